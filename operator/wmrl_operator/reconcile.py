"""Level-triggered reconciliation of one WMRLRun: read the run and its trainer Job, converge.

Every entry point (kopf create/update/resume, trainer Job events, timers) ends here, under a
per-run lock, and always starts from a fresh GET of the run, so a stale event body can never
double-count a restart. The children are written by :class:`writer.ChildWriter`.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import math
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Optional

from prometheus_client import Counter
from pydantic import ValidationError

from wmrl.api.runconfig import CALIBRATION_PORT
from wmrl.api.schema import API_VERSION, KIND, PLURAL, Phase, WMRLRunSpec, field_errors, parse_spec
from wmrl.api.vocabulary import (
    DEADLINE,
    INVALID_SPEC,
    KUEUE_JOB_UID_LABEL,
    MAX_RESTARTS,
    OWNERSHIP_CONFLICT,
    REFERENCE_MISSING,
    RESTARTING,
    RUNNING_CONDITION,
    SANDBOX_SCALED,
    TRAINER_COMPLETED,
    TRAINER_RESTARTED,
    WAITING_FOR_REFERENCES,
)
from wmrl_operator import builders, status as st
from wmrl_operator.autoscaler import Recommendations, demand_of
from wmrl_operator.children import Children
from wmrl_operator.events import EventRecorder
from wmrl_operator.kube import ApiError, Kube
from wmrl_operator.writer import ChildWriter

log = logging.getLogger("wmrl.operator")

CalibrationFetch = Callable[[str], Awaitable[Optional[dict[str, Any]]]]
COALESCED = Counter("wmrl_operator_reconciles_coalesced_total",
                    "Reconcile requests covered by one already waiting for the same run")


@dataclass
class _Waiting:
    apply_children: bool
    done: asyncio.Future


@dataclass
class Settings:
    operator_image: str = builders.DEFAULT_OPERATOR_IMAGE
    calibration_timeout: float = 1.0
    # Runs reconciled at once. Bounded so that a burst of new runs is served roughly first come,
    # first served (each finishes in a few requests' time) instead of all progressing slowly.
    max_concurrent: int = 8


class Reconciler:
    def __init__(self, kube: Kube, settings: Settings = Settings(),
                 fetch_calibration: Optional[CalibrationFetch] = None, children: Optional[Children] = None):
        self.kube = kube
        self.children = children or Children()  # with no cache started, every child is written
        self.writer = ChildWriter(kube, self.children, settings.operator_image)
        self.settings = settings
        self.events = EventRecorder(kube)
        self.fetch_calibration = fetch_calibration
        self.locks: defaultdict[tuple[str, str], asyncio.Lock] = defaultdict(asyncio.Lock)
        self.recommendations = Recommendations()
        self.slots = asyncio.Semaphore(settings.max_concurrent)
        self._waiting: dict[tuple[str, str], _Waiting] = {}  # the reconcile of a run waiting for its turn
        self._reconciled_at: dict[tuple[str, str], float] = {}  # monotonic time of each run's last reconcile

    # ------------------------------------------------------------ entry points

    async def reconcile(self, namespace: str, name: str, apply_children: bool = True) -> None:
        """Converge run ``namespace/name``; ``apply_children`` re-applies every child (spec events).

        A per-run work queue of depth one: while a reconcile of the run waits for its turn, further
        requests join it (it reads the run afresh when it starts, so it covers their events) instead
        of queueing reconciles of their own; each caller gets the outcome of the one that covered it,
        so a failure is still retried by whoever asked. A burst of Job events costs one reconcile.
        """
        key = (namespace, name)
        waiting = self._waiting.get(key)
        if waiting is not None:
            waiting.apply_children = waiting.apply_children or apply_children
            COALESCED.inc()
            await asyncio.shield(waiting.done)
            return
        waiting = self._waiting[key] = _Waiting(apply_children, asyncio.get_running_loop().create_future())
        try:
            async with self.locks[key]:
                del self._waiting[key]  # from here on, new events need a reconcile of their own
                async with self.slots:
                    body = await self._get_run(namespace, name)
                    if body is not None:
                        await self._reconcile(body, waiting.apply_children)
                        self._reconciled_at[key] = time.monotonic()
        except BaseException as exc:
            if self._waiting.get(key) is waiting:  # cancelled before its turn came
                del self._waiting[key]
            if isinstance(exc, Exception):
                waiting.done.set_exception(exc)
                waiting.done.exception()  # marked retrieved: the callers that joined re-raise it
            else:
                waiting.done.cancel()
            raise
        waiting.done.set_result(None)

    async def housekeeping(self, namespace: str, name: str, fresh_within: float = 0.0) -> None:
        """Periodic: deadline, TTL, sandbox autoscaling (cheap when nothing changes).

        The catch-up reconcile is skipped for a run reconciled less than ``fresh_within`` seconds
        ago: during a burst, events keep every run fresh and the resync loop only adds load.
        """
        key = (namespace, name)
        async with self.locks[key], self.slots:
            body = await self._get_run(namespace, name)
            if body is None:
                return
            status = body.get("status") or {}
            try:
                spec = parse_spec(body.get("spec") or {})
            except ValidationError:
                return
            now = dt.datetime.now(dt.timezone.utc)
            if st.is_finished(status):
                if st.ttl_expired(status.get("completionTime"), spec.ttl_seconds_after_finished, now):
                    await self._delete_run(body)
                return
            # Level-triggered catch-up: deadlines, and anything a lost watch event left behind.
            if time.monotonic() - self._reconciled_at.get(key, -math.inf) >= fresh_within:
                await self._reconcile(body, apply_children=False)
                self._reconciled_at[key] = time.monotonic()
                body = await self._get_run(namespace, name)
            status = (body or {}).get("status") or {}
            if body is not None and status.get("phase") and not st.is_finished(status):
                await self._autoscale(body, spec, status)

    async def refresh_calibration(self, namespace: str, name: str) -> None:
        """Copy the calibration service's pairs/reduction/weight into status.calibration (fails soft)."""
        if self.fetch_calibration is None:
            return
        body = await self._get_run(namespace, name)
        if body is None:
            return
        try:
            spec = parse_spec(body.get("spec") or {})
        except ValidationError:
            return
        if not builders.needs_calibration(spec):
            return
        run = builders.Run.from_body(body)
        cname = builders.calibration_name(run, spec)
        view = await self.fetch_calibration(f"http://{cname}.{namespace}.svc:{CALIBRATION_PORT}/v1/calibration")
        summary: dict[str, Any] = {"name": cname}
        if view is not None:
            bias = view.get("bias") or {}
            summary.update({"pairs": int(view.get("pairs") or 0), "reduction": bias.get("reduction"),
                            "weight": view.get("weight")})
        old = (body.get("status") or {}).get("calibration")
        if view is None and old and old.get("name") == cname:
            return  # unreachable: keep the last known figures
        if old != summary:
            await self._patch_status(body, {"calibration": summary})

    def forget(self, namespace: str, name: str) -> None:
        self.recommendations.forget((namespace, name))
        self.locks.pop((namespace, name), None)
        self._reconciled_at.pop((namespace, name), None)
        self.children.forget(namespace, name)

    # ------------------------------------------------------------ core

    async def _reconcile(self, body: dict[str, Any], apply_children: bool) -> None:
        run = builders.Run.from_body(body)
        status = body.get("status") or {}
        generation = body["metadata"].get("generation")
        now = dt.datetime.now(dt.timezone.utc)
        now_s = st.now_iso(now)

        try:
            spec = parse_spec(body.get("spec") or {})
        except ValidationError as exc:
            message = "; ".join(field_errors(exc))
            patch = st.status_patch(status, Phase.FAILED.value, INVALID_SPEC, message, generation, now_s)
            await self._transition(body, status, patch, "Warning", INVALID_SPEC, message)
            return

        if st.is_finished(status):
            return

        # The reads are independent: one round trip's time, not four.
        reads = [self._missing_references(run, spec),
                 self.kube.get("batch/v1", "Job", run.namespace, builders.trainer_name(run))]
        if apply_children:
            reads.append(self._ownership_conflicts(run, spec))
        missing, job, *checked = await asyncio.gather(*reads)
        if checked:
            conflicts = checked[0]
        else:
            conflicts = await self._ownership_conflicts(run, spec) if job is None else []
        if conflicts and job is None:
            # Writing would take over another run's (or a shared) calibration: create nothing, say which.
            message = "; ".join(conflicts)
            patch = st.status_patch(status, Phase.PENDING.value, OWNERSHIP_CONFLICT, message, generation, now_s)
            await self._transition(body, status, patch, "Warning", OWNERSHIP_CONFLICT, message)
            return
        if missing and job is None:
            # Nothing started yet: wait for the objects (they may be created after the run), create nothing.
            message = "; ".join(missing)
            patch = st.status_patch(status, Phase.PENDING.value, WAITING_FOR_REFERENCES, message, generation, now_s)
            await self._transition(body, status, patch, "Warning", WAITING_FOR_REFERENCES, message)
            return

        js = st.job_state(job)
        restarts = int(status.get("restarts") or 0)
        start_time = status.get("startTime")

        if st.deadline_exceeded(start_time, spec.active_deadline_seconds, now) or (
                js.state == "failed" and js.reason == DEADLINE):
            message = f"the run exceeded spec.activeDeadlineSeconds ({spec.active_deadline_seconds} s)"
            await self._finish(body, run, spec, status, Phase.FAILED.value, DEADLINE, message, now_s,
                               job_to_delete=job)
            return

        if js.state == "failed":
            if js.uid != status.get("lastFailedTrainer"):
                if restarts >= spec.failure_policy.max_restarts:
                    message = (f"the trainer failed {restarts + 1} times (spec.failurePolicy.maxRestarts is "
                               f"{spec.failure_policy.max_restarts}); last failure: {js.reason}: {js.message}".rstrip(": "))
                    await self._finish(body, run, spec, status, Phase.FAILED.value, MAX_RESTARTS, message, now_s,
                                       lastFailedTrainer=js.uid)
                    return
                restarts += 1
                message = f"trainer Job failed ({js.reason}); restart {restarts} of {spec.failure_policy.max_restarts}, resuming from checkpoint"
                patch = st.status_patch(status, Phase.PENDING.value, RESTARTING, message, generation, now_s,
                                        restarts=restarts, lastFailedTrainer=js.uid)
                status = await self._transition(body, status, patch, "Warning", TRAINER_RESTARTED, message)
            await self.kube.delete("batch/v1", "Job", run.namespace, builders.trainer_name(run), uid=js.uid)
            job, js = None, st.JobState("absent")

        if js.state == "succeeded":
            await self._finish(body, run, spec, status, Phase.SUCCEEDED.value, TRAINER_COMPLETED,
                               "the trainer Job completed", js.completion_time or now_s)
            return

        admission = builders.admission_labels(body["metadata"].get("labels"))
        queue = builders.queue_name(admission)
        # A queued run starts when Kueue admits its Job: its deadline counts from then.
        if start_time is None and not spec.suspend and (not queue or js.state in ("pending", "running")):
            start_time = now_s
        awaiting_admission = bool(queue) and not spec.suspend and js.state in ("absent", "suspended")
        # A queued run's pools wait at zero until admission, which only a Job event reports: while it
        # waits, and at the event that admits it, it re-applies its children.
        if apply_children or js.state == "absent" or awaiting_admission or (queue and st.is_queued(status)):
            await self.writer.write_children(run, spec, start_time, now, job_exists=job is not None,
                                             skip_calibration=bool(conflicts),
                                             may_prune=apply_children and generation != 1,
                                             admission=admission, awaiting_admission=awaiting_admission)
        if job is not None and queue:
            # Kueue owns Job.spec.suspend: suspending a queued run deactivates its Workload instead.
            if spec.suspend or status.get("phase") == Phase.SUSPENDED.value:
                await self._set_workload_active(run, job, active=not spec.suspend)
        elif job is not None and bool((job.get("spec") or {}).get("suspend")) != spec.suspend:
            job = await self.kube.merge_patch("batch/v1", "Job", run.namespace, builders.trainer_name(run),
                                              {"spec": {"suspend": spec.suspend}})
            js = st.job_state(job)

        phase, reason, message = st.phase_from_job(js, spec.suspend, queue)
        if phase == Phase.PENDING.value and js.state == "absent" and status.get("phase") == Phase.PENDING.value:
            reason, message = status_reason(status, reason, message)
        if missing:  # a trainer runs with what it mounted: never fail it over a reference, say so
            reason = REFERENCE_MISSING
            message = "; ".join(missing) + f" (the trainer keeps what it mounted; phase {phase} unchanged)"
        if conflicts:  # a running trainer keeps its calibration; the conflicting objects are left alone
            reason = OWNERSHIP_CONFLICT
            message = "; ".join(conflicts) + f" (left untouched; phase {phase} unchanged)"
        fields: dict[str, Any] = {"restarts": restarts}
        if start_time:
            fields["startTime"] = start_time
        patch = st.status_patch(status, phase, reason, message, generation, now_s, **fields)
        await self._transition(body, status, patch, "Normal", reason, message)

    async def _missing_references(self, run: builders.Run, spec: WMRLRunSpec) -> list[str]:
        """What a schema cannot check: objects the spec names must exist in the run's namespace.

        Before its trainer exists, a run naming a missing one waits in Pending/WaitingForReferences
        and nothing is created; it proceeds by itself once the object appears (re-checked on every
        resync). A run whose trainer already exists is never failed over one: its condition says
        ReferenceMissing and its phase follows the trainer.
        """
        refs = []
        if spec.tasks.config_map:
            refs.append(("spec.tasks.configMap", "v1", "ConfigMap", spec.tasks.config_map))
        if spec.tasks.pvc:
            refs.append(("spec.tasks.pvc", "v1", "PersistentVolumeClaim", spec.tasks.pvc))
        if spec.trainer.checkpoint.claim_name:
            refs.append(("spec.trainer.checkpoint.claimName", "v1", "PersistentVolumeClaim", spec.trainer.checkpoint.claim_name))
        found = await asyncio.gather(*(self.kube.get(api_version, kind, run.namespace, name)
                                       for _, api_version, kind, name in refs))
        return [f"{field}: {kind} {name!r} not found in namespace {run.namespace!r}"
                for (field, _, kind, name), obj in zip(refs, found) if obj is None]

    async def _ownership_conflicts(self, run: builders.Run, spec: WMRLRunSpec) -> list[str]:
        """The calibration objects this run would take over (``builders.ownership_conflict``): its
        Deployment and state ConfigMap, the ones a name collision puts at stake."""
        if not builders.needs_calibration(spec):
            return []
        at_stake = [o for o in builders.calibration_objects(run, spec) if o["kind"] in ("Deployment", "ConfigMap")]
        existing = await asyncio.gather(*(self.kube.get(o["apiVersion"], o["kind"], run.namespace,
                                                        o["metadata"]["name"]) for o in at_stake))
        return [why for obj, found in zip(at_stake, existing) if (why := builders.ownership_conflict(run, obj, found))]

    async def _set_workload_active(self, run: builders.Run, job: dict[str, Any], active: bool) -> None:
        """Kueue's way to stop (and later requeue) a workload: ``spec.active`` of the Workload that
        Kueue made for the trainer Job (found by Kueue's job-uid label). No Kueue, no Workload: no-op."""
        selector = f"{KUEUE_JOB_UID_LABEL}={job['metadata'].get('uid', '')}"
        try:
            workloads = await self.kube.list(*builders.KUEUE_WORKLOAD, run.namespace, selector)
        except ApiError as exc:
            if exc.status == 404:  # Kueue's CRDs are not installed
                return
            raise
        for wl in workloads:
            if ((wl.get("spec") or {}).get("active", True)) != active:
                await self.kube.merge_patch(*builders.KUEUE_WORKLOAD, run.namespace, wl["metadata"]["name"],
                                            {"spec": {"active": active}})

    async def _finish(self, body: dict[str, Any], run: builders.Run, spec: WMRLRunSpec, status: dict[str, Any],
                      phase: str, reason: str, message: str, completion_time: str,
                      job_to_delete: Optional[dict[str, Any]] = None, **fields: Any) -> None:
        """Terminal transition: pools and world model to zero, Job stopped if the deadline passed."""
        if job_to_delete is not None:
            await self.kube.delete("batch/v1", "Job", run.namespace, builders.trainer_name(run),
                                   uid=job_to_delete["metadata"].get("uid"))
        opts = builders.Options(finished=True, operator_image=self.settings.operator_image)
        scaled = [builders.sandbox_deployment(run, spec, opts)]
        if builders.serves_world_model(spec):
            scaled.append(builders.world_model_deployment(run, spec, opts))
        for obj in scaled:
            if await self.kube.get("apps/v1", "Deployment", run.namespace, obj["metadata"]["name"]) is not None:
                await self.kube.merge_patch("apps/v1", "Deployment", run.namespace, obj["metadata"]["name"],
                                            {"spec": {"replicas": 0}})
        patch = st.status_patch(status, phase, reason, message, body["metadata"].get("generation"), st.now_iso(),
                                completionTime=completion_time, **fields)
        await self._transition(body, status, patch, "Warning" if phase == Phase.FAILED.value else "Normal",
                               reason, message)
        self.recommendations.forget((run.namespace, run.name))

    async def _autoscale(self, body: dict[str, Any], spec: WMRLRunSpec, status: dict[str, Any]) -> None:
        run = builders.Run.from_body(body)
        dep = await self.kube.get("apps/v1", "Deployment", run.namespace, builders.sandbox_name(run))
        if dep is None:
            return
        current = int((dep.get("spec") or {}).get("replicas") or 0)
        s = spec.sandbox
        desired = self.recommendations.decide((run.namespace, run.name), demand_of(status), s.slots_per_pod,
                                              s.min_replicas, s.max_replicas, current, time.time(),
                                              s.scale_down_stabilization_seconds,
                                              suspended=spec.suspend or st.is_queued(status))
        dstatus = dep.get("status") or {}
        old = status.get("sandbox") or {}
        new = {"replicas": int(dstatus.get("replicas") or 0), "readyReplicas": int(dstatus.get("readyReplicas") or 0),
               "desiredReplicas": desired, "lastScaleTime": old.get("lastScaleTime")}
        if desired != current:
            await self.kube.merge_patch("apps/v1", "Deployment", run.namespace, builders.sandbox_name(run),
                                        {"spec": {"replicas": desired}})
            new["lastScaleTime"] = st.now_iso()
            log.info("sandbox scaled", extra={"run": run.name, "namespace": run.namespace, "from": current,
                                               "to": desired, "demand": demand_of(status)})
            await self.events(body, "Normal", SANDBOX_SCALED, f"sandbox pool scaled from {current} to {desired} "
                                                         f"(demand {demand_of(status)})")
        new = {k: v for k, v in new.items() if v is not None}
        if old != new:
            await self._patch_status(body, {"sandbox": new})

    # ------------------------------------------------------------ I/O helpers

    async def _get_run(self, namespace: str, name: str) -> Optional[dict[str, Any]]:
        body = await self.kube.get(API_VERSION, KIND, namespace, name)
        if body is None or body["metadata"].get("deletionTimestamp"):
            self.recommendations.forget((namespace, name))
            return None
        return body

    async def _patch_status(self, body: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
        meta = body["metadata"]
        try:
            result = await self.kube.merge_patch(API_VERSION, KIND, meta["namespace"], meta["name"],
                                                 {"status": patch}, subresource="status")
        except ApiError as exc:
            if exc.status == 404:
                return {**(body.get("status") or {}), **patch}
            raise
        return result.get("status") or {}

    async def _transition(self, body: dict[str, Any], status: dict[str, Any], patch: dict[str, Any],
                          event_type: str, reason: str, message: str) -> dict[str, Any]:
        """Write the status if it changes; post an Event and a log line when the phase or reason moves."""
        if not st.changed(status, patch):
            return status
        old_phase = status.get("phase")
        old_reason = (st.get_condition(status, RUNNING_CONDITION) or {}).get("reason")
        new_status = await self._patch_status(body, patch)
        meta = body["metadata"]
        if old_phase != patch.get("phase") or (old_reason != reason and patch.get("phase") != Phase.FAILED.value):
            log.info("phase %s -> %s (%s)", old_phase, patch.get("phase"), reason,
                     extra={"run": meta["name"], "namespace": meta["namespace"], "phase": patch.get("phase"),
                            "reason": reason, "detail": message})
            await self.events(body, event_type, reason, message)
        return new_status

    async def _delete_run(self, body: dict[str, Any]) -> None:
        meta = body["metadata"]
        log.info("ttlSecondsAfterFinished passed: deleting the run", extra={"run": meta["name"], "namespace": meta["namespace"]})
        try:
            await self.kube.request("DELETE", f"/apis/{API_VERSION}/namespaces/{meta['namespace']}/{PLURAL}/{meta['name']}",
                                    {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background",
                                     "preconditions": {"uid": meta.get("uid")}})
        except ApiError as exc:
            if exc.status not in (404, 409):
                raise
        self.forget(meta["namespace"], meta["name"])


def status_reason(status: dict[str, Any], reason: str, message: str) -> tuple[str, str]:
    """Keep a 'Restarting' reason while the replacement Job is being created."""
    running = st.get_condition(status, RUNNING_CONDITION) or {}
    if running.get("reason") == RESTARTING:
        return running["reason"], running.get("message", message)
    return reason, message
