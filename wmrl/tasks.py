"""The task format: one directory per mini ML competition, which users can extend.

```
<task>/
  task.yaml          name, description, kind (classification|regression), metric,
                     target (label column), idColumn, submission (file the solution writes),
                     optional category (tabular|text|image|other: how evaluation reports group it)
  data/...           files the solution sees (copied into the sandbox), e.g. train.csv, test.csv
  hidden/labels.csv  idColumn,target for the test rows: never sent to the sandbox
  leaderboard.json   reference scores (list of numbers) for the rank score
```

A suite is a directory of task directories. The same layout can come from a path, a
PersistentVolumeClaim mounted in the trainer, or a ConfigMap (keys are relative paths
with ``/`` written as ``__``, since ConfigMap keys cannot contain ``/``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Mapping

import yaml

METRICS_HIGHER_IS_BETTER = {"accuracy": True, "f1_macro": True, "r2": True, "rmse": False, "mae": False}
CATEGORIES = ("tabular", "text", "image", "other")
"""The task categories evaluation reports average over (:mod:`wmrl.task_category`)."""


class TaskFormatError(ValueError):
    """A task directory or ConfigMap does not follow the task format; the message names what is wrong."""


@dataclass(frozen=True)
class Task:
    name: str
    description: str
    kind: Literal["classification", "regression"]
    metric: str
    target: str
    id_column: str = "id"
    submission: str = "submission.csv"
    data: Mapping[str, bytes] = field(default_factory=dict, repr=False)
    hidden_labels: bytes = field(default=b"", repr=False)
    leaderboard: tuple[float, ...] = ()
    category: str = ""  # one of CATEGORIES when the task's metadata says; empty: inferred from its data

    @property
    def higher_is_better(self) -> bool:
        return METRICS_HIGHER_IS_BETTER[self.metric]

    def to_files(self) -> dict[str, bytes]:
        """The task as relative path -> bytes, in the directory layout (inverse of :func:`from_files`)."""
        meta = {
            "name": self.name,
            "description": self.description,
            "kind": self.kind,
            "metric": self.metric,
            "target": self.target,
            "idColumn": self.id_column,
            "submission": self.submission,
        }
        if self.category:
            meta["category"] = self.category
        files = {"task.yaml": yaml.safe_dump(meta, sort_keys=False).encode()}
        files.update({f"data/{k}": v for k, v in self.data.items()})
        files["hidden/labels.csv"] = self.hidden_labels
        files["leaderboard.json"] = json.dumps(list(self.leaderboard)).encode()
        return files


def from_files(files: Mapping[str, bytes], where: str = "task") -> Task:
    """Build a task from relative path -> bytes in the directory layout."""
    if "task.yaml" not in files:
        raise TaskFormatError(f"{where}: missing task.yaml")
    try:
        meta = yaml.safe_load(files["task.yaml"]) or {}
    except yaml.YAMLError as exc:
        raise TaskFormatError(f"{where}/task.yaml: not valid YAML: {exc}") from exc
    for key in ("name", "description", "kind", "metric", "target"):
        if key not in meta:
            raise TaskFormatError(f"{where}/task.yaml: missing field {key!r}")
    if meta["kind"] not in ("classification", "regression"):
        raise TaskFormatError(f"{where}/task.yaml: kind must be classification or regression, got {meta['kind']!r}")
    if meta["metric"] not in METRICS_HIGHER_IS_BETTER:
        raise TaskFormatError(f"{where}/task.yaml: metric must be one of {sorted(METRICS_HIGHER_IS_BETTER)}, got {meta['metric']!r}")
    if "hidden/labels.csv" not in files:
        raise TaskFormatError(f"{where}: missing hidden/labels.csv")
    try:
        leaderboard = tuple(float(x) for x in json.loads(files.get("leaderboard.json", b"[]")))
    except (ValueError, TypeError) as exc:
        raise TaskFormatError(f"{where}/leaderboard.json: must be a JSON list of numbers") from exc
    category = str(meta.get("category") or "")
    if category and category not in CATEGORIES:
        raise TaskFormatError(f"{where}/task.yaml: category must be one of {list(CATEGORIES)}, got {category!r}")
    data = {path[len("data/"):]: content for path, content in files.items() if path.startswith("data/")}
    if not data:
        raise TaskFormatError(f"{where}: no files under data/")
    return Task(
        name=str(meta["name"]),
        description=str(meta["description"]),
        kind=meta["kind"],
        metric=meta["metric"],
        target=str(meta["target"]),
        id_column=str(meta.get("idColumn", "id")),
        submission=str(meta.get("submission", "submission.csv")),
        data=data,
        hidden_labels=files["hidden/labels.csv"],
        leaderboard=leaderboard,
        category=category,
    )


def load_task(directory: str | Path) -> Task:
    root = Path(directory)
    files = {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}
    return from_files(files, where=str(root))


def load_suite(directory: str | Path) -> list[Task]:
    """Every task directory (one holding task.yaml) directly under ``directory``, sorted by name."""
    root = Path(directory)
    if not root.is_dir():
        raise TaskFormatError(f"{root}: not a directory")
    tasks = [load_task(d) for d in sorted(root.iterdir()) if (d / "task.yaml").is_file()]
    if not tasks:
        raise TaskFormatError(f"{root}: no task directories (folders with task.yaml)")
    return tasks


def from_config_map(data: Mapping[str, str], binary_data: Mapping[str, bytes] | None = None, where: str = "configmap") -> Task:
    """One task from a ConfigMap's ``data``/``binaryData`` (keys: paths with '/' as '__')."""
    files = {key.replace("__", "/"): value.encode() for key, value in data.items()}
    files.update({key.replace("__", "/"): value for key, value in (binary_data or {}).items()})
    return from_files(files, where=where)
