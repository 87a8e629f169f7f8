"""``wmrl bench operator``: N WMRLRuns on a real control plane; prints JSON (reported, not asserted).

Measures, with the operator as a separate process (``wmrl operator --standalone``):

- per run, create -> every child present (p50, p95, max), children observed through watches,
  in two phases: **steady** (``--steady`` runs created one at a time, each once the previous
  one has all its children: the operator's response time on an otherwise idle cluster) and
  **burst** (``--runs`` runs created back to back: latency under load, where runs queue behind
  each other and the control plane's own work on the same cores);
- the time from the first create of the burst until its last run has all its children;
- the operator's peak resident memory (``VmHWM`` from ``/proc/<pid>/status``).

The goals are checked against the burst, as the issue states them; the steady figures show
how much of the burst latency is queueing.

``--direct`` measures the floor instead: no operator; the benchmark itself POSTs each run's
children (the very objects the operator makes, its token Secret too) the moment the run exists,
all at once, the Job last. No operator can make them sooner on the same control plane, so the
difference between the two is what the operator adds, and what is left is the control plane's.

Uses ``KUBECONFIG`` when set, else starts the local control plane of ``tests/cluster``.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Optional

from wmrl.api.schema import API_VERSION, GROUP, KIND, PLURAL, VERSION, parse_spec
from wmrl.api.vocabulary import MANAGED_BY_SELECTOR

GOALS = {"p50_s": 1.0, "p95_s": 3.0, "total_s": 60.0, "operator_peak_rss_mb": 250.0}
LARGE_BURST = 1000
LARGE_BURST_GOALS = {"total_s": 180.0, "operator_peak_rss_mb": 400.0}  # all children in 3 minutes


def goals_for(runs: int) -> dict[str, float]:
    """The issue's goals for a burst of ``runs``: latency for 100, completion and memory for 1000."""
    return dict(LARGE_BURST_GOALS) if runs >= LARGE_BURST else dict(GOALS)


def completion_curve(created_at: float, done: list[float], points: int = 10) -> list[dict[str, float]]:
    """Seconds from the burst's first create until each tenth (``points``) of its runs had all children."""
    ordered = sorted(done)
    marks = sorted({max(1, round(len(ordered) * k / points)) for k in range(1, points + 1)}) if ordered else []
    return [{"completed": m, "s": round(ordered[m - 1] - created_at, 3)} for m in marks]
WATCHED = (  # every kind of child: (apiVersion, kind)
    ("v1", "ConfigMap"), ("v1", "ServiceAccount"), ("v1", "Service"),
    ("rbac.authorization.k8s.io/v1", "Role"), ("rbac.authorization.k8s.io/v1", "RoleBinding"),
    ("apps/v1", "Deployment"), ("batch/v1", "Job"), ("networking.k8s.io/v1", "NetworkPolicy"),
)


def plot_burst(created_s: list[float], done_s: list[float], path: str, goal_s: Optional[float] = None) -> None:
    """Runs created and runs with all their children, against seconds since the burst's first create."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for values, label in ((created_s, "created"), (done_s, "all children present")):
        ordered = sorted(values)
        ax.step(ordered, range(1, len(ordered) + 1), where="post", label=label)
    if goal_s is not None:
        ax.axvline(goal_s, color="grey", linestyle="--", label=f"goal: all within {goal_s:g} s")
    ax.set_xlabel("seconds since the first create")
    ax.set_ylabel("WMRLRuns")
    ax.set_title(f"burst of {len(created_s)} WMRLRuns")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", metavar="PATH", help="also write the result JSON to PATH")
    parser.add_argument("--runs", type=int, default=100, help="runs created back to back (the burst)")
    parser.add_argument("--steady", type=int, default=10,
                        help="runs created one at a time before the burst (0 to skip)")
    parser.add_argument("--timeout", type=float, default=300.0, help="give up after this many seconds")
    parser.add_argument("--keep", action="store_true", help="keep the benchmark namespace")
    parser.add_argument("--plot", metavar="PATH", help="also plot runs created and runs complete against time (PNG)")
    parser.add_argument("--cache-children", action=argparse.BooleanOptionalAction, default=True,
                        help="passed to the operator (default: on, as the operator's)")
    parser.add_argument("--restart", action="store_true",
                        help="then stop the operator, start a new one and measure how it resumes every run")
    parser.add_argument("--max-concurrent-reconciles", type=int, default=None, metavar="N",
                        help="passed to the operator (default: the operator's)")
    parser.add_argument("--direct", action="store_true",
                        help="no operator: the benchmark writes each run's children itself as it creates the run "
                             "(the control plane's floor for the same objects)")


def _repo_cluster_module():
    path = Path(__file__).resolve().parents[2] / "tests" / "cluster" / "cluster.py"
    if not path.is_file():
        return None
    if "wmrl_cluster" in sys.modules:
        return sys.modules["wmrl_cluster"]
    spec = importlib.util.spec_from_file_location("wmrl_cluster", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["wmrl_cluster"] = module  # dataclasses look their module up while executing it
    spec.loader.exec_module(module)
    return module


def _kubeconfig_and_kubectl() -> tuple[str, str, Optional[Any]]:
    cluster_mod = _repo_cluster_module()
    kubectl = shutil.which("kubectl")
    if cluster_mod is not None and cluster_mod.binary("kubectl").is_file():
        kubectl = str(cluster_mod.binary("kubectl"))
    if os.environ.get("KUBECONFIG"):
        if not kubectl:
            raise SystemExit("wmrl bench operator: kubectl not found")
        return os.environ["KUBECONFIG"], kubectl, None
    if cluster_mod is None:
        raise SystemExit("wmrl bench operator: set KUBECONFIG (tests/cluster not found to start a control plane)")
    cluster = cluster_mod.up()
    return str(cluster.kubeconfig), str(cluster_mod.binary("kubectl")), cluster


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _peak_rss_mb(pid: int) -> dict[str, float]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmHWM", "VmRSS"):
            out[key] = int(value.split()[0]) / 1024.0
    return out


def _latency_summary(latencies: list[float]) -> dict[str, Optional[float]]:
    if not latencies:
        return {"p50": None, "p95": None, "max": None, "mean": None}
    return {"p50": round(statistics.median(latencies), 3), "p95": round(_percentile(latencies, 0.95), 3),
            "max": round(max(latencies), 3), "mean": round(statistics.fmean(latencies), 3)}


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    idx = min(len(ordered) - 1, max(0, int(round(q * (len(ordered) - 1)))))
    return ordered[idx]


class ChildWatcher:
    """Watches every child kind in one namespace; records when each (kind, name) first appeared.

    Metadata-only watches on one event loop in one thread (the operator's own client): the
    instrument must not take the CPU that the operator and the control plane it measures need
    (typed watches of whole objects cost this process about as much CPU as the operator itself).
    """

    def __init__(self, cfg: Any, namespace: str):
        self.cfg, self.ns = cfg, namespace
        self.seen: dict[tuple[str, str], float] = {}
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.watching = threading.Event()  # set once every watch is open
        self.loop: Optional[asyncio.AbstractEventLoop] = None
        self.kube: Any = None  # the watches' client, also used to write children in --direct
        self.thread = threading.Thread(target=lambda: asyncio.run(self._watch_all()), daemon=True)

    def start(self) -> None:
        self.thread.start()
        self.watching.wait(30)

    async def _watch_all(self) -> None:
        from wmrl_operator.kube import Kube

        kube = self.kube = Kube(self.cfg)
        self.loop = asyncio.get_running_loop()
        opened = [0]
        try:
            await asyncio.gather(*(self._watch(kube, api_version, kind, opened) for api_version, kind in WATCHED))
        finally:
            await kube.close()

    async def _watch(self, kube: Any, api_version: str, kind: str, opened: list[int]) -> None:
        listing = await kube.list_metadata(api_version, kind, self.ns, label_selector=MANAGED_BY_SELECTOR)
        version = listing["metadata"]["resourceVersion"]
        opened[0] += 1
        if opened[0] == len(WATCHED):
            self.watching.set()
        while not self.stop.is_set():
            try:
                async for event in kube.watch_metadata(api_version, kind, self.ns, MANAGED_BY_SELECTOR, version, timeout_s=30):
                    obj = event["object"]
                    version = obj["metadata"].get("resourceVersion") or version
                    if event["type"] in ("ADDED", "MODIFIED"):
                        with self.lock:
                            self.seen.setdefault((kind, obj["metadata"]["name"]), time.time())
                    if self.stop.is_set():
                        return
            except Exception:  # noqa: BLE001 - reconnect from the last version seen
                await asyncio.sleep(0.1)


async def write_children(kube: Any, objs: list[dict[str, Any]]) -> None:
    """What ``--direct`` does for each run: POST its children at once, then its Job."""
    await asyncio.gather(*(kube.create(o, "wmrl-bench") for o in objs if o["kind"] != "Job"))
    await asyncio.gather(*(kube.create(o, "wmrl-bench") for o in objs if o["kind"] == "Job"))


def _wait_healthy(port: int, timeout: float = 60.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.1)


def _operator_metrics(port: int) -> dict[str, float]:
    """The resumption figures from an operator's /metrics: spec reconciles done, children created,
    applied, skipped."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    out = {"spec_reconciles": 0.0, "created": 0.0, "applied": 0.0, "skipped": 0.0}
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "wmrl_operator_reconciles_total" and sample.labels.get("trigger") == "spec" \
                    and sample.labels.get("result") == "ok":
                out["spec_reconciles"] += sample.value
            elif sample.name == "wmrl_operator_child_writes_total":
                out[sample.labels["result"]] = out.get(sample.labels["result"], 0.0) + sample.value
    return out


def measure_restart(command: list[str], env: dict[str, str], runs: int, timeout: float) -> dict[str, Any]:
    """Start an operator over ``runs`` existing runs: seconds until it has resumed them all (a spec
    reconcile each), and how many children it wrote or found already as wanted meanwhile."""
    health, metrics = _free_port(), _free_port()
    log = tempfile.NamedTemporaryFile(prefix="wmrl-bench-operator-restart-", suffix=".log", delete=False)
    started = time.monotonic()
    op = subprocess.Popen([*command, "--health-port", str(health), "--metrics-port", str(metrics)],
                          env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait_healthy(health)
        figures: dict[str, float] = {}
        while time.monotonic() - started < timeout:
            try:
                figures = _operator_metrics(metrics)
            except Exception:  # noqa: BLE001 - not serving yet
                figures = {}
            if figures.get("spec_reconciles", 0) >= runs:
                break
            time.sleep(0.1)
        elapsed = time.monotonic() - started
        return {"runs": runs, "resumed": int(figures.get("spec_reconciles", 0)), "resume_s": round(elapsed, 3),
                "children_written": int(figures.get("created", 0) + figures.get("applied", 0)), "children_skipped": int(figures.get("skipped", 0)),
                "operator_peak_rss_mb": round(_peak_rss_mb(op.pid).get("VmHWM", float("nan")), 1)}
    finally:
        op.terminate()
        try:
            op.wait(15)
        except subprocess.TimeoutExpired:
            op.kill()


def main(args: argparse.Namespace) -> int:
    from kubernetes import client as k8s_client
    from kubernetes import config as k8s_config

    from wmrl.api.crd import CRD_NAME, crd_yaml
    from wmrl_operator import builders

    kubeconfig, kubectl, started_cluster = _kubeconfig_and_kubectl()
    env = {**os.environ, "KUBECONFIG": kubeconfig}

    def kc(*a: str, input: Optional[str] = None) -> None:
        subprocess.run([kubectl, *a], input=input, text=True, env=env, check=True, capture_output=True)

    kc("apply", "-f", "-", input=crd_yaml())
    kc("wait", "--for", "condition=established", f"crd/{CRD_NAME}", "--timeout=60s")
    ns = f"bench-{uuid.uuid4().hex[:6]}"
    kc("create", "namespace", ns)

    cfg = k8s_client.Configuration()
    k8s_config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    api_client = k8s_client.ApiClient(cfg)
    custom = k8s_client.CustomObjectsApi(api_client)
    spec = {"policy": {"model": "builtin:tiny-coder", "rolloutEngine": "transformers"},
            "tasks": {"builtin": "mini-ml"}, "trainer": {"gpusPerNode": 0}}
    names = [f"b{i:03d}" for i in range(args.runs)]
    steady_names = [f"s{i:03d}" for i in range(args.steady)]
    parsed = parse_spec(spec)
    expected = {n: {(o["kind"], o["metadata"]["name"])
                    for o in builders.children(builders.Run(n, ns, "x"), parsed)}
                for n in steady_names + names}

    if args.direct and args.restart:
        raise SystemExit("wmrl bench operator: --restart measures an operator; --direct runs none")
    health = _free_port()
    log = tempfile.NamedTemporaryFile(prefix="wmrl-bench-operator-", suffix=".log", delete=False)
    command = [sys.executable, "-m", "wmrl.cli", "operator", "--standalone", "--namespace", ns,
               "--resync-interval", "10",
               "--cache-children" if args.cache_children else "--no-cache-children",
               *([] if args.max_concurrent_reconciles is None
                 else ["--max-concurrent-reconciles", str(args.max_concurrent_reconciles)])]
    op = None if args.direct else subprocess.Popen([*command, "--health-port", str(health), "--metrics-port", "0"],
                                                   env=env, stdout=log, stderr=subprocess.STDOUT)
    result: dict[str, Any] = {}
    writes: list[Any] = []  # --direct: each run's children being written
    try:
        if op is not None:
            _wait_healthy(health)
        baseline = _peak_rss_mb(op.pid) if op is not None else {}
        watcher = ChildWatcher(cfg, ns)
        watcher.start()

        def create(name: str) -> float:
            body = {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": name}, "spec": spec}
            made = custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, body)
            at = time.time()
            if args.direct:
                run = builders.Run(name, ns, made["metadata"]["uid"])
                objs = [builders.stamped(o) for o in builders.children(run, parsed)]
                objs.insert(0, builders.calibration_token_secret(run, parsed, uuid.uuid4().hex))
                writes.append(asyncio.run_coroutine_threadsafe(write_children(watcher.kube, objs), watcher.loop))
            return at

        def wait_for(pending: list[str], done: dict[str, float], give_up: float) -> None:
            while any(n not in done for n in pending) and time.monotonic() < give_up:
                with watcher.lock:
                    seen = dict(watcher.seen)
                for name in pending:
                    if name not in done and all(k in seen for k in expected[name]):
                        done[name] = max(seen[k] for k in expected[name])
                time.sleep(0.01)

        give_up = time.monotonic() + args.timeout
        steady_created: dict[str, float] = {}
        steady_done: dict[str, float] = {}
        for name in steady_names:
            steady_created[name] = create(name)
            wait_for([name], steady_done, give_up)
        created = {name: create(name) for name in names}
        done: dict[str, float] = {}
        wait_for(names, done, give_up)
        watcher.stop.set()
        for write in writes:
            write.result()  # a refused write is an error of the benchmark, not a slow run
        latencies = [done[n] - created[n] for n in names if n in done]
        rss = _peak_rss_mb(op.pid) if op is not None else {}
        result = {
            "benchmark": "operator",
            "writer": "direct (no operator)" if args.direct else "operator",
            "namespace": ns,
            "runs": len(names),
            "children_per_run": len(next(iter(expected.values()))),
            "completed": len(done),
            "create_to_children_s": _latency_summary(latencies),
            "total_s": round(max(done.values()) - min(created.values()), 3) if done else None,
            "create_loop_s": round(max(created.values()) - min(created.values()), 3),
            "steady": {"runs": len(steady_names), "completed": len(steady_done),
                       "create_to_children_s": _latency_summary(
                           [steady_done[n] - steady_created[n] for n in steady_names if n in steady_done])},
            "operator_peak_rss_mb": round(rss["VmHWM"], 1) if rss else None,
            "operator_idle_rss_mb": round(baseline["VmRSS"], 1) if baseline else None,
            "completion_curve": completion_curve(min(created.values()), list(done.values())) if created else [],
            "max_concurrent_reconciles": args.max_concurrent_reconciles,
            "cache_children": args.cache_children,
            "goals": goals_for(len(names)),
        }
        p = result["create_to_children_s"]
        measured = {"p50_s": p["p50"], "p95_s": p["p95"], "total_s": result["total_s"],
                    "operator_peak_rss_mb": result["operator_peak_rss_mb"]}
        result["goals_met"] = {k: measured[k] is not None and measured[k] < goal
                               for k, goal in result["goals"].items()
                               if not (args.direct and k == "operator_peak_rss_mb")}  # no operator to measure
        if args.plot and created:
            start = min(created.values())
            plot_burst([t - start for t in created.values()], [t - start for t in done.values()], args.plot,
                       result["goals"].get("total_s"))
        if op is not None:
            op.terminate()
            op.wait(15)
        if args.restart:
            result["restart"] = measure_restart(command, env, len(names) + len(steady_names),
                                                max(1.0, give_up - time.monotonic()))
    finally:
        if op is not None and op.poll() is None:
            op.terminate()
            try:
                op.wait(15)
            except subprocess.TimeoutExpired:
                op.kill()
        if not args.keep:
            subprocess.run([kubectl, "delete", "namespace", ns, "--wait=false"], env=env, capture_output=True)
        if started_cluster is not None and not os.environ.get("WMRL_KEEP_CLUSTER"):
            started_cluster.down()
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    steady_ok = (result.get("steady") or {}).get("completed") == len(steady_names)
    restart = result.get("restart")
    restart_ok = restart is None or restart["resumed"] >= restart["runs"]
    return 0 if result.get("completed") == len(names) and steady_ok and restart_ok else 1
