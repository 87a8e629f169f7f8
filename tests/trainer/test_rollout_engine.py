"""Which engine generates the rollouts: spec.policy.rolloutEngine decides, a GPU does not.

vLLM itself is not part of the dev environment ([train,dev]), so TRL's vLLM generation does not run
in these tests; the CPU vLLM tier runs it (tests/vllm_cpu/test_vllm_rollouts.py). Here: the decision,
the real GRPOConfig it gives on this CPU-only machine, and the wait for a rollout server.
"""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from wmrl.api.runconfig import RunConfig, RunMetadata, Runtime
from wmrl.api.schema import PolicySpec, WMRLRunSpec
from wmrl_trainer.build import grpo_args, rollout_options
from wmrl_trainer.rollout_server import RolloutServerUnavailable, rollout_server_subject, wait_for_rollout_server
from subprocesses import free_port


def policy(**fields) -> PolicySpec:
    return PolicySpec.model_validate({"model": "m", **fields})


def test_vllm_is_used_exactly_when_the_spec_asks_for_it():
    assert rollout_options(policy(rolloutEngine="vllm"), vllm_installed=True) == {
        "use_vllm": True, "vllm_mode": "colocate", "vllm_gpu_memory_utilization": 0.3, "vllm_tensor_parallel_size": 1}
    assert rollout_options(policy(rolloutEngine="vllm", vllmMode="server"), "http://r-rollout.ns.svc:8000",
                           vllm_installed=True) == {
        "use_vllm": True, "vllm_mode": "server", "vllm_server_base_url": "http://r-rollout.ns.svc:8000"}
    assert rollout_options(policy(), vllm_installed=True)["use_vllm"]  # the default engine is vLLM
    for installed in (True, False):
        assert rollout_options(policy(rolloutEngine="transformers"), vllm_installed=installed) == {"use_vllm": False}


@pytest.mark.parametrize("mode", ["colocate", "server"])
def test_asking_for_vllm_where_it_is_missing_is_an_error_naming_the_field(mode):
    with pytest.raises(ValueError, match=r"spec\.policy\.rolloutEngine: vllm, but vLLM is not installed") as err:
        rollout_options(policy(rolloutEngine="vllm", vllmMode=mode), vllm_installed=False)
    assert "rolloutEngine: transformers" in str(err.value)  # and says how to choose the other engine


@pytest.mark.parametrize("mode", ["colocate", "server"])
def test_without_a_gpu_trls_config_generates_with_vllm_in_the_configured_mode(tmp_path, mode):
    spec = WMRLRunSpec.model_validate({
        "policy": {"model": "m", "rolloutEngine": "vllm", "vllmMode": mode},
        "tasks": {"builtin": "mini-ml"}, "algorithm": {"groupSize": 4, "groupsPerStep": 2, "steps": 1},
    })
    config = RunConfig(metadata=RunMetadata(name="t"), spec=spec,
                       runtime=Runtime(checkpoint_dir=str(tmp_path), rollout_url="http://t-rollout.default.svc:8000"))
    generation = rollout_options(spec.policy, config.runtime.rollout_url, vllm_installed=True)
    args = grpo_args(config, str(tmp_path / "trl"), use_cuda=False, generation=generation)
    assert args.use_vllm and args.vllm_mode == mode
    assert args.use_cpu and not args.bf16
    if mode == "server":
        assert args.vllm_server_base_url == "http://t-rollout.default.svc:8000"


def test_server_mode_without_a_server_url_is_an_error_naming_the_field():
    with pytest.raises(ValueError, match=r"spec\.policy\.vllmServerUrl: vllmMode server needs a rollout server"):
        rollout_options(policy(rolloutEngine="vllm", vllmMode="server"), None, vllm_installed=True)


@pytest.mark.parametrize("spec_url,blamed", [
    ("http://mine:8000", r"spec\.policy\.vllmServerUrl: no rollout server answers at http://127\.0\.0\.1:\d+ "),
    (None, r"the rollout Deployment r-rollout \(spec\.policy\.vllmMode server without spec\.policy\.vllmServerUrl"),
])
def test_a_rollout_server_that_is_down_is_a_plain_error_after_the_wait(spec_url, blamed):
    """A loopback port with nothing listening: the error names what the run configured, within the wait."""
    url = f"http://127.0.0.1:{free_port()}"
    started = time.monotonic()
    with pytest.raises(RolloutServerUnavailable, match=blamed) as err:
        wait_for_rollout_server(url, rollout_server_subject(spec_url, "r"), timeout=1.5, interval=0.2)
    assert time.monotonic() - started < 10
    assert "runtime.rolloutWaitSeconds" in str(err.value) and "ConnectError" in str(err.value)


def test_a_rollout_server_that_answers_is_waited_for_no_longer():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        waited = wait_for_rollout_server(f"http://127.0.0.1:{server.server_port}", ("x", "y"), timeout=30)
    finally:
        server.shutdown()
        server.server_close()
    assert waited < 5


class _Health(BaseHTTPRequestHandler):
    """A loopback HTTP server answering /health: the check needs an answer, not a vLLM."""

    def log_message(self, *args):
        pass

    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()
