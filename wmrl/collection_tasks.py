"""A task from a benchmark collection (MLE-bench, MLE-Dojo, DSBench, the normalised layout).

Unlike the small wmrl format, a collection task holds no data: it references its public directory
(what a solution sees), its private answers file and its grader. :class:`CollectionTask` extends
:class:`wmrl.tasks.Task`, so the prompt, world model and sandbox dispatcher use it unchanged; its
``data`` reads the public files on demand and refuses, with a message saying so, to upload a public
directory larger than :data:`UPLOAD_LIMIT_BYTES`: larger ones are mounted into the sandbox from the
tasks volume (``public_dir``; :meth:`wmrl_sandbox.dispatcher.SandboxDispatcher.data_dir`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional

from wmrl.leaderboards import Leaderboard
from wmrl.tasks import Task, TaskFormatError

UPLOAD_LIMIT_BYTES = 16 * 1024 * 1024


class TaskTooLargeForUpload(TaskFormatError):
    """The public data is too large to send with every execution."""


def public_files(directory: Path) -> list[tuple[str, int]]:
    """(relative path, size) of every file under ``directory``, sorted; symlinked files are followed."""
    out = []
    for base, dirs, files in os.walk(directory, followlinks=True):
        dirs.sort()
        for name in files:
            path = Path(base, name)
            out.append((path.relative_to(directory).as_posix(), path.stat().st_size))
    return sorted(out)


class PublicFiles(Mapping):
    """Relative path -> bytes of a public directory, read when asked for (never all held at once)."""

    def __init__(self, directory: Path, task_name: str, limit: int = UPLOAD_LIMIT_BYTES):
        self.directory = Path(directory)
        self.task_name = task_name
        self.limit = limit
        self._listing: Optional[list[tuple[str, int]]] = None

    @property
    def listing(self) -> list[tuple[str, int]]:
        if self._listing is None:
            self._listing = public_files(self.directory)
        return self._listing

    @property
    def total_bytes(self) -> int:
        return sum(size for _, size in self.listing)

    def _check_uploadable(self) -> None:
        if self.total_bytes > self.limit:
            raise TaskTooLargeForUpload(
                f"task {self.task_name}: its public data ({self.directory}) is {self.total_bytes / 2**20:.1f} MiB, over "
                f"the {self.limit / 2**20:.0f} MiB sent with each execution; tasks this large need their data mounted "
                "into the sandbox: put them on a PersistentVolumeClaim (spec.tasks.pvc, with spec.sandbox.isolation "
                "namespaces), which the sandbox Pods mount read-only (docs/tasks.md, \"Mounted data\")")

    def __getitem__(self, key: str) -> bytes:
        sizes = dict(self.listing)
        if key not in sizes:
            raise KeyError(key)
        if sizes[key] > self.limit:
            self._check_uploadable()
        return (self.directory / key).read_bytes()

    def __contains__(self, key: object) -> bool:
        return any(name == key for name, _ in self.listing)

    def __iter__(self) -> Iterator[str]:
        return iter(name for name, _ in self.listing)

    def __len__(self) -> int:
        return len(self.listing)

    def items(self):  # what an upload iterates: refuse up front rather than read gigabytes
        self._check_uploadable()
        return super().items()

    def values(self):
        self._check_uploadable()
        return super().values()

    def __eq__(self, other) -> bool:
        return isinstance(other, PublicFiles) and other.directory == self.directory

    def __hash__(self) -> int:
        return hash(self.directory)

    def __repr__(self) -> str:
        return f"PublicFiles({str(self.directory)!r})"


@dataclass(frozen=True)
class GraderSpec:
    """How a collection task is scored (a JSON-able description the grading subprocess acts on).

    kind: ``builtin`` (``metric``, a :mod:`wmrl.task_metrics` name), ``python`` (``file`` defines
    ``function(submission, answers) -> float``: MLE-bench's grade.py, a task's own grade.py),
    ``mledojo`` (``file`` is MLE-Dojo's metric.py: a CompetitionMetrics subclass) or ``dsbench``
    (``file`` is DSBench's ``<name>_eval.py`` script). ``sys_path``: source roots the grader imports
    from (the mlebench or mledojo checkout it came from).
    """

    kind: str
    metric: str = ""
    file: str = ""
    function: str = "grade"
    sys_path: tuple[str, ...] = ()

    def to_json(self) -> dict:
        return {"kind": self.kind, "metric": self.metric, "file": self.file, "function": self.function,
                "sys_path": list(self.sys_path)}

    def describe(self) -> str:
        if self.kind == "builtin":
            return f"built-in {self.metric}"
        return f"{self.kind} {self.file}" + (f":{self.function}" if self.kind == "python" else "")


@dataclass(frozen=True)
class CollectionTask(Task):
    """A collection task: paths, not bytes (see the module docstring)."""

    format: str = ""
    root: Path = Path(".")
    public_dir: Path = Path(".")
    answers_path: Path = Path(".")
    sample_submission_path: Path = Path(".")
    grader: GraderSpec = field(default_factory=lambda: GraderSpec("builtin"))
    answer_columns: tuple[str, ...] = ()  # the answers' value columns a built-in metric scores
    submission_columns: tuple[str, ...] = ()  # the value columns the sample submission has
    boards: tuple[Leaderboard, ...] = ()
    medal_board: Optional[Leaderboard] = None
    lower_is_better: bool = False
    relative_to: Optional[tuple[float, float]] = None  # DSBench: (baseline, GT) performance

    @property
    def higher_is_better(self) -> bool:
        return not self.lower_is_better

    @property
    def public(self) -> PublicFiles:
        return self.data  # type: ignore[return-value]
