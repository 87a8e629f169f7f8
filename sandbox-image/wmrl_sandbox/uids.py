"""The uids of root mode: one dedicated uid per slot, and the work root those uids must reach.

In root mode every execution of a slot runs as that slot's uid, which nothing else on the
machine uses, so "every process of this uid" is exactly "everything this execution started"
(:func:`wmrl_sandbox.processes.kill_everything`).
"""

from __future__ import annotations

import fcntl
import os
import stat
import tempfile
from pathlib import Path
from typing import Optional

from wmrl_sandbox.processes import processes_of_uid


def check_searchable(directory: str) -> None:
    """In root mode the execution's uid must reach its directory: every ancestor needs o+x."""
    path = Path(directory).resolve()
    for d in (path, *path.parents):
        mode = d.stat().st_mode
        if not mode & stat.S_IXOTH:
            raise ValueError(f"--work-root {directory}: {d} (mode {stat.filemode(mode)}) is not searchable "
                             "by other users, so an execution's uid could not reach its directory")


class UidPool:
    """Dedicated uids, one per slot, unique among the sandbox servers of this machine.

    Each uid is reserved by an exclusive flock on ``<lock_dir>/<uid>.lock`` held for the
    server's lifetime, so two local servers never share one (a uid-wide kill would
    otherwise kill the other server's execution). In a Pod there is one server per PID
    namespace, but the reservation costs nothing there either.
    """

    def __init__(self, count: int, base: int = 62000, span: int = 2000, lock_dir: Optional[str] = None):
        self.lock_dir = Path(lock_dir or os.path.join(tempfile.gettempdir(), "wmrl-sandbox-uids"))
        self.lock_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._fds: list[int] = []
        self.uids: list[int] = []
        for uid in range(base, base + span):
            if len(self.uids) == count:
                break
            fd = os.open(self.lock_dir / f"{uid}.lock", os.O_CREAT | os.O_RDWR, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            if processes_of_uid(uid):  # used by something else on this machine: not ours to kill
                os.close(fd)
                continue
            self._fds.append(fd)
            self.uids.append(uid)
        if len(self.uids) < count:
            self.close()
            raise RuntimeError(f"no {count} free sandbox uids in [{base}, {base + span})")

    def close(self) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds.clear()


__all__ = ["UidPool", "check_searchable"]
