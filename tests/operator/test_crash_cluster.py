"""The operator SIGKILLed in the middle of reconciling, then restarted, creates no duplicates."""

import time

import pytest

from operator_helpers import Operator, run_manifest, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

RUNS = [f"crash-{i}" for i in range(3)]


def test_sigkill_during_reconcile_then_restart_creates_no_duplicates(kube, crd_installed, namespace, tmp_path):
    # A quota of zero Jobs holds every reconcile half-way: the trainer Job, applied last, is
    # refused and the operator keeps retrying. Kill it there, then lift the quota and restart.
    kube.run("create", "quota", "no-trainer-jobs", "-n", namespace, "--hard=count/jobs.batch=0")
    for name in RUNS:
        kube.apply(run_manifest(name))
    log = tmp_path / "operator.log"
    op = Operator(crd_installed.kubeconfig, namespace, log).start()

    def refused_jobs():
        lines = [line for line in log.read_text().splitlines() if "exceeded quota: no-trainer-jobs" in line]
        return {name for name in RUNS if any(f"{name}-trainer" in line for line in lines)}

    wait_for(lambda: refused_jobs() == set(RUNS), timeout=60, what="every run's trainer Job refused by the quota")
    op.kill9()
    for name in RUNS:  # half-way: what the Job needs was created before it
        for kind, child in (("configmap", "config"), ("serviceaccount", "trainer"), ("service", "sandbox")):
            assert kube.get(kind, f"{name}-{child}") is not None, f"{kind} {name}-{child}"
    kube.run("delete", "quota", "no-trainer-jobs", "-n", namespace)
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
