"""The speedup benchmark's experiment: the shared run, the arms, the judge's bias levels, the presets, the jobs.

**Arms** (:data:`ARMS`; one field of the same run each, nothing else differs):

| arm | spec |
| --- | --- |
| ``real`` | ``mode: real``: every rollout executed (the GRPO baseline) |
| ``worldModel`` | ``mode: worldModel``: the judge alone, no anchors |
| ``wmrl`` | ``mode: wmrl``, debiasing and denoising on (the paper's "both") |
| ``none`` | ``mode: wmrl``, debiasing and denoising off |
| ``debias`` | ``mode: wmrl``, debiasing only |
| ``denoise`` | ``mode: wmrl``, denoising only |
| ``wmrlOnline`` | ``wmrl`` with ``worldModel.learnOnline: true`` (beyond the paper) |

**The judge** is the paper's: frozen (``learnOnline: false``), the ``learned`` backend's
static judge with its built-in complexity bias and hash-seeded noise, plus an optimism
that grows with script complexity (``worldModel.optimism``). The bias strengths are
pre-registered in :data:`BIAS_GRID` and every one is reported; :data:`HEADLINE_OPTIMISM`
(fixed before any measurement) is the level whose figures fill the top-level JSON keys.

**Jobs.** A :class:`Job` is one (arm, bias level, seed) run with its budget; the ``real``
arm has no world model, so its runs are shared by every level and only the other arms get
a job per level (:func:`world_model_jobs`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from wmrl.api.runconfig import RunConfig, from_manifest
from wmrl.api.schema import API_VERSION, KIND

ARMS: dict[str, dict[str, Any]] = {
    "real": {"mode": "real"},
    "worldModel": {"mode": "worldModel"},
    "wmrl": {"mode": "wmrl", "debiasing": True, "denoising": True},
    "none": {"mode": "wmrl", "debiasing": False, "denoising": False},
    "debias": {"mode": "wmrl", "debiasing": True, "denoising": False},
    "denoise": {"mode": "wmrl", "debiasing": False, "denoising": True},
    "wmrlOnline": {"mode": "wmrl", "debiasing": True, "denoising": True, "learnOnline": True},
}
ABLATION_ORDER = ("none", "denoise", "debias", "wmrl")
"""The paper's ablation order, predicted lowest to highest final reward (both > debiasing > denoising > none)."""

BIAS_GRID = (0.0, 0.1, 0.2, 0.3)
"""Pre-registered judge optimism levels (``spec.worldModel.optimism``); every one is run and reported."""
HEADLINE_OPTIMISM = 0.2
"""Chosen before any measurement: the level whose figures fill the top-level ``arms``/``speedup`` keys."""

BASE_SPEC: dict[str, Any] = {
    "policy": {"model": "builtin:tiny-coder", "rolloutEngine": "transformers",
               "sampling": {"temperature": 1.0, "maxNewTokens": 8}},
    "worldModel": {"backend": "learned"},
    "tasks": {"builtin": "mini-ml", "heldOut": ["iris", "wine", "diabetes", "friedman3"]},
    "algorithm": {
        "groupSize": 8, "groupsPerStep": 4, "learningRate": 0.002, "maxTurns": 1,
        "anchors": {"fraction": 0.25, "minPerStep": 1, "maxConcurrent": 8},
        "debiasing": {"minPairs": 32, "refitEvery": 16},
        "denoising": {"warmup": 4, "halfLife": 16},
    },
    "sandbox": {"timeoutSeconds": 60},
    "trainer": {"gpusPerNode": 0, "checkpoint": {"intervalSteps": 100000}},  # one local process
}
"""The quickstart's run (examples/quickstart.yaml) with the paper's frozen judge; the bench sets mode, seed and steps."""

PRESETS: dict[str, dict[str, Any]] = {
    # Seeds per arm; the ablation arms (ABLATION_ORDER) get "ablation_seeds".
    "quick": {"seeds": 3, "ablation_seeds": 3, "steps": 8, "eval_points": 4, "bias_grid": (HEADLINE_OPTIMISM,),
              "arms": ("real", "worldModel", *ABLATION_ORDER)},
    "full": {"seeds": 10, "ablation_seeds": 20, "steps": 20, "eval_points": 10, "bias_grid": BIAS_GRID,
             "arms": tuple(ARMS)},
    # The paper's 4-turn loop with the multi-turn tiny coder; held-out reward from sampled trajectories.
    "multiturn": {"seeds": 3, "ablation_seeds": 3, "steps": 12, "eval_points": 4, "bias_grid": (HEADLINE_OPTIMISM,),
                  "arms": ("real", "worldModel", "wmrl"), "max_turns": 4},
    # The wide action space (preprocessing chains, large models, hyperparameter tokens, wrappers) where the
    # judge's optimism for complexity can be exploited; held-out reward from sampled scripts.
    "wide": {"seeds": 3, "ablation_seeds": 3, "steps": 8, "eval_points": 4, "bias_grid": BIAS_GRID,
             "arms": ("real", "worldModel", *ABLATION_ORDER), "space": "wide"},
}
MULTI_TURN_POLICY = "tiny-coder-multiturn"
WIDE_POLICY = "tiny-coder-wide"
WIDE_SETTINGS = {"max_new_tokens": 9, "timeout_seconds": 10}
"""The wide space's run: room for its longest warm-start script (load, 3 preprocessing steps, a model, 3 knobs,
an end), and a sandbox timeout that large ensembles and searches sometimes hit (a timeout is a runtime error)."""
EVAL_TRAJECTORIES = 256
"""Held-out trajectories (scripts) sampled per task and evaluation in multi-turn and wide-space runs (too many
to enumerate; each is graded from the outcome table)."""


def arm_config(arm: str, seed: int, steps: int, optimism: float = 0.0, base: dict[str, Any] = BASE_SPEC,
               group_size: Optional[int] = None, groups_per_step: Optional[int] = None,
               held_out: Optional[Sequence[str]] = None, max_turns: int = 1, space: str = "tiny") -> RunConfig:
    """The run of ``arm`` at ``seed`` and judge ``optimism``: the base spec with the arm's fields, nothing else
    (``max_turns`` > 1: the multi-turn tiny coder with that many turns; ``space`` "wide": the wide tiny coder
    with :data:`WIDE_SETTINGS`)."""
    settings = ARMS[arm]
    spec = json.loads(json.dumps(base))
    spec["mode"] = settings["mode"]
    alg = spec.setdefault("algorithm", {})
    alg["seed"], alg["steps"] = seed, steps
    if max_turns > 1:
        alg["maxTurns"] = max_turns
        spec["policy"]["model"] = f"builtin:{MULTI_TURN_POLICY}"
    if space == "wide":
        spec["policy"]["model"] = f"builtin:{WIDE_POLICY}"
        spec["policy"]["sampling"]["maxNewTokens"] = WIDE_SETTINGS["max_new_tokens"]
        spec["sandbox"]["timeoutSeconds"] = WIDE_SETTINGS["timeout_seconds"]
    if group_size is not None:
        alg["groupSize"] = group_size
    if groups_per_step is not None:
        alg["groupsPerStep"] = groups_per_step
    if held_out:
        spec["tasks"]["heldOut"] = list(held_out)
    if "debiasing" in settings:
        alg.setdefault("debiasing", {})["enabled"] = settings["debiasing"]
        alg.setdefault("denoising", {})["enabled"] = settings["denoising"]
    spec["worldModel"]["optimism"] = optimism
    spec["worldModel"]["learnOnline"] = bool(settings.get("learnOnline", False))
    return from_manifest({"apiVersion": API_VERSION, "kind": KIND,
                          "metadata": {"name": f"speedup-{arm.lower()}-s{seed}"}, "spec": spec})


@dataclass
class Job:
    """One run of the benchmark: (arm, bias level, seed), its budget, and the services and folders it uses."""

    arm: str
    seed: int
    optimism: float
    steps: int  # the step budget (real) or the step cap (every other arm)
    budget_s: Optional[float]  # None: run ``steps`` steps (the real arm, which sets the budget)
    eval_points: int
    slots: int
    judge_cost: float
    sandbox_urls: list[str]
    table_path: str
    work_dir: str
    spec_overrides: dict[str, Any] = field(default_factory=dict)
    threads: int = 1
    live: bool = False  # execute every rollout on the sandboxes (no table hits): modelled vs measured cost

    def name(self) -> str:
        return f"{self.arm}-b{self.optimism:g}-s{self.seed}"


def world_model_jobs(arms: Sequence[str], levels: Sequence[float], seeds: int, ablation_seeds: int,
                     **common: Any) -> list[Job]:
    """The jobs of every arm but ``real`` at every bias level, the headline level first; the ablation arms
    (:data:`ABLATION_ORDER`) get ``ablation_seeds`` seeds, the others ``seeds``."""
    jobs = []
    for level in sorted(levels, key=lambda b: b != HEADLINE_OPTIMISM):  # the headline level first
        for arm in arms:
            if arm == "real":
                continue  # the real arm has no world model: run once, shared by every level
            n = ablation_seeds if arm in ABLATION_ORDER else seeds
            jobs += [Job(arm=arm, seed=s, optimism=level, **common) for s in range(n)]
    return jobs
