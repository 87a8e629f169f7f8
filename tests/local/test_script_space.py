"""Exact script distributions of the tiny coder (wmrl_demo.script_space) against what sampling draws."""

from __future__ import annotations

import collections
import itertools
import math
import random
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import yaml
from scipy import stats

from wmrl.api.schema import RolloutSampling, parse_spec
from wmrl_demo import demo_policy, script_space, solutions
from wmrl_trainer.sampling import make_prompt, sample_solutions

QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart.yaml"
SAMPLES = 4000


def _grammatical_scripts() -> dict[str, tuple[str, ...]]:
    """Every ``load [preprocess] solve`` script, rendered, with its chunk names."""
    out = {}
    for load, pre, solve in itertools.product(solutions.slot_chunks("load"), [None] + solutions.slot_chunks("preprocess"),
                                              solutions.slot_chunks("solve")):
        chunks = [load] + ([pre] if pre else []) + [solve]
        out[solutions.render(chunks)] = tuple(c.name for c in chunks)
    return out


def _parse(script: str) -> list[str]:
    """The chunk names of ``script`` read back slot by slot (load, optional preprocess, solve), or an AssertionError."""
    names, rest = [], script
    for slot in solutions.SLOTS:
        matches = [c for c in solutions.slot_chunks(slot) if rest.startswith(c.code)]
        assert len(matches) <= 1, f"ambiguous {slot} chunk"
        if not matches:
            assert slot == "preprocess", f"no {slot} chunk at {rest[:60]!r}"
            continue
        names.append(matches[0].name)
        rest = rest[len(matches[0].code):]
    assert rest == "", f"trailing text {rest[:60]!r}"
    return names


def _agreement(distribution, samples: list[str]) -> tuple[float, float, float]:
    """(chi-square p-value, total variation, TV bound) of ``samples`` against the exact ``distribution``.

    Categories expected fewer than 5 times are pooled for the chi-square test. A sample
    outside the enumerated support gives p = 0 and TV counts its mass. The TV bound holds
    with probability >= 1 - 1e-6 for samples drawn from ``distribution``: E[TV] <=
    1/2 sum sqrt(p (1 - p) / n) (Jensen), and TV moves by at most 1/n per sample (McDiarmid).
    """
    n = len(samples)
    probs = dict(distribution)
    counts = collections.Counter(samples)
    outside = sum(c for s, c in counts.items() if s not in probs)
    tv = 0.5 * (sum(abs(counts.get(s, 0) / n - p) for s, p in probs.items()) + outside / n)
    bound = 0.5 * sum(math.sqrt(p * (1 - p) / n) for p in probs.values()) + math.sqrt(math.log(1e6) / (2 * n))
    if outside:
        return 0.0, tv, bound
    expected = np.array([p * n for p in probs.values()])
    observed = np.array([counts.get(s, 0) for s in probs], dtype=float)
    big = expected >= 5
    e, o = expected[big], observed[big]
    if (~big).any():
        e, o = np.append(e, expected[~big].sum()), np.append(o, observed[~big].sum())
    statistic = float(((o - e) ** 2 / e).sum())
    return float(stats.chi2.sf(statistic, len(e) - 1)), tv, bound


def _sample(model, tok, task, sampling, n: int = SAMPLES, seed: int = 0) -> list[str]:
    [(_, scripts)] = list(sample_solutions(model, tok, [task], sampling, n, seed=seed))
    return scripts


@pytest.fixture(scope="module")
def policy():
    """The warm-started tiny coder (built once into the shared cache, then loaded from it)."""
    return demo_policy.load_builtin("tiny-coder")


@pytest.fixture
def random_policy():
    tok = demo_policy.build_tokenizer()
    return demo_policy.build_model(tok, seed=3), tok


def _task(seed: int):
    return demo_policy.synthetic_task(random.Random(seed))


# ---------------------------------------------------------------- the enumeration itself

def test_random_policy_enumerates_the_whole_grammar_once(random_policy):
    model, tok = random_policy
    dist = script_space.script_distribution(model, tok, make_prompt(_task(0), tok), temperature=1.0, top_p=1.0,
                                            max_new_tokens=8)
    grammar = _grammatical_scripts()
    assert len(grammar) == 3 * (1 + 4) * 24
    assert sorted(s for s, _ in dist) == sorted(grammar)  # every script, each once (merged), nothing else
    assert abs(sum(p for _, p in dist) - 1.0) < 1e-6
    assert all(p > 0 for _, p in dist)
    assert [p for _, p in dist] == sorted((p for _, p in dist), reverse=True)
    for script, _ in dist:
        assert tuple(_parse(script)) == grammar[script]


def test_warm_policy_scripts_are_grammatical_and_sum_to_one(policy):
    model, tok = policy
    for seed in range(4):
        for temperature, top_p in ((1.0, 1.0), (0.7, 0.9), (1.3, 0.5)):
            dist = script_space.script_distribution(model, tok, make_prompt(_task(seed), tok),
                                                    temperature=temperature, top_p=top_p, max_new_tokens=8)
            assert abs(sum(p for _, p in dist) - 1.0) < 1e-6
            assert len({s for s, _ in dist}) == len(dist)
            for script, _ in dist:
                _parse(script)


def test_prompt_as_text_or_ids_gives_the_same_distribution(random_policy):
    model, tok = random_policy
    text = make_prompt(_task(1), tok)
    kwargs = dict(temperature=0.8, top_p=0.95, max_new_tokens=8)
    by_text = script_space.script_distribution(model, tok, text, **kwargs)
    ids = tok(text)["input_ids"]
    assert script_space.script_distribution(model, tok, ids, **kwargs) == by_text
    assert script_space.script_distribution(model, tok, torch.tensor([ids]), **kwargs) == by_text


def test_token_limit_cuts_scripts_like_generate(random_policy):
    model, tok = random_policy
    dist = script_space.script_distribution(model, tok, make_prompt(_task(0), tok), temperature=1.0, top_p=1.0,
                                            max_new_tokens=2)
    loads, pres, solves = (solutions.slot_chunks(s) for s in solutions.SLOTS)
    expected = {solutions.render([l, x]) for l in loads for x in pres + solves}
    assert {s for s, _ in dist} == expected and len(dist) == 3 * (4 + 24)
    assert abs(sum(p for _, p in dist) - 1.0) < 1e-6
    one = script_space.script_distribution(model, tok, make_prompt(_task(0), tok), temperature=1.0, top_p=1.0,
                                           max_new_tokens=1)
    assert {s for s, _ in one} == {c.code for c in loads}
    with pytest.raises(ValueError, match="too large"):
        script_space.script_distribution(model, tok, make_prompt(_task(0), tok), temperature=1.0, top_p=1.0,
                                         max_new_tokens=8, max_sequences=50)


def test_leaves_mode_rng_and_generation_config_untouched(random_policy):
    model, tok = random_policy
    before = model.generation_config.to_dict()
    rng = torch.get_rng_state()
    for training in (True, False):
        model.train(training)
        script_space.script_distribution(model, tok, make_prompt(_task(2), tok), temperature=0.9, top_p=0.9,
                                         max_new_tokens=8)
        assert model.training is training
    assert torch.equal(torch.get_rng_state(), rng)
    assert model.generation_config.to_dict() == before
    assert all(p.grad is None for p in model.parameters())


def test_applies_what_generate_applies_including_default_top_k(random_policy):
    from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    model, tok = random_policy
    ids = tok(make_prompt(_task(0), tok))["input_ids"]
    processors, stops = script_space.sampling_processors(model, tok, ids, temperature=0.7, top_p=0.9, max_new_tokens=8)
    kinds = [type(p) for p in processors]
    assert kinds == [TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper]
    assert processors[1].top_k == 50  # transformers' generate default, applied when nothing sets top_k
    assert stops == demo_policy.stop_token_ids(tok)
    processors, _ = script_space.sampling_processors(model, tok, ids, temperature=1.0, top_p=1.0, max_new_tokens=8)
    assert [type(p) for p in processors] == [TopKLogitsWarper]


# ---------------------------------------------------------------- against sampling

@pytest.mark.slow
def test_matches_sampling_at_the_quickstart_settings_and_a_wrong_temperature_fails(policy):
    model, tok = policy
    sampling = parse_spec(yaml.safe_load(QUICKSTART.read_text())["spec"]).policy.sampling
    assert (sampling.temperature, sampling.top_p, sampling.max_new_tokens) == (1.0, 1.0, 8)
    task = _task(3)
    prompt = make_prompt(task, tok)
    samples = _sample(model, tok, task, sampling)
    exact = script_space.script_distribution(model, tok, prompt, temperature=sampling.temperature,
                                             top_p=sampling.top_p, max_new_tokens=sampling.max_new_tokens)
    assert len(exact) == 360
    p_value, tv, bound = _agreement(exact, samples)
    assert p_value > 1e-4 and tv < bound, (p_value, tv, bound)
    # The test has power: the same samples reject the distribution at another temperature.
    for wrong in (0.7, 1.5):
        other = script_space.script_distribution(model, tok, prompt, temperature=wrong, top_p=1.0, max_new_tokens=8)
        p_value, tv, bound = _agreement(other, samples)
        assert p_value < 1e-10 and tv > bound, (wrong, p_value, tv, bound)


@pytest.mark.slow
def test_matches_sampling_with_nucleus_filtering_and_the_spec_defaults(policy):
    model, tok = policy
    task = _task(4)
    prompt = make_prompt(task, tok)
    for sampling in (RolloutSampling(temperature=0.8, top_p=0.9, max_new_tokens=8), RolloutSampling()):
        samples = _sample(model, tok, task, sampling, seed=1)
        exact = script_space.script_distribution(model, tok, prompt, temperature=sampling.temperature,
                                                 top_p=sampling.top_p, max_new_tokens=sampling.max_new_tokens)
        p_value, tv, bound = _agreement(exact, samples)
        assert p_value > 1e-4 and tv < bound, (sampling, p_value, tv, bound)
    nucleus = script_space.script_distribution(model, tok, prompt, temperature=0.8, top_p=0.9, max_new_tokens=8)
    assert len(nucleus) < 360  # top-p did cut the tail
    unfiltered = script_space.script_distribution(model, tok, prompt, temperature=0.8, top_p=1.0, max_new_tokens=8)
    p_value, _, _ = _agreement(unfiltered, _sample(model, tok, task, RolloutSampling(temperature=0.8, top_p=0.9,
                                                                                  max_new_tokens=8), seed=1))
    assert p_value < 1e-10  # without the nucleus filter the same samples do not fit


@pytest.mark.slow
def test_a_top_k_in_the_generation_config_is_applied_as_generate_applies_it(random_policy):
    model, tok = random_policy
    model.generation_config.top_k = 4
    task = _task(5)
    prompt = make_prompt(task, tok)
    exact = script_space.script_distribution(model, tok, prompt, temperature=1.0, top_p=1.0, max_new_tokens=8)
    assert len(exact) <= 3 * 4 * 4  # at most 4 children below each prefix
    sampling = SimpleNamespace(temperature=1.0, top_p=1.0, max_new_tokens=8)
    p_value, tv, bound = _agreement(exact, _sample(model, tok, task, sampling, n=2000))
    assert p_value > 1e-4 and tv < bound, (p_value, tv, bound)


# ---------------------------------------------------------------- expected reward

def test_expected_reward_renormalises_over_the_graded_mass():
    dist = [("a", 0.5), ("b", 0.25), ("c", 0.125), ("d", 0.125)]
    rewards = {"a": 1.0, "b": 0.0, "c": None, "d": float("nan")}
    value, graded = script_space.expected_reward(dist, rewards.get)
    assert graded == pytest.approx(0.75)
    assert value == pytest.approx(0.5 / 0.75)
    assert script_space.expected_reward(dist, lambda s: None) == (None, 0.0)
    assert script_space.expected_reward(dist, lambda s: 0.3) == (pytest.approx(0.3), pytest.approx(1.0))


def test_expected_reward_of_the_policy_is_the_limit_of_sampled_means(policy):
    model, tok = policy
    task = _task(6)
    exact = script_space.script_distribution(model, tok, make_prompt(task, tok), temperature=1.0, top_p=1.0,
                                             max_new_tokens=8)

    def reward(script: str):  # a stand-in grader: 1 for a sensible estimator of the task's kind, None for a bad load
        names = _parse(script)
        if solutions.BY_NAME[names[0]].fits == "bad":
            return None
        return 1.0 if solutions.BY_NAME[names[-1]].fits == task.kind else 0.0

    value, graded = script_space.expected_reward(exact, reward)
    samples = _sample(model, tok, task, SimpleNamespace(temperature=1.0, top_p=1.0, max_new_tokens=8), n=2000, seed=2)
    rewards = [reward(s) for s in samples]
    known = [r for r in rewards if r is not None]
    assert abs(len(known) / len(rewards) - graded) < 5 * math.sqrt(graded * (1 - graded) / len(rewards)) + 1e-9
    assert abs(np.mean(known) - value) < 5 * math.sqrt(value * (1 - value) / len(known)) + 1e-9
