"""Phase and conditions from children (pure)."""

import datetime as dt

from wmrl.api import vocabulary as v
from wmrl_operator import status as st


def job(conditions=(), ready=0, suspend=False, uid="u"):
    return {"metadata": {"uid": uid}, "spec": {"suspend": suspend},
            "status": {"ready": ready, "conditions": [{"type": t, "status": "True", "reason": r, "message": ""}
                                                      for t, r in conditions]}}


def test_job_states():
    assert st.job_state(None).state == "absent"
    assert st.job_state(job()).state == "pending"
    assert st.job_state(job(ready=1)).state == "running"
    assert st.job_state(job(suspend=True)).state == "suspended"
    assert st.job_state(job([("Complete", "")])).state == "succeeded"
    failed = st.job_state(job([("Failed", "DeadlineExceeded")]))
    assert failed.state == "failed" and failed.reason == "DeadlineExceeded" and failed.uid == "u"
    deleting = job(ready=1)
    deleting["metadata"]["deletionTimestamp"] = "x"
    assert st.job_state(deleting).state == "absent"


def test_phase_from_job():
    assert st.phase_from_job(st.JobState("running"), False)[0] == "Running"
    assert st.phase_from_job(st.JobState("pending"), False)[0] == "Pending"
    assert st.phase_from_job(st.JobState("running"), True)[0] == "Suspended"
    assert st.phase_from_job(st.JobState("succeeded"), False)[0] == "Succeeded"


def test_a_queued_run_waits_for_kueue_under_its_own_reason():
    phase, reason, message = st.phase_from_job(st.JobState("suspended"), False, "team-a")
    assert (phase, reason) == ("Pending", "Queued") and "'team-a'" in message
    assert st.phase_from_job(st.JobState("absent"), False, "team-a")[1] == "Queued"
    assert st.phase_from_job(st.JobState("running"), False, "team-a")[0] == "Running"  # admitted
    assert st.phase_from_job(st.JobState("suspended"), True, "team-a")[0] == "Suspended"  # the user's suspend


def test_conditions_keep_transition_time_unless_status_flips():
    c1 = st.conditions_for("Running", "TrainerRunning", "m", [], 1, "T1")
    c2 = st.conditions_for("Running", "TrainerRunning", "m", c1, 2, "T2")
    running = {c["type"]: c for c in c2}["Running"]
    assert running["lastTransitionTime"] == "T1" and running["observedGeneration"] == 2
    c3 = st.conditions_for("Suspended", "Suspended", "s", c2, 3, "T3")
    by = {c["type"]: c for c in c3}
    assert by["Running"]["status"] == "False" and by["Running"]["lastTransitionTime"] == "T3"
    assert by["Suspended"]["status"] == "True"
    assert {c["type"] for c in c3} == set(v.CONDITION_TYPES)


def test_invalid_spec_failure_is_not_finished():
    patch = st.status_patch({}, "Failed", v.INVALID_SPEC, "spec.x: bad", 1, "T")
    assert st.invalid_spec_failure(patch) and not st.is_finished(patch)
    done = st.status_patch({}, "Failed", v.MAX_RESTARTS, "m", 1, "T")
    assert st.is_finished(done)


def test_changed_detects_only_real_changes():
    old = st.status_patch({}, "Running", "TrainerRunning", "m", 1, "T")
    again = st.status_patch(old, "Running", "TrainerRunning", "m", 1, "T2")
    assert not st.changed(old, again)
    assert st.changed(old, st.status_patch(old, "Pending", "TrainerPending", "m", 1, "T2"))


def test_deadline_and_ttl():
    now = dt.datetime(2026, 1, 1, 0, 1, 0, tzinfo=dt.timezone.utc)
    assert st.deadline_exceeded("2026-01-01T00:00:00Z", 60, now)
    assert not st.deadline_exceeded("2026-01-01T00:00:00Z", 61, now)
    assert not st.deadline_exceeded(None, 10, now)
    assert st.remaining_deadline("2026-01-01T00:00:30Z", 60, now) == 30
    assert st.remaining_deadline(None, None, now) is None
    assert st.ttl_expired("2026-01-01T00:00:00Z", 0, now)
    assert not st.ttl_expired("2026-01-01T00:00:00Z", None, now)
    assert not st.ttl_expired(None, 0, now)


def test_a_sandbox_pods_status_is_read_for_why_it_does_not_serve():
    """A crash-looping Pod as the kubelet reports it: the server's termination message is in lastState."""
    pod = {"metadata": {"name": "r-sandbox-7d9-x2"},
           "status": {"phase": "Running",
                      "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "False"}],
                      "containerStatuses": [{
                          "name": "sandbox", "ready": False, "restartCount": 5,
                          "state": {"waiting": {"reason": "CrashLoopBackOff",
                                                "message": "back-off 2m40s restarting failed container=sandbox"}},
                          "lastState": {"terminated": {"exitCode": 2, "reason": "Error",
                                                       "message": "wmrl sandbox serve: isolation unavailable: x\n"}}}]}}
    p = st.pod_state(pod)
    assert (p.name, p.ready, p.creating, p.waiting_reason, p.exit_code, p.restarts) == (
        "r-sandbox-7d9-x2", False, False, "CrashLoopBackOff", 2, 5)
    assert p.terminated_message == "wmrl sandbox serve: isolation unavailable: x"
    creating = st.pod_state({"metadata": {"name": "c"}, "status": {
        "phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True"}],
        "containerStatuses": [{"name": "sandbox", "state": {"waiting": {"reason": "ContainerCreating"}}}]}})
    assert creating.creating and not creating.ready
    unscheduled = st.pod_state({"metadata": {"name": "u"}, "status": {
        "phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}})
    assert not unscheduled.creating
    rejected = st.pod_state({"metadata": {"name": "r"}, "status": {"phase": "Failed", "reason": "UnexpectedAdmissionError",
                                                                  "message": "user namespaces"}})
    assert rejected.pod_message == "UnexpectedAdmissionError: user namespaces"
    assert st.replica_failure({"status": {"conditions": [{"type": "ReplicaFailure", "status": "True",
                                                          "message": "forbidden"}]}}) == "forbidden"
    assert st.replica_failure({"status": {}}) == ""
