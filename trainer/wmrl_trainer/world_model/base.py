"""The world-model interface, the compile gate every backend runs first, and their shared plumbing.

A world model grades rollouts without running them: ``grade(items)`` maps items to predicted
:class:`~wmrl.outcome.Outcome`\\ s, or ``None`` for a rollout it could not grade (left out of
the loss by the trainer, never scored zero). An item is ``(task, code)`` or, for a turn of a
multi-turn trajectory, ``(task, code, history)`` with ``history`` the trajectory's earlier
turns as ``(code, observation)`` pairs, oldest first (see :func:`item_history`). ``observe``
feeds it a real outcome (from an anchor execution) to learn from; only the learned backend
uses it.
"""

from __future__ import annotations

import ast
import threading
from collections import Counter
from typing import Optional, Protocol, Sequence, Union, runtime_checkable

from wmrl.outcome import Outcome, Status
from wmrl.tasks import Task

History = tuple[tuple[str, str], ...]
"""A trajectory's earlier turns, oldest first: (code, observation) pairs, the observation being the text the
agent was shown after that turn. Empty for a first (or the only) turn."""

Item = Union[tuple[Task, str], tuple[Task, str, Sequence[tuple[str, str]]]]
"""What ``grade`` takes per rollout: ``(task, code)`` or ``(task, code, history)``."""


def item_history(item: Item) -> History:
    """The item's history (``()`` for a ``(task, code)`` item), as a tuple of (code, observation) pairs."""
    if len(item) == 2:
        return ()
    if len(item) != 3:
        raise ValueError(f"a world-model item is (task, code) or (task, code, history), got {len(item)} elements")
    return tuple((str(code), str(observation)) for code, observation in (item[2] or ()))


def item_parts(item: Item) -> tuple[Task, str, History]:
    """``(task, code, history)`` of an item of either form."""
    return item[0], item[1], item_history(item)

# SyntaxError messages that mean "the text stops mid-construct": a completion cut off at the
# token limit, which the ladder scores like malformed output rather than a real syntax error.
_EOF_HINTS = ("unexpected EOF", "was never closed")
_LAST_LINE_HINTS = ("expected an indented block", "unterminated string literal", "invalid syntax")


@runtime_checkable
class WorldModel(Protocol):
    def grade(self, items: Sequence[Item]) -> list[Optional[Outcome]]: ...

    def observe(self, task: Task, code: str, real_outcome: Optional[Outcome]) -> None: ...


def _syntax_feedback(exc: SyntaxError) -> str:
    text = (exc.text or "").rstrip("\n")
    caret = " " * max((exc.offset or 1) - 1 - (len(text) - len(text.lstrip())), 0) + "^"
    return (f'  File "main.py", line {exc.lineno}\n    {text.strip()}\n    {caret}\n'
            f"{type(exc).__name__}: {exc.msg}")


def _is_truncated(exc: SyntaxError, code: str) -> bool:
    msg = exc.msg or ""
    n_lines = len(code.rstrip().splitlines())
    if "unterminated triple-quoted string" in msg:  # everything after the opening quotes is inside it
        return True
    if any(h in msg for h in _EOF_HINTS):
        # An unclosed bracket far above the end, with complete lines after it, is a plain syntax error.
        return (exc.lineno or 0) >= n_lines - 2
    at_end = (exc.lineno or 0) >= n_lines and not code.endswith("\n")
    return at_end and any(h in msg for h in _LAST_LINE_HINTS)


def _is_prose(code: str) -> bool:
    """Compiles, but does nothing a program would: only bare names/constants (e.g. a sentence's first word)."""
    tree = ast.parse(code)
    return all(isinstance(node, ast.Expr) and isinstance(node.value, (ast.Constant, ast.Name)) for node in tree.body)


def compile_gate(code: str) -> Optional[Outcome]:
    """The deterministic first check: malformed or syntax_err (reward 0.0) without any model call, else None.

    malformed: empty, not text Python can read, cut off mid-construct, or no statements at all;
    syntax_err: Python's ``compile`` rejects it (with the line, as the sandbox would report).
    """
    if not isinstance(code, str) or not code.strip():
        return Outcome(status=Status.MALFORMED, feedback="empty solution: no code to run")
    if "\x00" in code:
        return Outcome(status=Status.MALFORMED, feedback="not a Python program: it contains null bytes")
    try:
        compile(code, "main.py", "exec", dont_inherit=True)
    except SyntaxError as exc:
        if _is_truncated(exc, code):
            return Outcome(status=Status.MALFORMED, error_type=type(exc).__name__, error_line=exc.lineno,
                           feedback="the solution is cut off mid-way:\n" + _syntax_feedback(exc))
        return Outcome(status=Status.SYNTAX_ERR, error_type=type(exc).__name__, error_line=exc.lineno,
                       feedback=_syntax_feedback(exc))
    except (ValueError, MemoryError, RecursionError) as exc:  # null bytes, absurd nesting
        return Outcome(status=Status.MALFORMED, error_type=type(exc).__name__, feedback=f"not a Python program: {exc}")
    if _is_prose(code):
        return Outcome(status=Status.MALFORMED, feedback="not a Python program: no statements to run")
    return None


class GatedWorldModel:
    """Base of the backends: the compile gate first, ``_predict`` for what passes it, counters.

    ``stats`` counts rollouts: ``gated`` (decided by the compile gate), ``predicted``,
    ``ungraded`` (the backend returned None) and backend-specific failure reasons.

    ``grade`` takes items of both forms. A backend that reads the trajectory's history sets
    ``uses_history = True`` and gets the items as given; any other backend (the learned one)
    gets plain ``(task, code)`` pairs, so it never sees a history it would not use.
    """

    uses_history: bool = False

    def __init__(self) -> None:
        self.stats: Counter[str] = Counter()
        self._stats_lock = threading.Lock()

    def count(self, key: str, n: int = 1) -> None:
        with self._stats_lock:
            self.stats[key] += n

    def grade(self, items: Sequence[Item]) -> list[Optional[Outcome]]:
        results: list[Optional[Outcome]] = [None] * len(items)
        todo = []
        for i, item in enumerate(items):
            gated = compile_gate(item[1])
            if gated is not None:
                results[i] = gated
            else:
                todo.append(i)
        self.count("gated", len(items) - len(todo))
        if todo:
            predicted = self._predict([items[i] if self.uses_history else (items[i][0], items[i][1]) for i in todo])
            if len(predicted) != len(todo):
                raise RuntimeError(f"{type(self).__name__} returned {len(predicted)} outcomes for {len(todo)} rollouts")
            for i, outcome in zip(todo, predicted):
                results[i] = outcome
            ungraded = sum(o is None for o in predicted)
            self.count("predicted", len(todo) - ungraded)
            self.count("ungraded", ungraded)
        return results

    def _predict(self, items: Sequence[Item]) -> list[Optional[Outcome]]:
        raise NotImplementedError

    def observe(self, task: Task, code: str, real_outcome: Optional[Outcome]) -> None:
        """Prompted models do not learn from real outcomes (as in the paper)."""

    def close(self) -> None:
        """Release clients and threads (no-op by default)."""
