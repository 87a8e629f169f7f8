"""Which groups of a step are graded by real execution as well (the anchors).

``want = min(n_groups, max_concurrent, max(min_per_step, round(fraction * n_groups)))``
groups are drawn uniformly without replacement. The draw for a step depends only
on ``(seed, step)``, so a resumed run anchors exactly the groups it would have
anchored without the interruption; the counters are bookkeeping for the realised
fraction (it drops below ``fraction`` when the concurrency cap binds).
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["AnchorSelector"]


class AnchorSelector:
    def __init__(self, fraction: float = 0.25, min_per_step: int = 1, max_concurrent: int = 16, seed: int = 0):
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(f"fraction must be in [0, 1], got {fraction!r}")
        if min_per_step < 0 or max_concurrent < 1 or seed < 0:
            raise ValueError("need min_per_step >= 0, max_concurrent >= 1, seed >= 0")
        self.fraction, self.min_per_step = float(fraction), int(min_per_step)
        self.max_concurrent, self.seed = int(max_concurrent), int(seed)
        self.groups = 0
        self.anchors = 0

    def count(self, n_groups: int, in_flight: int = 0) -> int:
        """How many anchors a step of ``n_groups`` gets, with ``in_flight`` executions running."""
        want = max(self.min_per_step, int(round(self.fraction * n_groups)))
        return max(0, min(want, n_groups, self.max_concurrent - in_flight))

    def select(self, step: int, n_groups: int, in_flight: int = 0) -> list[int]:
        """Sorted anchor group indices for ``step`` (reproducible from ``seed`` and ``step``)."""
        if step < 0 or n_groups < 0:
            raise ValueError(f"step and n_groups must be >= 0, got {step}, {n_groups}")
        k = self.count(n_groups, in_flight)
        rng = np.random.default_rng([self.seed, step])
        chosen = sorted(int(i) for i in rng.choice(n_groups, size=k, replace=False)) if k else []
        self.groups += n_groups
        self.anchors += k
        return chosen

    @property
    def realized_fraction(self) -> float:
        return self.anchors / self.groups if self.groups else 0.0

    def state_dict(self) -> dict[str, Any]:
        return {"fraction": self.fraction, "minPerStep": self.min_per_step, "maxConcurrent": self.max_concurrent,
                "seed": self.seed, "groups": self.groups, "anchors": self.anchors}

    def load_state_dict(self, data: dict[str, Any]) -> None:
        self.__init__(float(data["fraction"]), int(data["minPerStep"]), int(data["maxConcurrent"]), int(data["seed"]))
        self.groups, self.anchors = int(data["groups"]), int(data["anchors"])
