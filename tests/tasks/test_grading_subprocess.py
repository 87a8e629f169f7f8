"""The sandbox path (wmrl.grading.grade on a collection task) and the grading subprocess's limits."""

import time

import pytest

import collections_fixture as cf
from wmrl import collection_grading
from wmrl.grading import SandboxFailure, grade
from wmrl.outcome import Status
from wmrl.task_layouts import load_collection

OK_RUN = {"status": "Success", "run_result": {"status": "Finished", "return_code": 0, "stdout": "", "stderr": ""}}


def test_a_sandbox_run_grades_through_the_collection_grader(tmp_path):
    built = cf.spaceship_mlebench(tmp_path, split=False)
    (task,) = load_collection(built.root)
    valid = grade(task, OK_RUN, built.correct.to_csv(index=False).encode())
    assert valid.status is Status.VALID and valid.rank_score == 1.0 and "gold medal" in valid.feedback
    assert valid.medal == "gold"  # kept on the outcome: evaluation reports count medals
    invalid = grade(task, OK_RUN, built.invalid.to_csv(index=False).encode())
    assert invalid.status is Status.RAN_NO_SUB and "invalid submission" in invalid.feedback
    assert grade(task, OK_RUN, b"").status is Status.RAN_NO_SUB  # empty file: a reason, not a trace


def _with_grade_py(tmp_path, body):
    built = cf.own_grade(tmp_path)
    (tmp_path / built.name / "grade.py").write_text(body)
    (task,) = load_collection(tmp_path)
    path = tmp_path / "sub.csv"
    built.correct.to_csv(path, index=False)
    return task, path


def test_a_slow_grader_is_killed_at_the_time_limit(tmp_path):
    task, path = _with_grade_py(tmp_path, "import time\n\ndef grade(s, a):\n    time.sleep(60)\n    return 0.0\n")
    started = time.monotonic()
    with pytest.raises(collection_grading.GraderFailure, match="task median-error: grading took longer than 3s"):
        collection_grading.grade_file(task, path, timeout=3)
    assert time.monotonic() - started < 20


def test_a_grader_over_the_memory_limit_fails_cleanly(tmp_path):
    task, path = _with_grade_py(tmp_path, "def grade(s, a):\n    return len(bytearray(3 * 1024**3))\n")
    with pytest.raises(collection_grading.GraderFailure, match="out of memory|failed"):
        collection_grading.grade_file(task, path, memory_mb=1024)


def test_a_grader_that_cannot_import_is_the_tasks_fault(tmp_path):
    task, path = _with_grade_py(tmp_path, "import mlebench_not_installed\n\ndef grade(s, a):\n    return 0.0\n")
    with pytest.raises(collection_grading.GraderFailure, match="cannot import .*grade.py"):
        collection_grading.grade_file(task, path)
    with pytest.raises(SandboxFailure, match="grader failure"):
        grade(task, OK_RUN, path.read_bytes())
