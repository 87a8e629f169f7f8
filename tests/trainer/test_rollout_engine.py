"""Which engine generates the rollouts: spec.policy.rolloutEngine decides, a GPU does not.

vLLM itself is not part of the dev environment ([train,dev]), so TRL's vLLM generation does not run
in these tests (docs/trainer.md, "vLLM without a GPU", says what is known of it on CPUs). Here: the
decision, and the real GRPOConfig it gives on this CPU-only machine.
"""

from __future__ import annotations

import pytest

from wmrl.api.runconfig import RunConfig, RunMetadata, Runtime
from wmrl.api.schema import PolicySpec, WMRLRunSpec
from wmrl_trainer.build import grpo_args, rollout_options


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
