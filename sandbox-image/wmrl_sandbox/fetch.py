"""``fetch_files``: the files an execution leaves behind, read back after its last process is dead.

Root mode reads them as the program saw them: a helper process enters the execution's mount
namespace, becomes its uid and streams each readable file back as a record (an index into the
requested names, a length, the content), ending with an end record that says whether the size
cap left files out. The other modes read only inside the working directory
(:func:`fetch_in_workdir`), where a file cannot be told from the server's own elsewhere.
"""

from __future__ import annotations

import os
import selectors
import signal
import stat
import struct
import time
from pathlib import Path
from typing import Optional

from wmrl_sandbox.linux import CLONE_NEWNS, PR_SET_DUMPABLE, libc
from wmrl_sandbox.processes import live_mains


def _read_capped(fd: int, limit: int) -> bytes:
    """Up to ``limit`` bytes of ``fd`` (fewer at end of file)."""
    chunks, size = [], 0
    while size < limit:
        chunk = os.read(fd, min(1 << 20, limit - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def fetch_in_workdir(workdir: Path, names: list[str], cap: int) -> tuple[dict[str, bytes], bool]:
    """fetch_files without a uid of its own (non-root mode): only files inside the working directory.

    The program runs as the server's own user and shares its /tmp, so a file elsewhere cannot be
    told from the server's or another execution's: absolute paths count only when they lead into
    the working directory. Never follows a link out of it.
    """
    out: dict[str, bytes] = {}
    total = 0
    real_root = os.path.realpath(workdir)
    for name in names:
        if not name or "\x00" in name:
            continue
        path = os.path.realpath(os.path.join(workdir, name))
        if not path.startswith(real_root + os.sep):
            continue
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                continue
            data = _read_capped(fd, cap - total + 1)
        finally:
            os.close(fd)
        if total + len(data) > cap:
            return out, True
        total += len(data)
        out[name] = data
    return out, False


_RECORD = struct.Struct("!IQ")  # (index into names, length) then the content; index _END closes the stream
_END = 0xFFFFFFFF


def fetch_as_uid(workdir: Path, names: list[str], uid: int, ns_fd: Optional[int], cap: int,
                  deadline_s: float = 30.0) -> tuple[dict[str, bytes], bool]:
    """fetch_files as the program saw them (root mode): read by a helper that enters the execution's
    mount namespace (``ns_fd``) and becomes its uid, so a relative path is resolved in the working
    directory, an absolute one in the program's own view (``/tmp/x`` is its private /tmp), and only
    what the program itself could read is returned.

    Runs after every process of the execution is dead, so nothing can swap a file meanwhile. Only
    regular files owned by the execution's uid count (a hard link to a root-only file is owned by
    root; so are the helper's own /proc files, and procfs is refused outright); the last path
    component is never a followed symlink. Returns (files, whether the cap left some out).
    Raises RuntimeError when the helper fails: the sandbox's fault, not the program's.
    """
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        try:
            os.close(r)
            if ns_fd is not None and libc.setns(ns_fd, CLONE_NEWNS) != 0:
                os._exit(3)
            # No descriptor of the server's (another execution's directory being removed...) to read through.
            for fd in map(int, os.listdir("/proc/self/fd")):
                if fd > 2 and fd != w:
                    try:
                        os.close(fd)
                    except OSError:
                        pass
            proc_dev = os.stat("/proc").st_dev
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
            try:
                os.chdir(workdir)
                in_workdir = True
            except OSError:  # the program made its directory unreachable: its relative files are gone
                in_workdir = False
            total = 0
            for index, name in enumerate(names):
                if not name or "\x00" in name or (not in_workdir and not name.startswith("/")):
                    continue
                try:
                    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
                except OSError:
                    continue
                try:
                    st = os.fstat(fd)
                    if not stat.S_ISREG(st.st_mode) or st.st_uid != uid or st.st_dev == proc_dev:
                        continue
                    data = _read_capped(fd, cap - total + 1)
                except OSError:
                    continue
                finally:
                    os.close(fd)
                if total + len(data) > cap:
                    _write_all(w, _RECORD.pack(_END, 1))
                    os._exit(0)
                total += len(data)
                _write_all(w, _RECORD.pack(index, len(data)) + data)
            _write_all(w, _RECORD.pack(_END, 0))
            os._exit(0)
        except BaseException:
            os._exit(1)
    live_mains.claim(pid)  # ours to reap: another execution's orphan reaper leaves it alone
    os.close(w)
    buf = bytearray()
    finished = False
    try:
        end = time.monotonic() + deadline_s
        with selectors.DefaultSelector() as sel:
            sel.register(r, selectors.EVENT_READ)
            while True:
                remaining = end - time.monotonic()
                if remaining <= 0:
                    raise RuntimeError(f"fetch_files: reading the files took over {deadline_s:.0f}s")
                if sel.select(remaining):
                    chunk = os.read(r, 1 << 20)
                    if not chunk:
                        break
                    buf += chunk
        finished = True
    finally:
        os.close(r)
        if not finished:  # stuck: it has nothing left to do
            os.kill(pid, signal.SIGKILL)
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
        live_mains.release(pid)
    return _read_records(buf, names)


def _read_records(buf: bytes, names: list[str]) -> tuple[dict[str, bytes], bool]:
    """The helper's record stream as (files, whether the cap left some out); RuntimeError if it is cut short."""
    out: dict[str, bytes] = {}
    view, pos = memoryview(buf), 0
    while pos + _RECORD.size <= len(view):
        index, length = _RECORD.unpack_from(view, pos)
        pos += _RECORD.size
        if index == _END:
            return out, bool(length)
        if index >= len(names) or pos + length > len(view):
            break
        out[names[index]] = bytes(view[pos:pos + length])
        pos += length
    raise RuntimeError("fetch_files: the helper reading the files ended without finishing")


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


__all__ = ["fetch_as_uid", "fetch_in_workdir"]
