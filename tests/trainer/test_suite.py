"""The bundled mini-ml suite (real training, real grading) and loading tasks from every source.

The full suite is built once into the default cache (``$WMRL_CACHE`` or
``~/.cache/wmrl/tasks``); cache behaviour is tested on a two-task suite in a temp dir.
"""

import io
import json
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from suite_runs import run_in_process, run_subprocess
from wmrl.api.runconfig import Runtime
from wmrl.api.schema import TasksSpec
from wmrl.grading import read_submission, score
from wmrl.outcome import Status
from wmrl.tasks import TaskFormatError
from wmrl_demo import suite
from wmrl_trainer import tasks as tasks_module
from wmrl_demo.suite_data import MINI_ML, REFERENCE_MODELS

FAMILIES = [m.family for m in REFERENCE_MODELS]
# A leaderboard score and the same solution's score come from different processes (the build
# limits BLAS to one thread, a solution does not) or machines (a cache built elsewhere: other
# BLAS kernels, another libm). Measured here, every family on every task, at 1 and 2 BLAS
# threads: equal. Elsewhere a prediction may differ in its last bits; printed with %.10g that
# moves it, and the metric, by <= 1e-9 relative. The two nearest scores of different families
# differ by 2.6e-5 relative (linear, scaled-linear on sparse-linear; checked below).
SCORE_RTOL = 1e-7
# Data files print floats with %.10g: last-bit differences upstream move a value by at most one
# unit of its 10th significant digit (<= 1e-9 relative); a value that is ~0 by cancellation by ATOL.
CSV_RTOL, CSV_ATOL = 1e-8, 1e-12


@pytest.fixture(scope="module")
def tasks():
    return suite.builtin_suite("mini-ml")


@pytest.fixture(scope="module")
def references(tasks):
    return {t.name: suite.reference_scores("mini-ml", t.name) for t in tasks}


def _best(task, refs):
    pick = max if task.higher_is_better else min
    return pick(refs, key=refs.get)


def test_suite_has_at_least_12_tasks_of_both_kinds(tasks):
    assert len(tasks) >= 12
    kinds = {t.kind for t in tasks}
    assert kinds == {"classification", "regression"}
    assert sum(t.kind == "regression" for t in tasks) >= 5
    assert len({t.metric for t in tasks}) >= 4


def test_each_task_follows_the_data_contract(tasks):
    for t in tasks:
        train = t.data["train.csv"].decode().splitlines()
        test = t.data["test.csv"].decode().splitlines()
        labels = t.hidden_labels.decode().splitlines()
        n = len(test[0].split(",")) - 1
        assert train[0] == ",".join(["id", *[f"f{i}" for i in range(n)], "target"]), t.name
        assert test[0] == ",".join(["id", *[f"f{i}" for i in range(n)]]), t.name
        assert labels[0] == "id,target"
        assert [r.split(",")[0] for r in test[1:]] == [r.split(",")[0] for r in labels[1:]]
        assert 100 <= len(train) - 1 + len(test) - 1 <= 1000, "a few hundred rows"
        assert t.metric in t.description and f"{n} numeric features" in t.description
        assert f"{len(train) - 1} training rows" in t.description
        assert t.kind.split()[0][:5] in t.description.lower()


def test_leaderboards_come_from_models_of_varied_strength(tasks, references):
    for t in tasks:
        refs = references[t.name]
        assert set(refs) == set(FAMILIES)
        assert sorted(t.leaderboard) == sorted(refs.values())
        spread = max(refs.values()) - min(refs.values())
        scale = max(abs(v) for v in refs.values())
        assert spread > 0.05 * scale, f"{t.name}: reference scores barely differ: {refs}"
        # The dummy baseline is never the best entry.
        assert _best(t, refs) != "dummy"


def test_best_model_family_differs_between_tasks(tasks, references):
    best = {t.name: _best(t, references[t.name]) for t in tasks}
    assert len(set(best.values())) >= 4, best
    # Linear-friendly tasks: a linear model beats the random forest; non-linear ones: the reverse.
    r = references
    assert r["sparse-linear"]["linear"] > r["sparse-linear"]["random-forest"]
    assert r["sparse-uncorrelated"]["linear"] < r["sparse-uncorrelated"]["random-forest"]  # rmse: lower is better
    assert r["diabetes"]["scaled-linear"] > r["diabetes"]["random-forest"]
    assert r["circles"]["linear"] < r["circles"]["random-forest"]
    assert r["friedman1"]["linear"] > r["friedman1"]["gradient-boosting"]  # rmse


@pytest.mark.slow
def test_every_reference_solution_really_trains_and_the_grader_scores_it(tasks, references, tmp_path):
    """For every task: its best reference family, run as a script, reproduces the leaderboard top."""
    def one(t):
        out = run_subprocess(t, suite.solution_code(t, _best(t, references[t.name])), tmp_path / t.name)
        return t, out

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(one, tasks))
    for t, out in results:
        assert out.status is Status.VALID, (t.name, out.feedback)
        best = references[t.name][_best(t, references[t.name])]
        assert _submission_score(t, tmp_path / t.name) == pytest.approx(best, rel=SCORE_RTOL), (t.name, out.feedback)


def test_every_family_reproduces_its_leaderboard_entry(tasks, references, tmp_path):
    t = next(t for t in tasks if t.name == "moons")
    for family in FAMILIES:
        out = run_in_process(t, suite.solution_code(t, family), tmp_path / family)
        assert out.status is Status.VALID, (family, out.feedback)
        assert _submission_score(t, tmp_path / family) == pytest.approx(references[t.name][family], rel=SCORE_RTOL)


def test_reference_scores_of_different_families_are_told_apart_by_the_tolerance(references):
    for name, refs in references.items():
        values = sorted(set(refs.values()))
        gaps = [abs(b - a) / max(abs(a), abs(b)) for a, b in zip(values, values[1:])]
        assert min(gaps, default=1.0) > 100 * SCORE_RTOL, (name, refs)


def _submission_score(task, root: Path) -> float:
    """The metric of the submission a solution wrote under ``root``, graded as the grader does."""
    return score(task.metric, *read_submission(task, (root / task.submission).read_bytes()))


@pytest.mark.parametrize("bug,status", [
    ("undefined-name", Status.RUNTIME_ERR), ("bad-import", Status.RUNTIME_ERR), ("no-submission", Status.RAN_NO_SUB),
    ("no-header", Status.RAN_NO_SUB), ("id-as-feature", Status.VALID),
])
def test_solution_bugs_land_on_the_ladder(tasks, tmp_path, bug, status):
    t = next(t for t in tasks if t.name == "diabetes")
    out = run_in_process(t, suite.solution_code(t, "scaled-linear", bug=bug), tmp_path)
    assert out.status is status, out.feedback


def test_wrong_estimator_kind(tasks, tmp_path):
    regression = next(t for t in tasks if t.name == "friedman1")
    out = run_in_process(regression, suite.solution_code(regression, "random-forest", bug="wrong-kind"), tmp_path / "r")
    assert out.status is Status.RUNTIME_ERR and out.error_type == "ValueError"
    classification = next(t for t in tasks if t.name == "moons")
    out = run_in_process(classification, suite.solution_code(classification, "knn", bug="wrong-kind"), tmp_path / "c")
    assert out.status is Status.VALID  # a regressor's predictions truncated to labels: runs, scores worse


def test_solution_code_rejects_unknown_family_and_bug(tasks):
    with pytest.raises(ValueError, match="family"):
        suite.solution_code(tasks[0], "transformer")
    with pytest.raises(ValueError, match="bug"):
        suite.solution_code(tasks[0], "tree", bug="segfault")


# ------------------------------------------------------------------ building and caching

@pytest.fixture
def tiny_suite(monkeypatch):
    monkeypatch.setitem(suite.SUITES, "tiny", (MINI_ML[4], MINI_ML[9]))  # moons, diabetes
    return "tiny"


def _tree_bytes(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_build_is_deterministic(tiny_suite, tmp_path):
    suite.build_suite(tiny_suite, tmp_path / "a")
    suite.build_suite(tiny_suite, tmp_path / "b")
    assert _tree_bytes(tmp_path / "a") == _tree_bytes(tmp_path / "b")
    # ... and matches the cached full suite's copy of those tasks, which may have been built elsewhere.
    full = suite.builtin_suite_dir("mini-ml")
    for name in ("moons", "diabetes"):
        _assert_same_task_files(tmp_path / "a" / name, full / name)


def _assert_same_task_files(built: Path, cached: Path) -> None:
    """The same files; text equal, numbers equal up to the rounding another machine may cause."""
    a, b = _tree_bytes(built), _tree_bytes(cached)
    assert a.keys() == b.keys()
    for rel in a:
        if rel.endswith(".csv"):
            assert a[rel].split(b"\n", 1)[0] == b[rel].split(b"\n", 1)[0], rel  # the header
            np.testing.assert_allclose(_csv_values(a[rel]), _csv_values(b[rel]), rtol=CSV_RTOL, atol=CSV_ATOL,
                                       err_msg=rel)
        elif rel.endswith(".json"):  # the leaderboard and the reference scores
            assert json.loads(a[rel]) == pytest.approx(json.loads(b[rel]), rel=SCORE_RTOL), rel
        else:
            assert a[rel] == b[rel], rel


def _csv_values(content: bytes) -> np.ndarray:
    return np.loadtxt(io.BytesIO(content), delimiter=",", skiprows=1, ndmin=2)


def test_cache_is_built_once_and_partial_builds_are_replaced(tiny_suite, tmp_path):
    target = tmp_path / f"tiny-{suite.SUITE_VERSION}"
    target.mkdir()
    (target / "junk").write_text("a build cut off halfway")  # no completion marker
    first = suite.builtin_suite_dir(tiny_suite, tmp_path)
    assert first == target and not (target / "junk").exists()
    stamp = (target / "moons" / "task.yaml").stat().st_mtime_ns
    tasks = suite.builtin_suite(tiny_suite, tmp_path)
    assert [t.name for t in tasks] == ["diabetes", "moons"]
    assert (target / "moons" / "task.yaml").stat().st_mtime_ns == stamp
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "staging dirs are cleaned up"


def test_unknown_builtin_suite_names_the_field(tmp_path):
    with pytest.raises(ValueError, match="spec.tasks.builtin"):
        suite.builtin_suite("kaggle-all", tmp_path)


# ------------------------------------------------------------------ sources

def test_load_tasks_builtin_and_path(tasks, tmp_path):
    assert [t.name for t in tasks_module.load_tasks(TasksSpec(builtin="mini-ml"), Runtime())] == [t.name for t in tasks]
    shutil.copytree(suite.builtin_suite_dir("mini-ml") / "iris", tmp_path / "mine" / "iris")
    loaded = tasks_module.load_tasks(TasksSpec(path=str(tmp_path / "mine")), Runtime())
    assert [t.name for t in loaded] == ["iris"]
    assert loaded[0].data == next(t for t in tasks if t.name == "iris").data


def test_load_tasks_from_a_pvc_mount(tmp_path):
    for name in ("wine", "moons"):
        shutil.copytree(suite.builtin_suite_dir("mini-ml") / name, tmp_path / name)
    loaded = tasks_module.load_tasks(TasksSpec(pvc="my-tasks"), Runtime(tasks_dir=str(tmp_path)))
    assert [t.name for t in loaded] == ["moons", "wine"]


def test_load_tasks_from_a_mounted_config_map(tasks, tmp_path):
    """A ConfigMap volume: one file per key ('/' written '__') plus kubelet's ..data symlinks."""
    iris = next(t for t in tasks if t.name == "iris")
    real = tmp_path / "..2026_12_02_00_00_00.1"
    real.mkdir()
    for rel, content in iris.to_files().items():
        (real / rel.replace("/", "__")).write_bytes(content)
    os.symlink(real.name, tmp_path / "..data")
    for key in os.listdir(real):
        os.symlink(f"..data/{key}", tmp_path / key)
    loaded = tasks_module.load_tasks(TasksSpec(config_map="iris-task"), Runtime(tasks_dir=str(tmp_path)))
    assert len(loaded) == 1 and loaded[0].name == "iris"
    assert loaded[0].hidden_labels == iris.hidden_labels and loaded[0].leaderboard == iris.leaderboard


def test_load_tasks_errors_name_the_source(tmp_path):
    with pytest.raises(TaskFormatError, match="configMap"):
        tasks_module.load_tasks(TasksSpec(config_map="x"), Runtime(tasks_dir=str(tmp_path / "absent")))
    with pytest.raises(TaskFormatError, match="no task directories"):
        tasks_module.load_tasks(TasksSpec(path=str(tmp_path)), Runtime())


def test_held_out_selection(tasks):
    train, held = tasks_module.split_held_out(tasks, ["wine", "friedman3"])
    assert [t.name for t in held] == ["friedman3", "wine"]
    assert len(train) == len(tasks) - 2 and not {"wine", "friedman3"} & {t.name for t in train}
    with pytest.raises(TaskFormatError, match="heldOut.*'nope'"):
        tasks_module.split_held_out(tasks, ["nope"])
    with pytest.raises(TaskFormatError, match="every task is held out"):
        tasks_module.split_held_out(tasks[:2], [t.name for t in tasks[:2]])


def test_reference_predictions_are_not_constant(tasks):
    """Sanity: targets vary, so the metrics separate good models from bad ones."""
    for t in tasks:
        labels = np.loadtxt(io.BytesIO(t.hidden_labels), delimiter=",", skiprows=1)
        assert np.unique(labels[:, 1]).size > 1, t.name
