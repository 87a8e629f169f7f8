"""Warm starts, the server's side: one fork server per execution slot, and executions forked from it.

A fork server (a *zygote*, :mod:`wmrl_sandbox.warm`) is an interpreter started once per slot
that imports :data:`WARM_MODULES` and then forks one fresh child per execution, so an
execution does not pay for importing the scientific stack itself. Here the server starts each
slot's fork server (:class:`Zygote`), waits until it is ready, sends it an execution
(:func:`job_message`, :meth:`Zygote.spawn`) and watches the child it forked
(:class:`WarmChild`, what ``subprocess.Popen`` offers for a cold execution). A fork server that
dies is restarted, and its slot runs cold until the new one is ready; :class:`WarmSlots` says
why a server runs every execution cold (``--no-warm``, no isolation, an old kernel).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import threading
import time
from dataclasses import asdict
from typing import Any, Optional

from wmrl_sandbox.linux import pidfd_exited
from wmrl_sandbox.processes import live_mains

WARM_MODULES: tuple[str, ...] = (
    "numpy", "scipy", "scipy.stats", "pandas", "sklearn", "sklearn.base", "sklearn.datasets", "sklearn.decomposition",
    "sklearn.dummy", "sklearn.ensemble", "sklearn.feature_selection", "sklearn.linear_model", "sklearn.metrics",
    "sklearn.model_selection", "sklearn.naive_bayes", "sklearn.neighbors", "sklearn.pipeline",
    "sklearn.preprocessing", "sklearn.svm", "sklearn.tree",
)
"""Imported by every fork server before it serves (a module that fails to import is skipped and reported)."""

READY_TIMEOUT_S = 120.0
# Put on the fork server's sys.path, so that it imports this package (wmrl_sandbox.warm) from here.
_PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The zygote's environment while it imports: one thread per BLAS/OpenMP pool (as executions get), and no
# allocator threads (a process must be single-threaded when it forks).
_ZYGOTE_ENV = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
               "ARROW_DEFAULT_MEMORY_POOL": "system", "JE_ARROW_MALLOC_CONF": "background_thread:false",
               "MPLBACKEND": "Agg", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
               "PATH": "/usr/local/bin:/usr/bin:/bin"}
log = logging.getLogger("wmrl.sandbox")


def zygote_env(threads: int = 1) -> dict[str, str]:
    """The zygote's environment with ``threads`` per BLAS/OpenMP pool: the pools are sized when numpy
    loads, before any execution's environment applies, so the zygote gets the executions' size."""
    return {**_ZYGOTE_ENV, **{name: str(threads) for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                                              "MKL_NUM_THREADS")}}


class WarmSpawnFailed(OSError):
    """The slot's fork server did not start the execution (it died, or is dying): whatever its child
    did died with it, so the execution runs again, cold, in a fresh directory."""


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

    def __init__(self, python: str, modules: tuple[str, ...] = WARM_MODULES, threads: int = 1):
        self.python, self.modules, self.threads = python, modules, threads
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
                                          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, env=zygote_env(self.threads),
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
                 modules: tuple[str, ...] = WARM_MODULES, threads: int = 1):
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
            self.zygotes = {slot: Zygote(python, modules, threads) for slot in range(slots)}
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
                tasks_in_cgroup: bool = False, data: Any = None) -> dict:
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
    ``data``: the task data mount (:class:`wmrl_sandbox.data_mount.DataMount`), or None.
    """
    return {"script": script, "workdir": workdir, "exec_dir": exec_dir, "env": env, "uid": uid,
            "isolation": asdict(isolation), "limits": asdict(limits), "memory_mb": memory_mb + zygote.info["preloaded_mb"],
            "run_timeout": run_timeout, "python": python, "reveal": zygote.info["libraries"], "namespaces": namespaces,
            "cgroup_join": list(cgroup_join), "tasks_in_cgroup": tasks_in_cgroup,
            "data": data.to_json() if data is not None else None}


__all__ = ["READY_TIMEOUT_S", "WARM_MODULES", "WarmChild", "WarmSlots", "WarmSpawnFailed", "Zygote", "job_message"]
