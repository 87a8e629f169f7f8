"""Leader election over a ``coordination.k8s.io`` Lease: several operator replicas, one active.

``wmrl operator --leader-elect`` takes the Lease ``<lease-namespace>/<lease-name>`` before it
starts reconciling, renews it every ``renew_seconds``, and exits the moment it cannot be sure
it still holds it (the container restarts and waits as a standby): two replicas never act at
once. A standby takes the Lease over once it has seen no renewal for ``lease_seconds`` by its
own monotonic clock (as client-go does, so clock skew between nodes cannot make two leaders),
so a killed leader is replaced within about ``lease_seconds + renew_seconds`` (12 s by default).
Every request has a timeout shorter than a renewal, and a leader gives up once no renewal has
succeeded for ``lease_seconds - 2 * renew_seconds``: before any standby may take over. Writes
carry the Lease's resourceVersion, so two standbys racing for an expired Lease cannot both win.
A leader that stops cleanly (SIGTERM) gives the Lease up at once.

This is the protocol of client-go's leaderelection (holderIdentity, renewTime,
leaseDurationSeconds, leaseTransitions), which ``kubectl get lease`` shows as usual.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import socket
import threading
import time
from typing import Any, Callable, Optional

log = logging.getLogger("wmrl.operator")

LEASE_SECONDS = 10
RENEW_SECONDS = 2


def default_identity() -> str:
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"


class LeaderElector:
    def __init__(self, api: Any, namespace: str, name: str, identity: str, lease_seconds: int = LEASE_SECONDS,
                 renew_seconds: float = RENEW_SECONDS, now: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.timezone.utc)):
        if 2 * renew_seconds >= lease_seconds:
            raise ValueError(f"renewing every {renew_seconds} s needs a lease longer than two renewals, "
                             f"not {lease_seconds} s")
        self.api, self.namespace, self.name, self.identity = api, namespace, name, identity
        self.lease_seconds, self.renew_seconds, self.now = lease_seconds, renew_seconds, now
        self.request_timeout = renew_seconds
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._observed: Any = None  # the other holder's (identity, renewTime) as last seen ...
        self._observed_at = 0.0  # ... and when (monotonic): expiry is judged by this clock only

    # ------------------------------------------------------------ one attempt
    def try_acquire_or_renew(self) -> bool:
        """One round: True when this replica holds the Lease afterwards."""
        from kubernetes.client import V1Lease, V1LeaseSpec, V1ObjectMeta
        from kubernetes.client.exceptions import ApiException

        now = self.now()
        timeout = self.request_timeout
        try:
            lease = self.api.read_namespaced_lease(self.name, self.namespace, _request_timeout=timeout)
        except ApiException as exc:
            if exc.status != 404:
                raise
            body = V1Lease(metadata=V1ObjectMeta(name=self.name, namespace=self.namespace),
                           spec=V1LeaseSpec(holder_identity=self.identity, acquire_time=now, renew_time=now,
                                            lease_duration_seconds=self.lease_seconds, lease_transitions=0))
            try:
                self.api.create_namespaced_lease(self.namespace, body, _request_timeout=timeout)
                return True
            except ApiException as exc2:
                if exc2.status == 409:  # another replica created it first
                    return False
                raise
        spec = lease.spec
        duration = spec.lease_duration_seconds or self.lease_seconds
        held_by_other = spec.holder_identity not in (None, "", self.identity)
        if held_by_other:
            record = (spec.holder_identity, spec.renew_time)
            if record != self._observed:  # renewed (or a new holder) since we last looked
                self._observed, self._observed_at = record, time.monotonic()
                return False
            if time.monotonic() - self._observed_at < duration:
                return False
        if spec.holder_identity != self.identity:
            spec.acquire_time = now
            spec.lease_transitions = (spec.lease_transitions or 0) + (1 if held_by_other else 0)
        spec.holder_identity, spec.renew_time, spec.lease_duration_seconds = self.identity, now, self.lease_seconds
        try:
            self.api.replace_namespaced_lease(self.name, self.namespace, lease,  # carries resourceVersion
                                              _request_timeout=timeout)
            return True
        except ApiException as exc:
            if exc.status == 409:  # someone wrote it in between
                return False
            raise

    def holder(self) -> Optional[str]:
        return self.api.read_namespaced_lease(self.name, self.namespace).spec.holder_identity

    # ------------------------------------------------------------ the loop
    def acquire(self) -> None:
        """Block until this replica holds the Lease (a standby waits here)."""
        waiting_logged = False
        while not self._stop.is_set():
            try:
                if self.try_acquire_or_renew():
                    log.info("leading: holding lease %s/%s", self.namespace, self.name,
                             extra={"identity": self.identity})
                    return
                if not waiting_logged:
                    log.info("standby: lease %s/%s is held by another replica", self.namespace, self.name,
                             extra={"identity": self.identity, "holder": self.holder()})
                    waiting_logged = True
            except Exception as exc:  # the apiserver may be away: keep trying
                log.warning("lease %s/%s: %s", self.namespace, self.name, exc)
            self._stop.wait(self.renew_seconds)
        raise SystemExit(0)

    def keep(self, on_lost: Callable[[], None]) -> threading.Thread:
        """Renew in the background; call ``on_lost`` when the Lease is taken over, or when no renewal
        has succeeded for longer than the Lease lasts minus a renewal (another replica may take it)."""
        give_up = self.lease_seconds - 2 * self.renew_seconds  # a standby may take over at lease_seconds

        def loop() -> None:
            last_ok = time.monotonic()
            while not self._stop.wait(self.renew_seconds):
                attempt = time.monotonic()  # the renewTime written is at least this old
                try:
                    if not self.try_acquire_or_renew():
                        log.error("lost lease %s/%s to another replica: stopping", self.namespace, self.name)
                        on_lost()
                        return
                    last_ok = attempt
                except Exception as exc:  # each request times out after request_timeout
                    log.warning("renewing lease %s/%s: %s", self.namespace, self.name, exc)
                if time.monotonic() - last_ok > give_up:
                    log.error("could not renew lease %s/%s in time: stopping", self.namespace, self.name)
                    on_lost()
                    return

        self._thread = threading.Thread(target=loop, name="lease-renewal", daemon=True)
        self._thread.start()
        return self._thread

    def release(self) -> None:
        """Give the Lease up (a clean stop): a standby takes over at its next round."""
        self._stop.set()
        if self._thread is not None:  # no renewal may be in flight while we write
            self._thread.join(timeout=self.renew_seconds + self.request_timeout)
        try:
            lease = self.api.read_namespaced_lease(self.name, self.namespace, _request_timeout=self.request_timeout)
            if lease.spec.holder_identity == self.identity:
                lease.spec.holder_identity = None
                lease.spec.renew_time = None
                self.api.replace_namespaced_lease(self.name, self.namespace, lease, _request_timeout=self.request_timeout)
                log.info("released lease %s/%s", self.namespace, self.name)
        except Exception as exc:  # best effort: the Lease expires on its own
            log.warning("releasing lease %s/%s: %s", self.namespace, self.name, exc)


def serve_standby_health(port: int) -> Callable[[], None]:
    """/healthz while waiting for the Lease (so the kubelet keeps a standby alive); returns a closer,
    called before kopf binds the same port."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            body = b'{"status": "standby"}'
            self.send_response(200 if self.path.startswith("/healthz") else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: Any) -> None:
            pass

    server = ThreadingHTTPServer(("0.0.0.0", port), Handler)
    threading.Thread(target=server.serve_forever, name="standby-health", daemon=True).start()

    def close() -> None:
        server.shutdown()
        server.server_close()

    return close
