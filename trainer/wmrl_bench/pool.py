"""A virtual-time sandbox pool with P slots that persists across training steps (issue 29, item 4). Pure.

**The pool** (:class:`SlotPool`): executions are handed, in submission order, to the first slot that
is free (FIFO list scheduling, what the sandbox dispatcher does), each for its measured duration.
Submission times never decrease, so this is work conserving (an execution waits only while every
slot is busy) and never runs more than P at once. A slot stays taken across step boundaries: an
execution still running when its step ends keeps it while the next steps submit theirs.

**A step on the clock** (:class:`Timeline`): step k starts at ``S_k``, where step k-1 ended. The
trainer works ``work`` seconds (its own compute before it would wait, plus the modelled judge), then
its executions are submitted (where the synchronous clock of :mod:`.cost` charges them) at the wait
point ``W_k = S_k + work`` and it waits at most ``wait`` seconds: until all of them have finished, or
``W_k + wait``. Its anchor groups whose executions are not all done by then are *late*; it finishes
its compute (``after`` seconds) and the step ends at ``W_k + waited + after``. A late group *arrives*
at the first later step whose check time (its wait point plus what it waited: where the trainer
looks) is at or after the end of the group's last execution. With ``wait`` None (unbounded) no group
is late and every step costs ``work + after + makespan``: :func:`wmrl_bench.cost.step_cost` exactly.
:meth:`Timeline.demand` is what the trainer's anchor selector sees at a step's start, as a real
dispatcher's ``demand``: the executions still queued or running (a backlog throttles new anchors).

:func:`replay` runs recorded steps through a fresh timeline: the benchmark records every asynchronous
step's ``work``, ``after`` and durations, so the clock of any run can be recomputed from its result.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Any, Hashable, Optional, Sequence

EPS = 1e-12
"""Float slack for "finished by": an execution ending exactly at the deadline is on time."""


class SlotPool:
    """``slots`` sandbox slots; :meth:`place` starts each execution on the first free one."""

    def __init__(self, slots: int):
        if slots < 1:
            raise ValueError(f"slots must be >= 1, got {slots}")
        self.slots = slots
        self._free = [0.0] * slots  # when each slot is next free (a heap)
        self._last_submit = 0.0
        self._ends: list[float] = []  # every placed execution's end (a heap; pruned by :meth:`busy`)

    def place(self, submit: float, duration: float) -> tuple[float, float]:
        """(start, end) of an execution submitted at ``submit`` that takes ``duration`` seconds."""
        if duration < 0:
            raise ValueError(f"durations must be >= 0, got {duration}")
        if submit < self._last_submit - EPS:
            raise ValueError(f"submissions must not go back in time: {submit} after {self._last_submit}")
        self._last_submit = max(self._last_submit, submit)
        free = heapq.heappop(self._free)
        start = max(submit, free)
        heapq.heappush(self._free, start + duration)
        heapq.heappush(self._ends, start + duration)
        return start, start + duration

    def busy(self, t: float) -> int:
        """Executions placed and not finished by ``t`` (queued or running): the dispatcher's ``demand``. ``t``
        must not go back in time between calls."""
        while self._ends and self._ends[0] <= t + EPS:
            heapq.heappop(self._ends)
        return len(self._ends)


@dataclass
class StepClock:
    """One step on the virtual clock."""

    start: float
    wait_point: float
    waited: float
    late: list[Hashable]  # this step's groups not finished by the end of the wait
    arrived: list[Hashable]  # earlier steps' late groups that had finished by this step's check time
    ends: dict[Hashable, float] = field(default_factory=dict)  # when each of this step's groups finished
    end: Optional[float] = None

    @property
    def check_time(self) -> float:
        return self.wait_point + self.waited

    def to_json(self) -> dict[str, Any]:
        return {"start": self.start, "wait_point": self.wait_point, "waited": self.waited, "end": self.end,
                "late": [list(g) if isinstance(g, tuple) else g for g in self.late],
                "arrived": [list(g) if isinstance(g, tuple) else g for g in self.arrived]}


def waited_for(ends: Sequence[float], wait_point: float, wait: Optional[float]) -> float:
    """How long the trainer waits at ``wait_point`` for executions ending at ``ends``: until the last one ends,
    at most ``wait`` (None: no bound)."""
    needed = max(0.0, max(ends, default=wait_point) - wait_point)
    return needed if wait is None else min(max(0.0, wait), needed)


class Timeline:
    """Steps on one pool (see the module docstring): :meth:`submit` at each step's wait point, :meth:`finish`
    at its end."""

    def __init__(self, slots: int):
        self.pool = SlotPool(slots)
        self.now = 0.0  # where the next step starts
        self.steps: list[StepClock] = []
        self._late: list[tuple[Hashable, float]] = []  # (group, end of its last execution), in lateness order

    def submit(self, work: float, groups: Sequence[tuple[Hashable, Sequence[float]]], wait: Optional[float]) -> StepClock:
        """A step that worked ``work`` seconds since it started submits ``groups`` ((label, durations) in
        submission order) and waits for them at most ``wait`` seconds (None: until they have all finished)."""
        if self.steps and self.steps[-1].end is None:
            raise RuntimeError("the previous step has not finished")
        if work < 0:
            raise ValueError(f"work must be >= 0, got {work}")
        point = self.now + work
        ends = {}
        for label, durations in groups:
            ends[label] = max((self.pool.place(point, d)[1] for d in durations), default=point)
        waited = waited_for(list(ends.values()), point, wait)
        check = point + waited
        late = [label for label, end in ends.items() if end > check + EPS]
        arrived = [label for label, end in self._late if end <= check + EPS]
        self._late = [(label, end) for label, end in self._late if end > check + EPS]
        self._late += [(label, ends[label]) for label in late]
        clock = StepClock(self.now, point, waited, late, arrived, ends)
        self.steps.append(clock)
        return clock

    def finish(self, after: float) -> StepClock:
        """The current step does ``after`` more seconds of compute and ends; the next starts there."""
        if not self.steps or self.steps[-1].end is not None:
            raise RuntimeError("no step to finish")
        if after < 0:
            raise ValueError(f"after must be >= 0, got {after}")
        clock = self.steps[-1]
        clock.end = clock.check_time + after
        self.now = clock.end
        return clock

    def demand(self) -> int:
        """Executions queued or running when the current step starts (what the trainer's anchor selector sees as
        the dispatcher's demand: a backlog of late executions throttles new anchors, as in a real run)."""
        return self.pool.busy(self.now)

    @property
    def late_pending(self) -> list[Hashable]:
        """Late groups that have not arrived yet."""
        return [label for label, _ in self._late]


@dataclass(frozen=True)
class StepPlan:
    """What a step measured: its work before the wait point, its compute after it, its groups' durations."""

    work: float
    after: float
    groups: Sequence[Sequence[float]]


def replay(plans: Sequence[StepPlan], slots: int, wait: Optional[float]) -> list[StepClock]:
    """Every step of ``plans`` on a fresh ``slots``-slot timeline; groups are labelled (step, index)."""
    timeline = Timeline(slots)
    for k, plan in enumerate(plans):
        timeline.submit(plan.work, [((k, i), d) for i, d in enumerate(plan.groups)], wait)
        timeline.finish(plan.after)
    return timeline.steps
