"""Sandbox autoscaling on the real control plane, driven by status.progress.sandboxDemand."""

import pytest

from operator_helpers import run_manifest, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def replicas(kube, name):
    return kube.get("deployment", f"{name}-sandbox")["spec"]["replicas"]


def test_demand_scales_up_at_once_down_after_window_within_bounds(kube, operator):
    kube.apply(run_manifest("auto", mode="real", sandbox={"minReplicas": 1, "maxReplicas": 4, "slotsPerPod": 2,
                                                          "scaleDownStabilizationSeconds": 4}))
    wait_for(lambda: kube.status("auto").get("phase") == "Running", what="Running")
    assert replicas(kube, "auto") == 1

    kube.patch_status("auto", {"progress": {"step": 1, "sandboxDemand": 5}})  # ceil(5/2) = 3
    wait_for(lambda: replicas(kube, "auto") == 3, timeout=20, what="3 replicas")
    kube.patch_status("auto", {"progress": {"step": 2, "sandboxDemand": 100}})  # capped at maxReplicas
    wait_for(lambda: replicas(kube, "auto") == 4, timeout=20, what="4 replicas")
    wait_for(lambda: kube.status("auto").get("sandbox", {}).get("desiredReplicas") == 4, what="status.sandbox")
    scaled = kube.events("auto", field="message", reason="SandboxScaled")
    assert "from 1 to 3" in scaled and "to 4" in scaled, scaled

    kube.patch_status("auto", {"progress": {"step": 3, "sandboxDemand": 0}})
    seen = set()

    def down():
        seen.add(replicas(kube, "auto"))
        return replicas(kube, "auto") == 1
    wait_for(down, timeout=30, what="back to minReplicas")
    assert seen <= {1, 4}, f"flapped through {seen}"  # held at 4 during the window, then min
    assert all(1 <= r <= 4 for r in seen)

    kube.run("patch", "wmrlrun", "auto", "-n", kube.ns, "--type=merge", "-p", '{"spec":{"suspend":true}}')
    wait_for(lambda: replicas(kube, "auto") == 0, timeout=20, what="0 when suspended")
    kube.patch_status("auto", {"progress": {"step": 4, "sandboxDemand": 50}})
    wait_for(lambda: kube.status("auto").get("phase") == "Suspended", what="Suspended")
    import time
    time.sleep(2.5)
    assert replicas(kube, "auto") == 0  # demand never scales a suspended pool
