"""The multi-turn demo policy (builtin:tiny-coder-multiturn): it reads the observation header, its warm
start has revise-after-feedback examples, and multi-turn evaluation feeds each turn the real feedback."""

from __future__ import annotations

import random

import pytest
import torch

from wmrl.outcome import Outcome, Status
from wmrl_demo import demo_policy, solutions
from wmrl_demo.revisions import MISTAKES, simulated_outcome
from wmrl_trainer.observation import line_kind, observation_text

pytestmark = pytest.mark.slow


def test_the_tokenizer_reads_the_header_and_drops_the_output():
    tokenizer = demo_policy.build_tokenizer(multiturn=True)
    code = solutions.render([solutions.BY_NAME["load_wrong_path"], solutions.BY_NAME["ridge"]])
    crash = Outcome(status=Status.RUNTIME_ERR, error_type="FileNotFoundError", error_line=2,
                    feedback="Traceback: linear regression class binary noise\nFileNotFoundError: train.csv")
    ids = tokenizer(observation_text(crash, code), add_special_tokens=False)["input_ids"]
    assert tokenizer.convert_ids_to_tokens(ids) == ["status=runtime_err", "error=FileNotFoundError", "where=load",
                                                    "quality=none"]  # prompt words in the output are not read
    single = demo_policy.build_tokenizer()
    prompt = "A binary classification task, accuracy, higher is better; a noisy linear dataset"
    assert tokenizer.convert_ids_to_tokens(tokenizer(prompt)["input_ids"]) == \
        single.convert_ids_to_tokens(single(prompt)["input_ids"])


def test_every_mistake_fails_where_its_simulated_outcome_says():
    rng = random.Random(0)
    for name, (status, error, where) in MISTAKES.items():
        chunk = solutions.BY_NAME[name]
        script = {"load": [chunk, solutions.BY_NAME["ridge"]], "preprocess": [solutions.BY_NAME["load"], chunk,
                  solutions.BY_NAME["ridge"]], "solve": [solutions.BY_NAME["load"], chunk]}[chunk.slot]
        outcome, blamed = simulated_outcome(script, "regression", rng)
        assert outcome.status is status and blamed is chunk
        if where:
            assert line_kind(solutions.render(script), outcome.error_line) in ("load", "preprocess", "model", "fit")


def test_revision_examples_mask_the_observation():
    tokenizer = demo_policy.build_tokenizer(multiturn=True)
    examples = demo_policy.revision_examples(tokenizer, 200, seed=1)
    two_turn = [e for e in examples if 0 in e[2]]
    assert 60 < len(two_turn) < 140  # about REVISE_SHARE of them
    header_ids = set(tokenizer.convert_tokens_to_ids(demo_policy.feedback_tokens()))
    for _, ids, mask in two_turn:
        assert all((m == 0) == (i in header_ids) for i, m in zip(ids, mask))


def test_sample_trajectories_shows_each_turn_its_real_feedback(tmp_path, monkeypatch):
    from wmrl.api.schema import RolloutSampling
    from wmrl_demo.demo_policy import synthetic_task
    from wmrl_trainer import sampling

    model, tokenizer = demo_policy.load_builtin("tiny-coder-multiturn", tmp_path)
    tasks = [synthetic_task(random.Random(k)) for k in range(3)]
    inputs = []
    generate = sampling._generate_batch
    monkeypatch.setattr(sampling, "_generate_batch",
                        lambda m, t, batch, s, **kw: inputs.append(batch) or generate(m, t, batch, s, **kw))
    graded = []

    def grade(items):  # every first script "crashes", every later one is the top outcome
        graded.append(items)
        first = len(graded) == 1
        return [Outcome(status=Status.RUNTIME_ERR, error_type="ValueError", error_line=1, feedback="boom") if first
                else Outcome(status=Status.VALID, rank_score=0.9, feedback="ok") for _ in items]

    rng = torch.get_rng_state()
    trajectories = sampling.sample_trajectories(model, tokenizer, tasks, RolloutSampling(maxNewTokens=8), 4, max_turns=3, grade=grade,
                                                seed=5)
    assert torch.equal(rng, torch.get_rng_state())
    assert len(trajectories) == 12 and all(len(t.turns) == 2 and t.stop == "top" for t in trajectories)
    assert len(inputs) == 2 and len(graded) == 2
    status = tokenizer.convert_tokens_to_ids("status=runtime_err")
    assert all(status not in row for row in inputs[0]) and all(status in row for row in inputs[1])
    assert all(t.reward("real") == pytest.approx(0.95) for t in trajectories)
