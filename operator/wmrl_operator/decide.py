"""Pure decisions of one reconcile: (spec, status, the trainer Job's state, references and
conflicts found, the run's Kueue queue, now) -> what to write.

``reconcile.py`` reads, asks these functions, and writes. It asks in three steps, because a later
step decides from what an earlier step's writes returned (the status a restart wrote, the Job a
suspend patch returned):

1. :func:`waiting`, then :func:`trainer` (:func:`deadline`, :func:`failure`, :func:`success`):
   wait, finish, restart the trainer, or go on;
2. :func:`children` (:func:`start_time`, :func:`awaiting_admission`) and :func:`suspension`:
   which children to write, and how to hold or release the trainer;
3. :func:`report`: the status that says where the run is.

Apart from those steps, the resync asks :func:`sandbox_readiness` whether the sandbox pool serves
(the ``SandboxReady`` condition), from its Pods' status.

Condition reasons and Event reasons are :mod:`wmrl.api.vocabulary`'s.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence, Union

from wmrl.api.schema import Mode, Phase, WMRLRunSpec
from wmrl.api.vocabulary import (
    DEADLINE,
    EVALUATION_COMPLETED,
    INVALID_SPEC,
    ISOLATION_UNAVAILABLE,
    MAX_RESTARTS,
    OWNERSHIP_CONFLICT,
    REFERENCE_MISSING,
    RESTARTING,
    RUNNING_CONDITION,
    SANDBOX_ISOLATION_REFUSAL,
    SANDBOX_PODS_FAILING,
    SANDBOX_PODS_READY,
    SANDBOX_PODS_STARTING,
    SANDBOX_SCALED_TO_ZERO,
    TRAINER_COMPLETED,
    TRAINER_RESTARTED,
    WAITING_FOR_REFERENCES,
)
from wmrl_operator import status as st

ACTIVE = ("pending", "running")  # Job states of a trainer that has started (Kueue admitted it, if queued)
HELD = ("absent", "suspended")  # Job states of a trainer a queued run waits for Kueue to admit


@dataclass(frozen=True)
class Transition:
    """A status write: ``phase``, the conditions' ``reason`` and ``message``, more status ``fields``.

    Written only if it changes the status; then an Event of ``event_type`` is posted (and a line
    logged) when the phase moves, or when the Running condition's reason differs from ``event``
    (default: ``reason``) outside phase Failed.
    """

    phase: str
    reason: str
    message: str
    event_type: str = "Normal"
    event: Optional[str] = None
    fields: Mapping[str, Any] = field(default_factory=dict)

    @property
    def event_reason(self) -> str:
        return self.event or self.reason


@dataclass(frozen=True)
class Finish:
    """Terminal: pools and world model scaled to zero, the trainer Job deleted when ``delete_job``
    (a deadline stops it), then ``transition`` (which sets ``completionTime``)."""

    transition: Transition
    delete_job: bool = False


@dataclass(frozen=True)
class Restart:
    """The trainer Job failed and the run goes on: the Job is deleted (the children's write makes it
    again, resuming from the checkpoint). ``transition`` counts a new failure first; None when this
    Job's failure is already counted (``status.lastFailedTrainer``). ``restarts``: the count after it."""

    restarts: int
    transition: Optional[Transition] = None


@dataclass(frozen=True)
class ChildrenPlan:
    """What the children's write is told: whether it happens at all this reconcile, the run's start
    time (the trainer's remaining deadline counts from it), whether Kueue has yet to admit the trainer
    (its pools wait at zero), whether unwanted children may be pruned, whether the calibration's
    objects are left out (they would take over another's)."""

    write: bool
    start_time: Optional[str]
    awaiting_admission: bool
    may_prune: bool
    skip_calibration: bool


@dataclass(frozen=True)
class Suspension:
    """Hold (``suspend``) or release the trainer: through its Kueue Workload's ``spec.active`` when the
    run is queued (Kueue owns Job.spec.suspend then), else through the Job's ``spec.suspend``."""

    through_workload: bool
    suspend: bool


# ---------------------------------------------------------------- step 1: wait, finish, restart


def invalid_spec(errors: list[str]) -> Transition:
    """A spec the schema rejects fails the run, naming each field (a corrected spec proceeds)."""
    message = "; ".join(errors)
    return Transition(Phase.FAILED.value, INVALID_SPEC, message, "Warning")


def waiting(missing: list[str], conflicts: list[str], job_exists: bool) -> Optional[Transition]:
    """Before the trainer Job exists, create nothing while writing would take over another run's (or
    a shared) calibration (``conflicts``), or while an object the spec names is ``missing``; the run
    waits in Pending saying which. Once the Job exists, neither stops the run (:func:`report`)."""
    if job_exists:
        return None
    if conflicts:
        return Transition(Phase.PENDING.value, OWNERSHIP_CONFLICT, "; ".join(conflicts), "Warning")
    if missing:
        return Transition(Phase.PENDING.value, WAITING_FOR_REFERENCES, "; ".join(missing), "Warning")
    return None


def finish(phase: str, reason: str, message: str, completion_time: str, delete_job: bool = False,
           **fields: Any) -> Finish:
    """A terminal transition at ``completion_time``: a Warning Event for Failed, Normal otherwise."""
    event_type = "Warning" if phase == Phase.FAILED.value else "Normal"
    return Finish(Transition(phase, reason, message, event_type,
                             fields={"completionTime": completion_time, **fields}), delete_job)


def deadline(spec: WMRLRunSpec, status: dict[str, Any], js: st.JobState, now: dt.datetime) -> Optional[Finish]:
    """``spec.activeDeadlineSeconds`` past since ``status.startTime``, or the trainer Job failed on
    its own deadline (which the operator sets to what is left of the run's): Failed, the Job deleted."""
    if st.deadline_exceeded(status.get("startTime"), spec.active_deadline_seconds, now) or (
            js.state == "failed" and js.reason == DEADLINE):
        message = f"the run exceeded spec.activeDeadlineSeconds ({spec.active_deadline_seconds} s)"
        return finish(Phase.FAILED.value, DEADLINE, message, st.now_iso(now), delete_job=True)
    return None


def failure(spec: WMRLRunSpec, status: dict[str, Any], js: st.JobState,
            now: dt.datetime) -> Union[Finish, Restart, None]:
    """A failed trainer Job is counted once (by its uid): past ``spec.failurePolicy.maxRestarts`` the
    run fails (the Job is kept, for its logs); otherwise it restarts."""
    if js.state != "failed":
        return None
    restarts = int(status.get("restarts") or 0)
    if js.uid == status.get("lastFailedTrainer"):
        return Restart(restarts)
    limit = spec.failure_policy.max_restarts
    if restarts >= limit:
        message = (f"the trainer failed {restarts + 1} times (spec.failurePolicy.maxRestarts is "
                   f"{limit}); last failure: {js.reason}: {js.message}".rstrip(": "))
        return finish(Phase.FAILED.value, MAX_RESTARTS, message, st.now_iso(now), lastFailedTrainer=js.uid)
    restarts += 1
    message = f"trainer Job failed ({js.reason}); restart {restarts} of {limit}, resuming from checkpoint"
    return Restart(restarts, Transition(Phase.PENDING.value, RESTARTING, message, "Warning", TRAINER_RESTARTED,
                                        {"restarts": restarts, "lastFailedTrainer": js.uid}))


def success(js: st.JobState, now: dt.datetime, spec: Optional[WMRLRunSpec] = None) -> Optional[Finish]:
    """The trainer Job completed: Succeeded, at the Job's completion time. In mode eval the Job was the
    evaluation, whose result the evaluation process patched into ``status.progress``."""
    if js.state != "succeeded":
        return None
    if spec is not None and spec.mode is Mode.EVAL:
        return finish(Phase.SUCCEEDED.value, EVALUATION_COMPLETED,
                      "the evaluation Job completed: status.progress.heldOutReward is its result, "
                      "status.progress.heldOut.report its report", js.completion_time or st.now_iso(now))
    return finish(Phase.SUCCEEDED.value, TRAINER_COMPLETED, "the trainer Job completed",
                  js.completion_time or st.now_iso(now))


def trainer(spec: WMRLRunSpec, status: dict[str, Any], js: st.JobState,
            now: dt.datetime) -> Union[Finish, Restart, None]:
    """The trainer's verdict, the deadline first (it fails a run whatever its trainer did)."""
    return deadline(spec, status, js, now) or failure(spec, status, js, now) or success(js, now, spec)


# ---------------------------------------------------------------- step 2: children and suspension


def start_time(spec: WMRLRunSpec, started: Optional[str], js: st.JobState, queue: Optional[str],
               now: dt.datetime) -> Optional[str]:
    """``status.startTime`` (``started``, as the run was read), set at the first reconcile that is not
    suspended; a queued run's is set once Kueue admits its Job (its deadline counts from then)."""
    if started is None and not spec.suspend and (not queue or js.state in ACTIVE):
        return st.now_iso(now)
    return started


def awaiting_admission(spec: WMRLRunSpec, js: st.JobState, queue: Optional[str]) -> bool:
    """A queued, unsuspended run whose Job Kueue has not admitted (or that has none yet)."""
    return bool(queue) and not spec.suspend and js.state in HELD


def children(spec: WMRLRunSpec, status: dict[str, Any], js: st.JobState, queue: Optional[str], *,
             apply_children: bool, generation: Optional[int], conflicts: list[str], started: Optional[str],
             now: dt.datetime) -> ChildrenPlan:
    """Children are written on a spec reconcile (``apply_children``), when the Job is absent (made
    again), and, for a queued run, while it waits for admission and at the Job event that admits it
    (its pools wait at zero until then, and only a Job event reports admission). Only a changed spec
    (generation past 1) can make a child unwanted: pruning is for spec reconciles past it. ``status``:
    as the trainer's verdict left it; ``started``: ``status.startTime`` as the run was read."""
    awaiting = awaiting_admission(spec, js, queue)
    write = apply_children or js.state == "absent" or awaiting or bool(queue and st.is_queued(status))
    return ChildrenPlan(write=write, start_time=start_time(spec, started, js, queue, now), awaiting_admission=awaiting,
                        may_prune=apply_children and generation != 1, skip_calibration=bool(conflicts))


def suspension(spec: WMRLRunSpec, status: dict[str, Any], job: Optional[dict[str, Any]],
               queue: Optional[str]) -> Optional[Suspension]:
    """How ``spec.suspend`` reaches an existing trainer Job: a queued run's Workload is deactivated
    while suspended and activated again once the run leaves phase Suspended; any other Job's
    ``spec.suspend`` is patched when it differs. None: nothing to write."""
    if job is None:
        return None
    if queue:
        if spec.suspend or status.get("phase") == Phase.SUSPENDED.value:
            return Suspension(through_workload=True, suspend=spec.suspend)
        return None
    if bool((job.get("spec") or {}).get("suspend")) != spec.suspend:
        return Suspension(through_workload=False, suspend=spec.suspend)
    return None


# ---------------------------------------------------------------- step 3: the status


def report(spec: WMRLRunSpec, status: dict[str, Any], js: st.JobState, queue: Optional[str],
           missing: list[str], conflicts: list[str], restarts: int, start: Optional[str]) -> Transition:
    """Phase and reason from the trainer Job (:func:`status.phase_from_job`), with three overrides
    of the reason: a restart's is kept while the replacement Job is being made; a referenced object
    gone while the trainer runs is ReferenceMissing (the trainer keeps what it mounted: never fail it
    over one); calibration objects it would take over are OwnershipConflict (left untouched). The
    phase always follows the trainer."""
    phase, reason, message = st.phase_from_job(js, spec.suspend, queue)
    if phase == Phase.PENDING.value and js.state == "absent" and status.get("phase") == Phase.PENDING.value:
        running = st.get_condition(status, RUNNING_CONDITION) or {}
        if running.get("reason") == RESTARTING:
            reason, message = RESTARTING, running.get("message", message)
    if missing:
        reason = REFERENCE_MISSING
        message = "; ".join(missing) + f" (the trainer keeps what it mounted; phase {phase} unchanged)"
    if conflicts:
        reason = OWNERSHIP_CONFLICT
        message = "; ".join(conflicts) + f" (left untouched; phase {phase} unchanged)"
    fields: dict[str, Any] = {"restarts": restarts}
    if start:
        fields["startTime"] = start
    return Transition(phase, reason, message, fields=fields)


# ---------------------------------------------------------------- the sandbox pool


@dataclass(frozen=True)
class SandboxReadiness:
    """The ``SandboxReady`` condition: ``status`` True or False, ``reason``, ``message``."""

    status: str
    reason: str
    message: str

    @property
    def failing(self) -> bool:
        return self.reason in (ISOLATION_UNAVAILABLE, SANDBOX_PODS_FAILING)


ISOLATION_SIGNS = (SANDBOX_ISOLATION_REFUSAL, "user namespace", "usernamespace", "userns", "hostusers", "procmount",
                   "idmap", "can't mount proc")
"""Words (lower case) in a Pod's failure that say the runtime cannot give the isolation: the server's
refusal, the kubelet's ``user namespaces is not supported by the runtime``, a runtime refusing
``procMount`` or an idmapped mount, bubblewrap's ``Can't mount proc``."""
FAILING = ("CrashLoopBackOff", "CreateContainerError", "CreateContainerConfigError", "RunContainerError",
           "StartError", "ErrImagePull", "ImagePullBackOff", "InvalidImageName")
"""Waiting reasons of a container that will not start by itself."""
NAMESPACES_NEED = (
    "isolation: namespaces needs a user namespace of the Pod's own (hostUsers: false) with an unmasked /proc "
    "(procMount: Unmasked) and unprivileged user namespaces inside it: a runtime with user namespaces, containerd 2 "
    "or CRI-O with runc 1.2+ or crun, on Linux 6.3+ (docs/sandbox.md). Alternatives: spec.sandbox.isolation: "
    "restricted with a gVisor or Kata spec.sandbox.runtimeClassName (the runtime is then the boundary), or "
    "spec.sandbox.nodeSelector for nodes whose runtime gives user namespaces")
RESTRICTED_NEED = ("isolation: restricted runs each execution without namespaces of its own; check that "
                   "spec.sandbox.runtimeClassName names a runtime the nodes have (docs/sandbox.md)")


def _excerpt(text: str, limit: int = 600) -> str:
    """The part of a (log-long) message that says why: from the server's refusal on, else its end."""
    text = " ".join(text.split())
    at = text.lower().find(SANDBOX_ISOLATION_REFUSAL)
    if at >= 0:
        return text[at:at + limit]
    return text if len(text) <= limit else "..." + text[-limit:]


def _evidence(pod: st.PodState) -> list[str]:
    """What a Pod says about why it does not serve, most telling first."""
    said = [pod.terminated_message, pod.sandbox_error, pod.pod_message]
    if pod.waiting_reason in FAILING and pod.waiting_message:
        said.append(pod.waiting_message)
    return [text for text in said if text]


def sandbox_readiness(isolation: str, replicas: int, ready: int, replica_failure: str,
                      pods: Sequence[st.PodState]) -> SandboxReadiness:
    """Whether the pool serves (a ready Pod), and if not, why: the runtime cannot give ``isolation``
    (IsolationUnavailable, naming the cause and the alternatives), its Pods fail for a reason of their
    own (PodsFailing, naming it), it is at zero, or its Pods are still starting.

    ``replicas``/``ready``: the sandbox Deployment's; ``replica_failure``: its ReplicaFailure message
    (its Pods cannot even be created); ``pods``: its Pods (:func:`status.pod_state`).
    """
    if ready > 0:
        return SandboxReadiness("True", SANDBOX_PODS_READY, f"{ready} of {replicas} sandbox Pods ready")
    if replicas == 0:
        return SandboxReadiness("False", SANDBOX_SCALED_TO_ZERO, "the sandbox pool is scaled to zero")
    said = ([("the sandbox Deployment", replica_failure)] if replica_failure else []) + \
        [(f"sandbox Pod {pod.name}", text) for pod in pods for text in _evidence(pod)]
    need = NAMESPACES_NEED if isolation == "namespaces" else RESTRICTED_NEED
    for where, text in said:
        if any(sign in text.lower() for sign in ISOLATION_SIGNS):
            return SandboxReadiness("False", ISOLATION_UNAVAILABLE, f"{where}: {_excerpt(text)}. {need}")
    for pod in pods:
        if pod.waiting_reason in FAILING or pod.sandbox_error or pod.pod_message:
            why = pod.waiting_reason or ("FailedCreatePodSandBox" if pod.sandbox_error else "Failed")
            detail = next(iter(_evidence(pod)), "")
            restarts = f" (restarted {pod.restarts} times)" if pod.restarts else ""
            return SandboxReadiness("False", SANDBOX_PODS_FAILING,
                                    f"sandbox Pod {pod.name}: {why}{restarts}" + (f": {_excerpt(detail)}" if detail
                                                                                 else ""))
    if replica_failure:
        return SandboxReadiness("False", SANDBOX_PODS_FAILING, f"the sandbox Deployment: {_excerpt(replica_failure)}")
    return SandboxReadiness("False", SANDBOX_PODS_STARTING, f"0 of {replicas} sandbox Pods ready yet")
