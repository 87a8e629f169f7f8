"""Real `wmrl calibration serve` processes on 127.0.0.1 for the calibration tests."""

import time

import httpx
import numpy as np
import pytest

from subprocesses import CalibrationServer


@pytest.fixture
def servers(tmp_path):
    started = []

    def make(*args, env=None):
        server = CalibrationServer(args, env=env, log_path=tmp_path / f"server-{len(started)}.log")
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
