import importlib.util
import os
import sys
import time
from pathlib import Path

import pytest

# tests/cluster/cluster.py (stdlib only), loaded by path so that it does not
# depend on sys.path / pytest import mode; importable afterwards as
# `wmrl_cluster` (e.g. `from wmrl_cluster import kubectl, helm, binary`).
if "wmrl_cluster" not in sys.modules:
    _spec = importlib.util.spec_from_file_location(
        "wmrl_cluster", Path(__file__).resolve().parent / "cluster" / "cluster.py")
    sys.modules["wmrl_cluster"] = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(sys.modules["wmrl_cluster"])
wmrl_cluster = sys.modules["wmrl_cluster"]

# tests/build_deps.py (stdlib only): `make test` builds the cluster, vLLM and images in the background.
if "wmrl_build_deps" not in sys.modules:
    _spec = importlib.util.spec_from_file_location("wmrl_build_deps", Path(__file__).resolve().parent / "build_deps.py")
    sys.modules["wmrl_build_deps"] = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(sys.modules["wmrl_build_deps"])
build_deps = sys.modules["wmrl_build_deps"]

_GATES = pytest.StashKey[frozenset]()
_WAITED: dict = {}  # build name -> (seconds waited, its Result)


def pytest_collection_modifyitems(items):
    """Tests that need no background build first, then by the build they need (build_deps.GATE_ORDER);
    otherwise in their usual order."""
    for item in items:
        item.stash[_GATES] = build_deps.gates(item.fixturenames, (m.name for m in item.iter_markers()))
    items.sort(key=lambda item: build_deps.run_rank(item.stash[_GATES]))


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_protocol(item):
    """Under `make test` (WMRL_TEST_BUILDS), wait for the builds this test needs before it starts:
    outermost, so that the wait is not charged to the test's timeout."""
    directory = os.environ.get(build_deps.ENV_DIR)
    for name in sorted(item.stash.get(_GATES, ())) if directory else ():
        if name in _WAITED:
            continue
        reporter = item.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None and build_deps.is_running(Path(directory), name):
            reporter.write_line(f"waiting for the background {name} build (log {Path(directory) / name}.log)")
        t0 = time.monotonic()
        result = build_deps.wait(Path(directory), name)
        _WAITED[name] = (time.monotonic() - t0, result)
    return (yield)


def pytest_runtest_setup(item):
    for name in sorted(item.stash.get(_GATES, ())):
        result = _WAITED.get(name, (0, None))[1]
        if result is not None and not result.ok:
            pytest.fail(f"needs the background build {result.describe()}", pytrace=False)


def pytest_terminal_summary(terminalreporter):
    for name, (waited, result) in _WAITED.items():
        if result is not None:
            terminalreporter.write_line(f"background build {result.describe()}; the tests waited {waited:.0f} s for it")


@pytest.fixture(scope="session")
def k8s_cluster():
    """A real control plane (etcd, kube-apiserver, controller-manager,
    scheduler) with kwok fake nodes; see tests/cluster/README.md.

    Yields a wmrl_cluster.Cluster: .kubeconfig (admin kubeconfig path),
    .kubectl(*args), .helm(*args), .binary(name), .versions.  A cluster this
    session started is stopped when the last session using it ends; one
    started with tests/cluster/up is left running.  WMRL_KEEP_CLUSTER=1 keeps
    it running regardless.  WMRL_KUBECONFIG=<path> uses that cluster instead
    (e.g. kind, see docs/kind.md)."""
    external = os.environ.get("WMRL_KUBECONFIG")
    if external:
        # An existing cluster (scripts/kind-e2e sets this): used as is, never started or stopped.
        yield wmrl_cluster.Cluster(state_dir=wmrl_cluster.default_state_dir(), kubeconfig=Path(external),
                                   server="", versions=wmrl_cluster.versions())
        return
    cluster = wmrl_cluster.acquire()
    try:
        yield cluster
    finally:
        if os.environ.get("WMRL_KEEP_CLUSTER"):
            wmrl_cluster.make_persistent(cluster)
        wmrl_cluster.release(cluster)


@pytest.fixture(scope="session")
def real_node(k8s_cluster):
    """A real kubelet node, ``real-0``, beside the kwok nodes (containerd 2, runc, kube-proxy,
    CoreDNS; see tests/cluster/README.md, "Real node"), started the first time a test asks for
    it. Labelled ``wmrl.dev/real-node: "true"`` and tainted ``wmrl.dev/real-node=true:NoSchedule``:
    put a Pod there with ``**real_node.placement()`` (nodeSelector + toleration). No registry is
    reachable: import images with ``real_node.import_image(tarball)`` (OCI or docker archive) and
    use ``imagePullPolicy: Never``; ``real_node.images["nodetool"]`` is a small static helper
    (serve, get, lookup, cat, echo, sleep). ``real_node.ctr`` and ``.containerd_socket`` reach the
    node's containerd (namespace k8s.io). A node this session started is stopped, and the host
    settings it changed are restored, when the last session using it ends (WMRL_KEEP_CLUSTER=1
    keeps it running)."""
    if os.environ.get("WMRL_KUBECONFIG"):
        pytest.skip("WMRL_KUBECONFIG names an outside cluster: the local real node runs only "
                    "beside the test control plane")
    node = wmrl_cluster.acquire_real_node(k8s_cluster)
    try:
        yield node
    finally:
        wmrl_cluster.release_real_node(k8s_cluster, keep=bool(os.environ.get("WMRL_KEEP_CLUSTER")))
