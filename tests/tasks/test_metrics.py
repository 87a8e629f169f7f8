"""Built-in metrics against scikit-learn on the same data (property tests) and submission validation."""

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn import metrics as skm

from wmrl import task_metrics as tm

SEEDS = st.integers(0, 2**31 - 1)


def _rng(seed):
    return np.random.default_rng(seed)


@settings(max_examples=40, deadline=None)
@given(SEEDS, st.integers(2, 60))
def test_auc_matches_sklearn_with_ties(seed, n):
    rng = _rng(seed)
    y = rng.integers(0, 2, size=n)
    y[0], y[1] = 0, 1
    score = rng.integers(0, 5, size=n) / 4.0  # many ties
    assert tm.roc_auc(y, score) == pytest.approx(skm.roc_auc_score(y, score))


@settings(max_examples=40, deadline=None)
@given(SEEDS, st.integers(1, 50), st.integers(2, 6))
def test_log_loss_matches_sklearn(seed, n, k):
    rng = _rng(seed)
    labels = rng.integers(0, k, size=n)
    proba = rng.dirichlet(np.ones(k), size=n) * 0.98 + 0.01 / k
    proba /= proba.sum(axis=1, keepdims=True)
    assert tm.log_loss(np.eye(k)[labels], proba) == pytest.approx(
        skm.log_loss(labels, proba, labels=list(range(k))), rel=1e-9)


@settings(max_examples=40, deadline=None)
@given(SEEDS, st.integers(2, 60))
def test_qwk_matches_sklearn(seed, n):
    rng = _rng(seed)
    y, p = rng.integers(0, 5, size=n), rng.integers(0, 5, size=n)
    expected = skm.cohen_kappa_score(y, p, weights="quadratic")
    if np.isnan(expected):
        return
    assert tm.quadratic_weighted_kappa(y, p) == pytest.approx(expected)


@settings(max_examples=40, deadline=None)
@given(SEEDS, st.integers(1, 60), st.sampled_from(["macro", "micro", "weighted", "binary"]))
def test_f1_matches_sklearn(seed, n, average):
    rng = _rng(seed)
    classes = 2 if average == "binary" else 4
    y, p = rng.integers(0, classes, size=n), rng.integers(0, classes, size=n)
    expected = skm.f1_score(y, p, average=average, zero_division=0, labels=sorted(set(y) | set(p)) if average != "binary" else None)
    assert tm.f1(y, p, average) == pytest.approx(expected)


@settings(max_examples=40, deadline=None)
@given(SEEDS, st.integers(2, 60))
def test_regression_metrics_match_sklearn(seed, n):
    rng = _rng(seed)
    y, p = rng.exponential(size=n) * 10, rng.exponential(size=n) * 10
    assert tm.rmse(y, p) == pytest.approx(np.sqrt(skm.mean_squared_error(y, p)))
    assert tm.rmsle(y, p) == pytest.approx(np.sqrt(skm.mean_squared_log_error(y, p)))
    assert tm.mae(y, p) == pytest.approx(skm.mean_absolute_error(y, p))
    assert tm.r2(y, p) == pytest.approx(skm.r2_score(y, p))


def test_map_at_k_by_hand():
    # Kaggle's AP@3: hits at 1 and 3 of 3 predictions with 2 relevant -> (1/1 + 2/3) / 2
    assert tm.average_precision_at_k(["a", "b"], ["a", "x", "b"], 3) == pytest.approx((1 + 2 / 3) / 2)
    assert tm.average_precision_at_k(["a"], ["x", "y", "z", "a"], 3) == 0.0
    assert tm.average_precision_at_k(["a"], ["a", "a", "a"], 3) == 1.0  # duplicates count once


def _frame(ids, **cols):
    return pd.DataFrame({"id": ids, **cols})


def test_accuracy_on_boolean_and_string_labels():
    answers = _frame([1, 2, 3, 4], Transported=[True, False, True, False])
    sub = _frame(["4", "3", "2", "1"], Transported=["false", "True", "False", "FALSE"])
    assert tm.score_submission("accuracy", sub, answers, "id", ["Transported"]) == 0.75
    assert tm.accuracy(["cat", "dog"], ["cat", "Dog"]) == 0.5


def test_mean_column_wise_auc_and_mcrmse():
    rng = _rng(0)
    y = rng.integers(0, 2, size=(40, 3))
    y[0], y[1] = 0, 1
    p = rng.uniform(size=(40, 3))
    cols = ["a", "b", "c"]
    answers = pd.DataFrame(y, columns=cols).assign(id=range(40))
    sub = pd.DataFrame(p, columns=cols).assign(id=range(40))
    expected = np.mean([skm.roc_auc_score(y[:, j], p[:, j]) for j in range(3)])
    assert tm.score_submission("auc-roc", sub, answers, "id", cols) == pytest.approx(expected)
    mcrmse = np.mean([np.sqrt(skm.mean_squared_error(y[:, j], p[:, j])) for j in range(3)])
    assert tm.score_submission("mcrmse", sub, answers, "id", cols) == pytest.approx(mcrmse)


@settings(max_examples=60, deadline=None)
@given(SEEDS, st.lists(st.sampled_from([-1e-9, 0.0, 1.0, 1 + 1e-9, -3.5, 2.0]) | st.floats(-0.5, 1.5), min_size=2, max_size=30))
def test_single_target_auc_takes_probabilities_as_mlebench_does(seed, scores):
    # MLE-bench's prepare_for_auroc_metric refuses a column whose min < 0 or max > 1 (0 and 1 themselves pass).
    rng = _rng(seed)
    n = len(scores)
    y = rng.integers(0, 2, size=n)
    y[0], y[1] = 0, 1
    answers = pd.DataFrame({"id": range(n), "target": y})
    sub = pd.DataFrame({"id": range(n), "target": scores})
    low, high = min(scores), max(scores)
    if low < 0 or high > 1:
        bound = f"a maximum of {high!r}, above 1" if high > 1 else f"a minimum of {low!r}, below 0"
        with pytest.raises(tm.SubmissionError) as refused:
            tm.score_submission("auc", sub, answers, "id", ["target"])
        assert str(refused.value) == f"AUC takes probabilities in [0, 1]: the submission's column 'target' has {bound}"
    else:
        got = tm.score_submission("auc-roc", sub, answers, "id", ["target"])
        assert got == pytest.approx(skm.roc_auc_score(y, scores))


def test_mean_column_wise_auc_takes_any_scores_as_mlebench_does():
    # MLE-bench's several-column AUC graders (jigsaw-toxic, plant-pathology-2020, playground-series-s3e18)
    # pass the scores to roc_auc_score unchecked: a rank statistic, unchanged by any increasing map.
    rng = _rng(1)
    y = rng.integers(0, 2, size=(40, 2))
    y[0], y[1] = 0, 1
    p = rng.uniform(size=(40, 2))
    cols = ["EC1", "EC2"]
    answers = pd.DataFrame(y, columns=cols).assign(id=range(40))
    logits = pd.DataFrame(np.log(p / (1 - p)) * 3 + 2, columns=cols).assign(id=range(40))
    expected = np.mean([skm.roc_auc_score(y[:, j], p[:, j]) for j in range(2)])
    assert tm.score_submission("mean-column-wise-auc", logits, answers, "id", cols) == pytest.approx(expected)


def test_log_loss_against_a_label_column():
    answers = _frame([1, 2, 3], species=["Acer", "Salix", "Acer"])
    sub = _frame([3, 2, 1], Acer=[0.7, 0.2, 0.6], Salix=[0.3, 0.8, 0.4])
    got = tm.score_submission("multi-class-log-loss", sub, answers, "id", ["species"], ["Acer", "Salix"])
    assert got == pytest.approx(skm.log_loss(["Acer", "Salix", "Acer"], [[0.6, 0.4], [0.2, 0.8], [0.7, 0.3]]))


@pytest.mark.parametrize("sub, reason", [
    (_frame([1, 2, 3], y=[1.0, np.nan, 2.0]), "NaN"),
    (_frame([1, 2, 2], y=[1.0, 2.0, 2.0]), "duplicate"),
    (_frame([1, 2, 9], y=[1.0, 2.0, 2.0]), "not test ids"),
    (_frame([1, 2], y=[1.0, 2.0]), "rows"),
    (pd.DataFrame({"key": [1, 2, 3], "y": [1, 2, 3]}), "no 'id' column"),
    (_frame([1, 2, 3], z=[1, 2, 3]), "lacks column"),
    (_frame([1, 2, 3], y=["a", "b", "c"]), "non-numeric"),
])
def test_invalid_submissions_say_why(sub, reason):
    answers = _frame([1, 2, 3], y=[1.0, 2.0, 3.0])
    with pytest.raises(tm.SubmissionError, match=reason):
        tm.score_submission("rmse", sub, answers, "id", ["y"])


def test_metric_names():
    assert tm.canonical_metric("AUC_ROC") == "auc"
    assert tm.canonical_metric("MAP@5") == "map@5"
    assert tm.canonical_metric("multi-class-log-loss") == "log-loss"
    assert tm.canonical_metric("bleu") is None
    assert tm.metric_info("rmsle").higher_is_better is False
