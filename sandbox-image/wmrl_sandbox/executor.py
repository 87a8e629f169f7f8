"""Run one untrusted Python program in isolation and report what happened.

Layers, from the outside in (see docs/sandbox.md for what each one stops):

* a fresh working directory per execution, removed afterwards; the program's files are
  owned by the execution's uid, the script lives next to the directory, owned by root;
* when the server runs as root: a dedicated, otherwise unused uid per slot (so "every
  process of this uid" is exactly "everything this execution started", wherever it
  escaped to), a fresh network namespace (no interface but a down loopback), and a private
  mount namespace whose world-writable directories (/tmp, /var/tmp, /dev/shm) are fresh
  tmpfs mounts that vanish with the execution;
* a scrubbed environment (nothing of the server's), a new session/process group,
  resource limits (CPU time, address space, processes, file size, open files, no core);
* a wall-clock timeout; when the main process ends (or times out) every process of the
  execution is SIGKILLed: its process group, then every process of its uid (root mode) or
  carrying its marker environment variable (non-root mode), until none is left;
* stdout and stderr are drained continuously and capped (with a truncation flag), so a
  program printing gigabytes neither blocks nor exhausts the server's memory.

The module is deliberately independent of HTTP: :func:`execute` takes an
:class:`ExecutionRequest` and returns an :class:`ExecutionResult`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import fcntl
import math
import os
import resource
import secrets
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Optional

SCRIPT_NAME = "main.py"
WORK_SUBDIR = "work"
MARKER_ENV = "WMRL_SANDBOX_EXECUTION"
# Directories any uid may write to: masked by a private tmpfs in the execution's mount namespace.
WORLD_WRITABLE_DIRS = ("/tmp", "/var/tmp", "/dev/shm")

_CLONE_NEWNS = 0x00020000
_CLONE_NEWNET = 0x40000000
_MS_NOSUID = 2
_MS_NODEV = 4
_MS_BIND = 4096
_MS_REC = 16384
_MS_PRIVATE = 1 << 18

_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)


class RequestError(ValueError):
    """The request itself is invalid (bad path, bad base64...): the client's fault, not the sandbox's."""


@dataclass(frozen=True)
class Limits:
    """Per-execution resource limits and the server-side caps on what a request may ask for."""

    memory_mb: int = 2048  # address space (RLIMIT_AS) when the request does not set memory_limit_MB
    max_memory_mb: int = 8192
    max_run_timeout: float = 600.0
    nproc: int = 64  # processes (threads) the execution may have
    file_size_mb: int = 256  # largest file the program may write (RLIMIT_FSIZE)
    nofile: int = 256
    max_output_bytes: int = 1 << 20  # per stream
    max_fetch_bytes: int = 64 << 20  # all fetched files together
    tmpfs_mb: int = 64  # size of each private /tmp, /var/tmp, /dev/shm (root mode)


@dataclass
class ExecutionRequest:
    code: str
    run_timeout: float = 10.0
    memory_limit_mb: int = -1
    stdin: Optional[str] = None
    files: dict[str, bytes] = field(default_factory=dict)
    fetch_files: list[str] = field(default_factory=list)


@dataclass
class ExecutionResult:
    status: str  # Finished | TimeLimitExceeded | Error (the sandbox failed, not the program)
    execution_time: float
    return_code: Optional[int]
    stdout: str
    stderr: str
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    files: dict[str, bytes] = field(default_factory=dict)
    leftover_processes_killed: int = 0


def safe_relative_path(path: str, what: str) -> PurePosixPath:
    """A request path as a normalized relative path inside the working directory, or RequestError."""
    if not isinstance(path, str) or not path or "\x00" in path:
        raise RequestError(f"{what}: invalid path {path!r}")
    pure = PurePosixPath(path)
    if pure.is_absolute() or any(part in ("..", "") for part in pure.parts) or pure == PurePosixPath("."):
        raise RequestError(f"{what}: path {path!r} must be relative and stay inside the working directory")
    return pure


# --------------------------------------------------------------------------- capabilities


@dataclass(frozen=True)
class Isolation:
    """What this host allows; probed once at server start (reported on /healthz)."""

    as_root: bool
    network_namespace: bool
    mount_namespace: bool

    def describe(self) -> dict:
        return {
            "uid_per_slot": self.as_root,
            "network_namespace": self.network_namespace,
            "mount_namespace": self.mount_namespace,
        }


def _unshare(flags: int) -> None:
    if _libc.unshare(ctypes.c_int(flags)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"unshare({flags:#x}): {os.strerror(err)}")


def _mount(source: Optional[str], target: str, fstype: Optional[str], flags: int, data: Optional[str]) -> None:
    enc = lambda s: s.encode() if s is not None else None  # noqa: E731
    if _libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount({target}): {os.strerror(err)}")


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _drop_to(uid: int) -> None:
    """Become ``uid`` but keep root's capabilities until the coming execve, which drops them all.

    Like setpriv(1): the interpreter is looked up with root's file access (it may live under a
    directory only root can traverse, e.g. a venv of /root/.pyenv here), then execve of a file
    without file capabilities by a non-root uid clears every capability set (inheritable and
    ambient are empty), so the program itself runs with none.
    """
    PR_SET_KEEPCAPS = 8
    if _libc.prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_KEEPCAPS)")
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    header = _CapHeader(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3
    data = (_CapData * 2)()
    if _libc.capget(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capget")
    for d in data:
        d.effective = d.permitted
        d.inheritable = 0
    if _libc.capset(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capset")


def _probe(flags: int) -> bool:
    """Whether unshare(flags) works here, tried in a throwaway child process."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        try:
            _unshare(flags)
            if flags & _CLONE_NEWNS:
                _mount(None, "/", None, _MS_REC | _MS_PRIVATE, None)
                _mount("tmpfs", "/tmp", "tmpfs", _MS_NOSUID | _MS_NODEV, "size=1m")
            os._exit(0)
        except BaseException:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


def probe_isolation() -> Isolation:
    as_root = os.geteuid() == 0
    return Isolation(
        as_root=as_root,
        network_namespace=as_root and _probe(_CLONE_NEWNET),
        mount_namespace=as_root and _probe(_CLONE_NEWNS),
    )


# --------------------------------------------------------------------------- uids


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
            if _processes_of_uid(uid):  # used by something else on this machine: not ours to kill
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


# --------------------------------------------------------------------------- process cleanup


def _proc_pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def _stat_fields(pid: int) -> Optional[list[str]]:
    """/proc/<pid>/stat after the command name: [state, ppid, pgrp, ...], or None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _processes_of_uid(uid: int) -> list[int]:
    """Live (non-zombie) processes of ``uid``: zombies are dead already and only need reaping."""
    found = []
    for pid in _proc_pids():
        try:
            if os.stat(f"/proc/{pid}").st_uid != uid:
                continue
        except FileNotFoundError:
            continue
        fields = _stat_fields(pid)
        if fields is not None and fields[0] != "Z":
            found.append(pid)
    return found


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


# Main processes of running executions: asyncio's child watcher reaps those, never us.
_active_mains: set[int] = set()


def _reap_orphans() -> None:
    """Reap zombies re-parented to this server (it is a child subreaper), except running mains."""
    me = str(os.getpid())
    for pid in _proc_pids():
        if pid in _active_mains:
            continue
        fields = _stat_fields(pid)
        if fields is not None and fields[0] == "Z" and fields[1] == me:
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass


def kill_everything(pgid: int, uid: Optional[int], marker: str, deadline_s: float = 5.0) -> set[int]:
    """Kill the execution's process group and every process that escaped it; returns the pids found."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    seen: set[int] = set()
    end = time.monotonic() + deadline_s
    clean_scans = 0
    while True:
        if uid is not None:
            left = _processes_of_uid(uid)
            if left:
                _kill_uid(uid)
        else:
            left = _processes_with_marker(marker)
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        _reap_orphans()
        seen.update(left)
        # One empty scan is not enough: a process caught mid-fork can leave a child that is not in
        # /proc yet (seen under load: a daemonized grandchild outlived its execution).
        clean_scans = clean_scans + 1 if not left else 0
        if clean_scans >= 3:
            return seen
        if time.monotonic() > end:
            raise RuntimeError(f"could not kill the execution's processes: {sorted(left)[:10]}")
        time.sleep(0.001 if clean_scans else 0.005)  # re-checking a clean scan only needs a fork's time


def set_child_subreaper() -> bool:
    """Make orphans of executions re-parent to this server (so it can reap them) instead of PID 1."""
    PR_SET_CHILD_SUBREAPER = 36
    return _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


# --------------------------------------------------------------------------- the child side


def _child_env(workdir: str, marker: str) -> dict[str, str]:
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": workdir,
        "TMPDIR": workdir,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        # One execution owns one slot (~one core): no oversubscribing BLAS/OpenMP thread pools.
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "MPLBACKEND": "Agg",
        MARKER_ENV: marker,
    }


def _tasks_of_uid(uid: int) -> int:
    """Threads of ``uid`` now: what RLIMIT_NPROC counts against."""
    total = 0
    for pid in _processes_of_uid(uid):
        try:
            total += len(os.listdir(f"/proc/{pid}/task"))
        except OSError:
            pass
    return total


def _masked(path: str) -> bool:
    return any(path == d or path.startswith(d + "/") for d in WORLD_WRITABLE_DIRS)


def interpreter_root(python: str) -> str:
    """The directory an interpreter needs besides the system (``<venv>`` for ``<venv>/bin/python``)."""
    return os.path.dirname(os.path.dirname(os.path.abspath(python)))


def _make_preexec(exec_dir: str, uid: Optional[int], isolation: Isolation, limits: Limits,
                  memory_mb: int, run_timeout: float, python: str = sys.executable):
    """The function run in the forked child before exec (root work first, then dropping to ``uid``).

    The private tmpfs over /tmp and friends would also hide the execution's directory and the
    interpreter's environment when they live there (a checkout under /tmp: every execution failed
    with "No such file or directory"), so those two are bound back at their own paths.
    """
    hidden = [path for path in dict.fromkeys((exec_dir, interpreter_root(python))) if _masked(path)]
    cpu_seconds = int(math.ceil(run_timeout)) + 1
    address_space = memory_mb << 20
    # RLIMIT_NPROC counts every thread of the real uid: the execution's own uid in root mode;
    # otherwise the server's, so the execution gets its allowance on top of what runs now.
    nproc = limits.nproc if uid is not None else _tasks_of_uid(os.getuid()) + limits.nproc

    def preexec() -> None:  # pragma: no cover - runs in the child
        if uid is not None:
            flags = (_CLONE_NEWNET if isolation.network_namespace else 0) | (
                _CLONE_NEWNS if isolation.mount_namespace else 0)
            if flags:
                _unshare(flags)
            if isolation.mount_namespace:
                _mount(None, "/", None, _MS_REC | _MS_PRIVATE, None)
                kept = [(path, os.open(path, os.O_PATH | os.O_DIRECTORY)) for path in hidden]
                for d in WORLD_WRITABLE_DIRS:
                    if os.path.isdir(d):
                        _mount("tmpfs", d, "tmpfs", _MS_NOSUID | _MS_NODEV, f"size={limits.tmpfs_mb}m,mode=1777")
                for path, fd in kept:  # under a masked directory: bind it back at its own path
                    os.makedirs(path, exist_ok=True)
                    _mount(f"/proc/self/fd/{fd}", path, None, _MS_BIND, None)
                    os.close(fd)
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 1))
        resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_size_mb << 20, limits.file_size_mb << 20))
        resource.setrlimit(resource.RLIMIT_NOFILE, (limits.nofile, limits.nofile))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
        if uid is not None:
            _drop_to(uid)

    return preexec


# --------------------------------------------------------------------------- the server side


class _Capture:
    """One output stream, kept up to ``cap`` bytes; the rest is read and discarded."""

    def __init__(self, cap: int):
        self.cap = cap
        self.kept = bytearray()
        self.truncated = False

    def add(self, chunk: bytes) -> None:
        room = self.cap - len(self.kept)
        if room > 0:
            self.kept += chunk[:room]
        if len(chunk) > room:
            self.truncated = True

    def text(self) -> str:
        return self.kept.decode("utf-8", errors="replace")


def _pump(proc: subprocess.Popen, stdin: bytes, deadline: float, out: _Capture, err: _Capture,
          until_eof: bool) -> bool:
    """Move bytes between the child and the captures until the main process exits (or, with
    ``until_eof``, until both pipes close); returns False if ``deadline`` passed first.

    A pidfd tells exactly when the main process exits, so a fast program is not held back by
    polling, and a daemonized grandchild holding the pipes open cannot stretch the execution.
    """
    captures = {proc.stdout.fileno(): out, proc.stderr.fileno(): err}
    with selectors.DefaultSelector() as sel:
        for fd in captures:
            sel.register(fd, selectors.EVENT_READ)
        pidfd = None
        if not until_eof:
            pidfd = os.pidfd_open(proc.pid)
            sel.register(pidfd, selectors.EVENT_READ)
        if stdin and proc.stdin and not until_eof:
            sel.register(proc.stdin.fileno(), selectors.EVENT_WRITE)
        view = memoryview(stdin)
        try:
            while captures:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                for key, _ in sel.select(remaining):
                    fd = key.fd
                    if fd == pidfd:
                        return True
                    if fd in captures:
                        chunk = os.read(fd, 1 << 16)
                        if chunk:
                            captures[fd].add(chunk)
                        else:
                            sel.unregister(fd)
                            del captures[fd]
                    else:  # stdin writable
                        try:
                            written = os.write(fd, view[:1 << 16])
                        except BrokenPipeError:
                            written = len(view)
                        view = view[written:]
                        if not view:
                            sel.unregister(fd)
                            proc.stdin.close()
            return True
        finally:
            if pidfd is not None:
                os.close(pidfd)


def _prepare(exec_dir: Path, workdir: Path, request: ExecutionRequest, uid: Optional[int]) -> None:
    os.chmod(exec_dir, 0o711)  # the program may traverse it to its script and work dir, not list or write it
    (exec_dir / SCRIPT_NAME).write_text(request.code, encoding="utf-8")
    workdir.mkdir(mode=0o700)
    for rel, content in request.files.items():
        target = workdir / safe_relative_path(rel, "files")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
    if uid is not None:
        for root, dirs, files in os.walk(workdir):
            os.chown(root, uid, uid)
            for name in files:
                os.chown(os.path.join(root, name), uid, uid)


def _fetch(workdir: Path, names: list[str], uid: Optional[int], cap: int) -> dict[str, bytes]:
    """Read back requested files, never following a link out of the working directory.

    Runs after every process of the execution is dead, so nothing can swap a file meanwhile.
    In root mode only files owned by the execution's uid are returned (a hard link to a
    root-only file would be owned by root).
    """
    out: dict[str, bytes] = {}
    total = 0
    real_root = os.path.realpath(workdir)
    for name in names:
        rel = safe_relative_path(name, "fetch_files")
        path = os.path.realpath(workdir / rel)
        if not path.startswith(real_root + os.sep):
            continue
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue
        with os.fdopen(fd, "rb") as fh:
            st = os.fstat(fh.fileno())
            if not stat.S_ISREG(st.st_mode) or (uid is not None and st.st_uid != uid):
                continue
            data = fh.read(cap - total + 1)
        if total + len(data) > cap:
            raise RequestError(f"fetch_files: fetched files exceed {cap} bytes")
        total += len(data)
        out[name] = data
    return out


def _remove(path: Path) -> None:
    def force(func, p, _exc):
        try:
            os.chmod(os.path.dirname(p), 0o700)
            os.chmod(p, 0o700)
        except OSError:
            pass
        func(p)

    shutil.rmtree(path, onerror=force)


def execute(request: ExecutionRequest, *, work_root: str, uid: Optional[int], isolation: Isolation,
            limits: Limits = Limits(), python: str = sys.executable) -> ExecutionResult:
    """Run ``request.code`` with ``python -I -B`` in a fresh directory under ``work_root``.

    Blocking (the server runs it in a worker thread). ``uid`` is the slot's dedicated uid in
    root mode, None otherwise. Raises RequestError for an invalid request (nothing is run);
    a failure of the sandbox itself is a result with status ``Error``.
    """
    for name in request.fetch_files:
        safe_relative_path(name, "fetch_files")
    run_timeout = min(max(float(request.run_timeout), 0.01), limits.max_run_timeout)
    memory_mb = limits.memory_mb if request.memory_limit_mb is None or request.memory_limit_mb <= 0 else \
        min(int(request.memory_limit_mb), limits.max_memory_mb)
    marker = secrets.token_hex(8)
    exec_dir = Path(tempfile.mkdtemp(prefix="x-", dir=work_root))
    workdir = exec_dir / WORK_SUBDIR
    proc = None
    start = time.monotonic()
    try:
        _prepare(exec_dir, workdir, request, uid)
        out, err = _Capture(limits.max_output_bytes), _Capture(limits.max_output_bytes)
        start = time.monotonic()
        proc = subprocess.Popen(
            [python, "-I", "-B", str(exec_dir / SCRIPT_NAME)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            cwd=str(workdir), env=_child_env(str(workdir), marker), start_new_session=True,
            preexec_fn=_make_preexec(str(exec_dir), uid, isolation, limits, memory_mb, run_timeout, python),
        )
        _active_mains.add(proc.pid)
        stdin = request.stdin.encode() if request.stdin else b""
        if not stdin:
            proc.stdin.close()
        finished = _pump(proc, stdin, start + run_timeout, out, err, until_eof=False)
        elapsed = time.monotonic() - start
        # The execution ends with its main process: whatever it left behind dies now, which
        # also closes any pipe a daemonized grandchild kept open.
        killed = kill_everything(proc.pid, uid, marker)
        return_code = proc.wait()
        _pump(proc, b"", time.monotonic() + 5.0, out, err, until_eof=True)
        files = _fetch(workdir, request.fetch_files, uid, limits.max_fetch_bytes)
        return ExecutionResult(
            status="Finished" if finished else "TimeLimitExceeded",
            execution_time=elapsed,
            return_code=return_code if finished else None,
            stdout=out.text(),
            stderr=err.text(),
            stdout_truncated=out.truncated,
            stderr_truncated=err.truncated,
            files=files,
            leftover_processes_killed=len(killed - {proc.pid}),
        )
    except RequestError:
        raise
    except (OSError, subprocess.SubprocessError, RuntimeError) as exc:
        return ExecutionResult(status="Error", execution_time=time.monotonic() - start, return_code=None,
                               stdout="", stderr=f"sandbox error: {exc}")
    finally:
        if proc is not None:
            if proc.returncode is None:
                kill_everything(proc.pid, uid, marker)
                proc.wait()
            _active_mains.discard(proc.pid)
            for stream in (proc.stdin, proc.stdout, proc.stderr):
                if stream is not None and not stream.closed:
                    try:
                        stream.close()
                    except OSError:
                        pass
        _remove(exec_dir)


__all__ = [
    "ExecutionRequest", "ExecutionResult", "Isolation", "Limits", "RequestError", "UidPool", "execute",
    "check_searchable", "kill_everything", "probe_isolation", "safe_relative_path", "set_child_subreaper", "SCRIPT_NAME",
]
