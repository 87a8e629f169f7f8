"""Held-out evaluation end to end on the test control plane: ``wmrl train`` as its own process, a
real sandbox server on loopback, heldOutReward and heldOut patched into the WMRLRun's status on
the real apiserver, and the HeldOut printer column showing it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from training_cluster_helpers import create_run, install_crd, kubectl_for, train


pytestmark = [pytest.mark.cluster, pytest.mark.slow]

MANIFEST = {
    "apiVersion": "wmrl.dev/v1alpha1", "kind": "WMRLRun", "metadata": {"namespace": "default"},
    "spec": {
        "mode": "wmrl", "suspend": True,  # no operator here: the test runs the trainer itself
        "policy": {"model": "builtin:tiny-coder", "rolloutEngine": "transformers", "sampling": {"maxNewTokens": 8}},
        "worldModel": {"backend": "learned"},
        "tasks": {"builtin": "mini-ml", "heldOut": ["iris"]},
        "algorithm": {"groupSize": 2, "groupsPerStep": 2, "steps": 2, "learningRate": 0.002, "maxTurns": 1,
                      "anchors": {"fraction": 0.5}},
        "evaluation": {"intervalSteps": 1, "samples": 2, "maxConcurrent": 2},
        "sandbox": {"timeoutSeconds": 60},
        "trainer": {"gpusPerNode": 0, "checkpoint": {"intervalSteps": 1}},
    },
}


def test_a_run_with_held_out_tasks_gets_held_out_reward_in_its_status(k8s_cluster, tmp_path):
    kubectl = kubectl_for(k8s_cluster)
    crd = install_crd(kubectl)
    manifest, name = create_run(kubectl, MANIFEST, "heldout")
    try:
        proc = train(k8s_cluster, manifest, tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
        reports = [json.loads((tmp_path / "ckpt" / "eval" / f"step-{n}.json").read_text()) for n in (1, 2)]
        assert all(r["complete"] for r in reports)
        got = json.loads(subprocess.run([*kubectl, "get", "wmrlrun", name, "-o", "json"], capture_output=True,
                                        text=True, check=True).stdout)
        progress = got["status"]["progress"]
        assert progress["step"] == 2
        assert progress["heldOutReward"] == pytest.approx(reports[-1]["reward"])
        held = progress["heldOut"]
        assert held["step"] == 2 and held["evaluations"] == 2 and held["samples"] == 2
        assert held["executions"] == sum(r["executed"] for r in reports)
        assert Path(held["report"]).name == "step-2.json"
        # The control plane is shared: a session on an older tree may have applied its CRD (no HeldOut column)
        # meanwhile. Apply ours again right before reading the table.
        subprocess.run([*kubectl, "apply", "-f", "-"], input=crd, text=True, check=True, capture_output=True)
        table = subprocess.run([*kubectl, "get", "wmrlrun", name], capture_output=True, text=True, check=True).stdout
        header, row = table.splitlines()[:2]
        assert "HELDOUT" in header.split()
        # Columns are aligned (Phase is empty here: no operator), so read the value under the header.
        assert row[header.index("HELDOUT"):].split()[0] == repr(reports[-1]["reward"])
    finally:
        subprocess.run([*kubectl, "delete", "wmrlrun", name, "--wait=false"], capture_output=True)
