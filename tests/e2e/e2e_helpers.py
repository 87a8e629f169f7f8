"""Helpers of the end-to-end suite on the real node (tests/e2e)."""

import json
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "wmrl-operator"
RELEASE = "wmrl-e2e"
SYSTEM_NS = "wmrl-e2e-system"
RUNS_NS = "wmrl-e2e"


def wait_for(pred, timeout=120.0, interval=1.0, what="condition"):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = pred()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")


def get_json(cluster, *args, check=True):
    res = cluster.kubectl("get", *args, "-o", "json", check=check)
    return json.loads(res.stdout) if res.returncode == 0 else None


def describe(cluster, namespace, *what):
    """Everything a failing e2e needs to be understood: objects, Events, logs."""
    out = [cluster.kubectl("describe", *what, "-n", namespace, check=False).stdout,
           cluster.kubectl("get", "events", "-n", namespace, "--sort-by=.lastTimestamp", check=False).stdout]
    return "\n".join(out)


def pod_logs(cluster, namespace, selector):
    return cluster.kubectl("logs", "-n", namespace, "-l", selector, "--all-containers", "--tail=60",
                           "--prefix", check=False).stdout


def run_pods(cluster, namespace, run, component):
    pods = get_json(cluster, "pods", "-n", namespace, "-l", f"wmrl.dev/run={run},app.kubernetes.io/component={component}")
    return [p for p in pods["items"] if not p["metadata"].get("deletionTimestamp")]


def ready(pod):
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions", []))


def unique(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def wait_ready_sandbox(cluster, namespace, run, timeout=300):
    """The first Ready sandbox Pod of ``run``; on timeout, fails with the namespace's Pods and the run's logs."""
    def ready_sandbox():
        pods = [p for p in run_pods(cluster, namespace, run, "sandbox") if ready(p)]
        return pods[0] if pods else None

    try:
        return wait_for(ready_sandbox, timeout=timeout, interval=2, what=f"a Ready sandbox Pod of {run}")
    except AssertionError:
        raise AssertionError(describe(cluster, namespace, "pods") + "\n"
                             + pod_logs(cluster, namespace, f"wmrl.dev/run={run}"))
