"""Reading a JSON-lines input file strictly: every line an object, a bad one named by file and line.

For files a person hands to a command (fidelity cases, few-shot examples), where a line that is
not JSON is an error to report, not a line to skip (the trajectory logs' reader skips a line cut
short by a crash instead).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator


def json_lines(path: str | Path, label: str, error: type[Exception]) -> Iterator[tuple[int, object]]:
    """(line number, parsed value) of every non-blank line; ``error`` naming ``label`` and the line when a
    line is not JSON or the file cannot be read."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise error(f"{label}: cannot read it ({exc})") from exc
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            yield n, json.loads(line)
        except ValueError as exc:
            raise error(f"{label}:{n}: not JSON ({exc})") from exc
