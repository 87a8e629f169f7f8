"""``wmrl bench speedup``: WMRL against real-execution GRPO at equal compute, and the ablations.

The paper's claim is about a budget: with the same GPU-hours, WMRL takes many more steps
than real-execution GRPO (most rollouts are graded by the world model instead of waiting
on sandboxes), reaches GRPO's final score 3.1-3.4x sooner and ends higher. This benchmark
tests that claim on this machine, at demo scale.

**The experiment** (the configurations, the learning-rate and batch grids, the tuning and
evaluation seeds, the pool sizes, the presets and the jobs) is :mod:`.design`'s, fixed before any
run; each job trains in its own process (:mod:`.arm_run`).

**Equal cost.** The reference configuration (the v2 real arm) runs its steps on the tuning seeds;
its mean cost at each pool size P is that P's budget, which every configuration spends. A step's
cost is :mod:`.cost`'s: the trainer's measured compute, a modelled LLM-judge cost (``--judge-cost`` x
the policy's own generation cost per rollout, for every rollout the world model grades) and the
makespan of the step's executions on P sandbox slots, each at its duration measured once in the
outcome table (:mod:`.outcome_table`). The ``worldModel`` arm is capped by steps, as is every run for
safety (``--cap``).

**Asynchronous anchors** (:mod:`.async_clock`, :mod:`.async_analysis`): wmrl with ``anchors.waitSeconds`` at
the pre-registered fractions of a synchronous wmrl step and late real rewards in the gradient (with and without
the importance correction, and dropped as a control), each on one pool size whose slots persist across steps,
judged against the same target at the same budget.

**Judged at the budget** (:mod:`.analysis`): the target is the best real configuration's (chosen on
the tuning seeds) mean held-out reward at the budget, so its time to target is the budget; wmrl's
speedup is the budget over the time its mean curve reaches that target, "not reached within the
budget" when it does not (censored, never 0). Every test of a run is Holm-adjusted together.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import math
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import httpx
import numpy as np

from wmrl_bench import report
from wmrl_bench.analysis import ablation_summary, choose, holm_over_run, judge_grid_summary, pool_summary
from wmrl_bench.arm_run import policy_scripts, run_job
from wmrl_bench.async_analysis import async_goal, async_pool_summary
from wmrl_bench.design import (ABLATION_ORDER, ARMS, ASYNC_CONTROLS, ASYNC_WAIT_FRACTIONS, BASE_SPEC,
                               EVAL_TRAJECTORIES, GROUPS_PER_STEP_GRID, HEADLINE_OPTIMISM, HEADLINE_SLOTS,
                               LATE_CLIP_MAX, LATE_CORRECTIONS, LR_GRID, PRESETS, SLOTS_GRID, Job, arm_config,
                               async_variant_name, async_variants, config_name, evaluation_configs,
                               evaluation_seeds, tuning_configs, tuning_seeds)
from wmrl_bench.synthetic_judge import JUDGE_GRID, PREDICTIONS
from wmrl_bench.outcome_table import OutcomeTable, TableDispatcher
from wmrl_demo.demo_policy import load_builtin
from wmrl_demo.suite import SUITE_VERSION, builtin_suite
from wmrl_sandbox.dispatcher import SandboxDispatcher, StaticEndpoints
from wmrl_trainer.services import LocalServices, quiet_libraries


def run_jobs(jobs: list[Job], workers: int, log: Callable[[str], None]) -> list[dict[str, Any]]:
    """Run ``jobs`` in ``workers`` fresh processes (spawned: torch is never forked); results in job order."""
    if workers <= 1:
        results = []
        for i, job in enumerate(jobs):
            results.append(run_job(job))
            log(_progress_line(results[-1], i + 1, len(jobs)))
        return results
    context = multiprocessing.get_context("spawn")
    with cf.ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        futures = {pool.submit(run_job, job): i for i, job in enumerate(jobs)}
        results: list[Optional[dict]] = [None] * len(jobs)
        for done, future in enumerate(cf.as_completed(futures), 1):
            results[futures[future]] = future.result()
            log(_progress_line(results[futures[future]], done, len(jobs)))
    return results  # type: ignore[return-value]


def _progress_line(result: dict[str, Any], done: int, total: int) -> str:
    return json.dumps({"event": "run", "done": done, "of": total, "config": result.get("config", result["arm"]),
                       "judge": result.get("judge_cell"), "seed": result["seed"], "steps": result["steps"],
                       "cost_s": {p: round(c, 1) for p, c in result["cost_s"].items()}
                       if isinstance(result["cost_s"], dict) else round(result["cost_s"], 1),
                       "initial": round(result["initial_reward"], 4), "final": round(result["final_reward"], 4),
                       "elapsed_s": round(result["elapsed_s"], 1)})


def sandboxes_start_warm(urls: Sequence[str]) -> bool:
    """Whether every sandbox server forks its executions from a warm fork server (their /healthz)."""
    return all(httpx.get(f"{url}/healthz", timeout=30).json().get("warm", {}).get("ready", 0) > 0 for url in urls)


def prefill_held_out(table_dispatcher: Any, held_out: Sequence[Any], sampling: Any) -> int:
    """Execute every script the policy can write for the held-out tasks once (all have probability > 0)."""
    model, tokenizer = load_builtin("tiny-coder")
    items = [(task, code) for task in held_out for code, _ in policy_scripts(model, tokenizer, task, sampling)]
    return table_dispatcher.fill(items)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help=f"the quick preset ({PRESETS['quick']})")
    parser.add_argument("--multiturn", action="store_true",
                        help=f"the multi-turn preset ({PRESETS['multiturn']}): the paper's 4-turn loop")
    parser.add_argument("--wide", action="store_true",
                        help=f"the wide-space preset ({PRESETS['wide']}): preprocessing chains, large models, "
                             "hyperparameter tokens and wrappers, where the judge's optimism can be exploited")
    parser.add_argument("--json", metavar="PATH", required=True, help="write the results JSON here")
    parser.add_argument("--plot", metavar="PATH", help="write the comparison PNG here")
    parser.add_argument("--markdown", metavar="PATH", help="write the Markdown tables here")
    parser.add_argument("--tuning-seeds", type=int, help="seeds that choose learning rates and the best real "
                        "configuration (default: the preset's)")
    parser.add_argument("--seeds", type=int, help="evaluation seeds for worldModel and wmrlOnline; real runs the "
                        "larger of this and --ablation-seeds, so every wmrl seed has its paired real runs")
    parser.add_argument("--ablation-seeds", type=int, help="evaluation seeds for wmrl, none, debias, denoise")
    parser.add_argument("--grid-seeds", type=int, help="paired seeds per synthetic-judge cell (default: the preset's)")
    parser.add_argument("--arms", help=f"comma-separated subset of {list(ARMS)} (must include real)")
    parser.add_argument("--lrs", help=f"learning-rate grid (default: pre-registered {LR_GRID})")
    parser.add_argument("--real-groups", help=f"real GRPO groupsPerStep grid (default: pre-registered "
                                              f"{GROUPS_PER_STEP_GRID})")
    parser.add_argument("--slots", help=f"sandbox pool sizes the clock charges executions on (default: "
                                        f"pre-registered {SLOTS_GRID}; the headline is {HEADLINE_SLOTS})")
    parser.add_argument("--judge-grid", help="synthetic-judge cells for the corrections' ablation, comma-separated, "
                                             "'all' or 'none' (default: the preset's)")
    parser.add_argument("--async-arms", help="asynchronous-anchor arms, comma-separated, 'all' or 'none' (default: "
                                             f"all of {[async_variant_name(*v) for v in async_variants()]} for "
                                             "single-turn presets with wmrl, none for --multiturn)")
    parser.add_argument("--bias", type=float, default=HEADLINE_OPTIMISM,
                        help=f"the frozen judge's optimism (default {HEADLINE_OPTIMISM}, fixed before any run)")
    parser.add_argument("--steps", type=int, help="the reference configuration's steps, which set the budget "
                                                  "(default: the preset's)")
    parser.add_argument("--cap", type=float, default=6.0,
                        help="step cap x the reference's steps (x its groupsPerStep / the run's, for real; default 6)")
    parser.add_argument("--judge-cost", type=float, default=1.0,
                        help="LLM-judge cost per graded rollout, x the policy's generation cost per rollout (default 1.0)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="runs in parallel (default: one per core)")
    parser.add_argument("--sandboxes", type=int, default=os.cpu_count() or 1,
                        help="local sandbox servers for outcome-table misses (default: one per core)")
    parser.add_argument("--table", metavar="PATH", help="outcome table file (default: under the cache root, keyed by suite and sandbox)")
    parser.add_argument("--live", action="store_true",
                        help="instead: one seed of real and wmrl executing every rollout on live sandboxes; "
                             "reports the modelled cost against the measured wall-clock")
    parser.add_argument("--work-dir", help="keep every run's folder here (default: a temporary folder, removed); "
                                           "run again with the same folder to reuse every run that finished")
    parser.add_argument("--eval-points", type=int,
                        help="held-out evaluations per run and pool size, at equal fractions of its budget "
                             "(default: the preset's)")
    # For tests: an extra-tiny setting.
    parser.add_argument("--group-size", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--groups-per-step", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--held-out", help=argparse.SUPPRESS)


def _csv(text: Optional[str], cast: Callable[[str], Any]) -> Optional[list]:
    return None if text is None else [cast(x.strip()) for x in text.split(",") if x.strip()]


def _judge_cells(text: Optional[str], preset: dict[str, Any]) -> list[str]:
    """The synthetic-judge cells to run: ``--judge-grid`` (names, 'all' or 'none'), else the preset's."""
    chosen = preset.get("judge_grid", ()) if text is None else text
    if chosen in ("none", ()):
        return []
    return [c.name for c in JUDGE_GRID] if chosen == "all" else list(_csv(chosen, str) if isinstance(chosen, str)
                                                                        else chosen)


def _async_arms(text: Optional[str], arms: Sequence[str], max_turns: int) -> list[tuple[str, float]]:
    """The asynchronous arms to run, as (late handling, wait fraction): ``--async-arms`` (names, 'all' or
    'none'), else all of them when wmrl runs single-turn (anchors.waitSeconds is single-turn only)."""
    known = {async_variant_name(*v): v for v in async_variants()}
    if text is None:
        return list(known.values()) if "wmrl" in arms and max_turns == 1 else []
    if text == "none":
        return []
    if text == "all":
        return list(known.values())
    return [known[name] for name in _csv(text, str)] if all(n in known for n in _csv(text, str)) else [("?", -1.0)]


def main(args: argparse.Namespace) -> int:
    quiet_libraries()
    chosen_presets = [name for name in ("quick", "multiturn", "wide") if getattr(args, name)]
    if len(chosen_presets) > 1:
        print(f"wmrl bench speedup: --{' and --'.join(chosen_presets)} are different presets; choose one", file=sys.stderr)
        return 2
    preset = dict(PRESETS[chosen_presets[0] if chosen_presets else "full"])
    max_turns = int(preset.get("max_turns", 1))
    space = preset.get("space", "tiny")
    arms = _csv(args.arms, str) or list(preset["arms"])
    lrs = _csv(args.lrs, float) or list(LR_GRID)
    real_groups = _csv(args.real_groups, int) or list(GROUPS_PER_STEP_GRID)
    pools = [str(p) for p in (_csv(args.slots, int) or list(SLOTS_GRID))]
    headline = str(HEADLINE_SLOTS) if str(HEADLINE_SLOTS) in pools else pools[0]
    cells = _judge_cells(args.judge_grid, preset)
    tuning_n = args.tuning_seeds or preset["tuning_seeds"]
    seeds = args.seeds or preset["seeds"]
    ablation_seeds = args.ablation_seeds or preset["ablation_seeds"]
    grid_seeds = args.grid_seeds or preset["grid_seeds"]
    steps = args.steps or preset["steps"]
    eval_points = args.eval_points or preset["eval_points"]
    base_groups = args.groups_per_step or BASE_SPEC["algorithm"]["groupsPerStep"]
    base_lr = BASE_SPEC["algorithm"]["learningRate"]
    unknown = sorted(set(arms) - set(ARMS))
    problems = []
    if unknown or "real" not in arms:
        problems.append(f"--arms must include 'real' and only {list(ARMS)} (unknown: {unknown})")
    if not 0 <= args.bias <= 1:
        problems.append("--bias must be in [0, 1]")
    if base_groups not in real_groups or base_lr not in lrs:
        problems.append(f"--real-groups must include the reference's groupsPerStep {base_groups} and --lrs its "
                        f"learning rate {base_lr:g} (the reference sets the budget)")
    if any(g < 1 for g in real_groups) or any(not 0 < lr < 1 for lr in lrs) or any(int(p) < 1 for p in pools):
        problems.append("--real-groups and --slots must be >= 1, --lrs in (0, 1)")
    variants = _async_arms(args.async_arms, arms, max_turns)
    if ("?", -1.0) in variants:
        problems.append(f"--async-arms: choose from {[async_variant_name(*v) for v in async_variants()]}, "
                        "'all' or 'none'")
    elif variants and ("wmrl" not in arms or max_turns != 1):
        problems.append("--async-arms needs the wmrl arm and single turns (anchors.waitSeconds is single-turn only)")
    bad_cells = sorted(set(cells) - {c.name for c in JUDGE_GRID})
    if bad_cells:
        problems.append(f"--judge-grid: unknown cells {bad_cells}; known: {[c.name for c in JUDGE_GRID]}")
    if min(tuning_n, seeds, ablation_seeds, grid_seeds, steps, eval_points, args.workers) < 1 or args.cap < 1 or args.judge_cost < 0:
        problems.append("--tuning-seeds, --seeds, --ablation-seeds, --grid-seeds, --steps, --workers must be >= 1, "
                        "--cap >= 1, "
                        "--judge-cost >= 0")
    if problems:
        print("wmrl bench speedup: " + "; ".join(problems), file=sys.stderr)
        return 2
    started = time.perf_counter()
    own_dir = args.work_dir is None
    work_dir = Path(args.work_dir or tempfile.mkdtemp(prefix="wmrl-speedup-"))
    log = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    overrides = {"group_size": args.group_size, "held_out": _csv(args.held_out, str), "max_turns": max_turns,
                 "space": space}
    try:
        tasks = builtin_suite("mini-ml")
        with LocalServices(args.sandboxes, work_dir / "logs") as services:
            warm = sandboxes_start_warm(services.sandbox_urls)
            config = arm_config("real", 0, steps, groups_per_step=base_groups, **overrides)
            timeout = config.spec.sandbox.timeout_seconds
            table = (OutcomeTable(Path(args.table)) if args.table
                     else OutcomeTable.for_suite(tasks, SUITE_VERSION, warm, timeout))
            held_out = [t for t in tasks if t.name in config.spec.tasks.held_out]
            filler = TableDispatcher(table, SandboxDispatcher(StaticEndpoints(services.sandbox_urls), slots_per_pod=1,
                                                              timeout=timeout + 30), timeout=timeout)
            try:
                t0 = time.perf_counter()
                # The wide space cannot be enumerated: its held-out scripts are executed as they are sampled.
                ran = 0 if space == "wide" else prefill_held_out(filler, held_out, config.spec.policy.sampling)
                log(json.dumps({"event": "outcome-table", "path": str(table.path), "entries": len(table),
                                "executed_now": ran, "seconds": round(time.perf_counter() - t0, 1)}))
            finally:
                filler.close()
            common = {"eval_points": eval_points, "slots": tuple(int(p) for p in pools), "judge_cost": args.judge_cost,
                      "sandbox_urls": services.sandbox_urls, "table_path": str(table.path), "work_dir": str(work_dir),
                      "spec_overrides": overrides, "optimism": args.bias}
            if args.live:
                return _live(args, steps, base_groups, common, log, started, warm)

            def job(arm: str, groups: int, lr: float, seed: int, budgets: Optional[dict], cell: Optional[str] = None,
                    **extra: Any) -> Job:
                scale = base_groups / groups if arm == "real" else 1.0
                cap = steps if budgets is None else int(math.ceil(steps * args.cap * scale))
                return Job(arm=arm, seed=seed, groups_per_step=groups, learning_rate=lr, steps=cap, budgets=budgets,
                           judge_cell=cell, **{**common, **extra})

            tune = tuning_seeds(tuning_n)
            reference = run_jobs([job("real", base_groups, base_lr, s, None) for s in tune], args.workers, log)
            budgets = {p: float(np.mean([r["cost_s"][p] for r in reference])) for p in pools}
            log(json.dumps({"event": "budget", "budget_s": {p: round(b, 2) for p, b in budgets.items()}}))
            reference_name = config_name("real", base_groups, base_lr)
            tuning_runs = run_jobs([job(a, g, lr, s, budgets) for a, g, lr in tuning_configs(arms, real_groups, lrs,
                                                                                               base_groups)
                                    if config_name(a, g, lr) != reference_name for s in tune], args.workers, log)
            tuning_by_config = _group(reference + tuning_runs)
            chosen = {p: choose(tuning_by_config, p, budgets[p]) for p in pools}
            log(json.dumps({"event": "chosen", **{p: {"best_real": c["best_real"], "wmrl": c["wmrl"]}
                                                  for p, c in chosen.items()}}))
            wmrl_lrs = [c["wmrl_learning_rate"] for c in chosen.values() if c["wmrl_learning_rate"] is not None]
            ablation_lr = chosen[headline]["wmrl_learning_rate"] or base_lr
            eval_jobs = [job(a, g, lr, s, budgets)
                         for a, g, lr in evaluation_configs(arms, real_groups, lrs, base_groups, wmrl_lrs, ablation_lr)
                         for s in evaluation_seeds(a, seeds, ablation_seeds)]
            # Asynchronous arms: wmrl at its rate chosen for P, waitSeconds a fraction of its synchronous step at P.
            sync_step_s = {p: _step_seconds(tuning_by_config.get(chosen[p]["wmrl"] or "", []), p) for p in pools}
            async_jobs = [job("wmrl", base_groups, chosen[p]["wmrl_learning_rate"], s, {p: budgets[p]},
                              slots=(int(p),), async_anchors={"late": late, "wait_fraction": fraction,
                                                              "wait_s": fraction * sync_step_s[p]})
                          for p in pools if chosen[p]["wmrl"] and sync_step_s[p] is not None
                          for late, fraction in variants for s in evaluation_seeds("wmrl", seeds, ablation_seeds)]
            all_runs = run_jobs(eval_jobs + async_jobs, args.workers, log)
            eval_runs, async_runs = all_runs[:len(eval_jobs)], all_runs[len(eval_jobs):]
            grid_runs = run_jobs([job(a, base_groups, ablation_lr, s, budgets, cell) for cell in cells
                                  for a in ABLATION_ORDER for s in range(grid_seeds)], args.workers, log)
    finally:
        if own_dir:
            shutil.rmtree(work_dir, ignore_errors=True)
    by_config = _group(eval_runs)
    arm_config_names = {a: config_name(a, base_groups, ablation_lr) for a in arms if a not in ("real", "wmrl")}
    pools_out = {}
    for p in pools:
        wmrl_name = config_name("wmrl", base_groups, chosen[p]["wmrl_learning_rate"]) if chosen[p]["wmrl"] else None
        pools_out[p] = pool_summary(by_config, p, budgets[p], chosen[p]["best_real"], wmrl_name)
        pools_out[p]["arms"] = _arms_view(pools_out[p], arm_config_names)
    tests = [t for p in pools for t in pools_out[p]["tests"]]
    ablation = ablation_summary({a: by_config.get(n, []) for a, n in
                                 {**arm_config_names, "wmrl": config_name("wmrl", base_groups, ablation_lr)}.items()},
                                headline, budgets[headline], label="frozen judge: ")
    tests += ablation["tests"] if ablation else []
    judge_grid = judge_grid_summary(grid_runs, cells, headline, budgets[headline], PREDICTIONS)
    tests += judge_grid["tests"]
    asynchronous = _async_section(async_runs, pools_out, by_config, budgets, sync_step_s, variants)
    tests += [t for pool in asynchronous.get("slots", {}).values() for t in pool["tests"]]
    tests = holm_over_run(tests)
    top = pools_out[headline]
    results = {
        "benchmark": "speedup", "version": 3, "quick": bool(args.quick), "max_turns": max_turns, "space": space,
        "budget_s": budgets[headline], "budgets_s": budgets, "reference": reference_name, "real_steps": steps,
        "step_cap": args.cap, "headline_slots": int(headline), "judge_cost": args.judge_cost, "eval_points": eval_points,
        "lr_grid": lrs, "real_groups": real_groups, "optimism": args.bias,
        "tuning": {"seeds": tune, "chosen": chosen},
        "evaluation_seeds": {"seeds": seeds, "ablation_seeds": ablation_seeds, "grid_seeds": grid_seeds},
        "held_out_tasks": [t.name for t in held_out],
        "held_out_evaluation": (f"mean best-turn real reward of {EVAL_TRAJECTORIES} sampled trajectories per task"
                                if max_turns > 1 else f"mean real reward of {EVAL_TRAJECTORIES} sampled scripts per task"
                                if space == "wide" else "exact expectation over the policy's scripts"),
        "base_spec": BASE_SPEC, "outcome_table": {"path": str(table.path), "entries": len(OutcomeTable(table.path))},
        "sandbox_start": "warm" if warm else "cold",
        "machine": {"cpus": os.cpu_count(), "workers": args.workers, "sandboxes": args.sandboxes},
        "target_reward": top["target_reward"], "speedup": top["speedup"], "arms": top["arms"],
        "real_arms": {n: top["configs"][n] for n in top["configs"] if n.startswith("real-")},
        "slots": pools_out,
        "ablation": ablation,
        "async": asynchronous,
        "judge_grid": judge_grid,
        "tests": tests,
        "runs": reference + tuning_runs + eval_runs + grid_runs + async_runs,
        "wall_clock_s": time.perf_counter() - started,
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(results, indent=1, default=_json_default))
    if args.plot:
        report.plot(results, args.plot)
    if args.markdown:
        Path(args.markdown).write_text(report.markdown_table(results))
    print(json.dumps(results, default=_json_default))
    return 0


def _step_seconds(runs: Sequence[dict[str, Any]], pool: str) -> Optional[float]:
    """A configuration's mean cost per step at ``pool`` over ``runs`` (None without runs)."""
    per_run = [r["cost_s"][pool] / r["steps"] for r in runs if r["steps"]]
    return float(np.mean(per_run)) if per_run else None


def _async_section(runs: Sequence[dict[str, Any]], pools: dict[str, dict[str, Any]],
                   by_config: dict[str, list[dict[str, Any]]], budgets: dict[str, float],
                   sync_step_s: dict[str, Optional[float]], variants: Sequence[tuple[str, float]]) -> dict[str, Any]:
    """The JSON's ``async``: the pre-registered settings, every asynchronous arm at every pool size, the goal."""
    if not variants:
        return {"measured": False, "why": "no asynchronous arm ran (--async-arms none, no wmrl arm, or multi-turn)"}
    out: dict[str, Any] = {
        "measured": True, "arms": [async_variant_name(*v) for v in variants],
        "wait_fractions": list(ASYNC_WAIT_FRACTIONS), "corrections": list(LATE_CORRECTIONS),
        "controls": [async_variant_name(*v) for v in ASYNC_CONTROLS], "clip_max": LATE_CLIP_MAX,
        "sync_step_s": sync_step_s, "slots": {}}
    for p, pool in pools.items():
        mine = [r for r in runs if str(r["async"]["slots"]) == p]
        if not mine:
            continue
        out["slots"][p] = async_pool_summary(mine, p, budgets[p], pool["target_reward"], by_config[pool["best_real"]],
                                             pool["best_real"], by_config.get(pool["wmrl"] or "", []))
        out["slots"][p]["wmrl"] = {"config": pool["wmrl"], "speedup": pool["speedup"],
                                   "final_reward": (pool["configs"].get(pool["wmrl"] or "") or {}).get("final_reward")}
    out["goal"] = async_goal(out["slots"])
    return out


def _group(runs: Sequence[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Runs by configuration name, in seed order."""
    out: dict[str, list[dict[str, Any]]] = {}
    for run in sorted(runs, key=lambda r: (r["config"], r["seed"])):
        out.setdefault(run["config"], []).append(run)
    return out


def _arms_view(pool: dict[str, Any], others: dict[str, str]) -> dict[str, Any]:
    """The pool's figures by arm, as v2 keyed them: ``real`` is the best real configuration, ``wmrl`` the
    chosen one, every other arm its configuration at wmrl's learning rate."""
    names = {"real": pool["best_real"], "wmrl": pool["wmrl"], **others}
    return {arm: {**pool["configs"][name], "config": name} for arm, name in names.items()
            if name and name in pool["configs"]}


def _live(args: argparse.Namespace, steps: int, groups: int, common: dict[str, Any],
          log: Callable[[str], None], started: float, warm: bool) -> int:
    """``--live``: seed 0 of the reference and wmrl with every execution on the live sandboxes, one run at a time.

    The clock models each step from in-sandbox execution times on the pool sizes of ``--slots``; the
    trainer's own wall-clock is what those steps really took here (HTTP, queueing on ``--sandboxes``
    servers, a loaded machine). Their ratio says how far to trust the model.
    """
    lr = BASE_SPEC["algorithm"]["learningRate"]
    real = run_jobs([Job(arm="real", seed=0, groups_per_step=groups, learning_rate=lr, steps=steps, budgets=None,
                         live=True, **common)], 1, log)[0]
    wmrl = run_jobs([Job(arm="wmrl", seed=0, groups_per_step=groups, learning_rate=lr,
                         steps=int(math.ceil(steps * args.cap)), budgets=dict(real["cost_s"]), live=True, **common)],
                    1, log)[0]
    arms = {}
    for run in (real, wmrl):
        arms[run["arm"]] = {"steps": run["steps"], "executions": run["executions"], "modelled_cost_s": run["cost_s"],
                            "measured_s": run["wall_s"],
                            "modelled_over_measured": {p: c / run["wall_s"] for p, c in run["cost_s"].items()},
                            "final_reward": run["final_reward"], "initial_reward": run["initial_reward"]}
    results = {"benchmark": "speedup", "version": 3, "live": True, "budgets_s": real["cost_s"],
               "optimism": common["optimism"], "sandbox_start": "warm" if warm else "cold",
               "slots": list(common["slots"]), "sandboxes": args.sandboxes, "judge_cost": args.judge_cost, "arms": arms,
               "runs": [real, wmrl], "wall_clock_s": time.perf_counter() - started}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(results, indent=1, default=_json_default))
    print(json.dumps(results, default=_json_default))
    return 0


def _json_default(value: Any) -> Any:
    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    raise TypeError(f"not JSON-serialisable: {type(value)}")
