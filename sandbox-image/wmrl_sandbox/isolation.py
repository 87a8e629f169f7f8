"""Which isolation this host allows, probed once when the server starts.

Root mode needs root and, for each of its namespaces (network, mount, IPC), a kernel that lets
``unshare`` make it: each is tried in a throwaway child. Non-root mode needs bubblewrap to be
able to create an execution's namespaces here (unprivileged user namespaces allowed). The
result, :class:`Isolation`, decides how every execution is isolated and is reported on /healthz.

What the server was asked for (``--isolation``, the values of ``spec.sandbox.isolation``):

* ``namespaces``: every execution in namespaces of its own (root mode as root, bubblewrap
  otherwise); :func:`missing` names what this host lacks of it, and the server refuses to start
  while anything is missing (it never falls back to running executions unisolated by itself);
* ``restricted``: executions run without namespaces of their own (``unisolated`` as a non-root
  uid; bubblewrap is not even looked for), for a Pod whose runtime (gVisor, Kata) is the boundary.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from typing import Optional

from wmrl_sandbox import seccomp
from wmrl_sandbox.linux import (CLONE_NEWIPC, CLONE_NEWNET, CLONE_NEWNS, MS_NODEV, MS_NOSUID, MS_PRIVATE, MS_REC, mount,
                                unshare)

MODES = ("namespaces", "restricted")
"""``--isolation`` (``WMRL_SANDBOX_ISOLATION``): the values of ``spec.sandbox.isolation``."""
BWRAP_ENV = "WMRL_SANDBOX_BWRAP"
"""Which bubblewrap to use (``--bwrap``); without it, ``bwrap`` on PATH."""


@dataclass(frozen=True)
class Isolation:
    """What this host allows; probed once at server start (reported on /healthz)."""

    as_root: bool
    network_namespace: bool
    mount_namespace: bool
    ipc_namespace: bool = False
    bwrap: Optional[str] = None  # non-root mode: bubblewrap, when it can create the namespaces here
    seccomp: bool = False
    requested: str = "namespaces"  # --isolation
    bwrap_error: Optional[str] = None  # non-root, namespaces requested: why bubblewrap cannot be used

    @property
    def mode(self) -> str:
        return "root" if self.as_root else "namespaces" if self.bwrap else "unisolated"

    def describe(self) -> dict:
        return {
            "mode": self.mode,
            "requested": self.requested,
            "uid_per_slot": self.as_root,
            "user_namespaces": self.bwrap is not None,
            "network_namespace": self.network_namespace or self.bwrap is not None,
            "mount_namespace": self.mount_namespace or self.bwrap is not None,
            "ipc_namespace": self.ipc_namespace or self.bwrap is not None,
            "pid_namespace": self.bwrap is not None,
            "seccomp": self.seccomp,
            "bwrap": self.bwrap,
            "bwrap_error": self.bwrap_error,
        }


def missing(isolation: Isolation) -> list[str]:
    """What ``isolation.requested`` promises that this host does not give, in words (empty: all of it).

    ``restricted`` promises no namespaces. ``namespaces`` promises, as root, a network, a mount and
    an IPC namespace per execution (root mode); otherwise bubblewrap able to create them here.
    """
    if isolation.requested == "restricted":
        return []
    if isolation.as_root:
        return [f"{name} namespace per execution (unshare({flag}) is refused here)"
                for name, flag, there in (("a network", "CLONE_NEWNET", isolation.network_namespace),
                                          ("a mount", "CLONE_NEWNS", isolation.mount_namespace),
                                          ("an IPC", "CLONE_NEWIPC", isolation.ipc_namespace)) if not there]
    if isolation.bwrap is None:
        return [isolation.bwrap_error or "bubblewrap"]
    return []


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


def resolve_bwrap(given: Optional[str]) -> tuple[Optional[str], Optional[str]]:
    """``(path, None)`` of the bubblewrap to use, or ``(None, why not)``.

    ``given`` (``--bwrap``): a path, or a name looked up on PATH; None: ``$WMRL_SANDBOX_BWRAP``,
    else ``bwrap`` on PATH.
    """
    wanted = given or os.environ.get(BWRAP_ENV) or "bwrap"
    found = shutil.which(wanted)
    if found:
        return found, None
    if "/" in wanted:
        return None, f"bubblewrap: {wanted} is not an executable file (--bwrap / {BWRAP_ENV})"
    return None, (f"bubblewrap: no {wanted!r} on PATH (install the bubblewrap package, or give its path with "
                  f"--bwrap / {BWRAP_ENV})")


def _probe_bwrap(bwrap: str) -> Optional[str]:
    """None when ``bwrap`` can set up an execution's namespaces here (unprivileged user namespaces
    allowed: not refused by sysctl, seccomp or AppArmor; a /proc it may mount), else why not."""
    command = [bwrap, "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--ro-bind", "/", "/",
               "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "true"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bubblewrap ({bwrap}) could not be run: {exc}"
    if done.returncode == 0:
        return None
    said = (done.stderr or done.stdout).strip()[-500:] or f"exit code {done.returncode}"
    return f"bubblewrap ({bwrap}) cannot create an execution's namespaces here: {said}"


def probe_isolation(bwrap: Optional[str] = None, requested: str = "namespaces") -> Isolation:
    """What this host allows for ``requested`` (:data:`MODES`). Root mode needs root; non-root
    ``namespaces`` uses bubblewrap (:func:`resolve_bwrap` of ``bwrap``) when it works here."""
    if requested not in MODES:
        raise ValueError(f"--isolation must be one of {', '.join(MODES)}, got {requested!r}")
    as_root = os.geteuid() == 0
    path = error = None
    if not as_root and requested == "namespaces":
        path, error = resolve_bwrap(bwrap)
        if path is not None:
            error = _probe_bwrap(path)
            if error is not None:
                path = None
    return Isolation(
        as_root=as_root,
        network_namespace=as_root and _probe(CLONE_NEWNET),
        mount_namespace=as_root and _probe(CLONE_NEWNS),
        ipc_namespace=as_root and _probe(CLONE_NEWIPC),
        bwrap=path,
        seccomp=seccomp.supported(),
        requested=requested,
        bwrap_error=error,
    )


__all__ = ["BWRAP_ENV", "Isolation", "MODES", "missing", "probe_isolation", "resolve_bwrap"]
