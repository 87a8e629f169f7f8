"""World-model fidelity metrics: pure functions of (prediction, real outcome) pairs.

A :class:`Judged` is one case as graded: the real status, reward and exception class, and the
world model's statuses (most likely first; empty when it did not grade the case), the reward of
its top prediction and that prediction's exception class. Every figure is over the *graded*
cases unless it says otherwise; ungraded cases (parse failures, a server that did not answer)
are counted apart, never scored.

* ``status@k``: share of graded cases whose real status is among the first ``k`` predicted
  statuses (a backend with one prediction per case has status@2 = status@1);
* reward error = predicted reward (top prediction, on the reward ladder) - real reward: its mean
  absolute value (MAE) and its mean (bias), overall and by the real *rung* (the ladder's rung:
  the status, and for a valid run its real quality bucket);
* exception-class match: of the graded real runtime errors with a known exception class, the
  share whose top prediction is a runtime error of the same class (module prefix ignored);
* confusion matrix: real status x predicted top status (plus ``ungraded``);
* reliability: mean real reward against mean predicted reward, per predicted reward (each
  distinct value its own point when there are at most :data:`RELIABILITY_POINTS`, else equal
  bins of [0, 1]);
* latency: mean, median, 90th percentile and maximum seconds per case.

Every function is invariant under a permutation of the cases.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np

from wmrl.outcome import VALID_BASE, VALID_SPAN, Status, bucket_of

STATUSES = tuple(s.value for s in Status)
UNGRADED = "ungraded"
RUNGS = ("malformed", "syntax_err", "runtime_err", "ran_no_sub", "valid:low", "valid:fair", "valid:mid", "valid:high")
RELIABILITY_POINTS = 10


@dataclass(frozen=True)
class Judged:
    real_status: str
    real_reward: float
    real_error: Optional[str] = None
    predicted: tuple[str, ...] = ()
    """Predicted statuses, most likely first, distinct; () when the world model did not grade the case."""
    predicted_reward: Optional[float] = None
    predicted_error: Optional[str] = None
    gated: bool = False
    """Decided by the compile gate (no model call)."""
    latency: Optional[float] = None

    @property
    def graded(self) -> bool:
        return bool(self.predicted) and self.predicted_reward is not None


def error_class(name: Optional[str]) -> Optional[str]:
    """An exception class name without its module (``sklearn.exceptions.NotFittedError`` -> ``NotFittedError``)."""
    if not name or not name.strip():
        return None
    return name.strip().rsplit(".", 1)[-1]


def rung(status: str, reward: float) -> str:
    """The reward ladder's rung of a real outcome: its status, and a valid run's quality bucket."""
    if status != Status.VALID.value:
        return status
    return f"valid:{bucket_of(min(1.0, max(0.0, (reward - VALID_BASE) / VALID_SPAN))).value}"


def _share(hits: int, n: int) -> Optional[float]:
    return hits / n if n else None


def status_at(judged: Sequence[Judged], k: int) -> Optional[float]:
    """Share of the graded cases whose real status is among the first ``k`` predictions (None: none graded)."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    graded = [j for j in judged if j.graded]
    return _share(sum(j.real_status in j.predicted[:k] for j in graded), len(graded))


def reward_errors(judged: Sequence[Judged]) -> list[float]:
    """Predicted - real reward of every graded case."""
    return [j.predicted_reward - j.real_reward for j in judged if j.graded]


def mae_bias(errors: Sequence[float]) -> dict[str, Any]:
    """{cases, mae, bias} of reward errors (None figures for no cases)."""
    n = len(errors)
    return {"cases": n, "mae": sum(abs(e) for e in errors) / n if n else None,
            "bias": sum(errors) / n if n else None}


def reward_by_rung(judged: Sequence[Judged]) -> dict[str, dict[str, Any]]:
    """{rung: {cases, mae, bias}} over the graded cases, for every rung with a case, plus ``all``."""
    out = {}
    for name in RUNGS:
        errors = [j.predicted_reward - j.real_reward for j in judged
                  if j.graded and rung(j.real_status, j.real_reward) == name]
        if errors:
            out[name] = mae_bias(errors)
    out["all"] = mae_bias(reward_errors(judged))
    return out


def exception_match(judged: Sequence[Judged]) -> dict[str, Any]:
    """Of the graded real runtime errors with a known exception class: how many the top prediction names."""
    cases = [j for j in judged if j.graded and j.real_status == Status.RUNTIME_ERR.value and error_class(j.real_error)]
    matched = sum(j.predicted[0] == Status.RUNTIME_ERR.value and error_class(j.predicted_error) == error_class(j.real_error)
                  for j in cases)
    return {"cases": len(cases), "matched": matched, "rate": _share(matched, len(cases))}


def confusion(judged: Sequence[Judged]) -> dict[str, Any]:
    """Counts of real status (rows, :data:`STATUSES`) x predicted top status (columns, plus ``ungraded``)."""
    columns = STATUSES + (UNGRADED,)
    counts = [[0] * len(columns) for _ in STATUSES]
    for j in judged:
        column = columns.index(j.predicted[0]) if j.graded else len(STATUSES)
        counts[STATUSES.index(j.real_status)][column] += 1
    return {"real": list(STATUSES), "predicted": list(columns), "counts": counts}


def reliability(judged: Sequence[Judged], points: int = RELIABILITY_POINTS) -> list[dict[str, Any]]:
    """Mean real reward per predicted reward, over the graded cases (see the module docstring), lowest first."""
    graded = [j for j in judged if j.graded]
    values = sorted({round(j.predicted_reward, 9) for j in graded})
    if len(values) <= points:
        def key(j: Judged) -> Any:
            return round(j.predicted_reward, 9)
    else:
        def key(j: Judged) -> Any:
            return min(points - 1, max(0, int(j.predicted_reward * points)))
    groups: dict[Any, list[Judged]] = {}
    for j in graded:
        groups.setdefault(key(j), []).append(j)
    out = []
    for k in sorted(groups):
        members = groups[k]
        out.append({"predicted": sum(j.predicted_reward for j in members) / len(members),
                    "real": sum(j.real_reward for j in members) / len(members), "cases": len(members)})
    return out


def latency(judged: Sequence[Judged]) -> dict[str, Any]:
    """Seconds per case of the cases the model was asked about (the compile gate's are apart)."""
    asked = np.array([j.latency for j in judged if not j.gated and j.latency is not None], dtype=float)
    if not asked.size:
        return {"cases": 0, "mean": None, "p50": None, "p90": None, "max": None}
    return {"cases": int(asked.size), "mean": float(asked.mean()), "p50": float(np.percentile(asked, 50)),
            "p90": float(np.percentile(asked, 90)), "max": float(asked.max())}


def summarize(judged: Sequence[Judged]) -> dict[str, Any]:
    """Every figure of a set of judged cases."""
    graded = sum(j.graded for j in judged)
    gated = sum(j.gated for j in judged)
    return {
        "cases": len(judged),
        "graded": graded,
        "ungraded": len(judged) - graded,
        "gated": gated,
        "status_at_1": status_at(judged, 1),
        "status_at_2": status_at(judged, 2),
        "reward": reward_by_rung(judged),
        "exception_match": exception_match(judged),
        "confusion": confusion(judged),
        "reliability": reliability(judged),
        "latency": latency(judged),
        "real_statuses": {s: sum(j.real_status == s for j in judged) for s in STATUSES},
    }


def rolling(judged: Sequence[Judged]) -> dict[str, Any]:
    """The training-time figures (``status.progress.fidelity``): cases, graded, status@1, reward MAE and bias."""
    errors = reward_errors(judged)
    figures = mae_bias(errors)
    return {"cases": len(judged), "graded": figures["cases"], "status_at_1": status_at(judged, 1),
            "reward_mae": figures["mae"], "reward_bias": figures["bias"]}
