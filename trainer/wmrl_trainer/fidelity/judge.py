"""A world model's answer on one case as the metrics see it (:class:`~.metrics.Judged`).

The llm and transformers backends answer with top-k predictions (their raw predictions travel
with the outcome, :mod:`wmrl_trainer.world_model.explain`): :func:`ranked` reads them back as
outcomes with distinct statuses, most likely first, as the parser takes them. The learned
judge and the compile gate give one outcome.
"""

from __future__ import annotations

from typing import Optional

from wmrl.outcome import Outcome
from wmrl_trainer.fidelity.metrics import Judged
from wmrl_trainer.world_model.explain import explanation
from wmrl_trainer.world_model.parse import outcome_from_prediction


def ranked(outcome: Optional[Outcome]) -> list[Outcome]:
    """The predictions behind ``outcome``, most likely first, distinct statuses ([] for None)."""
    if outcome is None:
        return []
    found = [outcome]
    for raw in (explanation(outcome) or {}).get("predictions") or []:
        candidate = outcome_from_prediction(raw) if isinstance(raw, dict) else None
        if candidate is not None and all(o.status is not candidate.status for o in found):
            found.append(candidate)
    return found


def judged(real: Outcome, predicted: Optional[Outcome], *, gated: bool = False,
           latency: Optional[float] = None) -> Judged:
    """One case for the metrics: ``real`` against the world model's ``predicted`` (None: ungraded)."""
    top = ranked(predicted)
    return Judged(real_status=real.status.value, real_reward=real.reward, real_error=real.error_type,
                  predicted=tuple(o.status.value for o in top),
                  predicted_reward=top[0].reward if top else None,
                  predicted_error=top[0].error_type if top else None, gated=gated, latency=latency)


def prediction_json(outcome: Outcome) -> dict:
    """One prediction as a report lists it."""
    return {"status": outcome.status.value, "error_type": outcome.error_type, "error_line": outcome.error_line,
            "quality_bucket": outcome.quality_bucket.value if outcome.quality_bucket else None,
            "reward": outcome.reward}
