"""Solution scripts as sequences of code chunks: the action space of the CPU demo policy.

A solution for a mini-ml task (data contract: ``data/train.csv`` = ``id,f0..f{n-1},target``,
``data/test.csv`` = ``id,f0..f{n-1}``, write ``submission.csv`` with header ``id,target``)
is assembled from three slots, each filled by one *chunk* (a few whole lines of code):

  load -> [preprocess] -> solve      (solve = build an estimator, fit it, write predictions)

Every chunk is one token of the demo policy's vocabulary (:mod:`wmrl_demo.demo_policy`),
so a whole script is ~3 tokens and CPU RL is fast. Besides good chunks the library holds
plausible mistakes that land on every rung of the reward ladder: a syntax error, a wrong
path or a misspelt method (runtime error), printing a score instead of writing the
submission or writing the wrong header (no valid submission), a classifier on a regression
task (runtime error: sklearn rejects continuous labels) or a regressor on a classification
task (valid but poor). Scripts use numpy + scikit-learn only.

Why fitting and writing live inside each estimator's chunk: with separate ``fit`` and
``write`` tokens shared by every script, GRPO blames them for every failed script too, and
the tiny policy drifted into a degenerate mode (estimator chunks repeated to the token
limit, never fitting or writing: every group constant at 0.2, advantages zero, no way
back), in the real-execution arm as much as in WMRL's. A solve chunk is a complete ending
(the demo policy stops generating after it), so what RL credits or blames is the choice of
estimator itself.

:func:`sample_script` draws random mixtures of good and bad choices, the estimator only
weakly tied to the task's kind: the supervised warm start on such scripts gives a *mediocre*
starting policy with variance, and RL has to learn which choices suit which kind of task.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

_SAVE = ("np.savetxt('submission.csv', np.column_stack([ids, pred]), delimiter=',', "
         "header='{header}', comments='', fmt='%.10g')\n")


@dataclass(frozen=True)
class Chunk:
    """One token's worth of code. ``fits`` says what it is good for (for docs/tests only)."""

    name: str
    slot: str
    code: str
    fits: str = "any"  # any | classification | regression | bad


_FIT = "model.fit(X, y)\n"
_PREDICT = "pred = model.predict(X_test)\n"
_FIT_AND_WRITE = _FIT + _PREDICT + _SAVE.format(header="id,target")


def _model(name: str, module: str, cls: str, args: str, fits: str) -> Chunk:
    """A solve chunk: build ``cls(args)``, fit it, write its test predictions."""
    return Chunk(name, "solve", f"from sklearn.{module} import {cls}\nmodel = {cls}({args})\n" + _FIT_AND_WRITE, fits)


CHUNKS: tuple[Chunk, ...] = (
    # load
    Chunk("load", "load",
          "import numpy as np\n"
          "train = np.loadtxt('data/train.csv', delimiter=',', skiprows=1, ndmin=2)\n"
          "test = np.loadtxt('data/test.csv', delimiter=',', skiprows=1, ndmin=2)\n"
          "X, y = train[:, 1:-1], train[:, -1]\n"
          "ids, X_test = test[:, 0], test[:, 1:]\n"),
    Chunk("load_wrong_path", "load",
          "import numpy as np\n"
          "train = np.loadtxt('train.csv', delimiter=',', skiprows=1, ndmin=2)\n"
          "test = np.loadtxt('test.csv', delimiter=',', skiprows=1, ndmin=2)\n"
          "X, y = train[:, 1:-1], train[:, -1]\n"
          "ids, X_test = test[:, 0], test[:, 1:]\n", "bad"),
    Chunk("load_syntax_error", "load",
          "import numpy as np\n"
          "train = np.loadtxt('data/train.csv', delimiter=',', skiprows=1\n"
          "X, y = train[:, 1:-1], train[:, -1]\n", "bad"),
    # preprocess (optional slot)
    Chunk("standard_scaler", "preprocess",
          "from sklearn.preprocessing import StandardScaler\n"
          "scaler = StandardScaler().fit(X)\n"
          "X, X_test = scaler.transform(X), scaler.transform(X_test)\n"),
    Chunk("minmax_scaler", "preprocess",
          "from sklearn.preprocessing import MinMaxScaler\n"
          "scaler = MinMaxScaler().fit(X)\n"
          "X, X_test = scaler.transform(X), scaler.transform(X_test)\n"),
    Chunk("poly_features", "preprocess",
          "from sklearn.preprocessing import PolynomialFeatures\n"
          "poly = PolynomialFeatures(degree=2, include_bias=False).fit(X)\n"
          "X, X_test = poly.transform(X), poly.transform(X_test)\n"),
    Chunk("scaler_typo", "preprocess",
          "from sklearn.preprocessing import StandardScaler\n"
          "X = StandardScaler().fit_transfrom(X)\n", "bad"),
    # solve: classifiers (fit + write included)
    _model("logreg", "linear_model", "LogisticRegression", "max_iter=1000", "classification"),
    _model("logreg_strong_l2", "linear_model", "LogisticRegression", "C=0.01, max_iter=1000", "classification"),
    _model("rf_clf", "ensemble", "RandomForestClassifier", "n_estimators=100, random_state=0", "classification"),
    _model("rf_clf_stump", "ensemble", "RandomForestClassifier", "n_estimators=5, max_depth=1, random_state=0", "classification"),
    _model("knn_clf", "neighbors", "KNeighborsClassifier", "n_neighbors=5", "classification"),
    _model("gaussian_nb", "naive_bayes", "GaussianNB", "", "classification"),
    _model("tree_clf", "tree", "DecisionTreeClassifier", "max_depth=3, random_state=0", "classification"),
    _model("svc", "svm", "SVC", "C=3.0", "classification"),
    _model("extra_trees_clf", "ensemble", "ExtraTreesClassifier", "n_estimators=100, random_state=0", "classification"),
    _model("dummy_clf", "dummy", "DummyClassifier", "strategy='most_frequent'", "classification"),
    # solve: regressors
    _model("linreg", "linear_model", "LinearRegression", "", "regression"),
    _model("ridge", "linear_model", "Ridge", "alpha=1.0", "regression"),
    _model("ridge_strong", "linear_model", "Ridge", "alpha=1000.0", "regression"),
    _model("rf_reg", "ensemble", "RandomForestRegressor", "n_estimators=100, random_state=0", "regression"),
    _model("gbr", "ensemble", "GradientBoostingRegressor", "random_state=0", "regression"),
    _model("knn_reg", "neighbors", "KNeighborsRegressor", "n_neighbors=5", "regression"),
    _model("tree_reg", "tree", "DecisionTreeRegressor", "max_depth=2, random_state=0", "regression"),
    _model("svr", "svm", "SVR", "C=3.0", "regression"),
    _model("extra_trees_reg", "ensemble", "ExtraTreesRegressor", "n_estimators=100, random_state=0", "regression"),
    _model("dummy_reg", "dummy", "DummyRegressor", "", "regression"),
    # solve: mistakes in building, fitting or writing (the estimator itself would be fine)
    Chunk("model_syntax_error", "solve",
          "from sklearn.ensemble import RandomForestClassifier\n"
          "model = RandomForestClassifier(n_estimators=100\n" + _FIT_AND_WRITE, "bad"),
    Chunk("fit_wrong_api", "solve",
          "from sklearn.linear_model import Ridge\nmodel = Ridge(alpha=1.0)\n"
          "model.train(X, y)\n" + _PREDICT + _SAVE.format(header="id,target"), "bad"),
    Chunk("write_wrong_header", "solve",
          "from sklearn.ensemble import RandomForestRegressor\nmodel = RandomForestRegressor(n_estimators=100, random_state=0)\n"
          + _FIT + _PREDICT + _SAVE.format(header="id,prediction"), "bad"),
    Chunk("print_only", "solve",
          "from sklearn.linear_model import LogisticRegression\nmodel = LogisticRegression(max_iter=1000)\n"
          + _FIT + "print('train score', model.score(X, y))\n", "bad"),
)

SLOTS: tuple[str, ...] = ("load", "preprocess", "solve")
BY_NAME: dict[str, Chunk] = {c.name: c for c in CHUNKS}

# Warm-start mixture: how often each slot is left out, and how often a bad chunk fills it.
# Chosen so the starting policy lands on every rung of the ladder (see module docstring).
SKIP_PROBABILITY = {"preprocess": 0.4}
BAD_PROBABILITY = {"load": 0.12, "preprocess": 0.15, "solve": 0.3}


def slot_chunks(slot: str, bad: bool | None = None) -> list[Chunk]:
    """The chunks of ``slot``; ``bad`` filters mistakes (True) or sensible choices (False)."""
    chunks = [c for c in CHUNKS if c.slot == slot]
    if bad is None:
        return chunks
    return [c for c in chunks if (c.fits == "bad") == bad]


KIND_MATCH = 0.65
"""Warm start: how often a sensible estimator is of the task's kind (0.5 would ignore the task)."""


def sample_script(rng: random.Random, kind: str | None = None) -> list[Chunk]:
    """A random solution: each slot skipped, filled badly or filled sensibly at random.

    The estimator is of the task's ``kind`` with probability :data:`KIND_MATCH`, else of the
    other kind (uniform over both without a ``kind``): a weak lean towards the right kind
    teaches the warm-started policy to read the prompt at all, and leaves about a third of
    its otherwise-good scripts on the wrong kind of estimator for RL to unlearn.
    """
    script = []
    for slot in SLOTS:
        if rng.random() < SKIP_PROBABILITY.get(slot, 0.0):
            continue
        bad = rng.random() < BAD_PROBABILITY[slot]
        choices = slot_chunks(slot, bad=bad)
        if slot == "solve" and not bad and kind is not None:
            wanted = kind if rng.random() < KIND_MATCH else ("regression" if kind == "classification" else "classification")
            choices = [c for c in choices if c.fits == wanted]
        script.append(rng.choice(choices))
    return script


def render(chunks: list[Chunk]) -> str:
    return "".join(c.code for c in chunks)


def best_script(kind: str) -> list[Chunk]:
    """A strong solution for ``kind`` (classification | regression): a reference for tests."""
    model = "rf_clf" if kind == "classification" else "rf_reg"
    return [BY_NAME["load"], BY_NAME["standard_scaler"], BY_NAME[model]]
