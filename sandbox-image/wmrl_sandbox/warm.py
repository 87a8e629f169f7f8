"""Warm starts: one fork server per execution slot, with the scientific stack already imported.

A cold execution starts a fresh interpreter that imports numpy and scikit-learn itself: about
1 s of CPU on every execution, far more than a small model takes to fit. A *fork server* (a
zygote) is an interpreter started once per slot that imports the scientific stack
(:data:`wmrl_sandbox.warm_slots.WARM_MODULES`) and then forks one fresh child per execution:

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
Where neither holds (no isolation at all), executions start cold;
:attr:`wmrl_sandbox.warm_slots.WarmSlots.reason` says why.

This module is what runs inside a fork server: :func:`serve` and the child it forks per
execution. The server's side (one fork server per slot, started, restarted and asked for
children) is :mod:`wmrl_sandbox.warm_slots`.
"""

from __future__ import annotations

import atexit
import builtins
import contextlib
import gc
import importlib
import json
import os
import random
import signal
import socket
import sys
import threading
import traceback
import types
import weakref

from wmrl_sandbox import namespaces, seccomp
from wmrl_sandbox.data_mount import DataMount
from wmrl_sandbox.executor import Limits
from wmrl_sandbox.isolation import Isolation
from wmrl_sandbox.linux import PR_SET_PDEATHSIG, clear_capabilities, libc
from wmrl_sandbox.preexec import make_preexec

# Put on sys.path by the fork server's boot command (wmrl_sandbox.warm_slots), to import this package.
_PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def serve(fd: int, modules: list[str]) -> None:
    """The zygote's main loop: import ``modules``, say ready, then fork one child per request.

    Nothing is ever imported from a directory a request controls: the current directory and
    this package's parent leave ``sys.path`` before anything else, and the modules a child needs
    to isolate itself (preexec, namespaces, seccomp) are imported with this module, from the package.
    """
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # never outlive the server
    base_vm_mb = _vm_mb()  # a bare interpreter's address space, before any import
    # Only the entry the boot line inserted: where the package is installed (an image's site-packages),
    # the same directory is also on the interpreter's own path, and the program needs it.
    if sys.path and sys.path[0] == _PACKAGE_PARENT:
        del sys.path[0]
    sys.path[:] = [p for p in sys.path if p != ""]
    sock = socket.socket(fileno=fd)
    imported, failed = [], {}
    for name in modules:
        try:
            importlib.import_module(name)
            imported.append(name)
        except Exception as exc:  # noqa: BLE001 - reported, the rest still warms up
            failed[name] = f"{type(exc).__name__}: {exc}"
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
        isolation = Isolation(**job["isolation"])
        limits = Limits(**job["limits"])
        if job.get("namespaces") is not None:  # deployed mode: fds[3] is the info pipe, as bwrap's
            _enter_namespaces(job, isolation, limits, info_fd=ns_fd)
            os.environ["PWD"] = job["workdir"]  # as bwrap's --chdir sets it
        else:
            ns_sock = socket.socket(fileno=ns_fd) if ns_fd is not None else None
            make_preexec(job["exec_dir"], job["uid"], isolation, limits, job["memory_mb"], job["run_timeout"],
                         job["python"], ns_sock=ns_sock, warm=True, reveal=tuple(job["reveal"]),
                         cgroup_join=tuple(job["cgroup_join"]), tasks_in_cgroup=job["tasks_in_cgroup"],
                         data=DataMount.from_json(job.get("data")))()
            if ns_sock is not None:
                ns_sock.close()
            _die_with(zygote)  # the uid change above cleared it
        os.chdir(job["workdir"])  # as the execution's uid, in its own mount namespace
    except BaseException as exc:  # noqa: BLE001 - the sandbox failed before the program: say so, never run it
        with contextlib.suppress(BaseException):
            os.write(2, f"sandbox error: warm start: {type(exc).__name__}: {exc}\n".encode())
        os._exit(126)
    _run_program(job["script"])


def _enter_namespaces(job: dict, isolation: Isolation, limits: Limits,
                      info_fd: int) -> None:  # pragma: no cover - in the child
    """What a cold execution gets from bubblewrap, in this process: the limits first (as the server
    sets them before bwrap starts), then the namespaces, then no capability and the seccomp filter."""
    make_preexec(job["exec_dir"], None, isolation, limits, job["memory_mb"], job["run_timeout"], job["python"],
                 cgroup_join=tuple(job["cgroup_join"]), tasks_in_cgroup=job["tasks_in_cgroup"])()
    layout = job["namespaces"]
    namespaces.enter(workdir=job["workdir"], work_root=layout["work_root"], info_fd=info_fd,
                     visible=layout["visible"], hidden=layout["hidden"], tmpfs_bytes=layout["tmpfs_bytes"],
                     data=job.get("data"), devices=layout.get("devices", ()))
    clear_capabilities()
    seccomp.set_no_new_privs()  # as bwrap sets it, with or without the filter
    if isolation.seccomp:
        seccomp.install()


def _run_program(script: str) -> None:  # pragma: no cover - in the child
    """``python main.py`` from here on: a fresh ``__main__``, the interpreter's tracebacks, and an
    exit that does what a program can see of the interpreter's (:func:`_exit`). No frame here
    keeps the program's namespace alive once it has run, so that exit can release it."""
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
    with the child, and each touch copies a page: that teardown is most of a warm execution's time
    (about 100 of 157 ms for an import-and-fit program on a loaded 2-core machine).
    What a program can observe of ``Py_FinalizeEx`` still happens, in its order: a ``SystemExit``
    code means what it means to the interpreter; non-daemon threads are joined; ``atexit`` handlers
    run; the standard streams are flushed (a failure is reported and exits 120); a collection runs;
    the program's own modules (``__main__`` and every module imported after the fork) leave
    ``sys.modules`` and are collected, those still alive cleared as CPython clears a module, so
    files it left open are flushed and closed and its finalizers run with their globals intact
    where the interpreter's would. Finalizers of objects that the preloaded modules hold are not
    run (the language never promises them at exit). Tested against the cold path in test_warm.
    """
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


__all__ = ["serve"]
