"""Held-out evaluation: trajectories sampled on tasks never trained on, graded by REAL execution.

One evaluation, used by the trainer (``spec.evaluation``, :mod:`wmrl_trainer.trainer`) and
by ``wmrl run`` (:mod:`wmrl_trainer.local`):

* act (:class:`HeldOutEvaluator`): sample ``samples`` trajectories per task from the current
  policy, ``maxTurns`` turns as trained (:func:`wmrl_trainer.sampling.sample_solutions` for
  one turn, :func:`~wmrl_trainer.sampling.sample_trajectories` for several, each turn's real
  feedback shown to the next), and execute every script through the run's sandbox dispatcher
  with at most ``max_concurrent`` executions in flight (:class:`BoundedGrader`);
* decide (:func:`summarize`, pure): the report -- mean real reward (avg@samples, pooled over
  tasks), per task its figures (:mod:`wmrl_trainer.eval_figures`: mean best-turn reward, valid
  rate, mean best position, leaderboard percentile, medals, its category from
  :mod:`wmrl.task_category`), their means per category and overall, and the cost (seconds,
  executions) apart from training's.

An evaluation in which an execution failed on the sandbox side (pod down, connection
refused, dispatcher closed) or sampling raised is *partial*: ``complete`` false, ``reward``
None and ``partial`` saying why. It stops submitting executions at the first failure, and
its executions fail fast on a dead pool (every sandbox endpoint failing, none answering for
``dead_pool_grace`` seconds: :meth:`wmrl_sandbox.dispatcher.SandboxDispatcher.failing_fast`),
so a pool that went down makes it partial in seconds, not after minutes of backoff. A
partial evaluation is never a number: the trainer keeps ``heldOutReward`` at the last
complete one. Sampling forks torch's RNG streams with a fixed seed (common random numbers
across evaluations), so evaluating never changes what training draws.

Under several processes (``world``) the evaluation is split across them: each samples every
``size``-th trajectory (seed + rank), all take their turns in lockstep (generation too, for a
sharded model: FSDP), rank 0 alone executes every turn's scripts (:class:`SharedGrader`) and
summarizes the gathered trajectories. A process that raises while sampling leaves the others
waiting in a collective: the process group's timeout then fails the run, as in training.
"""

from __future__ import annotations

import concurrent.futures as cf
import math
import threading
import time
from typing import Any, Callable, Mapping, Optional, Sequence

from wmrl.outcome import Outcome
from wmrl.task_category import category_of
from wmrl.tasks import Task
from wmrl_sandbox.dispatcher import DEAD_POOL_GRACE_S
from wmrl_trainer.distributed import World
from wmrl_trainer.eval_figures import aggregate, task_figures
from wmrl_trainer.sampling import prompt_ids, sample_rows, sample_solutions, sample_trajectories
from wmrl_trainer.turns import Trajectory, repairs


def _mean(values: Sequence[float]) -> Optional[float]:
    return sum(values) / len(values) if values else None


class BoundedGrader:
    """Real outcomes of (task, script) items through ``dispatcher``, at most ``limit`` in flight.

    Identical (task, script) items are executed once (within a call, and across calls when a
    ``cache`` dict is given). ``failures`` collects why executions failed; after the first
    failure nothing more is submitted (the evaluation is partial anyway) and the remaining
    items are ungraded (None). ``dead_pool_grace``: through a dispatcher that offers
    ``failing_fast`` (the sandbox dispatcher), executions fail once every endpoint has been
    failing that long (None: the dispatcher's whole retry budget).
    """

    def __init__(self, dispatcher: Any, limit: int, cache: Optional[dict] = None,
                 on_graded: Optional[Callable[[int], None]] = None,
                 dead_pool_grace: Optional[float] = DEAD_POOL_GRACE_S):
        if limit < 1:
            raise ValueError(f"max_concurrent must be >= 1, got {limit}")
        failing_fast = getattr(dispatcher, "failing_fast", None)
        if dead_pool_grace is not None and failing_fast is not None:
            dispatcher = failing_fast(dead_pool_grace)
        self.dispatcher, self.limit = dispatcher, limit
        self.cache: dict[tuple[str, str], Outcome] = cache if cache is not None else {}
        self.keep = cache is not None
        self.failures: list[str] = []
        self.executed = 0
        self.on_graded = on_graded  # called with a number of items as their executions finish (progress bars)

    def _submit(self, task: Task, code: str, slots: threading.Semaphore) -> cf.Future:
        """Submit one execution that holds a slot of ``slots`` (released when it is done)."""
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
        if self.on_graded is not None:
            self.on_graded(len(items) - sum(1 for t, code in items if (t.name, code) in todo))
        copies = {key: sum(1 for t, code in items if (t.name, code) == key) for key in todo}
        slots = threading.Semaphore(self.limit)
        futures: dict[tuple[str, str], cf.Future] = {}

        def partial() -> bool:
            return bool(self.failures) or any(f.done() and _failure(k, f) for k, f in futures.items())

        for key, task in todo.items():
            if partial():
                break  # partial already: do not load the pool with executions that cannot make it whole
            slots.acquire()
            if partial():  # an execution failed while this one waited for a slot
                slots.release()
                break
            futures[key] = self._submit(task, key[1], slots)
            if self.on_graded is not None:
                futures[key].add_done_callback(lambda _, n=copies[key]: self.on_graded(n))
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


class SharedGrader:
    """``grade`` for :func:`~wmrl_trainer.sampling.sample_rows` under several processes (collective:
    every process calls it once per turn): every process's (task, script) items are executed once,
    on rank 0 by ``grader`` (None on the other ranks), and each process gets its own outcomes back.
    Items travel as (task name, script); ``tasks`` names them on rank 0."""

    def __init__(self, world: World, grader: Optional[BoundedGrader], tasks: Sequence[Task]):
        if world.is_main and grader is None:
            raise ValueError("rank 0 grades: it needs a grader")
        self.world, self.grader = world, grader
        self.tasks = {task.name: task for task in tasks}

    def __call__(self, items: Sequence[tuple[Task, str]]) -> list[Optional[Outcome]]:
        parts = self.world.gather([[(task.name, code) for task, code in items]])

        def grade_all() -> list[list[Optional[Outcome]]]:
            outcomes = iter(self.grader([(self.tasks[name], code) for part in parts for name, code in part]))
            return [[next(outcomes) for _ in part] for part in parts]

        return self.world.share(grade_all)[self.world.rank]


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


def summarize(tasks: Sequence[Task], trajectories: Sequence[Trajectory], *, failures: Sequence[str],
              executed: int, seconds: float, max_turns: int,
              categories: Optional[Mapping[str, str]] = None) -> dict[str, Any]:
    """The report of one evaluation (module docstring): pure, from its trajectories and what failed.

    ``categories``: task name -> category (:func:`wmrl.task_category.category_of`, which may read
    the task's files); a task missing from it takes its declared category, else ``other``."""
    categories = categories or {}
    per_task = {task.name: task_figures([t for t in trajectories if t.task.name == task.name],
                                        category=categories.get(task.name) or task.category or "other",
                                        has_medals=getattr(task, "medal_board", None) is not None)
                for task in tasks}
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
        **aggregate(per_task),
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
    every evaluation executes what it samples. ``dead_pool_grace``: see :class:`BoundedGrader`.
    """

    def __init__(self, tasks: Sequence[Task], dispatcher: Any, samples_per_task: int, seed: int, *,
                 max_turns: int = 1, max_tokens: Optional[int] = None, max_concurrent: int = 16,
                 cache: Optional[dict] = None, dead_pool_grace: Optional[float] = DEAD_POOL_GRACE_S):
        if samples_per_task < 1:
            raise ValueError(f"samples per task must be >= 1, got {samples_per_task}")
        self.tasks, self.dispatcher = list(tasks), dispatcher
        self.samples, self.seed = samples_per_task, seed
        self.max_turns, self.max_tokens, self.max_concurrent = max_turns, max_tokens, max_concurrent
        self.cache, self.dead_pool_grace = cache, dead_pool_grace
        self.categories = {task.name: category_of(task) for task in self.tasks}  # once: it may read the data

    def evaluate(self, model: Any, tokenizer: Any, sampling: Any,
                 on_graded: Optional[Callable[[int], None]] = None, *, world: Optional[World] = None,
                 synced: bool = False) -> Optional[dict[str, Any]]:
        """Sample, execute and summarize; never raises for a sandbox or sampling failure (the report is partial).

        ``on_graded(n)``: n more turns graded (a progress bar's update; at most tasks x samples x
        maxTurns in all, fewer when trajectories stop early). ``world`` with several processes:
        every process calls this, split as the module docstring says (``synced``: generation is
        collective, a sharded model); the report is rank 0's, the others get None."""
        if world is not None and world.size > 1:
            return self._evaluate_split(model, tokenizer, sampling, world, synced, on_graded)
        started = time.perf_counter()
        grader = BoundedGrader(self.dispatcher, self.max_concurrent, self.cache, on_graded, self.dead_pool_grace)
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
                         seconds=time.perf_counter() - started, max_turns=self.max_turns, categories=self.categories)

    def _evaluate_split(self, model: Any, tokenizer: Any, sampling: Any, world: World, synced: bool,
                        on_graded: Optional[Callable[[int], None]]) -> Optional[dict[str, Any]]:
        started = time.perf_counter()
        grader = (BoundedGrader(self.dispatcher, self.max_concurrent, self.cache, on_graded, self.dead_pool_grace)
                  if world.is_main else None)
        rows = [task for task in self.tasks for _ in range(self.samples)]
        mine = list(range(world.rank, len(rows), world.size))
        sampled = sample_rows(model, tokenizer, [rows[i] for i in mine], sampling, self.max_turns,
                              SharedGrader(world, grader, self.tasks), seed=self.seed + world.rank,
                              max_tokens=self.max_tokens, world=world, synced=synced,
                              stand_in=prompt_ids(self.tasks[0], tokenizer))
        gathered = world.gather([(i, t.turns, t.stop) for i, t in zip(mine, sampled)])
        if not world.is_main:
            return None
        trajectories = [Trajectory(rows[i], anchor=True, turns=turns, stop=stop)
                        for i, turns, stop in sorted(gathered, key=lambda found: found[0])]
        point = summarize(self.tasks, trajectories, failures=grader.failures, executed=grader.executed,
                          seconds=time.perf_counter() - started, max_turns=self.max_turns, categories=self.categories)
        # Row i was dealt to rank i % size.
        point["sampled_by_rank"] = [sum(1 for found in gathered if found[0] % world.size == rank)
                                    for rank in range(world.size)]
        return point
