"""``wmrl launch --config FILE``: the trainer Pod's entry point, one training process per GPU.

One process in all (one GPU, or none, on one node) runs ``wmrl train`` in this process.
Otherwise it becomes torchrun (``python -m torch.distributed.run``), which starts
``--nproc-per-node`` processes of ``wmrl train`` here and meets the other nodes' launchers:

* processes per node: ``spec.trainer.gpusPerNode`` (1 without GPUs);
* nodes: ``spec.trainer.nodes``; this node's rank: ``JOB_COMPLETION_INDEX`` (the Indexed Job's);
* rendezvous: ``MASTER_ADDR:MASTER_PORT``, which the operator sets to Pod 0 through the Job's
  headless Service (``<job>-0.<job>``). One node alone rendezvouses on a free local port.

Every flag overrides what the config and environment say (run two launchers on one machine
with ``--nnodes 2 --node-rank 0/1 --master-addr 127.0.0.1`` to try several nodes locally, or
``--nproc-per-node 2`` for two CPU processes). Options after ``--`` go to ``wmrl train``.
A failed process fails the launcher (exit 1), so the Pod fails and the operator restarts the
Job from the last checkpoint, within ``spec.failurePolicy.maxRestarts``. torchrun passes SIGTERM
on to the processes (each checkpoints after its current step) but kills them after its own
shutdown timeout and exits 1: the restart then resumes from the last complete checkpoint.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from typing import Optional

from wmrl.api.runconfig import load_run_config

DEFAULT_MASTER_PORT = 29500


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="the rendered run config (run.yaml from the ConfigMap)")
    parser.add_argument("--nproc-per-node", type=int, help="training processes here (default: spec.trainer.gpusPerNode, "
                        "at least 1)")
    parser.add_argument("--nnodes", type=int, help="launchers that train together (default: spec.trainer.nodes)")
    parser.add_argument("--node-rank", type=int, help="this launcher's place among them (default: $JOB_COMPLETION_INDEX, "
                        "else 0)")
    parser.add_argument("--master-addr", help="where node 0 listens (default: $MASTER_ADDR)")
    parser.add_argument("--master-port", type=int, help=f"its port (default: $MASTER_PORT, else {DEFAULT_MASTER_PORT})")
    parser.add_argument("--dry-run", action="store_true", help="print the command instead of running it")
    parser.add_argument("train_args", nargs=argparse.REMAINDER, help="-- then options for wmrl train "
                        "(--world-model, --summary)")


def _positive(name: str, value: int) -> int:
    if value < 1:
        raise ValueError(f"{name} must be at least 1, got {value}")
    return value


def command(args: argparse.Namespace, gpus_per_node: int, nodes: int,
            env: Optional[dict[str, str]] = None) -> list[str]:
    """The command this launcher runs: ``wmrl train`` itself for one process in all, else torchrun."""
    env = os.environ if env is None else env
    nproc = _positive("--nproc-per-node", args.nproc_per_node if args.nproc_per_node is not None
                      else max(1, gpus_per_node))
    nnodes = _positive("--nnodes", args.nnodes if args.nnodes is not None else nodes)
    node_rank = args.node_rank if args.node_rank is not None else int(env.get("JOB_COMPLETION_INDEX") or 0)
    if not 0 <= node_rank < nnodes:
        raise ValueError(f"node rank {node_rank} is not one of {nnodes} nodes")
    rest = [a for a in (args.train_args or []) if a != "--"]
    train = ["train", "--config", args.config, *rest]
    if nproc * nnodes == 1:
        return [sys.executable, "-m", "wmrl.cli", *train]
    run = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}", f"--nnodes={nnodes}",
           "--max-restarts=0"]  # a failed rank fails the Pod: the operator restarts from the checkpoint
    if nnodes == 1 and not (args.master_addr or args.master_port):
        run.append("--standalone")
    else:
        addr = args.master_addr or env.get("MASTER_ADDR")
        if not addr:
            raise ValueError("several nodes need a rendezvous address: --master-addr or $MASTER_ADDR")
        port = args.master_port or int(env.get("MASTER_PORT") or DEFAULT_MASTER_PORT)
        run += [f"--node-rank={node_rank}", f"--master-addr={addr}", f"--master-port={port}"]
    return run + ["-m", "wmrl.cli", *train]


def main(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    try:
        trainer = load_run_config(args.config).spec.trainer
        cmd = command(args, trainer.gpus_per_node, trainer.nodes)
    except (OSError, ValueError, ValidationError) as exc:
        print(f"wmrl launch: {exc}", file=sys.stderr)
        return 2
    if args.dry_run:
        print(shlex.join(cmd))
        return 0
    sys.stdout.flush()
    os.execv(cmd[0], cmd)  # signals reach torchrun (or the trainer) directly; its exit code is the Pod's
    return 1  # not reached
