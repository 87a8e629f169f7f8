"""World-model fidelity metrics: properties (hypothesis) and agreement with scikit-learn as a trusted peer."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.metrics import accuracy_score, confusion_matrix, mean_absolute_error

from wmrl.outcome import BUCKET_RANK_SCORE, LADDER, VALID_BASE, VALID_SPAN, Status
from wmrl_trainer.fidelity.metrics import (STATUSES, UNGRADED, Judged, confusion, error_class, exception_match,
                                           latency, reliability, reward_by_rung, rolling, rung, status_at, summarize)

EXCEPTIONS = ("NameError", "ValueError", "KeyError", "sklearn.exceptions.NotFittedError", None)


def reward_of(status: str, rank: float) -> float:
    return VALID_BASE + VALID_SPAN * rank if status == "valid" else LADDER[Status(status)]


@st.composite
def judged_case(draw) -> Judged:
    real = draw(st.sampled_from(STATUSES))
    real_rank = draw(st.floats(0, 1))
    graded = draw(st.booleans()) or draw(st.booleans())
    predicted: tuple[str, ...] = ()
    reward = None
    if graded:
        predicted = tuple(draw(st.permutations(STATUSES))[:draw(st.integers(1, 3))])
        reward = reward_of(predicted[0], draw(st.sampled_from(sorted(BUCKET_RANK_SCORE.values()))))
    return Judged(real_status=real, real_reward=reward_of(real, real_rank),
                  real_error=draw(st.sampled_from(EXCEPTIONS)) if real == "runtime_err" else None,
                  predicted=predicted, predicted_reward=reward,
                  predicted_error=draw(st.sampled_from(EXCEPTIONS)) if predicted[:1] == ("runtime_err",) else None,
                  gated=draw(st.booleans()), latency=draw(st.floats(0, 5)))


cases = st.lists(judged_case(), min_size=0, max_size=40)


@settings(max_examples=200, deadline=None)
@given(cases)
def test_status_at_2_is_at_least_status_at_1_and_more_predictions_never_lower_it(judged):
    s1, s2, s3 = status_at(judged, 1), status_at(judged, 2), status_at(judged, 3)
    if s1 is None:
        assert s2 is None and not any(j.graded for j in judged)
    else:
        assert 0 <= s1 <= s2 <= s3 <= 1


@settings(max_examples=200, deadline=None)
@given(cases)
def test_mae_is_at_least_the_absolute_bias_on_every_rung(judged):
    for figures in reward_by_rung(judged).values():
        if figures["cases"]:
            assert figures["mae"] >= abs(figures["bias"]) - 1e-12
            assert figures["mae"] <= 1 + 1e-12


def assert_close(a, b):
    """Equal structures, floats equal up to rounding (a sum's order changes its last bits)."""
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            assert_close(a[key], b[key])
    elif isinstance(a, list):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_close(x, y)
    elif isinstance(a, float):
        assert a == pytest.approx(b, abs=1e-12)
    else:
        assert a == b


@settings(max_examples=150, deadline=None)
@given(cases, st.randoms(use_true_random=False))
def test_every_figure_is_invariant_under_a_permutation_of_the_cases(judged, rnd):
    shuffled = list(judged)
    rnd.shuffle(shuffled)
    assert_close(summarize(judged), summarize(shuffled))
    assert_close(rolling(judged), rolling(shuffled))


@settings(max_examples=150, deadline=None)
@given(cases)
def test_the_figures_agree_with_scikit_learn(judged):
    graded = [j for j in judged if j.graded]
    if graded:
        truth = [j.real_status for j in graded]
        top = [j.predicted[0] for j in graded]
        assert status_at(judged, 1) == pytest.approx(accuracy_score(truth, top))
        assert reward_by_rung(judged)["all"]["mae"] == pytest.approx(
            mean_absolute_error([j.real_reward for j in graded], [j.predicted_reward for j in graded]))
    counts = np.array(confusion(judged)["counts"])
    truth = [j.real_status for j in judged]
    top = [j.predicted[0] if j.graded else UNGRADED for j in judged]
    labels = list(STATUSES) + [UNGRADED]
    if judged:
        expected = confusion_matrix(truth, top, labels=labels)[: len(STATUSES)]
        np.testing.assert_array_equal(counts, expected)
    assert counts.sum() == len(judged)


@settings(max_examples=150, deadline=None)
@given(cases)
def test_reliability_points_hold_every_graded_case_and_their_real_mean(judged):
    points = reliability(judged)
    graded = [j for j in judged if j.graded]
    assert sum(p["cases"] for p in points) == len(graded)
    if graded:
        mean_real = sum(p["real"] * p["cases"] for p in points) / len(graded)
        assert mean_real == pytest.approx(np.mean([j.real_reward for j in graded]))
        assert [p["predicted"] for p in points] == sorted(p["predicted"] for p in points)


def test_reliability_bins_continuous_predictions_into_ten_equal_bins():
    rng = random.Random(3)
    judged = [Judged("valid", 0.5 + rng.random() / 2, predicted=("valid",), predicted_reward=rng.random())
              for _ in range(200)]
    points = reliability(judged)
    assert 1 < len(points) <= 10 and sum(p["cases"] for p in points) == 200
    for p in points:
        assert p["predicted"] <= 1


def test_exception_match_compares_classes_without_their_module_on_graded_runtime_errors():
    judged = [
        Judged("runtime_err", 0.1, "NameError", ("runtime_err",), 0.1, "NameError"),
        Judged("runtime_err", 0.1, "sklearn.exceptions.NotFittedError", ("runtime_err",), 0.1, "NotFittedError"),
        Judged("runtime_err", 0.1, "KeyError", ("runtime_err",), 0.1, "ValueError"),
        Judged("runtime_err", 0.1, "KeyError", ("valid", "runtime_err"), 0.6, None),  # top prediction is not an error
        Judged("runtime_err", 0.1, None, ("runtime_err",), 0.1, "KeyError"),  # class unknown: not counted
        Judged("runtime_err", 0.1, "KeyError"),  # ungraded: not counted
    ]
    assert exception_match(judged) == {"cases": 4, "matched": 2, "rate": 0.5}
    assert error_class(" pandas.errors.ParserError ") == "ParserError" and error_class("") is None


def test_rungs_split_valid_runs_by_their_real_quality_bucket():
    assert rung("runtime_err", 0.1) == "runtime_err"
    assert rung("valid", VALID_BASE + VALID_SPAN * 0.9) == "valid:high"
    assert rung("valid", VALID_BASE + VALID_SPAN * 0.3) == "valid:fair"
    assert rung("valid", VALID_BASE) == "valid:low"


def test_latency_leaves_the_compile_gates_cases_out():
    judged = [Judged("valid", 0.6, latency=x, gated=False) for x in (1.0, 2.0, 3.0, 4.0)]
    judged.append(Judged("syntax_err", 0.0, predicted=("syntax_err",), predicted_reward=0.0, gated=True, latency=0.0))
    figures = latency(judged)
    assert figures["cases"] == 4 and figures["mean"] == 2.5 and figures["p50"] == 2.5 and figures["max"] == 4.0
    assert figures["p90"] == pytest.approx(np.percentile([1, 2, 3, 4], 90))


def test_no_graded_case_gives_no_figure_rather_than_zero():
    judged = [Judged("valid", 0.9), Judged("runtime_err", 0.1, "NameError")]
    figures = rolling(judged)
    assert figures == {"cases": 2, "graded": 0, "status_at_1": None, "reward_mae": None, "reward_bias": None}
    with pytest.raises(ValueError):
        status_at(judged, 0)
