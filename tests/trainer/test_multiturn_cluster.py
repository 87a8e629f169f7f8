"""A 4-turn WMRL run end to end on the test control plane: ``wmrl train`` as its own process,
a real sandbox server on loopback, status.progress (with the turn figures) patched on the
real apiserver through a kubeconfig."""

from __future__ import annotations

import json
import subprocess

import pytest
from training_cluster_helpers import create_run, install_crd, kubectl_for, train


pytestmark = [pytest.mark.cluster, pytest.mark.slow]

MANIFEST = {
    "apiVersion": "wmrl.dev/v1alpha1", "kind": "WMRLRun", "metadata": {"namespace": "default"},
    "spec": {
        "mode": "wmrl", "suspend": True,  # no operator here: the test runs the trainer itself
        "policy": {"model": "builtin:tiny-coder-multiturn", "rolloutEngine": "transformers",
                   "sampling": {"maxNewTokens": 8}},
        "worldModel": {"backend": "learned"},
        "tasks": {"builtin": "mini-ml", "heldOut": ["iris"]},
        "algorithm": {"groupSize": 4, "groupsPerStep": 2, "steps": 2, "learningRate": 0.002, "maxTurns": 4,
                      "anchors": {"fraction": 0.5}, "debiasing": {"minPairs": 4, "refitEvery": 2},
                      "denoising": {"warmup": 2}},
        "sandbox": {"timeoutSeconds": 60},
        "trainer": {"checkpoint": {"intervalSteps": 1}},
    },
}


def test_a_four_turn_run_trains_and_reports_its_turns_on_the_apiserver(k8s_cluster, tmp_path):
    kubectl = kubectl_for(k8s_cluster)
    install_crd(kubectl)
    manifest, name = create_run(kubectl, MANIFEST, "turns")
    try:
        summary_path = tmp_path / "summary.json"
        proc = train(k8s_cluster, manifest, tmp_path, "--summary", str(summary_path))
        assert proc.returncode == 0, proc.stderr[-3000:]
        summary = json.loads(summary_path.read_text())
        assert summary["steps"] == 2 and summary["finished"]
        steps = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith('{"event": "step"')]
        assert len(steps) == 2 and all(s["turns"]["mean_turns"] >= 1 for s in steps)
        assert any(s["turns"]["mean_turns"] > 1 for s in steps)  # some trajectory revised its script
        got = json.loads(subprocess.run([*kubectl, "get", "wmrlrun", name, "-o", "json"], capture_output=True,
                                        text=True, check=True).stdout)
        progress = got["status"]["progress"]
        assert progress["step"] == 2 and progress["executions"] > 0
        assert progress["turns"]["meanTurns"] == pytest.approx(steps[-1]["turns"]["mean_turns"])
    finally:
        subprocess.run([*kubectl, "delete", "wmrlrun", name, "--wait=false"], capture_output=True)
