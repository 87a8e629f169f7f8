"""The calibration service as the operator deploys it (operator image, ConfigMap-backed) on the real
node: it serves through its Service, and deleting its Pod loses nothing it acknowledged."""

import base64

import httpx
import numpy as np
import pytest

from e2e_helpers import get_json, ready, run_pods, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.e2e]


def _service_url(k8s_cluster, namespace, run):
    svcs = get_json(k8s_cluster, "services", "-n", namespace,
                    "-l", f"wmrl.dev/run={run},app.kubernetes.io/component=calibration")["items"]
    svc = next(s for s in svcs if s["spec"].get("clusterIP") not in (None, "None"))
    return f"http://{svc['spec']['clusterIP']}:{svc['spec']['ports'][0]['port']}"


def _token(k8s_cluster, namespace, run):
    secrets = get_json(k8s_cluster, "secrets", "-n", namespace, "-l", f"wmrl.dev/run={run}")["items"]
    secret = next(s for s in secrets if "token" in s["metadata"]["name"])
    return base64.b64decode(secret["data"]["token"]).decode()


def _group(rng, size=8):
    real = rng.random(size).round(3)
    return {"task": "t", "wm": np.sqrt(real).round(6).tolist(), "env": real.tolist()}


def _post_until_acknowledged(http, url, body, timeout=120):
    def attempt():
        try:
            return http.post(url + "/v1/observations", json=body).status_code == 200
        except httpx.HTTPError:
            return False
    wait_for(attempt, timeout=timeout, interval=0.5, what=f"batch {body['batch']} acknowledged")


def test_calibration_pod_serves_and_survives_its_deletion(k8s_cluster, real_node, sandbox_run, runs_namespace):
    run, _ = sandbox_run
    ns = runs_namespace
    pod = wait_for(lambda: next((p for p in run_pods(k8s_cluster, ns, run, "calibration") if ready(p)), None),
                   timeout=240, what="a Ready calibration Pod")
    assert pod["spec"]["nodeName"] == real_node.name
    url = _service_url(k8s_cluster, ns, run)
    http = httpx.Client(timeout=10, headers={"Authorization": f"Bearer {_token(k8s_cluster, ns, run)}"})
    rng = np.random.default_rng(0)
    before = wait_for(lambda: _view(http, url), timeout=60, what="the calibration through its Service")
    for i in range(10):
        _post_until_acknowledged(http, url, {"trainer": "e2e", "batch": str(i), "groups": [_group(rng) for _ in range(2)]})
    k8s_cluster.kubectl("delete", "pod", pod["metadata"]["name"], "-n", ns, "--grace-period=0", "--force")
    for i in range(10, 14):  # posted while the Pod is away: retried until a new Pod acknowledges them
        _post_until_acknowledged(http, url, {"trainer": "e2e", "batch": str(i), "groups": [_group(rng) for _ in range(2)]})
    again = wait_for(lambda: next((p for p in run_pods(k8s_cluster, ns, run, "calibration")
                                   if ready(p) and p["metadata"]["uid"] != pod["metadata"]["uid"]), None),
                     timeout=240, what="a new Ready calibration Pod")
    assert again["spec"]["nodeName"] == real_node.name
    # a batch sent twice counts once
    _post_until_acknowledged(http, url, {"trainer": "e2e", "batch": "3", "groups": [_group(rng) for _ in range(2)]})
    view = wait_for(lambda: _view(http, url), timeout=60, what="the calibration after the restart")
    assert view["batches"] - before["batches"] == 14
    assert view["pairsSeen"] - before["pairsSeen"] == 14 * 2 * 8


def _view(http, url):
    try:
        resp = http.get(url + "/v1/calibration")
    except httpx.HTTPError:
        return None
    return resp.json() if resp.status_code == 200 else None
