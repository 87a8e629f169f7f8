"""An interpreter whose environment lives under /tmp (e.g. a checkout cloned into /tmp) still runs code.

Executions get a private tmpfs over /tmp; before the fix it hid such a venv too and every
execution failed with "No such file or directory" (and a local run retried forever)."""

import os
import subprocess
import sys

import pytest

from sandbox_helpers import TEST_ARGS, run
from wmrl_sandbox.local import LocalServer
from wmrl_sandbox.preexec import interpreter_root


@pytest.mark.skipif(os.geteuid() != 0, reason="the private /tmp is a root-mode isolation (mount namespace)")
def test_a_venv_under_tmp_is_visible_to_executions_and_the_rest_of_tmp_is_not(tmp_path):
    assert str(tmp_path).startswith("/tmp/")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    assert interpreter_root(python) == str(venv)
    secret = tmp_path / "not-for-executions.txt"
    secret.write_text("x")
    code = ("import os, sys\n"
            f"print(sys.prefix)\n"
            f"print(os.path.exists({str(secret)!r}))\n")
    with LocalServer(slots=1, args=(*TEST_ARGS, "--python", python)) as server:
        res = run(server, code)
    assert res["status"] == "Success", res
    assert res["run_result"]["stdout"].split() == [str(venv), "False"]


@pytest.mark.skipif(os.geteuid() != 0, reason="the private /tmp is a root-mode isolation (mount namespace)")
def test_packages_beside_an_installed_sandbox_import_in_warm_executions(tmp_path):
    """In an image the sandbox package is installed in the interpreter's site-packages, beside numpy
    and the rest: the fork server once dropped that directory from its path with the one its boot
    line inserts, so every warm execution failed `import numpy` (seen on a real node)."""
    import shutil

    import wmrl_sandbox

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          capture_output=True, text=True, check=True).stdout.strip()
    shutil.copytree(os.path.dirname(wmrl_sandbox.__file__), os.path.join(site, "wmrl_sandbox"))
    with open(os.path.join(site, "wmrl_probe_beside.py"), "w") as f:
        f.write("ANSWER = 42\n")
    # The server imports this installed copy, so the fork server's boot line inserts `site` itself.
    env = {"PYTHONPATH": os.pathsep.join([site, os.environ.get("PYTHONPATH", "")])}
    with LocalServer(slots=1, args=(*TEST_ARGS, "--python", python), env=env) as server:
        assert server.healthz()["warm"]["ready"] == 1
        res = run(server, "import sys, wmrl_probe_beside\nprint(wmrl_probe_beside.ANSWER, 'wmrl_sandbox.warm' in sys.modules)")
    assert res["status"] == "Success", res["run_result"]["stderr"]
    assert res["run_result"]["stdout"].split() == ["42", "True"]
