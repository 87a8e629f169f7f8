"""What an execution's process does to itself before its program runs: its environment and isolation.

:func:`make_preexec` builds the function a cold execution's child runs between ``fork`` and
``exec`` (``subprocess.Popen``'s ``preexec_fn``), which a warm execution's child runs too, in its
fork server (:mod:`wmrl_sandbox.warm`): join the execution's cgroup, make root mode's
namespaces and private tmpfs mounts, set the resource limits, drop to the slot's uid, then
``no_new_privs`` and the seccomp filter. :func:`child_env` is the environment it runs with.
"""

from __future__ import annotations

import math
import os
import resource
import socket
import stat
import sys
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Optional

from wmrl_sandbox import cgroups, devices, seccomp
from wmrl_sandbox.data_mount import DataMount
from wmrl_sandbox.isolation import Isolation
from wmrl_sandbox.linux import (CLONE_NEWIPC, CLONE_NEWNET, CLONE_NEWNS, MS_BIND, MS_NODEV, MS_NOSUID, MS_PRIVATE,
                                MS_RDONLY, MS_REC, MS_REMOUNT, PR_SET_DUMPABLE, clear_capabilities, drop_to_uid, libc, mount, unshare)
from wmrl_sandbox.processes import MARKER_ENV, tasks_of_uid

if TYPE_CHECKING:  # executor.py imports this module
    from wmrl_sandbox.executor import Limits

# Directories any uid may write to: masked by a private tmpfs in the execution's mount namespace.
WORLD_WRITABLE_DIRS = ("/tmp", "/var/tmp", "/dev/shm")


def child_env(workdir: str, marker: str, threads: int = 1) -> dict[str, str]:
    """An execution's whole environment: nothing of the server's, and its marker (:data:`MARKER_ENV`).
    ``threads``: the BLAS/OpenMP thread pools' size (one per CPU the execution has)."""
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": workdir,
        "TMPDIR": workdir,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        # One execution owns one slot (its --cpus): no oversubscribing BLAS/OpenMP thread pools.
        "OMP_NUM_THREADS": str(threads),
        "OPENBLAS_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        "MPLBACKEND": "Agg",
        MARKER_ENV: marker,
    }


def masked(path: str) -> bool:
    """Whether ``path`` lies in a world-writable directory, which an execution's private tmpfs masks."""
    return any(path == d or path.startswith(d + "/") for d in WORLD_WRITABLE_DIRS)


def interpreter_root(python: str) -> str:
    """The directory an interpreter needs besides the system (``<venv>`` for ``<venv>/bin/python``)."""
    return os.path.dirname(os.path.dirname(os.path.abspath(python)))


def closed_ancestor(path: str) -> Optional[str]:
    """The topmost directory above ``path`` that other uids cannot traverse (no ``o+x``), if any."""
    parts = PurePosixPath(os.path.abspath(path)).parts
    for depth in range(2, len(parts)):
        ancestor = str(PurePosixPath(*parts[:depth]))
        try:
            if not os.stat(ancestor).st_mode & stat.S_IXOTH:
                return ancestor
        except OSError:
            return None
    return None


def _reveal(paths: tuple[str, ...], exec_dir: str) -> None:  # pragma: no cover - runs in the child
    """Mask each closed ancestor of ``paths`` with an empty tmpfs and bind the paths (and the
    execution's own directory, if it lies there) back at their own places."""
    masks: dict[str, list[str]] = {}
    for path in paths:
        ancestor = closed_ancestor(path)
        if ancestor is not None:
            masks.setdefault(ancestor, []).append(path)
    for ancestor, wanted in masks.items():
        if exec_dir.startswith(ancestor + "/"):
            wanted.append(exec_dir)
        kept = [(path, os.open(path, os.O_PATH | os.O_DIRECTORY)) for path in dict.fromkeys(wanted)]
        mount("tmpfs", ancestor, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
        for path, fd in kept:
            os.makedirs(path, exist_ok=True)
            mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC, None)
            os.close(fd)


def _mount_data(data: DataMount, source_fd: Optional[int]) -> None:  # pragma: no cover - runs in the child
    """Hide the tasks directory under an empty tmpfs (if it is still visible: one under /tmp is masked
    already) and bind the public directory, opened as ``source_fd``, read-only at ``data.target``."""
    if os.path.isdir(data.hide):
        mount("tmpfs", data.hide, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
    if source_fd is None or data.target is None:
        return
    mount(f"/proc/self/fd/{source_fd}", data.target, None, MS_BIND | MS_REC, None)
    mount(None, data.target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV, None)
    os.close(source_fd)
    # A cold execution's child entered its working directory before this ran (Popen's cwd): enter it
    # again, so that relative paths (data/train.csv) go through the mount.
    os.chdir(os.path.dirname(data.target))


def make_preexec(exec_dir: str, uid: Optional[int], isolation: Isolation, limits: Limits,
                 memory_mb: int, run_timeout: float, python: str = sys.executable,
                 ns_sock: Optional[socket.socket] = None, warm: bool = False, reveal: tuple[str, ...] = (),
                 cgroup_join: tuple[str, ...] = (), tasks_in_cgroup: bool = False, data: Optional[DataMount] = None):
    """The function run in the forked child before exec (root work first, then dropping to ``uid``).

    ``cgroup_join``: the execution's cgroup (:mod:`wmrl_sandbox.cgroups`), joined first, so
    every process it starts is born inside its limits. ``tasks_in_cgroup``: the group bounds the
    execution's tasks (``pids.max``), so RLIMIT_NPROC, which outside root mode counts every
    process of the server's uid (other executions' too), is left as it is.

    The private tmpfs over /tmp and friends would also hide the execution's directory and the
    interpreter's environment when they live there (a checkout under /tmp), so those two are bound
    back at their own paths.

    With ``ns_sock``, the child sends the server a descriptor of its mount namespace once that is
    set up: it keeps the namespace (and its private /tmp) alive after the execution's last process
    is gone, so ``fetch_files`` can read ``/tmp/...`` as the program saw it.

    ``limits.devices`` (``--device``): bound at their own paths after the masks (root mode), and no
    address-space limit is set (the execution's cgroup bounds its memory, where cgroups are on).

    ``warm``: called in a fork server's child (:mod:`wmrl_sandbox.warm`), where no ``execve``
    follows to drop root's capabilities: they are cleared here, and checked, before seccomp.
    ``reveal``: directories the program must be able to read although an ancestor is closed to
    its uid (the fork server's interpreter under /root, say): that ancestor is masked by an empty
    tmpfs in the execution's mount namespace and only these directories are bound back.
    """
    hidden = [path for path in dict.fromkeys((exec_dir, interpreter_root(python))) if masked(path)]
    own_process_rules = not (uid is None and isolation.bwrap)  # else bwrap sets no_new_privs and loads the filter
    cpu_seconds = int(math.ceil(run_timeout)) + 1
    address_space = memory_mb << 20
    # RLIMIT_NPROC counts every thread of the real uid: the execution's own uid in root mode;
    # otherwise the server's, so the execution gets its allowance on top of what runs now.
    nproc = limits.nproc if uid is not None else None if tasks_in_cgroup else tasks_of_uid(os.getuid()) + limits.nproc

    def preexec() -> None:  # pragma: no cover - runs in the child
        cgroups.join(cgroup_join)
        if uid is not None:
            flags = (CLONE_NEWNET if isolation.network_namespace else 0) | (
                CLONE_NEWNS if isolation.mount_namespace else 0) | (CLONE_NEWIPC if isolation.ipc_namespace else 0)
            if flags:
                unshare(flags)
            if isolation.mount_namespace:
                mount(None, "/", None, MS_REC | MS_PRIVATE, None)
                # Opened before anything is masked (the tasks directory may lie under /tmp, say).
                data_fd = os.open(data.source, os.O_PATH | os.O_DIRECTORY) if data and data.source else None
                kept = [(path, os.open(path, os.O_PATH | os.O_DIRECTORY)) for path in hidden]
                device_fds = [(path, os.open(path, os.O_PATH)) for path in dict.fromkeys(limits.devices)]
                for d in WORLD_WRITABLE_DIRS:
                    if os.path.isdir(d):
                        mount("tmpfs", d, "tmpfs", MS_NOSUID | MS_NODEV, f"size={limits.tmpfs_mb}m,mode=1777")
                for path, fd in kept:  # under a masked directory: bind it back at its own path
                    os.makedirs(path, exist_ok=True)
                    mount(f"/proc/self/fd/{fd}", path, None, MS_BIND, None)
                    os.close(fd)
                _reveal(reveal, exec_dir)
                if data is not None:
                    _mount_data(data, data_fd)
                devices.bind(device_fds)
                if ns_sock is not None:
                    ns_fd = os.open("/proc/self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
                    socket.send_fds(ns_sock, [b"m"], [ns_fd])
                    os.close(ns_fd)
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 1))
        if not limits.devices:  # CUDA reserves huge address ranges: with a device, the cgroup bounds memory
            resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_size_mb << 20, limits.file_size_mb << 20))
        resource.setrlimit(resource.RLIMIT_NOFILE, (limits.nofile, limits.nofile))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if nproc is not None:
            resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
        if uid is not None:
            drop_to_uid(uid)
            if warm:
                clear_capabilities()
                # A uid change without execve leaves the process non-dumpable (its /proc files root's);
                # a cold execution is dumpable after its execve: the same here.
                libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
        if own_process_rules:  # last: nothing above may be refused by the filter
            seccomp.set_no_new_privs()
            if isolation.seccomp:
                seccomp.install()

    return preexec


__all__ = [
    "WORLD_WRITABLE_DIRS", "child_env", "closed_ancestor", "interpreter_root", "make_preexec", "masked",
]
