"""Task sources on disk: which layout a directory follows, and its tasks.

Formats (``spec.tasks.format``):

``wmrl``        ``<task>/task.yaml`` + ``data/`` + ``hidden/labels.csv`` (:mod:`wmrl.tasks`).
``mlebench``    ``<id>/prepared/{public,private}`` (``mlebench prepare --data-dir``) with the competition's
                definition (``config.yaml``, ``grade.py``, ``leaderboard.csv``, ``description.md``) either
                in ``<id>/`` too or in ``competitionsDir/<id>/`` (the ``mlebench/competitions`` folder).
``mledojo``     ``<name>/data/public/{description.txt, sample_submission.csv, ...}`` +
                ``<name>/data/private/{test_answer.csv, public_leaderboard.csv, private_leaderboard.csv}``
                (MLE-Dojo's prepared data) scored by ``competitionsDir/<name>/utils/metric.py``.
``normalised``  the same two folders, scored by ``<name>/grade.py`` or the built-in metric named in
                ``<name>/metric.yaml`` (``metric: rmsle``; it may declare ``category`` too).
``dsbench``     DSBench's data-modeling folder: ``data/data_resplit/<name>/`` (public),
                ``data/answers/<name>/test_answer.csv``, ``data/task/<name>.txt``, scored by
                ``evaluation/<name>_eval.py``, relative to ``save_performance/{baseline,GT}/<name>/result.txt``.

A task's ``category`` (tabular, text, image, other) comes from its metadata where the layout has
one (``task.yaml``, MLE-bench's ``config.yaml``, the normalised ``metric.yaml``); otherwise evaluation
infers it from the public files (:mod:`wmrl.task_category`).

``auto`` picks the one format the directory's tasks fit and refuses, naming the candidates, when
they fit several or none. Every problem is a :class:`TaskFormatError` naming the task and the file.
"""

from __future__ import annotations

import ast
import importlib.util
import os
from pathlib import Path
from typing import Optional, Sequence

import yaml

from wmrl import answers_file
from wmrl.answers_file import AnswersError
from wmrl.collection_tasks import CollectionTask, GraderSpec, PublicFiles
from wmrl.leaderboards import Leaderboard, direction, read_leaderboard
from wmrl.task_metrics import canonical_metric, known_metric_names, metric_info
from wmrl.tasks import CATEGORIES, Task, TaskFormatError, load_task

FORMATS = ("auto", "wmrl", "mlebench", "mledojo", "dsbench", "normalised")
# Files that hold answers or final standings: never in a public directory.
PRIVATE_NAMES = {"test_answer.csv", "answers.csv", "private_leaderboard.csv", "public_leaderboard.csv",
                 "solution.csv", "test_labels.csv"}
_LFS_POINTER = b"version https://git-lfs"
MLEBENCH_DECIMALS = 5  # MLE-bench's Grader rounds each score to 5 decimals before ranking it


# --------------------------------------------------------------------------- task lists


def read_task_list(path: Path) -> list[str]:
    """Names, one a line (``tasks_train.txt``): blank lines and ``#`` comments skipped; a line's last
    word is the name, so numbered lists work."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise TaskFormatError(f"spec.tasks.taskList: cannot read {path}: {exc.strerror or exc}") from exc
    names = [line.split("#", 1)[0].split()[-1] for line in text.splitlines() if line.split("#", 1)[0].strip()]
    if not names:
        raise TaskFormatError(f"spec.tasks.taskList: {path} names no tasks")
    return names


# --------------------------------------------------------------------------- detection


def _installed_definitions(package: str) -> Optional[Path]:
    """``<package>/competitions`` of an installed mlebench or mledojo, if any."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(list(spec.submodule_search_locations)[0]) / "competitions"
    return folder if folder.is_dir() else None


def _dsbench_data(root: Path) -> Optional[Path]:
    for candidate in (root, root / "data"):
        if (candidate / "data_resplit").is_dir() and (candidate / "answers").is_dir():
            return candidate
    return None


def _candidates(task_dir: Path, competitions_dir: Optional[Path]) -> set[str]:
    """The formats one task folder fits."""
    fits = set()
    if (task_dir / "task.yaml").is_file():
        fits.add("wmrl")
    if (task_dir / "prepared").is_dir():
        fits.add("mlebench")
    if (task_dir / "data" / "public").is_dir() or (task_dir / "data" / "private").is_dir():
        dojo = competitions_dir or _installed_definitions("mledojo")
        if dojo is not None and (dojo / task_dir.name / "utils" / "metric.py").is_file():
            fits.add("mledojo")
        if (task_dir / "grade.py").is_file() or (task_dir / "metric.yaml").is_file():
            fits.add("normalised")
        if not fits:
            fits.add("mledojo-or-normalised")
    return fits


def _task_dirs(root: Path, names: Optional[Sequence[str]]) -> list[Path]:
    if names is not None:
        missing = [n for n in names if not (root / n).is_dir()]
        if missing:
            raise TaskFormatError(f"{root}: no task folder(s) {missing[:10]} (named in spec.tasks.taskList)")
        return [root / n for n in names]
    return [d for d in sorted(root.iterdir()) if d.is_dir() and not d.name.startswith((".", "_"))]


def detect_format(root: Path, competitions_dir: Optional[Path] = None, names: Optional[Sequence[str]] = None) -> str:
    """The one format ``root``'s tasks follow, or a TaskFormatError saying why it cannot tell."""
    root = Path(root)
    if not root.is_dir():
        raise TaskFormatError(f"{root}: not a directory")
    if _dsbench_data(root) is not None:
        return "dsbench"
    by_format: dict[str, list[str]] = {}
    for task_dir in _task_dirs(root, names):
        for fit in _candidates(task_dir, competitions_dir):
            by_format.setdefault(fit, []).append(task_dir.name)
    if not by_format:
        raise TaskFormatError(
            f"{root}: no task directories: expected folders in one of the layouts wmrl (task.yaml), mlebench "
            "(<id>/prepared/), mledojo/normalised (<name>/data/public and data/private) or a DSBench "
            "data_modeling folder (data/data_resplit)")
    if "mledojo-or-normalised" in by_format:
        first = by_format["mledojo-or-normalised"][0]
        raise TaskFormatError(
            f"{root}/{first}: no grader: a normalised task needs {first}/grade.py or {first}/metric.yaml, an MLE-Dojo "
            "task needs spec.tasks.competitionsDir (MLE-Dojo's mledojo/competitions) with "
            f"{first}/utils/metric.py")
    if len(by_format) > 1:
        listed = "; ".join(f"{fmt}: {', '.join(tasks[:3])}" for fmt, tasks in sorted(by_format.items()))
        raise TaskFormatError(f"{root}: ambiguous layout ({listed}); set spec.tasks.format (--format)")
    return next(iter(by_format))


# --------------------------------------------------------------------------- shared checks


def _csv_header(path: Path, where: str) -> list[str]:
    try:
        return answers_file.csv_header(path)
    except AnswersError as exc:
        raise TaskFormatError(f"{where}: {exc}") from exc


def _require_file(path: Path, what: str, where: str) -> Path:
    if not path.is_file():
        raise TaskFormatError(f"{where}: no {what}: {path} does not exist")
    return path


def _public_entries(public: Path):
    """Every file and link under ``public``, at any depth (links are not followed into directories)."""
    for base, dirs, files in os.walk(public):
        dirs.sort()
        for name in sorted(files) + [d for d in dirs if os.path.islink(os.path.join(base, d))]:
            yield Path(base, name)


def _check_public(public: Path, answers: Path, where: str) -> None:
    """No answers or standings anywhere under the public directory: no file named like one, no byte copy
    of the answers (sizes compared before bytes), no link to the answers or into their directory."""
    if not public.is_dir():
        raise TaskFormatError(f"{where}: no public data directory {public}")
    answers_real = answers.resolve()
    # The answers' folder is private too, unless the public directory lies inside it.
    private = answers_real.parent if answers_real.parent not in public.resolve().parents else None
    answers_size = answers.stat().st_size
    answers_bytes: Optional[bytes] = None
    for entry in _public_entries(public):
        if entry.name.lower() in PRIVATE_NAMES:
            raise TaskFormatError(f"{where}: private file {entry} is under public/ (solutions would see it)")
        if entry.is_symlink():
            target = entry.resolve()
            if target == answers_real or private is not None and (target == private or private in target.parents):
                raise TaskFormatError(f"{where}: {entry} is a link to the private {target} (private file under public/)")
        if not entry.is_file():
            continue
        if entry.stat().st_size == answers_size:
            answers_bytes = answers.read_bytes() if answers_bytes is None else answers_bytes
            if entry.read_bytes() == answers_bytes:
                raise TaskFormatError(f"{where}: {entry} is a copy of the answers {answers} (private file under public/)")


def _check_sample_ids(sample: Path, answers: Path, id_column: str, where: str) -> None:
    try:
        answer_header = answers_file.columns(answers)
    except AnswersError as exc:
        raise TaskFormatError(f"{where}: {exc}") from exc
    if id_column not in answer_header:
        raise TaskFormatError(f"{where}: sample submission {sample} does not match the answers {answers}: its id "
                              f"column {id_column!r} is not among the answers' columns {answer_header[:8]}")
    try:
        answer_ids = answers_file.ids(answers, id_column)
    except AnswersError as exc:
        raise TaskFormatError(f"{where}: {exc}") from exc
    sample_ids = answers_file.csv_column(sample, id_column)
    if sorted(sample_ids) != sorted(answer_ids):
        raise TaskFormatError(f"{where}: sample submission {sample} does not match the answers {answers}: "
                              f"{len(sample_ids)} rows against {len(answer_ids)}, "
                              f"{len(set(answer_ids) - set(sample_ids))} answer ids missing from it")


def _builtin_columns(metric: str, sample: Path, answers: Path, id_column: str, where: str) -> tuple[tuple, tuple]:
    """(answer value columns, submission value columns) for a built-in metric; mismatches are errors."""
    sample_cols = [c for c in _csv_header(sample, where) if c != id_column]
    try:
        answer_cols = [c for c in answers_file.columns(answers) if c != id_column]
    except AnswersError as exc:
        raise TaskFormatError(f"{where}: {exc}") from exc
    if not sample_cols:
        raise TaskFormatError(f"{where}: sample submission {sample} has no value column besides {id_column!r}")
    if set(sample_cols) <= set(answer_cols):
        return tuple(sample_cols), tuple(sample_cols)
    if canonical_metric(metric) == "log-loss" and len(answer_cols) == 1:
        return tuple(answer_cols), tuple(sample_cols)  # a label column against one probability column per class
    raise TaskFormatError(f"{where}: sample submission {sample} does not match the answers {answers}: columns "
                          f"{sample_cols[:8]} are not among the answers' {answer_cols[:8]}")


def _read_boards(paths: Sequence[tuple[str, Path]], where: str) -> tuple[Leaderboard, ...]:
    boards = []
    for name, path in paths:
        if path.is_file():
            if path.read_bytes()[:len(_LFS_POINTER)] == _LFS_POINTER:
                raise TaskFormatError(f"{where}: {path} is a Git LFS pointer, not the leaderboard (run `git lfs pull`)")
            boards.append(read_leaderboard(path, name, where))
    return tuple(boards)


def _lower_is_better(boards: Sequence[Leaderboard], metric: str, declared: Optional[bool], where: str) -> bool:
    """The direction from the collection: its declaration, else the leaderboards' order, else the
    built-in metric's definition; a contradiction or no source at all is an error."""
    try:
        from_boards = direction(boards)
    except ValueError as exc:
        raise TaskFormatError(f"{where}: {exc}") from exc
    info = metric_info(metric) if metric else None
    if declared is not None:
        return not declared
    if from_boards is not None:
        if info is not None and info.higher_is_better != from_boards:
            raise TaskFormatError(f"{where}: the leaderboard ranks {'higher' if from_boards else 'lower'} scores first, "
                                  f"but {metric} is {'higher' if info.higher_is_better else 'lower'}-is-better")
        return not from_boards
    if info is not None:
        return not info.higher_is_better
    raise TaskFormatError(f"{where}: cannot tell whether higher {metric or 'scores'} are better: the leaderboard's "
                          "top and bottom entries tie and the metric is not a built-in one")


def _kind(metric: str) -> str:
    info = metric_info(metric) if metric else None
    return info.kind if info else "classification"


def _description(candidates: Sequence[Path], where: str) -> str:
    for path in candidates:
        if path.is_file():
            return path.read_text(encoding="utf-8", errors="replace")
    raise TaskFormatError(f"{where}: no description: none of {[str(p) for p in candidates]} exists")


def _source_root(definitions: Path, package: str) -> tuple[str, ...]:
    """The checkout a definitions folder lives in (``.../<package>/competitions/<id>``), for its imports."""
    parent = definitions.parent
    if parent.name == "competitions" and parent.parent.name == package:
        return (str(parent.parent.parent),)
    return ()


def _category(value: object, source: Path, where: str) -> str:
    """A declared ``category`` (empty when not declared); anything outside :data:`CATEGORIES` is an error."""
    category = str(value or "")
    if category and category not in CATEGORIES:
        raise TaskFormatError(f"{where}: category in {source} must be one of {list(CATEGORIES)}, got {category!r}")
    return category


def _task(name: str, fmt: str, root: Path, public: Path, answers: Path, sample: Path, grader: GraderSpec,
          metric: str, description: str, boards: tuple, lower: bool, medal_board, where: str,
          relative_to=None, category: str = "") -> CollectionTask:
    id_column = _csv_header(sample, where)[0]
    if grader.kind == "builtin":
        answer_cols, sample_cols = _builtin_columns(metric, sample, answers, id_column, where)
    else:
        sample_cols = tuple(c for c in _csv_header(sample, where) if c != id_column)
        answer_cols = sample_cols
    try:
        answers_file.check_suffix(answers)
    except AnswersError as exc:
        raise TaskFormatError(f"{where}: {exc}") from exc
    if grader.kind == "builtin" or not answers_file.is_jsonl(answers):
        # JSON lines answers hold what their own grader needs (MLE-bench's tensorflow2-question-answering: one
        # record per example, two submission rows each): that grader alone can match them to a submission,
        # and `wmrl tasks check` has it grade the sample submission.
        _check_sample_ids(sample, answers, id_column, where)
    _check_public(public, answers, where)
    return CollectionTask(
        name=name, description=description, kind=_kind(metric), metric=metric or grader.describe(),
        target=",".join(sample_cols), id_column=id_column, submission="submission.csv",
        data=PublicFiles(public, name), hidden_labels=b"",
        leaderboard=medal_board.scores if medal_board else (boards[0].scores if boards else ()),
        format=fmt, root=root, public_dir=public, answers_path=answers, sample_submission_path=sample,
        grader=grader, answer_columns=tuple(answer_cols), submission_columns=tuple(sample_cols), boards=boards,
        medal_board=medal_board, lower_is_better=lower, relative_to=relative_to, category=category)


# --------------------------------------------------------------------------- MLE-bench


def _load_mlebench(root: Path, competition: str, competitions_dir: Optional[Path]) -> CollectionTask:
    where = f"task {competition}"
    definitions = root / competition
    if not (definitions / "config.yaml").is_file():
        registry = competitions_dir or _installed_definitions("mlebench")
        if registry is None or not (registry / competition / "config.yaml").is_file():
            raise TaskFormatError(f"{where}: no config.yaml in {root / competition} or "
                                  f"{(registry or Path('<spec.tasks.competitionsDir>')) / competition}")
        definitions = registry / competition
    config_path = definitions / "config.yaml"
    try:
        config = yaml.safe_load(config_path.read_text()) or {}
        answers_rel = config["dataset"]["answers"]
        sample_rel = config["dataset"]["sample_submission"]
        grader_cfg = config.get("grader") or {}
    except (yaml.YAMLError, KeyError, TypeError) as exc:
        raise TaskFormatError(f"{where}: {config_path} lacks dataset.answers / dataset.sample_submission ({exc})") from exc
    public = root / competition / "prepared" / "public"
    answers = _require_file(root / answers_rel, f"answers (dataset.answers in {config_path})", where)
    sample = _require_file(root / sample_rel, f"sample submission (dataset.sample_submission in {config_path})", where)
    if public in answers.parents:
        raise TaskFormatError(f"{where}: private file {answers} (dataset.answers) is under public/")
    metric = str(grader_cfg.get("name") or "")
    grade_fn = str(grader_cfg.get("grade_fn") or "")
    if (definitions / "grade.py").is_file():
        function = grade_fn.rsplit(":", 1)[-1] if ":" in grade_fn else "grade"
        grader = GraderSpec("python", file=str(definitions / "grade.py"), function=function,
                            sys_path=_source_root(definitions, "mlebench"), decimals=MLEBENCH_DECIMALS)
    elif canonical_metric(metric):
        grader = GraderSpec("builtin", metric=canonical_metric(metric), decimals=MLEBENCH_DECIMALS)
    else:
        raise TaskFormatError(f"{where}: no grade.py in {definitions} and grader.name {metric!r} in {config_path} is not "
                              f"a built-in metric ({known_metric_names()})")
    boards = _read_boards([("leaderboard", definitions / "leaderboard.csv")], where)
    if not boards:
        raise TaskFormatError(f"{where}: no leaderboard: {definitions / 'leaderboard.csv'} does not exist")
    lower = _lower_is_better(boards, metric, None, where)
    description = _description([definitions / "description.md", public / "description.md"], where)
    return _task(competition, "mlebench", root / competition, public, answers, sample, grader, metric, description,
                 boards, lower, boards[0], where, category=_category(config.get("category"), config_path, where))


# --------------------------------------------------------------------------- MLE-Dojo and the normalised layout


def _declared_higher_is_better(metric_py: Path) -> Optional[bool]:
    """The default of ``higher_is_better`` in an MLE-Dojo metric class's ``__init__`` (read, not imported)."""
    try:
        tree = ast.parse(metric_py.read_text())
    except (OSError, SyntaxError):
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "__init__":
            args = node.args.args[len(node.args.args) - len(node.args.defaults):]
            for arg, default in zip(args, node.args.defaults):
                if arg.arg == "higher_is_better" and isinstance(default, ast.Constant):
                    return bool(default.value)
    return None


def _load_prepared(root: Path, name: str, fmt: str, competitions_dir: Optional[Path]) -> CollectionTask:
    where = f"task {name}"
    task_dir = root / name
    public, private = task_dir / "data" / "public", task_dir / "data" / "private"
    answers = _require_file(private / "test_answer.csv", "answers", where)
    sample = _require_file(public / "sample_submission.csv", "sample submission", where)
    description = _description([public / "description.txt", public / "description.md"], where)
    board_files = [("private", private / "private_leaderboard.csv"), ("public", private / "public_leaderboard.csv")]
    declared: Optional[bool] = None
    category = ""
    if fmt == "mledojo":
        registry = competitions_dir or _installed_definitions("mledojo")
        metric_py = (registry / name / "utils" / "metric.py") if registry else None
        if metric_py is None or not metric_py.is_file():
            raise TaskFormatError(f"{where}: no MLE-Dojo metric: {metric_py or '<spec.tasks.competitionsDir>/' + name + '/utils/metric.py'} "
                                  "does not exist")
        grader = GraderSpec("mledojo", file=str(metric_py), sys_path=_source_root(metric_py.parent.parent, "mledojo"))
        metric = ""
        declared = _declared_higher_is_better(metric_py)
        info_dir = metric_py.parent.parent / "info"
        board_files += [("private", info_dir / "private_leaderboard.csv"), ("public", info_dir / "public_leaderboard.csv")]
    else:
        metric = ""
        metric_yaml = task_dir / "metric.yaml"
        if metric_yaml.is_file():
            try:
                settings = yaml.safe_load(metric_yaml.read_text()) or {}
                metric = str(settings.get("metric") or "")
                category = _category(settings.get("category"), metric_yaml, where)
            except (yaml.YAMLError, AttributeError) as exc:
                raise TaskFormatError(f"{where}: {metric_yaml} is not a YAML mapping with 'metric': {exc}") from exc
        if (task_dir / "grade.py").is_file():
            grader = GraderSpec("python", file=str(task_dir / "grade.py"))
        elif canonical_metric(metric):
            metric = canonical_metric(metric)
            grader = GraderSpec("builtin", metric=metric)
        else:
            raise TaskFormatError(f"{where}: unknown metric {metric!r} in {metric_yaml}; built-in metrics are "
                                  f"{known_metric_names()} (or ship {task_dir / 'grade.py'})")
    seen, unique = set(), []
    for board_name, path in board_files:  # a board in private/ wins over MLE-Dojo's info/ copy
        if board_name not in seen and path.is_file():
            seen.add(board_name)
            unique.append((board_name, path))
    boards = _read_boards(unique, where)
    if not boards:
        raise TaskFormatError(f"{where}: no leaderboard: neither {private / 'private_leaderboard.csv'} nor "
                              f"{private / 'public_leaderboard.csv'} exists")
    lower = _lower_is_better(boards, metric, declared, where)
    medal_board = next((b for b in boards if b.name == "private"), boards[0])
    return _task(name, fmt, task_dir, public, answers, sample, grader, metric, description, boards, lower,
                 medal_board, where, category=category)


# --------------------------------------------------------------------------- DSBench


def _read_result(path: Path, where: str) -> float:
    try:
        return float(path.read_text().strip())
    except (OSError, ValueError) as exc:
        raise TaskFormatError(f"{where}: cannot read a number from {path}: {exc}") from exc


def _load_dsbench(root: Path, name: str, competitions_dir: Optional[Path]) -> CollectionTask:
    where = f"task {name}"
    data = _dsbench_data(root)
    assert data is not None
    public = data / "data_resplit" / name
    answers = _require_file(data / "answers" / name / "test_answer.csv", "answers", where)
    samples = sorted(p for p in public.glob("*.csv") if "submission" in p.name.lower() or "solution" in p.name.lower())
    if not samples:
        raise TaskFormatError(f"{where}: no sample submission (a *submission*.csv) in {public}")
    homes = [h for h in (competitions_dir, root, root.parent, data.parent) if h is not None]
    script = next((h / "evaluation" / f"{name}_eval.py" for h in homes if (h / "evaluation" / f"{name}_eval.py").is_file()), None)
    if script is None:
        raise TaskFormatError(f"{where}: no grader: evaluation/{name}_eval.py is in none of {[str(h) for h in homes]}")
    perf = next((h / "save_performance" for h in homes if (h / "save_performance" / "GT" / name).is_dir()), None)
    if perf is None:
        raise TaskFormatError(f"{where}: no save_performance/GT/{name}/result.txt (DSBench's reference performance, "
                              f"which gives the metric's direction) in {[str(h) for h in homes]}")
    gt = _read_result(perf / "GT" / name / "result.txt", where)
    baseline = _read_result(perf / "baseline" / name / "result.txt", where)
    if gt == baseline:
        raise TaskFormatError(f"{where}: the GT and baseline performances tie ({gt}); the direction is unknown")
    description = _description([data / "task" / f"{name}.txt", public / "description.txt"], where)
    grader = GraderSpec("dsbench", file=str(script))
    return _task(name, "dsbench", public, public, answers, samples[0], grader, "", description, (), gt < baseline,
                 None, where, relative_to=(baseline, gt))


def _dsbench_names(root: Path) -> list[str]:
    data = _dsbench_data(root)
    assert data is not None
    return sorted(d.name for d in (data / "data_resplit").iterdir() if d.is_dir() and not d.name.startswith((".", "_")))


# --------------------------------------------------------------------------- entry point


def task_names(root: str | Path, fmt: str, competitions_dir: str | Path | None = None) -> list[str]:
    """The names ``load_collection(root, fmt, ..., names=[name])`` accepts: task folders (or DSBench tasks)."""
    root = Path(root)
    if fmt == "auto":
        fmt = detect_format(root, Path(competitions_dir) if competitions_dir else None)
    if fmt == "dsbench":
        return _dsbench_names(root)
    marker = {"wmrl": "task.yaml", "mlebench": "prepared"}.get(fmt, "data")
    return [d.name for d in _task_dirs(root, None) if (d / marker).exists()]




def load_collection(root: str | Path, fmt: str = "auto", competitions_dir: str | Path | None = None,
                    names: Optional[Sequence[str]] = None) -> list[Task]:
    """Every task under ``root`` in format ``fmt`` (only ``names`` if given), sorted by name."""
    root = Path(root)
    if fmt not in FORMATS:
        raise TaskFormatError(f"spec.tasks.format must be one of {list(FORMATS)}, got {fmt!r}")
    if not root.is_dir():
        raise TaskFormatError(f"{root}: not a directory")
    definitions = Path(competitions_dir) if competitions_dir else None
    if definitions is not None and not definitions.is_absolute():
        definitions = root / definitions
    if definitions is not None and not definitions.is_dir():
        raise TaskFormatError(f"spec.tasks.competitionsDir: {definitions} is not a directory")
    if fmt == "auto":
        fmt = detect_format(root, definitions, names)
    if fmt == "dsbench":
        if _dsbench_data(root) is None:
            raise TaskFormatError(f"{root}: not a DSBench data-modeling folder (no data_resplit/ and answers/)")
        available = _dsbench_names(root)
        unknown = sorted(set(names or []) - set(available))
        if unknown:
            raise TaskFormatError(f"{root}: no DSBench task(s) {unknown[:10]} in data_resplit/")
        return [_load_dsbench(root, n, definitions) for n in (names or available)]
    tasks: list[Task] = []
    for task_dir in _task_dirs(root, names):
        if fmt == "wmrl":
            if names is None and not (task_dir / "task.yaml").is_file():
                continue
            tasks.append(load_task(task_dir))
        elif fmt == "mlebench":
            if names is None and not (task_dir / "prepared").is_dir():
                continue
            tasks.append(_load_mlebench(root, task_dir.name, definitions))
        else:
            if names is None and not (task_dir / "data").is_dir():
                continue
            tasks.append(_load_prepared(root, task_dir.name, fmt, definitions))
    if not tasks:
        raise TaskFormatError(f"{root}: no {fmt} task directories")
    return sorted(tasks, key=lambda t: t.name)
