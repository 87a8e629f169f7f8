"""``wmrl trajectories FILE``: print or filter a run's trajectory logs (:mod:`wmrl_trainer.trajectory_log`).

FILE is one log (``rank-0.jsonl``, or a rotated ``rank-0.jsonl.2``) or the log folder
(``<checkpoint dir>/trajectories``: every rank's files, each rank's oldest rotated file
first). Filters, all optional and combined with AND:

* ``--task T``: trajectories of task T;
* ``--status S``: with a turn whose real or predicted status is S (malformed, syntax_err,
  runtime_err, ran_no_sub, valid);
* ``--anchor`` / ``--no-anchor``: anchor trajectories (graded by real execution) or the others;
* ``--min-disagreement X``: |world-model reward - real reward| >= X (anchor rows in mode wmrl,
  the only ones graded both ways).

Prints one line per trajectory and a count, or with ``--json`` the matching log lines as
they are. A line that is not JSON (a log cut short by a crash) is skipped with a warning.
Exit 0 (also when nothing matches), 2 for a missing file or a bad filter.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any, Iterator, Optional

STATUSES = ("malformed", "syntax_err", "runtime_err", "ran_no_sub", "valid")
_ROTATED = re.compile(r"^(?P<base>.+\.jsonl)(?:\.(?P<n>\d+))?$")


def log_files(path: Path) -> list[Path]:
    """The files to read for ``path``: itself, or a folder's logs by rank, oldest rotated file first."""
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: no such file or folder")
    found = []
    for entry in path.iterdir():
        match = _ROTATED.match(entry.name)
        if match and entry.is_file():
            found.append((match.group("base"), -int(match.group("n") or 0), entry))
    return [entry for _, _, entry in sorted(found, key=lambda f: (_rank_key(f[0]), f[1]))]


def _rank_key(base: str) -> tuple[int, str]:
    digits = re.findall(r"\d+", base)
    return (int(digits[-1]) if digits else -1, base)


def read_entries(files: list[Path], warn: Any = None) -> Iterator[dict[str, Any]]:
    for path in files:
        with open(path, encoding="utf-8") as fh:
            for number, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                try:
                    entry = json.loads(line)
                except json.JSONDecodeError:
                    if warn is not None:
                        warn(f"{path}:{number}: not a JSON line (cut short?), skipped")
                    continue
                if isinstance(entry, dict):
                    yield entry


def statuses(entry: dict[str, Any]) -> set[str]:
    """Every real or predicted status among the trajectory's turns."""
    found = set()
    for turn in entry.get("turns") or []:
        for grade in ("real", "world_model"):
            if isinstance(turn.get(grade), dict) and turn[grade].get("status"):
                found.add(turn[grade]["status"])
    return found


def matches(entry: dict[str, Any], *, task: Optional[str] = None, status: Optional[str] = None,
            anchor: Optional[bool] = None, min_disagreement: Optional[float] = None) -> bool:
    """Whether one log entry passes the filters (module docstring); None means no filter."""
    if task is not None and entry.get("task") != task:
        return False
    if status is not None and status not in statuses(entry):
        return False
    if anchor is not None and bool(entry.get("anchor")) is not anchor:
        return False
    if min_disagreement is not None:
        disagreement = entry.get("disagreement")
        if disagreement is None or disagreement < min_disagreement:
            return False
    return True


def _num(value: Optional[float], signed: bool = False) -> str:
    if value is None:
        return "-"
    return f"{value:+.3f}" if signed else f"{value:.3f}"


def _grade(turn: dict[str, Any]) -> str:
    shown = turn.get("shown")
    grade = turn.get(shown) if shown else None
    if not isinstance(grade, dict):
        return "ungraded"
    text = grade.get("status", "?")
    if grade.get("quality_bucket"):
        text += f"/{grade['quality_bucket']}"
    return text + ("" if shown == "real" else "*")


def render(entry: dict[str, Any]) -> str:
    """One trajectory in a line: where, rewards by grader, advantage x weight, each turn's shown grade
    (``*`` = the world model's prediction), and why it stopped."""
    turns = entry.get("turns") or []
    parts = [f"step {entry.get('step')}", f"rank {entry.get('rank')}", f"row {entry.get('row')}",
             str(entry.get("task")), "anchor" if entry.get("anchor") else "wm",
             f"reward {_num(entry.get('reward'))} (wm {_num(entry.get('raw_reward'))} "
             f"cal {_num(entry.get('calibrated_reward'))} real {_num(entry.get('real_reward'))})",
             f"adv {_num(entry.get('advantage'), signed=True)} x{entry.get('weight', 1.0):.2f}",
             f"turns {len(turns)}: " + " -> ".join(_grade(t) for t in turns)]
    if entry.get("stop"):
        parts.append(f"stop {entry['stop']}")
    if not entry.get("graded", True):
        parts.append("UNGRADED")
    return "  ".join(parts)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="a trajectory log (rank-<r>.jsonl[.n]) or the folder holding them")
    parser.add_argument("--task", help="only this task")
    parser.add_argument("--status", choices=STATUSES, help="only trajectories with a turn graded (really or "
                        "predicted) with this status")
    parser.add_argument("--anchor", action=argparse.BooleanOptionalAction, default=None,
                        help="only anchor trajectories (--anchor) or only the others (--no-anchor)")
    parser.add_argument("--min-disagreement", type=float, metavar="X",
                        help="only trajectories whose |world-model reward - real reward| >= X")
    parser.add_argument("--json", action="store_true", help="print the matching log lines as JSON")


def main(args: argparse.Namespace) -> int:
    if args.min_disagreement is not None and not args.min_disagreement >= 0:
        print(f"wmrl trajectories: --min-disagreement must be >= 0, got {args.min_disagreement}", file=sys.stderr)
        return 2
    try:
        files = log_files(Path(args.file))
    except FileNotFoundError as exc:
        print(f"wmrl trajectories: {exc}", file=sys.stderr)
        return 2
    total = shown = 0
    for entry in read_entries(files, warn=lambda m: print(f"wmrl trajectories: {m}", file=sys.stderr)):
        total += 1
        if not matches(entry, task=args.task, status=args.status, anchor=args.anchor,
                       min_disagreement=args.min_disagreement):
            continue
        shown += 1
        print(json.dumps(entry, ensure_ascii=False) if args.json else render(entry))
    if not args.json:
        print(f"# {shown} of {total} trajectories")
    return 0
