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
