"""A small CPU WMRLRun whose trainer Job really runs on the real node in the CPU trainer image and
executes its anchors on the real sandbox Pods, through to Succeeded."""

import json

import pytest

from e2e_helpers import describe, get_json, pod_logs, unique, wait_for
from e2e_runs import training_run

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.e2e,
              pytest.mark.timeout(1500)]  # the trainer image's import and 3 steps on 2 shared cores: 5-12 min

STEPS = 3


def test_a_cpu_run_trains_on_the_real_node_and_succeeds(k8s_cluster, real_node, e2e_images, trainer_image,
                                                          e2e_operator, runs_namespace):
    name = unique("train")
    ns = runs_namespace
    k8s_cluster.kubectl("apply", "-n", ns, "-f", "-",
                        input=json.dumps(training_run(name, e2e_images, trainer_image, real_node.placement(), steps=STEPS)))

    def finished():
        status = get_json(k8s_cluster, "wmrlrun", name, "-n", ns).get("status") or {}
        return status if status.get("phase") in ("Succeeded", "Failed") else None

    try:
        status = wait_for(finished, timeout=900, interval=5, what=f"{name} to finish")
    except AssertionError:
        raise AssertionError(describe(k8s_cluster, ns, "pods") + pod_logs(k8s_cluster, ns, f"wmrl.dev/run={name}"))
    logs = pod_logs(k8s_cluster, ns, f"wmrl.dev/run={name},app.kubernetes.io/component=trainer")
    assert status["phase"] == "Succeeded", (status, logs)
    pods = get_json(k8s_cluster, "pods", "-n", ns, "-l", f"wmrl.dev/run={name},app.kubernetes.io/component=trainer")
    assert pods["items"] and {p["spec"]["nodeName"] for p in pods["items"]} == {real_node.name}
    progress = status["progress"]
    assert progress["step"] == STEPS, progress
    assert progress["executions"] > 0, progress  # anchors really ran on the sandbox Pods
    assert progress.get("meanRealReward") is not None, progress
    k8s_cluster.kubectl("delete", "wmrlrun", name, "-n", ns, "--wait=false", check=False)
