"""The tiny coder's script grammar holds on every path: sampling, TRL's fused LM head, the KL reference, a reload.

The network is randomly initialised here on purpose: a random network writes any token
after any other unless the grammar forbids it, so these tests fail the moment the grammar
stops reaching one of the paths.
"""

from __future__ import annotations

import copy
import math
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from wmrl.api.runconfig import RunConfig, RunMetadata, Runtime
from wmrl.api.schema import WMRLRunSpec
from wmrl_demo import demo_policy, solutions
from wmrl_demo.tiny_coder_model import BLOCKED, NEXT_ROLES, ROLES, TinyCoderForCausalLM, grammar_matrix
from wmrl_trainer.build import build_trainer
from wmrl_scripted import ScriptedWorldModel, make_tasks

SCRIPT = re.compile(r"load (preprocess )?solve( eos| pad)*")


@given(st.lists(st.sampled_from(ROLES), min_size=1, max_size=40))
@settings(max_examples=60, deadline=None)
def test_grammar_matrix_allows_exactly_the_next_roles(roles):
    matrix = grammar_matrix(roles)
    for v, role_of_v in enumerate(roles):
        for r, previous in enumerate(ROLES):
            assert matrix[v, r].item() == (0.0 if role_of_v in NEXT_ROLES[previous] else BLOCKED)


def test_unknown_roles_are_refused():
    with pytest.raises(ValueError, match="unknown token roles"):
        grammar_matrix(["prompt", "fit"])


@pytest.fixture(scope="module")
def random_coder():
    torch.manual_seed(0)
    tokenizer = demo_policy.build_tokenizer()
    return demo_policy.build_model(tokenizer, seed=11), tokenizer


def _roles_of(tokenizer, ids):
    roles = demo_policy.token_roles(tokenizer)
    return " ".join("pad" if t == tokenizer.pad_token_id else roles[t] for t in ids)


def _sample(model, tokenizer, n=200, seed=0):
    prompts = ["Regression: a noisy dataset. Metric: rmse (lower is better).",
               "3-class classification: images. Metric: accuracy (higher is better)."] * (n // 2)
    enc = tokenizer(prompts, return_tensors="pt", padding=True)
    torch.manual_seed(seed)
    out = model.generate(**enc, do_sample=True, temperature=1.0, max_new_tokens=8)
    return enc, out


def test_a_random_network_samples_only_grammatical_scripts(random_coder):
    model, tokenizer = random_coder
    enc, out = _sample(model, tokenizer)
    completions = out[:, enc["input_ids"].shape[1]:].tolist()
    patterns = {_roles_of(tokenizer, row) for row in completions}
    assert all(SCRIPT.fullmatch(p) for p in patterns), patterns
    assert {"load solve", "load preprocess solve"} <= {p.replace(" pad", "").replace(" eos", "") for p in patterns}
    # A script never runs into the token limit: at most three tokens, the last a stop token.
    stops = set(demo_policy.stop_token_ids(tokenizer))
    assert all(any(t in stops for t in row) for row in completions)


def test_trl_fused_head_scores_the_grammars_distribution(random_coder):
    """TRL trains on log-probs and entropies from its fused LM head, not from the logits: they must agree."""
    from trl.trainer.utils import add_fused_lm_head

    model, tokenizer = random_coder
    enc, out = _sample(model, tokenizer, n=16, seed=1)
    mask = (out != tokenizer.pad_token_id).long()
    logits = model(input_ids=out, attention_mask=mask).logits[:, :-1].float()
    logp_all = torch.log_softmax(logits, -1)
    logps = logp_all.gather(-1, out[:, 1:, None]).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    fused = copy.deepcopy(model)
    add_fused_lm_head(fused, outputs=("log_probs", "entropy"))
    result = fused(input_ids=out, attention_mask=mask, labels=out.masked_fill(mask == 0, -100), fused_lm_head=True)
    start = enc["input_ids"].shape[1] - 1  # logits at position t score token t + 1: the completion starts here
    scored = mask[:, start + 1:].bool()
    torch.testing.assert_close(result.log_probs[:, start:][scored], logps[:, start:][scored], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(result.entropy[:, start:][scored], entropy[:, start:][scored], rtol=1e-4, atol=1e-4)
    # Entropy over the grammar's choices only: at most log(preprocess + solve chunks), never the whole vocabulary.
    widest = len(solutions.slot_chunks("preprocess")) + len(solutions.slot_chunks("solve"))
    assert result.entropy[:, start:][scored].max().item() <= math.log(widest) + 1e-4
    assert math.log(len(tokenizer)) > math.log(widest) + 0.5


def test_reload_through_the_auto_classes_keeps_the_grammar(random_coder, tmp_path):
    from transformers import AutoModelForCausalLM

    model, tokenizer = random_coder
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert isinstance(loaded, TinyCoderForCausalLM)
    ids = tokenizer(["Regression: a dataset. Metric: r2 (higher is better)."], return_tensors="pt")["input_ids"]
    torch.testing.assert_close(loaded(input_ids=ids).logits, model(input_ids=ids).logits)
    # The grammar is a constant, not a parameter: the optimizer sees exactly Qwen2's weights.
    names = {name for name, _ in model.named_parameters()}
    assert "model.embed_tokens.weight" in names and not any("lm_head" in name or "grammar" in name for name in names)


def _run_config(tmp_path) -> RunConfig:
    spec = WMRLRunSpec.model_validate({
        "mode": "worldModel",
        "policy": {"model": "builtin:tiny-coder", "rolloutEngine": "transformers", "sampling": {"maxNewTokens": 8}},
        "tasks": {"builtin": "mini-ml"},
        "algorithm": {"groupSize": 4, "groupsPerStep": 2, "steps": 2, "learningRate": 1e-2, "seed": 3, "maxTurns": 1},
        "trainer": {"checkpoint": {"intervalSteps": 100}},
    })
    return RunConfig(metadata=RunMetadata(name="t"), spec=spec,
                     runtime=Runtime(checkpoint_dir=str(tmp_path / "ckpt"), patch_status=False, metrics_port=None))


@pytest.mark.slow
def test_trl_trains_the_tiny_coder_with_a_grammatical_kl_reference_and_health_figures(random_coder, tmp_path):
    model, tokenizer = copy.deepcopy(random_coder[0]), random_coder[1]
    records = []
    trainer = build_trainer(_run_config(tmp_path), policy=(model, tokenizer), tasks=make_tasks(2),
                            world_model=ScriptedWorldModel(), callbacks=[records.append])
    try:
        reference = trainer.grpo.ref_model
        assert isinstance(reference, TinyCoderForCausalLM)
        ids = tokenizer(["Regression: a dataset. Metric: r2 (higher is better)."], return_tensors="pt")["input_ids"]
        torch.testing.assert_close(reference(input_ids=ids).logits, model(input_ids=ids).logits)
        trainer.train()
    finally:
        trainer.close()
    assert len(records) == 2
    widest = len(solutions.slot_chunks("preprocess")) + len(solutions.slot_chunks("solve"))
    for record in records:
        assert record.truncated_share == 0.0  # the grammar ends every script within three tokens
        assert 2.0 <= record.mean_completion_tokens <= 3.0
        assert 0.0 < record.entropy <= math.log(widest)
        assert 1.0 <= record.distinct_per_group <= 4.0
        assert record.health_warning is None
