"""The CPU weight sync's decisions and tensors (wmrl_trainer.vllm_sync); the sync itself runs against a
real CPU vLLM in tests/vllm_cpu/test_vllm_rollouts.py."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from wmrl_trainer.policy import build_tiny_model, build_tiny_tokenizer
from wmrl_trainer.vllm_sync import (RELOAD, RELOAD_FILES, TRL, CPUWeightSyncGeneration, vllm_named_weights,
                                    weight_sync, write_weights)


def test_trls_own_sync_runs_exactly_where_it_can():
    assert weight_sync("colocate", "cuda", vllm_on_cpu=False) == TRL
    assert weight_sync("colocate", "cpu", vllm_on_cpu=True) == RELOAD
    assert weight_sync("server", "cuda", vllm_on_cpu=False) == TRL
    # The trainer's device decides in server mode: NCCL needs CUDA on the trainer's side, wherever the server runs.
    assert weight_sync("server", "cpu", vllm_on_cpu=False) == RELOAD_FILES
    assert weight_sync("server", "cpu", vllm_on_cpu=True) == RELOAD_FILES
    with pytest.raises(ValueError, match="spec.policy.vllmMode"):
        weight_sync("remote", "cpu", vllm_on_cpu=True)


def test_tied_output_embeddings_are_sent_under_their_own_name():
    model = build_tiny_model(build_tiny_tokenizer())
    assert model.config.tie_word_embeddings
    walked = list(model.named_parameters())
    assert "lm_head.weight" not in dict(walked)  # the walk yields the tied matrix once
    sent = dict(vllm_named_weights(iter(walked), model))
    assert set(sent) == set(dict(walked)) | {"lm_head.weight"}
    assert sent["lm_head.weight"].data_ptr() == model.get_input_embeddings().weight.data_ptr()  # the tied matrix


def test_written_weights_load_back_equal_with_the_tied_matrix_unshared(tmp_path):
    model = build_tiny_model(build_tiny_tokenizer())
    path = write_weights(vllm_named_weights(model.named_parameters(), model), tmp_path / "w")
    loaded = load_file(path)
    assert set(loaded) == {n for n, _ in model.named_parameters()} | {"lm_head.weight"}
    for name, param in model.named_parameters():
        assert torch.equal(loaded[name], param.detach())
    assert torch.equal(loaded["lm_head.weight"], model.get_output_embeddings().weight.detach())
    assert [p.name for p in (tmp_path / "w").iterdir()] == ["model.safetensors"]  # no partial file left


def test_the_backend_refuses_a_sync_it_does_not_do():
    with pytest.raises(ValueError, match="not 'trl'"):
        CPUWeightSyncGeneration(sync=TRL)
    with pytest.raises(ValueError, match="weights_dir"):
        CPUWeightSyncGeneration(sync=RELOAD_FILES)
