"""Limits across all of an execution's processes together: a cgroup of its own per execution.

Rlimits bound each process; a program that forks twelve children of 100 MB passes a 256 MB
limit twelve times. A cgroup bounds them together (memory, tasks, CPU), counts what the kernel
refused or killed, and holds every process of the execution, whatever it did to hide.

Where: the server's own cgroup, when the server may write to it (it is *delegated*: root on a
node or VM, or a subtree handed to the server's uid, as systemd's ``Delegate=`` and some
runtimes do; a Pod's ``/sys/fs/cgroup`` is read-only by default). Each controller is looked up
where the kernel has it, cgroup v2 (the unified hierarchy) or a v1 hierarchy of its own, so
hybrid hosts work too. The layout, in each hierarchy used::

    <the server's cgroup>/wmrl-<server pid>/exec-<token>   one per execution, removed after it
    <the server's cgroup>/wmrl-<server pid>/server         v2 only: the server and its fork servers

cgroup v2 allows processes only in leaves once controllers are enabled below a cgroup, so there
the server first moves itself into ``server``; that needs a cgroup the server has to itself
(or the root cgroup). Groups of a server that died (``wmrl-<pid>`` with no such process) are
emptied and removed when the next server starts.

The execution's first process joins its group itself, before it makes namespaces, drops its uid
or runs anything of the program (it writes ``0`` to ``cgroup.procs``, in v1 to ``tasks``: see
:attr:`ExecutionGroup.join_files`): everything it starts is born inside.
"""

from __future__ import annotations

import errno
import math
import os
import secrets
import signal
import time
from dataclasses import dataclass, field
from typing import Optional

CONTROLLERS = ("memory", "pids", "cpu")
CPU_PERIOD_US = 100_000
# The sandbox's own processes inside an execution's group in the deployed mode (bwrap, or the
# warm child that plays it, and the PID namespace's first process), on top of the program's allowance.
SCAFFOLD_TASKS = 2
MODES = ("auto", "off", "required")


class CgroupsUnavailable(RuntimeError):
    """``required`` was asked for and some controller cannot be used here (the message says why)."""


@dataclass(frozen=True)
class Hierarchy:
    """One mounted cgroup hierarchy the server can use: its version, the controllers it gives,
    and the server's subtree in it (``<the server's cgroup>/wmrl-<pid>``)."""

    version: int
    controllers: tuple[str, ...]
    own: str  # the server's cgroup directory (where it started)
    root: str  # own/wmrl-<pid>: every execution's group is made under it


def _mountinfo() -> list[tuple[str, str, str, set[str]]]:
    """(mount point, root inside the hierarchy, fs type, super options) of every cgroup mount."""
    mounts = []
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            fields = line.split()
            dash = fields.index("-")
            fstype = fields[dash + 1]
            if fstype in ("cgroup", "cgroup2"):
                mounts.append((fields[4], fields[3], fstype, set(fields[dash + 3].split(","))))
    return mounts


def _memberships() -> dict[str, str]:
    """The server's cgroup path per v1 controller, and under ``""`` its v2 path."""
    paths = {}
    with open("/proc/self/cgroup") as fh:
        for line in fh:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for name in controllers.split(",") if controllers else [""]:
                paths[name] = path
    return paths


def _inside(mount_point: str, mount_root: str, path: str) -> Optional[str]:
    """The directory of cgroup ``path`` under a mount of the hierarchy's ``mount_root``."""
    if mount_root != "/" and not (path == mount_root or path.startswith(mount_root + "/")):
        return None  # the server's cgroup is not visible through this mount
    relative = path[len(mount_root):] if mount_root != "/" else path
    return os.path.normpath(mount_point + "/" + relative.lstrip("/"))


def _read(path: str) -> str:
    with open(path) as fh:
        return fh.read()


def _write(path: str, value: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _key_values(path: str) -> dict[str, int]:
    """A flat-keyed cgroup file (``memory.events``, ``memory.oom_control``, ``pids.events``)."""
    try:
        pairs = (line.split() for line in _read(path).splitlines())
        return {pair[0]: int(pair[1]) for pair in pairs if len(pair) == 2 and pair[1].lstrip("-").isdigit()}
    except OSError:
        return {}


def _procs(directory: str) -> list[int]:
    try:
        return [int(pid) for pid in _read(os.path.join(directory, "cgroup.procs")).split()]
    except FileNotFoundError:
        return []


def _alive(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")


def _kill_all(directory: str, deadline: float) -> bool:
    """SIGKILL every process in the group until a scan finds none (False: not by ``deadline``).

    Nothing born in the group can leave it, so an empty scan after the kill is final."""
    kill_file = os.path.join(directory, "cgroup.kill")  # v2, Linux 5.14+: the kernel kills them all at once
    while pids := _procs(directory):
        if time.monotonic() > deadline:
            return False
        if os.path.exists(kill_file):
            _write(kill_file, "1")
        else:
            _kill_members(pids, directory)
        time.sleep(0.002)
    return True


def _kill_members(pids: list[int], directory: str) -> None:
    """SIGKILL ``pids`` through pidfds, each once it is known to name a process of the group (a
    pid read from ``cgroup.procs`` may have been reused by the time it is signalled): the pidfds
    are opened first, then the group is read again, so a pidfd whose pid it still lists names
    that member, not a newcomer."""
    pidfds = {}
    for pid in pids:
        try:
            pidfds[pid] = os.pidfd_open(pid)
        except OSError:  # gone
            pass
    try:
        members = set(_procs(directory))
        for pid, pidfd in pidfds.items():
            if pid in members:
                try:
                    signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                except ProcessLookupError:
                    pass
    finally:
        for pidfd in pidfds.values():
            os.close(pidfd)


def _remove(directory: str, deadline_s: float = 5.0) -> bool:
    """Kill what is left in a leaf group and remove it (False: it could not be removed in time)."""
    deadline = time.monotonic() + deadline_s
    while _kill_all(directory, deadline):
        try:
            os.rmdir(directory)
            return True
        except FileNotFoundError:
            return True
        except OSError as exc:  # EBUSY: a killed process is still leaving
            if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                return False
        time.sleep(0.005)
    return False


def remove_tree(directory: str) -> bool:
    """Empty and remove ``directory`` and every group below it (deepest first)."""
    removed = True
    for entry in sorted(os.scandir(directory), key=lambda e: e.name) if os.path.isdir(directory) else []:
        if entry.is_dir(follow_symlinks=False):
            removed &= remove_tree(entry.path)
    return _remove(directory) and removed


@dataclass
class ExecutionGroup:
    """One execution's cgroup: the directory ``name`` in each hierarchy used (those made so far)."""

    name: str
    hierarchies: list[Hierarchy] = field(default_factory=list)
    ended: Optional[dict] = None

    @property
    def directories(self) -> list[str]:
        return [os.path.join(h.root, self.name) for h in self.hierarchies]

    @property
    def bounds_tasks(self) -> bool:
        """Whether ``pids.max`` holds the execution's tasks."""
        return any("pids" in h.controllers for h in self.hierarchies)

    @property
    def join_files(self) -> list[str]:
        """What the execution's first process writes ``0`` to, to join the group, while it is the
        only thread of its process (just forked; its threads and children are born inside).

        In v1 that is ``tasks``, which moves the calling thread alone: moving a whole process
        (``cgroup.procs``) takes the kernel's global thread-group lock, whose write side waits an
        RCU grace period, ~12 ms here on every execution; one thread needs no such lock. v2
        moves processes only through ``cgroup.procs``."""
        return [os.path.join(h.root, self.name, "cgroup.procs" if h.version == 2 else "tasks") for h in self.hierarchies]

    def _file(self, *names: str) -> Optional[str]:
        """The first of ``names`` that one of the group's directories has."""
        for name in names:
            for directory in self.directories:
                if os.path.exists(os.path.join(directory, name)):
                    return os.path.join(directory, name)
        return None

    def counters(self) -> dict:
        """What the kernel refused or killed: ``oom_kills`` (processes killed at the memory limit),
        ``pids_refused`` (forks refused at the task limit), ``memory_peak_mb``; a controller not
        in use gives None."""
        oom = self._file("memory.events", "memory.oom_control")
        pids = self._file("pids.events")
        peak = self._file("memory.peak", "memory.max_usage_in_bytes")
        return {
            "oom_kills": _key_values(oom).get("oom_kill", 0) if oom else None,
            "pids_refused": _key_values(pids).get("max", 0) if pids else None,
            "memory_peak_mb": round(int(_read(peak).split()[0]) / (1 << 20), 1) if peak else None,
        }

    def end(self) -> dict:
        """Kill whatever is left in the group, read its counters, remove it (idempotent)."""
        if self.ended is None:
            deadline = time.monotonic() + 5.0
            for directory in self.directories:  # then nothing runs any more: the counters are final
                _kill_all(directory, deadline)
            self.ended = self.counters()
            left = [d for d in self.directories if not remove_tree(d)]
            if left:
                raise RuntimeError(f"could not remove the execution's cgroup {left[0]}")
        return self.ended


class Cgroups:
    """The server's cgroups: found at start, one group per execution (:meth:`create`)."""

    def __init__(self, hierarchies: list[Hierarchy], missing: dict[str, str], cpus: float):
        self.hierarchies = hierarchies
        self.missing = missing  # controller -> why it cannot be used here
        self.cpus = cpus

    @property
    def enabled(self) -> bool:
        return bool(self.hierarchies)

    @property
    def versions(self) -> dict[str, int]:
        return {c: h.version for h in self.hierarchies for c in h.controllers}

    @classmethod
    def setup(cls, mode: str = "auto", cpus: float = 1.0, wanted: tuple[str, ...] = CONTROLLERS,
              unusable: Optional[str] = None) -> "Cgroups":
        """Find the controllers this server may use and make its subtree (``mode`` ``off``: none).

        ``unusable``: why this server must not use them at all (an isolation mode in which an
        execution could write its own group's limits). ``required`` raises
        :class:`CgroupsUnavailable` naming each controller that cannot be used. ``cpus`` is held
        to what the server's own cgroup may use (v1 refuses a child quota above its parent's).
        """
        if mode not in MODES:
            raise ValueError(f"cgroups mode must be one of {', '.join(MODES)}, got {mode!r}")
        if mode == "off":
            return cls([], {c: "turned off (--cgroups off)" for c in wanted}, cpus)
        hierarchies, missing = ([], {c: unusable for c in wanted}) if unusable else _discover(wanted)
        if mode == "required" and missing:
            raise CgroupsUnavailable("cgroups required, but " + "; ".join(f"{c}: {why}" for c, why in missing.items()))
        for hierarchy in hierarchies:
            if hierarchy.version == 1 and "cpu" in hierarchy.controllers and cpus > 0:
                cpus = min(cpus, _v1_cpu_ceiling(hierarchy.own))
        return cls(hierarchies, missing, cpus)

    def create(self, memory_mb: int, tasks: int) -> Optional[ExecutionGroup]:
        """A new group with the execution's limits: ``memory_mb`` for all its processes together
        (no swap beyond it), ``tasks`` processes and threads (plus the sandbox's own), and
        :attr:`cpus` CPUs of time (0: no CPU limit)."""
        if not self.hierarchies:
            return None
        group = ExecutionGroup(f"exec-{secrets.token_hex(6)}")
        try:
            for hierarchy in self.hierarchies:
                directory = os.path.join(hierarchy.root, group.name)
                os.mkdir(directory)
                group.hierarchies.append(hierarchy)
                for controller in hierarchy.controllers:
                    _limit(directory, hierarchy.version, controller, memory_mb=memory_mb,
                           tasks=tasks + SCAFFOLD_TASKS, cpus=self.cpus)
        except BaseException:
            group.end()
            raise
        return group

    def describe(self) -> dict:
        """/healthz's ``cgroups``."""
        return {"enabled": self.enabled, "controllers": {c: f"v{v}" for c, v in self.versions.items()},
                "missing": self.missing, "cpus": self.cpus if self.versions.get("cpu") else None,
                "groups": [h.root for h in self.hierarchies]}

    def close(self) -> None:
        """Remove the server's subtree (its execution groups are gone by then). In v2 the server
        sits in ``server`` until it exits; the next server removes that one."""
        for hierarchy in self.hierarchies:
            for entry in os.scandir(hierarchy.root) if os.path.isdir(hierarchy.root) else []:
                if entry.name.startswith("exec-"):
                    remove_tree(entry.path)
            if hierarchy.version == 1:
                _remove(hierarchy.root, deadline_s=1.0)


def _limit(directory: str, version: int, controller: str, *, memory_mb: int, tasks: int, cpus: float) -> None:
    join = os.path.join
    if controller == "memory":
        limit = str(memory_mb << 20)
        if version == 2:
            _write(join(directory, "memory.max"), limit)
            if os.path.exists(join(directory, "memory.swap.max")):
                _write(join(directory, "memory.swap.max"), "0")
        else:
            _write(join(directory, "memory.limit_in_bytes"), limit)
            if os.path.exists(join(directory, "memory.memsw.limit_in_bytes")):  # memory + swap: no swap beyond
                _write(join(directory, "memory.memsw.limit_in_bytes"), limit)
    elif controller == "pids":
        _write(join(directory, "pids.max"), str(tasks))
    elif controller == "cpu" and cpus > 0:
        quota = max(1000, int(cpus * CPU_PERIOD_US))
        if version == 2:
            _write(join(directory, "cpu.max"), f"{quota} {CPU_PERIOD_US}")
        else:
            _write(join(directory, "cpu.cfs_period_us"), str(CPU_PERIOD_US))
            _write(join(directory, "cpu.cfs_quota_us"), str(quota))


def locate(controller: str) -> Optional[tuple[int, str]]:
    """(version, directory) of this process's cgroup in the hierarchy that has ``controller``
    (cgroup v2 where the unified hierarchy offers it, else its own v1 hierarchy), or None."""
    memberships, mounts = _memberships(), _mountinfo()
    unified = next(((point, root) for point, root, fstype, _ in mounts if fstype == "cgroup2"), None)
    own = _inside(*unified, memberships[""]) if unified and "" in memberships else None
    if own and controller in _read(os.path.join(own, "cgroup.controllers")).split():
        return 2, own
    mount = next(((point, root) for point, root, fstype, options in mounts
                  if fstype == "cgroup" and controller in options), None)
    own = _inside(*mount, memberships[controller]) if mount and controller in memberships else None
    return (1, own) if own else None


def _v1_cpu_ceiling(own: str) -> float:
    """The CPUs a v1 cgroup's children may be given: the smallest quota on its way to the root."""
    ceiling, directory = math.inf, own
    while os.path.exists(os.path.join(directory, "cpu.cfs_quota_us")):
        quota = int(_read(os.path.join(directory, "cpu.cfs_quota_us")))
        if quota > 0:
            ceiling = min(ceiling, quota / int(_read(os.path.join(directory, "cpu.cfs_period_us"))))
        directory = os.path.dirname(directory)
    return ceiling


def _discover(wanted: tuple[str, ...]) -> tuple[list[Hierarchy], dict[str, str]]:
    """Where each wanted controller is, and whether this server may make groups there."""
    pid = os.getpid()
    found: dict[tuple[int, str], list[str]] = {}  # (version, the server's cgroup dir) -> controllers
    missing: dict[str, str] = {}
    for controller in wanted:
        where = locate(controller)
        if where is None:
            missing[controller] = "no cgroup hierarchy of this server has it"
        else:
            found.setdefault(where, []).append(controller)
    hierarchies = []
    for (version, own), controllers in found.items():
        if not os.access(own, os.W_OK):
            for controller in controllers:
                missing[controller] = f"{own} is not delegated to this server (not writable)"
            continue
        _remove_dead_servers(own)
        root = os.path.join(own, f"wmrl-{pid}")
        try:
            if version == 2:
                _enter_v2_leaf(own, root, controllers)
            else:
                os.makedirs(root, exist_ok=True)
        except OSError as exc:
            for controller in controllers:
                missing[controller] = f"cannot set up {root}: {exc.strerror or exc}"
            continue
        hierarchies.append(Hierarchy(version, tuple(controllers), own, root))
    return hierarchies, missing


def _enter_v2_leaf(own: str, root: str, controllers: list[str]) -> None:
    """cgroup v2: move this server into ``root/server`` and enable ``controllers`` for ``root``'s
    children. A cgroup that enables controllers for its children holds no process itself, so
    ``own`` must hold only this server (or be the hierarchy's root cgroup)."""
    enable = " ".join(f"+{c}" for c in controllers)
    os.makedirs(os.path.join(root, "server"), exist_ok=True)
    _write(os.path.join(root, "server", "cgroup.procs"), "0")
    others = [p for p in _procs(own) if p != os.getpid()]
    try:
        wanted = set(controllers)
        if not wanted <= set(_read(os.path.join(own, "cgroup.subtree_control")).split()):
            _write(os.path.join(own, "cgroup.subtree_control"), enable)
        _write(os.path.join(root, "cgroup.subtree_control"), enable)
    except OSError as exc:
        if exc.errno == errno.EBUSY and others:
            raise OSError(exc.errno, f"{own} also holds other processes ({len(others)}): give the server a cgroup "
                                     "of its own") from exc
        raise


def _remove_dead_servers(own: str) -> None:
    """Empty and remove the subtrees of servers that are gone (a crash leaves them behind)."""
    for entry in os.scandir(own):
        if entry.is_dir(follow_symlinks=False) and entry.name.startswith("wmrl-") and entry.name[5:].isdigit():
            if not _alive(int(entry.name[5:])):
                remove_tree(entry.path)


def join(join_files: list[str]) -> None:  # pragma: no cover - runs in the execution's first process
    """Move the calling process, single-threaded, into its execution's group (every hierarchy)."""
    for path in join_files:
        _write(path, "0")


__all__ = ["CONTROLLERS", "Cgroups", "CgroupsUnavailable", "ExecutionGroup", "MODES", "join", "locate", "remove_tree"]
