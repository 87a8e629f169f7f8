"""What a world model said beyond its outcome: the reason and every prediction of its answer.

:class:`~wmrl.outcome.Outcome` holds what is graded; the llm and transformers backends' answers
carry more (top-k predictions, each with a ``reason``), which only the trajectory logs
(:mod:`wmrl_trainer.trajectory_log`) read. :func:`explain` attaches it to an outcome object in
a side table keyed by the object (dropped when the outcome is), so outcomes compare, pickle
and serialise exactly as before; :func:`explanation` reads it back (None when the backend
gave none, or for a copy of the outcome).
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Optional

_TABLE: dict[int, tuple[weakref.ref, dict[str, Any]]] = {}
_LOCK = threading.Lock()


def _forget(key: int) -> None:
    with _LOCK:
        _TABLE.pop(key, None)


def explain(outcome: Any, info: dict[str, Any]) -> Any:
    """Attach ``info`` (JSON-able) to ``outcome``; returns the outcome."""
    if outcome is not None:
        key = id(outcome)
        with _LOCK:
            _TABLE[key] = (weakref.ref(outcome, lambda _ref, k=key: _forget(k)), info)
    return outcome


def explanation(outcome: Any) -> Optional[dict[str, Any]]:
    """What :func:`explain` attached to this very object, or None."""
    if outcome is None:
        return None
    with _LOCK:
        entry = _TABLE.get(id(outcome))
    if entry is None or entry[0]() is not outcome:
        return None
    return entry[1]
