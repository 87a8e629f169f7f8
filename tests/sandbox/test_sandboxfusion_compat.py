"""SandboxFusion compatibility (issue 13, item 3): its own client and verl's calling pattern against a
1-slot server, files beside the program, fetch_files paths, SandboxError as 200, memory_limit_MB -1."""

import asyncio
import base64
import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import requests
from sandbox_fusion import RunCodeRequest, RunCodeResponse, RunStatus, run_code

from sandbox_helpers import TEST_ARGS, assert_contained, run
from wmrl_sandbox import executor, linux
from wmrl_sandbox.executor import WORK_SUBDIR
from wmrl_sandbox.isolation import Isolation
from wmrl_sandbox.local import LocalServer


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def metric(server, sample: str) -> float:
    for line in httpx.get(f"{server.url}/metrics").text.splitlines():
        if line.rsplit(" ", 1)[0] == sample:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


# --------------------------------------------------------------------------- concurrency on one slot

CONCURRENT = 8


def test_official_client_8_concurrent_requests_one_slot_no_retries(server):
    """sandbox_fusion.run_code with max_attempts=1: every request waits for the slot, none fails."""
    assert server.healthz()["slots"] == 1
    queued_before = metric(server, "wmrl_sandbox_queued_total")
    barrier = threading.Barrier(CONCURRENT)

    def one(i):
        barrier.wait()
        return run_code(RunCodeRequest(code=f"import time\ntime.sleep(0.2)\nprint({i})", language="python",
                                       run_timeout=10), endpoint=server.url, max_attempts=1)

    with ThreadPoolExecutor(CONCURRENT) as pool:
        results = list(pool.map(one, range(CONCURRENT)))
    assert [r.status for r in results] == [RunStatus.Success] * CONCURRENT
    assert [r.run_result.stdout for r in results] == [f"{i}\n" for i in range(CONCURRENT)]
    assert metric(server, "wmrl_sandbox_queued_total") >= queued_before + CONCURRENT - 1  # they really waited
    assert_contained(server)


def verl_call(url: str, code: str, stdin=None, timeout: int = 10, memory_limit_mb: int = 1024):
    """verl's reward path (verl/utils/reward_score/sandbox_fusion/utils.py, call_sandbox_api), reproduced:
    requests.post of a JSON string, 3 attempts that retry only on 504, anything else non-2xx is an error."""
    payload = json.dumps({"compile_timeout": timeout, "run_timeout": timeout, "code": code, "stdin": stdin,
                          "memory_limit_MB": memory_limit_mb, "language": "python", "files": {}, "fetch_files": []})
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    last_error = None
    for attempt in range(3):
        try:
            response = requests.post(url, headers=headers, data=payload, timeout=timeout + timeout + 10)
            if response.status_code == 504:
                last_error = "504"
                time.sleep(attempt + 1)
                continue
            response.raise_for_status()
            return response.json(), None
        except requests.exceptions.RequestException as exc:
            last_error = str(exc)
            break
    return None, last_error


def test_verl_style_caller_8_concurrent_requests_one_slot(server):
    barrier = threading.Barrier(CONCURRENT)

    def one(i):
        barrier.wait()
        code = "import sys, time\ntime.sleep(0.2)\nprint(int(sys.stdin.read()) * 2)"
        return verl_call(f"{server.url}/run_code", code, stdin=str(i))

    with ThreadPoolExecutor(CONCURRENT) as pool:
        results = list(pool.map(one, range(CONCURRENT)))
    assert [err for _, err in results] == [None] * CONCURRENT
    assert [resp["status"] for resp, _ in results] == ["Success"] * CONCURRENT
    assert [resp["run_result"]["stdout"] for resp, _ in results] == [f"{2 * i}\n" for i in range(CONCURRENT)]
    assert_contained(server)


# --------------------------------------------------------------------------- the bounded queue

HOLD = "import os, time\nwhile not os.path.exists('release'):\n    time.sleep(0.01)\nprint('released')"


def release_all(server) -> None:
    for execution in os.listdir(server.work_root):
        try:
            (Path(server.work_root) / execution / WORK_SUBDIR / "release").touch()
        except OSError:  # one that is just starting or ending
            pass


def hold_the_slot(server) -> ThreadPoolExecutor:
    pool = ThreadPoolExecutor(1)
    holder = pool.submit(httpx.post, f"{server.url}/run_code", timeout=60,
                         json={"code": HOLD, "language": "python", "run_timeout": 60})
    deadline = time.monotonic() + 30
    while server.healthz()["busy"] == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    pool.holder = holder
    return pool


@pytest.fixture(scope="module")
def small_queue():
    with LocalServer(slots=1, args=(*TEST_ARGS, "--max-queue", "2", "--max-queue-wait", "30")) as srv:
        yield srv


def test_a_full_queue_answers_503_with_retry_after(small_queue):
    srv = small_queue
    holder = hold_the_slot(srv)
    try:
        with ThreadPoolExecutor(5) as pool:
            pending = [pool.submit(httpx.post, f"{srv.url}/run_code", timeout=60,
                                   json={"code": f"print({i})", "language": "python"}) for i in range(5)]
            refused = []
            deadline = time.monotonic() + 30
            while len(refused) < 3 and time.monotonic() < deadline:
                refused = [f.result() for f in pending if f.done()]
                time.sleep(0.02)
            assert len(refused) == 3 and all(r.status_code == 503 for r in refused), [r.text for r in refused]
            assert all(r.headers["Retry-After"] == "1" and "already waiting" in r.json()["error"] for r in refused)
            health = srv.healthz()
            assert health["busy"] == 1 and health["queued"] == 2 and health["max_queue"] == 2
            release_all(srv)
            answered = [f.result() for f in pending]
        waited = [r for r in answered if r.status_code == 200]
        assert len(waited) == 2 and all(r.json()["status"] == "Success" for r in waited)
        assert holder.holder.result().json()["run_result"]["stdout"] == "released\n"
    finally:
        release_all(srv)
        holder.shutdown(wait=True)
    assert metric(srv, 'wmrl_sandbox_rejected_total{reason="queue_full"}') >= 3
    assert srv.healthz()["queued"] == 0


def test_a_client_that_hangs_up_leaves_the_queue(small_queue):
    srv = small_queue
    holder = hold_the_slot(srv)
    try:
        with pytest.raises(httpx.TimeoutException):
            httpx.post(f"{srv.url}/run_code", json={"code": "print(1)", "language": "python"}, timeout=0.5)
        deadline = time.monotonic() + 10
        while srv.healthz()["queued"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert srv.healthz()["queued"] == 0
        assert metric(srv, 'wmrl_sandbox_rejected_total{reason="client_gone"}') == 1
    finally:
        release_all(srv)
        holder.shutdown(wait=True)
    assert_contained(srv)


def test_a_wait_past_the_limit_answers_503():
    with LocalServer(slots=1, args=(*TEST_ARGS, "--max-queue-wait", "0.5")) as srv:
        holder = hold_the_slot(srv)
        try:
            started = time.monotonic()
            resp = httpx.post(f"{srv.url}/run_code", json={"code": "print(1)", "language": "python"}, timeout=30)
            waited = time.monotonic() - started
            assert resp.status_code == 503 and resp.headers["Retry-After"] == "1"
            assert "within 0.5s" in resp.json()["error"]
            assert 0.45 <= waited < 10
        finally:
            release_all(srv)
            holder.shutdown(wait=True)
        assert metric(srv, 'wmrl_sandbox_rejected_total{reason="queue_timeout"}') == 1
        assert run(srv, "print('after')")["run_result"]["stdout"] == "after\n"


def test_max_queue_0_never_waits():
    with LocalServer(slots=1, args=(*TEST_ARGS, "--max-queue", "0")) as srv:
        holder = hold_the_slot(srv)
        try:
            resp = httpx.post(f"{srv.url}/run_code", json={"code": "print(1)", "language": "python"}, timeout=30)
            assert resp.status_code == 503 and resp.headers["Retry-After"] == "1"
        finally:
            release_all(srv)
            holder.shutdown(wait=True)


def test_queue_defaults_scale_with_slots():
    with LocalServer(slots=2, args=TEST_ARGS) as srv:
        health = srv.healthz()
        assert health["max_queue"] == 32 and health["max_queue_wait"] == 60
    with LocalServer(slots=1, env={"WMRL_SANDBOX_MAX_QUEUE": "5", "WMRL_SANDBOX_MAX_QUEUE_WAIT_SECONDS": "7"}) as srv:
        health = srv.healthz()
        assert health["max_queue"] == 5 and health["max_queue_wait"] == 7


# --------------------------------------------------------------------------- files beside the program


def test_files_sit_beside_the_program_and_can_be_imported(server):
    resp = run_code(RunCodeRequest(
        code="import helper\nfrom pkg.mod import g\nimport sys, os\n"
             "print(helper.f(), g(), sys.path[0] == os.getcwd() == os.path.dirname(os.path.abspath(__file__)))",
        language="python",
        files={"helper.py": b64(b"def f(): return 1"), "pkg/__init__.py": b64(b""),
               "pkg/mod.py": b64(b"def g(): return 2")}), endpoint=server.url, max_attempts=1)
    assert resp.status == RunStatus.Success, resp.run_result.stderr
    assert resp.run_result.stdout == "1 2 True\n"


def test_a_file_cannot_take_the_program_s_place(server):
    resp = httpx.post(f"{server.url}/run_code", json={"code": "print(1)", "language": "python",
                                                       "files": {"main.py": b64(b"print(2)")}})
    assert resp.status_code == 422 and "main.py" in resp.json()["error"]
    clash = httpx.post(f"{server.url}/run_code", json={"code": "print(1)", "language": "python",
                                                        "files": {"a": b64(b"x"), "a/b": b64(b"y")}})
    assert clash.status_code == 422 and "clashes" in clash.json()["error"]
    assert_contained(server)


# --------------------------------------------------------------------------- fetch_files paths

WRITE = (
    "import os\n"
    "os.makedirs('out/deep', exist_ok=True)\n"
    "open('out/deep/r.txt', 'w').write('nested')\n"
    "open('top.txt', 'w').write('top')\n"
    "open('/tmp/t.txt', 'w').write('private tmp')\n"
    "os.makedirs('/tmp/a/b', exist_ok=True)\n"
    "open('/tmp/a/b/n.txt', 'w').write('nested tmp')\n"
    "open('/var/tmp/v.txt', 'w').write('var tmp')\n"
    "open('/dev/shm/s.txt', 'w').write('shm')\n"
    "print(os.getcwd())\n"
)


@pytest.mark.skipif(os.geteuid() != 0, reason="the private /tmp is root mode's")
def test_fetch_files_nested_and_absolute_paths_as_in_sandboxfusion(server):
    """Relative paths are resolved in the working directory (nested, ./ and .. included), absolute
    ones in the program's own view (its private /tmp, /var/tmp, /dev/shm); each comes back under
    the path as it was asked for; what is not there, or not the program's, is simply absent."""
    names = ["out/deep/r.txt", "./top.txt", "out/../top.txt", "out/deep/../../out/deep/r.txt",
             "/tmp/t.txt", "/tmp/a/b/n.txt", "/tmp/a/../a/b/n.txt", "/var/tmp/v.txt", "/dev/shm/s.txt",
             "missing.txt", "/tmp/missing", "out/deep", "/etc/passwd", "/etc/hostname", "/proc/self/environ",
             "/proc/self/status", "../", "", "/"]
    resp = run_code(RunCodeRequest(code=WRITE, language="python", fetch_files=names), endpoint=server.url,
                    max_attempts=1)
    assert resp.status == RunStatus.Success, resp.run_result.stderr
    files = {k: base64.b64decode(v) for k, v in resp.files.items()}
    assert files == {
        "out/deep/r.txt": b"nested", "./top.txt": b"top", "out/../top.txt": b"top",
        "out/deep/../../out/deep/r.txt": b"nested", "/tmp/t.txt": b"private tmp", "/tmp/a/b/n.txt": b"nested tmp",
        "/tmp/a/../a/b/n.txt": b"nested tmp", "/var/tmp/v.txt": b"var tmp", "/dev/shm/s.txt": b"shm",
    }
    assert not os.path.exists("/tmp/t.txt") or Path("/tmp/t.txt").read_bytes() != b"private tmp"
    assert_contained(server)


@pytest.mark.skipif(os.geteuid() != 0, reason="the private /tmp is root mode's")
def test_fetch_files_absolute_path_into_the_working_directory(server):
    """An absolute path that leads into the working directory (here through a link the program made
    in its /tmp) reaches the program's files, as it would for the program itself."""
    code = ("import os\nopen('here.txt', 'w').write(os.getcwd())\nos.symlink(os.getcwd(), '/tmp/wd')\n"
            "os.symlink(os.path.abspath('here.txt'), '/tmp/link.txt')\nprint(os.getcwd())")
    res = run(server, code, fetch_files=["/tmp/wd/here.txt", "/tmp/link.txt"])
    cwd = res["run_result"]["stdout"].strip()
    assert cwd.startswith(server.work_root) and cwd.endswith("/" + WORK_SUBDIR)
    assert res["files"] == {"/tmp/wd/here.txt": b64(cwd.encode())}  # a link as the last component is never followed
    assert_contained(server)


@pytest.mark.skipif(os.geteuid() != 0, reason="the private /tmp is root mode's")
def test_a_private_tmp_file_is_not_fetched_by_the_next_execution(server):
    first = run(server, "open('/tmp/left.txt', 'w').write('first')", fetch_files=["/tmp/left.txt"])
    assert base64.b64decode(first["files"]["/tmp/left.txt"]) == b"first"
    second = run(server, "print('second')", fetch_files=["/tmp/left.txt"])
    assert second["files"] == {}
    assert_contained(server)


def test_fetch_files_over_the_limit_are_the_program_s_failure():
    with LocalServer(slots=1, args=(*TEST_ARGS, "--max-fetch-bytes", "1000")) as srv:
        code = "open('a.txt', 'w').write('a' * 600)\nopen('b.txt', 'w').write('b' * 600)\nprint('wrote')"
        res = run(srv, code, fetch_files=["a.txt", "b.txt"])
        assert res["status"] == "Failed" and res["files_truncated"] is True
        assert res["run_result"]["status"] == "Finished" and res["run_result"]["return_code"] == 0
        assert list(res["files"]) == ["a.txt"] and "1000 bytes" in res["message"]
        ok = run(srv, "open('a.txt', 'w').write('a' * 600)", fetch_files=["a.txt"])
        assert ok["status"] == "Success" and ok["files_truncated"] is False
        parsed = RunCodeResponse(**res)  # still SandboxFusion's response model
        assert parsed.status == RunStatus.Failed


# --------------------------------------------------------------------------- memory_limit_MB

RLIMIT_AS = "import resource\nprint(resource.getrlimit(resource.RLIMIT_AS)[0] >> 20)"


def _preloaded_mb(server) -> int:
    """What a warm execution's limit adds for the fork server's imports (the program's own room is the request)."""
    warm = server.healthz()["warm"]
    return warm["preloaded_mb"] if warm["ready"] else 0


@pytest.mark.parametrize("fields, expected_mb", [
    ({}, 512),  # absent: --memory-mb (512 in TEST_ARGS)
    ({"memory_limit_MB": None}, 512),
    ({"memory_limit_MB": -1}, 8192),  # SandboxFusion's "no limit": the server's maximum (--max-memory-mb)
    ({"memory_limit_MB": 0}, 8192),
    ({"memory_limit_MB": 1024}, 1024),
    ({"memory_limit_MB": 100000}, 8192),  # capped
])
def test_memory_limit_mb(server, fields, expected_mb):
    res = run(server, RLIMIT_AS, **fields)
    assert res["run_result"]["stdout"] == f"{expected_mb + _preloaded_mb(server)}\n"


def test_memory_minus_one_follows_max_memory_mb():
    with LocalServer(slots=1, args=(*TEST_ARGS, "--max-memory-mb", "3000")) as srv:
        extra = _preloaded_mb(srv)
        assert run(srv, RLIMIT_AS, memory_limit_MB=-1)["run_result"]["stdout"] == f"{3000 + extra}\n"
        assert run(srv, RLIMIT_AS)["run_result"]["stdout"] == f"{512 + extra}\n"


# --------------------------------------------------------------------------- SandboxError as 200


@pytest.fixture
def in_process(tmp_path, monkeypatch):
    """A SandboxServer in this process (non-root layers only), so a sandbox failure can be injected."""
    from aiohttp.test_utils import TestClient, TestServer

    from wmrl_sandbox.server import SandboxServer

    root = tmp_path / "work"
    srv = SandboxServer(slots=1, work_root=str(root), isolation=Isolation(False, False, False))

    def post(body: dict):
        async def go():
            app = srv.app()
            app.on_cleanup.clear()  # keep the worker pool for the next post; shut down below
            async with TestClient(TestServer(app)) as client:
                resp = await client.post("/run_code", json=body)
                return resp.status, await resp.json()
        return asyncio.run(go())

    yield srv, post
    srv.pool.shutdown(wait=True)
    linux.libc.prctl(linux.PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)  # off again for the test process


def test_a_failure_after_the_run_is_200_sandbox_error(in_process, monkeypatch):
    srv, post = in_process

    def broken(*_args, **_kwargs):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(executor, "fetch_in_workdir", broken)
    monkeypatch.setattr(executor, "fetch_as_uid", broken)
    status, body = post({"code": "open('out.txt', 'w').write('x')\nprint('ran')", "language": "python",
                         "fetch_files": ["out.txt"]})
    assert status == 200
    assert body["status"] == "SandboxError" and "Input/output error" in body["message"]
    assert body["run_result"]["status"] == "Error" and body["files"] == {}
    assert RunCodeResponse(**body).status == RunStatus.SandboxError


def test_an_unexpected_exception_is_200_sandbox_error_in_sandboxfusion_s_shape(in_process, monkeypatch):
    srv, post = in_process

    def bug(*_args, **_kwargs):
        raise KeyError("a bug")

    monkeypatch.setattr(srv, "_execute", bug)
    status, body = post({"code": "print(1)", "language": "python"})
    assert status == 200
    assert body == {"status": "SandboxError", "message": "sandbox error: KeyError: 'a bug'", "compile_result": None,
                    "run_result": None, "executor_pod_name": srv.pod, "files": {}}
    assert RunCodeResponse(**body).status == RunStatus.SandboxError
    assert srv.busy == 0  # the slot is free again
    monkeypatch.undo()
    status, ok = post({"code": "print('fine')", "language": "python"})
    assert status == 200 and ok["run_result"]["stdout"] == "fine\n"
