"""``wmrl run FILE.yaml``: run a WMRLRun manifest on this machine, no cluster.

What a cluster would provide is started here as local processes (:mod:`wmrl_trainer.services`):

* ``--sandboxes N`` sandbox servers (``wmrl sandbox serve``, one per core by default), which
  mount a ``spec.tasks.path`` directory as sandbox Pods mount the tasks volume (``--tasks-dir``:
  a collection task's public directory is bound into each execution at ``data/``, at any size,
  and the rest of the directory, its answers included, is hidden; not with
  ``--sandbox-isolation restricted``, where task data is uploaded up to 16 MiB),
* a calibration service on a state file (``wmrl calibration serve --state-file``) when the
  mode is ``wmrl``,

and the trainer runs in this process (:func:`wmrl_trainer.build.build_trainer`) against
them, with the world-model backend the manifest names (``learned`` and ``transformers``
run in-process; ``llm`` needs ``spec.worldModel.endpoint``).

Held-out reward: the mean REAL reward of ``--eval-samples`` sampled solutions on each of
``spec.tasks.heldOut`` (never trained on), measured before the first step, every
``--eval-every`` steps and at the end. Evaluations are paused time: the training clock
(sum of the trainer's per-step wall-clock) and the count of real executions leave them
out. Evaluation samples with a fixed seed (common random numbers across evaluations), and
identical (task, script) pairs are executed once per run: the demo policy's solutions are
deterministic programs, so this changes no number, only the time evaluations take. The
evaluation is the trainer's own (:mod:`wmrl_trainer.evaluation`), scheduled here by the
flags above instead of ``spec.evaluation`` (the trainer's built-in evaluation is off), with
training's sampling settings and every sandbox slot; a partial one (a sandbox failed) is
a point with ``reward`` null and ``partial`` saying why.

The results folder (default ``./wmrl-results/<run name>/``) holds ``results.json`` (config,
per-step records, the held-out curve against training wall-clock and real executions; each
evaluation's whole report also in ``checkpoints/eval/step-<n>.json``, as the trainer writes it,
for ``wmrl report --eval-dir``),
``results.png``, ``steps.jsonl`` (the trainer's line per step), the checkpoints and the
services' logs (``logs/``, with ``services.json``: name, pid, URL of each). Ctrl-C checkpoints after the
current step and exits 130; running the same command again resumes from that checkpoint
and continues the curves. Every process started here is stopped on the way out, error or
not (and, on Linux, if this process dies, by the kernel: PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence


from wmrl.api.runconfig import RunConfig, from_manifest, read_manifest
from wmrl.api.schema import Mode, field_errors
from wmrl_sandbox.dispatcher import SandboxDispatcher, StaticEndpoints
from wmrl_trainer.build import build_trainer, load_training_tasks, mounted_tasks_dir
from wmrl_trainer.checkpoint import latest_checkpoint
from wmrl_trainer.policy import load_policy
from wmrl_trainer.evaluation import HeldOutEvaluator
from wmrl_trainer.services import (LocalServices, ServiceStartError, local_runtime, local_tasks_dir,
                                   quiet_libraries, write_json_atomic)

log = logging.getLogger("wmrl.local")

RESULTS_FILE = "results.json"
PLOT_FILE = "results.png"
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


# ---------------------------------------------------------------- one run

@dataclass
class RunOptions:
    eval_every: Optional[int] = None  # default: about 5 evaluations per run
    eval_samples: int = 16
    progress: bool = True
    torch_threads: Optional[int] = None  # default: 1 for builtin (tiny) policies on CPU
    on_step: Optional[Callable[[dict], None]] = None
    eval_cache: Optional[dict] = None  # (task, script) -> real Outcome, shareable between runs (evaluation only)


@dataclass
class RunState:
    """What results.json holds while a run is in progress (reloaded on resume)."""

    records: list[dict] = field(default_factory=list)
    evals: list[dict] = field(default_factory=list)
    elapsed_s: float = 0.0
    resumed_from: list[int] = field(default_factory=list)

    @property
    def wall_clock_s(self) -> float:
        return self.records[-1]["wall_clock_s"] if self.records else 0.0

    @property
    def executions(self) -> int:
        return self.records[-1]["executions_total"] if self.records else 0


def eval_steps(steps: int, every: Optional[int]) -> set[int]:
    every = every or max(1, steps // 5)
    return {0, steps} | set(range(every, steps, every))


def run_warnings(records: Sequence[dict], evals: Sequence[dict], drop: float = 0.05) -> list[str]:
    """What a user should know about a run's learning, in plain words: degenerate generation, a falling held-out reward."""
    found, previous = [], None
    for record in records:
        warning = record.get("health_warning")
        if warning and warning != previous:
            found.append(f"step {record['step'] + 1}: generation was degenerating: {warning}")
        previous = warning
    rewards = [e["reward"] for e in evals if e.get("reward") is not None]
    if len(rewards) >= 2 and rewards[-1] < rewards[0] - drop:
        found.append(f"held-out reward fell from {rewards[0]:.3f} at the start to {rewards[-1]:.3f} at the end")
    return found


def results_payload(config: RunConfig, state: RunState, finished: bool, held_out: Sequence[str],
                    samples: int) -> dict[str, Any]:
    evals = state.evals
    return {
        "run": config.metadata.name,
        "mode": config.spec.mode.value,
        "seed": config.spec.algorithm.seed,
        "steps": config.spec.algorithm.steps,
        "steps_done": state.records[-1]["step"] + 1 if state.records else 0,
        "finished": finished,
        "wall_clock_s": state.wall_clock_s,
        "executions": state.executions,
        "elapsed_s": state.elapsed_s,
        "resumed_from": state.resumed_from,
        "held_out": {
            "tasks": list(held_out),
            "samples_per_task": samples,
            "initial_reward": evals[0]["reward"] if evals else None,
            "final_reward": evals[-1]["reward"] if evals else None,
            "curve": evals,
        },
        "warnings": run_warnings(state.records, evals),
        "records": state.records,
        "config": config.to_wire(),
    }


def _load_state(path: Path, resumed_step: int) -> RunState:
    """The previous results of this run up to the checkpoint it resumes from (later entries are redone)."""
    if resumed_step <= 0 or not path.is_file():
        return RunState()
    data = json.loads(path.read_text())
    records = [r for r in data.get("records", []) if r["step"] < resumed_step]  # record "step" counts from 0
    evals = [e for e in data.get("held_out", {}).get("curve", []) if e["step"] <= resumed_step]
    return RunState(records, evals, float(data.get("elapsed_s", 0.0)), [*data.get("resumed_from", []), resumed_step])


def train_and_evaluate(config: RunConfig, sandbox_urls: Sequence[str], results_dir: Path, options: RunOptions,
                       stop_flag: Optional[Callable[[Any], None]] = None) -> tuple[dict[str, Any], Any]:
    """Train ``config`` against the given sandboxes, evaluating held-out tasks; returns (results, trainer).

    ``config.runtime`` must already name the checkpoint dir and the calibration URL (if any).
    ``stop_flag(trainer)`` is called once the trainer exists (the CLI hooks Ctrl-C there).
    """
    import torch  # here, not on import: `wmrl run --help` and bad manifests answer without loading torch

    spec = config.spec
    if spec.policy.model.startswith("builtin:") and not torch.cuda.is_available():
        torch.set_num_threads(options.torch_threads or 1)  # the tiny model; the cores go to the sandboxes
    elif options.torch_threads:
        torch.set_num_threads(options.torch_threads)
    started = time.perf_counter()
    results_dir.mkdir(parents=True, exist_ok=True)
    results_path = results_dir / RESULTS_FILE
    tasks, held_out = load_training_tasks(config)
    if not held_out:
        raise ValueError("spec.tasks.heldOut: name at least one task to evaluate on (never trained on)")
    latest = latest_checkpoint(config.runtime.checkpoint_dir)
    resumed_step = int(json.loads((latest / "COMPLETE").read_text())["step"]) if latest is not None else 0
    state = _load_state(results_path, resumed_step)
    elapsed_before = state.elapsed_s
    dispatcher = SandboxDispatcher(StaticEndpoints(list(sandbox_urls)), slots_per_pod=spec.sandbox.slots_per_pod,
                                   timeout=spec.sandbox.timeout_seconds + 30, tasks_dir=mounted_tasks_dir(config.runtime))
    steps = spec.algorithm.steps
    when = eval_steps(steps, options.eval_every)
    # Training waits while it evaluates here, so evaluation may use every sandbox slot.
    evaluator = HeldOutEvaluator(held_out, dispatcher, options.eval_samples, seed=spec.algorithm.seed + 7919,
                                 cache=options.eval_cache if options.eval_cache is not None else {},
                                 max_turns=spec.algorithm.max_turns, max_tokens=spec.algorithm.max_trajectory_tokens,
                                 max_concurrent=len(sandbox_urls) * spec.sandbox.slots_per_pod)
    bar = None
    trainer = None

    def save(finished: bool) -> dict[str, Any]:
        state.elapsed_s = elapsed_before + time.perf_counter() - started
        payload = results_payload(config, state, finished, [t.name for t in held_out], options.eval_samples)
        write_json_atomic(results_path, payload)
        return payload

    def evaluate(step: int) -> None:
        model = trainer.grpo.accelerator.unwrap_model(trainer.grpo.model)
        point = evaluator.evaluate(model, trainer.grpo.processing_class, spec.policy.sampling)
        point.update(step=step, wall_clock_s=state.wall_clock_s, executions=state.executions)
        # The trainer's report file too, so that `wmrl report --eval-dir <checkpoints>/eval` draws this run.
        gpus = 1 if getattr(model, "device", None) is not None and model.device.type == "cuda" else 0
        report = {**point, "samples_per_task": options.eval_samples, "temperature": spec.policy.sampling.temperature,
                  "max_turns": spec.algorithm.max_turns,
                  "compute": {"train_seconds": state.wall_clock_s, "gpus": gpus,
                              "gpu_hours": state.wall_clock_s * gpus / 3600.0 if gpus else None,
                              "executions": state.executions}}
        reports = Path(config.runtime.checkpoint_dir) / "eval"
        reports.mkdir(parents=True, exist_ok=True)
        write_json_atomic(reports / f"step-{step}.json", report)
        state.evals.append(point)
        if point["complete"]:
            log.info("held-out reward at step %d: %s", step, point["reward"])
        else:
            log.warning("held-out evaluation at step %d is partial: %s", step, point["partial"])
        if bar is not None:
            bar.set_postfix_str(_postfix(state), refresh=True)
        save(finished=False)

    def on_step(record: Any) -> None:
        row = record.to_json()
        row["wall_clock_s"] = state.wall_clock_s + record.total
        row["executions_total"] = state.executions + record.executions
        state.records.append(row)
        if bar is not None:
            bar.update(1)
            bar.set_postfix_str(_postfix(state), refresh=False)
        if record.step + 1 in when:
            evaluate(record.step + 1)
        else:
            save(finished=False)
        if options.on_step is not None:
            options.on_step(row)

    step_log = open(results_dir / "steps.jsonl", "a")
    try:
        policy = load_policy(spec.policy.model, scripts=spec.policy.scripts)
        trainer = build_trainer(config, policy=policy, tasks=tasks, held_out=held_out, dispatcher=dispatcher,
                                callbacks=[on_step], evaluate=False)  # evaluated here, on the --eval-* schedule
        if stop_flag is not None:
            stop_flag(trainer)
        if options.progress:
            from tqdm import tqdm

            bar = tqdm(total=steps, initial=resumed_step, desc=config.metadata.name, unit="step", dynamic_ncols=True)
        if not any(e["step"] == resumed_step for e in state.evals) and resumed_step < steps:
            evaluate(resumed_step)
        # The trainer prints one JSON line per step: keep them in a file, the terminal gets the progress bar
        # (and the trainer's warnings, written above the bar).
        from tqdm.contrib.logging import logging_redirect_tqdm

        with contextlib.redirect_stdout(step_log), logging_redirect_tqdm():
            trainer.train()
        finished = trainer.finished
        if finished and (not state.evals or state.evals[-1]["step"] != steps):
            evaluate(steps)
        return save(finished=finished), trainer
    finally:
        if bar is not None:
            bar.close()
        if trainer is not None:
            trainer.close()
        dispatcher.close()
        step_log.close()


def _postfix(state: RunState) -> str:
    parts = []
    if state.records:
        r = state.records[-1]
        reward = r.get("mean_real_reward") if r.get("mean_calibrated_reward") is None else r["mean_calibrated_reward"]
        if reward is not None:
            parts.append(f"reward={reward:.3f}")
    parts.append(f"executions={state.executions}")
    if state.evals and state.evals[-1]["reward"] is not None:
        parts.append(f"held-out={state.evals[-1]['reward']:.3f}")
    if state.records and state.records[-1].get("distinct_per_group") is not None:
        parts.append(f"distinct={state.records[-1]['distinct_per_group']:.1f}")
    if state.records and state.records[-1].get("health_warning"):
        parts.append("DEGENERATING")
    return " ".join(parts)


# ---------------------------------------------------------------- plot

def plot_run(results: dict[str, Any], path: Path) -> None:
    """Held-out reward against training wall-clock and against real executions."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curve = [p for p in results["held_out"]["curve"] if p["reward"] is not None]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, key, label in ((axes[0], "wall_clock_s", "training wall-clock (s)"),
                           (axes[1], "executions", "real executions")):
        ax.plot([p[key] for p in curve], [p["reward"] for p in curve], marker="o", label=results["mode"])
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("held-out reward (real execution)")
    axes[1].legend()
    fig.suptitle(f"{results['run']}: held-out reward ({', '.join(results['held_out']['tasks'])})")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------- CLI

def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="a WMRLRun manifest (YAML)")
    parser.add_argument("--results", metavar="DIR", help="results folder (default ./wmrl-results/<run name>/)")
    parser.add_argument("--sandboxes", type=int, default=os.cpu_count() or 1, help="local sandbox servers (default: one per core)")
    parser.add_argument("--seed", type=int, help="override spec.algorithm.seed")
    parser.add_argument("--steps", type=int, help="override spec.algorithm.steps")
    parser.add_argument("--eval-every", type=int, help="held-out evaluation every N steps (default: steps/5)")
    parser.add_argument("--eval-samples", type=int, default=16, help="sampled solutions per held-out task (default 16)")
    parser.add_argument("--threads", type=int, metavar="N",
                        help="torch CPU threads for the trainer (default: 1 for builtin policies, else torch's default)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--sandbox-isolation", choices=("namespaces", "restricted"), default="namespaces",
                        help="the sandbox servers' --isolation: namespaces (default; root mode as root, bubblewrap "
                             "otherwise; they refuse to start without it) or restricted (executions run without "
                             "namespaces of their own, as your uid)")


def load_manifest(path: str | Path, seed: Optional[int] = None, steps: Optional[int] = None) -> RunConfig:
    """A RunConfig from a manifest file, with CLI overrides; ValueError naming the field when invalid."""
    from pydantic import ValidationError

    manifest = read_manifest(path)
    spec = dict(manifest.get("spec") or {})
    algorithm = dict(spec.get("algorithm") or {})
    if seed is not None:
        algorithm["seed"] = seed
    if steps is not None:
        algorithm["steps"] = steps
    spec["algorithm"] = algorithm
    # This machine trains in one process: the trainer Pod's GPUs and nodes do not apply here.
    spec["trainer"] = {**dict(spec.get("trainer") or {}), "gpusPerNode": 0, "nodes": 1}
    try:
        return from_manifest({**manifest, "spec": spec})
    except ValidationError as exc:
        raise ValueError("; ".join(field_errors(exc))) from exc


def main(args: argparse.Namespace) -> int:
    logging.basicConfig(level=os.environ.get("WMRL_LOG_LEVEL", "WARNING"), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    quiet_libraries()
    try:
        config = load_manifest(args.file, args.seed, args.steps)
        if config.spec.mode is Mode.EVAL:
            raise ValueError(f"spec.mode: eval trains nothing; evaluate with `wmrl eval {args.file}`")
        if config.spec.world_model.backend == "llm" and not config.spec.world_model.endpoint:
            raise ValueError("spec.worldModel.endpoint: a local run with backend llm needs an OpenAI-compatible "
                             "endpoint (or use backend learned / transformers)")
        if args.sandboxes < 1:
            raise ValueError(f"--sandboxes must be >= 1, got {args.sandboxes}")
        if args.threads is not None and args.threads < 1:
            raise ValueError(f"--threads must be >= 1, got {args.threads}")
    except ValueError as exc:
        print(f"wmrl run: {exc}", file=sys.stderr)
        return EXIT_USAGE
    results_dir = Path(args.results or Path("wmrl-results") / config.metadata.name).resolve()
    results_dir.mkdir(parents=True, exist_ok=True)
    print(f"wmrl run: results in {results_dir}", flush=True)
    options = RunOptions(eval_every=args.eval_every, eval_samples=args.eval_samples, progress=not args.no_progress,
                         torch_threads=args.threads)
    interrupted = {"count": 0}
    previous = signal.getsignal(signal.SIGINT)

    def hook(trainer: Any) -> None:
        def on_sigint(signum: int, frame: Any) -> None:
            interrupted["count"] += 1
            if interrupted["count"] > 1:
                raise KeyboardInterrupt
            print("\nwmrl run: interrupted: checkpointing after this step (Ctrl-C again to abort)", file=sys.stderr,
                  flush=True)
            trainer.request_stop()

        signal.signal(signal.SIGINT, on_sigint)

    tasks_dir = local_tasks_dir(config, args.sandbox_isolation)
    try:
        with LocalServices(args.sandboxes, results_dir / "logs", slots=config.spec.sandbox.slots_per_pod,
                           isolation=args.sandbox_isolation, tasks_dir=tasks_dir) as services:
            print(f"wmrl run: sandboxes: {services.sandbox_isolation()}", flush=True)
            if tasks_dir:
                print(f"wmrl run: task data: {tasks_dir} mounted into the sandboxes; each execution sees only its "
                      "task's public directory (at data/)", flush=True)
            calibration_url = None
            if config.spec.mode is Mode.WMRL:
                calibration_url = services.start_calibration(results_dir / "calibration-state.json",
                                                             config.spec.algorithm).url
            config = local_runtime(config, results_dir, services.sandbox_urls, calibration_url, tasks_dir)
            results, trainer = train_and_evaluate(config, services.sandbox_urls, results_dir, options, stop_flag=hook)
    except KeyboardInterrupt:
        print("wmrl run: aborted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except ValueError as exc:
        print(f"wmrl run: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ServiceStartError as exc:
        print(f"wmrl run: {exc}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        signal.signal(signal.SIGINT, previous)
    plot_run(results, results_dir / PLOT_FILE)
    held = results["held_out"]
    summary = {"run": results["run"], "mode": results["mode"], "steps_done": results["steps_done"],
               "finished": results["finished"], "initial_held_out_reward": held["initial_reward"],
               "final_held_out_reward": held["final_reward"], "wall_clock_s": results["wall_clock_s"],
               "executions": results["executions"], "results": str(results_dir / RESULTS_FILE),
               "plot": str(results_dir / PLOT_FILE), "warnings": results["warnings"]}
    print(json.dumps(summary), flush=True)
    for warning in results["warnings"]:
        print(f"wmrl run: warning: {warning}", file=sys.stderr)
    if not results["finished"]:
        print(f"wmrl run: stopped at step {results['steps_done']}; run the same command again to resume",
              file=sys.stderr)
        return EXIT_INTERRUPTED
    return EXIT_OK
