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



def training_run(name, images, trainer_image, placement, *, steps=3):
    """The quickstart's run, cut to a few steps, with every Pod on the real node: the trainer Job in
    the CPU trainer image, anchors executed on the real sandbox Pods."""
    run = sandbox_only_run(name, images, placement, slots=2)
    spec = run["spec"]
    spec["policy"]["sampling"] = {"temperature": 1.0, "maxNewTokens": 8}
    spec["worldModel"]["learnOnline"] = True
    spec["tasks"]["heldOut"] = ["iris", "wine"]
    spec["algorithm"] = {
        "groupSize": 4, "groupsPerStep": 2, "steps": steps, "learningRate": 0.002, "maxTurns": 1, "seed": 0,
        "anchors": {"fraction": 0.5, "minPerStep": 1, "maxConcurrent": 4},
        "debiasing": {"minPairs": 4, "refitEvery": 4},
        "denoising": {"warmup": 1},
    }
    spec["trainer"] = _placed(placement, {
        "gpusPerNode": 0, "image": trainer_image, "imagePullPolicy": "Never",
        "resources": {"requests": {"cpu": "500m", "memory": "2Gi"}, "limits": {"cpu": "2", "memory": "6Gi"}},
        "checkpoint": {"intervalSteps": 1},
    })
    spec["failurePolicy"] = {"maxRestarts": 0}
    return run
