"""The outcome of one rollout, shared by the world model and the real grader, and the reward ladder.

Both graders produce an :class:`Outcome`; :func:`reward` turns it into a reward with the
same ladder, so world-model and real rewards are comparable pair by pair.

| status        | reward                          |
|---------------|---------------------------------|
| malformed     | 0.0 (truncated / not code)      |
| syntax_err    | 0.0                             |
| runtime_err   | 0.1                             |
| ran_no_sub    | 0.2                             |
| valid         | 0.5 + 0.5 x rank score in [0,1] |

The world model never invents a numeric score: it predicts a quality bucket, which maps to
a rank score (:data:`BUCKET_RANK_SCORE`).
"""

from __future__ import annotations

import math
from enum import Enum
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Status(str, Enum):
    MALFORMED = "malformed"
    SYNTAX_ERR = "syntax_err"
    RUNTIME_ERR = "runtime_err"
    RAN_NO_SUB = "ran_no_sub"
    VALID = "valid"


class QualityBucket(str, Enum):
    LOW = "low"
    FAIR = "fair"
    MID = "mid"
    HIGH = "high"


LADDER: dict[Status, float] = {
    Status.MALFORMED: 0.0,
    Status.SYNTAX_ERR: 0.0,
    Status.RUNTIME_ERR: 0.1,
    Status.RAN_NO_SUB: 0.2,
}
VALID_BASE = 0.5
VALID_SPAN = 0.5

BUCKET_RANK_SCORE: dict[QualityBucket, float] = {
    QualityBucket.LOW: 0.05,
    QualityBucket.FAIR: 0.20,
    QualityBucket.MID: 0.45,
    QualityBucket.HIGH: 0.75,
}


class Outcome(BaseModel):
    """What happened (or is predicted to happen) when a rollout's code runs."""

    model_config = ConfigDict(extra="forbid")

    status: Status
    error_type: Optional[str] = Field(None, description="e.g. 'ValueError' for runtime_err, 'SyntaxError'.")
    error_line: Optional[int] = Field(None, ge=0)
    quality_bucket: Optional[QualityBucket] = Field(None, description="World-model prediction of a valid run's quality.")
    rank_score: Optional[float] = Field(None, ge=0.0, le=1.0, description="Leaderboard position in [0,1] of a valid run.")
    medal: Optional[Literal["gold", "silver", "bronze"]] = Field(
        None, description="A valid real run's medal on its collection's final leaderboard (MLE-bench's thresholds); "
        "None without one, or where the task has no medal leaderboard.")
    feedback: str = Field("", description="Sandbox output (real) or its imitation (world model): the next observation.")

    @model_validator(mode="after")
    def _valid_has_score(self) -> "Outcome":
        if self.status is Status.VALID and self.rank_score is None:
            if self.quality_bucket is None:
                raise ValueError("a valid outcome needs rank_score or quality_bucket")
            self.rank_score = BUCKET_RANK_SCORE[self.quality_bucket]
        return self

    @property
    def reward(self) -> float:
        return reward(self)


def reward(outcome: Outcome) -> float:
    """The reward ladder: the same for real execution and the world model."""
    if outcome.status is Status.VALID:
        score = outcome.rank_score if outcome.rank_score is not None else 0.0
        if not math.isfinite(score):
            raise ValueError(f"rank score must be finite, got {score!r}")
        return VALID_BASE + VALID_SPAN * min(1.0, max(0.0, score))
    return LADDER[outcome.status]


def rank_score(score: float, leaderboard: list[float], higher_is_better: bool) -> float:
    """Leaderboard position of ``score`` in [0,1]: the fraction of reference entries it beats or ties.

    An empty leaderboard gives 0.5 (no information). Ties count as beaten so that
    matching the best reference entry scores 1.0.
    """
    if not math.isfinite(score):
        return 0.0
    if not leaderboard:
        return 0.5
    beaten = sum(1 for ref in leaderboard if (score >= ref if higher_is_better else score <= ref))
    return beaten / len(leaderboard)


def bucket_of(rank_score: float) -> QualityBucket:
    """The quality bucket a leaderboard rank score falls in: the nearest bucket's score (for real outcomes,
    which carry a rank score and no bucket; the world model's buckets map the other way,
    :data:`BUCKET_RANK_SCORE`)."""
    return min(BUCKET_RANK_SCORE, key=lambda b: (abs(BUCKET_RANK_SCORE[b] - rank_score), -BUCKET_RANK_SCORE[b]))


def quality_of(outcome: Outcome) -> Optional[QualityBucket]:
    """A valid outcome's quality bucket (predicted, or from its rank score); None for the other statuses."""
    if outcome.status is not Status.VALID:
        return None
    if outcome.quality_bucket is not None:
        return outcome.quality_bucket
    return bucket_of(outcome.rank_score if outcome.rank_score is not None else 0.0)


def is_top(outcome: Outcome) -> bool:
    """The top outcome: a valid run in the best quality bucket. A multi-turn trajectory stops there."""
    return quality_of(outcome) is QualityBucket.HIGH
