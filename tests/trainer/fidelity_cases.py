"""A small hand-made fidelity case set (test helper): a toy task, seven scripts, their real outcomes.

The learned judge's predictions on them (seed 0, frozen) are written next to each script; the
tests check that it still says so before they compute the figures by hand from them.
"""

from __future__ import annotations

import json
from pathlib import Path

from wmrl.outcome import Outcome, Status
from wmrl.tasks import Task
from wmrl_trainer.fidelity.cases import case_json

TASK = Task(name="toy", description="Binary classification of toy rows. Metric: accuracy.", kind="classification",
            metric="accuracy", target="target",
            data={"train.csv": b"id,f0,f1,target\n0,1,2,1\n", "test.csv": b"id,f0,f1\n1,3,4\n"},
            hidden_labels=b"id,target\n1,1\n", leaderboard=(0.5, 0.8, 0.9))
HEAD = ("import pandas as pd\ntrain = pd.read_csv('data/train.csv')\ntest = pd.read_csv('data/test.csv')\n"
        "X, y = train[['f0', 'f1']], train['target']\n")
WRITE = ("pd.DataFrame({'id': test['id'], 'target': model.predict(test[['f0', 'f1']])})"
         ".to_csv('submission.csv', index=False)\n")
LINEAR = "from sklearn.linear_model import LogisticRegression\n"

# name -> (script, real outcome, the learned judge's prediction: status, error type, reward)
CASES = {
    "syntax": ("x = = 1\nprint(x)\n",
               Outcome(status=Status.SYNTAX_ERR, error_type="SyntaxError", error_line=1),
               ("syntax_err", "SyntaxError", 0.0)),
    "name": (HEAD + "model = RandomForestClassifier().fit(X, y)\n" + WRITE,
             Outcome(status=Status.RUNTIME_ERR, error_type="NameError", error_line=5,
                     feedback="NameError: name 'RandomForestClassifier' is not defined"),
             ("runtime_err", "NameError", 0.1)),
    "key": (HEAD + "if X.empty:\n    print(undefined_total)\nprint(train['f9'].mean())\n" + LINEAR
            + "model = LogisticRegression().fit(X, y)\n" + WRITE,
            Outcome(status=Status.RUNTIME_ERR, error_type="KeyError", error_line=7, feedback="KeyError: 'f9'"),
            ("runtime_err", "NameError", 0.1)),
    "nosub": (HEAD + LINEAR + "model = LogisticRegression().fit(X, y)\nprint(model.score(X, y))\n",
              Outcome(status=Status.RAN_NO_SUB, feedback="no submission.csv was written"),
              ("ran_no_sub", None, 0.2)),
    "forest": (HEAD + "from sklearn.ensemble import RandomForestClassifier\n"
               "model = RandomForestClassifier(n_estimators=300, random_state=0).fit(X, y)\n" + WRITE,
               Outcome(status=Status.VALID, rank_score=0.9, feedback="accuracy = 0.95"),
               ("valid", None, 0.6)),
    "linear": (HEAD + LINEAR + "model = LogisticRegression(max_iter=500).fit(X, y)\n" + WRITE,
               Outcome(status=Status.RAN_NO_SUB, feedback="submission.csv: ids do not match the test ids"),
               ("valid", None, 0.525)),
    "knn": (HEAD + "from sklearn.neighbors import KNeighborsClassifier\n"
            "model = KNeighborsClassifier(n_neighbors=5).fit(X, y)\n" + WRITE,
            Outcome(status=Status.VALID, rank_score=0.2, feedback="accuracy = 0.7"),
            ("valid", None, 0.525)),
}


def case_lines(prefix: str = "") -> list[dict]:
    """The cases as case-file objects; ``prefix`` is put before every script (a different set of scripts)."""
    return [case_json(TASK, prefix + code, real, source={"name": name}) for name, (code, real, _) in CASES.items()]


def write_cases(path: Path, lines: list[dict] | None = None) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in (case_lines() if lines is None else lines)))
    return path
