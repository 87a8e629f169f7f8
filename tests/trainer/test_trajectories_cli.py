"""`wmrl trajectories`: a real subprocess reading a trajectory log folder (a rotated file, a line cut
short by a crash) and filtering it; the same filters in-process agree."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from wmrl_trainer.trajectories_cli import log_files, matches, read_entries


def _wmrl(*args: str) -> list[str]:
    return [sys.executable, "-m", "wmrl.cli", *args]


def _entry(step, row, task, anchor, statuses, raw, real):
    turns = [{"code": "c", "text": "t", "observation": "o", "shown": "real" if anchor else "world_model",
              "world_model": {"status": s, "reward": raw}, "real": {"status": s, "reward": real} if anchor else None}
             for s in statuses]
    return {"step": step, "rank": 0, "row": row, "task": task, "anchor": anchor, "turns": turns, "stop": "turns",
            "reward": real if anchor else raw, "raw_reward": raw, "calibrated_reward": raw,
            "real_reward": real if anchor else None,
            "disagreement": abs(raw - real) if anchor else None, "advantage": 0.5, "weight": 2.0 if anchor else 1.0,
            "graded": True}


@pytest.fixture
def log_dir(tmp_path):
    entries = [_entry(0, 0, "iris", True, ["runtime_err", "valid"], 0.6, 0.9),
               _entry(0, 1, "iris", False, ["valid"], 0.7, None),
               _entry(1, 0, "wine", True, ["syntax_err"], 0.1, 0.0),
               _entry(1, 1, "wine", False, ["ran_no_sub"], 0.2, None)]
    directory = tmp_path / "trajectories"
    directory.mkdir()
    (directory / "rank-0.jsonl.1").write_text(json.dumps(entries[0]) + "\n")
    (directory / "rank-0.jsonl").write_text("".join(json.dumps(e) + "\n" for e in entries[1:]) + '{"step": 2, "ro')
    return directory


def _run(*args):
    return subprocess.run(_wmrl("trajectories", *args), capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("flags, expected", [
    ([], [(0, 0), (0, 1), (1, 0), (1, 1)]),
    (["--task", "iris"], [(0, 0), (0, 1)]),
    (["--status", "valid"], [(0, 0), (0, 1)]),
    (["--status", "runtime_err", "--task", "wine"], []),
    (["--anchor"], [(0, 0), (1, 0)]),
    (["--no-anchor"], [(0, 1), (1, 1)]),
    (["--min-disagreement", "0.2"], [(0, 0)]),
    (["--min-disagreement", "0.05", "--status", "syntax_err"], [(1, 0)]),
])
def test_the_cli_filters(log_dir, flags, expected):
    proc = _run(str(log_dir), "--json", *flags)
    assert proc.returncode == 0, proc.stderr
    found = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [(e["step"], e["row"]) for e in found] == expected  # the rotated (older) file first
    assert "not a JSON line" in proc.stderr  # the cut-short last line is skipped, said so
    assert [(e["step"], e["row"]) for e in read_entries(log_files(log_dir)) if matches(
        e, task=_flag(flags, "--task"), status=_flag(flags, "--status"),
        anchor=True if "--anchor" in flags else False if "--no-anchor" in flags else None,
        min_disagreement=float(_flag(flags, "--min-disagreement")) if "--min-disagreement" in flags else None)] \
        == expected


def _flag(flags, name):
    return flags[flags.index(name) + 1] if name in flags else None


def test_the_cli_prints_one_line_per_trajectory_and_a_count(log_dir):
    proc = _run(str(log_dir / "rank-0.jsonl.1"))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("step 0  rank 0  row 0  iris  anchor  reward 0.900 (wm 0.600 cal 0.600 real 0.900)")
    assert "adv +0.500 x2.00" in lines[0] and "turns 2: runtime_err -> valid" in lines[0]
    assert lines[-1] == "# 1 of 1 trajectories"


def test_the_cli_refuses_a_missing_file_and_a_bad_filter(tmp_path, log_dir):
    missing = _run(str(tmp_path / "nope.jsonl"))
    assert missing.returncode == 2 and "nope.jsonl: no such file or folder" in missing.stderr
    bad = _run(str(log_dir), "--status", "crashed")
    assert bad.returncode == 2 and "--status" in bad.stderr
    negative = _run(str(log_dir), "--min-disagreement", "-1")
    assert negative.returncode == 2 and "--min-disagreement must be >= 0" in negative.stderr
