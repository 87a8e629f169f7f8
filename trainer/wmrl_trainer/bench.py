"""``wmrl bench trainer --json PATH``: seconds per training step split by phase, for each mode.

Everything is real except the scale: the CPU demo policy (``builtin:tiny-coder``, real
solution scripts), the bundled ``mini-ml`` tasks, a real sandbox server process on
127.0.0.1 reached through the real dispatcher, the configured world-model backend
(default ``learned``, the CPU one) and in-process calibration. Each mode trains
``--steps`` TRL steps from the same starting policy; the first step (warm-up: lazy
imports, allocator) is reported but left out of the means.

Phases are what the trainer waited for (they add up to the step): generation, world
model, execution (blocked on sandboxes after the world model finished), calibration,
update (TRL's log-prob passes, loss, backward, optimizer). The figure of merit is
``executionWaitFraction`` in mode ``wmrl``: the share of step time spent waiting on
sandboxes (goal < 10%). ``wmrlAsync`` is mode ``wmrl`` with ``anchors.waitSeconds: 0`` (late anchor
groups train on world-model rewards; their pairs still reach the calibration).

``--max-turns 1,4`` (the default) measures every mode single-turn (``modes.<mode>``) and with
multi-turn trajectories (``modes.<mode>@<turns>turns``, with the multi-turn tiny coder when the
policy is the builtin one; ``wmrlAsync`` is single-turn only), and reports each mode's step cost
at N turns relative to one turn (``turnCost``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from wmrl.api.runconfig import RunConfig, RunMetadata, Runtime
from wmrl.api.schema import WMRLRunSpec
from wmrl_sandbox.local import LocalServer
from wmrl_trainer.build import build_trainer

PHASES = ("generation", "world_model", "execution", "calibration", "update", "total")
MODES = ("real", "worldModel", "wmrl", "wmrlAsync")
ASYNC = "wmrlAsync"  # mode wmrl with anchors.waitSeconds 0: anchors off the critical path (see wmrl_trainer.loop)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", metavar="PATH", help="write the results JSON here (always printed)")
    parser.add_argument("--steps", type=int, default=4, help="TRL steps per mode (the first is warm-up)")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated modes")
    parser.add_argument("--policy", default="builtin:tiny-coder")
    parser.add_argument("--world-model", default="learned", choices=("learned", "transformers", "llm"))
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--groups", type=int, default=4, help="groups per step")
    parser.add_argument("--anchor-fraction", type=float, default=0.25)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--sandbox-slots", type=int, default=4)
    parser.add_argument("--max-turns", default="1,4", help="comma-separated spec.algorithm.maxTurns values")


def run_config(args: argparse.Namespace, mode: str, sandbox_url: str, workdir: Path, max_turns: int = 1) -> Any:
    policy = args.policy
    if max_turns > 1 and policy == "builtin:tiny-coder":
        policy = "builtin:tiny-coder-multiturn"
    spec = WMRLRunSpec.model_validate({
        "mode": "wmrl" if mode == ASYNC else mode,
        "policy": {"model": policy, "rolloutEngine": "transformers",
                   "sampling": {"maxNewTokens": args.max_new_tokens}},
        "worldModel": {"backend": args.world_model},
        "tasks": {"builtin": "mini-ml"},
        "algorithm": {"groupSize": args.group_size, "groupsPerStep": args.groups, "steps": args.steps,
                      "learningRate": 1e-4, "seed": 0, "maxTurns": max_turns,
                      "anchors": {"fraction": args.anchor_fraction, "waitSeconds": 0.0 if mode == ASYNC else None}},
        "sandbox": {"timeoutSeconds": 60},
        "trainer": {"gpusPerNode": 0, "checkpoint": {"intervalSteps": 10**6}},  # one local process
    })
    return RunConfig(metadata=RunMetadata(name=f"bench-{mode.lower()}-{max_turns}"), spec=spec,
                     runtime=Runtime(checkpoint_dir=str(workdir / f"{mode}-{max_turns}"), patch_status=False,
                                     metrics_port=None, sandbox_urls=[sandbox_url]))


def run_key(mode: str, max_turns: int) -> str:
    return mode if max_turns == 1 else f"{mode}@{max_turns}turns"


def summarise(records: list[Any]) -> dict[str, Any]:
    measured = records[1:] if len(records) > 1 else records
    mean = {p: float(np.mean([getattr(r, p) for r in measured])) for p in PHASES}
    total = sum(r.total for r in measured)
    return {
        "steps": len(records),
        "measuredSteps": len(measured),
        "meanSeconds": mean,
        "shareOfStep": {p: (mean[p] / mean["total"] if mean["total"] > 0 else None) for p in PHASES[:-1]},
        "executionWaitFraction": sum(r.execution for r in measured) / total if total > 0 else None,
        "executionsPerStep": float(np.mean([r.executions for r in measured])),
        "sandboxSecondsPerStep": float(np.mean([r.sandbox_seconds for r in measured])),
        "worldModelBusySecondsPerStep": float(np.mean([r.world_model_busy for r in measured])),
        "droppedAnchors": int(sum(r.dropped_anchors for r in records)),
        "lateAnchors": int(sum(r.late_anchors for r in records)),
        "anchorGroupsPerStep": float(np.mean([r.anchor_groups for r in measured])),
        "ungraded": int(sum(r.ungraded for r in records)),
        "meanTurns": (float(np.mean([r.turns["mean_turns"] for r in measured])) if measured and measured[0].turns
                      else None),
        "warmupStep": records[0].to_json() if records else None,
    }


def main(args: argparse.Namespace) -> int:
    import torch

    modes = [m for m in args.modes.split(",") if m]
    unknown = sorted(set(modes) - set(MODES))
    try:
        turns = [int(t) for t in args.max_turns.split(",") if t]
    except ValueError:
        turns = []
    if unknown or args.steps < 1 or not turns or any(t < 1 for t in turns):
        print(f"wmrl bench trainer: --modes must be among {MODES}, --steps >= 1 and --max-turns positive integers",
              file=sys.stderr)
        return 2
    results: dict[str, Any] = {
        "benchmark": "trainer",
        "machine": {"cpus": os.cpu_count(), "torchThreads": torch.get_num_threads(), "python": platform.python_version(),
                    "cuda": torch.cuda.is_available()},
        "settings": {k: v for k, v in vars(args).items() if k != "json"},
        "modes": {},
    }
    with tempfile.TemporaryDirectory(prefix="wmrl-bench-trainer-") as tmp, LocalServer(slots=args.sandbox_slots) as server:
        for max_turns in turns:
            for mode in modes:
                if mode == ASYNC and max_turns > 1:
                    continue  # anchors.waitSeconds is single-turn only
                records: list[Any] = []
                started = time.perf_counter()
                config = run_config(args, mode, server.url, Path(tmp), max_turns)
                trainer = build_trainer(config, callbacks=[records.append])
                try:
                    trainer.train()
                finally:
                    trainer.close()
                results["modes"][run_key(mode, max_turns)] = {**summarise(records), "maxTurns": max_turns,
                                                              "wallSeconds": time.perf_counter() - started}
    results["turnCost"] = {
        run_key(mode, t): results["modes"][run_key(mode, t)]["meanSeconds"]["total"] / results["modes"][mode]["meanSeconds"]["total"]
        for mode in modes for t in turns if t > 1 and run_key(mode, t) in results["modes"] and mode in results["modes"]
        and results["modes"][mode]["meanSeconds"]["total"] > 0
    }
    text = json.dumps(results, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text)
    return 0
