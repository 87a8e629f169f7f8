"""The bundled "mini-ml" task suite (loading tasks from a path, PVC or ConfigMap is :mod:`wmrl_trainer.tasks`).

The bundled suite is built on first use into a cache directory, in the task directory
format of :mod:`wmrl.tasks`, and loaded back with :func:`wmrl.tasks.load_suite`. Building
is deterministic (fixed seeds) and trains every reference solution for real, so each
task's leaderboard holds the test scores of models of varied strength (a dummy baseline
up to boosting and SVMs). The build writes into a temporary sibling and renames it into
place, so concurrent builders and a build cut off halfway never leave a partial suite.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from wmrl.cache import cache_root
from wmrl.grading import score
from wmrl.tasks import METRICS_HIGHER_IS_BETTER, Task, load_suite
from wmrl_demo.suite_data import MINI_ML, REFERENCE_BY_FAMILY, REFERENCE_MODELS, DatasetSpec

SUITE_VERSION = "1"
SUITES: dict[str, tuple[DatasetSpec, ...]] = {"mini-ml": MINI_ML}
REFERENCE_FILE = "reference.json"  # family -> test score; extra file, ignored by the task loader
_COMPLETE_MARKER = ".complete"
BUGS = ("undefined-name", "no-submission", "wrong-kind", "bad-import", "id-as-feature", "no-header")
"""Deliberate defects :func:`solution_code` can inject (for world-model corpora and demos)."""


def default_cache_dir() -> Path:
    """``$WMRL_CACHE/tasks`` or ``~/.cache/wmrl/tasks``."""
    return cache_root() / "tasks"


# ---------------------------------------------------------------- building

_FLOAT_FMT = "%.10g"


def _csv(header: Sequence[str], columns: Sequence[np.ndarray], fmts: Sequence[str]) -> bytes:
    buf = io.StringIO()
    np.savetxt(buf, np.column_stack(columns), delimiter=",", header=",".join(header), comments="", fmt=list(fmts))
    return buf.getvalue().encode()


def _read(content: bytes) -> np.ndarray:
    return np.loadtxt(io.BytesIO(content), delimiter=",", skiprows=1, ndmin=2)


def describe(kind: str, metric: str, source: str, n_features: int, n_train: int, n_test: int, n_classes: int) -> str:
    """A mini-ml task's description (also the template of the demo policy's warm-start prompts)."""
    label = f"{n_classes}-class classification" if kind == "classification" else "regression"
    better = "higher" if METRICS_HIGHER_IS_BETTER[metric] else "lower"
    return (f"{label.capitalize()}: {source}. {n_features} numeric features f0..f{n_features - 1}; "
            f"{n_train} training rows, {n_test} test rows. Metric: {metric} ({better} is better).")


def _task_files(spec: DatasetSpec) -> dict[str, bytes]:
    """One task's files: task.yaml, data, hidden labels, leaderboard and the named reference scores."""
    X, y = spec.make()
    X = np.asarray(X, dtype=float)
    n = len(y)
    order = np.random.default_rng(_seed(spec.name)).permutation(n)
    X, y = X[order], np.asarray(y)[order]
    n_test = int(round(n * spec.test_fraction))
    n_train = n - n_test
    ids = np.arange(n)
    nf = X.shape[1]
    feat = [f"f{i}" for i in range(nf)]
    target_fmt = "%d" if spec.kind == "classification" else _FLOAT_FMT
    train = _csv(["id", *feat, "target"], [ids[:n_train], X[:n_train], y[:n_train]], ["%d"] + [_FLOAT_FMT] * nf + [target_fmt])
    test = _csv(["id", *feat], [ids[n_train:], X[n_train:]], ["%d"] + [_FLOAT_FMT] * nf)
    labels = _csv(["id", "target"], [ids[n_train:], y[n_train:]], ["%d", target_fmt])
    references = _reference_scores(spec, train, test, labels)
    n_classes = len(np.unique(y)) if spec.kind == "classification" else 0
    task = Task(
        name=spec.name,
        description=describe(spec.kind, spec.metric, spec.source, nf, n_train, n_test, n_classes),
        kind=spec.kind,
        metric=spec.metric,
        target="target",
        data={"train.csv": train, "test.csv": test},
        hidden_labels=labels,
        leaderboard=tuple(sorted(references.values(), reverse=METRICS_HIGHER_IS_BETTER[spec.metric])),
    )
    files = task.to_files()
    files[REFERENCE_FILE] = json.dumps(references, indent=1).encode()
    return files


def _seed(name: str) -> int:
    """A stable per-task seed (Python's hash() is salted per process)."""
    return sum((i + 1) * ord(c) for i, c in enumerate(name))


def _reference_scores(spec: DatasetSpec, train: bytes, test: bytes, labels: bytes) -> dict[str, float]:
    """Train every reference model on the CSVs exactly as a solution would read them; score on the test rows."""
    tr, te, lab = _read(train), _read(test), _read(labels)
    X, y, Xt, yt = tr[:, 1:-1], tr[:, -1], te[:, 1:], lab[:, 1]
    if spec.kind == "classification":
        y = y.astype(int)
    scores = {}
    for ref in REFERENCE_MODELS:
        model = _instantiate(ref.family, spec.kind)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model.fit(X, y)
            pred = model.predict(Xt)
        # Round-trip through the submission format so the grader sees the same numbers.
        fmt = "%d" if spec.kind == "classification" else _FLOAT_FMT
        pred = np.array([float(fmt % p) for p in pred])
        scores[ref.family] = score(spec.metric, yt, pred)
    return scores


def _instantiate(family: str, kind: str):
    ref = REFERENCE_BY_FAMILY[family]
    namespace: dict = {}
    exec("\n".join(ref.imports), namespace)  # noqa: S102 - our own constant import lines
    return eval(ref.expression(kind), namespace)  # noqa: S307 - our own constant expression


def build_suite(name: str, directory: Path, only: Optional[Sequence[str]] = None) -> None:
    """Write suite ``name`` (or just the tasks named in ``only``) into ``directory``.

    Native thread pools are limited to one thread: the references are tiny, and OpenMP
    spinning on a busy machine makes them orders of magnitude slower.
    """
    from threadpoolctl import threadpool_limits

    if name not in SUITES:
        raise ValueError(f"spec.tasks.builtin: unknown suite {name!r}; bundled suites: {sorted(SUITES)}")
    specs = [s for s in SUITES[name] if only is None or s.name in only]
    with threadpool_limits(1):
        built = [(spec, _task_files(spec)) for spec in specs]
    for spec, files in built:
        for rel, content in files.items():
            path = directory / spec.name / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content)
    (directory / _COMPLETE_MARKER).write_text(SUITE_VERSION)


def builtin_suite_dir(name: str = "mini-ml", cache_dir: str | Path | None = None) -> Path:
    """The directory of bundled suite ``name``, built on first use under ``cache_dir``."""
    if name not in SUITES:
        raise ValueError(f"spec.tasks.builtin: unknown suite {name!r}; bundled suites: {sorted(SUITES)}")
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = root / f"{name}-{SUITE_VERSION}"
    if (target / _COMPLETE_MARKER).is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-building-", dir=root))
    try:
        build_suite(name, staging)
        if target.exists() and not (target / _COMPLETE_MARKER).is_file():
            shutil.rmtree(target, ignore_errors=True)  # a partial build from an old crash
        try:
            os.rename(staging, target)
        except OSError:
            if not (target / _COMPLETE_MARKER).is_file():  # lost a race to a builder that finished
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def builtin_suite(name: str = "mini-ml", cache_dir: str | Path | None = None) -> list[Task]:
    """The bundled suite as tasks (built into ``cache_dir/<name>-<version>`` on first use)."""
    return load_suite(builtin_suite_dir(name, cache_dir))


def reference_scores(name: str, task: str, cache_dir: str | Path | None = None) -> dict[str, float]:
    """Reference family -> test score for one bundled task (the leaderboard, with names)."""
    return json.loads((builtin_suite_dir(name, cache_dir) / task / REFERENCE_FILE).read_text())


# ---------------------------------------------------------------- solutions

def solution_code(task: Task, family: str = "random-forest", bug: Optional[str] = None) -> str:
    """A complete solution script for ``task`` using reference family ``family``.

    With ``bug`` one of :data:`BUGS` the script carries a realistic defect: it crashes
    (undefined-name, bad-import, wrong-kind on most data), writes nothing (no-submission),
    writes an unreadable submission (no-header) or runs but scores worse (id-as-feature).
    """
    if family not in REFERENCE_BY_FAMILY:
        raise ValueError(f"family must be one of {sorted(REFERENCE_BY_FAMILY)}, got {family!r}")
    if bug is not None and bug not in BUGS:
        raise ValueError(f"bug must be one of {BUGS} or None, got {bug!r}")
    ref = REFERENCE_BY_FAMILY[family]
    kind = task.kind
    if bug == "wrong-kind":
        kind = "regression" if task.kind == "classification" else "classification"
    classify = task.kind == "classification"
    lines = ["import numpy as np", *ref.imports]
    if bug == "bad-import":
        lines.append("import xgboost as xgb")
    lines += [
        "",
        'train = np.loadtxt("data/train.csv", delimiter=",", skiprows=1, ndmin=2)',
        'test = np.loadtxt("data/test.csv", delimiter=",", skiprows=1, ndmin=2)',
        "X, y = train[:, :-1], train[:, -1]" if bug == "id-as-feature" else "X, y = train[:, 1:-1], train[:, -1]",
        "X_test = test" if bug == "id-as-feature" else "X_test = test[:, 1:]",
    ]
    if classify and bug != "wrong-kind":
        lines.append("y = y.astype(int)")
    lines += [f"model = {ref.expression(kind)}", "model.fit(X, y)"]
    lines.append("pred = model.predict(X_tests)" if bug == "undefined-name" else "pred = model.predict(X_test)")
    fmt = '"%d,%d"' if classify else '"%d,%.10g"'
    if bug != "no-submission":
        header = '""' if bug == "no-header" else '"id,target"'
        lines.append(f'np.savetxt("submission.csv", np.column_stack([test[:, 0], pred]), fmt={fmt}, '
                     f'delimiter=",", header={header}, comments="")')
    lines.append('print("predicted", len(pred), "rows")')
    return "\n".join(lines) + "\n"
