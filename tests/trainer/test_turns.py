"""Multi-turn trajectories at the step level (no TRL): who sees which feedback, best-turn rewards,
early stops, ungraded turns, per-trajectory calibration pairs and the world model's history."""

from __future__ import annotations

import concurrent.futures as cf
import math
from typing import Optional

import numpy as np
import pytest

from wmrl.anchors import AnchorSelector
from wmrl.api.schema import AlgorithmSpec
from wmrl.calibration.client import LocalCalibration
from wmrl.calibration.state import CalibrationConfig
from wmrl.outcome import Outcome, Status, bucket_of, is_top, QualityBucket, BUCKET_RANK_SCORE
from wmrl_trainer.loop import WMRLStep
from wmrl_trainer.observation import header, line_kind, observation_text
from wmrl_scripted import make_tasks

G = 4


def outcome_of(code: str) -> Optional[Outcome]:
    """Scripts name their outcome: ``crash`` -> runtime error on line 2 (a fit line), ``noout`` -> no
    submission, ``valid:<rank>`` -> a valid run, ``none`` -> ungraded."""
    kind, _, arg = code.partition(":")
    if kind == "crash":
        return Outcome(status=Status.RUNTIME_ERR, error_type="ValueError", error_line=2,
                       feedback="Traceback ...\nValueError: Unknown label type")
    if kind == "noout":
        return Outcome(status=Status.RAN_NO_SUB, feedback="no submission.csv was written")
    if kind == "valid":
        return Outcome(status=Status.VALID, rank_score=float(arg), feedback="accuracy = 0.9")
    return None


class SplitWorld:
    """The world model reads the script's first line, the sandbox its second: they can disagree."""

    def __init__(self):
        self.items: list[tuple] = []

    def grade(self, items):
        self.items.extend(items)
        return [outcome_of(item[1].splitlines()[0]) for item in items]


class SplitSandbox:
    def __init__(self, fail=lambda code: False):
        self.pool = cf.ThreadPoolExecutor(4)
        self.runs: list[str] = []
        self.fail = fail
        self.demand = 0

    def run_task(self, task, code):
        self.runs.append(code)

        def run():
            if self.fail(code):
                raise ConnectionError("sandbox down")
            return outcome_of(code.splitlines()[1])
        return self.pool.submit(run)

    def close(self):
        self.pool.shutdown()


def step_for(mode="wmrl", fraction=0.5, sandbox=None, world=None, cal=None):
    alg = AlgorithmSpec.model_validate({"groupSize": G, "groupsPerStep": 2, "maxTurns": 3})
    cal = cal or LocalCalibration(CalibrationConfig(min_pairs=1000, refit_every=1000, warmup=2, half_life=4.0))
    return WMRLStep(mode, alg, world_model=world or SplitWorld(), dispatcher=sandbox or SplitSandbox(),
                    calibration=cal, selector=AnchorSelector(fraction, 1, 16, seed=0)), cal


def script(wm: str, real: str) -> str:
    return f"{wm}\n{real}\n"


def test_anchor_trajectories_see_the_sandbox_and_the_others_the_world_model():
    step, _ = step_for()
    batch = step.begin_trajectories(0, make_tasks(2), G)
    assert len(batch.anchors) == 1
    keys = batch.keys()
    step.grade_turn(batch, keys, [script("valid:0.3", "crash")] * len(keys))
    for key in keys:
        trajectory = batch.get(key)
        turn = trajectory.turns[0]
        if trajectory.anchor:
            assert turn.shown is turn.real and turn.real.status is Status.RUNTIME_ERR
            assert "status=runtime_err error=ValueError where=other" in turn.observation
            assert turn.world_model is not None and turn.world_model.status is Status.VALID  # graded for its pair
        else:
            assert turn.real is None and turn.shown is turn.world_model
            assert "status=valid" in turn.observation and "quality=fair" in turn.observation
    assert len(step.dispatcher.runs) == G  # only the anchor group ran


def test_reward_is_the_best_turn_and_a_top_outcome_ends_the_trajectory():
    step, _ = step_for(mode="worldModel", fraction=0.0)
    batch = step.begin_trajectories(0, make_tasks(2), G)
    keys = batch.keys()
    step.grade_turn(batch, keys, [script("valid:0.45", "x")] * len(keys))
    step.grade_turn(batch, keys, [script("crash", "x")] * 4 + [script("valid:0.9", "x")] * 4)
    top = [k for k in keys if batch.get(k).done]
    assert [batch.get(k).stop for k in top] == ["top"] * 4
    running = batch.running()
    step.grade_turn(batch, running, [script("noout", "x")] * len(running))
    for key in running:
        batch.get(key).end("turns")
    scored = step.finish_trajectories(batch)
    wm = scored.world_model
    np.testing.assert_allclose(wm[0], 0.5 + 0.5 * 0.45)  # crash (0.1) and noout (0.2) after 0.725: best is turn 1
    np.testing.assert_allclose(wm[1], 0.5 + 0.5 * 0.9)
    np.testing.assert_allclose(scored.rewards, wm)
    summary = batch.summary()
    assert summary["stops"] == {"top": 4, "turns": 4, "budget": 0, "truncated": 0, "ungraded": 0}
    assert summary["mean_turns"] == pytest.approx(2.5)
    assert summary["status_by_turn"][1] == {"malformed": 0, "syntax_err": 0, "runtime_err": 4, "ran_no_sub": 0,
                                            "valid": 4}
    assert summary["valid_share_by_turn"] == [1.0, 0.5, 0.0]


def test_a_turn_the_world_model_cannot_grade_ends_its_trajectory_ungraded_never_zero():
    step, _ = step_for(mode="worldModel", fraction=0.0)
    batch = step.begin_trajectories(0, make_tasks(2), G)
    keys = batch.keys()
    step.grade_turn(batch, keys, [script("crash", "x")] * len(keys))
    step.grade_turn(batch, keys, [script("none", "x")] + [script("valid:0.2", "x")] * (len(keys) - 1))
    assert batch.get(keys[0]).stop == "ungraded" and batch.get(keys[1]).stop is None
    with pytest.raises(RuntimeError, match="ended"):
        batch.get(keys[0]).add_turn("x", world_model=None, real=None, anchor=False)
    silent = Outcome(status=Status.VALID, rank_score=0.2, feedback="  ")  # nothing to show the next turn
    batch.get(keys[1]).add_turn("y", world_model=silent, real=None, anchor=False)
    assert batch.get(keys[1]).stop == "ungraded"
    scored = step.finish_trajectories(batch)
    assert math.isnan(scored.rewards[0, 0]) and math.isnan(scored.rewards[0, 1]) and scored.record.ungraded == 2
    assert scored.rewards[0, 2] == pytest.approx(0.5 + 0.5 * 0.2)


def test_anchor_trajectories_give_one_calibration_pair_each_and_a_failed_execution_is_ungraded():
    sandbox = SplitSandbox(fail=lambda code: code.startswith("valid:0.1"))
    step, cal = step_for(sandbox=sandbox)
    batch = step.begin_trajectories(0, make_tasks(2), G)
    (anchor,) = batch.anchors
    keys = batch.keys()
    first = [script("valid:0.1" if k == (anchor, 0) else "valid:0.3", "crash") for k in keys]
    step.grade_turn(batch, keys, first)
    assert batch.get((anchor, 0)).stop == "ungraded"
    running = batch.running()
    step.grade_turn(batch, running, [script("valid:0.2", "valid:0.45")] * len(running))
    for key in batch.running():
        batch.get(key).end("turns")
    scored = step.finish_trajectories(batch)
    assert scored.anchor_groups == [anchor]
    assert math.isnan(scored.rewards[anchor, 0])
    # Real: crash (0.1) then valid 0.45 -> 0.725; world model: best of 0.3 and 0.2 -> 0.65.
    np.testing.assert_allclose(scored.real[anchor, 1:], 0.725)
    np.testing.assert_allclose(scored.world_model[anchor, 1:], 0.65)
    np.testing.assert_allclose(scored.rewards[anchor, 1:], 0.725)
    assert cal.state.pairs_seen == G - 1  # one pair per executed anchor trajectory, not per turn
    assert scored.record.executions == 2 * G - 1 and scored.record.failed_executions == 1


def test_the_world_model_prompt_carries_the_trajectory_so_far():
    world = SplitWorld()
    step, _ = step_for(world=world, fraction=0.0, mode="worldModel")
    batch = step.begin_trajectories(0, make_tasks(1)[:1], G)
    keys = batch.keys()
    step.grade_turn(batch, keys, [script("crash", "x")] * G)
    step.grade_turn(batch, keys, [script("valid:0.2", "x")] * G)
    first, second = world.items[0], world.items[G]
    assert first[2] == ()
    (earlier_code, earlier_observation), = second[2]
    assert earlier_code == script("crash", "x") and "status=runtime_err" in earlier_observation


def test_observation_header_names_status_error_line_kind_and_quality():
    code = "import numpy as np\nX = np.loadtxt('train.csv')\nmodel.fit(X, y)\n"
    crash = Outcome(status=Status.RUNTIME_ERR, error_type="FileNotFoundError", error_line=2, feedback="x" * 5000)
    assert header(crash, code) == "[execution] status=runtime_err error=FileNotFoundError where=load quality=none"
    assert len(observation_text(crash, code)) < 1500  # the output is cut to its tail
    odd = Outcome(status=Status.RUNTIME_ERR, error_type="FancyError", error_line=9)
    assert header(odd, code) == "[execution] status=runtime_err error=other where=none quality=none"
    assert [line_kind(code, n) for n in (1, 2, 3, None, 4)] == ["import", "load", "fit", None, None]
    valid = Outcome(status=Status.VALID, rank_score=0.8)
    assert header(valid, code).endswith("quality=high") and is_top(valid)
    assert not is_top(Outcome(status=Status.VALID, quality_bucket=QualityBucket.MID))


def test_bucket_of_a_rank_score_is_the_nearest_bucket():
    for bucket, score in BUCKET_RANK_SCORE.items():
        assert bucket_of(score) is bucket
    assert bucket_of(0.0) is QualityBucket.LOW and bucket_of(1.0) is QualityBucket.HIGH
