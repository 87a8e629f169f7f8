"""The server as a non-root user without namespaces: it refuses to start unless told
``--isolation restricted``, and then runs in the fallback, in which the layers that need no
privilege still hold.

Started with setpriv as an unprivileged uid. No per-execution uid or namespaces here; seccomp
and no_new_privs, the process limit, the marker-based cleanup, the scrubbed environment and the
limits remain, and /healthz says which layers do not hold. The deployed mode proper
(bubblewrap) is tested by test_hostile.py.
"""

import base64
import os
import shutil
import subprocess
import sys

import httpx
import pytest

from sandbox_helpers import SECRET, run
from wmrl_sandbox.local import LocalServer

SERVER_UID = 61999

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                                reason="needs root and setpriv to start the server as another user")


@pytest.fixture(scope="module")
def nonroot(tmp_path_factory):
    root = tmp_path_factory.mktemp("nonroot-work")
    for d in (root.parent, root.parent.parent):
        os.chmod(d, 0o755)
    os.chown(root, SERVER_UID, SERVER_UID)
    # setpriv looks the venv's interpreter up with root's access (it lives under /root here), then
    # runs as SERVER_UID; the server's children use the system interpreter, which that uid can run.
    prefix = ("setpriv", "--reuid", str(SERVER_UID), "--regid", str(SERVER_UID), "--clear-groups")
    with LocalServer(slots=1, work_root=str(root), prefix=prefix, env={"WMRL_TEST_SECRET": SECRET},
                     args=("--nproc", "32", "--memory-mb", "512", "--python", "/usr/bin/python3",
                           "--isolation", "restricted")) as srv:
        yield srv


def marker_processes() -> list[int]:
    """Live sandboxed processes of this server (other servers on the machine run as other users)."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.stat(f"/proc/{name}").st_uid != SERVER_UID:
                    continue
                with open(f"/proc/{name}/environ", "rb") as fh:
                    if b"WMRL_SANDBOX_EXECUTION=" in fh.read():
                        found.append(int(name))
            except OSError:
                pass
    return found


def _serve_as_nonroot(tmp_path, *args: str, env=None) -> subprocess.CompletedProcess:
    """``wmrl sandbox serve`` as SERVER_UID, to its exit (one that started would time out the test)."""
    for d in (tmp_path, tmp_path.parent, tmp_path.parent.parent):
        os.chmod(d, 0o755)
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    os.chown(work, SERVER_UID, SERVER_UID)
    return subprocess.run(["setpriv", "--reuid", str(SERVER_UID), "--regid", str(SERVER_UID), "--clear-groups",
                           sys.executable, "-m", "wmrl.cli", "sandbox", "serve", "--host", "127.0.0.1", "--port", "0",
                           "--work-root", str(work), "--python", "/usr/bin/python3", "--no-warm", *args],
                          capture_output=True, text=True, timeout=60, env={**os.environ, **(env or {})})


def test_without_bubblewrap_a_nonroot_server_refuses_to_start(tmp_path):
    """Fail closed: no namespaces to be had and no --isolation restricted -> exit 2, naming what is
    missing and the way out; it never falls back to unisolated executions by itself."""
    gone = tmp_path / "no-bwrap-here"
    # The kubelet's termination message file, made before the container starts: the refusal is written there.
    termination = tmp_path / "termination-log"
    termination.write_text("")
    os.chown(termination, SERVER_UID, SERVER_UID)
    done = _serve_as_nonroot(tmp_path, "--bwrap", str(gone), env={"WMRL_SANDBOX_TERMINATION_LOG": str(termination)})
    assert done.returncode == 2, done.stdout + done.stderr
    assert termination.read_text() == done.stderr.strip()
    assert termination.read_text().startswith("wmrl sandbox serve: isolation unavailable: ")
    assert f"isolation unavailable: --isolation namespaces needs bubblewrap: {gone} is not an executable file" \
        in done.stderr
    assert "--isolation restricted" in done.stderr and "listening" not in done.stdout
    # A bubblewrap that runs but cannot make the namespaces: its own words are passed on.
    missing_log = tmp_path / "no-termination-log"
    done = _serve_as_nonroot(tmp_path, "--bwrap", "/bin/false", env={"WMRL_SANDBOX_TERMINATION_LOG": str(missing_log)})
    assert not missing_log.exists()  # only the kubelet's file is written, never made (not in a Pod: none)
    assert done.returncode == 2 and "bubblewrap (/bin/false) cannot create an execution's namespaces here: exit code 1" \
        in done.stderr, done.stderr


def test_nonroot_mode_is_reported(nonroot):
    health = nonroot.healthz()
    # --isolation restricted: the fallback, with only what needs no privilege (bubblewrap not looked for).
    assert health["isolation"] == {"mode": "unisolated", "requested": "restricted", "uid_per_slot": False,
                                   "user_namespaces": False, "network_namespace": False, "mount_namespace": False,
                                   "ipc_namespace": False, "pid_namespace": False, "seccomp": True, "bwrap": None,
                                   "bwrap_error": None}
    assert any("warning: --isolation restricted: executions run without namespaces" in line for line in nonroot.log), \
        nonroot.log
    # The self-test says what does not hold (the server was not started with --require-isolation).
    assert health["layers"]["seccomp"] and health["layers"]["no_new_privs"] and health["layers"]["capabilities"]
    assert not health["layers"]["reach_server"] and not health["layers"]["see_planted_files"]
    assert not health["layers"]["signal_server"]  # the probe's SIGURG reached the server
    assert health["uids"] == []


def test_nonroot_runs_scrubbed_and_limited(nonroot):
    res = run(nonroot, "import os\nprint(os.getuid(), sorted(k for k in os.environ if 'SECRET' in k))")
    assert res["status"] == "Success" and res["run_result"]["stdout"] == f"{SERVER_UID} []\n"


def test_nonroot_daemon_and_fork_bomb_are_cleaned_up(nonroot):
    daemon = ("import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
              "        time.sleep(60)\n    os._exit(0)\nprint('main exits')\n")
    assert run(nonroot, daemon)["status"] == "Success"
    assert marker_processes() == []
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    assert run(nonroot, bomb, run_timeout=1.5)["run_result"]["status"] == "TimeLimitExceeded"
    assert marker_processes() == []
    assert nonroot.healthz()["busy"] == 0
    assert os.listdir(nonroot.work_root) == []
    assert run(nonroot, "print('next')")["run_result"]["stdout"] == "next\n"


def test_nonroot_timeout_and_memory(nonroot):
    assert run(nonroot, "while True: pass", run_timeout=1)["run_result"]["status"] == "TimeLimitExceeded"
    res = run(nonroot, "x = bytearray(10**10)")
    assert "MemoryError" in res["run_result"]["stderr"]
    assert httpx.get(f"{nonroot.url}/healthz").status_code == 200


def test_nonroot_files_import_and_fetch_stays_in_the_working_directory(nonroot, tmp_path):
    """files sit beside the program here too; fetch_files returns only what is inside the working
    directory (nested and .. paths included), since outside it nothing tells the program's files
    from the server's: an absolute path elsewhere, or one through a link out, is absent."""
    helper = base64.b64encode(b"def f(): return 1").decode()
    code = ("import helper, os\nos.makedirs('a/b')\nopen('a/b/c.txt', 'w').write(str(helper.f()))\n"
            "os.symlink('/proc/self/environ', 'env')\nos.symlink('/proc', 'procs')\nprint(os.getcwd())")
    res = run(nonroot, code, files={"helper.py": helper},
              fetch_files=["a/b/c.txt", "a/../a/b/c.txt", "env", "procs/self/environ", "/proc/self/environ",
                           "/etc/passwd", "../x"])
    assert res["status"] == "Success", res["run_result"]["stderr"]
    assert res["files"] == {"a/b/c.txt": "MQ==", "a/../a/b/c.txt": "MQ=="}
