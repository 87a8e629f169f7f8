"""Multi-turn trajectories of one step: what each turn wrote, how it was graded, what the agent saw.

A trajectory is up to ``maxTurns`` scripts for one task. After each turn its script is
graded -- by the sandbox on anchor trajectories (in mode real, every one), by the world
model otherwise -- and the grade the trajectory *sees* becomes the next observation
(:func:`wmrl_trainer.observation.observation_text`). It ends early at the top outcome
(:func:`wmrl.outcome.is_top`), at its token budget, after a turn cut off at the policy's
``maxNewTokens`` (graded as it is, never revised), or as soon as a turn cannot be graded:
an execution that failed on the sandbox side, or a world-model answer with no usable
outcome or no feedback to show. Such a trajectory is *ungraded* (left out of the loss), never
scored zero.

Rewards are per trajectory, as in the reference implementation: the best turn's. An
anchor trajectory is also graded by the world model on every turn (with the same, real,
history in its prompt), so it gives one calibration pair: the best world-model reward
against the best real reward.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from wmrl.outcome import Outcome, Status, is_top
from wmrl.tasks import Task
from wmrl_trainer.observation import observation_text
from wmrl_trainer.records import StepRecord

STOP_REASONS = ("top", "turns", "budget", "truncated", "ungraded")


@dataclass
class Turn:
    code: str
    world_model: Optional[Outcome]
    real: Optional[Outcome]
    shown: Optional[Outcome]
    """The grade this trajectory sees: the real outcome on an anchor trajectory, the world model's otherwise."""
    observation: str


@dataclass
class Trajectory:
    task: Task
    anchor: bool
    turns: list[Turn] = field(default_factory=list)
    stop: Optional[str] = None
    """Why it ended (one of :data:`STOP_REASONS`); None while it runs."""

    @property
    def done(self) -> bool:
        return self.stop is not None

    @property
    def ungraded(self) -> bool:
        return self.stop == "ungraded"

    def history(self) -> list[tuple[str, str]]:
        """(script, observation) of every turn so far: the world model's view of the trajectory."""
        return [(t.code, t.observation) for t in self.turns]

    def add_turn(self, code: str, *, world_model: Optional[Outcome], real: Optional[Outcome], anchor: bool) -> Turn:
        if self.done:
            raise RuntimeError(f"trajectory ended ({self.stop}): no more turns")
        shown = real if anchor else world_model
        if shown is not None and not anchor and not shown.feedback.strip():
            shown = None  # a world-model answer with no feedback to show: no usable observation
        turn = Turn(code, world_model, real, shown, observation_text(shown, code) if shown is not None else "")
        self.turns.append(turn)
        if shown is None:
            self.stop = "ungraded"
        elif is_top(shown):
            self.stop = "top"
        return turn

    def end(self, reason: str) -> None:
        """End a running trajectory (``turns`` or ``budget``); an ended one keeps its reason."""
        if reason not in STOP_REASONS:
            raise ValueError(f"unknown stop reason {reason!r}")
        if not self.done:
            self.stop = reason

    def reward(self, grader: str) -> float:
        """The best turn's reward by ``grader`` (``real``, ``world_model`` or ``shown``); NaN when the
        trajectory is ungraded or a turn lacks that grade (its best would not be known)."""
        if self.ungraded or not self.turns:
            return math.nan
        grades = [getattr(t, grader) for t in self.turns]
        if any(g is None for g in grades):
            return math.nan
        return max(g.reward for g in grades)

    @property
    def best_turn(self) -> Optional[int]:
        """0-based index of the first turn with the best reward it saw; None if ungraded."""
        if self.ungraded or not self.turns:
            return None
        rewards = [t.shown.reward for t in self.turns]
        return rewards.index(max(rewards))


def repairs(trajectories: list[Trajectory]) -> tuple[int, int, int]:
    """(first-turn failures, those that had a second turn, those whose second turn was valid), by the grade
    each trajectory was shown: the repair rate is the last over the second."""
    failed_first = [t for t in trajectories if t.turns and t.turns[0].shown is not None
                    and t.turns[0].shown.status is not Status.VALID]
    retried = [t for t in failed_first if len(t.turns) >= 2]
    repaired = [t for t in retried if t.turns[1].shown is not None and t.turns[1].shown.status is Status.VALID]
    return len(failed_first), len(retried), len(repaired)


@dataclass
class Trajectories:
    """One step's trajectories, ``group_size`` per task, addressed by (group, row)."""

    step: int
    tasks: list[Task]
    group_size: int
    anchors: list[int]
    record: StepRecord
    groups: list[list[Trajectory]] = field(default_factory=list)
    executions_per_turn: list[int] = field(default_factory=list)
    """Real executions of each turn, in order (a turn's executions run together; turns one after another)."""

    def __post_init__(self) -> None:
        if not self.groups:
            anchors = set(self.anchors)
            self.groups = [[Trajectory(task, g in anchors) for _ in range(self.group_size)]
                           for g, task in enumerate(self.tasks)]

    def get(self, key: tuple[int, int]) -> Trajectory:
        return self.groups[key[0]][key[1]]

    def keys(self) -> list[tuple[int, int]]:
        return [(g, i) for g in range(len(self.groups)) for i in range(self.group_size)]

    def running(self) -> list[tuple[int, int]]:
        return [key for key in self.keys() if not self.get(key).done]

    def rewards(self, grader: str) -> np.ndarray:
        """``[n_groups, G]`` trajectory rewards by ``grader`` (see :meth:`Trajectory.reward`)."""
        return np.array([[t.reward(grader) for t in group] for group in self.groups], dtype=float)

    def first_turn_codes(self) -> list[list[str]]:
        return [[t.turns[0].code if t.turns else "" for t in group] for group in self.groups]

    def summary(self) -> dict[str, Any]:
        """Per-step turn figures for progress and metrics: mean turns, stop reasons, best turn, repairs,
        and per turn index the statuses seen and the share of valid runs.

        ``repair_rate``: of the trajectories whose first turn did not produce a valid
        submission (by the grade they saw) and that had a second turn, the share whose
        second turn did.
        """
        done = [t for group in self.groups for t in group]
        turns = [len(t.turns) for t in done]
        stops = {reason: sum(t.stop == reason for t in done) for reason in STOP_REASONS}
        best = [t.best_turn for t in done if t.best_turn is not None]
        _, retried, repaired = repairs(done)
        status_by_turn: list[dict[str, int]] = []
        for n in range(max(turns, default=0)):
            counts = {s.value: 0 for s in Status}
            for t in done:
                if len(t.turns) > n and t.turns[n].shown is not None:
                    counts[t.turns[n].shown.status.value] += 1
            status_by_turn.append(counts)
        return {
            "mean_turns": float(np.mean(turns)) if turns else None,
            "stops": stops,
            "mean_best_turn": float(np.mean(best)) + 1 if best else None,
            "repair_rate": repaired / retried if retried else None,
            "repair_attempts": retried,
            "executions_per_turn": list(self.executions_per_turn),
            "status_by_turn": status_by_turn,
            "valid_share_by_turn": [c["valid"] / sum(c.values()) if sum(c.values()) else None for c in status_by_turn],
        }
