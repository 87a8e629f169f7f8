"""The fidelity report's pictures (matplotlib, Agg): confusion matrices and the reliability curve."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_confusion(arms: Sequence[dict[str, Any]], path: Path, title: str) -> Path:
    """One heatmap per arm: real status (rows) x predicted top status (columns), counts written in the cells."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(arms), figsize=(5.6 * len(arms), 4.6), squeeze=False)
    for ax, arm in zip(axes[0], arms):
        matrix = arm["summary"]["confusion"]
        counts = matrix["counts"]
        peak = max((max(row) for row in counts), default=0) or 1
        ax.imshow(counts, cmap="Blues", vmin=0, vmax=peak)
        for r, row in enumerate(counts):
            for c, value in enumerate(row):
                ax.text(c, r, str(value), ha="center", va="center", fontsize=9,
                        color="white" if value > 0.6 * peak else "black")
        ax.set_xticks(range(len(matrix["predicted"])), matrix["predicted"], rotation=35, ha="right")
        ax.set_yticks(range(len(matrix["real"])), matrix["real"])
        ax.set_xlabel("predicted (top prediction)")
        ax.set_ylabel("real")
        s1 = arm["summary"]["status_at_1"]
        ax.set_title(f"{arm['name']}: status@1 {s1:.3f}" if s1 is not None else f"{arm['name']}: nothing graded",
                     fontsize=10)
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_reliability(arms: Sequence[dict[str, Any]], path: Path, title: str) -> Path:
    """Mean real reward against predicted reward per arm (marker area ~ cases), with the diagonal."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.6, 5.0))
    ax.plot([0, 1], [0, 1], color="grey", linestyle="--", linewidth=1, label="perfectly calibrated")
    for arm in arms:
        points = arm["summary"]["reliability"]
        if not points:
            continue
        xs = [p["predicted"] for p in points]
        ys = [p["real"] for p in points]
        line = ax.plot(xs, ys, marker="", linewidth=1.2, label=arm["name"])[0]
        ax.scatter(xs, ys, s=[20 + 24 * p["cases"] ** 0.5 for p in points], color=line.get_color(), alpha=0.75)
    ax.set_xlim(-0.02, 1.02)
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("predicted reward (top prediction)")
    ax.set_ylabel("mean real reward")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
