"""Finding and ending an execution's processes, and reaping what the server inherits.

An execution's processes are found through /proc: every process of its uid (root mode, where
each slot has a uid of its own) or every process carrying its marker environment variable
(:data:`MARKER_ENV`, the other modes). :func:`kill_everything` kills them until none is left.

The server is a child subreaper (:func:`wmrl_sandbox.linux.set_child_subreaper`), so the
orphans of every execution become its children and their zombies are reaped here
(:func:`reap_orphans`), except the children someone waits for itself: those are claimed in
:data:`live_mains`.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Optional

MARKER_ENV = "WMRL_SANDBOX_EXECUTION"
"""Set in every execution's environment to its own random marker, which finds its processes outside root mode."""


def _proc_pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def stat_fields(pid: int) -> Optional[list[str]]:
    """/proc/<pid>/stat after the command name: [state, ppid, pgrp, ...], or None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def processes_of_uid(uid: int) -> list[int]:
    """Live (non-zombie) processes of ``uid``: zombies are dead already and only need reaping."""
    found = []
    for pid in _proc_pids():
        try:
            if os.stat(f"/proc/{pid}").st_uid != uid:
                continue
        except FileNotFoundError:
            continue
        fields = stat_fields(pid)
        if fields is not None and fields[0] != "Z":
            found.append(pid)
    return found


def tasks_of_uid(uid: int) -> int:
    """Threads of ``uid`` now: what RLIMIT_NPROC counts against."""
    total = 0
    for pid in processes_of_uid(uid):
        try:
            total += len(os.listdir(f"/proc/{pid}/task"))
        except OSError:
            pass
    return total


def _processes_with_marker(marker: str) -> list[int]:
    needle = f"{MARKER_ENV}={marker}".encode()
    found = []
    for pid in _proc_pids():
        try:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                if needle in fh.read().split(b"\0"):
                    found.append(pid)
        except OSError:
            continue
    return found


def _kill_uid(uid: int) -> None:
    """kill(-1, SIGKILL) as ``uid``: every process of that uid at once (a fork bomb cannot outrun it)."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            os.kill(-1, signal.SIGKILL)
        except BaseException:
            os._exit(1)
        os._exit(0)
    os.waitpid(pid, 0)


class LiveMains:
    """The children of this server that their owner waits for itself: main processes of running
    executions, ``fetch_files`` helpers, fork servers. :func:`reap_orphans` leaves them alone, so
    an owner's ``wait`` never finds its child reaped by another execution's cleanup.

    An owner claims a child as soon as it has started it and releases it once it has waited for it.
    """

    def __init__(self) -> None:
        self._pids: set[int] = set()

    def claim(self, pid: int) -> None:
        self._pids.add(pid)

    def release(self, pid: int) -> None:
        self._pids.discard(pid)

    def __contains__(self, pid: int) -> bool:
        return pid in self._pids


live_mains = LiveMains()
"""This server's claimed children (one set per process: the orphans it inherits are its own)."""


def reap_orphans() -> None:
    """Reap zombies re-parented to this server (it is a child subreaper), except claimed children."""
    me = str(os.getpid())
    for pid in _proc_pids():
        if pid in live_mains:
            continue
        fields = stat_fields(pid)
        if fields is not None and fields[0] == "Z" and fields[1] == me:
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass


def kill_everything(pgid: Optional[int], uid: Optional[int], marker: str, deadline_s: float = 5.0) -> set[int]:
    """Kill the execution's process group and every process that escaped it; returns the pids found.

    ``pgid`` None: no process group to kill first (a warm execution, whose main process the fork
    server may already have reaped: its pid, and so its group id, may name another process now;
    the slot's uid covers every process of the execution).
    """
    if pgid is not None:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    seen: set[int] = set()
    end = time.monotonic() + deadline_s
    clean_scans = 0
    while True:
        if uid is not None:
            left = processes_of_uid(uid)
            if left:
                _kill_uid(uid)
        else:
            left = _processes_with_marker(marker)
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        reap_orphans()
        seen.update(left)
        # One empty scan is not enough: a process caught mid-fork can leave a child that is not in
        # /proc yet, and a daemonized grandchild would outlive its execution.
        clean_scans = clean_scans + 1 if not left else 0
        if clean_scans >= 3:
            return seen
        if time.monotonic() > end:
            raise RuntimeError(f"could not kill the execution's processes: {sorted(left)[:10]}")
        time.sleep(0.001 if clean_scans else 0.005)  # re-checking a clean scan only needs a fork's time


__all__ = ["MARKER_ENV", "LiveMains", "kill_everything", "live_mains", "processes_of_uid", "reap_orphans",
           "stat_fields", "tasks_of_uid"]
