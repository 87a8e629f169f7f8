"""An automatic overview of a competition's public data, for the policy's and the world model's prompts.

What a Kaggle-style script needs to know before it reads anything: the files (sizes; folders as
counts by extension), for each CSV its row count, columns and their types (inferred from the first
rows: int, float, bool, date, text with its distinct values), and the sample submission's header and
first rows, which fix the submission's format. It is capped in tokens (:data:`MAX_TOKENS`, the
reference implementation's 1500): lines are added in order of use until the budget is spent, and a
last line says what was left out. Tokens are estimated as characters / 4 unless a counter is given
(a tokenizer's). Only the public directory is read, and only the first rows of each CSV (row counts
count newlines).
"""

from __future__ import annotations

import csv
import io
import math
import os
from collections import Counter
from pathlib import Path
from typing import Callable, Optional

MAX_TOKENS = 1500
SAMPLE_ROWS = 200  # rows read per CSV to infer its columns' types
MAX_COLUMNS = 40  # columns listed per CSV; the rest are counted
MAX_ENTRIES = 30  # top-level files and folders listed
SUBMISSION_ROWS = 3


def approx_tokens(text: str) -> int:
    """A tokenizer-free estimate: about four characters per token for English and code."""
    return math.ceil(len(text) / 4)


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"  # unreachable


def count_rows(path: Path) -> int:
    """Data rows of a CSV (lines after the header; a last line without a newline counts)."""
    lines, last = 0, b"\n"
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            lines += chunk.count(b"\n")
            last = chunk[-1:]
    return max(0, lines + (last != b"\n") - 1)


def _kind(values: list[str]) -> str:
    present = [v for v in values if v.strip() != ""]
    missing = len(values) - len(present)
    suffix = f", {missing} of {len(values)} empty" if missing else ""
    if not present:
        return "empty" + suffix

    def all_parse(cast) -> bool:
        try:
            for v in present:
                if "_" in v:  # Python's int() and float() accept 1_000; a CSV's '0001_01' is an id
                    return False
                cast(v)
            return True
        except ValueError:
            return False

    if all_parse(int):
        return "int" + suffix
    if all_parse(float):
        return "float" + suffix
    if {v.strip().lower() for v in present} <= {"true", "false"}:
        return "bool" + suffix
    if all(len(v) >= 8 and v[:4].isdigit() and v[4] in "-/" for v in present):
        return "date" + suffix
    distinct = Counter(present)
    if len(distinct) <= 10:
        shown = ", ".join(repr(v) for v, _ in distinct.most_common(5))
        return f"text, {len(distinct)} values in the first rows ({shown}{', ...' if len(distinct) > 5 else ''})" + suffix
    return f"text (e.g. {present[0][:40]!r})" + suffix


def _head(path: Path, rows: int) -> tuple[list[str], list[list[str]]]:
    with open(path, newline="", encoding="utf-8-sig", errors="replace") as fh:
        reader = csv.reader(fh)
        header = next(reader, [])
        body = []
        for row in reader:
            body.append(row)
            if len(body) >= rows:
                break
    return header, body


def describe_csv(path: Path, name: str) -> list[str]:
    """Lines on one CSV: its rows and columns, each column's type."""
    header, body = _head(path, SAMPLE_ROWS)
    lines = [f"{name}: {count_rows(path)} rows, {len(header)} columns"]
    for i, column in enumerate(header[:MAX_COLUMNS]):
        values = [row[i] for row in body if i < len(row)]
        lines.append(f"  {column}: {_kind(values)}")
    if len(header) > MAX_COLUMNS:
        lines.append(f"  ... {len(header) - MAX_COLUMNS} more columns: {', '.join(header[MAX_COLUMNS:MAX_COLUMNS + 20])}"
                     + (", ..." if len(header) > MAX_COLUMNS + 20 else ""))
    return lines


def describe_submission(path: Path, name: str) -> list[str]:
    """The sample submission: its header, first rows and row count (the format to write)."""
    header, body = _head(path, SUBMISSION_ROWS)
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(body)
    return [f"Sample submission {name} ({count_rows(path)} rows; write submission.csv in this format):",
            *("  " + line for line in text.getvalue().splitlines())]


def _folder(path: Path) -> str:
    files, kinds, size = 0, Counter(), 0
    for base, _, names in os.walk(path, followlinks=True):
        for n in names:
            files += 1
            kinds[os.path.splitext(n)[1].lower() or "(none)"] += 1
            try:
                size += os.stat(os.path.join(base, n)).st_size
            except OSError:
                pass
        if files > 100_000:
            break
    shown = ", ".join(f"{k} {c}" for k, c in kinds.most_common(4))
    return f"{files} files ({shown}), {_size(size)}"


def overview(public_dir: Path, sample_submission: Optional[Path] = None, *, prefix: str = "data/",
             max_tokens: int = MAX_TOKENS, count_tokens: Callable[[str], int] = approx_tokens) -> str:
    """The overview of ``public_dir`` as the script sees it (paths under ``prefix``), within ``max_tokens``."""
    public_dir = Path(public_dir)
    entries = sorted(public_dir.iterdir(), key=lambda p: (p.is_dir(), p.name))
    listing = ["Files:"]
    for entry in entries[:MAX_ENTRIES]:
        if entry.is_dir():
            listing.append(f"  {prefix}{entry.name}/: {_folder(entry)}")
        else:
            listing.append(f"  {prefix}{entry.name} ({_size(entry.stat().st_size)})")
    if len(entries) > MAX_ENTRIES:
        listing.append(f"  ... {len(entries) - MAX_ENTRIES} more entries")
    sections = [listing]
    if sample_submission is not None and Path(sample_submission).is_file():
        sample = Path(sample_submission)
        shown = f"{prefix}{sample.relative_to(public_dir)}" if public_dir in sample.parents else sample.name
        sections.append(describe_submission(sample, shown))
    csvs = [e for e in entries if e.is_file() and e.suffix.lower() == ".csv"
            and (sample_submission is None or e != Path(sample_submission))]
    # The files a script reads first: train, then test, then the rest.
    csvs.sort(key=lambda e: (0 if "train" in e.name.lower() else 1 if "test" in e.name.lower() else 2, e.name))
    for entry in csvs:
        sections.append(describe_csv(entry, f"{prefix}{entry.name}"))
    out: list[str] = []
    left_out = 0
    budget = max_tokens - count_tokens("[overview cut at 9999 tokens: 9999 more lines]")
    for section in sections:
        for line in section:
            if left_out or count_tokens("\n".join(out + [line])) > budget:
                left_out += 1
                continue
            out.append(line)
    if left_out:
        out.append(f"[overview cut at {max_tokens} tokens: {left_out} more lines]")
    return "\n".join(out)


__all__ = ["MAX_TOKENS", "approx_tokens", "count_rows", "describe_csv", "describe_submission", "overview"]
