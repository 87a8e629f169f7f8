"""Trajectory logs (spec.logging.trajectories): written by a real trainer against a real local
sandbox server, cross-checked against the per-row rollout log; sampling, rotation, the world
model's reasons and the schema (the CLI: test_trajectories_cli.py)."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from wmrl.api.runconfig import RunConfig, RunMetadata, Runtime
from wmrl.api.schema import WMRLRunSpec, field_errors, parse_spec
from wmrl_trainer.services import LocalServices
from wmrl_trainer.trajectory_log import RotatingJsonl, is_sampled, outcome_json
from wmrl_trainer.world_model.parse import outcome_from_text

SPEC = {
    "mode": "wmrl",
    "policy": {"model": "builtin:tiny-coder", "rolloutEngine": "transformers", "sampling": {"maxNewTokens": 8}},
    "worldModel": {"backend": "learned"},
    "tasks": {"builtin": "mini-ml"},
    "algorithm": {"groupSize": 2, "groupsPerStep": 2, "steps": 2, "learningRate": 0.002, "klBeta": 0.0, "maxTurns": 1,
                  "entropyCoef": 0.0, "anchors": {"fraction": 0.5, "minPerStep": 1}},
    "logging": {"trajectories": {"sampleRate": 1.0}},
    "sandbox": {"timeoutSeconds": 60},
    "trainer": {"gpusPerNode": 0, "checkpoint": {"intervalSteps": 100}},
}


# ---------------------------------------------------------------- a real trainer writes them

@pytest.mark.slow
@pytest.mark.parametrize("model, turns", [("builtin:tiny-coder", 1), ("builtin:tiny-coder-multiturn", 2)])
def test_a_trainer_logs_every_trajectory_in_full(tmp_path, model, turns):
    from wmrl_trainer.build import build_trainer

    spec = json.loads(json.dumps(SPEC))
    spec["policy"]["model"] = model
    spec["algorithm"]["maxTurns"] = turns
    records = []
    with LocalServices(1, tmp_path / "logs") as services:
        config = RunConfig(metadata=RunMetadata(name="t"), spec=WMRLRunSpec.model_validate(spec),
                           runtime=Runtime(sandbox_urls=services.sandbox_urls, checkpoint_dir=str(tmp_path / "ckpt"),
                                           patch_status=False, metrics_port=None))
        trainer = build_trainer(config, rollouts_dir=str(tmp_path / "rollouts"), callbacks=[records.append])
        try:
            trainer.train()
        finally:
            trainer.close()
    assert [p.name for p in (tmp_path / "ckpt" / "trajectories").iterdir()] == ["rank-0.jsonl"]
    entries = _lines(tmp_path / "ckpt" / "trajectories" / "rank-0.jsonl")
    rollouts = [json.loads(line) for line in (tmp_path / "rollouts" / "rank-0.jsonl").read_text().splitlines()]
    assert len(entries) == len(rollouts) == 2 * 4  # sampleRate 1: every row of both steps
    by_key = {(r["step"], r["row"]): r for r in rollouts}
    for entry in entries:
        row = by_key[(entry["step"], entry["row"])]  # the same numbers as the per-row rollout log
        assert entry["task"] == row["task"] and entry["anchor"] == row["anchor"] and entry["graded"] == row["graded"]
        assert entry["reward"] == row["reward"] and entry["advantage"] == pytest.approx(row["advantage"])
        assert [t["code"] for t in entry["turns"]] == row["codes"]
        assert entry["rank"] == 0 and entry["mode"] == "wmrl" and task_prompt_names(entry)
        assert 1 <= len(entry["turns"]) <= turns
        for turn in entry["turns"]:
            assert turn["code"] in turn["text"]  # the script is the text's code block (or all of it)
            assert turn["world_model"]["status"]  # mode wmrl: the world model grades every turn
            if entry["anchor"]:  # executed for real, and that is what the agent saw
                assert turn["real"]["status"] and turn["shown"] == "real"
                assert turn["real"]["reward"] == pytest.approx(_ladder(turn["real"]))
            else:
                assert turn["real"] is None and turn["shown"] == "world_model"
            assert turn["observation"].startswith("\n[execution] status=" + turn[turn["shown"]]["status"])
        if entry["anchor"]:
            assert entry["reward"] == entry["real_reward"]
            assert entry["disagreement"] == pytest.approx(abs(entry["raw_reward"] - entry["real_reward"]))
        else:
            assert entry["real_reward"] is None and entry["disagreement"] is None
            assert entry["reward"] == pytest.approx(entry["calibrated_reward"])
    # The anchor weight is the step's on anchor rows, 1 elsewhere.
    for entry in entries:
        step_weight = records[entry["step"]].weight
        assert entry["weight"] == (pytest.approx(step_weight) if entry["anchor"] else 1.0)


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def task_prompt_names(entry) -> bool:
    prompt = entry["prompt"] if isinstance(entry["prompt"], str) else entry["prompt"][-1]["content"]
    return f"'{entry['task']}'" in prompt


def _ladder(grade: dict) -> float:
    from wmrl.outcome import Outcome

    return Outcome.model_validate({k: v for k, v in grade.items() if k != "reward"}).reward


# ---------------------------------------------------------------- pieces

def test_sampling_is_deterministic_and_close_to_the_rate():
    picked = [is_sampled(7, 3, row, 0.25) for row in range(8000)]
    assert picked == [is_sampled(7, 3, row, 0.25) for row in range(8000)]
    assert 0.22 < sum(picked) / len(picked) < 0.28
    assert picked != [is_sampled(7, 4, row, 0.25) for row in range(8000)]  # another step, other rows
    assert not any(is_sampled(7, 3, row, 0.0) for row in range(100))
    assert all(is_sampled(7, 3, row, 1.0) for row in range(100))


def test_rotation_keeps_keep_files_bounded_and_in_order(tmp_path):
    log = RotatingJsonl(tmp_path / "rank-0.jsonl", max_bytes=400, keep=2)
    for step in range(40):
        log.append([{"step": step, "pad": "x" * 40}])
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["rank-0.jsonl", "rank-0.jsonl.1", "rank-0.jsonl.2"]
    assert all(p.stat().st_size <= 400 for p in tmp_path.iterdir())
    steps = [e["step"] for name in names[::-1] for e in _lines(tmp_path / name)]  # .2, .1, current
    assert steps == list(range(40 - len(steps), 40)) and len(steps) > 10  # the newest, oldest first
    none_kept = RotatingJsonl(tmp_path / "other" / "rank-1.jsonl", max_bytes=100, keep=0)
    for step in range(10):
        none_kept.append([{"step": step, "pad": "y" * 40}])
    assert [p.name for p in (tmp_path / "other").iterdir()] == ["rank-1.jsonl"]


def test_the_world_models_reason_and_predictions_reach_the_log():
    answer = json.dumps({"predictions": [
        {"status": "runtime_err", "error_type": "KeyError", "error_line": 3, "env_feedback": "KeyError: 'y'",
         "reason": "the target column is called target"},
        {"status": "valid", "quality_bucket": "mid", "env_feedback": "ok", "reason": "if it ran"}]})
    outcome = outcome_from_text(answer)
    logged = outcome_json(outcome)
    assert logged["status"] == "runtime_err" and logged["reward"] == 0.1
    assert logged["reason"] == "the target column is called target"
    assert [p["status"] for p in logged["predictions"]] == ["runtime_err", "valid"]
    copy = outcome.model_copy()
    assert copy == outcome and "reason" not in outcome_json(copy)  # outcomes compare as before; copies carry none


@pytest.mark.parametrize("spec, path", [
    ({"sampleRate": 1.5}, "spec.logging.trajectories.sampleRate"),
    ({"sampleRate": -0.1}, "spec.logging.trajectories.sampleRate"),
    ({"maxFileBytes": 10}, "spec.logging.trajectories.maxFileBytes"),
    ({"keepFiles": -1}, "spec.logging.trajectories.keepFiles"),
    ({"rate": 0.5}, "spec.logging.trajectories.rate"),
])
def test_bad_logging_fields_are_refused_naming_the_field(spec, path):
    with pytest.raises(ValidationError) as err:
        parse_spec({**SPEC, "logging": {"trajectories": spec}})
    assert any(line.startswith(path + ":") for line in field_errors(err.value)), field_errors(err.value)


def test_logging_is_off_by_default():
    spec = dict(SPEC)
    spec.pop("logging")
    t = parse_spec(spec).logging.trajectories
    assert (t.sample_rate, t.max_file_bytes, t.keep_files) == (0.0, 64 * 1024 * 1024, 4)
