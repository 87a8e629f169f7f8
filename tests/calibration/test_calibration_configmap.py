"""Replicas of `wmrl calibration serve --configmap` on the real apiserver from tests/cluster."""

import json
import threading
import time
import uuid

import httpx
import numpy as np
import pytest

from wmrl.calibration.store import ConfigMapStore

pytestmark = pytest.mark.cluster


@pytest.fixture
def configmap(k8s_cluster):
    name = f"cal-{uuid.uuid4().hex[:8]}"
    store = ConfigMapStore("default", name, kubeconfig=str(k8s_cluster.kubeconfig))
    yield name, store
    store._request("DELETE", store._path())


def replicas(servers, k8s_cluster, name, n, *extra):
    env = {"KUBECONFIG": str(k8s_cluster.kubeconfig)}
    return [servers("--configmap", f"default/{name}", *extra, env=env).start() for _ in range(n)]


@pytest.mark.slow
def test_eight_trainers_two_replicas_exact_counts_and_no_batch_twice(servers, k8s_cluster, configmap, make_group):
    from wmrl.calibration.client import CalibrationClient

    name, store = configmap
    a, b = replicas(servers, k8s_cluster, name, 2)
    clients = [CalibrationClient((a, b)[i % 2].url, f"trainer-{i}", flush_interval=0.05) for i in range(8)]

    def train(client, seed):
        rng = np.random.default_rng(seed)
        for step in range(250):  # 2 anchor groups a step
            client.observe([make_group(rng) for _ in range(2)])
            if step % 50 == 0:
                time.sleep(0.01)

    threads = [threading.Thread(target=train, args=(c, i)) for i, c in enumerate(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(c.flush(120) for c in clients)
    batches = sum(c.acknowledged_batches for c in clients)
    # a retried batch (same trainer and id), sent to both replicas, counts once
    retry = {"trainer": "trainer-x", "batch": "once", "groups": [make_group(np.random.default_rng(9))]}
    answers = [httpx.post(s.url + "/v1/observations", json=retry, timeout=30).json() for s in (a, b, a)]
    assert [x["applied"] for x in answers] == [True, False, False]
    for c in clients:
        c.close()

    view = store.load().view()
    total = 8 * 500 * 8 + 8
    assert view["pairsSeen"] == total and view["groupsSeen"] == 8 * 500 + 1
    assert view["pairs"] == 5000 and view["pairsEvicted"] == total - 5000
    assert view["batches"] == batches + 1 and all(c.dropped_batches == 0 for c in clients)
    assert view["map"] is not None and view["bias"]["reduction"] > 0.5
    assert httpx.get(b.url + "/v1/calibration").json()["version"] == view["version"]
    conflicts = sum(float(line.split()[-1]) for s in (a, b) for line in httpx.get(s.url + "/metrics").text.splitlines()
                    if line.startswith("wmrl_calibration_store_conflicts "))
    print(f"\nbatches {batches}, optimistic-concurrency conflicts resolved: {conflicts}")


def test_kill9_a_replica_mid_stream_loses_no_acknowledged_observation(servers, hammer, k8s_cluster, configmap):
    name, store = configmap
    a, b = replicas(servers, k8s_cluster, name, 2)
    acked, stop = [], threading.Event()
    threads = [threading.Thread(target=hammer, args=((a, b)[i % 2].url, f"t{i}", 15, acked, stop)) for i in range(4)]
    for t in threads:
        t.start()
    while len(acked) < 12:
        time.sleep(0.01)
    a.kill9()
    acknowledged = list(acked)  # before the load: replica b keeps acknowledging meanwhile
    state = store.load()
    assert all(state.seen(t, batch) for t, batch in acknowledged)  # durable before acknowledged
    a.start()
    for t in threads:
        t.join(120)
    stop.set()
    view = store.load().view()
    assert len(acked) == 60 and view["batches"] == 60 and view["pairsSeen"] == 60 * 32


def test_configmap_edited_to_garbage_then_deleted_gives_clear_error_then_clean_reinit(servers, k8s_cluster, configmap):
    name, store = configmap
    (server,) = replicas(servers, k8s_cluster, name, 1)
    good = {"trainer": "t", "batch": "1", "groups": [{"wm": [0.2, 0.7], "env": [0.1, 0.9]}]}
    assert httpx.post(server.url + "/v1/observations", json=good).json()["version"] == 1
    k8s_cluster.kubectl("-n", "default", "patch", "configmap", name, "--type", "merge",
                        "-p", json.dumps({"data": {"state.json": "{garbage"}}))
    for _ in range(3):
        health = httpx.get(server.url + "/healthz")
        assert health.status_code == 503
        assert f"ConfigMap default/{name}" in health.json()["error"] and "not JSON" in health.json()["error"]
        response = httpx.post(server.url + "/v1/observations", json={**good, "batch": "2"})
        assert response.status_code == 503 and "delete the ConfigMap" in response.json()["error"]
    assert server.proc.poll() is None and httpx.get(server.url + "/livez").status_code == 200  # no crash loop
    k8s_cluster.kubectl("-n", "default", "delete", "configmap", name)
    response = httpx.post(server.url + "/v1/observations", json={**good, "batch": "3"})
    assert response.status_code == 200 and response.json()["version"] == 1  # a clean re-initialisation
    assert httpx.get(server.url + "/healthz").status_code == 200
    assert httpx.get(server.url + "/v1/calibration").json()["pairsSeen"] == 2
