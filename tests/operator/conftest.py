"""Cluster fixtures for the operator tests: the CRD, a fresh namespace per module, and a real
`wmrl operator` subprocess watching it (KUBECONFIG pointing at tests/cluster's apiserver)."""

import json
import os
import subprocess
import sys
import time
import uuid

import pytest
import yaml

from subprocesses import ManagedProcess
from wmrl.api.crd import crd_yaml


class Operator(ManagedProcess):
    """`wmrl operator --standalone --namespace NS` as a real process; restartable and killable."""

    stop_timeout = 15.0

    def __init__(self, kubeconfig, namespace, log_path, resync=1.0):
        self.kubeconfig, self.namespace, self.log_path, self.resync = kubeconfig, namespace, log_path, resync
        self.proc = None

    def start(self):
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig)}
        cmd = [sys.executable, "-m", "wmrl.cli", "operator", "--standalone", "--namespace", self.namespace,
               "--health-port", "0", "--metrics-port", "0", "--resync-interval", str(self.resync),
               "--calibration-interval", "2"]
        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        return self

    def stop(self):
        super().stop()
        self.log.close()


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

    def finish_pods(self, run, phase):
        """kwok: annotate the trainer pods so they terminate with ``phase``."""
        pods = [p for p in self.items("pods", f"wmrl.dev/run={run},app.kubernetes.io/component=trainer")
                if p["status"].get("phase") not in ("Succeeded", "Failed")]
        for pod in pods:
            self.run("annotate", "pod", pod["metadata"]["name"], "-n", self.ns, f"wmrl.dev/kwok-phase={phase}", "--overwrite")
        return len(pods)


def wait_for(predicate, timeout=30.0, interval=0.25, what="condition"):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last value: {last!r}")


def run_manifest(name, **spec):
    body = {"policy": {"model": "builtin:tiny-coder", "rolloutEngine": "transformers"},
            "tasks": {"builtin": "mini-ml"}, "trainer": {"gpusPerNode": 0}}
    body.update(spec)
    return {"apiVersion": "wmrl.dev/v1alpha1", "kind": "WMRLRun", "metadata": {"name": name}, "spec": body}


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
