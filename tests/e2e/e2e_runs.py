"""WMRLRun manifests for the real node: runs whose Pods are placed on it and use the images imported there."""

import copy


def _placed(placement, extra=None):
    return {**copy.deepcopy(placement), **(extra or {})}


def sandbox_only_run(name, images, placement, *, slots=2):
    """A run whose sandbox pool and calibration service run on the real node; its trainer Pod stays on a
    kwok node (which runs no container), so the pool and the service can be exercised on their own."""
    return {
        "apiVersion": "wmrl.dev/v1alpha1",
        "kind": "WMRLRun",
        "metadata": {"name": name},
        "spec": {
            "policy": {"model": "builtin:tiny-coder", "rolloutEngine": "transformers"},
            "worldModel": {"backend": "learned"},
            "tasks": {"builtin": "mini-ml"},
            "algorithm": {"steps": 100000},
            "trainer": {"gpusPerNode": 0},
            "sandbox": _placed(placement, {
                "image": images["sandbox"], "imagePullPolicy": "Never",
                "minReplicas": 1, "maxReplicas": 1, "slotsPerPod": slots, "timeoutSeconds": 60,
                "clientAccess": {"enabled": True},
                "resources": {"requests": {"cpu": "250m", "memory": "1Gi"},
                              "limits": {"cpu": "2", "memory": "3Gi"}},
            }),
            "calibration": _placed(placement),
        },
    }

