"""A task from a benchmark collection (MLE-bench, MLE-Dojo, DSBench, the normalised layout).

Unlike the small wmrl format, a collection task holds no data: it references its public directory
(what a solution sees), its private answers file and its grader. :class:`CollectionTask` extends
:class:`wmrl.tasks.Task`, so the prompt, world model and sandbox dispatcher use it unchanged; its
``data`` reads the public files on demand and refuses, with a message saying so, to upload a public
directory larger than :data:`UPLOAD_LIMIT_BYTES` (larger ones are mounted into the sandbox from the
tasks volume: ``public_dir``; :meth:`wmrl_sandbox.dispatcher.SandboxDispatcher.data_dir`) or one
holding a link that leads outside it (a link to the private answers beside it would otherwise be read
and uploaded: :class:`UnsafePublicLink`).
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


class UnsafePublicLink(TaskFormatError):
    """A link in the public directory leads outside it: its target is never uploaded."""


@dataclass(frozen=True)
class PublicListing:
    """What a public directory holds: ``files`` (relative path, size) inside it, links followed while they
    stay inside; ``escaping`` (relative path, target) of every link that leads outside it."""

    files: list[tuple[str, int]]
    escaping: list[tuple[str, str]]


def list_public(directory: Path) -> PublicListing:
    """Walk ``directory``: a link (to a file or a folder) is followed only while its target, resolved,
    lies inside the directory; one that leads outside is listed in ``escaping`` and not entered. Each
    folder is entered once (a link loop ends), and a dangling link inside is skipped."""
    root = os.path.realpath(directory)
    files: list[tuple[str, int]] = []
    escaping: list[tuple[str, str]] = []
    seen: set[str] = set()

    def inside(real: str) -> bool:
        return real == root or real.startswith(root.rstrip("/") + "/")

    def walk(folder: Path, rel: str) -> None:
        real_folder = os.path.realpath(folder)
        if real_folder in seen:
            return
        seen.add(real_folder)
        with os.scandir(folder) as entries:
            for entry in sorted(entries, key=lambda e: e.name):
                name = f"{rel}{entry.name}"
                path = Path(folder, entry.name)
                if entry.is_symlink():
                    target = os.path.realpath(path)
                    if not inside(target):
                        escaping.append((name, target))
                        continue
                    if not os.path.exists(target):
                        continue
                if entry.is_dir():
                    walk(path, name + "/")
                elif entry.is_file():
                    files.append((name, entry.stat().st_size))

    walk(Path(directory), "")
    return PublicListing(sorted(files), sorted(escaping))


def public_files(directory: Path) -> list[tuple[str, int]]:
    """(relative path, size) of every file under ``directory``, sorted (links followed while they stay inside)."""
    return list_public(directory).files


class PublicFiles(Mapping):
    """Relative path -> bytes of a public directory, read when asked for (never all held at once).

    Uploading refuses, naming the file, a public directory holding a link that leads outside it (the
    private answers sit beside it: :class:`UnsafePublicLink`) and one over ``limit`` bytes."""

    def __init__(self, directory: Path, task_name: str, limit: int = UPLOAD_LIMIT_BYTES):
        self.directory = Path(directory)
        self.task_name = task_name
        self.limit = limit
        self._listing: Optional[PublicListing] = None

    @property
    def _walked(self) -> PublicListing:
        if self._listing is None:
            self._listing = list_public(self.directory)
        return self._listing

    @property
    def listing(self) -> list[tuple[str, int]]:
        return self._walked.files

    @property
    def escaping_links(self) -> list[tuple[str, str]]:
        return self._walked.escaping

    @property
    def total_bytes(self) -> int:
        return sum(size for _, size in self.listing)

    def _refuse_link(self, name: str, target: str) -> None:
        raise UnsafePublicLink(
            f"task {self.task_name}: public file {self.directory / name} is a link to {target}, outside the public "
            f"directory {self.directory}: it is not uploaded to the sandbox (such a link could hand an execution the "
            "private answers); copy the file into the public directory, or mount the tasks (spec.tasks.pvc, or "
            "`wmrl run` on a local path), where executions see only the public directory")

    def _check_uploadable(self) -> None:
        for name, target in self.escaping_links:
            self._refuse_link(name, target)
        if self.total_bytes > self.limit:
            raise TaskTooLargeForUpload(
                f"task {self.task_name}: its public data ({self.directory}) is {self.total_bytes / 2**20:.1f} MiB, over "
                f"the {self.limit / 2**20:.0f} MiB sent with each execution; tasks this large need their data mounted "
                "into the sandbox: put them on a PersistentVolumeClaim (spec.tasks.pvc, with spec.sandbox.isolation "
                "namespaces), which the sandbox Pods mount read-only, or run `wmrl run` on a local path "
                "(docs/tasks.md, \"Mounted data\")")

    def __getitem__(self, key: str) -> bytes:
        escaping = dict(self.escaping_links)
        if key in escaping:
            self._refuse_link(key, escaping[key])
        sizes = dict(self.listing)
        if key not in sizes:
            raise KeyError(key)
        if sizes[key] > self.limit:
            self._check_uploadable()
        path = self.directory / key
        target = os.path.realpath(path)
        if not target.startswith(os.path.realpath(self.directory).rstrip("/") + "/"):  # made a link since listed
            self._refuse_link(key, target)
        return path.read_bytes()

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
    from (the mlebench or mledojo checkout it came from). ``decimals``: the score is rounded to this
    many decimals before it is placed on the leaderboard (MLE-bench's ``Grader`` rounds to 5; None:
    unrounded, as MLE-Dojo and DSBench report it).
    """

    kind: str
    metric: str = ""
    file: str = ""
    function: str = "grade"
    sys_path: tuple[str, ...] = ()
    decimals: Optional[int] = None

    def to_json(self) -> dict:
        return {"kind": self.kind, "metric": self.metric, "file": self.file, "function": self.function,
                "sys_path": list(self.sys_path), "decimals": self.decimals}

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
