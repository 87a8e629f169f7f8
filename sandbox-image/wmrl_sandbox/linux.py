"""The Linux calls the sandbox makes through libc: namespaces, mounts, capabilities, uids, pidfds.

The standard library has no ``unshare``, ``mount``, ``capget``/``capset`` or most ``prctl``
options, so they are called through ctypes here, with the kernel's constants under their own
names (linux/sched.h, linux/mount.h, linux/prctl.h). This module imports nothing from the
package: every other module of it may use it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import selectors
from typing import Optional

libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)

# unshare(2) and setns(2) namespace flags (linux/sched.h).
CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

# mount(2) flags (linux/mount.h).
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18

# prctl(2) options (linux/prctl.h).
PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_KEEPCAPS = 8
PR_SET_SECCOMP = 22
PR_CAPBSET_DROP = 24
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4

_LINUX_CAPABILITY_VERSION_3 = 0x20080522


def check(result: int, what: str) -> None:
    """Raise OSError (errno and its message) when a libc call returned non-zero."""
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def unshare(flags: int) -> None:
    check(libc.unshare(ctypes.c_int(flags)), f"unshare({flags:#x})")


def mount(source: Optional[str], target: str, fstype: Optional[str], flags: int, data: Optional[str]) -> None:
    enc = lambda s: s.encode() if s is not None else None  # noqa: E731
    check(libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)), f"mount({target})")


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def drop_to_uid(uid: int) -> None:
    """Become ``uid`` but keep root's capabilities until the coming execve, which drops them all.

    Like setpriv(1): the interpreter is looked up with root's file access (it may live under a
    directory only root can traverse, e.g. a venv of /root/.pyenv here), then execve of a file
    without file capabilities by a non-root uid clears every capability set (inheritable and
    ambient are empty), so the program itself runs with none.
    """
    if libc.prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_KEEPCAPS)")
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    if libc.capget(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capget")
    for d in data:
        d.effective = d.permitted
        d.inheritable = 0
    if libc.capset(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capset")


def clear_capabilities() -> None:
    """Empty every capability set of this process (a warm execution has no ``execve`` to do it) and check."""
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()  # all zero
    if libc.capset(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capset")
    if libc.prctl(PR_SET_KEEPCAPS, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_KEEPCAPS)")
    with open("/proc/self/status") as fh:
        held = {k: v.strip() for k, v in (line.split(":", 1) for line in fh) if k in ("CapEff", "CapPrm", "CapInh")}
    if any(int(v, 16) for v in held.values()):
        raise RuntimeError(f"capabilities left after clearing them: {held}")


def pidfd_exited(pidfd: int, timeout: float = 0.0) -> bool:
    """Whether the process behind ``pidfd`` has exited, waiting up to ``timeout`` seconds for it
    (a pidfd is readable once its process has exited)."""
    with selectors.DefaultSelector() as sel:
        sel.register(pidfd, selectors.EVENT_READ)
        return bool(sel.select(timeout))


def set_child_subreaper() -> bool:
    """Make orphans of executions re-parent to this server (so it can reap them) instead of PID 1."""
    return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


__all__ = [
    "CLONE_NEWCGROUP", "CLONE_NEWIPC", "CLONE_NEWNET", "CLONE_NEWNS", "CLONE_NEWPID", "CLONE_NEWUSER", "CLONE_NEWUTS",
    "MS_BIND", "MS_NODEV", "MS_NOEXEC", "MS_NOSUID", "MS_PRIVATE", "MS_RDONLY", "MS_REC", "MS_REMOUNT",
    "PR_CAPBSET_DROP", "PR_CAP_AMBIENT", "PR_CAP_AMBIENT_CLEAR_ALL", "PR_SET_CHILD_SUBREAPER", "PR_SET_DUMPABLE",
    "PR_SET_KEEPCAPS", "PR_SET_NO_NEW_PRIVS", "PR_SET_PDEATHSIG", "PR_SET_SECCOMP",
    "check", "clear_capabilities", "drop_to_uid", "libc", "mount", "pidfd_exited", "set_child_subreaper", "unshare",
]
