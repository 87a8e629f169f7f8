import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from wmrl.advantages import apply_anchor_weight, grpo_advantages
from wmrl.anchors import AnchorSelector
from wmrl.denoise import DisagreementWeighter, group_disagreement

reward = st.floats(0.0, 1.0, allow_nan=False)


def group_pairs(min_size=2):
    return st.integers(min_size, 12).flatmap(
        lambda n: st.tuples(st.lists(reward, min_size=n, max_size=n), st.lists(reward, min_size=n, max_size=n)))


@settings(max_examples=100, deadline=None)
@given(st.lists(group_pairs(), min_size=1, max_size=80), st.integers(1, 40), st.floats(1.0, 3.0), st.floats(0, 3))
def test_weight_is_one_before_warmup_and_bounded_after(groups, warmup, target, extra):
    w = DisagreementWeighter(target_weight=target, max_weight=target + extra, half_life=8, warmup=warmup)
    for calibrated, real in groups:
        w.observe_group(calibrated, real)
        if w.observations < warmup:
            assert w.weight == 1.0 and w.constant is None
        else:
            assert 1.0 <= w.weight <= target + extra


def test_constant_frozen_so_weight_is_target_at_warmup():
    w = DisagreementWeighter(target_weight=2.0, max_weight=4.0, half_life=64, warmup=3)
    for s2 in (0.5, 0.5, 0.5):
        w.push(s2)
    assert w.constant == pytest.approx(1.0 / 0.5) and w.weight == pytest.approx(2.0)
    for _ in range(1000):
        w.push(10.0)
    assert w.weight == 4.0  # clipped
    for _ in range(2000):
        w.push(0.0)
    assert w.weight == pytest.approx(1.0)


def test_ewma_half_life_in_groups():
    w = DisagreementWeighter(half_life=4, warmup=1000)
    w.push(1.0)
    for _ in range(4):
        w.push(0.0)
    assert w.disagreement == pytest.approx(0.5)


def test_degenerate_groups_are_skipped():
    w = DisagreementWeighter(warmup=1)
    assert w.observe_group([0.1, 0.9], [0.5, 0.5]) is None
    assert w.observations == 0 and w.weight == 1.0
    assert group_disagreement([0.2, 0.8], [0.0, 1.0]) == pytest.approx(0.2 ** 2 / 0.25)


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 6), st.integers(1, 9), st.data())
def test_group_advantages_sum_to_zero_and_ungraded_are_excluded(n_groups, size, data):
    values = st.one_of(reward, st.just(float("nan")))
    rewards = np.array(data.draw(st.lists(st.lists(values, min_size=size, max_size=size), min_size=n_groups, max_size=n_groups)))
    adv = grpo_advantages(rewards)
    assert np.array_equal(np.isnan(adv), np.isnan(rewards))
    for row in adv:
        graded = row[~np.isnan(row)]
        if len(graded):
            assert abs(graded.sum()) <= 1e-6 * max(1.0, np.abs(graded).sum())


def test_advantages_formula_and_anchor_weight_after_normalisation():
    r = np.array([[0.0, 1.0], [0.2, 0.2], [0.5, float("nan")]])
    adv = grpo_advantages(r)
    np.testing.assert_allclose(adv[0], [-0.5 / (0.5 + 1e-4), 0.5 / (0.5 + 1e-4)])
    np.testing.assert_array_equal(adv[1], [0.0, 0.0])
    assert adv[2, 0] == 0.0 and np.isnan(adv[2, 1])
    weighted = apply_anchor_weight(adv, [0], 2.5)
    np.testing.assert_allclose(weighted[0], adv[0] * 2.5)
    np.testing.assert_array_equal(weighted[1], adv[1])
    with pytest.raises(ValueError, match="out of range"):
        apply_anchor_weight(adv, [3], 2.0)


@pytest.mark.parametrize("bad", [float("inf"), -0.1, 1.5])
def test_advantages_reject_bad_rewards(bad):
    with pytest.raises(ValueError, match=r"rewards\[0, 1\]"):
        grpo_advantages(np.array([[0.1, bad]]))


def test_anchor_selection_is_reproducible_and_respects_fraction_floor_cap():
    a, b = AnchorSelector(0.25, 1, 16, seed=7), AnchorSelector(0.25, 1, 16, seed=7)
    picks = [a.select(step, 8) for step in range(20)]
    assert picks == [b.select(step, 8) for step in range(20)]
    assert all(len(p) == 2 and p == sorted(set(p)) and all(0 <= i < 8 for i in p) for p in picks)
    assert len(set(map(tuple, picks))) > 1
    assert AnchorSelector(0.0, 1, 16).select(0, 8).__len__() == 1  # floor
    assert len(AnchorSelector(1.0, 1, 3).select(0, 8)) == 3  # concurrency cap
    assert len(AnchorSelector(1.0, 1, 16).select(0, 8, in_flight=14)) == 2
    resumed = AnchorSelector(0.25, 1, 16, seed=7)
    resumed.load_state_dict(a.state_dict())
    assert resumed.select(20, 8) == a.select(20, 8) and resumed.realized_fraction == a.realized_fraction
