"""``wmrl eval`` against its trusted peer, the local runner's own held-out evaluation: the quickstart
cut to two steps, then ``wmrl eval`` on its final checkpoint and on its base policy, same seed and
samples, each as a real subprocess with its own sandbox servers; then ``wmrl report --eval-dir``
on the run's reports."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "examples" / "quickstart.yaml"
FIGURES = ("mean_reward", "valid_rate", "mean_best_position", "percentile", "best_position", "graded")


def _wmrl(*args: str, env: dict, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "wmrl.cli", *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=900)


def _same_figures(ours: dict, theirs: dict) -> None:
    assert ours["complete"] and theirs["complete"]
    assert ours["reward"] == theirs["reward"]
    assert ours["overall"] == theirs["overall"] and ours["by_category"] == theirs["by_category"]
    assert list(ours["tasks"]) == list(theirs["tasks"])
    for name, task in ours["tasks"].items():
        assert {k: task[k] for k in FIGURES} == {k: theirs["tasks"][name][k] for k in FIGURES}, name


def test_wmrl_eval_reproduces_the_runs_held_out_figures_for_the_same_checkpoint_and_seed(tmp_path, wmrl_env):
    results = tmp_path / "run"
    run = _wmrl("run", str(QUICKSTART), "--steps", "2", "--seed", "1", "--eval-samples", "8", "--sandboxes", "2",
                "--results", str(results), "--no-progress", env=wmrl_env, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    held = json.loads((results / "results.json").read_text())["held_out"]
    reports = results / "checkpoints" / "eval"
    assert sorted(p.name for p in reports.iterdir()) == ["step-0.json", "step-1.json", "step-2.json"]
    first, last = (json.loads((reports / f"step-{n}.json").read_text()) for n in (0, 2))
    assert last["reward"] == held["final_reward"] and first["reward"] == held["initial_reward"]

    # The trained policy: the run's last checkpoint (a folder of checkpoints: the newest).
    trained = _wmrl("eval", str(QUICKSTART), "--checkpoint", str(results / "checkpoints"), "--seed", "1",
                    "--samples", "8", "--sandboxes", "2", "--out", str(tmp_path / "trained"), "--no-progress",
                    env=wmrl_env, cwd=tmp_path)
    assert trained.returncode == 0, trained.stderr[-3000:]
    report = json.loads((tmp_path / "trained" / "eval.json").read_text())
    assert report["checkpoint"] == str(results / "checkpoints" / "step-00000002") and report["checkpoint_step"] == 2
    assert report["samples_per_task"] == 8 and report["evaluation_seed"] == 1 + 7919
    _same_figures(report, last)
    summary = json.loads(trained.stdout.strip().splitlines()[-1])
    assert summary["reward"] == held["final_reward"] and summary["percentile"] == last["overall"]["percentile"]
    # Its report: Markdown with the run's curve beside it, the plots.
    text = (tmp_path / "trained" / "eval.md").read_text()
    assert f"**{last['overall']['percentile']:.3f}**" in text and "| iris | tabular | 8/8 |" in text
    assert "## The run's held-out evaluations" in text
    for name in ("eval.png", "curve.png"):
        assert (tmp_path / "trained" / name).stat().st_size > 5000

    # The base policy: the run's evaluation before its first step.
    base = _wmrl("eval", str(QUICKSTART), "--seed", "1", "--samples", "8", "--sandboxes", "2",
                 "--out", str(tmp_path / "base"), "--no-progress", env=wmrl_env, cwd=tmp_path)
    assert base.returncode == 0, base.stderr[-3000:]
    assert "the base policy (no checkpoint)" in base.stdout
    _same_figures(json.loads((tmp_path / "base" / "eval.json").read_text()), first)

    # The run's curve, per category over steps and over compute.
    drawn = _wmrl("report", "--eval-dir", str(reports), "--markdown", str(tmp_path / "curve.md"), env=wmrl_env,
                  cwd=tmp_path)
    assert drawn.returncode == 0, drawn.stderr
    assert (reports / "curve.png").stat().st_size > 5000
    rows = [line for line in (tmp_path / "curve.md").read_text().splitlines() if line.startswith("| ") and
            line[2].isdigit()]
    assert [row.split(" | ")[0] for row in rows] == ["| 0", "| 1", "| 2"]
    assert "training seconds (trainer wall-clock, no GPU)" in drawn.stdout
    assert f"{last['overall']['percentile']:.3f}" in rows[-1]
