"""Shared helpers for the local-runner tests: a tiny manifest and a process-liveness check."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

TINY = {
    "apiVersion": "wmrl.dev/v1alpha1",
    "kind": "WMRLRun",
    "metadata": {"name": "tiny"},
    "spec": {
        "mode": "wmrl",
        "policy": {"model": "builtin:tiny-coder", "rolloutEngine": "transformers", "sampling": {"maxNewTokens": 8}},
        "worldModel": {"backend": "learned"},
        "tasks": {"builtin": "mini-ml", "heldOut": ["iris"]},
        "algorithm": {"groupSize": 2, "groupsPerStep": 2, "steps": 2, "learningRate": 0.002, "klBeta": 0.0,
                      "entropyCoef": 0.0, "anchors": {"fraction": 0.5, "minPerStep": 1},
                      "debiasing": {"minPairs": 4, "refitEvery": 2}, "denoising": {"warmup": 2}},
        "sandbox": {"timeoutSeconds": 60},
        "trainer": {"checkpoint": {"intervalSteps": 1}},
    },
}


def write_manifest(directory: Path, **algorithm) -> Path:
    manifest = yaml.safe_load(yaml.safe_dump(TINY))
    manifest["spec"]["algorithm"].update(algorithm)
    path = directory / "tiny.yaml"
    path.write_text(yaml.safe_dump(manifest))
    return path


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


@pytest.fixture
def wmrl_env(tmp_path_factory):
    """Environment for `wmrl` subprocesses: offline, shared caches (policy + suite are built once)."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1")
    return env
