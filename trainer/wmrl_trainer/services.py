"""What a run on this machine uses in place of a cluster's: local service processes.

:class:`LocalServices` starts sandbox servers (``wmrl sandbox serve``) and, on request, a
calibration service on a state file (``wmrl calibration serve --state-file``), each a
:class:`Service` on 127.0.0.1 and a free port, healthy once ``GET /healthz`` answers, and
stops them all on exit, error or not (and, on Linux, when this process dies: the kernel
sends them SIGTERM, PR_SET_PDEATHSIG). :func:`local_runtime` points a run's config at such
services and :func:`quiet_libraries` keeps transformers' and TRL's chatter off the terminal.

``wmrl run`` (:mod:`wmrl_trainer.local`) and the benchmarks (:mod:`wmrl_bench`) use them.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional, Sequence

import httpx

from wmrl.api.runconfig import RunConfig, Runtime


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` now (the kernel picks it)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _die_with_parent() -> None:
    """Child-side (preexec): get SIGTERM if the parent dies, so nothing outlives a killed runner."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


class ServiceStartError(RuntimeError):
    """A local service (sandbox server, calibration service) exited or never became healthy."""


class Service:
    """One local server process on 127.0.0.1:<free port>, healthy once ``GET /healthz`` answers 200.

    It runs in its own session, so a Ctrl-C at the terminal reaches only the runner, which
    checkpoints while the services keep serving, then stops them.
    """

    def __init__(self, name: str, argv: Sequence[str], port: int, log_path: Path):
        self.name, self.port = name, port
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log_path, "ab")
        self.proc = subprocess.Popen(list(argv), stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True, preexec_fn=_die_with_parent)

    def wait_healthy(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServiceStartError(f"{self.name} exited with {self.proc.returncode} at start "
                                        f"(log {self.log_path}):\n{self.log_tail()}")
            try:
                if httpx.get(self.url + "/healthz", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise ServiceStartError(f"{self.name} not healthy after {timeout:.0f}s (log {self.log_path}):\n{self.log_tail()}")

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, grace: float = 5.0) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait()
        self._log.close()


def _wmrl(*args: str) -> list[str]:
    return [sys.executable, "-m", "wmrl.cli", *args]


def calibration_flags(algorithm: Any) -> list[str]:
    """The calibration service's config flags for a run's ``spec.algorithm`` (debiasing + denoising)."""
    d, n = algorithm.debiasing, algorithm.denoising
    return ["--bins", str(d.bins), "--min-pairs", str(d.min_pairs), "--refit-every", str(d.refit_every),
            "--buffer-size", str(d.buffer_size), "--target-weight", str(n.target_weight),
            "--max-weight", str(n.max_weight), "--half-life", str(n.half_life), "--warmup", str(n.warmup),
            "--debiasing-enabled", "true" if d.enabled else "false"]


class LocalServices:
    """Sandbox servers and (optionally) a calibration service for one or more local runs.

    ``tasks_dir``: a directory of tasks the servers mount as a sandbox Pod mounts the tasks volume
    (``--tasks-dir``: each execution sees the public directory its request names at ``data/``, and
    nothing else of the directory).

    ``with LocalServices(n, logs) as services: ... services.start_calibration(state, algorithm)``;
    everything started is stopped on exit, in reverse order, even after an error.
    """

    def __init__(self, sandboxes: int, log_dir: Path, slots: int = 1, isolation: str = "namespaces",
                 tasks_dir: Optional[str] = None):
        if sandboxes < 1:
            raise ValueError(f"--sandboxes must be >= 1, got {sandboxes}")
        self.n_sandboxes, self.slots, self.log_dir, self.isolation = sandboxes, slots, log_dir, isolation
        self.tasks_dir = tasks_dir  # the sandboxes' --tasks-dir, as a sandbox Pod mounts the tasks volume
        self.services: list[Service] = []
        self.sandboxes: list[Service] = []
        self._work_root: Optional[str] = None

    def __enter__(self) -> "LocalServices":
        try:
            self._work_root = tempfile.mkdtemp(prefix="wmrl-run-sandbox-")
            os.chmod(self._work_root, 0o711)
            for i in range(self.n_sandboxes):
                port = free_port()
                root = os.path.join(self._work_root, str(i))
                os.makedirs(root)
                os.chmod(root, 0o711)
                mount = ("--tasks-dir", self.tasks_dir) if self.tasks_dir else ()
                svc = Service(f"sandbox-{i}", _wmrl("sandbox", "serve", "--host", "127.0.0.1", "--port", str(port),
                                                    "--slots", str(self.slots), "--work-root", root,
                                                    "--isolation", self.isolation, *mount),
                              port, self.log_dir / f"sandbox-{i}.log")
                self.services.append(svc)
                self.sandboxes.append(svc)
            self._record()
            for svc in self.sandboxes:
                svc.wait_healthy()
        except BaseException:
            self.close()
            raise
        return self

    @property
    def sandbox_urls(self) -> list[str]:
        return [s.url for s in self.sandboxes]

    def sandbox_isolation(self) -> str:
        """How the sandboxes isolate each execution, in a line (from the first one's ``/healthz``)."""
        return isolation_line(httpx.get(self.sandboxes[0].url + "/healthz", timeout=5.0).json())

    def start_calibration(self, state_file: Path, algorithm: Any, name: str = "calibration") -> Service:
        port = free_port()
        svc = Service(name, _wmrl("calibration", "serve", "--state-file", str(state_file), "--host", "127.0.0.1",
                                  "--port", str(port), *calibration_flags(algorithm)),
                      port, self.log_dir / f"{name}.log")
        self.services.append(svc)
        self._record()
        svc.wait_healthy()
        return svc

    def _record(self) -> None:
        """``<logs>/services.json``: name, pid and URL of every service started (for operators and tests)."""
        path = self.log_dir / "services.json"
        known = json.loads(path.read_text()) if path.is_file() else []
        seen = {entry["pid"] for entry in known}
        known += [{"name": s.name, "pid": s.proc.pid, "url": s.url} for s in self.services if s.proc.pid not in seen]
        write_json_atomic(path, known)

    def stop(self, svc: Service) -> None:
        svc.stop()
        if svc in self.services:
            self.services.remove(svc)

    def close(self) -> None:
        while self.services:
            self.services.pop().stop()
        self.sandboxes.clear()
        if self._work_root:
            shutil.rmtree(self._work_root, ignore_errors=True)
            self._work_root = None

    def __exit__(self, *exc: Any) -> None:
        self.close()


def isolation_line(health: dict) -> str:
    """A sandbox server's isolation (its ``/healthz``) in words: the mode, what it gives each
    execution, and which self-test layers do not hold."""
    iso = health.get("isolation") or {}
    mode = iso.get("mode", "unknown")
    given = {"root": "a uid of its own per slot, network, mount and IPC namespaces",
             "namespaces": "user, PID, network, mount and IPC namespaces of its own (bubblewrap)",
             "unisolated": "no namespaces of its own: it runs as the server's uid"}.get(mode, "")
    failing = [layer for layer, holds in (health.get("layers") or {}).items() if not holds]
    line = f"isolation {mode}" + (f" (each execution: {given})" if given else "")
    return line + (f"; NOT holding: {', '.join(failing)}" if failing else "; every self-test layer holds")


def write_json_atomic(path: Path, data: Any) -> None:
    """Write ``data`` as JSON through a temporary file and a rename: a reader never sees half a file."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=1, default=float))
    os.replace(tmp, path)


# ---------------------------------------------------------------- a local run's settings

def local_tasks_dir(config: RunConfig, isolation: str) -> Optional[str]:
    """The directory local sandboxes mount, as sandbox Pods mount the tasks volume: ``spec.tasks.path``
    (resolved) when the sandboxes give each execution a mount namespace (``namespaces``); None otherwise
    (builtin suites, or ``restricted`` sandboxes, which could not hide the answers: task data is then
    uploaded with each execution, up to its size limit)."""
    if isolation != "namespaces" or not config.spec.tasks.path:
        return None
    return os.path.realpath(config.spec.tasks.path)


def local_runtime(config: RunConfig, results_dir: Path, sandbox_urls: Sequence[str],
                  calibration_url: Optional[str], tasks_dir: Optional[str] = None) -> RunConfig:
    """``config`` pointed at local services: these sandboxes and calibration service, checkpoints and
    results under ``results_dir``, and no status patching or metrics port (there is no cluster).
    ``tasks_dir``: the directory the sandboxes mount (:func:`local_tasks_dir`), whose collection tasks'
    public directories are then mounted into executions instead of uploaded."""
    runtime = Runtime(sandbox_urls=list(sandbox_urls), calibration_url=calibration_url,
                      checkpoint_dir=str(results_dir / "checkpoints"), results_dir=str(results_dir),
                      world_model_url=config.spec.world_model.endpoint, patch_status=False, metrics_port=None,
                      tasks_dir=tasks_dir, sandbox_mounts_tasks=tasks_dir is not None)
    return config.model_copy(update={"runtime": runtime})


def quiet_libraries() -> None:
    """No deprecation chatter or weight-loading bars from transformers/TRL over the progress bar."""
    import warnings

    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning, module=r"(transformers|trl|torch)\.")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()
    except ImportError:
        pass
