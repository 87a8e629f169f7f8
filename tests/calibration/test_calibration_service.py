"""The HTTP service as a real process (file store), the client against it, kill -9 and restart."""

import json
import threading
import time

import httpx
import numpy as np
import pytest

from wmrl.calibration.client import CalibrationClient, LocalCalibration
from wmrl.calibration.store import FileStore


def group(rng, size=8):
    real = rng.random(size).round(3)
    return {"task": "t", "wm": np.sqrt(real).round(6).tolist(), "env": real.tolist()}


def post(url, body, **kw):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(url + "/v1/observations", content=content, headers={"Content-Type": "application/json"}, **kw)


def _eventually(condition, timeout: float = 30.0):
    """``condition()``'s first truthy value, polled; ``None`` after ``timeout`` s (only so a bug cannot hang)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := condition():
            return value
        time.sleep(0.01)
    return None


GOOD = {"wm": [0.2, 0.4], "env": [0.1, 0.5]}
BAD_BODIES = [
    (b'{"trainer": "t", "batch": "b", "groups": [{"wm": [NaN, 0.1], "env": [0.1, 0.2]}]}', "NaN"),
    (b'{"trainer": "t", "batch": "b", "groups": [{"wm": [Infinity], "env": [0.1]}]}', "Infinity"),
    ({"trainer": "t", "batch": "b", "groups": [{"wm": [1.2, 0.1], "env": [0.1, 0.2]}]}, r"groups[0].wm[0] = 1.2"),
    ({"trainer": "t", "batch": "b", "groups": [{"wm": [0.2], "env": [-0.1]}]}, "groups[0].env[0]"),
    ({"trainer": "t", "batch": "b", "groups": [{"wm": [0.2, 0.3], "env": [0.1]}]}, "lengths differ"),
    ({"trainer": "t", "batch": "b", "groups": []}, "groups must be a non-empty list"),
    ({"trainer": "t", "batch": "b", "groups": [GOOD, {"wm": [], "env": []}]}, "groups[1].wm must be a non-empty list"),
    ({"trainer": "t", "batch": "b", "groups": [{"wm": "0.2", "env": [0.1]}]}, "groups[0].wm must be a non-empty list"),
    ({"trainer": "t", "batch": "b", "groups": [{"wm": ["0.2"], "env": [0.1]}]}, "groups[0].wm[0] must be a number, got str"),
    ({"trainer": "t", "batch": "b", "groups": [{"wm": [True], "env": [0.1]}]}, "must be a number, got bool"),
    ({"trainer": 7, "batch": "b", "groups": [GOOD]}, "trainer must be a non-empty string"),
    ({"trainer": "t", "groups": [GOOD]}, "batch must be a non-empty string"),
    ({"trainer": "t", "batch": "b", "groups": [GOOD], "extra": 1}, "unknown field(s) ['extra']"),
    ({"trainer": "t", "batch": "b", "groups": {"wm": [0.1]}}, "groups must be a non-empty list"),
    (b"[1, 2", "invalid JSON"),
]


@pytest.fixture
def file_server(servers, tmp_path):
    return servers("--state-file", str(tmp_path / "state.json"), "--max-body-bytes", "65536").start()


def test_bad_input_gets_400_or_413_naming_the_problem_and_leaves_state_untouched(file_server):
    url = file_server.url
    assert post(url, {"trainer": "t", "batch": "first", "groups": [GOOD]}).status_code == 200
    before = httpx.get(url + "/v1/calibration").json()
    for body, message in BAD_BODIES:
        response = post(url, body)
        assert response.status_code == 400, (body, response.text)
        assert message in response.json()["error"]
    big = {"trainer": "t", "batch": "big", "groups": [{"wm": [0.5] * 2000, "env": [0.5] * 2000}] * 10}
    response = post(url, big)
    assert response.status_code == 413 and "65536" in response.json()["error"]
    assert httpx.get(url + "/v1/calibration").json() == before
    metrics = httpx.get(url + "/metrics").text
    assert f"wmrl_calibration_bad_requests_total {len(BAD_BODIES) + 1}.0" in metrics


def test_a_retried_batch_is_counted_once(file_server):
    rng = np.random.default_rng(0)
    body = {"trainer": "t", "batch": "b-1", "groups": [group(rng) for _ in range(4)]}
    first, again = post(file_server.url, body).json(), post(file_server.url, body).json()
    assert first["applied"] is True and again["applied"] is False
    assert again["pairsSeen"] == 32 and again["version"] == 1
    health = httpx.get(file_server.url + "/healthz").json()
    assert health["ok"] and health["version"] == 1


def test_client_batches_keeps_its_map_while_the_service_is_away_and_never_double_counts(servers, tmp_path):
    server = servers("--state-file", str(tmp_path / "state.json"), "--min-pairs", "64", "--refit-every", "16")
    client = CalibrationClient(server.url, "trainer-a", flush_interval=0.05, refresh_interval=0.2,
                               backoff_initial=0.02, backoff_max=0.2)
    rng = np.random.default_rng(1)
    try:
        client.observe([group(rng) for _ in range(5)])  # the service is not up yet
        assert _eventually(lambda: client.last_error), "the client never reported the service missing"
        assert client.stale_seconds is None and client.weight == 1.0
        np.testing.assert_array_equal(client.calibrate([0.3]), [0.3])  # identity until a map arrives
        server.start()
        assert client.flush(30)
        for _ in range(20):
            client.observe([group(rng) for _ in range(5)])
        assert client.flush(30)
        view = client.view()
        assert view["pairsSeen"] == 21 * 5 * 8 and view["map"] is not None
        fitted = client.calibrate([0.3, 0.6])
        acknowledged = client.acknowledged_batches
        server.kill9()
        client.observe([group(rng) for _ in range(5)])
        assert _eventually(lambda: client.last_error), "the client never noticed the service went away"
        # Alive, the service confirms the map every 0.2 s (refresh_interval); away, the map only
        # ages: failed retries (every <= 0.2 s, backoff_max) must not count as contact.
        assert _eventually(lambda: client.stale_seconds > 0.5), "staleness stopped growing while the service was away"
        np.testing.assert_array_equal(client.calibrate([0.3, 0.6]), fitted)  # training goes on
        assert client.pending_groups == 5 and client.acknowledged_batches == acknowledged
        restarting_at = time.monotonic()
        server.start()
        assert client.flush(30)
        assert client.view()["pairsSeen"] == 22 * 5 * 8
        assert client.acknowledged_batches == acknowledged + 1 and client.last_error is None
        # Staleness counts from a contact after the restart began. (One monotonic clock, read in
        # this order: it orders two events and bounds no duration.)
        stale = client.stale_seconds
        assert stale <= time.monotonic() - restarting_at
    finally:
        client.close()
    assert FileStore(tmp_path / "state.json").load().view()["pairsSeen"] == 22 * 5 * 8


def test_kill9_mid_stream_loses_no_acknowledged_observation(servers, hammer, tmp_path):
    path = tmp_path / "state.json"
    server = servers("--state-file", str(path)).start()
    acked, stop = [], threading.Event()
    threads = [threading.Thread(target=hammer, args=(server.url, f"t{i}", 30, acked, stop)) for i in range(4)]
    for t in threads:
        t.start()
    while len(acked) < 20:
        time.sleep(0.01)
    server.kill9()
    acked_before_kill = list(acked)
    state = FileStore(path).load()
    assert all(state.seen(t, b) for t, b in acked_before_kill)  # durable before acknowledged
    server.start()
    for t in threads:
        t.join(60)
    stop.set()
    view = httpx.get(server.url + "/v1/calibration").json()
    assert len(acked) == 120 and view["batches"] == 120 and view["pairsSeen"] == 120 * 32


def test_a_corrupt_state_file_is_reported_not_a_crash(servers, tmp_path):
    path = tmp_path / "state.json"
    path.write_text("{ edited by hand")
    server = servers("--state-file", str(path)).start()
    health = httpx.get(server.url + "/healthz")
    assert health.status_code == 503 and "not JSON" in health.json()["error"]
    response = post(server.url, {"trainer": "t", "batch": "b", "groups": [GOOD]})
    assert response.status_code == 503 and "delete the file to re-initialise" in response.json()["error"]
    assert server.proc.poll() is None and httpx.get(server.url + "/livez").status_code == 200
    assert path.read_text() == "{ edited by hand"  # never overwritten behind the operator's back
    path.unlink()
    assert post(server.url, {"trainer": "t", "batch": "b", "groups": [GOOD]}).json()["applied"] is True
    assert httpx.get(server.url + "/healthz").status_code == 200


def test_client_queue_is_bounded_while_the_service_is_away():
    client = CalibrationClient("http://127.0.0.1:9", "t", max_pending_groups=10, backoff_max=0.05, flush_interval=60)
    rng = np.random.default_rng(4)
    try:
        for _ in range(5):
            client.observe([group(rng) for _ in range(4)])
        assert client.pending_groups == 10 and client.dropped_groups == 10  # nothing sent: not due yet
        assert client.stale_seconds is None and client.weight == 1.0
        assert _eventually(lambda: client.last_error)  # the service is unreachable (the refresh GET failed)
        assert client.last_error.startswith("GET /v1/calibration")
    finally:
        client.close(timeout=0.2)
    assert not client._thread.is_alive()  # what could not be sent in time is abandoned, not retried forever


def test_local_calibration_has_the_client_interface():
    local = LocalCalibration()
    rng = np.random.default_rng(3)
    local.observe([{"task": "t", "wm": [0.5, None, float("nan")], "env": [0.4, 0.3, 0.2]}])  # ungraded dropped
    assert local.view()["pairsSeen"] == 1
    with pytest.raises(ValueError, match="groups"):
        local.observe([{"wm": [0.5, 2.0], "env": [0.4, 0.3]}])
    for _ in range(40):
        local.observe([group(rng) for _ in range(2)])
    assert local.view()["map"] is not None and local.stale_seconds == 0.0
    assert local.calibrate([0.5]).shape == (1,) and local.weight >= 1.0


def test_observations_need_the_token_and_reads_do_not(servers, tmp_path):
    """With WMRL_CALIBRATION_TOKEN set (from the calibration's Secret in a cluster), an observation
    without the token, or with another, is refused with 401 and changes nothing; reads stay open
    (the operator copies them into the run's status)."""
    token = "s3cret-token-for-this-calibration"
    server = servers("--state-file", str(tmp_path / "state.json"), env={"WMRL_CALIBRATION_TOKEN": token}).start()
    body = {"trainer": "t", "batch": "b0", "groups": [GOOD]}
    for headers in ({}, {"Authorization": "Bearer another"}, {"Authorization": token}):
        refused = httpx.post(server.url + "/v1/observations", json=body, headers=headers, timeout=10)
        assert refused.status_code == 401 and "token" in refused.json()["error"], refused.text
        assert refused.headers["WWW-Authenticate"].startswith("Bearer")
    view = httpx.get(server.url + "/v1/calibration", timeout=10)
    assert view.status_code == 200 and view.json()["pairs"] == 0  # nothing was folded in
    accepted = httpx.post(server.url + "/v1/observations", json=body,
                          headers={"Authorization": f"Bearer {token}"}, timeout=10)
    assert accepted.status_code == 200 and accepted.json()["pairs"] == 2
    metrics = httpx.get(server.url + "/metrics", timeout=10).text
    assert "wmrl_calibration_unauthorized_total 3.0" in metrics


def test_the_client_sends_the_token_and_keeps_what_a_wrong_one_could_not_deliver(servers, tmp_path, monkeypatch):
    token = "the-right-token"
    server = servers("--state-file", str(tmp_path / "state.json"), env={"WMRL_CALIBRATION_TOKEN": token}).start()
    rng = np.random.default_rng(0)
    wrong = CalibrationClient(server.url, "wrong", token="not-it", backoff_max=0.2)
    try:
        wrong.observe([group(rng)])
        assert not wrong.flush(timeout=2.0)  # refused, kept and retried: never dropped
        assert wrong.dropped_batches == 0 and "HTTP 401" in (wrong.last_error or "")
    finally:
        wrong.close(timeout=0.5)
    monkeypatch.setenv("WMRL_CALIBRATION_TOKEN", token)  # what the trainer Pod gets from the Secret
    right = CalibrationClient(server.url, "right")
    try:
        right.observe([group(rng)])
        assert right.flush(timeout=10.0) and right.acknowledged_batches == 1
    finally:
        right.close()
    assert httpx.get(server.url + "/v1/calibration", timeout=10).json()["pairs"] == 8
