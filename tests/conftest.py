import importlib.util
import os
import sys
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
