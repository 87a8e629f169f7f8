"""The WMRLRun CustomResourceDefinition, generated from the pydantic models in ``wmrl.api.schema``.

``wmrl crd`` prints it; ``manifests/`` and the Helm chart hold generated copies.

pydantic emits JSON Schema (draft 2020-12, ``$ref``/``$defs``, ``anyOf`` with ``null``);
Kubernetes wants a *structural* OpenAPI v3.0 schema. The conversion here:

- inlines every ``$ref`` and drops ``title`` (noise in ``kubectl explain``);
- ``Optional[X]`` becomes plain optional ``X``: the apiserver prunes explicit ``null``
  values of non-nullable fields before defaulting, so ``endpoint: null`` still applies;
- draft-2020 ``exclusiveMinimum: 0`` becomes OpenAPI 3.0 ``minimum: 0, exclusiveMinimum: true``;
- fields marked ``x-kubernetes-int-or-string`` (resource quantities) become
  ``anyOf: [integer, string]`` with the pattern kept at the top;
- nested objects that pydantic fills with a ``default_factory`` get ``default: {}`` so the
  apiserver materialises their own defaults too (a stored run shows every paper default);
- ``additionalProperties: false`` (pydantic's ``extra="forbid"``) is dropped: structural
  schemas forbid it next to ``properties``; unknown fields are pruned, and
  ``kubectl apply`` (strict field validation) rejects them by name.

Cross-field rules that live in ``model_validator``s are mirrored as CEL
(``x-kubernetes-validations``), see ``SPEC_RULES`` and ``ROOT_RULES``.
"""

from __future__ import annotations

import argparse
import copy
from typing import Any

import yaml

from wmrl.api.schema import (ANCHOR_WAIT_SINGLE_TURN, EVAL_ONE_PROCESS, FIXED_SCRIPTS, FIXED_SCRIPTS_NEEDS_SCRIPTS, GROUP,
                             KIND, LATE_REWARDS_NEED_WAIT, PLURAL, SHORT_NAMES, SINGULAR, TRAINER_SHARED_CHECKPOINTS,
                             VERSION, WMRLRunSpec, WMRLRunStatus)

CRD_NAME = f"{PLURAL}.{GROUP}"

# Phases in which the identity of a run (what is trained, on what, how) is fixed.
# A run that has not been picked up yet, or that is finished (Succeeded, or Failed —
# e.g. an InvalidSpec the user now corrects), may be edited.
ACTIVE_PHASES = ("Pending", "Running", "Suspended")

# Identity fields: (CEL path under the root object, spec-relative name for messages).
IDENTITY_FIELDS = (
    ("spec.mode", "spec.mode"),
    ("spec.policy.model", "spec.policy.model"),
    ("spec.worldModel.model", "spec.worldModel.model"),
    ("spec.worldModel.backend", "spec.worldModel.backend"),
    ("spec.tasks", "spec.tasks"),
)

# Cross-field rules: (path of the object inside spec, rule, message, fieldPath relative to that object).
def _or_default(path: str, default: int) -> str:
    """CEL for ``self.<path>`` or its default when absent (objects above it may be absent too)."""
    parts = path.split(".")
    present = " && ".join(f"has(self.{'.'.join(parts[:i + 1])})" for i in range(len(parts)))
    return f"({present} ? self.{path} : {default})"


_GPUS = _or_default("trainer.gpusPerNode", 8)
_PROCESSES = f"(({_GPUS} > 0 ? {_GPUS} : 1) * {_or_default('trainer.nodes', 1)})"
_ROWS = f"({_or_default('algorithm.groupSize', 8)} * {_or_default('algorithm.groupsPerStep', 8)})"
_TP = _or_default("policy.vllmTensorParallelSize", 1)

SPEC_RULES: dict[tuple[str, ...], list[dict[str, str]]] = {
    (): [
        {
            "rule": f"{_ROWS} % {_PROCESSES} == 0",
            "message": "spec.algorithm.groupsPerStep: a step's rollouts (groupSize x groupsPerStep) must split evenly "
                       "over the trainer's processes (trainer.gpusPerNode x nodes)",
            "fieldPath": ".algorithm.groupsPerStep",
            "reason": "FieldValueInvalid",
        },
        {
            "rule": f"!has(self.mode) || self.mode != 'eval' || ({_GPUS} <= 1 && {_or_default('trainer.nodes', 1)} == 1)",
            "message": EVAL_ONE_PROCESS,
            "fieldPath": ".trainer.gpusPerNode",
            "reason": "FieldValueInvalid",
        },
        {
            "rule": f"{_TP} == 1 || (has(self.policy) && has(self.policy.vllmMode) && self.policy.vllmMode == 'server') "
                    f"|| ({_GPUS} > 0 && {_GPUS} % {_TP} == 0)",
            "message": "spec.policy.vllmTensorParallelSize: a colocated engine's must divide spec.trainer.gpusPerNode",
            "fieldPath": ".policy.vllmTensorParallelSize",
            "reason": "FieldValueInvalid",
        },
    ],
    ("trainer",): [
        {
            "rule": "!has(self.nodes) || self.nodes == 1 || (has(self.checkpoint) && has(self.checkpoint.claimName))",
            "message": TRAINER_SHARED_CHECKPOINTS,
            "fieldPath": ".checkpoint.claimName",
            "reason": "FieldValueInvalid",
        }
    ],
    ("sandbox",): [
        {
            "rule": "!has(self.minReplicas) || !has(self.maxReplicas) || self.minReplicas <= self.maxReplicas",
            "message": "spec.sandbox.minReplicas must be <= spec.sandbox.maxReplicas",
            "fieldPath": ".minReplicas",
            "reason": "FieldValueInvalid",
        }
    ],
    ("algorithm",): [
        {
            # The apiserver defaults maxTurns (4) before validating, so an absent maxTurns is not 1.
            "rule": "!has(self.anchors) || !has(self.anchors.waitSeconds) || (has(self.maxTurns) && self.maxTurns == 1)",
            "message": ANCHOR_WAIT_SINGLE_TURN,
            "fieldPath": ".anchors.waitSeconds",
            "reason": "FieldValueInvalid",
        }
    ],
    ("algorithm", "anchors"): [
        {
            "rule": "!has(self.lateRewards) || !has(self.lateRewards.enabled) || !self.lateRewards.enabled "
                    "|| has(self.waitSeconds)",
            "message": LATE_REWARDS_NEED_WAIT,
            "fieldPath": ".lateRewards.enabled",
            "reason": "FieldValueInvalid",
        }
    ],
    ("algorithm", "denoising"): [
        {
            "rule": "!has(self.targetWeight) || !has(self.maxWeight) || self.targetWeight <= self.maxWeight",
            "message": "spec.algorithm.denoising.targetWeight must be <= maxWeight",
            "fieldPath": ".targetWeight",
            "reason": "FieldValueInvalid",
        }
    ],
    ("policy",): [
        {
            "rule": f"has(self.scripts) == (has(self.model) && self.model == '{FIXED_SCRIPTS}')",
            "message": FIXED_SCRIPTS_NEEDS_SCRIPTS,
            "fieldPath": ".scripts",
            "reason": "FieldValueInvalid",
        }
    ],
    ("worldModel",): [
        {
            "rule": "!has(self.learnOnline) || !self.learnOnline || (has(self.backend) && self.backend == 'learned')",
            "message": "spec.worldModel.learnOnline: only the learned backend learns online",
            "fieldPath": ".learnOnline",
            "reason": "FieldValueInvalid",
        },
        {
            "rule": "!has(self.optimism) || self.optimism == 0.0 || (has(self.backend) && self.backend == 'learned')",
            "message": "spec.worldModel.optimism: only the learned backend has an optimism setting",
            "fieldPath": ".optimism",
            "reason": "FieldValueInvalid",
        },
        {
            "rule": "!has(self.fewShot) || (!has(self.fewShot.path) && (!has(self.fewShot.examples) || "
                    "size(self.fewShot.examples) == 0)) || (has(self.backend) && self.backend != 'learned')",
            "message": "spec.worldModel.fewShot: the learned backend has no prompt to show examples in (only llm and "
                       "transformers use them)",
            "fieldPath": ".fewShot",
            "reason": "FieldValueInvalid",
        },
    ],
    ("worldModel", "fewShot", "examples", "*"): [
        {
            "rule": "(self.status == 'valid') == has(self.qualityBucket)",
            "message": "spec.worldModel.fewShot.examples: a valid example needs its qualityBucket, and only a valid "
                       "one has one",
            "fieldPath": ".qualityBucket",
            "reason": "FieldValueInvalid",
        }
    ],
    ("worldModel", "fewShot"): [
        {
            "rule": "!has(self.path) || !has(self.examples) || size(self.examples) == 0",
            "message": "spec.worldModel.fewShot: set path or examples, not both",
            "fieldPath": ".path",
            "reason": "FieldValueInvalid",
        }
    ],
    ("tasks",): [
        {
            "rule": "[has(self.builtin), has(self.path), has(self.pvc), has(self.configMap)].filter(x, x).size() == 1",
            "message": "spec.tasks: set exactly one of builtin, path, pvc, configMap",
            "reason": "FieldValueInvalid",
        }
    ],
}


def _identity_rule(path: str, label: str) -> dict[str, str]:
    """Transition rule on the root object: ``path`` may not change while the run is active.

    It lives at the root because only there can a rule see ``oldSelf.status.phase``; a
    spec-level ``self == oldSelf`` would make the field immutable forever, including on a
    run that failed validation and that the user is correcting.
    """
    head, _, leaf = path.rpartition(".")
    active = " || ".join(f"oldSelf.status.phase == '{p}'" for p in ACTIVE_PHASES)
    # has() needs a field selection; compare presence as well as value so that setting or
    # clearing an optional identity field (worldModel.model) counts as a change.
    same = (
        f"(has(self.{head}.{leaf}) == has(oldSelf.{head}.{leaf})) && "
        f"(!has(self.{head}.{leaf}) || self.{path} == oldSelf.{path})"
    )
    return {
        "rule": f"!(has(oldSelf.status) && has(oldSelf.status.phase) && ({active})) || ({same})",
        "message": f"{label} is immutable while the run is active (phase Pending, Running or Suspended)",
        "fieldPath": "." + path,
        "reason": "FieldValueForbidden",
    }


ROOT_RULES: list[dict[str, str]] = [
    {
        # Child names append up to 12 characters ("-world-model", "-calibration") and must
        # stay valid DNS-1035 labels (63 characters) for Services.
        "rule": "self.metadata.name.size() <= 50",
        "message": "metadata.name must be at most 50 characters (child object names append suffixes)",
        "reason": "FieldValueInvalid",
    },
    {
        "rule": "self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",
        "message": "metadata.name must be a DNS-1035 label (lowercase letters, digits, '-', starting with a letter)",
        "reason": "FieldValueInvalid",
    },
] + [_identity_rule(path, label) for path, label in IDENTITY_FIELDS]


def _resolve(node: Any, defs: dict[str, Any]) -> Any:
    """Inline ``$ref``s recursively (the models have no recursive types)."""
    if isinstance(node, dict):
        if "$ref" in node:
            target = defs[node["$ref"].rsplit("/", 1)[-1]]
            merged = {**copy.deepcopy(target), **{k: v for k, v in node.items() if k != "$ref"}}
            return _resolve(merged, defs)
        return {k: _resolve(v, defs) for k, v in node.items()}
    if isinstance(node, list):
        return [_resolve(v, defs) for v in node]
    return node


def _structural(node: dict[str, Any], defaults: bool) -> dict[str, Any]:
    """Rewrite one (already inlined) pydantic schema node into structural OpenAPI v3.0."""
    node = dict(node)
    node.pop("title", None)
    if "anyOf" in node:  # Optional[X]: keep X, drop the null branch
        branches = [b for b in node.pop("anyOf") if b.get("type") != "null"]
        if len(branches) != 1:
            raise ValueError(f"cannot express union {branches!r} structurally")
        inner = branches[0]
        node = {**inner, **node}
        node.pop("title", None)
    if node.get("default", 0) is None:
        node.pop("default")
    if not defaults:
        node.pop("default", None)
    if "exclusiveMinimum" in node and not isinstance(node["exclusiveMinimum"], bool):
        node["minimum"], node["exclusiveMinimum"] = node["exclusiveMinimum"], True
    if "exclusiveMaximum" in node and not isinstance(node["exclusiveMaximum"], bool):
        node["maximum"], node["exclusiveMaximum"] = node["exclusiveMaximum"], True
    if node.get("x-kubernetes-int-or-string"):
        node.pop("type", None)
        node["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if "properties" in node:
        node.pop("additionalProperties", None)
        props = {}
        for name, sub in node["properties"].items():
            sub = _structural(sub, defaults)
            required = name in node.get("required", ())
            if defaults and not required and sub.get("type") == "object" and "properties" in sub and "default" not in sub:
                sub["default"] = {}
            props[name] = sub
        node["properties"] = props
        node.setdefault("type", "object")
    elif isinstance(node.get("additionalProperties"), dict):
        node["additionalProperties"] = _structural(node["additionalProperties"], defaults)
    if "items" in node:
        node["items"] = _structural(node["items"], defaults)
    if "enum" in node and "type" not in node:
        node["type"] = "string"
    return node


def _model_schema(model: type, defaults: bool) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True)
    defs = raw.pop("$defs", {})
    return _structural(_resolve(raw, defs), defaults)


def _at(schema: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any]:
    """The node at ``path``: property names, ``*`` for an array's items."""
    node = schema
    for name in path:
        node = node["items"] if name == "*" else node["properties"][name]
    return node


def spec_schema() -> dict[str, Any]:
    schema = _model_schema(WMRLRunSpec, defaults=True)
    for path, rules in SPEC_RULES.items():
        _at(schema, path).setdefault("x-kubernetes-validations", []).extend(copy.deepcopy(rules))
    # Tolerations and conditions are identified by position/type like core Kubernetes lists.
    return schema


def status_schema() -> dict[str, Any]:
    """The status the operator and trainer write; no defaults (writers own every value)."""
    schema = _model_schema(WMRLRunStatus, defaults=False)
    conditions = schema["properties"]["conditions"]
    conditions["x-kubernetes-list-type"] = "map"
    conditions["x-kubernetes-list-map-keys"] = ["type"]
    # The trainer owns progress; fields a newer trainer adds must survive pruning.
    schema["properties"]["progress"]["x-kubernetes-preserve-unknown-fields"] = True
    return schema


PRINTER_COLUMNS = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Mode", "type": "string", "jsonPath": ".spec.mode"},
    {"name": "Step", "type": "integer", "jsonPath": ".status.progress.step"},
    {"name": "Reward", "type": "number", "jsonPath": ".status.progress.meanRealReward",
     "description": "Mean reward of really executed rollouts (anchors; all rollouts in mode real)."},
    {"name": "Calibrated", "type": "number", "jsonPath": ".status.progress.meanCalibratedReward", "priority": 1,
     "description": "Mean calibrated world-model reward (the only reward in mode worldModel)."},
    {"name": "HeldOut", "type": "number", "jsonPath": ".status.progress.heldOutReward",
     "description": "Mean real reward on the held-out tasks at the last complete evaluation (spec.evaluation)."},
    {"name": "Restarts", "type": "integer", "jsonPath": ".status.restarts", "priority": 1},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def crd() -> dict[str, Any]:
    """The CustomResourceDefinition object."""
    root = {
        "type": "object",
        "description": "A World-Model RL training run: trainer Job, sandbox pool, world model and calibration.",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec_schema(),
            "status": status_schema(),
        },
        "x-kubernetes-validations": copy.deepcopy(ROOT_RULES),
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD_NAME, "labels": {"app.kubernetes.io/name": "wmrl", "app.kubernetes.io/part-of": "wmrl"}},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": list(SHORT_NAMES),
                "categories": ["wmrl"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {"openAPIV3Schema": root},
                }
            ],
        },
    }


def crd_yaml() -> str:
    return yaml.safe_dump(crd(), sort_keys=False, width=120)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--output", "-o", metavar="PATH", help="write to PATH instead of stdout")


def main(args: argparse.Namespace) -> int:
    text = crd_yaml()
    if args.output:
        with open(args.output, "w") as fh:
            fh.write(text)
    else:
        print(text, end="")
    return 0
