"""Speedup aggregation (pure) and `wmrl report`: PNG + Markdown table from a results JSON."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
from hypothesis import given, strategies as st

from wmrl_bench.report import load_results, markdown_table

from wmrl_bench.design import ABLATION_ORDER
from wmrl_bench.analysis import REACH_TOLERANCE, crossing, level_summary

def _run(arm: str, seed: int, rewards: list[float], cost_per_eval: float, executions_per_eval: int) -> dict:
    curve = [{"cost_s": cost_per_eval * i, "reward": r, "executions": executions_per_eval * i, "step": 5 * i}
             for i, r in enumerate(rewards)]
    return {"arm": arm, "seed": seed, "curve": curve, "initial_reward": rewards[0], "final_reward": rewards[-1],
            "steps": 5 * (len(rewards) - 1), "cost_s": curve[-1]["cost_s"], "compute_s": 1.0, "judge_s": 0.0,
            "executions_s": 1.0, "executions": curve[-1]["executions"]}


def _bench() -> dict:
    """A v2 results JSON (one bias level) from synthetic runs."""
    runs = {"real": [_run("real", s, [0.3, 0.4, 0.5 + 0.02 * s], 50.0, 160) for s in range(2)],
            "worldModel": [_run("worldModel", s, [0.3, 0.35, 0.35], 5.0, 0) for s in range(2)]}
    for k, arm in enumerate(ABLATION_ORDER):
        runs[arm] = [_run(arm, s, [0.3, 0.5, 0.55 + 0.01 * k + 0.001 * s], 50.0, 40) for s in range(3)]
    level = level_summary(runs, budget=100.0)
    return {"version": 2, "budget_s": 100.0, "real_steps": 10, "slots": 2, "judge_cost": 1.0,
            "headline_optimism": 0.2, "levels": {"0.2": level}, **{k: level[k] for k in ("target_reward", "speedup", "arms")}}


def test_level_summary_targets_the_real_arms_final_reward():
    out = _bench()
    assert out["target_reward"] == pytest.approx(0.51)
    real, wmrl, wm = out["arms"]["real"], out["arms"]["wmrl"], out["arms"]["worldModel"]
    assert real["time_to_target_s"] == pytest.approx(100.0, abs=1e-6)  # reached at its last evaluation
    # wmrl: 0.3 -> 0.5 at 50 s, 0.58 at 100 s; 0.51 is 1/8 of the way from 50 s to 100 s.
    assert wmrl["time_to_target_s"] == pytest.approx(50.0 + 50.0 * 0.01 / 0.0804, rel=0.02)
    assert out["speedup"] == pytest.approx(100.0 / wmrl["time_to_target_s"])
    assert wm["time_to_target_s"] is None and wm["executions_to_target"] is None and wm["reach_rate"] == 0.0
    assert real["final_reward"] == pytest.approx(0.51) and real["final_reward_std"] == pytest.approx(0.02 / math.sqrt(2))


@given(st.lists(st.floats(0, 1), min_size=1, max_size=20), st.floats(0, 1))
def test_crossing_is_the_first_point_at_or_above_target(ys, target):
    xs = list(range(len(ys)))
    x = crossing(xs, ys, target)
    reached = target - REACH_TOLERANCE
    first = next((i for i, y in enumerate(ys) if y >= reached), None)
    if first is None:
        assert x is None
    else:
        assert first - 1 <= x <= first
        assert all(y < reached for y in ys[:first])


def test_report_renders_png_and_markdown(tmp_path):
    results = tmp_path / "speedup.json"
    results.write_text(json.dumps(_bench()))
    png, md = tmp_path / "plot.png", tmp_path / "table.md"
    proc = subprocess.run([sys.executable, "-m", "wmrl.cli", "report", str(results), "--plot", str(png),
                           "--markdown", str(md)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    table = md.read_text()
    assert table in proc.stdout + "\n"
    assert "| GRPO, real execution (`real`) | 10 | 100.0 | 320 | 50% | 0.510 +- 0.014 |" in table
    assert "| pure world model (`worldModel`) | 10 | not reached | not reached | 0% |" in table
    assert "Page's L test of none < denoise < debias < wmrl" in table and "| wmrl - none |" in table
    assert "Judge optimism 0.2" in table and "paired bootstrap 95%" in table


def test_report_still_renders_a_version_1_results_file(tmp_path):
    """Version 1 (every arm the same steps, wall-clock curves) files stay readable."""
    curve = {"step": [0, 8], "wall_clock_s": [0.0, 131.0], "executions": [0, 128], "reward": [0.35, 0.497],
             "reward_std": [0.0, 0.093]}
    arm = {"final_reward": 0.497, "final_reward_std": 0.093, "time_to_target_s": 131.0, "executions_to_target": 128,
           "curve": curve}
    path, png = tmp_path / "v1.json", tmp_path / "v1.png"
    path.write_text(json.dumps({"target_reward": 0.497, "speedup": None, "arms": {"real": arm}}))
    proc = subprocess.run([sys.executable, "-m", "wmrl.cli", "report", str(path), "--plot", str(png)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "| GRPO, real execution (`real`) | 131.0 | 128 | 0.497 +- 0.093 | 1.00x |" in proc.stdout
    assert png.stat().st_size > 5000


def test_report_accepts_a_single_run_and_rejects_other_json(tmp_path):
    run = _single_run("wmrl", [0.3, 0.5])
    assert list(load_results_from(tmp_path, run)["arms"]) == ["wmrl"]
    assert "0.500 +- 0.000" in markdown_table(load_results_from(tmp_path, run))
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    with pytest.raises(ValueError, match="neither"):
        load_results(bad)


def load_results_from(tmp_path, data):
    path = tmp_path / "one.json"
    path.write_text(json.dumps(data))
    return load_results(path)


def _single_run(mode: str, rewards: list[float]) -> dict:
    curve = [{"step": 5 * i, "reward": r, "wall_clock_s": 10.0 * i, "executions": 40 * i} for i, r in enumerate(rewards)]
    return {"mode": mode, "seed": 0, "held_out": {"curve": curve, "initial_reward": rewards[0],
                                                  "final_reward": rewards[-1]}}
