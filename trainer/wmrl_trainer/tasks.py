"""The tasks of a run: ``spec.tasks`` (builtin, path, PVC or ConfigMap) and the held-out split."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Sequence

from wmrl.task_layouts import load_collection, read_task_list
from wmrl.tasks import Task, TaskFormatError, from_files


def _load_config_map_dir(directory: Path) -> list[Task]:
    """One task from a mounted ConfigMap: files named like ``data__train.csv`` ('/' written as '__')."""
    if not directory.is_dir():
        raise TaskFormatError(f"spec.tasks.configMap: {directory} is not a mounted directory")
    files = {p.name.replace("__", "/"): p.read_bytes()
             for p in sorted(directory.iterdir()) if p.is_file() and not p.name.startswith("..")}
    return [from_files(files, where=f"configMap mounted at {directory}")]


def _load_source(root: Path, tasks_spec) -> list[Task]:
    """The tasks of a path or PVC source in ``spec.tasks.format``, only those of ``taskList`` if given."""
    names = None
    if tasks_spec.task_list:
        listed = Path(tasks_spec.task_list)
        names = read_task_list(listed if listed.is_absolute() else root / listed)
    return load_collection(root, tasks_spec.format, tasks_spec.competitions_dir, names)


def load_tasks(tasks_spec, runtime=None, cache_dir: str | Path | None = None) -> list[Task]:
    """Every task of ``spec.tasks`` (a :class:`wmrl.api.schema.TasksSpec`).

    builtin -> the bundled suite (built on first use); path -> a directory of tasks in any layout of
    :mod:`wmrl.task_layouts`; pvc -> the claim mounted at ``runtime.tasks_dir`` (default ``/tasks``);
    configMap -> one task whose keys are mounted as files at ``runtime.tasks_dir``.
    """
    mounted = Path(getattr(runtime, "tasks_dir", None) or "/tasks")
    if tasks_spec.builtin:
        from wmrl_demo.suite import builtin_suite  # demo data, imported only when a spec names it

        tasks = builtin_suite(tasks_spec.builtin, cache_dir)
    elif tasks_spec.path:
        tasks = _load_source(Path(tasks_spec.path), tasks_spec)
    elif tasks_spec.pvc:
        tasks = _load_source(mounted, tasks_spec)
    elif tasks_spec.config_map:
        tasks = _load_config_map_dir(mounted)
    else:
        raise TaskFormatError("spec.tasks: set exactly one of builtin, path, pvc, configMap")
    names = [t.name for t in tasks]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise TaskFormatError(f"spec.tasks: duplicate task names {duplicates}")
    return tasks


def split_held_out(tasks: Iterable[Task], held_out: Sequence[str]) -> tuple[list[Task], list[Task]]:
    """(training tasks, held-out tasks); an unknown held-out name is an error naming it."""
    tasks = list(tasks)
    names = {t.name for t in tasks}
    unknown = sorted(set(held_out) - names)
    if unknown:
        raise TaskFormatError(f"spec.tasks.heldOut: unknown task(s) {unknown}; tasks are {sorted(names)}")
    train = [t for t in tasks if t.name not in held_out]
    if not train:
        raise TaskFormatError("spec.tasks.heldOut: every task is held out; nothing left to train on")
    return train, [t for t in tasks if t.name in held_out]
