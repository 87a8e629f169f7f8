"""Deployed (non-root) mode: every execution in namespaces of its own, through bubblewrap.

The image runs the server as a non-root uid, which can neither give an execution a uid of its
own nor create namespaces directly. Unprivileged user namespaces can, and bubblewrap (``bwrap``,
from the distribution's packages; no setuid bit needed) is the well-kept tool that sets them up.
Each execution gets:

* new user (mapped to uid 1000 inside, no capabilities, no further user namespaces), PID, network
  (only its own loopback), mount, IPC, UTS and cgroup namespaces; its processes die with it
  (``--die-with-parent``: when the server kills bwrap, the namespace's first process dies, and
  with it every process of the PID namespace, daemons included);
* the filesystem read-only, with fresh tmpfs over /tmp, /var/tmp and /dev/shm, the work root of
  every execution hidden under an empty tmpfs except its own directory (read-write), and a
  /proc of its own PID namespace: nothing of the server or of another execution is visible;
* a new session (no controlling terminal to inject into), ``no_new_privs`` and the seccomp
  filter of :mod:`wmrl_sandbox.seccomp`.

Resource limits (rlimits) are set by the server before bwrap starts and are inherited.
"""

from __future__ import annotations

import os
import shutil
from typing import Iterable, Optional

INSIDE_UID = 1000
BWRAP_ENV = "WMRL_BWRAP"  # where bwrap is when it is not on PATH (the tests' cached copy)


def find_bwrap() -> Optional[str]:
    return os.environ.get(BWRAP_ENV) or shutil.which("bwrap")


def bwrap_command(bwrap: str, *, workdir: str, work_root: str, seccomp_fd: int, info_fd: int,
                  visible: Iterable[str] = (), hidden: Iterable[str] = (), tmpfs_bytes: int = 256 << 20) -> list[str]:
    """bwrap's arguments up to and including ``--`` (the program's command line follows).

    bwrap writes ``{"child-pid": N}`` to ``info_fd`` once the namespaces exist: N is the PID
    namespace's first process as the server sees it, whose death ends every process in it.

    ``visible``: read-only paths bound back after the tmpfs mounts (the interpreter's root when
    it lives under /tmp); ``hidden``: directories masked by an empty tmpfs (the server's home,
    service account tokens).
    """
    args = [bwrap, "--unshare-all", "--unshare-user", "--disable-userns", "--uid", str(INSIDE_UID), "--gid",
            str(INSIDE_UID), "--hostname", "sandbox", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
            "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev"]
    for directory in ("/tmp", "/var/tmp", "/dev/shm"):
        args += ["--size", str(tmpfs_bytes), "--perms", "1777", "--tmpfs", directory]
    for directory in (*hidden, work_root):
        if os.path.isdir(directory):
            args += ["--tmpfs", directory]
    for path in visible:
        args += ["--ro-bind", path, path]
    args += ["--bind", workdir, workdir, "--chdir", workdir, "--seccomp", str(seccomp_fd), "--info-fd", str(info_fd),
             "--"]
    return args
