"""``wmrl train --config FILE``: the trainer Job's entry point, and :func:`build_trainer` for local runs.

:func:`build_trainer` assembles, from the rendered :class:`~wmrl.api.runconfig.RunConfig`:
the policy (:mod:`wmrl_trainer.policy`), the task suite, the world model, the sandbox
dispatcher (``runtime.sandboxUrls`` or the ``runtime.sandboxService`` EndpointSlices),
the calibration (``runtime.calibrationUrl`` -> the shared service; empty -> in-process)
and the anchor selector, and wires them into TRL's GRPOTrainer through
:class:`wmrl_trainer.grpo.WMRLGRPOTrainer`. Anything passed explicitly is used as is (the
local runner and tests inject their own). The same code runs in a cluster and locally.

:class:`WMRLTrainer` runs it: resumes from the newest complete checkpoint under
``runtime.checkpointDir``, calls every ``callbacks`` entry with a
:class:`~wmrl_trainer.records.StepRecord` after each step, patches status, checkpoints every
``trainer.checkpoint.intervalSteps`` and on SIGTERM (then stops; ``wmrl train`` exits 143
so the Job restarts it and it resumes).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import logging
import math
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Sequence

import numpy as np

from wmrl.api.runconfig import RunConfig, load_run_config
from wmrl.api.schema import Mode
from wmrl.tasks import Task
from wmrl_trainer.distributed import World
from wmrl_trainer.health import HealthMonitor
from wmrl_trainer.sampling import make_prompt, sample_solutions

log = logging.getLogger("wmrl.trainer")

EXIT_PREEMPTED = 143  # 128 + SIGTERM: the pod failed, so the Job recreates it and training resumes
StepCallback = Callable[[Any], None]


# ---------------------------------------------------------------- pieces from the config

def build_dispatcher(config: RunConfig) -> Any:
    from wmrl_sandbox.dispatcher import EndpointSliceEndpoints, SandboxDispatcher, StaticEndpoints

    runtime, sandbox = config.runtime, config.spec.sandbox
    if runtime.sandbox_urls:
        endpoints = StaticEndpoints(list(runtime.sandbox_urls))
    elif runtime.sandbox_service:
        endpoints = EndpointSliceEndpoints(config.metadata.namespace, runtime.sandbox_service, runtime.sandbox_port)
    else:
        raise ValueError("runtime: set sandboxUrls or sandboxService (the mode needs real execution)")
    return SandboxDispatcher(endpoints, slots_per_pod=sandbox.slots_per_pod, timeout=sandbox.timeout_seconds)


def build_calibration(config: RunConfig) -> Any:
    from wmrl.calibration.client import CalibrationClient, LocalCalibration
    from wmrl.calibration.state import CalibrationConfig

    trainer_id = f"{config.metadata.namespace}.{config.metadata.name}"
    if config.runtime.calibration_url:
        return CalibrationClient(config.runtime.calibration_url, trainer_id)
    return LocalCalibration(CalibrationConfig.from_spec(config.spec.algorithm), trainer_id=trainer_id)


def build_world_model_from_config(config: RunConfig) -> Any:
    from wmrl_trainer.world_model import build_world_model

    # An empty spec.worldModel.model means the policy's base model, as in the paper.
    return build_world_model(config.spec.world_model, config.runtime, policy_model=config.spec.policy.model,
                             seed=config.spec.algorithm.seed)


def load_training_tasks(config: RunConfig) -> tuple[list[Task], list[Task]]:
    from wmrl_trainer.tasks import load_tasks, split_held_out

    return split_held_out(load_tasks(config.spec.tasks, config.runtime), config.spec.tasks.held_out)


def step_rows(tasks: Sequence[Task], groups_per_step: int, steps: int, seed: int) -> list[str]:
    """Task name of every group of the run, in order: seeded permutations of the tasks, back to back.

    The order depends only on ``seed`` (TRL's own shuffling is off), so a resumed run sees
    exactly the groups an uninterrupted one would.
    """
    rng = np.random.default_rng([seed, 7])
    names = [t.name for t in tasks]
    rows: list[str] = []
    while len(rows) < groups_per_step * steps:
        rows.extend(names[i] for i in rng.permutation(len(names)))
    return rows[: groups_per_step * steps]


def vllm_options(policy: Any, rollout_url: Optional[str] = None) -> dict[str, Any]:
    """GRPOConfig's vLLM settings from ``spec.policy`` (used on GPU nodes with rolloutEngine vllm);
    ``rollout_url`` is the server the operator deployed when the spec names none."""
    options: dict[str, Any] = {"vllm_mode": policy.vllm_mode}
    if policy.vllm_mode == "server" and (policy.vllm_server_url or rollout_url):
        options["vllm_server_base_url"] = policy.vllm_server_url or rollout_url
    if policy.vllm_mode == "colocate":
        options["vllm_gpu_memory_utilization"] = policy.vllm_gpu_memory_utilization
        options["vllm_tensor_parallel_size"] = policy.vllm_tensor_parallel_size
    return options


def batch_split(group_size: int, groups_per_step: int, processes: int) -> tuple[int, int]:
    """(rows per micro-batch, micro-batches per optimizer step) of each process, so that one optimizer
    step consumes exactly one generation batch of ``group_size x groups_per_step`` rows split evenly
    over ``processes`` (one process: a group per micro-batch, as before)."""
    rows = group_size * groups_per_step
    if rows % processes:
        raise ValueError(f"spec.algorithm.groupsPerStep: {rows} rollouts per step do not split over {processes} processes")
    per_process = rows // processes
    micro = math.gcd(group_size, per_process)
    return micro, per_process // micro


def strategy_options(strategy: str, use_cuda: bool) -> dict[str, Any]:
    """TrainingArguments for ``spec.trainer.strategy`` (DDP needs none: accelerate wraps the model when
    there are several processes)."""
    if strategy == "fsdp":
        # Checkpoints stay sharded (each rank writes its own shard): no rank gathers the whole policy.
        return {"fsdp": "full_shard auto_wrap",
                "fsdp_config": {"version": 2, "reshard_after_forward": True, "activation_checkpointing": use_cuda,
                                "state_dict_type": "SHARDED_STATE_DICT"}}
    return {}


def grpo_args(config: RunConfig, output_dir: str, use_cuda: bool, processes: int = 1) -> Any:
    """The GRPOConfig of a run: one optimizer step per generation batch of ``groupSize x groupsPerStep``
    rows, split over ``processes`` training processes."""
    from trl import GRPOConfig

    spec, alg = config.spec, config.spec.algorithm
    use_vllm = use_cuda and spec.policy.rollout_engine == "vllm"
    extra = vllm_options(spec.policy, config.runtime.rollout_url) if use_vllm else {}
    micro, accumulation = batch_split(alg.group_size, alg.groups_per_step, processes)
    if processes > 1:
        extra.update(strategy_options(spec.trainer.strategy, use_cuda))
        # Rank 0 grades for everyone: the others wait in a collective for up to a whole execution.
        extra["ddp_timeout"] = 2 * spec.sandbox.timeout_seconds + 600
        if os.environ.get("WMRL_DDP_BACKEND"):  # default: accelerate's (nccl on GPUs, gloo on CPUs)
            extra["ddp_backend"] = os.environ["WMRL_DDP_BACKEND"]
    return GRPOConfig(
        output_dir=output_dir,
        num_generations=alg.group_size,
        generation_batch_size=alg.group_size * alg.groups_per_step,
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=accumulation,
        num_iterations=1,
        max_steps=alg.steps,
        learning_rate=alg.learning_rate,
        lr_scheduler_type="constant",
        beta=alg.kl_beta,
        entropy_coef=alg.entropy_coef,
        max_completion_length=spec.policy.sampling.max_new_tokens,
        mask_truncated_completions=spec.policy.sampling.mask_truncated_completions,
        temperature=spec.policy.sampling.temperature,
        top_p=spec.policy.sampling.top_p,
        seed=alg.seed,
        data_seed=alg.seed,
        shuffle_dataset=False,
        use_vllm=use_vllm,
        use_cpu=not use_cuda,
        bf16=use_cuda,
        # TRL turns it on by default; a CPU-sized model only pays the recompute. FSDP checkpoints activations itself.
        gradient_checkpointing=use_cuda and not extra.get("fsdp"),
        report_to="none",
        save_strategy="no",
        logging_strategy="steps",
        logging_steps=1,
        disable_tqdm=True,
        dataloader_num_workers=0,
        **extra,
    )


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
    from wmrl.calibration.state import CalibrationState

    if hasattr(calibration, "load_state_dict"):
        calibration.load_state_dict(data)
    elif getattr(calibration, "state", None) is not None:
        calibration.state = CalibrationState.from_json(data["state"])
        calibration._batches = int(data["batches"])


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
                 world: World = World()):
        """``step`` is None on ranks other than 0 (only rank 0 grades; :mod:`wmrl_trainer.distributed`)."""
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
        grpo.add_callback(_Hook(self))

    # ------------------------------------------------------------ training
    def train(self) -> dict[str, Any]:
        from wmrl_trainer.checkpoint import latest_checkpoint

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
            self.world.share(lambda: self._report(scored.record, now))
        stopping = self.world.any(self.stop_requested.is_set())  # every rank stops at the same step
        if stopping or state.global_step % self.interval == 0 or state.global_step >= state.max_steps:
            self.save_checkpoint()
        if stopping:
            control.should_training_stop = True
        self._step_started = time.perf_counter()

    def _report(self, record: Any, now: float) -> None:
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
        print(json.dumps({"event": "step", **record.to_json()}, default=float), flush=True)
        for callback in self.callbacks:
            callback(record)

    def request_stop(self, *_: Any) -> None:
        """Checkpoint after the current step and stop (the SIGTERM handler)."""
        self.stop_requested.set()

    @property
    def finished(self) -> bool:
        return self.grpo.state.global_step >= self.config.spec.algorithm.steps

    # ------------------------------------------------------------ checkpoints
    def save_checkpoint(self) -> Path:
        from wmrl_trainer.checkpoint import save_trainer_state, write_checkpoint

        def write(directory: Path) -> None:
            save_trainer_state(self.grpo, directory, main=self.world.is_main)
            if self.world.is_main:
                self._save_wmrl_state(directory)

        path = write_checkpoint(self.checkpoint_root, self.grpo.state.global_step, write, world=self.world)
        log.info("checkpoint %s", path)
        return path

    def _save_wmrl_state(self, directory: Path) -> None:
        import torch

        from wmrl_trainer.checkpoint import WMRL_STATE, WORLD_MODEL_STATE, save_json

        step = self.step
        data: dict[str, Any] = {"step": self.grpo.state.global_step, "totals": self.reporter.totals.state_dict(),
                                "health": self.health.state_dict()}
        if step.selector is not None:
            data["selector"] = step.selector.state_dict()
        calibration = _calibration_state(step.calibration)
        if calibration is not None:
            data["calibration"] = calibration
        save_json(directory / WMRL_STATE, data)
        if hasattr(step.world_model, "state_dict"):
            torch.save(step.world_model.state_dict(), directory / WORLD_MODEL_STATE)

    def _load_wmrl_state(self, directory: Path) -> None:
        import torch

        from wmrl_trainer.checkpoint import WMRL_STATE, WORLD_MODEL_STATE, load_json

        data, step = load_json(directory / WMRL_STATE), self.step
        if "selector" in data and step.selector is not None:
            step.selector.load_state_dict(data["selector"])
        if "calibration" in data:
            _load_calibration_state(step.calibration, data["calibration"])
        self.reporter.totals.load_state_dict(data.get("totals", {}))
        self.health.load_state_dict(data.get("health", {}))
        wm_path = directory / WORLD_MODEL_STATE
        if wm_path.is_file() and hasattr(step.world_model, "load_state_dict"):
            step.world_model.load_state_dict(torch.load(wm_path, weights_only=False))

    # ------------------------------------------------------------ evaluation
    def evaluate(self, tasks: Sequence[Task], samples_per_task: int) -> float:
        """Mean REAL reward of ``samples_per_task`` sampled solutions per task (NaN if none could be executed).

        Generation uses the current policy with the run's sampling settings and leaves the
        training RNG streams untouched, so evaluating does not change what training does.
        """
        if self.step is None:
            raise RuntimeError("evaluate runs on rank 0, which holds the sandbox dispatcher")
        dispatcher = self.step.dispatcher
        if dispatcher is None:
            raise ValueError("evaluate needs a sandbox dispatcher (runtime.sandboxUrls or sandboxService)")
        model = self.grpo.accelerator.unwrap_model(self.grpo.model)
        futures: list[cf.Future] = []
        # Execution of one task's samples overlaps with generation for the next task.
        for task, codes in sample_solutions(model, self.grpo.processing_class, tasks,
                                            self.config.spec.policy.sampling, samples_per_task):
            futures += [dispatcher.run_task(task, code) for code in codes]
        done, _ = cf.wait(futures, timeout=self.step.execution_timeout)
        rewards = []
        for future in futures:
            if future in done and future.exception() is None and future.result() is not None:
                rewards.append(future.result().reward)
            else:
                future.cancel()
        return float(np.mean(rewards)) if rewards else float("nan")

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


def _ensure_loadable(model: Any, tokenizer: Any, directory: Path) -> None:
    """TRL builds the KL reference model from the policy's path: give an in-memory policy one."""
    name = getattr(model.config, "_name_or_path", "")
    if name and (Path(name).exists() or "/" in name and not name.startswith((".", "/"))):
        return
    if not (directory / "config.json").is_file():
        model.save_pretrained(directory)
        tokenizer.save_pretrained(directory)
    model.config._name_or_path = str(directory)


def build_trainer(config: RunConfig, *, policy: Any = None, tasks: Optional[Sequence[Task]] = None,
                  world_model: Any = None, dispatcher: Any = None, calibration: Any = None,
                  callbacks: Iterable[StepCallback] = (), held_out: Optional[Sequence[Task]] = None,
                  rollouts_dir: Optional[str] = None) -> WMRLTrainer:
    """A ready :class:`WMRLTrainer`; anything not given is built from ``config`` (see the module docstring).

    ``policy`` is ``(model, tokenizer)``; ``tasks`` are the training tasks (held-out tasks are
    then ``held_out``, default none); ``rollouts_dir`` logs every rank's rows of every step
    there. What this function builds itself it also closes.
    """
    import torch
    from datasets import Dataset

    from wmrl.anchors import AnchorSelector
    from wmrl_trainer.grpo import WMRLGRPOTrainer
    from wmrl_trainer.loop import WMRLStep
    from wmrl_trainer.policy import load_policy
    from wmrl_trainer.progress import ProgressReporter, StatusPatcher, Totals, TrainerMetrics

    spec, alg, mode = config.spec, config.spec.algorithm, config.spec.mode
    world = World.from_env()
    owned: list[Any] = []
    if tasks is None:
        tasks, held_out = load_training_tasks(config)
    tasks, held_out = list(tasks), list(held_out or [])
    if not tasks:
        raise ValueError("spec.tasks: no training tasks")
    grading = world.is_main  # rank 0 grades the whole batch; the others get its results
    if grading and world_model is None and mode is not Mode.REAL:
        world_model = build_world_model_from_config(config)
        owned.append(world_model)
    if grading and dispatcher is None and mode is not Mode.WORLD_MODEL:
        dispatcher = build_dispatcher(config)
        owned.append(dispatcher)
    if grading and calibration is None and mode is Mode.WMRL:
        calibration = build_calibration(config)
        owned.append(calibration)
    selector = None
    if grading and mode is Mode.WMRL:
        a = alg.anchors
        selector = AnchorSelector(a.fraction, a.min_per_step, a.max_concurrent, alg.seed)
    if spec.policy.model in ("builtin:tiny-coder", "builtin:tiny-coder-wide") and alg.max_turns > 1:
        raise ValueError(f"spec.algorithm.maxTurns: {spec.policy.model} writes one script and cannot read feedback; "
                         "set maxTurns: 1, or use builtin:tiny-coder-multiturn")
    model, tokenizer = policy if policy is not None else load_policy(spec.policy.model)
    initial = "initial-policy" if world.size == 1 else f"initial-policy-rank{world.rank}"  # no two writers
    _ensure_loadable(model, tokenizer, Path(config.runtime.checkpoint_dir) / initial)

    step = None
    if grading:
        step = WMRLStep(mode, alg, world_model=world_model, dispatcher=dispatcher, calibration=calibration,
                        selector=selector, execution_timeout=spec.sandbox.timeout_seconds + 60,
                        anchor_wait=spec.algorithm.anchors.wait_seconds)
    by_name = {t.name: t for t in tasks}
    prompts = {t.name: make_prompt(t, tokenizer) for t in tasks}
    names = step_rows(tasks, alg.groups_per_step, alg.steps, alg.seed)
    dataset = Dataset.from_list([{"prompt": prompts[n], "task": n} for n in names])
    use_cuda = torch.cuda.is_available()
    if spec.policy.rollout_engine == "vllm" and not use_cuda:
        log.warning("spec.policy.rolloutEngine is vllm but there is no GPU: generating with transformers")
    grpo = WMRLGRPOTrainer(
        model=model, args=grpo_args(config, str(Path(config.runtime.checkpoint_dir) / "trl"), use_cuda, world.size),
        train_dataset=dataset, processing_class=tokenizer, wmrl_step=step, tasks=by_name,
        max_turns=alg.max_turns, max_trajectory_tokens=alg.max_trajectory_tokens, world=world,
        rollouts_dir=rollouts_dir,
    )
    from transformers.trainer_callback import PrinterCallback

    grpo.remove_callback(PrinterCallback)  # our own one-JSON-line-per-step log replaces it
    if world.size > 1 and spec.trainer.strategy == "fsdp" and not grpo.is_fsdp_enabled:
        log.warning("spec.trainer.strategy fsdp shards over GPUs only (accelerate): training with DDP on %s",
                    grpo.accelerator.device)

    patcher = metrics = None
    try:  # progress reporting must never keep training from running
        if config.runtime.patch_status and world.is_main:
            patcher = StatusPatcher(config.metadata.name, config.metadata.namespace)
        if config.runtime.metrics_port is not None and world.is_main:
            metrics = TrainerMetrics(config.runtime.metrics_port)
    except Exception as exc:
        log.warning("progress reporting disabled: %s", exc)
    reporter = ProgressReporter(Totals(), alg.steps, patcher, metrics)
    return WMRLTrainer(config, grpo, step, tasks=tasks, held_out=held_out, reporter=reporter,
                       callbacks=callbacks, owned=owned, world=world)


# ---------------------------------------------------------------- CLI

def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="the rendered run config (run.yaml from the ConfigMap)")
    parser.add_argument("--world-model", metavar="MODULE:FACTORY",
                        help="use your own world model: FACTORY(world_model_spec, runtime) -> WorldModel")
    parser.add_argument("--summary", metavar="PATH", help="write the run summary JSON here as well")
    parser.add_argument("--rollouts", metavar="DIR", help="log every step's rollouts (task, scripts, reward, advantage, "
                        "anchor) as JSON lines, one file per training process: DIR/rank-<r>.jsonl")


def _factory(ref: str) -> Callable[..., Any]:
    import importlib

    module, _, name = ref.partition(":")
    if not module or not name:
        raise ValueError(f"--world-model must be MODULE:FACTORY, got {ref!r}")
    return getattr(importlib.import_module(module), name)


def main(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    logging.basicConfig(level=os.environ.get("WMRL_LOG_LEVEL", "INFO"), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = load_run_config(args.config)
        world_model = _factory(args.world_model)(config.spec.world_model, config.runtime) if args.world_model else None
    except (OSError, ValueError, ValidationError) as exc:
        print(f"wmrl train: {exc}", file=sys.stderr)
        return 2
    try:
        trainer = build_trainer(config, world_model=world_model, rollouts_dir=args.rollouts)
        signal.signal(signal.SIGTERM, trainer.request_stop)
        try:
            summary = trainer.train()
            trainer.world.close()  # only after success: a failed rank never reaches the barrier
        finally:
            trainer.close()
    finally:  # the --world-model factory's object is this function's to close (a multi-process run skips atexit)
        if callable(getattr(world_model, "close", None)):
            world_model.close()
    text = json.dumps({"event": "summary", **summary}, default=float)
    if trainer.world.is_main:
        print(text, flush=True)
        if args.summary:
            Path(args.summary).write_text(text)
    code = 0 if trainer.finished else EXIT_PREEMPTED
    if trainer.world.size > 1:
        _exit_skipping_teardown(code)
    return code


def _exit_skipping_teardown(code: int) -> None:
    """End a training process of a multi-process run without the interpreter's teardown.

    Everything the run owns is written and closed by now. What remains are gloo's C++ worker
    threads, which at interpreter teardown sometimes abort a rank ("terminate called without an
    active exception", SIGABRT) even after ``destroy_process_group``: torchrun then reports a
    finished run as failed and the Job would retry it. ``os._exit`` skips that teardown."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
