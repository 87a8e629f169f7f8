"""GPU check of the trainer's launch paths without vLLM (run it through ``tests/gpu/train.sh``).

The GPU smoke test (``run.sh``) needs vLLM; this one needs only torch, TRL and the repo, so it
runs wherever a GPU is, also where vLLM cannot be installed. Generation is TRL's transformers
path. Each case runs ``wmrl launch`` as its own processes, with the tiny policy, the bundled
tasks' scripts executed by a real sandbox server, and the scripted world model of the tests:

1. ``one-gpu``: one process on CUDA (bf16, gradient checkpointing), then a second launch with
   more steps that resumes from the first one's checkpoint (CUDA RNG state included);
2. ``one-gpu-multiturn``: the same with two turns per trajectory;
3. ``two-nodes-ddp``: two launchers as two nodes on this machine's one GPU (both ranks on
   cuda:0; gloo, since NCCL refuses two ranks on one device), DDP, then a relaunch one step
   longer that resumes from their shared checkpoint;
4. ``two-nodes-fsdp``: the same with ``spec.trainer.strategy: fsdp`` (FSDP2 over gloo, sharded
   checkpoints).

The two-node cases hold one task out and evaluate it after every step, split across the two
processes (under FSDP generation is collective): every evaluation must be complete.

Writes one JSON document (``--out``): per case its exit codes, seconds, summary and checks.
Exit 0 when every case passes.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
SCRIPTED = ROOT / "tests" / "trainer"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_config(work: Path, name: str, policy: Path, sandbox_url: str, *, steps: int, max_turns: int = 1,
                 gpus: int = 1, nodes: int = 1, strategy: str = "ddp", held_out: tuple[str, ...] = ()) -> Path:
    trainer = {"gpusPerNode": gpus, "nodes": nodes, "strategy": strategy, "checkpoint": {"intervalSteps": 1}}
    if nodes > 1:
        trainer["checkpoint"]["claimName"] = "shared"  # the launchers share this machine's disk
    config = {
        "apiVersion": "wmrl.dev/v1alpha1", "kind": "WMRLRun", "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "mode": "wmrl",
            "policy": {"model": str(policy), "rolloutEngine": "transformers", "sampling": {"maxNewTokens": 16}},
            "tasks": {"path": str(work / "tasks"), "heldOut": list(held_out)},
            **({"evaluation": {"intervalSteps": 1, "samples": 3}} if held_out else {}),
            "algorithm": {"groupSize": 4, "groupsPerStep": 2, "steps": steps, "learningRate": 1e-3, "seed": 1,
                          "maxTurns": max_turns, "anchors": {"fraction": 0.5}},
            "sandbox": {"timeoutSeconds": 30},
            "trainer": trainer,
        },
        "runtime": {"checkpointDir": str(work / f"ckpt-{name}"), "patchStatus": False, "metricsPort": None,
                    "sandboxUrls": [sandbox_url]},
    }
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def launch(config: Path, logs: Path, *flags: str, env: dict | None = None) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "wmrl.cli", "launch", "--config", str(config), *flags, "--",
           "--world-model", "wmrl_scripted:factory", "--rollouts", str(logs)]
    full_env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SCRIPTED), os.environ.get("PYTHONPATH", "")]),
                **(env or {})}
    return subprocess.Popen(cmd, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def summary_of(out: str) -> dict | None:
    lines = [line for line in out.splitlines() if line.startswith('{"event": "summary"')]
    return json.loads(lines[-1]) if lines else None


def rollout_ranks(logs: Path) -> list[int]:
    return sorted(int(p.stem.split("-")[1]) for p in logs.glob("rank-*.jsonl"))


def run_case(name: str, procs: list[subprocess.Popen], timeout: float) -> tuple[list[int], list[str], float]:
    started = time.monotonic()
    outs = []
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=max(1.0, timeout - (time.monotonic() - started)))
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        outs.append(out)
    return [p.returncode for p in procs], outs, time.monotonic() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "gpu-train.json"))
    parser.add_argument("--work", default="/tmp/wmrl-gpu-train")
    parser.add_argument("--device", default="cuda", help="the device type the runs must report (cpu to try it here)")
    parser.add_argument("--cases", default="one-gpu,one-gpu-multiturn,two-nodes-ddp,two-nodes-fsdp")
    parser.add_argument("--timeout", type=float, default=150.0, help="seconds per case")
    args = parser.parse_args()

    sys.path.insert(0, str(SCRIPTED))
    from wmrl_sandbox.local import LocalServer
    from wmrl_trainer.policy import save_tiny_model
    from wmrl_scripted import make_tasks, save_turn_ending_policy

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    for task in make_tasks(3):
        for rel, content in task.to_files().items():
            (work / "tasks" / task.name / rel).parent.mkdir(parents=True, exist_ok=True)
            (work / "tasks" / task.name / rel).write_bytes(content)
    policy = save_tiny_model(work / "policy")
    ending = save_turn_ending_policy(work / "ending-policy")  # multi-turn rows get second turns

    results: dict = {"device": args.device, "cases": {}}
    wanted = args.cases.split(",")
    gloo = {"WMRL_DDP_BACKEND": "gloo"}
    with LocalServer(slots=4) as server:
        for case in wanted:
            logs = work / f"rollouts-{case}"
            checks: dict[str, bool] = {}
            if case in ("one-gpu", "one-gpu-multiturn"):
                turns = 2 if case.endswith("multiturn") else 1
                model = ending if turns > 1 else policy
                first = write_config(work, case, model, server.url, steps=2, max_turns=turns)
                codes, outs, seconds = run_case(case, [launch(first, logs)], args.timeout)
                again = write_config(work, case, model, server.url, steps=3, max_turns=turns)  # same run, longer
                codes2, outs2, seconds2 = run_case(case, [launch(again, logs)], args.timeout)
                codes, outs, seconds = codes + codes2, outs + outs2, seconds + seconds2
                first_summary, summary = summary_of(outs[0]), summary_of(outs[1])
                checks["exit 0"] = codes == [0, 0]
                checks["device"] = bool(summary) and summary["device"].split(":")[0] == args.device
                checks["resumed at step 2"] = bool(summary) and summary["resumedFrom"] == 2 and summary["finished"]
                checks["one process"] = bool(first_summary) and first_summary["processes"] == 1
                if turns > 1:
                    rows = [json.loads(l) for l in (logs / "rank-0.jsonl").read_text().splitlines()] if (
                        logs / "rank-0.jsonl").exists() else []
                    checks["second turns"] = any(len(r["codes"] or []) > 1 for r in rows)
            else:
                strategy = case.rsplit("-", 1)[1]
                config = write_config(work, case, policy, server.url, steps=2, nodes=2, strategy=strategy,
                                      held_out=("task-2",))
                port = str(free_port())
                common = ("--nnodes", "2", "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", port)
                procs = [launch(config, logs, *common, "--node-rank", str(rank), env=gloo) for rank in (0, 1)]
                codes, outs, seconds = run_case(case, procs, args.timeout)
                # The same run, one step longer: both ranks resume from the shared checkpoint.
                again = write_config(work, case, policy, server.url, steps=3, nodes=2, strategy=strategy,
                                     held_out=("task-2",))
                common = common[:-1] + (str(free_port()),)
                procs = [launch(again, logs, *common, "--node-rank", str(rank), env=gloo) for rank in (0, 1)]
                codes2, outs2, seconds2 = run_case(case, procs, args.timeout)
                codes, outs, seconds = codes + codes2, outs + outs2, seconds + seconds2
                summary = summary_of(outs[2])
                checks["resumed at step 2"] = bool(summary) and summary["resumedFrom"] == 2 and summary["finished"]
                checks["exit 0"] = codes == [0, 0, 0, 0]
                checks["device"] = bool(summary) and summary["device"].split(":")[0] == args.device
                checks["two processes"] = bool(summary) and summary["processes"] == 2
                checks["strategy"] = bool(summary) and summary["strategy"] == strategy
                checks["both ranks logged"] = rollout_ranks(logs) == [0, 1]
                evaluations = [e for out in (outs[0], outs[2]) for e in ((summary_of(out) or {}).get("heldOut") or [])]
                checks["held-out evaluated whole"] = len(evaluations) == 3 and all(e["complete"] for e in evaluations)
            if not all(checks.values()):  # the whole output of a failed case, next to the results
                for i, out in enumerate(outs):
                    (Path(args.out).parent / f"{case}-{i}.log").write_text(out)
            results["cases"][case] = {"exit_codes": codes, "seconds": round(seconds, 1), "checks": checks,
                                      "passed": all(checks.values()), "summary": summary_of(outs[-1])}
            print(json.dumps({"case": case, "passed": all(checks.values()), "checks": checks,
                              "seconds": round(seconds, 1)}), flush=True)
    results["passed"] = all(c["passed"] for c in results["cases"].values())
    Path(args.out).write_text(json.dumps(results, indent=1, default=str))
    return 0 if results["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
