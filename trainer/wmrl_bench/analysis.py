"""The speedup benchmark's figures from its runs (v3): every configuration judged at the budget, per pool size.

For each pool size P and its budget B (:mod:`.design`): every configuration's mean held-out reward
curve up to B (each run's curve read on P's clock, linear between evaluations), its reward at B
(``final_reward``), the time and executions at which its mean curve first reaches the target within B
(None: not reached within the budget, a censored observation, never counted as 0), per seed likewise,
and the reach rate. The target is the best real configuration's mean reward at B (chosen on the tuning
seeds by :func:`choose`), so t_real = B and wmrl's speedup is B / its time to target.

Intervals: a t-interval below :data:`~wmrl_bench.stats.BOOTSTRAP_MIN_SEEDS` seeds, a bootstrap from
there on, which recomputes exactly the headline (target and wmrl's mean curve) over resampled paired
seeds. Tests: two-sided Wilcoxon for comparisons, Page's L test for a predicted order, one-sided
Wilcoxon for a pre-registered prediction; :func:`holm_over_run` adjusts every test of a run together.

Pure: runs (the ``result.json`` of :func:`wmrl_bench.arm_run.run_job`) in, JSON-ready dicts out.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional, Sequence

import numpy as np

from wmrl_bench.design import ABLATION_ORDER
from wmrl_bench.stats import (BOOTSTRAP_MIN_SEEDS, area_under_curve, bootstrap_ci, holm, mean_interval,
                              page_test, pairwise_tests, reach_rate, wilcoxon)

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


def _exp(value: Optional[float]) -> Optional[float]:
    """exp of a log-speedup bound: 0 for -inf (never reached), inf for inf (at the start), None for None or NaN."""
    if value is None or math.isnan(value):
        return None
    return 0.0 if value == -math.inf else (math.inf if value == math.inf else math.exp(value))


def _costs(run: dict[str, Any], pool: str) -> list[float]:
    return [p["cost_s"][pool] for p in run["curve"]]


def on_clock(run: dict[str, Any], pool: str, costs: Any, key: str = "reward") -> np.ndarray:
    """A run's ``key`` at each of ``costs`` on pool ``pool``'s clock: linear between evaluations, held after
    the last."""
    return np.interp(costs, _costs(run, pool), [p[key] for p in run["curve"]])


def at_cost(run: dict[str, Any], pool: str, cost: float, key: str = "reward") -> float:
    """:func:`on_clock` at one cost."""
    return float(on_clock(run, pool, cost, key))


def _within(run: dict[str, Any], pool: str, budget: float) -> tuple[list[float], list[float]]:
    """The run's curve up to the budget, ending exactly at it (interpolated)."""
    xs, ys = [], []
    for point, x in zip(run["curve"], _costs(run, pool)):
        if x >= budget:
            break
        xs.append(x)
        ys.append(point["reward"])
    return xs + [budget], ys + [at_cost(run, pool, budget)]


def config_summary(runs: Sequence[dict[str, Any]], pool: str, budget: float, target: Optional[float],
                   points: int = 50, seed: int = 0) -> dict[str, Any]:
    """One configuration at pool size ``pool``: its mean curve up to the budget, its reward at the budget
    (``final_reward``: mean, std, interval, per seed) and, given a ``target``, the time and executions at
    which its mean curve first reaches it within the budget (None: not reached, censored at the budget),
    per seed likewise, and the reach rate."""
    grid = np.linspace(0.0, budget, points + 1)
    rewards = np.array([on_clock(r, pool, grid) for r in runs])
    executions = np.array([on_clock(r, pool, grid, "executions") for r in runs])
    finals = rewards[:, -1].tolist()
    entry: dict[str, Any] = {
        "seeds": [r["seed"] for r in runs],
        "final_reward": float(np.mean(finals)), "final_reward_std": _std(finals), "final_reward_per_seed": finals,
        "final_reward_interval": mean_interval(finals, seed=seed),
        "initial_reward": float(np.mean([r["initial_reward"] for r in runs])),
        "steps_at_budget": float(np.mean([at_cost(r, pool, budget, "step") for r in runs])),
        "executions": float(executions[:, -1].mean()),
        "auc": float(np.mean([area_under_curve(*_within(r, pool, budget), budget) for r in runs])),
        "curve": {"cost_s": grid.tolist(), "reward": rewards.mean(axis=0).tolist(),
                  "reward_std": (rewards.std(axis=0, ddof=1) if len(runs) > 1 else np.zeros(len(grid))).tolist(),
                  "executions": executions.mean(axis=0).tolist()},
        "time_to_target_s": None, "executions_to_target": None, "reached": None,
        "time_to_target_s_per_seed": [], "reach_rate": None,
    }
    if target is not None:
        t = crossing(grid, entry["curve"]["reward"], target)
        entry["reached"] = t is not None
        entry["time_to_target_s"] = t
        entry["executions_to_target"] = None if t is None else float(np.interp(t, grid, entry["curve"]["executions"]))
        entry["time_to_target_s_per_seed"] = [crossing(*_within(r, pool, budget), target) for r in runs]
        entry["reach_rate"] = reach_rate(entry["time_to_target_s_per_seed"])
    return entry


def choose(tuning: dict[str, list[dict[str, Any]]], pool: str, budget: float) -> dict[str, Any]:
    """The best real configuration and wmrl's learning rate at pool size ``pool``: the highest mean reward at
    the budget over the tuning seeds (ties: the first in name order)."""
    means = {name: float(np.mean([at_cost(r, pool, budget) for r in runs])) for name, runs in sorted(tuning.items())}
    best = {}
    for arm in ("real", "wmrl"):
        named = [n for n in means if tuning[n][0]["arm"] == arm]
        best[arm] = max(named, key=lambda n: means[n]) if named else None
    return {"best_real": best["real"], "wmrl": best["wmrl"], "reward_at_budget": means,
            "wmrl_learning_rate": tuning[best["wmrl"]][0]["learning_rate"] if best["wmrl"] else None}


def _by_seed(runs: Sequence[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    return {r["seed"]: r for r in runs}


def speedup_statistic(real: Sequence[dict], wmrl: Sequence[dict], pool: str, budget: float,
                      points: int = 50) -> Callable[[np.ndarray], float]:
    """log(budget / wmrl's time to target) over a resample of paired seeds, recomputing the target (the real
    configuration's mean reward at the budget) and wmrl's mean curve: -inf when it is not reached within the
    budget, +inf when wmrl starts there."""
    grid = np.linspace(0.0, budget, points + 1)
    real_finals = np.array([at_cost(r, pool, budget) for r in real])
    wmrl_rewards = np.array([on_clock(r, pool, grid) for r in wmrl])

    def statistic(idx: np.ndarray) -> float:
        t = crossing(grid, wmrl_rewards[idx].mean(axis=0), float(real_finals[idx].mean()))
        if t is None:
            return -math.inf
        return math.inf if t == 0 else math.log(budget / t)
    return statistic


def pool_summary(runs: dict[str, list[dict[str, Any]]], pool: str, budget: float, best_real: str,
                 wmrl: Optional[str], seed: int = 0) -> dict[str, Any]:
    """Every figure at pool size ``pool`` from the evaluation seeds' runs by configuration: the target (the
    best real configuration's mean reward at the budget, so t_real = the budget), every configuration's
    summary, wmrl's speedup (budget / its time to target; None: not reached within the budget) and its
    comparison with the best real configuration, paired by seed."""
    target = float(np.mean([at_cost(r, pool, budget) for r in runs[best_real]]))
    configs = {name: config_summary(rs, pool, budget, target, seed=seed) for name, rs in runs.items() if rs}
    out: dict[str, Any] = {"budget_s": budget, "best_real": best_real, "wmrl": wmrl, "target_reward": target,
                           "speedup": None, "configs": configs, "tests": []}
    if wmrl is None or wmrl not in configs:
        return out
    t = configs[wmrl]["time_to_target_s"]
    out["speedup"] = (budget / t) if t else None
    real_seeds, wmrl_seeds = _by_seed(runs[best_real]), _by_seed(runs[wmrl])
    common = sorted(set(real_seeds) & set(wmrl_seeds))
    if len(common) < 2:
        return out
    a, b = [wmrl_seeds[s] for s in common], [real_seeds[s] for s in common]
    diffs = [at_cost(x, pool, budget) - at_cost(y, pool, budget) for x, y in zip(a, b)]
    versus: dict[str, Any] = {"seeds": common, "reward_difference_at_budget": mean_interval(diffs, seed=seed)}
    per_seed = [crossing(*_within(r, pool, budget), target) for r in a]
    versus["speedup_per_seed"] = [budget / x if x else None for x in per_seed]
    versus["not_reached_within_budget"] = sum(x is None for x in per_seed)
    if len(common) >= BOOTSTRAP_MIN_SEEDS:
        log_speed = bootstrap_ci(speedup_statistic(b, a, pool, budget), len(common), seed=seed)
        versus["log_speedup"] = log_speed
        versus["speedup_interval"] = [_exp(log_speed["low"]), _exp(log_speed["high"])]
    else:  # too few seeds for a bootstrap interval: the per-seed range, censored runs counted apart
        reached = [x for x in versus["speedup_per_seed"] if x is not None]
        versus["speedup_range"] = [min(reached), max(reached)] if reached else None
    out["wmrl_vs_best_real"] = versus
    out["tests"].append({"name": f"P{pool}: {wmrl} vs {best_real}, reward at budget", "test": "wilcoxon two-sided",
                         "n": len(diffs), "mean_difference": float(np.mean(diffs)), "p": wilcoxon(diffs)})
    return out


def ablation_summary(runs: dict[str, list[dict[str, Any]]], pool: str, budget: float,
                     label: str = "") -> Optional[dict[str, Any]]:
    """Page's L test of the paper's order (none < denoise < debias < wmrl) on reward at the budget, and
    two-sided pairwise Wilcoxon tests, over the seeds every ablation arm has (``runs`` keyed by arm)."""
    if not all(runs.get(arm) for arm in ABLATION_ORDER):
        return None
    seeds = sorted(set.intersection(*({r["seed"] for r in runs[arm]} for arm in ABLATION_ORDER)))
    if len(seeds) < 2:
        return None
    finals = {arm: {r["seed"]: at_cost(r, pool, budget) for r in runs[arm]} for arm in ABLATION_ORDER}
    matrix = np.array([[finals[arm][s] for arm in ABLATION_ORDER] for s in seeds])
    pairs = [(ABLATION_ORDER[j], ABLATION_ORDER[i]) for i in range(len(ABLATION_ORDER))
             for j in range(i + 1, len(ABLATION_ORDER))]
    page = page_test(matrix, ABLATION_ORDER, ABLATION_ORDER)
    pairwise = pairwise_tests(matrix, ABLATION_ORDER, pairs)
    tests = [{"name": f"{label}ablation order (Page)", "test": "page", "n": len(seeds), "p": page["p"]}]
    tests += [{"name": f"{label}{p['a']} vs {p['b']}", "test": "wilcoxon two-sided", "n": len(seeds),
               "mean_difference": p["mean_difference"], "p": p["p"]} for p in pairwise]
    return {"seeds": seeds, "mean_final_reward": dict(zip(ABLATION_ORDER, matrix.mean(axis=0).tolist())),
            "page": page, "pairwise": pairwise, "tests": tests}


def holm_over_run(tests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every test of a run in one family: each gets ``p_holm`` adjusted over all of them."""
    adjusted = holm({str(i): t["p"] for i, t in enumerate(tests)})
    return [{**t, "p_holm": adjusted[str(i)]} for i, t in enumerate(tests)]


def _arm_difference(runs: Sequence[dict[str, Any]], a: str, b: str, pool: str, budget: float) -> dict[int, float]:
    """Per seed: arm ``a``'s reward at the budget minus arm ``b``'s (seeds both have)."""
    ra = {r["seed"]: at_cost(r, pool, budget) for r in runs if r["arm"] == a}
    rb = {r["seed"]: at_cost(r, pool, budget) for r in runs if r["arm"] == b}
    return {s: ra[s] - rb[s] for s in sorted(set(ra) & set(rb))}


def judge_grid_summary(runs: Sequence[dict[str, Any]], cells: Sequence[str], pool: str, budget: float,
                       predictions: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    """The corrections' ablation on each synthetic-judge cell, and the pre-registered predictions
    (:data:`~wmrl_bench.synthetic_judge.PREDICTIONS`: ``effect`` "arm - arm", ``cells`` ordered by the
    predicted size of the effect, ``null_in`` cells where none is predicted, ``positive_in`` cells where
    it is > 0) tested: a one-sided Wilcoxon test (the correction helps) in every named cell, marked
    predicted or control, and Page's test that the effect grows along ``cells`` (seeds paired across
    cells)."""
    out: dict[str, Any] = {"cells": {}, "predictions": [], "tests": []}
    by_cell = {c: [r for r in runs if r.get("judge_cell") == c] for c in cells}
    for cell, cell_runs in by_cell.items():
        summary = ablation_summary({arm: [r for r in cell_runs if r["arm"] == arm] for arm in ABLATION_ORDER},
                                   pool, budget, label=f"judge {cell}: ")
        if summary is not None:
            out["cells"][cell] = {k: v for k, v in summary.items() if k != "tests"}
            out["tests"] += summary["tests"]
    for prediction in predictions:
        a, b = (x.strip() for x in prediction["effect"].split("-"))
        entry: dict[str, Any] = {**prediction, "per_cell": {}}
        order = list(prediction.get("cells", ()))
        nulls = set(prediction.get("null_in", ()))
        predicted = set(prediction.get("positive_in", ())) | (set(order) - nulls)
        named = [c for c in dict.fromkeys([*order, *prediction.get("positive_in", ()), *nulls])]
        diffs = {c: _arm_difference(by_cell[c], a, b, pool, budget) for c in named if by_cell.get(c)}
        for cell, d in diffs.items():
            if len(d) < 2:
                continue
            expected = cell in predicted
            p = wilcoxon(list(d.values()), alternative="greater")
            entry["per_cell"][cell] = {"mean_difference": float(np.mean(list(d.values()))), "p_one_sided": p,
                                       "effect_predicted": expected}
            out["tests"].append({"name": f"prediction {prediction['effect']} > 0 in {cell}"
                                         + ("" if expected else " (control: none predicted)"),
                                 "test": "wilcoxon one-sided", "n": len(d), "p": p, "predicted": expected})
        order = [c for c in order if c in diffs]
        if len(order) >= 3:
            seeds = sorted(set.intersection(*(set(diffs[c]) for c in order)))
            if len(seeds) >= 2:
                page = page_test([[diffs[c][s] for c in order] for s in seeds], order, order)
                entry["page"] = page
                out["tests"].append({"name": f"prediction {prediction['effect']} grows along {order}",
                                     "test": "page", "n": len(seeds), "p": page["p"], "predicted": True})
        out["predictions"].append(entry)
    return out
