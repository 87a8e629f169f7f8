"""The WMRLRun's status (``status`` of the object; the operator and the trainer write it): phase,
conditions, progress. Part of the API whose spec is wmrl/api/schema.py; the CRD and docs/api.md are
generated from both."""

from __future__ import annotations

from enum import Enum
from typing import Any, Literal, Optional

from pydantic import Field

from wmrl.api.wire import WireModel


class Phase(str, Enum):
    PENDING = "Pending"
    RUNNING = "Running"
    SUSPENDED = "Suspended"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


class Condition(WireModel):
    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str
    message: str = ""
    last_transition_time: Optional[str] = None
    observed_generation: Optional[int] = None


class PolicyHealth(WireModel):
    """Generation health at the last step: a collapsing policy shows here before its reward does."""

    distinct_per_group: Optional[float] = Field(
        None, description="Distinct completions per group, averaged over the step's groups (1 = every rollout identical).")
    truncated_share: Optional[float] = Field(
        None, description="Share of completions cut off at spec.policy.sampling.maxNewTokens (no stop token).")
    mean_completion_tokens: Optional[float] = None
    entropy: Optional[float] = Field(None, description="Mean per-token policy entropy of the sampled completions (nats).")
    warning: Optional[str] = Field(None, description="Set while generation is degenerating, in plain words.")


class TurnProgress(WireModel):
    """Multi-turn figures of the last step (spec.algorithm.maxTurns > 1)."""

    mean_turns: Optional[float] = None
    mean_best_turn: Optional[float] = Field(None, description="Mean 1-based turn of each trajectory's best script.")
    repair_rate: Optional[float] = Field(
        None, description="Of the trajectories whose first script did not produce a valid submission (by the grade "
        "they were shown) and that had a second turn, the share whose second script did.")
    stopped_at_top: int = Field(0, description="Trajectories that ended at the top outcome.")
    stopped_at_budget: int = Field(0, description="Trajectories that ended at spec.algorithm.maxTrajectoryTokens.")
    truncated: int = Field(0, description="Trajectories ended by a turn cut off at spec.policy.sampling.maxNewTokens.")
    ungraded: int = Field(0, description="Trajectories ended by a turn that could not be graded.")
    valid_by_turn: list[Optional[float]] = Field(
        default_factory=list, description="Per turn (first first): the share of the trajectories that reached it whose "
        "script produced a valid submission, by the grade they were shown.")


class HeldOutProgress(WireModel):
    """Held-out evaluation (spec.evaluation) as of the last one: what heldOutReward is, and what evaluating cost."""

    step: Optional[int] = Field(None, description="Step of the last complete evaluation (the one heldOutReward is).")
    samples: Optional[int] = Field(None, description="Trajectories the last complete evaluation graded.")
    partial: Optional[str] = Field(
        None, description="Set when the latest evaluation did not complete (step and reason); heldOutReward then "
        "stays at the last complete one.")
    evaluations: int = Field(0, description="Evaluations run (complete or partial).")
    executions: int = Field(0, description="Real executions of every evaluation so far (not in executions).")
    seconds: float = Field(0.0, description="Wall seconds of every evaluation so far (not in any step's time).")
    report: Optional[str] = Field(None, description="The last evaluation's per-task report on the checkpoint volume.")


class FidelityProgress(WireModel):
    """Rolling world-model fidelity: its predictions against the real outcomes of the latest anchor rollouts."""

    cases: int = Field(0, description="Anchor cases in the window.")
    graded: int = Field(0, description="Of those, the ones the world model graded (the rest were ungraded).")
    status_at_1: Optional[float] = Field(
        None, description="Share of the graded cases whose predicted status is the real one.")
    reward_mae: Optional[float] = Field(None, description="Mean |predicted reward - real reward| over the graded cases.")
    reward_bias: Optional[float] = Field(None, description="Mean (predicted reward - real reward) over the graded cases.")
    recorded: int = Field(0, description="Cases written so far (the case file's lines, across restarts).")
    file: Optional[str] = Field(None, description="The case file (`wmrl eval world-model --cases`).")


class Progress(WireModel):
    """Patched by the trainer each step; the operator never writes it."""

    step: int = 0
    total_steps: Optional[int] = None
    mean_real_reward: Optional[float] = None
    mean_world_model_reward: Optional[float] = None
    mean_calibrated_reward: Optional[float] = None
    held_out_reward: Optional[float] = Field(
        None, description="Mean REAL reward of sampled trajectories on spec.tasks.heldOut at the last complete "
        "evaluation (spec.evaluation).")
    held_out: Optional[HeldOutProgress] = None
    anchor_fraction: Optional[float] = None
    bias_reduction: Optional[float] = None
    anchor_weight: Optional[float] = None
    executions: int = 0
    sandbox_seconds: float = 0.0
    ungraded: int = 0
    sandbox_demand: int = Field(0, description="Executions queued + in flight at the trainer: the autoscaler's input.")
    calibration_stale_seconds: Optional[float] = None
    fidelity: Optional[FidelityProgress] = None
    health: Optional[PolicyHealth] = None
    turns: Optional[TurnProgress] = None
    updated_at: Optional[str] = None


class CalibrationStatus(WireModel):
    name: str
    pairs: int = 0
    reduction: Optional[float] = None
    weight: Optional[float] = None


class SandboxStatus(WireModel):
    replicas: int = 0
    ready_replicas: int = 0
    desired_replicas: int = 0
    last_scale_time: Optional[str] = None


class WMRLRunStatus(WireModel):
    phase: Phase = Phase.PENDING
    conditions: list[Condition] = Field(default_factory=list)
    observed_generation: Optional[int] = None
    restarts: int = 0
    last_failed_trainer: Optional[str] = Field(
        None, description="UID of the last failed trainer Job already counted in restarts (keeps restarts exactly-once)."
    )
    start_time: Optional[str] = None
    completion_time: Optional[str] = None
    progress: Optional[Progress] = None
    calibration: Optional[CalibrationStatus] = None
    sandbox: Optional[SandboxStatus] = None
