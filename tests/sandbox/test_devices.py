"""Device nodes bound into executions (``wmrl sandbox serve --device``), the GPU path.

No GPU on this machine: a stand-in character device is used, made with the null device's
numbers (1, 3) as ``nvidia0`` in a fresh directory on a filesystem mounted without ``nodev``
(pytest's temporary directory, which lies under /tmp: every execution's own tmpfs masks it, so
without ``--device`` no execution can reach the node, in any mode). A real server in each
isolation mode (root warm and cold, deployed warm and cold: bubblewrap for a cold execution,
the in-process namespaces of :func:`wmrl_sandbox.namespaces.enter` for a warm one) runs with
``--device`` naming the node by a glob; an execution opens and writes it and reads RLIMIT_AS
unlimited. The same modes without the flag: the node cannot be opened and RLIMIT_AS is the
server's ``--memory-mb``.
"""

import json
import os
import resource
import stat
import subprocess
import sys

import pytest

from sandbox_helpers import DEPLOYED_UID, TEST_ARGS, run, start_server
from wmrl_sandbox import devices
from wmrl_sandbox.namespaces import bwrap_command

MODES = ["root", "root-cold", "deployed", "deployed-cold"]
MEMORY_MB = 512  # TEST_ARGS' --memory-mb

PROBE = r"""
import json, os, resource, sys
path = sys.argv[1] if len(sys.argv) > 1 else {path!r}
out = {{"rlimit_as": resource.getrlimit(resource.RLIMIT_AS)[0] == resource.RLIM_INFINITY and "unlimited"
        or resource.getrlimit(resource.RLIMIT_AS)[0]}}
try:
    fd = os.open(path, os.O_WRONLY)
    out["wrote"] = os.write(fd, b"cuda")
    os.close(fd)
except OSError as exc:
    out["error"] = type(exc).__name__
print(json.dumps(out))
"""


def _stand_in(tmp_path_factory):
    """A character device (the null device's numbers) named nvidia0, readable and writable by every uid,
    in a directory every uid can traverse; skipped, naming why, where no filesystem here allows one."""
    base = tmp_path_factory.mktemp("gpu-dev")
    if os.statvfs(base).f_flag & os.ST_NODEV:
        pytest.skip(f"{base} is on a filesystem mounted nodev: no device node there can be opened")
    node = base / "nvidia0"
    try:
        os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except PermissionError as exc:
        pytest.skip(f"cannot make a device node here ({exc}): mknod needs CAP_MKNOD")
    os.chmod(node, 0o666)
    for directory in (base, base.parent, base.parent.parent):
        os.chmod(directory, 0o755)
    return node


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    return _stand_in(tmp_path_factory)


def _probe(server, path) -> dict:
    result = run(server, PROBE.format(path=str(path)))
    assert result["status"] == "Success", result
    return json.loads(result["run_result"]["stdout"])


@pytest.mark.parametrize("mode", MODES)
def test_device_is_usable_and_address_space_unlimited(mode, node, tmp_path_factory):
    pattern = str(node.parent / "nvidia*")  # a glob, as the operator renders /dev/nvidia*
    with start_server(mode, tmp_path_factory, 1, uid=DEPLOYED_UID + 20,
                      args=TEST_ARGS + ("--require-isolation", "--device", pattern)) as srv:
        health = srv.healthz()
        assert health["devices"] == [str(node)]
        started = "".join(srv.log)
        assert f"devices: {node}" in started and "no address-space limit" in started, started
        # The line says which bound holds: each execution's memory cgroup, or (warned) none but the container's.
        if "memory" in health["cgroups"]["controllers"]:
            assert "memory bounded by each execution's cgroup" in started and "WARNING" not in started, started
        else:
            assert "no memory bound but the container's" in started, started
        if not mode.endswith("-cold"):
            assert health["warm"]["ready"] == 1, health["warm"]
        for _ in range(2):  # a warm slot's second execution too
            assert _probe(srv, node) == {"rlimit_as": "unlimited", "wrote": 4}


@pytest.mark.parametrize("mode", MODES)
def test_without_the_flag_the_device_is_unreachable_and_address_space_limited(mode, node, tmp_path_factory):
    with start_server(mode, tmp_path_factory, 1, uid=DEPLOYED_UID + 21, args=TEST_ARGS + ("--require-isolation",)) as srv:
        assert srv.healthz()["devices"] == []
        out = _probe(srv, node)
        assert "wrote" not in out and out["error"] in ("FileNotFoundError", "PermissionError"), out
        limit = out["rlimit_as"]
        assert isinstance(limit, int) and MEMORY_MB << 20 <= limit <= (MEMORY_MB + 1024) << 20, out


def test_a_pattern_matching_nothing_is_refused_naming_it(tmp_path):
    missing = str(tmp_path / "nvidia*")
    proc = subprocess.run([sys.executable, "-m", "wmrl.cli", "sandbox", "serve", "--port", "0", "--no-warm",
                           "--device", missing], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc
    assert f"--device {missing}: matches no device node" in proc.stderr, proc.stderr


def test_env_var_is_read_when_no_flag_is_given(tmp_path):
    missing = str(tmp_path / "gpu*")
    proc = subprocess.run([sys.executable, "-m", "wmrl.cli", "sandbox", "serve", "--port", "0", "--no-warm"],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, devices.DEVICES_ENV: f" {missing} ,"})
    assert proc.returncode == 2 and f"--device {missing}" in proc.stderr, proc.stderr


def test_expand(node, tmp_path):
    (node.parent / "nvidia-caps").mkdir(exist_ok=True)  # /dev/nvidia* matches this directory too: skipped
    assert devices.expand([str(node.parent / "nvidia*"), str(node)]) == (str(node),)
    regular = tmp_path / "nvidia-file"
    regular.write_text("")
    with pytest.raises(ValueError, match="not a character or block device"):
        devices.expand([str(regular)])
    with pytest.raises(ValueError, match="must be an absolute path"):
        devices.expand(["dev/nvidia0"])
    assert devices.expand([]) == ()
    assert devices.parse_env("/dev/nvidia*, /dev/dri/card0,,") == ["/dev/nvidia*", "/dev/dri/card0"]


def test_bwrap_binds_devices_after_every_mask(tmp_path):
    args = bwrap_command("bwrap", workdir=str(tmp_path / "w"), work_root=str(tmp_path), seccomp_fd=3, info_fd=4,
                         devices=("/dev/nvidia0", "/dev/nvidiactl"))
    at = args.index("--dev-bind")
    assert args[at:at + 6] == ["--dev-bind", "/dev/nvidia0", "/dev/nvidia0", "--dev-bind", "/dev/nvidiactl",
                               "/dev/nvidiactl"]
    assert at > max(i for i, a in enumerate(args) if a in ("--tmpfs", "--bind", "--ro-bind", "--dev"))


def test_memory_note():
    assert devices.memory_note((), True) == "devices: none"
    assert "cgroup" in devices.memory_note(("/dev/nvidia0",), True)
    assert "WARNING" in devices.memory_note(("/dev/nvidia0",), False)
    assert resource.RLIM_INFINITY == -1  # what an execution with a device reads (the probe relies on it)
