"""Late anchors' real rewards in a later step's gradient: the pure pieces (wmrl_trainer.late) and the step's side."""

from __future__ import annotations

import concurrent.futures as cf
import math
import threading

import numpy as np
import pytest
import torch

from wmrl.anchors import AnchorSelector
from wmrl.api.schema import AlgorithmSpec
from wmrl.calibration.client import LocalCalibration
from wmrl.calibration.state import CalibrationConfig
from wmrl_trainer.late import LateRow, append_rows, importance_weights, late_advantages, pad_rows
from wmrl_trainer.loop import WMRLStep
from wmrl_scripted import ScriptedExecutor, ScriptedWorldModel, make_tasks, quality

G, B = 4, 4


# ---------------------------------------------------------------- the importance ratio

def test_token_ratio_is_current_over_stored_probability_truncated_at_clip_max():
    current = torch.tensor([[-1.0, -0.5, -3.0]])
    stored = torch.tensor([[-1.2, -2.0, -2.0]])
    mask = torch.tensor([[1, 1, 1]])
    w, cut = importance_weights(current, stored, mask, "token", 3.0)
    # by hand: exp(0.2) = 1.2214, exp(1.5) = 4.4817 -> 3.0 (cut), exp(-1.0) = 0.3679 (no lower bound)
    np.testing.assert_allclose(w.numpy(), [[math.exp(0.2), 3.0, math.exp(-1.0)]], rtol=1e-6)
    assert cut.tolist() == [[False, True, False]]


def test_sequence_ratio_is_the_product_over_the_rows_tokens_then_truncated():
    current = torch.tensor([[-1.0, -1.0, -9.0], [-1.0, -1.0, -1.0]])
    stored = torch.tensor([[-1.3, -1.2, 0.0], [-1.0, -2.0, -1.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])  # row 0's last token is padding: not in its product
    w, cut = importance_weights(current, stored, mask, "sequence", 2.0)
    first = math.exp(0.3 + 0.2)  # 1.6487, under the cap
    np.testing.assert_allclose(w.numpy(), [[first, first, 0.0], [2.0, 2.0, 2.0]], rtol=1e-6)  # exp(1) = 2.718 -> 2
    assert cut.tolist() == [[False, False, False], [True, True, True]]


def test_no_correction_weighs_every_token_one_and_masks_padding():
    w, cut = importance_weights(torch.zeros(2, 2), torch.full((2, 2), -5.0), torch.tensor([[1, 0], [1, 1]]), "none", 3.0)
    assert w.tolist() == [[1.0, 0.0], [1.0, 1.0]] and not cut.any()


def test_the_ratio_carries_no_gradient():
    current = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    w, _ = importance_weights(current, torch.tensor([[-1.5, -2.5]]), torch.ones(1, 2), "token", 3.0)
    assert not w.requires_grad


@pytest.mark.parametrize("correction,clip,field", [("ppo", 3.0, "correction"), ("token", 0.0, "clipMax")])
def test_bad_settings_name_the_field(correction, clip, field):
    with pytest.raises(ValueError, match=f"lateRewards.{field}"):
        importance_weights(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), correction, clip)


# ---------------------------------------------------------------- advantages and the batch

def test_late_advantages_normalise_the_real_rewards_within_the_group_times_the_weight():
    real = np.array([0.2, np.nan, 0.8, 0.5])  # row 1 failed: not in the mean or std
    adv = late_advantages(real, weight=2.0)
    mean, std = 0.5, math.sqrt(((0.2 - 0.5) ** 2 + (0.8 - 0.5) ** 2 + 0.0) / 3)
    expected = [2.0 * (r - mean) / (std + 1e-4) for r in (0.2, 0.8, 0.5)]
    np.testing.assert_allclose(adv[[0, 2, 3]], expected)
    assert np.isnan(adv[1])
    with pytest.raises(ValueError, match="anchor weight"):
        late_advantages(real, weight=0.0)


def batch(rows: int = 4, prompt: int = 3, completion: int = 2, **extra) -> dict:
    out = {"prompt_ids": torch.arange(rows * prompt).reshape(rows, prompt),
           "prompt_mask": torch.ones(rows, prompt, dtype=torch.long),
           "completion_ids": torch.arange(rows * completion).reshape(rows, completion) + 100,
           "completion_mask": torch.ones(rows, completion, dtype=torch.long),
           "advantages": torch.arange(rows, dtype=torch.float32) - 1.5,
           "num_items_in_batch": torch.tensor(rows * completion)}
    out.update(extra)
    return out


ROWS = [LateRow(0, (7, 8, 9, 10), (50, 51, 52), (-0.1, -0.2, -0.3)), LateRow(1, (7,), (60,), (-0.4,))]


def test_pad_rows_pads_prompts_left_and_completions_right():
    late = pad_rows(ROWS, pad_token_id=0)
    assert late["prompt_ids"].tolist() == [[7, 8, 9, 10], [0, 0, 0, 7]]
    assert late["prompt_mask"].tolist() == [[1, 1, 1, 1], [0, 0, 0, 1]]
    assert late["completion_ids"].tolist() == [[50, 51, 52], [60, 0, 0]]
    assert late["completion_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    np.testing.assert_allclose(late["behaviour_logps"].numpy(), [[-0.1, -0.2, -0.3], [-0.4, 0, 0]], rtol=1e-6)
    with pytest.raises(ValueError, match="log-probs"):
        LateRow(0, (1,), (2, 3), (-1.0,))


def test_append_rows_joins_the_batch_with_per_token_advantages_and_pads_to_the_micro_batch_count():
    own = batch(ref_per_token_logps=torch.full((4, 2), -1.0))
    late = pad_rows(ROWS, pad_token_id=0)
    adv = torch.tensor([[0.5, 0.6, 0.7], [-1.0, 0.0, 0.0]])
    out = append_rows(own, late, adv, pad_token_id=0, multiple=4, ref_logps=torch.full((2, 3), -2.0))
    assert out["prompt_ids"].shape == (8, 4) and out["completion_ids"].shape == (8, 3)  # 4 + 2 late + 2 padding
    assert out["prompt_ids"][0].tolist() == [0, 0, 1, 2] and out["prompt_mask"][0].tolist() == [0, 1, 1, 1]
    assert out["completion_mask"][:4, 2].tolist() == [0, 0, 0, 0]  # the batch's own rows: padded on the right
    assert out["completion_mask"][4:6].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert out["completion_mask"][6:].sum() == 0 and out["advantages"][6:].abs().sum() == 0  # padding rows
    np.testing.assert_allclose(out["advantages"][:4, :2].numpy(), [[-1.5] * 2, [-0.5] * 2, [0.5] * 2, [1.5] * 2])
    np.testing.assert_allclose(out["advantages"][4:6].numpy(), adv.numpy())
    assert out["ref_per_token_logps"][4:6, :1].tolist() == [[-2.0], [-2.0]]
    assert out["num_items_in_batch"] is own["num_items_in_batch"]  # the caller recounts


def test_append_rows_refuses_what_it_cannot_fill():
    late = pad_rows(ROWS, pad_token_id=0)
    adv = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="ref_per_token_logps"):
        append_rows(batch(ref_per_token_logps=torch.zeros(4, 2)), late, adv, pad_token_id=0)
    with pytest.raises(RuntimeError, match="tool_mask"):
        append_rows(batch(tool_mask=torch.ones(4, 2)), late, adv, pad_token_id=0)
    with pytest.raises(ValueError, match="shape"):
        append_rows(batch(), late, torch.zeros(2, 2), pad_token_id=0)


def test_with_trls_sampling_log_probs_the_late_rows_get_their_stored_ones_and_ratio_one():
    own = batch(old_per_token_logps=torch.zeros(4, 2), sampling_per_token_logps=torch.zeros(4, 2),
                importance_sampling_ratio=torch.full((4, 1), 0.9))
    late = pad_rows(ROWS, pad_token_id=0)
    current = torch.full((2, 3), -0.05)
    out = append_rows(own, late, torch.zeros(2, 3), pad_token_id=0, current_logps=current)
    np.testing.assert_allclose(out["sampling_per_token_logps"][4:].numpy(), late["behaviour_logps"].numpy())
    np.testing.assert_allclose(out["old_per_token_logps"][4:].numpy(), current.numpy())
    assert out["importance_sampling_ratio"][4:].tolist() == [[1.0], [1.0]]


# ---------------------------------------------------------------- a late anchor's reward reaches a later gradient

def codes_for(step: int) -> list[list[str]]:
    return [[f"s{step}-g{g}-r{i}" for i in range(G)] for g in range(B)]


def test_a_late_anchors_real_reward_reaches_a_later_steps_gradient():
    """Step 0's anchors are still running when it trains (late); at step 1 they have finished: the step reports
    their real rewards, and the rows the trainer kept join step 1's batch with those rewards' advantages, so the
    gradient of the token-normalised policy loss on them follows the real rewards (and their importance ratio)."""
    gate = threading.Event()
    executor = ScriptedExecutor(slots=64, release=gate)
    alg = AlgorithmSpec.model_validate({"groupSize": G, "groupsPerStep": B, "maxTurns": 1,
                                        "anchors": {"waitSeconds": 0, "lateRewards": {"enabled": True}}})
    cal = LocalCalibration(CalibrationConfig(min_pairs=64, refit_every=32, warmup=8, half_life=16.0))
    step = WMRLStep("wmrl", alg, world_model=ScriptedWorldModel(), dispatcher=executor, calibration=cal,
                    selector=AnchorSelector(0.5, 1, 16, seed=0), anchor_wait=0.0)
    tasks = make_tasks(B)
    try:
        first_pending = step.submit(0, tasks, codes_for(0))
        first = step.score(first_pending)
        assert first.late_groups == first_pending.anchors and first.arrivals == [] and first.anchor_groups == []
        executor.release = threading.Event()  # step 1's own anchors stay running
        gate.set()
        cf.wait(list(first_pending.executions.values()))
        second = step.score(step.submit(1, tasks, codes_for(1)))
    finally:
        gate.set()
        executor.release.set()
        executor.close()
    arrived = {(a.step, a.group): a.real for a in second.arrivals}
    assert sorted(arrived) == [(0, g) for g in first.late_groups]
    for g in first.late_groups:
        np.testing.assert_allclose(arrived[(0, g)], [0.5 + 0.5 * quality(c) for c in codes_for(0)[g]])

    # The trainer's side, on a toy policy: one logit per token id, a completion of one token per row.
    g = first.late_groups[0]
    real = arrived[(0, g)]
    logits = torch.zeros(200, requires_grad=True)
    kept = [LateRow(i, (1, 2), (100 + i,), (math.log(1 / 200),)) for i in range(G)]  # sampled by the uniform policy
    late = pad_rows(kept, pad_token_id=0)
    current = torch.log_softmax(logits, 0)[late["completion_ids"]]
    weights, _ = importance_weights(current, late["behaviour_logps"], late["completion_mask"], "token", 3.0)
    adv = torch.tensor(late_advantages(real, second.weight), dtype=torch.float32).unsqueeze(1) * weights
    out = append_rows(batch(rows=4, completion=1), late, adv, pad_token_id=0, multiple=4)
    rows = slice(4, 4 + G)
    logp = torch.log_softmax(logits, 0)[out["completion_ids"][rows]]
    mask = out["completion_mask"][rows].float()
    loss = -(out["advantages"][rows] * torch.exp(logp - logp.detach()) * mask).sum() / out["completion_mask"].sum()
    loss.backward()
    # the policy is still the sampling one (ratio 1): each late row's token gets d/dlogit = A_real(row) / tokens
    # (minus the softmax's share of every row's advantage, which sums to zero within the group)
    expected = late_advantages(real, second.weight) / out["completion_mask"].sum().item()
    np.testing.assert_allclose(-logits.grad[100:100 + G].numpy(), expected, rtol=1e-5, atol=1e-7)
    assert np.abs(expected).max() > 0
