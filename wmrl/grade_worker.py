"""The grading subprocess: one submission scored by a collection task's grader, in its own process.

``python -m wmrl.grade_worker JOB.json`` limits its own memory (address space) and CPU time first,
then reads the submission and answers with pandas (JSON lines answers as MLE-bench reads them:
:mod:`wmrl.answers_file`) and runs the grader the job names (see
:class:`wmrl.collection_tasks.GraderSpec`). It writes ``{"score": x}``, ``{"invalid": reason}`` (the
submission's fault: ran_no_sub) or ``{"grader_error": reason}`` (the task's fault) to the job's
``result`` path, rounded first when the grader spec names ``decimals`` (MLE-bench: 5); anything the
grader prints goes to stderr. A grader that raises on a submission
makes it invalid, as MLE-bench's ``Grader`` (a score of None) and MLE-Dojo's validation do.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import math
import resource
import subprocess
import sys
import tempfile
import traceback
import types
from pathlib import Path

REASON_CHARS = 600


class GraderError(Exception):
    """The grader itself cannot run (import error, bad answers file): no fault of the submission."""


class InvalidSubmission(Exception):
    pass


def _limit_self(memory_mb: int, cpu_seconds: int) -> None:
    if memory_mb > 0:
        limit = memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    if cpu_seconds > 0:
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 5))


def _short(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= REASON_CHARS else text[:REASON_CHARS] + "..."


def _import_file(path: Path, sys_path: list[str]):
    """``path`` as a module of a package rooted at its folder, so its relative imports (``from .classes``) work."""
    for entry in reversed(sys_path):
        if entry not in sys.path:
            sys.path.insert(0, entry)
    package = "_wmrl_task_grader"
    module = types.ModuleType(package)
    module.__path__ = [str(path.parent)]
    sys.modules[package] = module
    try:
        return importlib.import_module(f"{package}.{path.stem}")
    except Exception as exc:  # the grader's own import-time failure, e.g. mlebench not importable
        raise GraderError(f"cannot import {path}: {_short(exc)}") from exc


def _python_grade(spec: dict, submission, answers) -> float:
    module = _import_file(Path(spec["file"]), spec.get("sys_path") or [])
    function = getattr(module, spec.get("function") or "grade", None)
    if not callable(function):
        raise GraderError(f"{spec['file']} defines no function {spec.get('function') or 'grade'!r}")
    try:
        return function(submission, answers)
    except MemoryError:
        raise
    except Exception as exc:
        raise InvalidSubmission(f"the grader rejected it: {_short(exc)}") from exc


def _mledojo_grade(spec: dict, submission, answers) -> float:
    module = _import_file(Path(spec["file"]), spec.get("sys_path") or [])
    classes = [v for v in vars(module).values()
               if isinstance(v, type) and v.__module__ == module.__name__ and hasattr(v, "evaluate")]
    if len(classes) != 1:
        raise GraderError(f"{spec['file']} defines {len(classes)} metric classes; expected one")
    try:
        metrics = classes[0]()
    except Exception as exc:
        raise GraderError(f"cannot create {classes[0].__name__}: {_short(exc)}") from exc
    try:
        metrics.validate_submission(submission.copy(), answers.copy())
        return metrics.evaluate(answers.copy(), submission.copy())
    except MemoryError:
        raise
    except Exception as exc:
        raise InvalidSubmission(f"{_short(exc)}") from exc


def _dsbench_grade(spec: dict, submission_path: str, answers_path: str, timeout: float) -> float:
    """DSBench's ``<name>_eval.py`` writes ``<path>/<name>/result.txt``; a failure or 'nan' is invalid."""
    with tempfile.TemporaryDirectory() as out:
        name = "result"
        (Path(out) / name).mkdir()
        run = subprocess.run([sys.executable, spec["file"], "--path", out, "--name", name, "--answer_file", answers_path,
                              "--predict_file", submission_path], capture_output=True, text=True, timeout=timeout)
        result = Path(out) / name / "result.txt"
        if run.returncode != 0 or not result.is_file():
            tail = (run.stderr or run.stdout).strip().splitlines()[-1:] or [f"exit {run.returncode}"]
            raise InvalidSubmission(f"the DSBench evaluation failed: {tail[0][:REASON_CHARS]}")
        text = result.read_text().strip()
    try:
        return float(text)
    except ValueError:
        raise InvalidSubmission(f"the DSBench evaluation wrote {text[:80]!r}, not a number") from None


def grade_job(job: dict) -> dict:
    import pandas as pd  # here, after the limits: the worker's only heavy import

    from wmrl.task_metrics import SubmissionError, score_submission

    from wmrl.answers_file import read_answers

    spec = job["grader"]
    try:
        # A DataFrame, or for MLE-bench's JSON lines answers the list of dicts its grade_fn expects.
        answers = read_answers(Path(job["answers"]), as_frame=spec["kind"] != "python")
    except Exception as exc:
        return {"grader_error": f"cannot read the answers {job['answers']}: {_short(exc)}"}
    try:
        submission = pd.read_csv(job["submission"], float_precision="round_trip")
    except pd.errors.EmptyDataError:
        return {"invalid": "the submission is empty"}
    except Exception as exc:
        return {"invalid": f"the submission is not a readable CSV: {_short(exc)}"}
    try:
        if spec["kind"] == "builtin":
            try:
                value = score_submission(spec["metric"], submission, answers, job["id_column"],
                                         list(job["answer_columns"]), list(job["submission_columns"]))
            except SubmissionError as exc:
                raise InvalidSubmission(str(exc)) from exc
            except (ValueError, KeyError) as exc:
                raise GraderError(f"{spec['metric']} cannot score these answers: {_short(exc)}") from exc
        elif spec["kind"] == "python":
            value = _python_grade(spec, submission, answers)
        elif spec["kind"] == "mledojo":
            value = _mledojo_grade(spec, submission, answers)
        elif spec["kind"] == "dsbench":
            value = _dsbench_grade(spec, job["submission"], job["answers"], float(job.get("timeout", 60)))
        else:
            return {"grader_error": f"unknown grader kind {spec['kind']!r}"}
    except InvalidSubmission as exc:
        return {"invalid": str(exc)}
    except GraderError as exc:
        return {"grader_error": str(exc)}
    except subprocess.TimeoutExpired:
        return {"grader_error": "the DSBench evaluation script ran out of time"}
    try:
        if spec.get("decimals") is not None:
            # As MLE-bench's Grader: Python's round on the grader's own value (a numpy float rounds as numpy does).
            value = round(value, int(spec["decimals"]))
        value = float(value)
    except (TypeError, ValueError):
        return {"grader_error": f"the grader returned {value!r}, not a number"}
    if not math.isfinite(value):
        return {"invalid": f"the score is not finite ({value})"}
    return {"score": value}


def main(argv: list[str]) -> int:
    job = json.loads(Path(argv[0]).read_text())
    _limit_self(int(job.get("memory_mb", 0)), int(job.get("cpu_seconds", 0)))
    try:
        with contextlib.redirect_stdout(sys.stderr):
            result = grade_job(job)
    except MemoryError:
        result = {"grader_error": f"grading ran out of memory (limit {job.get('memory_mb')} MB)"}
    except Exception as exc:  # a bug or a grader failing oddly: reported, not a traceback to the trainer
        traceback.print_exc()
        result = {"grader_error": f"grading failed: {_short(exc)}"}
    Path(job["result"]).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
