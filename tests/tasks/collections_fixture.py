"""Small competitions written by the tests themselves, each in one collection's exact layout.

No Kaggle data exists here, so each builder draws a seeded data set, writes the public files, the
private answers, a leaderboard ranked in the metric's direction, and the collection's own grader
(an MLE-bench ``grade.py`` importing a minimal ``mlebench`` source tree, an MLE-Dojo ``metric.py``
on a minimal ``mledojo`` tree, a DSBench ``<name>_eval.py`` script). Each returns a :class:`Built`
with a correct, a poor and an invalid submission.
"""

from __future__ import annotations

import json
import textwrap
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd


@dataclass
class Built:
    root: Path  # what spec.tasks.path / `wmrl tasks check` is given
    name: str
    correct: pd.DataFrame
    poor: pd.DataFrame
    invalid: pd.DataFrame
    competitions_dir: Path | None = None
    higher_is_better: bool = True


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def _csv(path: Path, frame: pd.DataFrame) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(path, index=False)
    return path


def _rank_score_board(scores, higher_is_better: bool) -> pd.DataFrame:
    ordered = sorted(scores, reverse=higher_is_better)
    return pd.DataFrame({"rank": range(1, len(ordered) + 1), "score": ordered})


# --------------------------------------------------------------------------- MLE-bench: boolean labels, accuracy


MLEBENCH_GRADE_HELPERS = """
class InvalidSubmissionError(Exception):
    pass
"""

SPACESHIP_GRADE = """
import pandas as pd
from sklearn.metrics import accuracy_score

from mlebench.grade_helpers import InvalidSubmissionError


def grade(submission: pd.DataFrame, answers: pd.DataFrame) -> float:
    if "Transported" not in submission.columns or "PassengerId" not in submission.columns:
        raise InvalidSubmissionError("submission needs PassengerId and Transported columns")
    if len(submission) != len(answers):
        raise InvalidSubmissionError("submission and answers differ in length")
    merged = answers.merge(submission, on="PassengerId", suffixes=("_true", "_pred"))
    if len(merged) != len(answers):
        raise InvalidSubmissionError("PassengerId values do not match")
    truth = merged["Transported_true"].astype(str).str.lower()
    pred = merged["Transported_pred"].astype(str).str.lower()
    return accuracy_score(truth, pred)
"""


def spaceship_mlebench(base: Path, split: bool, name: str = "spaceship-titanic", seed: int = 1) -> Built:
    """Binary True/False labels, accuracy, MLE-bench layout; ``split``: definitions in an mlebench source tree."""
    rng = np.random.default_rng(seed)
    n_train, n_test = 200, 80
    ids = [f"{i:04d}_01" for i in range(n_train + n_test)]
    x = rng.normal(size=n_train + n_test)
    y = (x + rng.normal(scale=0.5, size=x.size)) > 0
    train = pd.DataFrame({"PassengerId": ids[:n_train], "Age": x[:n_train], "Transported": y[:n_train]})
    test = pd.DataFrame({"PassengerId": ids[n_train:], "Age": x[n_train:]})
    answers = pd.DataFrame({"PassengerId": ids[n_train:], "Transported": y[n_train:]})
    data_dir = base / "data"
    prepared = data_dir / name / "prepared"
    _csv(prepared / "public" / "train.csv", train)
    _csv(prepared / "public" / "test.csv", test)
    _csv(prepared / "public" / "sample_submission.csv", answers.assign(Transported=False))
    _write(prepared / "public" / "description.md", "# Spaceship Titanic\nPredict Transported.\n")
    _csv(prepared / "private" / "test.csv", answers)
    if split:
        source = base / "mle-bench"
        _write(source / "mlebench" / "__init__.py", "")
        _write(source / "mlebench" / "grade_helpers.py", MLEBENCH_GRADE_HELPERS)
        _write(source / "mlebench" / "competitions" / "__init__.py", "")
        definitions = source / "mlebench" / "competitions" / name
        competitions_dir = definitions.parent
    else:  # one folder per competition holding both; a grade.py without mlebench imports
        definitions = data_dir / name
        competitions_dir = None
    _write(definitions / "config.yaml", f"""
        id: {name}
        name: Spaceship Titanic
        competition_type: simple
        awards_medals: false
        description: mlebench/competitions/{name}/description.md
        dataset:
          answers: {name}/prepared/private/test.csv
          sample_submission: {name}/prepared/public/sample_submission.csv
        grader:
          name: accuracy
          grade_fn: mlebench.competitions.{name}.grade:grade
        preparer: mlebench.competitions.{name}.prepare:prepare
        """)
    grade_py = SPACESHIP_GRADE if split else SPACESHIP_GRADE.replace(
        "from mlebench.grade_helpers import InvalidSubmissionError", "class InvalidSubmissionError(Exception):\n    pass")
    _write(definitions / "grade.py", grade_py)
    _write(definitions / "description.md", "# Spaceship Titanic\nPredict Transported.\n")
    # Kaggle's export: best team first, extra columns.
    scores = np.round(np.linspace(0.95, 0.5, 40), 5)
    _csv(definitions / "leaderboard.csv", pd.DataFrame({"scoreNullable": scores, "teamId": range(40), "score": scores}))
    correct = answers.copy()
    poor = answers.assign(Transported=~answers["Transported"])
    invalid = answers.rename(columns={"Transported": "Label"})
    return Built(data_dir, name, correct, poor, invalid, competitions_dir)


# --------------------------------------------------------------------------- MLE-Dojo: multi-class log-loss


MLEDOJO_BASE = """
class InvalidSubmissionError(Exception):
    pass


class CompetitionMetrics:
    def __init__(self, higher_is_better: bool = True):
        self.higher_is_better = higher_is_better
"""

LEAF_METRIC = """
import numpy as np
import pandas as pd
from mledojo.metrics.base import CompetitionMetrics, InvalidSubmissionError


class LeafMetrics(CompetitionMetrics):
    def __init__(self, value: str = None, higher_is_better: bool = False):
        super().__init__(higher_is_better)

    def evaluate(self, y_true: pd.DataFrame, y_pred: pd.DataFrame) -> float:
        y_true = y_true.sort_values(by="id").reset_index(drop=True).iloc[:, 1:]
        y_pred = y_pred.sort_values(by="id").reset_index(drop=True)[y_true.columns]
        y_pred = y_pred.clip(1e-15, 1 - 1e-15)
        y_pred = y_pred.div(y_pred.sum(axis=1), axis=0)
        return float(-np.mean(np.sum(y_true.to_numpy() * np.log(y_pred.to_numpy()), axis=1)))

    def validate_submission(self, submission, ground_truth) -> str:
        if set(submission.columns) != set(ground_truth.columns):
            raise InvalidSubmissionError("columns differ from the ground truth's")
        if len(submission) != len(ground_truth):
            raise InvalidSubmissionError("row count differs")
        return "ok"
"""

CLASSES = ["Acer", "Quercus", "Salix"]


def leaf_mledojo(base: Path) -> Built:
    rng = np.random.default_rng(2)
    n_train, n_test = 150, 60
    labels = rng.integers(0, 3, size=n_train + n_test)
    x = labels[:, None] + rng.normal(scale=0.7, size=(labels.size, 2))
    ids = np.arange(1, labels.size + 1)
    onehot = np.eye(3)[labels[n_train:]]
    answers = pd.DataFrame(onehot, columns=CLASSES).astype(int)
    answers.insert(0, "id", ids[n_train:])
    root = base / "prepared"
    public, private = root / "leaf-classification" / "data" / "public", root / "leaf-classification" / "data" / "private"
    _csv(public / "train.csv", pd.DataFrame({"id": ids[:n_train], "f1": x[:n_train, 0], "f2": x[:n_train, 1],
                                             "species": [CLASSES[i] for i in labels[:n_train]]}))
    _csv(public / "test.csv", pd.DataFrame({"id": ids[n_train:], "f1": x[n_train:, 0], "f2": x[n_train:, 1]}))
    uniform = answers.copy()
    uniform[CLASSES] = 1 / 3
    _csv(public / "sample_submission.csv", uniform)
    _write(public / "description.txt", "Leaf classification: predict species probabilities.\n")
    _csv(private / "test_answer.csv", answers)
    board_scores = np.linspace(0.05, 1.5, 30)
    _csv(private / "private_leaderboard.csv", _rank_score_board(board_scores, higher_is_better=False))
    _csv(private / "public_leaderboard.csv", _rank_score_board(board_scores * 1.02, higher_is_better=False))
    source = base / "MLE-Dojo"
    _write(source / "mledojo" / "__init__.py", "")
    _write(source / "mledojo" / "metrics" / "__init__.py", "")
    _write(source / "mledojo" / "metrics" / "base.py", MLEDOJO_BASE)
    _write(source / "mledojo" / "competitions" / "leaf-classification" / "utils" / "metric.py", LEAF_METRIC)
    correct = answers.copy()
    correct[CLASSES] = np.clip(onehot * 0.98 + 0.01, 0, 1)
    poor = answers.copy()
    poor[CLASSES] = np.clip((1 - onehot) * 0.49 + 0.01, 0, 1)
    invalid = answers.drop(columns=["Salix"])
    return Built(root, "leaf-classification", correct, poor, invalid, source / "mledojo" / "competitions",
                 higher_is_better=False)


# --------------------------------------------------------------------------- normalised: RMSLE, text, own grade.py


def _normalised(root: Path, name: str, train, test, answers, sample, board_scores, higher: bool,
                metric: str | None = None, grade_py: str | None = None) -> Path:
    task = root / name
    public, private = task / "data" / "public", task / "data" / "private"
    _csv(public / "train.csv", train)
    _csv(public / "test.csv", test)
    _csv(public / "sample_submission.csv", sample)
    _write(public / "description.txt", f"The {name} competition.\n")
    _csv(private / "test_answer.csv", answers)
    _csv(private / "private_leaderboard.csv", _rank_score_board(board_scores, higher))
    _csv(private / "public_leaderboard.csv", _rank_score_board(board_scores, higher))
    if metric:
        _write(task / "metric.yaml", f"metric: {metric}\n")
    if grade_py:
        _write(task / "grade.py", grade_py)
    return task


def bikes_rmsle(root: Path) -> Built:
    rng = np.random.default_rng(3)
    n = 240
    hour = rng.integers(0, 24, size=n)
    count = np.round(np.exp(1 + 0.1 * hour + rng.normal(scale=0.2, size=n)))
    ids = [f"2011-01-{1 + i // 24:02d} {i % 24:02d}:00:00" for i in range(n)]
    train = pd.DataFrame({"datetime": ids[:180], "hour": hour[:180], "count": count[:180]})
    test = pd.DataFrame({"datetime": ids[180:], "hour": hour[180:]})
    answers = pd.DataFrame({"datetime": ids[180:], "count": count[180:]})
    _normalised(root, "bike-sharing-demand", train, test, answers, answers.assign(count=0),
                np.linspace(0.1, 2.0, 50), higher=False, metric="rmsle")
    return Built(root, "bike-sharing-demand", answers.copy(), answers.assign(count=1.0),
                 answers.assign(count=np.nan), higher_is_better=False)


def tweets_text(root: Path) -> Built:
    rng = np.random.default_rng(4)
    words = {"positive": ["great", "love", "happy"], "negative": ["awful", "hate", "sad"], "neutral": ["ok", "fine", "meh"]}
    labels = rng.choice(list(words), size=150)
    texts = [" ".join(rng.choice(words[label], size=3)) + " today" for label in labels]
    ids = [f"t{i}" for i in range(150)]
    train = pd.DataFrame({"textID": ids[:100], "text": texts[:100], "sentiment": labels[:100]})
    test = pd.DataFrame({"textID": ids[100:], "text": texts[100:]})
    answers = pd.DataFrame({"textID": ids[100:], "sentiment": labels[100:]})
    _normalised(root, "tweet-sentiment", train, test, answers, answers.assign(sentiment="neutral"),
                np.linspace(0.3, 0.95, 20), higher=True, metric="f1_macro")
    poor = answers.assign(sentiment=["positive" if s == "negative" else "negative" for s in answers["sentiment"]])
    return Built(root, "tweet-sentiment", answers.copy(), poor, answers.iloc[:-5])


OWN_GRADE = """
import numpy as np
import pandas as pd


def grade(submission: pd.DataFrame, answers: pd.DataFrame) -> float:
    # median absolute error, a metric no collection names
    merged = answers.merge(submission, on="id", suffixes=("", "_pred"), validate="one_to_one")
    if len(merged) != len(answers):
        raise ValueError("ids do not match")
    if merged["y_pred"].isna().any():
        raise ValueError("NaN predictions")
    return float(np.median(np.abs(merged["y"] - merged["y_pred"])))
"""


def own_grade(root: Path) -> Built:
    rng = np.random.default_rng(5)
    y = rng.normal(size=100)
    ids = np.arange(100)
    answers = pd.DataFrame({"id": ids[60:], "y": y[60:]})
    _normalised(root, "median-error", pd.DataFrame({"id": ids[:60], "x": y[:60] + 0.1, "y": y[:60]}),
                pd.DataFrame({"id": ids[60:], "x": y[60:] + 0.1}), answers, answers.assign(y=0.0),
                np.linspace(0.01, 1.0, 25), higher=False, grade_py=OWN_GRADE)
    return Built(root, "median-error", answers.copy(), answers.assign(y=answers["y"] + 3.0),
                 answers.rename(columns={"y": "target"}), higher_is_better=False)


# --------------------------------------------------------------------------- DSBench: AUC


DSBENCH_EVAL = """
import os.path

import pandas as pd
import argparse
from sklearn.metrics import roc_auc_score

parser = argparse.ArgumentParser()
parser.add_argument('--path', type=str, required=True)
parser.add_argument('--name', type=str, required=True)
parser.add_argument('--answer_file', type=str, required=True)
parser.add_argument('--predict_file', type=str, required=True)
parser.add_argument('--value', type=str, default="target")
args = parser.parse_args()

answers = pd.read_csv(args.answer_file)
predictions = pd.read_csv(args.predict_file)
performance = roc_auc_score(answers[args.value], predictions[args.value])
with open(os.path.join(args.path, args.name, "result.txt"), "w") as f:
    f.write(str(performance))
"""


def santander_dsbench(base: Path) -> Built:
    rng = np.random.default_rng(6)
    n = 300
    x = rng.normal(size=n)
    y = (x + rng.normal(size=n) > 0.5).astype(int)
    ids = [f"ID_code_{i}" for i in range(n)]
    root = base / "data_modeling"
    name = "santander-customer-transaction-prediction"
    data = root / "data"
    _csv(data / "data_resplit" / name / "train.csv", pd.DataFrame({"ID_code": ids[:200], "var_0": x[:200], "target": y[:200]}))
    _csv(data / "data_resplit" / name / "test.csv", pd.DataFrame({"ID_code": ids[200:], "var_0": x[200:]}))
    answers = pd.DataFrame({"ID_code": ids[200:], "target": y[200:]})
    _csv(data / "data_resplit" / name / "sample_submission.csv", answers.assign(target=0))
    _csv(data / "answers" / name / "test_answer.csv", answers)
    _write(data / "task" / f"{name}.txt", "Predict the probability of a transaction.\n")
    _write(root / "evaluation" / f"{name}_eval.py", DSBENCH_EVAL)
    _write(root / "save_performance" / "GT" / name / "result.txt", "1.0")
    _write(root / "save_performance" / "baseline" / name / "result.txt", "0.5")
    correct = answers.assign(target=answers["target"] * 0.8 + 0.1)
    poor = answers.assign(target=rng.uniform(size=len(answers)))
    return Built(root, name, correct, poor, answers.drop(columns=["target"]))


# --------------------------------------------------------------------------- MLE-bench: answers as JSON lines


QA_GRADE = """
import pandas as pd


class InvalidSubmissionError(Exception):
    pass


def grade(submission: pd.DataFrame, answers: list) -> float:
    # Like MLE-bench's tensorflow2-question-answering: answers is a list of dicts (one per example), the
    # submission holds two rows per example (<id>_long, <id>_short).
    if not isinstance(answers, list) or not all(isinstance(a, dict) for a in answers):
        raise TypeError(f"answers should be the JSON lines' list of dicts, got {type(answers).__name__}")
    expected = {f"{a['example_id']}_{part}" for a in answers for part in ("long", "short")}
    if {"example_id", "PredictionString"} - set(submission.columns):
        raise InvalidSubmissionError("submission needs example_id and PredictionString columns")
    if set(submission["example_id"]) != expected or len(submission) != len(expected):
        raise InvalidSubmissionError("example_ids do not match the answers'")
    predicted = dict(zip(submission["example_id"], submission["PredictionString"].fillna("").astype(str)))
    hits = [predicted[f"{a['example_id']}_long"] == a["long"] and predicted[f"{a['example_id']}_short"] == a["short"]
            for a in answers]
    return sum(hits) / len(hits)
"""


def qa_jsonl_mlebench(base: Path) -> Built:
    """MLE-bench layout whose ``dataset.answers`` is a ``.jsonl`` read by the competition's own grade.py as a
    list of dicts, with two submission rows per answer record (so ids cannot be matched without it)."""
    rng = np.random.default_rng(7)
    n_train, n_test = 60, 30
    examples = [f"e{i}" for i in range(n_train + n_test)]
    longs = [f"{s}:{s + int(rng.integers(5, 50))}" for s in rng.integers(0, 500, size=len(examples))]
    shorts = list(rng.choice(["YES", "NO", ""], size=len(examples)))
    data_dir = base / "data"
    prepared = data_dir / "qa-lite" / "prepared"
    (prepared / "public").mkdir(parents=True, exist_ok=True)
    (prepared / "private").mkdir(parents=True, exist_ok=True)
    with open(prepared / "public" / "train.jsonl", "w") as fh:
        for e, lo, sh in zip(examples[:n_train], longs, shorts):
            fh.write(json.dumps({"example_id": e, "long": lo, "short": sh}) + "\n")
    answers = [{"example_id": e, "long": lo, "short": sh}
               for e, lo, sh in zip(examples[n_train:], longs[n_train:], shorts[n_train:])]
    with open(prepared / "private" / "test.jsonl", "w") as fh:
        fh.write("".join(json.dumps(a) + "\n" for a in answers) + "\n")  # a trailing blank line
    rows = [(f"{a['example_id']}_{part}", a[part]) for a in answers for part in ("long", "short")]
    correct = pd.DataFrame(rows, columns=["example_id", "PredictionString"])
    _csv(prepared / "public" / "sample_submission.csv", correct.assign(PredictionString=""))
    _write(prepared / "public" / "description.md", "# QA lite\nPredict the long and short answers.\n")
    definitions = data_dir / "qa-lite"
    _write(definitions / "config.yaml", """
        id: qa-lite
        name: QA lite
        competition_type: code
        awards_medals: true
        dataset:
          answers: qa-lite/prepared/private/test.jsonl
          sample_submission: qa-lite/prepared/public/sample_submission.csv
        grader:
          name: exact-match
          grade_fn: mlebench.competitions.qa-lite.grade:grade
        """)
    _write(definitions / "grade.py", QA_GRADE)
    _write(definitions / "description.md", "# QA lite\nPredict the long and short answers.\n")
    scores = np.round(np.linspace(0.9, 0.0, 30), 5)
    _csv(definitions / "leaderboard.csv", pd.DataFrame({"teamId": range(30), "score": scores}))
    half = correct.copy()
    half.loc[half["example_id"].str.endswith("_short"), "PredictionString"] = "NOPE"  # every example missed
    invalid = correct.iloc[:-2]
    return Built(data_dir, "qa-lite", correct, half, invalid)


def labels_jsonl_mlebench(base: Path) -> Built:
    """MLE-bench layout, no grade.py: the built-in ``accuracy`` (grader.name) on ``.jsonl`` answers."""
    built = spaceship_mlebench(base, split=False)
    competition = built.root / built.name
    (competition / "grade.py").unlink()
    answers_csv = competition / "prepared" / "private" / "test.csv"
    frame = pd.read_csv(answers_csv)
    answers_csv.unlink()
    frame.to_json(competition / "prepared" / "private" / "test.jsonl", orient="records", lines=True)
    config = competition / "config.yaml"
    config.write_text(config.read_text().replace("private/test.csv", "private/test.jsonl"))
    return built


# --------------------------------------------------------------------------- scripts for builtin:fixed-scripts

# Solutions any competition shaped like spaceship_mlebench's accepts (an id column, numeric features, a
# label column named by the sample submission): what the smoke-run policy samples from, since the demo
# policy writes only numpy scripts for `id,f0..,target` CSVs. One per rung of the reward ladder.
SMOKE_SCRIPTS = {
    "a_logistic.py": """
        import pandas as pd
        from sklearn.linear_model import LogisticRegression

        train = pd.read_csv('data/train.csv')
        test = pd.read_csv('data/test.csv')
        sample = pd.read_csv('data/sample_submission.csv')
        id_col, label = sample.columns[0], sample.columns[1]
        features = [c for c in test.columns if c != id_col and pd.api.types.is_numeric_dtype(test[c])]
        model = LogisticRegression().fit(train[features], train[label])
        pd.DataFrame({id_col: test[id_col], label: model.predict(test[features])}).to_csv('submission.csv', index=False)
        """,
    "b_sample.py": """
        import shutil
        shutil.copy('data/sample_submission.csv', 'submission.csv')
        """,
    "c_wrong_columns.py": """
        import pandas as pd
        sample = pd.read_csv('data/sample_submission.csv')
        sample.rename(columns={sample.columns[1]: 'prediction'}).to_csv('submission.csv', index=False)
        """,
    "d_crash.py": """
        import pandas as pd
        train = pd.read_csv('data/train.csv')
        print(train['no_such_column'].mean())
        """,
}


def write_smoke_scripts(directory: Path) -> Path:
    for name, source in SMOKE_SCRIPTS.items():
        _write(directory / name, source.lstrip("\n"))
    return directory
