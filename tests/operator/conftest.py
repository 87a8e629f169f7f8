"""Cluster fixtures for the operator tests: the CRD, a fresh namespace per module, and a real
`wmrl operator` subprocess watching it (KUBECONFIG pointing at tests/cluster's apiserver)."""

import json
import uuid

import pytest
import yaml

from operator_helpers import Operator
from wmrl.api.crd import crd_yaml


class Kube:
    """kubectl against the test cluster, scoped to one namespace."""

    def __init__(self, cluster, namespace):
        self.cluster, self.ns = cluster, namespace

    def run(self, *args, check=True, input=None):
        return self.cluster.kubectl(*args, check=check, input=input)

    def apply(self, obj, check=True):
        return self.run("apply", "-n", self.ns, "-f", "-", input=yaml.safe_dump(obj), check=check)

    def get(self, kind, name=None, selector=None):
        args = ["get", kind, "-n", self.ns, "-o", "json"]
        if name:
            args.insert(2, name)
        if selector:
            args += ["-l", selector]
        res = self.run(*args, check=False)
        if res.returncode != 0:
            return None
        return json.loads(res.stdout)

    def items(self, kind, selector):
        return (self.get(kind, selector=selector) or {}).get("items", [])

    def status(self, name):
        return (self.get("wmrlrun", name) or {}).get("status") or {}

    def events(self, name, field="reason", reason=None):
        """``field`` of every Event about object ``name`` (only those with ``reason`` if given)."""
        selector = f"involvedObject.name={name}" + (f",reason={reason}" if reason else "")
        return self.run("get", "events", "-n", self.ns, "--field-selector", selector,
                        "-o", f"jsonpath={{.items[*].{field}}}").stdout

    def patch_status(self, name, status):
        self.run("patch", "wmrlrun", name, "-n", self.ns, "--subresource=status", "--type=merge",
                 "-p", json.dumps({"status": status}))

    def trainer_pods(self, run):
        return self.items("pods", f"wmrl.dev/run={run},app.kubernetes.io/component=trainer")

    def finish_pods(self, run, phase):
        """kwok: annotate the trainer pods so they terminate with ``phase``."""
        pods = [p for p in self.trainer_pods(run) if p["status"].get("phase") not in ("Succeeded", "Failed")]
        for pod in pods:
            self.run("annotate", "pod", pod["metadata"]["name"], "-n", self.ns, f"wmrl.dev/kwok-phase={phase}", "--overwrite")
        return len(pods)


@pytest.fixture(scope="session")
def crd_installed(k8s_cluster):
    k8s_cluster.kubectl("apply", "-f", "-", input=crd_yaml())
    k8s_cluster.kubectl("wait", "--for", "condition=established", "crd/wmrlruns.wmrl.dev", "--timeout=30s")
    return k8s_cluster


@pytest.fixture(scope="module")
def namespace(crd_installed):
    ns = f"op-{uuid.uuid4().hex[:8]}"
    crd_installed.kubectl("create", "namespace", ns)
    yield ns
    crd_installed.kubectl("delete", "namespace", ns, "--wait=false", check=False)


@pytest.fixture(scope="module")
def kube(crd_installed, namespace):
    return Kube(crd_installed, namespace)


@pytest.fixture(scope="session")
def kwok_nodes(k8s_cluster):
    """Skip where pods cannot be finished by annotation: a cluster without kwok nodes (e.g. kind,
    whose pods run the real images). On tests/cluster's control plane this never skips."""
    res = k8s_cluster.kubectl("get", "nodes", "-l", "type=kwok", "-o", "name", check=False)
    if res.returncode != 0 or not res.stdout.strip():
        pytest.skip("needs kwok nodes (trainer pods finished with the wmrl.dev/kwok-phase annotation)")


@pytest.fixture(scope="module")
def operator(crd_installed, namespace, tmp_path_factory):
    op = Operator(crd_installed.kubeconfig, namespace, tmp_path_factory.mktemp("operator") / "operator.log").start()
    yield op
    op.stop()


@pytest.fixture(scope="session")
def kueue(crd_installed, tmp_path_factory):
    """Kueue's controller manager (built from source with the control plane) watching the test cluster;
    see tests/cluster/kueue.py. On an external cluster (WMRL_KUBECONFIG, e.g. kind) Kueue must already run."""
    import importlib.util
    import os
    from pathlib import Path

    if os.environ.get("WMRL_KUBECONFIG"):
        res = crd_installed.kubectl("get", "crd", "workloads.kueue.x-k8s.io", check=False)
        if res.returncode != 0:
            pytest.skip("the external cluster has no Kueue (install it to run the admission tests there)")
        yield None
        return
    path = Path(__file__).resolve().parents[1] / "cluster" / "kueue.py"
    spec = importlib.util.spec_from_file_location("wmrl_kueue", path)
    module = importlib.util.module_from_spec(spec)
    import sys

    sys.modules["wmrl_kueue"] = module  # dataclasses look their module up while executing it
    spec.loader.exec_module(module)
    manager = module.start(crd_installed, tmp_path_factory.mktemp("kueue"))
    yield manager
    manager.stop()
