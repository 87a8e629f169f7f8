"""Fails loudly when a TRL / transformers internal that wmrl_trainer.grpo relies on changes.

Each check names what the subclass assumes (see the ``wmrl_trainer.grpo`` docstring). If
one fails after a TRL upgrade, re-read that method and adapt ``wmrl_trainer/grpo.py``
before relaxing the test.
"""

from __future__ import annotations

import functools
import inspect
from importlib.metadata import version

import pytest
import torch
from transformers import Trainer, TrainingArguments
from trl import GRPOConfig, GRPOTrainer

from wmrl_trainer.grpo import WMRLGRPOTrainer, restorable_device


def _params(fn) -> list[str]:
    return list(inspect.signature(fn).parameters)


def test_trl_is_the_pinned_version():
    assert version("trl") == "1.16.0", "wmrl_trainer.grpo was written against trl 1.16.0: re-check the internals"


def test_generate_takes_prompts_and_returns_completions_fourth():
    assert _params(GRPOTrainer._generate) == ["self", "prompts"]
    source = inspect.getsource(GRPOTrainer._generate)
    assert "return prompt_ids, completion_ids, tool_mask, completions, logprobs, extra_fields, images, tool_images" in source


def test_generate_and_score_completions_contract():
    assert _params(GRPOTrainer._generate_and_score_completions) == ["self", "inputs"]
    source = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    for key in ('"advantages": advantages', '"completion_mask": completion_mask', '"num_items_in_batch": num_items_in_batch',
                'output["tool_mask"] = tool_mask'):
        assert key in source, f"output key changed: {key}"
    # rewards are computed inside it (so our reward function runs before the advantages are returned)
    assert "self._calculate_rewards(inputs, prompts, completions, completion_ids_list)" in source
    assert "self._generate(prompts)" in source


def test_multi_turn_rollout_hooks():
    """rollout_func gets (prompts, trainer), its env_mask becomes the tool_mask (no loss on those tokens), and the
    two helpers the multi-turn rollout calls keep their shapes."""
    assert "rollout_func" in _params(GRPOTrainer.__init__)
    generate = inspect.getsource(GRPOTrainer._generate)
    assert "output = self.rollout_func(prompts, self)" in generate
    assert 'tool_mask = extra_fields.pop("env_mask", None)' in generate
    assert _params(GRPOTrainer._tokenize_prompts) == ["self", "prompts"]
    assert "return prompt_ids, images, multimodal_fields" in inspect.getsource(GRPOTrainer._tokenize_prompts)
    single = inspect.getsource(GRPOTrainer._generate_single_turn)
    assert _params(GRPOTrainer._generate_single_turn)[:5] == ["self", "prompt_ids", "images", "multimodal_fields",
                                                             "num_generations"]
    assert "return completion_ids, logprobs" in single
    loss = inspect.getsource(GRPOTrainer._compute_loss)
    assert 'completion_mask if "tool_mask" not in inputs else completion_mask * inputs["tool_mask"]' in loss


def test_reward_functions_get_columns_as_kwargs_and_may_return_none():
    source = inspect.getsource(GRPOTrainer._calculate_rewards)
    assert "prompts=prompts, completions=completions, completion_ids=completion_ids_list, **reward_kwargs" in source
    assert "reward if reward is not None else torch.nan" in source


def test_groups_are_consecutive_rows_of_the_generation_batch():
    source = inspect.getsource(GRPOTrainer._get_train_sampler)
    assert "mini_repeat_count=self.num_generations" in source
    assert "batch_size=self.args.generation_batch_size // self.num_generations" in source


def test_loss_uses_completion_mask_and_num_items_in_batch():
    source = inspect.getsource(GRPOTrainer._compute_loss)
    assert 'completion_mask = inputs["completion_ids"], inputs["completion_mask"]' in source
    assert 'inputs["num_items_in_batch"]' in source
    assert 'advantages = inputs["advantages"]' in source


def test_late_anchor_rows_rely_on_trls_batch_split_loss_and_log_prob_pass():
    """anchors.lateRewards (wmrl_trainer.late): rows appended to the batch are split with it into
    steps_per_generation equal micro-batches, the loss takes per-token (B, T) advantages, TRL's own IS ratio
    multiplies the per-token loss before the KL term, and the log-prob pass has the signature the trainer calls."""
    prepare = inspect.getsource(GRPOTrainer._prepare_inputs)
    assert "split_tensor_dict(generation_batch, self.args.steps_per_generation)" in prepare
    assert "shuffle_sequence_dict(generation_batch)" in prepare
    loss = inspect.getsource(GRPOTrainer._compute_loss)
    assert "if advantages.dim() == 1:" in loss and "advantages = advantages.unsqueeze(1)" in loss
    assert loss.index('per_token_loss * inputs["importance_sampling_ratio"]') < loss.index("self.beta * per_token_kl")
    assert 'old_per_token_logps = per_token_logps.detach() if old_per_token_logps is None' in loss
    assert _params(GRPOTrainer._get_per_token_logps_and_entropies)[:6] == [
        "self", "model", "input_ids", "attention_mask", "logits_to_keep", "batch_size"]
    import trl.models.utils

    assert callable(trl.models.utils.disable_gradient_checkpointing)  # the pass runs without it, as TRL's
    score = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    for key in ('output["old_per_token_logps"]', 'output["importance_sampling_ratio"]',
                'output["sampling_per_token_logps"]', 'output["ref_per_token_logps"]'):
        assert key in score, f"per-row output key changed: {key}"


def test_config_fields_we_set_exist():
    fields = GRPOConfig.__dataclass_fields__
    for name in ("num_generations", "generation_batch_size", "beta", "entropy_coef", "max_completion_length",
                 "use_vllm", "vllm_mode", "vllm_server_base_url", "vllm_gpu_memory_utilization", "shuffle_dataset",
                 "temperature", "top_p", "num_iterations", "loss_type"):
        assert name in fields, f"GRPOConfig.{name} is gone"
    assert GRPOConfig.__dataclass_fields__["loss_type"].default == "dapo"


def test_checkpoint_internals_of_transformers_trainer():
    for name in ("save_model", "_save_optimizer_and_scheduler", "_save_rng_state", "_load_rng_state",
                 "_load_optimizer_and_scheduler", "_load_from_checkpoint"):
        assert hasattr(Trainer, name), f"transformers.Trainer.{name} is gone"
    assert "resume_from_checkpoint" in _params(Trainer.train)


def test_resume_maps_the_optimizer_state_to_args_device_read_from_a_cached_property():
    """WMRLGRPOTrainer._load_optimizer_and_scheduler swaps the cached device while transformers' loads."""
    source = inspect.getsource(Trainer._load_optimizer_and_scheduler)
    assert 'map_location = self.args.device if self.args.world_size > 1 else "cpu"' in source
    assert isinstance(inspect.getattr_static(TrainingArguments, "_setup_devices"), functools.cached_property)
    assert "return self._setup_devices" in inspect.getsource(TrainingArguments.device.fget)


def test_an_indexed_cpu_is_restorable_only_as_plain_cpu(tmp_path):
    """What accelerate names a CPU process's device (cpu:<rank>) torch.load cannot restore to; the device
    the trainer maps to instead loads the same optimizer state."""
    path = tmp_path / "optimizer.pt"
    torch.save({"state": {0: {"exp_avg": torch.arange(3.0)}}}, path)
    with pytest.raises(RuntimeError, match="cpu:0"):
        torch.load(path, map_location=torch.device("cpu", 0), weights_only=True)
    loaded = torch.load(path, map_location=restorable_device(torch.device("cpu", 0)), weights_only=True)
    assert torch.equal(loaded["state"][0]["exp_avg"], torch.arange(3.0))
    assert restorable_device(torch.device("cpu", 1)) == torch.device("cpu")
    assert restorable_device(torch.device("cuda", 1)) == torch.device("cuda", 1)  # a GPU keeps its index


@pytest.mark.parametrize("name", ["_generate", "_generate_and_score_completions", "_load_optimizer_and_scheduler"])
def test_our_overrides_match_the_base_signature(name):
    assert _params(getattr(WMRLGRPOTrainer, name)) == _params(getattr(GRPOTrainer, name))


def test_vllm_backend_hooks_for_the_cpu_weight_sync():
    """wmrl_trainer.vllm_sync swaps the module-level name GRPOTrainer.__init__ builds its vLLM backend from, and
    overrides the backend's _init_vllm and sync_weights; TRL calls sync_weights before generating."""
    from trl.generation.vllm_generation import VLLMGeneration
    from trl.trainer import grpo_trainer

    assert grpo_trainer.VLLMGeneration is VLLMGeneration
    assert "self.vllm_generation = VLLMGeneration(" in inspect.getsource(GRPOTrainer.__init__)
    assert "self._init_vllm()" in inspect.getsource(VLLMGeneration.__init__)
    assert _params(VLLMGeneration.sync_weights) == ["self"] and _params(VLLMGeneration._iter_named_params) == ["self"]
    for method in (GRPOTrainer._generate_single_turn, GRPOTrainer._generate):
        assert "self.vllm_generation.sync_weights()" in inspect.getsource(method)
    init = inspect.getsource(VLLMGeneration._init_vllm)
    assert "self.vllm_client.init_communicator(device=accelerator.device)" in init  # what CPU server mode skips
    for attribute in ("self.server_base_url", "self.server_host", "self.server_port", "self.group_port",
                      "self.server_timeout", "self.llm = LLM("):
        assert attribute in inspect.getsource(VLLMGeneration), attribute
