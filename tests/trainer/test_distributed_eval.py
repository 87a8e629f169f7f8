"""Held-out evaluation split across processes, on a policy sharded by FSDP: real torchrun, gloo.

accelerate shards with FSDP only on GPUs, so the trainer's FSDP path needs a GPU (tests/gpu).
What makes it work is the evaluation's lockstep, and that runs here: torch's own FSDP2
(``fully_shard``) on the CPU shards a real policy over two processes, whose every forward pass
gathers the parameters from both. The same split evaluation with the policy replicated on both
processes must sample and execute exactly the same scripts and report the same figures.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def policy_and_sandbox(tmp_path_factory):
    from wmrl_sandbox.local import LocalServer
    from wmrl_scripted import save_turn_ending_policy

    root = tmp_path_factory.mktemp("split-eval")
    policy = save_turn_ending_policy(root / "policy")  # trajectories reach a second turn
    with LocalServer(slots=4) as server:
        yield root, policy, server.url


def evaluate(root: Path, policy: Path, url: str, layout: str, tasks: int, samples: int) -> dict:
    out = root / f"{layout}-{tasks}x{samples}.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    with socket.socket() as probe:  # torchrun's static rendezvous takes no port 0
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(port),
           str(HERE / "fsdp_eval_worker.py"), "--policy", str(policy), "--sandbox", url, "--layout", layout,
           "--out", str(out), "--tasks", str(tasks), "--samples", str(samples)]
    launcher = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
    try:
        output, _ = launcher.communicate(timeout=300)
    finally:
        if launcher.poll() is None:  # a hung collective: no worker may outlive the test
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()
    assert launcher.returncode == 0, output[-6000:]
    return json.loads(out.read_text())


@pytest.mark.parametrize("tasks,samples", [(3, 3), (1, 1)])
def test_a_sharded_policy_evaluates_split_across_processes_as_a_replicated_one(policy_and_sandbox, tasks, samples):
    root, policy, url = policy_and_sandbox
    sharded = evaluate(root, policy, url, "fsdp", tasks, samples)
    replicated = evaluate(root, policy, url, "replicated", tasks, samples)
    assert sharded["sharded"] and not replicated["sharded"]
    report = sharded["report"]
    assert report["complete"] and report["partial"] is None
    assert report["samples"] == report["graded"] == tasks * samples
    # Rows are dealt out in turn; with one trajectory in all, rank 1 only generates stand-ins.
    assert report["sampled_by_rank"] == [(tasks * samples + 1) // 2, tasks * samples // 2]
    assert report["mean_turns"] > 1, "no trajectory reached a second turn: the lockstep was not exercised"
    assert sharded["executed"] == replicated["executed"] and sharded["executed"]
    timeless = {k: v for k, v in report.items() if k != "eval_seconds"}
    assert timeless == {k: v for k, v in replicated["report"].items() if k != "eval_seconds"}
