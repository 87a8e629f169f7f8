"""The per-run work queue (issue 14, item 1): duplicate events cost one reconcile, on the real apiserver.

The Reconciler runs in-process against tests/cluster's apiserver with the operator's own client;
the client is subclassed only to count the reads of the run (and, in one test, to fail one of
them as an apiserver error would), never to answer in the apiserver's place.
"""

import asyncio

import pytest
from kubernetes import client as k8s_client, config as k8s_config
from prometheus_client import REGISTRY

from operator_helpers import run_manifest, wait_for
from wmrl_operator.kube import ApiError, Kube as ApiClient
from wmrl_operator.reconcile import Reconciler

pytestmark = pytest.mark.cluster


def _coalesced():
    return REGISTRY.get_sample_value("wmrl_operator_reconciles_coalesced_total") or 0.0


class CountingClient(ApiClient):
    """The operator's client, counting GETs of WMRLRuns and children applied; fails the run GETs
    whose ordinal is in ``fail_run_gets`` with a 500."""

    def __init__(self, cfg, fail_run_gets=()):
        super().__init__(cfg)
        self.run_gets = 0
        self.applies = 0
        self.fail_run_gets = set(fail_run_gets)

    async def get(self, api_version, kind, namespace, name):
        if kind == "WMRLRun":
            self.run_gets += 1
            if self.run_gets in self.fail_run_gets:
                raise ApiError(500, {"message": "injected: etcd leader changed"})
        return await super().get(api_version, kind, namespace, name)

    async def apply(self, obj, *args, **kwargs):
        self.applies += 1
        return await super().apply(obj, *args, **kwargs)


def _run_with_client(kube, body, **client_args):
    async def go():
        cfg = k8s_client.Configuration()
        k8s_config.load_kube_config(config_file=str(kube.cluster.kubeconfig), client_configuration=cfg)
        client = CountingClient(cfg, **client_args)
        reconciler = Reconciler(client)
        try:
            return await body(reconciler, client)
        finally:
            await reconciler.events.flush()
            await client.close()

    return asyncio.run(go())


def test_a_burst_of_events_for_one_run_costs_two_reconciles(kube):
    kube.apply(run_manifest("queued"))

    async def body(reconciler, client):
        await reconciler.reconcile(kube.ns, "queued", apply_children=True)  # the run's children exist
        gets, coalesced = client.run_gets, _coalesced()
        await asyncio.gather(*(reconciler.reconcile(kube.ns, "queued", apply_children=False) for _ in range(30)))
        return client.run_gets - gets, _coalesced() - coalesced

    reads, coalesced = _run_with_client(kube, body)
    # The first runs at once; the second waits for it and covers the other 28, which join it.
    assert (reads, coalesced) == (2, 28)
    assert kube.status("queued")["phase"] in ("Pending", "Running")


def test_a_spec_event_that_joins_a_waiting_reconcile_makes_it_apply_the_children(kube):
    kube.apply(run_manifest("joined"))

    async def body(reconciler, client):
        await reconciler.reconcile(kube.ns, "joined", apply_children=True)
        applies = client.applies
        first = asyncio.ensure_future(reconciler.reconcile(kube.ns, "joined", apply_children=False))
        await asyncio.sleep(0)  # the first holds the run's lock
        waiting = asyncio.ensure_future(reconciler.reconcile(kube.ns, "joined", apply_children=False))
        await asyncio.sleep(0)
        spec_event = asyncio.ensure_future(reconciler.reconcile(kube.ns, "joined", apply_children=True))
        await asyncio.gather(first, waiting, spec_event)
        return client.applies - applies, client.run_gets

    applies, gets = _run_with_client(kube, body)
    assert gets == 3  # three reconciles: the first, and the waiting one that the spec event joined
    assert applies >= 15  # ... which re-applied every child (besides the Job, which is never re-applied)


def test_a_failure_reaches_every_caller_that_the_failed_reconcile_covered(kube):
    """A spec event that joined a waiting reconcile must see its failure, so that kopf retries it."""
    kube.apply(run_manifest("failing"))
    wait_for(lambda: kube.get("wmrlrun", "failing"), what="the run")

    async def body(reconciler, client):
        first = asyncio.ensure_future(reconciler.reconcile(kube.ns, "failing", apply_children=False))
        await asyncio.sleep(0)
        waiting = asyncio.ensure_future(reconciler.reconcile(kube.ns, "failing", apply_children=False))
        await asyncio.sleep(0)
        joined = asyncio.ensure_future(reconciler.reconcile(kube.ns, "failing", apply_children=True))
        results = await asyncio.gather(first, waiting, joined, return_exceptions=True)
        after = await asyncio.gather(reconciler.reconcile(kube.ns, "failing", apply_children=True),
                                     return_exceptions=True)  # the retry kopf would make: the queue is free
        return results, after

    results, after = _run_with_client(kube, body, fail_run_gets={2})
    assert results[0] is None
    assert [type(r) for r in results[1:]] == [ApiError, ApiError]
    assert all(r.status == 500 for r in results[1:])
    assert after == [None]
    wait_for(lambda: kube.get("job", "failing-trainer"), what="the retried reconcile's Job")
