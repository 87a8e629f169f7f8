"""Level-triggered reconciliation of one WMRLRun: read the run and its trainer Job, converge.

Every entry point (kopf create/update/resume, trainer Job events, timers) ends here, under a
per-run lock, and always starts from a fresh GET of the run, so a stale event body can never
double-count a restart. A reconcile reads, asks :mod:`decide` what to do, and writes: the status
here, the children through :class:`writer.ChildWriter`.
"""

from __future__ import annotations

import asyncio
import dataclasses
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
from wmrl.api.vocabulary import KUEUE_JOB_UID_LABEL, RUNNING_CONDITION, SANDBOX_READY_CONDITION, SANDBOX_SCALED
from wmrl_operator import builders, decide, status as st
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
        """Read the run's trainer Job and references, decide (:mod:`decide`), write; each step decides
        from what the previous step's writes returned. ``apply_children``: a spec event's reconcile."""
        run = builders.Run.from_body(body)
        status = body.get("status") or {}
        now = dt.datetime.now(dt.timezone.utc)
        try:
            spec = parse_spec(body.get("spec") or {})
        except ValidationError as exc:
            await self._transition(body, status, decide.invalid_spec(field_errors(exc)), now)
            return
        if st.is_finished(status):
            return

        missing, job, conflicts = await self._read(run, spec, apply_children)
        wait = decide.waiting(missing, conflicts, job_exists=job is not None)
        if wait is not None:
            await self._transition(body, status, wait, now)
            return
        js = st.job_state(job)
        started, restarts = status.get("startTime"), int(status.get("restarts") or 0)
        verdict = decide.trainer(spec, status, js, now)
        if isinstance(verdict, decide.Finish):
            await self._finish(body, run, spec, status, verdict.transition, job if verdict.delete_job else None)
            return
        if isinstance(verdict, decide.Restart):
            if verdict.transition is not None:
                status = await self._transition(body, status, verdict.transition, now)
            await self.kube.delete("batch/v1", "Job", run.namespace, builders.trainer_name(run), uid=js.uid)
            job, js, restarts = None, st.JobState("absent"), verdict.restarts

        admission = builders.admission_labels(body["metadata"].get("labels"))
        queue = builders.queue_name(admission)
        plan = decide.children(spec, status, js, queue, apply_children=apply_children,
                               generation=body["metadata"].get("generation"), conflicts=conflicts,
                               started=started, now=now)
        if plan.write:
            await self.writer.write_children(run, spec, plan.start_time, now, job_exists=job is not None,
                                             skip_calibration=plan.skip_calibration, may_prune=plan.may_prune,
                                             admission=admission, awaiting_admission=plan.awaiting_admission)
        hold = decide.suspension(spec, status, job, queue)
        if hold is not None and hold.through_workload:
            await self._set_workload_active(run, job, active=not hold.suspend)
        elif hold is not None:
            job = await self.kube.merge_patch("batch/v1", "Job", run.namespace, builders.trainer_name(run),
                                              {"spec": {"suspend": hold.suspend}})
            js = st.job_state(job)
        await self._transition(body, status, decide.report(spec, status, js, queue, missing, conflicts, restarts,
                                                       plan.start_time), now)

    async def _read(self, run: builders.Run, spec: WMRLRunSpec,
                    apply_children: bool) -> tuple[list[str], Optional[dict[str, Any]], list[str]]:
        """The objects the spec names that are missing, the trainer Job, and the calibration objects
        this run would take over: looked for on a spec reconcile, else only while the Job is absent.
        The reads are independent: one round trip's time, not four."""
        reads = [self._missing_references(run, spec),
                 self.kube.get("batch/v1", "Job", run.namespace, builders.trainer_name(run))]
        if apply_children:
            reads.append(self._ownership_conflicts(run, spec))
        missing, job, *checked = await asyncio.gather(*reads)
        if checked:
            return missing, job, checked[0]
        return missing, job, await self._ownership_conflicts(run, spec) if job is None else []

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
                      transition: decide.Transition, job_to_delete: Optional[dict[str, Any]] = None) -> None:
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
        await self._transition(body, status, transition, dt.datetime.now(dt.timezone.utc))
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
        patch: dict[str, Any] = {"sandbox": new} if old != new else {}
        readiness = await self._sandbox_readiness(run, spec, dep)
        was = st.get_condition(status, SANDBOX_READY_CONDITION) or {}
        if (was.get("status"), was.get("reason"), was.get("message")) != (readiness.status, readiness.reason,
                                                                         readiness.message):
            patch["conditions"] = st.set_condition(status.get("conditions") or [], SANDBOX_READY_CONDITION,
                                                   readiness.status, readiness.reason, readiness.message,
                                                   body["metadata"].get("generation"), st.now_iso())
        if patch:
            await self._patch_status(body, patch)
        if readiness.failing and was.get("reason") != readiness.reason:
            log.warning("sandbox not ready: %s", readiness.message,
                        extra={"run": run.name, "namespace": run.namespace, "reason": readiness.reason})
            await self.events(body, "Warning", readiness.reason, readiness.message)

    async def _sandbox_readiness(self, run: builders.Run, spec: WMRLRunSpec,
                                 dep: dict[str, Any]) -> decide.SandboxReadiness:
        """Read what :func:`decide.sandbox_readiness` needs: the Deployment's figures, and only while no
        Pod is ready, the pool's Pods and the kubelet's sandbox-creation Events of those stuck creating."""
        replicas = int((dep.get("spec") or {}).get("replicas") or 0)
        ready = int((dep.get("status") or {}).get("readyReplicas") or 0)
        pods: list[st.PodState] = []
        if ready == 0 and replicas > 0:
            selector = ",".join(f"{k}={v}" for k, v in builders.labels(run, "sandbox").items())
            pods = [st.pod_state(p) for p in await self.kube.list("v1", "Pod", run.namespace, selector)]
            if any(p.creating for p in pods):
                events = await self.kube.list("v1", "Event", run.namespace,
                                              field_selector="involvedObject.kind=Pod,reason=FailedCreatePodSandBox")
                latest: dict[str, tuple[str, str]] = {}
                for e in events:
                    name, when = e["involvedObject"].get("name", ""), e.get("lastTimestamp") or e.get("eventTime") or ""
                    if when >= latest.get(name, ("", ""))[0]:
                        latest[name] = (when, e.get("message", ""))
                pods = [dataclasses.replace(p, sandbox_error=latest[p.name][1]) if p.creating and p.name in latest
                        else p for p in pods]
        return decide.sandbox_readiness(spec.sandbox.isolation, replicas, ready, st.replica_failure(dep), pods)

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

    async def _transition(self, body: dict[str, Any], status: dict[str, Any], transition: decide.Transition,
                          now: dt.datetime) -> dict[str, Any]:
        """Write the decided status if it changes; post an Event and a log line when the phase or
        reason moves (:class:`decide.Transition`). The run's status after it."""
        t = transition
        patch = st.status_patch(status, t.phase, t.reason, t.message, body["metadata"].get("generation"),
                                st.now_iso(now), **t.fields)
        if not st.changed(status, patch):
            return status
        old_phase = status.get("phase")
        old_reason = (st.get_condition(status, RUNNING_CONDITION) or {}).get("reason")
        new_status = await self._patch_status(body, patch)
        meta, reason = body["metadata"], t.event_reason
        if old_phase != t.phase or (old_reason != reason and t.phase != Phase.FAILED.value):
            log.info("phase %s -> %s (%s)", old_phase, t.phase, reason,
                     extra={"run": meta["name"], "namespace": meta["namespace"], "phase": t.phase,
                            "reason": reason, "detail": t.message})
            await self.events(body, t.event_type, reason, t.message)
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

