"""The operator as users deploy it: `helm install` of the chart, its Pods on the real node, leader
hand-over when the leader's Pod is killed."""

import json

import pytest

from e2e_helpers import SYSTEM_NS, describe, get_json, ready, unique, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.e2e]


def _operator_pods(cluster):
    pods = get_json(cluster, "pods", "-n", SYSTEM_NS, "-l", "app.kubernetes.io/name=wmrl-operator")["items"]
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


def _holder(cluster):
    leases = get_json(cluster, "leases", "-n", SYSTEM_NS)["items"]
    held = [l["spec"].get("holderIdentity") for l in leases if "wmrl" in l["metadata"]["name"]]
    return held[0] if held and held[0] else None


def test_the_chart_runs_two_ready_operators_on_the_real_node(k8s_cluster, real_node, e2e_operator):
    pods = _operator_pods(k8s_cluster)
    assert len(pods) == 2, describe(k8s_cluster, SYSTEM_NS, "pods")
    assert {p["spec"]["nodeName"] for p in pods} == {real_node.name}
    assert all(ready(p) for p in pods)
    assert all(s["restartCount"] == 0 for p in pods for s in p["status"]["containerStatuses"])
    holder = wait_for(lambda: _holder(k8s_cluster), timeout=60, what="a lease holder")
    assert holder in {p["metadata"]["name"] for p in pods}


def test_killing_the_leaders_pod_hands_over_and_runs_are_still_reconciled(k8s_cluster, real_node, e2e_operator,
                                                                          runs_namespace, e2e_images):
    before = wait_for(lambda: _holder(k8s_cluster), timeout=60, what="a lease holder")
    pods = {p["metadata"]["name"]: p for p in _operator_pods(k8s_cluster)}
    other = next(name for name in pods if name != before)
    # SIGKILL the leader's container through the node's containerd, then delete its Pod: no
    # graceful release of the lease, the follower must take it over when it expires.
    container_id = pods[before]["status"]["containerStatuses"][0]["containerID"].split("://", 1)[1]
    real_node.ctr_run("tasks", "kill", "--signal", "SIGKILL", container_id, check=False)
    k8s_cluster.kubectl("delete", "pod", before, "-n", SYSTEM_NS, "--wait=false")
    after = wait_for(lambda: (_holder(k8s_cluster) if _holder(k8s_cluster) not in (None, before) else None),
                     timeout=90, what="the lease to move off the killed leader")
    # The follower usually wins; the ReplicaSet's replacement Pod may start and win the expired lease
    # first (seen once in CI): either is a handover, as long as no one holds it twice.
    assert after == other or after not in pods, (before, after, sorted(pods))

    name = unique("after-handover")
    run = {"apiVersion": "wmrl.dev/v1alpha1", "kind": "WMRLRun", "metadata": {"name": name},
           "spec": {"policy": {"model": "builtin:tiny-coder"}, "tasks": {"builtin": "mini-ml"},
                    "worldModel": {"backend": "learned"}, "suspend": True}}
    k8s_cluster.kubectl("apply", "-n", runs_namespace, "-f", "-", input=json.dumps(run))
    try:
        status = wait_for(lambda: (get_json(k8s_cluster, "wmrlrun", name, "-n", runs_namespace).get("status") or {})
                          .get("observedGeneration"), timeout=90, what=f"{name} reconciled")
        assert status == 1
        conditions = get_json(k8s_cluster, "wmrlrun", name, "-n", runs_namespace)["status"]["conditions"]
        assert any(c["type"] == "Suspended" and c["status"] == "True" for c in conditions), conditions
        # the ReplicaSet replaced the killed Pod, and it became Ready as a follower
        wait_for(lambda: len([p for p in _operator_pods(k8s_cluster) if ready(p)]) == 2, timeout=180,
                 what="two Ready operator Pods again")
    finally:
        k8s_cluster.kubectl("delete", "wmrlrun", name, "-n", runs_namespace, "--wait=false", check=False)
