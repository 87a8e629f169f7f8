"""The run's SandboxReady condition from real sandbox Pods on the real apiserver.

What cannot exist here is a kubelet whose runtime fails these Pods: kwok plays the kubelet of the
nodes labelled ``type=kwok`` and reports every Pod it runs ready. So the pool is placed, through
``spec.sandbox.nodeSelector`` and ``tolerations``, on a Node of its own (tainted, as a dedicated
pool is) that nothing manages: the scheduler binds the Pods there for real, and they stay as a
kubelet that cannot create them leaves them (Pending, being created). What such a kubelet then
reports is written as it writes it: a FailedCreatePodSandBox Event, then the Pod's status
subresource (a crash loop, its termination message). The operator's own Reconciler reads them in
its resync (``housekeeping``) and writes the condition and its Warning Events.
"""

import asyncio
import datetime as dt
import json

import pytest
from kubernetes import client as k8s_client, config as k8s_config

from operator_helpers import run_manifest, wait_for
from wmrl.api import vocabulary as v
from wmrl_operator.kube import Kube as ApiClient
from wmrl_operator.reconcile import Reconciler

pytestmark = pytest.mark.cluster

RUN = "iso"
REFUSAL = ("wmrl sandbox serve: isolation unavailable: --isolation namespaces needs bubblewrap (/usr/bin/bwrap) "
           "cannot create an execution's namespaces here: bwrap: Can't mount proc on /newroot/proc: Operation not "
           "permitted. It needs bubblewrap and unprivileged user namespaces")


@pytest.fixture
def unmanaged_node(kube):
    """A Node nothing runs (no kwok label), labelled and tainted as a dedicated pool."""
    name = f"wmrl-unmanaged-{kube.ns}"
    node = {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"wmrl.dev/test-pool": kube.ns}},
            "spec": {"taints": [{"key": "wmrl.dev/test-pool", "value": kube.ns, "effect": "NoSchedule"}]}}
    kube.run("create", "-f", "-", input=json.dumps(node))
    room = {"cpu": "16", "memory": "64Gi", "pods": "110"}  # what a kubelet reports; the scheduler needs it
    kube.run("patch", "node", name, "--subresource=status", "--type=merge",
             "-p", json.dumps({"status": {"capacity": room, "allocatable": room}}))
    yield name
    kube.run("delete", "node", name, "--wait=false", check=False)


def _resync(kube, *steps):
    """Run the operator's reconcile/resync steps (``"reconcile"``, ``"housekeeping"``) in order."""
    async def go():
        cfg = k8s_client.Configuration()
        k8s_config.load_kube_config(config_file=str(kube.cluster.kubeconfig), client_configuration=cfg)
        api = ApiClient(cfg)
        reconciler = Reconciler(api)
        try:
            for step in steps:
                if step == "reconcile":
                    await reconciler.reconcile(kube.ns, RUN, apply_children=True)
                else:
                    await reconciler.housekeeping(kube.ns, RUN)
        finally:
            await reconciler.events.flush()
            await api.close()

    asyncio.run(go())


def _sandbox_ready(kube):
    return next((c for c in kube.status(RUN).get("conditions") or [] if c["type"] == v.SANDBOX_READY_CONDITION), None)


def _patch_pod_status(kube, pod, status):
    kube.run("patch", "pod", pod, "-n", kube.ns, "--subresource=status", "--type=merge",
             "-p", json.dumps({"status": status}))


def _crash_looping(message, restarts):
    return {"phase": "Running", "containerStatuses": [{
        "name": "sandbox", "image": "ghcr.io/wmrl/sandbox:0.1.0", "imageID": "", "ready": False,
        "started": False, "restartCount": restarts,
        "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s restarting failed container"}},
        "lastState": {"terminated": {"exitCode": 2, "reason": "Error", "message": message,
                                     "startedAt": "2026-01-01T00:00:00Z", "finishedAt": "2026-01-01T00:00:03Z"}}}]}


def test_a_runtime_that_cannot_run_the_sandbox_gives_the_run_a_condition(kube, unmanaged_node):
    kube.apply(run_manifest(RUN, mode="real", sandbox={
        "nodeSelector": {"wmrl.dev/test-pool": kube.ns},
        "tolerations": [{"key": "wmrl.dev/test-pool", "operator": "Exists"},
                        {"key": "node.kubernetes.io/not-ready", "operator": "Exists"},
                        {"key": "node.kubernetes.io/unreachable", "operator": "Exists"}]}))
    _resync(kube, "reconcile")
    pod = wait_for(lambda: next((p for p in kube.items("pods", f"wmrl.dev/run={RUN},app.kubernetes.io/component=sandbox")
                                 if p["spec"].get("nodeName") == unmanaged_node), None),
                   timeout=60, what="the sandbox Pod bound to the unmanaged node")
    name = pod["metadata"]["name"]

    # Bound, nothing reported yet: starting, not failing.
    _resync(kube, "housekeeping")
    cond = wait_for(lambda: _sandbox_ready(kube), what="SandboxReady")
    assert (cond["status"], cond["reason"], cond["message"]) == ("False", v.SANDBOX_PODS_STARTING,
                                                                 "0 of 1 sandbox Pods ready yet")

    # A kubelet whose runtime has no user namespaces (containerd 1.6) cannot make the Pod's sandbox.
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    event = {"apiVersion": "v1", "kind": "Event", "metadata": {"name": f"{name}.sandbox", "namespace": kube.ns},
             "involvedObject": {"kind": "Pod", "name": name, "namespace": kube.ns, "uid": pod["metadata"]["uid"]},
             "reason": "FailedCreatePodSandBox", "type": "Warning", "source": {"component": "kubelet"},
             "message": "Failed to create pod sandbox: user namespaces is not supported by the runtime",
             "firstTimestamp": now, "lastTimestamp": now, "count": 1}
    kube.run("create", "-f", "-", input=json.dumps(event))
    _resync(kube, "housekeeping")
    cond = _sandbox_ready(kube)
    assert (cond["status"], cond["reason"]) == ("False", v.ISOLATION_UNAVAILABLE)
    assert cond["message"].startswith(f"sandbox Pod {name}: Failed to create pod sandbox: user namespaces is not "
                                      "supported by the runtime. isolation: namespaces needs")
    assert "spec.sandbox.isolation: restricted with a gVisor or Kata spec.sandbox.runtimeClassName" in cond["message"]
    assert v.ISOLATION_UNAVAILABLE in kube.events(RUN, reason=v.ISOLATION_UNAVAILABLE)

    # A crash loop for a reason of its own: named, not blamed on the isolation.
    _patch_pod_status(kube, name, _crash_looping("wmrl sandbox serve: WMRL_SANDBOX_TIMEOUT_SECONDS='soon' is not a "
                                                 "valid float", restarts=2))
    _resync(kube, "housekeeping")
    cond = _sandbox_ready(kube)
    assert cond["reason"] == v.SANDBOX_PODS_FAILING
    assert cond["message"] == (f"sandbox Pod {name}: CrashLoopBackOff (restarted 2 times): wmrl sandbox serve: "
                               "WMRL_SANDBOX_TIMEOUT_SECONDS='soon' is not a valid float")
    assert v.SANDBOX_PODS_FAILING in kube.events(RUN, reason=v.SANDBOX_PODS_FAILING)

    # The server's own refusal (a runtime that masks /proc): its termination message, read back.
    _patch_pod_status(kube, name, _crash_looping(REFUSAL, restarts=5))
    _resync(kube, "housekeeping")
    cond = _sandbox_ready(kube)
    assert (cond["status"], cond["reason"]) == ("False", v.ISOLATION_UNAVAILABLE)
    assert cond["message"].startswith(f"sandbox Pod {name}: isolation unavailable: --isolation namespaces needs "
                                      "bubblewrap (/usr/bin/bwrap) cannot create an execution's namespaces here: "
                                      "bwrap: Can't mount proc on /newroot/proc")
    # The phase is the trainer's business: a pool that cannot start does not fail the run by itself.
    assert kube.status(RUN)["phase"] in ("Pending", "Running")
