"""Bins of the bucketed isotonic fit: bin k = [k/bins, (k+1)/bins), whatever the float rounding."""

import json
from fractions import Fraction

import numpy as np
from hypothesis import given, settings, strategies as st

from wmrl.calibration.state import CalibrationConfig, CalibrationState
from wmrl.debias import OnlineDebiaser, bin_index, bin_statistics, fit_bucketed_isotonic
from wmrl.outcome import BUCKET_RANK_SCORE, LADDER, VALID_BASE, VALID_SPAN


def ladder_rungs() -> list[float]:
    """Every reward the world model can give, plus the ends of the valid range (rank 0 and 1)."""
    rungs = set(LADDER.values())
    rungs |= {VALID_BASE + VALID_SPAN * s for s in (0.0, *BUCKET_RANK_SCORE.values(), 1.0)}
    return sorted(rungs)


def true_bin(value: float, bins: int) -> int:
    """The bin of the decimal the float stands for (its shortest repr), computed exactly."""
    return min(bins - 1, int(Fraction(repr(value)) * bins))


@settings(max_examples=300, deadline=None)
@given(st.integers(2, 20), st.data())
def test_every_edge_lands_in_the_bin_it_starts(bins, data):
    k = data.draw(st.integers(0, bins))
    expected = min(k, bins - 1)
    # the same edge, computed the ways a reward can come about (and, when the edge is a decimal of
    # at most 6 places, rounded to 6 decimals as the calibration state stores rewards)
    values = [k / bins, k * (1.0 / bins), np.linspace(0, 1, bins + 1)[k]]
    if 10**6 % Fraction(k, bins).denominator == 0:
        values.append(float(f"{k / bins:.6f}"))
    for value in values:
        assert bin_index([value], bins)[0] == expected, (value, bins)
    if k > 0:
        assert bin_index([k / bins - 1e-6], bins)[0] == k - 1
    if k < bins:
        assert bin_index([k / bins + 1e-6], bins)[0] == k


@settings(max_examples=200, deadline=None)
@given(st.integers(2, 1000), st.lists(st.floats(0.0, 1.0), min_size=1, max_size=50))
def test_bins_are_in_range_and_ordered(bins, values):
    index = bin_index(values, bins)
    assert index.dtype == np.int64 and index.min() >= 0 and index.max() <= bins - 1
    order = np.argsort(values, kind="stable")
    assert np.all(np.diff(index[order]) >= 0)
    assert bin_index([1.0], bins)[0] == bins - 1 and bin_index([0.0], bins)[0] == 0


def test_ladder_rungs_share_a_bin_only_when_they_lie_in_the_same_interval():
    rungs = ladder_rungs()
    index = bin_index(rungs, 10)
    assert index.tolist() == [true_bin(r, 10) for r in rungs]
    for i, a in enumerate(rungs):
        for j, b in enumerate(rungs):
            assert (index[i] == index[j]) == (true_bin(a, 10) == true_bin(b, 10)), (a, b)
    # the two cases float rounding used to get wrong with np.linspace edges
    assert bin_index([0.6, 0.3, VALID_BASE + VALID_SPAN * 0.2], 10).tolist() == [6, 3, 6]
    assert bin_index([0.525], 10)[0] == 5


def test_rungs_0525_and_06_are_separate_breakpoints_of_the_map():
    wm = np.array([0.1, 0.525, 0.6, 0.875] * 4)
    env = np.array([0.1, 0.5, 0.7, 0.9] * 4)
    fitted = fit_bucketed_isotonic(wm, env, bins=10)
    np.testing.assert_allclose(fitted.x, [0.1, 0.525, 0.6, 0.875])
    np.testing.assert_allclose(fitted.y, [0.1, 0.5, 0.7, 0.9])


def test_debiaser_and_bin_statistics_use_the_same_bins():
    rng = np.random.default_rng(0)
    rungs = np.array(ladder_rungs())
    wm = np.concatenate([rng.choice(rungs, 200), rng.random(100)])
    env = rng.random(len(wm))
    d = OnlineDebiaser(min_pairs=1, refit_every=1)
    d.observe_group(wm, env)
    np.testing.assert_array_equal(d._bin[d._start:d._end], bin_index(wm, 10))
    x, y, _ = bin_statistics(wm, env, 10)
    expected = fit_bucketed_isotonic(wm, env, 10)
    np.testing.assert_allclose(d.map.x, expected.x)
    np.testing.assert_allclose(d.map.x, x)


def test_saved_and_reloaded_state_has_the_same_bins_and_refits_the_same_map():
    rng = np.random.default_rng(1)
    rungs = np.array(ladder_rungs())
    state = CalibrationState(CalibrationConfig(min_pairs=8, refit_every=8))
    groups = [{"wm": rng.choice(rungs, 8).tolist(), "env": rng.choice(rungs, 8).tolist()} for _ in range(6)]
    state.observe("t", "1", groups)
    again = CalibrationState.loads(json.loads(json.dumps(state.dumps())))
    deb, other = state.debiaser, again.debiaser
    np.testing.assert_array_equal(other._bin[other._start:other._end], deb._bin[deb._start:deb._end])
    np.testing.assert_array_equal(other._bin[other._start:other._end], bin_index(deb.wm, 10))
    reloaded = OnlineDebiaser(min_pairs=8, refit_every=8)
    reloaded.load_state_dict(deb.state_dict())
    np.testing.assert_array_equal(reloaded._bin[:len(reloaded)], deb._bin[deb._start:deb._end])
    assert deb.refit() and other.refit() and reloaded.refit()
    for d in (other, reloaded):
        np.testing.assert_array_equal(d.map.x, deb.map.x)
        np.testing.assert_array_equal(d.map.y, deb.map.y)
