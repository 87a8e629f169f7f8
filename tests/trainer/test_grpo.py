"""TRL integration: every mode runs real GRPO steps with a tiny model on the CPU; the advantage surgery is exact."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from wmrl.advantages import grpo_advantages
from wmrl.api.runconfig import RunConfig, RunMetadata, Runtime
from wmrl.api.schema import WMRLRunSpec
from wmrl_trainer.build import build_trainer
from wmrl_trainer.grpo import wmrl_advantages
from wmrl_trainer.loop import Scored
from wmrl_trainer.policy import build_tiny_model, build_tiny_tokenizer
from wmrl_trainer.records import StepRecord
from wmrl_trainer.sampling import completion_text
from wmrl_scripted import ScriptedExecutor, ScriptedWorldModel, make_tasks

pytestmark = pytest.mark.slow


def run_config(tmp_path, mode: str = "wmrl", steps: int = 2, sampling=None, **algorithm) -> RunConfig:
    spec = WMRLRunSpec.model_validate({
        "mode": mode,
        "policy": {"model": "tiny", "rolloutEngine": "transformers", "sampling": sampling or {"maxNewTokens": 8}},
        "tasks": {"builtin": "mini-ml"},
        "algorithm": {"groupSize": 4, "groupsPerStep": 2, "steps": steps, "learningRate": 1e-2, "seed": 3,
                      "maxTurns": 1, "anchors": {"fraction": 0.5}, **algorithm},
        "trainer": {"checkpoint": {"intervalSteps": 100}},
    })
    return RunConfig(metadata=RunMetadata(name="t"), spec=spec,
                     runtime=Runtime(checkpoint_dir=str(tmp_path / "ckpt"), patch_status=False, metrics_port=None))


def tiny_policy(seed: int = 0):
    tokenizer = build_tiny_tokenizer()
    return build_tiny_model(tokenizer, seed=seed), tokenizer


def scored(rewards, anchors, weight) -> Scored:
    r = np.array(rewards, dtype=float)
    return Scored(r, anchors, weight, r, r, r, StepRecord(step=0, mode="wmrl"))


def test_anchor_weight_touches_exactly_the_anchor_rows_after_normalisation():
    rewards = [[0.1, 0.5, 0.9, 0.2], [0.0, 1.0, 0.5, 0.5], [0.3, 0.3, 0.7, 0.2]]
    plain, _ = wmrl_advantages(scored(rewards, [1], 1.0))
    weighted, graded = wmrl_advantages(scored(rewards, [1], 3.0))
    plain, weighted = plain.reshape(3, 4), weighted.reshape(3, 4)
    np.testing.assert_allclose(weighted[1], 3.0 * plain[1])
    np.testing.assert_allclose(weighted[[0, 2]], plain[[0, 2]])
    assert graded.all()


def test_ungraded_rows_get_no_advantage_and_do_not_shift_their_group():
    rewards = [[0.1, np.nan, 0.9, 0.5], [0.2, 0.4, 0.6, 0.8]]
    adv, graded = wmrl_advantages(scored(rewards, [], 1.0))
    assert graded.tolist() == [True, False, True, True, True, True, True, True]
    assert adv[1] == 0.0
    graded_only, _ = wmrl_advantages(scored([[0.1, 0.9, 0.5]], [], 1.0))
    np.testing.assert_allclose(adv[[0, 2, 3]], graded_only)


def test_completion_text_reads_strings_and_chat_messages():
    assert completion_text("x = 1") == "x = 1"
    assert completion_text([{"role": "assistant", "content": "y = 2"}]) == "y = 2"


@pytest.mark.parametrize("mode", ["wmrl", "real", "worldModel"])
def test_every_mode_runs_trl_steps_with_a_tiny_model(tmp_path, mode):
    records = []
    executor = ScriptedExecutor()
    trainer = build_trainer(run_config(tmp_path, mode), policy=tiny_policy(), tasks=make_tasks(3),
                            world_model=ScriptedWorldModel(noise=0.1), dispatcher=executor, callbacks=[records.append])
    before = [p.detach().clone() for p in trainer.grpo.model.parameters()]
    try:
        summary = trainer.train()
    finally:
        trainer.close()
    assert summary["steps"] == 2 and summary["finished"]
    assert [r.step for r in records] == [0, 1]
    changed = any(not torch.equal(a, b) for a, b in zip(before, trainer.grpo.model.parameters()))
    assert changed, "the policy did not move"
    for r in records:
        assert r.rows == 8 and r.total > 0
        assert r.generation > 0 and r.update > 0
        if mode == "real":
            assert r.executions == 8 and r.mean_world_model_reward is None
        elif mode == "worldModel":
            assert r.executions == 0 and r.mean_real_reward is None
        else:
            assert r.executions == 4 * r.anchor_groups and r.anchor_groups >= 1 and r.weight >= 1.0
    assert (tmp_path / "ckpt" / "step-00000002" / "COMPLETE").is_file()  # the final step is always saved


def train_capturing_batches(trainer) -> list:
    """Train (then close) ``trainer``; returns (what TRL trains on, our scored batch) per generation batch."""
    seen = []
    original = type(trainer.grpo)._generate_and_score_completions

    def capture(self, inputs):
        out = original(self, inputs)
        seen.append((out, self.last_scored))
        return out

    trainer.grpo._generate_and_score_completions = capture.__get__(trainer.grpo)
    try:
        trainer.train()
    finally:
        trainer.close()
    return seen


def test_ungraded_rows_never_reach_the_loss(tmp_path):
    """A world model that grades nothing in half the rows: those rows' mask is zero in what TRL trains on."""

    class Spy(ScriptedWorldModel):
        def grade(self, items):
            out = super().grade(items)
            return [None if i % 2 else o for i, o in enumerate(out)]

    trainer = build_trainer(run_config(tmp_path, "worldModel", steps=1), policy=tiny_policy(), tasks=make_tasks(2),
                            world_model=Spy(), dispatcher=None)
    out, scored_batch = train_capturing_batches(trainer)[0]
    ungraded = np.isnan(scored_batch.rewards.reshape(-1))
    assert ungraded.sum() == 4
    mask = out["completion_mask"].sum(dim=1)
    assert (mask[torch.tensor(ungraded)] == 0).all()
    assert (out["advantages"][torch.tensor(ungraded)] == 0).all()
    assert out["num_items_in_batch"] == out["completion_mask"].sum()


def test_trl_trains_on_anchor_weighted_advantages_and_masks_ungraded_rows(tmp_path):
    """wmrl mode through TRL: what TRL trains on is each group's normalised advantage, times the anchor
    weight in anchor groups (applied after the normalisation), and zero with an empty mask where ungraded."""

    class GradesEvenRowsOnly(ScriptedWorldModel):
        def grade(self, items):
            return [None if i % 2 else o for i, o in enumerate(super().grade(items))]

    # warmup 1: the weight is frozen at targetWeight by the first anchor group, so step 0 already uses it.
    config = run_config(tmp_path, "wmrl", steps=1, denoising={"warmup": 1, "targetWeight": 3.0})
    trainer = build_trainer(config, policy=tiny_policy(), tasks=make_tasks(2), world_model=GradesEvenRowsOnly(),
                            dispatcher=ScriptedExecutor())
    out, scored_batch = train_capturing_batches(trainer)[0]
    anchors = scored_batch.anchor_groups
    assert anchors and len(anchors) < len(scored_batch.rewards)  # both kinds of group in the batch
    assert scored_batch.weight == pytest.approx(3.0)
    expected = grpo_advantages(scored_batch.rewards)
    expected[anchors] *= scored_batch.weight
    expected = expected.reshape(-1)
    ungraded = np.isnan(expected)
    assert ungraded.sum() == 2 * (len(scored_batch.rewards) - len(anchors))  # odd rows of world-model groups
    np.testing.assert_allclose(out["advantages"].numpy(), np.where(ungraded, 0.0, expected), rtol=1e-5, atol=1e-6)
    tokens = out["completion_mask"].sum(dim=1).numpy()
    assert (tokens[ungraded] == 0).all() and (tokens[~ungraded] > 0).all()


def test_mask_truncated_completions_leaves_scripts_without_eos_out_of_the_loss(tmp_path):
    config = run_config(tmp_path, "worldModel", steps=1, sampling={"maxNewTokens": 3, "maskTruncatedCompletions": True})
    trainer = build_trainer(config, policy=tiny_policy(), tasks=make_tasks(2), world_model=ScriptedWorldModel(),
                            dispatcher=None)
    assert trainer.grpo.args.mask_truncated_completions is True
    out, _ = train_capturing_batches(trainer)[0]
    eos = trainer.grpo.processing_class.eos_token_id
    ended = (out["completion_ids"] == eos).any(dim=1)
    assert (~ended).any()  # a random tiny model rarely stops within 3 tokens
    assert (out["completion_mask"].sum(dim=1)[~ended] == 0).all()
    assert (out["completion_mask"].sum(dim=1)[ended] > 0).all()


@pytest.mark.parametrize("correction", ["none", "token"])
def test_late_anchor_rows_join_the_batch_of_the_step_their_real_rewards_arrive_at(tmp_path, correction):
    """waitSeconds 0 with lateRewards: step 0's anchor group is late (its sandbox is held); released after
    step 0, its rows join step 1's batch with per-token advantages = its real rewards' group advantages x the
    importance weight (1 without correction, in (0, clipMax] with it), and TRL trains on them."""
    import concurrent.futures as cf
    import threading

    from wmrl_trainer.late import late_advantages

    gate = threading.Event()
    executor = ScriptedExecutor(slots=64, release=gate)
    config = run_config(tmp_path, "wmrl", steps=2, anchors={"fraction": 0.5, "waitSeconds": 0,
                                                             "lateRewards": {"enabled": True, "correction": correction}})
    holds = [gate]

    def release_step_0(record):
        if record.step == 0:
            holds.append(threading.Event())
            executor.release = holds[-1]  # step 1's own anchors stay running
            gate.set()
            cf.wait([f for item in trainer.step._late for f in item.pending.executions.values()])

    records = []
    trainer = build_trainer(config, policy=tiny_policy(), tasks=make_tasks(2), world_model=ScriptedWorldModel(),
                            dispatcher=executor, callbacks=[release_step_0, records.append])
    try:
        seen = train_capturing_batches(trainer)
    finally:
        for hold in holds:
            hold.set()
    (first_out, first), (out, second) = seen
    assert first.late_groups and first_out["prompt_ids"].shape[0] == 8  # nothing has arrived at step 0
    [arrival] = second.arrivals
    assert (arrival.step, arrival.group) == (0, first.late_groups[0])
    assert records[1].late_trained == 1 and records[0].late_trained == 0
    assert out["prompt_ids"].shape[0] == 12 and out["advantages"].shape == out["completion_ids"].shape
    expected = late_advantages(arrival.real, second.weight)
    late_mask = out["completion_mask"][8:].bool()
    assert (late_mask.sum(dim=1) > 0).all()
    ratio = out["advantages"][8:] / torch.tensor(expected, dtype=torch.float32).unsqueeze(1)
    ratio = ratio[late_mask]
    if correction == "none":
        np.testing.assert_allclose(ratio.numpy(), 1.0, rtol=1e-5)
        assert records[1].late_weight_mean == pytest.approx(1.0)
    else:
        assert ((ratio > 0) & (ratio <= 3.0 + 1e-6)).all()
        assert records[1].late_weight_mean == pytest.approx(float(ratio.mean()), rel=1e-4)
    assert out["num_items_in_batch"] == out["completion_mask"].sum()


def test_spec_settings_reach_the_step_and_trls_vllm_config(tmp_path):
    """anchors.waitSeconds and the vLLM knobs are spec fields (no environment variables)."""
    from wmrl.api.schema import PolicySpec
    from wmrl_trainer.build import vllm_options

    config = run_config(tmp_path, "wmrl", steps=1, anchors={"fraction": 0.5, "waitSeconds": 0.25})
    trainer = build_trainer(config, policy=tiny_policy(), tasks=make_tasks(2), world_model=ScriptedWorldModel(),
                            dispatcher=ScriptedExecutor())
    try:
        assert trainer.step.anchor_wait == 0.25
    finally:
        trainer.close()
    assert run_config(tmp_path).spec.algorithm.anchors.wait_seconds is None  # default: wait for every anchor
    # What GRPOConfig gets on a GPU node (GRPOConfig itself refuses CUDA settings on this CPU machine).
    colocate = PolicySpec.model_validate({"model": "m", "vllmGpuMemoryUtilization": 0.45, "vllmTensorParallelSize": 2})
    assert vllm_options(colocate) == {"vllm_mode": "colocate", "vllm_gpu_memory_utilization": 0.45,
                                      "vllm_tensor_parallel_size": 2}
    server = PolicySpec.model_validate({"model": "m", "vllmMode": "server", "vllmServerUrl": "http://vllm:8000"})
    assert vllm_options(server) == {"vllm_mode": "server", "vllm_server_base_url": "http://vllm:8000"}
    assert vllm_options(PolicySpec.model_validate({"model": "m", "vllmMode": "server"})) == {"vllm_mode": "server"}


def test_evaluate_returns_the_mean_real_reward_and_leaves_training_rng_alone(tmp_path):
    executor = ScriptedExecutor()
    trainer = build_trainer(run_config(tmp_path, "real", steps=1), policy=tiny_policy(), tasks=make_tasks(2),
                            dispatcher=executor)
    try:
        rng = torch.get_rng_state()
        value = trainer.evaluate(make_tasks(2), samples_per_task=3)
        assert torch.equal(rng, torch.get_rng_state())
    finally:
        trainer.close()
    assert len(executor.runs) == 6
    assert 0.5 <= value <= 1.0  # the scripted executor grades every script as a valid submission
