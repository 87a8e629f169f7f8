"""`make test` (what .ci/run execs) fails when pytest fails or collects nothing.

The prerequisites (the venv, and test-builds: the background cluster, vLLM and images builds) are marked up to date
(`make -o`), and a stand-in for the venv's python exits with the status under test: this checks the recipe's exit-status
logic, not pytest. A background build is a real process (tests/build_deps.py) running a stand-in command.
"""

import re
import subprocess
import sys
from pathlib import Path

import pytest

build_deps = sys.modules["wmrl_build_deps"]  # tests/build_deps.py, loaded by tests/conftest.py
ROOT = Path(__file__).resolve().parents[2]


def _make_test(tmp_path, status):
    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/sh\necho \"pytest stand-in: $*\"\necho \"builds in $WMRL_TEST_BUILDS\"\nexit {status}\n")
    fake.chmod(0o755)
    return subprocess.run(["make", "--no-print-directory", "-o", "test-builds", "-o", "venv", "test", f"PY={fake}",
                           f"TEST_BUILDS_DIR={tmp_path / 'builds'}"], cwd=ROOT, capture_output=True, text=True)


@pytest.mark.parametrize("status,ok", [(0, True), (1, False), (2, False), (5, False)])
def test_make_test_exit_status(tmp_path, status, ok):
    res = _make_test(tmp_path, status)
    assert re.search(r"pytest stand-in: -m pytest -q (\S+ )*tests$", res.stdout, re.M), res.stdout
    assert (res.returncode == 0) is ok, res.stdout + res.stderr
    assert ("make test: PASSED" in res.stdout) is ok
    if status == 5:
        assert "collected no tests" in res.stdout
    assert f"builds in {tmp_path / 'builds'}" in res.stdout


@pytest.mark.parametrize("build_status,ok", [(0, True), (3, False)])
def test_a_failed_background_build_fails_make_test_though_pytest_passed(tmp_path, build_status, ok):
    build_deps.start(tmp_path / "builds", ["images"], commands={
        "images": ["sh", "-c", f"echo stand-in build output; exit {build_status}"]})
    res = _make_test(tmp_path, 0)
    assert (res.returncode == 0) is ok, res.stdout + res.stderr
    assert f"test-deps: images: exit {build_status} after" in res.stdout
    assert ("stand-in build output" in res.stdout) is not ok  # a failed build's log is shown


def test_ci_runs_exactly_make_test():
    lines = [ln for ln in (ROOT / ".ci/run").read_text().splitlines() if ln.strip() and not ln.startswith("#!")]
    assert lines[-1] == "exec make test"
    assert all(ln.startswith(("set ", "cd ")) for ln in lines[:-1])


@pytest.mark.parametrize("script", [".ci/run", "scripts/kind-e2e"])
def test_shell_scripts_parse(script):
    subprocess.run(["bash", "-n", str(ROOT / script)], check=True)
