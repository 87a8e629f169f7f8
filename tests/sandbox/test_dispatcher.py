"""SandboxDispatcher against real local servers (and EndpointSlice discovery on the real apiserver)."""

import socket
import subprocess
import threading
import time
import uuid

import httpx
import pytest

from sandbox_helpers import OK_BODY, Scripted
from wmrl.outcome import Status
from wmrl.tasks import Task
from wmrl_sandbox import server as sandbox_server
from wmrl_sandbox.dispatcher import (SERVER_QUEUE_WAIT_S, EndpointSliceEndpoints, SandboxDispatcher,
                                     SandboxRequestError, SandboxUnavailable, StaticEndpoints)
from wmrl_sandbox.local import LocalServer

SLEEP = "import time\ntime.sleep({s})\nprint('slept')"


def metric(server, name: str) -> float:
    for line in httpx.get(f"{server.url}/metrics").text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def hold_the_only_slot(server, seconds: float) -> threading.Thread:
    """Another client's run of ``seconds`` on ``server``, started and holding its slot on return."""
    hog = threading.Thread(target=lambda: httpx.post(f"{server.url}/run_code", timeout=30, json={
        "code": SLEEP.format(s=seconds), "language": "python"}))
    hog.start()
    while server.healthz()["busy"] == 0:
        time.sleep(0.02)
    return hog


@pytest.fixture(scope="module")
def two_servers():
    with LocalServer(slots=1) as a, LocalServer(slots=1) as b:
        yield a, b


def test_spreads_work_and_never_overfills_a_pod(two_servers):
    a, b = two_servers
    queued_before = metric(a, "wmrl_sandbox_queued_total") + metric(b, "wmrl_sandbox_queued_total")
    with SandboxDispatcher(StaticEndpoints([a.url, b.url]), slots_per_pod=1, timeout=20) as d:
        futures = [d.run(SLEEP.format(s=0.3)) for _ in range(6)]
        assert d.demand == 6
        results = [f.result(timeout=60) for f in futures]
        assert d.demand == 0
    assert all(r["status"] == "Success" and r["run_result"]["stdout"] == "slept\n" for r in results)
    queued_after = metric(a, "wmrl_sandbox_queued_total") + metric(b, "wmrl_sandbox_queued_total")
    assert queued_after == queued_before  # never sent a pod more than its slots: nothing waited there
    assert metric(a, 'wmrl_sandbox_executions_total{outcome="Success"}') >= 1
    assert metric(b, 'wmrl_sandbox_executions_total{outcome="Success"}') >= 1


def test_files_and_fetch_roundtrip(two_servers):
    a, _ = two_servers
    with SandboxDispatcher(StaticEndpoints([a.url]), timeout=20) as d:
        res = d.run("open('out.txt', 'w').write(open('in.txt').read() * 2)", files={"in.txt": b"ab"},
                    fetch_files=["out.txt"], run_timeout=10).result(timeout=60)
    assert res["files"]["out.txt"] == "YWJhYg=="  # base64 of "abab"


def test_run_task_grades_a_tiny_task(two_servers):
    task = Task(name="tiny", description="", kind="classification", metric="accuracy", target="target",
                data={"test.csv": b"id,f0\n1,0.5\n2,0.7\n"}, hidden_labels=b"id,target\n1,0\n2,1\n",
                leaderboard=(1.0, 0.5))
    good = ("import numpy as np\nt = np.loadtxt('data/test.csv', delimiter=',', skiprows=1, ndmin=2)\n"
            "np.savetxt('submission.csv', np.column_stack([t[:, 0], t[:, 1] > 0.6]), fmt='%d', delimiter=',',"
            " header='id,target', comments='')\n")
    with SandboxDispatcher(StaticEndpoints([s.url for s in two_servers]), timeout=30) as d:
        valid, crash, nosub = (d.run_task(task, code).result(timeout=90) for code in
                               (good, "import numpy as np\nnp.loadtxt('missing.csv')", "print('hi')"))
    assert valid.status is Status.VALID and valid.rank_score == 1.0
    assert crash.status is Status.RUNTIME_ERR and crash.error_type == "FileNotFoundError" and crash.error_line == 2
    assert nosub.status is Status.RAN_NO_SUB


def test_pod_killed_mid_run_is_retried_on_another():
    with LocalServer(slots=1) as a, LocalServer(slots=1) as b:
        with SandboxDispatcher(StaticEndpoints([a.url, b.url]), timeout=20, backoff=0.05) as d:
            futures = [d.run(SLEEP.format(s=1.5)) for _ in range(2)]
            while a.healthz()["busy"] == 0:  # wait until a is running its execution
                time.sleep(0.05)
            a.kill()
            results = [f.result(timeout=60) for f in futures]
        assert all(r["status"] == "Success" for r in results)
        assert metric(b, 'wmrl_sandbox_executions_total{outcome="Success"}') == 2


def test_all_pods_dead_fails_after_retries():
    with LocalServer(slots=1) as a:
        url = a.url
    with SandboxDispatcher(StaticEndpoints([url]), timeout=5, max_retries=2, backoff=0.01) as d:
        with pytest.raises(SandboxUnavailable, match="3 attempts"):
            d.run("print(1)").result(timeout=60)


def _closed_url() -> str:
    """A loopback URL nothing listens on (connections to it are refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


def _failed_attempts(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "wmrl.sandbox.dispatcher" and "failed (ConnectError" in r.getMessage()]


def test_a_dead_pool_fails_fast_naming_its_endpoints(caplog):
    """Every endpoint refusing: an execution given a dead-pool grace gives up once none has answered
    for that long, naming them, with most of its retry budget unspent (spending it would take
    minutes: each pod's backoff doubles up to 30 s)."""
    urls = [_closed_url(), _closed_url()]
    with SandboxDispatcher(StaticEndpoints(urls), timeout=5, max_retries=50, backoff=0.05) as d:
        with pytest.raises(SandboxUnavailable) as err:
            d.failing_fast(0.5).run("print(1)").result(timeout=120)
    message = str(err.value)
    assert message.startswith("every sandbox endpoint is down: 2 failing, none answered for 0.5s: "), message
    assert all(url in message for url in urls) and "ConnectError" in message
    attempts = _failed_attempts(caplog)
    assert {url for url in urls if any(url in a for a in attempts)} == set(urls)  # each was tried
    assert len(attempts) <= 20  # not the 51 of the retry budget


def test_a_pool_with_one_live_pod_is_not_dead(two_servers, caplog):
    """A pod that refuses is retried on the one that answers, however short the grace: the pool is
    dead only when every endpoint fails."""
    a, _ = two_servers
    dead = _closed_url()
    with SandboxDispatcher(StaticEndpoints([dead, a.url]), timeout=20, backoff=0.05) as d:
        fast = d.failing_fast(0.0)
        results = [f.result(timeout=60) for f in [fast.run("print(1)") for _ in range(4)]]
    assert all(r["status"] == "Success" for r in results)
    assert any(dead in a for a in _failed_attempts(caplog))  # the dead one was tried, and skipped


def test_request_errors_are_not_retried(two_servers):
    a, _ = two_servers
    with SandboxDispatcher(StaticEndpoints([a.url]), timeout=5) as d:
        with pytest.raises(SandboxRequestError, match="422"):
            d.run("print(1)", files={"../escape": b"x"}).result(timeout=30)


def test_backpressure_and_cancel(two_servers):
    a, _ = two_servers
    with SandboxDispatcher(StaticEndpoints([a.url]), timeout=20, workers=1, max_queue=1) as d:
        first = d.run(SLEEP.format(s=1))
        while d.demand != 1 or first.running() is False:
            time.sleep(0.01)
        queued = d.run("print('queued')")  # fills the queue
        submitted = threading.Event()
        third = []

        def submit():
            third.append(d.run("print('third')"))
            submitted.set()

        threading.Thread(target=submit, daemon=True).start()
        assert not submitted.wait(0.3)  # blocked: the queue is full
        assert queued.cancel()  # a queued job can be cancelled
        assert submitted.wait(30)
        assert first.result(timeout=30)["status"] == "Success"
        assert third[0].result(timeout=30)["run_result"]["stdout"] == "third\n"
        assert queued.cancelled()


def test_busy_pod_is_waited_for_not_failed():
    """Another client holds the only slot of a server that does not queue: its 503 + Retry-After
    answers wait for the slot without using up the retries."""
    with LocalServer(slots=1, args=("--max-queue", "0")) as a:
        hog = hold_the_only_slot(a, 1.5)
        with SandboxDispatcher(StaticEndpoints([a.url]), timeout=20, max_retries=0) as d:
            assert d.run("print('after')").result(timeout=60)["run_result"]["stdout"] == "after\n"
        hog.join()
        assert metric(a, 'wmrl_sandbox_rejected_total{reason="queue_full"}') >= 1  # it was really turned away


def test_a_wait_in_the_servers_queue_is_not_a_timeout():
    """Another client holds the only slot; the server queues the dispatcher's request behind it.
    The attempt's HTTP timeout counts that wait: without it (run_timeout + margin < wait + run)
    the attempt would time out and, with no retries, fail."""
    with LocalServer(slots=1, args=("--max-queue-wait", "6")) as a:
        hog = hold_the_only_slot(a, 2.5)
        with SandboxDispatcher(StaticEndpoints([a.url]), timeout=1.5, max_retries=0, http_margin=0.5,
                               server_queue_wait=6) as d:
            result = d.run(SLEEP.format(s=0.3)).result(timeout=60)
        hog.join()
        assert result["run_result"]["stdout"] == "slept\n"
        assert metric(a, "wmrl_sandbox_queue_wait_seconds_sum") >= 1.0  # it really waited in the server's queue


def test_the_dispatchers_queue_allowance_is_the_servers_default():
    assert SERVER_QUEUE_WAIT_S == sandbox_server.DEFAULT_MAX_QUEUE_WAIT


@pytest.mark.parametrize("busy", [
    (429, {"Retry-After": "0.1"}, {"error": "busy"}),  # servers before the queue
    (503, {"Retry-After": "0.1"}, {"error": "queue full"}),
])
def test_busy_answers_wait_without_using_up_retries(busy):
    with Scripted([busy, busy, busy, (200, {}, OK_BODY)]) as stub:
        with SandboxDispatcher(StaticEndpoints([stub.url]), timeout=5, max_retries=0) as d:
            assert d.run("print('ok')").result(timeout=30)["run_result"]["stdout"] == "ok\n"
        assert stub.calls == 4


def test_503_without_retry_after_is_a_failed_attempt():
    with Scripted([(503, {}, {"error": "down"})]) as stub:
        with SandboxDispatcher(StaticEndpoints([stub.url]), timeout=5, max_retries=1, backoff=0.01) as d:
            with pytest.raises(SandboxUnavailable, match="2 attempts.*HTTP 503"):
                d.run("print(1)").result(timeout=30)


def test_memory_limit_is_sent_only_when_set():
    with Scripted([(200, {}, OK_BODY)]) as stub:
        with SandboxDispatcher(StaticEndpoints([stub.url]), timeout=5) as d:
            assert "memory_limit_MB" not in d._body("x", None, None, None, None, None)  # the server's default
            assert d._body("x", None, None, None, None, -1)["memory_limit_MB"] == -1  # the server's maximum
        with SandboxDispatcher(StaticEndpoints([stub.url]), timeout=5, memory_limit_mb=1024) as d:
            assert d._body("x", None, None, None, None, None)["memory_limit_MB"] == 1024


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="urls"):
        StaticEndpoints([])
    with pytest.raises(ValueError, match="slots_per_pod"):
        SandboxDispatcher(StaticEndpoints(["http://x"]), slots_per_pod=0)


def _host_ip() -> str:
    """A non-loopback address of this machine (EndpointSlices may not point at loopback)."""
    return subprocess.run(["hostname", "-I"], capture_output=True, text=True, check=True).stdout.split()[0]


@pytest.mark.cluster
@pytest.mark.slow
def test_endpointslice_discovery(k8s_cluster):
    from kubernetes import client, config

    api = config.new_client_from_config(config_file=str(k8s_cluster.kubeconfig))
    core, discovery = client.CoreV1Api(api), client.DiscoveryV1Api(api)
    ns = f"sandbox-test-{uuid.uuid4().hex[:6]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
    ip = _host_ip()
    try:
        with LocalServer(host="0.0.0.0", slots=1) as server:
            port = int(server.url.rsplit(":", 1)[1])
            core.create_namespaced_service(ns, client.V1Service(
                metadata=client.V1ObjectMeta(name="r-sandbox"),
                spec=client.V1ServiceSpec(cluster_ip="None", ports=[client.V1ServicePort(name="http", port=8080)])))
            discovery.create_namespaced_endpoint_slice(ns, client.V1EndpointSlice(
                metadata=client.V1ObjectMeta(name="r-sandbox-manual",
                                             labels={"kubernetes.io/service-name": "r-sandbox"}),
                address_type="IPv4",
                ports=[client.DiscoveryV1EndpointPort(name="http", port=port, protocol="TCP")],
                endpoints=[
                    client.V1Endpoint(addresses=[ip], conditions=client.V1EndpointConditions(ready=True)),
                    client.V1Endpoint(addresses=["10.255.0.9"], conditions=client.V1EndpointConditions(ready=False)),
                ]))
            # An unrelated slice of another service is ignored.
            discovery.create_namespaced_endpoint_slice(ns, client.V1EndpointSlice(
                metadata=client.V1ObjectMeta(name="other", labels={"kubernetes.io/service-name": "other"}),
                address_type="IPv4", ports=[client.DiscoveryV1EndpointPort(port=1)],
                endpoints=[client.V1Endpoint(addresses=["10.255.0.10"])]))

            endpoints = EndpointSliceEndpoints(ns, "r-sandbox", port=None, refresh_seconds=0.2,
                                               kubeconfig=str(k8s_cluster.kubeconfig))
            assert endpoints.urls() == [f"http://{ip}:{port}"]
            with SandboxDispatcher(endpoints, timeout=20) as d:  # closing it closes the endpoints too
                assert d.run("print('via slice')").result(timeout=60)["run_result"]["stdout"] == "via slice\n"

                # The pod turns unready: the next refresh drops it.
                discovery.patch_namespaced_endpoint_slice("r-sandbox-manual", ns, {"endpoints": [
                    {"addresses": [ip], "conditions": {"ready": False}}]})
                deadline = time.monotonic() + 30
                while endpoints.urls() and time.monotonic() < deadline:
                    time.sleep(0.1)
                assert endpoints.urls() == []
                assert d.demand == 0
    finally:
        core.delete_namespace(ns)
