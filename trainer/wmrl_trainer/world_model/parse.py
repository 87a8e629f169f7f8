"""Turn a world model's text answer into one Outcome (shared by the llm and transformers backends).

The answer should be ``{"predictions": [...]}`` (see :func:`wmrl_trainer.prompts.outcome_json_schema`).
Guided decoding makes that exact on vLLM; unguided models may wrap it in prose or a code
fence, so the first balanced JSON object in the text is used. Each prediction is checked on
its own; the answer's outcome is the first well-formed prediction with the most frequent
status among the well-formed ones. No well-formed prediction -> ``None`` (ungraded).
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any, Optional

from pydantic import ValidationError

from wmrl.outcome import Outcome, Status

FEEDBACK_CHARS = 2000


def _first_json_object(text: str) -> Optional[Any]:
    decoder = json.JSONDecoder()
    start = text.find("{")
    while start != -1:
        try:
            value, _ = decoder.raw_decode(text, start)
            return value
        except json.JSONDecodeError:
            start = text.find("{", start + 1)
    return None


def predictions_from_text(text: str) -> list[dict]:
    """The raw prediction dicts in an answer ([] if there is no usable JSON)."""
    if not isinstance(text, str):
        return []
    value = _first_json_object(text)
    if isinstance(value, dict) and isinstance(value.get("predictions"), list):
        return [p for p in value["predictions"] if isinstance(p, dict)]
    if isinstance(value, dict) and "status" in value:  # a single prediction without the wrapper
        return [value]
    return []


def outcome_from_prediction(pred: dict) -> Optional[Outcome]:
    """One prediction -> Outcome, or None if it is not well-formed (unknown status, valid without a bucket...)."""
    try:
        status = Status(pred.get("status"))
    except ValueError:
        return None
    bucket = pred.get("quality_bucket") if status is Status.VALID else None
    line = pred.get("error_line")
    error_type = pred.get("error_type")
    feedback = pred.get("env_feedback")
    try:
        return Outcome(
            status=status,
            error_type=str(error_type)[:200] if error_type and status is not Status.VALID else None,
            error_line=line if isinstance(line, int) and not isinstance(line, bool) and line >= 0 and status is not Status.VALID else None,
            quality_bucket=bucket,
            feedback=str(feedback)[:FEEDBACK_CHARS] if feedback is not None else "",
        )
    except ValidationError:
        return None


def outcome_from_text(text: str) -> Optional[Outcome]:
    """The answer's outcome (see the module docstring), or None if no prediction is usable."""
    outcomes = [o for o in map(outcome_from_prediction, predictions_from_text(text)) if o is not None]
    if not outcomes:
        return None
    counts = Counter(o.status for o in outcomes)
    top = max(counts.values())
    return next(o for o in outcomes if counts[o.status] == top)
