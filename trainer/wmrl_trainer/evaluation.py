"""Held-out evaluation: trajectories sampled on tasks never trained on, graded by REAL execution.

One evaluation, used by the trainer (``spec.evaluation``, :mod:`wmrl_trainer.trainer`) and
by ``wmrl run`` (:mod:`wmrl_trainer.local`):

* act (:class:`HeldOutEvaluator`): sample ``samples`` trajectories per task from the current
  policy, ``maxTurns`` turns as trained (:func:`wmrl_trainer.sampling.sample_solutions` for
  one turn, :func:`~wmrl_trainer.sampling.sample_trajectories` for several, each turn's real
  feedback shown to the next), and execute every script through the run's sandbox dispatcher
  with at most ``max_concurrent`` executions in flight (:class:`BoundedGrader`);
* decide (:func:`summarize`, pure): the report -- mean real reward (avg@samples, pooled over
  tasks), per task the mean reward, valid rate (share of trajectories with a valid
  submission at some turn), best leaderboard position and samples, and the cost (seconds,
  executions) apart from training's.

An evaluation in which an execution failed on the sandbox side (pod down, connection
refused, dispatcher closed) or sampling raised is *partial*: ``complete`` false, ``reward``
None and ``partial`` saying why. It stops submitting executions at the first failure. A
partial evaluation is never a number: the trainer keeps ``heldOutReward`` at the last
complete one. Sampling forks torch's RNG streams with a fixed seed (common random numbers
across evaluations), so evaluating never changes what training draws.
"""

from __future__ import annotations

import concurrent.futures as cf
import math
import threading
import time
from typing import Any, Optional, Sequence

from wmrl.outcome import Outcome, Status
from wmrl.tasks import Task
from wmrl_trainer.sampling import sample_solutions, sample_trajectories
from wmrl_trainer.turns import Trajectory, repairs


def _mean(values: Sequence[float]) -> Optional[float]:
    return sum(values) / len(values) if values else None


class BoundedGrader:
    """Real outcomes of (task, script) items through ``dispatcher``, at most ``limit`` in flight.

    Identical (task, script) items are executed once (within a call, and across calls when a
    ``cache`` dict is given). ``failures`` collects why executions failed; after the first
    failure nothing more is submitted (the evaluation is partial anyway) and the remaining
    items are ungraded (None).
    """

    def __init__(self, dispatcher: Any, limit: int, cache: Optional[dict] = None):
        if limit < 1:
            raise ValueError(f"max_concurrent must be >= 1, got {limit}")
        self.dispatcher, self.limit = dispatcher, limit
        self.cache: dict[tuple[str, str], Outcome] = cache if cache is not None else {}
        self.keep = cache is not None
        self.failures: list[str] = []
        self.executed = 0

    def _submit(self, task: Task, code: str, slots: threading.Semaphore) -> cf.Future:
        slots.acquire()
        try:
            future = self.dispatcher.run_task(task, code)
        except Exception as exc:  # a closed dispatcher raises at submission
            slots.release()
            future = cf.Future()
            future.set_exception(exc)
            return future
        future.add_done_callback(lambda _: slots.release())
        return future

    def __call__(self, items: Sequence[tuple[Task, str]]) -> list[Optional[Outcome]]:
        known = dict(self.cache)
        todo = {(t.name, code): t for t, code in items if (t.name, code) not in known}
        slots = threading.Semaphore(self.limit)
        futures: dict[tuple[str, str], cf.Future] = {}
        for key, task in todo.items():
            if self.failures or any(f.done() and _failure(k, f) for k, f in futures.items()):
                break  # partial already: do not load the pool with executions that cannot make it whole
            futures[key] = self._submit(task, key[1], slots)
        cf.wait(list(futures.values()))  # each execution is bounded by the dispatcher (timeout, retries)
        self.executed += len(futures)
        for key, future in futures.items():
            failure = _failure(key, future)
            if failure is not None:
                self.failures.append(failure)
                continue
            known[key] = future.result()
            if self.keep:
                self.cache[key] = future.result()
        if len(futures) < len(todo) and not self.failures:  # pragma: no cover - a break implies a failure
            self.failures.append("executions were not submitted")
        return [known.get((t.name, code)) for t, code in items]


def _failure(key: tuple[str, str], future: cf.Future) -> Optional[str]:
    """Why a finished execution has no outcome, or None when it has one."""
    if future.cancelled():
        return f"execution of a {key[0]} script was cancelled"
    exc = future.exception()
    if exc is not None:
        return f"execution of a {key[0]} script failed: {type(exc).__name__}: {exc}"
    if future.result() is None:
        return f"execution of a {key[0]} script returned no outcome"
    return None


def task_figures(trajectories: Sequence[Trajectory]) -> dict[str, Any]:
    """Per-task figures of one task's trajectories (real grades): mean reward, valid rate, best position."""
    rewards = [t.reward("real") for t in trajectories]
    graded = [r for r in rewards if not math.isnan(r)]
    valid = [any(turn.real is not None and turn.real.status is Status.VALID for turn in t.turns)
             for t in trajectories]
    positions = [turn.real.rank_score for t in trajectories for turn in t.turns
                 if turn.real is not None and turn.real.status is Status.VALID and turn.real.rank_score is not None]
    return {
        "mean_reward": _mean(graded),
        "valid_rate": sum(valid) / len(valid) if valid else None,
        "best_position": max(positions) if positions else None,
        "samples": len(trajectories),
        "graded": len(graded),
    }


def summarize(tasks: Sequence[Task], trajectories: Sequence[Trajectory], *, failures: Sequence[str],
              executed: int, seconds: float, max_turns: int) -> dict[str, Any]:
    """The report of one evaluation (module docstring): pure, from its trajectories and what failed."""
    per_task = {task.name: task_figures([t for t in trajectories if t.task.name == task.name]) for task in tasks}
    rewards = [t.reward("real") for t in trajectories]
    graded = [r for r in rewards if not math.isnan(r)]
    complete = not failures and len(graded) == len(trajectories) and bool(trajectories)
    partial = None
    if not complete:
        reason = failures[0] if failures else ("no trajectory sampled" if not trajectories
                                               else f"{len(trajectories) - len(graded)} trajectories ungraded")
        more = f" (and {len(failures) - 1} more failures)" if len(failures) > 1 else ""
        partial = f"{len(graded)} of {len(trajectories)} trajectories graded: {reason}{more}"
    point: dict[str, Any] = {
        "complete": complete,
        "partial": partial,
        "reward": _mean(graded) if complete else None,
        "by_task": {name: figures["mean_reward"] for name, figures in per_task.items()},
        "tasks": per_task,
        "samples": len(trajectories),
        "graded": len(graded),
        "executed": executed,
        "failed_executions": len(failures),
        "distinct_scripts": len({turn.code for t in trajectories for turn in t.turns}),
        "distinct_scripts_by_task": {task.name: len({turn.code for t in trajectories if t.task.name == task.name
                                                     for turn in t.turns}) for task in tasks},
        "eval_seconds": seconds,
    }
    if max_turns > 1:
        firsts = [t.turns[0].real.reward for t in trajectories if t.turns and t.turns[0].real is not None]
        failed_first, retried, repaired = repairs(list(trajectories))  # what they saw is the real outcome
        point.update({
            "first_turn_reward": _mean(firsts),
            "mean_turns": _mean([len(t.turns) for t in trajectories]),
            "first_turn_failures": failed_first,
            "repair_attempts": retried,
            "repair_rate": repaired / retried if retried else None,
        })
    return point


def single_turn_trajectories(items: Sequence[tuple[Task, str]], outcomes: Sequence[Optional[Outcome]]) -> list[Trajectory]:
    """One-turn trajectories of sampled (task, script) items and their real outcomes (None: not executed)."""
    found = []
    for (task, code), outcome in zip(items, outcomes):
        trajectory = Trajectory(task, anchor=True)
        trajectory.add_turn(code, world_model=None, real=outcome, anchor=True)
        trajectory.end("turns")
        found.append(trajectory)
    return found


class HeldOutEvaluator:
    """Evaluate a policy on held-out ``tasks`` (module docstring); one instance per run.

    ``cache`` (optional): a dict (task name, script) -> real Outcome kept across evaluations
    (and runs): a deterministic policy's identical scripts are then executed once. Without it
    every evaluation executes what it samples.
    """

    def __init__(self, tasks: Sequence[Task], dispatcher: Any, samples_per_task: int, seed: int, *,
                 max_turns: int = 1, max_tokens: Optional[int] = None, max_concurrent: int = 16,
                 cache: Optional[dict] = None):
        if samples_per_task < 1:
            raise ValueError(f"samples per task must be >= 1, got {samples_per_task}")
        self.tasks, self.dispatcher = list(tasks), dispatcher
        self.samples, self.seed = samples_per_task, seed
        self.max_turns, self.max_tokens, self.max_concurrent = max_turns, max_tokens, max_concurrent
        self.cache = cache

    def evaluate(self, model: Any, tokenizer: Any, sampling: Any) -> dict[str, Any]:
        """Sample, execute and summarize; never raises for a sandbox or sampling failure (the report is partial)."""
        started = time.perf_counter()
        grader = BoundedGrader(self.dispatcher, self.max_concurrent, self.cache)
        trajectories: list[Trajectory] = []
        try:
            if self.max_turns > 1:
                trajectories = sample_trajectories(model, tokenizer, self.tasks, sampling, self.samples,
                                                   self.max_turns, grader, seed=self.seed, max_tokens=self.max_tokens)
            else:
                items = [(task, code) for task, codes in sample_solutions(model, tokenizer, self.tasks, sampling,
                                                                          self.samples, seed=self.seed)
                         for code in codes]
                trajectories = single_turn_trajectories(items, grader(items))
        except Exception as exc:  # a sampling or dispatch error makes the evaluation partial, not the run fail
            grader.failures.append(f"evaluation stopped: {type(exc).__name__}: {exc}")
        return summarize(self.tasks, trajectories, failures=grader.failures, executed=grader.executed,
                         seconds=time.perf_counter() - started, max_turns=self.max_turns)
