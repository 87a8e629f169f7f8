"""Speedup aggregation (pure) and `wmrl report`: PNG + Markdown table from a results JSON."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
from hypothesis import given, strategies as st

from wmrl_bench.report import load_results, markdown_table
from wmrl_bench.speedup import crossing, summarize


def _run(mode: str, seed: int, rewards: list[float], seconds_per_step: float, executions_per_step: int) -> dict:
    curve = [{"step": 5 * i, "reward": r, "wall_clock_s": 5 * i * seconds_per_step,
              "executions": 5 * i * executions_per_step} for i, r in enumerate(rewards)]
    return {"mode": mode, "seed": seed, "wall_clock_s": curve[-1]["wall_clock_s"],
            "executions": curve[-1]["executions"],
            "held_out": {"curve": curve, "initial_reward": rewards[0], "final_reward": rewards[-1]}}


def _bench() -> dict:
    runs = {
        "real": [_run("real", s, [0.3, 0.4, 0.5 + 0.02 * s], 10.0, 32) for s in range(2)],
        "wmrl": [_run("wmrl", s, [0.3, 0.5, 0.55], 3.0, 8) for s in range(2)],
        "worldModel": [_run("worldModel", s, [0.3, 0.35, 0.35], 1.0, 0) for s in range(2)],
    }
    return summarize(runs)


def test_summarize_targets_the_real_arms_final_reward():
    out = _bench()
    assert out["target_reward"] == pytest.approx(0.51)
    real, wmrl, wm = out["arms"]["real"], out["arms"]["wmrl"], out["arms"]["worldModel"]
    assert real["time_to_target_s"] == pytest.approx(100.0)  # reached at its last evaluation
    # wmrl: 0.3 -> 0.5 at 15 s, 0.55 at 30 s; 0.51 is 1/5 of the way from 15 s to 30 s.
    assert wmrl["time_to_target_s"] == pytest.approx(18.0)
    assert wmrl["executions_to_target"] == pytest.approx(48.0)
    assert out["speedup"] == pytest.approx(100.0 / 18.0)
    assert wm["time_to_target_s"] is None and wm["executions_to_target"] is None
    assert real["final_reward"] == pytest.approx(0.51) and real["final_reward_std"] == pytest.approx(0.02 / math.sqrt(2))
    assert wmrl["final_reward_std"] == 0.0


@given(st.lists(st.floats(0, 1), min_size=1, max_size=20), st.floats(0, 1))
def test_crossing_is_the_first_point_at_or_above_target(ys, target):
    xs = list(range(len(ys)))
    x = crossing(xs, ys, target)
    first = next((i for i, y in enumerate(ys) if y >= target), None)
    if first is None:
        assert x is None
    else:
        assert first - 1 <= x <= first
        assert all(y < target for y in ys[:first])


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
    assert "| GRPO, real execution (`real`) | 100.0 | 320 | 0.510 +- 0.014 | 1.00x |" in table
    assert "| pure world model (`worldModel`) | not reached | not reached |" in table
    assert "5.56x" in table


def test_report_accepts_a_single_run_and_rejects_other_json(tmp_path):
    run = _run("wmrl", 0, [0.3, 0.5], 2.0, 8)
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
