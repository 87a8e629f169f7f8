"""One process of tests/trainer/test_distributed_eval.py (run under torchrun, gloo on the CPU).

Evaluates the held-out tasks split across the processes with a policy that is either sharded
over them by torch's own FSDP (``fully_shard``: every forward pass gathers the parameters, so
generation is collective) or replicated. Rank 0 grades through a real sandbox server and writes
the report and every script it executed to ``--out``.

    python -m torch.distributed.run --nproc-per-node 2 fsdp_eval_worker.py \
        --policy DIR --sandbox URL --layout fsdp|replicated --out FILE
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM, AutoTokenizer

from wmrl.api.schema import RolloutSampling
from wmrl_sandbox.dispatcher import SandboxDispatcher, StaticEndpoints
from wmrl_scripted import make_tasks
from wmrl_trainer.distributed import World
from wmrl_trainer.evaluation import HeldOutEvaluator


class RecordingDispatcher(SandboxDispatcher):
    """A real dispatcher that also remembers what it was asked to execute."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.executed: list[tuple[str, str]] = []

    def run_task(self, task, code, *args, **options):
        self.executed.append((task.name, code))
        return super().run_task(task, code, *args, **options)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--policy", required=True)
    parser.add_argument("--sandbox", required=True)
    parser.add_argument("--layout", choices=("fsdp", "replicated"), required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--tasks", type=int, default=3)
    parser.add_argument("--samples", type=int, default=3)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    world = World.from_env()
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(args.policy)
    model = AutoModelForCausalLM.from_pretrained(args.policy)
    sharded = False
    if args.layout == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.tensor import DTensor

        mesh = init_device_mesh("cpu", (world.size,))
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        sharded = all(isinstance(p, DTensor) and p.to_local().numel() < p.numel()
                      for p in model.parameters() if p.numel() >= world.size)
    dispatcher = RecordingDispatcher(StaticEndpoints([args.sandbox]), slots_per_pod=1, timeout=20) \
        if world.is_main else None
    evaluator = HeldOutEvaluator(make_tasks(args.tasks), dispatcher, args.samples, seed=11, max_turns=2)
    sampling = RolloutSampling(maxNewTokens=8, temperature=1.0, topP=1.0)
    try:
        point = evaluator.evaluate(model, tokenizer, sampling, world=world, synced=args.layout == "fsdp")
        if world.is_main:
            with open(args.out, "w") as f:
                json.dump({"report": point, "executed": sorted(dispatcher.executed), "sharded": sharded}, f)
        else:
            assert point is None, "only rank 0 reports"
    finally:
        if dispatcher is not None:
            dispatcher.close()
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
