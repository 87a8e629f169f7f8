"""The speedup benchmark's clock for asynchronous anchors: :class:`VirtualTime`, the trainer step's ``waits``.

In an asynchronous run (``anchors.waitSeconds`` set) whether an anchor group is late, and when a late
one arrives, must follow the benchmark's clock, not this machine's: executions come from the outcome
table at once. :class:`VirtualTime` is what :class:`wmrl_trainer.loop.WMRLStep` asks instead of the
wall clock (``running_after``, ``finished``): it places each step's executions, with their measured
durations, on a :class:`wmrl_bench.pool.Timeline` of P slots that persists across steps, at the step's
wait point (the trainer's own time so far in the step plus the modelled judge), and answers from
there. After the step, :meth:`VirtualTime.finish_step` ends it on the clock; its cost is the
trainer's compute and judge plus what it waited on the timeline. :class:`VirtualDispatcher` gives the
trainer the timeline's ``demand`` (executions queued or running at the step's start) instead of the
table's 0, so that a backlog of late executions throttles new anchors as a real dispatcher's demand
does (:meth:`wmrl.anchors.AnchorSelector.count`).
"""

from __future__ import annotations

import concurrent.futures as cf
from typing import Any, Callable, Optional

from wmrl_bench.cost import step_cost
from wmrl_bench.pool import StepClock, Timeline


class VirtualTime:
    """``running_after`` / ``finished`` of :class:`wmrl_trainer.loop.RealTime` on a P-slot virtual timeline.

    ``durations()``: the measured seconds of the executions asked for since the last call, in submission
    order (:meth:`wmrl_bench.outcome_table.TableDispatcher.take_durations`); ``work()``: the trainer's
    seconds so far in the current step, its modelled judge included (the wait point's offset).
    """

    def __init__(self, slots: int, durations: Callable[[], list[float]], work: Callable[[], float]):
        self.timeline = Timeline(slots)
        self.slots = slots
        self._durations, self._work = durations, work
        self._labels: dict[int, tuple[int, int]] = {}  # id(future) of a late group's execution -> (step, group)
        self._arrived: set[tuple[int, int]] = set()
        self._step = 0
        self._work_at_wait: Optional[float] = None
        self._groups: list[list[float]] = []

    def running_after(self, executions: dict[tuple[int, int], cf.Future], wait: float) -> set[tuple[int, int]]:
        """The keys of ``executions`` (this step's, in submission order) still running after ``wait`` virtual seconds."""
        if self._work_at_wait is not None:
            raise RuntimeError("a step waited twice before it finished")
        work = float(self._work())
        cf.wait(list(executions.values()))  # table hits at once; a miss runs for real (the trainer's execution phase)
        durations = self._durations()
        if len(durations) != len(executions):
            raise RuntimeError(f"{len(durations)} measured durations for {len(executions)} executions")
        by_group: dict[int, list[float]] = {}
        for (group, _), seconds in zip(executions, durations):
            by_group.setdefault(group, []).append(seconds)
        clock = self.timeline.submit(work, [((self._step, g), d) for g, d in by_group.items()], wait)
        for key, future in executions.items():
            if (self._step, key[0]) in clock.late:
                self._labels[id(future)] = (self._step, key[0])
        self._arrived = set(clock.arrived)
        self._work_at_wait, self._groups = work, list(by_group.values())
        return {key for key in executions if (self._step, key[0]) in clock.late}

    def finished(self, futures: list[cf.Future]) -> bool:
        """Whether the late group of these executions had finished by this step's check time."""
        label = self._labels.get(id(futures[0])) if futures else None
        if label is None:
            raise RuntimeError("finished() asked about executions that were never late")
        if label in self._arrived:
            for future in futures:
                self._labels.pop(id(future), None)
            return True
        return False

    def finish_step(self, record: dict[str, Any], judge_cost: float) -> dict[str, Any]:
        """End the step whose :class:`~wmrl_trainer.records.StepRecord` (as JSON) is ``record``: its cost on the
        clock (``compute + judge + waited``) and what :func:`wmrl_bench.pool.replay` needs to recompute it."""
        cost = step_cost(record, [], self.slots, judge_cost)  # compute and judge, no executions: they are ours
        work = self._work_at_wait if self._work_at_wait is not None else cost.compute + cost.judge
        if self._work_at_wait is None:  # a step that never waited (no anchors asked): all of it is work
            self.timeline.submit(work, [], 0.0)
        after = max(0.0, cost.compute + cost.judge - work)
        clock: StepClock = self.timeline.finish(after)
        self._step += 1
        self._work_at_wait, groups, self._groups = None, self._groups, []
        return {"compute": cost.compute, "judge": cost.judge, "work": work, "after": after,
                "waited": clock.waited, "total": clock.end - clock.start, "groups": groups,
                "clock": clock.to_json(), "late_pending": len(self.timeline.late_pending)}


class VirtualDispatcher:
    """The trainer's dispatcher (``run_task``, ``demand``, ``close``): executions from ``inner`` (the outcome
    table), ``demand`` from the virtual clock ``time``."""

    def __init__(self, inner: Any, time: VirtualTime):
        self.inner, self.time = inner, time

    def run_task(self, task: Any, code: str, run_timeout: Optional[float] = None) -> cf.Future:
        return self.inner.run_task(task, code, run_timeout)

    @property
    def demand(self) -> int:
        return self.time.timeline.demand()

    def close(self) -> None:
        self.inner.close()
