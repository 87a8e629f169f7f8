"""Built-in competition metrics on pandas DataFrames: a submission scored against the answers.

Used for collection tasks whose collection ships no grade function of its own (and for the
normalised layout's ``metric.yaml``). Each metric is the definition Kaggle and MLE-bench use, checked
against scikit-learn in tests/tasks. :func:`score_submission` first validates the submission (id
column, target columns, ids, NaN, types); what is wrong raises :class:`SubmissionError`, whose
message becomes the ``ran_no_sub`` feedback.

With several target columns, accuracy, AUC and the regression metrics are the mean over the
columns (Kaggle's "mean column-wise" AUC / MCRMSE); log-loss treats the columns as one probability
distribution per row. AUC of one target column takes probabilities: a score outside [0, 1] is a
SubmissionError, as all 11 of MLE-bench's single-target AUC graders (``prepare_for_auroc_metric``)
refuse it. The mean column-wise AUC takes any real scores, as three of MLE-bench's four
several-column AUC graders do (jigsaw-toxic-comment-classification-challenge, plant-pathology-2020-fgvc7,
playground-series-s3e18; ranzcr-clip-catheter-line-classification bounds each column). Names are matched case-insensitively with ``_`` and ``-`` alike, and the
names MLE-bench's configs use (``auc-roc``, ``multi-class-log-loss``) are accepted.

This module imports pandas at import time: it runs in the grading subprocess, not in the trainer.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import pandas as pd

from wmrl.grading import mae, r2, rmse  # the tiny format's numeric metrics, the same formulas

LOG_LOSS_EPS = 1e-15


class SubmissionError(ValueError):
    """Why a submission cannot be scored (becomes the ran_no_sub feedback)."""


@dataclass(frozen=True)
class MetricInfo:
    name: str
    higher_is_better: bool
    kind: str  # "classification" | "regression": what the prompt and world model call the task


# Canonical name -> definition. ``map@k`` is matched by pattern (any k).
METRIC_INFO: dict[str, MetricInfo] = {m.name: m for m in (
    MetricInfo("accuracy", True, "classification"),
    MetricInfo("auc", True, "classification"),
    MetricInfo("log-loss", False, "classification"),
    MetricInfo("qwk", True, "classification"),
    MetricInfo("f1", True, "classification"),
    MetricInfo("f1-macro", True, "classification"),
    MetricInfo("f1-micro", True, "classification"),
    MetricInfo("f1-weighted", True, "classification"),
    MetricInfo("rmse", False, "regression"),
    MetricInfo("rmsle", False, "regression"),
    MetricInfo("mae", False, "regression"),
    MetricInfo("r2", True, "regression"),
)}
_ALIASES = {
    "classification-accuracy": "accuracy", "categorization-accuracy": "accuracy",
    "auc-roc": "auc", "roc-auc": "auc", "roc-auc-score": "auc", "mean-column-wise-auc": "auc",
    "column-wise-auc": "auc", "logloss": "log-loss", "multi-class-log-loss": "log-loss",
    "multiclass-log-loss": "log-loss", "binary-log-loss": "log-loss", "cross-entropy": "log-loss",
    "quadratic-weighted-kappa": "qwk", "cohen-kappa-quadratic": "qwk", "f1-score": "f1",
    "macro-f1": "f1-macro", "micro-f1": "f1-micro", "weighted-f1": "f1-weighted",
    "mcrmse": "rmse", "mean-columnwise-rmse": "rmse", "root-mean-squared-error": "rmse",
    "root-mean-squared-log-error": "rmsle", "mean-absolute-error": "mae", "r-squared": "r2",
}
_MAP_AT_K = re.compile(r"^map@(\d+)$")


def canonical_metric(name: str) -> Optional[str]:
    """The built-in metric ``name`` denotes (``'map@5'`` for MAP@5), or None if it is not one."""
    key = str(name).strip().lower().replace("_", "-").replace(" ", "-")
    key = _ALIASES.get(key, key)
    if key in METRIC_INFO or _MAP_AT_K.match(key):
        return key
    match = re.match(r"^(?:mean-average-precision|map)-?@?-?(\d+)$", key)
    return f"map@{match.group(1)}" if match else None


def metric_info(name: str) -> Optional[MetricInfo]:
    key = canonical_metric(name)
    if key is None:
        return None
    if key.startswith("map@"):
        return MetricInfo(key, True, "classification")
    return METRIC_INFO[key]


def known_metric_names() -> list[str]:
    return sorted(METRIC_INFO) + ["map@k"]


# --------------------------------------------------------------------------- value helpers


def _canonical_id(value) -> str:
    """'7', '7.0' and ' 7' are the same id (numpy writes integer ids as floats unless told otherwise)."""
    text = str(value).strip()
    try:
        number = float(text)
    except ValueError:
        return text
    return str(int(number)) if number.is_integer() and abs(number) < 2**53 else text


def _canonical_label(value) -> str:
    """A class label compared as text: booleans case-insensitively, numbers by value."""
    if isinstance(value, (bool, np.bool_)):
        return "true" if value else "false"
    text = str(value).strip()
    if text.lower() in ("true", "false"):
        return text.lower()
    return _canonical_id(text)


def _numeric(frame: pd.DataFrame, column: str, what: str) -> np.ndarray:
    values = pd.to_numeric(frame[column].map(_bool_as_number), errors="coerce").to_numpy(dtype=float)
    bad = ~np.isfinite(values)
    if bad.any():
        row = int(np.argmax(bad))
        raise SubmissionError(f"{what} column {column!r} has a non-numeric or missing value "
                              f"{frame[column].iloc[row]!r} (row {row + 1})")
    return values


def _bool_as_number(value):
    if isinstance(value, (bool, np.bool_)):
        return float(value)
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return 1.0 if value.strip().lower() == "true" else 0.0
    return value


# --------------------------------------------------------------------------- metrics (arrays)


def accuracy(y_true, y_pred) -> float:
    t = np.array([_canonical_label(v) for v in y_true], dtype=object)
    p = np.array([_canonical_label(v) for v in y_pred], dtype=object)
    return float(np.mean(t == p))


def roc_auc(y_true: np.ndarray, y_score: np.ndarray) -> float:
    """Binary ROC AUC as the Mann-Whitney statistic (ties in the score count one half)."""
    y_true = np.asarray(y_true, dtype=float)
    positive = y_true == 1.0
    n_pos, n_neg = int(positive.sum()), int((~positive).sum())
    if n_pos == 0 or n_neg == 0:
        raise ValueError("AUC is undefined when the answers hold only one class")
    ranks = pd.Series(np.asarray(y_score, dtype=float)).rank(method="average").to_numpy()
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def log_loss(y_onehot: np.ndarray, proba: np.ndarray) -> float:
    """Mean negative log-likelihood; predictions clipped to [eps, 1-eps] and rows renormalised (Kaggle)."""
    proba = np.clip(np.asarray(proba, dtype=float), LOG_LOSS_EPS, 1 - LOG_LOSS_EPS)
    proba = proba / proba.sum(axis=1, keepdims=True)
    return float(-np.mean(np.sum(np.asarray(y_onehot, dtype=float) * np.log(proba), axis=1)))


def quadratic_weighted_kappa(y_true, y_pred) -> float:
    y_true = np.asarray(y_true, dtype=int)
    y_pred = np.asarray(y_pred, dtype=int)
    labels = np.union1d(y_true, y_pred)
    index = {v: i for i, v in enumerate(labels)}
    n = len(labels)
    observed = np.zeros((n, n))
    for t, p in zip(y_true, y_pred):
        observed[index[t], index[p]] += 1
    expected = np.outer(observed.sum(axis=1), observed.sum(axis=0)) / observed.sum()
    i, j = np.indices((n, n))
    weights = (i - j) ** 2
    denominator = float((weights * expected).sum())
    if denominator == 0.0:
        return 1.0 if float((weights * observed).sum()) == 0.0 else 0.0
    return 1.0 - float((weights * observed).sum()) / denominator


def f1(y_true, y_pred, average: str) -> float:
    """F1 over text labels; ``binary`` takes the positive class as 1/true (the answers' other class 0)."""
    t = np.array([_canonical_label(v) for v in y_true], dtype=object)
    p = np.array([_canonical_label(v) for v in y_pred], dtype=object)
    if average == "binary":
        positive = "true" if "true" in set(t) | set(p) else "1"
        classes = [positive]
    else:
        classes = sorted(set(t) | set(p))
    tp = np.array([np.sum((p == c) & (t == c)) for c in classes], dtype=float)
    fp = np.array([np.sum((p == c) & (t != c)) for c in classes], dtype=float)
    fn = np.array([np.sum((p != c) & (t == c)) for c in classes], dtype=float)
    if average == "micro":
        denominator = 2 * tp.sum() + fp.sum() + fn.sum()
        return float(2 * tp.sum() / denominator) if denominator else 0.0
    denominators = 2 * tp + fp + fn
    per_class = np.divide(2 * tp, denominators, out=np.zeros_like(tp), where=denominators > 0)
    if average == "weighted":
        support = tp + fn
        return float(np.sum(per_class * support) / support.sum()) if support.sum() else 0.0
    return float(np.mean(per_class))


def rmsle(y_true, y_pred) -> float:
    return rmse(np.log1p(np.asarray(y_true, float)), np.log1p(np.asarray(y_pred, float)))


def average_precision_at_k(actual: list[str], predicted: list[str], k: int) -> float:
    """Kaggle's AP@k: precision at each new hit within the first k predictions, over min(|actual|, k)."""
    if not actual:
        return 0.0
    hits, total, seen = 0, 0.0, set()
    for i, p in enumerate(predicted[:k]):
        if p in actual and p not in seen:
            hits += 1
            total += hits / (i + 1.0)
        seen.add(p)
    return total / min(len(actual), k)


def mean_average_precision_at_k(actual: list[list[str]], predicted: list[list[str]], k: int) -> float:
    return float(np.mean([average_precision_at_k(a, p, k) for a, p in zip(actual, predicted)]))


# --------------------------------------------------------------------------- submissions


def _align(submission: pd.DataFrame, answers: pd.DataFrame, id_column: str, columns: list[str]) -> pd.DataFrame:
    """The submission's ``columns`` in the answers' row order, or SubmissionError."""
    if submission.empty and len(submission.columns) == 0:
        raise SubmissionError("the submission is empty")
    if id_column not in submission.columns:
        raise SubmissionError(f"the submission has no {id_column!r} column (its columns: {list(submission.columns)[:8]})")
    missing = [c for c in columns if c not in submission.columns]
    if missing:
        raise SubmissionError(f"the submission lacks column(s) {missing[:8]} (its columns: {list(submission.columns)[:8]})")
    if len(submission) != len(answers):
        raise SubmissionError(f"the submission has {len(submission)} rows; the test set has {len(answers)}")
    sub_ids = submission[id_column].map(_canonical_id)
    if sub_ids.duplicated().any():
        raise SubmissionError(f"the submission has duplicate {id_column!r} values, e.g. {sub_ids[sub_ids.duplicated()].iloc[0]!r}")
    ans_ids = answers[id_column].map(_canonical_id)
    unknown = set(sub_ids) - set(ans_ids)
    if unknown:
        raise SubmissionError(f"{len(unknown)} {id_column!r} value(s) are not test ids, e.g. {sorted(unknown)[0]!r}")
    aligned = submission.assign(_wmrl_id=sub_ids.to_numpy()).set_index("_wmrl_id").loc[ans_ids.to_numpy(), columns]
    if aligned.isna().any().any():
        column = aligned.columns[aligned.isna().any()].tolist()[0]
        raise SubmissionError(f"the submission has missing (NaN) values in column {column!r}")
    return aligned.reset_index(drop=True)


def _log_loss_inputs(submission: pd.DataFrame, answers: pd.DataFrame, id_column: str,
                     targets: list[str], classes: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(one-hot answers, predicted probabilities); answers are one-hot columns or one label column."""
    aligned = _align(submission, answers, id_column, classes)
    proba = np.column_stack([_numeric(aligned, c, "the submission's") for c in classes])
    if (proba < 0).any() or (proba > 1).any():
        raise SubmissionError("probabilities must lie in [0, 1]")
    if targets == classes:
        onehot = np.column_stack([_numeric(answers, c, "the answers'") for c in classes])
    else:
        (label_column,) = targets
        labels = answers[label_column].map(_canonical_label).to_numpy()
        index = {_canonical_label(c): i for i, c in enumerate(classes)}
        unknown = sorted({str(v) for v in labels if v not in index})
        if unknown:
            raise ValueError(f"answer label(s) {unknown[:5]} are not submission columns {classes[:8]}")
        onehot = np.zeros((len(labels), len(classes)))
        onehot[np.arange(len(labels)), [index[v] for v in labels]] = 1.0
    return onehot, proba


def score_submission(metric: str, submission: pd.DataFrame, answers: pd.DataFrame, id_column: str,
                     targets: list[str], submission_columns: Optional[list[str]] = None) -> float:
    """``metric`` of ``submission`` against ``answers``.

    ``targets`` are the answers' value columns; ``submission_columns`` the value columns the sample
    submission asks for (they differ only for log-loss against a label column: one column per class).
    """
    key = canonical_metric(metric)
    if key is None:
        raise ValueError(f"unknown metric {metric!r}; built-in metrics are {known_metric_names()}")
    wanted = list(submission_columns or targets)
    if key == "log-loss":
        return log_loss(*_log_loss_inputs(submission, answers, id_column, targets, wanted))
    aligned = _align(submission, answers, id_column, wanted)
    if key.startswith("map@"):
        k = int(key.split("@")[1])
        (column,) = targets
        actual = [str(v).split() for v in answers[column]]
        predicted = [str(v).split() for v in aligned[column]]
        return mean_average_precision_at_k(actual, predicted, k)
    if key == "auc" and len(targets) == 1:
        _require_probabilities(aligned, targets[0])
    per_column: list[float] = []
    for column in targets:
        per_column.append(_score_column(key, answers[column], aligned[column], column))
    return float(np.mean(per_column))


def _require_probabilities(aligned: pd.DataFrame, column: str) -> None:
    """One target column's AUC scores must lie in [0, 1], as MLE-bench's ``prepare_for_auroc_metric`` requires."""
    scores = _numeric(aligned, column, "the submission's")
    low, high = float(scores.min()), float(scores.max())
    if high > 1 or low < 0:
        found = f"a maximum of {high!r}, above 1" if high > 1 else f"a minimum of {low!r}, below 0"
        raise SubmissionError(f"AUC takes probabilities in [0, 1]: the submission's column {column!r} has {found}")


def _score_column(key: str, truth: pd.Series, predicted: pd.Series, column: str) -> float:
    if key == "accuracy":
        return accuracy(truth.to_numpy(), predicted.to_numpy())
    if key.startswith("f1"):
        average = "binary" if key == "f1" else key.split("-")[1]
        return f1(truth.to_numpy(), predicted.to_numpy(), average)
    y_true = _numeric(truth.to_frame(), column, "the answers'")
    y_pred = _numeric(predicted.to_frame(), column, "the submission's")
    if key == "auc":
        if not set(np.unique(y_true)) <= {0.0, 1.0}:
            raise ValueError(f"AUC needs 0/1 (or true/false) answers in {column!r}")
        return roc_auc(y_true, y_pred)
    if key == "qwk":
        if not np.all(np.equal(np.mod(y_pred, 1), 0)):
            raise SubmissionError(f"quadratic weighted kappa needs integer ratings in {column!r}")
        return quadratic_weighted_kappa(y_true, y_pred)
    if key == "rmsle" and (y_pred <= -1).any():
        raise SubmissionError(f"RMSLE needs predictions above -1 in {column!r}")
    functions: dict[str, Callable] = {"rmse": rmse, "rmsle": rmsle, "mae": mae, "r2": r2}
    return functions[key](y_true, y_pred)


def finite_or_error(value: float, metric: str) -> float:
    if not isinstance(value, (int, float, np.floating, np.integer)) or not math.isfinite(float(value)):
        raise SubmissionError(f"{metric} is not a finite number ({value!r})")
    return float(value)
