"""The speedup benchmark's experiment (v3): the configurations, the tuning and evaluation seeds, the
sandbox-pool axis, the presets and the jobs. Everything here is fixed before any run.

**Configurations** (:func:`config_name`): an arm of :data:`ARMS` at a ``groupsPerStep`` and a learning
rate. The real-execution GRPO baseline runs at every ``groupsPerStep`` of :data:`GROUPS_PER_STEP_GRID`
(same group size: a ``groupsPerStep: 1`` step executes 8 rollouts, about an anchor step's cost) and every
learning rate of :data:`LR_GRID`; ``wmrl`` runs at every learning rate of the same grid. Nothing else
differs between configurations.

| arm | spec |
| --- | --- |
| ``real`` | ``mode: real``: every rollout executed (the GRPO baseline) |
| ``worldModel`` | ``mode: worldModel``: the judge alone, no anchors |
| ``wmrl`` | ``mode: wmrl``, debiasing and denoising on (the paper's "both") |
| ``none`` | ``mode: wmrl``, debiasing and denoising off |
| ``debias`` | ``mode: wmrl``, debiasing only |
| ``denoise`` | ``mode: wmrl``, denoising only |
| ``wmrlOnline`` | ``wmrl`` with ``worldModel.learnOnline: true`` (beyond the paper) |

**Choosing, then measuring.** Every real configuration and every wmrl learning rate trains on the
*tuning* seeds (:data:`TUNING_SEED_BASE` + k, never used again). Per pool size, the best real
configuration and wmrl's learning rate are the ones with the highest mean held-out reward at the budget
on those seeds. The *evaluation* seeds (0, 1, ...) then run every real configuration (the table shows
them all), wmrl at its chosen rate and the other arms at wmrl's rate; the headline compares wmrl with
the best real configuration on the evaluation seeds only.

**The budget** of a pool size P is what the reference configuration (:data:`REFERENCE`, the v2 real
arm: ``groupsPerStep`` 4 at learning rate 0.002, ``steps`` steps) costs on average over the tuning seeds
at P. Every configuration trains until it has spent the budget at every P of the sweep, evaluating on the
way; each P's figures read its curve at that P's budget.

**The pool** (:data:`SLOTS_GRID`): the clock charges each step's executions on P sandbox slots
(:mod:`.cost`); every run records each step's costs at every P of the sweep.

**Asynchronous anchors** (:data:`ASYNC_WAIT_FRACTIONS`, :data:`LATE_CORRECTIONS`, :data:`ASYNC_CONTROLS`):
``wmrl`` with ``anchors.waitSeconds`` set, each run on one pool size P, whose slots persist across steps (a late
execution keeps its slot into the next steps). A step's executions are submitted where the trainer would start
waiting (after its own compute and the modelled judge, as the synchronous clock charges them), so with
``waitSeconds`` unbounded the clock is the synchronous one. Not tuned: each runs at wmrl's learning rate chosen
for its P on the tuning seeds, on the ablation arms' evaluation seeds (paired with real and wmrl), at P's budget.

**The judge** is the paper's: frozen (``learnOnline: false``), the ``learned`` backend's static judge
with its complexity bias and hash-seeded noise, plus optimism :data:`HEADLINE_OPTIMISM` (v2's headline
level). The corrections' ablation on a judge whose distortion is known is :mod:`.synthetic_judge`'s grid.
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
"""v2's pre-registered judge optimism levels (``spec.worldModel.optimism``); ``--bias`` still runs any of them."""
HEADLINE_OPTIMISM = 0.2
"""Chosen before any measurement: the judge's optimism in every run of v3 (v2's headline level)."""

LR_GRID = (0.001, 0.002, 0.004)
"""Pre-registered learning rates; every real configuration and wmrl train at each on the tuning seeds."""
GROUPS_PER_STEP_GRID = (1, 2, 4)
"""Pre-registered real-execution GRPO batch sizes (groups per step, group size unchanged)."""
SLOTS_GRID = (2, 8, 32)
"""Pre-registered sandbox pool sizes the clock charges executions on; every one is reported."""
HEADLINE_SLOTS = 2
"""Chosen before any measurement: the pool size whose figures fill the top-level ``arms``/``speedup`` keys."""
REFERENCE = ("real", 4, 0.002)
"""(arm, groupsPerStep, learning rate) of the configuration whose cost at ``steps`` steps sets the budget."""
TUNING_SEED_BASE = 1000
"""Tuning seeds are TUNING_SEED_BASE + k: disjoint from the evaluation seeds 0, 1, ..."""

# Asynchronous anchors (issue 29, item 4), pre-registered before any asynchronous run.
ASYNC_WAIT_FRACTIONS = (0.0, 0.25)
"""``anchors.waitSeconds`` of the asynchronous arms, as a fraction of a synchronous wmrl step at the arm's pool
size P (wmrl at its chosen learning rate: its mean cost per step at P over the tuning seeds): 0 (never wait for
an anchor) and a quarter of a step. Anchors not done by then are late."""
LATE_CORRECTIONS = ("token", "none")
"""How a late anchor group's real rewards enter the gradient of the step they arrive at (``anchors.lateRewards``):
``token``, the rollout's stored log-probs against the current policy's, a per-token importance ratio truncated
at :data:`LATE_CLIP_MAX` (the form of TRL's ``vllm_importance_sampling_mode="token_truncate"``); ``none``, as if
on-policy (ratio 1). Every combination with :data:`ASYNC_WAIT_FRACTIONS` runs. Either way the arrived group's
advantages are its real rewards normalised within the group, times the step's anchor weight (denoising), and at
its own step a late group trains on calibrated world-model rewards like any judged group."""
LATE_CLIP_MAX = 3.0
"""The truncation of the importance ratio (TRL's default ``vllm_importance_sampling_clip_max``)."""
ASYNC_CONTROLS = (("drop", 0.0),)
"""(late handling, wait fraction) run besides: ``drop`` is ``waitSeconds`` as it was before item 4, late
anchors trained on calibrated world-model rewards and their real rewards never in the gradient."""

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
    # Evaluation seeds per arm; the ablation arms (ABLATION_ORDER) get "ablation_seeds"; "tuning_seeds"
    # choose the learning rates and the best real configuration; "judge_grid" names the synthetic-judge
    # cells (.synthetic_judge.JUDGE_GRID) whose ablation runs "grid_seeds" paired seeds each.
    "quick": {"tuning_seeds": 2, "seeds": 3, "ablation_seeds": 3, "steps": 8, "eval_points": 4,
              "arms": ("real", "worldModel", *ABLATION_ORDER), "judge_grid": (), "grid_seeds": 3},
    "full": {"tuning_seeds": 3, "seeds": 10, "ablation_seeds": 10, "steps": 20, "eval_points": 10,
             "arms": tuple(ARMS), "judge_grid": "all", "grid_seeds": 20},
    # The paper's 4-turn loop with the multi-turn tiny coder; held-out reward from sampled trajectories.
    "multiturn": {"tuning_seeds": 1, "seeds": 3, "ablation_seeds": 3, "steps": 12, "eval_points": 4,
                  "arms": ("real", "worldModel", "wmrl"), "max_turns": 4, "judge_grid": (), "grid_seeds": 3},
    # The wide action space (preprocessing chains, large models, hyperparameter tokens, wrappers) where the
    # judge's optimism for complexity can be exploited; held-out reward from sampled scripts.
    "wide": {"tuning_seeds": 2, "seeds": 3, "ablation_seeds": 3, "steps": 8, "eval_points": 4,
             "arms": ("real", "worldModel", *ABLATION_ORDER), "space": "wide", "judge_grid": (), "grid_seeds": 3},
}
MULTI_TURN_POLICY = "tiny-coder-multiturn"
WIDE_POLICY = "tiny-coder-wide"
WIDE_SETTINGS = {"max_new_tokens": 9, "timeout_seconds": 10}
"""The wide space's run: room for its longest warm-start script (load, 3 preprocessing steps, a model, 3 knobs,
an end), and a sandbox timeout that large ensembles and searches sometimes hit (a timeout is a runtime error)."""
EVAL_TRAJECTORIES = 256
"""Held-out trajectories (scripts) sampled per task and evaluation in multi-turn and wide-space runs (too many
to enumerate; each is graded from the outcome table)."""


def config_name(arm: str, groups_per_step: int, learning_rate: float) -> str:
    """The configuration's name in the results: ``real-g1-lr0.004``, ``wmrl-g4-lr0.002``."""
    return f"{arm}-g{groups_per_step}-lr{learning_rate:g}"


def async_variants() -> list[tuple[str, float]]:
    """Every pre-registered asynchronous arm as (late handling, wait fraction): each correction at each wait
    fraction, then the controls."""
    return [(late, fraction) for fraction in ASYNC_WAIT_FRACTIONS for late in LATE_CORRECTIONS] + list(ASYNC_CONTROLS)


def async_variant_name(late: str, fraction: float) -> str:
    """``token-w0``, ``none-w0.25``, ``drop-w0``."""
    return f"{late}-w{fraction:g}"


def async_anchors(late: str, wait_seconds: float) -> dict[str, Any]:
    """``algorithm.anchors`` of an asynchronous arm: ``waitSeconds`` and, unless it drops late rewards (``drop``),
    ``lateRewards`` with the correction (``token``, ``sequence`` or ``none``) at :data:`LATE_CLIP_MAX`."""
    if late not in (*LATE_CORRECTIONS, "sequence", "drop"):
        raise ValueError(f"unknown late handling {late!r}")
    anchors: dict[str, Any] = {"waitSeconds": float(wait_seconds)}
    if late != "drop":
        anchors["lateRewards"] = {"enabled": True, "correction": late, "clipMax": LATE_CLIP_MAX}
    return anchors


def arm_config(arm: str, seed: int, steps: int, optimism: float = 0.0, base: dict[str, Any] = BASE_SPEC,
               group_size: Optional[int] = None, groups_per_step: Optional[int] = None,
               learning_rate: Optional[float] = None,
               held_out: Optional[Sequence[str]] = None, max_turns: int = 1, space: str = "tiny",
               anchors: Optional[dict[str, Any]] = None) -> RunConfig:
    """The run of ``arm`` at ``seed`` and judge ``optimism``: the base spec with the arm's fields, nothing else
    (``max_turns`` > 1: the multi-turn tiny coder with that many turns; ``space`` "wide": the wide tiny coder
    with :data:`WIDE_SETTINGS`; ``anchors``: fields merged into ``algorithm.anchors``, an asynchronous arm's)."""
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
    if learning_rate is not None:
        alg["learningRate"] = learning_rate
    if held_out:
        spec["tasks"]["heldOut"] = list(held_out)
    if anchors:
        alg.setdefault("anchors", {}).update(json.loads(json.dumps(anchors)))
    if "debiasing" in settings:
        alg.setdefault("debiasing", {})["enabled"] = settings["debiasing"]
        alg.setdefault("denoising", {})["enabled"] = settings["denoising"]
    spec["worldModel"]["optimism"] = optimism
    spec["worldModel"]["learnOnline"] = bool(settings.get("learnOnline", False))
    return from_manifest({"apiVersion": API_VERSION, "kind": KIND,
                          "metadata": {"name": f"speedup-{arm.lower()}-s{seed}"}, "spec": spec})


@dataclass
class Job:
    """One run of the benchmark: a configuration (arm, groupsPerStep, learning rate) at a seed, its budgets
    per pool size, and the services and folders it uses."""

    arm: str
    seed: int
    groups_per_step: int
    learning_rate: float
    optimism: float
    steps: int  # the reference's step count (budgets None), else the step cap
    budgets: Optional[dict[str, float]]  # pool size -> budget s; None: run ``steps`` steps (the reference)
    eval_points: int
    slots: tuple[int, ...]
    judge_cost: float
    sandbox_urls: list[str]
    table_path: str
    work_dir: str
    spec_overrides: dict[str, Any] = field(default_factory=dict)
    threads: int = 1
    live: bool = False  # execute every rollout on the sandboxes (no table hits): modelled vs measured cost
    judge_cell: Optional[str] = None  # a synthetic judge of the ablation grid instead of the frozen learned judge
    # An asynchronous arm (one pool size in ``slots``): {"late": ..., "wait_fraction": ..., "wait_s": ...}.
    async_anchors: Optional[dict[str, Any]] = None

    @property
    def config(self) -> str:
        if self.async_anchors is not None:
            variant = async_variant_name(self.async_anchors["late"], self.async_anchors["wait_fraction"])
            return f"async-{variant}-P{self.slots[0]}-g{self.groups_per_step}-lr{self.learning_rate:g}"
        return config_name(self.arm, self.groups_per_step, self.learning_rate)

    def name(self) -> str:
        return f"{self.config}-s{self.seed}" + (f"-j{self.judge_cell}" if self.judge_cell else "")


def tuning_seeds(n: int) -> list[int]:
    return [TUNING_SEED_BASE + k for k in range(n)]


def tuning_configs(arms: Sequence[str], real_groups: Sequence[int], lrs: Sequence[float],
                   base_groups: int) -> list[tuple[str, int, float]]:
    """What trains on the tuning seeds: every real configuration, and wmrl (if run) at every learning rate."""
    configs = [("real", g, lr) for g in real_groups for lr in lrs]
    if "wmrl" in arms:
        configs += [("wmrl", base_groups, lr) for lr in lrs]
    return configs


def evaluation_configs(arms: Sequence[str], real_groups: Sequence[int], lrs: Sequence[float], base_groups: int,
                       wmrl_lrs: Sequence[float], ablation_lr: float) -> list[tuple[str, int, float]]:
    """What trains on the evaluation seeds: every real configuration, wmrl at each learning rate chosen for a
    pool size, and every other arm at the rate chosen for the headline pool."""
    configs = [("real", g, lr) for g in real_groups for lr in lrs]
    configs += [("wmrl", base_groups, lr) for lr in sorted(set(wmrl_lrs)) if "wmrl" in arms]
    configs += [(arm, base_groups, ablation_lr) for arm in arms if arm not in ("real", "wmrl")]
    return configs



def evaluation_seeds(arm: str, seeds: int, ablation_seeds: int) -> list[int]:
    """The evaluation seeds of ``arm``: the ablation arms (wmrl among them) get ``ablation_seeds``; real gets
    the larger count so that every wmrl seed has its paired real runs; the others ``seeds``."""
    if arm == "real":
        return list(range(max(seeds, ablation_seeds)))
    return list(range(ablation_seeds if arm in ABLATION_ORDER else seeds))
