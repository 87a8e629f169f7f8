"""status.calibration is copied from a REAL calibration service into a run on the real apiserver.

The one thing that cannot exist here is cluster DNS: the operator asks for
``http://<calibration>.<ns>.svc:8080/v1/calibration``, and kwok pods run nothing. So the service
runs as a local process on 127.0.0.1 and the fetch function the operator injects into its
Reconciler maps that in-cluster URL onto it (the fetch itself is the operator's own).
"""

import asyncio
import socket
import subprocess
import sys
import time

import httpx
import numpy as np
import pytest

from operator_helpers import run_manifest, wait_for
from wmrl_operator.handlers import _fetch_calibration
from kubernetes import client as k8s_client, config as k8s_config

from wmrl_operator.kube import Kube as ApiClient
from wmrl_operator.reconcile import Reconciler

pytestmark = pytest.mark.cluster


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def calibration_service(tmp_path):
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "wmrl.cli", "calibration", "serve", "--state-file",
                             str(tmp_path / "state.json"), "--host", "127.0.0.1", "--port", str(port),
                             "--min-pairs", "16", "--refit-every", "8", "--warmup", "2"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: _healthy(url), timeout=30, what="calibration service")
    yield url
    proc.terminate()
    proc.wait(10)


def _healthy(url):
    try:
        return httpx.get(url + "/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def test_status_calibration_mirrors_the_service(kube, namespace, calibration_service):
    rng = np.random.default_rng(0)
    groups = []
    for _ in range(6):
        real = rng.random(8).round(3)
        noisy = np.clip(np.sqrt(real) + rng.normal(0, 0.1, 8), 0, 1).round(6)
        groups.append({"task": "t", "wm": noisy.tolist(), "env": real.tolist()})
    resp = httpx.post(calibration_service + "/v1/observations",
                      json={"trainer": "t0", "batch": "b0", "groups": groups}, timeout=10)
    assert resp.status_code == 200, resp.text
    view = httpx.get(calibration_service + "/v1/calibration", timeout=5).json()
    assert view["pairs"] == 48

    kube.apply(run_manifest("calstatus"))
    asked = []

    async def fetch(url):
        asked.append(url)
        return await _fetch_calibration(url.replace(f"http://calstatus-calibration.{namespace}.svc:8080",
                                                    calibration_service), 5.0)

    async def refresh():
        cfg = k8s_client.Configuration()
        k8s_config.load_kube_config(config_file=str(kube.cluster.kubeconfig), client_configuration=cfg)
        api = ApiClient(cfg)
        try:
            await Reconciler(api, fetch_calibration=fetch).refresh_calibration(namespace, "calstatus")
        finally:
            await api.close()

    asyncio.run(refresh())

    assert asked == [f"http://calstatus-calibration.{namespace}.svc:8080/v1/calibration"]
    status = wait_for(lambda: kube.status("calstatus").get("calibration"), what="status.calibration")
    assert status["name"] == "calstatus-calibration"
    assert status["pairs"] == 48
    assert status["weight"] == pytest.approx(view["weight"])
    assert status.get("reduction") == pytest.approx(view["bias"]["reduction"])
    assert (kube.status("calstatus").get("progress") or {}) == {}  # never touches the trainer's block
