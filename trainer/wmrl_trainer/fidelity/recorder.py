"""The training side of fidelity: anchors' cases to the checkpoint volume, and the rolling figures.

Rank 0 (which grades) hands every executed anchor script of a step to :meth:`CaseRecorder.record`:
its task, code and trajectory so far, the world model's prediction and the real outcome. Each
becomes a line of ``<checkpoint dir>/fidelity/cases.jsonl`` (:mod:`.cases`; rotated by size like
the trajectory logs, :class:`~wmrl_trainer.trajectory_log.RotatingJsonl`), so every run builds
its own fidelity set for ``wmrl eval world-model``. The latest ``window`` cases give the rolling
figures (``status.progress.fidelity``, the ``wmrl_trainer_world_model_fidelity`` gauges):
status@1, reward MAE and bias of the run's world model as it graded them, over the cases it
graded. The window and the count of cases written are checkpointed, so a resumed run goes on
from them; a case file that cannot be written (a full volume) is logged and never stops
training, and the figures still follow the anchors.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import asdict
from pathlib import Path
from typing import Any, NamedTuple, Optional, Sequence

from wmrl.outcome import Outcome
from wmrl.tasks import Task
from wmrl_trainer.fidelity.cases import CASE_FILE, case_json
from wmrl_trainer.fidelity.judge import judged
from wmrl_trainer.fidelity.metrics import Judged, rolling
from wmrl_trainer.prompts import task_context
from wmrl_trainer.trajectory_log import RotatingJsonl

log = logging.getLogger("wmrl.trainer.fidelity")
CASE_DIR = "fidelity"


class AnchorCase(NamedTuple):
    """One executed anchor script: what the world model saw and said, and what really happened."""

    task: Task
    code: str
    history: tuple[tuple[str, str], ...]
    world_model: Optional[Outcome]
    real: Outcome
    source: dict[str, Any]


class CaseRecorder:
    """One run's case file and rolling fidelity window (see the module docstring)."""

    def __init__(self, directory: str | Path, *, window: int = 256, max_bytes: int = 32 * 1024 * 1024, keep: int = 4,
                 run: str = ""):
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.file = RotatingJsonl(Path(directory) / CASE_FILE, max_bytes, keep)
        self.window: deque[Judged] = deque(maxlen=window)
        self.run = run
        self.recorded = 0
        self.write_failures = 0
        self._contexts: dict[str, dict[str, Any]] = {}

    @classmethod
    def from_spec(cls, spec: Any, checkpoint_dir: str | Path, run: str = "") -> Optional["CaseRecorder"]:
        """The recorder ``spec.logging.cases`` asks for (mode wmrl), or None."""
        c = spec.logging.cases
        if not c.enabled or spec.mode.value != "wmrl":
            return None
        return cls(Path(checkpoint_dir) / CASE_DIR, window=c.window, max_bytes=c.max_file_bytes, keep=c.keep_files,
                   run=run)

    def _context(self, task: Task) -> dict[str, Any]:
        """The task's prompt context, built once per task (a collection task's data overview reads its files)."""
        if task.name not in self._contexts:
            self._contexts[task.name] = task_context(task)
        return self._contexts[task.name]

    def record(self, cases: Sequence[AnchorCase]) -> Optional[dict[str, Any]]:
        """Write ``cases`` (one step's), add them to the window; the rolling figures (None before any case)."""
        lines = []
        for task, code, history, world_model, real, source in cases:
            self.window.append(judged(real, world_model))
            lines.append(case_json(task, code, real, history=history, world_model=world_model,
                                   source={"run": self.run, **source}, context=self._context(task)))
        if lines:
            try:
                self.file.append(lines)
                self.recorded += len(lines)
            except OSError as exc:  # a full volume must not stop training; the figures still follow the anchors
                self.write_failures += 1
                log.warning("writing %d fidelity cases to %s failed: %s", len(lines), self.file.path, exc)
        return self.figures()

    def figures(self) -> Optional[dict[str, Any]]:
        """The rolling figures of the window, with the count of cases written and the file."""
        if not self.window:
            return None
        return {**rolling(list(self.window)), "recorded": self.recorded, "file": str(self.file.path)}

    def state_dict(self) -> dict[str, Any]:
        return {"recorded": self.recorded, "window": [asdict(j) for j in self.window]}

    def load_state_dict(self, data: dict[str, Any]) -> None:
        self.recorded = int(data.get("recorded", 0))
        self.window.clear()
        for item in data.get("window", []):
            self.window.append(Judged(**{**item, "predicted": tuple(item.get("predicted") or ())}))
