"""One run of one arm of the speedup benchmark, in its own process: train until the budget is spent.

The run goes through the trainer the Job runs (:func:`wmrl_trainer.build.build_trainer`,
TRL's GRPO, the WMRL step, an in-process calibration), with two things swapped for the
benchmark: real executions come from the outcome table (:mod:`.outcome_table`, misses run
for real on the sandbox servers), and the clock is :mod:`.cost`'s. After every step the
step's cost is added up; the run evaluates the held-out tasks each time its cost crosses
the next of ``eval_points`` equal fractions of the budget (the ``worldModel`` arm, whose
steps cost almost nothing, at fractions of its step cap instead), and stops once it has
spent the budget or reached its step cap. The clock runs at every pool size of the job's sweep at
once (a synchronous step's learning does not depend on the pool): every cost is a mapping from pool
size to seconds, and each step's costs and execution durations are kept (``step_costs``) so any other
pool size can be scored from the result alone. An asynchronous run (``job.async_anchors``: late anchors)
learns differently on every pool, so it runs on one pool size, on :mod:`.async_clock`'s virtual clock,
which decides which anchors are late and when they arrive; its ``step_costs`` keep what
:func:`wmrl_bench.pool.replay` needs to recompute that clock. Its ``result.json`` is written last,
atomically: a benchmark run again with the same ``--work-dir`` reuses every run that finished.

Held-out reward is exact for single turns: the expected real reward under the policy's own
sampling distribution, summed over every script it can write for each held-out task
(:func:`wmrl_demo.script_space.script_distribution`), with each script's real outcome from
the table. No sampling noise, so 20 seeds measure the seeds, not the evaluation. Multi-turn
runs sample :data:`~wmrl_bench.design.EVAL_TRAJECTORIES` trajectories per task instead
(each turn shown its real feedback, from the table; the same sampling seed at every
evaluation of a run), and report the best-turn reward, the first turn's and the repair rate.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Optional

import numpy as np

from wmrl_bench.async_clock import VirtualDispatcher, VirtualTime
from wmrl_bench.cost import step_cost
from wmrl_bench.design import EVAL_TRAJECTORIES, WIDE_POLICY, Job, arm_config, async_anchors
from wmrl_bench.outcome_table import OutcomeTable, TableDispatcher
from wmrl_demo.demo_policy import load_builtin
from wmrl_demo.script_space import script_distribution
from wmrl_sandbox.dispatcher import SandboxDispatcher, StaticEndpoints
from wmrl_trainer.build import build_trainer, load_training_tasks
from wmrl_trainer.sampling import make_prompt, sample_trajectories
from wmrl_trainer.services import local_runtime, quiet_libraries
from wmrl_trainer.turns import repairs


def policy_scripts(model: Any, tokenizer: Any, task: Any, sampling: Any) -> list[tuple[str, float]]:
    """Every script the policy can write for ``task`` under the run's sampling, with its probability."""
    return script_distribution(model, tokenizer, make_prompt(task, tokenizer), temperature=sampling.temperature,
                               top_p=sampling.top_p, max_new_tokens=sampling.max_new_tokens)


def held_out_reward(model: Any, tokenizer: Any, held_out: list[Any], sampling: Any, dispatcher: Any) -> dict[str, Any]:
    """Exact expected real reward over every script the policy can write, per held-out task and on average."""
    by_task, scripts, mass = {}, {}, {}
    for task in held_out:
        distribution = policy_scripts(model, tokenizer, task, sampling)
        entries = dispatcher.entries((task, code) for code, _ in distribution)
        by_task[task.name] = float(sum(p * entry.outcome.reward for (_, p), entry in zip(distribution, entries)))
        scripts[task.name] = len(distribution)
        mass[task.name] = float(sum(p for _, p in distribution))
    return {"reward": float(np.mean(list(by_task.values()))), "by_task": by_task, "scripts": scripts, "mass": mass}


def held_out_trajectory_reward(model: Any, tokenizer: Any, held_out: list[Any], sampling: Any, dispatcher: Any,
                               max_turns: int, samples: int, seed: int, max_tokens: Optional[int] = None) -> dict[str, Any]:
    """Mean best-turn real reward of ``samples`` sampled trajectories per held-out task (outcomes from the table)."""
    def grade(items: list[tuple[Any, str]]) -> list[Any]:
        return [entry.outcome for entry in dispatcher.entries(items)]

    trajectories = sample_trajectories(model, tokenizer, held_out, sampling, samples, max_turns, grade, seed=seed,
                                       max_tokens=max_tokens)
    by_task = {task.name: float(np.mean([t.reward("real") for t in trajectories if t.task.name == task.name]))
               for task in held_out}
    _, retried, repaired = repairs(trajectories)  # what they saw is the real outcome
    return {"reward": float(np.mean(list(by_task.values()))), "by_task": by_task,
            "first_turn_reward": float(np.mean([t.turns[0].real.reward for t in trajectories])),
            "mean_turns": float(np.mean([len(t.turns) for t in trajectories])),
            "repair_rate": repaired / retried if retried else None, "samples": samples}


def run_job(job: Job) -> dict[str, Any]:
    """Train one configuration at one seed until its budget is spent at every pool size (or its step cap);
    its curve and costs at every pool size."""
    # torch takes seconds to import: only a training run pays for it, not `wmrl bench speedup --help`.
    import torch

    run_dir = Path(job.work_dir) / job.name()
    done = _finished(run_dir, job)
    if done is not None:
        return done
    quiet_libraries()
    torch.set_num_threads(job.threads)
    started = time.perf_counter()
    shutil.rmtree(run_dir, ignore_errors=True)
    asynchronous = job.async_anchors is not None
    if asynchronous and len(job.slots) != 1:
        raise ValueError(f"an asynchronous run learns on one pool size, got {job.slots}")
    anchors = async_anchors(job.async_anchors["late"], job.async_anchors["wait_s"]) if asynchronous else None
    config = arm_config(job.arm, job.seed, job.steps, optimism=job.optimism, groups_per_step=job.groups_per_step,
                        learning_rate=job.learning_rate, anchors=anchors, **job.spec_overrides)
    config = local_runtime(config, run_dir, job.sandbox_urls, None)
    spec = config.spec
    tasks, held_out = load_training_tasks(config)
    sandboxes = SandboxDispatcher(StaticEndpoints(list(job.sandbox_urls)), slots_per_pod=1,
                                  timeout=spec.sandbox.timeout_seconds + 30) if job.sandbox_urls else None
    dispatcher = TableDispatcher(OutcomeTable(Path(job.table_path)), sandboxes, timeout=spec.sandbox.timeout_seconds,
                                 live=job.live)
    pools = [str(p) for p in job.slots]
    # Runs with budgets stop once every pool size's is spent and evaluate at fractions of each; the
    # reference (which sets the budgets) and worldModel (whose steps cost almost nothing) run their steps
    # and evaluate at fractions of them.
    budgeted = job.budgets is not None and spec.mode.value != "worldModel"
    fractions = [k / job.eval_points for k in range(1, job.eval_points + 1)]
    milestones = {p: [job.budgets[p] * f for f in fractions] if budgeted else [] for p in pools}
    step_milestones = [] if budgeted else [job.steps * f for f in fractions]
    # cost_s: the benchmark's clock per pool size; wall_s: what the trainer measured itself (live: real waits).
    totals: dict[str, Any] = {"cost_s": {p: 0.0 for p in pools}, "compute_s": 0.0, "judge_s": 0.0,
                              "executions_s": {p: 0.0 for p in pools}, "wall_s": 0.0, "executions": 0, "steps": 0}
    step_costs: list[dict[str, Any]] = []
    curve: list[dict[str, Any]] = []
    trainer = None
    # The wait point of a step: the trainer's own seconds so far in it plus the modelled judge (cost.step_cost's).
    virtual = VirtualTime(job.slots[0], dispatcher.take_durations, lambda: trainer.step_seconds() + job.judge_cost
                          * trainer.grpo.last_generation_seconds) if asynchronous else None

    def evaluate() -> None:
        model = trainer.grpo.accelerator.unwrap_model(trainer.grpo.model)
        if spec.algorithm.max_turns > 1 or spec.policy.model == f"builtin:{WIDE_POLICY}":  # too many to enumerate
            point = held_out_trajectory_reward(model, trainer.grpo.processing_class, held_out, spec.policy.sampling,
                                               dispatcher, spec.algorithm.max_turns, EVAL_TRAJECTORIES,
                                               seed=7919 + job.seed, max_tokens=spec.algorithm.max_trajectory_tokens)
        else:
            point = held_out_reward(model, trainer.grpo.processing_class, held_out, spec.policy.sampling, dispatcher)
        point.update(step=totals["steps"], cost_s=dict(totals["cost_s"]), executions=totals["executions"])
        curve.append(point)

    def crossed(marks: list[float], value: float) -> bool:
        hit = False
        while marks and value >= marks[0] - 1e-9:
            marks.pop(0)
            hit = True
        return hit

    def on_step(record: Any) -> None:
        row = record.to_json()
        if virtual is not None:  # one pool, on the virtual clock that decided which anchors were late
            clock = virtual.finish_step(row, job.judge_cost)
            totals["compute_s"] += clock["compute"]
            totals["judge_s"] += clock["judge"]
            totals["cost_s"][pools[0]] += clock["total"]
            totals["executions_s"][pools[0]] += clock["waited"]
            step_costs.append({**clock, **{k: row[k] for k in ("anchor_groups", "demand", "late_anchors", "late_folded",
                                                                "late_trained", "late_weight_mean",
                                                                "late_clipped_share", "dropped_anchors")}})
        else:
            durations = dispatcher.take_durations()
            costs = {p: step_cost(row, durations, int(p), job.judge_cost) for p in pools}
            any_cost = costs[pools[0]]
            totals["compute_s"] += any_cost.compute
            totals["judge_s"] += any_cost.judge
            for p, cost in costs.items():
                totals["cost_s"][p] += cost.total
                totals["executions_s"][p] += cost.executions
            step_costs.append({"compute": any_cost.compute, "judge": any_cost.judge,
                               "executions": {p: c.executions for p, c in costs.items()},
                               "durations": [round(d, 4) for d in durations],
                               "executions_per_turn": (row.get("turns") or {}).get("executions_per_turn")})
        totals["wall_s"] += record.total
        totals["executions"] += record.executions
        totals["steps"] = record.step + 1
        spent = budgeted and all(totals["cost_s"][p] >= job.budgets[p] for p in pools)
        hit = any([crossed(milestones[p], totals["cost_s"][p]) for p in pools]) | crossed(step_milestones,
                                                                                           totals["steps"])
        if hit or spent or totals["steps"] >= job.steps:
            evaluate()
        if spent:
            trainer.request_stop()

    try:
        policy = load_builtin(spec.policy.model.removeprefix("builtin:"), warm_start_seed=job.seed)
        world_model = None
        if job.judge_cell is not None:
            from wmrl_bench.synthetic_judge import synthetic_world_model

            # The truth comes from the outcome table (a miss executes once, uncharged: it is the judge's input).
            world_model = synthetic_world_model(job.judge_cell, job.seed, lambda task, code: dispatcher.entries(
                [(task, code)])[0].outcome.reward)
        trainer = build_trainer(config, policy=policy, tasks=tasks, held_out=held_out,
                                dispatcher=dispatcher if virtual is None else VirtualDispatcher(dispatcher, virtual),
                                world_model=world_model, callbacks=[on_step], waits=virtual)
        evaluate()
        with open(run_dir / "steps.jsonl", "w") as log, contextlib.redirect_stdout(log):  # the trainer's line per step
            trainer.train()
    finally:
        if trainer is not None:
            trainer.close()
        dispatcher.close()
        shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
    result = {
        "arm": job.arm, "config": job.config, "seed": job.seed, "optimism": job.optimism,
        "async": None if not asynchronous else {**job.async_anchors, "slots": job.slots[0],
                                                "anchors": anchors},
        "groups_per_step": job.groups_per_step, "learning_rate": job.learning_rate, "judge_cell": job.judge_cell,
        "stopped_by": "budget" if budgeted and all(totals["cost_s"][p] >= job.budgets[p] for p in pools) else "steps",
        **totals,
        "initial_reward": curve[0]["reward"], "final_reward": curve[-1]["reward"],
        "curve": curve,
        "step_costs": step_costs,
        "table": {"hits": dispatcher.hits, "misses": dispatcher.misses},
        "elapsed_s": time.perf_counter() - started,
        "job": _identity(job),
    }
    tmp = run_dir / ".result.json.tmp"
    tmp.write_text(json.dumps(result, indent=1))
    os.replace(tmp, run_dir / "result.json")  # written last and atomically: its presence means the run finished
    return result


def _identity(job: Job) -> dict[str, Any]:
    """What makes two jobs the same run (not where its services or folders happen to be)."""
    return {k: v for k, v in asdict(job).items() if k not in ("sandbox_urls", "work_dir", "table_path")}


def _finished(run_dir: Path, job: Job) -> Optional[dict[str, Any]]:
    """The result of this very job from an earlier, interrupted benchmark in the same work dir, if it finished."""
    try:
        result = json.loads((run_dir / "result.json").read_text())
    except (OSError, ValueError):
        return None
    return result if result.get("job") == json.loads(json.dumps(_identity(job))) else None
