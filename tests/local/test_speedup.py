"""`wmrl bench speedup` (v2): arms differ only in their spec, the figures from runs, and the command end to end."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from wmrl_bench.analysis import at_cost, choose, holm_over_run, judge_grid_summary, pool_summary
from wmrl_bench.synthetic_judge import JUDGE_GRID
from wmrl_bench.async_analysis import async_goal, async_pool_summary
from wmrl_bench.pool import StepPlan, replay
from wmrl_bench.design import (ABLATION_ORDER, ARMS, ASYNC_CONTROLS, ASYNC_WAIT_FRACTIONS, BASE_SPEC, BIAS_GRID,
                               GROUPS_PER_STEP_GRID, HEADLINE_OPTIMISM, HEADLINE_SLOTS, LATE_CLIP_MAX,
                               LATE_CORRECTIONS, LR_GRID, REFERENCE, SLOTS_GRID, WIDE_POLICY, WIDE_SETTINGS, Job,
                               arm_config, async_anchors, async_variant_name, async_variants, config_name,
                               evaluation_configs, evaluation_seeds, tuning_configs, tuning_seeds)


def test_arms_differ_only_in_their_spec():
    configs = {arm: arm_config(arm, seed=3, steps=7, optimism=0.1).spec.to_wire() for arm in ARMS}
    reference = json.loads(json.dumps(configs["real"]))
    for arm, spec in configs.items():
        spec = json.loads(json.dumps(spec))
        assert spec.pop("mode") == ARMS[arm]["mode"]
        alg = spec["algorithm"]
        assert (alg.pop("debiasing")["enabled"], alg.pop("denoising")["enabled"]) == \
            (ARMS[arm].get("debiasing", True), ARMS[arm].get("denoising", True))
        assert spec["worldModel"].pop("learnOnline") is bool(ARMS[arm].get("learnOnline", False))
        assert alg["seed"] == 3 and alg["steps"] == 7 and spec["worldModel"]["optimism"] == 0.1
        ref = json.loads(json.dumps(reference))
        ref.pop("mode"), ref["algorithm"].pop("debiasing"), ref["algorithm"].pop("denoising")
        ref["worldModel"].pop("learnOnline")
        assert spec == ref, arm


def test_the_v3_design_is_pre_registered():
    assert BIAS_GRID == (0.0, 0.1, 0.2, 0.3) and HEADLINE_OPTIMISM == 0.2
    assert ABLATION_ORDER == ("none", "denoise", "debias", "wmrl")
    assert LR_GRID == (0.001, 0.002, 0.004) and GROUPS_PER_STEP_GRID == (1, 2, 4) and SLOTS_GRID == (2, 8, 32)
    assert HEADLINE_SLOTS in SLOTS_GRID and REFERENCE == ("real", 4, 0.002)
    assert REFERENCE[1] in GROUPS_PER_STEP_GRID and REFERENCE[2] in LR_GRID
    assert BASE_SPEC["algorithm"]["groupsPerStep"] == REFERENCE[1] and BASE_SPEC["algorithm"]["learningRate"] == REFERENCE[2]
    evaluation = {s for arm in ARMS for s in evaluation_seeds(arm, 10, 20)}
    assert not evaluation & set(tuning_seeds(5))  # tuning never reuses an evaluation seed


def test_the_asynchronous_arms_are_pre_registered():
    assert ASYNC_WAIT_FRACTIONS == (0.0, 0.25) and LATE_CORRECTIONS == ("token", "none") and LATE_CLIP_MAX == 3.0
    assert ASYNC_CONTROLS == (("drop", 0.0),)
    assert [async_variant_name(*v) for v in async_variants()] == ["token-w0", "none-w0", "token-w0.25", "none-w0.25",
                                                                  "drop-w0"]
    anchors = arm_config("wmrl", 0, 5, anchors=async_anchors("token", 0.12)).spec.algorithm.anchors
    assert anchors.wait_seconds == 0.12 and anchors.late_rewards.enabled
    assert anchors.late_rewards.correction == "token" and anchors.late_rewards.clip_max == 3.0
    assert anchors.fraction == BASE_SPEC["algorithm"]["anchors"]["fraction"]  # nothing else changes
    dropped = arm_config("wmrl", 0, 5, anchors=async_anchors("drop", 0.0)).spec.algorithm.anchors
    assert dropped.wait_seconds == 0.0 and not dropped.late_rewards.enabled
    assert arm_config("wmrl", 0, 5).spec.algorithm.anchors.wait_seconds is None  # synchronous arms wait
    job = Job(arm="wmrl", seed=1, groups_per_step=4, learning_rate=0.004, optimism=0.2, steps=8, budgets={"8": 1.0},
              eval_points=4, slots=(8,), judge_cost=1.0, sandbox_urls=[], table_path="t", work_dir="w",
              async_anchors={"late": "none", "wait_fraction": 0.25, "wait_s": 0.1})
    assert job.config == "async-none-w0.25-P8-g4-lr0.004" and job.name() == "async-none-w0.25-P8-g4-lr0.004-s1"
    with pytest.raises(ValueError, match="late handling"):
        async_anchors("ppo", 0.0)


def _async_run(variant: str, seed: int, rewards: list[float], step_cost: float, pool: str = "2") -> dict:
    late, fraction = variant.rsplit("-w", 1)
    run = _run("wmrl", seed, rewards, {pool: step_cost}, f"async-{variant}-P{pool}")
    steps = [{"anchor_groups": 0, "late_anchors": 1, "dropped_anchors": 0, "late_trained": 1 if i else 0,
              "waited": 0.0, "late_weight_mean": None if late == "drop" or not i else 0.9,
              "late_clipped_share": None if late == "drop" or not i else 0.1} for i in range(len(rewards) - 1)]
    run.update(step_costs=steps, **{"async": {"late": late, "wait_fraction": float(fraction), "wait_s": 0.0,
                                              "slots": int(pool)}})
    return run


def test_asynchronous_arms_are_judged_at_the_budget_against_the_best_real_configuration():
    rng = np.random.default_rng(3)
    real = [_run("real", s, _climb(0.4, 0.02, 10, 0.01, rng), {"2": 10.0}, "real-a") for s in range(4)]
    wmrl = [_run("wmrl", s, _climb(0.4, 0.02, 15, 0.01, rng), {"2": 100.0 / 15}, "wmrl-x") for s in range(4)]
    fast = [_async_run("token-w0", s, _climb(0.4, 0.02, 25, 0.005, rng), 4.0) for s in range(4)]
    flat = [{**_async_run("drop-w0", s, [0.4] * 21, 4.0), "stopped_by": "steps"} for s in range(4)]  # capped at 80 s
    target = float(np.mean([at_cost(r, "2", 100.0) for r in real]))
    summary = async_pool_summary(fast + flat, "2", 100.0, target, real, "real-a", wmrl)
    token, drop = summary["variants"]["token-w0"], summary["variants"]["drop-w0"]
    assert token["beats_best_real"] and 2.0 < token["speedup"] < 3.0  # 0.02 a step at 4 s a step vs 10 s
    assert token["speedup"] == pytest.approx(100.0 / token["time_to_target_s"])
    assert token["vs_best_real"]["estimate"] > 0.2 and token["vs_wmrl"]["method"] == "t"
    assert token["checks"] == {"late_share": 1.0, "late_trained_per_step": pytest.approx(24 / 25),
                               "waited_per_step_s": 0.0, "importance_weight_mean": pytest.approx(0.9),
                               "truncated_share": pytest.approx(0.1)}
    assert drop["speedup"] is None and drop["time_to_target_s"] is None and not drop["beats_best_real"]  # censored
    assert token["capped_before_budget"] == 0 and drop["capped_before_budget"] == 4  # 25 steps of 4 s: spent
    assert drop["checks"]["importance_weight_mean"] is None and drop["reach_rate"] == 0.0
    assert [t["name"] for t in summary["tests"]] == ["P2: async token-w0 vs real-a, reward at budget",
                                                     "P2: async drop-w0 vs real-a, reward at budget"]
    goal = async_goal({"2": summary, "8": {"variants": {"token-w0": {**token, "beats_best_real": False}}}})
    assert goal["arms"]["token-w0"] == {"per_pool": {"2": True, "8": False}, "every_pool": False}
    assert goal["arms"]["drop-w0"]["every_pool"] is False and goal["any_arm_every_pool"] is False
    assert async_goal({"2": summary})["arms"]["token-w0"]["every_pool"] is True


def test_the_grids_become_configurations():
    tune = tuning_configs(["real", "wmrl", "none"], [1, 2, 4], [0.001, 0.002], base_groups=4)
    assert len(tune) == 3 * 2 + 2 and ("wmrl", 4, 0.002) in tune and all(a != "none" for a, _, _ in tune)
    evaluate = evaluation_configs(["real", "wmrl", "none", "worldModel"], [1, 4], [0.001, 0.002], 4,
                                  wmrl_lrs=[0.002, 0.002, 0.001], ablation_lr=0.002)
    assert [c for c in evaluate if c[0] == "real"] == [("real", g, lr) for g in (1, 4) for lr in (0.001, 0.002)]
    assert [c for c in evaluate if c[0] == "wmrl"] == [("wmrl", 4, 0.001), ("wmrl", 4, 0.002)]
    assert ("none", 4, 0.002) in evaluate and ("worldModel", 4, 0.002) in evaluate
    config = arm_config("real", 0, 5, groups_per_step=1, learning_rate=0.004)
    assert config.spec.algorithm.groups_per_step == 1 and config.spec.algorithm.learning_rate == 0.004
    assert config_name("real", 1, 0.004) == "real-g1-lr0.004"


def _run(arm: str, seed: int, rewards: list[float], step_cost: dict, config: str = None, cell: str = None) -> dict:
    """A run with an evaluation after every step; ``step_cost``: pool size -> seconds per step."""
    curve = [{"cost_s": {p: c * i for p, c in step_cost.items()}, "reward": r, "executions": 8 * i, "step": i}
             for i, r in enumerate(rewards)]
    return {"arm": arm, "config": config or arm, "seed": seed, "judge_cell": cell, "curve": curve,
            "initial_reward": rewards[0], "final_reward": rewards[-1], "steps": len(rewards) - 1,
            "cost_s": curve[-1]["cost_s"], "executions": curve[-1]["executions"], "learning_rate": 0.002}


def _climb(start: float, per_step: float, steps: int, noise: float, rng) -> list[float]:
    return list(start + per_step * np.arange(steps + 1) + rng.normal(0, noise))


def test_pool_summary_judges_every_configuration_at_the_budget():
    rng = np.random.default_rng(0)
    seeds = range(12)
    runs = {  # real-a climbs faster than real-b; wmrl climbs twice as fast per second as real-a at P=2
        "real-a": [_run("real", s, _climb(0.4, 0.02, 10, 0.01, rng), {"2": 10.0, "8": 5.0}, "real-a") for s in seeds],
        "real-b": [_run("real", s, _climb(0.4, 0.01, 10, 0.01, rng), {"2": 10.0, "8": 5.0}, "real-b") for s in seeds],
        "wmrl-x": [_run("wmrl", s, _climb(0.4, 0.02, 20, 0.005, rng), {"2": 5.0, "8": 5.0}, "wmrl-x") for s in seeds],
    }
    chosen = choose({k: v[:3] for k, v in runs.items()}, "2", 100.0)
    assert chosen["best_real"] == "real-a" and chosen["wmrl"] == "wmrl-x" and chosen["wmrl_learning_rate"] == 0.002
    summary = pool_summary(runs, "2", 100.0, "real-a", "wmrl-x")
    real_finals = [at_cost(r, "2", 100.0) for r in runs["real-a"]]
    assert summary["target_reward"] == pytest.approx(np.mean(real_finals))
    wmrl = summary["configs"]["wmrl-x"]
    assert summary["speedup"] == pytest.approx(100.0 / wmrl["time_to_target_s"]) and 1.7 < summary["speedup"] < 2.3
    assert summary["configs"]["real-b"]["time_to_target_s"] is None  # censored at the budget, not 0
    assert summary["configs"]["real-b"]["reached"] is False
    versus = summary["wmrl_vs_best_real"]
    assert versus["reward_difference_at_budget"]["method"] == "bootstrap"  # 12 seeds
    assert versus["speedup_interval"][0] <= summary["speedup"] <= versus["speedup_interval"][1]
    assert summary["tests"][0]["p"] < 0.01
    # At P=8 the executions are cheap: wmrl's step costs what real's does and it does not win.
    at8 = pool_summary(runs, "8", 50.0, "real-a", "wmrl-x")
    assert at8["speedup"] is None or at8["speedup"] < 1.2
    # Below 10 seeds: a t-interval and the per-seed range, never a bootstrap.
    few = pool_summary({k: v[:4] for k, v in runs.items()}, "2", 100.0, "real-a", "wmrl-x")
    assert few["wmrl_vs_best_real"]["reward_difference_at_budget"]["method"] == "t"
    assert "speedup_interval" not in few["wmrl_vs_best_real"] and few["wmrl_vs_best_real"]["speedup_range"]


def test_a_wmrl_that_never_reaches_the_target_is_censored():
    rng = np.random.default_rng(1)
    runs = {"real-a": [_run("real", s, _climb(0.4, 0.02, 10, 0.01, rng), {"2": 10.0}, "real-a") for s in range(10)],
            "wmrl-x": [_run("wmrl", s, [0.4] * 21, {"2": 5.0}, "wmrl-x") for s in range(10)]}
    summary = pool_summary(runs, "2", 100.0, "real-a", "wmrl-x")
    versus = summary["wmrl_vs_best_real"]
    assert summary["speedup"] is None and versus["not_reached_within_budget"] == 10
    assert versus["speedup_interval"] == [0.0, 0.0] and summary["configs"]["wmrl-x"]["reach_rate"] == 0.0


def test_every_test_of_a_run_is_adjusted_together():
    tests = [{"name": str(i), "p": p} for i, p in enumerate([0.001, 0.01, 0.04, 0.3])]
    adjusted = holm_over_run(tests)
    assert [t["p_holm"] for t in adjusted] == pytest.approx([0.004, 0.03, 0.08, 0.3])


def test_the_judge_grid_tests_each_prediction_where_it_was_made():
    rng = np.random.default_rng(2)
    cells = ["c1", "c2", "c3", "ctl"]
    effect = {"c1": 0.0, "c2": 0.02, "c3": 0.05, "ctl": 0.0}
    runs = []
    for cell in cells:
        for s in range(12):
            base = 0.5 + rng.normal(0, 0.01)
            for arm in ABLATION_ORDER:
                gain = effect[cell] if arm in ("debias", "wmrl") else 0.0
                runs.append(_run(arm, s, [0.4, base + gain + rng.normal(0, 0.002)], {"2": 10.0},
                                 cell=cell))
    predictions = [{"effect": "debias - none", "cells": ["c1", "c2", "c3"], "null_in": ["c1", "ctl"], "positive_in": []}]
    grid = judge_grid_summary(runs, cells, "2", 10.0, predictions)
    assert set(grid["cells"]) == set(cells)
    per_cell = grid["predictions"][0]["per_cell"]
    assert per_cell["c3"]["p_one_sided"] < 0.01 and per_cell["c3"]["effect_predicted"]
    assert per_cell["ctl"]["p_one_sided"] > 0.05 and not per_cell["ctl"]["effect_predicted"]
    assert not per_cell["c1"]["effect_predicted"] and per_cell["c2"]["effect_predicted"]
    assert grid["predictions"][0]["page"]["p"] < 0.01
    assert any(t["test"] == "page" and t.get("predicted") for t in grid["tests"])


@pytest.mark.slow
def test_bench_end_to_end_extra_tiny(tmp_path):
    """Every configuration trains through TRL against the outcome table: the reference sets a budget per pool
    size, the tuning seeds choose, the evaluation seeds measure, a synthetic-judge cell runs the ablation."""
    out, png, md = tmp_path / "speedup.json", tmp_path / "speedup.png", tmp_path / "speedup.md"
    cell = JUDGE_GRID[-1].name
    proc = subprocess.run([sys.executable, "-m", "wmrl.cli", "bench", "speedup", "--quick", "--tuning-seeds", "1",
                           "--seeds", "1", "--ablation-seeds", "2", "--grid-seeds", "2", "--steps", "2",
                           "--eval-points", "2",
                           "--group-size", "2", "--groups-per-step", "2", "--real-groups", "1,2", "--lrs", "0.002,0.004",
                           "--slots", "2,8", "--judge-grid", cell, "--held-out", "iris", "--workers", "1",
                           "--async-arms", "token-w0,drop-w0",
                           "--sandboxes", "2", "--cap", "3", "--json", str(out), "--plot", str(png), "--markdown", str(md)],
                          capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(out.read_text())
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == data  # printed as JSON too
    assert data["version"] == 3 and data["headline_slots"] == 2 and set(data["budgets_s"]) == {"2", "8"}
    assert data["budgets_s"]["8"] < data["budgets_s"]["2"]  # more slots, shorter waits for the same steps
    assert set(data["arms"]) == {"real", "worldModel", *ABLATION_ORDER}
    assert set(data["real_arms"]) == {"real-g1-lr0.002", "real-g1-lr0.004", "real-g2-lr0.002", "real-g2-lr0.004"}
    assert isinstance(data["target_reward"], float) and "speedup" in data and data["async"]["measured"] is True
    for name, arm in data["arms"].items():
        for key in ("time_to_target_s", "executions_to_target", "final_reward", "final_reward_std", "auc", "reach_rate"):
            assert key in arm, (name, key)
    for p, pool in data["slots"].items():
        best = data["tuning"]["chosen"][p]["best_real"]
        assert pool["best_real"] == best and pool["target_reward"] == pytest.approx(pool["configs"][best]["final_reward"])
    tuning = [r for r in data["runs"] if r["seed"] >= 1000]
    assert {r["config"] for r in tuning} == {*data["real_arms"], "wmrl-g2-lr0.002", "wmrl-g2-lr0.004"}
    reference = [r for r in tuning if r["config"] == data["reference"]]
    assert len(reference) == 1 and reference[0]["steps"] == 2 and reference[0]["executions"] == 8
    for run in data["runs"]:
        assert 0.0 <= run["final_reward"] <= 1.0 and set(run["curve"][0]["cost_s"].values()) == {0.0}
        assert abs(sum(run["curve"][0]["mass"].values()) - 1.0) < 1e-6  # the exact evaluation covers every script
        assert len(run["step_costs"]) == run["steps"]  # every step's costs kept for re-scoring
        pools = [str(run["async"]["slots"])] if run.get("async") else ["2", "8"]
        if run["stopped_by"] == "budget":  # spent at every pool size it runs on
            assert all(run["cost_s"][p] >= data["budgets_s"][p] for p in pools)
    # Asynchronous arms: one pool each, wmrl's chosen rate there; the virtual clock replays from the records.
    async_runs = [r for r in data["runs"] if r.get("async")]
    assert sorted({(r["async"]["late"], r["async"]["slots"]) for r in async_runs}) == [
        ("drop", 2), ("drop", 8), ("token", 2), ("token", 8)]
    for run in async_runs:
        p = str(run["async"]["slots"])
        assert run["learning_rate"] == data["tuning"]["chosen"][p]["wmrl_learning_rate"]
        assert run["async"]["wait_s"] == 0.0 and run["async"]["anchors"]["waitSeconds"] == 0.0
        clocks = replay([StepPlan(s["work"], s["after"], s["groups"]) for s in run["step_costs"]], int(p), 0.0)
        assert clocks[-1].end == pytest.approx(run["cost_s"][p])
        assert sum(s["late_anchors"] for s in run["step_costs"]) > 0  # with waitSeconds 0 anchors are late
        trained = sum(s["late_trained"] for s in run["step_costs"])
        assert trained > 0 if run["async"]["late"] == "token" else trained == 0
    for p in ("2", "8"):
        pool = data["async"]["slots"][p]
        assert set(pool["variants"]) == {"token-w0", "drop-w0"} and pool["target_reward"] == data["slots"][p]["target_reward"]
    assert set(data["async"]["goal"]["arms"]) == {"token-w0", "drop-w0"}
    assert any(t["name"].startswith("P2: async token-w0") for t in data["tests"])
    world = [r for r in data["runs"] if r["arm"] == "worldModel"]
    assert world and all(r["executions"] == 0 for r in world)
    grid = [r for r in data["runs"] if r.get("judge_cell") == cell]
    assert len(grid) == 4 * 2 and cell in data["judge_grid"]["cells"]
    assert data["tests"] and all(t["p_holm"] >= t["p"] for t in data["tests"])
    assert png.stat().st_size > 5000 and "Holm" in md.read_text() and "P = 8" in md.read_text()
    assert "#### Asynchronous anchors" in md.read_text()


def test_the_multi_turn_preset_trains_four_turn_arms_at_equal_cost(tmp_path):
    out = tmp_path / "speedup.json"
    proc = subprocess.run([sys.executable, "-m", "wmrl.cli", "bench", "speedup", "--multiturn", "--seeds", "1",
                           "--tuning-seeds", "1", "--real-groups", "2", "--lrs", "0.002", "--slots", "2",
                           "--steps", "2", "--eval-points", "1", "--group-size", "2", "--groups-per-step", "2",
                           "--held-out", "iris", "--workers", "1", "--sandboxes", "2", "--cap", "2",
                           "--json", str(out)], capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["max_turns"] == 4 and set(data["arms"]) == {"real", "worldModel", "wmrl"}
    assert data["async"]["measured"] is False  # anchors.waitSeconds is single-turn only: no asynchronous arm
    assert "sampled trajectories" in data["held_out_evaluation"]
    for run in data["runs"]:
        assert run["job"]["spec_overrides"]["max_turns"] == 4
        point = run["curve"][-1]
        assert point["samples"] == 256 and 1.0 <= point["mean_turns"] <= 4.0
        assert point["first_turn_reward"] <= point["reward"] + 1e-9  # the best turn is at least the first
    real = next(r for r in data["runs"] if r["arm"] == "real")
    assert real["executions"] >= 2 * 2 * 2  # every trajectory executed on each of its turns, 2 steps
    assert proc.returncode == 0 and subprocess.run(
        [sys.executable, "-m", "wmrl.cli", "bench", "speedup", "--multiturn", "--quick", "--json", str(out)],
        capture_output=True, text=True, timeout=120).returncode == 2  # two presets at once: refused
    refused = subprocess.run([sys.executable, "-m", "wmrl.cli", "bench", "speedup", "--multiturn", "--async-arms",
                              "token-w0", "--json", str(out)], capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "single turns" in refused.stderr
    unknown = subprocess.run([sys.executable, "-m", "wmrl.cli", "bench", "speedup", "--quick", "--async-arms",
                              "token-w9", "--json", str(out)], capture_output=True, text=True, timeout=120)
    assert unknown.returncode == 2 and "--async-arms: choose from" in unknown.stderr


def test_the_wide_preset_trains_the_wide_coder_and_samples_its_held_out_scripts(tmp_path):
    """The wide action space end to end: its policy, its sandbox timeout, sampled held-out evaluation
    (256 scripts a task, executed as they are first sampled: no enumeration, no prefill)."""
    out = tmp_path / "speedup.json"
    proc = subprocess.run([sys.executable, "-m", "wmrl.cli", "bench", "speedup", "--wide", "--seeds", "1",
                           "--ablation-seeds", "1", "--arms", "real,wmrl", "--bias", "0.2", "--steps", "2",
                           "--tuning-seeds", "1", "--real-groups", "2", "--lrs", "0.002", "--slots", "2",
                           "--eval-points", "1", "--group-size", "2", "--groups-per-step", "2", "--held-out", "iris",
                           "--workers", "1", "--sandboxes", "2", "--cap", "2", "--async-arms", "none",
                           "--json", str(out)], capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["async"]["measured"] is False and not any(r.get("async") for r in data["runs"])
    assert data["space"] == "wide" and "256 sampled scripts" in data["held_out_evaluation"]
    assert data["optimism"] == 0.2 and set(data["arms"]) == {"real", "wmrl"}
    for run in data["runs"]:
        assert run["job"]["spec_overrides"]["space"] == "wide"
        assert all(point["samples"] == 256 and 0.0 <= point["reward"] <= 1.0 for point in run["curve"])
    real = next(r for r in data["runs"] if r["arm"] == "real")
    assert real["steps"] == 2 and real["executions"] == 8
    config = arm_config("real", 0, 2, space="wide")
    assert config.spec.policy.model == f"builtin:{WIDE_POLICY}"
    assert config.spec.sandbox.timeout_seconds == WIDE_SETTINGS["timeout_seconds"]
    assert config.spec.policy.sampling.max_new_tokens == WIDE_SETTINGS["max_new_tokens"]


def test_a_finished_run_is_reused_only_for_the_same_job(tmp_path):
    from wmrl_bench.arm_run import _finished, _identity

    job = Job(arm="wmrl", seed=2, groups_per_step=4, learning_rate=0.002, optimism=0.2, steps=12,
              budgets={"2": 40.0, "8": 20.0}, eval_points=4, slots=(2, 8), judge_cost=1.0,
              sandbox_urls=["http://127.0.0.1:1"], table_path="/x.jsonl", work_dir=str(tmp_path))
    run_dir = tmp_path / job.name()
    assert _finished(run_dir, job) is None
    run_dir.mkdir()
    (run_dir / "result.json").write_text(json.dumps({"final_reward": 0.5, "job": _identity(job)}))
    moved = Job(**{**job.__dict__, "sandbox_urls": ["http://127.0.0.1:2"], "table_path": "/y.jsonl"})
    assert _finished(run_dir, moved)["final_reward"] == 0.5  # other services, same run
    for change in ({"budgets": {"2": 41.0, "8": 20.0}}, {"learning_rate": 0.004}, {"judge_cell": "g3-s0.05"},
                   {"async_anchors": {"late": "token", "wait_fraction": 0.0, "wait_s": 0.0}}):
        assert _finished(run_dir, Job(**{**job.__dict__, **change})) is None, change
    (run_dir / "result.json").write_text('{"final_reward": 0.5, "jo')  # cut off: not finished
    assert _finished(run_dir, job) is None


@pytest.mark.slow
def test_live_mode_reports_modelled_against_measured_cost(tmp_path):
    out = tmp_path / "live.json"
    proc = subprocess.run([sys.executable, "-m", "wmrl.cli", "bench", "speedup", "--live", "--steps", "2",
                           "--eval-points", "1", "--group-size", "2", "--groups-per-step", "2", "--held-out", "iris",
                           "--sandboxes", "2", "--cap", "2", "--slots", "2", "--json", str(out)],
                          capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["live"] is True and set(data["arms"]) == {"real", "wmrl"}
    real, wmrl = data["arms"]["real"], data["arms"]["wmrl"]
    assert real["executions"] == 8 and real["steps"] == 2  # every rollout executed for real, twice 2 x 2
    for arm in (real, wmrl):
        assert arm["measured_s"] > 0 and arm["modelled_cost_s"]["2"] > 0
        assert arm["modelled_over_measured"]["2"] == pytest.approx(arm["modelled_cost_s"]["2"] / arm["measured_s"])
    assert all(r["table"]["hits"] == 0 for r in data["runs"])  # live: nothing served from the table
