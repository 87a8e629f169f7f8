"""Inverse-Variance Denoising: how much more an anchor group's advantages should count.

Model: a world-model-graded group's gradient has variance ``V_WM = (1 + c s^2) V_E``
where ``V_E`` is the variance of a really-executed one and ``s^2`` the measured
disagreement between the calibrated world model and the truth. Fusing the two
estimates by inverse variance gives anchor rows the weight ``1 + c s^2``.

Per anchor group, with ``d`` the world-model rewards the trainer trains on and ``r`` the
real rewards (population variance, means inside the group)::

    s^2 = mean(((d - mean d) - (r - mean r))^2) / Var(r)      (skipped when Var(r) = 0)

``s^2`` is tracked by an exponentially weighted mean whose half-life is counted in
groups (``alpha = 1 - 2^(-1/halfLife)``; the first group initialises it). After
``warmup`` groups the constant is frozen so that the weight equals ``target`` at
that moment, ``c = (target - 1) / s^2``; from then on ``w = clip(1 + c s^2, 1,
maxWeight)``. Before that ``w`` is exactly 1.

``d`` is the calibrated world-model reward when debiasing is enabled (the paper: as the
map removes bias, the disagreement and the weight relax), and the raw one when it is
not, since then the trainer trains on raw rewards; ``wmrl.calibration.state`` chooses by
its config's ``debiasing_enabled``.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from wmrl.debias import check_rewards

__all__ = ["DEGENERATE_VARIANCE", "DisagreementWeighter", "group_disagreement"]

DEGENERATE_VARIANCE = 1e-9
"""Groups whose real rewards vary less than this carry no ranking signal and are skipped."""


def group_disagreement(calibrated: Any, real: Any) -> Optional[float]:
    """``s^2`` of one group, or ``None`` for a degenerate group (``Var(real) ~ 0``)."""
    return disagreement_of_checked(*_checked_pair(calibrated, real))


def disagreement_of_checked(d: np.ndarray, r: np.ndarray) -> Optional[float]:
    """:func:`group_disagreement` for 1-D arrays already checked (the hot path of the service)."""
    n = len(r)
    if n == 0:
        return None
    rc = r - r.sum() / n
    var = float(rc @ rc) / n
    if var < DEGENERATE_VARIANCE:
        return None
    diff = (d - d.sum() / n) - rc
    return float(diff @ diff) / n / var


def disagreements_of_groups(d: np.ndarray, r: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """``s^2`` of consecutive groups (integer ``sizes``, all >= 1) at once; NaN marks a degenerate group."""
    sizes = np.asarray(sizes, dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    rc = r - np.repeat(np.add.reduceat(r, starts) / sizes, sizes)
    dc = d - np.repeat(np.add.reduceat(d, starts) / sizes, sizes)
    var = np.add.reduceat(rc * rc, starts) / sizes
    diff = dc - rc
    num = np.add.reduceat(diff * diff, starts) / sizes
    out = np.full(len(sizes), np.nan)
    ok = var >= DEGENERATE_VARIANCE
    out[ok] = num[ok] / var[ok]
    return out


def _checked_pair(calibrated: Any, real: Any) -> tuple[np.ndarray, np.ndarray]:
    d = check_rewards(calibrated, "calibrated").reshape(-1)
    r = check_rewards(real, "real").reshape(-1)
    if len(d) != len(r):
        raise ValueError(f"calibrated and real must have equal length (got {len(d)} and {len(r)})")
    return d, r


class DisagreementWeighter:
    """EWMA of ``s^2``, the frozen constant ``c`` and the anchor weight."""

    def __init__(self, target_weight: float = 2.0, max_weight: float = 4.0, half_life: float = 64, warmup: int = 32):
        if not (1.0 <= target_weight <= max_weight) or half_life <= 0 or warmup < 1:
            raise ValueError("need 1 <= target_weight <= max_weight, half_life > 0, warmup >= 1")
        self.target_weight, self.max_weight = float(target_weight), float(max_weight)
        self.half_life, self.warmup = float(half_life), int(warmup)
        self.alpha = 1.0 - 0.5 ** (1.0 / self.half_life)
        self.disagreement: Optional[float] = None
        self.observations = 0
        self.constant: Optional[float] = None

    def push(self, s2: float) -> None:
        """Fold one group's ``s^2`` into the average; freeze ``c`` once warm-up is over."""
        if not np.isfinite(s2) or s2 < 0:
            raise ValueError(f"disagreement must be a finite number >= 0, got {s2!r}")
        if self.disagreement is None:
            self.disagreement = float(s2)
        else:
            self.disagreement += self.alpha * (float(s2) - self.disagreement)
        self.observations += 1
        if self.constant is None and self.observations >= self.warmup and self.disagreement > 1e-12:
            self.constant = (self.target_weight - 1.0) / self.disagreement

    def observe_group(self, calibrated: Any, real: Any) -> Optional[float]:
        """Measure and fold one anchor group; returns its ``s^2`` (``None``: skipped)."""
        return self.observe_checked(*_checked_pair(calibrated, real))

    def observe_checked(self, calibrated: np.ndarray, real: np.ndarray) -> Optional[float]:
        s2 = disagreement_of_checked(calibrated, real)
        if s2 is not None:
            self.push(s2)
        return s2

    @property
    def weight(self) -> float:
        """The anchor weight: exactly 1.0 until ``c`` is frozen."""
        if self.constant is None or self.disagreement is None:
            return 1.0
        return float(min(self.max_weight, max(1.0, 1.0 + self.constant * self.disagreement)))

    def state_dict(self) -> dict[str, Any]:
        return {"disagreement": self.disagreement, "observations": self.observations, "constant": self.constant}

    def load_state_dict(self, data: dict[str, Any]) -> None:
        disagreement, constant = data.get("disagreement"), data.get("constant")
        self.disagreement = None if disagreement is None else float(disagreement)
        self.observations = int(data["observations"])
        self.constant = None if constant is None else float(constant)
