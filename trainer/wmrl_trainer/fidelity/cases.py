"""The fidelity case file: one real outcome per JSON line, with what a world model needs to predict it.

Anchors write it during training (:mod:`wmrl_trainer.fidelity.recorder`); ``wmrl eval
world-model --cases`` reads it. One line per executed anchor script (per turn, with several
turns)::

    {"version": 1, "task": "iris", "code": "import pandas as pd\\n...",
     "history": [["<earlier script>", "<what the agent saw after it>"], ...],
     "real": {"status": "runtime_err", "error_type": "NameError", "error_line": 7, "rank_score": null,
              "reward": 0.1, "feedback": "Traceback ..."},
     "world_model": {"status": "valid", "quality_bucket": "mid", "reward": 0.725, ...},
     "task_context": {"name": "iris", "kind": "classification", "metric": "accuracy", "metric_text": "accuracy",
                      "description": ..., "contract": ..., "target": ..., "id_column": "id",
                      "submission": "submission.csv", "leaderboard": [...], "higher_is_better": true},
     "source": {"run": "quickstart", "step": 3, "group": 1, "row": 4, "turn": 1}}

Required: ``task``, ``code``, ``real`` (``status``; for a valid run ``rank_score``, its
leaderboard position in [0, 1], or ``reward``; ``error_type`` names a failure's exception
class) and ``task_context`` (what the world-model prompt shows of the task:
:func:`wmrl_trainer.prompts.task_context`, so a case grades without the task's data and gives
the prompt the run's world model saw). Optional: ``history`` (earlier turns, oldest first),
``world_model`` (what the run's world model predicted, as the trajectory logs write an
outcome; null when it did not grade the script), ``source``. Keys are snake_case like the
trajectory logs'. A line that breaks these rules is refused naming the file, the line and
the field (:class:`CaseFormatError`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

from pydantic import ValidationError

from wmrl.outcome import VALID_BASE, VALID_SPAN, Outcome, Status
from wmrl.tasks import Task
from wmrl_trainer.json_lines import json_lines
from wmrl_trainer.prompts import CONTEXT_FIELDS, PromptTask, context_task, task_context
from wmrl_trainer.trajectory_log import outcome_json

CASE_VERSION = 1
CASE_FILE = "cases.jsonl"
FEEDBACK_CHARS = 2000
"""Real feedback kept per case (the sandbox's output, tail kept: a traceback ends there)."""
KINDS = ("classification", "regression")


class CaseFormatError(ValueError):
    """A case file that cannot be read; the message names the file, the line and the field."""


@dataclass(frozen=True)
class Case:
    """One case: ``item`` is what a world model grades, ``real`` what really happened."""

    task: PromptTask
    code: str
    real: Outcome
    history: tuple[tuple[str, str], ...] = ()
    world_model: Optional[dict[str, Any]] = None
    source: dict[str, Any] = field(default_factory=dict)
    where: str = ""
    """File and line it was read from (empty for a case built in memory)."""

    @property
    def item(self) -> tuple[Task, str, tuple[tuple[str, str], ...]]:
        return (self.task, self.code, self.history)


def _tail(text: str, limit: int) -> str:
    return text if len(text) <= limit else "..." + text[-(limit - 3):]


def real_json(outcome: Outcome) -> dict[str, Any]:
    """A real outcome as a case holds it."""
    return {"status": outcome.status.value, "error_type": outcome.error_type, "error_line": outcome.error_line,
            "rank_score": outcome.rank_score, "reward": outcome.reward,
            "feedback": _tail(outcome.feedback or "", FEEDBACK_CHARS)}


def case_json(task: Task, code: str, real: Outcome, *, history: Sequence[tuple[str, str]] = (),
              world_model: Optional[Outcome] = None, source: Optional[dict[str, Any]] = None,
              context: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """One case line (the module docstring): ``context`` is ``task_context(task)`` when the caller has it."""
    return {"version": CASE_VERSION, "task": task.name, "code": code,
            "history": [[str(c), str(o)] for c, o in history], "real": real_json(real),
            "world_model": outcome_json(world_model), "task_context": context or task_context(task),
            "source": dict(source or {})}


# ---------------------------------------------------------------- reading

def _need(data: dict, key: str, kind: type | tuple[type, ...], where: str, prefix: str = "") -> Any:
    """``data[key]``, which must be of ``kind`` (a bool is not a number here)."""
    if key not in data:
        raise CaseFormatError(f"{where}: {prefix}{key}: missing")
    value, kinds = data[key], kind if isinstance(kind, tuple) else (kind,)
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        raise CaseFormatError(f"{where}: {prefix}{key}: expected {' or '.join(k.__name__ for k in kinds)}, "
                              f"got {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        raise CaseFormatError(f"{where}: {prefix}{key}: {value!r} is not a finite number")
    return value


def _optional(data: dict, key: str, kind: type | tuple[type, ...], where: str, prefix: str = "") -> Any:
    return None if data.get(key) is None else _need(data, key, kind, where, prefix)


def _context(data: dict, task_name: str, where: str) -> PromptTask:
    context = _need(data, "task_context", dict, where)
    for key, kind in CONTEXT_FIELDS.items():
        _need(context, key, kind, where, "task_context.")
    if context["name"] != task_name:
        raise CaseFormatError(f"{where}: task_context.name: {context['name']!r} is not the case's task {task_name!r}")
    if context["kind"] not in KINDS:
        raise CaseFormatError(f"{where}: task_context.kind: {context['kind']!r} is not one of {list(KINDS)}")
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
               for x in context["leaderboard"]):
        raise CaseFormatError(f"{where}: task_context.leaderboard: expected a list of finite numbers")
    return context_task(context)


def _real(data: dict, where: str) -> Outcome:
    real = _need(data, "real", dict, where)
    status_text = _need(real, "status", str, where, "real.")
    try:
        status = Status(status_text)
    except ValueError:
        raise CaseFormatError(f"{where}: real.status: {status_text!r} is not one of {[s.value for s in Status]}") from None
    rank = _optional(real, "rank_score", (int, float), where, "real.")
    reward = _optional(real, "reward", (int, float), where, "real.")
    error_type = _optional(real, "error_type", str, where, "real.")
    line = _optional(real, "error_line", int, where, "real.")
    feedback = _optional(real, "feedback", str, where, "real.") or ""
    if status is Status.VALID and rank is None:
        if reward is None:
            raise CaseFormatError(f"{where}: real.rank_score: a valid case needs its leaderboard position "
                                  "(rank_score in [0, 1]) or its reward")
        rank = (reward - VALID_BASE) / VALID_SPAN
    if rank is not None and not (math.isfinite(rank) and 0.0 <= rank <= 1.0):
        raise CaseFormatError(f"{where}: real.rank_score: {rank!r} is not in [0, 1]")
    try:
        outcome = Outcome(status=status, error_type=error_type if status is not Status.VALID else None,
                          error_line=line if status is not Status.VALID else None,
                          rank_score=rank if status is Status.VALID else None, feedback=feedback)
    except ValidationError as exc:
        error = exc.errors()[0]
        raise CaseFormatError(f"{where}: real.{'.'.join(map(str, error['loc'])) or 'status'}: {error['msg']}") from exc
    if reward is not None and abs(reward - outcome.reward) > 1e-6:
        raise CaseFormatError(f"{where}: real.reward: {reward!r} does not match real.status {status.value}"
                              + (f" with rank_score {rank!r}" if status is Status.VALID else "")
                              + f" (the ladder gives {outcome.reward!r})")
    return outcome


def _history(data: dict, where: str) -> tuple[tuple[str, str], ...]:
    history = data.get("history") or []
    if not isinstance(history, list):
        raise CaseFormatError(f"{where}: history: expected a list of [script, observation] pairs")
    for n, turn in enumerate(history):
        if not (isinstance(turn, list) and len(turn) == 2 and all(isinstance(x, str) for x in turn)):
            raise CaseFormatError(f"{where}: history[{n}]: expected [script, observation] (two strings)")
    return tuple((c, o) for c, o in history)


def parse_case(data: Any, where: str) -> Case:
    """One case from its JSON object; :class:`CaseFormatError` naming ``where`` and the field."""
    if not isinstance(data, dict):
        raise CaseFormatError(f"{where}: a case is a JSON object, got {type(data).__name__}")
    version = data.get("version", CASE_VERSION)
    if version != CASE_VERSION:
        raise CaseFormatError(f"{where}: version: {version!r}, this wmrl reads version {CASE_VERSION}")
    task_name = _need(data, "task", str, where)
    code = _need(data, "code", str, where)
    return Case(task=_context(data, task_name, where), code=code, real=_real(data, where),
                history=_history(data, where), world_model=_optional(data, "world_model", dict, where),
                source=_optional(data, "source", dict, where) or {}, where=where)


def case_files(path: str | Path) -> list[Path]:
    """A case file, or every case file of a directory (``cases.jsonl`` and its rotated copies, oldest first)."""
    path = Path(path)
    if not path.is_dir():
        return [path]
    rotated = sorted((p for p in path.glob(CASE_FILE + ".*") if p.suffix[1:].isdigit()),
                     key=lambda p: -int(p.suffix[1:]))
    found = rotated + ([path / CASE_FILE] if (path / CASE_FILE).is_file() else [])
    if not found:
        raise CaseFormatError(f"{path}: a directory without {CASE_FILE}")
    return found


def read_cases(paths: Iterable[str | Path]) -> list[Case]:
    """Every case of ``paths`` (files, or directories of case files), in order; blank lines are skipped."""
    paths, cases = list(paths), []
    for path in [f for p in paths for f in case_files(p)]:
        cases += [parse_case(data, f"{path}:{n}") for n, data in json_lines(path, str(path), CaseFormatError)]
    if not cases:
        raise CaseFormatError(f"{', '.join(str(p) for p in paths)}: no cases")
    return cases
