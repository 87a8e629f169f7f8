"""Run one untrusted Python program in isolation and report what happened.

Layers, from the outside in (see docs/sandbox.md for what each one stops):

* a fresh working directory per execution, removed afterwards: the program (``main.py``) and
  its ``files`` side by side, owned by the execution's uid, so ``files`` can be imported;
* when the server runs as root: a dedicated, otherwise unused uid per slot (so "every
  process of this uid" is exactly "everything this execution started", wherever it
  escaped to), a fresh network namespace (no interface but a down loopback), and a private
  mount namespace whose world-writable directories (/tmp, /var/tmp, /dev/shm) are fresh
  tmpfs mounts that vanish with the execution;
* when it does not (the image's non-root user, the deployed mode): new user, PID, network,
  mount, IPC, UTS and cgroup namespaces per execution through bubblewrap
  (:mod:`wmrl_sandbox.namespaces`): a read-only filesystem with private /tmp, /var/tmp and
  /dev/shm, other executions' directories hidden, no capabilities, no path to the server;
* in every mode: ``no_new_privs`` and the seccomp filter of :mod:`wmrl_sandbox.seccomp`
  (ptrace, bpf, io_uring, keyctl, new namespaces, mounts... refused); root mode also gets an
  IPC namespace, so SysV IPC objects vanish with the execution;
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

import json
import os
import secrets
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Optional

from wmrl_sandbox import cgroups, seccomp
from wmrl_sandbox.data_mount import DATA_DIR, DataMount, bwrap_args
from wmrl_sandbox.fetch import fetch_as_uid, fetch_in_workdir
from wmrl_sandbox.isolation import Isolation
from wmrl_sandbox.linux import pidfd_exited
from wmrl_sandbox.namespaces import bwrap_command
from wmrl_sandbox.preexec import child_env, interpreter_root, make_preexec, masked
from wmrl_sandbox.processes import kill_everything, live_mains, reap_orphans, stat_fields
from wmrl_sandbox.warm_slots import WarmSpawnFailed, job_message

SCRIPT_NAME = "main.py"
WORK_SUBDIR = "work"


class RequestError(ValueError):
    """The request itself is invalid (bad path, bad base64...): the client's fault, not the sandbox's."""


@dataclass(frozen=True)
class Limits:
    """Per-execution resource limits and the server-side caps on what a request may ask for."""

    memory_mb: int = 2048  # address space (RLIMIT_AS) when the request does not set memory_limit_MB
    max_memory_mb: int = 8192  # what memory_limit_MB -1 (SandboxFusion: "no limit") gets; the cap on any request
    max_run_timeout: float = 600.0
    nproc: int = 64  # processes (threads) the execution may have
    file_size_mb: int = 256  # largest file the program may write (RLIMIT_FSIZE)
    nofile: int = 256
    max_output_bytes: int = 1 << 20  # per stream
    max_fetch_bytes: int = 64 << 20  # all fetched files together
    tmpfs_mb: int = 64  # size of each private /tmp, /var/tmp, /dev/shm
    threads: int = 1  # OMP/OpenBLAS/MKL threads (one per whole CPU of the execution's cgroup, --cpus)
    # Device nodes bound into every execution (--device, wmrl_sandbox.devices); with any, no RLIMIT_AS.
    devices: tuple[str, ...] = ()


@dataclass
class ExecutionRequest:
    code: str
    run_timeout: float = 10.0
    memory_limit_mb: Optional[int] = None  # None: Limits.memory_mb; <= 0 (-1): Limits.max_memory_mb
    stdin: Optional[str] = None
    files: dict[str, bytes] = field(default_factory=dict)
    fetch_files: list[str] = field(default_factory=list)
    # A task's public directory (resolved, wmrl_sandbox.data_mount), mounted read-only at data/, and the
    # tasks directory, hidden from the execution (whether or not it mounts a public directory).
    data_source: Optional[str] = None
    data_hide: Optional[str] = None


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
    files_truncated: bool = False  # fetched files exceeded Limits.max_fetch_bytes: the rest were left out
    leftover_processes_killed: int = 0
    # From the execution's cgroup (wmrl_sandbox.cgroups); None where no such controller is used.
    oom_kills: Optional[int] = None  # processes the kernel killed at the memory limit of the whole execution
    pids_refused: Optional[int] = None  # forks refused at its task limit
    memory_peak_mb: Optional[float] = None  # all its processes together


def memory_limit_mb(requested: Optional[int], limits: "Limits") -> int:
    """The address-space limit of an execution: absent -> the default, -1 (any value <= 0, which
    SandboxFusion reads as "no limit") -> the server's maximum, otherwise the request capped by it."""
    if requested is None:
        return limits.memory_mb
    if requested <= 0:
        return limits.max_memory_mb
    return min(int(requested), limits.max_memory_mb)


def safe_relative_path(path: str, what: str) -> PurePosixPath:
    """A request path as a normalized relative path inside the working directory, or RequestError."""
    if not isinstance(path, str) or not path or "\x00" in path:
        raise RequestError(f"{what}: invalid path {path!r}")
    pure = PurePosixPath(path)
    if pure.is_absolute() or any(part in ("..", "") for part in pure.parts) or pure == PurePosixPath("."):
        raise RequestError(f"{what}: path {path!r} must be relative and stay inside the working directory")
    return pure


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
    Both pipes closed is not the end: a program may close its streams and go on working, and a
    namespace's first process reports the program's status only after the pipes have closed
    (ending the execution there would kill it before it reports).
    """
    captures = {proc.stdout.fileno(): out, proc.stderr.fileno(): err}
    with selectors.DefaultSelector() as sel:
        for fd in captures:
            sel.register(fd, selectors.EVENT_READ)
        pidfd = None
        if not until_eof:
            # A warm child is the fork server's, not ours: its pidfd comes from there (its pid may be reaped early).
            pidfd = proc.open_pidfd() if hasattr(proc, "open_pidfd") else os.pidfd_open(proc.pid)
            sel.register(pidfd, selectors.EVENT_READ)
        if stdin and proc.stdin and not until_eof:
            sel.register(proc.stdin.fileno(), selectors.EVENT_WRITE)
        view = memoryview(stdin)
        try:
            while captures or pidfd is not None:
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
    """The working directory: ``files`` and then ``main.py`` side by side (as SandboxFusion lays
    them out), so the program's directory -- sys.path[0] -- holds them and they can be imported."""
    os.chmod(exec_dir, 0o711)  # the program may traverse it to its work dir, not list or write it
    workdir.mkdir(mode=0o700)
    for rel, content in request.files.items():
        pure = safe_relative_path(rel, "files")
        if str(pure) == SCRIPT_NAME:
            raise RequestError(f"files[{rel!r}]: {SCRIPT_NAME} is where the program itself is written")
        if request.data_source is not None and pure.parts[0] == DATA_DIR:
            raise RequestError(f"files[{rel!r}]: {DATA_DIR}/ is where data_dir is mounted")
        target = workdir / pure
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content)
        except (FileExistsError, NotADirectoryError, IsADirectoryError) as exc:
            raise RequestError(f"files[{rel!r}]: clashes with another entry of files ({exc.strerror})") from exc
    (workdir / SCRIPT_NAME).write_text(request.code, encoding="utf-8")
    if request.data_source is not None:
        (workdir / DATA_DIR).mkdir(mode=0o755)  # the mount point of the task's public directory
    if uid is not None:
        for root, dirs, files in os.walk(workdir):
            os.chown(root, uid, uid)
            for name in files:
                os.chown(os.path.join(root, name), uid, uid)


def _remove(path: Path) -> None:
    """Remove an execution's directory, whatever permissions the program left on what it made there."""

    def force(func, p, _exc):
        try:
            os.chmod(os.path.dirname(p), 0o700)
            os.chmod(p, 0o700)
        except OSError:
            pass
        func(p)

    shutil.rmtree(path, onerror=force)


def _filter_pipe() -> int:
    """The read end of a pipe holding the seccomp program (bwrap reads it up to end of file)."""
    code = seccomp.program()
    read, write = os.pipe()
    try:
        os.write(write, code)  # a few hundred bytes: well within the pipe's buffer
    finally:
        os.close(write)
    return read


def _namespace_layout(workdir: Path, work_root: str, needed: list[str]) -> dict[str, Any]:
    """What a deployed-mode execution's mount namespace hides (the server's home) and shows again
    read-only: each of ``needed`` (the interpreter, its libraries) that a mask would hide."""
    home = os.path.expanduser("~")
    hidden = [home] if home not in ("/", "") and os.path.isdir(home) and not str(workdir).startswith(home + "/") else []
    under = lambda path, d: path == d or path.startswith(d.rstrip("/") + "/")  # noqa: E731
    visible = [path for path in dict.fromkeys(needed)
               if masked(path) or under(path, work_root) or any(under(path, d) for d in hidden)]
    return {"work_root": work_root, "hidden": hidden, "visible": visible}


def _bwrap_prefix(bwrap: str, workdir: Path, work_root: str, python: str, limits: Limits, filter_fd: int,
                  info_fd: int, data: Optional[DataMount] = None) -> list[str]:
    """bwrap's arguments for a cold deployed-mode execution, up to the program's command line."""
    layout = _namespace_layout(workdir, work_root, [interpreter_root(python)])
    return bwrap_command(bwrap, workdir=str(workdir), work_root=work_root, seccomp_fd=filter_fd, info_fd=info_fd,
                         visible=layout["visible"], hidden=layout["hidden"], tmpfs_bytes=limits.tmpfs_mb << 20,
                         data=bwrap_args(data) if data is not None else None, devices=tuple(limits.devices))


def _data_mount(request: ExecutionRequest, workdir: Path, uid: Optional[int], isolation: Isolation) -> Optional[DataMount]:
    """The execution's task data mount (:mod:`wmrl_sandbox.data_mount`), if it asked for one."""
    if request.data_hide is None:
        if request.data_source is not None:
            raise RequestError("data_dir: no tasks directory to hide")  # the server always sets data_hide with it
        return None
    if not (isolation.bwrap if uid is None else isolation.mount_namespace):
        raise RequestError("--tasks-dir: executions get no mount namespace here, which hides the private answers")
    target = str(workdir / DATA_DIR) if request.data_source is not None else None
    return DataMount(request.data_source, target, request.data_hide)


def _namespace_init(info_fd: int, parent: int, timeout: float = 10.0) -> Optional[int]:
    """A pidfd of the PID namespace's first process (its host pid read from bwrap's info pipe, or
    from a warm child's, which speaks the same protocol); None if it is gone already.

    ``parent`` (bwrap, or the warm child that made the namespace) reaps that process when it ends,
    and may have done so before the pidfd is opened: its pid may then name another process. The
    pidfd is kept only if, while it was open and its process alive, that process was ``parent``'s
    child: then it is the namespace's first process, and the pidfd can never point elsewhere.
    """
    data = b""
    end = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        sel.register(info_fd, selectors.EVENT_READ)
        while time.monotonic() < end and sel.select(max(0.0, end - time.monotonic())):
            chunk = os.read(info_fd, 4096)
            if not chunk:
                break
            data += chunk
            try:
                pid = int(json.loads(data)["child-pid"])
            except (ValueError, KeyError):
                continue
            try:
                pidfd = os.pidfd_open(pid)
            except ProcessLookupError:  # already gone, and its namespace with it
                return None
            fields = stat_fields(pid)
            if fields is None or int(fields[1]) != parent or pidfd_exited(pidfd):
                os.close(pidfd)  # reaped before we looked, and its pid reused (or ended): never signal it
                return None
            return pidfd
    return None


def _end_namespace(init_fd: int, deadline_s: float = 5.0) -> None:
    """Kill a PID namespace's first process (through its pidfd), which takes every process of the
    namespace with it, and wait until it has exited (the kernel has then ended every process in
    the namespace); a zombie left re-parented to this server is reaped."""
    try:
        signal.pidfd_send_signal(init_fd, signal.SIGKILL)
    except ProcessLookupError:  # exited already
        pass
    if not pidfd_exited(init_fd, deadline_s):
        raise RuntimeError("the execution's PID namespace did not end")
    reap_orphans()


def execute(request: ExecutionRequest, *, work_root: str, uid: Optional[int], isolation: Isolation,
            limits: Limits = Limits(), python: str = sys.executable, warm: Optional[Any] = None,
            groups: Optional[cgroups.Cgroups] = None) -> ExecutionResult:
    """Run ``request.code`` (:func:`_execute`); cold again if the slot's fork server failed to start it."""
    options = dict(work_root=work_root, uid=uid, isolation=isolation, limits=limits, python=python, groups=groups)
    try:
        return _execute(request, warm=warm, **options)
    except WarmSpawnFailed:  # a fork server killed or dying as the execution was sent: nothing of it is left
        return _execute(request, warm=None, **options)


def _execute(request: ExecutionRequest, *, work_root: str, uid: Optional[int], isolation: Isolation,
             limits: Limits, python: str, warm: Optional[Any], groups: Optional[cgroups.Cgroups]) -> ExecutionResult:
    """Run ``request.code`` as ``python -E -s -B <workdir>/main.py`` in a fresh directory under ``work_root``.

    ``warm``: the slot's fork server (:class:`wmrl_sandbox.warm_slots.Zygote`): the program
    runs in a child forked from it, with the same isolation, instead of a new interpreter.
    ``groups``: the server's cgroups: the execution gets a group of its own with ``memory_mb``
    and ``limits.nproc`` for all its processes together (and ``groups.cpus`` CPUs).

    Blocking (the server runs it in a worker thread). ``uid`` is the slot's dedicated uid in
    root mode, None otherwise. Raises RequestError for an invalid request, and only before
    anything ran; every failure of the sandbox itself, before or after the program ran, is a
    result with status ``Error`` (never an exception).
    """
    run_timeout = min(max(float(request.run_timeout), 0.01), limits.max_run_timeout)
    memory_mb = memory_limit_mb(request.memory_limit_mb, limits)
    if uid is None and not isolation.bwrap:
        warm = None  # no isolation to build in the child: cold (wmrl_sandbox.warm)
    marker = secrets.token_hex(8)
    exec_dir = Path(tempfile.mkdtemp(prefix="x-", dir=work_root))
    workdir = exec_dir / WORK_SUBDIR
    proc = exec_group = None
    ns_fd = info_read = init_fd = None  # root mode's mount namespace; bwrap's info pipe and PID namespace
    start = time.monotonic()
    try:
        _prepare(exec_dir, workdir, request, uid)
        data = _data_mount(request, workdir, uid, isolation)
        exec_group = groups.create(memory_mb, limits.nproc) if groups is not None else None
        cgroup_join = tuple(exec_group.join_files) if exec_group is not None else ()
        tasks_in_cgroup = exec_group is not None and exec_group.bounds_tasks
        out, err = _Capture(limits.max_output_bytes), _Capture(limits.max_output_bytes)
        # Root mode with a mount namespace: the child hands over a handle on it (see make_preexec).
        want_ns = uid is not None and isolation.mount_namespace and bool(request.fetch_files)
        ns_parent, ns_child = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM) if want_ns else (None, None)
        filter_read = info_write = None
        try:
            # -E -s instead of -I: -I also implies -P, which keeps the program's directory off sys.path.
            command = [python, "-E", "-s", "-B", str(workdir / SCRIPT_NAME)]
            if uid is None and isolation.bwrap:
                info_read, info_write = os.pipe()  # closed in the outer finally, whatever fails
                if warm is None:  # a warm child makes the namespaces itself and loads the filter
                    filter_read = _filter_pipe()
                    command = _bwrap_prefix(isolation.bwrap, workdir, work_root, python, limits, filter_read,
                                            info_write, data) + command
            start = time.monotonic()
            if warm is not None:
                layout = None
                if info_write is not None:  # deployed mode: the child makes bwrap's namespaces itself
                    layout = {**_namespace_layout(workdir, work_root, [interpreter_root(python),
                                                                       *warm.info["libraries"]]),
                              "tmpfs_bytes": limits.tmpfs_mb << 20, "devices": list(limits.devices)}
                job = job_message(warm, script=str(workdir / SCRIPT_NAME), workdir=str(workdir), exec_dir=str(exec_dir),
                                  env=child_env(str(workdir), marker, limits.threads), uid=uid, isolation=isolation, limits=limits,
                                  memory_mb=memory_mb, run_timeout=run_timeout, python=python, namespaces=layout,
                                  cgroup_join=cgroup_join, tasks_in_cgroup=tasks_in_cgroup, data=data)
                extra_fd = info_write if info_write is not None else ns_child.fileno() if ns_child is not None else None
                try:
                    proc = warm.spawn(job, extra_fd)
                except BaseException:
                    kill_everything(None, uid, marker)  # a child may have been forked before it failed
                    raise
            else:
                proc = subprocess.Popen(
                    command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                    cwd=str(workdir), env=child_env(str(workdir), marker, limits.threads), start_new_session=True,
                    pass_fds=tuple(fd for fd in (filter_read, info_write) if fd is not None),
                    preexec_fn=make_preexec(str(exec_dir), uid, isolation, limits, memory_mb, run_timeout, python,
                                             ns_sock=ns_child, cgroup_join=cgroup_join,
                                             tasks_in_cgroup=tasks_in_cgroup, data=data),
                )
            live_mains.claim(proc.pid)  # ours to reap: another execution's orphan reaper leaves it alone
            if ns_parent is not None:
                ns_child.close()
                ns_parent.settimeout(5.0)
                _, fds, _, _ = socket.recv_fds(ns_parent, 1, 1)
                if not fds:
                    raise RuntimeError("the execution did not hand over its mount namespace")
                ns_fd = fds[0]
        finally:
            for sock in (ns_parent, ns_child):
                if sock is not None:
                    sock.close()
            for fd in (filter_read, info_write):
                if fd is not None:
                    os.close(fd)
        if info_read is not None:
            init_fd = _namespace_init(info_read, proc.pid)
        stdin = request.stdin.encode() if request.stdin else b""
        if not stdin:
            proc.stdin.close()
        finished = _pump(proc, stdin, start + run_timeout, out, err, until_eof=False)
        elapsed = time.monotonic() - start
        # The execution ends with its main process: whatever it left behind dies now, which
        # also closes any pipe a daemonized grandchild kept open.
        group = None if warm is not None else proc.pid
        killed = kill_everything(group, uid, marker)
        if init_fd is not None:
            _end_namespace(init_fd)
        return_code = proc.wait()
        counters = exec_group.end() if exec_group is not None else {}
        _pump(proc, b"", time.monotonic() + 5.0, out, err, until_eof=True)
        if not request.fetch_files:
            files, files_truncated = {}, False
        elif uid is None:
            files, files_truncated = fetch_in_workdir(workdir, request.fetch_files, limits.max_fetch_bytes)
        else:
            files, files_truncated = fetch_as_uid(workdir, request.fetch_files, uid, ns_fd, limits.max_fetch_bytes)
        return ExecutionResult(
            status="Finished" if finished else "TimeLimitExceeded",
            execution_time=elapsed,
            return_code=return_code if finished else None,
            stdout=out.text(),
            stderr=err.text(),
            stdout_truncated=out.truncated,
            stderr_truncated=err.truncated,
            files=files,
            files_truncated=files_truncated,
            leftover_processes_killed=len(killed - {proc.pid}),
            **counters,
        )
    except (RequestError, WarmSpawnFailed):  # RequestError only from _prepare: nothing has run
        raise
    except Exception as exc:  # the sandbox failed, not the program: reported, never raised
        return ExecutionResult(status="Error", execution_time=time.monotonic() - start, return_code=None,
                               stdout="", stderr=f"sandbox error: {type(exc).__name__}: {exc}")
    finally:
        if info_read is not None:
            os.close(info_read)
        if ns_fd is not None:
            os.close(ns_fd)
        if proc is not None:
            if proc.returncode is None:
                try:
                    kill_everything(None if warm is not None else proc.pid, uid, marker)
                    if init_fd is not None:
                        _end_namespace(init_fd)
                finally:
                    proc.wait()  # a warm one also frees its fork server here
            live_mains.release(proc.pid)
            for stream in (proc.stdin, proc.stdout, proc.stderr):
                if stream is not None and not stream.closed:
                    try:
                        stream.close()
                    except OSError:
                        pass
        if init_fd is not None:
            os.close(init_fd)
        if exec_group is not None and exec_group.ended is None:
            try:
                exec_group.end()
            except (OSError, RuntimeError):
                pass  # removed with the server's subtree, or by the next server
        _remove(exec_dir)


__all__ = [
    "ExecutionRequest", "ExecutionResult", "Limits", "RequestError", "execute", "memory_limit_mb",
    "safe_relative_path", "SCRIPT_NAME",
]
