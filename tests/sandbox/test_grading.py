"""wmrl.grading: the ladder from real Python stderr and submissions, metrics against scikit-learn."""

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn import metrics as skm

from wmrl.grading import SandboxFailure, grade, parse_error, score
from wmrl.outcome import Status
from wmrl.tasks import Task

LABELS = b"id,target\n10,1\n11,0\n12,1\n13,1\n"
TASK = Task(name="tiny", description="four rows", kind="classification", metric="accuracy", target="target",
            data={"train.csv": b"id,f0,target\n1,0.5,1\n", "test.csv": b"id,f0\n10,0.1\n11,0.2\n12,0.3\n13,0.4\n"},
            hidden_labels=LABELS, leaderboard=(1.0, 0.75, 0.5))


def real_run(code: str, tmp_path) -> dict:
    """A run_result from really running ``code`` as main.py (so tracebacks are Python's own)."""
    script = tmp_path / "main.py"
    script.write_text(code)
    proc = subprocess.run([sys.executable, "-I", "-B", str(script)], capture_output=True, text=True, timeout=30)
    return {"status": "Success" if proc.returncode == 0 else "Failed", "message": "",
            "run_result": {"status": "Finished", "return_code": proc.returncode, "execution_time": 0.01,
                           "stdout": proc.stdout, "stderr": proc.stderr}}


def test_syntax_error_has_its_line(tmp_path):
    out = grade(TASK, real_run("x = 1\ny = 2\ndef f(:\n    pass\n", tmp_path), None)
    assert out.status is Status.SYNTAX_ERR and out.error_type == "SyntaxError" and out.error_line == 3
    assert out.reward == 0.0


def test_indentation_error_is_a_syntax_error(tmp_path):
    out = grade(TASK, real_run("if True:\nprint(1)\n", tmp_path), None)
    assert out.status is Status.SYNTAX_ERR and out.error_type == "IndentationError" and out.error_line == 2


def test_traceback_gives_type_and_line_of_the_script(tmp_path):
    code = "import json\n\ndef load():\n    return json.loads('{bad')\n\nload()\n"
    out = grade(TASK, real_run(code, tmp_path), b"id,target\n10,1\n")
    assert out.status is Status.RUNTIME_ERR
    assert out.error_type == "JSONDecodeError"  # qualified json.decoder.JSONDecodeError -> last part
    assert out.error_line == 4  # deepest frame in main.py, not in json's own files
    assert "JSONDecodeError" in out.feedback and out.reward == 0.1


def test_chained_exception_reports_the_last_one(tmp_path):
    code = "try:\n    {}['k']\nexcept KeyError:\n    raise ValueError('no key')\n"
    out = grade(TASK, real_run(code, tmp_path), None)
    assert (out.status, out.error_type, out.error_line) == (Status.RUNTIME_ERR, "ValueError", 4)


def test_syntax_error_at_runtime_is_a_runtime_error(tmp_path):
    out = grade(TASK, real_run("x = 1\nexec('def (')\n", tmp_path), None)
    assert out.status is Status.RUNTIME_ERR and out.error_type == "SyntaxError" and out.error_line == 2


def test_exit_codes_and_signals(tmp_path):
    assert grade(TASK, real_run("import sys; sys.exit(3)", tmp_path), None).error_type == "SystemExit"
    killed = grade(TASK, real_run("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", tmp_path), None)
    assert killed.status is Status.RUNTIME_ERR and killed.error_type == "SIGKILL"


def test_timeout_is_a_runtime_error():
    resp = {"status": "Failed", "run_result": {"status": "TimeLimitExceeded", "execution_time": 2.0,
                                               "return_code": None, "stdout": "epoch 1\n", "stderr": ""}}
    out = grade(TASK, resp, None)
    assert out.status is Status.RUNTIME_ERR and out.error_type == "TimeLimitExceeded"
    assert "time limit" in out.feedback and "epoch 1" in out.feedback


def test_sandbox_error_is_not_graded():
    with pytest.raises(SandboxFailure):
        grade(TASK, {"status": "SandboxError", "message": "boom", "run_result": None}, None)


def test_fetched_files_over_the_limit_are_a_runtime_error(tmp_path):
    """The program's output exceeded what the sandbox returns (files_truncated): its failure, not ungraded."""
    resp = {**real_run("print('wrote a big submission')", tmp_path), "status": "Failed",
            "message": "fetch_files: the files exceed 5 bytes together; the rest were left out",
            "files_truncated": True}
    out = grade(TASK, resp, None)
    assert out.status is Status.RUNTIME_ERR and out.error_type == "OutputLimitExceeded"
    assert "exceed 5 bytes" in out.feedback
    crashed = {**real_run("raise ValueError('first')", tmp_path), "files_truncated": True}
    assert grade(TASK, crashed, None).error_type == "ValueError"  # the program's own error says more


@pytest.mark.parametrize("submission, why", [
    (None, "no submission.csv"),
    (b"", "empty"),
    (b"\xff\xfe", "UTF-8"),
    (b"10,1\n11,0\n12,1\n13,1\n", "no 'id' column"),
    (b"id,target\n10,1\n11,0\n12,1\n", "1 test ids missing"),
    (b"id,target\n10,1\n11,0\n12,1\n13,1\n99,0\n", "1 unknown ids"),
    (b"id,target\n10,1\n10,1\n11,0\n12,1\n13,1\n", "duplicate"),
    (b"id,target\n10,1\n11,cat\n12,1\n13,1\n", "non-numeric"),
    (b"id,target\n10,1\n11,nan\n12,1\n13,1\n", "non-finite"),
    (b"id,target\n10,1\n11\n12,1\n13,1\n", "expected 2 fields"),
])
def test_ran_without_a_usable_submission(tmp_path, submission, why):
    out = grade(TASK, real_run("print('trained')", tmp_path), submission)
    assert out.status is Status.RAN_NO_SUB and out.reward == 0.2
    assert why in out.feedback and "trained" in out.feedback


def test_valid_submission_is_scored_and_ranked(tmp_path):
    run = real_run("print('ok')", tmp_path)
    # numpy.savetxt without fmt writes ids as floats: still the same ids; rows in any order.
    perfect = grade(TASK, run, b"id,target\n1.3e1,1\n10.0,1\n11,0\n12,1\n")
    assert perfect.status is Status.VALID and perfect.rank_score == 1.0 and perfect.reward == 1.0
    three_of_four = grade(TASK, run, b"id,target\n10,1\n11,1\n12,1\n13,1\n")
    assert three_of_four.rank_score == pytest.approx(2 / 3)
    assert "accuracy = 0.75" in three_of_four.feedback


def test_regression_metric_lower_is_better(tmp_path):
    task = Task(name="reg", description="", kind="regression", metric="rmse", target="target",
                data={"x": b""}, hidden_labels=b"id,target\n1,1.0\n2,2.0\n", leaderboard=(0.1, 0.5, 1.0))
    out = grade(task, real_run("pass", tmp_path), b"id,target\n1,1.0\n2,2.6\n")
    assert out.status is Status.VALID
    assert out.rank_score == pytest.approx(2 / 3)  # rmse ~0.42 beats 0.5 and 1.0


def test_parse_error_ignores_noise():
    assert parse_error("") is None
    assert parse_error("Warning: something odd\n") is None


classes = st.lists(st.integers(0, 3), min_size=1, max_size=40)
reals = st.floats(-1e3, 1e3, allow_nan=False)


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_classification_metrics_match_sklearn(data):
    y_true = np.array(data.draw(classes))
    y_pred = np.array(data.draw(st.lists(st.integers(0, 3), min_size=len(y_true), max_size=len(y_true))))
    assert score("accuracy", y_true, y_pred) == pytest.approx(skm.accuracy_score(y_true, y_pred))
    assert score("f1_macro", y_true, y_pred) == pytest.approx(
        skm.f1_score(y_true, y_pred, average="macro", zero_division=0))


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_regression_metrics_match_sklearn(data):
    y_true = np.array(data.draw(st.lists(reals, min_size=2, max_size=40)))
    y_pred = np.array(data.draw(st.lists(reals, min_size=len(y_true), max_size=len(y_true))))
    assert score("rmse", y_true, y_pred) == pytest.approx(np.sqrt(skm.mean_squared_error(y_true, y_pred)), abs=1e-9)
    assert score("mae", y_true, y_pred) == pytest.approx(skm.mean_absolute_error(y_true, y_pred), abs=1e-9)
    assert score("r2", y_true, y_pred) == pytest.approx(skm.r2_score(y_true, y_pred), rel=1e-9, abs=1e-9)


def test_r2_of_a_constant_target_matches_sklearn():
    y = np.array([2.0, 2.0, 2.0])
    assert score("r2", y, y) == skm.r2_score(y, y) == 1.0
    assert score("r2", y, y + 1) == skm.r2_score(y, y + 1) == 0.0


def test_unknown_metric_is_named():
    with pytest.raises(ValueError, match="metric must be one of"):
        score("auc", np.ones(2), np.ones(2))
