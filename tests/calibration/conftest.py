"""Real `wmrl calibration serve` processes on 127.0.0.1 for the calibration tests."""

import os
import socket
import subprocess
import sys
import time

import httpx
import numpy as np
import pytest

from subprocesses import ManagedProcess


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server(ManagedProcess):
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



@pytest.fixture
def servers(tmp_path):
    started = []

    def make(*args, env=None):
        server = Server(args, env=env, log_path=tmp_path / f"server-{len(started)}.log")
        started.append(server)
        return server

    yield make
    for server in started:
        server.stop()


def observation_group(rng, size=8):
    """One anchor group whose world model over-rates non-linearly (sqrt of the real reward)."""
    real = rng.random(size).round(3)
    return {"task": "t", "wm": np.sqrt(real).round(6).tolist(), "env": real.tolist()}


def _hammer(url, trainer, n_batches, acked, stop, groups_per_batch=4):
    """Post batches, retrying each (same id) until acknowledged; record what was acknowledged."""
    rng = np.random.default_rng(abs(hash(trainer)) % 2**32)
    http = httpx.Client(timeout=10)
    for i in range(n_batches):
        body = {"trainer": trainer, "batch": str(i), "groups": [observation_group(rng) for _ in range(groups_per_batch)]}
        while not stop.is_set():
            try:
                if http.post(url + "/v1/observations", json=body).status_code == 200:
                    acked.append((trainer, str(i)))
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.02)
    http.close()


@pytest.fixture
def hammer():
    return _hammer


@pytest.fixture
def make_group():
    return observation_group
