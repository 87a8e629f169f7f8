"""`wmrl tasks check` and `wmrl tasks grade` as subprocesses on competitions in each layout."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import collections_fixture as cf
from test_layouts import BAD

ROOT = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join(str(ROOT / p) for p in ("", "trainer", "sandbox-image", "operator")))


def wmrl(*args):
    return subprocess.run([sys.executable, "-m", "wmrl.cli", *map(str, args)], capture_output=True, text=True,
                          env=ENV, timeout=300)


BUILDERS = {
    "mlebench-accuracy-bool": lambda p: cf.spaceship_mlebench(p, split=False),
    "mlebench-source-tree": lambda p: cf.spaceship_mlebench(p, split=True),
    "mledojo-log-loss": cf.leaf_mledojo,
    "normalised-rmsle": cf.bikes_rmsle,
    "normalised-text-f1": cf.tweets_text,
    "normalised-own-grade-py": cf.own_grade,
    "dsbench-auc": cf.santander_dsbench,
    "mlebench-jsonl-answers-own-grade": cf.qa_jsonl_mlebench,
    "mlebench-jsonl-answers-builtin": cf.labels_jsonl_mlebench,
}


@pytest.mark.parametrize("case", sorted(BUILDERS))
def test_check_and_grade(tmp_path, case):
    built = BUILDERS[case](tmp_path)
    extra = ["--competitions-dir", built.competitions_dir] if built.competitions_dir else []
    check = wmrl("tasks", "check", built.root, *extra)
    assert check.returncode == 0, check.stdout + check.stderr
    assert f"{built.name}: format" in check.stdout and "1 of 1 task(s) usable" in check.stdout
    assert ("higher is better" if built.higher_is_better else "lower is better") in check.stdout
    grades = {}
    for kind in ("correct", "poor", "invalid"):
        path = tmp_path / f"{kind}.csv"
        getattr(built, kind).to_csv(path, index=False)
        result = wmrl("tasks", "grade", built.root, built.name, path, *extra)
        assert result.returncode == 0, result.stderr
        grades[kind] = json.loads(result.stdout)
    assert grades["correct"]["status"] == "valid" and grades["correct"]["position"] == 1.0
    assert grades["correct"]["reward"] == 1.0
    assert grades["poor"]["status"] == "valid" and grades["poor"]["position"] <= 0.2
    assert grades["invalid"]["status"] == "ran_no_sub" and grades["invalid"]["reason"]
    assert grades["invalid"]["reward"] == 0.2
    if built.root.name != "data_modeling":  # DSBench has no leaderboard, so no medals
        assert grades["correct"]["medal"] == "gold" and grades["poor"]["medal"] is None


@pytest.mark.parametrize("make", BAD, ids=lambda f: f.__name__[5:])
def test_check_refuses_bad_input_naming_task_and_file(tmp_path, make):
    built, message = make(tmp_path)
    extra = ["--competitions-dir", built.competitions_dir] if built.competitions_dir else []
    check = wmrl("tasks", "check", built.root, *extra, "--no-grade")
    assert check.returncode == 2
    import re
    assert re.search(message, check.stdout + check.stderr), check.stdout + check.stderr
    assert "Traceback" not in check.stderr


def test_grade_exit_codes(tmp_path):
    built = cf.bikes_rmsle(tmp_path)
    assert wmrl("tasks", "grade", built.root, "no-such-task", tmp_path / "x.csv").returncode == 2
    assert wmrl("tasks", "grade", built.root, built.name, tmp_path / "missing.csv").returncode == 2
    assert "tasks check" in wmrl("--help").stdout
