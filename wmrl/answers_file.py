"""A collection task's private answers file: CSV, or JSON lines as some MLE-bench competitions store them.

MLE-bench's ``dataset.answers`` names a ``.csv`` (read as a DataFrame) or a ``.jsonl`` (read as a list
of dicts, one a line: MLE-bench's own ``load_answers``; ``tensorflow2-question-answering`` is one) and
hands that object to the competition's ``grade_fn`` as it is. The loader's checks only need the
answers' columns and ids, read here with the standard library (no pandas at start-up); the grading
subprocess reads the whole file (:func:`read_answers`).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

SUFFIXES = (".csv", ".jsonl")


class AnswersError(ValueError):
    """The answers file cannot be read (the message names it and why)."""


def is_jsonl(path: Path) -> bool:
    return Path(path).suffix.lower() == ".jsonl"


def check_suffix(path: Path) -> None:
    if Path(path).suffix.lower() not in SUFFIXES:
        raise AnswersError(f"answers {path}: unsupported format {Path(path).suffix or '(no suffix)'!r}; "
                           f"answers are {' or '.join(SUFFIXES)} files")


def jsonl_records(path: Path, limit: int | None = None) -> list[dict]:
    """The JSON objects of a ``.jsonl`` file, one a line (blank lines skipped), at most ``limit`` of them."""
    records: list[dict] = []
    try:
        with open(path, encoding="utf-8") as handle:
            for number, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise AnswersError(f"answers {path}: line {number} is not JSON: {exc.msg}") from None
                if not isinstance(record, dict):
                    raise AnswersError(f"answers {path}: line {number} is a {type(record).__name__}, not a JSON object")
                records.append(record)
                if limit is not None and len(records) >= limit:
                    break
    except (OSError, UnicodeDecodeError) as exc:
        raise AnswersError(f"answers {path}: cannot read it: {exc}") from exc
    if not records:
        raise AnswersError(f"answers {path} is empty")
    return records


def csv_header(path: Path) -> list[str]:
    """A CSV file's column names (stripped); AnswersError if it cannot be read or is empty."""
    try:
        with open(path, newline="", encoding="utf-8-sig") as handle:
            header = next(csv.reader(handle), None)
    except (OSError, UnicodeDecodeError) as exc:
        raise AnswersError(f"cannot read {path}: {exc}") from exc
    if not header:
        raise AnswersError(f"{path} is empty")
    return [h.strip() for h in header]


def csv_column(path: Path, column: str) -> list[str]:
    """The values of ``column`` in a CSV file, as text, in file order."""
    with open(path, newline="", encoding="utf-8-sig") as handle:
        reader = csv.reader(handle)
        header = [h.strip() for h in next(reader)]
        i = header.index(column)
        return [row[i].strip() for row in reader if row and len(row) > i]


def columns(path: Path) -> list[str]:
    """The answers' column names: a CSV's header, or the keys of a JSON lines file's first record."""
    check_suffix(path)
    if is_jsonl(path):
        return [str(key) for key in jsonl_records(path, limit=1)[0]]
    return csv_header(path)


def ids(path: Path, column: str) -> list[str]:
    """The values of ``column`` (the id column), as text, in file order."""
    if is_jsonl(path):
        records = jsonl_records(path)
        missing = sum(column not in r for r in records)
        if missing:
            raise AnswersError(f"answers {path}: {missing} record(s) have no {column!r}")
        return [str(r[column]).strip() for r in records]
    return csv_column(path, column)


def read_answers(path: Path, as_frame: bool) -> Any:
    """What a grader gets: a DataFrame for a CSV; for JSON lines, MLE-bench's list of dicts, or a DataFrame of
    the records when ``as_frame`` (built-in metrics score DataFrames)."""
    import pandas as pd

    check_suffix(path)
    if not is_jsonl(path):
        return pd.read_csv(path, float_precision="round_trip")
    records = jsonl_records(path)
    return pd.DataFrame.from_records(records) if as_frame else records


__all__ = ["AnswersError", "SUFFIXES", "check_suffix", "columns", "csv_column", "csv_header", "ids", "is_jsonl", "jsonl_records", "read_answers"]
