"""Thin kopf handlers: every one of them hands over to ``Reconciler``.

- WMRLRun create/update/resume -> full reconcile (re-apply every child);
- trainer Job events (label :data:`~wmrl.api.vocabulary.RUN_LABEL`) -> status reconcile of the owning run;
- with ``cache_children`` (the default): metadata watches of the other children (``children.py``),
  so a reconcile writes only the children that are missing or differ; a child deleted by hand ->
  full reconcile of its run (made again);
- WMRLRun events keep the set of known runs for the periodic resync loop, which handles
  deadlines, TTL, missed events and the sandbox autoscaler, and refreshes status.calibration.

The resync loop is a plain asyncio task rather than kopf timers: kopf timers put a finalizer on
every run, and a run must stay deletable (children garbage-collected) when the operator is down.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Optional

import aiohttp
import httpx
import kopf
from prometheus_client import Counter, Histogram

from wmrl.api.schema import GROUP, PLURAL, VERSION, field_errors, parse_spec
from wmrl.api.vocabulary import RUN_LABEL
from wmrl_operator import children
from wmrl_operator.kube import Kube
from wmrl_operator.reconcile import Reconciler, Settings

log = logging.getLogger("wmrl.operator")

RECONCILES = Counter("wmrl_operator_reconciles_total", "Reconciliations by trigger and result", ["trigger", "result"])
RECONCILE_SECONDS = Histogram("wmrl_operator_reconcile_seconds", "Time per reconciliation", ["trigger"])


@dataclass
class Config:
    resync_interval: float = 10.0
    calibration_interval: float = 30.0
    settings: Settings = field(default_factory=Settings)
    webhook: bool = False
    cache_children: bool = True  # metadata watches of the children (children.py); see --no-cache-children
    namespaces: tuple[str, ...] = ()  # the operator's namespaces (kopf's); () every namespace
    watch_timeout: int = 300


def _temporary(exc: Exception) -> bool:
    from wmrl_operator.kube import ApiError

    if isinstance(exc, ApiError):
        return exc.status in (409, 429) or exc.status >= 500
    return isinstance(exc, (aiohttp.ClientError, asyncio.TimeoutError, OSError))


async def _run(trigger: str, coro) -> None:
    start = time.perf_counter()
    try:
        await coro
    except Exception as exc:
        RECONCILES.labels(trigger, "error").inc()
        if _temporary(exc):
            raise kopf.TemporaryError(f"{trigger}: {type(exc).__name__}: {exc}", delay=2) from exc
        raise
    else:
        RECONCILES.labels(trigger, "ok").inc()
    finally:
        RECONCILE_SECONDS.labels(trigger).observe(time.perf_counter() - start)


async def _fetch_calibration(url: str, timeout: float) -> Optional[dict[str, Any]]:
    """GET /v1/calibration; None when unreachable (e.g. the operator runs outside the cluster)."""
    try:
        async with httpx.AsyncClient(timeout=timeout) as client:
            resp = await client.get(url)
        if resp.status_code != 200:
            return None
        data = resp.json()
        return data if isinstance(data, dict) else None
    except (httpx.HTTPError, ValueError, OSError):
        return None


def register(registry: kopf.OperatorRegistry, config: Config) -> None:
    """Attach the handlers to ``registry`` (a fresh one per operator, so tests can run several)."""
    known: set[tuple[str, str]] = set()
    state: dict[str, Any] = {}

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> Optional[kopf.ConnectionInfo]:
        """In-cluster service account, else the kubeconfig (KUBECONFIG) — as the Kube client does."""
        return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)

    @kopf.on.startup(registry=registry)
    async def startup(**kwargs: Any) -> None:
        kube = Kube()
        timeout = config.settings.calibration_timeout
        known_children = children.Children()
        reconciler = Reconciler(kube, config.settings, children=known_children,
                                fetch_calibration=lambda url: _fetch_calibration(url, timeout))
        state["kube"], state["reconciler"], state["children"] = kube, reconciler, known_children
        if config.cache_children:
            known_children.start(kube, config.namespaces, on_deleted=child_deleted,
                                 watch_timeout=config.watch_timeout)
        state["loop"] = asyncio.create_task(_resync_loop(reconciler, known, config))

    @kopf.on.cleanup(registry=registry)
    async def cleanup(**_: Any) -> None:
        task = state.pop("loop", None)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        known_children = state.pop("children", None)
        if known_children is not None:
            await known_children.stop()
        reconciler = state.pop("reconciler", None)
        if reconciler is not None:
            await reconciler.events.flush()
        kube = state.pop("kube", None)
        if kube is not None:
            await kube.close()

    @kopf.on.resume(GROUP, VERSION, PLURAL, registry=registry)
    @kopf.on.create(GROUP, VERSION, PLURAL, registry=registry)
    @kopf.on.update(GROUP, VERSION, PLURAL, registry=registry)
    async def run_changed(namespace: str, name: str, **_: Any) -> None:
        known.add((namespace, name))
        await _run("spec", state["reconciler"].reconcile(namespace, name, apply_children=True))

    @kopf.on.event(GROUP, VERSION, PLURAL, registry=registry)
    async def run_event(type: Optional[str], namespace: str, name: str, **_: Any) -> None:
        if type == "DELETED":
            known.discard((namespace, name))
            state["reconciler"].forget(namespace, name)
        else:
            known.add((namespace, name))

    async def child_deleted(namespace: str, run: str) -> None:
        """A child deleted while its run lives is made again (a run being deleted is not reconciled)."""
        if (namespace, run) in known:
            try:
                await _run("child", state["reconciler"].reconcile(namespace, run, apply_children=True))
            except kopf.TemporaryError as exc:  # not retried: the next spec event or restart catches up
                log.warning("child event reconcile failed: %s", exc, extra={"run": run, "namespace": namespace})

    @kopf.on.event("batch", "v1", "jobs", labels={RUN_LABEL: kopf.PRESENT}, registry=registry)
    async def job_event(labels: dict[str, str], namespace: str, **_: Any) -> None:
        run = labels.get(RUN_LABEL)
        if run:
            try:
                await _run("job", state["reconciler"].reconcile(namespace, run, apply_children=False))
            except kopf.TemporaryError as exc:  # event handlers are not retried: the resync loop catches up
                log.warning("job event reconcile failed: %s", exc, extra={"run": run, "namespace": namespace})

    if config.webhook:
        # ignore_failures: failurePolicy Ignore — the reconciler validates again, so an operator that is
        # down (or uninstalled, leaving the configuration behind) never blocks kubectl.
        @kopf.on.validate(GROUP, VERSION, PLURAL, id="validate-spec", ignore_failures=True, registry=registry)
        def validate(spec: Any, **_: Any) -> None:
            """The same pydantic validation as the reconciler, at admission time."""
            try:
                parse_spec(dict(spec))
            except Exception as exc:
                raise kopf.AdmissionError("; ".join(field_errors(exc)), code=422)


async def _resync_loop(reconciler: Reconciler, known: set[tuple[str, str]], config: Config) -> None:
    """Every ``resync_interval``: housekeeping of each known run; calibration every ``calibration_interval``."""
    last_calibration = 0.0
    limit = asyncio.Semaphore(16)

    async def one(key: tuple[str, str], calibration: bool) -> None:
        async with limit:
            try:
                await reconciler.housekeeping(*key, fresh_within=config.resync_interval)
                if calibration:
                    await reconciler.refresh_calibration(*key)
            except Exception as exc:  # keep the loop alive; the next pass retries
                RECONCILES.labels("resync", "error").inc()
                log.warning("resync failed: %s", exc, extra={"namespace": key[0], "run": key[1]})

    while True:
        await asyncio.sleep(config.resync_interval)
        calibration = time.monotonic() - last_calibration >= config.calibration_interval
        if calibration:
            last_calibration = time.monotonic()
        await asyncio.gather(*(one(key, calibration) for key in sorted(known)))
