"""The operator survives an apiserver restart: same process, watches re-established, runs still reconciled.

The real kube-apiserver of tests/cluster is stopped for a few seconds and started again on the
same etcd data (tests/cluster/cluster.py ``restart_apiserver``): every connection and watch the
operator holds drops, as in a control-plane upgrade. Not possible against an external cluster
(``WMRL_KUBECONFIG``, e.g. kind), whose apiserver this suite does not own.
"""

import os

import pytest

import wmrl_cluster
from operator_helpers import run_manifest, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


@pytest.mark.skipif(bool(os.environ.get("WMRL_KUBECONFIG")),
                    reason="needs the apiserver of tests/cluster (an external cluster's cannot be restarted)")
def test_operator_survives_apiserver_restart(kube, operator, crd_installed):
    kube.apply(run_manifest("before"))
    wait_for(lambda: kube.status("before").get("phase") == "Running", timeout=60, what="'before' Running")
    pid = operator.proc.pid

    downtime = wmrl_cluster.restart_apiserver(crd_installed.state_dir, downtime=5.0)
    assert downtime >= 5.0

    # A run created after the restart is reconciled (the WMRLRun watch came back) ...
    kube.apply(run_manifest("after"))
    wait_for(lambda: kube.status("after").get("phase") == "Running", timeout=90, what="'after' Running")
    assert len(kube.items("jobs", "wmrl.dev/run=after")) == 1
    # ... a spec change to a run from before it is acted on (update events and the Job watch) ...
    kube.run("patch", "wmrlrun", "before", "-n", kube.ns, "--type=merge", "-p", '{"spec":{"suspend":true}}')
    wait_for(lambda: kube.status("before").get("phase") == "Suspended", timeout=60, what="'before' Suspended")
    job = kube.get("job", "before-trainer")
    assert job["spec"]["suspend"] is True
    # ... by the same process, which never exited, and without duplicating anything.
    assert operator.proc.poll() is None and operator.proc.pid == pid
    assert len(kube.items("jobs", "wmrl.dev/run=before")) == 1
    assert kube.status("before")["restarts"] == 0
