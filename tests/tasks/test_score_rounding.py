"""MLE-bench's Grader rounds a score to 5 decimals before ranking it; wmrl's MLE-bench tasks do the same.

MLE-bench 1.0.0 (``mlebench/grade_helpers.py``, ``Grader.__call__``) applies Python's ``round(score, 5)``
to whatever ``grade_fn`` returned and hands that rounded score to ``rank_score`` (medals, median) and
to its report. Python's ``round`` on a ``float`` is exact decimal rounding; on a numpy float it is
numpy's (scale, round half to even, unscale), and the two differ on some values, so the worker rounds
the grader's own value, not a float made of it. Other collections (MLE-Dojo, DSBench, normalised)
place the score unrounded, as they report it.
"""

import sys

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import collections_fixture as cf
from wmrl import collection_grading
from wmrl.grade_worker import grade_job
from wmrl.task_layouts import MLEBENCH_DECIMALS, load_collection

# The grader hands back the submission's one value, as a numpy float or as a Python float.
ECHO_GRADE = """
def grade(submission, answers):
    value = submission["value"].iloc[0]
    return float(value) if submission["kind"].iloc[0] == "python" else value
"""


@pytest.fixture(scope="module")
def echo(tmp_path_factory):
    folder = tmp_path_factory.mktemp("echo")
    (folder / "grade.py").write_text(ECHO_GRADE)
    pd.DataFrame({"id": [1], "value": [0.0]}).to_csv(folder / "answers.csv", index=False)
    yield folder
    for name in [m for m in sys.modules if m.startswith("_wmrl_task_grader")]:
        del sys.modules[name]


def _worker_score(folder, value: float, kind: str, decimals):
    path = folder / f"sub-{kind}.csv"
    pd.DataFrame({"id": [1], "value": [repr(value)], "kind": [kind]}).to_csv(path, index=False)
    job = {"grader": {"kind": "python", "file": str(folder / "grade.py"), "function": "grade", "sys_path": [],
                      "decimals": decimals},
           "submission": str(path), "answers": str(folder / "answers.csv"), "id_column": "id",
           "answer_columns": ["value"], "submission_columns": ["value"]}
    return grade_job(job)["score"]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False) | st.sampled_from(
    [0.000015, 0.123455, 2.675e-5, 0.999995, 1 / 3, 0.8574999999999999]))
def test_the_worker_rounds_as_mlebench_grader_does(echo, value):
    # What MLE-bench's Grader returns for a grade_fn returning np.float64(value) or float(value).
    assert _worker_score(echo, value, "numpy", 5) == round(np.float64(value), 5)
    assert _worker_score(echo, value, "python", 5) == round(float(value), 5)
    assert _worker_score(echo, value, "python", None) == value  # no decimals: unrounded


def test_numpy_and_python_rounding_differ_so_the_worker_keeps_the_type(echo):
    # 0.999995 is stored just below itself: exact rounding goes down, numpy's scaled rounding up.
    assert round(0.999995, 5) == 0.99999 and round(np.float64(0.999995), 5) == 1.0
    assert _worker_score(echo, 0.999995, "python", 5) == 0.99999
    assert _worker_score(echo, 0.999995, "numpy", 5) == 1.0


NEAR_GOLD_GRADE = """
def grade(submission, answers):
    merged = answers.merge(submission, on="PassengerId", suffixes=("_true", "_pred"))
    hits = merged["Transported_true"].astype(str).str.lower() == merged["Transported_pred"].astype(str).str.lower()
    return float(hits.mean()) - 4e-6  # a correct submission scores 0.999996: 1.0 once rounded
"""


def test_an_mlebench_score_is_rounded_before_it_meets_the_medal_thresholds(tmp_path):
    built = cf.spaceship_mlebench(tmp_path, split=False)
    definitions = built.root / built.name
    (definitions / "grade.py").write_text(NEAR_GOLD_GRADE)
    # 40 teams: gold is the 4th score (int(40 * 0.1)), exactly 1.0; silver the 8th.
    scores = [1.0] * 4 + list(np.round(np.linspace(0.99, 0.5, 36), 5))
    pd.DataFrame({"teamId": range(40), "score": scores}).to_csv(definitions / "leaderboard.csv", index=False)
    (task,) = load_collection(built.root, "mlebench")
    assert task.grader.decimals == MLEBENCH_DECIMALS == 5
    path = tmp_path / "sub.csv"
    built.correct.to_csv(path, index=False)
    result = collection_grading.grade_file(task, path)
    # MLE-bench: round(0.999996, 5) == 1.0 >= the gold threshold; unrounded it would be silver.
    assert result.score == 1.0 and result.medal == "gold" and result.position == 1.0
    assert collection_grading.placed(task, 0.999996).medal == "silver"


def test_other_collections_place_the_score_unrounded(tmp_path):
    built = cf.own_grade(tmp_path)
    (tmp_path / built.name / "grade.py").write_text("def grade(s, a):\n    return 0.123456789\n")
    (task,) = load_collection(tmp_path)
    assert task.grader.decimals is None
    path = tmp_path / "sub.csv"
    built.correct.to_csv(path, index=False)
    assert collection_grading.grade_file(task, path).score == 0.123456789
