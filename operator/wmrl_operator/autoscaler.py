"""Sandbox-pool autoscaling: the decision (a pure function) and its per-run memory.

Input: ``status.progress.sandboxDemand``, which the trainer patches each step (executions
queued + in flight; see the brief). Reading demand from the trainer rather than scraping pod
``/metrics`` keeps the operator off the data path and works with no network access to pods.

Algorithm (the HorizontalPodAutoscaler's, with the HPA's default of no up-stabilization):

1. ``raw = clamp(ceil(demand / slotsPerPod), minReplicas, maxReplicas)``;
2. the *stabilized* recommendation is the maximum of ``raw`` and every recommendation made
   in the last ``scaleDownStabilizationSeconds`` — so the pool grows at once and shrinks only
   after demand stayed low for a whole window (no flapping);
3. suspended or finished runs get 0; bounds hold otherwise whatever the history says.

After an operator restart the history is empty; the current replica count then stands in
for it, so a restart never triggers an early scale-down.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Deque, Iterable, Optional

History = Iterable[tuple[float, int]]


def clamp(value: int, lo: int, hi: int) -> int:
    return max(lo, min(hi, value))


def raw_recommendation(demand: int, slots_per_pod: int, min_replicas: int, max_replicas: int) -> int:
    needed = math.ceil(max(0, demand) / max(1, slots_per_pod))
    return clamp(needed, min_replicas, max_replicas)


def desired_replicas(demand: int, slots_per_pod: int, min_replicas: int, max_replicas: int, current: int,
                     history: History, now: float, stabilization_seconds: float, suspended: bool = False) -> int:
    """Replicas the sandbox Deployment should have now. ``history``: (time, recommendation) pairs."""
    if suspended:
        return 0
    raw = raw_recommendation(demand, slots_per_pod, min_replicas, max_replicas)
    history = list(history)
    if not history:
        history = [(now, current)]  # no memory (fresh operator): as if current was just recommended
    window = [rec for t, rec in history if now - t <= stabilization_seconds]
    return clamp(max([raw] + window), min_replicas, max_replicas)


class Recommendations:
    """Per-run recommendation history, trimmed to the longest window in use."""

    def __init__(self, max_age: float = 86400.0):
        self.max_age = max_age
        self._runs: dict[tuple[str, str], Deque[tuple[float, int]]] = {}

    def history(self, key: tuple[str, str]) -> list[tuple[float, int]]:
        return list(self._runs.get(key, ()))

    def record(self, key: tuple[str, str], now: float, recommendation: int, window: float) -> None:
        hist = self._runs.setdefault(key, deque())
        hist.append((now, recommendation))
        horizon = min(self.max_age, window)
        while hist and now - hist[0][0] > horizon:
            hist.popleft()

    def forget(self, key: tuple[str, str]) -> None:
        self._runs.pop(key, None)

    def decide(self, key: tuple[str, str], demand: int, slots_per_pod: int, min_replicas: int, max_replicas: int,
               current: int, now: float, stabilization_seconds: float, suspended: bool = False) -> int:
        """Decide and remember the raw recommendation (what the HPA stores)."""
        desired = desired_replicas(demand, slots_per_pod, min_replicas, max_replicas, current,
                                   self.history(key), now, stabilization_seconds, suspended)
        if suspended:
            self.forget(key)
        else:
            if key not in self._runs:
                self.record(key, now, clamp(current, min_replicas, max_replicas), stabilization_seconds)
            self.record(key, now, raw_recommendation(demand, slots_per_pod, min_replicas, max_replicas),
                        stabilization_seconds)
        return desired


def demand_of(status: Optional[dict]) -> int:
    progress = (status or {}).get("progress") or {}
    try:
        return max(0, int(progress.get("sandboxDemand") or 0))
    except (TypeError, ValueError):
        return 0
