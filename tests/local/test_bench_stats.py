"""wmrl_bench.stats: bootstrap intervals, reach rate, curve area, Holm, Page and Wilcoxon tests."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from scipy import stats as scipy_stats

from wmrl_bench.stats import (
    area_under_curve,
    bootstrap_ci,
    holm,
    page_test,
    paired_bootstrap_ci,
    pairwise_tests,
    reach_rate,
)

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
values = st.floats(min_value=-1e3, max_value=1e3, allow_nan=False, allow_infinity=False)


# --- paired_bootstrap_ci -------------------------------------------------------------------


@FAST
@given(st.integers(min_value=2, max_value=30).flatmap(
    lambda n: st.tuples(st.lists(values, min_size=n, max_size=n), st.lists(values, min_size=n, max_size=n))),
    st.integers(min_value=0, max_value=2**32 - 1))
def test_paired_interval_contains_the_estimate(pair, seed):
    a, b = pair
    diff = np.subtract(a, b)
    assume(np.ptp(diff) > 1e-3)  # non-degenerate: the differences are not all (nearly) equal
    ci = paired_bootstrap_ci(a, b, n_resamples=400, seed=seed)
    assert ci["n"] == len(a)
    assert ci["estimate"] == pytest.approx(diff.mean())
    tol = 1e-9 * np.abs(diff).max()  # resample means are summed in a different order
    assert ci["low"] - tol <= ci["estimate"] <= ci["high"] + tol
    assert ci["low"] < ci["high"]
    assert diff.min() - tol <= ci["low"] and ci["high"] <= diff.max() + tol


@FAST
@given(st.integers(min_value=2, max_value=40), values, values)
def test_paired_interval_is_a_point_when_every_difference_is_the_same(n, c, base):
    b = [base] * n
    a = [base + c] * n
    ci = paired_bootstrap_ci(a, b, n_resamples=200, seed=1)
    assert ci["low"] == ci["high"] == ci["estimate"]
    assert ci["estimate"] == pytest.approx(c, abs=1e-9)


def test_paired_interval_shrinks_as_seeds_grow():
    rng = np.random.default_rng(7)
    widths = []
    for n in (8, 64, 512):
        a = rng.normal(1.0, 1.0, size=n)
        b = rng.normal(0.0, 1.0, size=n)
        ci = paired_bootstrap_ci(a, b, n_resamples=2000, seed=3)
        widths.append(ci["high"] - ci["low"])
    assert widths[0] > widths[1] > widths[2]
    assert widths[2] < widths[0] / 4  # ~ 1/sqrt(n): 8x fewer -> about 8x narrower


def test_paired_interval_depends_only_on_the_seed():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=12), rng.normal(size=12)
    first = paired_bootstrap_ci(a, b, n_resamples=1000, seed=42)
    assert paired_bootstrap_ci(list(a), list(b), n_resamples=1000, seed=42) == first
    assert paired_bootstrap_ci(a, b, n_resamples=1000, seed=43) != first


def test_paired_pairing_matters():
    """Shared seed effects cancel: a = b + 1 + tiny noise gives a tight interval around 1."""
    rng = np.random.default_rng(5)
    b = rng.normal(0.0, 10.0, size=20)  # big seed-to-seed spread
    a = b + 1.0 + rng.normal(0.0, 0.01, size=20)
    ci = paired_bootstrap_ci(a, b, n_resamples=2000)
    assert 0.98 < ci["low"] < ci["high"] < 1.02


@pytest.mark.parametrize("a, b, message", [
    ([1.0, 2.0, 3.0], [1.0, 2.0], "equal lengths"),
    ([1.0], [2.0], "at least 2"),
    ([], [], "at least 2"),
    ([1.0, float("nan")], [1.0, 2.0], "NaN"),
    ([1.0, 2.0], [float("nan"), 2.0], "NaN"),
])
def test_paired_refuses_bad_input(a, b, message):
    with pytest.raises(ValueError, match=message):
        paired_bootstrap_ci(a, b)


@pytest.mark.parametrize("kwargs", [{"level": 0.0}, {"level": 1.0}, {"n_resamples": 0}])
def test_paired_refuses_bad_settings(kwargs):
    with pytest.raises(ValueError):
        paired_bootstrap_ci([1.0, 2.0], [0.0, 0.0], **kwargs)


def test_higher_level_gives_a_wider_interval():
    rng = np.random.default_rng(11)
    a, b = rng.normal(size=15), rng.normal(size=15)
    narrow = paired_bootstrap_ci(a, b, level=0.5, n_resamples=2000)
    wide = paired_bootstrap_ci(a, b, level=0.99, n_resamples=2000)
    assert wide["low"] < narrow["low"] < narrow["high"] < wide["high"]


# --- bootstrap_ci --------------------------------------------------------------------------


def test_generic_bootstrap_matches_the_paired_one_for_the_mean_difference():
    rng = np.random.default_rng(2)
    a, b = rng.normal(size=9), rng.normal(size=9)
    diff = a - b
    generic = bootstrap_ci(lambda idx: diff[idx].mean(), 9, n_resamples=1500, seed=9)
    paired = paired_bootstrap_ci(a, b, n_resamples=1500, seed=9)
    assert generic["undefined_share"] == 0.0
    for key in ("estimate", "low", "high"):
        assert generic[key] == pytest.approx(paired[key], rel=1e-12, abs=1e-12)
    assert generic["n"] == paired["n"] == 9


def test_generic_bootstrap_keeps_infinite_bounds():
    times = np.array([1.0, 2.0, np.inf, 3.0, 2.5, 1.5])  # seed 2 never reached the target
    ci = bootstrap_ci(lambda idx: times[idx].mean(), len(times), n_resamples=2000, seed=0)
    assert ci["undefined_share"] == 0.0
    assert ci["estimate"] == math.inf
    assert ci["high"] == math.inf
    assert math.isfinite(ci["low"]) and 1.0 <= ci["low"] <= 3.0

    never = bootstrap_ci(lambda idx: -math.inf, 5, n_resamples=100)
    assert never["low"] == never["high"] == never["estimate"] == -math.inf
    assert never["undefined_share"] == 0.0


def test_generic_bootstrap_counts_undefined_resamples():
    data = np.arange(8.0)

    def statistic(idx):
        return math.nan if 0 in idx else float(data[idx].mean())

    ci = bootstrap_ci(statistic, 8, n_resamples=4000, seed=1)
    expected = 1 - (7 / 8) ** 8  # chance a resample contains index 0
    assert ci["undefined_share"] == pytest.approx(expected, abs=0.03)
    assert math.isnan(ci["estimate"])
    assert 1.0 <= ci["low"] <= ci["high"] <= 7.0

    none = bootstrap_ci(lambda idx: math.nan, 4, n_resamples=50)
    assert none["low"] is None and none["high"] is None and none["undefined_share"] == 1.0


def test_generic_bootstrap_sees_index_arrays_of_length_n():
    seen = []

    def statistic(idx):
        seen.append(np.asarray(idx).copy())
        return 0.0

    bootstrap_ci(statistic, 6, n_resamples=30, seed=4)
    assert len(seen) == 31
    assert np.array_equal(seen[0], np.arange(6))  # the estimate uses every seed once
    for idx in seen[1:]:
        assert idx.shape == (6,) and idx.min() >= 0 and idx.max() < 6


def test_generic_bootstrap_refuses_one_seed():
    with pytest.raises(ValueError, match="at least 2"):
        bootstrap_ci(lambda idx: 0.0, 1)


# --- reach_rate ----------------------------------------------------------------------------


def test_reach_rate():
    assert reach_rate([1.0, None, 3.0, None]) == 0.5
    assert reach_rate([None]) == 0.0
    assert reach_rate([0.0, 2.0]) == 1.0  # a time of zero still counts as reached
    with pytest.raises(ValueError):
        reach_rate([])
    with pytest.raises(ValueError, match="NaN"):
        reach_rate([1.0, float("nan")])


# --- area_under_curve ----------------------------------------------------------------------


@FAST
@given(st.lists(st.floats(min_value=0, max_value=1e3), min_size=1, max_size=10, unique=True), values,
       st.floats(min_value=0.01, max_value=2e3))
def test_area_of_a_constant_curve_is_the_constant(xs, c, extra):
    xs = sorted(xs)
    x_max = xs[0] + extra
    assert area_under_curve(xs, [c] * len(xs), x_max) == pytest.approx(c, abs=1e-9)


@FAST
@given(st.lists(st.tuples(st.floats(min_value=0, max_value=100), values), min_size=1, max_size=12,
                unique_by=lambda p: p[0]),
       st.floats(min_value=0.01, max_value=200))
def test_area_is_between_the_lowest_and_highest_point(points, extra):
    points.sort()
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    area = area_under_curve(xs, ys, xs[0] + extra)
    tol = 1e-9 * (1 + max(abs(y) for y in ys))
    assert min(ys) - tol <= area <= max(ys) + tol


def test_area_of_known_curves():
    assert area_under_curve([0.0, 1.0], [0.0, 1.0], 1.0) == pytest.approx(0.5)
    assert area_under_curve([2.0, 4.0], [0.0, 1.0], 4.0) == pytest.approx(0.5)  # starts at xs[0]
    # Ends at x=1 but x_max=2: holds y=1 over [1, 2] -> (0.5 + 1) / 2.
    assert area_under_curve([0.0, 1.0], [0.0, 1.0], 2.0) == pytest.approx(0.75)
    assert area_under_curve([0.0], [0.3], 5.0) == pytest.approx(0.3)
    # Points beyond x_max are cut: interpolate at x_max.
    assert area_under_curve([0.0, 1.0, 2.0], [0.0, 1.0, 0.0], 1.0) == pytest.approx(0.5)
    assert area_under_curve([0.0, 1.0, 2.0], [0.0, 1.0, 0.0], 1.5) == pytest.approx((0.5 + 0.375) / 1.5)
    assert area_under_curve([0.0, 2.0], [0.0, 2.0], 1.0) == pytest.approx(0.5)


@pytest.mark.parametrize("xs, ys, x_max", [
    ([0.0, 1.0, 1.0], [0.0, 1.0, 2.0], 2.0),  # not strictly increasing
    ([1.0, 0.0], [0.0, 1.0], 2.0),            # decreasing
    ([0.0, 1.0], [0.0], 2.0),                 # unequal lengths
    ([], [], 1.0),                            # empty
    ([0.0, 1.0], [0.0, 1.0], 0.0),            # x_max not beyond the start
    ([0.0, 1.0], [0.0, float("nan")], 2.0),   # NaN
])
def test_area_refuses_bad_curves(xs, ys, x_max):
    with pytest.raises(ValueError):
        area_under_curve(xs, ys, x_max)


# --- holm ----------------------------------------------------------------------------------


def holm_reference(pvalues):
    """From the definition: the adjusted p of H_i is the smallest alpha at which Holm's
    step-down procedure (reject the k-th smallest p while p_(k) <= alpha / (m - k + 1))
    rejects H_i, or 1 if none does."""
    names = list(pvalues)
    m = len(names)
    ranked = sorted(names, key=lambda k: pvalues[k])

    def rejected(alpha):
        out = set()
        for k, name in enumerate(ranked):
            if (m - k) * pvalues[name] <= alpha:  # p_(k) <= alpha / (m - k + 1), without rounding
                out.add(name)
            else:
                break
        return out

    candidates = sorted({min(1.0, (m - k) * pvalues[name]) for k, name in enumerate(ranked)} | {1.0})
    result = {}
    for name in names:
        result[name] = next((alpha for alpha in candidates if name in rejected(alpha)), 1.0)
    return result


pvalue_maps = st.dictionaries(st.text(alphabet="abcdefgh", min_size=1, max_size=3),
                              st.floats(min_value=0.0, max_value=1.0), min_size=0, max_size=8)


@settings(max_examples=150, deadline=None)
@given(pvalue_maps)
def test_holm_matches_the_definition(pvalues):
    adjusted = holm(pvalues)
    reference = holm_reference(pvalues)
    assert adjusted.keys() == pvalues.keys()
    for name in pvalues:
        assert adjusted[name] == pytest.approx(reference[name], rel=1e-12, abs=1e-15)


@settings(max_examples=150, deadline=None)
@given(pvalue_maps)
def test_holm_is_monotone_bounded_and_never_below_raw(pvalues):
    adjusted = holm(pvalues)
    for name, p in pvalues.items():
        assert p <= adjusted[name] <= 1.0
        assert adjusted[name] <= min(1.0, len(pvalues) * p)  # never worse than Bonferroni
    ranked = sorted(pvalues, key=lambda k: pvalues[k])
    for lower, higher in itertools.pairwise(ranked):
        assert adjusted[lower] <= adjusted[higher]


@settings(max_examples=40, deadline=None)
@given(pvalue_maps)
def test_holm_ignores_key_order_among_ties(pvalues):
    reversed_map = dict(reversed(list(pvalues.items())))
    assert holm(reversed_map) == holm(pvalues)


def test_holm_known_values():
    assert holm({"x": 0.01, "y": 0.04, "z": 0.03}) == pytest.approx({"x": 0.03, "y": 0.06, "z": 0.06})
    assert holm({"only": 0.2}) == {"only": 0.2}
    assert holm({"a": 0.5, "b": 0.6}) == {"a": 1.0, "b": 1.0}
    assert holm({}) == {}
    with pytest.raises(ValueError):
        holm({"a": 1.5})
    with pytest.raises(ValueError):
        holm({"a": float("nan")})


# --- page_test -----------------------------------------------------------------------------

COLUMNS = ["wmrl", "real", "none", "worldModel"]


def increasing_matrix(rows=20, seed=0):
    """Rows = seeds; per row worldModel < none < real < wmrl, with seed-level noise."""
    rng = np.random.default_rng(seed)
    level = {"worldModel": 0.0, "none": 1.0, "real": 2.0, "wmrl": 3.0}
    base = rng.normal(0.0, 5.0, size=(rows, 1))
    jitter = rng.uniform(0.0, 0.4, size=(rows, len(COLUMNS)))
    return base + np.array([level[c] for c in COLUMNS]) + jitter


def test_page_detects_the_predicted_order_and_not_its_reverse():
    data = increasing_matrix()
    order = ["worldModel", "none", "real", "wmrl"]
    up = page_test(data, order, COLUMNS)
    down = page_test(data, order[::-1], COLUMNS)
    assert up["p"] < 1e-6
    assert down["p"] > 0.99
    assert up["L"] > down["L"]
    assert up["order"] == order and up["n"] == 20


def test_page_matches_scipy_called_directly():
    rng = np.random.default_rng(3)
    data = rng.normal(size=(8, 4))
    order = ["none", "wmrl", "worldModel"]  # a subset, in a different order from the columns
    got = page_test(data, order, COLUMNS)
    direct = scipy_stats.page_trend_test(data[:, [2, 0, 3]], method="auto")
    assert got["L"] == pytest.approx(direct.statistic)
    assert got["p"] == pytest.approx(direct.pvalue)
    assert got["n"] == 8


@pytest.mark.parametrize("data, order, message", [
    (np.ones((1, 4)), ["worldModel", "none", "real"], "at least 2 rows"),
    (np.ones((5, 4)), ["worldModel", "none", "nope"], "unknown arm"),
    (np.ones((5, 4)), ["worldModel", "none"], "at least 3 arms"),
    (np.ones((5, 4)), ["worldModel", "none", "none"], "twice"),
    (np.ones((5, 3)), ["worldModel", "none", "real"], "columns"),
])
def test_page_refuses_bad_input(data, order, message):
    with pytest.raises(ValueError, match=message):
        page_test(data, order, COLUMNS)


# --- pairwise_tests ------------------------------------------------------------------------


def test_pairwise_matches_scipy_and_holm():
    data = increasing_matrix(rows=12, seed=4)
    pairs = [("wmrl", "real"), ("wmrl", "none"), ("none", "worldModel")]
    result = pairwise_tests(data, COLUMNS, pairs)
    assert [(r["a"], r["b"]) for r in result] == pairs
    for r in result:
        x, y = data[:, COLUMNS.index(r["a"])], data[:, COLUMNS.index(r["b"])]
        assert r["mean_difference"] == pytest.approx(np.mean(x - y))
        assert r["p"] == pytest.approx(scipy_stats.wilcoxon(x - y).pvalue)
        assert r["mean_difference"] > 0 and r["p"] < 0.01  # every pair ordered in all 12 seeds
    adjusted = holm({str(k): r["p"] for k, r in enumerate(result)})
    assert [r["p_holm"] for r in result] == [adjusted[str(k)] for k in range(len(result))]


def test_pairwise_identical_arms_give_p_one_and_sign_follows_the_pair_order():
    rng = np.random.default_rng(8)
    data = rng.normal(size=(10, 4))
    data[:, 1] = data[:, 0]  # "real" is a copy of "wmrl"
    result = pairwise_tests(data, COLUMNS, [("wmrl", "real"), ("none", "worldModel"), ("worldModel", "none")])
    assert result[0]["p"] == 1.0 and result[0]["p_holm"] == 1.0 and result[0]["mean_difference"] == 0.0
    assert result[1]["mean_difference"] == pytest.approx(-result[2]["mean_difference"])
    assert result[1]["p"] == pytest.approx(result[2]["p"])  # two-sided
    for r in result:
        assert r["p"] <= r["p_holm"] <= 1.0


def test_pairwise_handles_an_empty_pair_list_and_refuses_bad_pairs():
    data = np.ones((5, 4))
    assert pairwise_tests(data, COLUMNS, []) == []
    with pytest.raises(ValueError, match="unknown arm"):
        pairwise_tests(data, COLUMNS, [("wmrl", "ghost")])
    with pytest.raises(ValueError, match="itself"):
        pairwise_tests(data, COLUMNS, [("wmrl", "wmrl")])
    with pytest.raises(ValueError, match="at least 2 rows"):
        pairwise_tests(np.ones((1, 4)), COLUMNS, [("wmrl", "real")])


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(min_value=-1.0, max_value=1.0), min_size=2, max_size=9))
def test_t_interval_matches_scipy_and_brackets_the_mean(values):
    from wmrl_bench.stats import t_interval

    out = t_interval(values)
    x = np.asarray(values)
    if x.std(ddof=1) > 0:
        low, high = scipy_stats.t.interval(0.95, len(x) - 1, loc=x.mean(), scale=scipy_stats.sem(x))
        assert out["low"] == pytest.approx(low, abs=1e-9) and out["high"] == pytest.approx(high, abs=1e-9)
    assert out["low"] <= out["estimate"] <= out["high"] and out["range"] == [min(values), max(values)]


def test_mean_interval_is_a_t_interval_below_ten_seeds_and_a_bootstrap_from_ten():
    from wmrl_bench.stats import BOOTSTRAP_MIN_SEEDS, mean_interval

    assert BOOTSTRAP_MIN_SEEDS == 10 and mean_interval([0.1]) is None
    few = mean_interval([0.01, 0.02, 0.03])
    assert few["method"] == "t" and few["low"] < 0.01  # wider than the seeds' range, as a t-interval is here
    many = mean_interval(list(np.linspace(0.0, 0.04, 10)))
    assert many["method"] == "bootstrap" and 0.0 <= many["low"] <= many["high"] <= 0.04


def test_one_sided_wilcoxon_tests_the_predicted_direction():
    from wmrl_bench.stats import wilcoxon

    up = [0.01, 0.02, 0.015, 0.03, 0.005, 0.02, 0.01, 0.025]
    assert wilcoxon(up, "greater") == pytest.approx(scipy_stats.wilcoxon(up, alternative="greater").pvalue)
    assert wilcoxon(up, "greater") < 0.01 < 0.99 < wilcoxon([-d for d in up], "greater")
    assert wilcoxon([0.0, 0.0, 0.0]) == 1.0
