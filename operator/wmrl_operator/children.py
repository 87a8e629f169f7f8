"""What the operator knows of its children, so that a reconcile writes only the ones that are
missing or differ.

Every child is applied with the annotation :data:`builders.APPLIED_HASH` (a hash of the manifest
the operator meant). kopf indexes, one per kind in :data:`INDEXED_KINDS`, keep for each child the
operator manages its applied hash, its version (``metadata.generation`` where the kind has one,
else ``resourceVersion``) and its uid, fed by kopf's watches. kopf fills every index from its
initial LIST before any handler runs, so an operator that restarts with a thousand runs resumes
them without rewriting seventeen thousand unchanged objects.

A child is skipped when it is in the index, carries the hash of the manifest wanted now and, if
this process wrote it, has not changed since (someone who edits a Deployment bumps its
generation: the next spec reconcile writes it back). Anything not known (an index not yet
attached, a kind not indexed, a child deleted) is written, so the cache can cost a write but
never lose one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

from wmrl_operator import builders
from wmrl_operator.kube import PLURALS

INDEXED_KINDS: tuple[tuple[str, str], ...] = (
    ("v1", "ConfigMap"), ("v1", "Service"), ("v1", "ServiceAccount"),
    ("rbac.authorization.k8s.io/v1", "Role"), ("rbac.authorization.k8s.io/v1", "RoleBinding"),
    ("apps/v1", "Deployment"), ("networking.k8s.io/v1", "NetworkPolicy"),
)
"""Kinds of child the operator applies on every spec reconcile (the trainer Job is applied only
when it is absent, and its Secret is create-only)."""


@dataclass(frozen=True)
class Seen:
    applied_hash: Optional[str]
    version: str
    uid: str


def index_id(api_version: str, kind: str) -> str:
    """The kopf index (handler id, and the keyword handlers receive it by) of one kind."""
    return f"wmrl_children_{PLURALS[(api_version, kind)]}"


def seen(meta: Mapping[str, Any]) -> Seen:
    annotations = meta.get("annotations") or {}
    version = meta.get("generation") or meta.get("resourceVersion") or ""
    return Seen(annotations.get(builders.APPLIED_HASH), str(version), str(meta.get("uid") or ""))


def index_entry(namespace: str, name: str, meta: Mapping[str, Any], **_: Any) -> dict[tuple[str, str], Seen]:
    """The kopf indexing function: one entry per child, keyed by (namespace, name)."""
    return {(namespace, name): seen(meta)}


def _key(obj: Mapping[str, Any]) -> tuple[str, str, str, str]:
    meta = obj["metadata"]
    return obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"]


class Children:
    """Lookups in kopf's indexes plus what this process wrote (see the module docstring)."""

    def __init__(self) -> None:
        self._indexes: dict[tuple[str, str], Mapping[tuple[str, str], Any]] = {}
        # Per (namespace, run label): the version of each child right after this process wrote it.
        self._written: dict[tuple[str, str], dict[tuple[str, str, str, str], str]] = {}

    def attach(self, indexes: Mapping[str, Any]) -> None:
        """Take kopf's indexes from a handler's keyword arguments (missing ones stay unknown)."""
        for api_version, kind in INDEXED_KINDS:
            index = indexes.get(index_id(api_version, kind))
            if index is not None:
                self._indexes[(api_version, kind)] = index

    def current(self, obj: Mapping[str, Any]) -> Optional[Seen]:
        """What the watch last reported of ``obj``'s name and kind; None when absent or not indexed."""
        api_version, kind, namespace, name = _key(obj)
        index = self._indexes.get((api_version, kind))
        if index is None or (namespace, name) not in index:
            return None
        values = list(index[(namespace, name)])
        return values[0] if len(values) == 1 else None

    def unchanged(self, obj: Mapping[str, Any]) -> Optional[Seen]:
        """The live child when it already is ``obj`` (a stamped manifest), else None: write it."""
        live = self.current(obj)
        wanted = (obj["metadata"].get("annotations") or {}).get(builders.APPLIED_HASH)
        if live is None or wanted is None or live.applied_hash != wanted:
            return None
        if self._mine(obj).get(_key(obj), live.version) != live.version:
            return None  # changed by someone else since this process wrote it
        return live

    def written(self, obj: Mapping[str, Any], response: Mapping[str, Any]) -> None:
        """Remember the version our write produced (the watch reports it a moment later)."""
        self._mine(obj)[_key(obj)] = seen(response.get("metadata") or {}).version

    def forget(self, namespace: str, run: str) -> None:
        """A run is gone: drop what this process remembers of writing its children."""
        self._written.pop((namespace, run), None)

    def _mine(self, obj: Mapping[str, Any]) -> dict[tuple[str, str, str, str], str]:
        meta = obj["metadata"]
        owner = (meta.get("labels") or {}).get(builders.RUN_LABEL, "")  # "": a shared calibration's objects
        return self._written.setdefault((meta["namespace"], owner), {})
