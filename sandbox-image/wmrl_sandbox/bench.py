"""``wmrl bench sandbox --json PATH``: execution overhead and throughput of local sandbox servers.

* Overhead: the same trivial program run (a) bare, ``subprocess.run([python, "-c", "pass"])``,
  and (b) through a local server's ``/run_code`` (HTTP round trip, fresh directory, uid,
  namespaces, limits, cleanup), interleaved one after the other so both see the same machine
  load. Reports p50/p95 of each, their ratio and the p50 overhead in milliseconds.
* Throughput: a fixed batch of small CPU-bound executions through a SandboxDispatcher over
  1, 2 and 4 local servers (one slot each); executions per second and the speedup over one.
* Warm against cold (root mode): a program that imports scikit-learn and fits a small model,
  on a server whose slot forks it from a warm fork server (:mod:`wmrl_sandbox.warm`) and on one
  started with ``--no-warm``, interleaved: p50/p95 latency of each; then the same program's
  throughput through a dispatcher over ``--warm-servers`` servers of each kind.
* A cgroup per execution against none: the same program on two warm servers, one giving each
  execution a cgroup (:mod:`wmrl_sandbox.cgroups`, where the server may make them) and one
  started with ``--cgroups off``, interleaved: p50/p95 of each and the difference.

``--as-uid UID`` (from root) starts every server as that uid, as the image runs it: the
deployed mode, each execution in namespaces of its own (bubblewrap cold, the fork server's
child warm); ``--python`` names an interpreter that uid can run (with scikit-learn for the
warm/cold program).

The overhead figures are measured on cold servers (a new interpreter per execution, the path
the bare interpreter is compared with). Figures are reported, not asserted (goals: p50
overhead < 30 ms; throughput scales with servers up to the core count; warm p50 under 100 ms
and at least 5x the cold throughput).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from contextlib import ExitStack
from typing import Callable, Optional

import httpx
import numpy as np

from wmrl_sandbox.dispatcher import SandboxDispatcher, StaticEndpoints
from wmrl_sandbox.local import LocalServer

WORK = "s = 0\nfor i in range(400000):\n    s += i\n"
FIT = ("from sklearn.datasets import load_iris\nfrom sklearn.linear_model import LogisticRegression\n"
       "X, y = load_iris(return_X_y=True)\nprint(LogisticRegression(max_iter=500).fit(X, y).score(X, y))\n")
"""The warm/cold program: imports scikit-learn, fits a small model."""
COLD = ("--no-warm",)
NO_CGROUPS = ("--cgroups", "off")


def server_starter(user: Optional[int] = None, python: Optional[str] = None) -> Callable[..., LocalServer]:
    """How this run starts each one-slot server: as ``user`` (None: this process's), executing with ``python``."""
    def start(args: tuple[str, ...] = ()) -> LocalServer:
        return LocalServer(slots=1, user=user, args=(*(("--python", python) if python else ()), *args))

    return start


def _percentiles(samples: list[float]) -> dict:
    arr = np.asarray(samples) * 1000.0
    return {"p50_ms": round(float(np.percentile(arr, 50)), 2), "p95_ms": round(float(np.percentile(arr, 95)), 2),
            "mean_ms": round(float(arr.mean()), 2), "n": len(samples)}


def measure_overhead(iterations: int, python: str = sys.executable,
                     start: Callable[..., LocalServer] = server_starter()) -> dict:
    """Interleaved: bare ``python -c pass``, bare ``python -E -s -B -c pass`` (the sandbox's flags), served."""
    bare, bare_isolated, served, outside = [], [], [], []
    with start(args=COLD) as server, httpx.Client(timeout=60) as client:
        body = {"code": "pass", "language": "python", "run_timeout": 10}
        for _ in range(3):  # warm both paths (page cache, connection)
            subprocess.run([python, "-c", "pass"], check=True)
            client.post(f"{server.url}/run_code", json=body).raise_for_status()
        for _ in range(iterations):
            t0 = time.perf_counter()
            subprocess.run([python, "-c", "pass"], check=True)
            bare.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            subprocess.run([python, "-E", "-s", "-B", "-c", "pass"], check=True)
            bare_isolated.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            resp = client.post(f"{server.url}/run_code", json=body)
            served.append(time.perf_counter() - t0)
            if resp.status_code != 200 or resp.json()["status"] != "Success":
                raise RuntimeError(f"benchmark execution failed: {resp.text[:500]}")
            # Time spent outside the program's own run: HTTP, JSON, directory, cleanup.
            outside.append(served[-1] - resp.json()["run_result"]["execution_time"])
        isolation = server.healthz()["isolation"]
    b, s = _percentiles(bare), _percentiles(served)
    return {
        "bare": b,
        "bare_isolated_flags": _percentiles(bare_isolated),
        "server": s,
        "server_outside_program": _percentiles(outside),
        "ratio_p50": round(s["p50_ms"] / b["p50_ms"], 3),
        "ratio_p95": round(s["p95_ms"] / b["p95_ms"], 3),
        "overhead_p50_ms": round(s["p50_ms"] - b["p50_ms"], 2),
        "overhead_p95_ms": round(s["p95_ms"] - b["p95_ms"], 2),
        "isolation": isolation,
    }


def _batch(count: int, jobs: int, program: str, args: tuple[str, ...] = COLD,
           start: Callable[..., LocalServer] = server_starter()) -> dict:
    """``jobs`` executions of ``program`` through a dispatcher over ``count`` one-slot servers."""
    with ExitStack() as stack:
        servers = [stack.enter_context(start(args=args)) for _ in range(count)]
        with SandboxDispatcher(StaticEndpoints([s.url for s in servers]), timeout=120) as dispatcher:
            dispatcher.run(program).result()  # warm-up
            t0 = time.perf_counter()
            results = [f.result() for f in [dispatcher.run(program) for _ in range(jobs)]]
            elapsed = time.perf_counter() - t0
    failed = sum(r["status"] != "Success" for r in results)
    return {"servers": count, "jobs": jobs, "seconds": round(elapsed, 3),
            "executions_per_s": round(jobs / elapsed, 2), "failed": failed}


def measure_throughput(server_counts: list[int], jobs: int,
                       start: Callable[..., LocalServer] = server_starter()) -> list[dict]:
    rows = [_batch(count, jobs, WORK, start=start) for count in server_counts]
    base = rows[0]["executions_per_s"]
    for row in rows:
        row["speedup"] = round(row["executions_per_s"] / base, 2)
    return rows


def _interleaved(client: httpx.Client, servers: list[LocalServer], body: dict, iterations: int) -> list[dict]:
    """``body`` on each server in turn, ``iterations`` rounds after two warm-up rounds: per server,
    the latency through it (``total``) and the program's time inside the sandbox (``inside``)."""
    for _ in range(2):
        for server in servers:
            client.post(f"{server.url}/run_code", json=body).raise_for_status()
    samples = [{"total": [], "inside": []} for _ in servers]
    for _ in range(iterations):
        for server, taken in zip(servers, samples):
            t0 = time.perf_counter()
            resp = client.post(f"{server.url}/run_code", json=body)
            taken["total"].append(time.perf_counter() - t0)
            if resp.status_code != 200 or resp.json()["status"] != "Success":
                raise RuntimeError(f"benchmark execution failed: {resp.text[:500]}")
            taken["inside"].append(resp.json()["run_result"]["execution_time"])
    return samples


def measure_warm_against_cold(iterations: int, jobs: int, servers: int,
                              start: Callable[..., LocalServer] = server_starter()) -> dict:
    """Latency of :data:`FIT` on a warm and a cold server (interleaved), then throughput of each."""
    with start() as warm, start(args=COLD) as cold, httpx.Client(timeout=120) as client:
        state = warm.healthz()["warm"]
        if not state["ready"]:
            return {"skipped": f"no warm start on this server: {state['reason'] or 'its fork server is not ready'}"}
        probe = client.post(f"{cold.url}/run_code", json={"code": "import sklearn", "language": "python"}).json()
        if probe.get("status") != "Success":
            return {"skipped": "the executions' interpreter cannot import scikit-learn (see --python)"}
        body = {"code": FIT, "language": "python", "run_timeout": 60}
        warm_s, cold_s = _interleaved(client, [warm, cold], body, iterations)
    w, c = _percentiles(warm_s["total"]), _percentiles(cold_s["total"])
    warm_rate, cold_rate = _batch(servers, jobs, FIT, (), start), _batch(servers, jobs, FIT, COLD, start)
    return {
        "program": "import scikit-learn, load iris, fit LogisticRegression",
        "warm": w, "cold": c, "warm_execution_time": _percentiles(warm_s["inside"]),
        "cold_execution_time": _percentiles(cold_s["inside"]),
        "latency_ratio_p50": round(c["p50_ms"] / w["p50_ms"], 2),
        "throughput": {"warm": warm_rate, "cold": cold_rate,
                       "ratio": round(warm_rate["executions_per_s"] / cold_rate["executions_per_s"], 2)},
        "fork_server": state,
    }


def measure_cgroup_cost(iterations: int, start: Callable[..., LocalServer] = server_starter()) -> dict:
    """Latency of :data:`FIT` on a warm server with a cgroup per execution and on one without, interleaved."""
    with start() as grouped, start(args=NO_CGROUPS) as plain, httpx.Client(timeout=120) as client:
        state = grouped.healthz()["cgroups"]
        if not state["enabled"]:
            return {"skipped": "no cgroup per execution here: " + "; ".join(
                f"{c}: {why}" for c, why in state["missing"].items())}
        body = {"code": FIT, "language": "python", "run_timeout": 60}
        with_s, without_s = _interleaved(client, [grouped, plain], body, iterations)
    w, wo = _percentiles(with_s["total"]), _percentiles(without_s["total"])
    return {"program": "the warm/cold program, warm", "controllers": state["controllers"],
            "with_cgroup": w, "without_cgroup": wo, "cost_p50_ms": round(w["p50_ms"] - wo["p50_ms"], 2)}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", dest="json_path", default=None, help="also write the results here")
    parser.add_argument("--iterations", type=int, default=60, help="overhead samples of each kind")
    parser.add_argument("--jobs", type=int, default=40, help="executions per throughput point")
    parser.add_argument("--servers", default="1,2,4", help="comma-separated server counts")
    parser.add_argument("--warm-iterations", type=int, default=20, help="latency samples of the warm/cold program")
    parser.add_argument("--warm-jobs", type=int, default=40, help="executions per warm/cold throughput batch")
    parser.add_argument("--warm-servers", type=int, default=os.cpu_count() or 1,
                        help="servers (one slot each) in the warm/cold throughput batches (default: the core count)")
    parser.add_argument("--as-uid", type=int, default=None, metavar="UID",
                        help="start the servers as this uid (needs root): the deployed, non-root mode")
    parser.add_argument("--python", default=None,
                        help="interpreter for the executions and fork servers (default: this one); "
                             "with --as-uid, one that uid can run")


def main(args: argparse.Namespace) -> int:
    try:
        counts = [int(x) for x in args.servers.split(",") if x.strip()]
    except ValueError:
        print(f"wmrl bench sandbox: --servers must be comma-separated integers, got {args.servers!r}", file=sys.stderr)
        return 2
    if (args.iterations < 1 or args.jobs < 1 or not counts or min(counts) < 1 or args.warm_iterations < 1
            or args.warm_jobs < 1 or args.warm_servers < 1):
        print("wmrl bench sandbox: --iterations, --jobs, --servers and the --warm-* counts must be positive",
              file=sys.stderr)
        return 2
    if args.as_uid is not None and os.geteuid() != 0:
        print("wmrl bench sandbox: --as-uid needs root (the servers are started through setpriv)", file=sys.stderr)
        return 2
    start = server_starter(args.as_uid, args.python)
    result = {
        "benchmark": "sandbox",
        "cpu_count": os.cpu_count(),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "python": sys.version.split()[0],
        "server_uid": args.as_uid,
        "overhead": measure_overhead(args.iterations, args.python or sys.executable, start),
        "throughput": measure_throughput(counts, args.jobs, start),
        "warm_against_cold": measure_warm_against_cold(args.warm_iterations, args.warm_jobs, args.warm_servers, start),
        "cgroup_per_execution": measure_cgroup_cost(args.warm_iterations, start),
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.json_path:
        with open(args.json_path, "w") as fh:
            fh.write(text + "\n")
    return 0
