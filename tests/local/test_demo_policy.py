"""The CPU demo policy (builtin:tiny-coder): builds offline, writes decodable, mostly compilable scripts."""

from __future__ import annotations

import collections
import random

import pytest
import torch

from wmrl_demo import demo_policy, solutions


def _compiles(code: str) -> bool:
    try:
        compile(code, "<solution>", "exec")
    except SyntaxError:
        return False
    return True


def test_tokenizer_keeps_only_keywords_of_any_prompt():
    tok = demo_policy.build_tokenizer()
    text = "3-class classification: iris flowers (4 features). Metric: f1_macro (higher is better). Non-linear!"
    tokens = tok.convert_ids_to_tokens(tok(text)["input_ids"])
    assert tokens == ["<bos>", "class", "classification", "f1_macro", "higher", "non", "linear"]


def test_every_chunk_is_one_token_and_scripts_round_trip():
    tok = demo_policy.build_tokenizer()
    rng = random.Random(1)
    for _ in range(50):
        script = solutions.sample_script(rng)
        code = solutions.render(script)
        ids = tok(code, add_special_tokens=False)["input_ids"]
        assert len(ids) == len(script)
        assert tok.decode(ids, skip_special_tokens=True) == code


def test_sampled_scripts_cover_the_reward_ladder():
    rng = random.Random(0)
    names = collections.Counter(c.name for _ in range(2000) for c in solutions.sample_script(rng))
    for bad in ("load_syntax_error", "load_wrong_path", "fit_wrong_api", "print_only", "write_wrong_header"):
        assert names[bad] > 0
    solving = sum(n for name, n in names.items() if solutions.BY_NAME[name].slot == "solve" and name not in (
        "print_only", "write_wrong_header", "fit_wrong_api", "model_syntax_error"))
    assert solving > 1000  # most scripts fit an estimator and write a submission
    for kind in ("classification", "regression"):
        assert _compiles(solutions.render(solutions.best_script(kind)))


@pytest.mark.slow
def test_warm_started_policy_builds_offline_caches_and_mostly_compiles(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cache = tmp_path / "policies"
    model, tok = demo_policy.load_builtin("tiny-coder", cache)
    built = sorted(p.name for p in cache.iterdir() if not p.name.startswith("."))
    assert built == [f"tiny-coder-{demo_policy.recipe_hash()}"]
    demo_policy.load_builtin("tiny-coder", cache)  # second load: from the cache, nothing rebuilt
    assert sorted(p.name for p in cache.iterdir()) == built
    # The saved tokenizer still reduces prompts to their keywords (the policy can tell tasks apart).
    prompt = tok("3-class classification: iris. Metric: accuracy (higher is better).")["input_ids"]
    assert tok.convert_ids_to_tokens(prompt) == ["<bos>", "class", "classification", "accuracy", "higher"]

    torch.manual_seed(0)
    enc = tok(["Regression: a dataset. Metric: r2 (higher is better)."] * 200, return_tensors="pt", padding=True)
    out = model.generate(**enc, do_sample=True, max_new_tokens=8)
    texts = tok.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    compiled = sum(_compiles(t) for t in texts)
    assert compiled >= 0.8 * len(texts)
    # Mediocre on purpose: both kinds of estimator, and mistakes, are still sampled.
    joined = "\n".join(texts)
    assert "Classifier" in joined and "Regressor" in joined
    assert "fit_transfrom" in joined or "model.train" in joined or "print('train score'" in joined
    assert len(set(texts)) > 20
    # Every sample is a whole script, load [preprocess] solve, and generation stops at its solve chunk.
    roles = demo_policy.token_roles(tok)
    for row in out[:, enc["input_ids"].shape[1]:].tolist():
        script = [roles[t] for t in row if t != tok.pad_token_id]
        assert script in (["load", "solve"], ["load", "preprocess", "solve"])


def test_warm_start_scripts_lean_weakly_towards_the_tasks_kind():
    rng = random.Random(4)
    for kind, other in (("classification", "regression"), ("regression", "classification")):
        fits = collections.Counter(c.fits for _ in range(4000) for c in solutions.sample_script(rng, kind) if c.slot == "solve")
        share = fits[kind] / (fits[kind] + fits[other])
        assert abs(share - solutions.KIND_MATCH) < 0.03
    fits = collections.Counter(c.fits for _ in range(4000) for c in solutions.sample_script(rng) if c.slot == "solve")
    assert abs(fits["classification"] / (fits["classification"] + fits["regression"]) - 0.5) < 0.05


def test_warm_start_prompts_use_the_real_template():
    tok = demo_policy.build_tokenizer()
    task = demo_policy.synthetic_task(random.Random(5))
    from wmrl_trainer.prompts import task_prompt

    words = tok.convert_ids_to_tokens(tok(task_prompt(task))["input_ids"])
    # kind (task line), the description's kind and metric, the score line's metric, "ranks higher"
    assert words[:2] == ["<bos>", task.kind] and words.count(task.metric) == 2 and words[-1] == "higher"


def test_every_script_ends_in_one_solve_chunk_that_fits_and_writes():
    """No shared fit/write scaffold token exists for RL to unlearn (the demo policy's old collapse)."""
    rng = random.Random(2)
    for _ in range(200):
        script = solutions.sample_script(rng)
        assert [c.slot for c in script][-1] == "solve"
        assert sum(c.slot == "solve" for c in script) == 1
    for chunk in solutions.slot_chunks("solve", bad=False):
        assert "model.fit(X, y)" in chunk.code and "header='id,target'" in chunk.code


def test_unknown_builtin_is_an_error_naming_the_field(tmp_path):
    with pytest.raises(ValueError, match="spec.policy.model"):
        demo_policy.load_builtin("huge-coder", tmp_path)


def _weights(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_warm_start_seed_names_its_own_cache_directory_and_seed_zero_keeps_the_old_name(tmp_path):
    base = f"tiny-coder-{demo_policy.recipe_hash()}"
    assert demo_policy.cache_name("tiny-coder") == demo_policy.cache_name("tiny-coder", 0) == base
    assert demo_policy.cache_name("tiny-coder", 1) == base + "-w1"
    assert demo_policy.cache_name("tiny-coder", 12) == base + "-w12"
    assert demo_policy.sft_seed(0) == demo_policy.SFT["seed"]
    for bad in (-1, 1.5, True, "1"):
        with pytest.raises(ValueError, match="warm_start_seed"):
            demo_policy.builtin_path("tiny-coder", tmp_path, warm_start_seed=bad)
    assert not any(tmp_path.iterdir())  # nothing built for an invalid seed


@pytest.mark.slow
def test_warm_start_seeds_give_their_own_deterministic_policies(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    base = f"tiny-coder-{demo_policy.recipe_hash()}"
    zero, _ = demo_policy.load_builtin("tiny-coder", tmp_path / "a")
    assert demo_policy.builtin_path("tiny-coder", tmp_path / "a") == tmp_path / "a" / base
    one, _ = demo_policy.load_builtin("tiny-coder", tmp_path / "a", warm_start_seed=1)
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == [base, base + "-w1"]
    again, _ = demo_policy.load_builtin("tiny-coder", tmp_path / "b", warm_start_seed=1)  # a second, independent build
    w0, w1 = _weights(zero), _weights(one)
    assert not _same(w0, w1)
    assert _same(w1, _weights(again))
    # Seed 0 is the recipe as it was before warm-start seeds existed: SFT["seed"] for init, examples and order.
    tok = demo_policy.build_tokenizer()
    legacy = demo_policy.build_model(tok, seed=demo_policy.SFT["seed"])
    examples = demo_policy.sft_examples(tok, demo_policy.SFT["examples"], demo_policy.SFT["seed"])
    demo_policy.warm_start(legacy, tok, examples, demo_policy.SFT["steps"], demo_policy.SFT["batch"],
                           demo_policy.SFT["lr"], demo_policy.SFT["seed"])
    assert _same(w0, _weights(legacy))
