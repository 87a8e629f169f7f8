"""``wmrl sandbox serve``: SandboxFusion-compatible ``POST /run_code`` for Python.

One server per sandbox Pod. It owns ``--slots`` exclusive execution slots (default 1: one
execution owns the sandbox). A request arriving while all are busy waits, in arrival order,
in a bounded queue (``--max-queue``, default 16 per slot) for at most ``--max-queue-wait``
seconds (default 60): SandboxFusion's server never refuses for load, and its clients (its
own, verl's) do not retry a refusal. It gets ``503`` with ``Retry-After`` only when the queue
is full or the wait runs out.

Request (JSON): ``code``, ``language`` (``python``), ``run_timeout`` (s), ``memory_limit_MB``
(absent = ``--memory-mb``; -1 = ``--max-memory-mb``), ``stdin``, ``files`` {path: base64} (written
beside the program, importable), ``fetch_files`` [path] (relative to the working directory or
absolute in the program's own view), ``data_dir`` (wmrl's extension: a task's public directory,
relative to ``--tasks-dir``, mounted read-only at ``data/`` with the rest of the tasks directory
hidden; :mod:`wmrl_sandbox.data_mount`); ``compile_timeout`` is accepted and ignored. Response:
``status`` Success | Failed | SandboxError, ``message``, ``compile_result`` (null),
``run_result`` {status Finished | TimeLimitExceeded | Error, execution_time, return_code,
stdout, stderr, plus stdout_truncated/stderr_truncated and, from the execution's cgroup,
oom_kills/pids_refused/memory_peak_mb (null without one)}, ``files`` {path: base64},
``files_truncated``, ``executor_pod_name``.

Errors: a body that is not a valid request -> 422 ``{"detail": [...], "error": ...}`` (the
shape FastAPI gives SandboxFusion's clients, plus our ``error`` message); not JSON -> 400;
over ``--max-body-bytes`` -> 413; queue full or waited too long -> 503. Once the request is
valid, every failure of the sandbox comes back as 200 with status ``SandboxError``, as
SandboxFusion does, never as a 5xx.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import json
import logging
import os
import signal
import socket
import sys
import tempfile
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Literal, Optional

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from wmrl.api.vocabulary import SANDBOX_ISOLATION_REFUSAL
from wmrl_sandbox import cgroups, data_mount, devices, executor, imports, linux, selftest, warm_slots
from wmrl_sandbox.executor import ExecutionRequest, ExecutionResult, Limits, RequestError
from wmrl_sandbox.isolation import MODES as ISOLATION_MODES, Isolation, missing, probe_isolation
from wmrl_sandbox.preexec import interpreter_root
from wmrl_sandbox.uids import UidPool, check_searchable

log = logging.getLogger("wmrl.sandbox")

DEFAULT_PORT = 8080
DEFAULT_MAX_BODY_BYTES = 64 << 20
DEFAULT_QUEUE_PER_SLOT = 16
DEFAULT_MAX_QUEUE_WAIT = 60.0
TERMINATION_LOG = "/dev/termination-log"  # the kubelet's default terminationMessagePath


class RunCodeRequest(BaseModel):
    """The subset of SandboxFusion's request this server runs (unknown fields are ignored)."""

    model_config = ConfigDict(extra="ignore")

    code: str
    language: Literal["python"]
    run_timeout: float = Field(10, gt=0)
    compile_timeout: float = 10
    memory_limit_MB: Optional[int] = None  # absent/null: --memory-mb; -1 (<= 0): --max-memory-mb
    stdin: Optional[str] = None
    files: dict[str, Optional[str]] = {}
    fetch_files: list[str] = []
    data_dir: Optional[str] = None  # wmrl's extension: a public directory of --tasks-dir, mounted read-only at data/


def _error(status: int, message: str, **extra) -> web.Response:
    return web.json_response({"error": message, **extra}, status=status)


def _invalid(detail: list[dict]) -> web.Response:
    first = detail[0]
    where = ".".join(str(part) for part in first.get("loc", ()))
    return _error(422, f"{where}: {first.get('msg', 'invalid')}", detail=detail)


def decode_files(files: dict[str, Optional[str]]) -> dict[str, bytes]:
    """base64 values -> bytes; ``None`` values are skipped, as SandboxFusion does."""
    out = {}
    for path, content in files.items():
        if content is None:
            continue
        executor.safe_relative_path(path, f"files[{path!r}]")
        try:
            out[path] = base64.b64decode(content, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise RequestError(f"files[{path!r}]: invalid base64: {exc}") from exc
    return out


def response_body(result: ExecutionResult, pod: str, max_fetch_bytes: int = Limits().max_fetch_bytes) -> dict:
    """SandboxFusion's response for an execution that happened (or failed in the sandbox)."""
    if result.status == "Error":
        status, message = "SandboxError", result.stderr
    elif result.status == "TimeLimitExceeded" or result.return_code != 0:
        status, message = "Failed", ""
    elif result.files_truncated:  # the program's output exceeded a limit: its failure, as a time limit is
        status = "Failed"
        message = f"fetch_files: the files exceed {max_fetch_bytes} bytes together; the rest were left out"
    else:
        status, message = "Success", ""
    if result.oom_kills and status == "Failed":  # its processes together outgrew its memory: its failure, so said
        message = (f"the execution's processes together reached its memory limit: the kernel killed "
                   f"{result.oom_kills} of them")
    return {
        "status": status,
        "message": message,
        "compile_result": None,
        "run_result": {
            "status": result.status,
            "execution_time": result.execution_time,
            "return_code": result.return_code,
            "stdout": result.stdout,
            "stderr": result.stderr,
            "stdout_truncated": result.stdout_truncated,
            "stderr_truncated": result.stderr_truncated,
            "oom_kills": result.oom_kills,
            "pids_refused": result.pids_refused,
            "memory_peak_mb": result.memory_peak_mb,
        },
        "executor_pod_name": pod,
        "files": {name: base64.b64encode(data).decode("ascii") for name, data in result.files.items()},
        "files_truncated": result.files_truncated,
    }


def sandbox_error_body(message: str, pod: str) -> dict:
    """SandboxFusion's answer when running the request raised: 200, SandboxError, no results."""
    return {"status": "SandboxError", "message": message, "compile_result": None, "run_result": None,
            "executor_pod_name": pod, "files": {}}


class SlotQueue:
    """``slots`` execution slots and a FIFO of requests waiting for one (all on the event loop's thread).

    A freed slot is handed straight to the longest-waiting request, so a newcomer never overtakes
    the queue. ``acquire`` returns None with a slot taken, or why it was refused.
    """

    def __init__(self, slots: int, max_queue: int, max_wait: float):
        self.slots, self.max_queue, self.max_wait = slots, max_queue, max_wait
        self.free = slots
        self.waiters: deque[asyncio.Future] = deque()

    @property
    def busy(self) -> int:
        return self.slots - self.free

    @property
    def queued(self) -> int:
        return sum(1 for w in self.waiters if not w.done())

    async def acquire(self, gone=lambda: False) -> Optional[str]:
        if self.free > 0 and not self.waiters:
            self.free -= 1
            return None
        if self.queued >= self.max_queue:
            return "queue_full"
        waiter = asyncio.get_running_loop().create_future()
        self.waiters.append(waiter)
        deadline = time.monotonic() + self.max_wait
        try:
            while not waiter.done():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                # Wake up now and then to notice a client that hung up (aiohttp does not cancel us).
                await asyncio.wait([waiter], timeout=min(remaining, 1.0))
                if not waiter.done() and gone():
                    waiter.cancel()
                    return "client_gone"
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release()  # handed a slot just as we were cancelled: pass it on
            else:
                waiter.cancel()
            raise
        if waiter.done() and not waiter.cancelled():
            return None
        waiter.cancel()
        return "queue_timeout"

    def release(self) -> None:
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(True)  # the slot passes on without becoming free
                return
        self.free += 1


class Metrics:
    def __init__(self, slots: int, max_queue: int):
        self.registry = CollectorRegistry()
        r = self.registry
        Gauge("wmrl_sandbox_slots", "Execution slots of this server", registry=r).set(slots)
        Gauge("wmrl_sandbox_max_queue", "Requests that may wait for a slot", registry=r).set(max_queue)
        self.busy = Gauge("wmrl_sandbox_busy_slots", "Slots running an execution now", registry=r)
        self.queued = Gauge("wmrl_sandbox_queued_requests", "Requests waiting for a slot now", registry=r)
        self.queued_total = Counter("wmrl_sandbox_queued_total", "Requests that had to wait for a slot",
                                    registry=r)
        self.queue_wait = Histogram("wmrl_sandbox_queue_wait_seconds", "Time requests waited for a slot",
                                    registry=r, buckets=(0.01, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300))
        self.executions = Counter("wmrl_sandbox_executions_total", "Executions by outcome",
                                  ["outcome"], registry=r)
        self.rejected = Counter("wmrl_sandbox_rejected_total", "Requests refused before running",
                                ["reason"], registry=r)
        self.duration = Histogram("wmrl_sandbox_execution_seconds", "Wall time of executions", registry=r,
                                  buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600))
        self.leftovers = Counter("wmrl_sandbox_leftover_processes_killed_total",
                                 "Processes an execution left behind that the server killed", registry=r)
        self.oom_kills = Counter("wmrl_sandbox_oom_kills_total",
                                 "Processes killed at the memory limit of their execution's cgroup", registry=r)


class SandboxServer:
    """The aiohttp application, the slots and their queue around :func:`executor.execute`."""

    def __init__(self, *, slots: int = 1, work_root: Optional[str] = None, limits: Limits = Limits(),
                 max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, isolation: Optional[Isolation] = None,
                 python: str = sys.executable, uid_base: int = 62000, max_queue: Optional[int] = None,
                 max_queue_wait: float = DEFAULT_MAX_QUEUE_WAIT, warm_start: bool = True,
                 cgroups_mode: str = "auto", cpus: float = 1.0, bwrap: Optional[str] = None,
                 tasks_dir: Optional[str] = None):
        if slots < 1:
            raise ValueError(f"slots must be >= 1, got {slots}")
        max_queue = DEFAULT_QUEUE_PER_SLOT * slots if max_queue is None else max_queue
        if max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {max_queue}")
        if max_queue_wait < 0:
            raise ValueError(f"max_queue_wait must be >= 0, got {max_queue_wait}")
        self.slots = slots
        self.queue = SlotQueue(slots, max_queue, max_queue_wait)
        self.work_root = work_root or os.path.join(tempfile.gettempdir(), "wmrl-sandbox")
        os.makedirs(self.work_root, mode=0o711, exist_ok=True)
        if os.stat(self.work_root).st_uid == os.geteuid():
            os.chmod(self.work_root, 0o711)  # others may traverse (the slot uids), not list
        self.limits = limits
        self.max_body_bytes = max_body_bytes
        self.python = python
        self.isolation = isolation or probe_isolation(bwrap)
        self.layers: Optional[dict[str, bool]] = None  # the self-test's findings (self_test)
        if self.isolation.as_root:
            check_searchable(self.work_root)
        # The tasks volume (spec.tasks.pvc), whose public directories executions get mounted (data_dir).
        self.tasks_dir = None if tasks_dir is None else data_mount.check_tasks_dir(
            tasks_dir, work_root=self.work_root, interpreter_root=interpreter_root(python),
            mount_namespace=self.isolation.bwrap is not None if not self.isolation.as_root
            else self.isolation.mount_namespace)
        self.uid_pool = UidPool(slots, base=uid_base) if self.isolation.as_root else None
        # Each slot: its own uid in root mode (None otherwise) and its own fork server.
        self._slot_uids: list[Optional[int]] = list(self.uid_pool.uids) if self.uid_pool else [None] * slots
        self._free_slots = list(range(slots))
        self.pool = ThreadPoolExecutor(max_workers=slots, thread_name_prefix="sandbox-exec")
        # Before the fork servers start: in cgroup v2 the server moves itself into a leaf first. In
        # unisolated mode an execution runs as the server's uid in its mount namespace: it could
        # rewrite its own group's limits, so it gets none (its rlimits hold instead).
        self.cgroups = cgroups.Cgroups.setup(
            cgroups_mode, cpus=cpus, unusable="unisolated mode: an execution could change its own cgroup's limits"
            if self.isolation.mode == "unisolated" else None)
        self.warm = warm_slots.WarmSlots(slots, python, self.isolation, enabled=warm_start, threads=limits.threads)
        self.metrics = Metrics(slots, max_queue)
        self.metrics.busy.set_function(lambda: self.queue.busy)  # read at each scrape
        self.metrics.queued.set_function(lambda: self.queue.queued)
        self.pod = os.environ.get("POD_NAME") or os.environ.get("MY_POD_NAME") or socket.gethostname()
        linux.set_child_subreaper()

    @property
    def busy(self) -> int:
        return self.queue.busy

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.max_body_bytes)
        app.router.add_post("/run_code", self.run_code)
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/metrics", self.metrics_handler)
        app.on_cleanup.append(self._cleanup)
        return app

    async def _cleanup(self, _app) -> None:
        self.close()

    def close(self) -> None:
        self.pool.shutdown(wait=True)
        self.warm.close()
        self.cgroups.close()
        if self.uid_pool:
            self.uid_pool.close()

    async def healthz(self, _request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "slots": self.slots, "busy": self.busy,
                                  "queued": self.queue.queued, "max_queue": self.queue.max_queue,
                                  "max_queue_wait": self.queue.max_wait,
                                  "isolation": self.isolation.describe(), "layers": self.layers,
                                  "tasks_dir": self.tasks_dir,
                                  "warm": self.warm.describe(), "cgroups": self.cgroups.describe(), "devices": list(self.limits.devices),
                                  "uids": self.uid_pool.uids if self.uid_pool else []})

    async def metrics_handler(self, _request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.metrics.registry),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def run_code(self, request: web.Request) -> web.Response:
        if request.content_length is not None and request.content_length > self.max_body_bytes:
            self.metrics.rejected.labels("too_large").inc()
            return _error(413, f"request body of {request.content_length} bytes exceeds {self.max_body_bytes}")
        arrived = time.monotonic()
        must_wait = self.queue.free == 0 or self.queue.queued > 0
        refused = await self.queue.acquire(gone=lambda: request.transport is None or request.transport.is_closing())
        if must_wait and refused != "queue_full":
            self.metrics.queued_total.inc()
            self.metrics.queue_wait.observe(time.monotonic() - arrived)
        if refused is not None:
            self.metrics.rejected.labels(refused).inc()
            why = {"queue_full": f"all {self.slots} execution slot(s) busy and {self.queue.max_queue} request(s) "
                                 "already waiting",
                   "queue_timeout": f"no execution slot became free within {self.queue.max_wait:g}s"}.get(
                       refused, "the client went away while waiting")
            return web.json_response({"error": why + "; retry later"}, status=503, headers={"Retry-After": "1"})
        slot = self._free_slots.pop()
        try:
            return await self._run_in_slot(request, slot)
        finally:
            self._free_slots.append(slot)
            self.queue.release()

    async def _run_in_slot(self, request: web.Request, slot: int) -> web.Response:
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            self.metrics.rejected.labels("too_large").inc()
            return _error(413, f"request body exceeds {self.max_body_bytes} bytes")
        try:
            job = self._parse(raw)
        except ValidationError as exc:
            self.metrics.rejected.labels("invalid").inc()
            return _invalid([{**{k: v for k, v in e.items() if k in ("type", "msg", "input")},
                              "loc": ["body", *e["loc"]]} for e in exc.errors()])
        except RequestError as exc:
            self.metrics.rejected.labels("invalid").inc()
            return _invalid([{"type": "value_error", "loc": ["body"], "msg": str(exc)}])
        except ValueError as exc:
            self.metrics.rejected.labels("invalid").inc()
            return _error(400, f"body is not JSON: {exc}")
        loop = asyncio.get_running_loop()
        started = time.monotonic()
        try:
            result = await loop.run_in_executor(self.pool, self._execute, job, slot)
        except RequestError as exc:  # raised only before anything ran
            self.metrics.rejected.labels("invalid").inc()
            return _invalid([{"type": "value_error", "loc": ["body"], "msg": str(exc)}])
        except Exception as exc:  # whatever else breaks is the sandbox's failure: 200 SandboxError, never a 5xx
            log.exception("running a request failed in the sandbox")
            self.metrics.executions.labels("SandboxError").inc()
            return web.json_response(sandbox_error_body(f"sandbox error: {type(exc).__name__}: {exc}", self.pod))
        self.metrics.duration.observe(time.monotonic() - started)
        if result.status == "Error":
            log.warning("execution failed in the sandbox: %s", result.stderr)
        body = response_body(result, self.pod, self.limits.max_fetch_bytes)
        outcome = "TimeLimitExceeded" if result.status == "TimeLimitExceeded" else body["status"]
        self.metrics.executions.labels(outcome).inc()
        self.metrics.leftovers.inc(result.leftover_processes_killed)
        self.metrics.oom_kills.inc(result.oom_kills or 0)
        return web.json_response(body)

    def _parse(self, raw: bytes) -> ExecutionRequest:
        data = json.loads(raw)
        if not isinstance(data, dict):
            raise ValueError("expected a JSON object")
        req = RunCodeRequest.model_validate(data)
        source = None
        if req.data_dir is not None:
            try:
                source = data_mount.resolve(self.tasks_dir, req.data_dir)
            except data_mount.DataMountError as exc:
                raise RequestError(str(exc)) from exc
        return ExecutionRequest(code=req.code, run_timeout=req.run_timeout, memory_limit_mb=req.memory_limit_MB,
                                stdin=req.stdin, files=decode_files(req.files), fetch_files=list(req.fetch_files),
                                data_source=source, data_hide=self.tasks_dir)

    def self_check(self) -> None:
        """Run one trivial program before serving; raise RuntimeError with the reason if it fails.

        A sandbox that cannot run anything (an interpreter hidden by the isolation, a broken
        work root) would otherwise answer every request with an error, and a trainer would
        retry its executions for ever instead of being told why. With a cgroup per execution,
        the program must also have been charged to its group (its peak memory above 0, where
        the kernel reports a peak: cgroup v1, or v2 from Linux 5.19).
        """
        marker = "wmrl-sandbox-self-check-ok"
        result = self._execute(ExecutionRequest(code=f"print({marker!r})", run_timeout=30.0), self._free_slots[0])
        if result.status != "Finished" or result.return_code != 0 or marker not in result.stdout:
            detail = (result.stderr or result.stdout).strip()[-2000:]
            raise RuntimeError(f"self-check failed: running print() with {self.python} gave status {result.status}, "
                               f"exit code {result.return_code}" + (f":\n{detail}" if detail else ""))
        if result.memory_peak_mb is not None and result.memory_peak_mb <= 0:  # nothing was charged to its group
            raise RuntimeError("self-check failed: the execution did not run inside its cgroup "
                               f"({', '.join(self.cgroups.describe()['groups'])})")

    def check_imports(self, modules: tuple[str, ...]) -> None:
        """Import each of ``modules`` in a cold execution (:mod:`wmrl_sandbox.imports`); raise
        RuntimeError saying which do not import there and why, the directory it cannot see first."""
        if not modules:
            return
        outside = imports.locate(self.python, modules)
        paths = imports.probe_paths(outside)
        argv = [json.dumps(list(modules)), json.dumps(paths)]
        program = f"import sys\nsys.argv[1:] = {argv!r}\n{imports.PROBE}"
        result = self._execute(ExecutionRequest(code=program, run_timeout=min(120.0, self.limits.max_run_timeout)),
                               self._free_slots[0], warm=False)
        try:
            found = json.loads(result.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            detail = (result.stderr or result.stdout).strip()[-2000:]
            raise RuntimeError(f"self-check failed: importing {', '.join(modules)} in an execution gave status "
                               f"{result.status}, exit code {result.return_code}" + (f":\n{detail}" if detail else ""))
        if found["failed"]:
            raise RuntimeError("self-check failed: " + imports.diagnose(self.python, found["failed"], outside,
                                                                        found["visible"]))

    def self_test(self) -> dict[str, bool]:
        """Check every isolation layer from inside an execution (:mod:`wmrl_sandbox.selftest`)."""
        def probe(code: str, argv: list[str]) -> tuple[str, str]:
            program = f"import sys\nsys.argv[1:] = {argv!r}\n{code}"
            result = self._execute(ExecutionRequest(code=program, run_timeout=30.0), self._free_slots[0])
            return result.stdout, result.stderr

        self.layers = selftest.run(probe, self.work_root)
        return self.layers

    def _execute(self, job: ExecutionRequest, slot: int, warm: bool = True) -> ExecutionResult:
        return executor.execute(job, work_root=self.work_root, uid=self._slot_uids[slot], isolation=self.isolation,
                                limits=self.limits, python=self.python,
                                warm=self.warm.for_slot(slot) if warm else None, groups=self.cgroups)


def _env(name: str, cast, default):
    """Defaults from the Pod's environment (the operator sets WMRL_SANDBOX_*); flags win."""
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return cast(raw)
    except ValueError:
        raise SystemExit(f"wmrl sandbox serve: {name}={raw!r} is not a valid {cast.__name__}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = Limits()
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="0 picks a free port (printed)")
    parser.add_argument("--slots", type=int, default=_env("WMRL_SANDBOX_SLOTS", int, 1),
                        help="concurrent executions (default 1: exclusive; env WMRL_SANDBOX_SLOTS)")
    parser.add_argument("--max-queue", type=int, default=_env("WMRL_SANDBOX_MAX_QUEUE", int, None),
                        help="requests that may wait for a slot beyond the running ones; more get 503 "
                        f"(default {DEFAULT_QUEUE_PER_SLOT} x --slots; 0: never wait; env WMRL_SANDBOX_MAX_QUEUE)")
    parser.add_argument("--max-queue-wait", type=float,
                        default=_env("WMRL_SANDBOX_MAX_QUEUE_WAIT_SECONDS", float, DEFAULT_MAX_QUEUE_WAIT),
                        help="seconds a request may wait for a slot before it gets 503 "
                        f"(default {DEFAULT_MAX_QUEUE_WAIT:g}; env WMRL_SANDBOX_MAX_QUEUE_WAIT_SECONDS)")
    parser.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES)
    parser.add_argument("--work-root", default=_env("WMRL_SANDBOX_WORK_DIR", str, None),
                        help="where execution directories are made (env WMRL_SANDBOX_WORK_DIR; "
                        "default $TMPDIR/wmrl-sandbox; in the image /work/exec on an emptyDir)")
    parser.add_argument("--memory-mb", type=int, default=_env("WMRL_SANDBOX_MEMORY_MB", int, d.memory_mb),
                        help="address-space limit when a request sets no memory_limit_MB "
                             f"(default {d.memory_mb}; env WMRL_SANDBOX_MEMORY_MB)")
    parser.add_argument("--max-memory-mb", type=int, default=_env("WMRL_SANDBOX_MAX_MEMORY_MB", int, None),
                        help="the cap on memory_limit_MB, and what memory_limit_MB -1 gets (default the larger "
                             f"of {d.max_memory_mb} and --memory-mb; env WMRL_SANDBOX_MAX_MEMORY_MB)")
    parser.add_argument("--tmpfs-mb", type=int, default=_env("WMRL_SANDBOX_TMPFS_MB", int, d.tmpfs_mb),
                        help="size of each execution's private /tmp, /var/tmp and /dev/shm "
                             f"(default {d.tmpfs_mb}; env WMRL_SANDBOX_TMPFS_MB)")
    parser.add_argument("--tasks-dir", default=_env(data_mount.TASKS_DIR_ENV, str, None),
                        help="the tasks volume (read-only): a request's data_dir names one of its public "
                             "directories, mounted read-only at data/ with the rest of it hidden (env "
                             f"{data_mount.TASKS_DIR_ENV}; default none: data is uploaded with each request)")
    parser.add_argument("--device", metavar="PATH", action="append", default=None,
                        help="a device node (a glob such as '/dev/nvidia*', expanded at start-up; repeatable) bound "
                             "into every execution at its own path; with any, executions get no address-space limit "
                             "(their cgroup bounds memory). A pattern matching nothing is refused (exit 2). Env "
                             f"{devices.DEVICES_ENV} (comma-separated), used when no --device is given; default none")
    parser.add_argument("--max-run-timeout", type=float,
                        default=_env("WMRL_SANDBOX_TIMEOUT_SECONDS", float, d.max_run_timeout),
                        help="cap on a request's run_timeout (env WMRL_SANDBOX_TIMEOUT_SECONDS)")
    parser.add_argument("--nproc", type=int, default=d.nproc, help="process/thread limit per execution")
    parser.add_argument("--file-size-mb", type=int, default=_env("WMRL_SANDBOX_FILE_SIZE_MB", int, d.file_size_mb),
                        help=f"largest file an execution may write (default {d.file_size_mb}; env "
                             "WMRL_SANDBOX_FILE_SIZE_MB)")
    parser.add_argument("--max-output-bytes", type=int, default=d.max_output_bytes, help="per stream")
    parser.add_argument("--max-fetch-bytes", type=int, default=d.max_fetch_bytes,
                        help="all fetch_files of an execution together; beyond it the rest are left out, "
                        "files_truncated is set and the status is Failed")
    parser.add_argument("--uid-base", type=int, default=62000, help="first uid of the per-slot uids (root mode)")
    parser.add_argument("--python", default=sys.executable, help="interpreter that runs the code")
    parser.add_argument("--isolation", choices=ISOLATION_MODES, default=_env("WMRL_SANDBOX_ISOLATION", str, "namespaces"),
                        help="namespaces (default): every execution in namespaces of its own (root mode as root, "
                             "bubblewrap otherwise); the server refuses to start (exit 2, naming what is missing) where "
                             "it cannot have them. restricted: executions run without namespaces of their own, for a Pod "
                             "whose runtime (gVisor, Kata) is the boundary (env WMRL_SANDBOX_ISOLATION)")
    parser.add_argument("--bwrap", metavar="PATH", default=None,
                        help="the bubblewrap that makes a non-root server's namespaces (default: $WMRL_SANDBOX_BWRAP, "
                             "else bwrap on PATH)")
    parser.add_argument("--warm", action=argparse.BooleanOptionalAction,
                        default=_env("WMRL_SANDBOX_WARM", lambda v: v.lower() in ("1", "true"), True),
                        help="root mode: one fork server per slot with numpy, pandas, scipy and scikit-learn "
                             "imported, forking each execution (default on; env WMRL_SANDBOX_WARM)")
    parser.add_argument("--require-imports", metavar="MODULES", default=_env("WMRL_SANDBOX_REQUIRE_IMPORTS", str, ""),
                        help="comma-separated modules that must import inside an execution (checked at start in a "
                             "cold one; exit 2 naming what does not, and the directory an execution cannot see); "
                             "default none; the image sets numpy,pandas,scipy,sklearn (env WMRL_SANDBOX_REQUIRE_IMPORTS)")
    parser.add_argument("--require-isolation", action="store_true",
                        default=_env("WMRL_SANDBOX_REQUIRE_ISOLATION", lambda v: v.lower() in ("1", "true"), False),
                        help="refuse to start unless the self-test finds every isolation layer holding "
                             "(exit 2 naming the ones that do not)")
    parser.add_argument("--cgroups", choices=cgroups.MODES, default=_env("WMRL_SANDBOX_CGROUPS", str, "auto"),
                        help="a cgroup per execution bounding memory, tasks and CPU of all its processes together: "
                             "auto (where the server's cgroup is delegated to it), off, or required (exit 2 naming "
                             "what is missing); env WMRL_SANDBOX_CGROUPS")
    parser.add_argument("--cpus", type=float, default=_env("WMRL_SANDBOX_CPUS", float, 1.0),
                        help="CPUs of time per execution through its cgroup (default 1; 0: no CPU limit; "
                             "env WMRL_SANDBOX_CPUS)")


def main(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    max_memory = args.max_memory_mb if args.max_memory_mb is not None else max(Limits().max_memory_mb, args.memory_mb)
    patterns = args.device if args.device else devices.parse_env(os.environ.get(devices.DEVICES_ENV, ""))
    try:
        device_paths = devices.expand(patterns)
    except ValueError as exc:
        return _refuse(str(exc))
    limits = Limits(memory_mb=args.memory_mb, max_memory_mb=max_memory,
                    max_run_timeout=args.max_run_timeout, nproc=args.nproc, file_size_mb=args.file_size_mb,
                    max_output_bytes=args.max_output_bytes, max_fetch_bytes=args.max_fetch_bytes,
                    tmpfs_mb=args.tmpfs_mb, threads=threads_for(args.cpus), devices=device_paths)
    if os.environ.get("TMPDIR"):  # the image points it into /work, an emptyDir that starts empty
        os.makedirs(os.environ["TMPDIR"], exist_ok=True)
    try:
        required = imports.parse(args.require_imports)
    except ValueError as exc:
        print(f"wmrl sandbox serve: {exc}", file=sys.stderr)
        return 2
    if args.isolation not in ISOLATION_MODES:  # from the environment, which argparse does not check
        print(f"wmrl sandbox serve: WMRL_SANDBOX_ISOLATION={args.isolation!r} is not one of "
              f"{', '.join(ISOLATION_MODES)}", file=sys.stderr)
        return 2
    isolation = probe_isolation(args.bwrap, args.isolation)
    gaps = missing(isolation)
    if gaps:
        return _refuse(isolation_refusal(isolation, gaps))
    if isolation.mode == "unisolated":
        print("wmrl sandbox serve: warning: --isolation restricted: executions run without namespaces of their own, "
              "as this server's uid: they can signal the server, read its files and reach the network the server "
              "reaches; only a boundary around the whole server (a gVisor or Kata runtimeClassName, the Pod's "
              "NetworkPolicy) contains them", file=sys.stderr, flush=True)
    server = None
    try:
        server = SandboxServer(slots=args.slots, work_root=args.work_root, limits=limits, isolation=isolation,
                               max_body_bytes=args.max_body_bytes, python=args.python, uid_base=args.uid_base,
                               max_queue=args.max_queue, max_queue_wait=args.max_queue_wait,
                               warm_start=args.warm, cgroups_mode=args.cgroups, cpus=args.cpus, bwrap=args.bwrap,
                               tasks_dir=args.tasks_dir)
        server.warm.wait_ready()  # so the self-test below checks the warm path's isolation too
        server.self_check()
        server.check_imports(required)
        layers = server.self_test()
    except (ValueError, RuntimeError, OSError) as exc:  # CgroupsUnavailable too
        if server is not None:
            server.close()
        return _refuse(str(exc))
    failing = [layer for layer, holds in layers.items() if not holds]
    print(f"wmrl sandbox: isolation mode {server.isolation.mode} (--isolation {server.isolation.requested}); self-test: "
          + ("every layer holds" if not failing else f"NOT holding: {', '.join(failing)}")
          + f"; warm starts: {_warm_line(server.warm.describe())}"
          + f"; cgroups: {_cgroups_line(server.cgroups.describe())}"
          + f"; {devices.memory_note(device_paths, 'memory' in server.cgroups.versions)}", flush=True)
    if device_paths and "memory" not in server.cgroups.versions:
        print("wmrl sandbox serve: warning: --device without a memory cgroup per execution: executions have no "
              "address-space limit, so no memory bound but the container's (docs/sandbox.md, GPUs)",
              file=sys.stderr, flush=True)
    if failing and args.require_isolation:
        server.close()
        return _refuse(f"{SANDBOX_ISOLATION_REFUSAL}: --require-isolation: these layers do not hold here: "
                       f"{', '.join(failing)} "
                       "(docs/sandbox.md: deployed mode needs unprivileged user namespaces, or run the server as root)")
    return asyncio.run(_serve(server, args.host, args.port))


def threads_for(cpus: float) -> int:
    """BLAS/OpenMP threads of an execution with ``cpus`` CPUs of time (0: no CPU limit): one per whole CPU."""
    return max(1, int(cpus)) if cpus > 0 else 1


def isolation_refusal(isolation: Isolation, gaps: list[str]) -> str:
    """Why a server asked for ``--isolation namespaces`` will not start, and what would let it."""
    if isolation.as_root:
        fix = "a kernel and runtime that let root unshare these namespaces"
    else:
        fix = ("bubblewrap and unprivileged user namespaces; in a Pod: hostUsers: false, procMount: Unmasked and "
               "seccompProfile Unconfined, on a runtime that supports user namespaces (containerd 2 or CRI-O, "
               "Linux 6.3+)")
    return (f"{SANDBOX_ISOLATION_REFUSAL}: --isolation namespaces needs {'; '.join(gaps)}. It needs {fix} "
            "(docs/sandbox.md); or start with --isolation restricted to run executions without namespaces of their "
            "own, inside a boundary of the server's own (a gVisor or Kata runtimeClassName)")


def _refuse(message: str) -> int:
    """The server will not serve: say why on stderr and in the Pod's termination message, exit 2.

    The kubelet makes the termination message file (``$WMRL_SANDBOX_TERMINATION_LOG``, default
    ``/dev/termination-log``) before the container starts; where there is none (not in a Pod),
    nothing is written."""
    print(f"wmrl sandbox serve: {message}", file=sys.stderr, flush=True)
    path = os.environ.get("WMRL_SANDBOX_TERMINATION_LOG") or TERMINATION_LOG
    try:
        with open(path, "r+") as fh:  # never created: only the kubelet's file is written
            fh.truncate()
            fh.write(f"wmrl sandbox serve: {message}"[:4000])  # the kubelet keeps 4096 bytes
    except OSError:
        pass
    return 2


def _cgroups_line(state: dict) -> str:
    used = ", ".join(f"{c} ({v})" for c, v in state["controllers"].items())
    missing = "; ".join(f"no {c}: {why}" for c, why in state["missing"].items())
    return "; ".join(part for part in (used, missing) if part) or "none"


def _warm_line(warm_state: dict) -> str:
    if not warm_state["enabled"]:
        return f"off, {warm_state['reason']}"
    failed = f" (not importable: {', '.join(warm_state['failed'])})" if warm_state["failed"] else ""
    return f"{warm_state['ready']}/{warm_state['slots']} slot(s) ready, {len(warm_state['modules'])} modules{failed}"


async def _serve(server: SandboxServer, host: str, port: int) -> int:
    runner = web.AppRunner(server.app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1]  # the real port when --port 0
    print(f"wmrl sandbox: listening on http://{host}:{bound} slots={server.slots} "
          f"max_queue={server.queue.max_queue} max_queue_wait={server.queue.max_wait:g}s "
          f"isolation={json.dumps(server.isolation.describe())}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()
    return 0
