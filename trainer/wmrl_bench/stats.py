"""Statistics for comparing benchmark arms over seeds.

Pure functions (numpy + scipy, nothing else): bootstrap confidence intervals over seeds,
reach rate, normalized area under a learning curve, Holm–Bonferroni adjustment, Page's
trend test for a predicted ordering of arms and pairwise Wilcoxon tests. Every random
choice goes through ``np.random.default_rng(seed)``, so the same inputs and seed give the
same numbers.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Optional

import numpy as np
from scipy import stats as _scipy_stats

__all__ = [
    "area_under_curve",
    "BOOTSTRAP_MIN_SEEDS",
    "bootstrap_ci",
    "holm",
    "mean_interval",
    "page_test",
    "paired_bootstrap_ci",
    "pairwise_tests",
    "reach_rate",
    "t_interval",
    "wilcoxon",
]

BOOTSTRAP_MIN_SEEDS = 10
"""Below this many seeds a percentile bootstrap of a mean cannot reach its nominal coverage (its interval
lies inside the seeds' range): :func:`mean_interval` gives a t-interval there instead."""

# Resampled index blocks hold at most this many entries, so memory stays bounded for any n.
_BLOCK_ENTRIES = 1 << 20


def _check_bootstrap_args(n: int, n_resamples: int, level: float) -> None:
    """Refuse settings under which a bootstrap interval means nothing."""
    if n < 2:
        raise ValueError(f"bootstrap needs at least 2 paired observations, got {n}")
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be at least 1, got {n_resamples}")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must lie strictly between 0 and 1, got {level}")


def _resample_blocks(n: int, n_resamples: int, seed: int) -> Iterator[np.ndarray]:
    """Yield (rows, n) blocks of seed indices drawn with replacement, n_resamples rows in all.

    Both bootstrap functions draw through here, so for the same (n, n_resamples, seed) they
    see the same resamples in the same order.
    """
    rng = np.random.default_rng(seed)
    rows_per_block = max(1, _BLOCK_ENTRIES // n)
    done = 0
    while done < n_resamples:
        rows = min(rows_per_block, n_resamples - done)
        yield rng.integers(0, n, size=(rows, n))
        done += rows


def _rank_interval(values: np.ndarray, level: float) -> tuple[float, float]:
    """Percentile interval picked by rank from sorted values (no interpolation).

    Picking order statistics instead of interpolating keeps ±inf intact (inf - inf would be
    nan) and rounds outward: the lower bound rounds its rank down, the upper bound up.
    """
    ordered = np.sort(values)
    last = len(ordered) - 1
    tail = (1.0 - level) / 2.0
    low_rank = math.floor(tail * last + 1e-9)
    high_rank = math.ceil((1.0 - tail) * last - 1e-9)
    return float(ordered[low_rank]), float(ordered[high_rank])


def paired_bootstrap_ci(a: Sequence[float], b: Sequence[float], *, n_resamples: int = 10000,
                        level: float = 0.95, seed: int = 0) -> dict[str, Any]:
    """Percentile bootstrap interval for mean(a - b), with a[i] and b[i] from the same seed.

    Seeds are resampled with replacement and the same indices are used for both arms, so the
    pairing (shared seed effects) is kept. Returns {"estimate", "low", "high", "n"}.
    """
    x = np.asarray(a, dtype=float)
    y = np.asarray(b, dtype=float)
    if x.ndim != 1 or y.ndim != 1:
        raise ValueError("a and b must be one-dimensional sequences")
    if len(x) != len(y):
        raise ValueError(f"a and b must have equal lengths (paired by seed), got {len(x)} and {len(y)}")
    n = len(x)
    _check_bootstrap_args(n, n_resamples, level)
    if np.isnan(x).any() or np.isnan(y).any():
        raise ValueError("a and b must not contain NaN")
    diff = x - y
    means = np.concatenate([diff[block].mean(axis=1) for block in _resample_blocks(n, n_resamples, seed)])
    low, high = _rank_interval(means, level)
    return {"estimate": float(diff.mean()), "low": low, "high": high, "n": n}


def bootstrap_ci(statistic: Callable[[np.ndarray], float], n: int, *, n_resamples: int = 10000,
                 level: float = 0.95, seed: int = 0) -> dict[str, Any]:
    """Percentile bootstrap interval for any statistic of a set of n paired seeds.

    ``statistic(indices)`` gets an index array (all of ``range(n)`` for the estimate, a
    resample with replacement otherwise) and returns a float. It may return ±inf (kept:
    e.g. "never reached the target" ranks last) or nan (undefined: counted in
    ``undefined_share`` and left out of the interval). Returns {"estimate", "low", "high",
    "n", "undefined_share"}; low and high are None when every resample is undefined.
    """
    n = int(n)
    _check_bootstrap_args(n, n_resamples, level)
    estimate = float(statistic(np.arange(n)))
    values = np.fromiter((float(statistic(row)) for block in _resample_blocks(n, n_resamples, seed)
                          for row in block), dtype=float, count=n_resamples)
    defined = values[~np.isnan(values)]
    undefined_share = 1.0 - len(defined) / n_resamples
    if len(defined) == 0:
        low = high = None
    else:
        low, high = _rank_interval(defined, level)
    return {"estimate": estimate, "low": low, "high": high, "n": n, "undefined_share": undefined_share}


def reach_rate(times: Sequence[Optional[float]]) -> float:
    """Share of runs that reached a target: entries that are not None (None = never reached)."""
    if len(times) == 0:
        raise ValueError("reach_rate needs at least one run")
    for t in times:
        if t is not None and math.isnan(t):
            raise ValueError("times must be a number or None (never reached), not NaN")
    return sum(t is not None for t in times) / len(times)


def area_under_curve(xs: Sequence[float], ys: Sequence[float], x_max: float) -> float:
    """Mean height of a piecewise-linear curve over [xs[0], x_max] (area / width).

    Comparable across arms with different horizons: a curve that stops early holds its
    last value up to x_max, and points past x_max are cut off (the curve is interpolated
    at x_max).
    """
    x = np.asarray(xs, dtype=float)
    y = np.asarray(ys, dtype=float)
    if x.ndim != 1 or y.ndim != 1 or len(x) != len(y):
        raise ValueError(f"xs and ys must be one-dimensional with equal lengths, got {x.shape} and {y.shape}")
    if len(x) == 0:
        raise ValueError("the curve needs at least one point")
    if not (np.isfinite(x).all() and np.isfinite(y).all() and math.isfinite(x_max)):
        raise ValueError("xs, ys and x_max must be finite")
    if np.any(np.diff(x) <= 0):
        raise ValueError("xs must be strictly increasing")
    if x_max <= x[0]:
        raise ValueError(f"x_max ({x_max}) must be greater than xs[0] ({x[0]})")
    inside = x < x_max
    # np.interp holds the last y beyond the final x: exactly the "hold to x_max" rule.
    px = np.append(x[inside], x_max)
    py = np.append(y[inside], np.interp(x_max, x, y))
    area = float(np.sum((px[1:] - px[:-1]) * (py[1:] + py[:-1]) / 2.0))
    return area / (x_max - float(x[0]))


def holm(pvalues: Mapping[str, float]) -> dict[str, float]:
    """Holm–Bonferroni adjusted p-values (step-down, made monotone, capped at 1).

    Controls the family-wise error rate across the comparisons without assuming they are
    independent; reject a hypothesis at level alpha when its adjusted p <= alpha.
    """
    names = list(pvalues)
    p = np.asarray([float(pvalues[k]) for k in names], dtype=float)
    if np.isnan(p).any() or np.any((p < 0) | (p > 1)):
        raise ValueError("p-values must lie in [0, 1]")
    m = len(p)
    order = np.argsort(p, kind="stable")
    scaled = np.minimum(1.0, (m - np.arange(m)) * p[order])
    adjusted = np.maximum.accumulate(scaled) if m else scaled
    result = np.empty(m)
    result[order] = adjusted
    return {name: float(result[i]) for i, name in enumerate(names)}


def _as_matrix(matrix: Any, columns: Sequence[str]) -> tuple[np.ndarray, dict[str, int]]:
    """Check a (seeds x arms) matrix against its column names; return it and name -> column."""
    data = np.asarray(matrix, dtype=float)
    if data.ndim != 2:
        raise ValueError(f"matrix must be two-dimensional (seeds x arms), got shape {data.shape}")
    if data.shape[1] != len(columns):
        raise ValueError(f"matrix has {data.shape[1]} columns but {len(columns)} names were given")
    if len(set(columns)) != len(columns):
        raise ValueError("column names must be unique")
    if data.shape[0] < 2:
        raise ValueError(f"need at least 2 rows (seeds), got {data.shape[0]}")
    if np.isnan(data).any():
        raise ValueError("matrix must not contain NaN")
    return data, {name: i for i, name in enumerate(columns)}


def _column(index: Mapping[str, int], name: str) -> int:
    if name not in index:
        raise ValueError(f"unknown arm {name!r}; known arms: {sorted(index)}")
    return index[name]


def page_test(matrix: Any, order: Sequence[str], columns: Sequence[str]) -> dict[str, Any]:
    """Page's L test that the arms in ``order`` rank from lowest to highest within each seed.

    One test of a predicted ordering, instead of many pairwise tests. ``order`` may name a
    subset of ``columns`` (at least 3, as the test requires). Returns {"L", "p", "order", "n"}.
    """
    data, index = _as_matrix(matrix, columns)
    if len(set(order)) != len(order):
        raise ValueError("order must not name an arm twice")
    picked = [_column(index, name) for name in order]
    if len(picked) < 3:
        raise ValueError(f"Page's test needs at least 3 arms in order, got {len(picked)}")
    result = _scipy_stats.page_trend_test(data[:, picked], method="auto")
    return {"L": float(result.statistic), "p": float(result.pvalue), "order": list(order), "n": int(data.shape[0])}


def pairwise_tests(matrix: Any, columns: Sequence[str],
                   pairs: Sequence[tuple[str, str]]) -> list[dict[str, Any]]:
    """Two-sided Wilcoxon signed-rank test of each pair (x, y) on x - y per seed, Holm-adjusted.

    Returns one {"a", "b", "mean_difference", "p", "p_holm"} per pair, in the given order;
    p_holm adjusts across all the given pairs. Identical columns give p = 1.0.
    """
    data, index = _as_matrix(matrix, columns)
    entries = []
    for x, y in pairs:
        i, j = _column(index, x), _column(index, y)
        if i == j:
            raise ValueError(f"pair ({x!r}, {y!r}) compares an arm with itself")
        diff = data[:, i] - data[:, j]
        p = 1.0 if np.all(diff == 0) else float(_scipy_stats.wilcoxon(diff).pvalue)
        entries.append({"a": x, "b": y, "mean_difference": float(diff.mean()), "p": p})
    adjusted = holm({str(k): e["p"] for k, e in enumerate(entries)})
    for k, e in enumerate(entries):
        e["p_holm"] = adjusted[str(k)]
    return entries


def t_interval(values: Sequence[float], *, level: float = 0.95) -> dict[str, Any]:
    """Student-t interval for the mean of ``values`` (at least 2), with their range beside it."""
    x = np.asarray(values, dtype=float)
    if x.ndim != 1 or len(x) < 2:
        raise ValueError(f"a t-interval needs at least 2 values, got {x.shape}")
    if np.isnan(x).any():
        raise ValueError("values must not contain NaN")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must lie strictly between 0 and 1, got {level}")
    n, mean = len(x), float(x.mean())
    half = float(_scipy_stats.t.ppf(0.5 + level / 2, n - 1) * x.std(ddof=1) / math.sqrt(n))
    return {"estimate": mean, "low": mean - half, "high": mean + half, "n": n, "method": "t",
            "range": [float(x.min()), float(x.max())]}


def mean_interval(values: Sequence[float], *, level: float = 0.95, seed: int = 0,
                  n_resamples: int = 10000) -> Optional[dict[str, Any]]:
    """An interval for the mean of ``values`` (e.g. paired differences): a t-interval below
    :data:`BOOTSTRAP_MIN_SEEDS` values, a percentile bootstrap from there on; None for fewer than 2."""
    x = [float(v) for v in values]
    if len(x) < 2:
        return None
    if len(x) < BOOTSTRAP_MIN_SEEDS:
        return t_interval(x, level=level)
    boot = paired_bootstrap_ci(x, [0.0] * len(x), n_resamples=n_resamples, level=level, seed=seed)
    return {**boot, "method": "bootstrap", "range": [min(x), max(x)]}


def wilcoxon(differences: Sequence[float], alternative: str = "two-sided") -> float:
    """Wilcoxon signed-rank p-value of paired ``differences`` (all zero: p = 1); ``alternative``
    "greater" tests a positive shift (one-sided, for a prediction written down in advance)."""
    d = np.asarray(differences, dtype=float)
    if d.ndim != 1 or len(d) < 1 or np.isnan(d).any():
        raise ValueError("differences must be a non-empty 1-D sequence without NaN")
    if np.all(d == 0):
        return 1.0
    return float(_scipy_stats.wilcoxon(d, alternative=alternative).pvalue)
