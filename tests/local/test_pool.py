"""The virtual-time sandbox pool (wmrl_bench.pool): FIFO, at most P at once, work conserving, persistent
across steps, the synchronous clock when the wait is unbounded; and the benchmark's virtual clock on top."""

from __future__ import annotations

import concurrent.futures as cf

import pytest
from hypothesis import given, settings, strategies as st

from wmrl_bench.async_clock import VirtualDispatcher, VirtualTime
from wmrl_bench.cost import makespan, step_cost
from wmrl_bench.pool import EPS, SlotPool, StepPlan, Timeline, replay, waited_for

durations = st.floats(0, 5, allow_nan=False)
submissions = st.lists(st.tuples(st.floats(0, 3, allow_nan=False), durations), min_size=1, max_size=40)


def _schedule(slots: int, items: list[tuple[float, float]]) -> list[tuple[float, float, float]]:
    """(submit, start, end) of gaps-then-durations ``items``: submission times are cumulative gaps."""
    pool, t, out = SlotPool(slots), 0.0, []
    for gap, duration in items:
        t += gap
        start, end = pool.place(t, duration)
        out.append((t, start, end))
    return out


def _running(schedule, t: float) -> int:
    return sum(start <= t < end for _, start, end in schedule if end > start)


@settings(max_examples=500, deadline=None)
@given(st.integers(1, 6), submissions)
def test_never_more_than_p_at_once_fifo_and_work_conserving(slots, items):
    schedule = _schedule(slots, items)
    events = sorted({x for _, start, end in schedule for x in (start, end)})
    assert all(_running(schedule, t) <= slots for t in events)  # never more than P at once
    starts = [start for _, start, _ in schedule]
    assert starts == sorted(starts)  # first come, first served
    for submit, start, end in schedule:
        assert start >= submit and end == pytest.approx(start + (end - start))
        # waiting only while every slot is busy: at each moment in [submit, start) all P slots run something
        waiting_at = [t for t in events if submit <= t < start - EPS] + ([submit] if start > submit + EPS else [])
        assert all(_running(schedule, t) == slots for t in waiting_at), (submit, start, schedule)


def test_the_pool_refuses_time_travel_and_bad_input():
    pool = SlotPool(2)
    pool.place(5.0, 1.0)
    with pytest.raises(ValueError, match="back in time"):
        pool.place(4.0, 1.0)
    with pytest.raises(ValueError, match="durations"):
        pool.place(6.0, -1.0)
    with pytest.raises(ValueError, match="slots"):
        SlotPool(0)


plans = st.lists(st.builds(StepPlan, st.floats(0, 2, allow_nan=False), st.floats(0, 2, allow_nan=False),
                           st.lists(st.lists(durations, min_size=1, max_size=4), max_size=4)), min_size=1, max_size=8)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 6), plans)
def test_an_unbounded_wait_is_the_synchronous_clock(slots, steps):
    """waitSeconds unbounded: nothing is late, the pool is empty at every step's end, and each step costs what
    cost.step_cost charges (compute + judge + the makespan of its executions on P slots)."""
    clocks = replay(steps, slots, wait=None)
    for plan, clock in zip(steps, clocks):
        flat = [d for group in plan.groups for d in group]
        assert clock.late == [] and clock.arrived == []
        assert clock.end - clock.start == pytest.approx(plan.work + plan.after + makespan(flat, slots))
        record = {"total": plan.work + plan.after, "execution": 0.0, "rows": 8, "generation": 0.0, "mode": "wmrl"}
        assert clock.end - clock.start == pytest.approx(step_cost(record, flat, slots, 0.0).total)
    assert clocks[-1].end == pytest.approx(sum(c.end - c.start for c in clocks))


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 6), plans, st.sampled_from([0.0, 0.3, 1.0]))
def test_late_groups_arrive_once_at_the_first_step_that_sees_them_finished(slots, steps, wait):
    clocks = replay(steps, slots, wait=wait)
    ends = {label: end for clock in clocks for label, end in clock.ends.items()}
    arrived_at = {}
    for k, clock in enumerate(clocks):
        assert clock.waited <= wait + EPS and clock.end == pytest.approx(clock.check_time + steps[k].after)
        for label in clock.arrived:
            assert label not in arrived_at and label[0] < k  # once, and at a later step than its own
            arrived_at[label] = k
        for label in clock.late:
            assert ends[label] > clock.check_time  # late: not finished when the trainer stopped waiting
    for label, k in arrived_at.items():
        assert ends[label] <= clocks[k].check_time + EPS
        assert all(ends[label] > clocks[j].check_time for j in range(label[0] + 1, k))  # not seen finished earlier
    late = {label for clock in clocks for label in clock.late}
    assert set(arrived_at) <= late
    if wait == 0.0:  # never waits: every step costs its own compute only
        assert all(c.waited == 0.0 for c in clocks)


def test_a_late_execution_keeps_its_slot_into_the_next_steps():
    """By hand, one slot, waitSeconds 0: step 0's 5 s execution runs from t=1 to 6 while steps 1 and 2 go on;
    step 1's execution queues behind it (6 to 7); both arrive at step 3, the first step that looks after 7."""
    timeline = Timeline(1)
    s0 = timeline.submit(1.0, [("a", [5.0])], wait=0.0)
    timeline.finish(1.0)
    assert timeline.demand() == 1  # what the next step's anchor selector sees: a is still running at t=2
    s1 = timeline.submit(1.0, [("b", [1.0])], wait=0.0)
    timeline.finish(1.0)
    assert timeline.demand() == 2  # at t=4: a running, b queued behind it
    s2 = timeline.submit(1.0, [], wait=0.0)
    timeline.finish(1.0)
    s3 = timeline.submit(2.0, [], wait=0.0)
    timeline.finish(0.0)
    assert timeline.demand() == 0  # at t=8 both are done
    assert (s0.wait_point, s0.end, s0.late, s0.ends) == (1.0, 2.0, ["a"], {"a": 6.0})
    assert (s1.wait_point, s1.end, s1.late, s1.ends) == (3.0, 4.0, ["b"], {"b": 7.0})
    assert s2.arrived == [] and s2.check_time == 5.0
    assert s3.check_time == 8.0 and s3.arrived == ["a", "b"] and timeline.late_pending == []
    # a bounded wait: the trainer waits until the last execution ends, at most the bound
    assert waited_for([3.0, 4.5], 2.0, 1.0) == 1.0 and waited_for([3.0], 2.0, 5.0) == 1.0
    assert waited_for([], 2.0, None) == 0.0


def test_the_virtual_clock_decides_lateness_and_arrival_for_the_step():
    """VirtualTime is the trainer step's waits object: durations from the table, the wait point from the
    trainer's time, lateness and arrival from the timeline; a step costs compute + judge + what it waited."""
    queue = [[4.0, 4.0], [1.0], []]
    work = iter([1.0, 0.5, 0.5])
    clock = VirtualTime(2, lambda: queue.pop(0), lambda: next(work))

    def done(n):
        futures = [cf.Future() for _ in range(n)]
        for f in futures:
            f.set_result(None)
        return futures

    first = dict(zip([(3, 0), (3, 1)], done(2)))
    assert clock.running_after(first, 2.0) == {(3, 0), (3, 1)}  # both end at 5 > 1 + 2
    step = clock.finish_step({"total": 1.2, "execution": 0.0, "rows": 4, "generation": 0.1, "mode": "wmrl"}, 1.0)
    assert step["waited"] == pytest.approx(2.0) and step["total"] == pytest.approx(1.2 + 0.1 + 2.0)
    assert step["work"] == 1.0 and step["after"] == pytest.approx(0.3) and step["groups"] == [[4.0, 4.0]]
    second = dict(zip([(0, 0)], done(1)))
    # step 1 starts at 3.3, waits from 3.8: its execution starts at 5 (both slots busy until then) and ends at 6,
    # within its 2.5 s: it waits 2.2 s, and at 6.0 it also sees step 0's group (ended at 5): it arrives
    assert clock.running_after(second, 2.5) == set()
    assert clock.finished(list(first.values()))
    step = clock.finish_step({"total": 0.5, "execution": 0.0, "rows": 4, "generation": 0.0, "mode": "wmrl"}, 1.0)
    assert step["waited"] == pytest.approx(2.2) and step["clock"]["arrived"] == [[0, 3]]
    with pytest.raises(RuntimeError, match="never late"):
        clock.finished(list(second.values()))
    dispatcher = VirtualDispatcher(type("Table", (), {"close": lambda self: None})(), clock)
    assert dispatcher.demand == 0  # at 6.0, step 1's end: every execution so far has finished
    with pytest.raises(RuntimeError, match="durations"):
        clock.running_after(dict(zip([(1, 0)], done(1))), 1.0)  # the table measured none: refused
