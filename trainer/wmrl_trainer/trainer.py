"""One run of training: :class:`WMRLTrainer`, which :func:`wmrl_trainer.build.build_trainer` returns.

:class:`WMRLTrainer` resumes from the newest complete checkpoint under
``runtime.checkpointDir``, calls every ``callbacks`` entry with a
:class:`~wmrl_trainer.records.StepRecord` after each step, patches status, checkpoints every
``trainer.checkpoint.intervalSteps`` and on SIGTERM (then stops; ``wmrl train`` exits 143
so the Job restarts it and it resumes).

Held-out evaluation (``spec.evaluation``, :mod:`wmrl_trainer.evaluation`): after every
``intervalSteps``-th step and after the last one, the held-out tasks are sampled with the
current policy and graded by real execution, before the step is reported. Under several
processes (DDP or FSDP) every process samples its share of the trajectories in lockstep and
rank 0 executes them all (the process group's timeout, ``2 x spec.sandbox.timeoutSeconds +
600`` s, bounds each collective). Its time is no step's: the next step's clock starts after
it. The report goes to ``<checkpoint dir>/eval/step-<n>.json``, with what training had spent
by then (``compute``: trainer seconds, GPU-hours, executions); ``heldOutReward`` (status,
metrics, the step's log line) changes only with a complete evaluation.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Sequence

import numpy as np

from wmrl.api.runconfig import RunConfig
from wmrl.calibration.state import CalibrationState
from wmrl.tasks import Task
from wmrl_trainer.checkpoint import (WMRL_STATE, WORLD_MODEL_STATE, latest_checkpoint, load_json, save_json,
                                     save_trainer_state, write_checkpoint)
from wmrl_trainer.distributed import World
from wmrl_trainer.evaluation import HeldOutEvaluator
from wmrl_trainer.health import HealthMonitor
from wmrl_trainer.services import write_json_atomic

log = logging.getLogger("wmrl.trainer")

StepCallback = Callable[[Any], None]


def _calibration_state(calibration: Any) -> Optional[dict[str, Any]]:
    """What to checkpoint of an in-process calibration (a shared service keeps its own state): None for a client."""
    if hasattr(calibration, "state_dict"):
        return calibration.state_dict()
    state = getattr(calibration, "state", None)
    if state is None or not hasattr(state, "to_json"):
        return None
    # LocalCalibration numbers its batches 1, 2, ...; the state remembers recent ids to drop retries, so the
    # counter must survive a restart or the first batches after it would be taken for retries.
    return {"state": state.to_json(), "batches": int(getattr(calibration, "_batches", 0))}


def _load_calibration_state(calibration: Any, data: dict[str, Any]) -> None:
    if hasattr(calibration, "load_state_dict"):
        calibration.load_state_dict(data)
    elif getattr(calibration, "state", None) is not None:
        calibration.state = CalibrationState.from_json(data["state"])
        calibration._batches = int(data["batches"])


def training_compute(totals: Any, record: Any, step_seconds: float, gpus: int) -> dict[str, Any]:
    """What training has spent up to and including the step of ``record`` (whose own wall-clock is
    ``step_seconds``; ``totals`` holds the steps before it): trainer seconds, GPUs, GPU-hours (None
    on CPU), real executions and their sandbox seconds. Evaluations are in none of them."""
    seconds = totals.train_seconds + step_seconds
    return {"train_seconds": seconds, "gpus": gpus, "gpu_hours": seconds * gpus / 3600.0 if gpus else None,
            "executions": totals.executions + record.executions,
            "sandbox_seconds": totals.sandbox_seconds + record.sandbox_seconds}


# ---------------------------------------------------------------- the trainer

class _Hook:
    """transformers TrainerCallback that turns each optimizer step into a StepRecord (built lazily: torch import)."""

    def __new__(cls, owner: "WMRLTrainer") -> Any:
        from transformers import TrainerCallback

        class Hook(TrainerCallback):
            def on_train_begin(self, args, state, control, **kwargs):
                owner._step_started = time.perf_counter()

            def on_step_end(self, args, state, control, **kwargs):
                owner._on_step_end(control)

        return Hook()


class WMRLTrainer:
    """One run: ``train()``, ``evaluate()``, ``save_checkpoint()``; see the module docstring."""

    def __init__(self, config: RunConfig, grpo: Any, step: Any, *, tasks: list[Task], held_out: list[Task],
                 reporter: Any, callbacks: Iterable[StepCallback] = (), owned: Iterable[Any] = (),
                 world: World = World(), evaluator: Optional[HeldOutEvaluator] = None):
        """``step`` is None on ranks other than 0 (only rank 0 grades; :mod:`wmrl_trainer.distributed`);
        ``evaluator`` evaluates the held-out tasks per ``spec.evaluation`` (every process holds one when
        rank 0 does; only rank 0's has a dispatcher); None: no evaluation."""
        self.config = config
        self.world = world
        self.grpo = grpo
        self.step = step
        self.tasks = tasks
        self.held_out = held_out
        self.reporter = reporter
        self.callbacks = list(callbacks)
        self.records: list[Any] = []
        self.stop_requested = threading.Event()
        self.checkpoint_root = Path(config.runtime.checkpoint_dir)
        self.interval = config.spec.trainer.checkpoint.interval_steps
        self.resumed_from: Optional[int] = None
        self._owned = list(owned)
        self._step_started = time.perf_counter()
        self.health = HealthMonitor(config.spec.algorithm.group_size)
        self.evaluator = evaluator
        self._rank0_evaluates: Optional[bool] = None  # several processes: learnt at the first evaluation
        self.evaluations: list[dict[str, Any]] = []
        grpo.add_callback(_Hook(self))

    # ------------------------------------------------------------ training
    def train(self) -> dict[str, Any]:
        latest = self.world.broadcast(latest_checkpoint(self.checkpoint_root))  # rank 0's view of the shared volume
        if latest is not None:
            self.world.share(lambda: self._load_wmrl_state(latest))  # rank 0's step state
            self.resumed_from = int(json.loads((latest / "COMPLETE").read_text())["step"])
            log.info("resuming from %s (step %d)", latest, self.resumed_from)
        self.grpo.train(resume_from_checkpoint=str(latest) if latest is not None else None)
        return self.summary()

    def _on_step_end(self, control: Any) -> None:
        scored = self.grpo.last_scored
        state = self.grpo.state
        now = time.perf_counter()
        if scored is not None:  # progress comes from rank 0 only; its failure stops every rank
            sampled = self._sample_held_out_if_due(state.global_step, state.max_steps)  # every rank takes part

            def report() -> None:
                evaluation = None
                if sampled is not None:
                    spent = training_compute(self.reporter.totals, scored.record, now - self._step_started,
                                             self._gpus())
                    evaluation = self._record_held_out(state.global_step, sampled, spent)
                self._report(scored.record, now, evaluation)

            self.world.share(report)
        stopping = self.world.any(self.stop_requested.is_set())  # every rank stops at the same step
        if stopping or state.global_step % self.interval == 0 or state.global_step >= state.max_steps:
            self.save_checkpoint()
        if stopping:
            control.should_training_stop = True
        self._step_started = time.perf_counter()

    def _report(self, record: Any, now: float, evaluation: Optional[dict[str, Any]] = None) -> None:
        """Finish the step's record and hand it to the reporter, the log and the callbacks (rank 0)."""
        record.total = now - self._step_started
        record.update = max(0.0, record.total - record.generation - record.world_model - record.execution
                            - record.calibration)
        record.entropy = self.grpo.step_metric("entropy")
        record.truncated_share = self.grpo.step_metric("completions/clipped_ratio")
        record.mean_completion_tokens = self.grpo.step_metric("completions/mean_length")
        change = self.health.check(record)
        if change is not None:
            log.warning("%s", change)
        self.records.append(record)
        self.reporter.report(record)
        line = {"event": "step", **record.to_json(), "held_out_reward": self.reporter.held_out_reward}
        if evaluation is not None:
            line["evaluation"] = {k: evaluation.get(k) for k in
                                  ("step", "complete", "partial", "reward", "samples", "graded", "executed",
                                   "eval_seconds", "report")}
        print(json.dumps(line, default=float), flush=True)
        for callback in self.callbacks:
            callback(record)

    def step_seconds(self) -> float:
        """Seconds since the current step started (its record's ``total`` counts from the same moment)."""
        return time.perf_counter() - self._step_started

    def request_stop(self, *_: Any) -> None:
        """Checkpoint after the current step and stop (the SIGTERM handler)."""
        self.stop_requested.set()

    @property
    def finished(self) -> bool:
        return self.grpo.state.global_step >= self.config.spec.algorithm.steps

    # ------------------------------------------------------------ checkpoints
    def save_checkpoint(self) -> Path:
        def write(directory: Path) -> None:
            save_trainer_state(self.grpo, directory, main=self.world.is_main)
            if self.world.is_main:
                self._save_wmrl_state(directory)

        path = write_checkpoint(self.checkpoint_root, self.grpo.state.global_step, write, world=self.world)
        log.info("checkpoint %s", path)
        return path

    def _save_wmrl_state(self, directory: Path) -> None:
        import torch  # loaded by the training run already; importing this module must not load it

        step = self.step
        data: dict[str, Any] = {"step": self.grpo.state.global_step, "totals": self.reporter.totals.state_dict(),
                                "health": self.health.state_dict(), "heldOut": self.reporter.held_out.state_dict()}
        if step.selector is not None:
            data["selector"] = step.selector.state_dict()
        calibration = _calibration_state(step.calibration)
        if calibration is not None:
            data["calibration"] = calibration
        if step.cases is not None:
            data["fidelity"] = step.cases.state_dict()
        save_json(directory / WMRL_STATE, data)
        if hasattr(step.world_model, "state_dict"):
            torch.save(step.world_model.state_dict(), directory / WORLD_MODEL_STATE)

    def _load_wmrl_state(self, directory: Path) -> None:
        import torch

        data, step = load_json(directory / WMRL_STATE), self.step
        if "selector" in data and step.selector is not None:
            step.selector.load_state_dict(data["selector"])
        if "calibration" in data:
            _load_calibration_state(step.calibration, data["calibration"])
        if "fidelity" in data and step.cases is not None:
            step.cases.load_state_dict(data["fidelity"])
        self.reporter.totals.load_state_dict(data.get("totals", {}))
        self.health.load_state_dict(data.get("health", {}))
        self.reporter.held_out.load_state_dict(data.get("heldOut", {}))
        wm_path = directory / WORLD_MODEL_STATE
        if wm_path.is_file() and hasattr(step.world_model, "load_state_dict"):
            step.world_model.load_state_dict(torch.load(wm_path, weights_only=False))

    # ------------------------------------------------------------ evaluation
    def evaluation_due(self, step: int, max_steps: int) -> bool:
        """Whether ``spec.evaluation`` evaluates after optimizer step ``step`` (every intervalSteps, and the last)."""
        interval = self.config.spec.evaluation.interval_steps
        return step >= max_steps or (interval > 0 and step % interval == 0)

    def _sample_held_out_if_due(self, step: int, max_steps: int) -> Optional[dict[str, Any]]:
        """The held-out evaluation's figures when one is due (rank 0; collective under several processes)."""
        if not self.evaluation_due(step, max_steps):
            return None
        if self.world.size > 1:  # every process samples, so all must know that rank 0 evaluates
            if self._rank0_evaluates is None:
                self._rank0_evaluates = self.world.broadcast(self.evaluator is not None)
            if not self._rank0_evaluates:
                return None
        elif self.evaluator is None:
            return None
        return self._sample_held_out()

    def _gpus(self) -> int:
        """GPUs the run trains on: one per process on CUDA, none on CPU."""
        device = getattr(getattr(self.grpo, "accelerator", None), "device", None)
        return self.world.size if getattr(device, "type", "cpu") == "cuda" else 0

    def evaluate_held_out(self, step: int, compute: Optional[dict[str, Any]] = None) -> Optional[dict[str, Any]]:
        """Evaluate the held-out tasks now, write the report and hand it to the reporter; returns it
        (rank 0; under several processes every process calls this and the others get None).

        ``compute``: what training has spent up to this step (:func:`training_compute`), kept in the
        report so that held-out curves can be drawn over compute (``wmrl report --eval-dir``)."""
        point = self._sample_held_out()
        return self._record_held_out(step, point, compute) if point is not None else None

    def _sample_held_out(self) -> Optional[dict[str, Any]]:
        """Sample and execute (:meth:`HeldOutEvaluator.evaluate`): rank 0's figures, None on the other ranks."""
        if self.evaluator is None:
            raise RuntimeError("no held-out evaluator (spec.tasks.heldOut empty, or no sandboxes to execute on)")
        ev = self.config.spec.evaluation
        model = self.grpo.accelerator.unwrap_model(self.grpo.model)  # FSDP2 shards in place: still collective
        sampling = self.config.spec.policy.sampling.model_copy(update={"temperature": ev.temperature})
        return self.evaluator.evaluate(model, self.grpo.processing_class, sampling, world=self.world,
                                       synced=bool(getattr(self.grpo, "is_fsdp_enabled", False)))

    def _record_held_out(self, step: int, point: dict[str, Any], compute: Optional[dict[str, Any]]) -> dict[str, Any]:
        """Complete ``point`` (rank 0), write its report and hand it to the reporter; returns it."""
        ev = self.config.spec.evaluation
        point.update(step=step, samples_per_task=ev.samples, temperature=ev.temperature,
                     max_turns=self.config.spec.algorithm.max_turns)
        if compute is not None:
            point["compute"] = compute
        path = self.checkpoint_root / "eval" / f"step-{step}.json"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            point["report"] = str(path)
            write_json_atomic(path, point)
        except OSError as exc:  # a full volume must not stop training; the figures still reach status
            point["report"] = None
            log.warning("writing the held-out report %s failed: %s", path, exc)
        self.reporter.evaluated(point)
        self.evaluations.append(point)
        if point["complete"]:
            log.info("held-out reward at step %d: %.4f (%d trajectories, %d executions, %.1f s)", step,
                     point["reward"], point["samples"], point["executed"], point["eval_seconds"])
        else:
            log.warning("held-out evaluation at step %d is partial: %s", step, point["partial"])
        return point

    def evaluate(self, tasks: Sequence[Task], samples_per_task: int) -> float:
        """Mean REAL reward of ``samples_per_task`` sampled solutions per task (NaN unless every one was graded).

        The same evaluation as ``spec.evaluation``'s (:mod:`wmrl_trainer.evaluation`), on
        ``tasks``, with the run's training sampling settings; it leaves the training RNG
        streams untouched and reports nothing.
        """
        if self.step is None:
            raise RuntimeError("evaluate runs on rank 0, which holds the sandbox dispatcher")
        dispatcher = self.step.dispatcher
        if dispatcher is None:
            raise ValueError("evaluate needs a sandbox dispatcher (runtime.sandboxUrls or sandboxService)")
        evaluator = HeldOutEvaluator(tasks, dispatcher, samples_per_task, seed=self.config.spec.algorithm.seed + 7919,
                                     max_turns=self.config.spec.algorithm.max_turns,
                                     max_tokens=self.config.spec.algorithm.max_trajectory_tokens,
                                     max_concurrent=self.config.spec.evaluation.max_concurrent)
        model = self.grpo.accelerator.unwrap_model(self.grpo.model)
        point = evaluator.evaluate(model, self.grpo.processing_class, self.config.spec.policy.sampling)
        return float(point["reward"]) if point["reward"] is not None else float("nan")

    # ------------------------------------------------------------ summary
    def summary(self) -> dict[str, Any]:
        records = self.records
        phases = ("generation", "world_model", "execution", "calibration", "update", "total")
        mean = {p: float(np.mean([getattr(r, p) for r in records])) if records else None for p in phases}
        last = self.reporter.last.to_wire() if self.reporter.last is not None else None
        total = sum(r.total for r in records)
        return {
            "run": self.config.metadata.name,
            "mode": self.config.spec.mode.value,
            "steps": self.grpo.state.global_step,
            "processes": self.world.size,
            "strategy": "fsdp" if getattr(self.grpo, "is_fsdp_enabled", False) else "ddp" if self.world.size > 1 else "one process",
            "device": str(self.grpo.accelerator.device),
            "stepsThisProcess": len(records),
            "resumedFrom": self.resumed_from,
            "finished": self.finished,
            "meanSeconds": mean,
            "executionWaitFraction": (sum(r.execution for r in records) / total) if total > 0 else None,
            "progress": last,
            "heldOut": [{k: e.get(k) for k in ("step", "complete", "partial", "reward", "eval_seconds", "executed")}
                        for e in self.evaluations],
        }

    def close(self) -> None:
        if self.step is not None:
            self.step.close()
        self.reporter.close()
        for thing in self._owned:
            try:
                thing.close()
            except Exception as exc:  # closing is best effort: report, don't mask the run's result
                log.warning("closing %r failed: %s", thing, exc)
