import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from sklearn.isotonic import IsotonicRegression

from wmrl.debias import (OnlineDebiaser, apply_map, bias_diagnostic, bin_statistics, check_rewards,
                         fit_bucketed_isotonic, pool_adjacent_violators)

reward = st.floats(0.0, 1.0, allow_nan=False)
pairs = st.lists(st.tuples(reward, reward), min_size=2, max_size=300)
bins = st.integers(2, 40)


@settings(max_examples=150, deadline=None)
@given(pairs, bins)
def test_map_is_monotone_and_matches_sklearn_on_weighted_bin_means(data, n_bins):
    wm, env = np.array(data).T
    fitted = fit_bucketed_isotonic(wm, env, n_bins)
    x, y, n = bin_statistics(wm, env, n_bins)
    if len(x) < 2:
        assert fitted is None
        return
    assert np.all(np.diff(fitted.x) > 0) and np.all(np.diff(fitted.y) >= 0)
    reference = IsotonicRegression(out_of_bounds="clip").fit(x, y, sample_weight=n)
    grid = np.linspace(0, 1, 201)
    np.testing.assert_allclose(apply_map(fitted, grid), reference.predict(grid), rtol=0, atol=1e-9)
    assert np.all(np.diff(apply_map(fitted, grid)) >= -1e-15)


@settings(max_examples=150, deadline=None)
@given(pairs, bins, st.lists(reward, min_size=1, max_size=16))
def test_calibration_never_reorders_a_group(data, n_bins, group):
    wm, env = np.array(data).T
    fitted = fit_bucketed_isotonic(wm, env, n_bins)
    group = np.array(group)
    out = apply_map(fitted, group)
    order = np.argsort(group, kind="stable")
    assert np.all(np.diff(out[order]) >= 0)  # ties allowed, never inverted


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(-10, 10), min_size=1, max_size=50), st.data())
def test_pav_is_the_weighted_isotonic_least_squares_fit(values, data):
    weights = data.draw(st.lists(st.floats(0.1, 10), min_size=len(values), max_size=len(values)))
    fitted = pool_adjacent_violators(np.array(values), np.array(weights))
    expected = IsotonicRegression().fit(np.arange(len(values)), values, sample_weight=weights).predict(np.arange(len(values)))
    np.testing.assert_allclose(fitted, expected, atol=1e-9)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf"), -0.01, 1.01])
def test_bad_rewards_are_rejected_naming_the_entry(bad):
    with pytest.raises(ValueError, match=r"wm\[1\].*finite numbers in \[0, 1\]"):
        check_rewards([0.5, bad], "wm")
    debiaser = OnlineDebiaser()
    with pytest.raises(ValueError):
        debiaser.observe_group([0.1, bad], [0.2, 0.3])
    assert len(debiaser) == 0


@settings(max_examples=50, deadline=None)
@given(st.lists(reward, min_size=1), st.one_of(st.just(float("nan")), st.floats(allow_nan=False).filter(lambda v: not 0 <= v <= 1)))
def test_any_bad_reward_anywhere_is_rejected(values, bad):
    values = list(values)
    values.insert(len(values) // 2, bad)
    with pytest.raises(ValueError, match="rewards must be"):
        check_rewards(values, "r")


def test_breakpoints_are_the_mean_world_model_reward_of_each_populated_bin():
    """Worked by hand: 4 bins of width 0.25, the second one empty, the last one closed at 1."""
    wm = np.array([0.1, 0.2, 0.6, 0.7, 0.9, 1.0])
    env = np.array([0.3, 0.5, 0.2, 0.4, 0.8, 1.0])
    breakpoints = [0.15, 0.65, 0.95]  # mean wm of bins [0, .25), [.5, .75), [.75, 1]
    fitted_y = [0.35, 0.35, 0.9]  # bin means of env 0.4, 0.3, 0.9; the violating pair pooled (equal counts)
    debiaser = OnlineDebiaser(bins=4, min_pairs=1, refit_every=1)
    debiaser.observe_group(wm, env)
    for fitted in (fit_bucketed_isotonic(wm, env, bins=4), debiaser.map):
        np.testing.assert_allclose(fitted.x, breakpoints, rtol=0, atol=1e-12)
        np.testing.assert_allclose(fitted.y, fitted_y, rtol=0, atol=1e-12)
    np.testing.assert_allclose(debiaser.calibrate([0.0, 0.15, 0.8, 0.95, 1.0]), [0.35, 0.35, 0.625, 0.9, 0.9],
                               rtol=0, atol=1e-12)


def test_identity_until_min_pairs_then_refit_every():
    d = OnlineDebiaser(bins=10, min_pairs=200, refit_every=64, buffer_size=5000)
    rng = np.random.default_rng(0)
    for _ in range(24):  # 192 pairs
        wm = rng.random(8)
        d.observe_group(wm, wm**2)
    assert d.map is None and d.fits == 0
    np.testing.assert_array_equal(d.calibrate([0.3, 0.7]), [0.3, 0.7])
    d.observe_group(rng.random(8), rng.random(8))  # 200 pairs, 200 since fit
    assert d.fits == 1
    for _ in range(7):  # 56 more: not yet
        d.observe_group(rng.random(8), rng.random(8))
    assert d.fits == 1
    d.observe_group(rng.random(8), rng.random(8))  # 64 since the fit
    assert d.fits == 2


def test_fifo_buffer_evicts_oldest_and_keeps_group_sizes():
    d = OnlineDebiaser(min_pairs=1, refit_every=1, buffer_size=10)
    assert d.observe_group([0.1] * 6, [0.2] * 6) == 0
    assert d.observe_group([0.9] * 6, [0.8] * 6) == 2
    assert len(d) == 10 and list(d.group_sizes) == [4, 6]
    np.testing.assert_array_equal(d.wm[:4], [0.1] * 4)


def test_debiasing_removes_a_nonlinear_bias():
    rng = np.random.default_rng(1)
    d = OnlineDebiaser()
    for _ in range(400):
        real = rng.random(8)
        d.observe_group(np.sqrt(real), real)  # world model over-rates, non-linearly
    before, after, reduction = d.bias
    assert after < before and reduction > 0.8
    assert bias_diagnostic(d.wm, d.env, d.group_sizes, None)[2] == 0.0


def test_state_dict_roundtrip():
    d = OnlineDebiaser(min_pairs=8, refit_every=8)
    rng = np.random.default_rng(2)
    for _ in range(5):
        d.observe_group(rng.random(4), rng.random(4))
    e = OnlineDebiaser(min_pairs=8, refit_every=8)
    e.load_state_dict(d.state_dict())
    assert e.state_dict() == d.state_dict()
    np.testing.assert_array_equal(e.calibrate([0.2, 0.6]), d.calibrate([0.2, 0.6]))


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 30), st.lists(st.lists(reward, min_size=1, max_size=12), min_size=1, max_size=60))
def test_buffer_is_exactly_the_newest_pairs(capacity, groups):
    d = OnlineDebiaser(min_pairs=1, refit_every=5, buffer_size=capacity)
    seen, evicted = [], 0
    for g in groups:
        evicted += d.observe_group(g, g)
        seen += g
    np.testing.assert_array_equal(d.wm, seen[-capacity:])
    assert evicted == len(seen) - len(d) and sum(d.group_sizes) == len(d)
    expected = fit_bucketed_isotonic(np.array(seen[-capacity:]), np.array(seen[-capacity:]))
    d.refit()
    if expected is not None:
        np.testing.assert_allclose(d.map.x, expected.x)
        np.testing.assert_allclose(d.map.y, expected.y)
