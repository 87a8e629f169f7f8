"""The children cache's list and watch (``children.ChildWatch``) against the real apiserver.

Metadata-only pages, the operator's label only, every change and deletion seen, and a listing
that finds children deleted while no watch ran reports them (no phantom stays in the cache).
"""

import asyncio

import pytest
from kubernetes import client as k8s_client, config as k8s_config

from wmrl.api.vocabulary import APPLIED_HASH, MANAGED_BY, RUN_LABEL
from wmrl_operator import children
from wmrl_operator.children import ChildWatch
from wmrl_operator.kube import Kube as ApiClient

pytestmark = pytest.mark.cluster


def _config_map(name, run="r1", stamp="h1", managed=True):
    labels = {RUN_LABEL: run, **(MANAGED_BY if managed else {})}
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "labels": labels, "annotations": {APPLIED_HASH: stamp}},
            "data": {"big": "x" * 4096}}


def _with_client(kube, body):
    async def go():
        cfg = k8s_client.Configuration()
        k8s_config.load_kube_config(config_file=str(kube.cluster.kubeconfig), client_configuration=cfg)
        client = ApiClient(cfg)
        try:
            return await body(client)
        finally:
            await client.close()

    return asyncio.run(go())


async def _until(condition, what, timeout=30.0):
    end = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < end, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


def test_a_listing_in_pages_keeps_only_the_operators_children_as_metadata(kube, namespace, monkeypatch):
    for i in range(5):
        kube.apply(_config_map(f"paged-{i}", stamp=f"h{i}"))
    kube.apply(_config_map("not-ours", managed=False))
    monkeypatch.setattr(children, "PAGE", 2)  # 5 children: three pages

    async def body(client):
        pages = []
        real = client.list_metadata

        async def counting(*args, **kwargs):
            page = await real(*args, **kwargs)
            pages.append(page)
            return page

        client.list_metadata = counting
        watch = ChildWatch(client, "v1", "ConfigMap", namespace)
        await watch.relist()
        return watch, pages

    watch, pages = _with_client(kube, body)
    assert len(pages) >= 3 and all(p["kind"] == "PartialObjectMetadataList" for p in pages)
    assert "data" not in pages[0]["items"][0]  # metadata only
    assert {name for _, name in watch.entries if name.startswith("paged-")} == {f"paged-{i}" for i in range(5)}
    assert (namespace, "not-ours") not in watch.entries
    assert watch.entries[(namespace, "paged-3")].applied_hash == "h3"
    assert watch.entries[(namespace, "paged-3")].run == "r1"
    assert watch.synced.is_set()


def test_the_watch_sees_changes_and_reports_deletions(kube, namespace):
    deleted = []

    async def on_deleted(ns, run):
        deleted.append((ns, run))

    async def body(client):
        watch = ChildWatch(client, "v1", "ConfigMap", namespace, on_deleted=on_deleted)
        task = asyncio.create_task(watch.run())
        try:
            await asyncio.wait_for(watch.synced.wait(), 30)
            key = (namespace, "watched")
            await asyncio.to_thread(kube.apply, _config_map("watched", run="r2", stamp="a"))
            await _until(lambda: key in watch.entries, "the new child")
            first = watch.entries[key]
            await asyncio.to_thread(kube.apply, _config_map("watched", run="r2", stamp="b"))
            await _until(lambda: watch.entries[key].applied_hash == "b", "the changed stamp")
            assert watch.entries[key].version != first.version
            await asyncio.to_thread(kube.run, "delete", "configmap", "watched", "-n", namespace)
            await _until(lambda: key not in watch.entries, "the deletion")
            await _until(lambda: deleted, "the deletion reported")
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    _with_client(kube, body)
    assert deleted == [(namespace, "r2")]


def test_a_new_listing_reports_children_deleted_while_no_watch_ran(kube, namespace):
    """What kopf's re-list does not do: a child gone while the watch was down is not kept as a phantom."""
    kube.apply(_config_map("phantom", run="r3"))
    deleted = []

    async def on_deleted(ns, run):
        deleted.append((ns, run))

    async def body(client):
        watch = ChildWatch(client, "v1", "ConfigMap", namespace, on_deleted=on_deleted)
        await watch.relist()
        assert (namespace, "phantom") in watch.entries
        await asyncio.to_thread(kube.run, "delete", "configmap", "phantom", "-n", namespace)
        await watch.relist()  # as after a 410 Gone or a failed watch
        await _until(lambda: deleted, "the deletion reported")
        return watch

    watch = _with_client(kube, body)
    assert (namespace, "phantom") not in watch.entries
    assert deleted == [(namespace, "r3")]
