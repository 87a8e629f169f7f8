"""The speedup benchmark's clock: what one training step costs, the same way for every arm.

A step's cost (seconds of the trainer's machine, which waits on everything below):

* **compute**: the trainer's own measured time for the step, without the time it spent
  waiting on sandboxes (generation, world-model grading as measured for the backend in
  use, calibration, the update);
* **judge**: a modelled LLM judge. The paper's world model is the policy's own base LLM,
  so grading a rollout costs about what generating it did: ``judge_cost`` x (the step's
  generation seconds / its rollouts) x the rollouts the world model grades. Our
  ``learned`` judge costs ~1 ms; this term charges what the paper's would;
* **executions**: the makespan of the step's real executions on ``slots`` sandbox slots,
  each taking its measured time from the outcome table, handed out in submission order
  to the first free slot (what the dispatcher does). In a multi-turn step a turn's
  executions run together and the next turn waits for them: the makespans of its turns add up.

Every arm of the benchmark is synchronous (a step waits for all of its executions), so the pool is
empty at each step's end and this per-step makespan is what a pool persisting across steps charges.
With asynchronous anchors (executions still running when the next step starts) it would not be;
those are not measured yet. A run keeps each step's durations, so any pool size can be re-scored.
"""

from __future__ import annotations

import heapq
from dataclasses import asdict, dataclass
from typing import Any, Sequence


def makespan(durations: Sequence[float], slots: int) -> float:
    """When the last of ``durations`` finishes, each started in order on the first free of ``slots``."""
    if slots < 1:
        raise ValueError(f"slots must be >= 1, got {slots}")
    if any(d < 0 for d in durations):
        raise ValueError("durations must be >= 0")
    free = [0.0] * min(slots, max(1, len(durations)))
    end = 0.0
    for duration in durations:
        start = heapq.heappop(free)
        end = max(end, start + duration)
        heapq.heappush(free, start + duration)
    return end


@dataclass
class StepCost:
    compute: float
    judge: float
    executions: float

    @property
    def total(self) -> float:
        return self.compute + self.judge + self.executions

    def to_json(self) -> dict[str, float]:
        return {**asdict(self), "total": self.total}


def step_cost(record: dict[str, Any], durations: Sequence[float], slots: int, judge_cost: float) -> StepCost:
    """The cost of one step from its :class:`~wmrl_trainer.records.StepRecord` (as JSON) and its executions' durations."""
    compute = max(0.0, float(record["total"]) - float(record["execution"]))
    rows = int(record["rows"])
    graded_by_world_model = rows if record["mode"] != "real" else 0
    judge = judge_cost * float(record["generation"]) / max(1, rows) * graded_by_world_model
    return StepCost(compute, judge, sum(makespan(wave, slots) for wave in turn_waves(record, durations)))


def turn_waves(record: dict[str, Any], durations: Sequence[float]) -> list[Sequence[float]]:
    """The step's execution durations split into its turns (one wave for a single-turn step)."""
    counts = (record.get("turns") or {}).get("executions_per_turn")
    if not counts or sum(counts) != len(durations):
        return [durations]
    waves, start = [], 0
    for count in counts:
        waves.append(durations[start:start + count])
        start += count
    return waves
