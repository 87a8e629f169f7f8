"""Few-shot curation: real cases picked to show a prompted world model what really happens.

From a set of cases, :func:`curate` picks one example per *failure kind* the model is asked
about, plus a low- and a high-quality valid run:

* failure kinds: each exception class of the real runtime errors (``runtime_err:NameError``, ...)
  and ``ran_no_sub``, most frequent first. ``malformed`` and ``syntax_err`` are not among them:
  the compile gate decides those without asking the model, so an example of them would only
  lengthen the prompt;
* ``valid-low``: the valid run with the lowest real leaderboard position; ``valid-high``: the
  one with the highest (another case than ``valid-low``);
* within a kind, the shortest script (fewer prompt tokens), the earliest on a tie;
* at most ``max_examples`` in all: the two valid ones are kept, the rarest failure kinds are
  dropped first. Scripts longer than a few-shot example may hold are never picked.

Each example carries its real outcome (quality bucket from the real position, the sandbox's
output cut to the world model's feedback length, its tail: a traceback ends there), its kind
and its source (file and line). Pure: the same cases give the same examples.
"""

from __future__ import annotations

from collections import Counter
from typing import Optional, Sequence

from wmrl.api.schema import FEW_SHOT_CODE_CHARS, FEW_SHOT_FEEDBACK_CHARS, FewShotExample
from wmrl.outcome import Status, quality_of
from wmrl_trainer.fidelity.cases import Case
from wmrl_trainer.fidelity.metrics import error_class
from wmrl_trainer.world_model.base import compile_gate

DEFAULT_MAX_EXAMPLES = 8


def failure_kind(case: Case) -> Optional[str]:
    """The failure kind a case shows (module docstring), or None (valid, or decided by the compile gate)."""
    status = case.real.status
    if status is Status.RAN_NO_SUB:
        return "ran_no_sub"
    if status is Status.RUNTIME_ERR:
        return f"runtime_err:{error_class(case.real.error_type) or 'unknown'}"
    return None


def _feedback(text: str) -> str:
    text = text.strip()
    return text if len(text) <= FEW_SHOT_FEEDBACK_CHARS else "..." + text[-(FEW_SHOT_FEEDBACK_CHARS - 3):]


def example_of(case: Case, kind: str) -> FewShotExample:
    """``case`` as a few-shot example of ``kind``."""
    real = case.real
    bucket = quality_of(real)
    return FewShotExample(task=case.task.name, code=case.code, status=real.status.value,
                          error_type=error_class(real.error_type) if real.status is not Status.VALID else None,
                          error_line=real.error_line if real.status is not Status.VALID else None,
                          quality_bucket=bucket.value if bucket is not None else None,
                          feedback=_feedback(real.feedback or ""), kind=kind, source=case.where or None)


def _usable(case: Case) -> bool:
    return bool(case.code.strip()) and len(case.code) <= FEW_SHOT_CODE_CHARS and compile_gate(case.code) is None


def curate(cases: Sequence[Case], max_examples: int = DEFAULT_MAX_EXAMPLES) -> list[tuple[Case, FewShotExample]]:
    """The picked (case, example) pairs: failure kinds first (most frequent first), then valid-low, valid-high."""
    if max_examples < 1:
        raise ValueError(f"max_examples must be >= 1, got {max_examples}")
    order = {id(c): n for n, c in enumerate(cases)}
    usable = [c for c in cases if _usable(c)]
    shortest = lambda c: (len(c.code), order[id(c)])  # noqa: E731
    kinds = Counter(k for k in map(failure_kind, usable) if k is not None)
    valid = [c for c in usable if c.real.status is Status.VALID]
    picked_valid: list[tuple[Case, str]] = []
    if valid:
        low = min(valid, key=lambda c: (c.real.rank_score, *shortest(c)))
        picked_valid.append((low, "valid-low"))
        rest = [c for c in valid if c is not low]
        if rest:
            picked_valid.append((min(rest, key=lambda c: (-c.real.rank_score, *shortest(c))), "valid-high"))
    room = max(0, max_examples - len(picked_valid))
    picked_failures = []
    for kind, _ in sorted(kinds.items(), key=lambda kv: (-kv[1], kv[0]))[:room]:
        case = min((c for c in usable if failure_kind(c) == kind), key=shortest)
        picked_failures.append((case, kind))
    chosen = picked_failures + picked_valid[:max_examples]
    return [(case, example_of(case, kind)) for case, kind in chosen]
