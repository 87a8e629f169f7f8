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


class WMRLGRPOTrainer(GRPOTrainer):
    def __init__(self, *args: Any, wmrl_step: WMRLStep, tasks: dict[str, Task], **kwargs: Any):
        self.wmrl_step = wmrl_step
        self.wmrl_tasks = tasks
        self.last_scored: Optional[Scored] = None
        self.last_generation_seconds = 0.0
        self._batch_tasks: Optional[list[str]] = None
        self._pending: Any = None
        super().__init__(*args, reward_funcs=[self.wmrl_reward], **kwargs)
        if self.accelerator.num_processes != 1:
            raise ValueError("the WMRL trainer runs as one process (the step needs the whole generation batch)")

    # ---------------------------------------------------------------- TRL hooks
    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        if not self.model.training:
            return super()._generate_and_score_completions(inputs)
        self._batch_tasks = [row["task"] for row in inputs]
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
        started = time.perf_counter()
        result = super()._generate(prompts)
        if self.model.training:
            self.last_generation_seconds = time.perf_counter() - started
            texts = [completion_text(c) for c in result[3]]
            self._pending = self.wmrl_step.submit(self.state.global_step, *self._groups(texts))
        return result

    def wmrl_reward(self, prompts: list, completions: list, **kwargs: Any) -> list[Optional[float]]:
        """TRL reward function: the WMRL step's reward per row, ``None`` where ungraded."""
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

    def _groups(self, texts: list[str]) -> tuple[list[Task], list[list[str]]]:
        """Rows -> (task per group, code per group row); rows of a group are consecutive (TRL's RepeatSampler)."""
        names, size = self._batch_tasks, self.num_generations
        if names is None or len(names) != len(texts) or len(texts) % size:
            raise RuntimeError(f"generation batch of {len(texts)} rows does not split into groups of {size}")
        tasks, codes = [], []
        for start in range(0, len(texts), size):
            group_names = set(names[start:start + size])
            if len(group_names) != 1:
                raise RuntimeError(f"rows {start}..{start + size - 1} mix tasks {sorted(group_names)}: not one group")
            tasks.append(self.wmrl_tasks[names[start]])
            codes.append([extract_code(t) for t in texts[start:start + size]])
        return tasks, codes
