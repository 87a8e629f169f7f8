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

Warm starts (:mod:`wmrl_sandbox.warm`) cannot use bwrap, which only starts a new program: a
fork server's child builds the same namespaces itself with :func:`enter`, then limits, clears
its capabilities and loads the same seccomp filter before the program runs.
"""

from __future__ import annotations

import ctypes
import json
import os
import select
import signal
from typing import Iterable, Optional

from wmrl_sandbox.devices import bind as bind_device_nodes
from wmrl_sandbox.devices import bwrap_args as device_args

from wmrl_sandbox.linux import (CLONE_NEWCGROUP, CLONE_NEWIPC, CLONE_NEWNET, CLONE_NEWNS, CLONE_NEWPID,
                                CLONE_NEWUSER, CLONE_NEWUTS, MS_BIND, MS_NODEV, MS_NOEXEC, MS_NOSUID, MS_PRIVATE,
                                MS_RDONLY, MS_REC, MS_REMOUNT, PR_CAPBSET_DROP, PR_CAP_AMBIENT,
                                PR_CAP_AMBIENT_CLEAR_ALL, PR_SET_PDEATHSIG, check, libc, mount, unshare)

INSIDE_UID = 1000


def bwrap_command(bwrap: str, *, workdir: str, work_root: str, seccomp_fd: int, info_fd: int,
                  visible: Iterable[str] = (), hidden: Iterable[str] = (), tmpfs_bytes: int = 256 << 20,
                  data: Optional[tuple[list[str], list[str]]] = None, devices: tuple[str, ...] = ()) -> list[str]:
    """bwrap's arguments up to and including ``--`` (the program's command line follows).

    bwrap writes ``{"child-pid": N}`` to ``info_fd`` once the namespaces exist: N is the PID
    namespace's first process as the server sees it, whose death ends every process in it.

    ``visible``: read-only paths bound back after the tmpfs mounts (the interpreter's root when
    it lives under /tmp); ``hidden``: directories masked by an empty tmpfs (the server's home,
    service account tokens). ``data``: the task data mount's arguments
    (:func:`wmrl_sandbox.data_mount.bwrap_args`): the tasks directory hidden with the other masks,
    the public directory bound read-only after the working directory. ``devices``: device nodes
    (``--device``, :mod:`wmrl_sandbox.devices`) bound at their own paths, after every mask.
    """
    args = [bwrap, "--unshare-all", "--unshare-user", "--disable-userns", "--uid", str(INSIDE_UID), "--gid",
            str(INSIDE_UID), "--hostname", "sandbox", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
            "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev"]
    for directory in ("/tmp", "/var/tmp", "/dev/shm"):
        args += ["--size", str(tmpfs_bytes), "--perms", "1777", "--tmpfs", directory]
    for directory in (*hidden, work_root):
        if os.path.isdir(directory):
            args += ["--tmpfs", directory]
    if data is not None:
        args += data[0]
    for path in visible:
        args += ["--ro-bind", path, path]
    args += ["--bind", workdir, workdir]
    if data is not None:
        args += data[1]
    args += device_args(devices)
    args += ["--chdir", workdir, "--seccomp", str(seccomp_fd), "--info-fd", str(info_fd), "--"]
    return args


# --------------------------------------------------------------------------- warm starts: the same, in-process

_ST_TO_MS = ((os.ST_NOSUID, MS_NOSUID), (os.ST_NODEV, MS_NODEV), (os.ST_NOEXEC, MS_NOEXEC))
_AT_FDCWD, _AT_RECURSIVE = -100, 0x8000
_MOUNT_ATTR_RDONLY = 0x1
_SYS_MOUNT_SETATTR = 442  # the same number on every architecture (one table for syscalls added since 5.1)


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64), ("propagation", ctypes.c_uint64),
                ("userns_fd", ctypes.c_uint64)]


def _locked_flags(path: str) -> int:
    """nosuid/nodev/noexec of the mount at ``path``: a remount in a user namespace must keep them."""
    flags = os.statvfs(path).f_flag
    return sum(ms for st, ms in _ST_TO_MS if flags & st)


def _bind(fd: int, path: str, read_only: bool) -> None:
    """Bind the directory open as ``fd`` (taken before anything was hidden) at ``path``."""
    os.makedirs(path, exist_ok=True)
    mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC, None)
    mount(None, path, None, MS_REMOUNT | MS_BIND | (MS_RDONLY if read_only else 0) | _locked_flags(path), None)


_DEVICES = ("null", "zero", "full", "random", "urandom", "tty")


def _minimal_dev(devices: list[tuple[str, int]]) -> None:  # pragma: no cover - in a fork server's child
    """A /dev of its own, as bwrap's ``--dev``: only the harmless nodes (``devices``: opened before),
    the usual links and an empty /dev/shm; no pty of the container (a ``kubectl exec`` terminal)."""
    mount("tmpfs", "/dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "size=64k,mode=0755")
    for name, fd in devices:
        open(f"/dev/{name}", "w").close()
        mount(f"/proc/self/fd/{fd}", f"/dev/{name}", None, MS_BIND, None)
        os.close(fd)
    for link, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):
        os.symlink(target, f"/dev/{link}")
    os.mkdir("/dev/shm")


def _write(path: str, text: str) -> None:
    with open(path, "w") as fh:
        fh.write(text)


def _drop_capabilities() -> None:
    """In its own user namespace the process holds every capability there: drop them all, for good."""
    last = int(open("/proc/sys/kernel/cap_last_cap").read())
    for cap in range(last + 1):
        check(libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), f"prctl(PR_CAPBSET_DROP, {cap})")
    check(libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "prctl(PR_CAP_AMBIENT_CLEAR_ALL)")


def _exit_code(status: int) -> int:
    """bwrap's exit code for a child's wait ``status``: its exit code, or 128 + the signal that killed it."""
    return 128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.waitstatus_to_exitcode(status) & 0xFF


def _init(program: int, report: int) -> None:  # pragma: no cover - PID 1 of an execution's namespace
    """PID 1: reap every process the namespace orphans; when the program ends, report its wait status
    and exit, which ends every process left in the namespace (as bwrap's init does)."""
    for descriptor in (0, 1, 2):  # the execution's pipes: only the program and its own processes hold them
        os.close(descriptor)
    while True:
        pid, status = os.wait()
        if pid == program:
            os.write(report, str(status).encode())
            os._exit(0)


def enter(*, workdir: str, work_root: str, info_fd: int, visible: Iterable[str] = (), hidden: Iterable[str] = (),
          tmpfs_bytes: int = 256 << 20, data: Optional[list[str]] = None,
          devices: Iterable[str] = ()) -> None:  # pragma: no cover - runs in a fork server's child
    r"""Make, in this process, what :func:`bwrap_command` makes for a cold execution.

    Three processes, as with bwrap: this one ``unshare``\s new user, PID, network, mount, IPC, UTS
    and cgroup namespaces and forks the namespace's PID 1, which sets up the mounts (everything
    read-only, its own /proc, fresh tmpfs over /tmp, /var/tmp and /dev/shm, the work root and
    ``hidden`` masked, ``workdir`` bound back read-write and ``visible`` read-only; with ``data``,
    :class:`wmrl_sandbox.data_mount.DataMount`'s JSON, the tasks directory masked too and the public
    directory bound read-only at its target; ``devices`` bound at their own paths last), dies with its
    parent, and forks the program's process (PID 2, uid :data:`INSIDE_UID`, a session of its own).
    Only that one returns; the caller then clears its capabilities and loads the seccomp filter.
    PID 1 stays the namespace's reaper (a process that is PID 1 would ignore its own signals).

    This process never returns: it writes ``{"child-pid": N}`` (PID 1's pid here) to ``info_fd``,
    bwrap's protocol, so the server ends the namespace as it ends bwrap's, then exits as bwrap
    does: with the program's exit code, or 128 + the signal that killed it.
    """
    uid, gid = os.getuid(), os.getgid()
    unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWPID | CLONE_NEWCGROUP)
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", f"{INSIDE_UID} {uid} 1")
    _write("/proc/self/gid_map", f"{INSIDE_UID} {gid} 1")
    parent_alive, parent_holds = os.pipe()
    report_read, report_write = os.pipe()
    pid = os.fork()
    if pid:
        os.close(parent_alive)
        os.close(report_write)
        for descriptor in (0, 1, 2):
            os.close(descriptor)
        os.write(info_fd, json.dumps({"child-pid": pid}).encode())
        os.close(info_fd)
        reported = b""
        while chunk := os.read(report_read, 64):
            reported += chunk
        _, status = os.waitpid(pid, 0)
        # As bwrap exits (a cold execution's answer); PID 1 killed (timeout, server): by its own status.
        os._exit(_exit_code(int(reported) if reported else status))
    os.close(parent_holds)
    os.close(report_read)
    os.close(info_fd)
    check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PR_SET_PDEATHSIG)")
    if select.select([parent_alive], [], [], 0)[0]:  # end of file: the parent died before PDEATHSIG was set
        os._exit(137)
    os.close(parent_alive)
    mount(None, "/", None, MS_REC | MS_PRIVATE, None)
    # Opened in this mount namespace (a bind's source must be in it), before anything is hidden.
    keep = [(path, os.open(path, os.O_PATH | os.O_DIRECTORY), True) for path in dict.fromkeys(visible)]
    keep.append((workdir, os.open(workdir, os.O_PATH | os.O_DIRECTORY), False))
    masks = [*hidden, work_root]
    if data is not None:
        source, target, hide = data
        masks.append(hide)
        if source is not None:
            keep.append((target, os.open(source, os.O_PATH | os.O_DIRECTORY), True))  # after its parent, workdir
    given = [(path, os.open(path, os.O_PATH)) for path in dict.fromkeys(devices)]  # --device, bound last
    devices = [(name, os.open(f"/dev/{name}", os.O_PATH)) for name in _DEVICES if os.path.exists(f"/dev/{name}")]
    attr = _MountAttr(_MOUNT_ATTR_RDONLY, 0, 0, 0)
    check(libc.syscall(_SYS_MOUNT_SETATTR, _AT_FDCWD, b"/", _AT_RECURSIVE, ctypes.byref(attr), ctypes.sizeof(attr)),
          "mount_setattr(/, read-only)")
    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)
    _minimal_dev(devices)
    for directory in ("/tmp", "/var/tmp", "/dev/shm"):
        if os.path.isdir(directory):
            mount("tmpfs", directory, "tmpfs", MS_NOSUID | MS_NODEV, f"size={tmpfs_bytes},mode=1777")
    for directory in masks:
        if os.path.isdir(directory):
            mount("tmpfs", directory, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
    for path, fd, read_only in keep:
        _bind(fd, path, read_only)
        os.close(fd)
    bind_device_nodes(given)
    libc.sethostname(b"sandbox", 7)
    _drop_capabilities()
    program = os.fork()
    if program:
        _init(program, report_write)
    os.close(report_write)
    os.setsid()
