"""Helpers shared by the local-runner tests (a plain module: conftest.py is not importable by name,
and importing it as `conftest` picks whichever conftest.py was loaded first)."""

from __future__ import annotations

from pathlib import Path

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
        "algorithm": {"groupSize": 2, "groupsPerStep": 2, "steps": 2, "learningRate": 0.002, "klBeta": 0.0, "maxTurns": 1,
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
