"""`wmrl eval` on an MLE-bench-layout collection, as a real subprocess: categories, positions and medals
of the report against the collection's own grader run directly (the trusted peer).

Two competitions in MLE-bench's layout, graded by their own ``grade.py`` on a 40-team leaderboard;
``spaceship-b`` declares ``category: other`` in its config.yaml (the fixture data is the same kind,
so that the report has two categories), ``spaceship-titanic`` declares none and is inferred tabular.
The policy is ``builtin:fixed-scripts`` over one script (logistic regression), so every trajectory
is that script: each task's valid rate is 1, its percentile the script's leaderboard position and
its medal share 1 for the medal the script's submission earns. The peer: the same script run here
on the public data, its submission graded by :func:`wmrl.collection_grading.grade_file`.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import collections_fixture as cf
from wmrl.collection_grading import grade_file
from wmrl.task_layouts import load_collection

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join(str(ROOT / p) for p in ("", "trainer", "sandbox-image", "operator")),
           HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1")
SCRIPT = "a_logistic.py"


def _peer(task, script: Path, tmp_path: Path):
    """The script run on the task's public data outside any sandbox, its submission graded directly."""
    work = tmp_path / f"peer-{task.name}"
    work.mkdir()
    (work / "data").symlink_to(task.public_dir)
    subprocess.run([sys.executable, str(script)], cwd=work, check=True, capture_output=True, timeout=120)
    return grade_file(task, work / "submission.csv")


def test_wmrl_eval_on_a_collection_reports_its_graders_positions_medals_and_categories(tmp_path):
    for name, seed in (("spaceship-b", 21), ("spaceship-titanic", 22)):
        built = cf.spaceship_mlebench(tmp_path, split=False, name=name, seed=seed)
    data = built.root
    config = data / "spaceship-b" / "config.yaml"
    config.write_text(config.read_text() + "category: other\n")
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    (scripts / SCRIPT).write_text(cf.SMOKE_SCRIPTS[SCRIPT].replace("\n        ", "\n").lstrip("\n"))
    manifest = {"apiVersion": "wmrl.dev/v1alpha1", "kind": "WMRLRun", "metadata": {"name": "collection-eval"},
                "spec": {"policy": {"model": "builtin:fixed-scripts", "scripts": str(scripts),
                                    "rolloutEngine": "transformers", "sampling": {"maxNewTokens": 4}},
                         "worldModel": {"backend": "learned"},
                         "tasks": {"path": str(data), "format": "mlebench"},
                         "algorithm": {"maxTurns": 1}, "evaluation": {"samples": 3},
                         "sandbox": {"timeoutSeconds": 120}, "trainer": {"gpusPerNode": 0}}}
    (tmp_path / "eval.yaml").write_text(yaml.safe_dump(manifest))
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "wmrl.cli", "eval", str(tmp_path / "eval.yaml"), "--sandboxes", "1",
                           "--out", str(out), "--no-progress"], capture_output=True, text=True, env=ENV, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert f"wmrl eval: task data: {os.path.realpath(data)} mounted into the sandboxes" in proc.stdout
    report = json.loads((out / "eval.json").read_text())
    assert report["complete"] and list(report["tasks"]) == ["spaceship-b", "spaceship-titanic"]

    tasks = {t.name: t for t in load_collection(data, "mlebench")}
    for name, figures in report["tasks"].items():
        peer = _peer(tasks[name], scripts / SCRIPT, tmp_path)
        assert peer.valid and figures["valid_rate"] == 1.0 and figures["graded"] == 3
        assert figures["mean_best_position"] == pytest.approx(peer.position)
        assert figures["percentile"] == pytest.approx(peer.position)
        assert figures["mean_reward"] == pytest.approx(0.5 + 0.5 * peer.position)
        expected = {m: float(peer.medal == m) for m in ("gold", "silver", "bronze")}
        assert figures["medals"] == {**expected, "any": float(peer.medal is not None)}, (name, peer)
    assert (report["tasks"]["spaceship-b"]["category"], report["tasks"]["spaceship-titanic"]["category"]) == \
        ("other", "tabular")
    assert list(report["by_category"]) == ["tabular", "other"]
    for category, name in (("tabular", "spaceship-titanic"), ("other", "spaceship-b")):
        assert report["by_category"][category]["percentile"] == report["tasks"][name]["percentile"]
    assert report["overall"]["percentile"] == pytest.approx(
        sum(t["percentile"] for t in report["tasks"].values()) / 2)
    anys = [t["medals"]["any"] for t in report["tasks"].values()]
    assert report["overall"]["any_medal"] == pytest.approx(sum(anys) / 2)
    text = (out / "eval.md").read_text()
    assert "| `tabular` | 1 |" in text and "| `other` | 1 |" in text
