"""Progress out of the trainer: ``WMRLRun.status.progress`` and Prometheus metrics.

:class:`StatusPatcher` sends a JSON merge patch of ``{"status": {"progress": ...}}`` to the
WMRLRun's ``status`` subresource after every step (in-cluster service account, or the
kubeconfig outside a cluster). A failed patch is logged and skipped: progress reporting
never stops training. :class:`TrainerMetrics` serves the same figures on
``runtime.metricsPort`` (``/metrics``). Held-out evaluations (:mod:`wmrl_trainer.evaluation`)
reach both through :meth:`ProgressReporter.evaluated`: ``heldOutReward`` is the last
complete evaluation's, and ``heldOut`` says what evaluating has cost (apart from training's
``executions`` and ``sandboxSeconds``) and whether the latest one was partial.
"""

from __future__ import annotations

import logging
import os
import threading
from datetime import datetime, timezone
from typing import Any, Optional

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from wmrl.api.schema import (GROUP, PLURAL, VERSION, FidelityProgress, HeldOutProgress, PolicyHealth, Progress,
                             TurnProgress)
from wmrl_trainer.records import StepRecord

log = logging.getLogger("wmrl.trainer.progress")
PHASES = ("generation", "world_model", "execution", "calibration", "update")
HEALTH_FIGURES = ("distinct_per_group", "truncated_share", "mean_completion_tokens", "entropy")
TURN_FIGURES = ("mean_turns", "mean_best_turn", "repair_rate")
FIDELITY_FIGURES = ("status_at_1", "reward_mae", "reward_bias", "cases", "graded")


class Totals:
    """Cumulative figures over the run (restored from checkpoints so they survive restarts).

    ``train_seconds``: the trainer's wall-clock summed over its steps (evaluations excluded), the
    clock that held-out reports put their compute on (:meth:`WMRLTrainer.evaluate_held_out`)."""

    def __init__(self, executions: int = 0, sandbox_seconds: float = 0.0, ungraded: int = 0,
                 train_seconds: float = 0.0):
        self.executions, self.sandbox_seconds, self.ungraded = executions, sandbox_seconds, ungraded
        self.train_seconds = train_seconds

    def add(self, record: StepRecord) -> None:
        self.executions += record.executions
        self.sandbox_seconds += record.sandbox_seconds
        self.ungraded += record.ungraded
        self.train_seconds += record.total

    def state_dict(self) -> dict[str, Any]:
        return {"executions": self.executions, "sandboxSeconds": self.sandbox_seconds, "ungraded": self.ungraded,
                "trainSeconds": self.train_seconds}

    def load_state_dict(self, data: dict[str, Any]) -> None:
        self.executions = int(data.get("executions", 0))
        self.sandbox_seconds = float(data.get("sandboxSeconds", 0.0))
        self.ungraded = int(data.get("ungraded", 0))
        self.train_seconds = float(data.get("trainSeconds", 0.0))


class HeldOutTotals:
    """Held-out evaluations so far: the last complete one's reward and step, the latest's partial reason,
    and the cumulative cost (restored from checkpoints, like :class:`Totals`)."""

    def __init__(self) -> None:
        self.reward: Optional[float] = None
        self.step: Optional[int] = None
        self.samples: Optional[int] = None
        self.partial: Optional[str] = None
        self.evaluations = 0
        self.executions = 0
        self.seconds = 0.0
        self.report: Optional[str] = None

    def add(self, point: dict[str, Any]) -> None:
        """Count one evaluation (:func:`wmrl_trainer.evaluation.summarize`'s report plus its ``step``)."""
        self.evaluations += 1
        self.executions += int(point.get("executed") or 0)
        self.seconds += float(point.get("eval_seconds") or 0.0)
        self.report = point.get("report")
        if point.get("complete"):
            self.reward, self.step, self.samples, self.partial = float(point["reward"]), point["step"], point["samples"], None
        else:
            self.partial = f"step {point.get('step')}: {point.get('partial')}"

    def progress(self) -> Optional[HeldOutProgress]:
        if not self.evaluations:
            return None
        return HeldOutProgress(step=self.step, samples=self.samples, partial=self.partial, evaluations=self.evaluations,
                               executions=self.executions, seconds=round(self.seconds, 3), report=self.report)

    def state_dict(self) -> dict[str, Any]:
        return {"reward": self.reward, "step": self.step, "samples": self.samples, "partial": self.partial,
                "evaluations": self.evaluations, "executions": self.executions, "seconds": self.seconds,
                "report": self.report}

    def load_state_dict(self, data: dict[str, Any]) -> None:
        self.reward = data.get("reward")
        self.step, self.samples = data.get("step"), data.get("samples")
        self.partial, self.report = data.get("partial"), data.get("report")
        self.evaluations = int(data.get("evaluations", 0))
        self.executions = int(data.get("executions", 0))
        self.seconds = float(data.get("seconds", 0.0))


def _turn_progress(turns: Optional[dict]) -> Optional[TurnProgress]:
    if not turns:
        return None
    stops = turns.get("stops") or {}
    return TurnProgress(mean_turns=turns.get("mean_turns"), mean_best_turn=turns.get("mean_best_turn"),
                        repair_rate=turns.get("repair_rate"), stopped_at_top=stops.get("top", 0),
                        stopped_at_budget=stops.get("budget", 0), truncated=stops.get("truncated", 0),
                        ungraded=stops.get("ungraded", 0),
                        valid_by_turn=list(turns.get("valid_share_by_turn") or []))


def _fidelity_progress(figures: Optional[dict]) -> Optional[FidelityProgress]:
    if not figures:
        return None
    return FidelityProgress(**{k: figures.get(k) for k in ("cases", "graded", "status_at_1", "reward_mae",
                                                            "reward_bias", "recorded", "file")})


def progress_of(record: StepRecord, totals: Totals, total_steps: Optional[int],
                held_out_reward: Optional[float] = None, held_out: Optional[HeldOutProgress] = None) -> Progress:
    """The ``status.progress`` object after ``record`` (``step`` = completed optimizer steps)."""
    return Progress(
        step=record.step + 1,
        total_steps=total_steps,
        mean_real_reward=record.mean_real_reward,
        mean_world_model_reward=record.mean_world_model_reward,
        mean_calibrated_reward=record.mean_calibrated_reward,
        held_out_reward=held_out_reward,
        held_out=held_out,
        anchor_fraction=record.anchor_fraction,
        bias_reduction=record.bias_reduction,
        anchor_weight=record.weight,
        executions=totals.executions,
        sandbox_seconds=round(totals.sandbox_seconds, 3),
        ungraded=totals.ungraded,
        sandbox_demand=record.demand,
        calibration_stale_seconds=record.calibration_stale_seconds,
        fidelity=_fidelity_progress(record.fidelity),
        health=PolicyHealth(distinct_per_group=record.distinct_per_group, truncated_share=record.truncated_share,
                            mean_completion_tokens=record.mean_completion_tokens, entropy=record.entropy,
                            warning=record.health_warning),
        turns=_turn_progress(record.turns),
        updated_at=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    )


def _api_client(kubeconfig: Optional[str] = None) -> Any:
    from kubernetes import client, config

    if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config()
        return client.ApiClient()
    return config.new_client_from_config(config_file=kubeconfig)


class StatusPatcher:
    """Merge-patches ``status.progress`` of one WMRLRun; errors are logged, never raised."""

    def __init__(self, name: str, namespace: str, api_client: Any = None, timeout: float = 5.0):
        from kubernetes import client

        self.name, self.namespace, self.timeout = name, namespace, timeout
        self.api = client.CustomObjectsApi(api_client or _api_client())
        self.failures = 0

    def patch(self, progress: Progress) -> bool:
        body = {"status": {"progress": progress.to_wire()}}
        try:
            self.api.patch_namespaced_custom_object_status(
                GROUP, VERSION, self.namespace, PLURAL, self.name, body,
                _content_type="application/merge-patch+json", _request_timeout=self.timeout,
            )
            return True
        except Exception as exc:  # apiserver down, RBAC, object deleted: report and keep training
            self.failures += 1
            log.warning("patching %s/%s status.progress failed: %s", self.namespace, self.name, exc)
            return False


class TrainerMetrics:
    """Prometheus gauges/counters of the trainer, on their own registry (several trainers per process in tests)."""

    def __init__(self, port: Optional[int] = None, addr: str = "0.0.0.0"):
        self.registry = CollectorRegistry()
        r = self.registry
        self.step = Gauge("wmrl_trainer_step", "Completed optimizer steps", registry=r)
        self.reward = Gauge("wmrl_trainer_mean_reward", "Mean reward of the last step", ["kind"], registry=r)
        self.weight = Gauge("wmrl_trainer_anchor_weight", "Anchor advantage weight of the last step", registry=r)
        self.anchor_fraction = Gauge("wmrl_trainer_anchor_fraction", "Fraction of groups executed for real", registry=r)
        self.bias_reduction = Gauge("wmrl_trainer_bias_reduction", "Debiasing residual reduction", registry=r)
        self.phase = Gauge("wmrl_trainer_phase_seconds", "Seconds the last step waited per phase", ["phase"], registry=r)
        self.executions = Counter("wmrl_trainer_executions", "Real executions submitted", registry=r)
        self.failed = Counter("wmrl_trainer_failed_executions", "Real executions that failed or timed out", registry=r)
        self.dropped = Counter("wmrl_trainer_dropped_anchors", "Anchor groups dropped (execution failed)", registry=r)
        self.late = Counter("wmrl_trainer_late_anchors", "Anchor groups trained on WM rewards (real result late)", registry=r)
        self.sandbox_seconds = Counter("wmrl_trainer_sandbox_seconds", "Wall seconds of real executions", registry=r)
        self.ungraded = Counter("wmrl_trainer_ungraded", "Rollouts left out of the loss", registry=r)
        self.demand = Gauge("wmrl_trainer_sandbox_demand", "Executions queued + in flight", registry=r)
        self.stale = Gauge("wmrl_trainer_calibration_stale_seconds", "Age of the calibration map", registry=r)
        self.health = Gauge("wmrl_trainer_policy_health", "Generation health of the last step", ["figure"], registry=r)
        self.degenerating = Gauge("wmrl_trainer_generation_degenerating", "1 while generation is degenerating",
                                  registry=r)
        self.turns = Gauge("wmrl_trainer_turns", "Multi-turn figures of the last step", ["figure"], registry=r)
        self.stops = Counter("wmrl_trainer_trajectory_stops", "Multi-turn trajectories by why they ended", ["reason"],
                             registry=r)
        self.valid_by_turn = Gauge("wmrl_trainer_turn_valid_share", "Share of valid runs at each turn of the last step",
                                   ["turn"], registry=r)
        self.fidelity = Gauge("wmrl_trainer_world_model_fidelity",
                              "Rolling world-model fidelity on the latest anchor cases (status_at_1, reward_mae, "
                              "reward_bias, cases, graded)", ["figure"], registry=r)
        self.fidelity_cases = Gauge("wmrl_trainer_fidelity_cases_recorded", "Fidelity cases written to the case file",
                                    registry=r)
        self.held_out = Gauge("wmrl_trainer_held_out_reward",
                              "Mean real reward on the held-out tasks at the last complete evaluation", registry=r)
        self.held_out_partial = Gauge("wmrl_trainer_held_out_partial", "1 while the latest held-out evaluation is partial",
                                      registry=r)
        self.evaluations = Counter("wmrl_trainer_evaluations", "Held-out evaluations", ["result"], registry=r)
        self.evaluation_executions = Counter("wmrl_trainer_evaluation_executions",
                                             "Real executions of held-out evaluations (not in executions)", registry=r)
        self.evaluation_seconds = Counter("wmrl_trainer_evaluation_seconds", "Wall seconds of held-out evaluations",
                                          registry=r)
        self._server = None
        if port is not None:
            self._server, self._thread = start_http_server(port, addr=addr, registry=r)

    @property
    def port(self) -> Optional[int]:
        return self._server.server_port if self._server is not None else None

    def observe(self, record: StepRecord) -> None:
        self.step.set(record.step + 1)
        for kind, value in (("real", record.mean_real_reward), ("world_model", record.mean_world_model_reward),
                            ("calibrated", record.mean_calibrated_reward)):
            if value is not None:
                self.reward.labels(kind).set(value)
        if record.weight is not None:
            self.weight.set(record.weight)
        if record.anchor_fraction is not None:
            self.anchor_fraction.set(record.anchor_fraction)
        if record.bias_reduction is not None:
            self.bias_reduction.set(record.bias_reduction)
        for phase in PHASES:
            self.phase.labels(phase).set(getattr(record, phase))
        self.executions.inc(record.executions)
        self.failed.inc(record.failed_executions)
        self.dropped.inc(record.dropped_anchors)
        self.late.inc(record.late_anchors)
        self.sandbox_seconds.inc(record.sandbox_seconds)
        self.ungraded.inc(record.ungraded)
        self.demand.set(record.demand)
        if record.calibration_stale_seconds is not None:
            self.stale.set(record.calibration_stale_seconds)
        for figure in HEALTH_FIGURES:
            value = getattr(record, figure)
            if value is not None:
                self.health.labels(figure).set(value)
        self.degenerating.set(1 if record.health_warning else 0)
        if record.fidelity:
            for figure in FIDELITY_FIGURES:
                if record.fidelity.get(figure) is not None:
                    self.fidelity.labels(figure).set(record.fidelity[figure])
            self.fidelity_cases.set(record.fidelity.get("recorded", 0))
        if record.turns:
            for figure in TURN_FIGURES:
                if record.turns.get(figure) is not None:
                    self.turns.labels(figure).set(record.turns[figure])
            for reason, count in (record.turns.get("stops") or {}).items():
                self.stops.labels(reason).inc(count)
            for n, share in enumerate(record.turns.get("valid_share_by_turn") or [], start=1):
                if share is not None:
                    self.valid_by_turn.labels(str(n)).set(share)

    def observe_evaluation(self, point: dict[str, Any]) -> None:
        if point.get("complete"):
            self.held_out.set(point["reward"])
        self.held_out_partial.set(0 if point.get("complete") else 1)
        self.evaluations.labels("complete" if point.get("complete") else "partial").inc()
        self.evaluation_executions.inc(int(point.get("executed") or 0))
        self.evaluation_seconds.inc(float(point.get("eval_seconds") or 0.0))

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


class ProgressReporter:
    """Per step: metrics, cumulative totals and (when enabled) the status patch, off the training thread's error path."""

    def __init__(self, totals: Totals, total_steps: Optional[int], patcher: Optional[StatusPatcher] = None,
                 metrics: Optional[TrainerMetrics] = None):
        self.totals, self.total_steps, self.patcher, self.metrics = totals, total_steps, patcher, metrics
        self.held_out = HeldOutTotals()
        self.last: Optional[Progress] = None
        self._lock = threading.Lock()

    @property
    def held_out_reward(self) -> Optional[float]:
        """The last complete held-out evaluation's mean real reward (a partial one never changes it)."""
        return self.held_out.reward

    def evaluated(self, point: dict[str, Any]) -> None:
        """Take in one held-out evaluation's report; the next :meth:`report` carries it to status."""
        with self._lock:
            self.held_out.add(point)
        if self.metrics is not None:
            self.metrics.observe_evaluation(point)

    def report(self, record: StepRecord) -> Progress:
        with self._lock:
            self.totals.add(record)
            progress = progress_of(record, self.totals, self.total_steps, self.held_out.reward,
                                   self.held_out.progress())
            self.last = progress
        if self.metrics is not None:
            self.metrics.observe(record)
        if self.patcher is not None:
            self.patcher.patch(progress)
        return progress

    def close(self) -> None:
        if self.metrics is not None:
            self.metrics.close()
