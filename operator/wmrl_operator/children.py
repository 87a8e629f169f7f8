"""What the operator knows of its children, so that a reconcile writes only the ones that are
missing or differ.

Every child is applied with the annotation :data:`~wmrl.api.vocabulary.APPLIED_HASH` (a hash of the manifest
the operator meant). One :class:`ChildWatch` per kind in :data:`INDEXED_KINDS` (and per watched
namespace) lists and then watches the children the operator manages, as *metadata only*
(``PartialObjectMetadata``: no spec, no status), and keeps for each its applied hash, its version
(``metadata.generation`` where the kind has one, else ``resourceVersion``), its uid and its run.
A restart with a thousand runs lists seventeen thousand children in pages of a few hundred small
objects, and resumes the runs without rewriting them.

A child is skipped when it is in the cache, carries the hash of the manifest wanted now and, if
this process wrote it, has not changed since (someone who edits a Deployment bumps its
generation: the next spec reconcile writes it back). Anything not known (a cache not listed yet,
a kind not cached, a child deleted) is written, so the cache can cost a write but never lose one.
A reconcile waits for the first listing a bounded time (:data:`SYNC_WAIT_S`), then writes.

A child deleted while its run lives is reported (``on_deleted``) so the run makes it again; a
watch that falls too far behind (410 Gone) lists again, and children missing from the new list
are reported the same way, so no deletion is lost while a watch was down.
"""

from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Mapping, Optional, Sequence

# kopf's own namespace matching (kopf is pinned): the caches must cover exactly the namespaces that
# kopf serves, exclusions ("!team-*") and comma lists included.
from kopf._cogs.structs.references import match_namespace

from wmrl.api.vocabulary import APPLIED_HASH, MANAGED_BY_SELECTOR, RUN_LABEL
from wmrl_operator.kube import ApiError

log = logging.getLogger("wmrl.operator")

INDEXED_KINDS: tuple[tuple[str, str], ...] = (
    ("v1", "ConfigMap"), ("v1", "Service"), ("v1", "ServiceAccount"),
    ("rbac.authorization.k8s.io/v1", "Role"), ("rbac.authorization.k8s.io/v1", "RoleBinding"),
    ("apps/v1", "Deployment"), ("networking.k8s.io/v1", "NetworkPolicy"),
)
"""Kinds of child the operator applies on every spec reconcile (the trainer Job is applied only
when it is absent, and its Secret is create-only)."""

SYNC_WAIT_S = 60.0
"""How long a reconcile waits for the caches' first listing before it writes without them."""
PAGE = 500
"""Objects per page of a listing (metadata only: a few kB each)."""
RETRY_S = (1.0, 30.0)
"""A failed list or watch is retried after a delay that doubles from the first to the second
figure (with jitter, so a thousand-run restart does not hit a recovering apiserver in step);
a listing that succeeds starts again from the first."""

OnDeleted = Callable[[str, str], Awaitable[None]]  # (namespace, run)


@dataclass(frozen=True)
class Seen:
    applied_hash: Optional[str]
    version: str
    uid: str
    run: Optional[str] = None


def seen(meta: Mapping[str, Any]) -> Seen:
    annotations = meta.get("annotations") or {}
    version = meta.get("generation") or meta.get("resourceVersion") or ""
    return Seen(annotations.get(APPLIED_HASH), str(version), str(meta.get("uid") or ""),
                (meta.get("labels") or {}).get(RUN_LABEL))


def _key(obj: Mapping[str, Any]) -> tuple[str, str, str, str]:
    meta = obj["metadata"]
    return obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"]


class _Expired(Exception):
    """The watch's resourceVersion is too old (410 Gone): list again."""


class ChildWatch:
    """The operator's children of one kind in one namespace (``None``: every namespace, optionally
    only those matching one of kopf's namespace ``patterns``), listed and then watched as metadata."""

    def __init__(self, kube: Any, api_version: str, kind: str, namespace: Optional[str] = None,
                 patterns: Sequence[str] = (), on_deleted: Optional[OnDeleted] = None, watch_timeout: int = 300):
        self.kube, self.api_version, self.kind, self.namespace = kube, api_version, kind, namespace
        self.patterns, self.on_deleted, self.watch_timeout = tuple(patterns), on_deleted, watch_timeout
        self.entries: dict[tuple[str, str], Seen] = {}
        self.synced = asyncio.Event()
        self._reporting: set[asyncio.Task] = set()  # on_deleted calls in flight (the watch never waits on them)
        self._watched = False  # the current watch delivered an event (bookmarks included)

    def covers(self, namespace: str) -> bool:
        if self.namespace is not None:
            return namespace == self.namespace
        return not self.patterns or any(match_namespace(namespace, p) for p in self.patterns)

    async def run(self) -> None:
        """List, then watch from the list's version; list again whenever the watch expires or fails."""
        failures = 0  # in a row; a listing alone does not end a run of them (LIST allowed, WATCH refused)
        while True:
            self._watched = False
            try:
                version = await self.relist()
                while True:
                    version = await self._watch(version)
                    failures = 0  # a watch that ran its course
            except asyncio.CancelledError:
                raise
            except _Expired:
                continue
            except Exception as exc:  # noqa: BLE001 - the apiserver away, RBAC not there yet: retry
                if self._watched:
                    failures = 0  # the watch delivered events before it failed
                delay = retry_delay(failures)
                failures += 1
                log.warning("children watch failed (retry in %.1f s): %s", delay, exc,
                            extra={"kind": self.kind, "namespace": self.namespace})
                await asyncio.sleep(delay)

    async def relist(self) -> str:
        """Replace the cache by a fresh listing; report the children that went away meanwhile."""
        entries: dict[tuple[str, str], Seen] = {}
        token: Optional[str] = None
        while True:
            page = await self.kube.list_metadata(self.api_version, self.kind, self.namespace,
                                                 label_selector=MANAGED_BY_SELECTOR, limit=PAGE,
                                                 continue_token=token)
            for item in page.get("items") or []:
                meta = item.get("metadata") or {}
                if self.covers(meta.get("namespace", "")):
                    entries[(meta["namespace"], meta["name"])] = seen(meta)
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                break
        gone = [(key, value) for key, value in self.entries.items() if key not in entries]
        self.entries = entries
        self.synced.set()
        for (namespace, _), value in gone:
            self._deleted(namespace, value)
        return str((page.get("metadata") or {}).get("resourceVersion") or "")

    async def _watch(self, version: str) -> str:
        async for event in self.kube.watch_metadata(self.api_version, self.kind, self.namespace,
                                                    label_selector=MANAGED_BY_SELECTOR,
                                                    resource_version=version, timeout_s=self.watch_timeout):
            kind, obj = event.get("type"), event.get("object") or {}
            meta = obj.get("metadata") or {}
            if kind == "ERROR":
                if obj.get("code") == 410:
                    raise _Expired()
                raise ApiError(int(obj.get("code") or 500), obj)
            version = str(meta.get("resourceVersion") or version)
            self._watched = True
            if kind == "BOOKMARK" or not self.covers(meta.get("namespace", "")):
                continue
            key = (meta["namespace"], meta["name"])
            if kind == "DELETED":
                value = self.entries.pop(key, None) or seen(meta)
                self._deleted(meta["namespace"], value)
            else:
                self.entries[key] = seen(meta)
        return version

    def _deleted(self, namespace: str, value: Seen) -> None:
        """Report a child gone (a task: the watch never waits on the reconcile it starts)."""
        if self.on_deleted is not None and value.run:
            task = asyncio.create_task(self._report(namespace, value.run))
            self._reporting.add(task)
            task.add_done_callback(self._reporting.discard)

    async def _report(self, namespace: str, run: str) -> None:
        try:
            await self.on_deleted(namespace, run)
        except Exception as exc:  # noqa: BLE001 - the run's next event or the resync catches up
            log.warning("reconcile after a child's deletion failed: %s", exc, extra={"run": run, "namespace": namespace})


def retry_delay(failures: int) -> float:
    """The wait after ``failures`` earlier failures in a row: a ceiling doubling from :data:`RETRY_S`'s
    first figure to its second, the wait drawn from its upper half (full jitter could retry at once)."""
    first, cap = RETRY_S
    ceiling = min(cap, first * 2 ** min(failures, 32))
    return random.uniform(ceiling / 2, ceiling)


class Children:
    """Lookups in the children caches plus what this process wrote (see the module docstring).

    Without :meth:`start` (the cache disabled) nothing is known and every child is written.
    """

    def __init__(self) -> None:
        self.watches: dict[tuple[str, str], list[ChildWatch]] = {}
        self._tasks: list[asyncio.Task] = []
        self._sync_deadline: Optional[float] = None  # after it, reconciles stop waiting for a first listing
        # Per (namespace, run label): the version of each child right after this process wrote it.
        self._written: dict[tuple[str, str], dict[tuple[str, str, str, str], str]] = {}

    def add(self, watch: ChildWatch) -> ChildWatch:
        self.watches.setdefault((watch.api_version, watch.kind), []).append(watch)
        return watch

    def start(self, kube: Any, namespaces: Sequence[str] = (), on_deleted: Optional[OnDeleted] = None,
              watch_timeout: int = 300) -> None:
        """Watch every kind of :data:`INDEXED_KINDS`: per namespace when ``namespaces`` names them,
        else cluster-wide (filtered by ``namespaces`` when they are patterns, as kopf's are)."""
        unique = list(dict.fromkeys(namespaces))
        # Plain names only: kopf's matcher strips spaces and reads brackets as fnmatch sets ("team-[ab]").
        literal = bool(unique) and all(n == n.strip() and not set(n) & set("!*?[],") for n in unique)
        scopes: list[tuple[Optional[str], Sequence[str]]] = (
            [(n, ()) for n in unique] if literal else [(None, tuple(unique))])
        for api_version, kind in INDEXED_KINDS:
            for namespace, patterns in scopes:
                watch = self.add(ChildWatch(kube, api_version, kind, namespace, patterns, on_deleted, watch_timeout))
                self._tasks.append(asyncio.create_task(watch.run(), name=f"children-{kind}-{namespace or '*'}"))

    async def stop(self) -> None:
        reporting = [t for ws in self.watches.values() for w in ws for t in w._reporting]
        for task in (*self._tasks, *reporting):
            task.cancel()
        await asyncio.gather(*self._tasks, *reporting, return_exceptions=True)
        self._tasks.clear()

    async def ready(self, timeout: float = SYNC_WAIT_S) -> bool:
        """Wait until every cache has its first listing, at most ``timeout`` after the first call in
        all (a cache that can never list, say forbidden, costs the first reconciles that wait, not
        every reconcile); whether they all have."""
        pending = [w.synced.wait() for ws in self.watches.values() for w in ws if not w.synced.is_set()]
        if not pending:
            return True
        loop = asyncio.get_running_loop()
        if self._sync_deadline is None:
            self._sync_deadline = loop.time() + timeout
        try:
            await asyncio.wait_for(asyncio.gather(*pending), max(0.0, self._sync_deadline - loop.time()))
            return True
        except asyncio.TimeoutError:
            return False

    def current(self, obj: Mapping[str, Any]) -> Optional[Seen]:
        """What the watch last reported of ``obj``'s name and kind; None when absent or not cached."""
        api_version, kind, namespace, name = _key(obj)
        for watch in self.watches.get((api_version, kind), ()):
            if watch.synced.is_set() and watch.covers(namespace):
                return watch.entries.get((namespace, name))
        return None

    def absent(self, obj: Mapping[str, Any]) -> bool:
        """Whether ``obj`` is known not to exist: its kind's listed cache has no such child and this
        process has not written it (a write the watch has not reported yet). Unknown: False."""
        api_version, kind, namespace, name = _key(obj)
        for watch in self.watches.get((api_version, kind), ()):
            if watch.synced.is_set() and watch.covers(namespace):
                return (namespace, name) not in watch.entries and _key(obj) not in self._mine(obj)
        return False

    def unchanged(self, obj: Mapping[str, Any]) -> Optional[Seen]:
        """The live child when it already is ``obj`` (a stamped manifest), else None: write it."""
        live = self.current(obj)
        wanted = (obj["metadata"].get("annotations") or {}).get(APPLIED_HASH)
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
        owner = (meta.get("labels") or {}).get(RUN_LABEL, "")  # "": a shared calibration's objects
        return self._written.setdefault((meta["namespace"], owner), {})
