"""`wmrl run` end to end, as a real subprocess: results, plot, services stopped, Ctrl-C + resume."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from local_helpers import alive, write_manifest

pytestmark = pytest.mark.slow


def _wmrl(*args: str) -> list[str]:
    return [sys.executable, "-m", "wmrl.cli", *args]


def _service_pids(results: Path) -> list[int]:
    return [s["pid"] for s in json.loads((results / "logs" / "services.json").read_text())]


def test_run_writes_results_and_plot_and_stops_every_service(tmp_path, wmrl_env):
    manifest = write_manifest(tmp_path)
    results = tmp_path / "out"
    proc = subprocess.run(_wmrl("run", str(manifest), "--results", str(results), "--sandboxes", "2",
                                "--eval-samples", "2", "--no-progress"),
                          capture_output=True, text=True, env=wmrl_env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"results in {results}" in proc.stdout
    # It says how its sandboxes isolate each execution (root here: a uid per slot and namespaces).
    assert "wmrl run: sandboxes: isolation root (each execution: a uid of its own per slot, network, mount and " \
        "IPC namespaces); every self-test layer holds" in proc.stdout, proc.stdout
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["finished"] and summary["steps_done"] == 2
    data = json.loads((results / "results.json").read_text())
    assert [r["step"] for r in data["records"]] == [0, 1]
    assert data["executions"] == sum(r["executions"] for r in data["records"]) > 0  # anchors ran for real
    curve = data["held_out"]["curve"]
    assert [p["step"] for p in curve] == [0, 1, 2]
    assert all(p["reward"] is not None and 0 <= p["reward"] <= 1 for p in curve)
    assert curve[0]["wall_clock_s"] == 0 and curve[-1]["wall_clock_s"] == pytest.approx(data["wall_clock_s"])
    assert data["config"]["runtime"]["patchStatus"] is False
    assert (results / "results.png").stat().st_size > 1000
    pids = _service_pids(results)
    assert len(pids) == 3  # two sandboxes + the calibration service
    assert not [p for p in pids if alive(p)]


def test_bad_manifest_is_a_usage_error_naming_the_field(tmp_path, wmrl_env):
    manifest = write_manifest(tmp_path, groupSize=1)
    proc = subprocess.run(_wmrl("run", str(manifest), "--results", str(tmp_path / "out")),
                          capture_output=True, text=True, env=wmrl_env, timeout=120)
    assert proc.returncode == 2
    assert "algorithm.group_size" in proc.stderr or "algorithm.groupSize" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_a_sandbox_that_cannot_start_fails_the_run_with_its_reason(tmp_path, wmrl_env):
    """Exit 1 with the sandbox's own message, at once, and nothing left running (not retries for ever)."""
    manifest = write_manifest(tmp_path)
    env = dict(wmrl_env, WMRL_SANDBOX_TIMEOUT_SECONDS="soon")  # the sandbox server rejects it at start
    proc = subprocess.run(_wmrl("run", str(manifest), "--results", str(tmp_path / "out"), "--sandboxes", "1"),
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "wmrl run: sandbox-0 exited with" in proc.stderr and "WMRL_SANDBOX_TIMEOUT_SECONDS='soon'" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not [p for p in _service_pids(tmp_path / "out") if alive(p)]


def test_ctrl_c_checkpoints_and_a_second_run_resumes_at_that_step(tmp_path, wmrl_env):
    manifest = write_manifest(tmp_path, steps=4)
    results = tmp_path / "out"
    args = _wmrl("run", str(manifest), "--results", str(results), "--sandboxes", "1", "--eval-samples", "2",
                 "--eval-every", "2", "--no-progress")
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=wmrl_env)
    steps = results / "steps.jsonl"
    deadline = time.monotonic() + 400
    while time.monotonic() < deadline and proc.poll() is None:
        if steps.is_file() and steps.read_text().strip():
            break
        time.sleep(0.2)
    assert proc.poll() is None, proc.communicate()[1][-3000:]
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=400)
    assert proc.returncode == 130, err[-3000:]
    assert "checkpointing after this step" in err
    first = json.loads((results / "results.json").read_text())
    stopped = first["steps_done"]
    assert not first["finished"] and 1 <= stopped < 4
    assert (results / "checkpoints" / f"step-{stopped:08d}" / "COMPLETE").is_file()
    assert not [p for p in _service_pids(results) if alive(p)]

    second = subprocess.run(args, capture_output=True, text=True, env=wmrl_env, timeout=600)
    assert second.returncode == 0, second.stderr[-3000:]
    data = json.loads((results / "results.json").read_text())
    assert data["finished"] and data["resumed_from"] == [stopped]
    assert [r["step"] for r in data["records"]] == [0, 1, 2, 3]  # no step lost or repeated
    clocks = [r["wall_clock_s"] for r in data["records"]]
    assert clocks == sorted(clocks)  # the training clock continues across the resume
    assert [p["step"] for p in data["held_out"]["curve"]][-1] == 4
    assert not [p for p in _service_pids(results) if alive(p)]
