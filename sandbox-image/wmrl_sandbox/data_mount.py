"""A task's public data, mounted read-only into an execution from the tasks volume.

The sandbox Pod mounts the run's tasks volume (``spec.tasks.pvc``) read-only at ``--tasks-dir``
(``/tasks``). That volume holds every task's public data *and* its private answers, and a
Kubernetes ``subPath`` can only pick one folder per volume mount, not one per execution. So the
whole volume reaches the Pod, and each execution's mount namespace is where it is narrowed:

* the tasks directory is covered by an empty tmpfs, in every execution of a server that has one
  (with or without ``data_dir``): nothing under it (no private answers, no other task) is visible
  by any path, absolute, relative or through a link;
* the one public directory the request names (``data_dir``, relative to the tasks directory) is
  bound read-only at ``<working directory>/data``, where scripts read ``data/train.csv``; a bind
  mount's root is that directory, so ``..`` from it stays inside it.

The bind's source is opened (or, for bubblewrap, looked up in the old root) before the tmpfs
hides it. Root mode does this in the execution's child (:mod:`wmrl_sandbox.preexec`), the deployed
mode through bubblewrap's arguments (cold) or :func:`wmrl_sandbox.namespaces.enter` (warm). A
server without a mount namespace per execution (``--isolation restricted`` as non-root) cannot
hide the answers, and refuses to start with a tasks directory (:func:`check_tasks_dir`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Optional

DATA_DIR = "data"
"""Where an execution sees the mounted public directory, relative to its working directory."""
TASKS_DIR_ENV = "WMRL_SANDBOX_TASKS_DIR"


class DataMountError(ValueError):
    """The request's ``data_dir`` cannot be mounted (the message names it and why)."""


@dataclass(frozen=True)
class DataMount:
    """One execution's view of the tasks directory: ``hide`` (the tasks directory) covered by an empty
    tmpfs, for every execution of a server that has one, and, when the request names a public
    directory, ``source`` (resolved) bound read-only at ``target`` (``<workdir>/data``)."""

    source: Optional[str]
    target: Optional[str]
    hide: str

    def to_json(self) -> list[str]:
        return [self.source, self.target, self.hide]

    @classmethod
    def from_json(cls, value: Optional[list[str]]) -> Optional["DataMount"]:
        return None if value is None else cls(*value)


def _under(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def check_tasks_dir(tasks_dir: str, *, work_root: str, interpreter_root: str, mount_namespace: bool) -> str:
    """The tasks directory (``--tasks-dir``), resolved; ValueError naming the flag when it cannot serve.

    It must be a directory, must not hold the work root or the interpreter (both would vanish
    under its tmpfs), and the isolation must give each execution a mount namespace (``mount_namespace``)."""
    if not mount_namespace:
        raise ValueError(f"--tasks-dir {tasks_dir}: executions get no mount namespace of their own here (--isolation "
                         "restricted as a non-root user), so the private answers in the tasks volume could not be "
                         "hidden from them; run with --isolation namespaces, or without --tasks-dir (task data is then "
                         "uploaded with each request)")
    real = os.path.realpath(tasks_dir)
    if not os.path.isdir(real):
        raise ValueError(f"--tasks-dir {tasks_dir}: not a directory")
    for what, path in (("the work root", work_root), ("the interpreter", interpreter_root)):
        if _under(os.path.realpath(path), real):
            raise ValueError(f"--tasks-dir {tasks_dir}: {what} ({path}) lies inside it, and every execution's view "
                             "of the tasks directory is hidden")
    return real


def resolve(tasks_dir: Optional[str], data_dir: str) -> str:
    """The public directory ``data_dir`` names (relative to ``tasks_dir``), resolved; DataMountError if it
    is not a directory inside the tasks directory or this server has none."""
    if tasks_dir is None:
        raise DataMountError(f"data_dir {data_dir!r}: this server has no tasks directory (--tasks-dir / "
                             f"{TASKS_DIR_ENV}): the tasks volume is not mounted in this sandbox; send the files instead")
    if not isinstance(data_dir, str) or not data_dir or "\x00" in data_dir:
        raise DataMountError(f"data_dir: invalid path {data_dir!r}")
    pure = PurePosixPath(data_dir)
    if pure.is_absolute() or any(part in ("..", "") for part in pure.parts):
        raise DataMountError(f"data_dir {data_dir!r}: must be relative to the tasks directory, without '..'")
    real = os.path.realpath(os.path.join(tasks_dir, data_dir))
    if real == tasks_dir or not _under(real, tasks_dir):
        raise DataMountError(f"data_dir {data_dir!r}: leads outside the tasks directory or is the whole of it")
    if not os.path.isdir(real):
        raise DataMountError(f"data_dir {data_dir!r}: no such directory in the tasks directory")
    return real


def bwrap_args(data: DataMount) -> tuple[list[str], list[str]]:
    """bubblewrap's arguments: (hide the tasks directory, placed with the other masks; bind the public
    directory, if any, placed after the working directory's bind). bubblewrap binds from the old root,
    which the tmpfs in the new one does not hide."""
    bind = ["--ro-bind", data.source, data.target] if data.source is not None and data.target is not None else []
    return ["--tmpfs", data.hide], bind


__all__ = ["DATA_DIR", "DataMount", "DataMountError", "TASKS_DIR_ENV", "bwrap_args", "check_tasks_dir", "resolve"]
