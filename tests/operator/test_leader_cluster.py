"""Two operator replicas, one active (issue 14, item 3), on the real control plane.

The Lease protocol first, with electors on short leases (one holder; a standby takes over only
once the holder stops renewing; two standbys racing for a free Lease cannot both win), then
real operator processes: kill -9 of the active one hands over within 15 s, the new leader
reconciles new runs, and the children of the old ones are neither duplicated nor recreated.
"""

import threading
import time
import uuid

import pytest

from operator_helpers import Operator, run_manifest, wait_for
from wmrl_operator.leader import LeaderElector

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


@pytest.fixture(scope="module")
def leases(crd_installed):
    from kubernetes import client, config

    api_client = config.new_client_from_config(config_file=str(crd_installed.kubeconfig))
    yield client.CoordinationV1Api(api_client)
    api_client.close()


def elector(api, namespace, name, identity, lease=3, renew=1.0):
    return LeaderElector(api, namespace, name, identity, lease_seconds=lease, renew_seconds=renew)


def test_one_holder_and_a_takeover_only_after_the_lease_runs_out(leases, namespace):
    name = f"lease-{uuid.uuid4().hex[:6]}"
    a, b = elector(leases, namespace, name, "a"), elector(leases, namespace, name, "b")
    assert a.try_acquire_or_renew() is True
    assert b.try_acquire_or_renew() is False
    time.sleep(1.5)
    assert a.try_acquire_or_renew() is True  # renewing keeps it
    assert b.try_acquire_or_renew() is False
    time.sleep(3.5)  # a stopped renewing: its 3 s lease ran out
    assert b.try_acquire_or_renew() is True
    lease = leases.read_namespaced_lease(name, namespace)
    assert lease.spec.holder_identity == "b" and lease.spec.lease_transitions == 1
    assert a.try_acquire_or_renew() is False  # the old holder does not get it back
    b.release()
    assert a.try_acquire_or_renew() is True  # a released lease is free at once


def test_two_replicas_racing_for_a_free_lease_cannot_both_win(leases, namespace):
    for round_ in range(5):
        name = f"race-{round_}-{uuid.uuid4().hex[:6]}"
        contenders = [elector(leases, namespace, name, f"r{i}") for i in range(4)]
        barrier, won = threading.Barrier(len(contenders)), []

        def contend(e):
            barrier.wait()
            if e.try_acquire_or_renew():
                won.append(e.identity)

        threads = [threading.Thread(target=contend, args=(e,)) for e in contenders]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(won) == 1, won
        assert leases.read_namespaced_lease(name, namespace).spec.holder_identity == won[0]


def test_killing_the_active_operator_hands_over_within_15_s(crd_installed, namespace, kube, leases, tmp_path):
    lease_name = f"wmrl-operator-{uuid.uuid4().hex[:6]}"
    flags = ("--leader-elect", "--lease-namespace", namespace, "--lease-name", lease_name)
    replicas = {identity: Operator(crd_installed.kubeconfig, namespace, tmp_path / f"{identity}.log",
                                   extra_args=flags, env={"POD_NAME": identity}).start()
                for identity in ("first", "second")}
    try:
        holder = wait_for(lambda: _holder(leases, namespace, lease_name), timeout=30, what="a leader")
        standby = next(i for i in replicas if i != holder)
        kube.apply(run_manifest("before"))
        job = wait_for(lambda: kube.get("job", "before-trainer"), timeout=30, what="the first run's Job")
        time.sleep(2)  # the standby must not act meanwhile: nothing in its log but waiting
        assert "leading" not in (tmp_path / f"{standby}.log").read_text()

        replicas[holder].proc.kill()  # kill -9: no chance to release the Lease
        killed_at = time.monotonic()
        wait_for(lambda: _holder(leases, namespace, lease_name) == standby, timeout=20, interval=0.1,
                 what="the standby taking the lease")
        handover = time.monotonic() - killed_at
        print(f"handover after kill -9: {handover:.1f} s")
        assert handover < 15
        kube.apply(run_manifest("after"))
        wait_for(lambda: kube.get("job", "after-trainer"), timeout=30, what="the new leader reconciling a new run")
        wait_for(lambda: kube.status("after").get("phase") == "Running", timeout=30, what="the new run Running")
        # The old run's children were adopted, not recreated: same Job, one of each.
        assert kube.get("job", "before-trainer")["metadata"]["uid"] == job["metadata"]["uid"]
        jobs = [j for j in kube.items("jobs", "wmrl.dev/run=before")]
        assert len(jobs) == 1
    finally:
        for replica in replicas.values():
            replica.stop()


def _holder(leases, namespace, name):
    from kubernetes.client.exceptions import ApiException

    try:
        return leases.read_namespaced_lease(name, namespace).spec.holder_identity
    except ApiException:
        return None
