"""Kueue admission of trainer Jobs (issue 14, item 2), against a real Kueue built from source.

A ClusterQueue whose GPU quota fits one run: the second run stays queued (Pending, reason
Queued) with its Job suspended, the operator never unsuspends it, and Kueue admits it when the
first run finishes. Suspending a queued run deactivates its Workload (Kueue's own stop); the
deadline of a queued run starts at admission.
"""

import json
import time
import uuid

import pytest

from operator_helpers import run_manifest, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

QUEUE = "team"


@pytest.fixture(scope="module")
def local_queue(kube, kueue):
    """A ClusterQueue with 8 GPUs (one run of 8) and a LocalQueue ``team`` in the test namespace."""
    cq = f"wmrl-{uuid.uuid4().hex[:6]}"
    quota = [{"name": "cpu", "nominalQuota": "100"}, {"name": "memory", "nominalQuota": "1000Gi"},
             {"name": "nvidia.com/gpu", "nominalQuota": "8"}]
    objects = [
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": "default-flavor"}},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": cq},
         "spec": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": kube.ns}},
                  "resourceGroups": [{"coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
                                      "flavors": [{"name": "default-flavor", "resources": quota}]}]}},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue", "metadata": {"name": QUEUE},
         "spec": {"clusterQueue": cq}},
    ]
    for obj in objects:
        kube.apply(obj)
    wait_for(lambda: _active(kube.run("get", "clusterqueue", cq, "-o", "json").stdout), what="ClusterQueue active")
    yield cq
    kube.run("delete", "clusterqueue", cq, "--wait=false", check=False)


def _active(text):
    conditions = (json.loads(text).get("status") or {}).get("conditions") or []
    return any(c["type"] == "Active" and c["status"] == "True" for c in conditions)


def queued_run(name, **spec):
    body = run_manifest(name, trainer={"gpusPerNode": 8}, **spec)
    body["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": QUEUE}
    return body


def _suspended(kube, run):
    job = kube.get("job", f"{run}-trainer")
    return None if job is None else bool(job["spec"].get("suspend"))


def _sandbox_replicas(kube, run):
    return kube.get("deployment", f"{run}-sandbox")["spec"]["replicas"]


def _reason(kube, run):
    for cond in kube.status(run).get("conditions") or []:
        if cond["type"] == "Running":
            return cond.get("reason")
    return None


def _workload(kube, run):
    job = kube.get("job", f"{run}-trainer")
    if job is None:
        return None
    items = kube.items("workloads.kueue.x-k8s.io", f"kueue.x-k8s.io/job-uid={job['metadata']['uid']}")
    return items[0] if items else None


def _all_running(pods):
    return bool(pods) and all(p["status"].get("phase") == "Running" for p in pods)


def _explained(kube, operator, run, wait):
    """Run ``wait``; if it times out, say where the run stood: its trainer pods (phase, node,
    scheduling), its Job's status, every scheduled pod in the cluster and the operator's last lines."""
    try:
        return wait()
    except AssertionError as exc:
        pods = [(p["metadata"]["name"], p["status"].get("phase"), p["spec"].get("nodeName"),
                 (p["metadata"].get("annotations") or {}).get("wmrl.dev/kwok-phase"),
                 [(c["type"], c["status"], c.get("message")) for c in p["status"].get("conditions") or []])
                for p in kube.trainer_pods(run)]
        job = kube.get("job", f"{run}-trainer") or {}
        scheduled = kube.run("get", "pods", "-A", "-o", "wide", "--field-selector", "spec.nodeName!=",
                            check=False).stdout
        log = operator.log_path.read_text(errors="replace").splitlines()[-30:]
        raise AssertionError("\n".join([str(exc), f"trainer pods: {pods}",
                                        f"job status: {job.get('status')}", f"run status: {kube.status(run)}",
                                        "scheduled pods:", scheduled, "operator log:", *log])) from None


def test_a_second_run_waits_for_the_quota_and_starts_when_the_first_finishes(kube, operator, local_queue, kwok_nodes):
    kube.apply(queued_run("q-first"))
    wait_for(lambda: _suspended(kube, "q-first") is False, timeout=60, what="the first run admitted")
    job = kube.get("job", "q-first-trainer")
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == QUEUE
    wait_for(lambda: kube.status("q-first").get("startTime"), what="the first run's start at admission")

    kube.apply(queued_run("q-second", activeDeadlineSeconds=3600))
    wait_for(lambda: _reason(kube, "q-second") == "Queued", what="the second run queued")
    status = kube.status("q-second")
    assert status["phase"] == "Pending" and "'team'" in next(
        c["message"] for c in status["conditions"] if c["type"] == "Running")
    assert "startTime" not in status  # its deadline has not started: it is not admitted
    workload = wait_for(lambda: _workload(kube, "q-second"), what="Kueue's Workload for the second Job")
    assert not (workload.get("status") or {}).get("admission")
    # Several resync passes and Job events later, the operator has not unsuspended it.
    wait_for(lambda: kube.status("q-second").get("observedGeneration") == 1, what="reconciled")
    for _ in range(3):
        assert _suspended(kube, "q-second") is True
        assert _sandbox_replicas(kube, "q-second") == 0  # a queued run holds no sandbox Pods
        time.sleep(1)  # the operator's resync interval in these tests
    assert _sandbox_replicas(kube, "q-first") == 1  # the admitted one has its pool (minReplicas)

    # The first run finishes: Kueue releases its quota and admits the second.
    _explained(kube, operator, "q-first", lambda: wait_for(
        lambda: _all_running(kube.trainer_pods("q-first")), timeout=90, what="the first run's trainer pod running on a GPU node"))
    kube.finish_pods("q-first", "Succeeded")
    _explained(kube, operator, "q-first", lambda: wait_for(
        lambda: kube.status("q-first").get("phase") == "Succeeded", timeout=60, what="the first run done"))
    wait_for(lambda: _suspended(kube, "q-second") is False, timeout=60, what="the second run admitted")
    wait_for(lambda: _reason(kube, "q-second") != "Queued", what="the second run no longer queued")
    assert kube.status("q-second").get("startTime")
    wait_for(lambda: _sandbox_replicas(kube, "q-second") == 1, what="the second run's pool, once admitted")
    assert kube.get("job", "q-second-trainer")["spec"]["activeDeadlineSeconds"] <= 3600


def test_suspending_a_queued_run_deactivates_its_workload(kube, operator, local_queue):
    kube.apply(queued_run("q-paused"))
    wait_for(lambda: _workload(kube, "q-paused"), timeout=60, what="its Workload")
    kube.run("patch", "wmrlrun", "q-paused", "-n", kube.ns, "--type=merge", "-p",
             json.dumps({"spec": {"suspend": True}}))
    wait_for(lambda: (_workload(kube, "q-paused")["spec"].get("active", True)) is False, what="Workload inactive")
    wait_for(lambda: kube.status("q-paused").get("phase") == "Suspended", what="phase Suspended")
    assert _suspended(kube, "q-paused") is True
    kube.run("patch", "wmrlrun", "q-paused", "-n", kube.ns, "--type=merge", "-p",
             json.dumps({"spec": {"suspend": False}}))
    wait_for(lambda: (_workload(kube, "q-paused")["spec"].get("active", True)) is True, what="Workload active again")
    wait_for(lambda: kube.status("q-paused").get("phase") != "Suspended", what="no longer Suspended")


def test_a_preempted_trainer_pod_is_replaced_and_is_not_a_restart(kube, operator, kwok_nodes):
    """Preemption and eviction (Kueue's, the scheduler's, a node drain) give the Pod the DisruptionTarget
    condition; the Job's podFailurePolicy ignores such a failure: a new Pod, no Job failure, no restart."""
    kube.apply(run_manifest("evicted"))
    wait_for(lambda: kube.status("evicted").get("phase") == "Running", timeout=60, what="Running")
    [pod] = kube.trainer_pods("evicted")
    eviction = {"apiVersion": "policy/v1", "kind": "Eviction",
                "metadata": {"name": pod["metadata"]["name"], "namespace": kube.ns}}
    kube.run("create", "--raw", f"/api/v1/namespaces/{kube.ns}/pods/{pod['metadata']['name']}/eviction",
             "-f", "-", input=json.dumps(eviction))
    replacement = wait_for(lambda: [p for p in kube.trainer_pods("evicted")
                                    if p["metadata"]["uid"] != pod["metadata"]["uid"]], timeout=60,
                           what="a replacement pod")
    assert len(replacement) == 1
    wait_for(lambda: kube.status("evicted").get("phase") == "Running", timeout=60, what="Running again")
    job = kube.get("job", "evicted-trainer")
    assert not [c for c in (job.get("status") or {}).get("conditions") or [] if c["type"] in ("Failed", "FailureTarget")]
    assert kube.status("evicted")["restarts"] == 0
