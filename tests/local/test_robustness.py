"""`wmrl bench quickstart`: the verdict on each cell, the report, and a reduced matrix end to end (slow)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from wmrl_trainer.local import run_warnings
from wmrl_bench.robustness import CRITERIA, judge, markdown_table, summarize


def _results(rewards, distinct=None, finished=True, every=4):
    curve = [{"step": i * every, "reward": r, "distinct_scripts_by_task": {"iris": 5, "wine": 3}}
             for i, r in enumerate(rewards)]
    if distinct is not None:
        curve[-1]["distinct_scripts_by_task"] = distinct
    return {"finished": finished, "held_out": {"curve": curve}}


def test_a_cell_that_learns_passes():
    verdict = judge(_results([0.40, 0.45, 0.52, 0.55]))
    assert verdict["passed"] and verdict["reasons"] == []
    assert verdict["gain"] == pytest.approx(0.15) and verdict["min_after"] == 0.45 and verdict["distinct_at_end"] == 3


def test_each_criterion_fails_a_cell_on_its_own():
    small_gain = judge(_results([0.40, 0.45, 0.48]))
    assert not small_gain["passed"] and small_gain["reasons"] == ["gain +0.080 < +0.10"]
    dip = judge(_results([0.40, 0.34, 0.60]))  # step 4 below the start - 0.05, then recovers
    assert not dip["passed"] and dip["reasons"][0].startswith("fell to 0.340")
    collapsed = judge(_results([0.40, 0.50, 0.60], distinct={"iris": 1, "wine": 4}))
    assert not collapsed["passed"] and collapsed["reasons"] == ["collapsed to one script on ['iris']"]
    unfinished = judge(_results([0.40, 0.60], finished=False))
    assert not unfinished["passed"] and unfinished["reasons"] == ["the run did not finish"]


def test_the_issues_collapse_fails_every_criterion_it_can():
    """The curve a new user saw (seed 0, 2 threads) with one script left per task at the end."""
    verdict = judge(_results([0.425, 0.520, 0.563, 0.574, 0.180, 0.186], distinct={"iris": 1, "wine": 1}))
    assert not verdict["passed"] and len(verdict["reasons"]) == 3


def test_a_dip_before_the_dip_step_is_allowed():
    criteria = dict(CRITERIA, dip_from_step=4)
    assert judge(_results([0.40, 0.30, 0.55], every=2), criteria)["passed"]  # step 2 dips, step 4 does not


def test_summary_and_table_report_every_cell():
    cells = [dict(seed=s, threads=t, curve=[{"step": 0, "reward": 0.4}, {"step": 20, "reward": 0.4 + g}],
                  **judge(_results([0.4, 0.4 + g])))
             for s, t, g in ((0, 1, 0.2), (0, 2, 0.15), (1, 1, 0.05))]
    summary = summarize(cells)
    assert summary["cells"] == 3 and summary["passed"] == 2 and not summary["all_passed"]
    assert summary["gain"]["mean"] == pytest.approx(0.4 / 3) and summary["gain"]["min"] == pytest.approx(0.05)
    table = markdown_table({"cells": cells, "summary": summary, "criteria": CRITERIA})
    assert table.count("\n| ") == 4  # header + 3 cells
    assert "FAILS: gain +0.050 < +0.10" in table and "2 of 3 cells meet every criterion" in table


def test_run_warnings_say_when_generation_degenerated_and_when_the_reward_fell():
    records = [{"step": 0, "health_warning": None}, {"step": 1, "health_warning": "stopped exploring"},
               {"step": 2, "health_warning": "stopped exploring"}, {"step": 3, "health_warning": None}]
    evals = [{"reward": 0.42}, {"reward": 0.57}, {"reward": 0.18}]
    warnings = run_warnings(records, evals)
    assert warnings == ["step 2: generation was degenerating: stopped exploring",
                        "held-out reward fell from 0.420 at the start to 0.180 at the end"]
    assert run_warnings(records[:1], [{"reward": 0.4}, {"reward": 0.5}]) == []


def test_bad_usage_exits_2_naming_the_option(tmp_path):
    cli = [sys.executable, "-m", "wmrl.cli", "bench", "quickstart", "--json", str(tmp_path / "r.json")]
    missing = subprocess.run([*cli, "--manifest", str(tmp_path / "nope.yaml")], capture_output=True, text=True)
    assert missing.returncode == 2 and "--manifest" in missing.stderr
    threads = subprocess.run([*cli, "--threads", "0"], capture_output=True, text=True)
    assert threads.returncode == 2 and "--threads" in threads.stderr
    seeds = subprocess.run([*cli, "--seeds", "a,b"], capture_output=True, text=True)
    assert seeds.returncode == 2 and "--seeds" in seeds.stderr


def test_an_evaluation_that_missed_samples_fails_the_cell():
    results = _results([0.40, 0.50, 0.60])
    for point in results["held_out"]["curve"]:
        point.update(samples=64, graded=64)
    assert judge(results)["passed"]
    results["held_out"]["curve"][0]["graded"] = 37  # a mean over whichever executions finished first
    verdict = judge(results)
    assert not verdict["passed"] and verdict["reasons"] == ["evaluations at steps [0] did not grade every sample"]


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_the_quickstart_learns_on_both_thread_counts(tmp_path, wmrl_env):
    """A reduced matrix (docs/local.md has the full one): the real quickstart, seed 0 (the seed a new user saw
    collapse), torch threads 1 and 2, each cell judged by every criterion."""
    report_path = tmp_path / "matrix.json"
    proc = subprocess.run([sys.executable, "-m", "wmrl.cli", "bench", "quickstart", "--seeds", "0", "--threads", "1,2",
                           "--parallel", "2", "--work-dir", str(tmp_path / "cells"), "--json", str(report_path),
                           "--no-progress"], capture_output=True, text=True, env=wmrl_env, timeout=2300)
    report = json.loads(report_path.read_text())
    failures = {(c["seed"], c["threads"]): c["reasons"] for c in report["cells"] if not c["passed"]}
    assert proc.returncode == 0 and not failures, (failures, proc.stderr[-3000:])
    assert [(c["seed"], c["threads"]) for c in report["cells"]] == [(0, 1), (0, 2)]
    for cell in report["cells"]:
        assert cell["gain"] >= CRITERIA["min_gain"] and cell["distinct_at_end"] >= 2
        assert all(p["graded"] == p["samples"] for p in cell["curve"])
        assert cell["warnings"] == []
