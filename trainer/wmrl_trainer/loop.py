"""The WMRL step, independent of TRL: grade a batch of groups and decide every row's reward.

One step, mode ``wmrl`` (``docs/trainer.md`` has the timeline):

1. :meth:`WMRLStep.submit` (called as soon as the completions exist): the anchor
   selector picks groups; their rollouts go to the sandbox dispatcher at once
   (non-blocking futures); the world model starts grading every rollout in a worker
   thread (every bundled backend applies the compile gate first), so grading, sandbox execution and whatever the
   trainer does next (TRL's reference log-probs) overlap.
2. :meth:`WMRLStep.score`: waits for the world model, then for the anchors (bounded by
   a deadline); a row whose execution failed or timed out is ungraded (NaN, left out of
   the loss, counted in ``failed_executions``) and its group stays an anchor group on the
   real rewards of its other rows; only a group none of whose rows was executed is
   dropped for this step (it falls back to world-model rewards; ``dropped_anchors``).
   The (WM, real) pairs of the executed rows go to the calibration (non-blocking); the
   learned world model observes their real outcomes; each executed row (task, script,
   world-model outcome, real outcome) becomes a fidelity case (``spec.logging.cases``,
   :mod:`wmrl_trainer.fidelity.recorder`), whose rolling figures go to the step's record. Rewards: anchor groups -> real
   (NaN on failed rows); other groups -> calibrated WM (``debiasing.enabled``) or raw
   WM; the anchor weight comes from the calibration (``denoising.enabled``, else 1),
   which measures the disagreement on the same scores (its config's
   ``debiasingEnabled``, set from ``debiasing.enabled``; a mismatch is logged).

Off the critical path (``anchor_wait`` seconds, opt-in): in mode ``wmrl`` the trainer
waits at most that long for anchors after the world model is done. Anchor groups not
finished by then are *late*: this step trains them on (calibrated) world-model rewards
like any other group, and their (WM, real) pairs reach the calibration and the learned
world model at the first step after they finish, whose :class:`Scored` lists them as
``arrivals`` (its step, group and real rewards) for the trainer to train on
(``anchors.lateRewards``, :mod:`wmrl_trainer.late`). The paper's semantics (every anchor
group trained on real rewards, deterministic given the seed) is the default
(``anchor_wait=None``: wait up to ``execution_timeout``). Late groups still running at a
checkpoint are not saved: a restart loses at most those pairs. How the step waits is
``waits``' (:class:`RealTime`: on the wall clock; the speedup benchmark's clock is virtual).

Mode ``real`` executes every rollout (a failed execution is ungraded); mode
``worldModel`` only asks the world model (no anchors, no correction). Ungraded rows
are NaN: they never reach the loss (see :mod:`wmrl_trainer.grpo`).

Timing: every phase is what the trainer *waited* for, so phases add up to the step:
``world_model`` = time blocked on the world model, ``execution`` = time blocked on
sandboxes after the world model was done. Busy times (``world_model_busy``,
``sandbox_seconds``) are reported next to them.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import math
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import numpy as np

from wmrl.api.schema import Mode
from wmrl.outcome import Outcome
from wmrl.tasks import Task
from wmrl_trainer.fidelity.recorder import AnchorCase
from wmrl_trainer.health import distinct_per_group
from wmrl_trainer.records import StepRecord
from wmrl_trainer.turns import Trajectories

log = logging.getLogger("wmrl.trainer.loop")

_FENCE = re.compile(r"```(?:python|py)?[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)


def extract_code(completion: str) -> str:
    """The program in a completion: the first fenced code block if there is one, else the whole text.

    An unterminated fence (a completion cut off at the token limit) yields what was written.
    """
    match = _FENCE.search(completion)
    return match.group(1) if match else completion


@dataclass
class Scored:
    """Rewards of one generation batch, ``[n_groups, G]`` arrays (NaN = ungraded / not executed)."""

    rewards: np.ndarray
    anchor_groups: list[int]
    weight: float
    world_model: np.ndarray
    calibrated: np.ndarray
    real: np.ndarray
    record: StepRecord
    trajectories: Any = None
    """The step's multi-turn trajectories (:class:`wmrl_trainer.turns.Trajectories`); None for single turns."""
    wm_outcomes: Optional[list] = None
    """Single turns: the world model's outcome of every row, ``[n_groups][G]`` (None: ungraded or not asked)."""
    real_outcomes: Optional[list] = None
    """Single turns: the real outcome of every row, ``[n_groups][G]`` (None: not executed, failed or late)."""
    turn_log: Optional[dict] = None
    """Rows picked for the trajectory log -> their turns' grades (:mod:`wmrl_trainer.trajectory_log`)."""
    late_groups: list[int] = field(default_factory=list)
    """This batch's anchor groups that were late (trained on world-model rewards now, real ones to come)."""
    arrivals: list["Arrival"] = field(default_factory=list)
    """Late anchor groups of earlier batches whose real rewards arrived by this step."""
    late_expired: list[tuple[int, int]] = field(default_factory=list)
    """(step, group) of late groups given up this step (every row failed, or past the execution timeout)."""


@dataclass(frozen=True)
class Arrival:
    """A late anchor group's real rewards: group ``group`` of step ``step``'s batch, ``real`` per row (NaN: failed)."""

    step: int
    group: int
    real: np.ndarray


@dataclass
class _Pending:
    step: int
    tasks: list[Task]
    codes: list[list[str]]
    anchors: list[int]
    executions: dict[tuple[int, int], cf.Future]
    wm_future: Optional[cf.Future]
    durations: dict[tuple[int, int], float] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass
class _LateGroup:
    pending: _Pending
    group: int
    wm: np.ndarray
    expires: float
    wm_outcomes: list = field(default_factory=list)


@dataclass
class _AnchorGroup:
    """An anchor group whose executions are in (this step's, or a late one's): what calibration, the learned
    world model and the fidelity cases take from it."""

    task: Task
    codes: list[str]
    wm: np.ndarray
    real: np.ndarray
    outcomes: list
    """Real outcomes per row (None: the execution failed)."""
    wm_outcomes: list
    """The world model's outcomes per row (None: ungraded)."""
    source: dict


def _result(future: cf.Future, key: tuple[int, int]) -> Optional[Outcome]:
    """A finished execution's outcome, or None when it failed (sandbox down, HTTP error, grader error)."""
    try:
        return future.result()
    except Exception as exc:  # this execution is lost, not the step
        log.warning("execution of group %d row %d failed: %s", key[0], key[1], exc)
        return None


def _await_executions(executions: dict[tuple[int, int], cf.Future], wait: float) -> set[tuple[int, int]]:
    """Wait at most ``wait`` seconds for ``executions``; the keys of those still running."""
    _, not_done = cf.wait(list(executions.values()), timeout=wait)
    return {key for key, future in executions.items() if future in not_done}


class RealTime:
    """How a step waits for its executions: on the wall clock. (The speedup benchmark swaps in a virtual
    clock with the same two methods, :class:`wmrl_bench.async_clock.VirtualTime`.)"""

    def running_after(self, executions: dict[tuple[int, int], cf.Future], wait: float) -> set[tuple[int, int]]:
        """Wait at most ``wait`` seconds for ``executions`` (a step's, in submission order); the keys still running."""
        return _await_executions(executions, wait) if executions else set()

    def finished(self, futures: Sequence[cf.Future]) -> bool:
        """Whether every one of ``futures`` (a late group's executions) has finished by now."""
        return all(f.done() for f in futures)


def _abandon(executions: dict[tuple[int, int], cf.Future], keys: set[tuple[int, int]], wait: float) -> None:
    """Give up on the executions ``keys`` that missed the deadline (they count as failed)."""
    for key in keys:
        executions[key].cancel()
    if keys:
        log.warning("%d executions missed the %.0f s deadline", len(keys), wait)


def _nanmean(values: np.ndarray) -> Optional[float]:
    finite = values[~np.isnan(values)]
    return float(finite.mean()) if finite.size else None


def _reward_or_nan(outcome: Optional[Outcome]) -> float:
    return float("nan") if outcome is None else float(outcome.reward)


def _calibration_payload(groups: list[tuple]) -> list[dict]:
    """``calibration.observe`` groups from (task, wm, real) rows of anchor groups: only rows graded by both.

    A row whose execution failed (real NaN) or that the world model did not grade (wm NaN)
    has no pair; the group's other pairs stay together as one group, and a group left
    without a pair is not sent.
    """
    payload = []
    for task, wm, real in groups:
        both = ~(np.isnan(wm) | np.isnan(real))
        if both.any():
            payload.append({"task": task.name, "wm": wm[both].tolist(), "env": real[both].tolist()})
    return payload


class WMRLStep:
    """Grades batches of groups for one mode. Not thread-safe: one batch at a time (submit, then score)."""

    def __init__(
        self,
        mode: Mode | str,
        algorithm: Any,
        *,
        world_model: Any = None,
        dispatcher: Any = None,
        calibration: Any = None,
        selector: Any = None,
        execution_timeout: float = 660.0,
        anchor_wait: Optional[float] = None,
        clock: Callable[[], float] = time.perf_counter,
        waits: Any = None,
        cases: Any = None,
    ):
        self.mode = Mode(mode)
        self.algorithm = algorithm
        self.world_model = world_model
        self.dispatcher = dispatcher
        self.calibration = calibration
        self.selector = selector
        self.execution_timeout = float(execution_timeout)
        self.anchor_wait = None if anchor_wait is None else max(0.0, float(anchor_wait))
        self._late: list[_LateGroup] = []
        self._scores_checked = False
        self.clock = clock
        self.waits = waits if waits is not None else RealTime()
        self.cases = cases if self.mode is Mode.WMRL else None
        """Mode wmrl: the anchors' fidelity cases go here (:class:`wmrl_trainer.fidelity.recorder.CaseRecorder`)."""
        if self.mode is not Mode.REAL and world_model is None:
            raise ValueError(f"spec.mode {self.mode.value!r} needs a world model (spec.worldModel)")
        if self.mode is not Mode.WORLD_MODEL and dispatcher is None:
            raise ValueError(f"spec.mode {self.mode.value!r} needs a sandbox dispatcher (runtime.sandboxUrls or sandboxService)")
        if self.mode is Mode.WMRL and (calibration is None or selector is None):
            raise ValueError("spec.mode 'wmrl' needs a calibration and an anchor selector")
        self._wm_pool = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix="wmrl-world-model")

    # ------------------------------------------------------------------ submit
    def submit(self, step: int, tasks: Sequence[Task], codes: Sequence[Sequence[str]]) -> _Pending:
        """Start grading ``codes[g][i]`` (group ``g`` solves ``tasks[g]``): executions and world model, both non-blocking."""
        if len(tasks) != len(codes) or not codes:
            raise ValueError(f"need one task per group, got {len(tasks)} tasks for {len(codes)} groups")
        anchors = self._select_anchors(step, len(codes), len(codes[0]))
        pending = _Pending(step, list(tasks), [list(c) for c in codes], anchors, {}, None)
        for g in anchors:
            for i, code in enumerate(pending.codes[g]):
                pending.executions[(g, i)] = self._execute(pending.tasks[g], code, (g, i), pending.durations, pending.lock)
        if self.mode is not Mode.REAL:
            pending.wm_future = self._wm_pool.submit(self._grade_world_model, pending.tasks, pending.codes)
        return pending

    def _select_anchors(self, step: int, n_groups: int, group_size: int) -> list[int]:
        """The groups graded by real execution this step: all in mode real, the selector's in mode wmrl."""
        if self.mode is Mode.REAL:
            return list(range(n_groups))
        if self.mode is Mode.WMRL:
            in_flight_groups = math.ceil(self._demand() / max(1, group_size))
            return self.selector.select(step, n_groups, in_flight=in_flight_groups)
        return []

    def _execute(self, task: Task, code: str, key: tuple[int, int], durations: dict, lock: threading.Lock) -> cf.Future:
        """Start one execution; its duration lands in ``durations[key]`` when it finishes."""
        started = self.clock()
        try:
            future = self.dispatcher.run_task(task, code)
        except Exception as exc:  # a dispatcher that refuses work (closed, no endpoints) fails this execution only
            future = cf.Future()
            future.set_exception(exc)

        def done(_f: cf.Future) -> None:
            with lock:
                durations[key] = self.clock() - started

        future.add_done_callback(done)
        return future

    def _grade_world_model(self, tasks: list[Task], codes: list[list[str]]) -> tuple[np.ndarray, float, list]:
        """Raw WM rewards ``[n_groups, G]`` (NaN = ungraded), the busy seconds and the outcomes
        ``[n_groups][G]``, from one batched call."""
        started = self.clock()
        flat = [(g, i, tasks[g], code) for g, group in enumerate(codes) for i, code in enumerate(group)]
        rewards = np.full((len(codes), len(codes[0])), np.nan)
        outcomes = self.world_model.grade([(task, code) for _, _, task, code in flat])
        if len(outcomes) != len(flat):
            raise RuntimeError(f"world model returned {len(outcomes)} outcomes for {len(flat)} rollouts")
        grid: list[list[Optional[Outcome]]] = [[None] * len(group) for group in codes]
        for (g, i, _, _), outcome in zip(flat, outcomes):
            rewards[g, i] = _reward_or_nan(outcome)
            grid[g][i] = outcome
        return rewards, self.clock() - started, grid

    # ------------------------------------------------------------------ score
    def score(self, pending: _Pending) -> Scored:
        """Wait for the world model and the executions (bounded) and decide every row's reward."""
        n_groups, group_size = len(pending.codes), len(pending.codes[0])
        record = StepRecord(step=pending.step, mode=self.mode.value, rows=n_groups * group_size,
                            distinct_per_group=distinct_per_group(pending.codes))

        wm = np.full((n_groups, group_size), np.nan)
        wm_outcomes: list = [[None] * group_size for _ in range(n_groups)]
        if pending.wm_future is not None:
            t0 = self.clock()
            wm, record.world_model_busy, wm_outcomes = pending.wm_future.result()
            record.world_model = self.clock() - t0

        t0 = self.clock()
        wait = self.anchor_wait if self.mode is Mode.WMRL and self.anchor_wait is not None else self.execution_timeout
        real, outcomes, failed, late = self._collect(pending, n_groups, group_size, wait)
        record.execution = self.clock() - t0
        record.executions = len(pending.executions)
        record.failed_executions = len(failed)
        with pending.lock:
            record.sandbox_seconds = float(sum(pending.durations.values()))

        # An anchor group stays an anchor while at least one of its rows was executed: its failed rows
        # are ungraded (NaN), the others keep their real rewards. Only a group with no executed row is dropped.
        anchors = [g for g in pending.anchors
                   if g not in late and any((g, i) not in failed for i in range(group_size))]
        record.late_anchors = len(late)
        record.dropped_anchors = len(pending.anchors) - len(anchors) - len(late) if self.mode is Mode.WMRL else 0
        arrivals, expired = self._fold_late(record)  # earlier steps' late groups: a group arrives at a later step
        for g in late:  # real results still coming: fold them into calibration when they arrive
            self._late.append(_LateGroup(pending, g, wm[g].copy(), self.clock() + self.execution_timeout,
                                         list(wm_outcomes[g])))
        groups = [_AnchorGroup(pending.tasks[g], pending.codes[g], wm[g], real[g],
                               [outcomes.get((g, i)) for i in range(group_size)], list(wm_outcomes[g]),
                               {"step": pending.step, "group": g})
                  for g in anchors]
        groups += [ready for ready, _ in arrivals]
        pairs = [(group.task, group.wm, group.real) for group in groups]
        observed = [(group.task, code, outcome) for group in groups
                    for code, outcome in zip(group.codes, group.outcomes)]
        scored = self._decide(record, wm, real, anchors, pairs, observed)
        self._record_cases(record, [
            AnchorCase(group.task, code, (), predicted, outcome, {**group.source, "row": i, "turn": 1})
            for group in groups
            for i, (code, predicted, outcome) in enumerate(zip(group.codes, group.wm_outcomes, group.outcomes))
            if outcome is not None])
        scored.wm_outcomes = wm_outcomes
        scored.real_outcomes = [[outcomes.get((g, i)) for i in range(group_size)] for g in range(n_groups)]
        scored.late_groups = list(late)
        scored.arrivals = [arrival for _, arrival in arrivals]
        scored.late_expired = expired
        return scored

    def _record_cases(self, record: StepRecord, cases: list[AnchorCase]) -> None:
        """Mode wmrl: the step's executed anchor scripts to the fidelity cases; the rolling figures to the record."""
        if self.cases is not None:
            record.fidelity = self.cases.record(cases)

    def _decide(self, record: StepRecord, wm: np.ndarray, real: np.ndarray, anchors: list[int],
                pairs: list[tuple], observed: list[tuple]) -> Scored:
        """Every row's reward from the world model's and the real rewards ``[n_groups, G]``.

        ``pairs``: (task, wm, real) rows of the anchor groups whose pairs go to the calibration
        (this step's and late ones); ``observed``: (task, code, real outcome or None) for the
        learned world model. Anchor groups (``anchors``) train on their real rewards.
        """
        n_groups = wm.shape[0]
        t0 = self.clock()
        calibrated = wm.copy()
        weight = 1.0
        if self.mode is Mode.WMRL:
            payload = _calibration_payload(pairs)
            if payload:
                self.calibration.observe(payload)
            if self.algorithm.debiasing.enabled:
                calibrated = np.asarray(self.calibration.calibrate(wm), dtype=float).reshape(wm.shape)
            if self.algorithm.denoising.enabled:
                weight = float(self.calibration.weight)
            view = self.calibration.view()
            self._check_measured_scores(view)
            bias = view.get("bias") or {}
            record.bias_reduction = bias.get("reduction")
            record.calibration_stale_seconds = self.calibration.stale_seconds
        record.calibration = self.clock() - t0

        if self.mode is Mode.WMRL and observed and hasattr(self.world_model, "observe"):
            t0 = self.clock()
            for task, code, outcome in observed:
                if outcome is not None:  # a failed execution has no real outcome to learn from
                    self.world_model.observe(task, code, outcome)
            record.world_model += self.clock() - t0

        if self.mode is Mode.REAL:
            rewards = real.copy()
        else:
            rewards = calibrated.copy()
            for g in anchors:
                rewards[g] = real[g]

        record.mean_real_reward = _nanmean(real)
        record.mean_world_model_reward = _nanmean(wm) if self.mode is not Mode.REAL else None
        record.mean_calibrated_reward = _nanmean(calibrated) if self.mode is not Mode.REAL else None
        record.anchor_groups = len(anchors) if self.mode is not Mode.REAL else n_groups
        record.anchor_fraction = record.anchor_groups / n_groups
        record.weight = weight if self.mode is Mode.WMRL else None
        record.ungraded = int(np.isnan(rewards).sum())
        record.demand = self._demand()
        weighted = anchors if self.mode is Mode.WMRL else []
        return Scored(rewards, weighted, weight, wm, calibrated, real, record)

    # ------------------------------------------------------------------ multi-turn
    def begin_trajectories(self, step: int, tasks: Sequence[Task], group_size: int) -> "Trajectories":
        """Start one step of multi-turn trajectories, ``group_size`` per task (:mod:`wmrl_trainer.turns`).

        The anchor groups are chosen now: their trajectories are graded by the sandbox on
        every turn and see its real feedback; the others see the world model's.
        """
        if not tasks or group_size < 1:
            raise ValueError(f"need tasks and a group size, got {len(tasks)} tasks and group size {group_size}")
        anchors = self._select_anchors(step, len(tasks), group_size)
        record = StepRecord(step=step, mode=self.mode.value, rows=len(tasks) * group_size)
        return Trajectories(step, list(tasks), group_size, anchors, record)

    def grade_turn(self, batch: "Trajectories", rows: Sequence[tuple[int, int]], codes: Sequence[str]) -> None:
        """Grade one turn of the trajectories ``rows`` ((group, row) keys), whose new scripts are ``codes``.

        Anchor trajectories are executed (and, in mode wmrl, graded by the world model too,
        for their calibration pair); the others are graded by the world model with the
        trajectory so far in its prompt. Both run concurrently; the turn waits for both.
        """
        rows, codes = list(rows), list(codes)
        if len(rows) != len(codes):
            raise ValueError(f"{len(codes)} scripts for {len(rows)} trajectories")
        record, anchors = batch.record, set(batch.anchors)
        executions: dict[tuple[int, int], cf.Future] = {}
        durations: dict[tuple[int, int], float] = {}
        lock = threading.Lock()
        for key, code in zip(rows, codes):
            if key[0] in anchors:
                executions[key] = self._execute(batch.tasks[key[0]], code, key, durations, lock)
        wm: dict[tuple[int, int], Optional[Outcome]] = {}
        if self.mode is not Mode.REAL:
            t0 = self.clock()
            items = [(batch.tasks[key[0]], code, tuple(batch.get(key).history())) for key, code in zip(rows, codes)]
            outcomes = self.world_model.grade(items)
            if len(outcomes) != len(items):
                raise RuntimeError(f"world model returned {len(outcomes)} outcomes for {len(items)} rollouts")
            wm = dict(zip(rows, outcomes))
            record.world_model += self.clock() - t0
            record.world_model_busy += self.clock() - t0
        t0 = self.clock()
        real: dict[tuple[int, int], Optional[Outcome]] = {}
        if executions:
            running = _await_executions(executions, self.execution_timeout)
            _abandon(executions, running, self.execution_timeout)
            real = {key: None if key in running else _result(future, key) for key, future in executions.items()}
        record.execution += self.clock() - t0
        record.executions += len(executions)
        batch.executions_per_turn.append(len(executions))
        record.failed_executions += sum(real[k] is None for k in executions)
        with lock:
            record.sandbox_seconds += float(sum(durations.values()))
        for key, code in zip(rows, codes):
            batch.get(key).add_turn(code, world_model=wm.get(key), real=real.get(key), anchor=key[0] in anchors)

    def finish_trajectories(self, batch: "Trajectories") -> Scored:
        """Every trajectory's reward (its best turn's) and the step's calibration, as for single turns.

        A trajectory's world-model reward is the best of the world model's rewards over its
        turns, its real reward the best of its executed turns'; an anchor trajectory gives one
        calibration pair (world model, real), as in the reference implementation.
        """
        record = batch.record
        wm, real = batch.rewards("world_model"), batch.rewards("real")
        record.distinct_per_group = distinct_per_group(batch.first_turn_codes())
        # As for single turns: an anchor group stays one while one of its trajectories was executed to the end.
        anchors = [g for g in batch.anchors if not np.isnan(real[g]).all()]
        record.dropped_anchors = len(batch.anchors) - len(anchors) if self.mode is Mode.WMRL else 0
        pairs = [(batch.tasks[g], wm[g], real[g]) for g in anchors]
        observed = [(batch.tasks[g], turn.code, turn.real) for g in anchors
                    for t in batch.groups[g] for turn in t.turns if turn.real is not None]
        scored = self._decide(record, wm, real, anchors, pairs, observed)
        self._record_cases(record, [
            AnchorCase(batch.tasks[g], turn.code, tuple((u.code, u.observation) for u in t.turns[:n]),
                       turn.world_model, turn.real, {"step": batch.step, "group": g, "row": i, "turn": n + 1})
            for g in anchors for i, t in enumerate(batch.groups[g])
            for n, turn in enumerate(t.turns) if turn.real is not None])
        scored.trajectories = batch
        return scored

    def _collect(self, pending: _Pending, n_groups: int, group_size: int, wait: float):
        """Real rewards (NaN where not executed, failed or late), outcomes by row, failed row keys, late groups.

        Executions still running after ``wait`` seconds are abandoned (failed), except in
        mode ``wmrl`` with ``anchor_wait`` set, where their groups are *late*: trained on
        world-model rewards now, folded into the calibration when they finish.
        """
        real = np.full((n_groups, group_size), np.nan)
        outcomes: dict[tuple[int, int], Outcome] = {}
        failed: set[tuple[int, int]] = set()
        running = self.waits.running_after(pending.executions, wait)
        if not pending.executions:
            return real, outcomes, failed, []
        keep_late = self.mode is Mode.WMRL and self.anchor_wait is not None
        late = sorted({key[0] for key in running}) if keep_late else []
        if not keep_late:
            _abandon(pending.executions, running, wait)
            failed |= running
        for key, future in pending.executions.items():
            if key[0] in late or key in running:  # late groups are collected whole, once they have finished
                continue
            outcome = _result(future, key)
            if outcome is None:
                failed.add(key)
            else:
                outcomes[key] = outcome
                real[key] = outcome.reward
        return real, outcomes, failed, late

    def _fold_late(self, record: StepRecord) -> tuple[list[tuple["_AnchorGroup", Arrival]], list[tuple[int, int]]]:
        """Late anchor groups whose executions have all finished, with their :class:`Arrival`, and the (step,
        group) of those given up (expired, or no row executed).

        As for a group on time, failed rows are left out (outcome ``None``, real reward NaN) and the
        group is dropped only when none of its rows was executed.
        """
        ready, waiting, expired = [], [], []
        for item in self._late:
            futures = [item.pending.executions[(item.group, i)] for i in range(len(item.wm))]
            if self.waits.finished(futures):
                outcomes = [_result(f, (item.group, i)) for i, f in enumerate(futures)]
                with item.pending.lock:
                    record.sandbox_seconds += sum(item.pending.durations.get((item.group, i), 0.0)
                                                  for i in range(len(futures)))
                if any(o is not None for o in outcomes):
                    real = np.array([_reward_or_nan(o) for o in outcomes], dtype=float)
                    ready.append((_AnchorGroup(item.pending.tasks[item.group], item.pending.codes[item.group],
                                               item.wm, real, outcomes, item.wm_outcomes,
                                               {"step": item.pending.step, "group": item.group, "late": True}),
                                  Arrival(item.pending.step, item.group, real)))
                else:
                    record.dropped_anchors += 1
                    expired.append((item.pending.step, item.group))
            elif self.clock() > item.expires:
                for f in futures:
                    f.cancel()
                record.dropped_anchors += 1
                expired.append((item.pending.step, item.group))
            else:
                waiting.append(item)
        self._late = waiting
        record.late_folded = len(ready)
        return ready, expired

    def _check_measured_scores(self, view: dict) -> None:
        """Warn once when the calibration measures the disagreement on other scores than this trainer uses.

        The service measures it on calibrated world-model rewards unless its config says
        ``debiasingEnabled: false`` (set from ``spec.algorithm.debiasing.enabled`` when the
        state is created; a stored state keeps its own config).
        """
        if self._scores_checked or not self.algorithm.denoising.enabled or self.calibration.stale_seconds is None:
            return  # no weight used, or no answer from the service yet (its view is the default one)
        self._scores_checked = True
        measured_calibrated = bool((view.get("config") or {}).get("debiasingEnabled", True))
        if measured_calibrated != bool(self.algorithm.debiasing.enabled):
            log.warning("the calibration measures the anchor disagreement on %s world-model rewards but this run "
                        "trains on %s ones (spec.algorithm.debiasing.enabled=%s): the anchor weight follows the "
                        "wrong scores; the calibration's config comes from the run that created its state",
                        "calibrated" if measured_calibrated else "raw",
                        "calibrated" if self.algorithm.debiasing.enabled else "raw",
                        str(self.algorithm.debiasing.enabled).lower())

    def _demand(self) -> int:
        try:
            return int(self.dispatcher.demand) if self.dispatcher is not None else 0
        except Exception:  # the demand is advisory (autoscaler input); never fail a step over it
            return 0

    def close(self) -> None:
        self._wm_pool.shutdown(wait=False, cancel_futures=True)
