"""Held-out evaluation reports as a person reads them: Markdown tables and plots.

Two inputs, both written by :func:`wmrl_trainer.evaluation.summarize` (and its callers):

* one evaluation (``wmrl eval``'s ``eval.json``): :func:`report_markdown` (overall, per category,
  per task, cost) and :func:`plot_report` (leaderboard percentile per task, coloured by category,
  with each category's mean);
* a run's evaluations over training, ``<checkpoint dir>/eval/step-<n>.json``
  (:func:`load_eval_points`): :func:`curves` turns them into leaderboard percentile per
  category over steps and over compute, :func:`curves_markdown` and :func:`plot_curves` show it.

The compute axis is what the reports record in ``compute`` (the trainer's, and ``wmrl run``'s):
GPU-hours when every point has them, else the trainer's seconds (a CPU run: wall-clock of the
training steps, evaluations excluded). A partial evaluation is no point on a curve: it is listed
with its reason. Everything here but the file reading and the drawing is pure.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Optional, Sequence

from wmrl.tasks import CATEGORIES

STEP_FILE = re.compile(r"^step-(\d+)\.json$")


def _num(value: Optional[float], digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _share(value: Optional[float]) -> str:
    return "n/a" if value is None else f"{value:.0%}"


# ---------------------------------------------------------------- one evaluation

def _summary_row(name: str, figures: dict[str, Any]) -> str:
    return (f"| {name} | {figures['tasks']} | {_share(figures['valid_rate'])} | {_num(figures['mean_reward'])} | "
            f"{_num(figures['mean_best_position'])} | **{_num(figures['percentile'])}** | "
            f"{_share(figures['any_medal'])} |")


def _medals(medals: Optional[dict[str, float]]) -> str:
    if not medals:
        return "n/a"
    return f"{medals['any']:.0%} ({medals['gold']:.0%} / {medals['silver']:.0%} / {medals['bronze']:.0%})"


def report_markdown(report: dict[str, Any]) -> str:
    """The Markdown of one evaluation report (``wmrl eval``'s ``eval.json``)."""
    lines = [f"# Evaluation: {report.get('policy', '?')}"
             + (f" at {report['checkpoint']}" if report.get("checkpoint") else " (base policy)"), ""]
    lines.append(f"Tasks: {len(report['tasks'])} ({report.get('tasks_source', '')}); {report.get('samples_per_task')} "
                 f"samples per task (avg@{report.get('samples_per_task')}), {report.get('max_turns')} turn(s), "
                 f"temperature {report.get('temperature')}, seed {report.get('seed')}; graded by real execution.")
    lines.append("")
    if not report["complete"]:
        lines += [f"**PARTIAL: {report['partial']}.** No figure of this evaluation is a result; the per-task rows "
                  "below are those whose trajectories were all graded.", ""]
    else:
        lines += [f"Reward (mean best-turn reward over all trajectories): **{report['reward']:.3f}**; "
                  f"leaderboard percentile (valid rate x mean best position): "
                  f"**{report['overall']['percentile']:.3f}**.", ""]
    head = ["| | tasks | valid rate | mean best-turn reward | mean best position | percentile | any medal |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    if report.get("overall"):
        lines += head + [_summary_row(f"`{c}`", f) for c, f in report["by_category"].items()]
        lines += [_summary_row("**overall**", report["overall"]), ""]
    lines += ["| task | category | graded | valid rate | mean best-turn reward | mean best position | percentile | "
              "medals: any (gold / silver / bronze) |",
              "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    for name, t in report["tasks"].items():
        lines.append(f"| {name} | {t['category']} | {t['graded']}/{t['samples']} | {_share(t['valid_rate'])} | "
                     f"{_num(t['mean_reward'])} | {_num(t['mean_best_position'])} | {_num(t['percentile'])} | "
                     f"{_medals(t['medals'])} |")
    lines += ["", f"Cost: {report.get('executed', 0)} real executions ({report.get('distinct_scripts', 0)} distinct "
              f"scripts), {report.get('eval_seconds', 0.0):.1f} s."]
    return "\n".join(lines) + "\n"


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _colour(category: str) -> str:
    return f"C{CATEGORIES.index(category) if category in CATEGORIES else len(CATEGORIES)}"


def plot_report(report: dict[str, Any], path: str | Path) -> None:
    """Leaderboard percentile of each task (bars coloured by category) and each category's mean (lines)."""
    plt = _pyplot()
    names = list(report["tasks"])
    fig, ax = plt.subplots(figsize=(max(6.0, 0.6 * len(names) + 2), 4.2))
    values = [report["tasks"][n]["percentile"] for n in names]
    bars = ax.bar(range(len(names)), [v if v is not None else 0.0 for v in values],
                  color=[_colour(report["tasks"][n]["category"]) for n in names])
    for bar, value in zip(bars, values):
        if value is None:  # a task not all graded: no figure
            bar.set_hatch("//")
    for category, figures in (report.get("by_category") or {}).items():
        if figures["percentile"] is not None:
            ax.axhline(figures["percentile"], color=_colour(category), linestyle="--", linewidth=1,
                       label=f"{category} mean {figures['percentile']:.3f} ({figures['tasks']} tasks)")
    ax.set_xticks(range(len(names)), names, rotation=45, ha="right")
    ax.set_ylim(0, 1)
    ax.set_ylabel("leaderboard percentile\n(valid rate x mean best position)")
    at = f" at step {report['checkpoint_step']}" if report.get("checkpoint_step") is not None else \
        (" (base)" if not report.get("checkpoint") else "")
    title = f"{report.get('policy', '')}{at}: leaderboard percentile per task, avg@{report.get('samples_per_task')}"
    if not report["complete"]:
        title += " (PARTIAL: hatched tasks were not all graded)"
    ax.set_title(title, fontsize=10)
    if report.get("by_category"):
        ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------- a run's evaluations over training

def load_eval_points(directory: str | Path) -> list[dict[str, Any]]:
    """Every ``step-<n>.json`` report in ``directory``, by step; ValueError naming the directory or file."""
    root = Path(directory)
    if not root.is_dir():
        raise ValueError(f"{root}: not a directory")
    found = sorted(((int(m.group(1)), p) for p in root.iterdir() if (m := STEP_FILE.match(p.name))),
                   key=lambda item: item[0])
    if not found:
        raise ValueError(f"{root}: no held-out reports (step-<n>.json, written by a run's evaluations)")
    points = []
    for step, path in found:
        try:
            point = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"{path}: not a held-out report: {exc}") from exc
        if not isinstance(point, dict) or "complete" not in point:
            raise ValueError(f"{path}: not a held-out report (no 'complete')")
        points.append({**point, "step": point.get("step", step)})
    return points


def compute_axis(points: Sequence[dict[str, Any]]) -> tuple[Optional[str], Optional[str]]:
    """(key in ``compute``, axis label): GPU-hours when every point has them, else the trainer's seconds
    when every point has them, else (None, None)."""
    computes = [p.get("compute") or {} for p in points]
    if computes and all(c.get("gpu_hours") is not None for c in computes):
        return "gpu_hours", "GPU-hours of training"
    if computes and all(c.get("train_seconds") is not None for c in computes):
        return "train_seconds", "training seconds (trainer wall-clock, no GPU)"
    return None, None


def curves(points: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Leaderboard percentile over steps (and compute) per category and overall, from a run's reports.

    Complete points with per-category figures only; the others are listed in ``partial`` (step, why)."""
    usable = [p for p in points if p.get("complete") and p.get("overall")]
    partial = [{"step": p["step"], "why": p.get("partial") or "no per-category figures in this report"}
               for p in points if p not in usable]
    key, label = compute_axis(usable)
    compute = None
    if key == "gpu_hours":
        compute = [p["compute"]["gpu_hours"] for p in usable]
    elif key == "train_seconds":
        compute = [p["compute"]["train_seconds"] for p in usable]
    present = [c for c in CATEGORIES if any(c in (p.get("by_category") or {}) for p in usable)]
    return {
        "steps": [p["step"] for p in usable],
        "compute": compute,
        "compute_label": label,
        "reward": [p.get("reward") for p in usable],
        "overall": [p["overall"]["percentile"] for p in usable],
        "by_category": {c: [(p["by_category"].get(c) or {}).get("percentile") for p in usable] for c in present},
        "partial": partial,
    }


def curves_markdown(curve: dict[str, Any]) -> str:
    """The curves as a table: step, compute, held-out reward, overall and per-category percentile."""
    cats = list(curve["by_category"])
    compute = curve["compute"]
    head = ["step"] + ([curve["compute_label"]] if compute is not None else []) + ["held-out reward",
                                                                                 "percentile (overall)"]
    head += [f"percentile `{c}`" for c in cats]
    lines = ["| " + " | ".join(head) + " |", "|" + " ---: |" * len(head)]
    for i, step in enumerate(curve["steps"]):
        row = [str(step)] + ([f"{compute[i]:.4g}"] if compute is not None else [])
        row += [_num(curve["reward"][i]), _num(curve["overall"][i])] + [_num(curve["by_category"][c][i]) for c in cats]
        lines.append("| " + " | ".join(row) + " |")
    for entry in curve["partial"]:
        lines.append(f"\nStep {entry['step']}: no point ({entry['why']}).")
    return "\n".join(lines) + "\n"


def plot_curves(curve: dict[str, Any], path: str | Path, title: str = "") -> None:
    """Percentile per category and overall against steps and, when recorded, against compute."""
    plt = _pyplot()
    panels = [("steps", "optimizer step")] + ([("compute", curve["compute_label"])] if curve["compute"] else [])
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.2), squeeze=False)
    for ax, (key, label) in zip(axes[0], panels):
        x = curve[key]
        only = list(curve["by_category"]) if len(curve["by_category"]) == 1 else []
        ax.plot(x, curve["overall"], marker="o", color="black", linewidth=2,
                label=f"overall (all {only[0]})" if only else "overall")
        for category, values in curve["by_category"].items():
            pairs = [(a, v) for a, v in zip(x, values) if v is not None]
            if pairs and len(curve["by_category"]) > 1:
                ax.plot([a for a, _ in pairs], [v for _, v in pairs], marker=".", color=_colour(category),
                        label=category)
        ax.set_xlabel(label)
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("held-out leaderboard percentile")
    axes[0][0].legend(fontsize=8)
    cats = ", ".join(curve["by_category"])
    fig.suptitle(title or f"held-out leaderboard percentile over training ({cats})")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
