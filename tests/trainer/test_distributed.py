"""Several training processes (``wmrl launch``): real torchrun, gloo on the CPU, real TRL steps.

What is checked, on real processes:

* two processes train the tiny policy in every mode, single- and multi-turn; every rank's
  rows of every step (``wmrl train --rollouts``) put back together give exactly the
  rewards that one process grading the same scripts computes (a fresh WMRLStep with the same
  seed and components, replayed here), and each rank's advantages are its slice of the
  advantages of the whole batch;
* kill -9 of one rank fails the launch (both launchers, when they are two nodes); the next
  launch resumes from the last checkpoint and finishes with the steps an uninterrupted run takes;
* two launchers on this machine (two "nodes", rendezvous on localhost) train together;
* the held-out evaluation is split across the two processes and reported whole by rank 0.

No GPU here: NCCL, FSDP on GPUs and vLLM tensor parallelism are exercised by tests/gpu.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import numpy as np
import pytest
import yaml

from wmrl_trainer.checkpoint import complete_checkpoints

pytestmark = pytest.mark.slow
HERE = Path(__file__).resolve().parent
GROUP_SIZE, GROUPS = 4, 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from wmrl_sandbox.local import LocalServer
    from wmrl_trainer.policy import save_tiny_model
    from wmrl_scripted import make_tasks, save_turn_ending_policy

    root = tmp_path_factory.mktemp("dist")
    for task in make_tasks(3):
        for rel, content in task.to_files().items():
            (root / "tasks" / task.name / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / "tasks" / task.name / rel).write_bytes(content)
    policy = save_tiny_model(root / "policy")
    save_turn_ending_policy(root / "ending-policy")  # multi-turn rows reach second turns
    with LocalServer(slots=4) as server:
        yield root, policy, server.url


def write_config(root: Path, name: str, policy: Path, sandbox_url: str, mode: str = "wmrl", steps: int = 2,
                 max_turns: int = 1, interval: int = 100, held_out: tuple[str, ...] = (),
                 evaluation: Optional[dict] = None) -> Path:
    config = {
        "apiVersion": "wmrl.dev/v1alpha1", "kind": "WMRLRun",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "mode": mode,
            "policy": {"model": str(policy), "rolloutEngine": "transformers", "sampling": {"maxNewTokens": 8}},
            "tasks": {"path": str(root / "tasks"), "heldOut": list(held_out)},
            **({"evaluation": evaluation} if evaluation else {}),
            "algorithm": {"groupSize": GROUP_SIZE, "groupsPerStep": GROUPS, "steps": steps, "learningRate": 1e-2,
                          "seed": 5, "maxTurns": max_turns, "anchors": {"fraction": 0.5}},
            "sandbox": {"timeoutSeconds": 20},
            "trainer": {"gpusPerNode": 0, "checkpoint": {"intervalSteps": interval}},
        },
        "runtime": {"checkpointDir": str(root / f"ckpt-{name}"), "patchStatus": False, "metricsPort": None,
                    "sandboxUrls": [sandbox_url]},
    }
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def launch(config: Path, *flags: str, train_args: tuple[str, ...] = (),
           world_model: str = "wmrl_scripted:factory") -> subprocess.Popen:
    """``wmrl launch``; every process that closes its world model leaves a mark in ``<config>.closed/``."""
    closed = config.parent / f"{config.stem}.closed"
    closed.mkdir(exist_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1", "WMRL_TEST_CLOSED_DIR": str(closed)}
    cmd = [sys.executable, "-m", "wmrl.cli", "launch", "--config", str(config), *flags, "--",
           "--world-model", world_model, *train_args]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def finish(proc: subprocess.Popen, timeout: float = 600) -> str:
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out[-6000:]
    return out


def summary(out: str) -> dict:
    lines = [line for line in out.splitlines() if line.startswith('{"event": "summary"')]
    assert len(lines) == 1, f"one summary (rank 0's) expected, got {len(lines)}"
    return json.loads(lines[0])


def rollouts(directory: Path, ranks: int) -> dict[int, list[dict]]:
    """Rows of each step, in the batch's order, from every rank's log."""
    rows: dict[int, list[dict]] = {}
    for rank in range(ranks):
        for line in (directory / f"rank-{rank}.jsonl").read_text().splitlines():
            row = json.loads(line)
            assert row["rank"] == rank
            rows.setdefault(row["step"], []).append(row)
    return {step: sorted(found, key=lambda r: r["row"]) for step, found in sorted(rows.items())}


def replay(config_path: Path, steps: dict[int, list[dict]], sandbox_url: str) -> dict[int, np.ndarray]:
    """The rewards one process computes for the same scripts: a fresh step with the same components and seed."""
    from wmrl.anchors import AnchorSelector
    from wmrl.api.runconfig import load_run_config
    from wmrl.calibration.client import LocalCalibration
    from wmrl.calibration.state import CalibrationConfig
    from wmrl_sandbox.dispatcher import SandboxDispatcher, StaticEndpoints
    from wmrl_trainer.loop import WMRLStep
    from wmrl_trainer.tasks import load_tasks
    from wmrl_scripted import factory

    config = load_run_config(str(config_path))
    alg, mode = config.spec.algorithm, config.spec.mode.value
    tasks = {t.name: t for t in load_tasks(config.spec.tasks, config.runtime)}
    dispatcher = SandboxDispatcher(StaticEndpoints([sandbox_url]), slots_per_pod=1, timeout=20)
    step = WMRLStep(mode, alg, world_model=None if mode == "real" else factory(None, None),
                    dispatcher=None if mode == "worldModel" else dispatcher,
                    calibration=LocalCalibration(CalibrationConfig.from_spec(alg), trainer_id="default.replay")
                    if mode == "wmrl" else None,
                    selector=AnchorSelector(alg.anchors.fraction, alg.anchors.min_per_step, alg.anchors.max_concurrent,
                                            alg.seed) if mode == "wmrl" else None,
                    execution_timeout=80)
    out = {}
    try:
        for number, rows in steps.items():
            group_tasks = [tasks[rows[g * GROUP_SIZE]["task"]] for g in range(GROUPS)]
            if alg.max_turns == 1:
                codes = [[rows[g * GROUP_SIZE + i]["codes"][0] for i in range(GROUP_SIZE)] for g in range(GROUPS)]
                scored = step.score(step.submit(number, group_tasks, codes))
            else:
                batch = step.begin_trajectories(number, group_tasks, GROUP_SIZE)
                keys = batch.keys()
                for turn in range(alg.max_turns):
                    live = [(keys[r], row["codes"][turn]) for r, row in enumerate(rows) if len(row["codes"]) > turn]
                    if not live:
                        break
                    step.grade_turn(batch, [k for k, _ in live], [c for _, c in live])
                    for r, row in enumerate(rows):  # what the rollout decided locally (budget, truncation)
                        trajectory = batch.get(keys[r])
                        if not trajectory.done and len(row["codes"]) == turn + 1:
                            trajectory.end("turns")
                scored = step.finish_trajectories(batch)
            out[number] = scored.rewards.reshape(-1)
    finally:
        step.close()
        dispatcher.close()
    return out


def check_rows(steps: dict[int, list[dict]], ranks: int) -> None:
    from wmrl_trainer.grpo import wmrl_advantages
    from wmrl_trainer.loop import Scored
    from wmrl_trainer.records import StepRecord

    for number, rows in steps.items():
        assert [r["row"] for r in rows] == list(range(GROUP_SIZE * GROUPS)), f"step {number}: rows missing"
        per_rank = len(rows) // ranks
        assert all(r["rank"] == r["row"] // per_rank for r in rows), "each rank holds its contiguous slice"
        rewards = np.array([np.nan if r["reward"] is None else r["reward"] for r in rows]).reshape(GROUPS, GROUP_SIZE)
        anchors = sorted({r["row"] // GROUP_SIZE for r in rows if r["anchor"]})
        weight = rows[0]["weight"]
        whole = Scored(rewards, anchors, weight, rewards, rewards, rewards, StepRecord(step=number, mode="x"))
        expected, graded = wmrl_advantages(whole)
        np.testing.assert_allclose([r["advantage"] for r in rows], expected, rtol=0, atol=1e-12)
        assert [r["graded"] for r in rows] == graded.tolist()


@pytest.mark.parametrize("mode,max_turns", [("wmrl", 1), ("real", 1), ("worldModel", 1), ("wmrl", 2)])
def test_two_processes_grade_the_whole_batch_once_and_agree(setup, mode, max_turns):
    root, policy, url = setup
    name = f"two-{mode.lower()}-{max_turns}"
    if max_turns > 1:
        policy = root / "ending-policy"
    config = write_config(root, name, policy, url, mode=mode, max_turns=max_turns)
    out = finish(launch(config, "--nproc-per-node", "2", train_args=("--rollouts", str(root / name))))
    result = summary(out)
    assert result["finished"] and result["steps"] == 2
    assert len(list((root / f"{name}.closed").iterdir())) == 2  # each process closed its --world-model object
    steps = rollouts(root / name, ranks=2)
    assert sorted(steps) == [0, 1]
    check_rows(steps, ranks=2)
    if max_turns > 1:
        assert any(len(r["codes"]) > 1 for rows in steps.values() for r in rows), "no trajectory had a second turn"
    for number, rewards in replay(config, steps, url).items():
        got = [np.nan if r["reward"] is None else r["reward"] for r in steps[number]]
        np.testing.assert_allclose(got, rewards, rtol=0, atol=1e-12, err_msg=f"step {number}")


def test_two_processes_split_the_held_out_evaluation_and_rank_0_reports_it_whole(setup):
    """Each process samples its share of the held-out trajectories (3 per task over 2 ranks: an
    uneven split), multi-turn in lockstep; rank 0 executes and reports all of them."""
    root, _, url = setup
    held_out = sorted(p.name for p in (root / "tasks").iterdir())[-1:]
    config = write_config(root, "two-eval", root / "ending-policy", url, mode="real", max_turns=2,
                          held_out=tuple(held_out), evaluation={"intervalSteps": 1, "samples": 3})
    result = summary(finish(launch(config, "--nproc-per-node", "2")))
    assert result["finished"] and result["processes"] == 2
    assert [(e["step"], e["complete"], e["partial"]) for e in result["heldOut"]] == [(1, True, None), (2, True, None)]
    for step in (1, 2):
        report = json.loads((root / "ckpt-two-eval" / "eval" / f"step-{step}.json").read_text())
        assert report["complete"] and report["samples"] == report["graded"] == 3
        assert report["sampled_by_rank"] == [2, 1]
        assert list(report["tasks"]) == held_out and report["reward"] == pytest.approx(report["by_task"][held_out[0]])
        assert report["executed"] >= 1 and 1 <= report["mean_turns"] <= 2


def _worker_pids(launcher: subprocess.Popen) -> list[int]:
    """The training processes under a launcher (torchrun's children running wmrl train)."""
    out = subprocess.run(["ps", "-o", "pid=,ppid=,args=", "-ax"], capture_output=True, text=True).stdout
    children: dict[int, list[tuple[int, str]]] = {}
    for line in out.splitlines():
        pid, ppid, args = line.strip().split(None, 2)
        children.setdefault(int(ppid), []).append((int(pid), args))
    found, todo = [], [launcher.pid]
    while todo:
        for pid, args in children.get(todo.pop(), []):
            todo.append(pid)
            if "wmrl.cli train" in args:
                found.append(pid)
    return found


def launch_all(config: Path, layout: str, port: str) -> list[subprocess.Popen]:
    """Two ranks: one launcher with two processes, or two launchers as two nodes."""
    if layout == "processes":
        return [launch(config, "--nproc-per-node", "2")]
    common = ("--nnodes", "2", "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", port)
    return [launch(config, *common, "--node-rank", str(rank)) for rank in (0, 1)]


@pytest.mark.parametrize("layout", ["processes", "nodes"])
def test_kill_9_of_one_rank_fails_the_launch_and_the_next_one_resumes(setup, layout):
    root, policy, url = setup
    steps = 4
    config = write_config(root, f"resume-{layout}", policy, url, steps=steps, interval=1)
    ckpt = root / f"ckpt-resume-{layout}"
    launchers = launch_all(config, layout, str(free_port()))
    deadline = time.monotonic() + 300
    while not any(s >= 1 for s, _ in complete_checkpoints(ckpt)):
        for proc in launchers:
            assert proc.poll() is None, proc.stdout.read()[-6000:]
        assert time.monotonic() < deadline, "no checkpoint within 300 s"
        time.sleep(0.05)
    workers = [pid for proc in launchers for pid in _worker_pids(proc)]
    assert len(workers) == 2, workers
    os.kill(workers[-1], signal.SIGKILL)  # rank 1 dies mid-run
    for proc in launchers:
        proc.communicate(timeout=300)
        assert proc.returncode != 0, "a dead rank must fail every launcher (and so every Pod)"
    saved = max(s for s, _ in complete_checkpoints(ckpt))
    assert 1 <= saved < steps, saved

    outs = [finish(proc) for proc in launch_all(config, layout, str(free_port()))]
    result = summary(outs[0])
    assert result["resumedFrom"] == saved and result["finished"] and result["steps"] == steps
    assert result["stepsThisProcess"] == steps - saved
    names = {p.name for p in (ckpt / f"step-{steps:08d}").iterdir()}
    assert {"rng_state_0.pth", "rng_state_1.pth", "trainer_state.json", "wmrl_state.json"} <= names

    # Exact: the same weights and anchor selector as a run that was never interrupted (every rank
    # restores its own RNG state; as in test_checkpoint, weights to float rounding).
    from safetensors.torch import load_file
    import torch

    straight = write_config(root, f"straight-{layout}", policy, url, steps=steps, interval=100)
    for proc in launch_all(straight, layout, str(free_port())):
        finish(proc)
    a_dir, b_dir = root / f"ckpt-straight-{layout}" / f"step-{steps:08d}", ckpt / f"step-{steps:08d}"
    a, b = load_file(a_dir / "model.safetensors"), load_file(b_dir / "model.safetensors")
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=0, atol=1e-6, msg=name)
    selector = lambda d: json.loads((d / "wmrl_state.json").read_text())["selector"]  # noqa: E731
    assert selector(a_dir) == selector(b_dir)


def test_two_launchers_on_one_machine_train_as_two_nodes(setup):
    root, policy, url = setup
    config = write_config(root, "nodes", policy, url)
    port = str(free_port())
    common = ("--nnodes", "2", "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", port)
    node0 = launch(config, *common, "--node-rank", "0", train_args=("--rollouts", str(root / "nodes")))
    node1 = launch(config, *common, "--node-rank", "1", train_args=("--rollouts", str(root / "nodes")))
    out0, out1 = finish(node0), finish(node1)
    assert summary(out0)["finished"]
    assert '{"event": "summary"' not in out1  # progress and the summary come from rank 0 only
    check_rows(rollouts(root / "nodes", ranks=2), ranks=2)


def test_a_failure_on_rank_0_stops_every_node_at_once(setup):
    """Rank 0 grades for everyone: when grading fails there, the other node learns it at once
    (instead of waiting in a collective for the process group's timeout)."""
    root, policy, url = setup
    config = write_config(root, "failing", policy, url, steps=3)
    common = ("--nnodes", "2", "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port",
              str(free_port()))
    nodes = [launch(config, *common, "--node-rank", str(rank), world_model="wmrl_scripted:failing_factory")
             for rank in (0, 1)]
    outs = [proc.communicate(timeout=180)[0] for proc in nodes]
    assert all(proc.returncode != 0 for proc in nodes), [o[-3000:] for o in outs]
    assert "world model down" in outs[0]
    assert "rank 0 failed: RuntimeError: world model down" in outs[1], outs[1][-3000:]


def test_the_launcher_refuses_zero_processes_and_a_rank_outside_the_nodes(setup, capsys):
    import argparse

    from wmrl_trainer import launch as launcher

    parser = argparse.ArgumentParser()
    launcher.add_arguments(parser)
    for flags, message in ((["--nproc-per-node", "0"], "--nproc-per-node must be at least 1"),
                           (["--nnodes", "2", "--node-rank", "2", "--master-addr", "a"], "node rank 2 is not one of 2")):
        args = parser.parse_args(["--config", "x.yaml", *flags])
        with pytest.raises(ValueError, match=message):
            launcher.command(args, gpus_per_node=0, nodes=1, env={})
