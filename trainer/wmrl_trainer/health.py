"""Policy health: figures that show generation degenerating, and warnings in plain words.

GRPO learns from differences inside a group. When every rollout of a group is the same
script, or every completion runs into the token limit, the group's rewards are equal, its
advantages are zero, and nothing pulls the policy back: a collapse is silent in the reward
curve until it is too late. Each step therefore records (:class:`~wmrl_trainer.records.StepRecord`):

* ``distinct_per_group``: distinct completions per group, averaged over groups (1 = collapsed);
* ``truncated_share``: completions that end in no stop token (cut off at ``maxNewTokens``);
* ``mean_completion_tokens``: tokens per completion, up to and including its stop token;
* ``entropy``: the policy's mean per-token entropy (nats) on the sampled completions.

The last three are TRL's own figures for the step (``completions/clipped_ratio``,
``completions/mean_length``, ``entropy``), read by the trainer rather than recomputed.

:class:`HealthMonitor` marks a problem that lasts ``patience`` steps (``health_warning`` on the
record and in ``status.progress.health``) and says so once when it starts and once when it
clears: the trainer logs both and ``wmrl run`` prints them above its progress bar.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np

MIN_DISTINCT_PER_GROUP = 1.5
"""Below this many distinct completions per group (on average) most groups teach nothing."""
MAX_TRUNCATED_SHARE = 0.5
"""At or above this share of cut-off completions the policy is writing scripts without an end."""


def distinct_per_group(codes: Sequence[Sequence[str]]) -> Optional[float]:
    """Mean number of distinct completions per group."""
    return float(np.mean([len(set(group)) for group in codes])) if codes else None


def problems(record: Any, group_size: int) -> list[str]:
    """What is wrong with generation at this step, in plain words (empty when healthy)."""
    found = []
    distinct = getattr(record, "distinct_per_group", None)
    if distinct is not None and group_size > 1 and distinct < MIN_DISTINCT_PER_GROUP:
        entropy = getattr(record, "entropy", None)
        tail = f", entropy {entropy:.3f} nats/token" if entropy is not None else ""
        found.append(f"the policy has stopped exploring: {distinct:.2f} distinct scripts per group of {group_size}"
                     f"{tail}; equal rewards in a group give zero advantages, so it no longer learns")
    truncated = getattr(record, "truncated_share", None)
    if truncated is not None and truncated >= MAX_TRUNCATED_SHARE:
        found.append(f"{truncated:.0%} of completions ran into the token limit without finishing "
                     "(spec.policy.sampling.maxNewTokens): the policy is writing scripts that never end")
    return found


@dataclass
class HealthMonitor:
    """Tracks problems over steps: ongoing once they last ``patience`` steps; logged when they start and clear."""

    group_size: int
    patience: int = 2
    _streak: int = 0
    _warned: bool = False

    def check(self, record: Any) -> Optional[str]:
        """Set ``record.health_warning`` while a problem is ongoing; return a message when the state changes."""
        found = problems(record, self.group_size)
        self._streak = self._streak + 1 if found else 0
        ongoing = self._streak >= self.patience
        record.health_warning = "; ".join(found) if ongoing else None
        if ongoing and not self._warned:
            self._warned = True
            return f"step {record.step + 1}: generation is degenerating: {record.health_warning}"
        if not found and self._warned:
            self._warned = False
            return f"step {record.step + 1}: generation is healthy again"
        return None

    def state_dict(self) -> dict[str, Any]:
        return {"streak": self._streak, "warned": self._warned}

    def load_state_dict(self, data: dict[str, Any]) -> None:
        self._streak, self._warned = int(data.get("streak", 0)), bool(data.get("warned", False))
