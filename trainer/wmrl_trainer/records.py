"""What one training step did: :class:`StepRecord`, the record the step fills in and the
trainer, progress reporting, health checks and benchmarks read.

A module of its own so that the step (:mod:`wmrl_trainer.loop`) and its multi-turn
trajectories (:mod:`wmrl_trainer.turns`) both build on it without importing each other.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Optional


@dataclass
class StepRecord:
    """What one training step did and how long each phase kept the trainer waiting (seconds)."""

    step: int
    mode: str
    generation: float = 0.0
    world_model: float = 0.0
    execution: float = 0.0
    calibration: float = 0.0
    update: float = 0.0
    total: float = 0.0
    world_model_busy: float = 0.0
    mean_real_reward: Optional[float] = None
    mean_world_model_reward: Optional[float] = None
    mean_calibrated_reward: Optional[float] = None
    anchor_groups: int = 0
    anchor_fraction: Optional[float] = None
    dropped_anchors: int = 0
    late_anchors: int = 0
    late_folded: int = 0
    # anchors.lateRewards: late groups whose real rewards entered this step's gradient, and (rank 0's rows) the
    # mean importance weight of their tokens and the share of tokens whose ratio was truncated.
    late_trained: int = 0
    late_weight_mean: Optional[float] = None
    late_clipped_share: Optional[float] = None
    bias_reduction: Optional[float] = None
    weight: Optional[float] = None
    executions: int = 0
    failed_executions: int = 0
    sandbox_seconds: float = 0.0
    ungraded: int = 0
    rows: int = 0
    demand: int = 0
    calibration_stale_seconds: Optional[float] = None
    # Policy health (wmrl_trainer.health): set by the step (distinct) and from TRL's step metrics (the rest).
    distinct_per_group: Optional[float] = None
    truncated_share: Optional[float] = None
    mean_completion_tokens: Optional[float] = None
    entropy: Optional[float] = None
    health_warning: Optional[str] = None
    # Multi-turn only (wmrl_trainer.turns.Trajectories.summary): mean turns, stop reasons, best turn, repair rate.
    turns: Optional[dict] = None
    # Mode wmrl with spec.logging.cases: the rolling world-model fidelity (wmrl_trainer.fidelity.recorder).
    fidelity: Optional[dict] = None

    @property
    def execution_wait_fraction(self) -> float:
        return self.execution / self.total if self.total > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["execution_wait_fraction"] = self.execution_wait_fraction
        return out
