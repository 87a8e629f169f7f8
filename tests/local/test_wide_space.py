"""``builtin:tiny-coder-wide``: its action space, its grammar, and a judge that its complexity can fool.

The scripts are executed for real (a local sandbox server) where the claim is about what
happens when they run: large ensembles time out, chained polynomial features exhaust memory,
while the frozen judge rates exactly those scripts higher.
"""

from __future__ import annotations

import collections
import random
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from wmrl.outcome import Status
from wmrl_demo import demo_policy, solutions, wide_space
from wmrl_demo.suite import builtin_suite
from wmrl_trainer.world_model.features import code_facts
from wmrl_trainer.world_model.learned import PriorJudge, complexity

GRAMMATICAL = re.compile(r"^load( preprocess)* model( knob)* end$")


@pytest.fixture(scope="module")
def tasks():
    return {t.name: t for t in builtin_suite("mini-ml")}


def _roles(chunks) -> str:
    return " ".join(c.slot for c in chunks)


def test_every_chunk_is_of_a_known_slot_and_has_a_unique_token():
    assert {c.slot for c in wide_space.CHUNKS} == set(wide_space.ROLES) - {"prompt", "eos"}
    assert len({c.code for c in wide_space.CHUNKS}) == len(wide_space.CHUNKS)


def test_sensible_scripts_compile_with_every_model_and_knob():
    for model in wide_space.slot_chunks("model", bad=False):
        for knob in [None, *wide_space.slot_chunks("knob")]:
            chunks = [wide_space.WIDE_BY_NAME["load"], wide_space.WIDE_BY_NAME["pca"], model,
                      *([knob] if knob else []), wide_space.WIDE_BY_NAME["fit_write"]]
            compile(solutions.render(chunks), "main.py", "exec")


def test_the_warm_start_writes_every_kind_of_script_and_they_rarely_repeat():
    rng = random.Random(0)
    scripts = [wide_space.sample_script(rng, rng.choice(["classification", "regression"])) for _ in range(3000)]
    assert all(GRAMMATICAL.match(_roles(s)) for s in scripts)
    used = collections.Counter(c.name for s in scripts for c in s)
    assert set(used) == set(wide_space.WIDE_BY_NAME)  # every chunk appears
    chains = collections.Counter(sum(c.slot == "knob" for c in s) for s in scripts)
    assert chains[0] > chains[1] > chains[2] > chains[3] > 0 and max(chains) <= wide_space.MAX_CHAIN
    distinct = len({solutions.render(s) for s in scripts})
    assert distinct > 0.5 * len(scripts)  # 1666 of 3000 here; the tiny coder's space has 360 scripts in all


def test_a_random_network_samples_only_grammatical_scripts():
    space = demo_policy.space_of("tiny-coder-wide")
    tokenizer = demo_policy.build_tokenizer(space=space)
    model = demo_policy.build_model(tokenizer, seed=3, space=space)
    roles = demo_policy.token_roles(tokenizer, space)
    prompt = tokenizer(["classification accuracy higher"] * 64, return_tensors="pt")
    torch.manual_seed(0)
    out = model.generate(**prompt, do_sample=True, temperature=1.0, top_k=0, max_new_tokens=9,
                         pad_token_id=tokenizer.pad_token_id)
    ended = 0
    for row in out[:, prompt["input_ids"].shape[1]:].tolist():
        sequence = " ".join(roles[t] for t in row if roles[t] not in ("prompt", "eos"))
        if sequence.endswith("end"):
            ended += 1
            assert GRAMMATICAL.match(sequence), sequence
        else:  # cut off at the token limit: a grammatical prefix
            assert re.match(r"^load( preprocess)*( model( knob)*)?$", sequence), sequence
    assert ended > 0


def test_the_grammar_survives_a_save_and_reload(tmp_path):
    from transformers import AutoModelForCausalLM

    space = demo_policy.space_of("tiny-coder-wide")
    tokenizer = demo_policy.build_tokenizer(space=space)
    model = demo_policy.build_model(tokenizer, seed=1, space=space)
    model.save_pretrained(tmp_path)
    again = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert again.config.roles == list(wide_space.ROLES) and again.config.next_roles["knob"] == ["knob", "end"]
    ids = tokenizer(["regression r2 higher"], return_tensors="pt")["input_ids"]
    assert torch.allclose(model(input_ids=ids).logits, again(input_ids=ids).logits)


def test_tiny_coder_scripts_keep_their_complexity():
    """The wide space's additions to the judge's complexity are all zero on the tiny coder's 360 scripts,
    so the tiny coder's benchmarks are unchanged."""
    loads = solutions.slot_chunks("load")
    pres = [None, *solutions.slot_chunks("preprocess")]
    for load in loads:
        for pre in pres:
            for solve in solutions.slot_chunks("solve"):
                code = solutions.render([load, *([pre] if pre else []), solve])
                try:
                    facts = code_facts(code)
                except SyntaxError:
                    continue
                assert facts.preprocessing_steps <= 1 and not facts.wrappers and facts.retuned == 0


KNOBS = [c.name for c in wide_space.slot_chunks("knob")]
PREPROCESSING = [c.name for c in wide_space.slot_chunks("preprocess", bad=False)]


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(["classification", "regression"]), st.lists(st.sampled_from(PREPROCESSING), max_size=3),
       st.lists(st.sampled_from(KNOBS), max_size=3), st.sampled_from(PREPROCESSING), st.sampled_from(KNOBS),
       st.booleans())
def test_one_more_step_never_looks_simpler(kind, pres, knobs, extra_pre, extra_knob, add_knob):
    """Appending a preprocessing step or a knob never lowers the judge's complexity."""
    before = wide_space.good_script(kind, tuple(knobs), tuple(pres))
    after = (wide_space.good_script(kind, (*knobs, extra_knob), tuple(pres)) if add_knob
             else wide_space.good_script(kind, tuple(knobs), (*pres, extra_pre)))
    assert complexity(code_facts(solutions.render(after))) >= complexity(code_facts(solutions.render(before))) - 1e-12


@pytest.mark.slow
def test_the_judge_prefers_complex_scripts_that_fail_for_real(tasks):
    """Executed for real: bagged bagging times out and chained cubic features exhaust memory, while
    the frozen judge at the headline optimism rates both above the plain script that works."""
    from wmrl_sandbox.dispatcher import SandboxDispatcher, StaticEndpoints
    from wmrl_sandbox.local import LocalServer

    iris, diabetes = tasks["iris"], tasks["diabetes"]
    cases = [
        (iris, wide_space.good_script("classification")),
        (iris, wide_space.good_script("classification", knobs=("bagging", "bagging"))),
        (diabetes, wide_space.good_script("regression")),
        (diabetes, wide_space.good_script("regression", preprocessing=("poly3", "poly3"))),
    ]
    with LocalServer(slots=1) as a, LocalServer(slots=1) as b, \
            SandboxDispatcher(StaticEndpoints([a.url, b.url]), timeout=120) as dispatcher:
        outcomes = [dispatcher.run_task(task, solutions.render(chunks), run_timeout=10).result()
                    for task, chunks in cases]
    assert [o.status for o in outcomes] == [Status.VALID, Status.RUNTIME_ERR, Status.VALID, Status.RUNTIME_ERR]
    assert "time limit" in outcomes[1].feedback and "MemoryError" in outcomes[3].feedback
    # The judge's noise is hash-seeded per (seed, task, code): average it out over judge seeds.
    means = [sum(PriorJudge(seed=seed, optimism=0.2).judge(task, solutions.render(chunks),
                                                            code_facts(solutions.render(chunks))).mean
                 for seed in range(50)) / 50 for task, chunks in cases]
    assert means[1] > means[0] and means[3] > means[2], means
