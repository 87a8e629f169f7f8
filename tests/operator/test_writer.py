"""Writing one child (``writer.ChildWriter.write``) against a recording fake client, without a cluster:
POST when known absent, skip when current, apply otherwise, and adopt a POST's managed fields.

The same writes against the real apiserver: tests/operator/test_children_cache_cluster.py."""

import asyncio

import pytest

from wmrl.api.schema import parse_spec
from wmrl.api.vocabulary import APPLIED_HASH
from wmrl_operator import builders as b
from wmrl_operator.children import ChildWatch, Children, Seen
from wmrl_operator.kube import FIELD_MANAGER, ApiError
from wmrl_operator.writer import ADOPT_ATTEMPTS, ChildWriter

RUN = b.Run("demo", "ns1", "uid-1")
SPEC = parse_spec({"policy": {"model": "Qwen/Qwen3-4B"}, "tasks": {"builtin": "mini-ml"}})
POSTED = [{"manager": FIELD_MANAGER, "operation": "Update", "apiVersion": "apps/v1", "fieldsV1": {"f:spec": {}}}]
APPLIED = [{"manager": FIELD_MANAGER, "operation": "Apply", "apiVersion": "apps/v1", "fieldsV1": {"f:spec": {}}}]


class FakeKube:
    """Records each call; ``create_error``: the status a POST fails with; ``conflicts``: how many
    managed-fields patches fail their resourceVersion test (422) before one succeeds."""

    def __init__(self, applied_fields=(), create_error=None, conflicts=0):
        self.calls: list[tuple] = []
        self.applied_fields = list(applied_fields)  # managedFields each apply answers with, in turn
        self.create_error, self.conflicts = create_error, conflicts

    def _answer(self, obj, fields, version="1"):
        return {"metadata": {**obj["metadata"], "uid": "u-1", "resourceVersion": version, "managedFields": fields}}

    async def create(self, obj, field_manager=None):
        self.calls.append(("create", field_manager))
        if self.create_error:
            raise ApiError(self.create_error, {"message": "exists"})
        return self._answer(obj, POSTED)

    async def apply(self, obj):
        self.calls.append(("apply",))
        self.obj = obj
        return self._answer(obj, self.applied_fields.pop(0) if self.applied_fields else APPLIED)

    async def json_patch(self, api_version, kind, namespace, name, ops):
        self.calls.append(("json_patch", ops))
        if self.conflicts:
            self.conflicts -= 1
            raise ApiError(422, {"message": "the test operation failed"})

    async def get(self, api_version, kind, namespace, name):
        self.calls.append(("get",))
        return self._answer(self.obj, POSTED, version=str(len(self.calls)))


def cache(entries=None):
    """Children whose Deployment cache has listed ``entries`` (name -> Seen)."""
    known = Children()
    watch = known.add(ChildWatch(None, "apps/v1", "Deployment"))
    watch.synced.set()
    watch.entries.update({(RUN.namespace, name): seen for name, seen in (entries or {}).items()})
    return known


def write(kube, known, obj):
    return asyncio.run(ChildWriter(kube, known, "operator:test").write(obj))


def sandbox():
    return b.sandbox_deployment(RUN, SPEC)


def test_a_child_known_absent_is_posted_and_then_no_longer_known_absent():
    kube, known = FakeKube(), cache()
    response = write(kube, known, sandbox())
    assert kube.calls == [("create", FIELD_MANAGER)]
    assert response["metadata"]["annotations"][APPLIED_HASH] == b.stamped(sandbox())["metadata"]["annotations"][APPLIED_HASH]
    assert not known.absent(b.stamped(sandbox()))  # written by this process: the next write is no POST


def test_a_current_child_is_skipped_and_keeps_its_live_uid():
    stamp = b.stamped(sandbox())["metadata"]["annotations"][APPLIED_HASH]
    kube = FakeKube()
    response = write(kube, cache({"demo-sandbox": Seen(stamp, "3", "live-uid")}), sandbox())
    assert kube.calls == [] and response["metadata"]["uid"] == "live-uid"


def test_an_unknown_or_different_child_is_applied():
    kube = FakeKube()
    write(kube, Children(), sandbox())  # no cache: nothing is known absent
    assert kube.calls == [("apply",)]
    kube = FakeKube()
    write(kube, cache({"demo-sandbox": Seen("old-hash", "3", "u-1")}), sandbox())
    assert kube.calls == [("apply",)]


def test_a_post_that_finds_the_child_made_meanwhile_applies_over_it():
    kube = FakeKube(create_error=409)
    write(kube, cache(), sandbox())
    assert kube.calls == [("create", FIELD_MANAGER), ("apply",)]
    with pytest.raises(ApiError):
        write(FakeKube(create_error=403), cache(), sandbox())


def test_the_first_apply_over_a_posted_child_adopts_its_fields_and_applies_again():
    kube = FakeKube(applied_fields=[APPLIED + POSTED])
    write(kube, Children(), sandbox())
    assert [c[0] for c in kube.calls] == ["apply", "json_patch", "apply"]
    guard, replace = kube.calls[1][1]
    assert guard == {"op": "test", "path": "/metadata/resourceVersion", "value": "1"}
    assert replace["path"] == "/metadata/managedFields" and replace["value"] == APPLIED  # the POST's entry merged in


def test_adoption_reads_again_when_the_child_changed_and_gives_up_after_its_attempts():
    kube = FakeKube(applied_fields=[POSTED], conflicts=1)
    write(kube, Children(), sandbox())
    assert [c[0] for c in kube.calls] == ["apply", "json_patch", "get", "json_patch", "apply"]
    assert kube.calls[3][1][0]["value"] == "3"  # guarded by the version read again
    kube = FakeKube(applied_fields=[POSTED], conflicts=ADOPT_ATTEMPTS)
    with pytest.raises(RuntimeError, match="kept changing"):
        write(kube, Children(), sandbox())
