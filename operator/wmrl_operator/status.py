"""Pure functions: children's state -> the run's phase and conditions.

Condition types (Kubernetes conventions; Job-like names):

==========  =============================================================================
Running     True while the trainer Job has ready pods; reasons TrainerRunning, TrainerPending,
            Restarting, Suspended, Finished
Suspended   True while ``spec.suspend`` holds the Job and pools at zero
Complete    True once the trainer Job completed (phase Succeeded)
Failed      True with reason InvalidSpec, MaxRestartsExceeded or DeadlineExceeded (phase Failed)
==========  =============================================================================
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any, Optional

from wmrl.api.schema import Phase
from wmrl.api.vocabulary import (
    COMPLETE_CONDITION,
    FAILED_CONDITION,
    INVALID_SPEC,
    NOT_COMPLETE,
    NOT_FAILED,
    NOT_SUSPENDED,
    QUEUED,
    RUNNING_CONDITION,
    SUSPENDED,
    SUSPENDED_CONDITION,
    TRAINER_COMPLETED,
    TRAINER_PENDING,
    TRAINER_RUNNING,
)

TERMINAL = (Phase.SUCCEEDED.value, Phase.FAILED.value)


def now_iso(now: Optional[dt.datetime] = None) -> str:
    now = now or dt.datetime.now(dt.timezone.utc)
    return now.astimezone(dt.timezone.utc).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: Optional[str]) -> Optional[dt.datetime]:
    if not value:
        return None
    return dt.datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.timezone.utc)


@dataclass(frozen=True)
class JobState:
    """What the trainer Job says: one of absent, suspended, pending, running, succeeded, failed."""

    state: str
    reason: str = ""
    message: str = ""
    uid: str = ""
    completion_time: Optional[str] = None


def job_state(job: Optional[dict[str, Any]]) -> JobState:
    if job is None or job.get("metadata", {}).get("deletionTimestamp"):
        return JobState("absent")
    uid = job["metadata"].get("uid", "")
    status = job.get("status") or {}
    conds = {c.get("type"): c for c in status.get("conditions") or [] if c.get("status") == "True"}
    if "Complete" in conds:
        return JobState("succeeded", "Complete", conds["Complete"].get("message", ""), uid, status.get("completionTime"))
    for kind in ("Failed", "FailureTarget"):
        if kind in conds:
            c = conds[kind]
            return JobState("failed", c.get("reason", "Failed"), c.get("message", ""), uid)
    if (job.get("spec") or {}).get("suspend"):
        return JobState("suspended", uid=uid)
    if (status.get("ready") or 0) > 0:
        return JobState("running", uid=uid)
    return JobState("pending", uid=uid)


@dataclass(frozen=True)
class PodState:
    """What a sandbox Pod's status says about why it does (not) serve (:func:`pod_state`)."""

    name: str
    ready: bool = False
    creating: bool = False  # its container is still being created (ContainerCreating, no status yet)
    waiting_reason: str = ""  # CrashLoopBackOff, CreateContainerError, RunContainerError, ...
    waiting_message: str = ""
    terminated_message: str = ""  # its container's last termination message (the server's refusal)
    exit_code: Optional[int] = None
    restarts: int = 0
    pod_message: str = ""  # the Pod's own reason and message (rejected at admission, evicted)
    sandbox_error: str = ""  # the kubelet's last FailedCreatePodSandBox Event (added by the reader)


def pod_state(pod: dict[str, Any]) -> PodState:
    """A Pod as :class:`PodState` (its first container: the sandbox Pod has one)."""
    status = pod.get("status") or {}
    conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
    containers = status.get("containerStatuses") or []
    first = containers[0] if containers else {}
    waiting = (first.get("state") or {}).get("waiting") or {}
    terminated = (first.get("state") or {}).get("terminated") or (first.get("lastState") or {}).get("terminated") or {}
    scheduled = conditions.get("PodScheduled") == "True"
    creating = status.get("phase") == "Pending" and scheduled and (not containers or waiting.get("reason") in (
        "ContainerCreating", "PodInitializing"))
    own = ": ".join(part for part in (status.get("reason"), status.get("message")) if part)
    return PodState(
        name=(pod.get("metadata") or {}).get("name", ""),
        ready=conditions.get("Ready") == "True",
        creating=creating,
        waiting_reason=waiting.get("reason", ""),
        waiting_message=waiting.get("message", ""),
        terminated_message=(terminated.get("message") or "").strip(),
        exit_code=terminated.get("exitCode"),
        restarts=int(first.get("restartCount") or 0),
        pod_message=own,
    )


def replica_failure(deployment: dict[str, Any]) -> str:
    """A Deployment's ReplicaFailure condition message (its ReplicaSet cannot create Pods), or ""."""
    for cond in (deployment.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "ReplicaFailure" and cond.get("status") == "True":
            return cond.get("message") or cond.get("reason") or "ReplicaFailure"
    return ""


def set_condition(conditions: list[dict[str, Any]], type_: str, status: str, reason: str, message: str,
                  generation: Optional[int], now: str) -> list[dict[str, Any]]:
    """A new list with ``type_`` set; lastTransitionTime moves only when the status flips."""
    out = []
    found = False
    for cond in conditions:
        if cond.get("type") == type_:
            found = True
            changed = cond.get("status") != status
            cond = {"type": type_, "status": status, "reason": reason, "message": message,
                    "lastTransitionTime": now if changed else cond.get("lastTransitionTime", now),
                    "observedGeneration": generation}
        out.append(cond)
    if not found:
        out.append({"type": type_, "status": status, "reason": reason, "message": message,
                    "lastTransitionTime": now, "observedGeneration": generation})
    return out


def get_condition(status: dict[str, Any], type_: str) -> Optional[dict[str, Any]]:
    for cond in status.get("conditions") or []:
        if cond.get("type") == type_:
            return cond
    return None


def invalid_spec_failure(status: dict[str, Any]) -> bool:
    """A run Failed only because its spec was invalid may be corrected and then proceeds."""
    failed = get_condition(status, FAILED_CONDITION)
    return bool(failed and failed.get("status") == "True" and failed.get("reason") == INVALID_SPEC)


def is_finished(status: dict[str, Any]) -> bool:
    return status.get("phase") in TERMINAL and not invalid_spec_failure(status)


def conditions_for(phase: str, reason: str, message: str, old: list[dict[str, Any]],
                   generation: Optional[int], now: str) -> list[dict[str, Any]]:
    """All four condition types consistent with ``phase``; ``reason``/``message`` describe it."""
    conds = list(old)
    running = phase == Phase.RUNNING.value
    conds = set_condition(conds, RUNNING_CONDITION, "True" if running else "False", reason, message, generation, now)
    conds = set_condition(conds, SUSPENDED_CONDITION, "True" if phase == Phase.SUSPENDED.value else "False",
                          reason if phase == Phase.SUSPENDED.value else NOT_SUSPENDED,
                          message if phase == Phase.SUSPENDED.value else "", generation, now)
    conds = set_condition(conds, COMPLETE_CONDITION, "True" if phase == Phase.SUCCEEDED.value else "False",
                          reason if phase == Phase.SUCCEEDED.value else NOT_COMPLETE,
                          message if phase == Phase.SUCCEEDED.value else "", generation, now)
    conds = set_condition(conds, FAILED_CONDITION, "True" if phase == Phase.FAILED.value else "False",
                          reason if phase == Phase.FAILED.value else NOT_FAILED,
                          message if phase == Phase.FAILED.value else "", generation, now)
    return conds


def status_patch(old: dict[str, Any], phase: str, reason: str, message: str, generation: Optional[int],
                 now: str, **fields: Any) -> dict[str, Any]:
    """The operator's part of ``status`` (never ``progress``): phase, conditions, generation + ``fields``."""
    patch: dict[str, Any] = {
        "phase": phase,
        "conditions": conditions_for(phase, reason, message, old.get("conditions") or [], generation, now),
        "observedGeneration": generation,
    }
    patch.update({k: v for k, v in fields.items()})
    return patch


def changed(old: dict[str, Any], patch: dict[str, Any]) -> bool:
    """Would ``patch`` change ``old``? (Avoids writes, and the watch events they cause, when converged.)"""
    return any(old.get(k) != v for k, v in patch.items())


def is_queued(status: dict[str, Any]) -> bool:
    """Waiting for Kueue to admit the trainer (``phase_from_job``'s reason ``Queued``)."""
    return (get_condition(status, RUNNING_CONDITION) or {}).get("reason") == QUEUED


def phase_from_job(js: JobState, suspended: bool, queue: Optional[str] = None) -> tuple[str, str, str]:
    """(phase, reason, message) for a non-failed, non-terminal trainer Job; ``queue``: the Kueue
    LocalQueue that admits it (its Job stays suspended until then)."""
    if js.state == "succeeded":
        return Phase.SUCCEEDED.value, TRAINER_COMPLETED, "the trainer Job completed"
    if queue and not suspended and js.state in ("suspended", "absent"):
        return (Phase.PENDING.value, QUEUED,
                f"waiting for Kueue to admit the trainer Job (LocalQueue {queue!r}); it starts once admitted")
    if suspended or js.state == "suspended":
        return Phase.SUSPENDED.value, SUSPENDED, "spec.suspend is true: trainer suspended, pools scaled to zero"
    if js.state == "running":
        return Phase.RUNNING.value, TRAINER_RUNNING, "the trainer is running"
    return Phase.PENDING.value, TRAINER_PENDING, "waiting for the trainer pods to become ready"


def deadline_exceeded(start_time: Optional[str], active_deadline: Optional[int], now: dt.datetime) -> bool:
    start = parse_time(start_time)
    return bool(active_deadline and start and (now - start).total_seconds() >= active_deadline)


def remaining_deadline(start_time: Optional[str], active_deadline: Optional[int], now: dt.datetime) -> Optional[int]:
    if not active_deadline:
        return None
    start = parse_time(start_time) or now
    return max(1, int(active_deadline - (now - start).total_seconds()))


def ttl_expired(completion_time: Optional[str], ttl: Optional[int], now: dt.datetime) -> bool:
    done = parse_time(completion_time)
    return ttl is not None and done is not None and (now - done).total_seconds() >= ttl
