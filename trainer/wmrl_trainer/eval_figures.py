"""The figures of a held-out evaluation, all pure: per task from its trajectories, then per
category and overall from the tasks.

Per task (:func:`task_figures`), over its G sampled trajectories (avg@G), each graded by real
execution, a trajectory's figures being those of its best turn:

* ``mean_reward``: the mean best-turn reward;
* ``valid_rate``: the share of trajectories with a valid submission at some turn;
* ``mean_best_position``: over those valid trajectories, the mean of each one's best leaderboard
  position in [0, 1] (None when none is valid);
* ``percentile``: the leaderboard percentile, ``valid_rate x mean_best_position`` (the
  reference's ``valid_rate x mean_best_position_valid``; 0 when no trajectory is valid), which is
  the mean over all trajectories of their best position, an invalid one counting 0;
* ``medals`` (tasks whose collection has a medal leaderboard; else None): the share of
  trajectories whose best medal is gold, silver, bronze, and ``any``;
* ``best_position``: the best position of any valid run.

A task whose trajectories were not all graded (an execution failed on the sandbox side) has
``complete`` false and none of these figures: a partial task is never a number.

Per category and overall (:func:`aggregate`): the mean over tasks of each figure (every task
weighs the same; ``mean_best_position`` over the tasks that have one, ``any_medal`` over the
tasks with medals), with the number of tasks.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Optional, Sequence

from wmrl.leaderboards import MEDALS
from wmrl.outcome import Status
from wmrl.tasks import CATEGORIES
from wmrl_trainer.turns import Trajectory

FIGURES = ("mean_reward", "valid_rate", "mean_best_position", "percentile", "any_medal")
"""What :func:`aggregate` averages per category and overall."""


def _mean(values: Sequence[float]) -> Optional[float]:
    return sum(values) / len(values) if values else None


def best_valid(trajectory: Trajectory) -> tuple[Optional[float], Optional[str]]:
    """(best leaderboard position, best medal) over a trajectory's valid real turns; (None, None) if none is valid."""
    valid = [t.real for t in trajectory.turns if t.real is not None and t.real.status is Status.VALID]
    if not valid:
        return None, None
    position = max(o.rank_score if o.rank_score is not None else 0.0 for o in valid)
    medals = [o.medal for o in valid if o.medal is not None]
    return position, min(medals, key=MEDALS.index) if medals else None


def task_figures(trajectories: Sequence[Trajectory], *, category: str = "other",
                 has_medals: bool = False) -> dict[str, Any]:
    """One task's figures (module docstring) from its trajectories."""
    rewards = [t.reward("real") for t in trajectories]
    graded = [r for r in rewards if not math.isnan(r)]
    complete = bool(trajectories) and len(graded) == len(trajectories)
    best = [best_valid(t) for t in trajectories]
    positions = [p for p, _ in best if p is not None]
    figures: dict[str, Any] = {
        "category": category,
        "complete": complete,
        "samples": len(trajectories),
        "graded": len(graded),
        "mean_reward": None, "valid_rate": None, "mean_best_position": None, "percentile": None,
        "best_position": None, "medals": None,
    }
    if not complete:
        return figures
    valid_rate = len(positions) / len(trajectories)
    mean_position = _mean(positions)
    figures.update(mean_reward=_mean(graded), valid_rate=valid_rate, mean_best_position=mean_position,
                   percentile=valid_rate * (mean_position or 0.0), best_position=max(positions) if positions else None)
    if has_medals:
        shares = {m: sum(medal == m for _, medal in best) / len(trajectories) for m in MEDALS}
        figures["medals"] = {**shares, "any": sum(shares.values())}
    return figures


def _figure(task: Mapping[str, Any], name: str) -> Optional[float]:
    if name == "any_medal":
        return (task.get("medals") or {}).get("any")
    return task.get(name)


def summary_of(tasks: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The mean of each of :data:`FIGURES` over ``tasks`` (those that have it), and their count."""
    out: dict[str, Any] = {"tasks": len(tasks)}
    for name in FIGURES:
        out[name] = _mean([v for v in (_figure(t, name) for t in tasks) if v is not None])
    return out


def aggregate(per_task: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """``overall`` and ``by_category`` (categories in :data:`CATEGORIES` order, only those present)
    of complete tasks' figures; ``overall`` and ``by_category`` are None unless every task is complete."""
    tasks = list(per_task.values())
    if not tasks or not all(t.get("complete") for t in tasks):
        return {"overall": None, "by_category": None}
    present = [c for c in CATEGORIES if any(t["category"] == c for t in tasks)]
    return {"overall": summary_of(tasks),
            "by_category": {c: summary_of([t for t in tasks if t["category"] == c]) for c in present}}
