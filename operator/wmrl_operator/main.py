"""``wmrl operator``: run the kopf operator that reconciles WMRLRuns.

Watches are bounded (server-side timeout, client timeout, connect timeout) so the operator
re-lists after apiserver restarts and silently dropped connections instead of hanging on a
dead stream. kopf keeps its bookkeeping in annotations only (never in ``status``, which belongs
to the operator's own fields and the trainer's ``progress``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from typing import Any

from wmrl.api.vocabulary import FINALIZER, KOPF_ANNOTATION_PREFIX, LAST_HANDLED_CONFIGURATION, WEBHOOK_CONFIGURATION

SKIPPED = {"settings", "k8s_skip"}  # kopf's internal extras
RESERVED = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message and every ``extra`` field."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key in RESERVED or key in SKIPPED or key.startswith("_"):
                continue
            if key == "k8s_ref" and isinstance(value, dict):  # kopf's per-object loggers
                out["object"] = {k: value.get(k) for k in ("kind", "namespace", "name")}
            else:
                out[key] = value if isinstance(value, (str, int, float, bool, type(None))) else str(value)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def configure_logging(fmt: str, verbose: bool) -> None:
    import time

    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        formatter = JsonFormatter()
        formatter.converter = time.gmtime
        handler.setFormatter(formatter)
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    for noisy in ("aiohttp.access", "httpx", "kubernetes"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if not verbose:  # kopf logs every handler success at INFO: one line per watch event
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument("--namespace", "-n", action="append", default=[], metavar="NS",
                       help="watch this namespace, or a kopf namespace pattern (repeatable; env WMRL_NAMESPACES: "
                       "comma-separated names or globs, a !glob excluding from the entry before it)")
    scope.add_argument("--all-namespaces", "-A", action="store_true", help="watch every namespace (the default)")
    parser.add_argument("--standalone", action="store_true", help="no kopf peering (with --leader-elect, the Lease "
                        "keeps replicas apart)")
    parser.add_argument("--leader-elect", action="store_true",
                        help="reconcile only while holding a coordination.k8s.io Lease: several replicas, one active")
    parser.add_argument("--lease-namespace", default=os.environ.get("POD_NAMESPACE") or "wmrl-system",
                        help="namespace of the Lease (default: $POD_NAMESPACE, else wmrl-system)")
    parser.add_argument("--lease-name", default="wmrl-operator", help="name of the Lease")
    parser.add_argument("--health-port", type=int, default=8080, help="liveness endpoint port (/healthz); 0 disables")
    parser.add_argument("--metrics-port", type=int, default=9090, help="Prometheus /metrics port; 0 disables")
    parser.add_argument("--webhook", action="store_true",
                        help="serve a validating admission webhook on :9443 and manage its ValidatingWebhookConfiguration")
    parser.add_argument("--webhook-host", default=os.environ.get("WMRL_WEBHOOK_HOST"),
                        help="DNS name the apiserver uses to reach the webhook (e.g. wmrl-operator.wmrl-system.svc)")
    parser.add_argument("--webhook-port", type=int, default=9443)
    parser.add_argument("--cache-children", action=argparse.BooleanOptionalAction, default=True,
                        help="watch the runs' children (metadata only) to write only those that are missing or "
                             "differ and to remake deleted ones at once (default: on; docs/operator.md)")
    parser.add_argument("--image", default=os.environ.get("WMRL_OPERATOR_IMAGE"),
                        help="image for calibration services (default: env WMRL_OPERATOR_IMAGE, else this "
                             "release's operator image; the chart passes the image it deploys)")
    parser.add_argument("--resync-interval", type=float, default=10.0,
                        help="seconds between level-triggered passes (deadlines, TTL, autoscaler)")
    parser.add_argument("--calibration-interval", type=float, default=30.0,
                        help="seconds between status.calibration refreshes")
    parser.add_argument("--watch-timeout", type=int, default=300,
                        help="server-side watch timeout in seconds (client timeout = this + 30)")
    parser.add_argument("--max-concurrent-reconciles", type=int, default=None, metavar="N",
                        help="runs reconciled at once (default 8); events for one run are queued and coalesced")
    parser.add_argument("--log-format", choices=("json", "text"), default="json")
    parser.add_argument("--verbose", "-v", action="store_true")


def namespace_patterns(text: str) -> list[str]:
    """``WMRL_NAMESPACES`` as kopf namespace patterns: comma-separated names or globs, each one an
    entry to watch; a ``!glob`` excludes from the entry before it (``team-*,!team-test``), or from
    everything when it comes first.

    kopf reads one pattern's comma-separated globs differently: only the first inclusive glob
    includes (``"ns1,ns2"`` matches ns1 alone), and separate patterns are alternatives (so
    ``["*", "!kube-system"]`` excludes nothing). Hence exclusions join the entry they follow and
    names stay apart.
    """
    patterns: list[str] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        if part.startswith("!") and patterns:
            patterns[-1] += "," + part
        else:
            patterns.append(part)
    return patterns


def operator_settings(args: argparse.Namespace) -> Any:
    import kopf

    settings = kopf.OperatorSettings()
    settings.watching.server_timeout = args.watch_timeout
    settings.watching.client_timeout = args.watch_timeout + 30
    settings.watching.connect_timeout = 30
    settings.watching.reconnect_backoff = 1.0
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=KOPF_ANNOTATION_PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=KOPF_ANNOTATION_PREFIX,
                                                                            key=LAST_HANDLED_CONFIGURATION)
    settings.persistence.finalizer = FINALIZER
    # Events: our own transitions are posted explicitly; kopf only posts its warnings/errors.
    settings.posting.level = logging.WARNING
    settings.posting.reporting_component = "wmrl-operator"
    settings.posting.event_name_prefix = "wmrl-"
    settings.networking.request_timeout = 60
    settings.networking.connect_timeout = 30
    settings.execution.max_workers = 8
    if args.webhook:
        from wmrl_operator.webhook import webhook_server

        settings.admission.server = webhook_server(args.webhook_port, args.webhook_host)
        settings.admission.managed = WEBHOOK_CONFIGURATION
    return settings


def _lead(args: argparse.Namespace) -> Any:
    """Wait as a standby until this replica holds the Lease, then keep renewing it; exits the
    process at once if leadership is lost (:mod:`wmrl_operator.leader`)."""
    from kubernetes import client

    from wmrl_operator.kube import load_configuration
    from wmrl_operator.leader import LeaderElector, default_identity, serve_standby_health

    api = client.CoordinationV1Api(client.ApiClient(load_configuration()))
    elector = LeaderElector(api, args.lease_namespace, args.lease_name, default_identity())
    close_health = serve_standby_health(args.health_port) if args.health_port else None
    try:
        elector.acquire()
    finally:
        if close_health is not None:
            close_health()
    elector.keep(on_lost=lambda: os._exit(1))  # never two active replicas: stop now, restart as a standby
    return elector


def main(args: argparse.Namespace) -> int:
    import kopf

    from wmrl_operator.builders import DEFAULT_OPERATOR_IMAGE
    from wmrl_operator.handlers import Config, register
    from wmrl_operator.reconcile import Settings

    configure_logging(args.log_format, args.verbose)
    concurrency = Settings.max_concurrent if args.max_concurrent_reconciles is None else args.max_concurrent_reconciles
    if concurrency < 1:
        print("wmrl operator: --max-concurrent-reconciles must be >= 1", file=sys.stderr)
        return 2
    namespaces = list(args.namespace)
    if not namespaces and not args.all_namespaces and os.environ.get("WMRL_NAMESPACES"):
        namespaces = namespace_patterns(os.environ["WMRL_NAMESPACES"])
    if args.metrics_port:
        from prometheus_client import start_http_server

        start_http_server(args.metrics_port)
    config = Config(resync_interval=args.resync_interval, calibration_interval=args.calibration_interval,
                    settings=Settings(operator_image=args.image or DEFAULT_OPERATOR_IMAGE,
                                      max_concurrent=concurrency), webhook=args.webhook,
                    cache_children=args.cache_children, namespaces=tuple(namespaces),
                    watch_timeout=args.watch_timeout)
    registry = kopf.OperatorRegistry()
    register(registry, config)
    logging.getLogger("wmrl.operator").info(
        "starting", extra={"namespaces": ",".join(namespaces) or "*", "webhook": args.webhook})
    elector = _lead(args) if args.leader_elect else None
    try:
        kopf.run(
            registry=registry,
            settings=operator_settings(args),
            standalone=args.standalone,
            clusterwide=not namespaces,
            namespaces=namespaces,
            liveness_endpoint=f"http://0.0.0.0:{args.health_port}/healthz" if args.health_port else None,
        )
    finally:
        if elector is not None:
            elector.release()
    return 0
