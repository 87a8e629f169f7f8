"""Speedup aggregation (pure) and `wmrl report`: PNG + Markdown table from a results JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from wmrl_bench.report import load_results, markdown_table

from wmrl_bench.analysis import REACH_TOLERANCE, crossing, pool_summary

V2_RESULTS = Path(__file__).parent / "data" / "speedup-v2.json"
"""A version-2 results file (one bias level, every arm at equal cost) as that version wrote it."""


def _bench() -> dict:
    return json.loads(V2_RESULTS.read_text())


def _v3_run(config: str, seed: int, rewards: list[float], cost: dict) -> dict:
    curve = [{"cost_s": {p: c * i for p, c in cost.items()}, "reward": r, "executions": 8 * i, "step": i}
             for i, r in enumerate(rewards)]
    return {"arm": config.split("-")[0], "config": config, "seed": seed, "curve": curve, "initial_reward": rewards[0],
            "final_reward": rewards[-1], "steps": len(rewards) - 1, "learning_rate": 0.002}


def _bench_v3() -> dict:
    """A v3 results JSON from synthetic runs: two pool sizes, two real configurations, wmrl."""
    runs = {"real-g4-lr0.002": [_v3_run("real-g4-lr0.002", s, [0.3, 0.4, 0.5 + 0.02 * s], {"2": 50.0, "8": 20.0})
                                for s in range(3)],
            "real-g1-lr0.002": [_v3_run("real-g1-lr0.002", s, [0.3, 0.35, 0.4], {"2": 50.0, "8": 20.0}) for s in range(3)],
            "wmrl-g4-lr0.002": [_v3_run("wmrl-g4-lr0.002", s, [0.3, 0.5, 0.6, 0.6], {"2": 25.0, "8": 20.0})
                                for s in range(3)]}
    budgets = {"2": 100.0, "8": 40.0}
    slots = {p: pool_summary(runs, p, b, "real-g4-lr0.002", "wmrl-g4-lr0.002") for p, b in budgets.items()}
    for pool in slots.values():
        pool["arms"] = {"real": pool["configs"]["real-g4-lr0.002"], "wmrl": pool["configs"]["wmrl-g4-lr0.002"]}
    chosen = {p: {"best_real": "real-g4-lr0.002", "wmrl": "wmrl-g4-lr0.002"} for p in budgets}
    tests = [{**t, "p_holm": min(1.0, t["p"] * 2)} for p in budgets for t in slots[p]["tests"]]
    return {"version": 3, "budget_s": 100.0, "budgets_s": budgets, "reference": "real-g4-lr0.002", "real_steps": 2,
            "headline_slots": 2, "optimism": 0.2, "judge_cost": 1.0, "lr_grid": [0.002], "real_groups": [1, 4],
            "tuning": {"seeds": [1000], "chosen": chosen}, "slots": slots, "target_reward": slots["2"]["target_reward"],
            "speedup": slots["2"]["speedup"], "arms": slots["2"]["arms"], "async": {"measured": False, "why": "x"},
            "judge_grid": {"cells": {}}, "tests": tests}


def test_report_renders_a_version_3_results_file(tmp_path):
    results = tmp_path / "v3.json"
    data = _bench_v3()
    results.write_text(json.dumps(data))
    png, md = tmp_path / "plot.png", tmp_path / "table.md"
    proc = subprocess.run([sys.executable, "-m", "wmrl.cli", "report", str(results), "--plot", str(png),
                           "--markdown", str(md)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert png.stat().st_size > 5000
    table = md.read_text()
    assert "#### P = 2 sandbox slots (headline)" in table and "#### P = 8 sandbox slots" in table
    assert "| `real-g4-lr0.002` (best real) | 2.0 | 0.520 +- 0.020 | 100.0 |" in table
    assert f"**{data['speedup']:.2f}x**" in table and "(t, n = 3)" in table
    assert "Asynchronous anchors: not measured: x." in table and "Holm over all of them" in table


def _async_section(data: dict) -> dict:
    """The ``async`` of a v3 JSON from synthetic asynchronous runs at P = 2 and 8 (token-w0 climbs fast, drop-w0 not)."""
    from wmrl_bench.async_analysis import async_goal, async_pool_summary

    def run(variant: str, seed: int, rewards: list[float], pool: str) -> dict:
        late, fraction = variant.rsplit("-w", 1)
        out = _v3_run(f"async-{variant}-P{pool}", seed, rewards, {pool: 20.0})
        out["async"] = {"late": late, "wait_fraction": float(fraction), "wait_s": 0.05, "slots": int(pool)}
        out["step_costs"] = [{"anchor_groups": 0, "late_anchors": 1, "dropped_anchors": 0, "late_trained": 1,
                              "waited": 0.0, "late_weight_mean": 1.2 if late == "token" else None,
                              "late_clipped_share": 0.05 if late == "token" else None} for _ in rewards[1:]]
        return out

    slots = {}
    for p, pool in data["slots"].items():
        runs = [run("token-w0", s, [0.3, 0.6, 0.7, 0.7, 0.7], p) for s in range(3)]
        runs += [run("drop-w0", s, [0.3, 0.3 + 0.01 * s, 0.32], p) for s in range(3)]
        real = [_v3_run("real-g4-lr0.002", s, [0.3, 0.4, 0.5 + 0.02 * s], {"2": 50.0, "8": 20.0}) for s in range(3)]
        slots[p] = async_pool_summary(runs, p, data["budgets_s"][p], pool["target_reward"], real, pool["best_real"])
        slots[p]["wmrl"] = {"config": pool["wmrl"], "speedup": pool["speedup"],
                            "final_reward": pool["configs"][pool["wmrl"]]["final_reward"]}
    return {"measured": True, "arms": ["token-w0", "drop-w0"], "wait_fractions": [0.0, 0.25],
            "corrections": ["token", "none"], "controls": ["drop-w0"], "clip_max": 3.0, "sync_step_s": {},
            "slots": slots, "goal": async_goal(slots)}


def test_report_renders_the_asynchronous_arms_and_the_json_round_trips(tmp_path):
    data = _bench_v3()
    data["async"] = _async_section(data)
    results = tmp_path / "v3-async.json"
    results.write_text(json.dumps(data))
    assert load_results(results) == json.loads(json.dumps(data))  # what the benchmark writes is what report reads
    png, md = tmp_path / "plot.png", tmp_path / "table.md"
    proc = subprocess.run([sys.executable, "-m", "wmrl.cli", "report", str(results), "--plot", str(png),
                           "--markdown", str(md)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    table = md.read_text()
    assert "#### Asynchronous anchors (waitSeconds at [0.0, 0.25] of a synchronous wmrl step" in table
    token = data["async"]["slots"]["2"]["variants"]["token-w0"]
    assert (f"| 2 | `token-w0` (late rewards, token IS) | 0.050 | {token['steps_at_budget']:.1f} | 100% | 1.00 | 1.20 (5%) | "
            f"{token['final_reward']:.3f} +- 0.000 |") in table
    assert f"{token['speedup']:.2f}x |" in table
    assert "| 8 | `drop-w0` (late rewards dropped) |" in table and "not reached within the budget |" in table
    assert "- `token-w0` beats the best real configuration at the budget at every P: **yes** (P = 2: yes, P = 8: yes)" in table
    assert "- `drop-w0` beats the best real configuration at the budget at every P: **no**" in table
    assert png.stat().st_size > 5000


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
