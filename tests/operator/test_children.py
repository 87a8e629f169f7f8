"""The applied-hash stamp and the decision to skip a write (``children.Children``), without a cluster.

The caches here are filled by hand (a watch never started, its first listing marked done); the
real list and watch are exercised against the apiserver by tests/operator/test_children_watch_cluster.py
and, through the operator, by tests/operator/test_children_cache_cluster.py.
"""

import asyncio
import copy

import pytest
from hypothesis import given, settings, strategies as st

from wmrl.api.schema import parse_spec
from wmrl.api.vocabulary import APPLIED_HASH, RUN_LABEL
from wmrl_operator import builders as b
from wmrl_operator import children as children_module
from wmrl_operator.children import INDEXED_KINDS, RETRY_S, ChildWatch, Children, Seen, retry_delay, seen
from wmrl_operator.kube import ApiError

RUN = b.Run("demo", "ns1", "uid-1")
SPEC = parse_spec({"policy": {"model": "Qwen/Qwen3-4B"}, "tasks": {"builtin": "mini-ml"}})


def sandbox():
    return b.stamped(b.sandbox_deployment(RUN, SPEC))


def children_with(obj, version="3", applied_hash=None, uid="u-1"):
    stamp = b.stamped(obj)["metadata"]["annotations"][APPLIED_HASH] if applied_hash is None else applied_hash
    known = Children()
    watch = known.add(ChildWatch(None, "apps/v1", "Deployment"))
    watch.synced.set()
    index = watch.entries
    index[(obj["metadata"]["namespace"], obj["metadata"]["name"])] = Seen(stamp, version, uid)
    return known, index


def test_every_child_kind_but_the_job_and_secret_is_indexed():
    kinds = {(o["apiVersion"], o["kind"]) for o in b.children(RUN, SPEC)}
    assert kinds - set(INDEXED_KINDS) == {("batch/v1", "Job")}


def test_the_stamp_ignores_key_order_and_an_earlier_stamp():
    obj = b.sandbox_deployment(RUN, SPEC)
    reordered = dict(reversed(list(copy.deepcopy(obj).items())))
    assert b.stamped(obj) == b.stamped(reordered) == b.stamped(b.stamped(obj))


@settings(max_examples=60, deadline=None)
@given(path=st.sampled_from([("spec", "replicas"), ("metadata", "labels", "extra"),
                             ("spec", "template", "metadata", "labels", "x"), ("metadata", "annotations", "note")]),
       value=st.one_of(st.integers(0, 50), st.text(min_size=1, max_size=8)))
def test_any_change_changes_the_stamp(path, value):
    obj = b.sandbox_deployment(RUN, SPEC)
    changed = copy.deepcopy(obj)
    node = changed
    for key in path[:-1]:
        node = node.setdefault(key, {})
    if node.get(path[-1]) == value:
        return
    node[path[-1]] = value
    stamp = lambda o: b.stamped(o)["metadata"]["annotations"][APPLIED_HASH]
    assert stamp(changed) != stamp(obj)


def test_a_child_is_skipped_only_when_its_live_stamp_is_the_wanted_one():
    obj = sandbox()
    known, _ = children_with(obj)
    assert known.unchanged(obj) == Seen(obj["metadata"]["annotations"][APPLIED_HASH], "3", "u-1")
    other = b.stamped(b.sandbox_deployment(RUN, SPEC, b.Options(sandbox_replicas=7)))
    assert known.unchanged(other) is None  # the spec wants something else: write it


def test_unknown_absent_or_unstamped_children_are_written():
    obj = sandbox()
    assert Children().unchanged(obj) is None  # no index attached (the Reconciler without kopf)
    known, index = children_with(obj, applied_hash=None)
    index.clear()
    assert known.unchanged(obj) is None  # deleted
    known, _ = children_with(obj)
    assert known.unchanged(b.sandbox_deployment(RUN, SPEC)) is None  # a manifest without a stamp


def test_a_child_changed_by_someone_else_after_our_write_is_written_again():
    obj = sandbox()
    known, index = children_with(obj, version="3")
    known.written(obj, {"metadata": {"generation": 3, "uid": "u-1"}})
    assert known.unchanged(obj) is not None
    key = (RUN.namespace, obj["metadata"]["name"])
    index[key] = Seen(obj["metadata"]["annotations"][APPLIED_HASH], "4", "u-1")  # edited by hand
    assert known.unchanged(obj) is None
    known.forget(RUN.namespace, RUN.name)  # the run is gone: what we wrote is forgotten
    assert known.unchanged(obj) is not None


def test_what_is_kept_takes_generation_before_resource_version():
    meta = {"annotations": {APPLIED_HASH: "h"}, "generation": 2, "resourceVersion": "99", "uid": "u",
            "labels": {RUN_LABEL: "demo"}}
    assert seen(meta) == Seen("h", "2", "u", "demo")
    assert seen({"resourceVersion": "99"}) == Seen(None, "99", "")


def test_a_cache_not_listed_yet_knows_nothing():
    obj = sandbox()
    known, _ = children_with(obj)
    known.watches[("apps/v1", "Deployment")][0].synced.clear()
    assert known.unchanged(obj) is None


def test_a_namespaced_watch_answers_only_for_its_namespace():
    watch = ChildWatch(None, "v1", "Service", namespace="a")
    assert watch.covers("a") and not watch.covers("b")
    patterned = ChildWatch(None, "v1", "Service", patterns=("team-*",))
    assert patterned.covers("team-x") and not patterned.covers("other")
    assert ChildWatch(None, "v1", "Service").covers("anything")


def test_kopf_namespace_patterns_decide_what_a_cluster_wide_watch_covers():
    excluding = ChildWatch(None, "v1", "Service", patterns=("!kube-*",))
    assert excluding.covers("team-a") and not excluding.covers("kube-system")
    listed = ChildWatch(None, "v1", "Service", patterns=("team-*,!team-test",))
    assert listed.covers("team-a") and not listed.covers("team-test") and not listed.covers("other")
    either = ChildWatch(None, "v1", "Service", patterns=("a", "b-*"))
    assert either.covers("a") and either.covers("b-1") and not either.covers("c")


@pytest.mark.parametrize("namespaces,scopes", [
    (("a", "b"), {"a", "b"}),          # literal names: one watch per namespace
    (("a", "team-*"), {None}),         # any pattern: one cluster-wide watch, filtered
    (("!kube-system",), {None}),       # an exclusion is a pattern too
    (("a,b",), {None}),                # so is a comma list
    (("team-[ab]",), {None}),          # and an fnmatch set
    ((" a",), {None}),                 # kopf strips spaces: not the literal name " a"
    (("a", "a"), {"a"}),               # a name given twice is watched once
    ((), {None}),                      # every namespace
])
def test_start_watches_literal_namespaces_each_and_patterns_cluster_wide(namespaces, scopes):
    async def started():
        known = Children()
        known.start(None, namespaces)  # no apiserver: the watches fail and retry until stopped
        try:
            return {kind: [w.namespace for w in ws] for (_, kind), ws in known.watches.items()}
        finally:
            await known.stop()

    watched = asyncio.run(started())
    assert set(watched) == {kind for _, kind in INDEXED_KINDS}
    assert all(len(found) == len(scopes) and set(found) == scopes for found in watched.values())


@given(st.integers(min_value=0, max_value=200))
def test_retries_back_off_from_the_first_delay_to_the_cap_with_jitter(failures):
    first, cap = RETRY_S
    ceiling = min(cap, first * 2 ** failures)
    delays = [retry_delay(failures) for _ in range(20)]
    assert all(ceiling / 2 <= d <= ceiling for d in delays)


def test_a_listing_alone_does_not_reset_the_backoff_a_watch_that_delivers_does():
    """LIST allowed but WATCH refused: every round lists fine and fails at the watch, and the
    retries must still back off instead of listing every second."""
    class ListOnly:
        def __init__(self, deliver):
            self.deliver, self.watches = deliver, 0

        async def list_metadata(self, *args, **kwargs):
            return {"items": [], "metadata": {"resourceVersion": "1"}}

        async def watch_metadata(self, *args, **kwargs):
            self.watches += 1
            if self.deliver:
                yield {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "2"}}}
            raise ApiError(403, {"message": "watch forbidden"})

    async def delays(deliver):
        slept = []

        async def sleep(seconds):
            slept.append(seconds)
            if len(slept) == 6:
                raise asyncio.CancelledError

        watch = ChildWatch(ListOnly(deliver), "v1", "Service", namespace="a")
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(children_module.asyncio, "sleep", sleep)
            with pytest.raises(asyncio.CancelledError):
                await watch.run()
        return slept

    first, cap = RETRY_S
    growing = asyncio.run(delays(deliver=False))
    assert growing[-1] >= min(cap, first * 2 ** 5) / 2  # backed off: the sixth wait is long
    healthy = asyncio.run(delays(deliver=True))
    assert all(d <= first for d in healthy)  # each watch delivered: every retry starts from the first delay
