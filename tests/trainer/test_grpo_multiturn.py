"""Multi-turn rollouts through TRL (``rollout_func`` + ``env_mask``) with a tiny model on the CPU:
observation tokens carry no loss, rewards are the best turn's, anchors see the sandbox."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from test_grpo import run_config, tiny_policy, train_capturing_batches
from wmrl_trainer.build import build_trainer
from wmrl_trainer.sampling import observation_ids
from wmrl_scripted import ScriptedExecutor, ScriptedWorldModel, make_tasks

pytestmark = pytest.mark.slow


class TopOnceSeen(ScriptedWorldModel):
    """Scripted grades, except that a first turn is never the top outcome (rank score at most 0.3) and
    a later turn always is (0.9): every trajectory graded by the world model runs exactly two turns."""

    def grade(self, items):
        out = super().grade(items)
        for i, item in enumerate(items):
            if out[i] is not None:
                later = len(item) > 2 and len(item[2]) >= 1
                out[i] = out[i].model_copy(update={"rank_score": 0.9 if later else min(out[i].rank_score, 0.3)})
        return out


def ending_policy():
    """The random tiny policy with every token a stop token: each turn is one complete token, never cut off
    at maxNewTokens (a cut-off turn ends its trajectory), whatever the sampler draws on this machine."""
    model, tokenizer = tiny_policy()
    model.generation_config.eos_token_id = list(range(len(tokenizer)))
    return model, tokenizer


def multi_turn_trainer(tmp_path, mode="wmrl", max_turns=3, world_model=None, **algorithm):
    algorithm.setdefault("maxTrajectoryTokens", 2000)  # the tiny test tokenizer spells observations out
    config = run_config(tmp_path, mode, steps=1, maxTurns=max_turns, **algorithm)
    return build_trainer(config, policy=ending_policy(), tasks=make_tasks(2),
                         world_model=world_model or TopOnceSeen(), dispatcher=ScriptedExecutor())


def test_observation_tokens_are_masked_and_rewards_are_the_best_turns(tmp_path):
    world = TopOnceSeen()
    trainer = multi_turn_trainer(tmp_path, world_model=world)
    tokenizer = trainer.grpo.processing_class
    (out, scored), = train_capturing_batches(trainer)
    batch = scored.trajectories
    assert batch is not None and "tool_mask" in out
    mask = out["tool_mask"] * out["completion_mask"]
    for row, key in enumerate(batch.keys()):
        trajectory = batch.get(key)
        if not trajectory.anchor:
            assert len(trajectory.turns) == 2 and trajectory.stop == "top"
        observed = [t for t in trajectory.turns[:-1]]  # every turn but the last was followed by its observation
        expected = sum(len(observation_ids(tokenizer, t.observation)) for t in observed)
        length = int(out["completion_mask"][row].sum())
        zeros = (out["tool_mask"][row, :length] == 0).nonzero().flatten().tolist()
        assert len(zeros) == expected
        decoded = tokenizer.decode(out["completion_ids"][row, zeros])
        assert decoded.count("[execution]") == len(observed)
        assert scored.rewards[key] == pytest.approx(max(t.shown.reward for t in trajectory.turns))
    assert out["num_items_in_batch"] == mask.sum()
    assert scored.record.turns["mean_turns"] > 1.5 and scored.record.turns["stops"]["ungraded"] == 0
    # The world model saw each trajectory so far: second-turn prompts carry the first turn's observation.
    assert any(history and "[execution]" in history[0][1] for history in world.histories)


def test_the_loss_ignores_observation_tokens(tmp_path):
    """Changing the KL reference's log-probs on observation tokens leaves TRL's loss unchanged;
    the same change on one policy token moves it (the check can fail)."""
    trainer = multi_turn_trainer(tmp_path, mode="worldModel", klBeta=0.5)
    (out, _), = train_capturing_batches(trainer)
    grpo = trainer.grpo
    model = grpo.model
    model.train()
    observation = (out["tool_mask"] == 0) & (out["completion_mask"] == 1)
    policy = (out["tool_mask"] == 1) & (out["completion_mask"] == 1)
    assert observation.any() and policy.any()

    def loss(shift_where):
        inputs = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in out.items()}
        inputs["ref_per_token_logps"] = inputs["ref_per_token_logps"] + 3.0 * shift_where
        with torch.no_grad():
            return float(grpo.compute_loss(model, inputs))

    base = loss(torch.zeros_like(observation, dtype=torch.float))
    assert loss(observation.float()) == pytest.approx(base, abs=1e-7)
    first_policy_token = torch.zeros_like(policy)
    first_policy_token[policy.nonzero()[0].tolist()[0], policy.nonzero()[0].tolist()[1]] = True
    assert abs(loss(first_policy_token.float()) - base) > 1e-6


def test_anchor_trajectories_are_executed_every_turn_and_the_others_never(tmp_path):
    trainer = multi_turn_trainer(tmp_path, max_turns=2)
    executor = trainer.step.dispatcher
    (_, scored), = train_capturing_batches(trainer)
    batch = scored.trajectories
    anchor_turns = [t.code for g in batch.anchors for trajectory in batch.groups[g] for t in trajectory.turns]
    assert sorted(executor.runs) == sorted(anchor_turns)
    for key in batch.keys():
        trajectory = batch.get(key)
        for turn in trajectory.turns:
            assert (turn.real is not None) == trajectory.anchor
            assert turn.shown is (turn.real if trajectory.anchor else turn.world_model)
    np.testing.assert_allclose(scored.real[batch.anchors], batch.rewards("real")[batch.anchors])


def test_a_trajectory_ends_at_its_token_budget(tmp_path):
    trainer = multi_turn_trainer(tmp_path, mode="worldModel", max_turns=4, maxTrajectoryTokens=10,
                                 world_model=TopOnceSeen())
    (out, scored), = train_capturing_batches(trainer)
    assert int(out["completion_mask"].sum(dim=1).max()) <= 10
    stops = scored.record.turns["stops"]
    assert stops["budget"] == 8 and stops["turns"] == 0  # no observation fits in 10 tokens after a turn


def test_a_turn_cut_off_at_max_new_tokens_ends_its_trajectory(tmp_path):
    """The random policy with its single EOS rarely stops within 2 tokens: such a turn is graded as it is,
    never revised, and the trajectory's last token is not a stop token (TRL's truncation masking sees it)."""
    config = run_config(tmp_path, "worldModel", steps=1, maxTurns=3, maxTrajectoryTokens=2000,
                        sampling={"maxNewTokens": 2})
    trainer = build_trainer(config, policy=tiny_policy(), tasks=make_tasks(2), world_model=TopOnceSeen(),
                            dispatcher=None)
    (out, scored), = train_capturing_batches(trainer)
    batch = scored.trajectories
    cut = [k for k in batch.keys() if batch.get(k).stop == "truncated"]
    assert cut and all(len(batch.get(k).turns) == 1 for k in cut)
    rows = [row for row, k in enumerate(batch.keys()) if k in cut]
    assert (out["tool_mask"][rows] == 1).all()  # nothing was appended after the cut turn


QWEN3_LIKE = (  # like Qwen3's: the last assistant turn after the last user turn gets an empty think block
    "{%- set ns = namespace(last=-1) -%}"
    "{%- for m in messages -%}{%- if m['role'] == 'user' -%}{%- set ns.last = loop.index0 -%}{%- endif -%}{%- endfor -%}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['role'] == 'assistant' and loop.index0 > ns.last %}<think>\n\n</think>\n\n{% endif %}"
    "{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.mark.parametrize("template", [CHATML, QWEN3_LIKE], ids=["chatml", "qwen3-like"])
def test_an_observation_is_a_user_turn_right_after_the_policys_eos(template):
    """Generation stops at <|im_end|> (the EOS); the observation must continue exactly as the template
    renders the conversation from there: newline, the user turn, the next assistant header."""
    from wmrl_trainer.policy import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    tokenizer.add_special_tokens({"eos_token": "<|im_end|>", "additional_special_tokens": ["<|im_start|>"]})
    tokenizer.chat_template = template
    ids = observation_ids(tokenizer, "status=valid")
    expected = tokenizer("\n<|im_start|>user\nstatus=valid<|im_end|>\n<|im_start|>assistant\n",
                         add_special_tokens=False)["input_ids"]
    assert ids == expected


def test_a_template_that_cannot_place_an_observation_is_refused():
    from wmrl_trainer.policy import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    tokenizer.chat_template = ("{%- for m in messages -%}{{ m['role'] }}: {{ m['content'] }}"
                               "{%- if loop.last %} (last){% endif %}\n{%- endfor -%}")
    with pytest.raises(ValueError, match="maxTurns: 1"):
        observation_ids(tokenizer, "status=valid")
