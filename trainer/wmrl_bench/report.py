"""``wmrl report RESULTS.json [--plot PATH] [--markdown PATH]``: the speedup comparison as a plot and a table.

Input: the JSON of ``wmrl bench speedup`` (``arms.<name>`` with a mean curve and the
to-target figures), or the ``results.json`` of one ``wmrl run`` (shown as one arm).
Output: a PNG with held-out reward against training wall-clock and against real
executions, one line per arm with a band of +- one standard deviation over seeds, and a
Markdown table in the paper's shape (printed, and written with ``--markdown``).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any, Optional

ARM_ORDER = ("real", "worldModel", "wmrl", "none", "debias", "denoise")
ARM_LABELS = {
    "real": "GRPO, real execution",
    "worldModel": "pure world model",
    "wmrl": "WMRL (debias + denoise)",
    "none": "ablation: no correction",
    "debias": "ablation: debiasing only",
    "denoise": "ablation: denoising only",
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


def markdown_table(results: dict[str, Any]) -> str:
    """The comparison in the paper's shape: arm, time and executions to target, final reward, speedup."""
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
    """Held-out reward against training wall-clock and against real executions, mean +- std per arm."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    target = results.get("target_reward")
    for name in _ordered(results["arms"]):
        curve = results["arms"][name]["curve"]
        reward = np.asarray(curve["reward"], dtype=float)
        std = np.asarray(curve.get("reward_std") or [0.0] * len(reward), dtype=float)
        for ax, key in ((axes[0], "wall_clock_s"), (axes[1], "executions")):
            x = np.asarray(curve[key], dtype=float)
            (line,) = ax.plot(x, reward, marker="o", markersize=3, label=ARM_LABELS.get(name, name),
                              linewidth=2.2 if name in ("real", "wmrl") else 1.2)
            ax.fill_between(x, reward - std, reward + std, color=line.get_color(), alpha=0.15)
    for ax, label in ((axes[0], "training wall-clock (s)"), (axes[1], "real executions")):
        if target is not None:
            ax.axhline(target, color="grey", linestyle="--", linewidth=1)
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    axes[1].set_xscale("symlog", linthresh=10)
    axes[1].set_xlim(left=0)  # executions are never negative (symlog would show a -10 tick)
    axes[0].set_ylabel("held-out reward (real execution)")
    axes[1].legend(fontsize=8, loc="lower right")
    title = "WMRL vs real-execution GRPO: held-out reward"
    if results.get("speedup") is not None:
        title += f" (speedup to target {results['speedup']:.2f}x)"
    fig.suptitle(title)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results", help="JSON from 'wmrl bench speedup' (or a 'wmrl run' results.json)")
    parser.add_argument("--plot", metavar="PATH", help="write the PNG here (default: next to RESULTS, .png)")
    parser.add_argument("--markdown", metavar="PATH", help="also write the Markdown table here")


def main(args: argparse.Namespace) -> int:
    try:
        results = load_results(args.results)
    except ValueError as exc:
        print(f"wmrl report: {exc}", file=sys.stderr)
        return 2
    plot_path = Path(args.plot) if args.plot else Path(args.results).with_suffix(".png")
    plot(results, plot_path)
    table = markdown_table(results)
    if args.markdown:
        Path(args.markdown).write_text(table)
    print(table)
    print(f"plot: {plot_path}", file=sys.stderr)
    return 0
