"""The self-test when the server is PID 1 of its PID namespace, as it is in a container.

The launcher is ``unshare --pid --fork --mount-proc`` (real namespaces, from root), then setpriv
to an unprivileged uid, so the server runs as the image runs it: PID 1, non-root. An execution
in a PID namespace of its own has a PID 1 of its own too, so a probe that signalled "the
server's pid" would reach its own init there and report the server reachable; the self-test
must hold in the deployed mode, and must still fail where executions really can signal the
server (``--isolation restricted``: no namespaces of their own).
"""

import os
import select
import signal

import pytest

import bubblewrap
from sandbox_helpers import DEPLOYED_UID, run
from wmrl_sandbox.local import LocalServer

UID = DEPLOYED_UID + 40


class _PidOneServer(LocalServer):
    """A server under ``unshare --fork``: ``proc`` is unshare and the server is its one child, which
    closing must end too. SIGTERM to unshare reaches the server through ``--kill-child`` (the parent
    death signal, which setpriv's change of uid would clear but for ``--pdeathsig keep``); closing
    then waits for the server itself, and SIGKILLs it (``needed_kill``) if that did not stop it."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with open(f"/proc/{self.pid}/task/{self.pid}/children") as fh:
            self.server_pid = int(fh.read().split()[0])  # unshare's one child: the server (setpriv exec'd it)
        self._server = os.pidfd_open(self.server_pid)
        self.needed_kill = False

    def server_exited(self, timeout: float = 0.0) -> bool:
        return bool(select.select([self._server], [], [], timeout)[0])

    def close(self) -> None:
        super().close()
        if getattr(self, "_server", None) is None:  # not started (LocalServer closes a failed start), or closed
            return
        try:
            if not self.server_exited(timeout=10):
                self.needed_kill = True
                signal.pidfd_send_signal(self._server, signal.SIGKILL)
                self.server_exited(timeout=10)
        finally:
            os.close(self._server)
            self._server = None


def _as_pid_one(tmp_path_factory, name: str, *args: str) -> _PidOneServer:
    base = tmp_path_factory.mktemp(name)
    for directory in (base, base.parent, base.parent.parent):
        os.chmod(directory, 0o755)
    work = base / "work"
    work.mkdir()
    os.chown(work, UID, UID)
    # --kill-child: the server (PID 1) gets the SIGTERM that stops unshare, and its namespace ends with it;
    # setpriv --pdeathsig keep: its change of uid would otherwise clear that signal (a server left running).
    prefix = ("unshare", "--pid", "--fork", "--mount-proc", "--kill-child=SIGTERM",
              "setpriv", "--reuid", str(UID), "--regid", str(UID), "--clear-groups", "--pdeathsig", "keep")
    return _PidOneServer(slots=1, work_root=str(work), prefix=prefix,
                         args=("--python", "/usr/bin/python3", *args, "--bwrap", bubblewrap.copy_for(base)))


def _server_pid_inside(server: _PidOneServer) -> int:
    """The server's pid as its own PID namespace numbers it (the last NSpid field)."""
    with open(f"/proc/{server.server_pid}/status") as fh:
        fields = dict(line.split(":", 1) for line in fh if ":" in line)
    return int(fields["NSpid"].split()[-1])


@pytest.mark.parametrize("warm", ["--warm", "--no-warm"])
def test_the_self_test_holds_for_a_deployed_server_that_is_pid_one(tmp_path_factory, warm):
    with _as_pid_one(tmp_path_factory, "pid-one-deployed", "--require-isolation", warm) as server:
        assert _server_pid_inside(server) == 1
        health = server.healthz()
        assert health["isolation"]["mode"] == "namespaces"
        assert health["layers"] and all(health["layers"].values()), health["layers"]
        # The execution's own PID 1 is not the server: signalling it changes nothing out here.
        res = run(server, "import os, signal\nos.kill(1, signal.SIGTERM)\nprint('still here')")
        assert res["run_result"]["stdout"] == "still here\n"
        assert server.healthz()["status"] == "ok"
    assert not server.needed_kill  # closing stopped the server with SIGTERM: nothing left running


def test_the_self_test_still_fails_where_an_execution_can_signal_a_pid_one_server(tmp_path_factory):
    with _as_pid_one(tmp_path_factory, "pid-one-restricted", "--isolation", "restricted") as server:
        assert _server_pid_inside(server) == 1
        layers = server.healthz()["layers"]
        assert layers["signal_server"] is False and layers["reach_server"] is False
        assert layers["seccomp"] and layers["no_new_privs"]  # what needs no namespace still holds
        # And it is true: an execution here can name the server, which is PID 1 in both their views.
        res = run(server, "import os\nprint(open('/proc/1/cmdline').read().split(chr(0))[2:5])")
        assert "wmrl.cli" in res["run_result"]["stdout"]
    assert not server.needed_kill
