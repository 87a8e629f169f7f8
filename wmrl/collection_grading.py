"""Grade a submission of a collection task: score in a bounded subprocess, then leaderboard and medal.

The score comes from :mod:`wmrl.grade_worker`, run as ``python -m wmrl.grade_worker`` in its own
process group with a wall-clock limit (killed past it) and memory/CPU limits it sets on itself, so a
slow or broken grader cannot stall the trainer. An invalid submission is a :class:`TaskGrade` with
``valid=False`` and the reason; a grader that cannot run raises :class:`GraderFailure` (the rollout
is then ungraded, like a sandbox failure).

Position: the fraction of the leaderboard(s) beaten (:func:`wmrl.leaderboards.position`); for DSBench,
which ships no leaderboard, its own relative score ``(score - baseline) / (GT - baseline)`` clipped to
[0, 1]. Medal: MLE-bench's thresholds on the final leaderboard. The score placed is the one the
worker returns: rounded to the grader spec's ``decimals`` (an MLE-bench task's 5, as its ``Grader``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import wmrl
from wmrl import leaderboards
from wmrl.collection_tasks import CollectionTask
from wmrl.outcome import LADDER, Status, VALID_BASE, VALID_SPAN

GRADE_TIMEOUT_S = 120.0
GRADE_MEMORY_MB = 4096


class GraderFailure(RuntimeError):
    """The task's grader could not score (import error, crash, out of time or memory)."""


@dataclass(frozen=True)
class TaskGrade:
    valid: bool
    score: Optional[float] = None
    position: Optional[float] = None
    medal: Optional[str] = None
    above_median: Optional[bool] = None
    reason: str = ""

    @property
    def status(self) -> Status:
        return Status.VALID if self.valid else Status.RAN_NO_SUB

    @property
    def reward(self) -> float:
        if not self.valid:
            return LADDER[Status.RAN_NO_SUB]
        return VALID_BASE + VALID_SPAN * (self.position if self.position is not None else 0.5)

    def to_json(self) -> dict:
        return {"status": self.status.value, "score": self.score, "position": self.position, "reward": self.reward,
                "medal": self.medal, "above_median": self.above_median, "reason": self.reason}


def run_grader(task: CollectionTask, submission_path: Path, timeout: float = GRADE_TIMEOUT_S,
               memory_mb: int = GRADE_MEMORY_MB) -> dict:
    """The worker's answer for one submission file: {"score"}, {"invalid"} or {"grader_error"}."""
    with tempfile.TemporaryDirectory(prefix="wmrl-grade-") as scratch:
        job_path, result_path = Path(scratch, "job.json"), Path(scratch, "result.json")
        job = {"grader": task.grader.to_json(), "submission": str(submission_path), "answers": str(task.answers_path),
               "id_column": task.id_column, "answer_columns": list(task.answer_columns),
               "submission_columns": list(task.submission_columns), "result": str(result_path),
               "memory_mb": memory_mb, "cpu_seconds": int(timeout) + 1, "timeout": timeout}
        job_path.write_text(json.dumps(job))
        env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
        package_parent = str(Path(wmrl.__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH", "")) if p)
        process = subprocess.Popen([sys.executable, "-m", "wmrl.grade_worker", str(job_path)], cwd=scratch, env=env,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
        try:
            _, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            raise GraderFailure(f"task {task.name}: grading took longer than {timeout:.0f}s") from None
        if not result_path.is_file():
            tail = stderr.decode(errors="replace").strip().splitlines()[-3:]
            why = f"killed by signal {-process.returncode}" if process.returncode < 0 else f"exit {process.returncode}"
            raise GraderFailure(f"task {task.name}: the grading process failed ({why}; memory limit {memory_mb} MB): "
                                + " | ".join(tail))
        return json.loads(result_path.read_text())


def grade_file(task: CollectionTask, submission_path: Path, timeout: float = GRADE_TIMEOUT_S,
               memory_mb: int = GRADE_MEMORY_MB) -> TaskGrade:
    """Score ``submission_path`` and place it on the task's leaderboard."""
    if not Path(submission_path).is_file():
        return TaskGrade(valid=False, reason=f"no {task.submission} was written")
    answer = run_grader(task, Path(submission_path), timeout, memory_mb)
    if "grader_error" in answer:
        raise GraderFailure(f"task {task.name}: {answer['grader_error']}")
    if "invalid" in answer:
        return TaskGrade(valid=False, reason=str(answer["invalid"]))
    return placed(task, float(answer["score"]))


def grade_bytes(task: CollectionTask, submission: bytes, timeout: float = GRADE_TIMEOUT_S,
                memory_mb: int = GRADE_MEMORY_MB) -> TaskGrade:
    with tempfile.TemporaryDirectory(prefix="wmrl-submission-") as scratch:
        path = Path(scratch, "submission.csv")
        path.write_bytes(submission)
        return grade_file(task, path, timeout, memory_mb)


def placed(task: CollectionTask, score: float) -> TaskGrade:
    """A valid score's position and medal on ``task``'s leaderboards."""
    higher = task.higher_is_better
    position = leaderboards.position(score, task.boards, higher)
    if position is None and task.relative_to is not None:
        baseline, reference = task.relative_to
        position = min(1.0, max(0.0, (score - baseline) / (reference - baseline)))
    medal = above = None
    if task.medal_board is not None:
        medal = leaderboards.medal(score, task.medal_board, higher)
        above = leaderboards.above_median(score, task.medal_board, higher)
    return TaskGrade(valid=True, score=score, position=position, medal=medal, above_median=above)


def summary(task: CollectionTask, grade: TaskGrade) -> str:
    """One feedback line for a valid grade."""
    where = "leaderboard position" if task.boards else "relative to the baseline"
    text = f"{task.metric} = {grade.score:.6g} ({where} {grade.position:.3f}"
    return text + (f", {grade.medal} medal)" if grade.medal else ")")
