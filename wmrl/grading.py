"""The real grader: a sandbox run of a task's solution -> :class:`wmrl.outcome.Outcome`.

``grade(task, run_response, submission)`` reads a SandboxFusion ``/run_code`` response (a
dict) and the submission file the solution wrote (bytes, or None if it wrote none) and
climbs the reward ladder:

* the script did not compile -> ``syntax_err`` with the line;
* it raised (last traceback frame of the script gives the line), was killed by a signal
  (its own doing, or a limit's: memory, CPU), exited non-zero, ran out of time
  (``error_type="TimeLimitExceeded"``) or wrote more than the sandbox returns
  (``files_truncated``: ``error_type="OutputLimitExceeded"``) -> ``runtime_err``;
* it exited 0 without a usable submission (missing file, no ``id,target`` header, wrong or
  duplicate ids, non-numeric or non-finite values) -> ``ran_no_sub``;
* otherwise the task metric on the hidden labels -> ``valid`` with the leaderboard rank score.

A collection task (:class:`wmrl.collection_tasks.CollectionTask`) climbs the same ladder, but its
submission is scored by its own grader in a bounded subprocess (:mod:`wmrl.collection_grading`); a
grader that cannot run raises :class:`SandboxFailure` too (the rollout is ungraded).

A response with status ``SandboxError`` is the sandbox's failure, not the program's: grading
raises :class:`SandboxFailure` so the caller treats the rollout as ungraded. (The server answers
``SandboxError`` only for its own failures: whatever the program does to itself is a result.)

Metrics are numpy implementations of scikit-learn's definitions (tested against it).
"""

from __future__ import annotations

import csv
import io
import math
import re
import signal
from dataclasses import dataclass
from typing import Mapping, Optional

import numpy as np

from wmrl import collection_grading
from wmrl.collection_tasks import CollectionTask
from wmrl.outcome import Outcome, Status, rank_score
from wmrl.tasks import Task

FEEDBACK_CHARS = 2000
# How the program shows up in tracebacks: the sandbox runs it as main.py; `python -c` shows "<string>"
# (so does code it exec()s, hence main.py frames win when both appear).
SCRIPT_NAMES = ("main.py", "<string>")
_SYNTAX_ERRORS = ("SyntaxError", "IndentationError", "TabError")
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]*)", line (?P<line>\d+)')
_EXC_LINE = re.compile(r"^(?P<type>[A-Za-z_][\w.]*)(?::\s.*|:)?$")


class SandboxFailure(RuntimeError):
    """The sandbox could not run the program (status SandboxError): the rollout is ungraded."""


# --------------------------------------------------------------------------- metrics


def accuracy(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    return float(np.mean(np.asarray(y_true) == np.asarray(y_pred)))


def f1_macro(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """Unweighted mean of per-class F1 over the classes in either array (0 where undefined)."""
    y_true, y_pred = np.asarray(y_true), np.asarray(y_pred)
    scores = []
    for c in np.unique(np.concatenate([y_true, y_pred])):
        tp = np.sum((y_pred == c) & (y_true == c))
        denom = np.sum(y_pred == c) + np.sum(y_true == c)
        scores.append(2.0 * tp / denom if denom else 0.0)
    return float(np.mean(scores))


def rmse(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    return float(np.sqrt(np.mean((np.asarray(y_true, float) - np.asarray(y_pred, float)) ** 2)))


def mae(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    return float(np.mean(np.abs(np.asarray(y_true, float) - np.asarray(y_pred, float))))


def r2(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """Coefficient of determination; a constant target scores 1.0 if predicted exactly, else 0.0 (as sklearn)."""
    y_true, y_pred = np.asarray(y_true, float), np.asarray(y_pred, float)
    ss_res = float(np.sum((y_true - y_pred) ** 2))
    ss_tot = float(np.sum((y_true - y_true.mean()) ** 2))
    if ss_tot == 0.0:
        return 1.0 if ss_res == 0.0 else 0.0
    return 1.0 - ss_res / ss_tot


METRICS = {"accuracy": accuracy, "f1_macro": f1_macro, "rmse": rmse, "mae": mae, "r2": r2}


def score(metric: str, y_true: np.ndarray, y_pred: np.ndarray) -> float:
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {sorted(METRICS)}, got {metric!r}")
    return METRICS[metric](y_true, y_pred)


# --------------------------------------------------------------------------- tracebacks


@dataclass(frozen=True)
class ErrorInfo:
    error_type: str
    line: Optional[int]
    syntax: bool


def parse_error(stderr: str) -> Optional[ErrorInfo]:
    """The final exception in a Python stderr: its type (last dotted part), line in the script, and
    whether it is a compile error of the script itself (a SyntaxError with no traceback header)."""
    lines = stderr.rstrip("\n").splitlines()
    exc_at = next((i for i in range(len(lines) - 1, -1, -1)
                   if lines[i] and not lines[i][0].isspace() and _EXC_LINE.match(lines[i])), None)
    if exc_at is None:
        return None
    error_type = _EXC_LINE.match(lines[exc_at]).group("type").rsplit(".", 1)[-1]
    header = max((i for i in range(exc_at) if lines[i].startswith("Traceback (most recent call last)")), default=-1)
    start = header + 1 if header >= 0 else 0
    frames = [(m.group("file"), int(m.group("line"))) for m in map(_FRAME.match, lines[start:exc_at]) if m]
    if header < 0 and not frames:
        return None  # a stray line that merely looks like "Name: message"
    line = frames[-1][1] if frames else None
    for name in reversed(SCRIPT_NAMES):
        own = [n for file, n in frames if file.rsplit("/", 1)[-1] == name]
        line = own[-1] if own else line
    syntax = error_type in _SYNTAX_ERRORS and header < 0
    return ErrorInfo(error_type=error_type, line=line, syntax=syntax)


# --------------------------------------------------------------------------- submissions


class SubmissionError(ValueError):
    """Why a submission is unusable (the message becomes the ran_no_sub feedback)."""


def _read_columns(data: bytes, id_column: str, value_column: str, what: str) -> tuple[list[str], list[str]]:
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise SubmissionError(f"{what} is not UTF-8 text") from exc
    rows = [row for row in csv.reader(io.StringIO(text)) if row]
    if not rows:
        raise SubmissionError(f"{what} is empty")
    header = [h.strip() for h in rows[0]]
    for col in (id_column, value_column):
        if col not in header:
            raise SubmissionError(f"{what} has no {col!r} column in its header {header[:5]}")
    i, j = header.index(id_column), header.index(value_column)
    ids, values = [], []
    for n, row in enumerate(rows[1:], start=2):
        if len(row) <= max(i, j):
            raise SubmissionError(f"{what} line {n}: expected {len(header)} fields, got {len(row)}")
        ids.append(_canonical_id(row[i]))
        values.append(row[j].strip())
    return ids, values


def _canonical_id(raw: str) -> str:
    """'7', '7.0' and ' 7' are the same id (numpy writes ids as floats unless told otherwise)."""
    raw = raw.strip()
    try:
        as_float = float(raw)
    except ValueError:
        return raw
    return str(int(as_float)) if as_float.is_integer() else raw


def read_submission(task: Task, submission: bytes) -> tuple[np.ndarray, np.ndarray]:
    """(y_true, y_pred) aligned by id, or SubmissionError saying what is wrong."""
    label_ids, label_values = _read_columns(task.hidden_labels, task.id_column, task.target, "hidden labels")
    ids, values = _read_columns(submission, task.id_column, task.target, task.submission)
    if len(set(ids)) != len(ids):
        raise SubmissionError(f"{task.submission} has duplicate ids")
    missing = set(label_ids) - set(ids)
    extra = set(ids) - set(label_ids)
    if missing or extra:
        raise SubmissionError(f"{task.submission} ids do not match the test set: {len(ids)} rows, "
                              f"{len(missing)} test ids missing, {len(extra)} unknown ids")
    pred_by_id = dict(zip(ids, values))
    try:
        y_pred = np.array([float(pred_by_id[i]) for i in label_ids])
    except ValueError as exc:
        raise SubmissionError(f"{task.submission} has a non-numeric {task.target!r}: {exc}") from exc
    if not np.all(np.isfinite(y_pred)):
        raise SubmissionError(f"{task.submission} has non-finite predictions")
    return np.array([float(v) for v in label_values]), y_pred


# --------------------------------------------------------------------------- grading


def _tail(text: str, limit: int) -> str:
    return text if len(text) <= limit else "..." + text[-limit:]


def feedback_text(run_result: Mapping, note: str = "") -> str:
    """What the agent would see: a note, then the tails of stdout and stderr."""
    parts = [note] if note else []
    stdout, stderr = run_result.get("stdout") or "", run_result.get("stderr") or ""
    half = FEEDBACK_CHARS // 2
    if stdout.strip():
        parts.append("stdout:\n" + _tail(stdout, half if stderr.strip() else FEEDBACK_CHARS))
    if stderr.strip():
        parts.append("stderr:\n" + _tail(stderr, half if stdout.strip() else FEEDBACK_CHARS))
    return "\n".join(parts)


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def grade(task: Task, run_response: Mapping, submission: Optional[bytes]) -> Outcome:
    """Turn a sandbox run of ``task``'s solution into an Outcome (see the module docstring)."""
    if run_response.get("status") == "SandboxError":
        raise SandboxFailure(f"sandbox error: {run_response.get('message', '')[:500]}")
    rr = run_response.get("run_result") or {}
    if rr.get("status") == "Error" or not rr:
        raise SandboxFailure(f"sandbox error: no usable run_result ({rr.get('stderr', '')[:500]})")
    if rr.get("status") == "TimeLimitExceeded":
        seconds = rr.get("execution_time")
        note = "time limit exceeded" + (f" after {seconds:.1f}s" if isinstance(seconds, (int, float)) else "")
        return Outcome(status=Status.RUNTIME_ERR, error_type="TimeLimitExceeded", feedback=feedback_text(rr, note))
    code = rr.get("return_code")
    if code != 0:
        info = parse_error(rr.get("stderr") or "")
        if info is not None and info.syntax:
            return Outcome(status=Status.SYNTAX_ERR, error_type=info.error_type, error_line=info.line,
                           feedback=feedback_text(rr))
        if info is not None:
            return Outcome(status=Status.RUNTIME_ERR, error_type=info.error_type, error_line=info.line,
                           feedback=feedback_text(rr))
        if isinstance(code, int) and code < 0 and rr.get("oom_kills"):  # its processes together outgrew the memory
            return Outcome(status=Status.RUNTIME_ERR, error_type="MemoryLimitExceeded",
                           feedback=feedback_text(rr, f"killed at the memory limit ({_signal_name(code)})"))
        if isinstance(code, int) and code < 0:
            return Outcome(status=Status.RUNTIME_ERR, error_type=_signal_name(code),
                           feedback=feedback_text(rr, f"killed by {_signal_name(code)}"))
        return Outcome(status=Status.RUNTIME_ERR, error_type="SystemExit", feedback=feedback_text(rr, f"exit code {code}"))
    if run_response.get("files_truncated"):
        note = run_response.get("message") or "the fetched files exceed the sandbox's limit"
        return Outcome(status=Status.RUNTIME_ERR, error_type="OutputLimitExceeded", feedback=feedback_text(rr, note))
    if submission is None:
        return Outcome(status=Status.RAN_NO_SUB, feedback=feedback_text(rr, f"no {task.submission} was written"))
    if isinstance(task, CollectionTask):
        return _grade_collection(task, rr, submission)
    try:
        y_true, y_pred = read_submission(task, submission)
    except SubmissionError as exc:
        return Outcome(status=Status.RAN_NO_SUB, feedback=feedback_text(rr, f"invalid submission: {exc}"))
    value = score(task.metric, y_true, y_pred)
    if not math.isfinite(value):
        return Outcome(status=Status.RAN_NO_SUB, feedback=feedback_text(rr, f"{task.metric} is not finite"))
    rank = rank_score(value, list(task.leaderboard), task.higher_is_better)
    return Outcome(status=Status.VALID, rank_score=rank,
                   feedback=feedback_text(rr, f"{task.metric} = {value:.6g} (leaderboard rank score {rank:.3f})"))


def _grade_collection(task: CollectionTask, rr: Mapping, submission: bytes) -> Outcome:
    try:
        result = collection_grading.grade_bytes(task, submission)
    except collection_grading.GraderFailure as exc:
        raise SandboxFailure(f"grader failure: {exc}") from exc
    if not result.valid:
        return Outcome(status=Status.RAN_NO_SUB, feedback=feedback_text(rr, f"invalid submission: {result.reason}"))
    rank = result.position if result.position is not None else 0.5
    return Outcome(status=Status.VALID, rank_score=rank, medal=result.medal,
                   feedback=feedback_text(rr, collection_grading.summary(task, result)))
