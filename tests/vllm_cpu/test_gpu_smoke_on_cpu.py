"""The GPU smoke script (tests/gpu/gpu_smoke.py) run whole on vLLM's CPU build: ``--device cpu`` in
the tier's venv. Everything but CUDA runs as on a lent GPU: the world-model server started with the
operator's rendered args, TRL's colocated vLLM generating two-turn trajectories, anchors on a real
sandbox server, calibration and the update. CUDA itself cannot run here; tests/gpu/run.sh does that."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1200)]

harness = sys.modules["wmrl_vllm_harness"]  # loaded by tests/vllm_cpu/conftest.py
REPO = Path(__file__).resolve().parents[2]


def test_the_gpu_smoke_script_runs_whole_on_cpu(vllm_build, tmp_path):
    env = {**harness.project_env(vllm_build), "OUT": str(tmp_path), "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(harness.free_port()), "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run([str(vllm_build.python), "tests/gpu/gpu_smoke.py", "--device", "cpu", "--steps", "2"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=1100)
    tail = (proc.stdout + proc.stderr)[-6000:]
    out = tmp_path / "gpu-smoke.json"
    assert out.is_file(), f"gpu_smoke.py exited with {proc.returncode} and wrote nothing:\n{tail}"
    result = json.loads(out.read_text())
    assert proc.returncode == 0 and result["ok"], f"{result['checks']}\n{tail}"
    assert set(result["checks"]) == {"device", "vllm_generation", "steps", "world_model_graded",
                                     "world_model_in_training", "anchors_executed", "multi_turn", "parameters_moved"}
    batch = result["world_model_batch"]
    assert batch["graded"] >= 1 and batch["guided"] == "response_format", batch
    assert result["world_model_requests"] >= 1  # the server itself answered: counted in its access log
    assert result["summary"]["steps"] == 2 and len(result["records"]) == 2
    # The server ran the operator's args: only host and port replaced, then the CPU's eager flag.
    rendered, command = result["world_model_rendered_args"], result["world_model_command"]
    assert command[1] == "serve"
    changed = [a for a, r in zip(command[2:], rendered) if a != r]
    assert len(changed) == 2 and changed[0] == "127.0.0.1" and changed[1].isdigit(), changed
    assert command[2 + len(rendered):] == ["--enforce-eager"]
    assert "--structured-outputs-config" in rendered
    assert (tmp_path / "vllm-server.log").is_file()
