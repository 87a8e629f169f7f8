"""Kubernetes Events about a WMRLRun, written by the operator's own client.

kopf's ``kopf.event`` only works inside kopf's per-object handler tasks; called from the resync
loop (deadlines, TTL, autoscaling, missed watch events) it has no queue and the Event is lost.
So every transition posts its Event here, whichever path noticed it.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
from typing import Any

from wmrl_operator.kube import Kube

log = logging.getLogger("wmrl.operator")

COMPONENT = "wmrl-operator"
MESSAGE_LIMIT = 1024  # the apiserver rejects longer event messages


def event_for(body: dict[str, Any], type_: str, reason: str, message: str, now: dt.datetime,
              instance: str = "") -> dict[str, Any]:
    """A core/v1 Event about the object ``body`` (as ``kubectl describe`` shows them)."""
    meta = body["metadata"]
    stamp = now.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
        "involvedObject": {"apiVersion": body["apiVersion"], "kind": body["kind"], "name": meta["name"],
                           "namespace": meta["namespace"], "uid": meta.get("uid"),
                           "resourceVersion": meta.get("resourceVersion")},
        "type": type_,
        "reason": reason,
        "message": message[:MESSAGE_LIMIT],
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "reportingInstance": instance,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


class EventRecorder:
    """Posts Events through the operator's client; best-effort, a failure is logged, never raised.

    Calling it schedules the POST and returns at once: a reconcile never waits on an Event.
    ``flush`` waits for the ones in flight (at shutdown, and in tests).
    """

    def __init__(self, kube: Kube, instance: str = os.environ.get("HOSTNAME", "")):
        self.kube = kube
        self.instance = instance
        self._in_flight: set[asyncio.Task] = set()

    async def __call__(self, body: dict[str, Any], type_: str, reason: str, message: str) -> None:
        event = event_for(body, type_, reason, message, dt.datetime.now(dt.timezone.utc), self.instance)
        task = asyncio.get_running_loop().create_task(self._post(body, event, reason))
        self._in_flight.add(task)
        task.add_done_callback(self._in_flight.discard)

    async def flush(self) -> None:
        while self._in_flight:
            await asyncio.gather(*list(self._in_flight), return_exceptions=True)

    async def _post(self, body: dict[str, Any], event: dict[str, Any], reason: str) -> None:
        try:
            await self.kube.create(event)
        except Exception as exc:  # noqa: BLE001 - an Event must never fail a reconcile
            log.warning("event %s not posted: %s", reason, exc,
                        extra={"run": body["metadata"]["name"], "namespace": body["metadata"]["namespace"]})
