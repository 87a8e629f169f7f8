"""``wmrl bench quickstart``: the quickstart over seeds x torch thread counts, and whether every cell learns.

A learning curve must not depend on one lucky seed or on floating-point details (thread
count, BLAS kernels). This runs the same manifest (default ``examples/quickstart.yaml``) as
``wmrl run`` would, once per (seed, threads) cell, each in its own process (``wmrl run
--seed S --threads T``, so a thread count never leaks between cells), and judges every cell
by the same criteria (:data:`CRITERIA`):

* it learns: the held-out reward ends at least ``min_gain`` above where it started;
* it never falls: no evaluation from step ``dip_from_step`` on is below the start minus ``max_dip``;
* it has not collapsed: at the end, every held-out task still gets more than one distinct script;
* every evaluation graded all of its samples (a mean over whichever finished would not compare).

Output: JSON (per cell: curve, gain, verdict and reasons; summary: gain mean, std and
minimum), optionally a Markdown table and a plot of every cell's curve. Exit status 0
when every cell meets the criteria, 1 when one does not (or a run failed), 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

CRITERIA = {"min_gain": 0.10, "max_dip": 0.05, "dip_from_step": 4, "min_distinct_scripts": 2}
DEFAULT_MANIFEST = Path(__file__).resolve().parents[2] / "examples" / "quickstart.yaml"


def judge(results: dict[str, Any], criteria: dict[str, Any] = CRITERIA) -> dict[str, Any]:
    """The verdict on one ``wmrl run`` results.json: figures and the reasons it fails (none = passed)."""
    curve = [p for p in results["held_out"]["curve"] if p.get("reward") is not None]
    reasons = []
    if not results.get("finished") or not curve:
        return {"passed": False, "reasons": ["the run did not finish"], "initial": None, "final": None, "gain": None,
                "min_after": None, "distinct_at_end": None}
    initial, final = curve[0]["reward"], curve[-1]["reward"]
    gain = final - initial
    if gain < criteria["min_gain"]:
        reasons.append(f"gain {gain:+.3f} < {criteria['min_gain']:+.2f}")
    later = [p["reward"] for p in curve if p["step"] >= criteria["dip_from_step"]]
    min_after = min(later) if later else None
    if min_after is not None and min_after < initial - criteria["max_dip"]:
        reasons.append(f"fell to {min_after:.3f} (start {initial:.3f} - {criteria['max_dip']})")
    partial = [p["step"] for p in curve if p.get("graded", p.get("samples")) != p.get("samples")]
    if partial:
        reasons.append(f"evaluations at steps {partial} did not grade every sample")
    distinct = curve[-1].get("distinct_scripts_by_task") or {}
    collapsed = sorted(task for task, n in distinct.items() if n < criteria["min_distinct_scripts"])
    if not distinct:
        reasons.append("no distinct-script counts in the last evaluation")
    elif collapsed:
        reasons.append(f"collapsed to one script on {collapsed}")
    return {"passed": not reasons, "reasons": reasons, "initial": initial, "final": final, "gain": gain,
            "min_after": min_after, "distinct_at_end": min(distinct.values()) if distinct else None}


def summarize(cells: Sequence[dict[str, Any]]) -> dict[str, Any]:
    gains = [c["gain"] for c in cells if c.get("gain") is not None]
    finals = [c["final"] for c in cells if c.get("final") is not None]

    def stats(values: list[float]) -> dict[str, Optional[float]]:
        if not values:
            return {"mean": None, "std": None, "min": None, "max": None}
        return {"mean": float(np.mean(values)), "std": float(np.std(values, ddof=1)) if len(values) > 1 else 0.0,
                "min": float(min(values)), "max": float(max(values))}

    return {"cells": len(cells), "passed": sum(bool(c["passed"]) for c in cells),
            "all_passed": bool(cells) and all(c["passed"] for c in cells),
            "gain": stats(gains), "final": stats(finals),
            "initial": stats([c["initial"] for c in cells if c.get("initial") is not None])}


def markdown_table(report: dict[str, Any]) -> str:
    steps = sorted({p["step"] for c in report["cells"] for p in c.get("curve", [])})
    head = ["seed", "threads", "start", "end", "gain", "lowest from step "
            f"{report['criteria']['dip_from_step']}", "distinct scripts at end (min over tasks)",
            "curve (steps " + ", ".join(map(str, steps)) + ")", "verdict"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]

    def num(x: Optional[float], sign: bool = False) -> str:
        return "n/a" if x is None else (f"{x:+.3f}" if sign else f"{x:.3f}")

    for c in report["cells"]:
        curve = ", ".join(f"{p['reward']:.3f}" for p in c.get("curve", []) if p.get("reward") is not None)
        verdict = "learns" if c["passed"] else "FAILS: " + "; ".join(c["reasons"])
        lines.append(f"| {c['seed']} | {c['threads']} | {num(c['initial'])} | {num(c['final'])} | "
                     f"{num(c['gain'], True)} | {num(c['min_after'])} | {c['distinct_at_end']} | {curve} | {verdict} |")
    s = report["summary"]
    lines.append("")
    lines.append(f"{s['passed']} of {s['cells']} cells meet every criterion; gain {s['gain']['mean']:+.3f} +- "
                 f"{s['gain']['std']:.3f} (min {s['gain']['min']:+.3f}); end {s['final']['mean']:.3f} +- "
                 f"{s['final']['std']:.3f}." if s["gain"]["mean"] is not None else f"{s['passed']} of {s['cells']} cells passed.")
    return "\n".join(lines) + "\n"


def plot(report: dict[str, Any], path: str | Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    threads = sorted({c["threads"] for c in report["cells"]})
    for c in report["cells"]:
        pts = [p for p in c.get("curve", []) if p.get("reward") is not None]
        order = threads.index(c["threads"])  # wide solid first, thinner dashed on top: equal curves stay visible
        label = f"{c['threads']} thread{'s' if c['threads'] != 1 else ''}"
        ax.plot([p["step"] for p in pts], [p["reward"] for p in pts], color=f"C{order}", alpha=0.8,
                linewidth=max(1.0, 4.0 - 1.5 * order), linestyle="-" if order == 0 else "--",
                marker="o" if c["passed"] else "x", markersize=3 if c["passed"] else 7,
                label=label if label not in ax.get_legend_handles_labels()[1] else None)
    ax.set_xlabel("training step")
    ax.set_ylabel("held-out reward (real execution)")
    s = report["summary"]
    ax.set_title(f"{report['manifest_name']}: {s['passed']}/{s['cells']} cells learn (seeds x torch threads)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------- running

def run_cell(manifest: Path, seed: int, threads: int, out_dir: Path, extra: Sequence[str]) -> dict[str, Any]:
    """One ``wmrl run`` in its own process; its results.json judged (a failed run fails the cell)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "wmrl.cli", "run", str(manifest), "--seed", str(seed), "--threads", str(threads),
            "--results", str(out_dir), "--no-progress", *extra]
    started = time.perf_counter()
    with open(out_dir / "run.log", "wb") as log:
        rc = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL).returncode
    cell: dict[str, Any] = {"seed": seed, "threads": threads, "exit_code": rc,
                            "seconds": round(time.perf_counter() - started, 1), "results": str(out_dir / "results.json")}
    try:
        results = json.loads((out_dir / "results.json").read_text())
    except (OSError, ValueError):
        results = {"finished": False, "held_out": {"curve": []}}
    cell.update(judge(results))
    if rc != 0:
        cell["passed"] = False
        cell["reasons"] = [f"wmrl run exited {rc} (log {out_dir / 'run.log'})", *cell["reasons"]]
    cell["curve"] = [{k: p.get(k) for k in ("step", "reward", "samples", "graded", "distinct_scripts_by_task")} for p in
                     results["held_out"]["curve"]]
    cell["warnings"] = results.get("warnings", [])
    return cell


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one value")
    return values


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--manifest", default=str(DEFAULT_MANIFEST), help="the WMRLRun to run (default: the quickstart)")
    parser.add_argument("--seeds", type=_ints, default=[0, 1, 2, 3, 4], help="comma-separated seeds (default 0,1,2,3,4)")
    parser.add_argument("--threads", type=_ints, default=[1, 2], help="comma-separated torch thread counts (default 1,2)")
    parser.add_argument("--parallel", type=int, default=1,
                        help="cells at once (default 1; each cell's figures do not depend on it, only the time)")
    parser.add_argument("--steps", type=int, help="override spec.algorithm.steps (a reduced matrix)")
    parser.add_argument("--eval-every", type=int, help="held-out evaluation every N steps (wmrl run's default)")
    parser.add_argument("--eval-samples", type=int, help="samples per held-out task (wmrl run's default)")
    parser.add_argument("--sandboxes", type=int, help="sandbox servers per cell (wmrl run's default)")
    parser.add_argument("--work-dir", help="keep every cell's results folder here (default: a temporary folder)")
    parser.add_argument("--json", metavar="PATH", required=True, help="write the report JSON here")
    parser.add_argument("--markdown", metavar="PATH", help="write the Markdown table here")
    parser.add_argument("--plot", metavar="PATH", help="write a plot of every cell's held-out curve here")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def main(args: argparse.Namespace) -> int:
    manifest = Path(args.manifest)
    if not manifest.is_file():
        print(f"wmrl bench quickstart: --manifest {manifest}: no such file", file=sys.stderr)
        return 2
    if args.parallel < 1 or min(args.threads) < 1:
        print("wmrl bench quickstart: --parallel and --threads must be >= 1", file=sys.stderr)
        return 2
    extra: list[str] = []
    for flag in ("steps", "eval_every", "eval_samples", "sandboxes"):
        if getattr(args, flag) is not None:
            extra += ["--" + flag.replace("_", "-"), str(getattr(args, flag))]
    work_dir = Path(args.work_dir or tempfile.mkdtemp(prefix="wmrl-quickstart-matrix-"))
    cells = [(seed, threads) for seed in args.seeds for threads in args.threads]
    started = time.perf_counter()
    bar = None
    if not args.no_progress:
        from tqdm import tqdm

        bar = tqdm(total=len(cells), desc="quickstart matrix", unit="cell", dynamic_ncols=True)

    def one(cell: tuple[int, int]) -> dict[str, Any]:
        seed, threads = cell
        result = run_cell(manifest, seed, threads, work_dir / f"seed{seed}-threads{threads}", extra)
        line = (f"seed {seed} threads {threads}: {result['initial']} -> {result['final']} "
                f"{'learns' if result['passed'] else 'FAILS: ' + '; '.join(result['reasons'])}")
        if bar is not None:
            bar.write(line)
            bar.update(1)
        else:
            print(line, file=sys.stderr, flush=True)
        return result

    try:
        with ThreadPoolExecutor(max_workers=args.parallel) as pool:
            results = list(pool.map(one, cells))
    finally:
        if bar is not None:
            bar.close()
    import yaml

    report = {
        "benchmark": "quickstart-matrix",
        "manifest": str(manifest),
        "manifest_name": (yaml.safe_load(manifest.read_text()).get("metadata") or {}).get("name", manifest.stem),
        "seeds": args.seeds, "threads": args.threads, "overrides": extra, "criteria": CRITERIA,
        "machine": {"cpus": os.cpu_count(), "parallel": args.parallel},
        "cells": results,
        "summary": summarize(results),
        "wall_clock_s": round(time.perf_counter() - started, 1),
        "work_dir": str(work_dir),
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(report, indent=1, default=float))
    if args.markdown:
        Path(args.markdown).write_text(markdown_table(report))
    if args.plot:
        plot(report, args.plot)
    print(json.dumps({k: report[k] for k in ("benchmark", "summary", "wall_clock_s")}, default=float), flush=True)
    return 0 if report["summary"]["all_passed"] else 1
