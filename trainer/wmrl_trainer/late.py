"""Late anchors' real rewards in the gradient of the step they arrive at (``spec.algorithm.anchors.lateRewards``).

With ``anchors.waitSeconds`` a step does not wait for every anchor group: a late group trains on
calibrated world-model rewards at its own step, and the first step after its executions finish
gets it as an :class:`~wmrl_trainer.loop.Arrival` (:mod:`wmrl_trainer.loop`). With
``lateRewards.enabled`` the trainer (:mod:`wmrl_trainer.grpo`) keeps the group's rollouts (prompt
and completion tokens, and the log-probs of the policy that sampled them, ``mu``) until then and
appends them to that step's batch:

* **advantages**: the group's real rewards normalised within the group, failed rows left out
  (:func:`late_advantages`), times the step's anchor weight: what the group would have had on time;
* **off-policy correction** (:func:`importance_weights`): the rollout was sampled by ``mu``, the
  policy of its own step, and is trained under the current one, ``pi``. ``token``: per token, the
  ratio ``pi(y_t | ...) / mu(y_t | ...)`` (current log-probs without gradient against the stored
  ones) truncated from above at ``clipMax``; ``sequence``: one ratio per rollout, the product over
  its tokens, truncated likewise; ``none``: 1. This is the form of TRL's truncated importance
  sampling (``GRPOConfig.vllm_importance_sampling_mode`` ``token_truncate`` /
  ``sequence_truncate``: ``min(exp(logp_trainer - logp_sampler), C_max)`` multiplying the per-token
  loss before the KL term is added), where the sampler is vLLM; here it is the older policy.
  TRL's per-token policy loss is ``-min(c A, clip(c) A)``: a constant factor ``w >= 0`` on it is the
  same as ``w A`` for ``A`` (:func:`append_rows` folds the weight into a per-token advantage, which
  TRL's loss accepts), and the KL term stays unweighted, as in TRL;
* the rows then count in TRL's own loss like any other (its token-normalised ``dapo`` loss over
  the batch's tokens, KL to the reference included: their reference log-probs are computed when
  they are appended).

Pure: lists and tensors in, tensors out; the trainer computes the log-probs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np
import torch

from wmrl.advantages import grpo_advantages

CORRECTIONS = ("token", "sequence", "none")

PER_ROW_KEYS = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "advantages",
                "old_per_token_logps", "sampling_per_token_logps", "ref_per_token_logps", "importance_sampling_ratio")
"""The per-row entries of TRL's training batch that late rows know how to join."""


@dataclass(frozen=True)
class LateRow:
    """One rollout of a late anchor group, as kept until its real reward arrives."""

    row: int  # its index in the group
    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]  # the tokens the loss covers (TRL's completion mask: up to the EOS)
    behaviour_logps: tuple[float, ...]  # log-probs of completion_ids under the policy that sampled them

    def __post_init__(self) -> None:
        if len(self.completion_ids) != len(self.behaviour_logps):
            raise ValueError(f"{len(self.completion_ids)} completion tokens but {len(self.behaviour_logps)} log-probs")


def late_advantages(real: np.ndarray, weight: float = 1.0) -> np.ndarray:
    """``[G]`` advantages of an arrived group: its real rewards normalised within the group (NaN rows, failed
    executions, stay NaN and out of the normalisation), times the anchor ``weight``."""
    if not np.isfinite(weight) or weight <= 0:
        raise ValueError(f"anchor weight must be a finite number > 0, got {weight!r}")
    return grpo_advantages(np.asarray(real, dtype=float)[None, :])[0] * weight


def importance_weights(current: torch.Tensor, behaviour: torch.Tensor, mask: torch.Tensor, correction: str,
                       clip_max: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights, truncated) per token, ``(rows, tokens)``: the importance ratio current / behaviour from log-probs,
    per token or per row (the product over the row's tokens), truncated from above at ``clip_max``; 1 for
    ``none``. ``truncated`` marks tokens whose ratio was cut. Both are 0 where ``mask`` is 0."""
    if correction not in CORRECTIONS:
        raise ValueError(f"spec.algorithm.anchors.lateRewards.correction must be one of {CORRECTIONS}, "
                         f"got {correction!r}")
    if not clip_max > 0:
        raise ValueError(f"spec.algorithm.anchors.lateRewards.clipMax must be > 0, got {clip_max!r}")
    mask = mask.to(current.dtype)
    if correction == "none":
        return mask.clone(), torch.zeros_like(mask, dtype=torch.bool)
    diff = torch.nan_to_num((current.detach() - behaviour) * mask, nan=0.0)
    if correction == "sequence":
        diff = diff.sum(dim=-1, keepdim=True).expand_as(mask)
    ratio = torch.exp(diff)
    truncated = (ratio > clip_max) & (mask > 0)
    return ratio.clamp(max=clip_max) * mask, truncated


def pad_rows(rows: Sequence[LateRow], pad_token_id: int, device: Any = None) -> dict[str, torch.Tensor]:
    """The rows as TRL pads a batch: prompts on the left, completions on the right (masks 1 on real tokens);
    ``behaviour_logps`` right-padded with 0."""
    if not rows:
        raise ValueError("no rows to pad")
    p = max(len(r.prompt_ids) for r in rows)
    c = max(1, max(len(r.completion_ids) for r in rows))
    out = {"prompt_ids": torch.full((len(rows), p), pad_token_id, dtype=torch.long),
           "prompt_mask": torch.zeros((len(rows), p), dtype=torch.long),
           "completion_ids": torch.full((len(rows), c), pad_token_id, dtype=torch.long),
           "completion_mask": torch.zeros((len(rows), c), dtype=torch.long),
           "behaviour_logps": torch.zeros((len(rows), c), dtype=torch.float32)}
    for i, r in enumerate(rows):
        n, m = len(r.prompt_ids), len(r.completion_ids)
        if n:
            out["prompt_ids"][i, p - n:] = torch.tensor(r.prompt_ids)
            out["prompt_mask"][i, p - n:] = 1
        if m:
            out["completion_ids"][i, :m] = torch.tensor(r.completion_ids)
            out["completion_mask"][i, :m] = 1
            out["behaviour_logps"][i, :m] = torch.tensor(r.behaviour_logps)
    return {k: v.to(device) for k, v in out.items()} if device is not None else out


def _pad_width(t: torch.Tensor, width: int, value: float, left: bool = False) -> torch.Tensor:
    extra = width - t.shape[1]
    if extra <= 0:
        return t
    fill = torch.full((t.shape[0], extra), value, dtype=t.dtype, device=t.device)
    return torch.cat([fill, t] if left else [t, fill], dim=1)


def append_rows(output: dict[str, Any], late: dict[str, torch.Tensor], advantages: torch.Tensor, *,
                pad_token_id: int, multiple: int = 1, ref_logps: Optional[torch.Tensor] = None,
                current_logps: Optional[torch.Tensor] = None) -> dict[str, Any]:
    """TRL's training batch ``output`` with the late rows ``late`` (:func:`pad_rows`) appended.

    ``advantages``: the late rows' per-token advantages ``(rows, tokens)`` (the group advantage times the
    importance weight, 0 where ungraded); the batch's own advantages become per-token too (the same value on
    every token). Per-token entries TRL may carry get the late rows' values: ``ref_per_token_logps`` from
    ``ref_logps``; ``old_per_token_logps`` the current policy's (``current_logps``, so that TRL's own ratio is 1
    in value: the correction is ours); ``sampling_per_token_logps`` the stored ones; ``importance_sampling_ratio``
    1. Fully masked copies of the last late row pad the batch to a multiple of ``multiple`` rows (TRL splits it
    into that many equal micro-batches). A per-row entry this does not know raises (``num_items_in_batch`` is
    the caller's to recount).
    """
    rows = late["prompt_ids"].shape[0]
    if rows == 0:
        return output
    unknown = [k for k, v in output.items() if k not in PER_ROW_KEYS and k != "num_items_in_batch"
               and (isinstance(v, list) or (isinstance(v, torch.Tensor) and v.ndim > 0))]
    if unknown:
        raise RuntimeError(f"late anchor rows cannot join a training batch with {unknown} (single-turn text only)")
    if advantages.shape != late["completion_ids"].shape:
        raise ValueError(f"advantages of shape {tuple(advantages.shape)} for late completions of shape "
                         f"{tuple(late['completion_ids'].shape)}")
    device = output["prompt_ids"].device
    late = {**late, "advantages": advantages}
    late.update({k: v for k, v in (("ref_logps", ref_logps), ("current_logps", current_logps)) if v is not None})
    late = {k: v.to(device) for k, v in late.items()}
    extra = (-(output["prompt_ids"].shape[0] + rows)) % max(1, multiple)
    if extra:  # fully masked copies of the last row: no loss, no tokens
        late = {k: torch.cat([v, v[-1:].repeat(extra, 1)]) for k, v in late.items()}
        late["completion_mask"][rows:] = 0
        late["advantages"][rows:] = 0.0
    p = max(output["prompt_ids"].shape[1], late["prompt_ids"].shape[1])
    c = max(output["completion_ids"].shape[1], late["completion_ids"].shape[1])
    out = dict(output)
    out["prompt_ids"] = torch.cat([_pad_width(output["prompt_ids"], p, pad_token_id, left=True),
                                   _pad_width(late["prompt_ids"], p, pad_token_id, left=True)])
    out["prompt_mask"] = torch.cat([_pad_width(output["prompt_mask"], p, 0, left=True),
                                    _pad_width(late["prompt_mask"].to(output["prompt_mask"].dtype), p, 0, left=True)])
    out["completion_ids"] = torch.cat([_pad_width(output["completion_ids"], c, pad_token_id),
                                       _pad_width(late["completion_ids"], c, pad_token_id)])
    out["completion_mask"] = torch.cat([_pad_width(output["completion_mask"], c, 0),
                                        _pad_width(late["completion_mask"].to(output["completion_mask"].dtype), c, 0)])
    own = output["advantages"]
    own = own.unsqueeze(1).expand(-1, output["completion_ids"].shape[1]) if own.ndim == 1 else own
    out["advantages"] = torch.cat([_pad_width(own.contiguous(), c, 0.0),
                                   _pad_width(late["advantages"].to(own.dtype), c, 0.0)])
    values = {"old_per_token_logps": late.get("current_logps"), "sampling_per_token_logps": late["behaviour_logps"],
              "ref_per_token_logps": late.get("ref_logps")}
    for key, value in values.items():
        if output.get(key) is None:
            continue
        if value is None:
            raise ValueError(f"the training batch has {key} but no such log-probs were given for the late rows")
        mine = output[key]
        out[key] = torch.cat([_pad_width(mine, c, 0.0), _pad_width(value.to(mine.dtype), c, 0.0)])
    ratio = output.get("importance_sampling_ratio")
    if ratio is not None:
        width = 1 if ratio.shape[1] == 1 else c
        ones = torch.ones((late["prompt_ids"].shape[0], width), dtype=ratio.dtype, device=device)
        out["importance_sampling_ratio"] = torch.cat([ratio if width == 1 else _pad_width(ratio, c, 1.0), ones])
    return out
