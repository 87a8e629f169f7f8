#!/usr/bin/env python3
"""Check wmrl's MLE-bench loader and grading against an installed ``mlebench`` (its own Grader and grade_fn).

MLE-bench is not on PyPI: install it from a checkout (``pip install --no-deps ./mle-bench`` plus
pandas, scikit-learn, scipy, pyyaml, appdirs, py7zr, tqdm, diskcache, tenacity) into an environment
that can also import wmrl, then::

    python scripts/mlebench_agreement.py [SCRATCH_DIR]

It writes synthetic prepared data in three competitions' columns (spaceship-titanic: accuracy on
boolean labels; leaf-classification: 99-class log-loss, a grade.py with a relative import;
tabular-playground-series-may-2022: AUC), loads them through the installed competition folders
(found without competitionsDir), and scores correct, poor and invalid submissions three ways: MLE-bench's
Grader, wmrl's grading subprocess running the competition's grade.py, and wmrl's built-in metric of
the grader's name; each valid score is placed on the leaderboard by MLE-bench's ``rank_score`` and by
wmrl (medal, above median). A leaderboard.csv that is still a Git LFS pointer (a checkout without
``git lfs pull``) is reported; the competition is then loaded from a copy of its folder with a
synthetic board (for the AUC competition, with its gold threshold where only a score rounded to 5
decimals reaches it). Nothing in the installed package is changed. It prints the agreement counts;
exit status 0 when validity, the rounded score, medal and above-median all agree and the built-in
metric equals ``grade_fn`` on every valid submission.
"""
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
from sklearn.metrics import roc_auc_score

import mlebench
from mlebench.registry import Registry
from mlebench.utils import load_answers, read_csv

from wmrl import collection_grading
from wmrl.task_layouts import load_collection
from wmrl.task_metrics import canonical_metric, score_submission
from wmrl.tasks import TaskFormatError

scratch = Path(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="mlebench-agreement-")).resolve()
data, copies = scratch / "data", scratch / "definitions"
shutil.rmtree(data, ignore_errors=True)
shutil.rmtree(copies, ignore_errors=True)
rng = np.random.default_rng(0)
competitions = Path(mlebench.__file__).parent / "competitions"
subs: dict[str, dict[str, pd.DataFrame]] = {}


def write(cid, public_frames, answers, sample):
    pub, priv = data / cid / "prepared" / "public", data / cid / "prepared" / "private"
    pub.mkdir(parents=True); priv.mkdir(parents=True)
    for name, frame in public_frames.items():
        frame.to_csv(pub / name, index=False)
    answers.to_csv(priv / "test.csv", index=False)
    sample.to_csv(pub / "sample_submission.csv", index=False)


# spaceship-titanic: boolean Transported, accuracy
n = 400
ids = [f"{i:04d}_01" for i in range(n)]
y = rng.random(n) < 0.5
ans = pd.DataFrame({"PassengerId": ids, "Transported": y})
write("spaceship-titanic", {"train.csv": ans.head(10), "test.csv": ans[["PassengerId"]]}, ans, ans.assign(Transported=False))
flip = rng.random(n) < 0.2
subs["spaceship-titanic"] = {"correct": ans, "80%": ans.assign(Transported=y ^ flip), "all-false": ans.assign(Transported=False),
                             "shuffled-rows": ans.assign(Transported=y ^ flip).sample(frac=1, random_state=1),
                             "invalid-columns": ans.rename(columns={"Transported": "Label"})}

# leaf-classification: 99 one-hot classes, multi-class log-loss (grade.py imports .classes)
sys.path.insert(0, str(competitions / "leaf-classification"))
from classes import CLASSES  # noqa: E402
n = 200
labels = rng.integers(0, len(CLASSES), n)
onehot = np.eye(len(CLASSES))[labels]
ans = pd.DataFrame(onehot, columns=CLASSES).astype(int); ans.insert(0, "id", np.arange(1, n + 1))
uniform = ans.copy(); uniform[CLASSES] = 1 / len(CLASSES)
write("leaf-classification", {"train.csv": pd.DataFrame({"id": [0], "species": [CLASSES[0]]}), "test.csv": ans[["id"]]}, ans, uniform)
noisy = rng.dirichlet(np.ones(len(CLASSES)), n) * 0.5 + onehot * 0.5
subs["leaf-classification"] = {"confident": ans.assign(**{c: ans[c] * 0.98 + 0.02 / len(CLASSES) for c in CLASSES}),
                               "noisy": pd.concat([ans[["id"]], pd.DataFrame(noisy, columns=CLASSES)], axis=1),
                               "uniform": uniform, "invalid-missing-class": ans.drop(columns=[CLASSES[-1]])}

# tabular-playground-series-may-2022: binary target, AUC
n = 500
t = (rng.random(n) < 0.4).astype(int)
ans = pd.DataFrame({"id": np.arange(900000, 900000 + n), "target": t})
write("tabular-playground-series-may-2022", {"train.csv": ans.head(10), "test.csv": ans[["id"]]}, ans, ans.assign(target=0.5))
score = t * 0.6 + rng.random(n) * 0.7
subs["tabular-playground-series-may-2022"] = {"good": ans.assign(target=np.clip(score, 0, 1)),
                                              "ties": ans.assign(target=np.round(np.clip(score, 0, 1), 1)),
                                              "random": ans.assign(target=rng.random(n)),
                                              "invalid-over-1": ans.assign(target=score + 1),
                                              "invalid-below-0": ans.assign(target=np.clip(score, 0, 1) - 0.01)}
# A submission whose AUC rounds up at 5 decimals: a synthetic board puts the gold threshold at its
# rounded score, which MLE-bench's Grader (rounding first) reaches and the unrounded score does not.
for _ in range(1000):
    near = np.clip(t * 0.6 + rng.random(n) * 0.7, 0, 1)
    near_gold = round(roc_auc_score(t, near), 5)
    if near_gold > roc_auc_score(t, near):
        subs["tabular-playground-series-may-2022"]["near-gold"] = ans.assign(target=near)
        break

# The installed definitions are found without competitionsDir; a board still a Git LFS pointer is refused.
competitions_dir = {}
for cid in subs:
    try:
        load_collection(data, "mlebench", names=[cid])
        competitions_dir[cid] = None
        print(f"{cid}: loaded from the installed folder {competitions / cid}")
    except TaskFormatError as exc:
        if "Git LFS pointer" not in str(exc):
            raise
        print(f"loader, installed folder: {exc}")
        shutil.copytree(competitions / cid, copies / cid)  # its grade.py still imports the installed mlebench
        lower = cid == "leaf-classification"
        scores = np.linspace(0.02, 4.0, 50) if lower else np.linspace(0.99, 0.5, 50)
        if "near-gold" in subs[cid]:  # 50 teams: gold is the 5th score
            scores = np.r_[near_gold + np.arange(4, -1, -1) * 1e-5, np.linspace(near_gold - 1e-3, 0.5, 45)]
        pd.DataFrame({"teamId": range(50), "score": scores}).to_csv(copies / cid / "leaderboard.csv", index=False)
        competitions_dir[cid] = copies

registry = Registry(data_dir=data)
rows = []
for cid, cases in subs.items():
    (task,) = load_collection(data, "mlebench", competitions_dir[cid], names=[cid])
    competition = registry.get_competition(cid)
    board = pd.read_csv((competitions_dir[cid] or competitions) / cid / "leaderboard.csv")
    for case, frame in cases.items():
        path = data / f"{cid}-{case}.csv"
        frame.to_csv(path, index=False)
        theirs = competition.grader(read_csv(path), load_answers(competition.answers))  # None when invalid
        try:
            raw = competition.grader.grade_fn(read_csv(path), load_answers(competition.answers))
        except Exception as exc:
            raw = f"{type(exc).__name__}"
        ours = collection_grading.grade_file(task, path)
        ranked = competition.grader.rank_score(theirs, board)
        their_medal = next((m for m in ("gold", "silver", "bronze") if ranked[f"{m}_medal"]), None)
        metric = canonical_metric(competition.grader.name)
        try:
            builtin = score_submission(metric, read_csv(path), read_csv(task.answers_path), task.id_column,
                                       list(task.submission_columns), list(task.submission_columns)) if metric else None
        except Exception as exc:
            builtin = f"{type(exc).__name__}"
        rows.append({"competition": cid, "submission": case, "mlebench Grader": theirs, "mlebench grade_fn": raw,
                     "wmrl (its grade.py)": ours.score if ours.valid else "invalid", "wmrl status": ours.status.value,
                     "wmrl built-in": builtin, "built-in name": metric, "position": ours.position,
                     "mlebench medal": their_medal, "wmrl medal": ours.medal,
                     "mlebench above median": ranked["above_median"], "wmrl above median": ours.above_median})
out = pd.DataFrame(rows)
pd.set_option("display.width", 300); pd.set_option("display.max_columns", 20)
print(out.to_string(index=False))
valid_agrees = [(r["mlebench Grader"] is None) == (r["wmrl status"] != "valid") for r in rows]
score_agrees = [r["mlebench Grader"] is None or r["wmrl (its grade.py)"] == r["mlebench Grader"] for r in rows]
medal_agrees = [r["mlebench Grader"] is None or (r["wmrl medal"] == r["mlebench medal"]
                                                 and r["wmrl above median"] == r["mlebench above median"]) for r in rows]
builtin_agrees = [(r["mlebench Grader"] is None) == isinstance(r["wmrl built-in"], str) for r in rows]
print(f"validity agrees on {sum(valid_agrees)}/{len(rows)} ({sum(r['mlebench Grader'] is None for r in rows)} invalid); "
      f"wmrl score == mlebench Grader's rounded score on {sum(score_agrees)}/{len(rows)}; "
      f"medal and above-median agree on {sum(medal_agrees)}/{len(rows)}; "
      f"the built-in metric's validity agrees on {sum(builtin_agrees)}/{len(rows)}")
ok = all(valid_agrees) and all(score_agrees) and all(medal_agrees) and all(builtin_agrees)
diffs = [abs(r["wmrl built-in"] - r["mlebench grade_fn"]) for r in rows
         if isinstance(r["mlebench grade_fn"], float) and isinstance(r["wmrl built-in"], float)]
print(f"wmrl built-in metric vs mlebench grade_fn on {len(diffs)} valid submissions: max |difference| {max(diffs):.3g}")
sys.exit(0 if ok and max(diffs) < 1e-12 else 1)
