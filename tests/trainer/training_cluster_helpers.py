"""The set-up the trainer's tests on the test control plane share: the WMRLRun CRD installed, a run
created under a unique name, and ``wmrl train`` run for it as its own process against a real sandbox
server on loopback, patching the run's status through a kubeconfig."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import yaml

from wmrl.api.runconfig import Runtime, from_manifest


def kubectl_for(k8s_cluster) -> list[str]:
    return [str(k8s_cluster.binary("kubectl")), "--kubeconfig", str(k8s_cluster.kubeconfig)]


def install_crd(kubectl: list[str]) -> str:
    """Apply this tree's CRD and wait until it is served; returns the CRD (to apply again later)."""
    crd = subprocess.run([sys.executable, "-m", "wmrl.cli", "crd"], capture_output=True, text=True, check=True).stdout
    subprocess.run([*kubectl, "apply", "-f", "-"], input=crd, text=True, check=True, capture_output=True)
    subprocess.run([*kubectl, "wait", "--for=condition=Established", "crd/wmrlruns.wmrl.dev", "--timeout=60s"],
                   check=True, capture_output=True)
    return crd


def create_run(kubectl: list[str], template: dict, prefix: str) -> tuple[dict, str]:
    """A copy of ``template`` named ``<prefix>-<random>``, created on the apiserver; (manifest, name)."""
    manifest = json.loads(json.dumps(template))
    manifest["metadata"]["name"] = name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    subprocess.run([*kubectl, "apply", "-f", "-"], input=yaml.safe_dump(manifest), text=True, check=True,
                   capture_output=True)
    return manifest, name


def train(k8s_cluster, manifest: dict, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """``wmrl train`` for ``manifest`` (checkpoints under ``tmp_path/ckpt``, status patched) with a real
    sandbox server of 2 slots; extra ``args`` go to ``wmrl train``."""
    from wmrl_sandbox.local import LocalServer

    with LocalServer(slots=2) as sandbox:
        runtime = Runtime(checkpoint_dir=str(tmp_path / "ckpt"), patch_status=True, metrics_port=None,
                          sandbox_urls=[sandbox.url])
        config_path = tmp_path / "run.yaml"
        config_path.write_text(yaml.safe_dump(from_manifest(manifest, runtime).to_wire()))
        return subprocess.run([sys.executable, "-m", "wmrl.cli", "train", "--config", str(config_path), *args],
                              env={**os.environ, "KUBECONFIG": str(k8s_cluster.kubeconfig)},
                              capture_output=True, text=True, timeout=900)
