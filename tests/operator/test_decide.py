"""A reconcile's decisions (``decide``), rule by rule, without a cluster.

The same decisions through the operator on a real apiserver: tests/operator/test_reconcile_cluster.py,
test_kueue_cluster.py and test_crash_cluster.py.
"""

import datetime as dt

import pytest

from wmrl.api import vocabulary as v
from wmrl.api.schema import parse_spec
from wmrl_operator import decide
from wmrl_operator import status as st

NOW = dt.datetime(2026, 1, 1, 0, 10, 0, tzinfo=dt.timezone.utc)
NOW_S = "2026-01-01T00:10:00Z"
STARTED = "2026-01-01T00:00:00Z"  # ten minutes before NOW
QUEUE = "team-a"


def spec(**over):
    return parse_spec({"policy": {"model": "Qwen/Qwen3-4B"}, "tasks": {"builtin": "mini-ml"}, **over})


def status(phase="Running", reason=v.TRAINER_RUNNING, message="", **fields):
    return {**st.status_patch({}, phase, reason, message, 1, STARTED), **fields}


def failed(reason="BackoffLimitExceeded", message="pods failed", uid="job-2"):
    return st.JobState("failed", reason, message, uid)


# ---------------------------------------------------------------- step 1: wait, finish, restart


def test_an_invalid_spec_fails_the_run_naming_every_field():
    t = decide.invalid_spec(["spec.a: bad", "spec.b: worse"])
    assert (t.phase, t.reason, t.event_type) == ("Failed", v.INVALID_SPEC, "Warning")
    assert t.message == "spec.a: bad; spec.b: worse"


def test_before_the_job_exists_a_conflict_waits_before_a_missing_reference():
    t = decide.waiting(["spec.tasks.pvc: missing"], ["Deployment c: another run's"], job_exists=False)
    assert (t.phase, t.reason, t.message, t.event_type) == ("Pending", v.OWNERSHIP_CONFLICT,
                                                            "Deployment c: another run's", "Warning")
    t = decide.waiting(["spec.tasks.pvc: missing", "spec.tasks.configMap: missing"], [], job_exists=False)
    assert (t.phase, t.reason) == ("Pending", v.WAITING_FOR_REFERENCES)
    assert t.message == "spec.tasks.pvc: missing; spec.tasks.configMap: missing"
    assert decide.waiting([], [], job_exists=False) is None


def test_once_the_job_exists_nothing_waits():
    assert decide.waiting(["spec.tasks.pvc: missing"], ["Deployment c: another run's"], job_exists=True) is None


@pytest.mark.parametrize("deadline, exceeded", [(600, True), (599, True), (601, False), (None, False)])
def test_the_deadline_counts_from_the_start_time(deadline, exceeded):
    over = {"activeDeadlineSeconds": deadline} if deadline else {}
    finish = decide.deadline(spec(**over), status(startTime=STARTED), st.JobState("running"), NOW)
    assert (finish is not None) == exceeded
    if exceeded:
        t = finish.transition
        assert finish.delete_job and (t.phase, t.reason, t.event_type) == ("Failed", v.DEADLINE, "Warning")
        assert t.fields == {"completionTime": NOW_S} and f"({deadline} s)" in t.message


def test_no_start_time_no_deadline_but_the_jobs_own_deadline_failure_counts():
    assert decide.deadline(spec(activeDeadlineSeconds=1), status(), st.JobState("running"), NOW) is None
    finish = decide.deadline(spec(), status(), failed(reason="DeadlineExceeded"), NOW)
    assert finish.transition.reason == v.DEADLINE and finish.delete_job
    assert decide.deadline(spec(), status(), failed(), NOW) is None


def test_a_new_failure_restarts_and_counts_once():
    restart = decide.failure(spec(), status(restarts=1, lastFailedTrainer="job-1"), failed(uid="job-2"), NOW)
    assert isinstance(restart, decide.Restart) and restart.restarts == 2
    t = restart.transition
    assert (t.phase, t.reason, t.event_type, t.event_reason) == ("Pending", v.RESTARTING, "Warning", v.TRAINER_RESTARTED)
    assert t.fields == {"restarts": 2, "lastFailedTrainer": "job-2"}
    assert t.message == "trainer Job failed (BackoffLimitExceeded); restart 2 of 3, resuming from checkpoint"


def test_a_failure_already_counted_only_replaces_the_job():
    restart = decide.failure(spec(), status(restarts=2, lastFailedTrainer="job-2"), failed(uid="job-2"), NOW)
    assert restart == decide.Restart(2, None)


@pytest.mark.parametrize("limit, restarts", [(3, 3), (0, 0)])
def test_a_failure_past_max_restarts_fails_the_run_and_keeps_the_job(limit, restarts):
    finish = decide.failure(spec(failurePolicy={"maxRestarts": limit}), status(restarts=restarts),
                            failed(message=""), NOW)
    t = finish.transition
    assert isinstance(finish, decide.Finish) and not finish.delete_job
    assert (t.phase, t.reason) == ("Failed", v.MAX_RESTARTS)
    assert t.fields == {"completionTime": NOW_S, "lastFailedTrainer": "job-2"}
    assert t.message == (f"the trainer failed {restarts + 1} times (spec.failurePolicy.maxRestarts is {limit}); "
                         "last failure: BackoffLimitExceeded")  # no dangling ": " without a message


def test_a_completed_job_succeeds_at_its_completion_time():
    finish = decide.success(st.JobState("succeeded", completion_time="2026-01-01T00:09:00Z"), NOW)
    t = finish.transition
    assert (t.phase, t.reason, t.event_type) == ("Succeeded", v.TRAINER_COMPLETED, "Normal")
    assert t.fields == {"completionTime": "2026-01-01T00:09:00Z"} and not finish.delete_job
    assert decide.success(st.JobState("succeeded"), NOW).transition.fields == {"completionTime": NOW_S}
    assert decide.success(st.JobState("running"), NOW) is None


def test_the_deadline_wins_over_what_the_trainer_did():
    late = status(startTime=STARTED)
    for js in (st.JobState("succeeded"), failed()):
        assert decide.trainer(spec(activeDeadlineSeconds=60), late, js, NOW).transition.reason == v.DEADLINE
    assert isinstance(decide.trainer(spec(), late, failed(), NOW), decide.Restart)
    assert decide.trainer(spec(), late, st.JobState("succeeded"), NOW).transition.reason == v.TRAINER_COMPLETED
    assert decide.trainer(spec(), late, st.JobState("running"), NOW) is None


# ---------------------------------------------------------------- step 2: children and suspension


def test_the_start_time_is_set_once_unless_suspended():
    assert decide.start_time(spec(), None, st.JobState("absent"), None, NOW) == NOW_S
    assert decide.start_time(spec(), STARTED, st.JobState("running"), None, NOW) == STARTED
    assert decide.start_time(spec(suspend=True), None, st.JobState("absent"), None, NOW) is None
    assert decide.start_time(spec(suspend=True), STARTED, st.JobState("suspended"), None, NOW) == STARTED


@pytest.mark.parametrize("state, starts", [("absent", False), ("suspended", False), ("pending", True), ("running", True)])
def test_a_queued_run_starts_when_kueue_admits_its_job(state, starts):
    assert decide.start_time(spec(), None, st.JobState(state), QUEUE, NOW) == (NOW_S if starts else None)
    assert decide.awaiting_admission(spec(), st.JobState(state), QUEUE) == (not starts)
    assert not decide.awaiting_admission(spec(suspend=True), st.JobState(state), QUEUE)  # the user's suspend
    assert not decide.awaiting_admission(spec(), st.JobState(state), None)


def plan(js, queue=None, apply_children=False, generation=2, conflicts=(), run_status=None, **over):
    return decide.children(spec(**over), run_status or status(), js, queue, apply_children=apply_children,
                           generation=generation, conflicts=list(conflicts), started=None, now=NOW)


def test_a_spec_reconcile_writes_every_child_and_prunes_past_generation_one():
    p = plan(st.JobState("running"), apply_children=True)
    assert p.write and p.may_prune and not p.skip_calibration and p.start_time == NOW_S
    assert not plan(st.JobState("running"), apply_children=True, generation=1).may_prune
    assert plan(st.JobState("running"), apply_children=True, conflicts=["x"]).skip_calibration


def test_a_job_event_writes_children_only_when_the_job_must_be_made():
    assert not plan(st.JobState("running")).write
    p = plan(st.JobState("absent"))
    assert p.write and not p.may_prune  # pruning is for spec changes


def test_a_queued_run_writes_children_while_it_waits_and_when_admitted():
    waiting = plan(st.JobState("suspended"), QUEUE)
    assert waiting.write and waiting.awaiting_admission and waiting.start_time is None
    queued = status("Pending", v.QUEUED)
    admitted = plan(st.JobState("running"), QUEUE, run_status=queued)
    assert admitted.write and not admitted.awaiting_admission and admitted.start_time == NOW_S
    assert not plan(st.JobState("running"), QUEUE).write  # admitted earlier: nothing to do


def job(suspend=None):
    return {"metadata": {"uid": "job-1"}, "spec": {} if suspend is None else {"suspend": suspend}}


def test_a_queued_runs_suspend_goes_through_its_workload():
    assert decide.suspension(spec(suspend=True), status(), job(True), QUEUE) == decide.Suspension(True, True)
    resumed = decide.suspension(spec(), status("Suspended", v.SUSPENDED), job(True), QUEUE)
    assert resumed == decide.Suspension(True, False)
    assert decide.suspension(spec(), status(), job(False), QUEUE) is None  # Kueue owns Job.spec.suspend


def test_any_other_jobs_suspend_is_patched_when_it_differs():
    assert decide.suspension(spec(suspend=True), status(), job(), None) == decide.Suspension(False, True)
    assert decide.suspension(spec(), status("Suspended", v.SUSPENDED), job(True), None) == decide.Suspension(False, False)
    assert decide.suspension(spec(), status(), job(), None) is None
    assert decide.suspension(spec(suspend=True), status(), None, None) is None  # no Job (yet, or deleted)


# ---------------------------------------------------------------- step 3: the status


def test_the_report_follows_the_trainer_and_records_restarts_and_start():
    t = decide.report(spec(), status(), st.JobState("running"), None, [], [], 2, STARTED)
    assert (t.phase, t.reason, t.event_type) == ("Running", v.TRAINER_RUNNING, "Normal")
    assert t.fields == {"restarts": 2, "startTime": STARTED}
    assert decide.report(spec(), status(), st.JobState("absent"), QUEUE, [], [], 0, None).fields == {"restarts": 0}
    assert decide.report(spec(), status(), st.JobState("absent"), QUEUE, [], [], 0, None).reason == v.QUEUED


def test_a_restart_keeps_its_reason_until_the_replacement_job_exists():
    restarting = status("Pending", v.RESTARTING, "restart 1 of 3")
    t = decide.report(spec(), restarting, st.JobState("absent"), None, [], [], 1, STARTED)
    assert (t.phase, t.reason, t.message) == ("Pending", v.RESTARTING, "restart 1 of 3")
    assert decide.report(spec(), restarting, st.JobState("pending"), None, [], [], 1, STARTED).reason == v.TRAINER_PENDING
    assert decide.report(spec(), status("Pending", v.TRAINER_PENDING), st.JobState("absent"), None,
                         [], [], 1, STARTED).reason == v.TRAINER_PENDING


def test_missing_references_and_conflicts_never_change_a_running_trainers_phase():
    t = decide.report(spec(), status(), st.JobState("running"), None, ["spec.tasks.pvc: gone"], [], 0, STARTED)
    assert (t.phase, t.reason) == ("Running", v.REFERENCE_MISSING)
    assert t.message == "spec.tasks.pvc: gone (the trainer keeps what it mounted; phase Running unchanged)"
    t = decide.report(spec(), status(), st.JobState("running"), None, ["spec.tasks.pvc: gone"], ["Deployment c"], 0, STARTED)
    assert (t.phase, t.reason, t.message) == ("Running", v.OWNERSHIP_CONFLICT,
                                              "Deployment c (left untouched; phase Running unchanged)")


# ---------------------------------------------------------------- the sandbox pool


REFUSAL = ("wmrl sandbox serve: isolation unavailable: --isolation namespaces needs bubblewrap (/usr/bin/bwrap) "
           "cannot create an execution's namespaces here: bwrap: Can't mount proc on /newroot/proc: Operation not "
           "permitted. It needs bubblewrap and unprivileged user namespaces ...")


def crash_looping(name="r-sandbox-abc", message=REFUSAL, restarts=4):
    return st.PodState(name, waiting_reason="CrashLoopBackOff", waiting_message="back-off 40s restarting failed "
                       "container=sandbox", terminated_message=message, exit_code=2, restarts=restarts)


def test_a_ready_pod_makes_the_pool_ready_whatever_the_others_do():
    r = decide.sandbox_readiness("namespaces", 3, 1, "", [crash_looping()])
    assert (r.status, r.reason, r.message, r.failing) == ("True", v.SANDBOX_PODS_READY, "1 of 3 sandbox Pods ready",
                                                          False)


def test_the_servers_refusal_is_isolation_unavailable_with_its_cause_and_the_alternatives():
    r = decide.sandbox_readiness("namespaces", 1, 0, "", [crash_looping()])
    assert (r.status, r.reason, r.failing) == ("False", v.ISOLATION_UNAVAILABLE, True)
    assert r.message.startswith("sandbox Pod r-sandbox-abc: isolation unavailable: --isolation namespaces needs "
                                "bubblewrap (/usr/bin/bwrap) cannot create an execution's namespaces here: bwrap: "
                                "Can't mount proc")
    assert "hostUsers: false" in r.message and "containerd 2" in r.message
    assert "spec.sandbox.isolation: restricted with a gVisor or Kata spec.sandbox.runtimeClassName" in r.message


def test_the_refusal_is_found_in_the_logs_the_kubelet_keeps_instead():
    """FallbackToLogsOnError: the termination message is the log's last lines; the refusal is cut out of them."""
    logs = "\n".join([f"2026-01-01 00:00:0{i} INFO wmrl.sandbox: line {i}" for i in range(8)] + [REFUSAL])
    r = decide.sandbox_readiness("namespaces", 1, 0, "", [crash_looping(message=logs)])
    assert r.reason == v.ISOLATION_UNAVAILABLE
    assert r.message.startswith("sandbox Pod r-sandbox-abc: isolation unavailable: --isolation namespaces")


@pytest.mark.parametrize("pod", [
    # containerd 1.6 and the like: the kubelet cannot even make the Pod's sandbox (stuck ContainerCreating).
    st.PodState("p", creating=True, sandbox_error="Failed to create pod sandbox: user namespaces is not supported "
                                                  "by the runtime"),
    # A runtime that refuses the unmasked /proc when it creates the container.
    st.PodState("p", waiting_reason="CreateContainerError", waiting_message="failed to generate spec: procMount "
                                                                            "Unmasked is not supported"),
    # Admitted to a node whose kubelet refuses user namespaces.
    st.PodState("p", pod_message="UnexpectedAdmissionError: pod requested a user namespace (hostUsers: false), but "
                                 "the feature gate UserNamespacesSupport is disabled"),
])
def test_a_runtime_without_user_namespaces_is_isolation_unavailable(pod):
    r = decide.sandbox_readiness("namespaces", 2, 0, "", [st.PodState("starting"), pod])
    assert r.reason == v.ISOLATION_UNAVAILABLE and r.message.startswith("sandbox Pod p: ")
    assert "gVisor or Kata" in r.message


def test_pods_failing_for_a_reason_of_their_own_say_which():
    bad_env = crash_looping(message="wmrl sandbox serve: WMRL_SANDBOX_TIMEOUT_SECONDS='soon' is not a valid float",
                            restarts=3)
    r = decide.sandbox_readiness("namespaces", 1, 0, "", [bad_env])
    assert (r.reason, r.failing) == (v.SANDBOX_PODS_FAILING, True)
    assert r.message == ("sandbox Pod r-sandbox-abc: CrashLoopBackOff (restarted 3 times): wmrl sandbox serve: "
                         "WMRL_SANDBOX_TIMEOUT_SECONDS='soon' is not a valid float")
    pull = st.PodState("q", waiting_reason="ImagePullBackOff", waiting_message="Back-off pulling image \"x\"")
    assert decide.sandbox_readiness("namespaces", 1, 0, "", [pull]).message == \
        'sandbox Pod q: ImagePullBackOff: Back-off pulling image "x"'


def test_a_deployment_that_cannot_make_pods_says_why():
    forbidden = 'pods "r-sandbox-1" is forbidden: violates PodSecurity "baseline:latest": seccompProfile'
    r = decide.sandbox_readiness("namespaces", 1, 0, forbidden, [])
    assert r.reason == v.SANDBOX_PODS_FAILING and r.message == f"the sandbox Deployment: {forbidden}"
    dropped = 'Pod "r-sandbox-1" is invalid: spec.containers[0].securityContext.procMount: Invalid value: "Unmasked"'
    assert decide.sandbox_readiness("namespaces", 1, 0, dropped, []).reason == v.ISOLATION_UNAVAILABLE


def test_starting_and_scaled_to_zero_are_not_failures():
    r = decide.sandbox_readiness("namespaces", 2, 0, "", [st.PodState("a", creating=True), st.PodState("b")])
    assert (r.status, r.reason, r.message, r.failing) == ("False", v.SANDBOX_PODS_STARTING,
                                                          "0 of 2 sandbox Pods ready yet", False)
    r = decide.sandbox_readiness("namespaces", 0, 0, "", [crash_looping()])  # terminating leftovers
    assert (r.reason, r.failing) == (v.SANDBOX_SCALED_TO_ZERO, False)


def test_restricted_isolation_points_at_the_runtime_class():
    r = decide.sandbox_readiness("restricted", 1, 0, "", [st.PodState("p", creating=True, sandbox_error=(
        "Failed to create pod sandbox: user namespaces is not supported by the runtime"))])
    assert r.reason == v.ISOLATION_UNAVAILABLE and "spec.sandbox.runtimeClassName" in r.message
    assert "hostUsers" not in r.message


def test_a_completed_evaluation_job_says_where_its_result_is():
    eval_spec = parse_spec({"mode": "eval", "policy": {"model": "m"}, "tasks": {"builtin": "mini-ml"},
                            "trainer": {"gpusPerNode": 0}})
    t = decide.success(st.JobState("succeeded", completion_time="2026-01-01T00:09:00Z"), NOW, eval_spec).transition
    assert (t.phase, t.reason) == ("Succeeded", v.EVALUATION_COMPLETED)
    assert "status.progress.heldOutReward" in t.message and t.fields == {"completionTime": "2026-01-01T00:09:00Z"}
    verdict = decide.trainer(eval_spec, {}, st.JobState("succeeded"), NOW)
    assert verdict.transition.reason == v.EVALUATION_COMPLETED
