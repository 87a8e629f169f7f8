"""Revise-after-feedback examples for the multi-turn tiny coder's warm start.

A two-turn example is ``prompt, script 1, observation of script 1, script 2``: the
observation is what the trainer would show after script 1 (:func:`wmrl_trainer.observation.observation_text`
of the outcome the sandbox reports for it), and script 2 is a revision. The outcome is
known without running anything: every mistake in the chunk library fails in one known
way (:data:`MISTAKES`), a classifier cannot fit a regression target, and a sensible
script is valid (its quality is drawn at random: the warm start does not know the
leaderboard; RL learns it).

Revisions are deliberately mediocre, so that RL has room to improve them: with
probability :data:`REPAIR_PROBABILITY` script 2 replaces the chunk that failed with a
sensible chunk of the same slot (the estimator of the task's kind only with the warm
start's :data:`~wmrl_demo.solutions.KIND_MATCH`), otherwise it is a fresh random script.
"""

from __future__ import annotations

import random
from typing import Optional

from wmrl.outcome import Outcome, QualityBucket, Status
from wmrl_demo import solutions
from wmrl_demo.solutions import Chunk

REPAIR_PROBABILITY = 0.4
REVISE_SHARE = 0.5
"""Share of the warm start's examples that are two-turn revisions (the rest are single scripts)."""

MISTAKES: dict[str, tuple[Status, str, str]] = {
    # chunk name: (status, error type, a text on the line the error is reported at)
    "load_syntax_error": (Status.SYNTAX_ERR, "SyntaxError", "np.loadtxt('data/train.csv'"),
    "model_syntax_error": (Status.SYNTAX_ERR, "SyntaxError", "RandomForestClassifier(n_estimators=100\n"),
    "load_wrong_path": (Status.RUNTIME_ERR, "FileNotFoundError", "np.loadtxt('train.csv'"),
    "scaler_typo": (Status.RUNTIME_ERR, "AttributeError", "fit_transfrom"),
    "fit_wrong_api": (Status.RUNTIME_ERR, "AttributeError", "model.train("),
    "write_wrong_header": (Status.RAN_NO_SUB, "", ""),
    "print_only": (Status.RAN_NO_SUB, "", ""),
}
_ORDER = (Status.SYNTAX_ERR, Status.RUNTIME_ERR, Status.RAN_NO_SUB)  # Python compiles first, then runs in order


def _line_of(code: str, text: str) -> Optional[int]:
    start = code.find(text.rstrip("\n"))
    return code.count("\n", 0, start) + 1 if start >= 0 else None


def simulated_outcome(script: list[Chunk], kind: str, rng: random.Random) -> tuple[Outcome, Optional[Chunk]]:
    """(what the sandbox reports for ``script`` on a task of ``kind``, the chunk to blame or None)."""
    code = solutions.render(script)
    for status in _ORDER:
        for chunk in script:
            mistake = MISTAKES.get(chunk.name)
            if mistake and mistake[0] is status:
                _, error, where = mistake
                return Outcome(status=status, error_type=error or None, error_line=_line_of(code, where) if where else None,
                               feedback=f"{error}: (simulated)" if error else "no valid submission.csv (simulated)"), chunk
    solve = script[-1]
    if kind == "regression" and solve.fits == "classification":
        return Outcome(status=Status.RUNTIME_ERR, error_type="ValueError", error_line=_line_of(code, "model.fit("),
                       feedback="ValueError: Unknown label type: continuous (simulated)"), solve
    if solve.name.startswith("dummy") or (kind == "classification" and solve.fits == "regression"):
        return Outcome(status=Status.VALID, quality_bucket=QualityBucket.LOW, feedback="scored (simulated)"), solve
    bucket = rng.choice([QualityBucket.FAIR, QualityBucket.MID, QualityBucket.HIGH])
    return Outcome(status=Status.VALID, quality_bucket=bucket, feedback="scored (simulated)"), None


def revise(script: list[Chunk], blamed: Optional[Chunk], kind: str, rng: random.Random) -> list[Chunk]:
    """Script 2 after script 1: a repair of the blamed chunk (sometimes) or a fresh random script."""
    if blamed is None or rng.random() >= REPAIR_PROBABILITY:
        return solutions.sample_script(rng, kind)
    choices = solutions.slot_chunks(blamed.slot, bad=False)
    if blamed.slot == "solve":
        wanted = kind if rng.random() < solutions.KIND_MATCH else ("regression" if kind == "classification" else "classification")
        choices = [c for c in choices if c.fits == wanted]
    replacement = rng.choice(choices)
    return [replacement if c is blamed else c for c in script]
