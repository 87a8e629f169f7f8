"""``wmrl eval``: evaluate a checkpoint (or a base policy) on a task set, graded by real execution.

The evaluation is the one runs make of their held-out tasks (:class:`wmrl_trainer.evaluation.
HeldOutEvaluator`): per task G trajectories (avg@G, ``--samples``), K turns as trained
(``--turns``, default ``spec.algorithm.maxTurns``, each turn's real feedback shown to the next), at
``--temperature`` (default ``spec.evaluation.temperature``), seed ``spec.algorithm.seed + 7919``
(``--seed`` sets ``spec.algorithm.seed``, as for ``wmrl run``), every script executed for real.
The report's figures are :mod:`wmrl_trainer.eval_figures`' (valid rate, mean best-turn reward,
mean best position, leaderboard percentile, medals, per category and overall).

Inputs (:func:`plan`), a spec being built from them and validated like a WMRLRun's:

* a WMRLRun manifest (``FILE``), or ``--config FILE`` (the rendered run config the operator mounts:
  the mode-eval Job runs ``wmrl eval --config /etc/wmrl/run.yaml``), or neither (then ``--policy``
  and ``--tasks`` say what to evaluate);
* the policy: ``spec.policy.model`` (``--policy``); with ``--checkpoint DIR`` the weights of that
  checkpoint (a ``step-NNNNNNNN`` folder, or a folder of them: the newest complete one;
  ``base``: the policy as it is). With ``--config`` and no ``--checkpoint``,
  ``spec.evaluation.checkpoint`` under the run's checkpoint volume decides;
* the tasks: ``spec.tasks.heldOut`` of the manifest's tasks (all of them when it names none), or
  every task of ``--tasks DIR`` (``--format``, ``--task-list``) or ``--tasks builtin:<suite>``.

Locally, ``--sandboxes`` sandbox servers are started as ``wmrl run`` starts them
(:mod:`wmrl_trainer.services`: a ``spec.tasks.path`` directory mounted into them, so collection
tasks' data of any size reaches executions) and evaluation may use every slot; with ``--config`` it uses the
run's sandbox pool at ``spec.evaluation.maxConcurrent``, reports that as the pool's demand while
it runs (the autoscaler sizes the pool for it), and patches its result into the WMRLRun's
``status.progress`` (``heldOutReward`` when complete; ``heldOut`` with the report's path, or why
it is partial).

Output (``--out``, default ``./wmrl-eval/<name>/``; the mode-eval Job's:
``<checkpoint path>/evaluations/<run>/``): ``eval.json`` (the whole report), ``eval.md``,
``eval.png`` (percentile per task and category) and, when the checkpoint's run left its
evaluations beside it (``<checkpoints>/eval/step-*.json``), ``curve.png`` and the curve's table.

Exit codes: 0 complete; 1 partial (an execution failed on the sandbox side, or sampling raised:
the report says why and holds no figure as a result) or a service failed to start; 2 bad input,
naming the field or flag; 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Optional

from wmrl.api.runconfig import RunConfig, RunMetadata, Runtime, load_run_config, read_manifest
from wmrl.api.schema import WMRLRunSpec, field_errors
from wmrl.task_layouts import FORMATS
from wmrl.tasks import Task
from wmrl_trainer.checkpoint import COMPLETE, complete_checkpoints
from wmrl_trainer.eval_report import curves, curves_markdown, load_eval_points, plot_curves, plot_report, report_markdown

log = logging.getLogger("wmrl.eval")
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
SEED_OFFSET = 7919  # the evaluation seed is spec.algorithm.seed + this, as in runs (wmrl run, the trainer)
REPORT_JSON, REPORT_MD, REPORT_PNG, CURVE_PNG = "eval.json", "eval.md", "eval.png", "curve.png"
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")

# Which flag set which field: an error about the field names the flag too.
FLAG_FIELDS = {
    "--policy": "spec.policy.model", "--tasks": "spec.tasks", "--format": "spec.tasks.format",
    "--task-list": "spec.tasks.taskList", "--seed": "spec.algorithm.seed", "--samples": "spec.evaluation.samples",
    "--temperature": "spec.evaluation.temperature", "--turns": "spec.algorithm.maxTurns",
    "--max-new-tokens": "spec.policy.sampling.maxNewTokens",
}


@dataclass
class EvalPlan:
    """What one ``wmrl eval`` evaluates, decided from its inputs (:func:`plan`)."""

    config: RunConfig
    tasks: list[Task]
    tasks_source: str
    checkpoint: Optional[Path]  # None: the base policy spec.policy.model
    checkpoint_step: Optional[int]
    out: Path
    cluster: bool  # --config: the run's sandbox pool and status

    @property
    def seed(self) -> int:
        return self.config.spec.algorithm.seed + SEED_OFFSET


# ---------------------------------------------------------------- inputs (decide)

def _read_manifest(path: str) -> tuple[str, dict[str, Any]]:
    manifest = read_manifest(path)
    return str((manifest.get("metadata") or {}).get("name") or "eval"), dict(manifest.get("spec") or {})


def spec_with_flags(spec: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """``spec`` (wire form) with the command line's overrides (module docstring); pure."""
    spec = json.loads(json.dumps(spec))
    for section in ("policy", "tasks", "algorithm", "evaluation"):
        spec[section] = dict(spec.get(section) or {})
    if args.policy:
        spec["policy"]["model"] = args.policy
    if args.tasks:
        source = ({"builtin": args.tasks[len("builtin:"):]} if args.tasks.startswith("builtin:")
                  else {"path": str(Path(args.tasks).resolve())})
        spec["tasks"] = source
    if args.format or args.task_list:
        if "builtin" in spec["tasks"] or "configMap" in spec["tasks"]:
            raise ValueError("--format/--task-list: they apply to a task directory (--tasks DIR, or spec.tasks.path "
                             "or pvc), not a builtin suite or a ConfigMap")
        if args.format:
            spec["tasks"]["format"] = args.format
        if args.task_list:
            spec["tasks"]["taskList"] = str(Path(args.task_list).resolve())
    if args.seed is not None:
        spec["algorithm"]["seed"] = args.seed
    if args.turns is not None:
        spec["algorithm"]["maxTurns"] = args.turns
    if args.samples is not None:
        spec["evaluation"]["samples"] = args.samples
    if args.temperature is not None:
        spec["evaluation"]["temperature"] = args.temperature
    if args.max_new_tokens is not None:
        spec["policy"]["sampling"] = {**dict(spec["policy"].get("sampling") or {}), "maxNewTokens": args.max_new_tokens}
    return spec


def _named(errors: list[str], args: argparse.Namespace) -> list[str]:
    """Field errors, with the flag that set the field in front where one did."""
    given = {flag: field for flag, field in FLAG_FIELDS.items()
             if getattr(args, flag[2:].replace("-", "_"), None) is not None}
    out = []
    for error in errors:
        flag = next((f for f, field in given.items() if field in error), None)
        out.append(f"{flag} ({error})" if flag else error)
    return out


def _validated(spec: dict[str, Any], args: argparse.Namespace) -> WMRLRunSpec:
    from pydantic import ValidationError

    try:
        return WMRLRunSpec.model_validate(spec)
    except ValidationError as exc:
        raise ValueError("; ".join(_named(field_errors(exc), args))) from exc


def checkpoint_in(path: Path, what: str) -> tuple[Path, int]:
    """(directory, step) of a checkpoint folder, or of the newest complete one in a folder of them."""
    if not path.is_dir():
        raise ValueError(f"{what}: {path} is not a directory")
    if (path / COMPLETE).is_file():
        return path, int(json.loads((path / COMPLETE).read_text())["step"])
    found = complete_checkpoints(path)
    if found:
        step, newest = found[-1]
        return newest, step
    if any((path / name).is_file() for name in WEIGHT_FILES):  # saved weights without our marker (save_pretrained)
        return path, None  # type: ignore[return-value]
    raise ValueError(f"{what}: {path} holds no complete checkpoint (a step-NNNNNNNN folder with {COMPLETE}) "
                     "and no saved weights")


def _checkpoint(args: argparse.Namespace, config: RunConfig, cluster: bool) -> tuple[Optional[Path], Optional[int]]:
    if args.checkpoint == "base":
        return None, None
    if args.checkpoint:
        return checkpoint_in(Path(args.checkpoint).resolve(), "--checkpoint")
    if not cluster:
        return None, None  # the base policy; said at the start
    which, root = config.spec.evaluation.checkpoint, Path(config.runtime.checkpoint_dir)
    field = f"spec.evaluation.checkpoint ({which or 'newest'} under {root})"
    if which == "base":
        return None, None
    if which:
        path = root / which
        if not (path / COMPLETE).is_file():
            raise ValueError(f"{field}: {path} is not a complete checkpoint")
        return path, int(json.loads((path / COMPLETE).read_text())["step"])
    found = complete_checkpoints(root)
    if not found:
        raise ValueError(f"{field}: no complete checkpoint there (set checkpoint: base to evaluate the base policy)")
    return found[-1][1], found[-1][0]


def select_tasks(tasks: list[Task], held_out: list[str]) -> list[Task]:
    """The tasks evaluated: those of ``tasks`` that ``held_out`` names when it names any (in the order of
    ``tasks``, as a run's held-out split keeps them: the order decides which samples each task gets), else all."""
    if not held_out:
        return list(tasks)
    names = {t.name for t in tasks}
    unknown = [n for n in held_out if n not in names]
    if unknown:
        raise ValueError(f"spec.tasks.heldOut: unknown task(s) {unknown}; tasks are {sorted(names)}")
    return [t for t in tasks if t.name in held_out]


def _tasks_source(spec: WMRLRunSpec) -> str:
    t = spec.tasks
    source = (f"builtin {t.builtin}" if t.builtin else f"path {t.path}" if t.path else f"pvc {t.pvc}" if t.pvc
              else f"configMap {t.config_map}")
    return source + (f", held out: {', '.join(t.held_out)}" if t.held_out else "")


def plan(args: argparse.Namespace) -> EvalPlan:
    """Decide what to evaluate from the command line (module docstring); ValueError naming the field or flag."""
    from wmrl_trainer.build import check_policy_turns
    from wmrl_trainer.services import local_tasks_dir
    from wmrl_trainer.tasks import load_tasks

    if args.file and args.config:
        raise ValueError("give a WMRLRun manifest or --config, not both")
    for flag, value in (("--sandboxes", args.sandboxes), ("--threads", args.threads)):
        if value is not None and value < 1:
            raise ValueError(f"{flag} must be >= 1, got {value}")
    cluster = bool(args.config)
    if cluster:
        try:
            rendered = load_run_config(args.config)
        except Exception as exc:  # OSError, YAML, validation: the file is the input that is wrong
            raise ValueError(f"--config: {args.config}: {exc}") from exc
        name, spec, metadata, runtime = (rendered.metadata.name, rendered.spec.to_wire(), rendered.metadata,
                                         rendered.runtime)
    else:
        if args.file:
            name, spec = _read_manifest(args.file)
        else:
            if not args.policy:
                raise ValueError("--policy: name the policy to evaluate (a Hugging Face id, a directory, "
                                 "builtin:<name>), or give a WMRLRun manifest")
            if not args.tasks:
                raise ValueError("--tasks: name the tasks to evaluate on (a directory, or builtin:<suite>), "
                                 "or give a WMRLRun manifest")
            name, spec = "eval", {"policy": {"model": args.policy, "rolloutEngine": "transformers"},
                                  "tasks": {}, "algorithm": {"maxTurns": 1}, "trainer": {"gpusPerNode": 0}}
        metadata, runtime = RunMetadata(name=name), Runtime(patch_status=False, metrics_port=None)
    validated = _validated(spec_with_flags(spec, args), args)
    if args.tasks:
        validated = validated.model_copy(update={"tasks": validated.tasks.model_copy(update={"held_out": []})})
    check_policy_turns(validated.policy.model, validated.algorithm.max_turns)
    config = RunConfig(metadata=metadata, spec=validated, runtime=runtime)
    if not cluster:  # the local sandboxes mount a task directory as wmrl run's do (collection data, any size)
        tasks_dir = local_tasks_dir(config, args.sandbox_isolation)
        runtime = runtime.model_copy(update={"tasks_dir": tasks_dir, "sandbox_mounts_tasks": tasks_dir is not None})
        config = config.model_copy(update={"runtime": runtime})
    checkpoint, step = _checkpoint(args, config, cluster)
    tasks = select_tasks(load_tasks(validated.tasks, runtime), validated.tasks.held_out)
    if args.out:
        out = Path(args.out)
    elif cluster:
        out = Path(runtime.checkpoint_dir) / "evaluations" / name
    else:
        out = Path("wmrl-eval") / name
    return EvalPlan(config, tasks, _tasks_source(validated), checkpoint, step, out.resolve(), cluster)


# ---------------------------------------------------------------- the policy (act)

def load_evaluated_policy(model: str, checkpoint: Optional[Path], scripts: Optional[str] = None) -> tuple[Any, Any]:
    """(model, tokenizer): ``model`` as it is, or with ``checkpoint``'s weights (what the trainer saved there:
    transformers' ``save_model``, the tokenizer beside it). A builtin policy keeps its own tokenizer and
    generation settings; an FSDP run's sharded checkpoint has no whole weights and is refused.
    ``scripts``: ``spec.policy.scripts`` (``builtin:fixed-scripts``)."""
    from wmrl_trainer.policy import load_policy

    if checkpoint is None:
        return load_policy(model, scripts=scripts)
    if not any((checkpoint / name).is_file() for name in WEIGHT_FILES):
        raise ValueError(f"--checkpoint: {checkpoint} has no whole weights ({', '.join(WEIGHT_FILES[::2])}); an FSDP "
                         "run's sharded checkpoint cannot be evaluated by wmrl eval yet")
    if model.startswith("builtin:"):
        base, tokenizer = load_policy(model, scripts=scripts)
        trained = type(base).from_pretrained(str(checkpoint))
        trained.generation_config = base.generation_config
        return trained, tokenizer
    return load_policy(str(checkpoint))


# ---------------------------------------------------------------- the report and the status (decide)

def report_of(point: dict[str, Any], evaluation: EvalPlan, policy: str) -> dict[str, Any]:
    """The evaluation's report: the evaluator's figures and what was evaluated, how."""
    spec = evaluation.config.spec
    return {
        "run": evaluation.config.metadata.name,
        "policy": policy,
        "checkpoint": str(evaluation.checkpoint) if evaluation.checkpoint else None,
        "checkpoint_step": evaluation.checkpoint_step,
        "tasks_source": evaluation.tasks_source,
        "samples_per_task": spec.evaluation.samples,
        "temperature": spec.evaluation.temperature,
        "max_turns": spec.algorithm.max_turns,
        "seed": spec.algorithm.seed,
        "evaluation_seed": evaluation.seed,
        "created": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        **point,
    }


def status_progress(report: Optional[dict[str, Any]], step: Optional[int], demand: int, path: Optional[str]) -> Any:
    """``status.progress`` of a mode-eval run: while evaluating (``report`` None) the pool's demand; after,
    ``heldOutReward`` (complete only) and ``heldOut`` (the report, or why it is partial)."""
    from wmrl.api.schema import HeldOutProgress, Progress

    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    if report is None:
        return Progress(step=step or 0, sandbox_demand=demand, updated_at=stamp)
    complete = bool(report["complete"])
    held = HeldOutProgress(step=step if complete else None, samples=report["samples"] if complete else None,
                           partial=None if complete else f"checkpoint step {step}: {report['partial']}",
                           evaluations=1, executions=int(report.get("executed") or 0),
                           seconds=round(float(report.get("eval_seconds") or 0.0), 3), report=path)
    return Progress(step=step or 0, held_out_reward=report["reward"] if complete else None, held_out=held,
                    sandbox_demand=0, updated_at=stamp)


# ---------------------------------------------------------------- running it (act)

def evaluate(evaluation: EvalPlan, dispatcher: Any, max_concurrent: int, progress: bool = True,
             threads: Optional[int] = None) -> dict[str, Any]:
    """Load the policy, evaluate it through ``dispatcher`` and return the report (nothing written)."""
    import torch

    from wmrl_trainer.evaluation import HeldOutEvaluator

    spec = evaluation.config.spec
    if spec.policy.model.startswith("builtin:") and not torch.cuda.is_available():
        torch.set_num_threads(threads or 1)  # as wmrl run: the tiny model, the cores go to the sandboxes
    elif threads:
        torch.set_num_threads(threads)
    model, tokenizer = load_evaluated_policy(spec.policy.model, evaluation.checkpoint, spec.policy.scripts)
    if torch.cuda.is_available():
        model = model.to("cuda")
    evaluator = HeldOutEvaluator(evaluation.tasks, dispatcher, spec.evaluation.samples, seed=evaluation.seed,
                                 max_turns=spec.algorithm.max_turns, max_tokens=spec.algorithm.max_trajectory_tokens,
                                 max_concurrent=max_concurrent, cache={})
    sampling = spec.policy.sampling.model_copy(update={"temperature": spec.evaluation.temperature})
    bar = None
    on_graded: Optional[Callable[[int], None]] = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(evaluation.tasks) * spec.evaluation.samples * spec.algorithm.max_turns,
                   desc=f"eval {evaluation.config.metadata.name}", unit="turn", dynamic_ncols=True)
        on_graded = bar.update
    try:
        point = evaluator.evaluate(model, tokenizer, sampling, on_graded=on_graded)
    finally:
        if bar is not None:
            bar.close()
    return report_of(point, evaluation, spec.policy.model)


def write_report(report: dict[str, Any], out: Path) -> dict[str, str]:
    """eval.json, eval.md, eval.png and, when the checkpoint's run left its evaluations beside it, its
    curve (curve.png, and the table in eval.md); returns what was written, by kind."""
    from wmrl_trainer.services import write_json_atomic

    out.mkdir(parents=True, exist_ok=True)
    written = {"json": str(out / REPORT_JSON), "markdown": str(out / REPORT_MD), "plot": str(out / REPORT_PNG)}
    write_json_atomic(out / REPORT_JSON, report)
    text = report_markdown(report)
    plot_report(report, out / REPORT_PNG)
    run_reports = Path(report["checkpoint"]).parent / "eval" if report.get("checkpoint") else None
    if run_reports is not None and run_reports.is_dir():
        try:
            curve = curves(load_eval_points(run_reports))
        except ValueError as exc:
            log.warning("the run's held-out reports in %s are not drawn: %s", run_reports, exc)
        else:
            if curve["steps"]:
                plot_curves(curve, out / CURVE_PNG, f"{report['run']}: held-out leaderboard percentile over training")
                written["curve"] = str(out / CURVE_PNG)
                text += f"\n## The run's held-out evaluations ({run_reports})\n\n![curve]({CURVE_PNG})\n\n" + \
                    curves_markdown(curve)
    (out / REPORT_MD).write_text(text)
    return written


def _patch(patcher: Any, progress: Any) -> None:
    if patcher is not None:
        patcher.patch(progress)  # logs and counts its own failures: status never stops an evaluation


# ---------------------------------------------------------------- CLI

def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", nargs="?", help="a WMRLRun manifest (YAML), as for wmrl run")
    parser.add_argument("--config", metavar="FILE", help="a rendered run config (the mode-eval Job's "
                        "/etc/wmrl/run.yaml): its sandbox pool, volumes and status")
    parser.add_argument("--checkpoint", metavar="DIR", help="a checkpoint folder (step-NNNNNNNN) or a folder of them "
                        "(the newest complete one); 'base': the policy as it is (default, without --config)")
    parser.add_argument("--policy", metavar="MODEL", help="the policy (Hugging Face id, directory, builtin:<name>); "
                        "default spec.policy.model")
    parser.add_argument("--tasks", metavar="DIR", help="evaluate on every task of DIR (or builtin:<suite>) instead "
                        "of the manifest's held-out tasks")
    parser.add_argument("--format", choices=FORMATS, help="layout of --tasks DIR (default auto)")
    parser.add_argument("--task-list", metavar="FILE", help="only the tasks named in FILE (one a line)")
    parser.add_argument("--seed", type=int, help="spec.algorithm.seed (the evaluation samples with seed + 7919)")
    parser.add_argument("--samples", type=int, metavar="G", help="trajectories per task, avg@G "
                        "(default spec.evaluation.samples)")
    parser.add_argument("--temperature", type=float, help="sampling temperature (default spec.evaluation.temperature)")
    parser.add_argument("--turns", type=int, metavar="K", help="turns per trajectory (default spec.algorithm.maxTurns; "
                        "1 without a manifest)")
    parser.add_argument("--max-new-tokens", type=int, metavar="N", help="tokens per turn "
                        "(default spec.policy.sampling.maxNewTokens)")
    parser.add_argument("--out", metavar="DIR", help="report folder (default ./wmrl-eval/<name>/)")
    parser.add_argument("--sandboxes", type=int, default=os.cpu_count() or 1,
                        help="local sandbox servers (default: one per core; not with --config)")
    parser.add_argument("--sandbox-isolation", choices=("namespaces", "restricted"), default="namespaces",
                        help="the local sandbox servers' --isolation (as for wmrl run)")
    parser.add_argument("--threads", type=int, metavar="N", help="torch CPU threads (default: 1 for builtin policies "
                        "on CPU, else torch's default)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def main(args: argparse.Namespace) -> int:
    from wmrl_trainer.services import quiet_libraries

    logging.basicConfig(level=os.environ.get("WMRL_LOG_LEVEL", "WARNING"), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    quiet_libraries()
    try:
        evaluation = plan(args)
    except ValueError as exc:
        print(f"wmrl eval: {exc}", file=sys.stderr)
        return EXIT_USAGE
    what = f"checkpoint {evaluation.checkpoint}" if evaluation.checkpoint else "the base policy (no checkpoint)"
    print(f"wmrl eval: {evaluation.config.spec.policy.model}, {what}, on {len(evaluation.tasks)} task(s); "
          f"report in {evaluation.out}", flush=True)
    try:
        report = _run(evaluation, args)
    except KeyboardInterrupt:
        print("wmrl eval: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except ValueError as exc:
        print(f"wmrl eval: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except RuntimeError as exc:  # a local service that would not start (ServiceStartError)
        print(f"wmrl eval: {exc}", file=sys.stderr)
        return EXIT_FAILED
    summary = {k: report.get(k) for k in ("run", "policy", "checkpoint", "complete", "partial", "reward")}
    summary["percentile"] = (report.get("overall") or {}).get("percentile")
    summary.update(report=str(evaluation.out / REPORT_JSON), markdown=str(evaluation.out / REPORT_MD))
    print(json.dumps(summary), flush=True)
    if not report["complete"]:
        print(f"wmrl eval: partial evaluation, no result: {report['partial']}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


def _run(evaluation: EvalPlan, args: argparse.Namespace) -> dict[str, Any]:
    """Start or reach the sandboxes, evaluate, write the report (and, in a cluster, the status)."""
    spec = evaluation.config.spec
    started = time.perf_counter()
    if evaluation.cluster:
        from wmrl_trainer.build import build_dispatcher
        from wmrl_trainer.progress import StatusPatcher

        patcher = None
        if evaluation.config.runtime.patch_status:
            try:
                patcher = StatusPatcher(evaluation.config.metadata.name, evaluation.config.metadata.namespace)
            except Exception as exc:  # no API access: the report on the volume is the result
                log.warning("status reporting disabled: %s", exc)
        limit = spec.evaluation.max_concurrent
        _patch(patcher, status_progress(None, evaluation.checkpoint_step, limit, None))
        dispatcher = build_dispatcher(evaluation.config)
        try:
            report = evaluate(evaluation, dispatcher, limit, progress=not args.no_progress, threads=args.threads)
        finally:
            dispatcher.close()
        report["wall_seconds"] = time.perf_counter() - started
        write_report(report, evaluation.out)
        _patch(patcher, status_progress(report, evaluation.checkpoint_step, 0, str(evaluation.out / REPORT_JSON)))
        return report
    from wmrl_sandbox.dispatcher import SandboxDispatcher, StaticEndpoints
    from wmrl_trainer.build import mounted_tasks_dir
    from wmrl_trainer.services import LocalServices

    runtime = evaluation.config.runtime
    with LocalServices(args.sandboxes, evaluation.out / "logs", slots=spec.sandbox.slots_per_pod,
                       isolation=args.sandbox_isolation, tasks_dir=runtime.tasks_dir) as services:
        print(f"wmrl eval: sandboxes: {services.sandbox_isolation()}", flush=True)
        if runtime.tasks_dir:
            print(f"wmrl eval: task data: {runtime.tasks_dir} mounted into the sandboxes; each execution sees only "
                  "its task's public directory (at data/)", flush=True)
        dispatcher = SandboxDispatcher(StaticEndpoints(services.sandbox_urls), slots_per_pod=spec.sandbox.slots_per_pod,
                                       timeout=spec.sandbox.timeout_seconds + 30, tasks_dir=mounted_tasks_dir(runtime))
        try:
            report = evaluate(evaluation, dispatcher, len(services.sandbox_urls) * spec.sandbox.slots_per_pod,
                              progress=not args.no_progress, threads=args.threads)
        finally:
            dispatcher.close()
    report["wall_seconds"] = time.perf_counter() - started
    write_report(report, evaluation.out)
    return report
