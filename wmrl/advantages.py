"""GRPO group advantages with ungraded rollouts left out, and the anchor weight.

``A[g, i] = (r[g, i] - mean_g r) / (std_g r + eps)`` over the *graded* rollouts of
group ``g`` (population std). An ungraded rollout (NaN reward) gets a NaN
advantage and is dropped from the loss; it is not scored zero, because a missing
grade says nothing about the attempt. The anchor weight multiplies the advantages
of anchor-group rows AFTER this normalisation (normalising afterwards would undo it).
"""

from __future__ import annotations

from typing import Iterable

import numpy as np

from wmrl.debias import check_rewards

__all__ = ["apply_anchor_weight", "grpo_advantages"]


def grpo_advantages(rewards: np.ndarray, eps: float = 1e-4) -> np.ndarray:
    """Advantages of a ``[n_groups, G]`` reward array (NaN = ungraded -> NaN)."""
    r = check_rewards(rewards, "rewards", allow_nan=True)
    if r.ndim != 2:
        raise ValueError(f"rewards must be 2-D [n_groups, group_size], got shape {r.shape}")
    if not eps > 0:
        raise ValueError(f"eps must be > 0, got {eps!r}")
    graded = ~np.isnan(r)
    counts = graded.sum(axis=1, keepdims=True)
    filled = np.where(graded, r, 0.0)
    mean = filled.sum(axis=1, keepdims=True) / np.maximum(counts, 1)
    centred = np.where(graded, r - mean, 0.0)
    std = np.sqrt((centred**2).sum(axis=1, keepdims=True) / np.maximum(counts, 1))
    return np.where(graded, centred / (std + eps), np.nan)


def apply_anchor_weight(advantages: np.ndarray, anchor_groups: Iterable[int], w: float) -> np.ndarray:
    """A copy of ``advantages`` with the rows of ``anchor_groups`` multiplied by ``w``."""
    if not np.isfinite(w) or w <= 0:
        raise ValueError(f"anchor weight must be a finite number > 0, got {w!r}")
    out = np.array(advantages, dtype=float, copy=True)
    rows = sorted(set(int(g) for g in anchor_groups))
    if rows and (rows[0] < 0 or rows[-1] >= out.shape[0]):
        raise ValueError(f"anchor group index out of range for {out.shape[0]} groups: {rows}")
    out[rows] *= w
    return out
