"""The server's self-test at start: one probe program run exactly as a client's program runs.

Each layer is checked by what it must prevent, from inside an execution, not by which
mechanism the server believes it set up:

* ``signal_server``: the program cannot signal the server process. It sends SIGURG to every
  process it can name (each pid in its ``/proc``, the server's pid as the server knows it, and
  ``kill(-1)``) and the server, which catches SIGURG meanwhile, checks that none arrived. No pid is
  compared: in a PID namespace of its own the execution's pids mean nothing outside it (the server
  may be PID 1 of its container while the execution has a PID 1 of its own);
* ``reach_server``: it cannot connect to a socket the server listens on at loopback;
* ``see_other_executions``: it cannot read a file planted in the work root the way an
  execution's own files lie there (directory 0711, work directory 0700, file 0600);
* ``see_planted_files``: files planted in /tmp, /var/tmp and /dev/shm are not there;
* ``capabilities``: it holds no capability (CapEff is 0);
* ``no_new_privs``: set, so no setuid binary gains anything;
* ``seccomp``: ptrace, bpf, io_uring and keyctl fail with EPERM;
* ``user_namespaces``: it cannot create a user namespace.

:func:`run` returns ``{layer: True when it holds}``; the server reports it on /healthz and
in its log, and with ``--require-isolation`` refuses to start unless every layer holds.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import sys
import tempfile
import threading
from typing import Callable

from wmrl_sandbox import seccomp

LAYERS = ("signal_server", "reach_server", "see_other_executions", "see_planted_files", "capabilities",
          "no_new_privs", "seccomp", "user_namespaces")
PLANTED_DIRS = ("/tmp", "/var/tmp", "/dev/shm")

PROBE_SIGNAL = signal.SIGURG  # ignored by default: whatever the probe reaches besides the server is unharmed

PROBE = r'''
import ctypes, errno, json, os, signal, socket, sys
server_pid, port, secret, numbers, planted = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], json.loads(sys.argv[4]), sys.argv[5:]
libc = ctypes.CDLL(None, use_errno=True)
out = {}
named = {int(p) for p in os.listdir("/proc") if p.isdigit()} | {server_pid}
signalled = []
for pid in sorted(named - {os.getpid()}):
    try:
        os.kill(pid, signal.SIGURG)
        signalled.append(pid)
    except OSError:
        pass
try:
    os.kill(-1, signal.SIGURG)
except OSError:
    pass
out["signalled"] = signalled
try:
    socket.create_connection(("127.0.0.1", port), timeout=2).close()
    out["reach_server"] = False
except OSError:
    out["reach_server"] = True
try:
    open(secret, "rb").read()
    out["see_other_executions"] = False
except OSError:
    out["see_other_executions"] = True
out["see_planted_files"] = bool(planted) and not any(os.path.exists(p) for p in planted)  # nothing planted: unknown
status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines() if ":" in line)
out["capabilities"] = int(status.get("CapEff", "1").strip(), 16) == 0
out["no_new_privs"] = status.get("NoNewPrivs", "0").strip() == "1"
def refused(name, *args):
    return libc.syscall(numbers[name], *args) == -1 and ctypes.get_errno() == errno.EPERM
out["seccomp"] = bool(numbers) and refused("ptrace", 0, 0, 0, 0) and refused("bpf", 0, 0, 0) and \
    refused("io_uring_setup", 1, 0) and refused("keyctl", 0, 0)
out["user_namespaces"] = libc.unshare(0x10000000) != 0
print(json.dumps(out))
'''


def run(execute: Callable[[str, list[str]], tuple[str, str]], work_root: str) -> dict[str, bool]:
    """Run the probe through ``execute(code, argv) -> (stdout, stderr)`` (a normal execution).

    Plants a file in each world-writable directory and one like another execution's in
    ``work_root``, opens a loopback listener and catches :data:`PROBE_SIGNAL` first (so it must be
    called on the main thread); undoes all of it afterwards. A probe that fails to run reports
    every layer as not holding.
    """
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("the sandbox self-test must run on the main thread (it catches a signal)")
    token = secrets.token_hex(6)
    planted = []
    for directory in PLANTED_DIRS:
        if os.path.isdir(directory):
            try:
                fd, path = tempfile.mkstemp(prefix=f"wmrl-planted-{token}-", dir=directory)
                os.close(fd)
                os.chmod(path, 0o644)
                planted.append(path)
            except OSError:
                pass
    other = tempfile.mkdtemp(prefix=f"wmrl-probe-{token}-", dir=work_root)
    os.chmod(other, 0o711)
    os.mkdir(os.path.join(other, "work"), 0o700)
    secret = os.path.join(other, "work", "secret")
    with open(secret, "w") as fh:
        fh.write(token)
    os.chmod(secret, 0o600)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    received: list[int] = []
    previous = signal.signal(PROBE_SIGNAL, lambda signum, _frame: received.append(signum))
    try:
        stdout, stderr = execute(PROBE, [str(os.getpid()), str(listener.getsockname()[1]), secret,
                                         json.dumps(seccomp.syscall_numbers()), *planted])
        _run_pending_handlers()  # a signal the probe sent is pending by now: its handler runs here
        try:
            found = json.loads(stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            print(f"sandbox self-test: the probe failed: {stderr.strip()[-2000:]}", file=sys.stderr)
            found = {}
        else:
            found["signal_server"] = "signalled" in found and not received
        return {layer: bool(found.get(layer, False)) for layer in LAYERS}
    finally:
        signal.signal(PROBE_SIGNAL, previous)
        listener.close()
        shutil.rmtree(other, ignore_errors=True)
        for path in planted:
            try:
                os.unlink(path)
            except OSError:
                pass


def _run_pending_handlers() -> None:
    """Python runs a caught signal's handler on the main thread at its next check, which entering
    a Python function makes."""
