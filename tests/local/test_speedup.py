"""`wmrl bench speedup` (v2): arms differ only in their spec, the figures from runs, and the command end to end."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest

from wmrl_bench.analysis import level_summary
from wmrl_bench.design import (ABLATION_ORDER, ARMS, BIAS_GRID, HEADLINE_OPTIMISM, WIDE_POLICY, WIDE_SETTINGS, Job,
                               arm_config)


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


def test_the_bias_grid_is_pre_registered():
    assert BIAS_GRID == (0.0, 0.1, 0.2, 0.3) and HEADLINE_OPTIMISM in BIAS_GRID
    assert ABLATION_ORDER == ("none", "denoise", "debias", "wmrl")


def _run(arm: str, seed: int, rewards: list[float], step_cost: float) -> dict:
    curve = [{"cost_s": step_cost * i, "reward": r, "executions": 8 * i} for i, r in enumerate(rewards)]
    return {"arm": arm, "seed": seed, "curve": curve, "initial_reward": rewards[0], "final_reward": rewards[-1],
            "steps": len(rewards) - 1, "cost_s": curve[-1]["cost_s"], "compute_s": 1.0, "judge_s": 0.5,
            "executions_s": 2.0, "executions": curve[-1]["executions"]}


def test_level_summary_from_synthetic_runs():
    rng = np.random.default_rng(0)
    seeds = range(8)
    real = [_run("real", s, list(np.linspace(0.4, 0.6, 11) + rng.normal(0, 0.01)), 10.0) for s in seeds]
    # wmrl climbs twice as fast per unit of cost; the ablation arms are ordered as the paper says.
    runs = {"real": real}
    for shift, arm in enumerate(ABLATION_ORDER):
        runs[arm] = [_run(arm, s, list(0.4 + 0.04 * np.arange(11) - 0.02 * (3 - shift)
                                       + rng.normal(0, 0.005)), 10.0) for s in seeds]
    summary = level_summary(runs, budget=100.0)
    assert summary["target_reward"] == pytest.approx(np.mean([r["final_reward"] for r in real]))
    wmrl, real_arm = summary["arms"]["wmrl"], summary["arms"]["real"]
    assert real_arm["time_to_target_s"] == pytest.approx(100.0, abs=5) and real_arm["reach_rate"] > 0
    assert wmrl["time_to_target_s"] < 60 and summary["speedup"] > 1.8 and wmrl["reach_rate"] == 1.0
    versus = summary["wmrl_vs_real"]
    assert versus["final_reward_difference"]["low"] > 0.1
    assert math.log(1.5) < versus["log_speedup"]["low"] <= versus["log_speedup"]["high"]
    page = summary["ablation"]["page"]
    assert page["p"] < 0.01 and page["order"] == list(ABLATION_ORDER)
    assert {(p["a"], p["b"]) for p in summary["ablation"]["pairwise"]} >= {("wmrl", "none"), ("debias", "denoise")}
    assert all(p["p_holm"] >= p["p"] for p in summary["ablation"]["pairwise"])
    # A wmrl that never reaches the target: no speedup, the interval says so.
    runs["wmrl"] = [_run("wmrl", s, [0.4] * 11, 10.0) for s in seeds]
    stuck = level_summary(runs, budget=100.0)
    assert stuck["speedup"] is None and stuck["arms"]["wmrl"]["reach_rate"] == 0.0
    assert stuck["wmrl_vs_real"]["log_speedup"]["high"] == -math.inf
    assert stuck["wmrl_vs_real"]["speedup_ci"] == [0.0, 0.0]


@pytest.mark.slow
def test_bench_end_to_end_extra_tiny(tmp_path):
    """Every arm trains through TRL against the outcome table; the JSON has the v2 schema and the old keys."""
    out, png, md = tmp_path / "speedup.json", tmp_path / "speedup.png", tmp_path / "speedup.md"
    proc = subprocess.run([sys.executable, "-m", "wmrl.cli", "bench", "speedup", "--quick", "--seeds", "1",
                           "--ablation-seeds", "2", "--steps", "2", "--eval-points", "2", "--group-size", "2",
                           "--groups-per-step", "2", "--held-out", "iris", "--workers", "1", "--sandboxes", "2",
                           "--cap", "3", "--json", str(out), "--plot", str(png), "--markdown", str(md)],
                          capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(out.read_text())
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == data  # printed as JSON too
    assert data["version"] == 2 and data["levels_run"] == [HEADLINE_OPTIMISM] and data["budget_s"] > 0
    assert set(data["arms"]) == {"real", "worldModel", *ABLATION_ORDER}
    assert isinstance(data["target_reward"], float) and "speedup" in data
    for name, arm in data["arms"].items():
        for key in ("time_to_target_s", "executions_to_target", "final_reward", "final_reward_std", "auc", "reach_rate"):
            assert key in arm, (name, key)
    real = [r for r in data["runs"] if r["arm"] == "real"]
    assert len(real) == 2 and all(r["steps"] == 2 and r["executions"] == 8 for r in real)  # all 2 x 2 rollouts, twice
    for run in data["runs"]:
        assert 0.0 <= run["final_reward"] <= 1.0 and run["curve"][0]["cost_s"] == 0.0
        assert abs(sum(run["curve"][0]["mass"].values()) - 1.0) < 1e-6  # the exact evaluation covers every script
        if run["arm"] in ABLATION_ORDER:  # stepped until the budget (or the cap of 3 x 2 steps)
            assert run["stopped_by"] == "budget" or run["steps"] == 6
            assert run["stopped_by"] != "budget" or run["cost_s"] >= data["budget_s"]
    world = [r for r in data["runs"] if r["arm"] == "worldModel"]
    assert world and all(r["executions"] == 0 and r["steps"] == 6 for r in world)
    assert "ablation" in data["levels"][f"{HEADLINE_OPTIMISM:g}"]
    assert png.stat().st_size > 5000 and "Page's L test" in md.read_text()


def test_the_multi_turn_preset_trains_four_turn_arms_at_equal_cost(tmp_path):
    out = tmp_path / "speedup.json"
    proc = subprocess.run([sys.executable, "-m", "wmrl.cli", "bench", "speedup", "--multiturn", "--seeds", "1",
                           "--steps", "2", "--eval-points", "1", "--group-size", "2", "--groups-per-step", "2",
                           "--held-out", "iris", "--workers", "1", "--sandboxes", "2", "--cap", "2",
                           "--json", str(out)], capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["max_turns"] == 4 and set(data["arms"]) == {"real", "worldModel", "wmrl"}
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


def test_the_wide_preset_trains_the_wide_coder_and_samples_its_held_out_scripts(tmp_path):
    """The wide action space end to end: its policy, its sandbox timeout, sampled held-out evaluation
    (256 scripts a task, executed as they are first sampled: no enumeration, no prefill)."""
    out = tmp_path / "speedup.json"
    proc = subprocess.run([sys.executable, "-m", "wmrl.cli", "bench", "speedup", "--wide", "--seeds", "1",
                           "--ablation-seeds", "1", "--arms", "real,wmrl", "--bias", "0.2", "--steps", "2",
                           "--eval-points", "1", "--group-size", "2", "--groups-per-step", "2", "--held-out", "iris",
                           "--workers", "1", "--sandboxes", "2", "--cap", "2", "--json", str(out)],
                          capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["space"] == "wide" and "256 sampled scripts" in data["held_out_evaluation"]
    assert data["levels_run"] == [0.2] and set(data["arms"]) == {"real", "wmrl"}
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

    job = Job(arm="wmrl", seed=2, optimism=0.2, steps=12, budget_s=40.0, eval_points=4, slots=2, judge_cost=1.0,
              sandbox_urls=["http://127.0.0.1:1"], table_path="/x.jsonl", work_dir=str(tmp_path))
    run_dir = tmp_path / job.name()
    assert _finished(run_dir, job) is None
    run_dir.mkdir()
    (run_dir / "result.json").write_text(json.dumps({"final_reward": 0.5, "job": _identity(job)}))
    moved = Job(**{**job.__dict__, "sandbox_urls": ["http://127.0.0.1:2"], "table_path": "/y.jsonl"})
    assert _finished(run_dir, moved)["final_reward"] == 0.5  # other services, same run
    other = Job(**{**job.__dict__, "budget_s": 41.0})
    assert _finished(run_dir, other) is None
    (run_dir / "result.json").write_text('{"final_reward": 0.5, "jo')  # cut off: not finished
    assert _finished(run_dir, job) is None


@pytest.mark.slow
def test_live_mode_reports_modelled_against_measured_cost(tmp_path):
    out = tmp_path / "live.json"
    proc = subprocess.run([sys.executable, "-m", "wmrl.cli", "bench", "speedup", "--live", "--steps", "2",
                           "--eval-points", "1", "--group-size", "2", "--groups-per-step", "2", "--held-out", "iris",
                           "--sandboxes", "2", "--cap", "2", "--json", str(out)],
                          capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["live"] is True and set(data["arms"]) == {"real", "wmrl"}
    real, wmrl = data["arms"]["real"], data["arms"]["wmrl"]
    assert real["executions"] == 8 and real["steps"] == 2  # every rollout executed for real, twice 2 x 2
    for arm in (real, wmrl):
        assert arm["measured_s"] > 0 and arm["modelled_cost_s"] > 0
        assert arm["modelled_over_measured"] == pytest.approx(arm["modelled_cost_s"] / arm["measured_s"])
    assert all(r["table"]["hits"] == 0 for r in data["runs"])  # live: nothing served from the table
