"""Real subprocesses under test that can be SIGKILLed on demand or stopped gracefully."""

import os
import signal
import socket
import subprocess
import sys
import time

import httpx


class ManagedProcess:
    """Subclasses start ``self.proc``; ``stop`` sends SIGTERM and falls back to SIGKILL after ``stop_timeout``."""

    proc = None
    stop_timeout = 10.0

    def kill9(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                self.kill9()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class CalibrationServer(ManagedProcess):
    """`wmrl calibration serve ARGS` on 127.0.0.1:<free port>; ``start`` returns once ``/livez`` answers."""

    def __init__(self, args, env=None, log_path=None):
        self.args, self.env, self.log_path = list(args), env, log_path
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = None

    def start(self, timeout=30.0):
        cmd = [sys.executable, "-m", "wmrl.cli", "calibration", "serve", "--host", "127.0.0.1",
               "--port", str(self.port), *self.args]
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        self.proc = subprocess.Popen(cmd, env={**os.environ, **(self.env or {})}, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"server exited with {self.proc.returncode}"
            try:
                if httpx.get(self.url + "/livez", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise TimeoutError("calibration service did not start")
