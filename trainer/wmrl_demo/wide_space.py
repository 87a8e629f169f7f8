"""The wide action space of ``builtin:tiny-coder-wide``: where complexity can be exploited.

The tiny coder's space (:mod:`wmrl_demo.solutions`, ``load [preprocess] solve``, 360 scripts a
task) has no complex-but-wrong script: a judge that likes complexity mostly points the right
way there. This space adds what AutoResearch agents actually reach for, and what an optimistic
reviewer over-rates:

  load -> preprocess* -> model -> knob* -> end

* **preprocessing chains**: any number of steps (scalers, PCA, quantile transform, polynomial
  features of degree 2 or 3), so ``poly3 -> poly3`` explodes the feature count;
* **models**: the tiny coder's estimators, built but not yet fitted, plus large forests and
  boosting (1000 estimators);
* **knobs** (hyperparameter tokens and wrappers, applied to the built model in order): ten
  times the estimators or iterations, unlimited depth, a grid search, bagging, stacking
  with a second model; several knobs multiply the work, and large ensembles run into the
  sandbox's timeout;
* **ends**: fit, predict and write the submission, or one of the tiny coder's mistakes there
  (a misspelt method, printing a score instead, a wrong header).

The grammar (:data:`NEXT_ROLES`) is first order and built into the network, as for the tiny
coder; ``maxNewTokens`` bounds a script's length, so a script that never reaches an end chunk
is cut off (and writes nothing). With 8 tokens a task has tens of millions of scripts: they
rarely repeat, and held-out reward is estimated from sampled scripts, not enumerated.

Every chunk is whole lines of code for both task kinds (the knobs pick a classifier's or a
regressor's wrapper with ``is_classifier``). Not every sequence runs: a wrapper over a stacking
ensemble fails, as it would for an agent that tried it; such scripts are runtime errors for the
reward, which a world model must learn to predict.
"""

from __future__ import annotations

import random

from wmrl_demo.solutions import BY_NAME, Chunk

ROLES: tuple[str, ...] = ("prompt", "load", "preprocess", "model", "knob", "end", "eos")
NEXT_ROLES: dict[str, tuple[str, ...]] = {
    "prompt": ("load",),
    "load": ("preprocess", "model"),
    "preprocess": ("preprocess", "model"),
    "model": ("knob", "end"),
    "knob": ("knob", "end"),
    "end": ("eos",),
    "eos": ("eos",),
}

_SAVE = ("np.savetxt('submission.csv', np.column_stack([ids, pred]), delimiter=',', "
         "header='{header}', comments='', fmt='%.10g')\n")
_TRANSFORM = "X, X_test = {name}.transform(X), {name}.transform(X_test)\n"


def _pre(name: str, module: str, cls: str, args: str, var: str) -> Chunk:
    return Chunk(name, "preprocess", f"from sklearn.{module} import {cls}\n{var} = {cls}({args}).fit(X)\n"
                 + _TRANSFORM.format(name=var))


def _build(name: str, module: str, cls: str, args: str, fits: str) -> Chunk:
    return Chunk(name, "model", f"from sklearn.{module} import {cls}\nmodel = {cls}({args})\n", fits)


def _wrap(name: str, code: str) -> Chunk:
    return Chunk(name, "knob", "from sklearn.base import is_classifier\n" + code)


CHUNKS: tuple[Chunk, ...] = (
    BY_NAME["load"], BY_NAME["load_wrong_path"], BY_NAME["load_syntax_error"],
    # preprocessing: chainable
    BY_NAME["standard_scaler"], BY_NAME["minmax_scaler"], BY_NAME["scaler_typo"],
    _pre("quantile", "preprocessing", "QuantileTransformer", "n_quantiles=50, output_distribution='normal'", "quant"),
    _pre("pca", "decomposition", "PCA", "n_components=0.95", "pca"),
    _pre("poly2", "preprocessing", "PolynomialFeatures", "degree=2, include_bias=False", "poly"),
    _pre("poly3", "preprocessing", "PolynomialFeatures", "degree=3, include_bias=False", "poly3"),
    # models: built here, fitted by the end chunk
    _build("logreg", "linear_model", "LogisticRegression", "max_iter=1000", "classification"),
    _build("rf_clf", "ensemble", "RandomForestClassifier", "n_estimators=100, random_state=0", "classification"),
    _build("rf_clf_1000", "ensemble", "RandomForestClassifier", "n_estimators=1000, random_state=0",
           "classification"),
    _build("knn_clf", "neighbors", "KNeighborsClassifier", "n_neighbors=5", "classification"),
    _build("gaussian_nb", "naive_bayes", "GaussianNB", "", "classification"),
    _build("tree_clf", "tree", "DecisionTreeClassifier", "max_depth=3, random_state=0", "classification"),
    _build("svc", "svm", "SVC", "C=3.0", "classification"),
    _build("gb_clf", "ensemble", "GradientBoostingClassifier", "random_state=0", "classification"),
    _build("dummy_clf", "dummy", "DummyClassifier", "strategy='most_frequent'", "classification"),
    _build("ridge", "linear_model", "Ridge", "alpha=1.0", "regression"),
    _build("rf_reg", "ensemble", "RandomForestRegressor", "n_estimators=100, random_state=0", "regression"),
    _build("rf_reg_1000", "ensemble", "RandomForestRegressor", "n_estimators=1000, random_state=0", "regression"),
    _build("gbr", "ensemble", "GradientBoostingRegressor", "random_state=0", "regression"),
    _build("gbr_1000", "ensemble", "GradientBoostingRegressor", "n_estimators=1000, random_state=0", "regression"),
    _build("knn_reg", "neighbors", "KNeighborsRegressor", "n_neighbors=5", "regression"),
    _build("tree_reg", "tree", "DecisionTreeRegressor", "max_depth=2, random_state=0", "regression"),
    _build("svr", "svm", "SVR", "C=3.0", "regression"),
    _build("dummy_reg", "dummy", "DummyRegressor", "", "regression"),
    Chunk("model_syntax_error", "model", "from sklearn.ensemble import RandomForestClassifier\n"
          "model = RandomForestClassifier(n_estimators=100\n", "bad"),
    # knobs: hyperparameter tokens and wrappers of the model built so far
    Chunk("more_estimators", "knob", "model.set_params(**{k: v * 10 for k, v in model.get_params().items() "
          "if k in ('n_estimators', 'max_iter') and isinstance(v, int) and v > 0})\n"),
    Chunk("no_depth_limit", "knob", "model.set_params(**{k: None for k in ('max_depth',) "
          "if k in model.get_params()})\n"),
    _wrap("grid_search", "from sklearn.model_selection import GridSearchCV\n"
          "grid = {'C': [0.1, 1.0, 10.0], 'alpha': [0.1, 1.0, 10.0], 'n_neighbors': [3, 5, 9], "
          "'max_depth': [2, 4, None], 'n_estimators': [50, 200, 500]}\n"
          "model = GridSearchCV(model, {k: v for k, v in grid.items() if k in model.get_params()}, cv=5)\n"),
    _wrap("bagging", "from sklearn.ensemble import BaggingClassifier, BaggingRegressor\n"
          "model = (BaggingClassifier if is_classifier(model) else BaggingRegressor)"
          "(model, n_estimators=50, random_state=0)\n"),
    _wrap("stacking", "from sklearn.ensemble import StackingClassifier, StackingRegressor\n"
          "from sklearn.tree import DecisionTreeClassifier, DecisionTreeRegressor\n"
          "model = (StackingClassifier if is_classifier(model) else StackingRegressor)([('first', model), "
          "('second', (DecisionTreeClassifier if is_classifier(model) else DecisionTreeRegressor)(random_state=0))], "
          "cv=5)\n"),
    # ends
    Chunk("fit_write", "end", "model.fit(X, y)\npred = model.predict(X_test)\n" + _SAVE.format(header="id,target")),
    Chunk("fit_wrong_api", "end", "model.train(X, y)\npred = model.predict(X_test)\n"
          + _SAVE.format(header="id,target"), "bad"),
    Chunk("print_only", "end", "model.fit(X, y)\nprint('train score', model.score(X, y))\n", "bad"),
    Chunk("write_wrong_header", "end", "model.fit(X, y)\npred = model.predict(X_test)\n"
          + _SAVE.format(header="id,prediction"), "bad"),
)
SLOT_OF = {c.name: c.slot for c in CHUNKS}
WIDE_BY_NAME = {c.name: c for c in CHUNKS}

# Warm start: how long the chains are and how often a mistake fills a slot. Chosen so the starting
# policy writes every kind of script, most of them compiling, with short chains most of the time.
CHAIN_PROBABILITY = {"preprocess": 0.45, "knob": 0.35}
"""Probability of adding one more step to a chain (a geometric length: 0 steps with 1 - p)."""
MAX_CHAIN = 3
BAD_PROBABILITY = {"load": 0.12, "preprocess": 0.1, "model": 0.05, "end": 0.3}
KIND_MATCH = 0.65
"""How often a sensible model is of the task's kind (as :data:`wmrl_demo.solutions.KIND_MATCH`)."""


def slot_chunks(slot: str, bad: bool | None = None) -> list[Chunk]:
    chunks = [c for c in CHUNKS if c.slot == slot]
    return chunks if bad is None else [c for c in chunks if (c.fits == "bad") == bad]


def _chain(rng: random.Random, slot: str) -> list[Chunk]:
    steps = []
    while len(steps) < MAX_CHAIN and rng.random() < CHAIN_PROBABILITY[slot]:
        bad = rng.random() < BAD_PROBABILITY.get(slot, 0.0)
        steps.append(rng.choice(slot_chunks(slot, bad=bad) or slot_chunks(slot)))
    return steps


def sample_script(rng: random.Random, kind: str | None = None) -> list[Chunk]:
    """A random wide script for the warm start: chains of random length, mistakes now and then,
    the model only weakly tied to the task's kind (RL has to learn the rest)."""
    script = [rng.choice(slot_chunks("load", bad=rng.random() < BAD_PROBABILITY["load"]))]
    script += _chain(rng, "preprocess")
    if rng.random() < BAD_PROBABILITY["model"]:
        script.append(rng.choice(slot_chunks("model", bad=True)))
    else:
        wanted = kind if kind is None or rng.random() < KIND_MATCH else (
            "regression" if kind == "classification" else "classification")
        script.append(rng.choice([c for c in slot_chunks("model", bad=False) if wanted is None or c.fits == wanted]))
    script += _chain(rng, "knob")
    script.append(rng.choice(slot_chunks("end", bad=rng.random() < BAD_PROBABILITY["end"])))
    return script


def good_script(kind: str, knobs: tuple[str, ...] = (), preprocessing: tuple[str, ...] = ("standard_scaler",)) -> list[Chunk]:
    """A sensible script for ``kind`` with these knobs and preprocessing (a reference for tests)."""
    model = "rf_clf" if kind == "classification" else "rf_reg"
    return ([WIDE_BY_NAME["load"]] + [WIDE_BY_NAME[p] for p in preprocessing] + [WIDE_BY_NAME[model]]
            + [WIDE_BY_NAME[k] for k in knobs] + [WIDE_BY_NAME["fit_write"]])
