"""``wmrl report RESULTS.json [--plot PATH] [--markdown PATH]``: the speedup comparison as a plot and a table.

Input: the JSON of ``wmrl bench speedup`` (``arms.<name>`` with a mean curve and the
to-target figures), or the ``results.json`` of one ``wmrl run`` (shown as one arm).
Output: a PNG with held-out reward against training wall-clock and against real
executions, one line per arm with a band of +- one standard deviation over seeds, and a
Markdown table in the paper's shape (printed, and written with ``--markdown``).

``wmrl report --eval-dir DIR``: a run's held-out reports instead (``<checkpoint dir>/eval/step-<n>.json``,
written by the trainer's evaluations and by ``wmrl run``'s): the leaderboard percentile per category
and overall over steps and over compute (GPU-hours, or the trainer's hours on CPU), as a PNG
(default ``DIR/curve.png``) and a Markdown table (:mod:`wmrl_trainer.eval_report`).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any, Optional

ARM_ORDER = ("real", "worldModel", "wmrl", "none", "debias", "denoise", "wmrlOnline")
ARM_LABELS = {
    "real": "GRPO, real execution",
    "worldModel": "pure world model",
    "wmrl": "WMRL (debias + denoise)",
    "none": "ablation: no correction",
    "debias": "ablation: debiasing only",
    "denoise": "ablation: denoising only",
    "wmrlOnline": "WMRL, judge learning online",
}


def _ordered(arms: dict[str, Any]) -> list[str]:
    known = [a for a in ARM_ORDER if a in arms]
    return known + sorted(a for a in arms if a not in ARM_ORDER)


def from_run_results(run: dict[str, Any]) -> dict[str, Any]:
    """A ``wmrl run`` results.json as a one-arm comparison (no spread, no target)."""
    curve = [p for p in run["held_out"]["curve"] if p.get("reward") is not None]
    arm = {
        "final_reward": run["held_out"]["final_reward"],
        "final_reward_std": 0.0,
        "time_to_target_s": None,
        "executions_to_target": None,
        "curve": {
            "step": [p["step"] for p in curve],
            "wall_clock_s": [p["wall_clock_s"] for p in curve],
            "executions": [p["executions"] for p in curve],
            "reward": [p["reward"] for p in curve],
            "reward_std": [0.0 for _ in curve],
        },
    }
    return {"target_reward": None, "speedup": None, "arms": {run["mode"]: arm}}


def load_results(path: str | Path) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: cannot read results JSON: {exc}") from exc
    if isinstance(data, dict) and "arms" in data:
        if not isinstance(data["arms"], dict) or not data["arms"]:
            raise ValueError(f"{path}: 'arms' must be a non-empty object")
        return data
    if isinstance(data, dict) and "held_out" in data and "mode" in data:
        return from_run_results(data)
    raise ValueError(f"{path}: neither a speedup benchmark JSON (arms) nor a wmrl run results.json (held_out)")


def _fmt(value: Optional[float], digits: int = 0, suffix: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "not reached"
    return f"{value:.{digits}f}{suffix}"


def _ci(entry: Optional[dict], digits: int = 3, transform=None) -> str:
    if not entry or entry.get("low") is None:
        return "n/a"
    f = transform or (lambda v: v)
    return f"{f(entry['estimate']):.{digits}f} [{f(entry['low']):.{digits}f}, {f(entry['high']):.{digits}f}]"


def _speedup_text(log_ci: Optional[dict]) -> str:
    if not log_ci or log_ci.get("low") is None:
        return "n/a"
    def fmt(v: float) -> str:
        if v == -math.inf:
            return "not reached"
        if v == math.inf:
            return "at start"
        return f"{math.exp(v):.2f}x"
    return f"{fmt(log_ci['estimate'])} [{fmt(log_ci['low'])}, {fmt(log_ci['high'])}]"


def level_markdown(level: str, summary: dict[str, Any]) -> str:
    """One bias level: the arms at equal cost, wmrl against real with intervals, the ablation's tests."""
    lines = [f"#### Judge optimism {level}\n", _arms_table(summary)]
    versus = summary.get("wmrl_vs_real")
    if versus:
        undefined = versus["log_speedup"].get("undefined_share") or 0.0
        lines.append(f"wmrl - real, final reward (paired bootstrap 95%, {len(versus['seeds'])} seeds): "
                     f"{_ci(versus['final_reward_difference'])}; speedup to target: "
                     f"{_speedup_text(versus['log_speedup'])}"
                     + (f" ({undefined:.0%} of resamples undefined)" if undefined else "") + ".\n")
    ablation = summary.get("ablation")
    if ablation:
        page = ablation["page"]
        means = ", ".join(f"{arm} {value:.3f}" for arm, value in ablation["mean_final_reward"].items())
        lines.append(f"Ablation ({len(ablation['seeds'])} seeds; mean final reward {means}): Page's L test of "
                     f"{' < '.join(page['order'])}: L = {page['L']:.1f}, p = {page['p']:.3g}.\n")
        lines += ["| pair | mean difference | p (Wilcoxon) | p (Holm) |", "| --- | ---: | ---: | ---: |"]
        for pair in ablation["pairwise"]:
            lines.append(f"| {pair['a']} - {pair['b']} | {pair['mean_difference']:+.4f} | {pair['p']:.3g} | "
                         f"{pair['p_holm']:.3g} |")
        lines.append("")
    return "\n".join(lines) + "\n"


def _arms_table(summary: dict[str, Any]) -> str:
    arms = summary["arms"]
    real_time = arms.get("real", {}).get("time_to_target_s")
    lines = [f"Target: the real arm's final held-out reward, {summary['target_reward']:.3f}.\n",
             "| arm | steps | time to target (s) | executions to target | reach rate | final reward | area under curve | speedup |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name in _ordered(arms):
        arm = arms[name]
        t = arm.get("time_to_target_s")
        speed = real_time / t if real_time is not None and t not in (None, 0) else None
        reach = arm.get("reach_rate")
        lines.append(f"| {ARM_LABELS.get(name, name)} (`{name}`) | {arm['steps']:.0f} | {_fmt(t, 1)} | "
                     f"{_fmt(arm.get('executions_to_target'), 0)} | {'n/a' if reach is None else f'{reach:.0%}'} | "
                     f"{arm['final_reward']:.3f} +- {arm['final_reward_std']:.3f} | {arm['auc']:.3f} | "
                     f"{_fmt(speed, 2, 'x') if t != 0 else 'at start'} |")
    return "\n".join(lines) + "\n"


def markdown_v2(results: dict[str, Any]) -> str:
    lines = [f"Budget {results['budget_s']:.1f} s of modelled compute per arm (the real arm's mean cost at "
             f"{results['real_steps']} steps; {results['slots']} sandbox slots, judge cost x{results['judge_cost']:g}). "
             f"Headline level (pre-registered): optimism {results['headline_optimism']:g}."
             + (f" {results['max_turns']}-turn trajectories; held-out reward: {results['held_out_evaluation']}."
                if results.get("max_turns", 1) > 1 else "") + "\n"]
    for level, summary in results["levels"].items():
        lines.append(level_markdown(level, summary))
    return "\n".join(lines)


def _interval(entry: Optional[dict], digits: int = 3) -> str:
    if not entry:
        return "n/a"
    return (f"{entry['estimate']:+.{digits}f} [{entry['low']:+.{digits}f}, {entry['high']:+.{digits}f}] "
            f"({entry.get('method', 'bootstrap')}, n = {entry['n']})")


def _config_table(pool: dict[str, Any]) -> str:
    budget = pool["budget_s"]
    lines = ["| configuration | steps at budget | reward at budget | time to target (s) | reach rate | speedup |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for name, entry in sorted(pool["configs"].items(), key=lambda kv: (not kv[0].startswith("real-"), kv[0])):
        t = entry.get("time_to_target_s")
        mark = " (best real)" if name == pool["best_real"] else " (chosen)" if name == pool.get("wmrl") else ""
        speed = "not reached within the budget" if t is None else ("at start" if t == 0 else f"{budget / t:.2f}x")
        reach = entry.get("reach_rate")
        lines.append(f"| `{name}`{mark} | {entry['steps_at_budget']:.1f} | {entry['final_reward']:.3f} +- "
                     f"{entry['final_reward_std']:.3f} | {_fmt(t, 1)} | {'n/a' if reach is None else f'{reach:.0%}'} | "
                     f"{speed} |")
    return "\n".join(lines) + "\n"


def markdown_v3(results: dict[str, Any]) -> str:
    """Every pool size's table of configurations, wmrl against the best real configuration, the ablations
    and every test of the run with its Holm-adjusted p."""
    head = results["headline_slots"]
    lines = [f"Budget per pool size (the reference `{results['reference']}`'s mean cost at {results['real_steps']} "
             f"steps on the tuning seeds {results['tuning']['seeds']}): "
             + ", ".join(f"P = {p}: {b:.1f} s" for p, b in results["budgets_s"].items())
             + f". Judge optimism {results['optimism']:g}, judge cost x{results['judge_cost']:g}. "
             f"Learning rates {results['lr_grid']}, real groupsPerStep {results['real_groups']}."
             + (f" {results['max_turns']}-turn trajectories; held-out reward: {results['held_out_evaluation']}."
                if results.get("max_turns", 1) > 1 else "") + "\n"]
    for p, pool in results["slots"].items():
        chosen = results["tuning"]["chosen"][p]
        lines.append(f"#### P = {p} sandbox slots{' (headline)' if int(p) == head else ''}\n")
        speedup = "not reached within the budget" if pool["speedup"] is None else f"**{pool['speedup']:.2f}x**"
        lines.append(f"Chosen on the tuning seeds: best real `{chosen['best_real']}`, wmrl `{chosen['wmrl']}`. "
                     f"Target: the best real configuration's mean reward at the budget, {pool['target_reward']:.3f}; "
                     f"speedup = budget / time to target: {speedup}.\n")
        lines.append(_config_table(pool))
        versus = pool.get("wmrl_vs_best_real")
        if versus:
            bounds = versus.get("speedup_interval") or versus.get("speedup_range")
            kind = "bootstrap interval" if "speedup_interval" in versus else "per-seed range"
            spread = f"{kind} [{bounds[0]:.2f}x, {bounds[1]:.2f}x]" if bounds else f"{kind} n/a"
            lines.append(f"wmrl - best real, reward at the budget: {_interval(versus['reward_difference_at_budget'])}; "
                         f"speedup {spread}, {versus['not_reached_within_budget']} of {len(versus['seeds'])} seeds "
                         f"not reached within the budget.\n")
    ablation = results.get("ablation")
    if ablation:
        means = ", ".join(f"{arm} {value:.3f}" for arm, value in ablation["mean_final_reward"].items())
        lines.append(f"#### Ablation on the frozen judge (P = {head}, {len(ablation['seeds'])} seeds)\n\n"
                     f"Mean reward at the budget: {means}.\n")
    grid = results.get("judge_grid") or {}
    if grid.get("cells"):
        lines += [f"#### Ablation on the synthetic judge grid (P = {head})\n",
                  "| cell | " + " | ".join(ABLATION_ORDER_REPORT) + " |",
                  "| --- |" + " ---: |" * len(ABLATION_ORDER_REPORT)]
        for cell, entry in grid["cells"].items():
            lines.append(f"| {cell} | " + " | ".join(f"{entry['mean_final_reward'][a]:.3f}"
                                                     for a in ABLATION_ORDER_REPORT) + " |")
        lines.append("")
    if results.get("async"):
        lines.append(async_markdown(results["async"]))
    if results.get("tests"):
        lines += ["#### Every test of this run (Holm over all of them)\n",
                  "| test | kind | n | p | p (Holm, run) |", "| --- | --- | ---: | ---: | ---: |"]
        lines += [f"| {t['name']} | {t['test']} | {t['n']} | {t['p']:.3g} | {t['p_holm']:.3g} |" for t in results["tests"]]
    return "\n".join(lines) + "\n"


ABLATION_ORDER_REPORT = ("none", "denoise", "debias", "wmrl")

LATE_LABELS = {"token": "late rewards, token IS", "sequence": "late rewards, sequence IS",
               "none": "late rewards, no correction", "drop": "late rewards dropped"}


def _num(value: Optional[float], fmt: str) -> str:
    return "n/a" if value is None else format(value, fmt)


def async_markdown(section: dict[str, Any]) -> str:
    """The JSON's ``async``: per pool size, every asynchronous arm at the budget against the best real
    configuration, its manipulation checks, and per arm whether it beats the best real configuration at every P."""
    if not section.get("measured"):
        return f"Asynchronous anchors: not measured{': ' + section['why'] if section.get('why') else ''}.\n"
    lines = [f"#### Asynchronous anchors (waitSeconds at {section['wait_fractions']} of a synchronous wmrl step; "
             f"importance ratio truncated at {section['clip_max']:g})\n",
             "| P | arm | waitSeconds | steps at budget | late share | late groups trained / step | "
             "IS weight (truncated) | reward at budget | - best real (t-interval) | time to target (s) | "
             "speedup vs best real |",
             "| ---: | --- | ---: | ---: | ---: | ---: | --- | ---: | --- | ---: | ---: |"]
    for p, pool in section["slots"].items():
        wmrl = pool.get("wmrl") or {}
        sync = "not reached" if wmrl.get("speedup") is None else f"{wmrl['speedup']:.2f}x"
        lines.append(f"| {p} | synchronous `{wmrl.get('config')}` (target {pool['target_reward']:.3f}, "
                     f"`{pool['best_real']}`) | | | | | | {_num(wmrl.get('final_reward'), '.3f')} | | | {sync} |")
        for name, arm in pool["variants"].items():
            checks = arm["checks"]
            weight = ("n/a" if checks["importance_weight_mean"] is None else
                      f"{checks['importance_weight_mean']:.2f} ({_num(checks['truncated_share'], '.0%')})")
            t = arm["time_to_target_s"]
            speed = "not reached within the budget" if t is None else ("at start" if t == 0 else f"{arm['speedup']:.2f}x")
            capped = arm.get("capped_before_budget") or 0
            steps = f"{arm['steps_at_budget']:.1f}" + (f" ({capped} of {len(arm['seeds'])} at the step cap)" if capped else "")
            lines.append(f"| {p} | `{name}` ({LATE_LABELS.get(arm['late'], arm['late'])}) | {arm['wait_s']:.3f} | "
                         f"{steps} | {_num(checks['late_share'], '.0%')} | {_num(checks['late_trained_per_step'], '.2f')} | "
                         f"{weight} | {arm['final_reward']:.3f} +- {arm['final_reward_std']:.3f} | "
                         f"{_interval(arm.get('vs_best_real'))} | {_fmt(t, 1)} | {speed} |")
    lines.append("")
    goal = section.get("goal") or {}
    for name, arm in (goal.get("arms") or {}).items():
        per = ", ".join(f"P = {p}: {'yes' if ok else 'no'}" for p, ok in arm["per_pool"].items())
        lines.append(f"- `{name}` beats the best real configuration at the budget at every P: "
                     f"**{'yes' if arm['every_pool'] else 'no'}** ({per})")
    return "\n".join(lines) + "\n"


def markdown_table(results: dict[str, Any]) -> str:
    """The comparison in the paper's shape: arm, time and executions to target, final reward, speedup."""
    if results.get("version") == 2:
        return markdown_v2(results)
    if results.get("version") == 3:
        return markdown_v3(results)
    arms = results["arms"]
    real_time = arms.get("real", {}).get("time_to_target_s")
    target = results.get("target_reward")
    lines = []
    if target is not None:
        lines.append(f"Target: the real-execution arm's final held-out reward, {target:.3f}.\n")
    lines += ["| arm | time to target (s) | real executions to target | final held-out reward | speedup vs real |",
              "| --- | ---: | ---: | ---: | ---: |"]
    for name in _ordered(arms):
        arm = arms[name]
        t = arm.get("time_to_target_s")
        speed = real_time / t if real_time is not None and t not in (None, 0) else None
        speed_text = _fmt(speed, 2, "x") if t != 0 else "n/a (target met at start)"
        final = arm.get("final_reward")
        std = arm.get("final_reward_std") or 0.0
        final_text = "n/a" if final is None else f"{final:.3f} +- {std:.3f}"
        executions = arm.get("executions_to_target")
        lines.append(f"| {ARM_LABELS.get(name, name)} (`{name}`) | {_fmt(t, 1)} | {_fmt(executions, 0)} | "
                     f"{final_text} | {speed_text} |")
    if results.get("speedup") is not None:
        lines.append(f"\nSpeedup (real arm's time to target / wmrl's): **{results['speedup']:.2f}x**.")
    elif real_time == 0:
        lines.append("\nSpeedup undefined: the real arm ended no higher than the starting policy, "
                     "so every arm meets the target at step 0.")
    return "\n".join(lines) + "\n"


def plot(results: dict[str, Any], path: str | Path) -> None:
    """Held-out reward against training cost (or wall-clock) and against real executions, mean +- std per arm;
    with several bias levels, a third panel: final reward against the judge's optimism."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    levels = results.get("levels") if len(results.get("levels") or {}) > 1 else {}
    fig, axes = plt.subplots(1, 3 if levels else 2, figsize=(17 if levels else 12, 4.5))
    axes[1].sharey(axes[0])
    target = results.get("target_reward")
    for name in _ordered(results["arms"]):
        curve = results["arms"][name]["curve"]
        reward = np.asarray(curve["reward"], dtype=float)
        std = np.asarray(curve.get("reward_std") or [0.0] * len(reward), dtype=float)
        for ax, key in ((axes[0], "cost_s" if "cost_s" in curve else "wall_clock_s"), (axes[1], "executions")):
            x = np.asarray(curve[key], dtype=float)
            (line,) = ax.plot(x, reward, marker="o" if len(x) <= 12 else None, markersize=3,
                              label=ARM_LABELS.get(name, name),
                              linewidth=2.2 if name in ("real", "wmrl") else 1.2)
            ax.fill_between(x, reward - std, reward + std, color=line.get_color(), alpha=0.15)
    head = str(results.get("headline_slots"))
    for name, arm in (((results.get("async") or {}).get("slots") or {}).get(head) or {}).get("variants", {}).items():
        curve = arm["curve"]
        for ax, key in ((axes[0], "cost_s"), (axes[1], "executions")):
            ax.plot(curve[key], curve["reward"], linestyle="--", linewidth=1.2, label=f"async {name}")
    clock = "training wall-clock (s)" if results.get("version", 1) < 2 else "modelled compute (s)"
    if results.get("version") == 3:
        clock += f", {results['headline_slots']} sandbox slots"
    for ax, label in ((axes[0], clock), (axes[1], "real executions")):
        if target is not None:
            ax.axhline(target, color="grey", linestyle="--", linewidth=1)
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    axes[1].set_xscale("symlog", linthresh=10)
    axes[1].set_xlim(left=0)  # executions are never negative (symlog would show a -10 tick)
    axes[0].set_ylabel("held-out reward (real execution)")
    axes[1].legend(fontsize=8, loc="lower right")
    if levels:
        _plot_levels(axes[2], levels)
    title = "WMRL vs real-execution GRPO: held-out reward"
    if results.get("max_turns", 1) > 1:
        title += f", {results['max_turns']}-turn trajectories (best turn)"
    if results.get("version") == 2:
        title += f" at equal compute (judge optimism {results['headline_optimism']:g})"
    if results.get("version") == 3:
        title += " at equal compute, best real configuration"
    if results.get("speedup") is not None:
        title += f" (speedup to target {results['speedup']:.2f}x)"
    fig.suptitle(title)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_levels(ax: Any, levels: dict[str, Any]) -> None:
    """Final reward (mean +- std over seeds) of every arm at every judge optimism level."""
    xs = sorted(levels, key=float)
    names = _ordered({a: None for level in levels.values() for a in level["arms"]})
    for i, name in enumerate(names):
        points = [(float(x), levels[x]["arms"][name]) for x in xs if name in levels[x]["arms"]]
        offset = (i - len(names) / 2) * 0.004
        ax.errorbar([x + offset for x, _ in points], [a["final_reward"] for _, a in points],
                    yerr=[a["final_reward_std"] for _, a in points], marker="o", markersize=4, capsize=2,
                    label=ARM_LABELS.get(name, name), linewidth=2.2 if name in ("real", "wmrl") else 1.0)
    ax.set_xlabel("judge optimism (pre-registered levels)")
    ax.set_ylabel("final held-out reward at the budget")
    ax.grid(alpha=0.3)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results", nargs="?", help="JSON from 'wmrl bench speedup' (or a 'wmrl run' results.json)")
    parser.add_argument("--eval-dir", metavar="DIR", help="instead: a run's held-out reports (<checkpoint dir>/eval, "
                        "step-<n>.json): percentile per category over steps and compute")
    parser.add_argument("--plot", metavar="PATH", help="write the PNG here (default: next to RESULTS, .png; "
                        "DIR/curve.png with --eval-dir)")
    parser.add_argument("--markdown", metavar="PATH", help="also write the Markdown table here")


def eval_dir_main(args: argparse.Namespace) -> int:
    """``--eval-dir``: a run's held-out curve per category (module docstring)."""
    from wmrl_trainer.eval_report import curves, curves_markdown, load_eval_points, plot_curves

    try:
        curve = curves(load_eval_points(args.eval_dir))
    except ValueError as exc:
        print(f"wmrl report: --eval-dir: {exc}", file=sys.stderr)
        return 2
    if not curve["steps"]:
        reasons = "; ".join(f"step {p['step']}: {p['why']}" for p in curve["partial"])
        print(f"wmrl report: --eval-dir: {args.eval_dir}: no complete evaluation with per-category figures "
              f"({reasons})", file=sys.stderr)
        return 1
    plot_path = Path(args.plot) if args.plot else Path(args.eval_dir) / "curve.png"
    plot_curves(curve, plot_path)
    return _emit(curves_markdown(curve), plot_path, args.markdown)


def _emit(table: str, plot_path: Path, markdown: Optional[str]) -> int:
    """Print the table (and write it to ``markdown``), say where the plot went."""
    if markdown:
        Path(markdown).write_text(table)
    print(table)
    print(f"plot: {plot_path}", file=sys.stderr)
    return 0


def main(args: argparse.Namespace) -> int:
    if (args.results is None) == (args.eval_dir is None):
        print("wmrl report: give RESULTS (a results JSON) or --eval-dir DIR, one of them", file=sys.stderr)
        return 2
    if args.eval_dir is not None:
        return eval_dir_main(args)
    try:
        results = load_results(args.results)
    except ValueError as exc:
        print(f"wmrl report: {exc}", file=sys.stderr)
        return 2
    plot_path = Path(args.plot) if args.plot else Path(args.results).with_suffix(".png")
    plot(results, plot_path)
    return _emit(markdown_table(results), plot_path, args.markdown)
