"""The operator SIGKILLed in the middle of reconciling, then restarted, creates no duplicates."""

import time

import pytest

from conftest import Operator, run_manifest, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

RUNS = [f"crash-{i}" for i in range(3)]


def test_sigkill_during_reconcile_then_restart_creates_no_duplicates(kube, crd_installed, namespace, tmp_path):
    for name in RUNS:
        kube.apply(run_manifest(name))
    op = Operator(crd_installed.kubeconfig, namespace, tmp_path / "operator.log").start()
    # Kill as soon as the first children appear: the operator is half-way through its reconciles.
    wait_for(lambda: kube.items("configmaps", "app.kubernetes.io/managed-by=wmrl-operator"), timeout=60,
             interval=0.05, what="first children")
    op.kill9()
    partial = len(kube.items("jobs", "app.kubernetes.io/managed-by=wmrl-operator"))
    op = Operator(crd_installed.kubeconfig, namespace, tmp_path / "operator2.log").start()
    try:
        for name in RUNS:
            wait_for(lambda: kube.status(name).get("phase") == "Running", timeout=60, what=f"{name} Running")
        time.sleep(2)  # let any stray duplicate show up
        for name in RUNS:
            sel = f"wmrl.dev/run={name}"
            assert len(kube.items("jobs", sel)) == 1
            assert len(kube.items("pods", sel + ",app.kubernetes.io/component=trainer")) == 1
            assert len(kube.items("deployments", sel)) == 3  # sandbox, world model, calibration
            assert len(kube.items("replicasets", sel)) == 3
            assert len(kube.items("configmaps", sel)) == 2  # config + calibration state
            assert len(kube.items("services", sel)) == 3
            assert kube.status(name)["restarts"] == 0
    finally:
        op.stop()
    assert partial <= len(RUNS)
