"""``wmrl calibration serve``: one calibration shared by any number of trainers over HTTP.

Endpoints (JSON; errors are ``{"error": "<message>"}``):

* ``POST /v1/observations`` ``{"trainer": ID, "batch": ID, "groups": [{"task": ..., "wm": [...], "env": [...]}]}``
  -> 200 ``{"applied": bool, ...view}`` once the batch is durable (``applied: false``: a
  retry of a batch already counted); 400/413 on bad input (state untouched); 503 when
  the store cannot be read or written (retry later).
* ``GET /v1/calibration`` -> the view (see ``CalibrationState.view``), read from the store.
* ``GET /healthz`` -> 200 when the stored state is readable, else 503 with the reason
  (use it as the readiness probe); ``GET /livez`` -> 200 while the process serves
  (the liveness probe: a corrupt state must not restart the pod in a loop).
* ``GET /metrics`` -> Prometheus text.

Concurrent POSTs are group-committed: a single writer takes every batch waiting,
folds them in arrival order into one read-modify-write of the store, and answers
each request only after that write succeeded.
"""

from __future__ import annotations

import argparse
import asyncio
import hmac
import json
import logging
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import CONTENT_TYPE_LATEST

from wmrl.calibration import TOKEN_ENV
from wmrl.calibration.state import CalibrationConfig, CalibrationState, StateError, validate_groups, _check_id
from wmrl.calibration.store import StoreDenied, StoreError, open_store

log = logging.getLogger("wmrl.calibration")

DEFAULT_MAX_BODY = 4 * 1024 * 1024
MAX_COMMIT_BATCHES = 512
DEFAULT_STORE_WAIT = 60.0
STORE_RETRY_S = (0.1, 5.0)  # the first retry's delay, doubling up to the second's


class BadRequest(ValueError):
    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON here (rewards must be finite numbers in [0, 1])")


def parse_observation(body: bytes) -> tuple[str, str, list]:
    """``(trainer, batch, validated pairs per group)`` from a request body, or ``BadRequest`` naming the field."""
    try:
        data = json.loads(body, parse_constant=_reject_constant)
    except ValueError as exc:
        raise BadRequest(f"invalid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise BadRequest("body must be a JSON object with trainer, batch and groups")
    extra = sorted(set(data) - {"trainer", "batch", "groups"})
    if extra:
        raise BadRequest(f"unknown field(s) {extra}")
    try:
        trainer = _check_id(data.get("trainer"), "trainer")
        batch = _check_id(data.get("batch"), "batch")
        pairs = validate_groups(data.get("groups"))
    except ValueError as exc:
        raise BadRequest(str(exc)) from None
    return trainer, batch, pairs


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.batches = Counter("wmrl_calibration_batches", "Observation batches acknowledged", ["result"], registry=r)
        self.groups = Counter("wmrl_calibration_groups", "Anchor groups folded in", registry=r)
        self.bad_requests = Counter("wmrl_calibration_bad_requests", "Requests rejected as bad input", registry=r)
        self.unauthorized = Counter("wmrl_calibration_unauthorized", "Observations refused for a missing or wrong "
                                    "token", registry=r)
        self.store_errors = Counter("wmrl_calibration_store_errors", "Failed store reads/writes", registry=r)
        self.conflicts = Gauge("wmrl_calibration_store_conflicts", "Optimistic-concurrency conflicts so far", registry=r)
        self.commit_seconds = Histogram("wmrl_calibration_commit_seconds", "Durable write latency", registry=r,
                                        buckets=(.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5))
        self.commit_batches = Histogram("wmrl_calibration_commit_batches", "Batches per group commit", registry=r,
                                        buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512))
        self.version = Gauge("wmrl_calibration_version", "State version", registry=r)
        self.pairs = Gauge("wmrl_calibration_pairs", "Pairs in the buffer", registry=r)
        self.pairs_seen = Gauge("wmrl_calibration_pairs_seen", "Pairs ever folded in", registry=r)
        self.weight = Gauge("wmrl_calibration_weight", "Anchor weight", registry=r)
        self.reduction = Gauge("wmrl_calibration_bias_reduction", "Bias reduction of the current map", registry=r)

    def update(self, view: dict) -> None:
        self.version.set(view["version"])
        self.pairs.set(view["pairs"])
        self.pairs_seen.set(view["pairsSeen"])
        self.weight.set(view["weight"])
        if view["bias"] is not None:
            self.reduction.set(view["bias"]["reduction"])


class CalibrationService:
    """``token``: when set, ``POST /v1/observations`` needs ``Authorization: Bearer <token>`` (401
    otherwise); reads (``GET /v1/calibration``, health, metrics) stay open: the operator reads
    the calibration into the run's status, and the state is the same figures."""

    def __init__(self, store: Any, max_body_bytes: int = DEFAULT_MAX_BODY, token: Optional[str] = None,
                 store_wait: float = DEFAULT_STORE_WAIT):
        self.token = token or None
        self.store_wait = store_wait
        self.store = store
        self.max_body_bytes = max_body_bytes
        self.metrics = Metrics()
        self.writer = ThreadPoolExecutor(1, thread_name_prefix="calibration-writer")
        self.readers = ThreadPoolExecutor(2, thread_name_prefix="calibration-reader")
        self.pending: asyncio.Queue | None = None
        self.committer: asyncio.Task | None = None
        self.opener: asyncio.Task | None = None

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.max_body_bytes)
        app.router.add_post("/v1/observations", self.post_observations)
        app.router.add_get("/v1/calibration", self.get_calibration)
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/livez", self.livez)
        app.router.add_get("/metrics", self.metrics_handler)
        app.on_startup.append(self._start)
        app.on_cleanup.append(self._stop)
        return app

    async def _start(self, app: web.Application) -> None:
        self.pending = asyncio.Queue()
        self.committer = asyncio.create_task(self._commit_loop())
        self.opener = asyncio.create_task(self._open_store())  # /livez answers meanwhile

    async def _open_store(self) -> None:
        """Create the state if missing; a corrupt one is reported, not fatal.

        The service may start before the apiserver applies its Role and RoleBinding (the operator
        writes them with its Deployment, and RBAC takes effect a moment later): a 403 is retried
        quietly, backing off, for ``store_wait`` seconds, and reported only if it lasts. Meanwhile
        ``/healthz`` answers 503 with the reason (the Pod is not ready) and ``/livez`` 200.
        """
        loop = asyncio.get_running_loop()
        started = time.monotonic()
        delay = STORE_RETRY_S[0]
        while True:
            try:
                _, state = await loop.run_in_executor(self.writer, self.store.transact, lambda s: None)
                break
            except StoreDenied as exc:
                waited = time.monotonic() - started
                if waited + delay > self.store_wait:
                    log.error("%s (still refused after %.0f s: does the service account's Role grant it?)", exc,
                              waited)
                    return
                log.debug("%s; retrying in %.1f s (its RBAC may not be in effect yet)", exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, STORE_RETRY_S[1])
            except (StateError, StoreError) as exc:
                log.error("%s", exc)
                return
        self.metrics.update(state.view())
        waited = time.monotonic() - started
        log.info("serving %s at version %d%s", self.store.describe(), state.version,
                 f" (readable after {waited:.1f} s)" if waited >= 0.5 else "")

    async def _stop(self, app: web.Application) -> None:
        if self.opener is not None:
            self.opener.cancel()
        if self.committer is not None:
            self.committer.cancel()
        self.writer.shutdown(wait=True)
        self.readers.shutdown(wait=False)

    # ---- the single writer
    async def _commit_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            items = [await self.pending.get()]
            while not self.pending.empty() and len(items) < MAX_COMMIT_BATCHES:
                items.append(self.pending.get_nowait())
            batches = [(t, b, g) for t, b, g, _ in items]

            def fold(state: CalibrationState) -> list[bool]:
                return [state.observe_validated(t, b, g) for t, b, g in batches]

            started = time.perf_counter()
            try:
                applied, state = await loop.run_in_executor(self.writer, self.store.transact, fold)
            except Exception as exc:  # StateError, StoreError, anything: answer every waiter
                self.metrics.store_errors.inc()
                log.error("commit of %d batches failed: %s", len(items), exc)
                for *_, future in items:
                    if not future.done():
                        future.set_exception(exc)
                continue
            self.metrics.commit_seconds.observe(time.perf_counter() - started)
            self.metrics.commit_batches.observe(len(items))
            self.metrics.conflicts.set(self.store.conflicts)
            view = state.view()
            self.metrics.update(view)
            for (_, _, groups, future), ok in zip(items, applied):
                self.metrics.batches.labels("applied" if ok else "duplicate").inc()
                if ok:
                    self.metrics.groups.inc(len(groups))
                if not future.done():
                    future.set_result({"applied": ok, **view})

    # ---- handlers
    def _authorized(self, request: web.Request) -> bool:
        if self.token is None:
            return True
        given = request.headers.get("Authorization", "")
        return hmac.compare_digest(given.encode("utf-8", "surrogateescape"), f"Bearer {self.token}".encode())

    async def post_observations(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            self.metrics.unauthorized.inc()
            return web.json_response({"error": "observations need this calibration's token "
                                               "(Authorization: Bearer <token>, from its Secret)"},
                                     status=401, headers={"WWW-Authenticate": 'Bearer realm="wmrl-calibration"'})
        try:
            if request.content_length is not None and request.content_length > self.max_body_bytes:
                raise BadRequest(f"body of {request.content_length} bytes exceeds the limit of "
                                 f"{self.max_body_bytes} bytes (--max-body-bytes)", 413)
            try:
                body = await request.read()
            except web.HTTPRequestEntityTooLarge:
                raise BadRequest(f"body exceeds the limit of {self.max_body_bytes} bytes (--max-body-bytes)", 413)
            trainer, batch, groups = parse_observation(body)
        except BadRequest as exc:
            self.metrics.bad_requests.inc()
            return _error(str(exc), exc.status)
        future = asyncio.get_running_loop().create_future()
        await self.pending.put((trainer, batch, groups, future))
        try:
            return web.json_response(await future)
        except (StateError, StoreError) as exc:
            return _error(str(exc), 503)

    async def _load_view(self) -> dict:
        state = await asyncio.get_running_loop().run_in_executor(self.readers, self.store.load)
        return state.view()

    async def get_calibration(self, request: web.Request) -> web.Response:
        try:
            return web.json_response(await self._load_view())
        except (StateError, StoreError) as exc:
            return _error(str(exc), 503)

    async def healthz(self, request: web.Request) -> web.Response:
        try:
            view = await self._load_view()
        except (StateError, StoreError) as exc:
            return _error(str(exc), 503)
        return web.json_response({"ok": True, "store": self.store.describe(), "version": view["version"]})

    async def livez(self, request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    async def metrics_handler(self, request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})


def _error(message: str, status: int) -> web.Response:
    return web.json_response({"error": message}, status=status)


CONFIG_ENV = "WMRL_CALIBRATION_CONFIG"


def config_defaults() -> CalibrationConfig:
    """The paper's defaults, or the camelCase JSON in ``$WMRL_CALIBRATION_CONFIG`` (set by the operator)."""
    text = os.environ.get(CONFIG_ENV)
    if not text:
        return CalibrationConfig()
    try:
        return CalibrationConfig.from_json(json.loads(text))
    except (ValueError, TypeError) as exc:
        print(f"wmrl calibration serve: invalid ${CONFIG_ENV}: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags for every knob; their defaults come from :func:`config_defaults` (explicit flags win)."""
    d = config_defaults()
    parser.add_argument("--bins", type=int, default=d.bins, help="isotonic bins on [0,1] (default %(default)s)")
    parser.add_argument("--min-pairs", type=int, default=d.min_pairs, help="pairs before the first fit (default %(default)s)")
    parser.add_argument("--refit-every", type=int, default=d.refit_every, help="new pairs between fits (default %(default)s)")
    parser.add_argument("--buffer-size", type=int, default=d.buffer_size, help="FIFO pair buffer (default %(default)s)")
    parser.add_argument("--target-weight", type=float, default=d.target_weight, help="weight at warm-up end (default %(default)s)")
    parser.add_argument("--max-weight", type=float, default=d.max_weight, help="weight cap (default %(default)s)")
    parser.add_argument("--half-life", type=float, default=d.half_life, help="disagreement half-life in groups (default %(default)s)")
    parser.add_argument("--warmup", type=int, default=d.warmup, help="groups before c is frozen (default %(default)s)")
    parser.add_argument("--debiasing-enabled", type=_on_off, default=d.debiasing_enabled, metavar="{true,false}",
                        help="whether trainers apply the map (spec.algorithm.debiasing.enabled): the disagreement is "
                             "measured on calibrated (true) or raw (false) world-model rewards (default %(default)s)")


def _on_off(text: str) -> bool:
    value = text.strip().lower()
    if value in ("true", "on", "yes", "1"):
        return True
    if value in ("false", "off", "no", "0"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def config_from_args(args: argparse.Namespace) -> CalibrationConfig:
    return CalibrationConfig(args.bins, args.min_pairs, args.refit_every, args.buffer_size,
                             args.target_weight, args.max_weight, args.half_life, args.warmup,
                             args.debiasing_enabled)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--configmap", metavar="NAMESPACE/NAME", help="state in this ConfigMap (in-cluster config or KUBECONFIG)")
    where.add_argument("--state-file", metavar="PATH", help="state in this file (local runs without a cluster)")
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, then KUBECONFIG)")
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY)
    parser.add_argument("--store-wait", type=float, default=DEFAULT_STORE_WAIT, metavar="SECONDS",
                        help="how long a store the apiserver refuses (HTTP 403: the service's Role not in effect yet) "
                             f"is retried at start, quietly, before it is reported (default {DEFAULT_STORE_WAIT:g})")
    add_config_arguments(parser)
    parser.epilog = "The config flags apply when the state is created; a stored state keeps its own config."


def main(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = config_from_args(args)
        store = open_store(args.configmap, args.state_file, config, kubeconfig=args.kubeconfig)
    except ValueError as exc:
        print(f"wmrl calibration serve: {exc}", file=sys.stderr)
        return 2
    if args.store_wait < 0:
        print(f"wmrl calibration serve: --store-wait must be >= 0, got {args.store_wait:g}", file=sys.stderr)
        return 2
    service = CalibrationService(store, args.max_body_bytes, token=os.environ.get(TOKEN_ENV),
                                 store_wait=args.store_wait)
    if service.token is None and args.host not in ("127.0.0.1", "localhost", "::1"):
        log.warning("no %s: any client that reaches %s:%d can add observations", TOKEN_ENV, args.host, args.port)
    web.run_app(service.app(), host=args.host, port=args.port, access_log=None,
                print=lambda msg: log.info("%s", msg))
    return 0
