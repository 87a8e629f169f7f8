"""The synthetic judge (wmrl_bench.synthetic_judge): its formula's properties, the grid, one tiny training run."""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.isotonic import IsotonicRegression

from wmrl.debias import apply_map, fit_bucketed_isotonic
from wmrl.outcome import Outcome, Status
from wmrl.tasks import Task
from wmrl_bench.synthetic_judge import (DRIFT_HORIZON, JUDGE_GRID, PREDICTIONS, JudgeCell, SyntheticWorldModel,
                                        judge_cell, judged_reward, outcome_of, reported_reward, script_error,
                                        synthetic_world_model, task_offset, warp)
from wmrl_trainer.world_model.base import WorldModel, compile_gate

SCRIPTS = (
    "import numpy as np\nfrom sklearn.linear_model import LogisticRegression\nm = LogisticRegression()\n",
    "from sklearn.ensemble import RandomForestClassifier\nm = RandomForestClassifier(n_estimators=500)\n",
    "from sklearn.preprocessing import StandardScaler\nfrom sklearn.svm import SVC\nm = SVC()\ns = StandardScaler()\n",
    "x = 1\nprint(x + 1)\n",
)
TASK_NAMES = ("iris", "wine", "diabetes", "friedman3")
# Every reward a compiling script can really get: the failure rungs, or a valid run's 0.5 + 0.5 x rank score
# (a fraction of a leaderboard: rounded, so that no two differ by one ulp, where sklearn's interpolation gives NaN).
true_rewards = st.one_of(st.sampled_from((0.0, 0.1, 0.2)), st.floats(0.5, 1.0).map(lambda x: round(x, 6)))
cells = st.builds(JudgeCell, name=st.just("c"), gamma=st.floats(0.2, 20.0), sigma=st.floats(0.0, 1.0),
                  task_offset=st.floats(0.0, 1.0), optimism=st.floats(0.0, 1.0), drift=st.floats(0.0, 1.0))


def _task(name: str) -> Task:
    return Task(name=name, description=f"{name} task", kind="classification", metric="accuracy", target="target",
                data={"train.csv": b"id,f0,target\n0,1,0\n"}, hidden_labels=b"id,target\n0,0\n")


TASKS = {name: _task(name) for name in TASK_NAMES}


def _uniform(*parts: str) -> float:
    digest = hashlib.blake2b("\0".join(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2**64


def _truth(task: Task, code: str) -> Outcome:
    """A stand-in for the outcome table: a fixed, ladder-shaped real outcome per (task, script); code that does
    not compile fails as it would in the sandbox."""
    gated = compile_gate(code)
    if gated is not None:
        return gated
    q = _uniform(task.name, code)
    if q < 0.2:
        return Outcome(status=Status.RUNTIME_ERR)
    if q < 0.3:
        return Outcome(status=Status.RAN_NO_SUB)
    return Outcome(status=Status.VALID, rank_score=(q - 0.3) / 0.7)


def _true_reward(task: Task, code: str) -> float:
    return _truth(task, code).reward


# ------------------------------------------------------------------ the grid and the predictions


def test_the_grid_holds_the_pre_registered_cells_under_unique_names():
    names = [cell.name for cell in JUDGE_GRID]
    assert len(names) == len(set(names)) == 12
    warps = {(c.gamma, c.sigma) for c in JUDGE_GRID if c.name.startswith("g")}
    assert warps == {(g, s) for g in (1.0, 3.0, 6.0) for s in (0.0, 0.05, 0.15)}
    assert judge_cell("g3-s0.05") == JudgeCell("g3-s0.05", gamma=3.0, sigma=0.05)
    assert judge_cell("offsets-only") == JudgeCell("offsets-only", task_offset=0.15)
    assert judge_cell("optimism-only") == JudgeCell("optimism-only", optimism=0.2)
    assert judge_cell("drift") == JudgeCell("drift", sigma=0.02, drift=0.2)
    with pytest.raises(KeyError, match="no judge cell"):
        judge_cell("g2-s0")


def test_the_predictions_name_grid_cells_and_order_them_along_their_knob():
    grid = {cell.name: cell for cell in JUDGE_GRID}
    assert {p["effect"] for p in PREDICTIONS} == {"debias - none", "denoise - none"}
    for prediction in PREDICTIONS:
        assert set(prediction) == {"effect", "increases_with", "cells", "null_in", "positive_in"}
        named = [*prediction["cells"], *prediction["null_in"], *prediction["positive_in"]]
        assert named and all(name in grid for name in named), named
        knob = prediction["increases_with"]
        levels = [getattr(grid[name], knob) for name in prediction["cells"]]
        assert levels == sorted(levels) and len(set(levels)) == len(levels)
    debias = next(p for p in PREDICTIONS if p["effect"] == "debias - none")
    assert {"offsets-only", "optimism-only"} <= set(debias["null_in"])
    assert all(grid[name].gamma == 1.0 for name in debias["null_in"])  # nothing a monotone map can fix there
    denoise = next(p for p in PREDICTIONS if p["effect"] == "denoise - none")
    assert "drift" in denoise["positive_in"]


@pytest.mark.parametrize("bad", [{"gamma": 0.0}, {"gamma": math.inf}, {"sigma": -0.1}, {"task_offset": math.nan},
                                 {"optimism": -1.0}, {"drift": -0.5}, {"name": ""}])
def test_a_cell_refuses_impossible_settings(bad):
    with pytest.raises(ValueError):
        JudgeCell(**{"name": "c", **bad})


# ------------------------------------------------------------------ the formula


@given(cells, true_rewards, st.sampled_from(TASK_NAMES), st.sampled_from(SCRIPTS), st.integers(0, 10 * DRIFT_HORIZON),
       st.integers(0, 2**31))
@settings(max_examples=200, deadline=None)
def test_wm_and_the_reported_reward_lie_in_the_unit_interval(cell, r, task, code, batches, seed):
    wm = judged_reward(cell, seed, task, code, r, batches)
    assert 0.0 <= wm <= 1.0
    assert 0.0 <= reported_reward(wm) <= 1.0


@given(st.floats(0.0, 1.0), st.floats(0.0, 1.0), st.floats(0.05, 50.0))
@settings(max_examples=300, deadline=None)
def test_the_warp_is_increasing_and_the_identity_at_gamma_one(a, b, gamma):
    lo, hi = min(a, b), max(a, b)
    assert warp(lo, gamma) <= warp(hi, gamma)
    assert warp(a, 1.0) == a
    assert warp(0.0, gamma) == 0.0 and warp(1.0, gamma) == 1.0
    if gamma > 1.0 and 0.0 < a < 1.0:
        assert warp(a, gamma) >= a  # concave: lifts every interior reward


@given(st.floats(0.0, 1.0), st.floats(0.0, 1.0))
@settings(max_examples=300, deadline=None)
def test_the_reported_reward_is_monotone_in_wm_and_exact_from_one_half(a, b):
    lo, hi = min(a, b), max(a, b)
    assert reported_reward(lo) <= reported_reward(hi)
    if a >= 0.5:
        assert reported_reward(a) == pytest.approx(a, abs=1e-12)
        assert outcome_of(a).status is Status.VALID
    else:
        assert reported_reward(a) in (0.0, 0.1, 0.2, 0.5)


@given(true_rewards, st.sampled_from(TASK_NAMES), st.sampled_from(SCRIPTS), st.integers(0, 2**31))
@settings(max_examples=200, deadline=None)
def test_a_judge_without_errors_reports_the_true_reward_and_status(r, task, code, seed):
    perfect = JudgeCell("perfect")
    wm = judged_reward(perfect, seed, task, code, r, batches=7)
    assert wm == r
    assert reported_reward(wm) == pytest.approx(r, abs=1e-12)
    truth = {0.0: Status.SYNTAX_ERR, 0.1: Status.RUNTIME_ERR, 0.2: Status.RAN_NO_SUB}.get(r, Status.VALID)
    assert outcome_of(wm).status is truth
    model = synthetic_world_model(perfect, seed, lambda t, c: r)
    assert model.grade([(TASKS[task], code)])[0].reward == pytest.approx(r, abs=1e-12)


def test_optimism_and_offsets_add_exactly_their_terms():
    from wmrl_trainer.world_model.features import code_facts
    from wmrl_trainer.world_model.learned import complexity

    forest = SCRIPTS[1]
    expected = 0.6 + 0.2 * complexity(code_facts(forest))
    assert judged_reward(judge_cell("optimism-only"), 0, "iris", forest, 0.6) == pytest.approx(expected, abs=1e-12)
    b = task_offset(0, "iris", 0.15)
    assert 0 < abs(b) <= 0.15
    assert judged_reward(judge_cell("offsets-only"), 0, "iris", forest, 0.6) == pytest.approx(0.6 + b, abs=1e-12)
    assert judged_reward(judge_cell("offsets-only"), 0, "iris", SCRIPTS[0], 0.7) == pytest.approx(0.7 + b, abs=1e-12)


def test_task_offsets_cover_their_interval_evenly():
    offsets = np.array([task_offset(seed, "iris", 0.15) for seed in range(4000)])
    assert offsets.min() >= -0.15 and offsets.max() <= 0.15
    assert abs(offsets.mean()) < 0.01 and offsets.std() == pytest.approx(0.15 / math.sqrt(3), rel=0.05)


def test_script_errors_are_standard_normal_across_scripts():
    errors = np.array([script_error(0, "iris", f"x = {i}\n") for i in range(4000)])
    assert abs(errors.mean()) < 0.06 and errors.std() == pytest.approx(1.0, rel=0.05)


@given(st.lists(st.tuples(st.sampled_from(TASK_NAMES), st.sampled_from(SCRIPTS)), min_size=2, max_size=12),
       st.randoms(use_true_random=False), st.integers(0, 2**31))
@settings(max_examples=60, deadline=None)
def test_the_error_is_fixed_per_task_and_script_whatever_the_grading_order(pairs, rng, seed):
    cell = JudgeCell("noisy", gamma=3.0, sigma=0.15, task_offset=0.1, optimism=0.2)
    items = [(TASKS[t], c) for t, c in pairs]
    shuffled = list(items)
    rng.shuffle(shuffled)
    first = synthetic_world_model(cell, seed, _true_reward).grade(items)
    second = synthetic_world_model(cell, seed, _true_reward).grade(shuffled)
    rewards: dict[tuple[str, str], set[float]] = {}
    for (task, code), outcome in [*zip(items, first), *zip(shuffled, second)]:
        rewards.setdefault((task.name, code), set()).add(outcome.reward)
    assert all(len(seen) == 1 for seen in rewards.values())  # in either order, repeated or not: one grade
    assert all(script_error(seed, t, c) == script_error(seed, t, c) for t, c in pairs)


# ------------------------------------------------------------------ what a monotone map can and cannot undo


@given(st.lists(true_rewards, min_size=2, max_size=40), st.floats(1.0, 12.0), st.integers(0, 2**31))
@settings(max_examples=150, deadline=None)
def test_an_isotonic_map_recovers_a_pure_warp_exactly(rewards, gamma, seed):
    cell = JudgeCell("warp", gamma=gamma)
    r = np.array(rewards)
    wm = np.array([judged_reward(cell, seed, "iris", f"x = {i}\n", v) for i, v in enumerate(rewards)])
    fitted = IsotonicRegression(increasing=True).fit(wm, r).predict(wm)
    np.testing.assert_allclose(fitted, r, atol=1e-9)


@given(st.lists(true_rewards, min_size=2, max_size=40), st.sampled_from((3.0, 6.0)), st.integers(0, 2**31))
@settings(max_examples=150, deadline=None)
def test_an_isotonic_map_recovers_the_reward_the_trainer_sees_at_the_grids_warps(rewards, gamma, seed):
    """At gamma 3 and 6 rounding wm to the ladder below 0.5 loses nothing: distinct true rewards stay apart."""
    cell = JudgeCell("warp", gamma=gamma)
    model = synthetic_world_model(cell, seed, lambda task, code: rewards[int(code.split()[-1])])
    reported = np.array([o.reward for o in model.grade([(TASKS["iris"], f"x = {i}\n") for i in range(len(rewards))])])
    fitted = IsotonicRegression(increasing=True).fit(reported, rewards).predict(reported)
    np.testing.assert_allclose(fitted, rewards, atol=1e-9)


@given(st.lists(st.tuples(st.integers(0, 9), st.floats(0.1, 0.9)), min_size=2, max_size=10,
                unique_by=lambda p: p[0]), st.floats(1.0, 12.0))
@settings(max_examples=150, deadline=None)
def test_the_benchmarks_own_bucketed_fit_recovers_a_warp_when_the_points_fill_distinct_bins(points, gamma):
    """wmrl.debias averages within each of its 10 bins: one judged value per bin, and its map is exact."""
    wm_target = np.array([(k + u) / 10 for k, u in points])
    r = wm_target ** gamma
    wm = np.array([judged_reward(JudgeCell("warp", gamma=gamma), 0, "iris", "x = 1\n", v) for v in r])
    np.testing.assert_allclose(wm, wm_target, atol=1e-12)
    calibration = fit_bucketed_isotonic(wm, r, bins=10)
    np.testing.assert_allclose(apply_map(calibration, wm), r, atol=1e-9)


def test_a_pure_warp_is_mostly_removed_by_the_bucketed_fit_on_realistic_groups():
    """Groups of 8 scripts of one task each, gamma 6: the within-group bias the trainer sees mostly goes. Not all
    of it at the spec's 10 bins: gamma 6 puts every compiling script's wm in [0.68, 1], 4 bins, and the map
    interpolates between their means; with 50 bins nearly all of it goes."""
    from wmrl.debias import bias_diagnostic

    cell = judge_cell("g6-s0")
    items = [(TASKS[TASK_NAMES[g % 4]], f"x = {g * 8 + i}\n") for g in range(60) for i in range(8)]
    r = np.array([_true_reward(t, c) for t, c in items])
    model = synthetic_world_model(cell, 0, _true_reward)
    wm = np.array([o.reward for o in model.grade(items)])
    before, after, reduction = bias_diagnostic(wm, r, [8] * 60, fit_bucketed_isotonic(wm, r, bins=10))
    assert before > 0.01 and reduction >= 0.85, (before, after)
    before, after, reduction = bias_diagnostic(wm, r, [8] * 60, fit_bucketed_isotonic(wm, r, bins=50))
    assert reduction >= 0.99, (before, after)


def test_offsets_per_task_defeat_any_single_monotone_map():
    """Two tasks with offsets of opposite sign: a worse script of the favoured task is judged above a better
    script of the other, so one global monotone map must err; one map per task would be exact."""
    cell = judge_cell("offsets-only")
    up = max(TASK_NAMES, key=lambda t: task_offset(0, t, 0.15))
    down = min(TASK_NAMES, key=lambda t: task_offset(0, t, 0.15))
    gap = task_offset(0, up, 0.15) - task_offset(0, down, 0.15)
    assert gap > 0.1  # the example needs offsets far enough apart (seed 0 has them)
    pairs = [(up, 0.6), (up, 0.9), (down, 0.6 + gap / 2), (down, 0.9)]
    wm = np.array([judged_reward(cell, 0, t, "x = 1\n", r) for t, r in pairs])
    r = np.array([r for _, r in pairs])
    assert wm[0] > wm[2] and r[0] < r[2]  # the order across tasks flips
    fitted = IsotonicRegression(increasing=True).fit(wm, r).predict(wm)
    assert np.mean((fitted - r) ** 2) > 1e-4
    bucketed = apply_map(fit_bucketed_isotonic(wm, r, bins=10), wm)
    assert np.mean((bucketed - r) ** 2) > 1e-4
    for task in (up, down):  # per task, the offset is a shift: a monotone map removes it
        mine = np.array([t == task for t, _ in pairs])
        per_task = IsotonicRegression(increasing=True).fit(wm[mine], r[mine]).predict(wm[mine])
        np.testing.assert_allclose(per_task, r[mine], atol=1e-12)


# ------------------------------------------------------------------ drift and the world model


@given(st.floats(0.0, 1.0), st.floats(0.0, 1.0), st.integers(0, 5 * DRIFT_HORIZON), st.integers(0, 5 * DRIFT_HORIZON))
@settings(max_examples=300, deadline=None)
def test_drift_never_lowers_the_noise(sigma, drift, a, b):
    cell = JudgeCell("d", sigma=sigma, drift=drift)
    assert cell.sigma_at(min(a, b)) <= cell.sigma_at(max(a, b))
    assert cell.sigma_at(0) == sigma
    assert cell.sigma_at(DRIFT_HORIZON + a) == pytest.approx(sigma + drift)


def test_a_drifting_judge_errs_more_with_every_batch_it_grades():
    cell = judge_cell("drift")
    code = next(f"x = {i}\n" for i in range(100) if abs(script_error(0, "iris", f"x = {i}\n")) > 0.5)
    model = synthetic_world_model(cell, 0, lambda task, c: 0.75)
    errors = []
    for _ in range(DRIFT_HORIZON + 5):
        errors.append(abs(model.grade([(TASKS["iris"], code)])[0].reward - 0.75))
        assert model.grade([]) == []  # an empty call is not a graded batch
    assert model.batches == DRIFT_HORIZON + 5
    assert all(a <= b + 1e-12 for a, b in zip(errors, errors[1:]))
    assert errors[0] == pytest.approx(0.02 * abs(script_error(0, "iris", code)), abs=1e-12)
    assert errors[-1] == pytest.approx(0.22 * abs(script_error(0, "iris", code)), abs=1e-12)
    resumed = synthetic_world_model(cell, 0, lambda task, c: 0.75)
    resumed.load_state_dict(model.state_dict())
    assert resumed.grade([(TASKS["iris"], code)])[0].reward == model.grade([(TASKS["iris"], code)])[0].reward
    with pytest.raises(ValueError):
        synthetic_world_model(cell, 1, _true_reward).load_state_dict(model.state_dict())


def test_the_compile_gate_grades_broken_code_without_asking_for_the_truth():
    asked = []
    model = synthetic_world_model("g6-s0.15", 0, lambda task, code: asked.append(code) or 0.75)
    assert isinstance(model, SyntheticWorldModel) and isinstance(model, WorldModel)
    outcomes = model.grade([(TASKS["iris"], "def f(:\n    pass\n"), (TASKS["iris"], ""),
                            (TASKS["iris"], SCRIPTS[0]), (TASKS["iris"], SCRIPTS[0]), (TASKS["wine"], SCRIPTS[0])])
    assert [o.status for o in outcomes[:2]] == [Status.SYNTAX_ERR, Status.MALFORMED]
    assert asked == [SCRIPTS[0], SCRIPTS[0]]  # once per distinct (task, script) of the batch
    assert outcomes[2] == outcomes[3] and model.stats["gated"] == 2 and model.stats["predicted"] == 3
    model.observe(TASKS["iris"], SCRIPTS[0], Outcome(status=Status.RUNTIME_ERR))  # frozen: learns nothing
    assert model.grade([(TASKS["iris"], SCRIPTS[0])])[0] == outcomes[2]


@pytest.mark.parametrize("bad", [1.5, -0.1, math.nan])
def test_a_true_reward_off_the_ladder_is_an_error_not_a_grade(bad):
    model = synthetic_world_model("g1-s0", 0, lambda task, code: bad)
    with pytest.raises(ValueError, match="true reward"):
        model.grade([(TASKS["iris"], SCRIPTS[0])])


# ------------------------------------------------------------------ a tiny training run


class _TruthDispatcher:
    """The trainer's dispatcher interface, answering at once with :func:`_truth` (no sandboxes)."""

    demand = 0

    def __init__(self):
        self.runs = 0

    def run_task(self, task: Task, code: str, run_timeout=None) -> cf.Future:
        self.runs += 1
        done: cf.Future = cf.Future()
        done.set_result(_truth(task, code))
        return done

    def close(self) -> None:
        pass


class _Recording(SyntheticWorldModel):
    def __init__(self, *args):
        super().__init__(*args)
        self.graded: list[tuple[Task, str, Outcome]] = []

    def grade(self, items):
        outcomes = super().grade(items)
        self.graded += [(task, code, o) for (task, code), o in zip(items, outcomes)]
        return outcomes


@pytest.mark.slow
def test_the_trainer_trains_two_wmrl_steps_against_the_synthetic_judge(tmp_path):
    """The bench's arm config, the builtin tiny coder, anchors from a stand-in table: a perfect cell
    reports every rollout's true reward, so the trainer's world-model rewards are the truth."""
    from wmrl_bench.design import arm_config
    from wmrl_demo.demo_policy import load_builtin
    from wmrl_trainer.build import build_trainer, load_training_tasks
    from wmrl_trainer.services import local_runtime, quiet_libraries

    quiet_libraries()
    config = local_runtime(arm_config("wmrl", 0, 2, group_size=4, groups_per_step=2, held_out=["iris"]), tmp_path, [],
                           None)
    tasks, held_out = load_training_tasks(config)
    model = _Recording(judge_cell("g1-s0"), 0, _true_reward)
    dispatcher, records = _TruthDispatcher(), []
    trainer = build_trainer(config, policy=load_builtin("tiny-coder"), tasks=tasks, held_out=held_out,
                            world_model=model, dispatcher=dispatcher, callbacks=[records.append])
    try:
        trainer.train()
    finally:
        trainer.close()
    assert len(records) == 2 and model.batches == 2 and dispatcher.runs >= 2 * 4  # an anchor group a step
    assert len(model.graded) == 2 * 2 * 4 and all(record.ungraded == 0 for record in records)
    for task, code, outcome in model.graded:
        assert outcome.reward == pytest.approx(_true_reward(task, code), abs=1e-12)
    for record in records:
        assert record.mean_world_model_reward is not None and 0.0 <= record.mean_world_model_reward <= 1.0
