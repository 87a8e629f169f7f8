"""The server's self-test at start: one probe program run exactly as a client's program runs.

Each layer is checked by what it must prevent, from inside an execution, not by which
mechanism the server believes it set up:

* ``signal_server``: the program cannot signal the server process;
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
import socket
import sys
import tempfile
from typing import Callable

from wmrl_sandbox import seccomp

LAYERS = ("signal_server", "reach_server", "see_other_executions", "see_planted_files", "capabilities",
          "no_new_privs", "seccomp", "user_namespaces")
PLANTED_DIRS = ("/tmp", "/var/tmp", "/dev/shm")

PROBE = r'''
import ctypes, errno, json, os, socket, sys
server_pid, port, secret, numbers, planted = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], json.loads(sys.argv[4]), sys.argv[5:]
libc = ctypes.CDLL(None, use_errno=True)
out = {}
try:
    os.kill(server_pid, 0)
    out["signal_server"] = False
except OSError:
    out["signal_server"] = True
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
    ``work_root``, and opens a loopback listener first; removes them afterwards. A probe that fails to run reports every layer as not holding.
    """
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
    try:
        stdout, stderr = execute(PROBE, [str(os.getpid()), str(listener.getsockname()[1]), secret,
                                         json.dumps(seccomp.syscall_numbers()), *planted])
        try:
            found = json.loads(stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            print(f"sandbox self-test: the probe failed: {stderr.strip()[-2000:]}", file=sys.stderr)
            found = {}
        return {layer: bool(found.get(layer, False)) for layer in LAYERS}
    finally:
        listener.close()
        shutil.rmtree(other, ignore_errors=True)
        for path in planted:
            try:
                os.unlink(path)
            except OSError:
                pass
