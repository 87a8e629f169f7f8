"""Mode eval end to end on the test control plane: a WMRLRun with ``mode: eval``, ``wmrl eval
--config`` (what the operator's Job runs) as its own process against a real sandbox server on
loopback, its result patched into the run's status on the real apiserver and shown in the HeldOut
printer column."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml
from training_cluster_helpers import create_run, install_crd, kubectl_for

from wmrl.api.runconfig import Runtime, from_manifest

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

MANIFEST = {
    "apiVersion": "wmrl.dev/v1alpha1", "kind": "WMRLRun", "metadata": {"namespace": "default"},
    "spec": {
        "mode": "eval", "suspend": True,  # no operator here: the test runs the evaluation itself
        "policy": {"model": "builtin:tiny-coder", "rolloutEngine": "transformers", "sampling": {"maxNewTokens": 8}},
        "worldModel": {"backend": "learned"},
        "tasks": {"builtin": "mini-ml", "heldOut": ["iris", "wine"]},
        "algorithm": {"maxTurns": 1},
        "evaluation": {"samples": 2, "maxConcurrent": 2, "checkpoint": "base"},
        "sandbox": {"timeoutSeconds": 60},
        "trainer": {"gpusPerNode": 0},
    },
}


def test_an_eval_run_gets_its_held_out_reward_and_report_in_its_status(k8s_cluster, tmp_path):
    from wmrl_sandbox.local import LocalServer

    kubectl = kubectl_for(k8s_cluster)
    crd = install_crd(kubectl)
    manifest, name = create_run(kubectl, MANIFEST, "evalrun")
    try:
        with LocalServer(slots=2) as sandbox:
            runtime = Runtime(checkpoint_dir=str(tmp_path / "ckpt"), patch_status=True, metrics_port=None,
                              sandbox_urls=[sandbox.url])
            config = tmp_path / "run.yaml"
            config.write_text(yaml.safe_dump(from_manifest(manifest, runtime).to_wire()))
            proc = subprocess.run([sys.executable, "-m", "wmrl.cli", "eval", "--config", str(config), "--no-progress"],
                                  env={**os.environ, "KUBECONFIG": str(k8s_cluster.kubeconfig)},
                                  capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stderr[-3000:]
        report_path = tmp_path / "ckpt" / "evaluations" / name / "eval.json"
        report = json.loads(report_path.read_text())
        assert report["complete"] and list(report["tasks"]) == ["iris", "wine"]
        got = json.loads(subprocess.run([*kubectl, "get", "wmrlrun", name, "-o", "json"], capture_output=True,
                                        text=True, check=True).stdout)
        progress = got["status"]["progress"]
        assert progress["heldOutReward"] == pytest.approx(report["reward"])
        assert progress["heldOut"]["report"] == str(report_path) and progress["heldOut"]["evaluations"] == 1
        assert progress["heldOut"]["samples"] == 4 and progress["sandboxDemand"] == 0
        subprocess.run([*kubectl, "apply", "-f", "-"], input=crd, text=True, check=True, capture_output=True)
        table = subprocess.run([*kubectl, "get", "wmrlrun", name], capture_output=True, text=True, check=True).stdout
        header, row = table.splitlines()[:2]
        assert row[header.index("MODE"):].split()[0] == "eval"
        assert row[header.index("HELDOUT"):].split()[0] == repr(report["reward"])
    finally:
        subprocess.run([*kubectl, "delete", "wmrlrun", name, "--wait=false"], capture_output=True)
