"""A calibration service that starts before its RBAC is in effect, on the real apiserver.

The operator writes the service's Role, RoleBinding and Deployment together, and a Pod can be
running before the apiserver authorizes its service account: its first ConfigMap GET got a 403,
logged as an error, on a real node. Here the service runs as its own service account (a token
from the TokenRequest API) with no Role at all; the Role and RoleBinding are created while it
waits. It must then serve, having logged no error; one whose Role never comes says so, once.
"""

import json
import uuid

import httpx
import pytest
import yaml

from subprocesses import CalibrationServer
from wmrl.calibration.store import ConfigMapStore, StoreDenied

pytestmark = pytest.mark.cluster


@pytest.fixture
def service_account(k8s_cluster, tmp_path):
    """(namespace, kubeconfig path of a fresh service account with no permissions)."""
    ns = f"cal-rbac-{uuid.uuid4().hex[:8]}"
    k8s_cluster.kubectl("create", "namespace", ns)
    k8s_cluster.kubectl("create", "serviceaccount", "calibration", "-n", ns)
    token = k8s_cluster.kubectl("create", "token", "calibration", "-n", ns, "--duration=1h").stdout.strip()
    admin = yaml.safe_load(open(k8s_cluster.kubeconfig))
    cluster = admin["clusters"][0]
    config = {"apiVersion": "v1", "kind": "Config", "clusters": [cluster],
              "users": [{"name": "calibration", "user": {"token": token}}],
              "contexts": [{"name": "calibration", "context": {"cluster": cluster["name"], "user": "calibration",
                                                               "namespace": ns}}],
              "current-context": "calibration"}
    path = tmp_path / "calibration.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    yield ns, path
    k8s_cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def _grant(k8s_cluster, ns, state):
    """What builders.calibration_objects gives the service: get/update/patch of its one ConfigMap."""
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "calibration"},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [state],
                       "verbs": ["get", "update", "patch"]}]}
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "calibration"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "calibration"},
               "subjects": [{"kind": "ServiceAccount", "name": "calibration", "namespace": ns}]}
    for obj in (role, binding):
        k8s_cluster.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(obj))


def _status(url, path):
    try:
        return httpx.get(url + path, timeout=2).status_code
    except httpx.HTTPError:
        return None


def _wait(predicate, timeout):
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def test_the_service_waits_quietly_for_its_rbac_then_serves(k8s_cluster, service_account, servers, tmp_path):
    ns, kubeconfig = service_account
    k8s_cluster.kubectl("create", "configmap", "calibration-state", "-n", ns)  # the operator makes it, empty
    store = ConfigMapStore(ns, "calibration-state", kubeconfig=str(kubeconfig))
    with pytest.raises(StoreDenied, match="HTTP 403"):  # really refused, for now
        store.load()

    server = servers("--configmap", f"{ns}/calibration-state", "--kubeconfig", str(kubeconfig)).start()
    assert _wait(lambda: server.proc.poll() is None and _status(server.url, "/livez") == 200, 5)
    assert _status(server.url, "/healthz") == 503  # not ready while refused
    assert not _wait(lambda: _status(server.url, "/healthz") == 200, 2)  # it keeps waiting, alive

    _grant(k8s_cluster, ns, "calibration-state")
    assert _wait(lambda: _status(server.url, "/healthz") == 200, 30), server.log_path.read_text()

    def stored():  # /healthz reads on its own; the opener writes the state at its next retry
        obj = json.loads(k8s_cluster.kubectl("get", "configmap", "calibration-state", "-n", ns, "-o", "json").stdout)
        return (obj.get("data") or {}).get("state.json")

    assert _wait(stored, 30), server.log_path.read_text()
    assert json.loads(stored())["version"] == 0  # it created the state once allowed
    server.stop()
    log = server.log_path.read_text()
    assert "ERROR" not in log and "403" not in log, log
    assert "serving ConfigMap" in log and "readable after" in log


def test_a_role_that_never_comes_is_reported_once(k8s_cluster, service_account, servers):
    ns, kubeconfig = service_account
    server = servers("--configmap", f"{ns}/calibration-state", "--kubeconfig", str(kubeconfig),
                     "--store-wait", "1.5").start()
    assert _wait(lambda: "ERROR" in server.log_path.read_text(), 20)
    assert server.proc.poll() is None and _status(server.url, "/healthz") == 503  # alive, not ready
    server.stop()
    errors = [line for line in server.log_path.read_text().splitlines() if "ERROR" in line]
    assert len(errors) == 1 and "HTTP 403" in errors[0] and "still refused after" in errors[0], errors
