"""A world model for CPU runs: a biased judge, frozen (the paper's setting) or learning online.

Two parts, blended (the ensemble only with ``learn_online``, ``spec.worldModel.learnOnline``,
beyond the paper):

* a **prior judge**: static rules over the code's facts (:mod:`.features`), with the
  realistic, imperfect knowledge of an LLM reviewer. It is deliberately *biased*: it
  believes more complex model families always score higher (boosting > forests > SVM >
  neighbours > trees > linear), trusts that any imported library is installed, and only
  sometimes notices a classifier fitted on a regression target or a wrong submission
  header. And it is *noisy*: a pseudo-random perturbation drawn from a hash of
  (seed, task, code), so the same rollout always gets the same judgement.
* an **online ensemble**: per task kind, ``members`` ridge regressions over the features,
  each fitted on a Poisson(1) bootstrap of the observed (features, real reward - prior)
  residuals (online bagging: exact, incremental sufficient statistics). Their mean
  corrects the prior; their spread is the epistemic variance.

Prediction: reward mean = prior + ensemble correction, variance = ensemble variance +
prior variance x n0 / (n0 + n observed); the outcome (status and quality bucket) is the
rung of the reward ladder nearest to that mean. With nothing observed (mode
``worldModel``) it is the prior alone. Deterministic given the seed and the order of
observations; ~1 ms per rollout (parsing dominates).
"""

from __future__ import annotations

import base64
import hashlib
import math
import re
import threading
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np

from wmrl.outcome import BUCKET_RANK_SCORE, LADDER, VALID_BASE, VALID_SPAN, Outcome, QualityBucket, Status
from wmrl.tasks import Task
from wmrl_trainer.world_model.base import GatedWorldModel, Item
from wmrl_trainer.world_model.features import (BASE_FEATURES, FAMILIES, N_FEATURES, TOKEN_BUCKETS, CodeEmbedder,
                                               CodeFacts, code_facts, featurize)

KINDS = ("classification", "regression")
# The prior's belief about a valid run's rank score, by family: complexity is always better.
PRIOR_QUALITY = {"boosting": 0.85, "extra-trees": 0.80, "random-forest": 0.80, "mlp": 0.80, "svm": 0.65,
                 "knn": 0.50, "tree": 0.45, "linear": 0.35, "naive-bayes": 0.30, "dummy": 0.05, None: 0.30}
# Reward of each rung the prediction can land on (compiling code: the gate handles the rest).
_RUNGS: tuple[tuple[Status, Optional[QualityBucket], float], ...] = (
    (Status.RUNTIME_ERR, None, LADDER[Status.RUNTIME_ERR]),
    (Status.RAN_NO_SUB, None, LADDER[Status.RAN_NO_SUB]),
    *((Status.VALID, b, VALID_BASE + VALID_SPAN * s) for b, s in BUCKET_RANK_SCORE.items()),
)
_CACHE_SIZE = 4096
_READS_OUTSIDE_DATA = re.compile(r"""(loadtxt|genfromtxt|read_csv)\(\s*['"](?!data/)""")
"""A data file read from outside ``data/``, where the task contract puts it (a predicted FileNotFoundError)."""


def _first_line(code: str, pattern: re.Pattern) -> Optional[int]:
    """The 1-based number of the first line of ``code`` matching ``pattern`` (where a predicted error is reported)."""
    return next((n for n, text in enumerate(code.splitlines(), start=1) if pattern.search(text)), None)


@dataclass(frozen=True)
class Judgement:
    """The prior's view of one rollout."""

    p_runtime: float
    p_no_sub: float
    quality: float  # believed rank score if valid
    mean: float  # expected reward
    var: float


def _unit_normals(*parts: str, n: int = 2) -> np.ndarray:
    digest = hashlib.blake2b("\0".join(parts).encode(), digest_size=8).digest()
    return np.random.default_rng(int.from_bytes(digest, "little")).standard_normal(n)


# How complex a script looks, per part (each in [0, 1]); see :func:`complexity`.
FAMILY_COMPLEXITY = {"boosting": 1.0, "extra-trees": 0.9, "random-forest": 0.9, "mlp": 0.9, "svm": 0.6, "knn": 0.4,
                     "tree": 0.3, "naive-bayes": 0.2, "linear": 0.2, "dummy": 0.0, None: 0.0}
_COMPLEXITY_WEIGHTS = {"family": 0.5, "size": 0.25, "preprocessing": 0.25}
_ELABORATION_WEIGHTS = {"chain": 0.25, "wrappers": 0.25, "retuned": 0.1}


def complexity(facts: CodeFacts) -> float:
    """How elaborate a script looks to a reviewer, in [0, 1]: the model family, its size
    (estimators, log scale) and the preprocessing in front of it; then, capped at 1, what
    the wide action space adds (:mod:`wmrl_demo.wide_space`): preprocessing chained beyond one
    step, meta-estimators (search, bagging, stacking, voting) and hyperparameters raised after
    construction. The optimism of a biased judge grows with it: elaborate code looks better
    than it scores. A script of the tiny coder's space has none of the additions, so its
    complexity is what it always was."""
    size = min(1.0, math.log10(max(1, facts.max_estimators)) / 3.0)
    preprocessing = min(1.0, 0.5 * facts.scaler + 1.0 * ("PolynomialFeatures" in facts.calls))
    parts = {"family": FAMILY_COMPLEXITY.get(facts.main_family, 0.0), "size": size, "preprocessing": preprocessing}
    base = sum(_COMPLEXITY_WEIGHTS[k] * v for k, v in parts.items())
    added = {"chain": min(1.0, max(0, facts.preprocessing_steps - 1) / 2), "wrappers": min(1.0, len(facts.wrappers) / 2),
             "retuned": min(1.0, float(facts.retuned))}
    return float(min(1.0, base + sum(_ELABORATION_WEIGHTS[k] * v for k, v in added.items())))


class PriorJudge:
    """Static rules with a complexity bias and hash-seeded noise (see the module docstring).

    ``optimism`` adds ``optimism x complexity(script)`` to the expected reward: the
    pre-registered bias strengths of the speedup benchmark (``spec.worldModel.optimism``).
    """

    def __init__(self, seed: int = 0, quality_noise: float = 0.15, reward_noise: float = 0.05, optimism: float = 0.0):
        if not 0.0 <= optimism <= 1.0:
            raise ValueError(f"optimism must be in [0, 1], got {optimism}")
        self.seed, self.quality_noise, self.reward_noise = seed, quality_noise, reward_noise
        self.optimism = optimism

    def judge(self, task: Task, code: str, facts: CodeFacts) -> Judgement:
        p_rt = 0.05
        if facts.undefined:
            p_rt = max(p_rt, 0.95)  # a name used but never defined: static analysis is reliable here
        if facts.missing_modules:
            p_rt = max(p_rt, 0.15)  # bias: assumes the library is installed
        kind = facts.estimator_kind()
        if kind is not None and kind != task.kind:
            p_rt = max(p_rt, 0.3)  # notices a classifier on a regression target only sometimes
        if facts.estimators and not (facts.fits and facts.predicts):
            p_rt = min(1.0, p_rt + 0.2)
        if not facts.writes_submission:
            share_no_sub = 0.85
        elif not facts.header_ok or not facts.reads_data:
            share_no_sub = 0.3
        else:
            share_no_sub = 0.03
        p_no = (1 - p_rt) * share_no_sub
        p_valid = 1 - p_rt - p_no
        z = _unit_normals(str(self.seed), task.name, code)
        quality = PRIOR_QUALITY[facts.main_family]
        if facts.max_estimators >= 200:
            quality += 0.05  # bias: more trees / iterations look better
        quality = float(np.clip(quality + self.quality_noise * z[0], 0.0, 1.0))
        r_valid = VALID_BASE + VALID_SPAN * quality
        mean = p_rt * LADDER[Status.RUNTIME_ERR] + p_no * LADDER[Status.RAN_NO_SUB] + p_valid * r_valid
        mean = float(np.clip(mean + self.reward_noise * z[1] + self.optimism * complexity(facts), 0.0, 1.0))
        var = (p_rt * (LADDER[Status.RUNTIME_ERR] - mean) ** 2 + p_no * (LADDER[Status.RAN_NO_SUB] - mean) ** 2
               + p_valid * ((r_valid - mean) ** 2 + (VALID_SPAN * self.quality_noise) ** 2))
        return Judgement(p_rt, p_no, quality, mean, float(var))


def _penalties(embedding_dims: int = 0) -> np.ndarray:
    """Ridge penalty per feature: facts and families cheap to move; hashed tokens, crosses, embeddings dearer."""
    return np.concatenate([np.full(len(BASE_FEATURES), 1.0), np.full(len(FAMILIES), 1.0),
                           np.full(TOKEN_BUCKETS, 3.0), np.full(N_FEATURES - len(BASE_FEATURES) - len(FAMILIES) - TOKEN_BUCKETS, 2.0),
                           np.full(embedding_dims, 3.0)])


class _Bagged:
    """``members`` ridge regressions on Poisson(1)-weighted copies of the stream (online bagging)."""

    def __init__(self, dim: int, members: int, penalty: np.ndarray):
        self.A = np.repeat(np.diag(penalty)[None], members, axis=0)
        self.b = np.zeros((members, dim))
        self.n = 0
        self._coef: Optional[np.ndarray] = np.zeros((members, dim))

    def add(self, x: np.ndarray, y: float, weights: np.ndarray) -> None:
        self.A += weights[:, None, None] * np.outer(x, x)[None]
        self.b += weights[:, None] * (x * y)[None]
        self.n += 1
        self._coef = None

    def coef(self) -> np.ndarray:
        if self._coef is None:
            self._coef = np.linalg.solve(self.A, self.b[..., None])[..., 0]
        return self._coef

    def predict(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        preds = X @ self.coef().T  # (n, members)
        return preds.mean(axis=1), preds.var(axis=1)


def _b64(a: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(a, dtype=np.float64).tobytes()).decode()


def _unb64(s: str, shape: tuple[int, ...]) -> np.ndarray:
    return np.frombuffer(base64.b64decode(s), dtype=np.float64).reshape(shape).copy()


class LearnedWorldModel(GatedWorldModel):
    """The learned surrogate; ``observe`` real outcomes to correct its prior (see the module docstring).

    ``continuous=True`` reports the blended estimate as the rank score itself instead of
    snapping it to a quality bucket's score (finer ranking within a group). ``embeddings=True``
    adds MiniLM code embeddings (:class:`~.features.CodeEmbedder`) to the features: slower.
    """

    def __init__(self, seed: int = 0, members: int = 8, prior_strength: float = 20.0, continuous: bool = False,
                 judge: Optional[PriorJudge] = None, embeddings: bool | CodeEmbedder = False, learn_online: bool = True,
                 optimism: float = 0.0):
        super().__init__()
        if members < 2:
            raise ValueError("members must be at least 2 (the spread is the variance)")
        self.seed, self.members, self.prior_strength, self.continuous = seed, members, prior_strength, continuous
        self.learn_online = learn_online
        self.judge = judge or PriorJudge(seed, optimism=optimism)
        self._rng = np.random.default_rng([seed, 17])
        self.embedder = CodeEmbedder(seed=seed) if embeddings is True else (embeddings or None)
        self.dim = N_FEATURES + (self.embedder.dims if self.embedder else 0)
        self._models = {kind: self._new_model() for kind in KINDS}
        self._cache: dict[tuple[str, str, str], tuple[np.ndarray, Judgement, CodeFacts]] = {}
        self._lock = threading.Lock()

    def _new_model(self) -> _Bagged:
        return _Bagged(self.dim, self.members, _penalties(self.dim - N_FEATURES))

    # -------------------------------------------------------------- features

    def _analyse(self, task: Task, code: str, embedding: Optional[np.ndarray] = None) -> tuple[np.ndarray, Judgement, CodeFacts]:
        key = (task.name, task.kind, code)
        hit = self._cache.get(key)
        if hit is None:
            facts = code_facts(code)
            x = featurize(task, facts)
            if self.embedder is not None:
                emb = embedding if embedding is not None else self.embedder.embed([code])[0]
                x = np.concatenate([x, emb])
            hit = (x, self.judge.judge(task, code, facts), facts)
            if len(self._cache) >= _CACHE_SIZE:
                self._cache.clear()
            self._cache[key] = hit
        return hit

    def _analyse_batch(self, items: Sequence[Item]) -> list[tuple[np.ndarray, Judgement, CodeFacts]]:
        """Like _analyse per item, embedding the uncached codes in one batch."""
        embeddings: dict[str, np.ndarray] = {}
        if self.embedder is not None:
            missing = sorted({code for task, code in items if (task.name, task.kind, code) not in self._cache})
            if missing:
                embeddings = dict(zip(missing, self.embedder.embed(missing)))
        return [self._analyse(task, code, embeddings.get(code)) for task, code in items]

    # -------------------------------------------------------------- predictions

    def predict_reward(self, items: Sequence[Item]) -> tuple[np.ndarray, np.ndarray]:
        """Blended (mean, variance) of the reward of each (task, compiling code) pair."""
        means, variances = np.zeros(len(items)), np.zeros(len(items))
        with self._lock:
            analysed = self._analyse_batch(items)
            for kind in KINDS:
                idx = [i for i, (task, _) in enumerate(items) if task.kind == kind]
                if not idx:
                    continue
                model = self._models[kind]
                correction, spread = model.predict(np.stack([analysed[i][0] for i in idx]))
                shrink = self.prior_strength / (self.prior_strength + model.n)
                for j, i in enumerate(idx):
                    prior = analysed[i][1]
                    means[i] = np.clip(prior.mean + correction[j], 0.0, 1.0)
                    variances[i] = spread[j] + prior.var * shrink
        return means, variances

    def prior_reward(self, task: Task, code: str) -> float:
        """What the prior judge alone expects (for diagnostics: its bias and noise)."""
        with self._lock:
            return self._analyse(task, code)[1].mean

    def _outcome(self, reward: float, facts: CodeFacts, task: Task, code: str) -> Outcome:
        status, bucket, _ = min(_RUNGS, key=lambda rung: abs(rung[2] - reward))
        if status is Status.VALID:
            score = float(np.clip((reward - VALID_BASE) / VALID_SPAN, 0.0, 1.0)) if self.continuous else None
            return Outcome(status=status, quality_bucket=bucket, rank_score=score,
                           feedback=f"wrote {task.submission}; predicted quality: {bucket.value}")
        if status is Status.RAN_NO_SUB:
            why = "no submission.csv was written" if not facts.writes_submission else "invalid submission"
            return Outcome(status=status, feedback=f"{why} (predicted)")
        error_type, line, message = "Exception", None, "the script raised (predicted)"
        outside = _first_line(code, _READS_OUTSIDE_DATA)
        if facts.undefined:
            name, line = facts.undefined[0]
            error_type, message = "NameError", f"name '{name}' is not defined"
        elif facts.missing_modules:
            module = facts.missing_modules[0]
            error_type, message = "ModuleNotFoundError", f"No module named '{module}'"
            line = _first_line(code, re.compile(rf"^\s*(import|from)\s+{re.escape(module)}\b"))
        elif outside is not None:
            error_type, line, message = "FileNotFoundError", outside, "the data file is not where the script reads it"
        elif facts.estimator_kind() not in (None, task.kind):
            error_type, message = "ValueError", "Unknown label type: continuous"
            line = _first_line(code, re.compile(r"\.fit\("))
        where = f'  File "main.py", line {line}, in <module>\n' if line else ""
        return Outcome(status=status, error_type=error_type, error_line=line,
                       feedback=f"Traceback (most recent call last):\n{where}{error_type}: {message}")

    def _predict(self, items: Sequence[Item]) -> list[Optional[Outcome]]:
        means, _ = self.predict_reward(items)
        with self._lock:
            facts = [self._analyse(task, code)[2] for task, code in items]
        return [self._outcome(float(m), f, task, code) for m, f, (task, code) in zip(means, facts, items)]

    # -------------------------------------------------------------- learning

    def observe(self, task: Task, code: str, real_outcome: Optional[Outcome]) -> None:
        """Learn from one real outcome; ungraded executions (None) and non-compiling code teach nothing,
        and a frozen judge (``learn_online=False``, the paper's) nothing at all."""
        if not self.learn_online or real_outcome is None or task.kind not in self._models:
            return
        try:
            compile(code, "main.py", "exec", dont_inherit=True)
        except (SyntaxError, ValueError):
            return  # the compile gate grades these exactly
        with self._lock:
            x, prior, _ = self._analyse(task, code)
            weights = self._rng.poisson(1.0, self.members).astype(float)
            self._models[task.kind].add(x, real_outcome.reward - prior.mean, weights)
        self.count("observed")

    # -------------------------------------------------------------- checkpoints

    def state_dict(self) -> dict[str, Any]:
        """Plain, JSON-able state (floats as base64 float64): resuming gives bit-identical predictions."""
        with self._lock:
            return {
                "version": 1, "seed": self.seed, "members": self.members, "features": self.dim,
                "rng": self._rng.bit_generator.state,
                "kinds": {k: {"n": m.n, "A": _b64(m.A), "b": _b64(m.b)} for k, m in self._models.items()},
            }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("version") != 1 or state.get("features") != self.dim or state.get("members") != self.members:
            raise ValueError("world model state: incompatible version, feature set or ensemble size")
        models = {}
        for kind in KINDS:
            entry = state["kinds"][kind]
            model = self._new_model()
            model.A = _unb64(entry["A"], model.A.shape)
            model.b = _unb64(entry["b"], model.b.shape)
            model.n = int(entry["n"])
            model._coef = None
            models[kind] = model
        with self._lock:
            self._models = models
            self._rng.bit_generator.state = state["rng"]
            self.seed = self.judge.seed = state["seed"]
            self._cache.clear()
