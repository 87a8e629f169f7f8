"""``wmrl tasks grade PATH TASK SUBMISSION.csv``: grade one submission as training would.

Prints JSON ``{status, score, position, reward, medal, above_median, reason}``: status ``valid`` or
``ran_no_sub`` (the submission is unusable; ``reason`` says why), ``position`` the fraction of the
leaderboard beaten, ``reward`` the reward ladder's value. Exit status: 0 graded (whatever the
status), 1 the task's grader failed, 2 bad input (no such task or file, an invalid task).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from wmrl.task_layouts import FORMATS, load_collection
from wmrl.tasks import TaskFormatError

EXIT_OK, EXIT_FAILED, EXIT_INVALID = 0, 1, 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", help="a directory of tasks (any layout of docs/tasks.md)")
    parser.add_argument("task", help="the task's folder name")
    parser.add_argument("submission", help="the submission CSV to grade")
    parser.add_argument("--format", choices=FORMATS, default="auto", help="the layout (default: detect it)")
    parser.add_argument("--competitions-dir", default=None,
                        help="MLE-bench's or MLE-Dojo's competitions folder, when not inside each task folder")


def _grade_small_task(task, submission: Path) -> dict:
    """The wmrl format's grading (in process, as training grades it)."""
    from wmrl.grading import SubmissionError, read_submission, score
    from wmrl.outcome import Outcome, Status, rank_score

    if not submission.is_file():
        return {"status": "ran_no_sub", "reason": f"no {submission}"}
    try:
        y_true, y_pred = read_submission(task, submission.read_bytes())
    except SubmissionError as exc:
        return {"status": Status.RAN_NO_SUB.value, "score": None, "position": None,
                "reward": Outcome(status=Status.RAN_NO_SUB).reward, "medal": None, "reason": str(exc)}
    value = score(task.metric, y_true, y_pred)
    position = rank_score(value, list(task.leaderboard), task.higher_is_better)
    return {"status": "valid", "score": value, "position": position,
            "reward": Outcome(status=Status.VALID, rank_score=position).reward, "medal": None, "reason": ""}


def main(args: argparse.Namespace) -> int:
    from wmrl import collection_grading
    from wmrl.collection_tasks import CollectionTask

    try:
        (task,) = load_collection(args.path, args.format, args.competitions_dir, [args.task])
    except TaskFormatError as exc:
        print(f"wmrl tasks grade: {exc}", file=sys.stderr)
        return EXIT_INVALID
    submission = Path(args.submission)
    if not submission.is_file():
        print(f"wmrl tasks grade: {submission}: no such file", file=sys.stderr)
        return EXIT_INVALID
    if not isinstance(task, CollectionTask):
        print(json.dumps(_grade_small_task(task, submission)))
        return EXIT_OK
    try:
        grade = collection_grading.grade_file(task, submission)
    except collection_grading.GraderFailure as exc:
        print(f"wmrl tasks grade: {exc}", file=sys.stderr)
        return EXIT_FAILED
    print(json.dumps(grade.to_json()))
    return EXIT_OK
