"""Record the host settings that the test cluster's real node changes, and put them back.

``record()`` runs before any node component starts and writes ``host-state.json`` in the
node's directory; while that file exists the host may hold something of the node's.
``teardown()`` (after the node's own processes were stopped) kills what is left of its Pods
and shims, unmounts everything under the node's directory, deletes the KUBE-*/CNI-* iptables
chains and the jumps into them, the bridge and its veths, the kubelet's cgroups and log links
and the shims' sockets, writes the recorded sysctls back, and only then removes the file.
It is driven by that file alone, so it also cleans up after a crash, and running it twice is
harmless. The decisions are pure functions in ``nodeconfig.py``; this module acts.
Standard library only.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional

try:  # loaded by path as wmrl_nodeconfig (tests/cluster/cluster.py), or as a plain module
    import wmrl_nodeconfig as nc  # type: ignore
except ImportError:  # run from tests/cluster directly
    import nodeconfig as nc  # type: ignore

Log = Callable[[str], None]


def _run(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


# ------------------------------------------------------------------------------- reading


def read_sysctls(names: Iterable[str]) -> Dict[str, str]:
    """Current values (whitespace as the kernel prints it, minus the newline); names this
    kernel lacks are left out."""
    out = {}
    for name in names:
        try:
            out[name] = nc.sysctl_path(name).read_text().strip()
        except OSError:
            pass
    return out


def cgroup_mounts() -> List[Path]:
    """Mount points of the cgroup (v1) and cgroup2 hierarchies."""
    mounts = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fstype = right.split()[0] if right else ""
        if fstype in ("cgroup", "cgroup2"):
            mounts.append(Path(left.split()[4]))
    return mounts


def kubepods_dirs() -> List[Path]:
    return [m / nc.KUBEPODS_CGROUP for m in cgroup_mounts() if (m / nc.KUBEPODS_CGROUP).is_dir()]


def iptables_chains() -> Dict[str, List[str]]:
    """{"iptables": ["nat/KUBE-SERVICES", ...], "ip6tables": [...]}: the node's chains now."""
    found: Dict[str, List[str]] = {}
    for tool in ("iptables", "ip6tables"):
        if not shutil.which(f"{tool}-save"):
            continue
        res = _run(f"{tool}-save")
        table, chains = None, []
        for line in res.stdout.splitlines():
            if line.startswith("*"):
                table = line[1:].strip()
            elif line.startswith(":"):
                chain = line[1:].split()[0]
                if chain.startswith(nc.CHAIN_PREFIXES):
                    chains.append(f"{table}/{chain}")
        found[tool] = chains
    return found


def link_exists(name: str) -> bool:
    return Path("/sys/class/net", name).exists()


def snapshot() -> dict:
    """What the node may change, as it is now (record() keeps it; the tests compare)."""
    return {
        "sysctls": read_sysctls(nc.SYSCTLS),
        "kubepods": [str(d) for d in kubepods_dirs()],
        "container_log_links_dir": nc.CONTAINER_LOG_LINKS.is_dir(),
        "shim_socket_dir": nc.SHIM_SOCKET_DIR.is_dir(),
        "run_containerd_dir": nc.SHIM_SOCKET_DIR.parent.is_dir(),
        "bridge": link_exists(nc.BRIDGE),
        "iptables_chains": iptables_chains(),
    }


# ------------------------------------------------------------------------------ recording


def record(lay: "nc.Layout") -> dict:
    """Write the host's state before the node starts. A record that is already there comes
    from a run that did not finish its teardown, and holds the host as it was before that
    run, so it is kept (the caller tears down first)."""
    if lay.record.exists():
        return json.loads(lay.record.read_text())
    state = snapshot()
    state["root"] = str(lay.root)
    state["containerd_socket"] = str(lay.containerd_socket)
    state["containerd_state"] = str(lay.containerd_state)
    state["pod_logs"] = str(lay.pod_logs)
    lay.root.mkdir(parents=True, exist_ok=True)
    tmp = lay.record.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=1, sort_keys=True))
    os.replace(tmp, lay.record)
    return state


def write_sysctls(values: Dict[str, str]) -> List[str]:
    """Write sysctls; returns the problems (name: error)."""
    problems = []
    for name, value in values.items():
        try:
            nc.sysctl_path(name).write_text(value + "\n")
        except OSError as e:
            problems.append(f"sysctl {name}={value}: {e}")
    return problems


# ------------------------------------------------------------------------------ tearing down


def _pids_in(cgroup_dirs: Iterable[Path]) -> List[int]:
    pids = set()  # a process is in every hierarchy
    for top in cgroup_dirs:
        for procs in top.rglob("cgroup.procs"):
            try:
                pids.update(int(x) for x in procs.read_text().split())
            except (OSError, ValueError):
                pass
    return sorted(pids)


def _cmdline(pid: int) -> List[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def _shim_pids(containerd_socket: str) -> List[int]:
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        argv = _cmdline(int(d.name))
        if argv and os.path.basename(argv[0]) == "containerd-shim-runc-v2" and \
                containerd_socket in argv:
            pids.append(int(d.name))
    return pids


def _kill_all(pids_now: Callable[[], List[int]], what: str, log: Log,
              timeout: float = 15.0) -> List[str]:
    deadline = time.time() + timeout
    pids = pids_now()
    if pids:
        log(f"killing {len(pids)} leftover {what}")
    while pids:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if time.time() > deadline:
            return [f"{what} still alive: {sorted(pids)}"]
        time.sleep(0.2)
        pids = pids_now()
    return []


def unmount_under(root: Path, log: Log) -> List[str]:
    """Unmount everything at or below root (deepest first; lazily if busy)."""
    for _ in range(5):
        mounts = nc.mounts_under(Path("/proc/self/mountinfo").read_text(), root)
        if not mounts:
            return []
        log(f"unmounting {len(mounts)} mounts under {root}")
        for mp in mounts:
            if _run("umount", str(mp)).returncode != 0:
                _run("umount", "-l", str(mp))
    left = nc.mounts_under(Path("/proc/self/mountinfo").read_text(), root)
    return [f"still mounted: {m}" for m in left]


def delete_iptables_chains(log: Log, before: Dict[str, List[str]]) -> List[str]:
    """Remove the KUBE-*/CNI-* chains that were not there ``before`` (iptables_chains())."""
    for tool in ("iptables", "ip6tables"):
        if not shutil.which(f"{tool}-save"):
            continue
        cmds = nc.iptables_cleanup(_run(f"{tool}-save").stdout, keep=before.get(tool, []))
        if cmds:
            log(f"{tool}: {len(cmds)} commands to remove the KUBE-*/CNI-* chains")
        for args in cmds:
            _run(tool, "-w", "5", *args)
    left = {tool: sorted(set(chains) - set(before.get(tool, [])))
            for tool, chains in iptables_chains().items()}
    return [f"{tool} chains left: {chains}" for tool, chains in left.items() if chains]


def delete_bridge(log: Log, existed: bool) -> List[str]:
    if existed or not link_exists(nc.BRIDGE):
        return []
    ports = [p.name for p in Path("/sys/class/net", nc.BRIDGE, "brif").glob("*")]
    log(f"deleting bridge {nc.BRIDGE} and its {len(ports)} ports")
    for port in ports:
        _run("ip", "link", "delete", port)
    _run("ip", "link", "delete", nc.BRIDGE)
    return [f"link {nc.BRIDGE} still exists"] if link_exists(nc.BRIDGE) else []


def remove_cgroups(keep: Iterable[str]) -> List[str]:
    """rmdir the kubepods hierarchies (bottom-up) that were not there before the node."""
    keep = set(keep)
    problems = []
    for top in kubepods_dirs():
        if str(top) in keep:
            continue
        for d in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            try:
                d.rmdir()
            except OSError:
                pass
        try:
            top.rmdir()
        except OSError as e:
            problems.append(f"cgroup {top}: {e}")
    return problems


def remove_shim_sockets(rec: dict) -> List[str]:
    tasks = Path(rec["containerd_state"]) / "io.containerd.runtime.v2.task"
    names = []
    if tasks.is_dir():
        for ns in tasks.iterdir():
            names += nc.shim_socket_names(Path(rec["containerd_socket"]), ns.name,
                                          [t.name for t in ns.iterdir()] if ns.is_dir() else [])
    for name in names:
        with contextlib.suppress(OSError):
            (nc.SHIM_SOCKET_DIR / name).unlink()
    if not rec.get("shim_socket_dir"):
        with contextlib.suppress(OSError):
            nc.SHIM_SOCKET_DIR.rmdir()
    run_dir = nc.SHIM_SOCKET_DIR.parent
    if not rec.get("run_containerd_dir") and run_dir.is_dir():
        # made for us (s/, and fifo/ and runc/ when ctr ran a task): its empty directories go
        for d in sorted((d for d in run_dir.rglob("*") if d.is_dir()), key=lambda d: -len(d.parts)):
            with contextlib.suppress(OSError):
                d.rmdir()
        with contextlib.suppress(OSError):
            run_dir.rmdir()
    return []


def remove_log_links(rec: dict) -> List[str]:
    d = nc.CONTAINER_LOG_LINKS
    if not d.is_dir():
        return []
    ours = rec["pod_logs"].rstrip("/") + "/"
    for link in d.iterdir():
        if link.is_symlink() and os.readlink(link).startswith(ours):
            with contextlib.suppress(OSError):
                link.unlink()
    if not rec.get("container_log_links_dir"):
        with contextlib.suppress(OSError):
            d.rmdir()
    return []


def restore_sysctls(rec: dict, log: Log) -> List[str]:
    recorded = rec.get("sysctls", {})
    changes = nc.sysctls_to_restore(recorded, read_sysctls(recorded))
    if changes:
        log("restoring sysctls: " + ", ".join(f"{k}={v}" for k, v in changes.items()))
    problems = write_sysctls(changes)
    still = nc.sysctls_to_restore(recorded, read_sysctls(recorded))
    return problems + [f"sysctl {k} is not back to {v!r}" for k, v in still.items()]


def teardown(lay: "nc.Layout", log: Log = lambda m: None) -> List[str]:
    """Undo what the node changed, as recorded in lay.record; returns the problems left
    (empty when the host is back as recorded, and then the record is gone)."""
    if not lay.record.exists():
        return []
    rec = json.loads(lay.record.read_text())
    root = Path(rec["root"])
    problems: List[str] = []
    problems += _kill_all(lambda: _pids_in(d for d in kubepods_dirs()
                                           if str(d) not in rec["kubepods"]), "Pod processes", log)
    problems += _kill_all(lambda: _shim_pids(rec["containerd_socket"]), "shims", log)
    problems += unmount_under(root, log)
    problems += delete_iptables_chains(log, rec.get("iptables_chains", {}))
    problems += delete_bridge(log, rec.get("bridge", False))
    problems += remove_cgroups(rec["kubepods"])
    problems += remove_shim_sockets(rec)
    problems += remove_log_links(rec)
    problems += restore_sysctls(rec, log)
    if not problems:
        lay.record.unlink()
    return problems


def leftovers(lay: "nc.Layout", before: Optional[dict] = None) -> List[str]:
    """What differs from ``before`` (default: the record) on the host now; for tests."""
    rec = before if before is not None else json.loads(lay.record.read_text())
    now = snapshot()
    diffs = []
    for key in ("kubepods", "container_log_links_dir", "shim_socket_dir", "bridge",
                "iptables_chains"):
        if now[key] != rec.get(key):
            diffs.append(f"{key}: {rec.get(key)!r} -> {now[key]!r}")
    changed = nc.sysctls_to_restore(rec.get("sysctls", {}), now["sysctls"])
    diffs += [f"sysctl {k}: {v!r} -> {now['sysctls'][k]!r}" for k, v in changed.items()]
    diffs += [f"mounted: {m}" for m in nc.mounts_under(Path("/proc/self/mountinfo").read_text(),
                                                       Path(rec.get("root", lay.root)))]
    return diffs
