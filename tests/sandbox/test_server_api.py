"""The API as SandboxFusion clients see it: the official `sandbox-fusion` client works unchanged."""

import base64

import httpx
import pytest
import sandbox_fusion
from sandbox_fusion import RunCodeRequest, RunStatus, SummaryMapping, run_code, summary_run_code_result

from sandbox_helpers import run


def test_official_client_runs_code_with_files(server):
    request = RunCodeRequest(
        code="import sys\nrows = open('data/in.csv').read().split()\n"
             "open('submission.csv', 'w').write(','.join(reversed(rows)))\nprint(sys.stdin.read().upper())",
        language="python", stdin="hello", run_timeout=10,
        files={"data/in.csv": base64.b64encode(b"a\nb\nc").decode()},
        fetch_files=["submission.csv"],
    )
    resp = run_code(request, endpoint=server.url, max_attempts=1)
    assert resp.status == RunStatus.Success
    assert resp.compile_result is None
    assert resp.run_result.stdout == "HELLO\n" and resp.run_result.return_code == 0
    assert base64.b64decode(resp.files["submission.csv"]) == b"c,b,a"
    assert resp.executor_pod_name
    assert summary_run_code_result(resp, SummaryMapping()) == "Success"


def test_official_client_sees_failures_and_timeouts(server):
    failed = run_code(RunCodeRequest(code="raise ValueError('x')", language="python"), endpoint=server.url,
                      max_attempts=1)
    assert failed.status == RunStatus.Failed and "ValueError" in failed.run_result.stderr
    timeout = run_code(RunCodeRequest(code="while True: pass", language="python", run_timeout=0.5),
                       endpoint=server.url, max_attempts=1)
    mapping = SummaryMapping(RunTimeout="timeout")
    assert timeout.status == RunStatus.Failed
    assert summary_run_code_result(timeout, mapping) == "timeout"


def test_official_client_default_endpoint(server, monkeypatch):
    monkeypatch.setattr(sandbox_fusion.config, "SANDBOX_ENDPOINT", server.url)
    resp = run_code(RunCodeRequest(code="print(6 * 7)", language="python"), max_attempts=1)
    assert resp.run_result.stdout == "42\n"


def test_unsupported_known_language_is_a_422(server):
    resp = httpx.post(f"{server.url}/run_code", json={"code": "int main(){}", "language": "cpp"})
    assert resp.status_code == 422 and resp.json()["detail"][0]["loc"] == ["body", "language"]
    with pytest.raises(Exception, match="422"):
        run_code(RunCodeRequest(code="x", language="cpp"), endpoint=server.url, max_attempts=1)


@pytest.mark.parametrize("body, status", [
    (b"not json", 400),
    (b"[1, 2]", 400),
    (b'{"language": "python"}', 422),
    (b'{"code": "print(1)", "language": "python", "run_timeout": -1}', 422),
])
def test_bad_bodies_are_json_errors(server, body, status):
    resp = httpx.post(f"{server.url}/run_code", content=body, headers={"Content-Type": "application/json"})
    assert resp.status_code == status
    assert resp.json()["error"]


def test_healthz_and_metrics(server):
    health = server.healthz()
    assert health["status"] == "ok" and health["slots"] == 1
    assert health["isolation"] == {"mode": "root", "requested": "namespaces", "uid_per_slot": True, "user_namespaces": False,
                                   "network_namespace": True, "mount_namespace": True, "ipc_namespace": True,
                                   "pid_namespace": False, "seccomp": True, "bwrap": None, "bwrap_error": None}
    assert health["layers"] and all(health["layers"].values()), health["layers"]
    run(server, "print('counted')")
    run(server, "import sys; sys.exit(3)")
    text = httpx.get(f"{server.url}/metrics").text
    values = {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines()
              if line and not line.startswith("#")}
    assert values['wmrl_sandbox_executions_total{outcome="Success"}'] >= 1
    assert values['wmrl_sandbox_executions_total{outcome="Failed"}'] >= 1
    assert values["wmrl_sandbox_busy_slots"] == 0
    assert values["wmrl_sandbox_slots"] == 1
    assert values["wmrl_sandbox_execution_seconds_count"] >= 2


def test_memory_limit_and_truncation_flags_are_reported(server):
    res = run(server, "print('a' * 100000)")
    assert res["run_result"]["stdout_truncated"] is True
    assert res["run_result"]["stderr_truncated"] is False


def test_pod_environment_sets_defaults():
    """The operator configures the server through WMRL_SANDBOX_* variables."""
    from wmrl_sandbox.local import LocalServer

    with LocalServer(env={"WMRL_SANDBOX_SLOTS": "2", "WMRL_SANDBOX_TIMEOUT_SECONDS": "0.5"}) as srv:
        assert srv.healthz()["slots"] == 2
        res = run(srv, "while True: pass", run_timeout=30)  # capped at 0.5 s by the server
        assert res["run_result"]["status"] == "TimeLimitExceeded"


def test_a_sandbox_that_cannot_run_code_refuses_to_start_and_says_why():
    """The startup self-check: a broken interpreter fails the server at once (exit 2), not every request."""
    import shutil
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    root = Path(tempfile.mkdtemp(prefix="wmrl-sandbox-"))  # searchable by the slot uids, as LocalServer makes it
    try:
        root.chmod(0o711)
        broken = root / "python"
        broken.write_text("#!/bin/sh\necho 'no interpreter here' >&2\nexit 3\n")
        broken.chmod(0o755)
        proc = subprocess.run([sys.executable, "-m", "wmrl.cli", "sandbox", "serve", "--port", "0",
                               "--work-root", str(root), "--python", str(broken)],
                              capture_output=True, text=True, timeout=60)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    assert proc.returncode == 2
    assert "self-check failed" in proc.stderr and "exit code 3" in proc.stderr and "no interpreter here" in proc.stderr
    assert "listening" not in proc.stdout
