"""Fidelity cases: the file format and the prompt it rebuilds, and the training side (anchors' cases from the
WMRL step, rotation, the rolling figures in status and metrics)."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest

from fidelity_cases import CASES, TASK, case_lines, write_cases
from test_competition_prompts import _competition
from wmrl.anchors import AnchorSelector
from wmrl.api.schema import AlgorithmSpec, Mode, parse_spec
from wmrl.calibration.client import LocalCalibration
from wmrl.calibration.state import CalibrationConfig
from wmrl.outcome import Outcome, Status
from wmrl_scripted import ScriptedExecutor, ScriptedWorldModel, make_tasks
from wmrl_trainer.fidelity.cases import CaseFormatError, case_files, case_json, parse_case, read_cases
from wmrl_trainer.fidelity.judge import judged
from wmrl_trainer.fidelity.metrics import rolling
from wmrl_trainer.fidelity.recorder import AnchorCase, CaseRecorder
from wmrl_trainer.loop import WMRLStep
from wmrl_trainer.progress import Totals, TrainerMetrics, progress_of
from wmrl_trainer.prompts import world_model_messages, world_model_prompt

HISTORY = (("import pandas as pd\nprint(pd.read_csv('train.csv'))\n", "FileNotFoundError: train.csv"),)


def roundtrip(line: dict):
    return parse_case(json.loads(json.dumps(line)), "mem:1")


# ---------------------------------------------------------------- the format

def test_a_case_rebuilds_the_exact_world_model_prompt_of_a_plain_task():
    code, real, _ = CASES["name"]
    case = roundtrip(case_json(TASK, code, real, history=HISTORY))
    assert case.code == code and case.history == HISTORY and case.real == real
    task, script, history = case.item
    assert world_model_messages(task, script, 2, history) == world_model_messages(TASK, code, 2, HISTORY)
    assert world_model_prompt(case.task, code, 3) == world_model_prompt(TASK, code, 3)
    assert case.task.data == {} and case.task.higher_is_better  # no data travels with a case


def test_a_case_rebuilds_the_exact_world_model_prompt_of_a_collection_task(tmp_path):
    task = _competition(tmp_path)
    code = "import pandas as pd\nprint(pd.read_csv('data/train.csv').shape)\n"
    case = roundtrip(case_json(task, code, Outcome(status=Status.RAN_NO_SUB)))
    assert world_model_messages(case.task, code) == world_model_messages(task, code)  # overview and all
    assert not case.task.higher_is_better and case.task.leaderboard == (0.1, 0.2, 0.4)


def test_the_case_keeps_the_real_outcome_and_the_world_models_prediction():
    code, real, _ = CASES["forest"]
    predicted = Outcome(status=Status.VALID, quality_bucket="mid", feedback="predicted")
    line = case_json(TASK, code, real, world_model=predicted, source={"step": 3})
    assert line["real"] == {"status": "valid", "error_type": None, "error_line": None, "rank_score": 0.9,
                            "reward": 0.95, "feedback": "accuracy = 0.95"}
    assert line["world_model"]["status"] == "valid" and line["world_model"]["reward"] == 0.725
    case = roundtrip(line)
    assert case.world_model == line["world_model"] and case.source == {"step": 3}


def test_a_valid_case_may_give_its_reward_instead_of_its_position():
    line = case_lines()[4]
    line["real"] = {"status": "valid", "reward": 0.8}
    assert roundtrip(line).real.rank_score == pytest.approx(0.6)
    line["real"] = {"status": "valid"}
    with pytest.raises(CaseFormatError, match=r"mem:1: real.rank_score: a valid case needs"):
        roundtrip(line)
    line["real"] = {"status": "valid", "rank_score": 1.5}
    with pytest.raises(CaseFormatError, match=r"real.rank_score: 1.5 is not in \[0, 1\]"):
        roundtrip(line)
    line["real"] = {"status": "runtime_err", "error_line": -2}
    with pytest.raises(CaseFormatError, match=r"real.error_line"):
        roundtrip(line)


def test_a_directory_reads_its_rotated_case_files_oldest_first(tmp_path):
    lines = case_lines()
    write_cases(tmp_path / "cases.jsonl.2", lines[:2])
    write_cases(tmp_path / "cases.jsonl.1", lines[2:4])
    write_cases(tmp_path / "cases.jsonl", lines[4:])
    (tmp_path / "cases.jsonl.tmp").write_text("ignored")
    assert [p.name for p in case_files(tmp_path)] == ["cases.jsonl.2", "cases.jsonl.1", "cases.jsonl"]
    assert [c.source["name"] for c in read_cases([tmp_path])] == list(CASES)
    assert read_cases([tmp_path])[0].where == f"{tmp_path / 'cases.jsonl.2'}:1"
    with pytest.raises(CaseFormatError, match="a directory without cases.jsonl"):
        read_cases([_empty(tmp_path)])


def _empty(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    return empty


# ---------------------------------------------------------------- the training side

def _anchor(name: str, step: int = 0) -> AnchorCase:
    code, real, (status, error, reward) = CASES[name]
    predicted = Outcome(status=status, error_type=error, quality_bucket="low" if status == "valid" else None)
    return AnchorCase(TASK, code, (), predicted, real, {"step": step, "name": name})


def test_the_recorder_writes_cases_rotates_them_and_keeps_a_rolling_window(tmp_path):
    recorder = CaseRecorder(tmp_path, window=4, max_bytes=6000, keep=1, run="r")
    figures = None
    names = list(CASES) * 2
    for step, name in enumerate(names):
        figures = recorder.record([_anchor(name, step)])
    cases = read_cases([tmp_path])
    assert (tmp_path / "cases.jsonl.1").is_file() and not (tmp_path / "cases.jsonl.2").exists()
    assert 2 <= len(cases) < len(names) and recorder.recorded == len(names)  # the oldest rotated away
    assert [c.source["name"] for c in cases] == names[-len(cases):] and cases[-1].source["run"] == "r"
    last = [_anchor(n) for n in names[-4:]]
    assert figures == {**rolling([judged(a.real, a.world_model) for a in last]), "recorded": len(names),
                       "file": str(tmp_path / "cases.jsonl")}
    restored = CaseRecorder(tmp_path / "again", window=4)
    restored.load_state_dict(json.loads(json.dumps(recorder.state_dict())))
    assert restored.figures() == {**figures, "file": str(tmp_path / "again" / "cases.jsonl")}


def test_a_volume_that_cannot_be_written_never_stops_the_figures(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    recorder = CaseRecorder(blocker / "fidelity", window=8)
    figures = recorder.record([_anchor("name"), _anchor("linear")])
    assert recorder.write_failures == 1 and figures["recorded"] == 0 and figures["cases"] == 2
    assert figures["status_at_1"] == 0.5


def _step(recorder, max_turns=1, **kw):
    alg = AlgorithmSpec.model_validate({"groupSize": 4, "groupsPerStep": 4, "maxTurns": max_turns})
    cal = LocalCalibration(CalibrationConfig(min_pairs=64, refit_every=32, warmup=8, half_life=16.0))
    return WMRLStep("wmrl", alg, world_model=ScriptedWorldModel(**kw), dispatcher=ScriptedExecutor(),
                    calibration=cal, selector=AnchorSelector(0.5, 1, 16, seed=0), cases=recorder)


def test_the_wmrl_step_records_every_executed_anchor_row_with_the_world_models_prediction(tmp_path):
    recorder = CaseRecorder(tmp_path, run="unit")
    step = _step(recorder, ungraded=lambda code: code.endswith("row1"))
    tasks = make_tasks(4)
    scored = [step.score(step.submit(s, tasks, [[f"s{s}-g{g}-row{i}" for i in range(4)] for g in range(4)]))
              for s in range(2)]
    step.close()
    cases = read_cases([tmp_path])
    anchors = [(s, g) for s, sc in enumerate(scored) for g in sc.anchor_groups]
    assert len(cases) == 4 * len(anchors)
    assert [(c.source["step"], c.source["group"]) for c in cases[::4]] == anchors
    for case in cases:
        s, g, i = case.source["step"], case.source["group"], case.source["row"]
        assert case.code == f"s{s}-g{g}-row{i}" and case.task.name == tasks[g].name and case.source["run"] == "unit"
        assert case.real.reward == pytest.approx(scored[s].real[g, i])
        if i == 1:
            assert case.world_model is None  # ungraded by the world model: a case all the same
        else:
            assert case.world_model["reward"] == pytest.approx(scored[s].world_model[g, i])
    fidelity = scored[-1].record.fidelity
    assert fidelity["cases"] == len(cases) and fidelity["graded"] == 3 * len(anchors)
    errors = [scored[c.source["step"]].world_model[c.source["group"], c.source["row"]] - c.real.reward
              for c in cases if c.world_model is not None]
    assert fidelity["reward_mae"] == pytest.approx(np.mean(np.abs(errors)))
    assert fidelity["status_at_1"] == 1.0  # the scripted model and executor only know valid runs


def test_multi_turn_anchor_trajectories_record_each_turn_with_the_trajectory_so_far(tmp_path):
    recorder = CaseRecorder(tmp_path)
    step = _step(recorder, max_turns=2)
    batch = step.begin_trajectories(0, make_tasks(4), 4)
    for turn in range(2):
        keys = batch.running()
        step.grade_turn(batch, keys, [f"g{g}-r{i}-t{turn}" for g, i in keys])
    scored = step.finish_trajectories(batch)
    step.close()
    cases = read_cases([tmp_path])
    assert {c.source["group"] for c in cases} == set(scored.anchor_groups)
    second = [c for c in cases if c.source["turn"] == 2]
    assert second and all(len(c.history) == 1 and c.history[0][0].endswith("-t0") for c in second)
    trajectory = batch.get((second[0].source["group"], second[0].source["row"]))
    assert second[0].history == ((trajectory.turns[0].code, trajectory.turns[0].observation),)
    assert scored.record.fidelity["cases"] == len(cases)


def test_the_rolling_fidelity_reaches_status_progress_and_the_metrics():
    from wmrl_trainer.records import StepRecord

    record = StepRecord(step=4, mode="wmrl", fidelity={"cases": 40, "graded": 38, "status_at_1": 0.75,
                                                       "reward_mae": 0.12, "reward_bias": -0.03, "recorded": 120,
                                                       "file": "/ckpt/fidelity/cases.jsonl"})
    wire = progress_of(record, Totals(), 10).to_wire()
    assert wire["fidelity"] == {"cases": 40, "graded": 38, "statusAt1": 0.75, "rewardMae": 0.12, "rewardBias": -0.03,
                                "recorded": 120, "file": "/ckpt/fidelity/cases.jsonl"}
    assert "fidelity" not in progress_of(StepRecord(step=0, mode="real"), Totals(), 10).to_wire()
    metrics = TrainerMetrics(port=0, addr="127.0.0.1")
    try:
        metrics.observe(record)
        text = httpx.get(f"http://127.0.0.1:{metrics.port}/metrics", timeout=5).text
    finally:
        metrics.close()
    assert 'wmrl_trainer_world_model_fidelity{figure="status_at_1"} 0.75' in text
    assert 'wmrl_trainer_world_model_fidelity{figure="reward_mae"} 0.12' in text
    assert "wmrl_trainer_fidelity_cases_recorded 120.0" in text


def test_the_case_log_is_on_by_default_in_mode_wmrl_only(tmp_path):
    spec = parse_spec({"policy": {"model": "m"}, "tasks": {"builtin": "mini-ml"}})
    assert CaseRecorder.from_spec(spec, tmp_path).file.path == tmp_path / "fidelity" / "cases.jsonl"
    assert CaseRecorder.from_spec(spec.model_copy(update={"mode": Mode.REAL}), tmp_path) is None
    off = parse_spec({"policy": {"model": "m"}, "tasks": {"builtin": "mini-ml"}, "logging": {"cases": {"enabled": False}}})
    assert CaseRecorder.from_spec(off, tmp_path) is None
