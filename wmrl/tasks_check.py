"""``wmrl tasks check PATH``: load every task of a directory and grade its sample submission.

Prints one line per task (format, metric, direction, leaderboard size, public data size, sample
submission) and, for each task that is not usable, what is wrong and in which file. Exit status: 0
every task is usable, 2 some task is not (or PATH is not a task source).
"""

from __future__ import annotations

import argparse
import sys

from wmrl.task_layouts import FORMATS, load_collection, task_names
from wmrl.tasks import TaskFormatError

EXIT_OK, EXIT_INVALID = 0, 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", help="a directory of tasks (any layout of docs/tasks.md)")
    parser.add_argument("--format", choices=FORMATS, default="auto", help="the layout (default: detect it)")
    parser.add_argument("--competitions-dir", default=None,
                        help="MLE-bench's mlebench/competitions or MLE-Dojo's mledojo/competitions, when the "
                             "definitions are not inside each task folder")
    parser.add_argument("--no-grade", action="store_true", help="skip grading each sample submission")


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _describe(task, grade_sample: bool) -> str:
    from wmrl.collection_tasks import CollectionTask

    direction = "higher is better" if task.higher_is_better else "lower is better"
    if not isinstance(task, CollectionTask):
        data = sum(len(v) for v in task.data.values())
        return (f"{task.name}: format wmrl, metric {task.metric} ({direction}), leaderboard {len(task.leaderboard)} "
                f"entries, data {_size(data)}, answers hidden/labels.csv")
    from wmrl import collection_grading

    boards = ", ".join(f"{b.name} {len(b.scores)}" for b in task.boards) or "none (DSBench baseline..GT)"
    line = (f"{task.name}: format {task.format}, metric {task.metric} ({direction}), grader {task.grader.describe()}, "
            f"leaderboard {boards}, public data {_size(task.public.total_bytes)} in {len(task.public)} files, "
            f"sample submission {task.sample_submission_path.name} (id {task.id_column!r}, "
            f"{len(task.submission_columns)} value column(s))")
    if grade_sample:
        grade = collection_grading.grade_file(task, task.sample_submission_path)
        if not grade.valid:
            raise TaskFormatError(f"task {task.name}: sample submission {task.sample_submission_path} does not grade: "
                                  f"{grade.reason}")
        line += f", sample scores {grade.score:.6g}"
    return line


def main(args: argparse.Namespace) -> int:
    from wmrl.collection_grading import GraderFailure

    try:
        names = task_names(args.path, args.format, args.competitions_dir)
    except TaskFormatError as exc:
        print(f"wmrl tasks check: {exc}", file=sys.stderr)
        return EXIT_INVALID
    if not names:
        print(f"wmrl tasks check: {args.path}: no tasks found", file=sys.stderr)
        return EXIT_INVALID
    problems = 0
    for name in names:
        try:
            (task,) = load_collection(args.path, args.format, args.competitions_dir, [name])
            print(_describe(task, not args.no_grade))
        except (TaskFormatError, GraderFailure) as exc:
            problems += 1
            print(f"{name}: INVALID: {exc}")
    print(f"{len(names) - problems} of {len(names)} task(s) usable")
    return EXIT_INVALID if problems else EXIT_OK
