"""Online Debiasing: a monotone map from world-model reward to expected real reward.

Anchor groups are graded twice, by the world model (``wm``) and by real execution
(``env``); every rollout of such a group gives one ``(wm, env)`` pair. We keep the
most recent pairs in a FIFO buffer and fit a *monotone* map on them by bucketed
isotonic regression:

1. split ``[0, 1]`` into ``bins`` equal-width bins, bin ``k`` = ``[k/bins, (k+1)/bins)``
   with the last one closed (:func:`bin_index`; a value on an edge, such as the ladder
   rung 0.6, lands in the bin it starts, whatever the float rounding);
2. for each populated bin take the mean world-model reward ``x_b``, the mean real
   reward ``y_b`` and the count ``n_b``;
3. pool adjacent violators over ``y_b`` weighted by ``n_b`` until non-decreasing;
4. apply with linear interpolation between the points ``(x_b, fitted y_b)``,
   constant beyond the first and last point.

Why monotone and non-affine: GRPO standardises rewards inside a group, which
cancels any affine correction, while a monotone map never swaps two rollouts of
one group. The map is the identity until ``min_pairs`` pairs have arrived, and is
refitted at the first group boundary after ``refit_every`` new pairs.

The diagnostic is the within-group centred squared residual,
``mean_i ((x_i - mean_g x) - (y_i - mean_g y))^2`` with means taken inside each
group, before (``x`` raw) and after (``x`` calibrated) the map; GRPO only sees
within-group differences, so that is the bias that matters to it.
"""

from __future__ import annotations

import copy
from collections import deque
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np

__all__ = [
    "CalibrationMap",
    "OnlineDebiaser",
    "apply_map",
    "bias_diagnostic",
    "bin_index",
    "check_rewards",
    "fit_bucketed_isotonic",
    "pool_adjacent_violators",
]


def check_rewards(values: Any, name: str, *, allow_nan: bool = False) -> np.ndarray:
    """``values`` as a float array, or ``ValueError`` naming ``name`` and the first bad entry.

    Rewards live in [0, 1] (the reward ladder). Infinities and values outside the
    range are always errors; NaN is an error unless ``allow_nan`` (NaN = ungraded).
    """
    try:
        arr = np.asarray(values, dtype=float)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name}: rewards must be numbers ({exc})") from None
    bad = np.isinf(arr) | (arr < 0.0) | (arr > 1.0)
    if not allow_nan:
        bad |= np.isnan(arr)
    if bad.any():
        index = tuple(int(i) for i in np.argwhere(bad)[0])
        where = ", ".join(map(str, index))
        raise ValueError(
            f"{name}[{where}] = {float(arr[index])!r}: rewards must be finite numbers in [0, 1]"
            + ("" if allow_nan else " (NaN is not allowed here)")
        )
    return arr


def pool_adjacent_violators(values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """The weighted least-squares non-decreasing fit of ``values`` (one pass, a stack of blocks)."""
    means: list[float] = []
    totals: list[float] = []
    lengths: list[int] = []
    for value, weight in zip(values.tolist(), weights.tolist()):
        means.append(value)
        totals.append(weight)
        lengths.append(1)
        while len(means) > 1 and means[-2] > means[-1]:
            m2, w2, n2 = means.pop(), totals.pop(), lengths.pop()
            w1 = totals[-1]
            merged = w1 + w2
            means[-1] = (means[-1] * w1 + m2 * w2) / merged
            totals[-1] = merged
            lengths[-1] += n2
    return np.repeat(np.asarray(means, dtype=float), lengths)


@dataclass(frozen=True)
class CalibrationMap:
    """Breakpoints of a fitted map: strictly increasing ``x``, non-decreasing ``y``."""

    x: np.ndarray
    y: np.ndarray

    def to_json(self) -> dict[str, list[float]]:
        return {"x": self.x.tolist(), "y": self.y.tolist()}

    @classmethod
    def from_json(cls, data: Optional[dict]) -> Optional["CalibrationMap"]:
        if data is None:
            return None
        x = np.asarray(data["x"], dtype=float)
        y = np.asarray(data["y"], dtype=float)
        if x.ndim != 1 or x.shape != y.shape or len(x) < 2:
            raise ValueError("map: x and y must be equal-length lists of at least 2 numbers")
        if np.any(np.diff(x) <= 0) or np.any(np.diff(y) < 0):
            raise ValueError("map: x must be strictly increasing and y non-decreasing")
        return cls(x, y)


BIN_DECIMALS = 9
"""``value * bins`` is rounded to this many decimals before its floor is taken (see :func:`bin_index`)."""


def bin_index(values: Any, bins: int) -> np.ndarray:
    """The equal-width bin of each value on [0, 1]: bin ``k`` is ``[k/bins, (k+1)/bins)``, 1.0 in the last.

    Robust to float rounding: a value that is an edge in decimal (``0.6`` with 10 bins,
    whose float is a hair below 6/10, or a sum like ``0.5 + 0.5 * 0.2``) lands in the bin
    that edge starts, because ``value * bins`` is rounded to :data:`BIN_DECIMALS` decimals
    before the floor. Indices are clipped to ``[0, bins - 1]``. Values must be finite.
    """
    scaled = np.round(np.asarray(values, dtype=float) * int(bins), BIN_DECIMALS)
    return np.clip(np.floor(scaled), 0, int(bins) - 1).astype(np.int64)


def bin_statistics(wm: np.ndarray, env: np.ndarray, bins: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean ``wm``, mean ``env`` and count of every populated equal-width bin on [0, 1] (:func:`bin_index`)."""
    index = bin_index(wm, bins)
    counts = np.bincount(index, minlength=bins).astype(float)
    sum_x = np.bincount(index, weights=wm, minlength=bins)
    sum_y = np.bincount(index, weights=env, minlength=bins)
    populated = counts > 0
    n = counts[populated]
    return sum_x[populated] / n, sum_y[populated] / n, n


def fit_bucketed_isotonic(wm: np.ndarray, env: np.ndarray, bins: int = 10) -> Optional[CalibrationMap]:
    """Fit the bucketed isotonic map on pairs; ``None`` when fewer than two bins are populated."""
    if len(wm) == 0:
        return None
    x, y, n = bin_statistics(np.asarray(wm, float), np.asarray(env, float), int(bins))
    if len(x) < 2:
        return None
    return CalibrationMap(x, pool_adjacent_violators(y, n))


def apply_map(calibration: Optional[CalibrationMap], values: Any) -> np.ndarray:
    """Calibrate rewards (NaN = ungraded passes through); ``None`` is the identity."""
    arr = check_rewards(values, "values", allow_nan=True)
    if calibration is None:
        return arr.copy()
    return np.interp(arr, calibration.x, calibration.y)


def _centred(values: np.ndarray, group_ids: np.ndarray, n_groups: int) -> np.ndarray:
    sizes = np.bincount(group_ids, minlength=n_groups)
    means = np.bincount(group_ids, weights=values, minlength=n_groups) / np.maximum(sizes, 1)
    return values - means[group_ids]


def bias_diagnostic(
    wm: np.ndarray, env: np.ndarray, group_sizes: Sequence[int], calibration: Optional[CalibrationMap]
) -> tuple[float, float, float]:
    """``(before, after, reduction)``: within-group centred squared residual, raw vs calibrated.

    ``group_sizes`` split the (ordered) pairs into their groups. ``reduction = 1 -
    after / before`` (0 when ``before`` is 0: nothing to remove).
    """
    wm = np.asarray(wm, float)
    env = np.asarray(env, float)
    if len(wm) == 0:
        return 0.0, 0.0, 0.0
    sizes = np.asarray(group_sizes, dtype=np.int64)
    ids = np.repeat(np.arange(len(sizes)), sizes)
    target = _centred(env, ids, len(sizes))
    before = float(np.mean((_centred(wm, ids, len(sizes)) - target) ** 2))
    calibrated = wm if calibration is None else np.interp(wm, calibration.x, calibration.y)
    after = float(np.mean((_centred(calibrated, ids, len(sizes)) - target) ** 2))
    reduction = 1.0 - after / before if before > 0 else 0.0
    return before, after, reduction


class OnlineDebiaser:
    """FIFO pair buffer plus the fitted map; fold anchor groups in with :meth:`observe_group`.

    Pairs are kept per group (``group_sizes``; after eviction the oldest group may be
    partial) so that the diagnostic can centre within groups. The buffer is a
    compacting array of twice the capacity (amortised O(1) per pair) and each pair's
    bin is computed once, so a refit costs three ``bincount`` calls and a PAV over
    at most ``bins`` values.
    """

    def __init__(self, bins: int = 10, min_pairs: int = 200, refit_every: int = 64, buffer_size: int = 5000):
        if bins < 2 or min_pairs < 1 or refit_every < 1 or buffer_size < 1:
            raise ValueError("need bins >= 2, min_pairs >= 1, refit_every >= 1, buffer_size >= 1")
        self.bins, self.min_pairs, self.refit_every, self.buffer_size = bins, min_pairs, refit_every, buffer_size
        self._clear()
        self.since_fit = 0
        self.fits = 0
        self.map: Optional[CalibrationMap] = None

    def _clear(self) -> None:
        capacity = 2 * self.buffer_size
        self._wm, self._env = np.empty(capacity), np.empty(capacity)
        self._bin = np.empty(capacity, dtype=np.int64)
        self._start = self._end = 0
        self.group_sizes: deque[int] = deque()

    @property
    def wm(self) -> np.ndarray:
        return self._wm[self._start:self._end]

    @property
    def env(self) -> np.ndarray:
        return self._env[self._start:self._end]

    def __len__(self) -> int:
        return self._end - self._start

    def observe_group(self, wm: Any, env: Any) -> int:
        """Add one group's pairs (validated, FIFO-evicting); refit if due. Returns pairs evicted."""
        wm = check_rewards(wm, "wm").reshape(-1)
        env = check_rewards(env, "env").reshape(-1)
        if len(wm) != len(env) or len(wm) == 0:
            raise ValueError(f"wm and env must be non-empty and of equal length (got {len(wm)} and {len(env)})")
        return self.push_validated(wm, env)

    def push_validated(self, wm: np.ndarray, env: np.ndarray) -> int:
        """:meth:`observe_group` for arrays already checked (1-D, equal length, in [0, 1])."""
        evicted = self.append_groups(wm, env, [len(wm)])
        if self.refit_due():
            self.refit()
        return evicted

    def refit_due(self) -> bool:
        return len(self) >= self.min_pairs and self.since_fit >= self.refit_every

    def append_groups(self, wm: np.ndarray, env: np.ndarray, sizes: Sequence[int]) -> int:
        """Append checked pairs of consecutive groups (``sizes``) without refitting; returns pairs evicted."""
        n = len(wm)
        if n > self.buffer_size:
            wm, env = wm[-self.buffer_size:], env[-self.buffer_size:]
        m = len(wm)
        if self._end + m > len(self._wm):  # compact: move the live pairs to the front
            keep = len(self)
            for arr in (self._wm, self._env, self._bin):
                arr[:keep] = arr[self._start:self._end]
            self._start, self._end = 0, keep
        self._wm[self._end:self._end + m] = wm
        self._env[self._end:self._end + m] = env
        self._bin[self._end:self._end + m] = bin_index(wm, self.bins)
        self._end += m
        self.group_sizes.extend(sizes)
        evicted = max(0, len(self) - self.buffer_size) + (n - m)
        if len(self) > self.buffer_size:
            self._start = self._end - self.buffer_size
        drop = evicted
        while drop:
            if self.group_sizes[0] <= drop:
                drop -= self.group_sizes.popleft()
            else:
                self.group_sizes[0] -= drop
                drop = 0
        self.since_fit += n
        return evicted

    def refit(self) -> bool:
        """Fit the map on the buffer now; ``False`` (map kept) when under two bins are populated."""
        index = self._bin[self._start:self._end]
        counts = np.bincount(index, minlength=self.bins).astype(float)
        populated = counts > 0
        if populated.sum() < 2:
            return False
        n = counts[populated]
        x = np.bincount(index, weights=self.wm, minlength=self.bins)[populated] / n
        y = np.bincount(index, weights=self.env, minlength=self.bins)[populated] / n
        self.map = CalibrationMap(x, pool_adjacent_violators(y, n))
        self.since_fit = 0
        self.fits += 1
        return True

    def calibrate(self, values: Any) -> np.ndarray:
        return apply_map(self.map, values)

    @property
    def bias(self) -> Optional[tuple[float, float, float]]:
        """The diagnostic of the current map on the current buffer (``None`` while identity)."""
        if self.map is None:
            return None
        return bias_diagnostic(self.wm, self.env, list(self.group_sizes), self.map)

    def state_dict(self) -> dict[str, Any]:
        """JSON-ready state (the bin of each pair and the diagnostic are recomputed on load)."""
        return {
            "wm": self.wm.tolist(),
            "env": self.env.tolist(),
            "groupSizes": list(self.group_sizes),
            "sinceFit": self.since_fit,
            "fits": self.fits,
            "map": None if self.map is None else self.map.to_json(),
        }

    def load_state_dict(self, data: dict[str, Any]) -> None:
        wm = check_rewards(data["wm"], "wm").reshape(-1)
        env = check_rewards(data["env"], "env").reshape(-1)
        sizes = [int(s) for s in data["groupSizes"]]
        if len(wm) != len(env) or sum(sizes) != len(wm) or any(s < 1 for s in sizes):
            raise ValueError("buffer: wm, env and groupSizes disagree")
        if len(wm) > self.buffer_size:
            raise ValueError("buffer holds more pairs than bufferSize")
        calibration = CalibrationMap.from_json(data.get("map"))
        self._clear()
        m = len(wm)
        self._wm[:m], self._env[:m] = wm, env
        self._bin[:m] = bin_index(wm, self.bins)
        self._end = m
        self.group_sizes = deque(sizes)
        self.since_fit = int(data["sinceFit"])
        self.fits = int(data["fits"])
        self.map = calibration

    def copy(self) -> "OnlineDebiaser":
        other = copy.copy(self)
        other._wm, other._env, other._bin = self._wm.copy(), self._env.copy(), self._bin.copy()
        other.group_sizes = deque(self.group_sizes)
        return other
