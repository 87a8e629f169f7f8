"""`make test` (what .ci/run execs) fails when pytest fails or collects nothing.

The prerequisites (test-deps: the venv, cluster, vLLM and images) are marked up to date (`make -o`), and a stand-in for the venv's
python exits with the status under test: this checks the recipe's exit-status logic, not pytest.
"""

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _make_test(tmp_path, status):
    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/sh\necho \"pytest stand-in: $*\"\nexit {status}\n")
    fake.chmod(0o755)
    return subprocess.run(["make", "--no-print-directory", "-o", "test-deps", "-o", "venv", "-o", "cluster", "-o", "vllm",
                           "-o", "test-images", "test",
                           f"PY={fake}"], cwd=ROOT, capture_output=True, text=True)


@pytest.mark.parametrize("status,ok", [(0, True), (1, False), (2, False), (5, False)])
def test_make_test_exit_status(tmp_path, status, ok):
    res = _make_test(tmp_path, status)
    assert re.search(r"pytest stand-in: -m pytest -q (\S+ )*tests$", res.stdout, re.M), res.stdout
    assert (res.returncode == 0) is ok, res.stdout + res.stderr
    assert ("make test: PASSED" in res.stdout) is ok
    if status == 5:
        assert "collected no tests" in res.stdout


def test_ci_runs_exactly_make_test():
    lines = [ln for ln in (ROOT / ".ci/run").read_text().splitlines() if ln.strip() and not ln.startswith("#!")]
    assert lines[-1] == "exec make test"
    assert all(ln.startswith(("set ", "cd ")) for ln in lines[:-1])


@pytest.mark.parametrize("script", [".ci/run", "scripts/kind-e2e"])
def test_shell_scripts_parse(script):
    subprocess.run(["bash", "-n", str(ROOT / script)], check=True)
