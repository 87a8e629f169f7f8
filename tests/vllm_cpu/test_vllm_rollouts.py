"""The trainer's rollouts through a real vLLM (CPU build): TRL's server and colocate modes, and weight sync.

The trainer runs in the harness's venv (vLLM must be importable in its process) as
``tests/vllm_cpu/trainer_run.py``, on the tier's policy model (the tiny Qwen3, trained to end its
answers), in mode ``worldModel`` with the ``learned`` world model, so that nothing but vLLM and
the trainer runs. Server mode talks to ``trl vllm-serve`` started with the command the operator
renders for the rollout Deployment (``harness.local_rollout_command``: host/port replaced,
``--enforce_eager`` added for CPU; the Deployment's cache env is not carried, its paths being the
container's).

Weight sync without CUDA is :mod:`wmrl_trainer.vllm_sync`'s: ``reload_weights`` in process
(colocate) or from files over vLLM's ``/collective_rpc`` (server mode). Each run trains with
learning rate 1e-2, so that one optimizer step moves the policy's log-probs far from the
weights vLLM generated that step with; after ``sync_weights`` they agree again.
"""

import json
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from wmrl.api.runconfig import RunConfig, RunMetadata, Runtime

harness = sys.modules["wmrl_vllm_harness"]
pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1800)]

DRIVER = Path(__file__).resolve().parent / "trainer_run.py"
# Per-token log-prob gaps between vLLM and the policy (both bf16) over a 40-token probe; measured
# figures in docs/trainer.md. Holding the same weights: mean < AGREE_MEAN, largest < AGREE_MAX.
# After one optimizer step at learning rate 1e-2, before the sync: mean > DISAGREE_MEAN.
AGREE_MEAN, AGREE_MAX, DISAGREE_MEAN = 0.02, 0.15, 0.5


def run_spec(policy: Path, max_turns: int, **policy_fields):
    """2 steps of 2 groups of 2 on the tier's policy (server mode unless ``policy_fields`` say otherwise)."""
    return harness.rollout_spec(
        policy, {"sampling": {"maxNewTokens": 48}, **policy_fields},
        mode="worldModel", worldModel={"backend": "learned"},
        algorithm={"groupSize": 2, "groupsPerStep": 2, "steps": 2, "learningRate": 1e-2, "seed": 5, "maxTurns": max_turns},
        trainer={"gpusPerNode": 0, "checkpoint": {"intervalSteps": 100}})  # one CPU process


def run_trainer(build, spec, tmp_path, what="train", timeout=1200, **runtime) -> dict:
    """``trainer_run.py WHAT`` on ``spec`` in the venv; its JSON (the driver's log is kept beside it)."""
    config = RunConfig(metadata=RunMetadata(name="vllm-tier"), spec=spec,
                       runtime=Runtime(checkpoint_dir=str(tmp_path / "ckpt"), patch_status=False, metrics_port=None,
                                       **runtime))
    (tmp_path / "run.yaml").write_text(config.to_yaml())
    out, log = tmp_path / "out.json", tmp_path / "trainer.log"
    with open(log, "wb") as fh:
        proc = subprocess.run([str(build.python), str(DRIVER), what, str(tmp_path / "run.yaml"), str(out)],
                              env=harness.project_env(build), stdout=fh, stderr=subprocess.STDOUT, timeout=timeout)
    tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
    assert out.is_file(), f"trainer_run.py exited with {proc.returncode} and wrote nothing:\n{tail}"
    result = json.loads(out.read_text())
    result["returncode"], result["log_tail"] = proc.returncode, tail
    return result


def assert_trained(result, steps=2, rows=4):
    assert result["returncode"] == 0 and "error" not in result, result.get("traceback") or result["log_tail"]
    assert result["use_vllm"] and result["summary"]["steps"] == steps and result["summary"]["finished"]
    assert [r["step"] for r in result["records"]] == list(range(steps))
    assert all(r["rows"] == rows and r["generation"] > 0 for r in result["records"])
    assert len(result["rollouts"]) == steps * rows
    # TRL measures, per token, how far vLLM's sampling log-probs are from the policy's (vLLM generation only):
    # small at every step, the second included, so vLLM generated with the weights of the first update.
    differences = [h["sampling/sampling_logp_difference/mean"] for h in result["log_history"] if "loss" in h]
    assert len(differences) == steps and max(differences) < AGREE_MEAN, differences


def assert_synced(result):
    """vLLM agreed with the policy at the start, disagreed after the run's last update, agreed after sync_weights."""
    for agreeing in ("gap_initial", "gap_after_sync"):
        assert result[agreeing]["mean"] < AGREE_MEAN and result[agreeing]["max"] < AGREE_MAX, (agreeing, result[agreeing])
    assert result["gap_before_sync"]["mean"] > DISAGREE_MEAN, result["gap_before_sync"]


def rpc_calls(log_text: str, path: str) -> int:
    return len(re.findall(rf'"POST {re.escape(path)} HTTP/1\.1" 200', log_text))


@pytest.fixture(scope="module")
def rollout_server(vllm_build, tmp_path_factory):
    """``trl vllm-serve`` with the operator's rendered rollout command on the tier's policy."""
    spec = harness.rollout_spec(vllm_build.policy)
    rendered = harness.rendered_rollout_command(spec)
    port = harness.free_port()
    server = harness.VLLMServer(harness.local_rollout_command(rendered, vllm_build, port), port,
                                tmp_path_factory.mktemp("rollout") / "trl-vllm-serve.log",
                                env=harness.project_env(vllm_build))
    server.start()
    server.rendered = rendered
    try:
        yield server
    finally:
        server.stop()


def test_trl_vllm_serve_runs_the_operators_rendered_command(rollout_server, vllm_build):
    rendered = rollout_server.rendered
    assert rendered[:2] == ["trl", "vllm-serve"]
    cmd = rollout_server.cmd
    assert cmd == harness.local_rollout_command(rendered, vllm_build, rollout_server.port)
    assert cmd[len(rendered):] == harness.TRL_CPU_ONLY_FLAGS
    assert [a for a, r in zip(cmd[1:], rendered[1:]) if a != r] == ["127.0.0.1", str(rollout_server.port)]
    models = httpx.get(f"{rollout_server.base_url}/models").json()["data"]
    assert [m["id"] for m in models] == [str(vllm_build.policy)]
    log_text = rollout_server.log_path.read_text()
    assert "--weight-transfer-config" in log_text  # TRL's own `vllm serve` command line, which it prints


def test_server_mode_trains_and_syncs_weights_through_files(rollout_server, vllm_build, tmp_path):
    before = rollout_server.log_path.read_text()
    spec = run_spec(vllm_build.policy, max_turns=1)
    result = run_trainer(vllm_build, spec, tmp_path, "sync", rollout_url=rollout_server.base_url.removesuffix("/v1"))
    assert_trained(result)
    assert result["vllm_mode"] == "server" and result["weight_sync"] == "reload-files" and result["device"] == "cpu"
    assert_synced(result)
    # TRL's own sync, tried before the last one: its NCCL group needs CUDA on the trainer's side.
    assert result["trl_sync_error"].startswith("NotImplementedError: Weight synchronization runs on vLLM's NCCL")
    log_text = rollout_server.log_path.read_text()[len(before):]
    # One sync before each step's generation, one by the test; each is a reload on the server.
    assert len(result["syncs"]) == 3 and rpc_calls(log_text, "/collective_rpc") == 3
    assert rpc_calls(log_text, "/v1/completions") >= 2
    assert (tmp_path / "ckpt" / "rollout-weights" / "model.safetensors").is_file()


def test_server_mode_generates_multi_turn_trajectories(rollout_server, vllm_build, tmp_path):
    spec = run_spec(vllm_build.policy, max_turns=2)
    result = run_trainer(vllm_build, spec, tmp_path, rollout_url=rollout_server.base_url.removesuffix("/v1"))
    assert_trained(result)
    assert result["weight_sync"] == "reload-files" and len(result["syncs"]) == 2
    assert max(len(r["codes"]) for r in result["rollouts"]) == 2, "no trajectory reached its second turn"
    assert all(r["turns"] for r in result["records"])


def test_colocate_mode_trains_multi_turn_and_syncs_weights_in_process(vllm_build, tmp_path):
    """vLLM inside the trainer's process, its weights synced with reload_weights. The driver also tries
    TRL's own sync (load_weights) and records what it did (``trl_sync_error``, ``gap_after_trl_sync``):
    not asserted, since the trainer does not use it on CPU (docs/trainer.md has the figures)."""
    spec = run_spec(vllm_build.policy, max_turns=2, vllmMode="colocate")
    result = run_trainer(vllm_build, spec, tmp_path, "sync")
    assert_trained(result)
    assert result["vllm_mode"] == "colocate" and result["weight_sync"] == "reload"
    assert result["backend"] == "CPUWeightSyncGeneration" and len(result["syncs"]) == 3
    assert_synced(result)
    assert max(len(r["codes"]) for r in result["rollouts"]) == 2, "no trajectory reached its second turn"


def test_a_rollout_server_that_is_down_fails_the_trainer_naming_the_field(vllm_build, tmp_path):
    url = f"http://127.0.0.1:{harness.free_port()}"
    spec = run_spec(vllm_build.policy, max_turns=1, vllmServerUrl=url)
    result = run_trainer(vllm_build, spec, tmp_path, rollout_wait_seconds=3, timeout=300)
    assert result["returncode"] == 3
    assert result["error"].startswith(f"RolloutServerUnavailable: spec.policy.vllmServerUrl: no rollout server "
                                      f"answers at {url} ")
