"""Warm starts: one fork server per execution slot, with the scientific stack already imported.

A cold execution starts a fresh interpreter that imports numpy and scikit-learn itself: about
1 s of CPU on every execution, far more than a small model takes to fit. A *fork server* (a
zygote) is an interpreter started once per slot that imports :data:`WARM_MODULES` and then
forks one fresh child per execution:

* the child applies the execution's isolation after the fork and before any user code runs,
  with the same function a cold execution runs before ``exec``
  (:func:`wmrl_sandbox.preexec.make_preexec`: mount, network and IPC namespaces, private
  /tmp, /var/tmp and /dev/shm, rlimits, the slot's uid, ``no_new_privs``, seccomp), then
  clears every capability (a cold execution loses them in ``execve``; there is none here) and
  checks that none is left;
* it runs ``main.py`` as ``__main__`` in a fresh module, with ``sys.argv`` and ``sys.path[0]``
  as ``python main.py`` sets them, tracebacks printed as the interpreter prints them, and the
  interpreter's exit sequence (non-daemon threads joined, atexit handlers run) at the end;
* ``random`` and numpy's global generator are reseeded from the OS, so executions do not
  share the zygote's random state. (The ``str`` hash seed is the zygote's, fixed per slot.)

Nothing of one execution survives into the next: each child is a separate process, killed
with everything it started (its uid's processes) when it ends, and the zygote itself never
runs user code. The zygote reports each child's pid (with a pidfd, so a reused pid can never
be mistaken for it) and, once it has reaped it, its wait status.

In root mode the child applies root mode's isolation (a uid of its own per slot, namespaces
made as root). In the deployed non-root mode, where a cold execution's namespaces come from
bubblewrap (which only runs a new program), the child makes the same namespaces itself
(:func:`wmrl_sandbox.namespaces.enter`: a user namespace of its own and the rest inside it) and
reports the namespace's first process as bubblewrap does, so the server ends it the same way.
Where neither holds (no isolation at all), executions start cold; :attr:`WarmSlots.reason` says why.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
import types
from dataclasses import asdict
from typing import Any, Optional

from wmrl_sandbox.isolation import Isolation
from wmrl_sandbox.linux import PR_SET_PDEATHSIG, clear_capabilities, libc, pidfd_exited
from wmrl_sandbox.preexec import make_preexec
from wmrl_sandbox.processes import live_mains

WARM_MODULES: tuple[str, ...] = (
    "numpy", "scipy", "scipy.stats", "pandas", "sklearn", "sklearn.base", "sklearn.datasets", "sklearn.decomposition",
    "sklearn.dummy", "sklearn.ensemble", "sklearn.feature_selection", "sklearn.linear_model", "sklearn.metrics",
    "sklearn.model_selection", "sklearn.naive_bayes", "sklearn.neighbors", "sklearn.pipeline",
    "sklearn.preprocessing", "sklearn.svm", "sklearn.tree",
)
"""Imported by every fork server before it serves (a module that fails to import is skipped and reported)."""

READY_TIMEOUT_S = 120.0
_PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The zygote's environment while it imports: one thread per BLAS/OpenMP pool (as executions get), and no
# allocator threads (a process must be single-threaded when it forks).
_ZYGOTE_ENV = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
               "ARROW_DEFAULT_MEMORY_POOL": "system", "JE_ARROW_MALLOC_CONF": "background_thread:false",
               "MPLBACKEND": "Agg", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
               "PATH": "/usr/local/bin:/usr/bin:/bin"}
log = logging.getLogger("wmrl.sandbox")


# --------------------------------------------------------------------------- the zygote (its own process)


def serve(fd: int, modules: list[str]) -> None:
    """The zygote's main loop: import ``modules``, say ready, then fork one child per request.

    Nothing is ever imported from a directory a request controls: the current directory and
    this package's parent leave ``sys.path`` before anything else, and the modules a child needs
    to isolate itself (the executor, seccomp) are imported here, while the child still runs as root.
    """
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # never outlive the server
    base_vm_mb = _vm_mb()  # a bare interpreter's address space, before any import
    from wmrl_sandbox import executor, seccomp  # noqa: F401 - imported now, as root, from the package

    sys.path[:] = [p for p in sys.path if p not in ("", _PACKAGE_PARENT)]
    sock = socket.socket(fileno=fd)
    imported, failed = [], {}
    for name in modules:
        try:
            importlib.import_module(name)
            imported.append(name)
        except Exception as exc:  # noqa: BLE001 - reported, the rest still warms up
            failed[name] = f"{type(exc).__name__}: {exc}"
    import gc

    gc.collect()
    gc.freeze()  # keep the imported objects out of the children's collections: fewer copy-on-write pages
    found = sorted({os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, *sys.path)
                    if p and os.path.isdir(p)})
    libraries = [p for p in found if not any(p.startswith(q + "/") for q in found)]  # the outermost of each tree
    vm_mb = _vm_mb()
    sock.send(json.dumps({"ready": True, "modules": imported, "failed": failed, "vm_mb": vm_mb,
                          "preloaded_mb": max(0, vm_mb - base_vm_mb), "libraries": libraries,
                          "threads": len(os.listdir("/proc/self/task"))}).encode())
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(sock, 1 << 20, 8)
        except OSError:
            return
        if not message:
            return  # the server closed its end
        zygote = os.getpid()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the child, reported through its pipes
            _child(json.loads(message), fds, sock, zygote)
        for descriptor in fds:
            os.close(descriptor)
        pidfd = os.pidfd_open(pid)  # before reaping: it can only ever name this child
        socket.send_fds(sock, [json.dumps({"pid": pid}).encode()], [pidfd])
        os.close(pidfd)
        _, status = os.waitpid(pid, 0)
        sock.send(json.dumps({"status": status}).encode())


def _vm_mb() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) // 1024
    return 0


def _die_with(parent: int) -> None:  # pragma: no cover - in the child
    """Be killed when ``parent`` (the fork server) dies, also if it died already."""
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0 or os.getppid() != parent:
        os._exit(126)


def _child(job: dict, fds: list[int], control: socket.socket, zygote: int) -> None:  # pragma: no cover - in the child
    """Become the execution: its descriptors, environment and isolation, then its directory and program.

    The child dies with its fork server: when the server gives up on a fork server (a spawn that
    failed after the fork, an answer that never came), killing it ends the child and, in the
    deployed mode, the namespace whose first process dies with the child. No cleanup by uid or by
    environment marker could find it there (its environment is set after the exec, so /proc does
    not show the marker).
    """
    try:
        control.close()
        _die_with(zygote)  # kept through unshare (the new user namespace is the old one's child)
        os.setsid()
        for target, descriptor in zip((0, 1, 2), fds[:3]):
            os.dup2(descriptor, target)
        ns_fd = fds[3] if len(fds) > 3 else None
        keep = {0, 1, 2} | ({ns_fd} if ns_fd is not None else set())
        for descriptor in map(int, os.listdir("/proc/self/fd")):
            if descriptor not in keep:
                with contextlib.suppress(OSError):
                    os.close(descriptor)
        os.environ.clear()
        os.environ.update(job["env"])
        from wmrl_sandbox import executor

        isolation = Isolation(**job["isolation"])
        limits = executor.Limits(**job["limits"])
        if job.get("namespaces") is not None:  # deployed mode: fds[3] is the info pipe, as bwrap's
            _enter_namespaces(job, isolation, limits, info_fd=ns_fd)
            os.environ["PWD"] = job["workdir"]  # as bwrap's --chdir sets it
        else:
            ns_sock = socket.socket(fileno=ns_fd) if ns_fd is not None else None
            make_preexec(job["exec_dir"], job["uid"], isolation, limits, job["memory_mb"], job["run_timeout"],
                         job["python"], ns_sock=ns_sock, warm=True, reveal=tuple(job["reveal"]),
                         cgroup_join=tuple(job["cgroup_join"]), tasks_in_cgroup=job["tasks_in_cgroup"])()
            if ns_sock is not None:
                ns_sock.close()
            _die_with(zygote)  # the uid change above cleared it
        os.chdir(job["workdir"])  # as the execution's uid, in its own mount namespace
    except BaseException as exc:  # noqa: BLE001 - the sandbox failed before the program: say so, never run it
        with contextlib.suppress(BaseException):
            os.write(2, f"sandbox error: warm start: {type(exc).__name__}: {exc}\n".encode())
        os._exit(126)
    _run_program(job["script"])


def _enter_namespaces(job: dict, isolation: Any, limits: Any, info_fd: int) -> None:  # pragma: no cover - in the child
    """What a cold execution gets from bubblewrap, in this process: the limits first (as the server
    sets them before bwrap starts), then the namespaces, then no capability and the seccomp filter."""
    from wmrl_sandbox import namespaces, seccomp

    make_preexec(job["exec_dir"], None, isolation, limits, job["memory_mb"], job["run_timeout"], job["python"],
                 cgroup_join=tuple(job["cgroup_join"]), tasks_in_cgroup=job["tasks_in_cgroup"])()
    layout = job["namespaces"]
    namespaces.enter(workdir=job["workdir"], work_root=layout["work_root"], info_fd=info_fd,
                     visible=layout["visible"], hidden=layout["hidden"], tmpfs_bytes=layout["tmpfs_bytes"])
    clear_capabilities()
    seccomp.set_no_new_privs()  # as bwrap sets it, with or without the filter
    if isolation.seccomp:
        seccomp.install()


def _run_program(script: str) -> None:  # pragma: no cover - in the child
    """``python main.py`` from here on: a fresh ``__main__``, the interpreter's tracebacks, and an
    exit that does what a program can see of the interpreter's (:func:`_exit`). No frame here
    keeps the program's namespace alive once it has run, so that exit can release it."""
    import builtins
    import random

    random.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()
    preloaded = frozenset(sys.modules)
    sys.argv = [script]
    sys.path[:] = [os.path.dirname(script)] + sys.path
    main = types.ModuleType("__main__")
    main.__dict__.update({"__file__": script, "__builtins__": builtins, "__cached__": None})
    sys.modules["__main__"] = main
    del main
    status: object = None
    try:
        with open(script, "rb") as fh:
            source = fh.read()
        exec(compile(source, script, "exec", dont_inherit=True), sys.modules["__main__"].__dict__)  # noqa: S102
    except SystemExit as exc:
        status = exc.code
    except KeyboardInterrupt as exc:  # the interpreter prints it, then dies of SIGINT
        _print_exception(exc)
        _flush_streams(report=False)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    except BaseException as exc:  # noqa: BLE001 - printed like the interpreter does, without this frame
        _print_exception(exc)
        status = 1
    _exit(status, preloaded)


def _exit(code: object, preloaded: frozenset) -> None:  # pragma: no cover - in the child
    """End the execution as the interpreter's exit would, less its teardown of the preloaded stack.

    Tearing down numpy, scipy, pandas and scikit-learn touches the pages the fork server shares
    with the child, and each touch copies a page: measured, that teardown was most of a warm
    execution's time (about 100 of 157 ms for an import-and-fit program on a loaded 2-core machine).
    What a program can observe of ``Py_FinalizeEx`` still happens, in its order: a ``SystemExit``
    code means what it means to the interpreter; non-daemon threads are joined; ``atexit`` handlers
    run; the standard streams are flushed (a failure is reported and exits 120); a collection runs;
    the program's own modules (``__main__`` and every module imported after the fork) leave
    ``sys.modules`` and are collected, those still alive cleared as CPython clears a module, so
    files it left open are flushed and closed and its finalizers run with their globals intact
    where the interpreter's would. Finalizers of objects that the preloaded modules hold are not
    run (the language never promises them at exit). Tested against the cold path in test_warm.
    """
    import atexit
    import gc
    import weakref

    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code
    else:
        with contextlib.suppress(BaseException):
            print(code, file=sys.stderr)
        status = 1
    with contextlib.suppress(BaseException):
        threading._shutdown()  # what the interpreter's exit calls first
    atexit._run_exitfuncs()  # prints what a handler raises, as at exit
    if not _flush_streams(report=True):
        status = 120
    gc.collect()
    alive = []
    for name in ["__main__", *(name for name in list(sys.modules) if name not in preloaded)]:  # sys.modules' order
        module = sys.modules.pop(name, None)
        with contextlib.suppress(TypeError):  # sys.modules may hold objects that take no weak reference
            alive.append(weakref.ref(module))
    module = None
    gc.collect()
    for ref in reversed(alive):  # the last imported first, __main__ last, as the interpreter does
        namespace = getattr(ref(), "__dict__", None)
        if isinstance(namespace, dict):
            with contextlib.suppress(BaseException):
                _clear_namespace(namespace)
        namespace = None
    gc.collect()
    _flush_streams(report=False)  # what finalizers printed (the interpreter flushes it when it closes the streams)
    os._exit(status & 0xFF)


def _clear_namespace(namespace: dict) -> None:  # pragma: no cover - in the child
    """As CPython clears a module's dict at exit: values set to None, one-underscore names first."""
    for first_pass in (True, False):
        for name in list(namespace):
            if name == "__builtins__" or not isinstance(name, str):
                continue
            if not first_pass or (name.startswith("_") and not name.startswith("__")):
                namespace[name] = None


def _flush_streams(report: bool) -> bool:  # pragma: no cover - in the child
    """Flush stdout and stderr; False if one failed, reported (when ``report``) as the interpreter does."""
    flushed = True
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None and not stream.closed:
                stream.flush()
        except BaseException as exc:  # noqa: BLE001 - the interpreter reports it and exits 120
            flushed = False
            if report:
                with contextlib.suppress(BaseException):
                    sys.stderr.write(f"Exception ignored in: {stream!r}\n"
                                     + "".join(traceback.format_exception_only(type(exc), exc)))
    return flushed


def _print_exception(exc: BaseException) -> None:  # pragma: no cover - in the child
    tb = exc.__traceback__.tb_next if exc.__traceback__ else None
    try:
        sys.excepthook(type(exc), exc.with_traceback(tb), tb)
    except BaseException:  # noqa: BLE001 - a broken hook: the default one, as the interpreter falls back
        traceback.print_exception(type(exc), exc, tb)


# --------------------------------------------------------------------------- the server side


class WarmChild:
    """One warm execution's main process, as the server sees it (what ``subprocess.Popen`` offers there)."""

    def __init__(self, zygote: "Zygote", pid: int, pidfd: int, stdin: int, stdout: int, stderr: int):
        self._zygote = zygote
        self.pid = pid
        self._pidfd = pidfd
        self.stdin = open(stdin, "wb", buffering=0)
        self.stdout = open(stdout, "rb", buffering=0)
        self.stderr = open(stderr, "rb", buffering=0)
        self.returncode: Optional[int] = None

    def open_pidfd(self) -> int:
        return os.dup(self._pidfd)

    def wait(self) -> int:
        """The exit code (negative: killed by that signal), once the zygote has reaped the child.

        If the zygote died meanwhile, its exit status is lost and -SIGKILL stands for it (every
        process of the slot's uid has been killed by then).
        """
        if self.returncode is None:
            try:
                status = self._zygote.receive(timeout=30.0)["status"]
                self.returncode = os.waitstatus_to_exitcode(status)
            except Exception:  # noqa: BLE001 - the zygote is gone or confused: never trust it again
                self._zygote.stop()
                self.returncode = -signal.SIGKILL
                self._reap_orphaned()
            finally:
                if self._pidfd >= 0:
                    os.close(self._pidfd)
                    self._pidfd = -1
                self._zygote.busy = False
        return self.returncode

    def _reap_orphaned(self, timeout: float = 5.0) -> None:
        """With its fork server gone, the child (which dies with it) is re-parented to this server, a
        child subreaper: reap it here, through its pidfd (so never another process that took its pid)."""
        if not pidfd_exited(self._pidfd, timeout):
            return  # still alive: the caller's cleanup (by uid, or the namespace) ends it
        with contextlib.suppress(ChildProcessError, OSError):  # not ours: someone else reaps it
            os.waitid(os.P_PIDFD, self._pidfd, os.WEXITED | os.WNOHANG)


class Zygote:
    """One slot's fork server (its own process; started once, restarted when it dies)."""

    def __init__(self, python: str, modules: tuple[str, ...] = WARM_MODULES):
        self.python, self.modules = python, modules
        self.info: Optional[dict] = None
        self.busy = False
        self._proc: Optional[subprocess.Popen] = None
        self._sock: Optional[socket.socket] = None
        self._lock = threading.RLock()  # its slot's worker and the server's start-up wait may both touch it

    def start(self) -> None:
        with self._lock:
            self._start()

    def _start(self) -> None:
        self._stop()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        boot = (f"import sys; sys.path.insert(0, {_PACKAGE_PARENT!r}); from wmrl_sandbox.warm import serve; "
                f"serve({theirs.fileno()}, {list(self.modules)!r})")
        try:
            self._proc = subprocess.Popen([self.python, "-E", "-s", "-B", "-c", boot], pass_fds=[theirs.fileno()],
                                          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, env=dict(_ZYGOTE_ENV),
                                          cwd="/", start_new_session=True)
        finally:
            theirs.close()
        live_mains.claim(self._proc.pid)  # the server's orphan reaper must leave it to us
        self._sock = ours

    def ready(self, timeout: float = 0.0) -> bool:
        """Whether it has imported its modules and serves (waits up to ``timeout`` seconds for that)."""
        with self._lock:
            return self._ready(timeout)

    def _ready(self, timeout: float) -> bool:
        if self.info is not None:
            return self.alive()
        if self._sock is None:
            return False
        try:
            self.info = self.receive(timeout)
        except (TimeoutError, BlockingIOError):
            return False
        except (OSError, ValueError):
            self._stop()
            return False
        if self.info.get("threads") != 1:  # forking a threaded process is unsafe: stay cold
            log.warning("fork server has %s threads after its imports: not used", self.info.get("threads"))
            self._stop()
            return False
        return True

    def poll_ready(self) -> None:
        """Take its ready message if it has come, unless someone else holds it right now."""
        if self._lock.acquire(blocking=False):
            try:
                self._ready(0.0)
            finally:
                self._lock.release()

    def alive(self) -> bool:
        proc = self._proc
        return proc is not None and proc.poll() is None

    def receive(self, timeout: Optional[float]) -> dict:
        self._sock.settimeout(timeout)
        data = self._sock.recv(1 << 16)
        if not data:
            raise OSError("the fork server closed its socket")
        return json.loads(data)

    def spawn(self, job: dict, ns_fd: Optional[int]) -> WarmChild:
        """Fork a child for ``job``, its stdin/stdout/stderr on new pipes (and the mount-namespace socket)."""
        with self._lock:
            return self._spawn(job, ns_fd)

    def _spawn(self, job: dict, ns_fd: Optional[int]) -> WarmChild:
        pipes = [os.pipe() for _ in range(3)]  # (read, write) each; the child gets stdin's read end, the others' write ends
        theirs = [pipes[0][0], pipes[1][1], pipes[2][1]]
        ours = [pipes[0][1], pipes[1][0], pipes[2][0]]
        self.busy = True
        try:
            socket.send_fds(self._sock, [json.dumps(job).encode()], theirs + ([ns_fd] if ns_fd is not None else []))
            self._sock.settimeout(10.0)
            message, fds, _, _ = socket.recv_fds(self._sock, 1 << 16, 1)
            if not message or not fds:
                raise OSError("the fork server did not start the execution")
            pid = json.loads(message)["pid"]
        except BaseException as exc:
            self.busy = False
            for descriptor in ours:
                os.close(descriptor)
            self._stop()  # kills a child it may have forked (it dies with its fork server)
            with contextlib.suppress(OSError):  # a new one for the slot's next executions
                self._start()
            if isinstance(exc, (OSError, ValueError, KeyError)):
                from wmrl_sandbox.executor import WarmSpawnFailed

                raise WarmSpawnFailed(f"the fork server did not start the execution: {exc}") from exc
            raise
        finally:
            for descriptor in theirs:
                os.close(descriptor)
        return WarmChild(self, pid, fds[0], *ours)

    def stop(self) -> None:
        with self._lock:
            self._stop()

    def _stop(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._proc is not None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.kill()
            self._proc.wait()
            live_mains.release(self._proc.pid)
            self._proc = None
        self.info = None


def _kernel() -> tuple[int, int]:
    release = os.uname().release
    try:
        major, minor = release.split(".")[:2]
        return int(major), int("".join(ch for ch in minor if ch.isdigit()) or 0)
    except ValueError:
        return (0, 0)


class WarmSlots:
    """The fork servers of a server's slots, one per slot (root or namespaces mode; see the module docstring)."""

    def __init__(self, slots: int, python: str, isolation: Any, enabled: bool = True,
                 modules: tuple[str, ...] = WARM_MODULES):
        self.reason: Optional[str] = None
        if not enabled:
            self.reason = "disabled (--no-warm)"
        elif isolation.mode not in ("root", "namespaces"):
            self.reason = (f"isolation mode {isolation.mode!r}: warm starts need root mode or namespaces mode "
                           "(user namespaces), so executions start cold")
        elif isolation.mode == "namespaces" and _kernel() < (5, 12):
            self.reason = (f"kernel {'.'.join(map(str, _kernel()))}: the deployed mode's warm start needs "
                           "mount_setattr (Linux 5.12), so executions start cold (bubblewrap)")
        self.zygotes: dict[int, Zygote] = {}
        if self.reason is None:
            self.zygotes = {slot: Zygote(python, modules) for slot in range(slots)}
            for zygote in self.zygotes.values():
                zygote.start()

    @property
    def enabled(self) -> bool:
        return self.reason is None

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> int:
        """Wait until every fork server has imported its modules; returns how many are ready."""
        end = time.monotonic() + timeout
        for zygote in self.zygotes.values():
            zygote.ready(max(0.0, end - time.monotonic()))
        return sum(z.ready() for z in self.zygotes.values())

    def for_slot(self, slot: int) -> Optional[Zygote]:
        """The slot's fork server if it can take this execution now, else None (the execution starts cold,
        while it is not ready).

        A fork server that died is restarted here; until it is ready again its slot runs cold.
        """
        zygote = self.zygotes.get(slot)
        if zygote is None or zygote.busy:
            return None
        if not zygote.ready():
            if not zygote.alive():
                zygote.start()
            return None
        return zygote

    def describe(self) -> dict:
        """What /healthz reports; never waits on a fork server (one busy with its slot is skipped)."""
        for zygote in self.zygotes.values():
            zygote.poll_ready()
        ready = [z for z in self.zygotes.values() if z.info is not None and z.alive()]
        info = ready[0].info if ready else {}
        return {"enabled": self.enabled, "reason": self.reason, "slots": len(self.zygotes), "ready": len(ready),
                "modules": info.get("modules", []), "failed": info.get("failed", {}), "vm_mb": info.get("vm_mb"),
                "preloaded_mb": info.get("preloaded_mb"),
                "pids": sorted(z._proc.pid for z in self.zygotes.values() if z._proc is not None and z.alive())}

    def close(self) -> None:
        for zygote in self.zygotes.values():
            zygote.stop()


def job_message(zygote: Zygote, *, script: str, workdir: str, exec_dir: str, env: dict[str, str],
                uid: Optional[int], isolation: Any, limits: Any, memory_mb: int, run_timeout: float,
                python: str, namespaces: Optional[dict] = None, cgroup_join: tuple[str, ...] = (),
                tasks_in_cgroup: bool = False) -> dict:
    """What a fork server needs to make one child into an execution (JSON).

    ``memory_mb`` is what the program may allocate: the child's address-space limit adds what the
    zygote's imports occupy beyond a bare interpreter (``preloaded_mb``, mostly shared library
    mappings), so a program gets the room it would get cold, where it pays for what it imports.

    ``reveal``: the zygote's library directories. The child reads modules it has not imported
    yet from them as the slot's uid; where one lies under a directory closed to other uids (an
    interpreter under /root), the child's mount namespace masks that directory and binds only
    these back (:func:`wmrl_sandbox.preexec.make_preexec`).

    ``namespaces`` (deployed mode): what :func:`wmrl_sandbox.namespaces.enter` hides and shows
    (``work_root``, ``hidden``, ``visible``, ``tmpfs_bytes``), as bwrap would for a cold execution.
    ``cgroup_join``: the execution's cgroup, which the child joins before anything else
    (``tasks_in_cgroup``: it bounds the execution's tasks; see ``preexec.make_preexec``).
    """
    return {"script": script, "workdir": workdir, "exec_dir": exec_dir, "env": env, "uid": uid,
            "isolation": asdict(isolation), "limits": asdict(limits), "memory_mb": memory_mb + zygote.info["preloaded_mb"],
            "run_timeout": run_timeout, "python": python, "reveal": zygote.info["libraries"], "namespaces": namespaces,
            "cgroup_join": list(cgroup_join), "tasks_in_cgroup": tasks_in_cgroup}


__all__ = ["WARM_MODULES", "WarmChild", "WarmSlots", "Zygote", "job_message", "serve"]
