"""``wmrl eval world-model``: measure a world model on a fidelity case file.

    wmrl eval world-model --cases CASES --world-model SPEC [--out DIR] [--few-shot FILE]

``--cases``: a case file (:mod:`.cases`), or a run's case directory (``<checkpoint
dir>/fidelity/``: ``cases.jsonl`` and its rotated copies), repeatable. ``--world-model``: a
backend name (``learned``, ``llm``, ``transformers``), an inline YAML/JSON mapping of
``spec.worldModel`` (``'{backend: llm, endpoint: http://127.0.0.1:8000/v1}'``), or a YAML file
holding one, or a whole WMRLRun manifest (its ``spec.worldModel``).

Each case is graded alone (:mod:`.measure`) and the report (``fidelity.json``,
``fidelity.md``, ``confusion.png``, ``reliability.png``, ``predictions-<arm>.jsonl``) goes to
``--out``. ``--few-shot FILE`` curates examples from the cases (:mod:`.curate`; from
``--few-shot-from`` instead when given) into FILE, leaves the cases they show out of the
measurement, and measures the world model without and with them (``spec.worldModel.fewShot``);
the learned judge has no prompt, so it is measured once and the report says so.

Exit codes: 0 measured; 1 the world model graded none of the cases it was asked about (a server
down, every answer unparsable), the report is still written; 2 bad input (a case line, the
spec, an option), naming the file and line or the field.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

import yaml
from pydantic import ValidationError

from wmrl.api.schema import FewShotSpec, WorldModelSpec, field_errors
from wmrl_trainer.few_shot import FewShotFormatError, write_examples
from wmrl_trainer.fidelity.cases import Case, CaseFormatError, read_cases
from wmrl_trainer.fidelity.curate import DEFAULT_MAX_EXAMPLES, curate
from wmrl_trainer.fidelity.measure import measure
from wmrl_trainer.fidelity.metrics import summarize
from wmrl_trainer.fidelity.plots import plot_confusion, plot_reliability
from wmrl_trainer.fidelity.report import markdown

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
BACKENDS = ("learned", "llm", "transformers")
PROG = "wmrl eval world-model"


class UsageError(ValueError):
    """Bad input; the message names the option or field."""


def world_model_spec(text: str) -> WorldModelSpec:
    """``--world-model``: a backend name, an inline YAML mapping, or a YAML file (a worldModel spec or a manifest)."""
    if text in BACKENDS:
        data: Any = {"backend": text}
    elif Path(text).is_file():
        try:
            data = yaml.safe_load(Path(text).read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise UsageError(f"--world-model: {text}: {exc}") from exc
        if isinstance(data, dict) and data.get("kind") == "WMRLRun":
            data = (data.get("spec") or {}).get("worldModel") or {}
    else:
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise UsageError(f"--world-model: not a backend, a file or a YAML mapping ({exc})") from exc
    if not isinstance(data, dict):
        raise UsageError(f"--world-model: {text!r} is none of: a backend ({', '.join(BACKENDS)}), a YAML file, an "
                         "inline YAML mapping of spec.worldModel")
    backend = data.get("backend", "llm")
    if backend not in BACKENDS:
        raise UsageError(f"--world-model: backend {backend!r} is not one of {', '.join(BACKENDS)}")
    try:
        return WorldModelSpec.model_validate(data)
    except ValidationError as exc:
        lines = [line.replace("spec.", "spec.worldModel.", 1) if line.startswith("spec.") else line
                 for line in field_errors(exc)]
        raise UsageError("--world-model: " + "; ".join(lines)) from exc


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cases", action="append", required=True, metavar="FILE",
                        help="a case file, or a run's <checkpoint dir>/fidelity/ directory (repeatable)")
    parser.add_argument("--world-model", required=True, metavar="SPEC",
                        help="learned | llm | transformers, an inline YAML mapping of spec.worldModel "
                             "('{backend: llm, endpoint: URL}'), or a YAML file (spec.worldModel or a WMRLRun manifest)")
    parser.add_argument("--out", metavar="DIR", help="report folder (default ./wmrl-results/fidelity-<backend>/)")
    parser.add_argument("--few-shot", metavar="FILE",
                        help="curate few-shot examples into FILE and measure without and with them")
    parser.add_argument("--few-shot-from", action="append", metavar="FILE",
                        help="curate from these cases instead of --cases (repeatable)")
    parser.add_argument("--few-shot-max", type=int, default=DEFAULT_MAX_EXAMPLES, metavar="N",
                        help=f"at most N examples (default {DEFAULT_MAX_EXAMPLES})")
    parser.add_argument("--concurrency", type=int, metavar="N",
                        help="cases graded at once (default: 8 for llm, 1 otherwise)")
    parser.add_argument("--limit", type=int, metavar="N", help="measure the first N cases only")
    parser.add_argument("--seed", type=int, default=0, help="the learned judge's seed / transformers' sampling seed")
    parser.add_argument("--checkpoint", metavar="DIR",
                        help="learned backend: a run checkpoint (step-N folder) whose learned world-model state to "
                             "load (a learnOnline run's corrected judge)")


def _check_options(args: argparse.Namespace, spec: WorldModelSpec) -> None:
    if args.few_shot_max < 1:
        raise UsageError(f"--few-shot-max: must be >= 1, got {args.few_shot_max}")
    if args.concurrency is not None and args.concurrency < 1:
        raise UsageError(f"--concurrency: must be >= 1, got {args.concurrency}")
    if args.limit is not None and args.limit < 1:
        raise UsageError(f"--limit: must be >= 1, got {args.limit}")
    if args.few_shot_from and not args.few_shot:
        raise UsageError("--few-shot-from: needs --few-shot FILE (where the curated examples go)")
    if args.checkpoint and spec.backend != "learned":
        raise UsageError("--checkpoint: only the learned backend has a state to load")


def _build(spec: WorldModelSpec, seed: int, checkpoint: Optional[str]) -> Any:
    from wmrl_trainer.world_model import build_world_model

    try:
        world_model = build_world_model(spec, None, seed=seed)
    except (ValueError, FewShotFormatError) as exc:
        raise UsageError(f"--world-model: {exc}") from exc
    if checkpoint:
        _load_state(world_model, Path(checkpoint))
    return world_model


def _load_state(world_model: Any, checkpoint: Path) -> None:
    import torch

    from wmrl_trainer.checkpoint import WORLD_MODEL_STATE

    path = checkpoint / WORLD_MODEL_STATE
    if not path.is_file():
        raise UsageError(f"--checkpoint: {path} does not exist (a step-N folder of a run with the learned backend)")
    try:
        world_model.load_state_dict(torch.load(path, weights_only=False))
    except (ValueError, KeyError) as exc:
        raise UsageError(f"--checkpoint: {path}: {exc}") from exc


def _arm(name: str, world_model: Any, cases: Sequence[Case], concurrency: int, out: Path,
         few_shot: Optional[str]) -> dict[str, Any]:
    try:
        measured = measure(world_model, cases, concurrency)
    finally:
        close = getattr(world_model, "close", None)
        if callable(close):
            close()
    slug = name.replace(" ", "-")
    predictions = out / f"predictions-{slug}.jsonl"
    predictions.write_text("".join(json.dumps(row) + "\n" for row in measured.rows))
    return {"name": name, "few_shot": few_shot, "summary": summarize(measured.judged), "stats": measured.stats,
            "seconds": round(measured.seconds, 3), "predictions": predictions.name}


def _concurrency(args: argparse.Namespace, spec: WorldModelSpec) -> int:
    return args.concurrency or (8 if spec.backend == "llm" else 1)


def run(args: argparse.Namespace) -> tuple[int, dict[str, Any], Path]:
    """Measure; (exit code, JSON report, report folder). Raises UsageError, CaseFormatError on bad input."""
    spec = world_model_spec(args.world_model)
    _check_options(args, spec)
    cases = read_cases(args.cases)
    out = Path(args.out or Path("wmrl-results") / f"fidelity-{spec.backend}").resolve()
    out.mkdir(parents=True, exist_ok=True)
    notes: list[str] = []
    excluded = 0
    arms_spec: list[tuple[str, WorldModelSpec, Optional[str]]] = [("as specified", spec, None)]
    if args.few_shot:
        source = read_cases(args.few_shot_from) if args.few_shot_from else cases
        picked = curate(source, args.few_shot_max)
        if not picked:
            raise UsageError("--few-shot: no case to curate from (every case is valid-free and failure-free, or "
                             "decided by the compile gate)")
        path = write_examples(args.few_shot, [example for _, example in picked])
        shown = {(c.task.name, c.code) for c, _ in picked}
        kept = [c for c in cases if (c.task.name, c.code) not in shown]
        excluded, cases = len(cases) - len(kept), kept
        notes.append(f"few-shot: {len(picked)} examples curated into {path} ("
                     + ", ".join(example.kind or "?" for _, example in picked) + ")"
                     + (f"; the {excluded} case(s) showing their scripts are left out of every arm" if excluded else ""))
        without = spec.model_copy(update={"few_shot": FewShotSpec()})
        if spec.backend == "learned":
            notes.append("few-shot: the learned judge has no prompt, so examples change nothing for it: measured once, "
                         "without (spec.worldModel.fewShot is refused for the learned backend)")
            arms_spec = [("without few-shot", without, None)]
        else:
            arms_spec = [("without few-shot", without, None),
                         ("with few-shot", spec.model_copy(update={"few_shot": FewShotSpec(path=str(path))}), str(path))]
    elif spec.few_shot.given:
        notes.append("few-shot: the spec's own examples (spec.worldModel.fewShot) are in the prompt")
    if args.limit:
        cases = cases[: args.limit]
    if not cases:
        raise UsageError("--cases: no case left to measure (every case was curated as a few-shot example)")
    if args.checkpoint:
        notes.append(f"learned judge: state loaded from {args.checkpoint}")
    arms = [_arm(name, _build(arm_spec, args.seed, args.checkpoint), cases, _concurrency(args, spec), out, few_shot)
            for name, arm_spec, few_shot in arms_spec]
    title = f"{spec.backend} world model on {len(cases)} cases"
    plots = {"confusion": plot_confusion(arms, out / "confusion.png", title).name,
             "reliability": plot_reliability(arms, out / "reliability.png", title).name}
    report = {"backend": spec.backend, "world_model": spec.to_wire(), "world_model_text": args.world_model,
              "case_files": [str(p) for p in args.cases], "cases": len(cases), "excluded": excluded,
              "seed": args.seed, "arms": arms, "plots": plots, "notes": notes}
    (out / "fidelity.json").write_text(json.dumps(report, indent=1, default=float) + "\n")
    (out / "fidelity.md").write_text(markdown(report))
    return (EXIT_FAILED if any(map(_graded_nothing, arms)) else EXIT_OK), report, out


def _graded_nothing(arm: dict[str, Any]) -> bool:
    """Whether the world model graded none of the cases it was asked about (the compile gate's aside)."""
    s = arm["summary"]
    return s["cases"] > s["gated"] and s["graded"] == s["gated"]


def main(args: argparse.Namespace) -> int:
    logging.basicConfig(level=os.environ.get("WMRL_LOG_LEVEL", "WARNING"), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        code, report, out = run(args)
    except (UsageError, CaseFormatError, FewShotFormatError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except RuntimeError as exc:  # e.g. a server that constrains its output under no guided mode
        print(f"{PROG}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    print(f"{PROG}: report in {out} (fidelity.md, fidelity.json, confusion.png, reliability.png)", flush=True)
    for arm in report["arms"]:
        s = arm["summary"]
        if _graded_nothing(arm):
            print(f"{PROG}: {arm['name']}: the world model graded none of the {s['cases'] - s['gated']} cases it was "
                  f"asked about (counters: {arm['stats']})", file=sys.stderr)
    headline = {a["name"]: {k: a["summary"][k] for k in ("cases", "graded", "ungraded", "status_at_1", "status_at_2")}
                | {"reward_mae": a["summary"]["reward"]["all"]["mae"], "reward_bias": a["summary"]["reward"]["all"]["bias"],
                   "exception_match": a["summary"]["exception_match"]["rate"],
                   "latency_p50_s": a["summary"]["latency"]["p50"]}
                for a in report["arms"]}
    print(json.dumps({"backend": report["backend"], "cases": report["cases"], "arms": headline,
                      "report": str(out / "fidelity.md")}), flush=True)
    return code

