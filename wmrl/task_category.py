"""A task's category (tabular, text, image, other): what evaluation reports average over.

Declared metadata wins (``category`` in ``task.yaml``, MLE-bench's ``config.yaml`` or the
normalised layout's ``metric.yaml``: :attr:`wmrl.tasks.Task.category`). Otherwise the category is
inferred from the task's public files (:func:`infer_category`, pure), in this order:

1. **image**: image files (``.png``, ``.jpg``, ``.tif``, ``.dcm``, ...) number at least
   :data:`MANY_FILES` or are most of the data files;
2. **other**: the same for audio or video files;
3. **text**: a table (CSV/TSV) has a free-text column (the median of its first rows' values has
   at least :data:`FREE_TEXT_WORDS` words), or, with no table at all, text files (``.txt``,
   ``.json``, ...) are most of the data files;
4. **tabular**: any other task with a table (CSV, TSV, Parquet, ...);
5. **other**: everything else.

Files that describe a task rather than hold its data (``description.*``, ``sample_submission*``,
``README*``) are left out. Only the first :data:`HEAD_BYTES` of at most :data:`TABLES_READ`
tables are read (:func:`category_of`, the thin part).
"""

from __future__ import annotations

import csv
import io
from pathlib import Path, PurePosixPath
from statistics import median
from typing import Mapping, Sequence

from wmrl.collection_tasks import CollectionTask
from wmrl.tasks import CATEGORIES, Task

IMAGE_EXTENSIONS = frozenset({".png", ".jpg", ".jpeg", ".gif", ".bmp", ".tif", ".tiff", ".webp", ".dcm"})
MEDIA_EXTENSIONS = frozenset({".wav", ".mp3", ".flac", ".ogg", ".aif", ".aiff", ".mp4", ".avi", ".mov", ".mkv"})
TABLE_EXTENSIONS = frozenset({".csv", ".tsv", ".parquet", ".feather", ".arff", ".xls", ".xlsx"})
TEXT_EXTENSIONS = frozenset({".txt", ".json", ".jsonl", ".xml", ".html", ".md"})
READABLE_TABLES = frozenset({".csv", ".tsv"})
MANY_FILES = 10
FREE_TEXT_WORDS = 8
HEAD_BYTES = 64 * 1024
TABLES_READ = 3
_NOT_DATA = ("description", "sample_submission", "samplesubmission", "readme")


def _is_data(path: str) -> bool:
    return not PurePosixPath(path).name.lower().startswith(_NOT_DATA)


def _suffix(path: str) -> str:
    return PurePosixPath(path).suffix.lower()


def has_free_text(head: str, delimiter: str = ",") -> bool:
    """Whether a table's first rows (``head``, its text cut anywhere) have a free-text column."""
    lines = head.splitlines()
    if len(lines) > 2:
        lines = lines[:-1]  # the last line may be cut off
    rows = [row for row in csv.reader(io.StringIO("\n".join(lines)), delimiter=delimiter) if row]
    if len(rows) < 2:
        return False
    for column in range(len(rows[0])):
        values = [row[column] for row in rows[1:] if column < len(row) and row[column].strip()]
        if len(values) >= 3 and median(len(v.split()) for v in values) >= FREE_TEXT_WORDS:
            return True
    return False


def infer_category(paths: Sequence[str], table_heads: Mapping[str, str]) -> str:
    """The category of a task whose public files are ``paths`` (relative), from the module's rules;
    ``table_heads``: the first bytes (decoded) of some of its CSV/TSV files, by path."""
    data = [p for p in paths if _is_data(p)]
    suffixes = [_suffix(p) for p in data]

    def plenty(kinds: frozenset) -> bool:
        count = sum(s in kinds for s in suffixes)
        return count >= MANY_FILES or (count > 0 and count * 2 > len(suffixes))

    if plenty(IMAGE_EXTENSIONS):
        return "image"
    if plenty(MEDIA_EXTENSIONS):
        return "other"
    tables = [p for p, s in zip(data, suffixes) if s in TABLE_EXTENSIONS]
    if any(has_free_text(head, "\t" if _suffix(path) == ".tsv" else ",")
           for path, head in table_heads.items() if _is_data(path)):
        return "text"
    if tables:
        return "tabular"
    if plenty(TEXT_EXTENSIONS):
        return "text"
    return "other"


def _tables_to_read(paths: Sequence[str]) -> list[str]:
    """Up to TABLES_READ readable tables, training files first."""
    tables = [p for p in paths if _is_data(p) and _suffix(p) in READABLE_TABLES]
    return sorted(tables, key=lambda p: ("train" not in PurePosixPath(p).name.lower(), p))[:TABLES_READ]


def _head(task: Task, path: str) -> str:
    if isinstance(task, CollectionTask):
        with open(Path(task.public_dir) / path, "rb") as handle:
            raw = handle.read(HEAD_BYTES)
    else:
        raw = bytes(task.data[path][:HEAD_BYTES])
    return raw.decode("utf-8", errors="replace")


def category_of(task: Task) -> str:
    """``task``'s declared category, else the one :func:`infer_category` gives for its public files."""
    if task.category:
        return task.category
    paths = [name for name, _ in task.public.listing] if isinstance(task, CollectionTask) else list(task.data)
    try:
        heads = {path: _head(task, path) for path in _tables_to_read(paths)}
    except OSError:
        heads = {}
    category = infer_category(paths, heads)
    assert category in CATEGORIES
    return category
