"""Writing a run's children: POST what is known absent, apply what differs, skip what already is.

One :class:`ChildWriter` per operator, beside :class:`children.Children` (what the operator knows
of its children). Children have fixed names and are written with server-side apply, so re-running
a write (say, after the operator was SIGKILLed half-way) converges to the same objects and never
duplicates them. A child the cache knows to be absent is created with a POST, which costs the
apiserver about half what an apply does (measured: docs/operator.md); the first apply over a
POSTed child adopts the POST's managed fields, so a field a later manifest leaves out is removed
as an apply alone would. The trainer Job is only ever POSTed (Kueue and suspend are patches), the
calibration's token Secret only created, and the children a changed spec no longer wants pruned.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import secrets
from typing import Any, Optional

from prometheus_client import Counter

from wmrl.api.schema import WMRLRunSpec
from wmrl.api.vocabulary import RUN_LABEL
from wmrl_operator import builders, status as st
from wmrl_operator.children import Children
from wmrl_operator.kube import FIELD_MANAGER, ApiError, Kube, adopted_managed_fields

log = logging.getLogger("wmrl.operator")

CHILD_WRITES = Counter("wmrl_operator_child_writes_total",
                       "Children created (known absent), applied, or skipped because the live object already is the wanted one",
                       ["kind", "result"])
ADOPT_ATTEMPTS = 5


class ChildWriter:
    """Writes the children of runs through ``kube``, skipping those ``children`` knows are current."""

    def __init__(self, kube: Kube, children: Children, operator_image: str):
        self.kube = kube
        self.children = children
        self.operator_image = operator_image
        self._tokens: set[tuple[str, str]] = set()  # runs' own token Secrets known to exist (namespace, name)

    async def write_children(self, run: builders.Run, spec: WMRLRunSpec, start_time: Optional[str],
                             now: dt.datetime, job_exists: bool, skip_calibration: bool = False,
                             may_prune: bool = True, admission: tuple[tuple[str, str], ...] = (),
                             awaiting_admission: bool = False) -> None:
        """Write every child ``spec`` wants, the trainer Job last and only when not ``job_exists``.

        ``start_time`` and ``now`` give the Job what is left of the run's deadline; ``admission``
        (the run's Kueue labels) and ``awaiting_admission`` hold its pools at zero until Kueue admits
        it; ``skip_calibration`` leaves the calibration's objects alone (they would take over
        another's); ``may_prune``: delete the ones the spec no longer wants (only a changed spec can
        make one unwanted, so a run at generation 1 skips the two LISTs).
        """
        calibration = builders.needs_calibration(spec) and not skip_calibration
        await self.children.ready()  # the caches' first listing (bounded): a restart resumes without rewriting
        state_uid = None
        if calibration and builders.calibration_shared(spec):
            # A shared calibration's state ConfigMap owns the rest of it: it comes first, for its uid.
            state = next(o for o in builders.calibration_objects(run, spec) if o["kind"] == "ConfigMap")
            state_uid = (await self.write(state))["metadata"]["uid"]
        reads = [self.kube.get("apps/v1", "Deployment", run.namespace, builders.sandbox_name(run))]
        if calibration:
            reads.append(self._ensure_calibration_token(run, spec, state_uid))  # before the Pods that read it
        sandbox, *_ = await asyncio.gather(*reads)
        current = ((sandbox or {}).get("spec") or {}).get("replicas")
        opts = builders.Options(
            calibration_state_uid=state_uid,
            suspended=spec.suspend,
            sandbox_replicas=current,
            job_deadline_seconds=st.remaining_deadline(start_time, spec.active_deadline_seconds, now),
            operator_image=self.operator_image,
            admission=admission,
            awaiting_admission=awaiting_admission,
        )
        objs = builders.children(run, spec, opts)
        if skip_calibration:
            names = {(o["kind"], o["metadata"]["name"]) for o in builders.calibration_objects(run, spec, opts)}
            objs = [o for o in objs if (o["kind"], o["metadata"]["name"]) not in names]
        job = [o for o in objs if o["kind"] == "Job"]
        applied = {("ConfigMap", builders.calibration_state_name(run, spec))} if state_uid else set()
        others = [o for o in objs if o["kind"] != "Job" and (o["kind"], o["metadata"]["name"]) not in applied]
        # Independent objects in parallel; the Job last, once its SA, config and Services exist.
        await asyncio.gather(*(self.write(o) for o in others))
        if may_prune:
            await self._prune(run, objs)
        if not job_exists:
            try:  # known absent: created (the Job is never applied over; Kueue and suspend are patches)
                await self.kube.create(builders.stamped(job[0]), FIELD_MANAGER)
            except ApiError as exc:
                if exc.status != 409:  # the old incarnation still terminating: the next event retries
                    raise

    async def write(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Write ``obj`` unless the live child already is it (``children.Children``): the object's
        metadata (at least its uid) either way.

        A child known to be absent is created with a POST, which costs the apiserver about half
        what a server-side apply does (measured: docs/operator.md); anything else is applied, and
        the first apply over a POSTed child takes the POST's fields over (:func:`adopted_managed_fields`)
        so that a field the new manifest leaves out is removed, as an apply alone would.
        """
        obj = builders.stamped(obj)
        live = self.children.unchanged(obj)
        if live is not None:
            CHILD_WRITES.labels(obj["kind"], "skipped").inc()
            return {"metadata": {**obj["metadata"], "uid": live.uid}}
        if self.children.absent(obj):
            try:
                response = await self.kube.create(obj, FIELD_MANAGER)
            except ApiError as exc:
                if exc.status != 409:  # 409: made meanwhile (the watch lags): apply over it
                    raise
            else:
                self.children.written(obj, response)
                CHILD_WRITES.labels(obj["kind"], "created").inc()
                return response
        response = await self._adopt_posted_fields(obj, await self.kube.apply(obj))
        self.children.written(obj, response)
        CHILD_WRITES.labels(obj["kind"], "applied").inc()
        return response

    async def _adopt_posted_fields(self, obj: dict[str, Any], response: dict[str, Any]) -> dict[str, Any]:
        """After an apply over a child first created by POST: move the POST's fields into the
        operator's Apply entry (:func:`adopted_managed_fields`) and apply again, which then removes
        the fields ``obj`` leaves out. Once per child at most; ``response`` when there is nothing to move.

        The managed fields are replaced only at the version they were read at: a controller's
        status write in between (a Deployment's, right after its spec changes) means read again.
        """
        api_version, kind, namespace, name = obj["apiVersion"], obj["kind"], obj["metadata"]["namespace"], obj["metadata"]["name"]
        for _ in range(ADOPT_ATTEMPTS):
            meta = response["metadata"]
            adopted = adopted_managed_fields(meta.get("managedFields") or [])
            if adopted is None:
                return response
            try:
                await self.kube.json_patch(api_version, kind, namespace, name, [
                    {"op": "test", "path": "/metadata/resourceVersion", "value": meta["resourceVersion"]},
                    {"op": "replace", "path": "/metadata/managedFields", "value": adopted}])
            except ApiError as exc:
                if exc.status not in (409, 422):  # 422: the test failed, it changed meanwhile
                    raise
                response = await self.kube.get(api_version, kind, namespace, name) or response
                continue
            return await self.kube.apply(obj)
        raise RuntimeError(f"{kind} {namespace}/{name} kept changing while its managed fields were adopted")

    async def _ensure_calibration_token(self, run: builders.Run, spec: WMRLRunSpec,
                                        state_uid: Optional[str] = None) -> None:
        """Create the calibration's token Secret unless it exists; never rewrite one (trainers hold it).

        Create-only on purpose: the operator may create Secrets but not read them, so "exists" is
        the apiserver's 409. A run's own token (named after the run's uid, deleted with the run) is
        remembered once made; a shared one is asked for at every reconcile, since whoever deletes it
        expects the next reconcile to make it again.
        """
        name = builders.calibration_token_name(run, spec)
        key = (run.namespace, name)
        if key in self._tokens:
            return
        try:
            await self.kube.create(builders.calibration_token_secret(run, spec, secrets.token_urlsafe(32), state_uid))
        except ApiError as exc:
            if exc.status != 409:  # 409: another run sharing it (or an earlier operator) made it; it stands
                raise
        if not builders.calibration_shared(spec) and run.uid:
            self._tokens.add(key)

    async def _prune(self, run: builders.Run, desired: list[dict[str, Any]]) -> None:
        """Delete the children a spec change made unwanted (no GPU stays allocated to an old vLLM)."""
        selector = f"{RUN_LABEL}={run.name}"
        for api_version, kind in builders.PRUNABLE:
            existing = [{**o, "kind": kind} for o in await self.kube.list(api_version, kind, run.namespace, selector)]
            for obj in builders.unwanted(run, desired, existing):
                name = obj["metadata"]["name"]
                if await self.kube.delete(api_version, kind, run.namespace, name, uid=obj["metadata"].get("uid")):
                    log.info("pruned %s %s: no longer wanted by the spec", kind, name,
                             extra={"namespace": run.namespace, "run": run.name})
