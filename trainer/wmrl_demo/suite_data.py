"""The bundled "mini-ml" suite: which datasets, which metrics, which reference solutions.

Pure data plus small deterministic generators; :mod:`wmrl_demo.suite` turns them into
task directories. Every dataset is either bundled with scikit-learn (no download) or
synthetic with a fixed seed, and small enough that a real solution trains in about a
second on one core. The tasks are chosen so that the best model family differs between
them: some are linear (diabetes, sparse regression), some need a non-linear boundary
(moons, circles, quantiles), some favour neighbours (digits) or boosting (hastie, friedman).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal

import numpy as np

Kind = Literal["classification", "regression"]


@dataclass(frozen=True)
class DatasetSpec:
    """One bundled task: where its rows come from and how it is scored."""

    name: str
    kind: Kind
    metric: str
    source: str  # one line for the description: what the rows are
    make: Callable[[], tuple[np.ndarray, np.ndarray]]
    test_fraction: float = 0.3


def _subsample(X: np.ndarray, y: np.ndarray, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    idx = np.random.default_rng(seed).permutation(len(y))[:n]
    return X[idx], y[idx]


def _iris():
    from sklearn.datasets import load_iris
    d = load_iris()
    return d.data, d.target


def _wine():
    from sklearn.datasets import load_wine
    d = load_wine()
    return d.data, d.target


def _breast_cancer():
    from sklearn.datasets import load_breast_cancer
    d = load_breast_cancer()
    return d.data, d.target


def _digits():
    from sklearn.datasets import load_digits
    d = load_digits()
    return _subsample(d.data, d.target, 600, seed=11)


def _diabetes():
    from sklearn.datasets import load_diabetes
    d = load_diabetes()
    return d.data, d.target


def _moons():
    from sklearn.datasets import make_moons
    return make_moons(n_samples=400, noise=0.3, random_state=1)


def _circles():
    from sklearn.datasets import make_circles
    return make_circles(n_samples=400, noise=0.12, factor=0.5, random_state=2)


def _hastie():
    from sklearn.datasets import make_hastie_10_2
    X, y = make_hastie_10_2(n_samples=600, random_state=3)
    return X, (y > 0).astype(int)


def _multiclass_linear():
    from sklearn.datasets import make_classification
    return make_classification(n_samples=500, n_features=20, n_informative=6, n_redundant=4,
                               n_classes=3, n_clusters_per_class=1, class_sep=1.2, random_state=4)


def _quantiles():
    from sklearn.datasets import make_gaussian_quantiles
    return make_gaussian_quantiles(n_samples=500, n_features=4, n_classes=3, random_state=5)


def _friedman1():
    from sklearn.datasets import make_friedman1
    return make_friedman1(n_samples=500, n_features=10, noise=1.0, random_state=6)


def _friedman2():
    from sklearn.datasets import make_friedman2
    return make_friedman2(n_samples=400, noise=10.0, random_state=7)


def _friedman3():
    from sklearn.datasets import make_friedman3
    return make_friedman3(n_samples=400, noise=0.05, random_state=8)


def _sparse_linear():
    from sklearn.datasets import make_regression
    return make_regression(n_samples=300, n_features=30, n_informative=8, noise=15.0, random_state=9)


def _sparse_uncorrelated():
    from sklearn.datasets import make_sparse_uncorrelated
    return make_sparse_uncorrelated(n_samples=400, n_features=10, random_state=10)


MINI_ML: tuple[DatasetSpec, ...] = (
    DatasetSpec("iris", "classification", "accuracy", "iris flowers (sepal/petal measurements, 3 species)", _iris),
    DatasetSpec("wine", "classification", "accuracy", "wine chemical analysis (3 cultivars), features on very different scales", _wine),
    DatasetSpec("breast-cancer", "classification", "accuracy", "breast cancer diagnosis from cell-nucleus measurements (benign/malignant)", _breast_cancer),
    DatasetSpec("digits", "classification", "accuracy", "8x8 handwritten digit images flattened to 64 pixel intensities (10 classes)", _digits),
    DatasetSpec("moons", "classification", "accuracy", "two interleaving noisy half-moons in 2-D", _moons),
    DatasetSpec("circles", "classification", "accuracy", "two noisy concentric circles in 2-D", _circles),
    DatasetSpec("hastie", "classification", "accuracy", "Hastie et al. 10-feature binary problem (label from the sum of squares)", _hastie),
    DatasetSpec("multiclass-linear", "classification", "f1_macro", "synthetic 3-class problem with informative, redundant and noise features", _multiclass_linear),
    DatasetSpec("quantiles", "classification", "f1_macro", "3 classes from nested Gaussian quantile shells in 4-D", _quantiles),
    DatasetSpec("diabetes", "regression", "r2", "diabetes disease progression from 10 standardized baseline variables", _diabetes),
    DatasetSpec("friedman1", "regression", "rmse", "Friedman #1 synthetic regression (5 informative of 10 features, non-linear)", _friedman1),
    DatasetSpec("friedman2", "regression", "mae", "Friedman #2 synthetic regression (impedance of an AC circuit, 4 features)", _friedman2),
    DatasetSpec("friedman3", "regression", "r2", "Friedman #3 synthetic regression (phase angle of an AC circuit, 4 features)", _friedman3),
    DatasetSpec("sparse-linear", "regression", "r2", "synthetic linear regression, 8 informative of 30 features, Gaussian noise", _sparse_linear),
    DatasetSpec("sparse-uncorrelated", "regression", "rmse", "synthetic sparse linear target over 10 uncorrelated features", _sparse_uncorrelated),
)


@dataclass(frozen=True)
class ReferenceModel:
    """A reference solution's estimator, as source text: the build and the script share it."""

    family: str
    imports: tuple[str, ...]
    classifier: str
    regressor: str

    def expression(self, kind: Kind) -> str:
        return self.classifier if kind == "classification" else self.regressor


_PIPE = "from sklearn.pipeline import make_pipeline"
_SCALE = "from sklearn.preprocessing import StandardScaler"

REFERENCE_MODELS: tuple[ReferenceModel, ...] = (
    ReferenceModel("dummy", ("from sklearn.dummy import DummyClassifier, DummyRegressor",),
                   "DummyClassifier(strategy='most_frequent')", "DummyRegressor()"),
    ReferenceModel("linear", ("from sklearn.linear_model import LogisticRegression, LinearRegression",),
                   "LogisticRegression(max_iter=300)", "LinearRegression()"),
    ReferenceModel("scaled-linear", (_PIPE, _SCALE, "from sklearn.linear_model import LogisticRegression, RidgeCV"),
                   "make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000))",
                   "make_pipeline(StandardScaler(), RidgeCV(alphas=(0.1, 1.0, 10.0)))"),
    ReferenceModel("naive-bayes-or-lasso", ("from sklearn.naive_bayes import GaussianNB", "from sklearn.linear_model import Lasso"),
                   "GaussianNB()", "Lasso(alpha=1.0)"),
    ReferenceModel("knn", (_PIPE, _SCALE, "from sklearn.neighbors import KNeighborsClassifier, KNeighborsRegressor"),
                   "make_pipeline(StandardScaler(), KNeighborsClassifier(n_neighbors=7))",
                   "make_pipeline(StandardScaler(), KNeighborsRegressor(n_neighbors=7))"),
    ReferenceModel("tree", ("from sklearn.tree import DecisionTreeClassifier, DecisionTreeRegressor",),
                   "DecisionTreeClassifier(max_depth=4, random_state=0)",
                   "DecisionTreeRegressor(max_depth=4, random_state=0)"),
    ReferenceModel("random-forest", ("from sklearn.ensemble import RandomForestClassifier, RandomForestRegressor",),
                   "RandomForestClassifier(n_estimators=50, random_state=0)",
                   "RandomForestRegressor(n_estimators=50, random_state=0)"),
    ReferenceModel("extra-trees", ("from sklearn.ensemble import ExtraTreesClassifier, ExtraTreesRegressor",),
                   "ExtraTreesClassifier(n_estimators=50, random_state=0)",
                   "ExtraTreesRegressor(n_estimators=50, random_state=0)"),
    ReferenceModel("gradient-boosting", ("from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor",),
                   "HistGradientBoostingClassifier(max_iter=50, random_state=0)",
                   "HistGradientBoostingRegressor(max_iter=50, random_state=0)"),
    ReferenceModel("svm", (_PIPE, _SCALE, "from sklearn.svm import SVC, SVR"),
                   "make_pipeline(StandardScaler(), SVC(C=3.0))",
                   "make_pipeline(StandardScaler(), SVR(C=3.0))"),
)
REFERENCE_BY_FAMILY = {m.family: m for m in REFERENCE_MODELS}
