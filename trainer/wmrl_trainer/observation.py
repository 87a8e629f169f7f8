"""What a multi-turn agent is shown after each turn: the observation built from an outcome.

The same text for every policy and for both graders: a one-line header with the status,
the error type, the kind of the failing line and the quality bucket (``key=value`` words a
small policy can read as single tokens, see :mod:`wmrl_demo.demo_policy`), then the output
(the sandbox's own, or the world model's imitation of it) between ``<output>`` tags, then
the request for a revised script. The output is cut to its last :data:`OUTPUT_CHARS`
characters: a traceback ends with the error.
"""

from __future__ import annotations

import re
from typing import Optional

from wmrl.outcome import Outcome, Status, quality_of

OUTPUT_CHARS = 1200
REVISE_REQUEST = "Revise the script and reply with the complete new script in a single ```python code block."
"""The observation's last line: the request for the next turn (the world model's prompt leaves it out)."""
HEADER = "[execution]"
LINE_KINDS: tuple[str, ...] = ("import", "load", "preprocess", "model", "fit", "predict", "write", "other")
ERROR_TYPES: tuple[str, ...] = (
    "SyntaxError", "IndentationError", "NameError", "AttributeError", "ValueError", "TypeError", "IndexError",
    "KeyError", "FileNotFoundError", "OSError", "ModuleNotFoundError", "ImportError", "MemoryError",
    "ZeroDivisionError", "TimeLimitExceeded", "Exception",
)
"""Error types with a header word of their own; any other type is shown as ``error=other``."""

_KIND_RULES: tuple[tuple[str, re.Pattern], ...] = (
    ("import", re.compile(r"^\s*(import|from)\s")),
    ("load", re.compile(r"loadtxt|genfromtxt|read_csv|np\.load\b|\bopen\(")),
    ("write", re.compile(r"savetxt|to_csv|submission")),
    ("preprocess", re.compile(r"Scaler|PolynomialFeatures|transform|PCA|Imputer|Encoder")),
    ("fit", re.compile(r"\.(fit|train|partial_fit)\(")),
    ("predict", re.compile(r"\.predict(_proba)?\(")),
    ("model", re.compile(r"^\s*\w+\s*=\s*[A-Z]\w*\(")),
)


def line_kind(code: str, line: Optional[int]) -> Optional[str]:
    """What the script's line ``line`` (1-based) does, one of :data:`LINE_KINDS`; None without a line."""
    lines = code.splitlines()
    if not line or not 1 <= line <= len(lines):
        return None
    text = lines[line - 1]
    return next((kind for kind, rule in _KIND_RULES if rule.search(text)), "other")


def header(outcome: Outcome, code: str) -> str:
    """``[execution] status=... error=... where=... quality=...`` (``none`` where a field does not apply)."""
    failed = outcome.status in (Status.SYNTAX_ERR, Status.RUNTIME_ERR, Status.MALFORMED)
    error = (outcome.error_type if outcome.error_type in ERROR_TYPES else "other") if failed and outcome.error_type else "none"
    where = (line_kind(code, outcome.error_line) or "none") if failed else "none"
    quality = quality_of(outcome)
    return (f"{HEADER} status={outcome.status.value} error={error} where={where} "
            f"quality={quality.value if quality is not None else 'none'}")


def observation_text(outcome: Outcome, code: str) -> str:
    """The observation appended to the conversation after a turn whose script is ``code``."""
    output = (outcome.feedback or "").strip()
    if len(output) > OUTPUT_CHARS:
        output = "..." + output[-OUTPUT_CHARS:]
    return f"\n{header(outcome, code)}\n<output>\n{output}\n</output>\n{REVISE_REQUEST}\n"
