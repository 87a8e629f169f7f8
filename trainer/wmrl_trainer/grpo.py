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
  (``num_items_in_batch`` is recounted so token-normalised losses stay right).

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
  ``train(resume_from_checkpoint=...)``, which restores what they wrote.

Multi-turn (``spec.algorithm.maxTurns`` > 1) runs on TRL's supported path for it, a
``rollout_func`` (:meth:`WMRLGRPOTrainer._multi_turn_rollout`): each turn generates with
TRL's own ``_generate_single_turn`` (vLLM or transformers, as configured) on the prompt plus
the trajectory so far, the step grades the turn (:meth:`wmrl_trainer.loop.WMRLStep.grade_turn`),
and the observation's tokens are appended with ``env_mask`` 0, which TRL turns into its
``tool_mask``: no loss, no KL and no entropy on them. The trajectory's reward is its best
turn's (:mod:`wmrl_trainer.turns`). TRL internals this adds: ``_tokenize_prompts(prompts)``
returns ``(prompt_ids, images, multimodal_fields)``; ``_generate_single_turn(ids, None, {},
num_generations=1)`` returns ``(completion_ids, logprobs or None)``.

Single process only (one accelerator process): the step needs the whole generation
batch; multi-process training would have to gather rows first.
"""

from __future__ import annotations

import time
from typing import Any, Optional

import numpy as np
import torch
from trl import GRPOTrainer

from wmrl.advantages import apply_anchor_weight, grpo_advantages
from wmrl.tasks import Task
from wmrl_trainer.loop import Scored, WMRLStep, extract_code


def completion_text(completion: Any) -> str:
    """The text of one TRL completion (a string, or a list of chat messages)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content") or "")
    raise TypeError(f"unexpected completion type {type(completion).__name__}")


def wmrl_advantages(scored: Scored) -> tuple[np.ndarray, np.ndarray]:
    """(advantages per row with NaN -> 0, graded mask per row) for a scored batch, rows in group order."""
    adv = grpo_advantages(scored.rewards)
    if scored.anchor_groups and scored.weight != 1.0:
        adv = apply_anchor_weight(adv, scored.anchor_groups, scored.weight)
    flat = adv.reshape(-1)
    graded = ~np.isnan(flat)
    return np.where(graded, flat, 0.0), graded


OBSERVATION_TOKENS = 512
"""What the default trajectory budget allows per observation (its output part is cut to
:data:`wmrl_trainer.observation.OUTPUT_CHARS` characters, a few hundred tokens)."""


def default_trajectory_tokens(max_turns: int, max_new_tokens: int) -> int:
    """``spec.algorithm.maxTrajectoryTokens`` when empty: every turn at full length, and its observations."""
    return max_turns * max_new_tokens + (max_turns - 1) * OBSERVATION_TOKENS


def observation_ids(tokenizer: Any, text: str, chat_template: Optional[str] = None,
                    chat_template_kwargs: Optional[dict] = None) -> list[int]:
    """The tokens of an observation: for a policy with a chat template, a user message and the
    next assistant header, exactly as the template renders them after an assistant turn that
    ended in EOS (what generation produced); else the plain text.

    The suffix starts right after the assistant turn's EOS: found as TRL finds a tool result's
    (the prefix conversation cut at its last EOS), or, for templates that render an earlier
    assistant turn differently from the last one (Qwen3 drops the empty think block once a
    user turn follows), as the EOS before the observation's own turn. A template whose turns
    do not end in EOS must at least render the conversation so far as a prefix of the longer one.
    """
    template = chat_template or getattr(tokenizer, "chat_template", None)
    if not template:
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
    kwargs = {"chat_template": chat_template, **(chat_template_kwargs or {})}
    before = [{"role": "user", "content": "task"}, {"role": "assistant", "content": "script"}]
    after = before + [{"role": "user", "content": text}]
    prefix = list(tokenizer.apply_chat_template(before, tokenize=True, return_dict=False, **kwargs))
    full = list(tokenizer.apply_chat_template(after, tokenize=True, add_generation_prompt=True, return_dict=False,
                                              **kwargs))
    eos = tokenizer.eos_token_id
    ends = [i for i, t in enumerate(prefix) if t == eos]
    full_ends = [i for i, t in enumerate(full) if t == eos]
    if ends and full[:ends[-1] + 1] == prefix[:ends[-1] + 1]:
        return full[ends[-1] + 1:]
    if len(full_ends) >= 3:  # user, assistant and observation turns each end in EOS
        return full[full_ends[-2] + 1:]
    head = tokenizer.apply_chat_template(before, tokenize=False, **kwargs)
    whole = tokenizer.apply_chat_template(after, tokenize=False, add_generation_prompt=True, **kwargs)
    if not ends and whole.startswith(head):
        return list(tokenizer(whole[len(head):], add_special_tokens=False)["input_ids"])
    raise ValueError("the policy's chat template renders an assistant turn differently once a user turn follows, "
                     "and its turns do not end in EOS: an observation cannot be placed after a turn "
                     "(use spec.algorithm.maxTurns: 1 with this policy)")


class WMRLGRPOTrainer(GRPOTrainer):
    def __init__(self, *args: Any, wmrl_step: WMRLStep, tasks: dict[str, Task], max_turns: int = 1,
                 max_trajectory_tokens: Optional[int] = None, **kwargs: Any):
        if max_turns < 1:
            raise ValueError(f"spec.algorithm.maxTurns must be at least 1, got {max_turns}")
        self.wmrl_step = wmrl_step
        self.wmrl_tasks = tasks
        self.max_turns = int(max_turns)
        self.last_scored: Optional[Scored] = None
        self.last_generation_seconds = 0.0
        self._batch_tasks: Optional[list[str]] = None
        self._pending: Any = None
        if self.max_turns > 1:
            kwargs["rollout_func"] = self._multi_turn_rollout
        super().__init__(*args, reward_funcs=[self.wmrl_reward], **kwargs)
        self.max_trajectory_tokens = int(max_trajectory_tokens or default_trajectory_tokens(self.max_turns,
                                                                                          self.max_completion_length))
        if self.accelerator.num_processes != 1:
            raise ValueError("the WMRL trainer runs as one process (the step needs the whole generation batch)")

    # ---------------------------------------------------------------- TRL hooks
    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        self._batch_tasks = [row["task"] for row in inputs]
        if not self.model.training:
            return super()._generate_and_score_completions(inputs)
        self._pending, self.last_scored = None, None
        output = super()._generate_and_score_completions(inputs)
        scored = self.last_scored
        if scored is None:
            raise RuntimeError("the WMRL reward function was not called for this batch")
        advantages, graded = wmrl_advantages(scored)
        device = output["advantages"].device
        output["advantages"] = torch.tensor(advantages, dtype=output["advantages"].dtype, device=device)
        keep = torch.tensor(graded, dtype=output["completion_mask"].dtype, device=device).unsqueeze(1)
        output["completion_mask"] = output["completion_mask"] * keep
        loss_mask = output["completion_mask"] if "tool_mask" not in output else output["completion_mask"] * output["tool_mask"]
        output["num_items_in_batch"] = loss_mask.sum()
        return output

    def _generate(self, prompts: list) -> tuple:
        if self.max_turns > 1:  # the rollout grades every turn itself
            return super()._generate(prompts)
        started = time.perf_counter()
        result = super()._generate(prompts)
        if self.model.training:
            self.last_generation_seconds = time.perf_counter() - started
            texts = [completion_text(c) for c in result[3]]
            self._pending = self.wmrl_step.submit(self.state.global_step, *self._groups(texts))
        return result

    def wmrl_reward(self, prompts: list, completions: list, **kwargs: Any) -> list[Optional[float]]:
        """TRL reward function: the WMRL step's reward per row, ``None`` where ungraded."""
        if isinstance(self._pending, Scored):  # multi-turn: graded turn by turn in the rollout
            scored = self._pending
        else:
            if self._pending is None:  # called outside training (TRL eval): grade now
                texts = [completion_text(c) for c in completions]
                self._batch_tasks = list(kwargs["task"])
                self._pending = self.wmrl_step.submit(self.state.global_step, *self._groups(texts))
            scored = self.wmrl_step.score(self._pending)
        scored.record.generation = self.last_generation_seconds
        self.last_scored, self._pending = scored, None
        return [None if np.isnan(r) else float(r) for r in scored.rewards.reshape(-1)]

    def step_metric(self, name: str) -> Optional[float]:
        """Mean of TRL's metric ``name`` over this optimizer step (its values since TRL last logged)."""
        values = self._metrics["train"].get(name) or []
        return float(np.mean(values)) if values else None

    def _group_tasks(self, rows: int) -> list[Task]:
        """The task of each group of a generation batch of ``rows`` rows; a group's rows are consecutive
        (TRL's RepeatSampler) and share one task."""
        names, size = self._batch_tasks, self.num_generations
        if names is None or len(names) != rows or rows % size:
            raise RuntimeError(f"generation batch of {rows} rows does not split into groups of {size}")
        tasks = []
        for start in range(0, rows, size):
            group_names = set(names[start:start + size])
            if len(group_names) != 1:
                raise RuntimeError(f"rows {start}..{start + size - 1} mix tasks {sorted(group_names)}: not one group")
            tasks.append(self.wmrl_tasks[names[start]])
        return tasks

    def _groups(self, texts: list[str]) -> tuple[list[Task], list[list[str]]]:
        """Rows -> (task per group, code per group row)."""
        size = self.num_generations
        tasks = self._group_tasks(len(texts))
        return tasks, [[extract_code(t) for t in texts[start:start + size]] for start in range(0, len(texts), size)]

    # ---------------------------------------------------------------- multi-turn
    def _multi_turn_rollout(self, prompts: list, trainer: Any) -> dict[str, Any]:
        """TRL ``rollout_func``: up to ``max_turns`` turns per row, each graded before the next (module docstring).

        Rows are the generation batch's (each prompt repeated ``num_generations`` times,
        consecutively). Returns TRL's required fields plus ``env_mask`` (1 on the policy's
        tokens, 0 on observations). The step's :class:`~wmrl_trainer.loop.Scored` is kept for
        :meth:`wmrl_reward`.
        """
        tasks = self._group_tasks(len(prompts))
        prompt_ids = self._tokenize_prompts(prompts)[0]
        batch = self.wmrl_step.begin_trajectories(self.state.global_step, tasks, self.num_generations)
        keys = batch.keys()
        completion: list[list[int]] = [[] for _ in prompts]
        env_mask: list[list[int]] = [[] for _ in prompts]
        logprobs: Optional[list[list[float]]] = None
        generation = 0.0
        for turn in range(self.max_turns):
            active = [r for r in range(len(prompts)) if not batch.get(keys[r]).done]
            if not active:
                break
            started = time.perf_counter()
            new_ids, new_logprobs = self._generate_single_turn([list(prompt_ids[r]) + completion[r] for r in active],
                                                              None, {}, num_generations=1)
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
            texts = self.processing_class.batch_decode(written, skip_special_tokens=True)
            self.wmrl_step.grade_turn(batch, [keys[r] for r in active], [extract_code(t) for t in texts])
            for r in active:
                trajectory = batch.get(keys[r])
                if trajectory.done:
                    continue
                if r in cut:
                    trajectory.end("budget")
                    continue
                if r in truncated:  # as in single turns: TRL masks it when maskTruncatedCompletions is set
                    trajectory.end("truncated")
                    continue
                if turn == self.max_turns - 1:
                    trajectory.end("turns")
                    continue
                observation = observation_ids(self.processing_class, trajectory.turns[-1].observation,
                                              self.chat_template, self.chat_template_kwargs)
                if len(completion[r]) + len(observation) >= self.max_trajectory_tokens:
                    trajectory.end("budget")
                    continue
                completion[r] += observation
                env_mask[r] += [0] * len(observation)
                if logprobs is not None:
                    logprobs[r] += [0.0] * len(observation)
        self.last_generation_seconds = generation
        scored = self.wmrl_step.finish_trajectories(batch)
        scored.record.turns = batch.summary()
        self._pending = scored
        return {"prompt_ids": [list(p) for p in prompt_ids], "completion_ids": completion, "logprobs": logprobs,
                "env_mask": env_mask}
