"""A synthetic judge whose distortion of the true reward is known and controlled (issue 29, item 5).

The ``learned`` backend's frozen judge errs per script, by code features: no monotone map of
its score removes that error, so the ablation cannot tell debiasing from denoising on it. This
judge starts from the *true* real reward ``r`` of (task, script), as the outcome table has it,
and distorts it by a formula with one knob per kind of error:

    wm = clip(r ** (1 / gamma) + b_task + sigma_t * eps(task, script) + optimism * complexity(script), 0, 1)

* ``gamma``: a monotone, concave warp (``gamma = 1`` is the identity): what an isotonic map
  can undo exactly, and the only error debiasing is built for.
* ``sigma_t * eps``: ``eps`` is a standard normal fixed per (seed, task, script), hash-seeded
  (:func:`script_error`), never drawn from a shared stream: a script always gets the same
  error within a run, whatever the grading order, and every arm run at the same seed sees
  the same errors (paired comparisons). What denoising is built for.
* ``sigma_t = sigma + drift * min(1, batches / DRIFT_HORIZON)``: the noise grows during the
  run. ``batches`` counts this judge's non-empty ``grade`` calls before the current one: one a
  step in single-turn runs, one a turn in multi-turn runs. Deterministic; saved with the
  trainer's checkpoint (``state_dict``) so a resumed run goes on where it stopped.
* ``b_task``: a per-task offset, uniform on ``[-task_offset, task_offset]``, hash-seeded per
  (seed, task). Constant inside a GRPO group, so group standardisation removes it; across
  tasks no single monotone map can (a negative control for debiasing).
* ``optimism * complexity(script)``: the learned judge's own feature-driven optimism
  (:func:`wmrl_trainer.world_model.learned.complexity`): not a function of ``r``, so no
  monotone map of ``wm`` removes it (the other negative control).

**A world model, not a** ``PriorJudge``. This is a :class:`GatedWorldModel` backend rather than a
``judge=`` for :class:`LearnedWorldModel`: that model caches one judgement per (task, script), so
the noise of a script seen before could not drift, and its ``Judgement`` asks for status
probabilities and a quality that this judge would have to make up. The compile gate runs first,
as in every backend (non-compiling code is graded exactly, undistorted); :func:`outcome_of`
turns ``wm`` into an Outcome.

**Below 0.5 the reward is discrete.** A valid outcome carries a continuous rank score, so for
``wm >= 0.5`` the reported reward is ``wm`` exactly. Below 0.5 the ladder has only the rungs
0.0 (syntax_err), 0.1 (runtime_err) and 0.2 (ran_no_sub), plus 0.5 (valid, rank score 0): ``wm``
is reported as the nearest of them (ties to the lower). The map wm -> reported reward is
monotone non-decreasing, so the order of a group never flips, but below 0.5 distinct ``wm``
can tie and noise there moves a script by whole rungs. With gamma = 1 and no other error the
reported reward is the true reward exactly. Without noise, gamma 3 lifts a runtime error (0.1)
to wm 0.46, reported as 0.5, and every other reward of a compiling script above 0.5 (continuous);
gamma 6 lifts them all to wm >= 0.68.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from wmrl.outcome import LADDER, VALID_BASE, VALID_SPAN, Outcome, Status
from wmrl.tasks import Task
from wmrl_trainer.world_model.base import GatedWorldModel, Item
from wmrl_trainer.world_model.features import code_facts
from wmrl_trainer.world_model.learned import _unit_normals, complexity

__all__ = ["DRIFT_HORIZON", "JUDGE_GRID", "PREDICTIONS", "JudgeCell", "SyntheticWorldModel", "judge_cell",
           "judged_reward", "outcome_of", "reported_reward", "script_error", "synthetic_world_model", "task_offset",
           "warp"]

TrueReward = Callable[[Task, str], float]
"""The real reward of (task, script): the benchmark's is backed by the outcome table."""

DRIFT_HORIZON = 40
"""Graded batches over which ``drift`` is added in full: about halfway through a full-preset ablation
arm, which runs up to about 80 steps before its budget is spent (its anchors execute a quarter of
the rollouts the real arm's 20 steps execute), and about 80% into a quick-preset one (up to ~32)."""


@dataclass(frozen=True)
class JudgeCell:
    """One pre-registered setting of the synthetic judge's errors (see the module docstring)."""

    name: str
    gamma: float = 1.0
    sigma: float = 0.0
    task_offset: float = 0.0
    optimism: float = 0.0
    drift: float = 0.0

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a judge cell needs a name")
        if not (math.isfinite(self.gamma) and self.gamma > 0.0):
            raise ValueError(f"{self.name}: gamma must be a finite number > 0, got {self.gamma!r}")
        for field in ("sigma", "task_offset", "optimism", "drift"):
            value = getattr(self, field)
            if not (math.isfinite(value) and value >= 0.0):
                raise ValueError(f"{self.name}: {field} must be a finite number >= 0, got {value!r}")

    def sigma_at(self, batches: int) -> float:
        """The noise scale of a batch graded after ``batches`` earlier ones."""
        return self.sigma + self.drift * min(1.0, max(0, batches) / DRIFT_HORIZON)


def _grid() -> tuple[JudgeCell, ...]:
    warps = tuple(JudgeCell(f"g{g:g}-s{s:g}", gamma=g, sigma=s) for g in (1.0, 3.0, 6.0) for s in (0.0, 0.05, 0.15))
    return warps + (JudgeCell("offsets-only", task_offset=0.15), JudgeCell("optimism-only", optimism=0.2),
                    JudgeCell("drift", sigma=0.02, drift=0.2))


JUDGE_GRID: tuple[JudgeCell, ...] = _grid()
"""Pre-registered: committed in code before any run with this judge, and every cell is run and reported.
gamma in {1, 3, 6} x sigma in {0, 0.05, 0.15}, then two negative controls (a per-task offset of up to
+-0.15; optimism 0.2 x complexity) and a noise that drifts from 0.02 to 0.22 over :data:`DRIFT_HORIZON`."""

PREDICTIONS: tuple[dict[str, Any], ...] = (
    {"effect": "debias - none", "increases_with": "gamma", "cells": ("g1-s0", "g3-s0", "g6-s0"),
     "null_in": ("g1-s0", "g1-s0.05", "g1-s0.15", "offsets-only", "optimism-only"), "positive_in": ()},
    {"effect": "denoise - none", "increases_with": "sigma", "cells": ("g1-s0", "g1-s0.05", "g1-s0.15"),
     "null_in": ("g1-s0", "offsets-only"), "positive_in": ("drift",)},
)
"""The written-down predictions, fixed with :data:`JUDGE_GRID`. ``effect``: the seed-paired difference
of final held-out real reward, arm minus ``none``. ``cells``: ordered by the predicted size of the
effect, smallest first (``increases_with`` names the knob that grows along them; Page's test).
``null_in``: cells where no gain is predicted (the judge there has no error of the kind the
correction is built for; in ``offsets-only`` a map fitted across tasks even adds a little
within-group distortion, so a small loss there would not contradict it). ``positive_in``: cells
where the effect is predicted > 0 (one-sided Wilcoxon)."""


def judge_cell(name: str) -> JudgeCell:
    """The pre-registered cell called ``name``."""
    for cell in JUDGE_GRID:
        if cell.name == name:
            return cell
    raise KeyError(f"no judge cell {name!r}; the grid has {[c.name for c in JUDGE_GRID]}")


def warp(r: float, gamma: float) -> float:
    """``g_gamma(r) = r ** (1 / gamma)`` on [0, 1]: increasing, concave for gamma > 1, the identity at 1."""
    return float(min(1.0, max(0.0, r)) ** (1.0 / gamma))


def script_error(seed: int, task_name: str, code: str) -> float:
    """``eps``: a standard normal fixed per (seed, task, script), from a hash (no shared RNG stream)."""
    return float(_unit_normals("synthetic-eps", str(seed), task_name, code, n=1)[0])


def task_offset(seed: int, task_name: str, width: float) -> float:
    """``b_task``: uniform on ``[-width, width]`` per (seed, task), from a hash (``erf(z / sqrt 2)`` of a
    standard normal ``z`` is uniform on (-1, 1))."""
    if width == 0.0:
        return 0.0
    z = float(_unit_normals("synthetic-offset", str(seed), task_name, n=1)[0])
    return width * math.erf(z / math.sqrt(2.0))


def judged_reward(cell: JudgeCell, seed: int, task_name: str, code: str, r: float, batches: int = 0,
                  script_complexity: Optional[float] = None) -> float:
    """``wm`` of one compiling script with true reward ``r`` (the module docstring's formula).

    ``script_complexity`` is computed from ``code`` when the cell has optimism and it is not given.
    """
    wm = warp(r, cell.gamma) + task_offset(seed, task_name, cell.task_offset)
    sigma = cell.sigma_at(batches)
    if sigma:
        wm += sigma * script_error(seed, task_name, code)
    if cell.optimism:
        wm += cell.optimism * (complexity(code_facts(code)) if script_complexity is None else script_complexity)
    return float(min(1.0, max(0.0, wm)))


# The rewards a compiling script can get below a valid run, with the status that carries each.
_LOW_RUNGS = ((Status.SYNTAX_ERR, LADDER[Status.SYNTAX_ERR]), (Status.RUNTIME_ERR, LADDER[Status.RUNTIME_ERR]),
              (Status.RAN_NO_SUB, LADDER[Status.RAN_NO_SUB]), (Status.VALID, VALID_BASE))
_FEEDBACK = {Status.SYNTAX_ERR: "SyntaxError (predicted)", Status.RUNTIME_ERR: "the script raised (predicted)",
             Status.RAN_NO_SUB: "no submission.csv was written (predicted)"}


def outcome_of(wm: float) -> Outcome:
    """The Outcome reporting ``wm``: valid with rank score ``(wm - 0.5) / 0.5`` from 0.5 up, else the
    nearest lower rung (ties to the lower; see the module docstring)."""
    if wm >= VALID_BASE:
        score = min(1.0, (wm - VALID_BASE) / VALID_SPAN)
        return Outcome(status=Status.VALID, rank_score=score, feedback="wrote submission.csv (predicted)")
    status, _ = min(_LOW_RUNGS, key=lambda rung: abs(rung[1] - wm))  # min keeps the first (lower) of a tie
    if status is Status.VALID:
        return Outcome(status=status, rank_score=0.0, feedback="wrote submission.csv (predicted)")
    return Outcome(status=status, feedback=_FEEDBACK[status])


def reported_reward(wm: float) -> float:
    """The reward of :func:`outcome_of` ``(wm)``: the trainer's WM reward for a script judged ``wm``."""
    return outcome_of(wm).reward


class SyntheticWorldModel(GatedWorldModel):
    """The world-model protocol (``grade``/``observe``) over :func:`judged_reward`; frozen: ``observe`` learns nothing.

    ``true_reward`` is called once per distinct (task, script) of a batch; its exceptions propagate
    (a judge that cannot see the truth is a broken run, not an ungraded row). Grading is serialised:
    each call reads and advances the batch counter that drives ``drift``.
    """

    def __init__(self, cell: JudgeCell, seed: int, true_reward: TrueReward):
        super().__init__()
        self.cell, self.seed, self.true_reward = cell, int(seed), true_reward
        self.batches = 0
        self._sigma_batches = 0
        self._lock = threading.Lock()

    def grade(self, items: Sequence[Item]) -> list[Optional[Outcome]]:
        with self._lock:
            self._sigma_batches = self.batches
            if items:
                self.batches += 1
            return super().grade(items)

    def _predict(self, items: Sequence[Item]) -> list[Optional[Outcome]]:
        truth: dict[tuple[str, str], float] = {}
        for task, code in items:
            key = (task.name, code)
            if key not in truth:
                r = float(self.true_reward(task, code))
                if not (math.isfinite(r) and 0.0 <= r <= 1.0):
                    raise ValueError(f"true reward of a {task.name} script must be in [0, 1], got {r!r}")
                truth[key] = r
        return [outcome_of(judged_reward(self.cell, self.seed, task.name, code, truth[(task.name, code)],
                                         self._sigma_batches))
                for task, code in items]

    def state_dict(self) -> dict[str, Any]:
        return {"version": 1, "cell": self.cell.name, "seed": self.seed, "batches": self.batches}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("version") != 1 or state.get("cell") != self.cell.name or state.get("seed") != self.seed:
            raise ValueError("synthetic judge state: another version, cell or seed")
        with self._lock:
            self.batches = int(state["batches"])


def synthetic_world_model(cell: JudgeCell | str, seed: int, true_reward: TrueReward) -> SyntheticWorldModel:
    """The world model for ``build_trainer(config, world_model=...)``: ``cell`` (or a grid cell's name) at
    ``seed`` (the run's seed: every arm of a seed then sees the same errors)."""
    return SyntheticWorldModel(judge_cell(cell) if isinstance(cell, str) else cell, seed, true_reward)
