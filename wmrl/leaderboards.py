"""Competition leaderboards: reading them, the metric's direction, a score's position and medal.

Two file shapes exist:

* MLE-bench's ``leaderboard.csv``: Kaggle's leaderboard export, best team first, with a ``score``
  column (other columns, e.g. ``teamId``, are ignored);
* MLE-Dojo's ``public_leaderboard.csv`` / ``private_leaderboard.csv`` (also the normalised layout's):
  ``rank,score``, rank 1 best.

The direction is read from the order, as MLE-bench's ``Grader.is_lower_better`` does: the top entry
scoring below the bottom one means lower is better. A leaderboard whose top and bottom tie says
nothing, and the caller needs another source (the metric's definition).

Position is the fraction of entries a score beats or ties (MLE-Dojo's position score; ties count
so that matching the winner scores 1.0), averaged over the leaderboards a task has (MLE-Dojo
averages its public and private boards). Medals follow MLE-bench's thresholds (Kaggle's progression
rules by number of teams) on the final (private) leaderboard.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from statistics import median
from typing import Optional, Sequence

from wmrl.outcome import rank_score
from wmrl.tasks import TaskFormatError

MEDALS = ("gold", "silver", "bronze")


@dataclass(frozen=True)
class Leaderboard:
    name: str  # "leaderboard" (MLE-bench), "private" or "public" (MLE-Dojo)
    scores: tuple[float, ...]  # as the file orders them: best first

    @property
    def higher_is_better(self) -> Optional[bool]:
        """From the order (MLE-bench's rule); None when the top and bottom entries tie."""
        if len(self.scores) < 2 or self.scores[0] == self.scores[-1]:
            return None
        return self.scores[0] > self.scores[-1]


def read_leaderboard(path: Path, name: str, where: str) -> Leaderboard:
    """A leaderboard file: the ``score`` column (else the second column), rows in rank order.

    Rows without a score (Kaggle exports teams that never scored) are dropped; no scored row at all
    is a TaskFormatError naming the file.
    """
    try:
        with open(path, newline="", encoding="utf-8-sig") as handle:
            rows = [row for row in csv.reader(handle) if row]
    except (OSError, UnicodeDecodeError) as exc:
        raise TaskFormatError(f"{where}: cannot read leaderboard {path}: {exc}") from exc
    if not rows:
        raise TaskFormatError(f"{where}: leaderboard {path} is empty")
    header = [h.strip() for h in rows[0]]
    if "score" in header:
        column = header.index("score")
    elif len(header) >= 2:
        column = 1
    else:
        raise TaskFormatError(f"{where}: leaderboard {path} has no 'score' column (header {header[:5]})")
    ranked = []
    for n, row in enumerate(rows[1:], start=2):
        value = row[column].strip() if column < len(row) else ""
        try:
            score = float(value)
        except ValueError:
            if value in ("", "nan", "NaN", "None", "null"):
                continue
            raise TaskFormatError(f"{where}: leaderboard {path} line {n}: score {value!r} is not a number") from None
        if math.isfinite(score):
            rank = _rank(row, header, n)
            ranked.append((rank, score))
    if not ranked:
        raise TaskFormatError(f"{where}: leaderboard {path} is empty (no scored entries)")
    ranked.sort(key=lambda item: item[0])
    return Leaderboard(name=name, scores=tuple(score for _, score in ranked))


def _rank(row: list[str], header: list[str], line: int) -> float:
    if "rank" in header and header.index("rank") < len(row):
        try:
            return float(row[header.index("rank")])
        except ValueError:
            pass
    return float(line)  # the file's own order


def direction(boards: Sequence[Leaderboard]) -> Optional[bool]:
    """higher_is_better as the boards order their scores; None if none tells; an error if they disagree."""
    told = {b.higher_is_better for b in boards} - {None}
    if len(told) > 1:
        raise ValueError("the leaderboards disagree on whether higher scores are better")
    return told.pop() if told else None


def position(score: float, boards: Sequence[Leaderboard], higher_is_better: bool) -> Optional[float]:
    """Mean over ``boards`` of the fraction of entries ``score`` beats or ties; None without boards."""
    if not boards:
        return None
    return sum(rank_score(score, list(b.scores), higher_is_better) for b in boards) / len(boards)


@dataclass(frozen=True)
class MedalThresholds:
    gold: float
    silver: float
    bronze: float
    median: float


def medal_thresholds(board: Leaderboard, higher_is_better: bool) -> MedalThresholds:
    """MLE-bench's thresholds: the score at the position Kaggle's progression rules give for the team count."""
    scores = sorted(board.scores, reverse=higher_is_better)  # best first
    teams = len(scores)

    def at(position: int) -> float:
        return scores[min(max(position, 1), teams) - 1]

    if teams < 100:
        gold, silver, bronze = at(max(1, int(teams * 0.1))), at(max(1, int(teams * 0.2))), at(max(1, int(teams * 0.4)))
    elif teams < 250:
        gold, silver, bronze = at(10), at(max(1, int(teams * 0.2))), at(max(1, int(teams * 0.4)))
    elif teams < 1000:
        gold, silver, bronze = at(10 + int(teams * 0.002)), at(50), at(100)
    else:
        gold, silver, bronze = at(10 + int(teams * 0.002)), at(max(1, int(teams * 0.05))), at(max(1, int(teams * 0.1)))
    return MedalThresholds(gold=gold, silver=silver, bronze=bronze, median=float(median(scores)))


def medal(score: float, board: Leaderboard, higher_is_better: bool) -> Optional[str]:
    """'gold', 'silver', 'bronze' or None: the best threshold ``score`` reaches (ties reach it)."""
    thresholds = medal_thresholds(board, higher_is_better)
    for name in MEDALS:
        threshold = getattr(thresholds, name)
        if (score >= threshold) if higher_is_better else (score <= threshold):
            return name
    return None


def above_median(score: float, board: Leaderboard, higher_is_better: bool) -> bool:
    """Strictly better than the median entry (MLE-bench's ``above_median``)."""
    threshold = medal_thresholds(board, higher_is_better).median
    return score > threshold if higher_is_better else score < threshold
