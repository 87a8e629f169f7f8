"""`wmrl bench sandbox` end to end with tiny sizes: it runs and writes the documented JSON."""

import json
import os
import subprocess
import sys

import pytest

import bubblewrap


@pytest.mark.slow
def test_bench_sandbox_writes_json(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, "-m", "wmrl.cli", "bench", "sandbox", "--json", str(out),
                           "--iterations", "3", "--jobs", "2", "--servers", "1,2", "--warm-iterations", "2",
                           "--warm-jobs", "2", "--warm-servers", "1"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    overhead = result["overhead"]
    for key in ("bare", "bare_isolated_flags", "server", "server_outside_program"):
        assert overhead[key]["n"] == 3 and overhead[key]["p50_ms"] > 0
    assert {"ratio_p50", "ratio_p95", "overhead_p50_ms"} <= overhead.keys()
    assert [row["servers"] for row in result["throughput"]] == [1, 2]
    assert all(row["failed"] == 0 and row["executions_per_s"] > 0 for row in result["throughput"])
    warm = result["warm_against_cold"]  # CI runs as root: the warm path is there
    assert warm["warm"]["n"] == warm["cold"]["n"] == 2 and warm["latency_ratio_p50"] > 0
    for kind in ("warm", "cold"):
        assert warm["throughput"][kind]["failed"] == 0 and warm["throughput"][kind]["jobs"] == 2
    assert warm["fork_server"]["ready"] == 1 and "sklearn" in warm["fork_server"]["modules"]
    grouped = result["cgroup_per_execution"]  # root here may make cgroups
    assert grouped["controllers"] == {"memory": "v1", "pids": "v1", "cpu": "v1"}
    assert grouped["with_cgroup"]["n"] == grouped["without_cgroup"]["n"] == 2 and "cost_p50_ms" in grouped


@pytest.mark.slow
def test_bench_sandbox_measures_the_deployed_mode_as_another_uid(tmp_path):
    """--as-uid: every server as an unprivileged uid with bubblewrap, as the image runs it. The system
    interpreter here has no scikit-learn: the warm/cold program is skipped and says why."""
    out = tmp_path / "bench.json"
    for directory in (tmp_path, tmp_path.parent, tmp_path.parent.parent):  # the uid reaches its bwrap copy
        os.chmod(directory, 0o755)
    env = {**os.environ, "WMRL_SANDBOX_BWRAP": bubblewrap.copy_for(tmp_path)}
    proc = subprocess.run([sys.executable, "-m", "wmrl.cli", "bench", "sandbox", "--json", str(out),
                           "--iterations", "2", "--jobs", "2", "--servers", "1", "--warm-iterations", "1",
                           "--warm-jobs", "1", "--warm-servers", "1", "--as-uid", "61980", "--python", "/usr/bin/python3"],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    assert result["server_uid"] == 61980
    assert result["overhead"]["isolation"]["mode"] == "namespaces"
    assert result["throughput"][0]["failed"] == 0
    assert "scikit-learn" in result["warm_against_cold"]["skipped"]
    assert "not delegated" in result["cgroup_per_execution"]["skipped"]  # a uid's cgroup, as in a Pod


def test_bench_rejects_bad_arguments():
    proc = subprocess.run([sys.executable, "-m", "wmrl.cli", "bench", "sandbox", "--servers", "1,x"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--servers" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "wmrl.cli", "bench", "sandbox", "--warm-servers", "0"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--warm-" in proc.stderr
