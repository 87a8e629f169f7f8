"""`wmrl run` trains on an MLE-bench-layout collection, as a real subprocess, its data mounted.

Two competitions made here in MLE-bench's layout (tabular, boolean ``Transported`` labels, accuracy
by the competition's own ``grade.py``): ``spaceship-big`` is trained on, and its public directory
holds a file past the 16 MiB upload limit, so it runs only because the local sandboxes mount the
tasks directory as sandbox Pods mount the tasks volume; ``spaceship-titanic`` is held out. The
policy is ``builtin:fixed-scripts`` over four scripts (one per rung of the reward ladder), since the
demo policy cannot write pandas solutions for these files.

Rewards come from the collection's grader: its ``grade.py`` logs every call (the score it returns),
each real outcome's leaderboard position is one of those scores placed on the leaderboard, and the
wrong-columns script gets grade.py's own rejection message as its reason.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import collections_fixture as cf
from wmrl import leaderboards
from wmrl.collection_tasks import UPLOAD_LIMIT_BYTES
from wmrl.outcome import VALID_BASE, VALID_SPAN
from wmrl.task_layouts import load_collection

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join(str(ROOT / p) for p in ("", "trainer", "sandbox-image", "operator")),
           HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1")

LOGGED_GRADE = cf.SPACESHIP_GRADE.replace("from mlebench.grade_helpers import InvalidSubmissionError", """
import json


class InvalidSubmissionError(Exception):
    pass


def _log(score):
    with open(LOG, "a") as fh:
        fh.write(json.dumps({"score": score}) + "\\n")
    return score
""").replace("    return accuracy_score(truth, pred)", "    return _log(float(accuracy_score(truth, pred)))")


def _collection(tmp_path):
    data = tmp_path / "data"
    log = tmp_path / "grade-calls.jsonl"
    for name, seed in (("spaceship-big", 11), ("spaceship-titanic", 12)):
        built = cf.spaceship_mlebench(tmp_path, split=False, name=name, seed=seed)
        (built.root / name / "grade.py").write_text(f"LOG = {str(log)!r}\n" + LOGGED_GRADE)
    with open(data / "spaceship-big" / "prepared" / "public" / "images.bin", "wb") as fh:
        fh.truncate(UPLOAD_LIMIT_BYTES + (1 << 20))  # over the upload limit: only a mount brings it
    return data, log


def _manifest(tmp_path, data, scripts):
    manifest = {
        "apiVersion": "wmrl.dev/v1alpha1", "kind": "WMRLRun", "metadata": {"name": "collection-smoke"},
        "spec": {
            "mode": "real",
            "policy": {"model": "builtin:fixed-scripts", "scripts": str(scripts), "rolloutEngine": "transformers",
                       "sampling": {"maxNewTokens": 4}},
            "worldModel": {"backend": "learned"},
            "tasks": {"path": str(data), "format": "mlebench", "heldOut": ["spaceship-titanic"]},
            "algorithm": {"groupSize": 8, "groupsPerStep": 1, "steps": 3, "learningRate": 0.001, "klBeta": 0.0,
                          "maxTurns": 1, "entropyCoef": 0.0},
            "sandbox": {"timeoutSeconds": 120},
            "trainer": {"checkpoint": {"intervalSteps": 1}},
            "logging": {"trajectories": {"sampleRate": 1.0}},
        },
    }
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(manifest))
    return path


def test_wmrl_run_trains_on_a_mounted_mlebench_collection_graded_by_its_grade_py(tmp_path):
    data, log = _collection(tmp_path)
    scripts = cf.write_smoke_scripts(tmp_path / "scripts")
    tasks = {t.name: t for t in load_collection(data, "mlebench")}
    assert tasks["spaceship-big"].public.total_bytes > UPLOAD_LIMIT_BYTES
    results = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "wmrl.cli", "run", str(_manifest(tmp_path, data, scripts)),
                           "--results", str(results), "--sandboxes", "1", "--eval-samples", "4", "--no-progress"],
                          capture_output=True, text=True, env=ENV, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert f"wmrl run: task data: {os.path.realpath(data)} mounted into the sandboxes" in proc.stdout

    # The run completed, with held-out figures from real executions of the held-out competition.
    run = json.loads((results / "results.json").read_text())
    assert run["finished"] and run["steps_done"] == 3 and run["executions"] == 24
    held = run["held_out"]
    assert held["tasks"] == ["spaceship-titanic"]
    assert [p["step"] for p in held["curve"]] == [0, 1, 2, 3]
    assert all(p["complete"] and 0.0 <= p["reward"] <= 1.0 for p in held["curve"]), held["curve"]
    assert held["initial_reward"] is not None and held["final_reward"] is not None

    # Every training rollout ran for real on spaceship-big (through the mount) and was graded by grade.py.
    calls = [json.loads(line)["score"] for line in log.read_text().splitlines()]
    lines = [json.loads(line) for line in (results / "checkpoints" / "trajectories" / "rank-0.jsonl").open()]
    assert len(lines) == 24 and {t["task"] for t in lines} == {"spaceship-big"}
    by_script = {path.name: path.read_text() for path in scripts.glob("*.py")}
    big = tasks["spaceship-big"]
    positions: dict[str, set] = {}
    for line in lines:
        (turn,) = line["turns"]
        (name,) = [n for n, s in by_script.items() if s == turn["code"]]
        real = turn["real"]
        if name in ("a_logistic.py", "b_sample.py"):
            assert real["status"] == "valid", real
            placed = {leaderboards.position(score, big.boards, True) for score in calls}
            assert real["rank_score"] in placed and "accuracy = " in real["feedback"], real
            assert line["real_reward"] == pytest.approx(VALID_BASE + VALID_SPAN * real["rank_score"])
        elif name == "c_wrong_columns.py":
            assert real["status"] == "ran_no_sub", real
            assert "submission needs PassengerId and Transported columns" in real["feedback"], real  # grade.py's words
        else:
            assert real["status"] == "runtime_err" and "no_such_column" in real["feedback"], real
        positions.setdefault(name, set()).add(real.get("rank_score"))
    assert {"a_logistic.py", "b_sample.py"} <= set(positions)
    # grade.py scored every valid training submission (and the held-out evaluation's too).
    assert len(calls) >= sum(t["turns"][0]["real"]["status"] == "valid" for t in lines)
    # Each script's outcome is the same every time; the logistic model beats copying the all-False
    # sample (accuracy about 0.8 against about 0.5 on this board of 0.95 .. 0.5).
    assert all(len(p) == 1 for p in positions.values()), positions
    assert positions["a_logistic.py"].pop() > positions["b_sample.py"].pop()


def test_which_directory_local_sandboxes_mount(tmp_path):
    from wmrl.api.runconfig import from_manifest
    from wmrl_trainer.services import local_tasks_dir

    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")

    def config(tasks):
        return from_manifest({"kind": "WMRLRun", "metadata": {"name": "r"},
                              "spec": {"policy": {"model": "builtin:tiny-coder"}, "tasks": tasks}})

    assert local_tasks_dir(config({"path": str(tmp_path / "link")}), "namespaces") == str(tmp_path / "real")
    # restricted sandboxes could not hide the answers: nothing is mounted, data is uploaded (up to 16 MiB)
    assert local_tasks_dir(config({"path": str(tmp_path / "link")}), "restricted") is None
    assert local_tasks_dir(config({"builtin": "mini-ml"}), "namespaces") is None
