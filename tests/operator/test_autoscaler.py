"""The autoscaler's decision function: HPA-like, bounds always hold (hypothesis)."""

from hypothesis import given, settings, strategies as st

from wmrl_operator.autoscaler import Recommendations, demand_of, desired_replicas


def test_scales_up_immediately_to_cover_demand():
    assert desired_replicas(10, 4, 1, 8, current=1, history=[], now=0, stabilization_seconds=60) == 3


def test_scale_down_waits_for_the_window():
    history = [(0.0, 6)]
    assert desired_replicas(0, 1, 1, 8, current=6, history=history, now=30, stabilization_seconds=60) == 6
    assert desired_replicas(0, 1, 1, 8, current=6, history=history, now=61, stabilization_seconds=60) == 1


def test_no_history_treats_current_as_recent():
    assert desired_replicas(0, 1, 1, 8, current=5, history=[], now=100, stabilization_seconds=60) == 5


def test_suspended_is_zero_even_below_min():
    assert desired_replicas(50, 1, 2, 8, current=5, history=[(0, 8)], now=1, stabilization_seconds=60, suspended=True) == 0


def test_recommendations_memory_end_to_end():
    recs = Recommendations()
    key = ("ns", "r")
    assert recs.decide(key, 0, 1, 1, 8, current=1, now=0, stabilization_seconds=10) == 1
    assert recs.decide(key, 7, 1, 1, 8, current=1, now=1, stabilization_seconds=10) == 7
    assert recs.decide(key, 0, 1, 1, 8, current=7, now=5, stabilization_seconds=10) == 7
    assert recs.decide(key, 0, 1, 1, 8, current=7, now=12, stabilization_seconds=10) == 1


def test_demand_of_status():
    assert demand_of(None) == 0
    assert demand_of({"progress": {"sandboxDemand": 12}}) == 12
    assert demand_of({"progress": {"sandboxDemand": "junk"}}) == 0
    assert demand_of({"progress": {"sandboxDemand": -3}}) == 0


bounds = st.tuples(st.integers(0, 50), st.integers(0, 50)).map(sorted)


@settings(max_examples=300, deadline=None)
@given(bounds=bounds, demand=st.integers(-5, 10_000), slots=st.integers(1, 64), current=st.integers(0, 200),
       history=st.lists(st.tuples(st.floats(0, 1000), st.integers(0, 200)), max_size=20),
       now=st.floats(0, 2000), window=st.floats(0, 600))
def test_bounds_always_hold(bounds, demand, slots, current, history, now, window):
    lo, hi = bounds
    got = desired_replicas(demand, slots, lo, hi, current, history, now, window)
    assert lo <= got <= hi


@settings(max_examples=200, deadline=None)
@given(bounds=bounds, demand=st.integers(0, 10_000), slots=st.integers(1, 64), current=st.integers(0, 50),
       history=st.lists(st.tuples(st.floats(0, 1000), st.integers(0, 50)), max_size=20), now=st.floats(0, 2000))
def test_demand_is_always_covered_within_bounds(bounds, demand, slots, current, history, now):
    lo, hi = bounds
    got = desired_replicas(demand, slots, lo, hi, current, history, now, 60)
    assert got >= min(hi, -(-demand // slots))


@settings(max_examples=200, deadline=None)
@given(demands=st.lists(st.integers(0, 100), min_size=1, max_size=30), window=st.integers(1, 20))
def test_never_flaps_within_the_window(demands, window):
    """Between two consecutive decisions less than a window apart, a scale-down never follows a scale-up."""
    recs = Recommendations()
    current, moves = 1, []
    for t, demand in enumerate(demands):
        new = recs.decide(("n", "r"), demand, 1, 1, 100, current, float(t), float(window))
        if new != current:
            moves.append((t, new - current))
        current = new
    for (t1, d1), (t2, d2) in zip(moves, moves[1:]):
        if d1 > 0 and d2 < 0:
            assert t2 - t1 > window - 1
