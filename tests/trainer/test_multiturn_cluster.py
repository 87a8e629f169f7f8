"""A 4-turn WMRL run end to end on the test control plane: ``wmrl train`` as its own process,
a real sandbox server on loopback, status.progress (with the turn figures) patched on the
real apiserver through a kubeconfig."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest
import yaml

from wmrl.api.runconfig import Runtime, from_manifest

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
    from wmrl_sandbox.local import LocalServer

    kubectl = [str(k8s_cluster.binary("kubectl")), "--kubeconfig", str(k8s_cluster.kubeconfig)]
    crd = subprocess.run([sys.executable, "-m", "wmrl.cli", "crd"], capture_output=True, text=True, check=True).stdout
    subprocess.run([*kubectl, "apply", "-f", "-"], input=crd, text=True, check=True, capture_output=True)
    subprocess.run([*kubectl, "wait", "--for=condition=Established", "crd/wmrlruns.wmrl.dev", "--timeout=60s"],
                   check=True, capture_output=True)
    manifest = json.loads(json.dumps(MANIFEST))
    manifest["metadata"]["name"] = name = f"turns-{uuid.uuid4().hex[:8]}"
    subprocess.run([*kubectl, "apply", "-f", "-"], input=yaml.safe_dump(manifest), text=True, check=True,
                   capture_output=True)
    try:
        with LocalServer(slots=2) as sandbox:
            runtime = Runtime(checkpoint_dir=str(tmp_path / "ckpt"), patch_status=True, metrics_port=None,
                              sandbox_urls=[sandbox.url])
            config_path, summary_path = tmp_path / "run.yaml", tmp_path / "summary.json"
            config_path.write_text(yaml.safe_dump(from_manifest(manifest, runtime).to_wire()))
            proc = subprocess.run([sys.executable, "-m", "wmrl.cli", "train", "--config", str(config_path),
                                   "--summary", str(summary_path)],
                                  env={**os.environ, "KUBECONFIG": str(k8s_cluster.kubeconfig)},
                                  capture_output=True, text=True, timeout=900)
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
