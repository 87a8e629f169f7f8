"""Start ``wmrl sandbox serve`` as a local subprocess (benchmarks, tests, ``wmrl run``)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Optional

import httpx

_LISTENING = re.compile(r"listening on (http://\S+)")


class LocalServer:
    """A sandbox server process on ``host`` (127.0.0.1) with a free port; use as a context manager.

    ``work_root`` defaults to a fresh directory under the system temp dir (searchable by the
    per-slot uids), removed on exit. ``prefix`` wraps the command (e.g. setpriv to run the
    server as another user). ``user``: run the server as that uid (from root, through setpriv),
    as the image runs it: the deployed (namespaces) mode; the default work root is then its own.
    """

    def __init__(self, *, host: str = "127.0.0.1", slots: Optional[int] = None, args: tuple[str, ...] = (), env: Optional[dict] = None,
                 work_root: Optional[str] = None, start_timeout: float = 30.0, prefix: tuple[str, ...] = (),
                 user: Optional[int] = None):
        self._own_root = work_root is None
        self.work_root = work_root or tempfile.mkdtemp(prefix="wmrl-sandbox-")
        os.chmod(self.work_root, 0o711)
        if user is not None:
            prefix = ("setpriv", "--reuid", str(user), "--regid", str(user), "--clear-groups", *prefix)
            if self._own_root:
                os.chown(self.work_root, user, user)
        cmd = [*prefix, sys.executable, "-m", "wmrl.cli", "sandbox", "serve", "--host", host, "--port", "0",
               "--work-root", self.work_root, *(("--slots", str(slots)) if slots else ()), *args]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env={**os.environ, **(env or {})})
        self.log: list[str] = []
        self.url = self._wait_listening(start_timeout)

    def _wait_listening(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        lines = []
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            match = _LISTENING.search(line)
            if match:
                self.log.extend(lines)  # the start-up lines (warnings, the self-test's) stay readable
                # Keep draining the server's output so a chatty server never blocks on a full pipe.
                threading.Thread(target=self._drain, daemon=True).start()
                return match.group(1)
        self.close()
        raise RuntimeError("sandbox server did not start:\n" + "".join(lines))

    def _drain(self) -> None:
        for line in self.proc.stdout:
            self.log.append(line)
            del self.log[:-200]

    @property
    def pid(self) -> int:
        return self.proc.pid

    def healthz(self) -> dict:
        return httpx.get(f"{self.url}/healthz", timeout=5).json()

    def kill(self) -> None:
        """SIGKILL the server (a dead Pod)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
        if self._own_root:
            shutil.rmtree(self.work_root, ignore_errors=True)

    def __enter__(self) -> "LocalServer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
