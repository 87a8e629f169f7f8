"""``wmrl sandbox serve``: SandboxFusion-compatible ``POST /run_code`` for Python.

One server per sandbox Pod. It owns ``--slots`` exclusive execution slots (default 1: one
execution owns the sandbox); a request arriving while all are busy gets ``429`` with
``Retry-After`` at once and is never queued here: queueing and retrying belong to the
client (:mod:`wmrl_sandbox.dispatcher`), which can send it to another Pod.

Request (JSON): ``code``, ``language`` (``python``), ``run_timeout`` (s), ``memory_limit_MB``
(-1 = server default), ``stdin``, ``files`` {path: base64}, ``fetch_files`` [path];
``compile_timeout`` is accepted and ignored. Response: ``status`` Success | Failed |
SandboxError, ``message``, ``compile_result`` (null), ``run_result`` {status Finished |
TimeLimitExceeded | Error, execution_time, return_code, stdout, stderr, plus
stdout_truncated/stderr_truncated}, ``files`` {path: base64}, ``executor_pod_name``.

Errors: a body that is not a valid request -> 422 ``{"detail": [...], "error": ...}`` (the
shape FastAPI gives SandboxFusion's clients, plus our ``error`` message); not JSON -> 400;
over ``--max-body-bytes`` -> 413; all slots busy -> 429.
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
from concurrent.futures import ThreadPoolExecutor
from typing import Literal, Optional

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from wmrl_sandbox import executor
from wmrl_sandbox.executor import ExecutionRequest, ExecutionResult, Isolation, Limits, RequestError

log = logging.getLogger("wmrl.sandbox")

DEFAULT_PORT = 8080
DEFAULT_MAX_BODY_BYTES = 64 << 20


class RunCodeRequest(BaseModel):
    """The subset of SandboxFusion's request this server runs (unknown fields are ignored)."""

    model_config = ConfigDict(extra="ignore")

    code: str
    language: Literal["python"]
    run_timeout: float = Field(10, gt=0)
    compile_timeout: float = 10
    memory_limit_MB: int = -1
    stdin: Optional[str] = None
    files: dict[str, Optional[str]] = {}
    fetch_files: list[str] = []


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


def response_body(result: ExecutionResult, pod: str) -> dict:
    if result.status == "Error":
        status, message = "SandboxError", result.stderr
    elif result.status == "TimeLimitExceeded" or result.return_code != 0:
        status, message = "Failed", ""
    else:
        status, message = "Success", ""
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
        },
        "executor_pod_name": pod,
        "files": {name: base64.b64encode(data).decode("ascii") for name, data in result.files.items()},
    }


class Metrics:
    def __init__(self, slots: int):
        self.registry = CollectorRegistry()
        r = self.registry
        Gauge("wmrl_sandbox_slots", "Execution slots of this server", registry=r).set(slots)
        self.busy = Gauge("wmrl_sandbox_busy_slots", "Slots running an execution now", registry=r)
        self.executions = Counter("wmrl_sandbox_executions_total", "Executions by outcome",
                                  ["outcome"], registry=r)
        self.rejected = Counter("wmrl_sandbox_rejected_total", "Requests refused before running",
                                ["reason"], registry=r)
        self.duration = Histogram("wmrl_sandbox_execution_seconds", "Wall time of executions", registry=r,
                                  buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600))
        self.leftovers = Counter("wmrl_sandbox_leftover_processes_killed_total",
                                 "Processes an execution left behind that the server killed", registry=r)


class SandboxServer:
    """The aiohttp application and the slot bookkeeping around :func:`executor.execute`."""

    def __init__(self, *, slots: int = 1, work_root: Optional[str] = None, limits: Limits = Limits(),
                 max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, isolation: Optional[Isolation] = None,
                 python: str = sys.executable, uid_base: int = 62000):
        if slots < 1:
            raise ValueError(f"slots must be >= 1, got {slots}")
        self.slots = slots
        self.work_root = work_root or os.path.join(tempfile.gettempdir(), "wmrl-sandbox")
        os.makedirs(self.work_root, mode=0o711, exist_ok=True)
        if os.stat(self.work_root).st_uid == os.geteuid():
            os.chmod(self.work_root, 0o711)  # others may traverse (the slot uids), not list
        self.limits = limits
        self.max_body_bytes = max_body_bytes
        self.python = python
        self.isolation = isolation or executor.probe_isolation()
        if self.isolation.as_root:
            executor.check_searchable(self.work_root)
        self.uid_pool = executor.UidPool(slots, base=uid_base) if self.isolation.as_root else None
        self._free_uids = list(self.uid_pool.uids) if self.uid_pool else [None] * slots
        self.busy = 0
        self.pool = ThreadPoolExecutor(max_workers=slots, thread_name_prefix="sandbox-exec")
        self.metrics = Metrics(slots)
        self.pod = os.environ.get("POD_NAME") or os.environ.get("MY_POD_NAME") or socket.gethostname()
        executor.set_child_subreaper()

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.max_body_bytes)
        app.router.add_post("/run_code", self.run_code)
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/metrics", self.metrics_handler)
        app.on_cleanup.append(self._cleanup)
        return app

    async def _cleanup(self, _app) -> None:
        self.pool.shutdown(wait=True)
        if self.uid_pool:
            self.uid_pool.close()

    async def healthz(self, _request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "slots": self.slots, "busy": self.busy,
                                  "isolation": self.isolation.describe(),
                                  "uids": self.uid_pool.uids if self.uid_pool else []})

    async def metrics_handler(self, _request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.metrics.registry),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def run_code(self, request: web.Request) -> web.Response:
        if self.busy >= self.slots:
            self.metrics.rejected.labels("busy").inc()
            return web.json_response({"error": f"all {self.slots} execution slot(s) busy; retry later"},
                                     status=429, headers={"Retry-After": "1"})
        if request.content_length is not None and request.content_length > self.max_body_bytes:
            self.metrics.rejected.labels("too_large").inc()
            return _error(413, f"request body of {request.content_length} bytes exceeds {self.max_body_bytes}")
        self.busy += 1  # taken before any await: the event loop makes check-and-take atomic
        self.metrics.busy.set(self.busy)
        uid = self._free_uids.pop()
        try:
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
                result = await loop.run_in_executor(self.pool, self._execute, job, uid)
            except RequestError as exc:
                self.metrics.rejected.labels("invalid").inc()
                return _invalid([{"type": "value_error", "loc": ["body"], "msg": str(exc)}])
            self.metrics.duration.observe(time.monotonic() - started)
            if result.status == "Error":
                log.warning("execution failed in the sandbox: %s", result.stderr)
            body = response_body(result, self.pod)
            outcome = "TimeLimitExceeded" if result.status == "TimeLimitExceeded" else body["status"]
            self.metrics.executions.labels(outcome).inc()
            self.metrics.leftovers.inc(result.leftover_processes_killed)
            return web.json_response(body)
        finally:
            self._free_uids.append(uid)
            self.busy -= 1
            self.metrics.busy.set(self.busy)

    def _parse(self, raw: bytes) -> ExecutionRequest:
        data = json.loads(raw)
        if not isinstance(data, dict):
            raise ValueError("expected a JSON object")
        req = RunCodeRequest.model_validate(data)
        return ExecutionRequest(code=req.code, run_timeout=req.run_timeout, memory_limit_mb=req.memory_limit_MB,
                                stdin=req.stdin, files=decode_files(req.files), fetch_files=list(req.fetch_files))

    def self_check(self) -> None:
        """Run one trivial program before serving; raise RuntimeError with the reason if it fails.

        A sandbox that cannot run anything (an interpreter hidden by the isolation, a broken
        work root) would otherwise answer every request with an error, and a trainer would
        retry its executions for ever instead of being told why.
        """
        marker = "wmrl-sandbox-self-check-ok"
        result = self._execute(ExecutionRequest(code=f"print({marker!r})", run_timeout=30.0), self._free_uids[0])
        if result.status != "Finished" or result.return_code != 0 or marker not in result.stdout:
            detail = (result.stderr or result.stdout).strip()[-2000:]
            raise RuntimeError(f"self-check failed: running print() with {self.python} gave status {result.status}, "
                               f"exit code {result.return_code}" + (f":\n{detail}" if detail else ""))

    def _execute(self, job: ExecutionRequest, uid: Optional[int]) -> ExecutionResult:
        return executor.execute(job, work_root=self.work_root, uid=uid, isolation=self.isolation,
                                limits=self.limits, python=self.python)


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
    parser.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES)
    parser.add_argument("--work-root", default=_env("WMRL_SANDBOX_WORK_DIR", str, None),
                        help="where execution directories are made (env WMRL_SANDBOX_WORK_DIR; "
                        "default $TMPDIR/wmrl-sandbox; in the image /work/exec on an emptyDir)")
    parser.add_argument("--memory-mb", type=int, default=d.memory_mb, help="address-space limit when a request sets none")
    parser.add_argument("--max-memory-mb", type=int, default=d.max_memory_mb)
    parser.add_argument("--max-run-timeout", type=float,
                        default=_env("WMRL_SANDBOX_TIMEOUT_SECONDS", float, d.max_run_timeout),
                        help="cap on a request's run_timeout (env WMRL_SANDBOX_TIMEOUT_SECONDS)")
    parser.add_argument("--nproc", type=int, default=d.nproc, help="process/thread limit per execution")
    parser.add_argument("--file-size-mb", type=int, default=d.file_size_mb)
    parser.add_argument("--max-output-bytes", type=int, default=d.max_output_bytes, help="per stream")
    parser.add_argument("--uid-base", type=int, default=62000, help="first uid of the per-slot uids (root mode)")
    parser.add_argument("--python", default=sys.executable, help="interpreter that runs the code")


def main(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    limits = Limits(memory_mb=args.memory_mb, max_memory_mb=args.max_memory_mb,
                    max_run_timeout=args.max_run_timeout, nproc=args.nproc, file_size_mb=args.file_size_mb,
                    max_output_bytes=args.max_output_bytes)
    if os.environ.get("TMPDIR"):  # the image points it into /work, an emptyDir that starts empty
        os.makedirs(os.environ["TMPDIR"], exist_ok=True)
    try:
        server = SandboxServer(slots=args.slots, work_root=args.work_root, limits=limits,
                               max_body_bytes=args.max_body_bytes, python=args.python, uid_base=args.uid_base)
        server.self_check()
    except (ValueError, RuntimeError, OSError) as exc:
        print(f"wmrl sandbox serve: {exc}", file=sys.stderr)
        return 2
    return asyncio.run(_serve(server, args.host, args.port))


async def _serve(server: SandboxServer, host: str, port: int) -> int:
    runner = web.AppRunner(server.app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1]  # the real port when --port 0
    print(f"wmrl sandbox: listening on http://{host}:{bound} slots={server.slots} "
          f"isolation={json.dumps(server.isolation.describe())}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()
    return 0
