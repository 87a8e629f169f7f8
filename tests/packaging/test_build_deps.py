"""tests/build_deps.py: `make test`'s background builds and the gates tests/conftest.py puts before
the tests that need them. The builds here are real background processes running stand-in commands;
the gates are exercised by a real pytest run over tests/packaging/gated_sample.py."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

build_deps = sys.modules["wmrl_build_deps"]  # tests/build_deps.py, loaded by tests/conftest.py
ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable


@pytest.mark.parametrize("fixtures,markers,needed", [
    ((), (), set()),
    (("tmp_path",), ("slow",), set()),
    (("k8s_cluster", "tmp_path"), (), {"cluster"}),
    (("real_node", "k8s_cluster"), (), {"cluster"}),
    (("vllm_build", "vllm_server"), (), {"vllm"}),
    ((), ("e2e",), {"cluster", "images"}),
    ((), ("images",), {"images"}),
    (("e2e_images",), ("cluster",), {"cluster", "images"}),
])
def test_what_a_test_needs_comes_from_its_fixtures_and_markers(fixtures, markers, needed):
    assert build_deps.gates(fixtures, markers) == needed


def test_tests_needing_no_build_run_first_and_the_slowest_build_last():
    assert build_deps.run_rank(set()) == 0
    ranks = [build_deps.run_rank({name}) for name in build_deps.GATE_ORDER]
    assert ranks == sorted(ranks) and ranks[0] > 0
    assert build_deps.run_rank({"vllm", "cluster"}) == build_deps.run_rank({"cluster"})
    assert set(build_deps.GATE_ORDER) == set(build_deps.BUILDS)
    assert set(build_deps.GATE_FIXTURES.values()) <= set(build_deps.BUILDS)


def test_the_builds_commands_exist():
    for name, (script, *_) in build_deps.BUILDS.items():
        assert (ROOT / script).is_file(), name


def test_a_build_holds_its_lock_from_launch_until_it_ends(tmp_path):
    go, done = tmp_path / "go", tmp_path / "done"
    script = f"import pathlib,time\nwhile not pathlib.Path({str(go)!r}).exists(): time.sleep(0.05)\n" \
             f"print('building'); pathlib.Path({str(done)!r}).write_text('x'); raise SystemExit(3)"
    build_deps.start(tmp_path / "b", ["x"], commands={"x": [PY, "-c", script]})
    assert build_deps.is_running(tmp_path / "b", "x")  # locked before start() returned: no race with the tests
    with pytest.raises(RuntimeError, match="still running"):
        build_deps.start(tmp_path / "b", ["x"], commands={"x": [PY, "-c", "pass"]})
    go.write_text("")
    result = build_deps.wait(tmp_path / "b", "x")
    assert done.exists() and not build_deps.is_running(tmp_path / "b", "x")
    assert result.returncode == 3 and not result.ok and result.seconds > 0
    assert "building" in result.log.read_text()
    assert build_deps.wait(tmp_path / "b", "never-started") is None


def test_a_build_runs_at_lower_priority(tmp_path):
    build_deps.start(tmp_path / "b", ["x"], commands={"x": [PY, "-c", "import os; print('nice', os.nice(0))"]},
                     nice=5)
    result = build_deps.wait(tmp_path / "b", "x")
    assert result.ok
    assert f"nice {min(os.nice(0) + 5, 19)}" in result.log.read_text()


def test_a_daemon_the_build_leaves_does_not_hold_the_lock(tmp_path):
    pidfile = tmp_path / "daemon.pid"
    build_deps.start(tmp_path / "b", ["x"], commands={
        "x": ["sh", "-c", f"sleep 300 </dev/null >/dev/null 2>&1 & echo $! > {pidfile}"]})
    try:
        assert build_deps.wait(tmp_path / "b", "x").ok
        os.kill(int(pidfile.read_text()), 0)  # still alive, yet the wait is over
    finally:
        os.kill(int(pidfile.read_text()), signal.SIGKILL)


def test_finish_reports_every_build_and_fails_on_a_failed_one(tmp_path, capsys):
    build_deps.start(tmp_path / "b", ["cluster", "vllm"], commands={
        "vllm": ["sh", "-c", "echo vllm fine"], "cluster": ["sh", "-c", "echo go: compile error >&2; exit 2"]})
    assert build_deps.finish(tmp_path / "b") == 1
    out = capsys.readouterr().out
    assert out.index("test-deps: vllm: exit 0") < out.index("test-deps: cluster: exit 2")
    assert "go: compile error" in out and "vllm fine" not in out
    build_deps.start(tmp_path / "ok", ["vllm"], commands={"vllm": ["true"]})
    assert build_deps.finish(tmp_path / "ok") == 0
    assert build_deps.finish(tmp_path / "nothing-started") == 0


def _pytest_sample(tmp_path, build_script):
    """A real pytest over gated_sample.py under a background "vllm" build running ``build_script``."""
    sample = tmp_path / "sample"
    sample.mkdir()
    build_deps.start(tmp_path / "b", ["vllm"], commands={"vllm": [PY, "-c", build_script]})
    env = {**os.environ, build_deps.ENV_DIR: str(tmp_path / "b"), "SAMPLE_DIR": str(sample)}
    return subprocess.run([PY, "-m", "pytest", "-v", "-p", "no:cacheprovider", "--timeout", "2",
                           "--basetemp", str(tmp_path / "inner"), str(ROOT / "tests/packaging/gated_sample.py")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_a_gated_test_runs_last_and_waits_for_its_build_outside_its_timeout(tmp_path):
    # The build starts only once the ungated test has run, then takes longer than the 2 s timeout.
    script = (f"import pathlib,time\nd=pathlib.Path({str(tmp_path / 'sample')!r})\n"
              "while not (d/'go').exists(): time.sleep(0.05)\ntime.sleep(4)\n(d/'built').write_text('done')")
    res = _pytest_sample(tmp_path, script)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert out.index("test_needs_no_build PASSED") < out.index("test_gated_on_the_vllm_build PASSED")
    assert "waiting for the background vllm build" in out
    assert "background build vllm: exit 0" in out


def test_a_failed_build_fails_the_tests_that_need_it_and_no_others(tmp_path):
    res = _pytest_sample(tmp_path, "print('pip: no space left'); raise SystemExit(1)")
    out = res.stdout + res.stderr
    assert res.returncode == 1, out
    assert "test_needs_no_build PASSED" in out
    assert "test_gated_on_the_vllm_build ERROR" in out
    assert "needs the background build vllm: exit 1" in out
