"""Turn a world model's text answer into one Outcome (shared by the llm and transformers backends).

The answer should be ``{"predictions": [...]}`` (see :func:`wmrl_trainer.prompts.outcome_json_schema`).
Guided decoding makes that exact on vLLM; unguided models may wrap it in prose or a code
fence, so the first balanced JSON object in the text is used (after a ``</think>`` if the
model thought aloud first). Each prediction is checked on its own; its ``reason`` is optional
(unguided models may leave it out) and never used, its ``env_feedback`` is cut to
:data:`FEEDBACK_CHARS` characters.

Predictions are distinct alternatives: the prompt, like the reference implementation, asks
for top-k outcomes with k different statuses, so a later well-formed prediction whose status
repeats an earlier well-formed one is dropped (it is the same alternative again, not a vote).
The answer's outcome is the first well-formed prediction that remains: the most likely
one. (The rule that took the most frequent status among the predictions reduces to this
once statuses are distinct, and a model that repeats a status against the instruction no
longer wins a majority with it.) No well-formed prediction -> ``None`` (ungraded).
"""

from __future__ import annotations

import json
from typing import Any, Optional

from pydantic import ValidationError

from wmrl.outcome import Outcome, Status
from wmrl_trainer.prompts import ENV_FEEDBACK_CHARS
from wmrl_trainer.world_model.explain import explain

FEEDBACK_CHARS = ENV_FEEDBACK_CHARS
THINK_END = "</think>"


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
    if THINK_END in text:  # a reasoning model's thoughts come first; the answer follows them
        text = text.rsplit(THINK_END, 1)[1]
    value = _first_json_object(text)
    if isinstance(value, dict) and isinstance(value.get("predictions"), list):
        return [p for p in value["predictions"] if isinstance(p, dict)]
    if isinstance(value, dict) and "status" in value:  # a single prediction without the wrapper
        return [value]
    return []


def outcome_from_prediction(pred: dict) -> Optional[Outcome]:
    """One prediction -> Outcome, or None if it is not well-formed (unknown status, valid without a bucket...).

    ``reason`` may be present or not; it is not part of the outcome."""
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


def outcomes_from_text(text: str) -> list[Outcome]:
    """The answer's well-formed predictions with distinct statuses, most likely first (module docstring)."""
    outcomes: list[Outcome] = []
    for outcome in map(outcome_from_prediction, predictions_from_text(text)):
        if outcome is not None and all(o.status is not outcome.status for o in outcomes):
            outcomes.append(outcome)
    return outcomes


def outcome_from_text(text: str) -> Optional[Outcome]:
    """The answer's outcome: its first well-formed prediction (see the module docstring), or None if
    no prediction is usable. The answer's raw predictions (with their ``reason``) are attached for
    the trajectory logs (:func:`wmrl_trainer.world_model.explain.explanation`)."""
    outcomes = outcomes_from_text(text)
    if not outcomes:
        return None
    predictions = predictions_from_text(text)
    chosen = next(p for p in predictions if outcome_from_prediction(p) is not None)  # the outcome's own
    reason = chosen.get("reason") if isinstance(chosen.get("reason"), str) else None
    return explain(outcomes[0], {"reason": reason, "predictions": predictions})
