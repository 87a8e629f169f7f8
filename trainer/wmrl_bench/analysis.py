"""The speedup benchmark's figures from its runs: curves on a common cost grid, times to target, statistics.

**Measured** (per arm, per bias level): the held-out reward curve, exact under the
policy's distribution (:func:`wmrl_bench.arm_run.held_out_reward`), against cost and
against real executions, as a mean over seeds on a common cost grid; final reward (mean,
std, per seed); time and executions to target (target = the ``real`` arm's mean final
reward; where the arm's mean curve first reaches it, and per seed), reach rate, area under
reward-vs-cost; for wmrl against real: paired bootstrap 95% intervals on the final-reward
difference and on the log speedup; for the ablation: Page's L test of the paper's order
(none < denoising < debiasing < both) and Holm-corrected pairwise Wilcoxon tests.

Pure: runs (the ``result.json`` of :func:`wmrl_bench.arm_run.run_job`) in, JSON-ready dicts out.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional, Sequence

import numpy as np

from wmrl_bench.design import ABLATION_ORDER
from wmrl_bench.stats import area_under_curve, bootstrap_ci, paired_bootstrap_ci, page_test, pairwise_tests, reach_rate

REACH_TOLERANCE = 1e-9
"""A curve reaches a target within this much: a mean curve taken over the same finals as the
target (the real arm's own) must reach it whatever order the floats were summed in."""


def crossing(xs: Sequence[float], ys: Sequence[Optional[float]], target: float) -> Optional[float]:
    """The first x where the piecewise-linear curve (xs, ys) reaches ``target`` (within
    REACH_TOLERANCE); None if it never does."""
    target -= REACH_TOLERANCE
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
    """The sample standard deviation; 0 for a single value."""
    return float(np.std(values, ddof=1)) if len(values) > 1 else 0.0


def on_grid(run: dict[str, Any], key: str, grid: np.ndarray) -> np.ndarray:
    """A run's ``key`` (reward or executions) at each cost of ``grid``: linear between evaluations, held after the last."""
    xs = [p["cost_s"] for p in run["curve"]]
    return np.interp(grid, xs, [p[key] for p in run["curve"]])


def mean_curve(runs: Sequence[dict[str, Any]], grid: np.ndarray) -> dict[str, list[float]]:
    """Reward (mean and std over ``runs``) and executions (mean) at each cost of ``grid``."""
    rewards = np.array([on_grid(r, "reward", grid) for r in runs])
    executions = np.array([on_grid(r, "executions", grid) for r in runs])
    return {"cost_s": grid.tolist(), "reward": rewards.mean(axis=0).tolist(),
            "reward_std": (rewards.std(axis=0, ddof=1) if len(runs) > 1 else np.zeros(len(grid))).tolist(),
            "executions": executions.mean(axis=0).tolist()}


def arm_summary(runs: Sequence[dict[str, Any]], grid: np.ndarray, target: Optional[float], budget: float) -> dict[str, Any]:
    """One arm's figures: its mean curve on ``grid``, final reward, cost, area under reward-vs-cost up to
    ``budget`` and, given a ``target``, time and executions to it (of the mean curve and per seed)."""
    curve = mean_curve(runs, grid)
    finals = [r["final_reward"] for r in runs]
    entry: dict[str, Any] = {
        "seeds": [r["seed"] for r in runs],
        "final_reward": float(np.mean(finals)), "final_reward_std": _std(finals), "final_reward_per_seed": finals,
        "initial_reward": float(np.mean([r["initial_reward"] for r in runs])),
        "steps": float(np.mean([r["steps"] for r in runs])), "steps_per_seed": [r["steps"] for r in runs],
        "cost_s": float(np.mean([r["cost_s"] for r in runs])),
        "cost_breakdown_s": {k: float(np.mean([r[f"{k}_s"] for r in runs])) for k in ("compute", "judge", "executions")},
        "executions": float(np.mean([r["executions"] for r in runs])),
        "auc": float(np.mean([area_under_curve([p["cost_s"] for p in r["curve"]], [p["reward"] for p in r["curve"]],
                                               budget) for r in runs])),
        "curve": curve,
        "time_to_target_s": None, "executions_to_target": None,
        "time_to_target_s_per_seed": [], "executions_to_target_per_seed": [], "reach_rate": None,
    }
    if target is not None:
        entry["time_to_target_s"] = crossing(curve["cost_s"], curve["reward"], target)
        entry["executions_to_target"] = crossing(curve["executions"], curve["reward"], target)
        for run in runs:
            xs, ys = [p["cost_s"] for p in run["curve"]], [p["reward"] for p in run["curve"]]
            entry["time_to_target_s_per_seed"].append(crossing(xs, ys, target))
            entry["executions_to_target_per_seed"].append(crossing([p["executions"] for p in run["curve"]], ys, target))
        entry["reach_rate"] = reach_rate(entry["time_to_target_s_per_seed"])
    return entry


def _paired(a: Sequence[dict[str, Any]], b: Sequence[dict[str, Any]]) -> tuple[list[dict], list[dict]]:
    """The runs of two arms on the seeds both have, in seed order."""
    by_b = {r["seed"]: r for r in b}
    common = sorted(r["seed"] for r in a if r["seed"] in by_b)
    by_a = {r["seed"]: r for r in a}
    return [by_a[s] for s in common], [by_b[s] for s in common]


def log_speedup_statistic(real: Sequence[dict], wmrl: Sequence[dict], grid: np.ndarray) -> Callable[[np.ndarray], float]:
    """log(real's time to target / wmrl's) over a resample of seeds: both mean curves and the target recomputed.

    -inf when wmrl's mean curve never reaches the target, +inf when it starts there.
    """
    real_rewards = np.array([on_grid(r, "reward", grid) for r in real])
    wmrl_rewards = np.array([on_grid(r, "reward", grid) for r in wmrl])
    real_finals = np.array([r["final_reward"] for r in real])

    def statistic(idx: np.ndarray) -> float:
        target = float(real_finals[idx].mean())
        t_real = crossing(grid, real_rewards[idx].mean(axis=0), target)
        t_wmrl = crossing(grid, wmrl_rewards[idx].mean(axis=0), target)
        if t_wmrl is None:
            return -math.inf
        if t_wmrl == 0:
            return math.inf if t_real else math.nan
        return math.log(t_real / t_wmrl) if t_real else -math.inf
    return statistic


def level_summary(runs_by_arm: dict[str, list[dict[str, Any]]], budget: float, points: int = 50,
                  seed: int = 0) -> dict[str, Any]:
    """Every figure of one bias level (see the module docstring)."""
    # To the last cost any run reached: the real runs' own costs spread around the budget (their mean).
    end = max([budget] + [r["curve"][-1]["cost_s"] for runs in runs_by_arm.values() for r in runs])
    grid = np.linspace(0.0, end, points + 1)
    real = runs_by_arm.get("real", [])
    target = float(np.mean([r["final_reward"] for r in real])) if real else None
    arms = {arm: arm_summary(runs, grid, target, budget) for arm, runs in runs_by_arm.items() if runs}
    out: dict[str, Any] = {"target_reward": target, "speedup": None, "arms": arms}
    real_t = arms.get("real", {}).get("time_to_target_s")
    wmrl_t = arms.get("wmrl", {}).get("time_to_target_s")
    if real_t is not None and wmrl_t not in (None, 0):
        out["speedup"] = real_t / wmrl_t
    if real and runs_by_arm.get("wmrl"):
        a, b = _paired(runs_by_arm["wmrl"], real)
        if len(a) >= 2:
            diff = paired_bootstrap_ci([r["final_reward"] for r in a], [r["final_reward"] for r in b], seed=seed)
            log_speed = bootstrap_ci(log_speedup_statistic(b, a, grid), len(a), seed=seed)
            out["wmrl_vs_real"] = {
                "seeds": [r["seed"] for r in a],
                "final_reward_difference": diff,
                "log_speedup": log_speed,
                "speedup_ci": [_exp(log_speed["low"]), _exp(log_speed["high"])],
            }
    ablation = [arm for arm in ABLATION_ORDER if runs_by_arm.get(arm)]
    if len(ablation) == len(ABLATION_ORDER):
        seeds = sorted(set.intersection(*({r["seed"] for r in runs_by_arm[arm]} for arm in ablation)))
        if len(seeds) >= 2:
            finals = {arm: {r["seed"]: r["final_reward"] for r in runs_by_arm[arm]} for arm in ablation}
            matrix = np.array([[finals[arm][s] for arm in ablation] for s in seeds])
            pairs = [(ablation[j], ablation[i]) for i in range(len(ablation)) for j in range(i + 1, len(ablation))]
            out["ablation"] = {
                "seeds": seeds,
                "mean_final_reward": dict(zip(ablation, matrix.mean(axis=0).tolist())),
                "page": page_test(matrix, ABLATION_ORDER, ablation),
                "pairwise": pairwise_tests(matrix, ablation, pairs),
            }
    return out


def _exp(value: Optional[float]) -> Optional[float]:
    """exp of a log-speedup bound: 0 for -inf (never reached), inf for inf (at the start), None for None or NaN."""
    if value is None or math.isnan(value):
        return None
    return 0.0 if value == -math.inf else (math.inf if value == math.inf else math.exp(value))
