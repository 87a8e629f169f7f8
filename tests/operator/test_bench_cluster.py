"""`wmrl bench operator` end to end on the real control plane, at a tiny size (figures are reported, never asserted)."""

import json
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def test_bench_operator_measures_steady_and_burst_runs(crd_installed, tmp_path):
    out = tmp_path / "operator.json"
    env = {**os.environ, "KUBECONFIG": str(crd_installed.kubeconfig)}
    res = subprocess.run([sys.executable, "-m", "wmrl.cli", "bench", "operator", "--runs", "3", "--steady", "2",
                          "--timeout", "120", "--max-concurrent-reconciles", "4", "--json", str(out),
                          "--plot", str(tmp_path / "burst.png"), "--restart", "--cache-children"], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    result = json.loads(out.read_text())
    assert result == json.loads(res.stdout[res.stdout.index("{"):])  # the same JSON on stdout
    assert result["runs"] == result["completed"] == 3
    assert result["children_per_run"] == 17  # mode wmrl: trainer, sandbox, world model, calibration (+ its NetworkPolicy), RBAC
    assert result["steady"]["runs"] == result["steady"]["completed"] == 2
    for block in (result["create_to_children_s"], result["steady"]["create_to_children_s"]):
        assert 0 < block["p50"] <= block["p95"] <= block["max"]
    assert result["total_s"] >= result["create_to_children_s"]["max"] > 0
    assert result["operator_peak_rss_mb"] >= result["operator_idle_rss_mb"] > 0
    assert set(result["goals_met"]) == set(result["goals"]) == {"p50_s", "p95_s", "total_s", "operator_peak_rss_mb"}
    assert result["max_concurrent_reconciles"] == 4
    curve = result["completion_curve"]
    assert [c["completed"] for c in curve] == [1, 2, 3]
    assert [c["s"] for c in curve] == sorted(c["s"] for c in curve) and curve[-1]["s"] == result["total_s"]
    assert (tmp_path / "burst.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # A second operator resumes all 5 runs and writes none of their unchanged children.
    restart = result["restart"]
    assert restart["runs"] == restart["resumed"] == 5 and restart["resume_s"] > 0
    assert restart["children_written"] == 0 and restart["children_skipped"] >= 5 * 10


def test_bench_operator_direct_writes_the_same_children_with_no_operator(crd_installed, tmp_path):
    """The floor: no operator process at all, so every child the benchmark saw it wrote itself,
    and they are the operator's objects (owned by their run, with the operator's labels)."""
    env = {**os.environ, "KUBECONFIG": str(crd_installed.kubeconfig)}
    res = subprocess.run([sys.executable, "-m", "wmrl.cli", "bench", "operator", "--runs", "3", "--steady", "1",
                          "--timeout", "120", "--direct", "--keep"], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    result = json.loads(res.stdout[res.stdout.index("{"):])
    assert result["writer"] == "direct (no operator)" and result["runs"] == result["completed"] == 3
    assert result["operator_peak_rss_mb"] is None and "operator_peak_rss_mb" not in result["goals_met"]
    assert 0 < result["create_to_children_s"]["p50"] <= result["create_to_children_s"]["max"] <= result["total_s"]
    namespace = result["namespace"]  # its own: an earlier benchmark's namespace may still be terminating
    try:
        job = json.loads(crd_installed.kubectl("get", "job", "b002-trainer", "-n", namespace, "-o", "json").stdout)
        run = json.loads(crd_installed.kubectl("get", "wmrlrun", "b002", "-n", namespace, "-o", "json").stdout)
        assert job["metadata"]["ownerReferences"][0]["uid"] == run["metadata"]["uid"]
        assert "status" not in run or not run["status"].get("phase")  # no operator touched the run
        assert crd_installed.kubectl("get", "secret", "-n", namespace, "-o", "name").stdout.count("calibration") == 4
    finally:
        crd_installed.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def test_the_completion_curve_and_the_goals_by_burst_size():
    from wmrl_operator.bench import completion_curve, goals_for

    curve = completion_curve(100.0, [100.0 + t for t in range(1, 101)][::-1])
    assert curve == [{"completed": 10 * k, "s": float(10 * k)} for k in range(1, 11)]
    assert completion_curve(0.0, []) == []
    assert goals_for(100) == {"p50_s": 1.0, "p95_s": 3.0, "total_s": 60.0, "operator_peak_rss_mb": 250.0}
    assert goals_for(1000) == {"total_s": 180.0, "operator_peak_rss_mb": 400.0}
