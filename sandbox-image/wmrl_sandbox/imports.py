"""The start-up check that the packages a sandbox promises import inside an execution.

A sandbox whose interpreter imports numpy outside but not inside an execution (its packages on a
path the execution's mount namespace hides: a directory under /tmp put on ``sys.path`` by a
``.pth`` file, a venv whose packages live in the server's home) would pass every isolation check
and fail every program that imports them. ``--require-imports`` names the modules (the image
sets ``WMRL_SANDBOX_REQUIRE_IMPORTS`` to its scientific stack); the server then runs
:data:`PROBE` once, cold (a fresh interpreter: a fork server has them imported already), and
refuses to start unless each one imports. Where one does not, :func:`locate` asks the same
interpreter outside the sandbox where it finds it, and :func:`diagnose` says which directory the
execution cannot see.
"""

from __future__ import annotations

import json
import os
import subprocess
from typing import Optional

# Outside the sandbox, as the server's uid: where the interpreter finds each module (no import of
# the module itself; a dotted name imports its parents). -I keeps the current directory off sys.path.
LOCATE = r'''
import importlib.util, json, os, sys
out = {"sys_path": [p for p in sys.path if p], "modules": {}}
for name in sys.argv[1:]:
    try:
        spec = importlib.util.find_spec(name)
    except Exception as exc:  # a parent package that fails to import
        spec, error = None, f"{type(exc).__name__}: {exc}"
    else:
        error = None
    if spec is None:
        out["modules"][name] = {"error": error or "not found"}
        continue
    where = spec.origin if spec.origin not in (None, "built-in", "frozen") else None
    if where is None and spec.submodule_search_locations:
        where = list(spec.submodule_search_locations)[0]
    entry = None
    if where:
        real = os.path.realpath(where)
        for path in out["sys_path"]:
            base = os.path.realpath(path)
            if (real == base or real.startswith(base.rstrip("/") + "/")) and (entry is None or len(base) > len(entry)):
                entry = path
    out["modules"][name] = {"origin": where, "entry": entry}
print(json.dumps(out))
'''

# Inside an execution: import each module; report the failures and which of the given paths exist here.
PROBE = r'''
import importlib, json, os, sys
modules, paths = json.loads(sys.argv[1]), json.loads(sys.argv[2])
failed = {}
for name in modules:
    try:
        importlib.import_module(name)
    except BaseException as exc:
        failed[name] = f"{type(exc).__name__}: {exc}"
print(json.dumps({"failed": failed, "visible": {p: os.path.exists(p) for p in paths}}))
'''

HIDDEN_BY_DEFAULT = "/tmp, /var/tmp, /dev/shm, the work root and the server's home"


def parse(text: Optional[str]) -> tuple[str, ...]:
    """``numpy, pandas,sklearn`` -> the module names (empty for None or blank); ValueError for a bad one."""
    names = tuple(part.strip() for part in (text or "").split(",") if part.strip())
    for name in names:
        if not all(piece.isidentifier() for piece in name.split(".")):
            raise ValueError(f"--require-imports: {name!r} is not a module name")
    return names


def locate(python: str, modules: tuple[str, ...], timeout: float = 60.0) -> dict:
    """Where ``python`` finds each module outside the sandbox (``LOCATE``'s answer; empty if it failed)."""
    try:
        done = subprocess.run([python, "-I", "-c", LOCATE, *modules], capture_output=True, text=True,
                              timeout=timeout, cwd="/", env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return {}


def probe_paths(outside: dict) -> list[str]:
    """The directories whose visibility inside an execution explains a failed import."""
    paths = []
    for where in (outside.get("modules") or {}).values():
        for key in ("entry", "origin"):
            if where.get(key) and where[key] not in paths:
                paths.append(where[key])
    return paths


def diagnose(python: str, failed: dict[str, str], outside: dict, visible: dict[str, bool]) -> str:
    """Why the modules in ``failed`` ({name: the import's error inside}) do not import in an execution.

    ``outside``: :func:`locate`'s answer; ``visible``: which of its paths exist inside.
    """
    lines = [f"{', '.join(failed)} {'does' if len(failed) == 1 else 'do'} not import inside an execution "
             f"(--require-imports) with {python}:"]
    for name, error in failed.items():
        where = (outside.get("modules") or {}).get(name) or {}
        origin, entry = where.get("origin"), where.get("entry")
        if not origin:
            why = where.get("error") or "the interpreter could not be asked"
            lines.append(f"  {name}: {error}; it does not import outside the sandbox either ({why}): "
                         f"install it for {python}")
        elif entry and not visible.get(entry, True):
            lines.append(f"  {name}: {error}; outside the sandbox {python} imports it from {entry}, a directory "
                         f"an execution cannot see (its mount namespace hides {HIDDEN_BY_DEFAULT}, and shows "
                         f"again only the interpreter's prefix): install it under the interpreter's prefix, or "
                         f"use an interpreter whose packages lie elsewhere")
        elif not visible.get(origin, True):
            lines.append(f"  {name}: {error}; outside the sandbox it is {origin}, which an execution cannot see "
                         f"(its mount namespace hides {HIDDEN_BY_DEFAULT})")
        else:
            lines.append(f"  {name}: {error}; outside the sandbox it is {origin}, which an execution sees too: the "
                         f"import itself fails there (a library it loads, a limit)")
    return "\n".join(lines)


__all__ = ["LOCATE", "PROBE", "diagnose", "locate", "parse", "probe_paths"]
