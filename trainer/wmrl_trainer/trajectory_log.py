"""Trajectory logs: what each trajectory of a step wrote, saw and earned, as JSON lines.

``spec.logging.trajectories`` (``sampleRate`` > 0) turns them on: every training process
appends its sampled rows of every step to ``<checkpoint dir>/trajectories/rank-<r>.jsonl``.
One line per trajectory::

    {"step": 3, "rank": 0, "row": 5, "group": 2, "task": "iris", "anchor": true, "mode": "wmrl",
     "prompt": ..., "turns": [{"text": ..., "code": ..., "observation": ..., "shown": "real",
                               "world_model": {"status": "valid", ..., "reason": ..., "predictions": [...]},
                               "real": {"status": "valid", "rank_score": 0.9, "reward": 0.95, ...}}],
     "stop": "top", "reward": 0.95, "raw_reward": 0.7, "calibrated_reward": 0.8, "real_reward": 0.95,
     "disagreement": 0.25, "advantage": 1.2, "weight": 2.0, "graded": true}

``reward`` is what the row trained on; ``raw_reward`` / ``calibrated_reward`` /
``real_reward`` the world model's, the calibrated and the real one (null where there is
none); ``disagreement`` = |raw - real| where both exist; ``weight`` the anchor weight applied
to the row's advantage (1 for other rows); ``shown`` which grade the turn's observation came
from. A world model's ``reason`` and ``predictions`` appear where the backend gives them
(llm, transformers). Turns are those of the trajectory (several with maxTurns > 1).

Which rows: a row is logged when a hash of (seed, step, row) falls under ``sampleRate``
(:func:`is_sampled`), so every process agrees and a rerun logs the same rows. Rank 0 grades
and knows every turn's grades; it picks them out for the sampled rows only
(:func:`turn_log`) and they travel with the step's shared result, so each process writes
its own rows with its own prompts and texts. Files rotate by size (:class:`RotatingJsonl`):
before a write would take ``rank-<r>.jsonl`` past ``maxFileBytes`` it becomes ``.1`` (``.1``
becomes ``.2`` ...), and ``keepFiles`` rotated files are kept. Each step's lines are written
and fsynced together, so a crash loses at most the step being written. ``wmrl trajectories``
(:mod:`wmrl_trainer.trajectories_cli`) reads and filters them.
"""

from __future__ import annotations

import json
import math
import os
import zlib
from pathlib import Path
from typing import Any, Optional, Sequence

from wmrl.outcome import Outcome
from wmrl_trainer.observation import observation_text
from wmrl_trainer.world_model.explain import explanation

LOG_DIR = "trajectories"


def is_sampled(seed: int, step: int, row: int, rate: float) -> bool:
    """Whether row ``row`` of step ``step`` is logged at ``rate`` (deterministic: every process agrees)."""
    if rate <= 0:
        return False
    if rate >= 1:
        return True
    return zlib.crc32(f"{seed}:{step}:{row}".encode()) / 2 ** 32 < rate


def outcome_json(outcome: Optional[Outcome]) -> Optional[dict[str, Any]]:
    """An outcome as logged: its fields, its reward and what the world model said besides (when it did)."""
    if outcome is None:
        return None
    data = outcome.model_dump(mode="json", exclude_none=True)
    data["reward"] = outcome.reward
    extra = explanation(outcome)
    if extra:
        data.update({k: v for k, v in extra.items() if v is not None})
    return data


def _turn(code: str, world_model: Optional[Outcome], real: Optional[Outcome], shown: Optional[Outcome],
          observation: str) -> dict[str, Any]:
    which = None if shown is None else "real" if shown is real else "world_model"
    return {"code": code, "observation": observation, "shown": which,
            "world_model": outcome_json(world_model), "real": outcome_json(real)}


def turn_log(scored: Any, codes: Sequence[Sequence[str]], rows: Sequence[int], group_size: int) -> dict[int, dict]:
    """The grades of the batch rows ``rows`` (rank 0, which graded them): row -> {"turns", "stop"}.

    ``codes``: single turns, the batch's script per group row ``[n_groups][G]`` (multi-turn
    trajectories keep their own). JSON-able, so it travels with the step's shared result.
    """
    found: dict[int, dict] = {}
    batch = scored.trajectories
    anchors = set(scored.anchor_groups)
    for row in rows:
        g, i = divmod(row, group_size)
        if batch is not None:
            trajectory = batch.get((g, i))
            found[row] = {"turns": [_turn(t.code, t.world_model, t.real, t.shown, t.observation)
                                    for t in trajectory.turns], "stop": trajectory.stop}
            continue
        wm = scored.wm_outcomes[g][i] if scored.wm_outcomes is not None else None
        real = scored.real_outcomes[g][i] if scored.real_outcomes is not None else None
        shown = real if (g in anchors or wm is None) and real is not None else wm
        code = codes[g][i]
        found[row] = {"turns": [_turn(code, wm, real, shown, observation_text(shown, code) if shown else "")],
                      "stop": None}
    return found


def _number(value: float) -> Optional[float]:
    return None if value is None or math.isnan(value) else float(value)


def trajectory_entry(*, step: int, rank: int, row: int, group_size: int, task: str, mode: str, prompt: Any,
                     texts: Sequence[str], scored: Any, advantage: float, graded: bool) -> dict[str, Any]:
    """One log line (module docstring) from the step's shared result and this process's own row."""
    g, i = divmod(row, group_size)
    logged = (scored.turn_log or {}).get(row, {"turns": [], "stop": None})
    turns = [dict(turn) for turn in logged["turns"]]
    for n, turn in enumerate(turns):
        turn["text"] = texts[n] if n < len(texts) else None
    anchor = g in set(scored.anchor_groups)
    raw, real = _number(scored.world_model[g, i]), _number(scored.real[g, i])
    return {
        "step": step, "rank": rank, "row": row, "group": g, "task": task, "anchor": anchor, "mode": mode,
        "prompt": prompt, "turns": turns, "stop": logged["stop"],
        "reward": _number(scored.rewards[g, i]), "raw_reward": raw, "calibrated_reward": _number(scored.calibrated[g, i]),
        "real_reward": real, "disagreement": abs(raw - real) if raw is not None and real is not None else None,
        "advantage": float(advantage), "weight": float(scored.weight) if anchor else 1.0, "graded": bool(graded),
    }


class RotatingJsonl:
    """Append-only JSON lines with size rotation (``path`` -> ``path.1`` -> ... ``path.<keep>``)."""

    def __init__(self, path: Path, max_bytes: int, keep: int):
        if max_bytes < 1 or keep < 0:
            raise ValueError(f"max_bytes must be >= 1 and keep >= 0, got {max_bytes} and {keep}")
        self.path, self.max_bytes, self.keep = Path(path), max_bytes, keep

    def rotated(self, n: int) -> Path:
        return self.path.with_name(f"{self.path.name}.{n}")

    def _rotate(self) -> None:
        if self.keep == 0:
            self.path.unlink(missing_ok=True)
            return
        self.rotated(self.keep).unlink(missing_ok=True)
        for n in range(self.keep - 1, 0, -1):
            if self.rotated(n).exists():
                os.replace(self.rotated(n), self.rotated(n + 1))
        os.replace(self.path, self.rotated(1))

    def append(self, entries: Sequence[dict[str, Any]]) -> None:
        """Write ``entries`` (one step's) and fsync; rotate first where a line would not fit."""
        if not entries:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lines = [json.dumps(e, default=float, ensure_ascii=False) + "\n" for e in entries]
        fh = open(self.path, "a", encoding="utf-8")
        try:
            size = fh.tell()
            for line in lines:
                length = len(line.encode("utf-8"))
                if size > 0 and size + length > self.max_bytes:
                    fh.flush()
                    os.fsync(fh.fileno())
                    fh.close()
                    self._rotate()
                    fh = open(self.path, "a", encoding="utf-8")
                    size = 0
                fh.write(line)
                size += length
            fh.flush()
            os.fsync(fh.fileno())
        finally:
            fh.close()


class TrajectoryLogger:
    """One process's trajectory log: :meth:`rows` says which batch rows to log, :meth:`write` logs them."""

    def __init__(self, directory: Path, rank: int, sample_rate: float, max_bytes: int, keep: int, seed: int):
        self.rank, self.rate, self.seed = rank, sample_rate, seed
        self.file = RotatingJsonl(Path(directory) / f"rank-{rank}.jsonl", max_bytes, keep)

    @classmethod
    def from_spec(cls, spec: Any, checkpoint_dir: str | Path, rank: int) -> Optional["TrajectoryLogger"]:
        """The logger ``spec.logging.trajectories`` asks for, or None when its sampleRate is 0."""
        t = spec.logging.trajectories
        if t.sample_rate <= 0:
            return None
        return cls(Path(checkpoint_dir) / LOG_DIR, rank, t.sample_rate, t.max_file_bytes, t.keep_files,
                   spec.algorithm.seed)

    def rows(self, step: int, batch_rows: int) -> list[int]:
        return [row for row in range(batch_rows) if is_sampled(self.seed, step, row, self.rate)]

    def write(self, entries: Sequence[dict[str, Any]]) -> None:
        self.file.append(entries)
