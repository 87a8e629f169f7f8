"""Device nodes (a GPU's ``/dev/nvidia*``) made available inside every execution: ``--device``.

An execution's mount namespace has a minimal ``/dev`` of its own (deployed mode) or masks
directories with tmpfs (root mode), so a device the Pod has is not usable by the program unless
the server binds it in. ``--device PATH`` (repeatable, a glob such as ``/dev/nvidia*`` expanded
once at start-up) names them; each is bound at its own path: bubblewrap's ``--dev-bind`` for a
cold deployed-mode execution, the same bind made in-process for a warm one
(:func:`wmrl_sandbox.namespaces.enter`) and in root mode (:func:`wmrl_sandbox.preexec.make_preexec`).

With any device, executions get no address-space limit (RLIMIT_AS): CUDA reserves virtual
address ranges far beyond any useful limit. Their memory bound is then the execution's cgroup
(``memory.max``) where cgroups are on, and only the container's limit where they are off.
"""

from __future__ import annotations

import glob
import os
import stat

from wmrl_sandbox.linux import MS_BIND, mount

DEVICES_ENV = "WMRL_SANDBOX_DEVICES"
"""The environment variable holding ``--device`` patterns, comma-separated (the operator sets it)."""


def parse_env(raw: str) -> list[str]:
    """The patterns of :data:`DEVICES_ENV` (comma-separated; empty items ignored)."""
    return [item.strip() for item in raw.split(",") if item.strip()]


def expand(patterns: list[str]) -> tuple[str, ...]:
    """Every device node the patterns name (globs expanded, sorted, duplicates dropped); ValueError
    naming the pattern that matches nothing, or a path that is not a character or block device."""
    found: dict[str, None] = {}
    for pattern in patterns:
        if not pattern.startswith("/"):
            raise ValueError(f"--device {pattern}: must be an absolute path")
        matches = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern] if os.path.lexists(pattern) else []
        if not matches:
            raise ValueError(f"--device {pattern}: matches no device node on this machine (is the GPU, or the "
                             "device plugin that provides it, present in this Pod?)")
        for path in matches:
            try:
                mode = os.stat(path).st_mode
            except OSError as exc:
                raise ValueError(f"--device {pattern}: {path}: {exc.strerror}") from None
            if not (stat.S_ISCHR(mode) or stat.S_ISBLK(mode)):
                if glob.has_magic(pattern) and stat.S_ISDIR(mode):
                    continue  # /dev/nvidia* also matches /dev/nvidia-caps, a directory: skipped
                raise ValueError(f"--device {pattern}: {path} is not a character or block device")
            found[os.path.abspath(path)] = None
    return tuple(found)


def bwrap_args(devices: tuple[str, ...]) -> list[str]:
    """bubblewrap's arguments binding each device at its own path (after every mask and bind)."""
    args: list[str] = []
    for path in devices:
        args += ["--dev-bind", path, path]
    return args


def bind(devices: list[tuple[str, int]]) -> None:  # pragma: no cover - in an execution's child
    """Bind each device node (``path``, an ``O_PATH`` descriptor opened before anything was hidden) at
    its own path in the execution's mount namespace, making the mount point where a tmpfs left none.
    A device node on a read-only mount can still be written to; only ``nodev`` forbids opening it."""
    for path, fd in devices:
        if not os.path.lexists(path):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            open(path, "w").close()
        mount(f"/proc/self/fd/{fd}", path, None, MS_BIND, None)
        os.close(fd)


def memory_note(devices: tuple[str, ...], cgroup_memory: bool) -> str:
    """The start-up line's memory bound of an execution, given its devices and whether its cgroup bounds memory."""
    if not devices:
        return "devices: none"
    names = ", ".join(devices)
    if cgroup_memory:
        return f"devices: {names} (no address-space limit: memory bounded by each execution's cgroup)"
    return (f"devices: {names} (no address-space limit, and cgroups off: WARNING executions have no memory bound "
            "but the container's)")


__all__ = ["DEVICES_ENV", "bind", "bwrap_args", "expand", "memory_note", "parse_env"]
