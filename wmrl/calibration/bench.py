"""``wmrl bench calibration``: service throughput, refit time, our isotonic fit against scikit-learn's.

Throughput: ``--replicas`` real ``wmrl calibration serve`` processes share one state
(a ConfigMap on the cluster named by ``--kubeconfig``/``KUBECONFIG``, else a file);
``--trainers`` threads (in this process, on the same machine) post batches of ``--batch-groups`` anchor groups of
``--group-size`` rollouts for ``--seconds``, spread over the replicas; the figure is
acknowledged (durable) groups per second per replica. Printed as JSON, also
written to ``--json PATH``. Figures are reported, never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from typing import Any, Optional

import numpy as np

from wmrl.calibration.state import CalibrationState
from wmrl.calibration.store import ConfigMapStore
from wmrl.debias import OnlineDebiaser, apply_map, bin_statistics, fit_bucketed_isotonic


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", metavar="PATH", help="also write the results here")
    parser.add_argument("--kubeconfig", help="use this cluster (default: KUBECONFIG if set, else a file store)")
    parser.add_argument("--namespace", default="default")
    parser.add_argument("--replicas", default="1,2", help="comma-separated replica counts to measure (default %(default)s)")
    parser.add_argument("--trainers", type=int, default=8)
    parser.add_argument("--batch-groups", type=int, default=256, help="groups per POST (the client's default batch)")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--repeats", type=int, default=200, help="timing repeats for the fits")


def _timed(fn, repeats: int) -> float:
    """Median seconds of ``fn()`` over ``repeats`` runs."""
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def bench_fits(repeats: int, pairs: int = 5000, bins: int = 10) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    env = rng.random(pairs).round(6)
    wm = np.clip(np.sqrt(env) + rng.normal(0, 0.1, pairs), 0, 1).round(6)
    debiaser = OnlineDebiaser(bins=bins, buffer_size=pairs)
    for start in range(0, pairs, 8):
        debiaser.observe_group(wm[start:start + 8], env[start:start + 8])
    state = CalibrationState()
    for start in range(0, pairs, 8):
        state.observe("bench", str(start), [{"wm": wm[start:start + 8].tolist(), "env": env[start:start + 8].tolist()}])
    out: dict[str, Any] = {
        "pairs": pairs,
        "bins": bins,
        "refit_ms": 1e3 * _timed(debiaser.refit, repeats),
        "fit_from_raw_pairs_ms": 1e3 * _timed(lambda: fit_bucketed_isotonic(wm, env, bins), repeats),
        "bias_diagnostic_ms": 1e3 * _timed(lambda: debiaser.bias, repeats),
        "state_json_bytes": len(state.dumps().encode()),
        "state_dumps_ms": 1e3 * _timed(state.dumps, max(5, repeats // 10)),
    }
    try:
        from sklearn.isotonic import IsotonicRegression
    except ImportError:
        out["sklearn"] = None
        return out

    def sklearn_fit():
        x, y, n = bin_statistics(wm, env, bins)
        return IsotonicRegression(out_of_bounds="clip").fit(x, y, sample_weight=n)

    ours, theirs = fit_bucketed_isotonic(wm, env, bins), sklearn_fit()
    grid = np.concatenate([np.linspace(0, 1, 10001), wm])
    ours_ms = 1e3 * _timed(lambda: fit_bucketed_isotonic(wm, env, bins), repeats)
    sklearn_ms = 1e3 * _timed(sklearn_fit, repeats)
    out["sklearn"] = {
        "ours_fit_ms": ours_ms,
        "sklearn_fit_ms": sklearn_ms,
        "time_ratio_sklearn_over_ours": sklearn_ms / ours_ms,
        "max_abs_diff": float(np.max(np.abs(apply_map(ours, grid) - theirs.predict(grid)))),
        "compared_at": "10001 grid points on [0,1] and the 5000 world-model rewards",
    }
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_replicas(n: int, store_args: list[str], env: dict) -> list[tuple[subprocess.Popen, str]]:
    import httpx

    procs = []
    for _ in range(n):
        port = _free_port()
        cmd = [sys.executable, "-m", "wmrl.cli", "calibration", "serve", "--host", "127.0.0.1", "--port", str(port),
               *store_args]
        procs.append((subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
                      f"http://127.0.0.1:{port}"))
    deadline = time.monotonic() + 60
    for proc, url in procs:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"calibration replica exited with {proc.returncode}")
            try:
                if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("calibration replica did not become healthy")
            time.sleep(0.1)
    return procs


def bench_service(args: argparse.Namespace, replicas: int) -> dict[str, Any]:
    import httpx

    kubeconfig = args.kubeconfig or os.environ.get("KUBECONFIG")
    env = dict(os.environ)
    tmp = tempfile.TemporaryDirectory()
    name = f"wmrl-bench-calibration-{uuid.uuid4().hex[:6]}"
    if kubeconfig:
        env["KUBECONFIG"] = kubeconfig
        store_args = ["--configmap", f"{args.namespace}/{name}"]
        store = {"kind": "configmap", "configmap": f"{args.namespace}/{name}", "kubeconfig": kubeconfig}
    else:
        path = os.path.join(tmp.name, "state.json")
        store_args = ["--state-file", path]
        store = {"kind": "file", "path": path, "note": "no KUBECONFIG/--kubeconfig: file store, not a ConfigMap"}
    procs = _start_replicas(replicas, store_args, env)
    acked = [0] * args.trainers
    latencies: list[float] = []
    stop = threading.Event()

    def trainer(i: int) -> None:
        rng = np.random.default_rng(i)
        url = procs[i % len(procs)][1]
        http = httpx.Client(timeout=30)
        batch = 0
        while not stop.is_set():
            env_r = rng.random((args.batch_groups, args.group_size)).round(6)
            wm_r = np.sqrt(env_r).round(6)
            body = {"trainer": f"bench-{i}", "batch": str(batch),
                    "groups": [{"task": "t", "wm": w, "env": e} for w, e in zip(wm_r.tolist(), env_r.tolist())]}
            start = time.perf_counter()
            try:
                response = http.post(url + "/v1/observations", json=body)
            except httpx.HTTPError:
                continue
            if response.status_code == 200:
                latencies.append(time.perf_counter() - start)
                if not stop.is_set():
                    acked[i] += args.batch_groups
                batch += 1
        http.close()

    try:
        threads = [threading.Thread(target=trainer, args=(i,)) for i in range(args.trainers)]
        warmup = min(2.0, args.seconds / 5)
        for t in threads:
            t.start()
        time.sleep(warmup)
        base = sum(acked)
        start = time.perf_counter()
        time.sleep(args.seconds)
        elapsed = time.perf_counter() - start
        groups = sum(acked) - base
        stop.set()
        for t in threads:
            t.join(60)
        view = httpx.get(procs[0][1] + "/v1/calibration", timeout=30).json()
        conflicts = 0.0
        for _, url in procs:
            for line in httpx.get(url + "/metrics", timeout=30).text.splitlines():
                if line.startswith("wmrl_calibration_store_conflicts "):
                    conflicts += float(line.split()[-1])
    finally:
        for proc, _ in procs:
            proc.terminate()
        for proc, _ in procs:
            proc.wait(30)
        if kubeconfig:
            ConfigMapStore(args.namespace, name, kubeconfig=kubeconfig)._request(
                "DELETE", f"/api/v1/namespaces/{args.namespace}/configmaps/{name}")
        tmp.cleanup()
    total = groups / elapsed
    return {
        "store": store,
        "replicas": replicas,
        "trainers": args.trainers,
        "batch_groups": args.batch_groups,
        "group_size": args.group_size,
        "seconds": elapsed,
        "groups_per_s_total": total,
        "groups_per_s_per_replica": total / replicas,
        "post_latency_ms_p50": 1e3 * statistics.median(latencies) if latencies else None,
        "conflicts_resolved": conflicts,
        "final_pairs_seen": view["pairsSeen"],
        "goal_groups_per_s_per_replica": 2000,
    }


def main(args: argparse.Namespace) -> int:
    result = {
        "benchmark": "calibration",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "load_avg_1m": os.getloadavg()[0]},
        "fits": bench_fits(args.repeats),
        "service": [bench_service(args, int(n)) for n in str(args.replicas).split(",")],
        "goals": {"groups_per_s_per_replica": ">= 2000", "refit_ms": "< 5", "max_abs_diff_vs_sklearn": "<= 1e-9"},
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    return 0
