"""Which isolation this host allows, probed once when the server starts.

Root mode needs root and, for each of its namespaces (network, mount, IPC), a kernel that lets
``unshare`` make it: each is tried in a throwaway child. Non-root mode needs bubblewrap to be
able to create an execution's namespaces here (unprivileged user namespaces allowed). The
result, :class:`Isolation`, decides how every execution is isolated and is reported on /healthz.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from typing import Optional

from wmrl_sandbox import namespaces, seccomp
from wmrl_sandbox.linux import (CLONE_NEWIPC, CLONE_NEWNET, CLONE_NEWNS, MS_NODEV, MS_NOSUID, MS_PRIVATE, MS_REC, mount,
                                unshare)


@dataclass(frozen=True)
class Isolation:
    """What this host allows; probed once at server start (reported on /healthz)."""

    as_root: bool
    network_namespace: bool
    mount_namespace: bool
    ipc_namespace: bool = False
    bwrap: Optional[str] = None  # non-root mode: bubblewrap, when it can create the namespaces here
    seccomp: bool = False

    @property
    def mode(self) -> str:
        return "root" if self.as_root else "namespaces" if self.bwrap else "unisolated"

    def describe(self) -> dict:
        return {
            "mode": self.mode,
            "uid_per_slot": self.as_root,
            "user_namespaces": self.bwrap is not None,
            "network_namespace": self.network_namespace or self.bwrap is not None,
            "mount_namespace": self.mount_namespace or self.bwrap is not None,
            "ipc_namespace": self.ipc_namespace or self.bwrap is not None,
            "pid_namespace": self.bwrap is not None,
            "seccomp": self.seccomp,
        }


def _probe(flags: int) -> bool:
    """Whether unshare(flags) works here, tried in a throwaway child process."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        try:
            unshare(flags)
            if flags & CLONE_NEWNS:
                mount(None, "/", None, MS_REC | MS_PRIVATE, None)
                mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "size=1m")
            os._exit(0)
        except BaseException:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


def _probe_bwrap(bwrap: Optional[str]) -> Optional[str]:
    """``bwrap`` when it can set up an execution's namespaces here (unprivileged user namespaces
    allowed: not refused by sysctl, seccomp or AppArmor), else None."""
    if not bwrap:
        return None
    try:
        done = subprocess.run([bwrap, "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent",
                               "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "true"],
                              capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return bwrap if done.returncode == 0 else None


def probe_isolation(bwrap: Optional[str] = None) -> Isolation:
    """What this host allows. Root mode needs root; non-root mode uses ``bwrap`` (default: found on
    PATH or through $WMRL_BWRAP) when it works here."""
    as_root = os.geteuid() == 0
    return Isolation(
        as_root=as_root,
        network_namespace=as_root and _probe(CLONE_NEWNET),
        mount_namespace=as_root and _probe(CLONE_NEWNS),
        ipc_namespace=as_root and _probe(CLONE_NEWIPC),
        bwrap=None if as_root else _probe_bwrap(bwrap or namespaces.find_bwrap()),
        seccomp=seccomp.supported(),
    )


__all__ = ["Isolation", "probe_isolation"]
