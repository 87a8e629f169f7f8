"""The smallest GRPOTrainer subclass that runs the WMRL step (TRL pinned: ``trl==1.16.0``).

What it changes, and nothing else:

* rewards come from one reward function (:meth:`WMRLGRPOTrainer.wmrl_reward`, TRL's
  documented reward-function interface) that returns the step's rewards, ``None`` for
  ungraded rows;
* the anchors and the world model start as soon as the completions exist (after
  ``_generate``), so sandbox execution overlaps the world model and TRL's reference
  log-prob pass instead of following them;
* advantages are recomputed with :func:`wmrl.advantages.grpo_advantages` (ungraded rows
  excluded from each group's mean and std), anchor-group rows are multiplied by the
  anchor weight AFTER the normalisation (:func:`wmrl.advantages.apply_anchor_weight`),
  and ungraded rows are removed from the loss by zeroing their ``completion_mask``
  (``num_items_in_batch`` is recounted so token-normalised losses stay right);
* with ``anchors.lateRewards`` (:mod:`wmrl_trainer.late`), each late anchor group's rows are
  kept (tokens and the sampling policy's log-probs) and, at the step its real rewards arrive,
  appended to that step's batch with per-token advantages (real-reward advantage x truncated
  importance ratio). Every rank keeps its own rows of a late group and appends them; every
  rank runs the same log-prob passes for them (a stand-in row where it holds none), as FSDP needs.

TRL internals relied on (checked by ``tests/trainer/test_grpo_trl_internals.py``, which
fails loudly when they change):

* ``GRPOTrainer._generate(prompts)`` returns an 8-tuple whose 4th item is the decoded
  completions (strings, or ``[{"role": "assistant", "content": ...}]`` when conversational);
* ``GRPOTrainer._generate_and_score_completions(inputs)``: ``inputs`` is the list of dataset
  rows of one generation batch, each prompt repeated ``num_generations`` times
  consecutively (``RepeatSampler``); it calls the reward functions and returns a dict with
  ``"advantages"`` (shape ``[rows]``), ``"completion_mask"`` (``[rows, tokens]``, also the
  attention mask of the completion), optional ``"tool_mask"``, and ``"num_items_in_batch"``
  (the loss normaliser of ``loss_type="dapo"``);
* reward functions are called as ``f(prompts=, completions=, completion_ids=, **columns)``
  and may return ``None`` for a row (TRL turns it into NaN);
* attributes ``self.model.training``, ``self.state.global_step``, ``self.accelerator``,
  ``self.num_generations``; ``self._metrics["train"]`` holds, until TRL logs (after
  ``on_step_end``), the current optimizer step's ``entropy`` (one mean per micro-batch),
  ``completions/mean_length`` and ``completions/clipped_ratio`` (one per generation batch;
  a completion is clipped when it ends in no EOS of the generation config);
* checkpointing (``wmrl_trainer.checkpoint``) uses transformers' ``Trainer.save_model``,
  ``_save_optimizer_and_scheduler``, ``_save_rng_state``, ``state.save_to_json`` and
  ``train(resume_from_checkpoint=...)``, which restores what they wrote;
* on resume, transformers' ``_load_optimizer_and_scheduler`` reads the optimizer state with
  ``map_location=self.args.device`` when there are several processes, and ``args.device`` is
  the cached property ``TrainingArguments._setup_devices``
  (:meth:`WMRLGRPOTrainer._load_optimizer_and_scheduler` relies on both).

Multi-turn (``spec.algorithm.maxTurns`` > 1) runs on TRL's supported path for it, a
``rollout_func`` (:meth:`WMRLGRPOTrainer._multi_turn_rollout`): each turn generates with
TRL's own ``_generate_single_turn`` (vLLM or transformers, as configured) on the prompt plus
the trajectory so far, the step grades the turn (:meth:`wmrl_trainer.loop.WMRLStep.grade_turn`),
and the observation's tokens are appended with ``env_mask`` 0, which TRL turns into its
``tool_mask``: no loss, no KL and no entropy on them. The trajectory's reward is its best
turn's (:mod:`wmrl_trainer.turns`). TRL internals this adds: ``_tokenize_prompts(prompts)``
returns ``(prompt_ids, images, multimodal_fields)``; ``_generate_single_turn(ids, None, {},
num_generations=1)`` returns ``(completion_ids, logprobs or None)``.

Generation with vLLM is TRL's, in the mode the spec names. Where TRL's weight sync cannot run or
cannot be relied on (server mode with a trainer without CUDA; colocate with vLLM's CPU build),
:mod:`wmrl_trainer.vllm_sync` syncs through vLLM's ``reload_weights`` instead; TRL internals
this adds: ``GRPOTrainer.__init__`` builds its backend from the module-level name
``trl.trainer.grpo_trainer.VLLMGeneration``, whose ``__init__`` calls ``_init_vllm()`` (server
mode: ``vllm_client.init_communicator``, the NCCL group), ``_iter_named_params()`` walks the
policy's parameters under vLLM's names, and ``_generate`` / ``_generate_single_turn`` call
``vllm_generation.sync_weights()`` before generating after an optimizer step.

Several processes (``wmrl launch``, one per GPU): each generates its slice of the generation
batch (TRL's split), rank 0 grades the whole batch once and every rank gets the same
:class:`~wmrl_trainer.loop.Scored` (:mod:`wmrl_trainer.distributed`), so advantages are
identical everywhere and each rank keeps its own rows. Multi-turn rollouts exchange each
turn's scripts and observations the same way; every rank runs the same number of turns and
generates the same number of rows in each (padded with throw-away rows), since generation under
FSDP is collective and TRL's vLLM paths slice the gathered prompts by rank.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
import torch
from trl import GRPOTrainer

from wmrl.advantages import apply_anchor_weight, grpo_advantages
from wmrl.tasks import Task
from wmrl_trainer.distributed import World
from wmrl_trainer.late import LateRow, append_rows, importance_weights, late_advantages, pad_rows
from wmrl_trainer.loop import Scored, WMRLStep, extract_code
from wmrl_trainer.sampling import completion_text, default_trajectory_tokens, observation_ids
from wmrl_trainer.trajectory_log import TrajectoryLogger, trajectory_entry, turn_log
from wmrl_trainer.vllm_sync import generation_backend, vllm_on_cpu, weight_sync


def wmrl_advantages(scored: Scored) -> tuple[np.ndarray, np.ndarray]:
    """(advantages per row with NaN -> 0, graded mask per row) for a scored batch, rows in group order."""
    adv = grpo_advantages(scored.rewards)
    if scored.anchor_groups and scored.weight != 1.0:
        adv = apply_anchor_weight(adv, scored.anchor_groups, scored.weight)
    flat = adv.reshape(-1)
    graded = ~np.isnan(flat)
    return np.where(graded, flat, 0.0), graded


def restorable_device(device: torch.device) -> torch.device:
    """``device`` as ``torch.load(map_location=)`` accepts it: accelerate names a CPU process's device
    ``cpu:<local rank>``, and torch 2.13 restores storages to plain ``cpu`` only (``cpu:0`` raises
    "don't know how to restore data location"). Both are the same memory."""
    return torch.device("cpu") if device.type == "cpu" else device


def vllm_weight_sync(args: Any) -> Optional[str]:
    """How the policy's weights reach vLLM under GRPOConfig ``args`` (:func:`wmrl_trainer.vllm_sync.weight_sync`);
    None without vLLM."""
    if args is None or not args.use_vllm:
        return None
    on_cpu = vllm_on_cpu() if args.vllm_mode == "colocate" else False
    return weight_sync(args.vllm_mode, args.device.type, on_cpu)


class WMRLGRPOTrainer(GRPOTrainer):
    def __init__(self, *args: Any, wmrl_step: Optional[WMRLStep], tasks: dict[str, Task], max_turns: int = 1,
                 max_trajectory_tokens: Optional[int] = None, world: World = World(),
                 rollouts_dir: Optional[str] = None, rollout_weights_dir: Optional[Path] = None,
                 trajectory_logger: Optional[TrajectoryLogger] = None, late_rewards: Any = None, **kwargs: Any):
        """``late_rewards``: ``spec.algorithm.anchors.lateRewards`` when enabled (None: late anchors' real rewards
        never reach the gradient)."""
        if max_turns < 1:
            raise ValueError(f"spec.algorithm.maxTurns must be at least 1, got {max_turns}")
        if late_rewards is not None and max_turns != 1:
            raise ValueError("spec.algorithm.anchors.lateRewards applies only to maxTurns: 1")
        self.wmrl_step = wmrl_step
        self.late_rewards = late_rewards
        self._late_rows: dict[tuple[int, int], list[LateRow]] = {}  # (step, group) -> this rank's rows of it
        self.wmrl_tasks = tasks
        self.max_turns = int(max_turns)
        self.world = world
        self.last_scored: Optional[Scored] = None
        self.last_generation_seconds = 0.0
        self._batch_tasks: Optional[list[str]] = None
        self._pending: Any = None
        self._submitted = False
        self._local_codes: list[list[str]] = []  # per row of this rank: its script per turn
        self._local_texts: list[list[str]] = []  # per row of this rank: its completion text per turn
        self.trajectory_logger = trajectory_logger
        self.rollouts_dir = Path(rollouts_dir) if rollouts_dir else None
        if self.max_turns > 1:
            kwargs["rollout_func"] = self._multi_turn_rollout
        self.weight_sync = vllm_weight_sync(kwargs.get("args"))
        with generation_backend(self.weight_sync, rollout_weights_dir):
            super().__init__(*args, reward_funcs=[self.wmrl_reward], **kwargs)
        self.max_trajectory_tokens = int(max_trajectory_tokens or default_trajectory_tokens(self.max_turns,
                                                                                          self.max_completion_length))
        if self.accelerator.num_processes != world.size or self.accelerator.process_index != world.rank:
            raise RuntimeError(f"accelerate sees process {self.accelerator.process_index} of "
                               f"{self.accelerator.num_processes}, the environment rank {world.rank} of {world.size}")

    # ---------------------------------------------------------------- TRL hooks
    def _load_optimizer_and_scheduler(self, checkpoint: Optional[str]) -> None:
        """TRL's and transformers' own, with ``args.device`` as torch can restore to while they run: with
        several processes on CPUs transformers maps the optimizer state to ``cpu:<rank>``, which torch
        2.13 refuses, so every multi-process CPU run failed to resume."""
        device = self.args.device
        target = restorable_device(device)
        if target == device:
            return super()._load_optimizer_and_scheduler(checkpoint)
        self.args.__dict__["_setup_devices"] = target  # the cached value behind args.device
        try:
            return super()._load_optimizer_and_scheduler(checkpoint)
        finally:
            self.args.__dict__["_setup_devices"] = device

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        self._batch_tasks = [row["task"] for row in inputs]
        if not self.model.training:
            return super()._generate_and_score_completions(inputs)
        self._pending, self._submitted, self.last_scored = None, False, None
        output = super()._generate_and_score_completions(inputs)
        scored = self.last_scored
        if scored is None:
            raise RuntimeError("the WMRL reward function was not called for this batch")
        advantages, graded = wmrl_advantages(scored)  # the whole batch's, identical on every rank
        mine = self.world.rows(len(inputs))
        advantages, graded = advantages[mine], graded[mine]
        if self.rollouts_dir is not None:
            self._log_rollouts(inputs, scored, mine, advantages, graded)
        if self.trajectory_logger is not None:
            self._log_trajectories(inputs, scored, mine, advantages, graded)
        device = output["advantages"].device
        if self.late_rewards is not None:  # before the mask loses the late groups' ungraded-now rows
            self._keep_late_rows(output, scored, mine)
        output["advantages"] = torch.tensor(advantages, dtype=output["advantages"].dtype, device=device)
        keep = torch.tensor(graded, dtype=output["completion_mask"].dtype, device=device).unsqueeze(1)
        output["completion_mask"] = output["completion_mask"] * keep
        if self.late_rewards is not None:
            output = self._add_arrivals(output, scored)
        loss_mask = output["completion_mask"] if "tool_mask" not in output else output["completion_mask"] * output["tool_mask"]
        output["num_items_in_batch"] = self.accelerator.gather(loss_mask.sum()).sum()  # over all ranks, as TRL's
        return output

    # ---------------------------------------------------------------- late anchors (anchors.lateRewards)
    def _rows_of(self, output: dict[str, Any], local: Sequence[int], logps: Optional[torch.Tensor]) -> list[LateRow]:
        """This rank's batch rows ``local`` as :class:`LateRow` (row index within the group unset: 0), with ``logps``
        (per completion token) as their behaviour log-probs."""
        rows = []
        for k, j in enumerate(local):
            prompt = output["prompt_ids"][j][output["prompt_mask"][j].bool()].tolist()
            n = int(output["completion_mask"][j].sum())  # TRL's mask: a prefix, up to the EOS
            completion = output["completion_ids"][j][:n].tolist()
            behaviour = [0.0] * n if logps is None else logps[k][:n].float().tolist()
            rows.append(LateRow(0, tuple(prompt), tuple(completion), tuple(behaviour)))
        return rows

    def _policy_logps(self, late: dict[str, torch.Tensor], model: Any) -> torch.Tensor:
        """Per-token log-probs of padded late rows (:func:`wmrl_trainer.late.pad_rows`) under ``model``, no gradient."""
        from trl.models.utils import disable_gradient_checkpointing

        ids = torch.cat([late["prompt_ids"], late["completion_ids"]], dim=1)
        mask = torch.cat([late["prompt_mask"], late["completion_mask"]], dim=1)
        with torch.no_grad(), disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs):
            logps, _, _ = self._get_per_token_logps_and_entropies(model, ids, mask, late["completion_ids"].shape[1],
                                                                  batch_size=self.args.per_device_train_batch_size)
        return logps

    def _keep_late_rows(self, output: dict[str, Any], scored: Scored, mine: slice) -> None:
        """Keep this rank's rows of the batch's late anchor groups with the log-probs of the policy that sampled
        them: vLLM's sampling log-probs or TRL's old ones when the batch has them, else the policy's now (it has
        not been updated since it generated them)."""
        size = self.num_generations
        wanted = [(g, row, row - mine.start) for g in scored.late_groups for row in range(g * size, (g + 1) * size)
                  if mine.start <= row < mine.stop]
        if not wanted:
            return
        local = [j for _, _, j in wanted]
        stored = output.get("sampling_per_token_logps")
        stored = output.get("old_per_token_logps") if stored is None else stored
        if stored is not None:
            logps = stored[local]
        else:
            padded = pad_rows(self._rows_of(output, local, None), self.processing_class.pad_token_id,
                              output["prompt_ids"].device)
            logps = self._policy_logps(padded, self.model)
        for (g, row, _), kept in zip(wanted, self._rows_of(output, local, logps)):
            key = (scored.record.step, g)
            self._late_rows.setdefault(key, []).append(dataclasses.replace(kept, row=row - g * size))

    def _add_arrivals(self, output: dict[str, Any], scored: Scored) -> dict[str, Any]:
        """Append this rank's rows of the late groups whose real rewards arrived (:func:`wmrl_trainer.late.append_rows`)."""
        for key in scored.late_expired:
            self._late_rows.pop(key, None)
        if not scored.arrivals:
            return output
        rows, advantages = [], []
        for arrival in scored.arrivals:
            group = late_advantages(arrival.real, scored.weight)
            for row in self._late_rows.pop((arrival.step, arrival.group), []):
                rows.append(row)
                advantages.append(group[row.row])
        # Every rank runs the same log-prob passes (collective under FSDP): a stand-in row where it holds none.
        stand_in = self._rows_of(output, [0], None)
        late = pad_rows(rows or stand_in, self.processing_class.pad_token_id, output["prompt_ids"].device)
        current = self._policy_logps(late, self.model)
        ref = None
        if self.beta != 0.0:
            if self.ref_model is None:
                raise RuntimeError("spec.algorithm.anchors.lateRewards needs TRL's reference model (a PEFT policy "
                                   "has none)")
            ref = self._policy_logps(late, self.ref_model)
        record = scored.record
        record.late_trained = len(scored.arrivals)
        if not rows:
            return output
        spec = self.late_rewards
        mask = late["completion_mask"]
        weights, truncated = importance_weights(current, late["behaviour_logps"], mask, spec.correction, spec.clip_max)
        adv = torch.tensor(advantages, dtype=weights.dtype, device=weights.device)
        graded = ~torch.isnan(adv)
        late["completion_mask"] = mask * graded.unsqueeze(1).to(mask.dtype)  # failed executions: out of the loss
        per_token = torch.where(graded, adv, torch.zeros_like(adv)).unsqueeze(1) * weights
        tokens = (late["completion_mask"] > 0)
        if tokens.any():
            record.late_weight_mean = float(weights[tokens].mean())
            record.late_clipped_share = float(truncated[tokens].float().mean())
        return append_rows(output, late, per_token, pad_token_id=self.processing_class.pad_token_id,
                           multiple=self.args.steps_per_generation, ref_logps=ref, current_logps=current)

    def _generate(self, prompts: list) -> tuple:
        if self.max_turns > 1:  # the rollout grades every turn itself
            return super()._generate(prompts)
        started = time.perf_counter()
        result = super()._generate(prompts)
        if self.model.training:
            self.last_generation_seconds = time.perf_counter() - started
            texts = [completion_text(c) for c in result[3]]
            self._local_codes = [[extract_code(t)] for t in texts]
            self._local_texts = [[t] for t in texts]
            self._submit(texts, self._batch_tasks)
        return result

    def _log_rollouts(self, inputs: list[dict[str, Any]], scored: Scored, mine: slice, advantages: np.ndarray,
                      graded: np.ndarray) -> None:
        """Append this rank's rows of the step to ``<rollouts_dir>/rank-<r>.jsonl`` (``wmrl train --rollouts``)."""
        rewards = scored.rewards.reshape(-1)[mine]
        anchors = set(scored.anchor_groups)
        self.rollouts_dir.mkdir(parents=True, exist_ok=True)
        with open(self.rollouts_dir / f"rank-{self.world.rank}.jsonl", "a") as fh:
            for j, row in enumerate(range(mine.start, mine.stop)):
                fh.write(json.dumps({
                    "step": self.state.global_step, "rank": self.world.rank, "row": row, "task": inputs[j]["task"],
                    "codes": self._local_codes[j] if j < len(self._local_codes) else None,
                    "reward": None if np.isnan(rewards[j]) else float(rewards[j]),
                    "advantage": float(advantages[j]), "graded": bool(graded[j]),
                    "anchor": row // self.num_generations in anchors, "weight": float(scored.weight)}) + "\n")

    def _log_trajectories(self, inputs: list[dict[str, Any]], scored: Scored, mine: slice, advantages: np.ndarray,
                          graded: np.ndarray) -> None:
        """Append this rank's sampled rows of the step to its trajectory log (:mod:`wmrl_trainer.trajectory_log`)."""
        logged = scored.turn_log or {}
        entries = []
        for j, row in enumerate(range(mine.start, mine.stop)):
            if row not in logged:
                continue
            entries.append(trajectory_entry(
                step=self.state.global_step, rank=self.world.rank, row=row, group_size=self.num_generations,
                task=inputs[j]["task"], mode=scored.record.mode, prompt=inputs[j]["prompt"],
                texts=self._local_texts[j] if j < len(self._local_texts) else [], scored=scored,
                advantage=advantages[j], graded=graded[j]))
        self.trajectory_logger.write(entries)

    def _with_turn_log(self, scored: Scored, codes: Optional[list[list[str]]]) -> Scored:
        """Rank 0: the grades of the rows the trajectory log samples, carried to every rank with the step's result."""
        if self.trajectory_logger is not None:
            rows = self.trajectory_logger.rows(self.state.global_step, scored.rewards.size)
            scored.turn_log = turn_log(scored, codes or [], rows, self.num_generations)
        return dataclasses.replace(scored, wm_outcomes=None, real_outcomes=None)  # only the log needed them

    def _submit(self, texts: list[str], names: list[str]) -> None:
        """Start grading the whole generation batch (every rank's rows) on rank 0."""
        texts, names = self.world.gather(texts), self.world.gather(names)
        if self.world.is_main:
            try:
                self._pending = self.wmrl_step.submit(self.state.global_step, *self._groups(texts, names))
            except Exception as exc:  # raised where every rank learns of it (wmrl_reward's share)
                self._pending = exc
        self._submitted = True

    def _score_pending(self) -> Scored:
        if isinstance(self._pending, Exception):
            raise self._pending
        return self._with_turn_log(self.wmrl_step.score(self._pending), self._pending.codes)

    def wmrl_reward(self, prompts: list, completions: list, **kwargs: Any) -> list[Optional[float]]:
        """TRL reward function: the WMRL step's reward per row of this rank, ``None`` where ungraded."""
        if isinstance(self._pending, Scored):  # multi-turn: graded turn by turn in the rollout
            scored = self._pending
        else:
            if not self._submitted:  # called outside training (TRL eval): grade now
                self._submit([completion_text(c) for c in completions], list(kwargs["task"]))
            scored = self.world.share(self._score_pending)
        scored.record.generation = self.last_generation_seconds
        self.last_scored, self._pending, self._submitted = scored, None, False
        rewards = scored.rewards.reshape(-1)[self.world.rows(len(completions))]
        return [None if np.isnan(r) else float(r) for r in rewards]

    def step_metric(self, name: str) -> Optional[float]:
        """Mean of TRL's metric ``name`` over this optimizer step (its values since TRL last logged)."""
        values = self._metrics["train"].get(name) or []
        return float(np.mean(values)) if values else None

    def _group_tasks(self, names: list[str]) -> list[Task]:
        """The task of each group of a generation batch whose rows have the tasks ``names``; a group's
        rows are consecutive (TRL's RepeatSampler) and share one task."""
        rows, size = len(names), self.num_generations
        if rows % size:
            raise RuntimeError(f"generation batch of {rows} rows does not split into groups of {size}")
        tasks = []
        for start in range(0, rows, size):
            group_names = set(names[start:start + size])
            if len(group_names) != 1:
                raise RuntimeError(f"rows {start}..{start + size - 1} mix tasks {sorted(group_names)}: not one group")
            tasks.append(self.wmrl_tasks[names[start]])
        return tasks

    def _groups(self, texts: list[str], names: list[str]) -> tuple[list[Task], list[list[str]]]:
        """Rows (text, task name) -> (task per group, code per group row)."""
        size = self.num_generations
        if len(texts) != len(names):
            raise RuntimeError(f"{len(texts)} completions for {len(names)} task rows")
        tasks = self._group_tasks(names)
        return tasks, [[extract_code(t) for t in texts[start:start + size]] for start in range(0, len(texts), size)]

    # ---------------------------------------------------------------- multi-turn
    def _multi_turn_rollout(self, prompts: list, trainer: Any) -> dict[str, Any]:
        """TRL ``rollout_func``: up to ``max_turns`` turns per row, each graded before the next (module docstring).

        Rows are this rank's slice of the generation batch (each prompt repeated
        ``num_generations`` times, consecutively). Rank 0 holds the batch's trajectories: each
        turn every rank sends it its scripts, it grades them and sends back each row's state
        (done, and the observation to show next); the rows' local ends (budget, truncation,
        last turn) go back to it before the next turn. Returns TRL's required fields plus
        ``env_mask`` (1 on the policy's tokens, 0 on observations). The step's
        :class:`~wmrl_trainer.loop.Scored` (the whole batch's, on every rank) is kept for
        :meth:`wmrl_reward`.
        """
        world = self.world
        names = world.gather(self._batch_tasks)
        offset = world.rows(len(prompts)).start
        trajectories: dict[str, Any] = {}

        def begin() -> None:
            trajectories["batch"] = self.wmrl_step.begin_trajectories(self.state.global_step,
                                                                      self._group_tasks(names), self.num_generations)

        world.share(begin)
        batch = trajectories.get("batch")
        keys = batch.keys() if batch is not None else None
        prompt_ids = self._tokenize_prompts(prompts)[0]
        completion: list[list[int]] = [[] for _ in prompts]
        env_mask: list[list[int]] = [[] for _ in prompts]
        logprobs: Optional[list[list[float]]] = None
        done = [False] * len(prompts)
        self._local_codes = [[] for _ in prompts]
        self._local_texts = [[] for _ in prompts]
        generation = 0.0
        for turn in range(self.max_turns):
            active = [r for r in range(len(prompts)) if not done[r]]
            width = max(world.gather([len(active)]))
            if not width:
                break
            # Every rank generates the same number of rows (TRL's vLLM paths slice the gathered
            # prompts by rank, assuming equal counts), padded with throw-away copies of a prompt.
            inputs = [list(prompt_ids[r]) + completion[r] for r in active]
            inputs += [list(prompt_ids[0])] * (width - len(inputs))
            started = time.perf_counter()
            new_ids, new_logprobs = self._generate_single_turn(inputs, None, {}, num_generations=1)
            generation += time.perf_counter() - started
            if new_logprobs is not None and logprobs is None:
                logprobs = [[0.0] * len(c) for c in completion]
            cut, truncated, written = set(), set(), []
            for j, r in enumerate(active):
                ids = list(new_ids[j])
                room = self.max_trajectory_tokens - len(completion[r])
                if len(ids) >= room:  # the budget ends the trajectory after this (cut) turn
                    ids = ids[:room]
                    cut.add(r)
                elif not ids or ids[-1] not in self.eos_token_ids:
                    truncated.add(r)  # ran into maxNewTokens: no complete script to revise
                written.append(ids)
                completion[r] += ids
                env_mask[r] += [1] * len(ids)
                if logprobs is not None:
                    logprobs[r] += list(new_logprobs[j][:len(ids)])
            texts = self.processing_class.batch_decode(written, skip_special_tokens=True) if written else []
            codes = [extract_code(t) for t in texts]
            for r, code, text in zip(active, codes, texts):
                self._local_codes[r].append(code)
                self._local_texts[r].append(text)
            graded = world.gather([(offset + r, code) for r, code in zip(active, codes)])

            def grade() -> dict[int, tuple[bool, str]]:
                self.wmrl_step.grade_turn(batch, [keys[g] for g, _ in graded], [code for _, code in graded])
                found = {}
                for g, _ in graded:
                    trajectory = batch.get(keys[g])
                    found[g] = (trajectory.done, "" if trajectory.done else trajectory.turns[-1].observation)
                return found

            state = world.share(grade)
            ends: list[tuple[int, str]] = []
            for r in active:
                finished, observation_text = state[offset + r]
                if finished:
                    done[r] = True
                    continue
                reason = ("budget" if r in cut else "truncated" if r in truncated  # truncated: as in single turns,
                          else "turns" if turn == self.max_turns - 1 else None)   # TRL masks it when asked to
                if reason is None:
                    observation = observation_ids(self.processing_class, observation_text, self.chat_template,
                                                  self.chat_template_kwargs)
                    if len(completion[r]) + len(observation) >= self.max_trajectory_tokens:
                        reason = "budget"
                    else:
                        completion[r] += observation
                        env_mask[r] += [0] * len(observation)
                        if logprobs is not None:
                            logprobs[r] += [0.0] * len(observation)
                if reason is not None:
                    ends.append((offset + r, reason))
                    done[r] = True
            ends = world.gather(ends)
            if world.is_main:
                for g, reason in ends:
                    batch.get(keys[g]).end(reason)
        self.last_generation_seconds = generation
        finished: dict[str, Scored] = {}

        def finish() -> Scored:
            finished["scored"] = scored = self.wmrl_step.finish_trajectories(batch)
            scored.record.turns = batch.summary()
            scored = self._with_turn_log(scored, None)
            finished["scored"].turn_log = scored.turn_log
            return dataclasses.replace(scored, trajectories=None)  # the trajectories stay on rank 0

        shared = world.share(finish)
        self._pending = finished.get("scored", shared)
        return {"prompt_ids": [list(p) for p in prompt_ids], "completion_ids": completion, "logprobs": logprobs,
                "env_mask": env_mask}
