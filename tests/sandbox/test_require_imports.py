"""--require-imports: a server whose packages an execution cannot import refuses to start, naming
the directory the execution cannot see.

The hidden case is built for real: a venv (``python -m venv --symlinks`` made by hand: a
``pyvenv.cfg`` and a link to the system interpreter, which has no venv module here) under the
test's temporary directory, itself under /tmp, with one package in its site-packages and a
``.pth`` file putting a checkout beside it on ``sys.path``, as ``pip install -e`` does. The
execution's mount namespace hides /tmp and shows the venv again (the interpreter's prefix), not
the checkout. The deployed server runs as an unprivileged uid with the tests' bubblewrap.
"""

import os
import subprocess
import sys

import pytest

import bubblewrap
from sandbox_helpers import DEPLOYED_UID, TEST_ARGS, run
from wmrl_sandbox import imports
from wmrl_sandbox.local import LocalServer

UID = DEPLOYED_UID + 50
SYSTEM_PYTHON = "/usr/bin/python3"


@pytest.fixture(scope="module")
def layout(tmp_path_factory):
    """(base, venv python, checkout): ``visible_pkg`` in the venv, ``hidden_pkg`` in the checkout."""
    base = tmp_path_factory.mktemp("require-imports")
    for directory in (base, base.parent, base.parent.parent):
        os.chmod(directory, 0o755)
    version = subprocess.run([SYSTEM_PYTHON, "-c", "import sys; print('python%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    venv = base / "venv"
    (venv / "bin").mkdir(parents=True)
    os.symlink(SYSTEM_PYTHON, venv / "bin" / "python3")
    (venv / "pyvenv.cfg").write_text(f"home = {os.path.dirname(SYSTEM_PYTHON)}\n"
                                     "include-system-site-packages = false\n")
    site = venv / "lib" / version / "site-packages"
    (site / "visible_pkg").mkdir(parents=True)
    (site / "visible_pkg" / "__init__.py").write_text("WHERE = 'venv'\n")
    checkout = base / "checkout"
    (checkout / "hidden_pkg").mkdir(parents=True)
    (checkout / "hidden_pkg" / "__init__.py").write_text("WHERE = 'checkout'\n")
    (site / "__editable__.hidden_pkg.pth").write_text(f"{checkout}\n")
    for root, dirs, files in os.walk(base):  # readable by the server's uid (never through the link out)
        for name, mode in [(d, 0o755) for d in dirs] + [(f, 0o644) for f in files]:
            if not os.path.islink(os.path.join(root, name)):
                os.chmod(os.path.join(root, name), mode)
    work = base / "work"
    work.mkdir()
    os.chown(work, UID, UID)
    python = str(venv / "bin" / "python3")
    # Outside the sandbox this interpreter imports both.
    assert subprocess.run([python, "-c", "import visible_pkg, hidden_pkg"]).returncode == 0
    return base, python, checkout


def _command(layout, *args: str) -> tuple[list[str], str]:
    base, python, _ = layout
    setpriv = ["setpriv", "--reuid", str(UID), "--regid", str(UID), "--clear-groups"]
    return setpriv + [sys.executable, "-m", "wmrl.cli", "sandbox", "serve", "--host", "127.0.0.1", "--port", "0",
                      "--work-root", str(base / "work"), "--python", python, "--bwrap", bubblewrap.copy_for(base),
                      *TEST_ARGS, *args], str(base / "work")


def _refused(layout, *args: str) -> subprocess.CompletedProcess:
    command, _ = _command(layout, *args)
    done = subprocess.run(command, capture_output=True, text=True, timeout=180)
    assert done.returncode == 2 and "listening" not in done.stdout, done.stdout + done.stderr
    return done


def test_a_package_the_isolation_hides_keeps_the_server_from_starting(layout):
    """Warm starts on (the default): a fork server reads its libraries from every sys.path directory,
    so a warm execution would import it; the check runs cold, where the mount namespace decides."""
    _, python, checkout = layout
    done = _refused(layout, "--require-imports", "visible_pkg, hidden_pkg")
    said = done.stderr
    assert f"self-check failed: hidden_pkg does not import inside an execution (--require-imports) with {python}" in said
    assert "ModuleNotFoundError: No module named 'hidden_pkg'" in said
    assert f"outside the sandbox {python} imports it from {checkout}, a directory an execution cannot see" in said
    assert "visible_pkg" not in said.split("with", 1)[0]  # the one it sees is not blamed


def test_a_package_not_installed_at_all_is_named_as_such(layout):
    done = _refused(layout, "--no-warm", "--require-imports", "no_such_module_here")
    assert "no_such_module_here: ModuleNotFoundError" in done.stderr
    assert f"it does not import outside the sandbox either (not found): install it for {layout[1]}" in done.stderr


def test_packages_an_execution_sees_let_it_start(layout):
    command, work = _command(layout, "--no-warm", "--require-imports", "visible_pkg,json")
    prefix = tuple(command[:command.index(sys.executable)])
    args = tuple(command[command.index("--python"):])
    with LocalServer(slots=1, work_root=work, prefix=prefix, args=args) as server:
        assert server.healthz()["isolation"]["mode"] == "namespaces"
        assert run(server, "import visible_pkg\nprint(visible_pkg.WHERE)")["run_result"]["stdout"] == "venv\n"
        # The other really is hidden from a cold execution: what the refusal above was about.
        hidden = run(server, "import hidden_pkg")
        assert "No module named 'hidden_pkg'" in hidden["run_result"]["stderr"]


def test_a_root_server_checks_the_scientific_stack_in_a_cold_execution():
    """Root mode, the venv's interpreter under /root (closed to the slot uids): the stack imports."""
    with LocalServer(slots=1, args=TEST_ARGS + ("--require-imports", "numpy,pandas,scipy,sklearn")) as server:
        assert server.healthz()["status"] == "ok"


def test_the_list_is_checked_for_module_names():
    assert imports.parse(" numpy, sklearn.linear_model ,") == ("numpy", "sklearn.linear_model")
    assert imports.parse(None) == () and imports.parse("") == ()
    with pytest.raises(ValueError, match="'num py' is not a module name"):
        imports.parse("num py")


def test_the_diagnosis_tells_hidden_from_missing_from_broken():
    outside = {"modules": {"a": {"origin": "/tmp/src/a/__init__.py", "entry": "/tmp/src"},
                           "b": {"error": "not found"},
                           "c": {"origin": "/usr/lib/c.py", "entry": "/usr/lib"}}}
    said = imports.diagnose("/v/bin/python", {"a": "ModuleNotFoundError: x", "b": "ModuleNotFoundError: y",
                                              "c": "ImportError: libfoo.so"},
                            outside, {"/tmp/src": False, "/tmp/src/a/__init__.py": False, "/usr/lib": True,
                                      "/usr/lib/c.py": True})
    assert said.startswith("a, b, c do not import inside an execution (--require-imports) with /v/bin/python:")
    assert "imports it from /tmp/src, a directory an execution cannot see" in said
    assert "b: ModuleNotFoundError: y; it does not import outside the sandbox either (not found)" in said
    assert "c: ImportError: libfoo.so; outside the sandbox it is /usr/lib/c.py, which an execution sees too" in said
    assert imports.probe_paths(outside) == ["/tmp/src", "/tmp/src/a/__init__.py", "/usr/lib", "/usr/lib/c.py"]


def test_the_image_requires_its_scientific_stack():
    here = os.path.dirname(os.path.abspath(__file__))
    dockerfile = open(os.path.join(here, "..", "..", "sandbox-image", "Dockerfile")).read()
    assert "WMRL_SANDBOX_REQUIRE_IMPORTS=numpy,pandas,scipy,sklearn,xgboost,lightgbm" in dockerfile
