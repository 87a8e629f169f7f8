"""What an execution's processes die with, and which process the server may signal.

* A warm execution dies with its fork server: when the server gives up on one (it killed it
  after a spawn that failed half-way, or it died), the execution must not run on unwatched,
  in root mode or in the deployed mode, where no cleanup by uid or environment marker sees it.
* The server signals a PID namespace's first process through a pidfd; the pid it reads from
  bubblewrap's (or a warm child's) info pipe may have been reaped and reused by the time it
  opens one, and then that pidfd must not be kept.
* ``no_new_privs`` holds for every execution, also where the seccomp filter is not available.

Real servers, real processes, real pipes; the servers start as other users, so these need root.
"""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from sandbox_helpers import DEPLOYED_UID, TEST_ARGS, assert_contained, execution_processes, run, start_server
from wmrl_sandbox.executor import ExecutionRequest, _namespace_init, execute
from wmrl_sandbox.isolation import Isolation


@pytest.fixture(scope="module", params=["root", "deployed"])
def warm_server(request, tmp_path_factory):
    with start_server(request.param, tmp_path_factory, uid=DEPLOYED_UID + 20,
                      args=TEST_ARGS + ("--require-isolation",)) as srv:
        assert srv.healthz()["warm"]["ready"] == 1
        yield srv


def test_a_warm_execution_dies_with_its_fork_server(warm_server):
    [zygote] = warm_server.healthz()["warm"]["pids"]
    answer = {}
    request = threading.Thread(target=lambda: answer.update(
        run(warm_server, "import time\ntime.sleep(120)", run_timeout=60, timeout=120)))
    request.start()
    deadline = time.monotonic() + 60
    while not execution_processes(warm_server):
        assert request.is_alive() and time.monotonic() < deadline, answer
        time.sleep(0.05)
    os.kill(zygote, signal.SIGKILL)
    request.join(90)
    assert not request.is_alive()
    # Ended by its fork server's death (killed: the run finished, with a signal), not by the time limit.
    assert answer["run_result"]["status"] == "Finished", answer
    assert answer["run_result"]["return_code"] == -signal.SIGKILL, answer
    assert_contained(warm_server)  # its next execution runs cold, and starts a new fork server
    deadline = time.monotonic() + 120
    while warm_server.healthz()["warm"]["ready"] != 1:
        assert time.monotonic() < deadline, warm_server.healthz()["warm"]
        time.sleep(0.2)


def _info_pipe(pid: int) -> int:
    read, write = os.pipe()
    os.write(write, json.dumps({"child-pid": pid}).encode())
    os.close(write)
    return read


def test_the_namespace_pidfd_is_kept_for_the_parents_live_child():
    child = subprocess.Popen(["sleep", "60"])
    info = _info_pipe(child.pid)
    try:
        pidfd = _namespace_init(info, parent=os.getpid())
        assert pidfd is not None
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        os.close(pidfd)
        assert child.wait(30) == -signal.SIGKILL
    finally:
        os.close(info)
        child.kill()
        child.wait()


def test_a_pid_that_is_not_the_parents_child_is_never_kept():
    """As if the namespace's first process had been reaped and its pid given to another process:
    here a grandchild, whose parent is not the one named."""
    shell = subprocess.Popen(["sh", "-c", "sleep 60 & echo $!; wait"], stdout=subprocess.PIPE, text=True)
    grandchild = int(shell.stdout.readline())
    info = _info_pipe(grandchild)
    try:
        assert _namespace_init(info, parent=os.getpid()) is None
        os.kill(grandchild, 0)  # never signalled: still alive
    finally:
        os.close(info)
        shell.kill()
        os.kill(grandchild, signal.SIGKILL)
        shell.wait()


def test_an_exited_first_process_is_not_kept():
    child = subprocess.Popen(["true"])
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped: its pid is still its own
    info = _info_pipe(child.pid)
    try:
        assert _namespace_init(info, parent=os.getpid()) is None
    finally:
        os.close(info)
        child.wait()


def test_no_new_privs_holds_without_the_seccomp_filter(tmp_path: Path):
    code = ("status = dict(l.split(':', 1) for l in open('/proc/self/status').read().splitlines() if ':' in l)\n"
            "print(status['NoNewPrivs'].strip(), status['Seccomp'].strip())")
    result = execute(ExecutionRequest(code=code), work_root=str(tmp_path), uid=None,
                     isolation=Isolation(as_root=False, network_namespace=False, mount_namespace=False, seccomp=False),
                     python=sys.executable)
    assert result.status == "Finished" and result.return_code == 0, result
    assert result.stdout.split() == ["1", "0"]  # no_new_privs, and really no filter
