"""The trainer's client for the sandbox pool: find pods, keep each one's slots busy, retry elsewhere.

``SandboxDispatcher(endpoints, slots_per_pod=1, timeout=..., max_retries=...)``:

* ``endpoints`` says where the pods are: :class:`StaticEndpoints` (a URL list, local runs) or
  :class:`EndpointSliceEndpoints` (the ready endpoints of a run's headless Service, refreshed
  in the background);
* at most ``slots_per_pod`` requests are in flight per pod (a server queues a little beyond
  its slots, but only the dispatcher can send a request to another pod, so the queue lives here);
* a "busy" answer -- 503 with ``Retry-After`` (the server's queue is full or the wait ran out),
  or 429 from older servers -- waits for a slot and does not use up the ``max_retries`` budget;
  a connection failure (a pod that died mid-run), another 5xx or a ``SandboxError`` response is
  retried on another pod with backoff; a 4xx is the request's fault and fails at once;
* one attempt may wait in the server's own queue (``server_queue_wait``, when other clients share
  the pod) before its ``run_timeout`` starts, so its HTTP timeout is the sum of both plus a margin;
* ``run``/``run_task`` return futures; the queue is bounded (submitting blocks while it is
  full: backpressure); ``demand`` = queued + in flight, which the trainer reports to the
  operator's autoscaler;
* a dead pool: per execution (``dead_pool_grace=``, or the view :meth:`SandboxDispatcher.failing_fast`),
  it fails at once with :class:`SandboxUnavailable` naming the endpoints once every known endpoint has
  failed consecutively and none has answered for ``dead_pool_grace`` seconds, instead of spending its
  retries on pods that a growing backoff (up to 30 s a pod) keeps it waiting for. Off by default:
  training's anchors keep the retry budget (a pool that recovers in a minute still grades them); a
  held-out evaluation (:mod:`wmrl_trainer.evaluation`) turns it on, as a dead pool makes it partial anyway.
"""

from __future__ import annotations

import base64
import concurrent.futures as cf
import itertools
import logging
import os
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Protocol

import httpx

log = logging.getLogger("wmrl.sandbox.dispatcher")

HTTP_MARGIN_S = 30.0  # added to run_timeout for one HTTP attempt (setup, file transfer, cleanup)
DEAD_POOL_GRACE_S = 5.0
"""How long every endpoint of a pool must have been failing, none answering, before an execution that
asked to fail fast (a held-out evaluation's) gives up: long enough to ride out a blip, short enough
that a dead pool makes an evaluation partial in seconds rather than minutes."""
SERVER_QUEUE_WAIT_S = 60.0
"""The longest a server holds a request in its queue before it runs or answers busy (the server's
default ``--max-queue-wait``). Other clients of the same pod can fill its slots, so one attempt may
wait that long before its run even starts: an attempt's HTTP timeout allows for it."""


class SandboxUnavailable(RuntimeError):
    """No pod could run the request within the retry budget."""


class SandboxRequestError(ValueError):
    """The server rejected the request itself (4xx other than 429): retrying cannot help."""


class Endpoints(Protocol):
    def urls(self) -> list[str]: ...

    def close(self) -> None: ...


class StaticEndpoints:
    """A fixed list of server URLs (``http://host:port``)."""

    def __init__(self, urls: list[str]):
        if not urls:
            raise ValueError("StaticEndpoints: urls must not be empty")
        self._urls = [u.rstrip("/") for u in urls]

    def urls(self) -> list[str]:
        return list(self._urls)

    def close(self) -> None:
        pass


def _url(address: str, port: int) -> str:
    return f"http://[{address}]:{port}" if ":" in address else f"http://{address}:{port}"


class EndpointSliceEndpoints:
    """Ready pods behind a Service, from its EndpointSlices (label ``kubernetes.io/service-name``).

    Lists once at construction (so a dispatcher starts with what is there), then every
    ``refresh_seconds`` in a daemon thread; a failed refresh keeps the last good list.
    Uses the in-cluster config when running in a Pod, else ``kubeconfig`` / the default one.
    """

    def __init__(self, namespace: str, service: str, port: Optional[int] = 8080, *, refresh_seconds: float = 5.0,
                 kubeconfig: Optional[str] = None, api_client: Any = None):
        from kubernetes import client, config  # lazy: slow to import, and only this discovery needs it

        if api_client is None:
            try:
                config.load_incluster_config()
                api_client = client.ApiClient()
            except config.ConfigException:
                api_client = config.new_client_from_config(config_file=kubeconfig)
        self._api = client.DiscoveryV1Api(api_client)
        self.namespace, self.service, self.port = namespace, service, port
        self.refresh_seconds = refresh_seconds
        self._urls: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.refresh()
        self._thread = threading.Thread(target=self._loop, name=f"endpoints-{service}", daemon=True)
        self._thread.start()

    def refresh(self) -> list[str]:
        slices = self._api.list_namespaced_endpoint_slice(
            self.namespace, label_selector=f"kubernetes.io/service-name={self.service}")
        urls = []
        for sl in slices.items:
            port = self.port or next((p.port for p in (sl.ports or []) if p.port), None)
            if port is None:
                continue
            for ep in sl.endpoints or []:
                # Kubernetes: a nil "ready" condition means ready (unknown state is treated as ready).
                if ep.conditions is not None and ep.conditions.ready is False:
                    continue
                if ep.conditions is not None and ep.conditions.terminating:
                    continue
                urls += [_url(a, port) for a in ep.addresses or []]
        urls = sorted(set(urls))
        with self._lock:
            self._urls = urls
        return urls

    def _loop(self) -> None:
        while not self._stop.wait(self.refresh_seconds):
            try:
                self.refresh()
            except Exception as exc:  # the API may blip; keep the last good list
                log.warning("refreshing endpoints of %s/%s failed: %s", self.namespace, self.service, exc)

    def urls(self) -> list[str]:
        with self._lock:
            return list(self._urls)

    def close(self) -> None:
        self._stop.set()


@dataclass
class _Job:
    body: dict
    run_timeout: float
    future: cf.Future
    post: Optional[Callable[[dict], Any]] = None  # turns the response into the future's result
    failed_on: set[str] = field(default_factory=set)
    failures: int = 0
    busy_since: Optional[float] = None
    dead_pool_grace: Optional[float] = None  # fail at once when the whole pool has been down this long


@dataclass
class _Endpoint:
    inflight: int = 0
    cooldown_until: float = 0.0
    failures: int = 0  # consecutive; a failing pod is avoided for exponentially longer
    failing_since: Optional[float] = None  # when its current run of failures began (None: it last answered)
    last_error: str = ""


class SandboxDispatcher:
    """Thread-pool client over a pool of sandbox servers (see the module docstring)."""

    def __init__(self, endpoints: Endpoints, slots_per_pod: int = 1, timeout: float = 60.0, max_retries: int = 3,
                 *, max_queue: int = 4096, workers: int = 64, backoff: float = 0.2, no_endpoint_wait: float = 60.0,
                 memory_limit_mb: Optional[int] = None, server_queue_wait: float = SERVER_QUEUE_WAIT_S,
                 http_margin: float = HTTP_MARGIN_S, tasks_dir: Optional[str] = None):
        if slots_per_pod < 1:
            raise ValueError(f"slots_per_pod must be >= 1, got {slots_per_pod}")
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0, got {timeout}")
        self.endpoints = endpoints
        self.slots_per_pod = slots_per_pod
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff = backoff
        self.no_endpoint_wait = no_endpoint_wait
        self.memory_limit_mb = memory_limit_mb
        self.server_queue_wait = server_queue_wait
        self.http_margin = http_margin
        # Where this process sees the tasks volume that the servers mount at their --tasks-dir (None: they do not).
        self.tasks_dir = os.path.realpath(tasks_dir) if tasks_dir else None
        self._queue: deque[_Job] = deque()
        self._max_queue = max_queue
        self._cond = threading.Condition()
        self._state: dict[str, _Endpoint] = {}
        self._waiting = 0  # taken from the queue by a worker, waiting for a free slot
        self._inflight = 0
        self._closed = False
        self._rr = itertools.count()
        self._http = httpx.Client(limits=httpx.Limits(max_connections=workers, max_keepalive_connections=workers))
        self._workers = [threading.Thread(target=self._work, name=f"sandbox-dispatch-{i}", daemon=True)
                         for i in range(workers)]
        for w in self._workers:
            w.start()

    # ------------------------------------------------------------------ public API

    @property
    def demand(self) -> int:
        """Executions queued + in flight (what the autoscaler sizes the pool for)."""
        with self._cond:
            return len(self._queue) + self._waiting + self._inflight

    def run(self, code: str, files: Optional[dict[str, bytes]] = None, fetch_files: Optional[list[str]] = None,
            run_timeout: Optional[float] = None, *, stdin: Optional[str] = None,
            memory_limit_mb: Optional[int] = None, dead_pool_grace: Optional[float] = None) -> cf.Future:
        """Execute ``code``; the future's result is the SandboxFusion response dict (files base64).

        ``dead_pool_grace``: fail fast once every endpoint has been failing that long (module docstring)."""
        return self._submit(self._body(code, files, fetch_files, run_timeout, stdin, memory_limit_mb), run_timeout,
                            dead_pool_grace=dead_pool_grace)

    def failing_fast(self, dead_pool_grace: float = DEAD_POOL_GRACE_S) -> "FailingFast":
        """This dispatcher (same pool, queue and slots), its executions given ``dead_pool_grace``."""
        return FailingFast(self, dead_pool_grace)

    def data_dir(self, task) -> Optional[str]:
        """``task``'s public directory relative to the tasks volume, when the servers mount that volume
        (``tasks_dir``) and the task has one inside it (a collection task); else None (upload its data)."""
        public = getattr(task, "public_dir", None)
        if self.tasks_dir is None or public is None:
            return None
        real = os.path.realpath(public)
        if not real.startswith(self.tasks_dir.rstrip("/") + "/"):
            return None
        return os.path.relpath(real, self.tasks_dir)

    def run_task(self, task, code: str, run_timeout: Optional[float] = None, *,
                 dead_pool_grace: Optional[float] = None) -> cf.Future:
        """Run a solution of ``task`` (its data under ``data/``: mounted from the tasks volume when the
        servers have it, see :meth:`data_dir`, else uploaded), fetch its submission, grade it -> Outcome."""
        from wmrl.grading import grade  # lazy: it imports numpy, which running code alone never needs

        data_dir = self.data_dir(task)
        files = {} if data_dir else {f"data/{name}": content for name, content in task.data.items()}

        def post(response: dict) -> Any:
            encoded = (response.get("files") or {}).get(task.submission)
            submission = base64.b64decode(encoded) if encoded is not None else None
            return grade(task, response, submission)

        body = self._body(code, files, [task.submission], run_timeout, None, None)
        if data_dir:
            body["data_dir"] = data_dir
        return self._submit(body, run_timeout, post, dead_pool_grace=dead_pool_grace)

    def close(self) -> None:
        with self._cond:
            if self._closed:
                return
            self._closed = True
            queued = list(self._queue)
            self._queue.clear()
            self._cond.notify_all()
        for job in queued:
            if job.future.set_running_or_notify_cancel():
                job.future.set_exception(SandboxUnavailable("dispatcher closed"))
        for w in self._workers:
            w.join(timeout=self.server_queue_wait + self.timeout + self.http_margin)
        self._http.close()
        self.endpoints.close()

    def __enter__(self) -> "SandboxDispatcher":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ internals

    def _body(self, code, files, fetch_files, run_timeout, stdin, memory_limit_mb) -> dict:
        """The request; ``memory_limit_MB`` only when set (absent: the server's default, -1: its maximum)."""
        body = {
            "code": code,
            "language": "python",
            "run_timeout": run_timeout or self.timeout,
            "stdin": stdin,
            "files": {path: base64.b64encode(content).decode("ascii") for path, content in (files or {}).items()},
            "fetch_files": list(fetch_files or []),
        }
        memory = self.memory_limit_mb if memory_limit_mb is None else memory_limit_mb
        if memory is not None:
            body["memory_limit_MB"] = memory
        return body

    def _submit(self, body: dict, run_timeout: Optional[float], post=None, *,
                dead_pool_grace: Optional[float] = None) -> cf.Future:
        if dead_pool_grace is not None and dead_pool_grace < 0:
            raise ValueError(f"dead_pool_grace must be >= 0, got {dead_pool_grace}")
        job = _Job(body=body, run_timeout=run_timeout or self.timeout, future=cf.Future(), post=post,
                   dead_pool_grace=dead_pool_grace)
        with self._cond:
            while len(self._queue) >= self._max_queue and not self._closed:
                self._cond.wait()  # backpressure: the caller waits for room
            if self._closed:
                raise SandboxUnavailable("dispatcher closed")
            self._queue.append(job)
            self._cond.notify_all()
        return job.future

    def _sync_endpoints(self) -> list[str]:
        """Current URLs; state is kept for known ones (their in-flight counts stay right)."""
        try:
            urls = self.endpoints.urls()
        except Exception as exc:
            log.warning("listing sandbox endpoints failed: %s", exc)
            urls = list(self._state)
        for url in urls:
            self._state.setdefault(url, _Endpoint())
        for url in list(self._state):
            if url not in urls and self._state[url].inflight == 0:
                del self._state[url]
        return urls

    def _acquire(self, job: _Job) -> Optional[str]:
        """Block until an endpoint has a free slot. One this job failed on is used again only when
        it has failed on all of them (otherwise it waits for a busy, untried one)."""
        waited_since = time.monotonic()
        while not self._closed:
            urls = self._sync_endpoints()
            now = time.monotonic()
            free = [u for u in urls if self._state[u].inflight < self.slots_per_pod
                    and self._state[u].cooldown_until <= now]
            untried = [u for u in urls if u not in job.failed_on]
            fresh = [u for u in free if u not in job.failed_on] if untried else free
            if fresh:
                least = min(self._state[u].inflight for u in fresh)
                best = [u for u in fresh if self._state[u].inflight == least]
                url = best[next(self._rr) % len(best)]
                self._state[url].inflight += 1
                return url
            if not urls and now - waited_since > self.no_endpoint_wait:
                raise SandboxUnavailable(f"no ready sandbox endpoints for {self.no_endpoint_wait:.0f}s")
            if job.dead_pool_grace is not None:
                dead = self._dead_pool(urls, now, job.dead_pool_grace)
                if dead:
                    raise SandboxUnavailable(dead)
            self._cond.wait(timeout=0.1)
        return None

    def _dead_pool(self, urls: list[str], now: float, grace: float) -> Optional[str]:
        """Why the pool is dead -- every endpoint failing, none with an attempt under way, the last of
        them failing for ``grace`` seconds -- naming the endpoints; None while any may still answer."""
        states = [self._state[u] for u in urls]
        if not states or any(s.failing_since is None or s.inflight for s in states):
            return None
        if now - max(s.failing_since for s in states) < grace:
            return None
        named = ", ".join(f"{u} ({self._state[u].failures} failures; last: {self._state[u].last_error})"
                          for u in urls[:3])
        more = f" and {len(urls) - 3} more" if len(urls) > 3 else ""
        return (f"every sandbox endpoint is down: {len(urls)} failing, none answered for {grace:g}s: "
                f"{named}{more}")

    def _release(self, url: str, cooldown: float = 0.0, failed: bool = False, reason: str = "") -> None:
        with self._cond:
            self._inflight -= 1
            state = self._state.get(url)
            if state is not None:
                state.inflight -= 1
                state.failures = state.failures + 1 if failed else 0
                if not failed:  # it answered (a result, or busy): alive
                    state.failing_since = None
                elif state.failing_since is None:
                    state.failing_since = time.monotonic()
                if failed:
                    state.last_error = reason
                    cooldown = max(cooldown, min(self.backoff * 2 ** (state.failures - 1), 30.0))
                if cooldown:
                    state.cooldown_until = max(state.cooldown_until, time.monotonic() + cooldown)
            self._cond.notify_all()

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                job = self._queue.popleft()
                self._cond.notify_all()  # room in the queue for a blocked submitter
            if not job.future.set_running_or_notify_cancel():
                continue  # cancelled while queued
            try:
                job.future.set_result(self._attempts(job))
            except BaseException as exc:  # the future carries every failure to the caller
                job.future.set_exception(exc)

    def _attempts(self, job: _Job) -> Any:
        while True:
            with self._cond:
                self._waiting += 1
                try:
                    url = self._acquire(job)
                finally:
                    self._waiting -= 1
                if url is None:
                    raise SandboxUnavailable("dispatcher closed")
                self._inflight += 1
            body, retry_reason, cooldown = None, None, 0.0
            try:
                body, retry_reason, cooldown = self._post(url, job)
            except httpx.TransportError as exc:  # refused, reset, timed out: the pod is gone or stuck
                retry_reason = f"{type(exc).__name__}: {exc}"
            finally:
                failed = retry_reason is not None and retry_reason != "busy"
                if failed:
                    job.failures += 1
                    job.failed_on.add(url)
                self._release(url, cooldown, failed, retry_reason or "")
            if body is not None:  # graded after the slot is free again
                return job.post(body) if job.post else body
            if retry_reason == "busy":
                job.busy_since = job.busy_since or time.monotonic()
                if time.monotonic() - job.busy_since > self.timeout + self.http_margin:
                    raise SandboxUnavailable(f"every sandbox stayed busy for {self.timeout + self.http_margin:.0f}s")
                continue
            log.warning("sandbox %s failed (%s); attempt %d/%d", url, retry_reason, job.failures,
                        self.max_retries + 1)
            if job.failures > self.max_retries:
                raise SandboxUnavailable(f"gave up after {job.failures} attempts; last: {retry_reason}")

    def _post(self, url: str, job: _Job) -> tuple[Optional[dict], Optional[str], float]:
        """One attempt: (response body, None, 0) or (None, why to retry, cooldown); raises for a 4xx."""
        # The server may queue the request (behind other clients) before its run_timeout starts.
        attempt_timeout = self.server_queue_wait + job.run_timeout + self.http_margin
        response = self._http.post(f"{url}/run_code", json=job.body, timeout=attempt_timeout)
        if response.status_code == 429 or (response.status_code == 503 and "Retry-After" in response.headers):
            try:
                retry_after = float(response.headers.get("Retry-After", 1))
            except ValueError:
                retry_after = 1.0
            return None, "busy", min(max(retry_after, 0.05), 5.0)
        if 400 <= response.status_code < 500:
            raise SandboxRequestError(f"{url} rejected the request ({response.status_code}): {response.text[:500]}")
        if response.status_code != 200:
            return None, f"HTTP {response.status_code}", 0.0
        body = response.json()
        if body.get("status") == "SandboxError":
            return None, f"SandboxError: {str(body.get('message'))[:200]}", 0.0
        return body, None, 0.0


class FailingFast:
    """A :class:`SandboxDispatcher` whose executions fail fast on a dead pool (``dead_pool_grace``,
    module docstring); everything else is the dispatcher's own (:meth:`SandboxDispatcher.failing_fast`)."""

    def __init__(self, dispatcher: SandboxDispatcher, dead_pool_grace: float = DEAD_POOL_GRACE_S):
        if dead_pool_grace < 0:
            raise ValueError(f"dead_pool_grace must be >= 0, got {dead_pool_grace}")
        self.dispatcher, self.dead_pool_grace = dispatcher, dead_pool_grace

    def run(self, code: str, *args: Any, **kwargs: Any) -> cf.Future:
        return self.dispatcher.run(code, *args, **{"dead_pool_grace": self.dead_pool_grace, **kwargs})

    def run_task(self, task, code: str, run_timeout: Optional[float] = None) -> cf.Future:
        return self.dispatcher.run_task(task, code, run_timeout, dead_pool_grace=self.dead_pool_grace)

    def __getattr__(self, name: str) -> Any:  # demand, data_dir, close, ...: the dispatcher's
        return getattr(self.dispatcher, name)
