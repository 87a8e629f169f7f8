"""Bad input is refused by the apiserver (structural schema + CEL), naming the field, and
nothing is created. The same specs fail pydantic validation with the same field named."""

import copy
import json

import pytest
from pydantic import ValidationError

from operator_helpers import run_manifest
from wmrl.api.schema import field_errors, parse_spec

pytestmark = [pytest.mark.cluster]


def merged(base, patch):
    out = copy.deepcopy(base)
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out


_EXAMPLE = {"task": "t", "code": "print(x)", "status": "runtime_err", "errorType": "NameError", "errorLine": 1}

# (id, spec patch, field the error must name)
BAD = [
    ("unknown-mode", {"mode": "magic"}, "spec.mode"),
    ("negative-restarts", {"failurePolicy": {"maxRestarts": -1}}, "spec.failurePolicy.maxRestarts"),
    ("group-size-1", {"algorithm": {"groupSize": 1}}, "spec.algorithm.groupSize"),
    ("anchor-fraction>1", {"algorithm": {"anchors": {"fraction": 1.5}}}, "spec.algorithm.anchors.fraction"),
    ("zero-learning-rate", {"algorithm": {"learningRate": 0}}, "spec.algorithm.learningRate"),
    ("target>max-weight", {"algorithm": {"denoising": {"targetWeight": 5, "maxWeight": 4}}}, "spec.algorithm.denoising.targetWeight"),
    ("sandbox-min>max", {"sandbox": {"minReplicas": 5, "maxReplicas": 2}}, "spec.sandbox.minReplicas"),
    ("two-task-sources", {"tasks": {"builtin": "mini-ml", "path": "/x"}}, "spec.tasks"),
    ("no-task-source", {"tasks": {"heldOut": ["a"]}}, "spec.tasks"),
    ("bad-quantity", {"trainer": {"resources": {"requests": {"memory": "lots"}}}}, "spec.trainer.resources.requests.memory"),
    ("bad-engine", {"policy": {"rolloutEngine": "tensorrt"}}, "spec.policy.rolloutEngine"),
    ("too-many-gpus", {"trainer": {"gpusPerNode": 17}}, "spec.trainer.gpusPerNode"),
    ("empty-model", {"policy": {"model": ""}}, "spec.policy.model"),
    ("bad-calibration-name", {"calibration": {"name": "Not_A_Name"}}, "spec.calibration.name"),
    ("unknown-field", {"sandbox": {"replicas": 3}}, "spec.sandbox.replicas"),
    ("wrong-type", {"algorithm": {"steps": "many"}}, "spec.algorithm.steps"),
    ("learn-online-llm", {"worldModel": {"backend": "llm", "learnOnline": True}}, "spec.worldModel.learnOnline"),
    ("optimism-llm", {"worldModel": {"backend": "llm", "optimism": 0.2}}, "spec.worldModel.optimism"),
    ("optimism>1", {"worldModel": {"backend": "learned", "optimism": 1.5}}, "spec.worldModel.optimism"),
    ("checkpoint-relative-path", {"trainer": {"checkpoint": {"path": "ckpt"}}}, "spec.trainer.checkpoint.path"),
    ("max-turns-0", {"algorithm": {"maxTurns": 0}}, "spec.algorithm.maxTurns"),
    ("max-turns-9", {"algorithm": {"maxTurns": 9}}, "spec.algorithm.maxTurns"),
    ("zero-trajectory-tokens", {"algorithm": {"maxTrajectoryTokens": 0}}, "spec.algorithm.maxTrajectoryTokens"),
    ("wait-seconds-multi-turn", {"algorithm": {"maxTurns": 4, "anchors": {"waitSeconds": 5}}},
     "spec.algorithm.anchors.waitSeconds"),
    # maxTurns left out: its default (4) is multi-turn, and the apiserver defaults before it validates.
    ("wait-seconds-default-turns", {"algorithm": {"anchors": {"waitSeconds": 0}}}, "spec.algorithm.anchors.waitSeconds"),
    ("late-rewards-without-wait", {"algorithm": {"maxTurns": 1, "anchors": {"lateRewards": {"enabled": True}}}},
     "spec.algorithm.anchors.lateRewards.enabled"),
    ("late-rewards-unknown-correction", {"algorithm": {"maxTurns": 1, "anchors": {
        "waitSeconds": 0, "lateRewards": {"enabled": True, "correction": "ppo"}}}},
     "spec.algorithm.anchors.lateRewards.correction"),
    ("late-rewards-clip-0", {"algorithm": {"maxTurns": 1, "anchors": {
        "waitSeconds": 0, "lateRewards": {"enabled": True, "clipMax": 0}}}}, "spec.algorithm.anchors.lateRewards.clipMax"),
    ("presence-penalty-3", {"worldModel": {"sampling": {"presencePenalty": 3}}}, "spec.worldModel.sampling.presencePenalty"),
    ("enable-thinking-not-bool", {"worldModel": {"enableThinking": "sometimes"}}, "spec.worldModel.enableThinking"),
    # 3 x 4 = 12 rollouts a step cannot split over 8 processes (8 GPUs, one process each).
    ("rows-do-not-split", {"algorithm": {"groupSize": 3, "groupsPerStep": 4}, "trainer": {"gpusPerNode": 8}},
     "spec.algorithm.groupsPerStep"),
    # Defaults (8 x 8 rollouts, 8 GPUs) on 3 nodes: 64 over 24 processes.
    ("rows-do-not-split-nodes", {"trainer": {"gpusPerNode": 8, "nodes": 3, "checkpoint": {"claimName": "c"}}},
     "spec.algorithm.groupsPerStep"),
    ("tensor-parallel-3-of-8", {"policy": {"vllmTensorParallelSize": 3}, "trainer": {"gpusPerNode": 8}},
     "spec.policy.vllmTensorParallelSize"),
    ("tensor-parallel-without-gpus", {"policy": {"vllmTensorParallelSize": 2}}, "spec.policy.vllmTensorParallelSize"),
    ("nodes-without-shared-checkpoints", {"trainer": {"nodes": 2}}, "spec.trainer.checkpoint.claimName"),
    ("unknown-strategy", {"trainer": {"strategy": "zero3"}}, "spec.trainer.strategy"),
    ("unknown-cgroups-mode", {"sandbox": {"cgroups": "sometimes"}}, "spec.sandbox.cgroups"),
    ("fixed-scripts-without-scripts", {"policy": {"model": "builtin:fixed-scripts"}}, "spec.policy.scripts"),
    ("scripts-without-fixed-scripts", {"policy": {"scripts": "/tasks/smoke"}}, "spec.policy.scripts"),
    ("few-shot-learned", {"worldModel": {"backend": "learned", "fewShot": {"path": "/tasks/few-shot.jsonl"}}},
     "spec.worldModel.fewShot"),
    ("few-shot-path-and-examples", {"worldModel": {"fewShot": {"path": "/x", "examples": [_EXAMPLE]}}},
     "spec.worldModel.fewShot"),
    ("few-shot-valid-without-bucket",
     {"worldModel": {"fewShot": {"examples": [{"task": "t", "code": "x = 1", "status": "valid"}]}}},
     "spec.worldModel.fewShot.examples"),
    ("few-shot-17-examples", {"worldModel": {"fewShot": {"examples": [_EXAMPLE] * 17}}},
     "spec.worldModel.fewShot.examples"),
    ("case-window-0", {"logging": {"cases": {"window": 0}}}, "spec.logging.cases.window"),
    # Mode eval is one process on at most one GPU; its checkpoint is newest, base or a step directory.
    ("eval-on-eight-gpus", {"mode": "eval", "trainer": {"gpusPerNode": 8}}, "spec.trainer.gpusPerNode"),
    ("eval-on-two-nodes", {"mode": "eval", "trainer": {"gpusPerNode": 1, "nodes": 2, "checkpoint": {"claimName": "c"}}},
     "spec.trainer.gpusPerNode"),
    ("eval-unknown-checkpoint", {"mode": "eval", "evaluation": {"checkpoint": "latest"}}, "spec.evaluation.checkpoint"),
]

# (id, spec patch): edge cases both validators accept.
GOOD = [
    ("wait-seconds-single-turn", {"algorithm": {"maxTurns": 1, "anchors": {"waitSeconds": 0}}}),
    ("late-rewards-with-wait", {"algorithm": {"maxTurns": 1, "anchors": {
        "waitSeconds": 0, "lateRewards": {"enabled": True, "correction": "sequence", "clipMax": 2}}}}),
    ("max-turns-8-with-budget", {"algorithm": {"maxTurns": 8, "maxTrajectoryTokens": 4096}}),
    ("presence-penalty-bounds", {"worldModel": {"enableThinking": False, "sampling": {"presencePenalty": -2}}}),
    ("two-nodes-fsdp-tp", {"policy": {"vllmTensorParallelSize": 4}, "algorithm": {"groupSize": 16, "groupsPerStep": 2},
                           "trainer": {"gpusPerNode": 8, "nodes": 2, "strategy": "fsdp",
                                       "checkpoint": {"claimName": "shared"}}}),
    ("cpu-trainer-any-batch", {"algorithm": {"groupSize": 3, "groupsPerStep": 1}, "trainer": {"gpusPerNode": 0}}),
    ("eval-one-gpu-step", {"mode": "eval", "trainer": {"gpusPerNode": 1}, "evaluation": {"checkpoint": "step-00000020"}}),
    ("eval-cpu-base", {"mode": "eval", "evaluation": {"checkpoint": "base"}}),
    # The rollout server's GPUs are its own: its tensor-parallel size need not divide the trainer's.
    ("fixed-scripts-smoke-run", {"policy": {"model": "builtin:fixed-scripts", "scripts": "/tasks/smoke"}}),
    ("rollout-server-tp-3", {"policy": {"rolloutEngine": "vllm", "vllmMode": "server", "vllmTensorParallelSize": 3},
                             "trainer": {"gpusPerNode": 8}}),
    ("few-shot-inline", {"worldModel": {"fewShot": {"examples": [
        _EXAMPLE, {"task": "t", "code": "x = 1", "status": "valid", "qualityBucket": "high", "feedback": "ok"}]}}}),
    ("cases-off", {"logging": {"cases": {"enabled": False}}}),
]


@pytest.mark.parametrize("patch,field", [(p, f) for _, p, f in BAD], ids=[i for i, _, _ in BAD])
def test_apiserver_rejects_bad_spec_naming_the_field(kube, patch, field):
    manifest = run_manifest("bad")
    manifest["spec"] = merged(manifest["spec"], patch)
    if "tasks" in patch and patch is not None and "builtin" not in patch["tasks"]:
        manifest["spec"]["tasks"] = dict(patch["tasks"])
    res = kube.apply(manifest, check=False)
    assert res.returncode != 0, f"accepted: {json.dumps(manifest['spec'])}"
    assert field in res.stderr, res.stderr
    assert kube.get("wmrlrun", "bad") is None


@pytest.mark.parametrize("patch,field", [(p, f) for _, p, f in BAD], ids=[i for i, _, _ in BAD])
def test_pydantic_rejects_the_same_specs(patch, field):
    manifest = run_manifest("bad")
    spec = merged(manifest["spec"], patch)
    if "tasks" in patch and "builtin" not in patch["tasks"]:
        spec["tasks"] = dict(patch["tasks"])
    with pytest.raises(ValidationError) as exc:
        parse_spec(spec)
    errors = field_errors(exc.value)
    assert any(field in error for error in errors), errors


@pytest.mark.parametrize("name,patch", GOOD, ids=[i for i, _ in GOOD])
def test_apiserver_and_pydantic_accept_the_edge_cases(kube, name, patch):
    manifest = run_manifest(name)
    manifest["spec"] = merged(manifest["spec"], patch)
    parse_spec(manifest["spec"])
    res = kube.apply(manifest, check=False)
    try:
        assert res.returncode == 0, res.stderr
    finally:
        kube.run("delete", "wmrlrun", name, "-n", kube.ns, "--wait=false", check=False)


def test_bad_run_names_rejected(kube):
    for name, needle in (("x" * 51, "at most 50"), ("9starts-with-digit", "DNS-1035")):
        manifest = run_manifest(name)
        res = kube.apply(manifest, check=False)
        assert res.returncode != 0 and needle in res.stderr, res.stderr
