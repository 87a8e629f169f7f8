"""``wmrl bench speedup``: WMRL against real-execution GRPO, and the ablations, on this machine.

Arms (one field of the same run each; nothing else differs):

| arm | spec |
| --- | --- |
| ``real`` | ``mode: real`` (every rollout executed: the GRPO baseline) |
| ``worldModel`` | ``mode: worldModel`` (no anchors, no correction) |
| ``wmrl`` | ``mode: wmrl``, debiasing and denoising on ("both") |
| ``none`` | ``mode: wmrl``, debiasing off, denoising off |
| ``debias`` | ``mode: wmrl``, debiasing only |
| ``denoise`` | ``mode: wmrl``, denoising only |

Every arm runs the same base manifest (:data:`BASE_SPEC`: the quickstart's policy, world
model, tasks, held-out tasks and hyperparameters) for the same steps and seeds, against the
same local sandbox servers, through the same code path as ``wmrl run``
(:func:`wmrl_trainer.local.train_and_evaluate`), each with a fresh checkpoint folder and, for
the ``wmrl`` family, a fresh calibration service. Runs go one after another, so arms never
compete for the cores.

Measured per run: held-out reward (real execution, tasks never trained on) at fixed steps,
against the training clock (evaluation excluded) and the count of real training
executions. Per arm: the curve's mean and standard deviation over seeds at each
evaluation step; ``final_reward`` (+ ``final_reward_std``); ``time_to_target_s`` and
``executions_to_target``: where the arm's MEAN curve first reaches the target, linearly
interpolated between evaluations, null if it never does; the same per seed for the spread.
Target = the ``real`` arm's mean final held-out reward. ``speedup`` = real's time to target
/ wmrl's. Presets (:data:`PRESETS`): ``--quick`` (< 15 min on 2 cores) and the full run;
measured figures are in ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from wmrl.api.runconfig import RunConfig, from_manifest
from wmrl.api.schema import Mode

ARMS: dict[str, dict[str, Any]] = {
    "real": {"mode": "real"},
    "worldModel": {"mode": "worldModel"},
    "wmrl": {"mode": "wmrl", "debiasing": True, "denoising": True},
    "none": {"mode": "wmrl", "debiasing": False, "denoising": False},
    "debias": {"mode": "wmrl", "debiasing": True, "denoising": False},
    "denoise": {"mode": "wmrl", "debiasing": False, "denoising": True},
}

BASE_SPEC: dict[str, Any] = {
    "policy": {"model": "builtin:tiny-coder", "rolloutEngine": "transformers",
               "sampling": {"temperature": 1.0, "maxNewTokens": 8}},
    "worldModel": {"backend": "learned"},
    "tasks": {"builtin": "mini-ml", "heldOut": ["iris", "wine", "diabetes", "friedman3"]},
    "algorithm": {
        "groupSize": 8, "groupsPerStep": 4, "steps": 30, "learningRate": 0.002,
        "anchors": {"fraction": 0.25, "minPerStep": 1, "maxConcurrent": 8},
        "debiasing": {"minPairs": 32, "refitEvery": 16},
        "denoising": {"warmup": 4, "halfLife": 16},
    },
    "sandbox": {"timeoutSeconds": 60},
    "trainer": {"checkpoint": {"intervalSteps": 1000}},
}
"""The quickstart's run (examples/quickstart.yaml), minus the seed and step budget the bench sets."""

PRESETS = {
    # --quick: < 15 min on 2 cores. Groups of 4 (16 rollouts a step) keep the real arm affordable.
    # Its calibration thresholds are scaled to the 4 anchor pairs a step it collects (first fit after
    # 2 steps), for every arm alike; the full preset keeps the quickstart's.
    # 8 samples per held-out task (4 left the curves mostly noise; 16 took the run past 15 minutes: 15 min 22 s).
    "quick": {"seeds": 2, "steps": 8, "eval_every": 2, "eval_samples": 8, "group_size": 4, "groups_per_step": 4,
              "calibration": {"debiasing": {"minPairs": 8, "refitEvery": 8}, "denoising": {"warmup": 2, "halfLife": 8}}},
    "full": {"seeds": 3, "steps": 20, "eval_every": 4, "eval_samples": 16, "group_size": 8, "groups_per_step": 4,
             "calibration": {}},
}


def arm_config(arm: str, seed: int, steps: int, base: dict[str, Any] = BASE_SPEC,
               group_size: Optional[int] = None, groups_per_step: Optional[int] = None,
               calibration: Optional[dict[str, dict[str, Any]]] = None) -> RunConfig:
    """The run of ``arm`` at ``seed``: the base spec with the arm's mode and corrections, nothing else."""
    settings = ARMS[arm]
    spec = json.loads(json.dumps(base))
    spec["mode"] = settings["mode"]
    alg = spec.setdefault("algorithm", {})
    alg["seed"], alg["steps"] = seed, steps
    if group_size is not None:
        alg["groupSize"] = group_size
    if groups_per_step is not None:
        alg["groupsPerStep"] = groups_per_step
    for part, values in (calibration or {}).items():  # shared by every arm: never an arm's own setting
        alg.setdefault(part, {}).update(values)
    if "debiasing" in settings:
        alg.setdefault("debiasing", {})["enabled"] = settings["debiasing"]
        alg.setdefault("denoising", {})["enabled"] = settings["denoising"]
    return from_manifest({"apiVersion": "wmrl.dev/v1alpha1", "kind": "WMRLRun",
                          "metadata": {"name": f"speedup-{arm.lower()}-s{seed}"}, "spec": spec})


# ---------------------------------------------------------------- aggregation (pure)

def crossing(xs: Sequence[float], ys: Sequence[Optional[float]], target: float) -> Optional[float]:
    """The first x where the piecewise-linear curve (xs, ys) reaches ``target``; None if it never does."""
    prev = None
    for x, y in zip(xs, ys):
        if y is None or (isinstance(y, float) and math.isnan(y)):
            continue
        if y >= target:
            if prev is None or prev[1] >= target:
                return float(x)
            x0, y0 = prev
            return float(x0 + (x - x0) * (target - y0) / (y - y0))
        prev = (x, y)
    return None


def _std(values: Sequence[float]) -> float:
    return float(np.std(values, ddof=1)) if len(values) > 1 else 0.0


def mean_curve(runs: Sequence[dict[str, Any]]) -> dict[str, list]:
    """Mean and std over seeds at each evaluation step every run has."""
    per_run = [{p["step"]: p for p in run["held_out"]["curve"] if p.get("reward") is not None} for run in runs]
    steps = sorted(set.intersection(*(set(c) for c in per_run))) if per_run else []
    out: dict[str, list] = {k: [] for k in ("step", "wall_clock_s", "wall_clock_s_std", "executions", "reward",
                                            "reward_std")}
    for step in steps:
        points = [c[step] for c in per_run]
        out["step"].append(step)
        out["wall_clock_s"].append(float(np.mean([p["wall_clock_s"] for p in points])))
        out["wall_clock_s_std"].append(_std([p["wall_clock_s"] for p in points]))
        out["executions"].append(float(np.mean([p["executions"] for p in points])))
        out["reward"].append(float(np.mean([p["reward"] for p in points])))
        out["reward_std"].append(_std([p["reward"] for p in points]))
    return out


def summarize(runs_by_arm: dict[str, list[dict[str, Any]]], target_arm: str = "real") -> dict[str, Any]:
    """The benchmark's figures from each arm's run results (see the module docstring)."""
    curves = {arm: mean_curve(runs) for arm, runs in runs_by_arm.items()}
    target_curve = curves.get(target_arm)
    target = target_curve["reward"][-1] if target_curve and target_curve["reward"] else None
    arms: dict[str, Any] = {}
    for arm, runs in runs_by_arm.items():
        curve = curves[arm]
        finals = [r["held_out"]["final_reward"] for r in runs if r["held_out"]["final_reward"] is not None]
        entry: dict[str, Any] = {
            "spec": ARMS.get(arm, {}),
            "seeds": [r["seed"] for r in runs],
            "final_reward": float(np.mean(finals)) if finals else None,
            "final_reward_std": _std(finals) if finals else None,
            "final_reward_per_seed": finals,
            "initial_reward": curve["reward"][0] if curve["reward"] else None,
            "train_wall_clock_s": float(np.mean([r["wall_clock_s"] for r in runs])),
            "executions": float(np.mean([r["executions"] for r in runs])),
            "time_to_target_s": None,
            "executions_to_target": None,
            "time_to_target_s_per_seed": [],
            "executions_to_target_per_seed": [],
            "curve": curve,
        }
        if target is not None:
            entry["time_to_target_s"] = crossing(curve["wall_clock_s"], curve["reward"], target)
            entry["executions_to_target"] = crossing(curve["executions"], curve["reward"], target)
            for run in runs:
                pts = [p for p in run["held_out"]["curve"] if p.get("reward") is not None]
                ys = [p["reward"] for p in pts]
                entry["time_to_target_s_per_seed"].append(crossing([p["wall_clock_s"] for p in pts], ys, target))
                entry["executions_to_target_per_seed"].append(crossing([p["executions"] for p in pts], ys, target))
        arms[arm] = entry
    real_t = arms.get(target_arm, {}).get("time_to_target_s")
    wmrl_t = arms.get("wmrl", {}).get("time_to_target_s")
    speedup = real_t / wmrl_t if real_t is not None and wmrl_t not in (None, 0) else None
    return {"target_reward": target, "speedup": speedup, "arms": arms}


# ---------------------------------------------------------------- running

def run_bench(arms: Sequence[str], seeds: Sequence[int], steps: int, eval_every: int, eval_samples: int,
              sandboxes: int, work_dir: Path, log=print, group_size: Optional[int] = None,
              groups_per_step: Optional[int] = None,
              calibration: Optional[dict[str, dict[str, Any]]] = None) -> dict[str, list[dict[str, Any]]]:
    from wmrl_trainer.local import LocalServices, RunOptions, local_runtime, train_and_evaluate

    runs: dict[str, list[dict[str, Any]]] = {arm: [] for arm in arms}
    eval_cache: dict = {}  # deterministic (task, script) -> reward, shared by every evaluation (never by training)
    with LocalServices(sandboxes, work_dir / "logs") as services:
        for seed in seeds:
            for arm in arms:
                config = arm_config(arm, seed, steps, group_size=group_size, groups_per_step=groups_per_step,
                                    calibration=calibration)
                run_dir = work_dir / config.metadata.name
                shutil.rmtree(run_dir, ignore_errors=True)
                service = None
                if config.spec.mode is Mode.WMRL:
                    service = services.start_calibration(run_dir / "calibration-state.json", config.spec.algorithm,
                                                         name=f"calibration-{config.metadata.name}")
                try:
                    config = local_runtime(config, run_dir, services.sandbox_urls,
                                           service.url if service else None)
                    options = RunOptions(eval_every=eval_every, eval_samples=eval_samples, progress=False,
                                         eval_cache=eval_cache)
                    result, _ = train_and_evaluate(config, services.sandbox_urls, run_dir, options)
                finally:
                    if service is not None:
                        services.stop(service)
                held = result["held_out"]
                log(json.dumps({"event": "run", "arm": arm, "seed": seed, "initial": held["initial_reward"],
                                "final": held["final_reward"], "wall_clock_s": round(result["wall_clock_s"], 1),
                                "executions": result["executions"]}), file=sys.stderr, flush=True)
                runs[arm].append(result)
    return runs


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help=f"fewer seeds and steps ({PRESETS['quick']})")
    parser.add_argument("--seeds", type=int, help="seeds per arm (default: 2 quick, 3 full)")
    parser.add_argument("--json", metavar="PATH", required=True, help="write the results JSON here")
    parser.add_argument("--plot", metavar="PATH", help="write the comparison PNG here")
    parser.add_argument("--markdown", metavar="PATH", help="write the Markdown table here")
    parser.add_argument("--arms", default=",".join(ARMS), help="comma-separated subset of arms (default: all)")
    parser.add_argument("--sandboxes", type=int, default=os.cpu_count() or 1, help="local sandbox servers (default: one per core)")
    parser.add_argument("--work-dir", help="keep every run's folder here (default: a temporary folder, removed)")
    # For tests: an extra-tiny setting.
    parser.add_argument("--steps", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--eval-every", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--eval-samples", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--group-size", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--groups-per-step", type=int, help=argparse.SUPPRESS)


def main(args: argparse.Namespace) -> int:
    from wmrl_bench import report
    from wmrl_trainer.local import quiet_libraries

    quiet_libraries()
    preset = dict(PRESETS["quick" if args.quick else "full"])
    for key in ("seeds", "steps", "eval_every", "eval_samples", "group_size", "groups_per_step"):
        if getattr(args, key, None) is not None:
            preset[key] = getattr(args, key)
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    unknown = sorted(set(arms) - set(ARMS))
    if unknown or "real" not in arms or preset["seeds"] < 1 or preset["steps"] < 1:
        print(f"wmrl bench speedup: --arms must include 'real' and only {list(ARMS)} (got unknown {unknown}); "
              "--seeds and --steps must be >= 1", file=sys.stderr)
        return 2
    started = time.perf_counter()
    own_dir = args.work_dir is None
    work_dir = Path(args.work_dir or tempfile.mkdtemp(prefix="wmrl-speedup-"))
    try:
        runs = run_bench(arms, list(range(preset["seeds"])), preset["steps"], preset["eval_every"],
                         preset["eval_samples"], args.sandboxes, work_dir, group_size=preset["group_size"],
                         groups_per_step=preset["groups_per_step"], calibration=preset["calibration"])
    finally:
        if own_dir:
            shutil.rmtree(work_dir, ignore_errors=True)
    results = summarize(runs)
    results = {
        "benchmark": "speedup",
        "quick": bool(args.quick),
        "seeds": list(range(preset["seeds"])),
        "steps": preset["steps"],
        "eval_every": preset["eval_every"],
        "eval_samples_per_task": preset["eval_samples"],
        "group_size": preset["group_size"],
        "groups_per_step": preset["groups_per_step"],
        "calibration_overrides": preset["calibration"],
        "held_out_tasks": BASE_SPEC["tasks"]["heldOut"],
        "base_spec": BASE_SPEC,
        "machine": {"cpus": os.cpu_count(), "sandboxes": args.sandboxes},
        **results,
        "wall_clock_s": time.perf_counter() - started,
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(results, indent=1, default=float))
    if args.plot:
        report.plot(results, args.plot)
    if args.markdown:
        Path(args.markdown).write_text(report.markdown_table(results))
    print(json.dumps(results, default=float))
    return 0
