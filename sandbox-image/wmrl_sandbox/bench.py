"""``wmrl bench sandbox --json PATH``: execution overhead and throughput of local sandbox servers.

* Overhead: the same trivial program run (a) bare, ``subprocess.run([python, "-c", "pass"])``,
  and (b) through a local server's ``/run_code`` (HTTP round trip, fresh directory, uid,
  namespaces, limits, cleanup), interleaved one after the other so both see the same machine
  load. Reports p50/p95 of each, their ratio and the p50 overhead in milliseconds.
* Throughput: a fixed batch of small CPU-bound executions through a SandboxDispatcher over
  1, 2 and 4 local servers (one slot each); executions per second and the speedup over one.

Figures are reported, not asserted (goals: p50 overhead < 30 ms; throughput scales with
servers up to the core count).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from contextlib import ExitStack

import httpx
import numpy as np

from wmrl_sandbox.dispatcher import SandboxDispatcher, StaticEndpoints
from wmrl_sandbox.local import LocalServer

WORK = "s = 0\nfor i in range(400000):\n    s += i\n"


def _percentiles(samples: list[float]) -> dict:
    arr = np.asarray(samples) * 1000.0
    return {"p50_ms": round(float(np.percentile(arr, 50)), 2), "p95_ms": round(float(np.percentile(arr, 95)), 2),
            "mean_ms": round(float(arr.mean()), 2), "n": len(samples)}


def measure_overhead(iterations: int, python: str = sys.executable) -> dict:
    """Interleaved: bare ``python -c pass``, bare ``python -E -s -B -c pass`` (the sandbox's flags), served."""
    bare, bare_isolated, served, outside = [], [], [], []
    with LocalServer(slots=1) as server, httpx.Client(timeout=60) as client:
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


def measure_throughput(server_counts: list[int], jobs: int) -> list[dict]:
    rows = []
    for count in server_counts:
        with ExitStack() as stack:
            servers = [stack.enter_context(LocalServer(slots=1)) for _ in range(count)]
            with SandboxDispatcher(StaticEndpoints([s.url for s in servers]), timeout=60) as dispatcher:
                dispatcher.run(WORK).result()  # warm-up
                t0 = time.perf_counter()
                results = [f.result() for f in [dispatcher.run(WORK) for _ in range(jobs)]]
                elapsed = time.perf_counter() - t0
        failed = sum(r["status"] != "Success" for r in results)
        rows.append({"servers": count, "jobs": jobs, "seconds": round(elapsed, 3),
                     "executions_per_s": round(jobs / elapsed, 2), "failed": failed})
    base = rows[0]["executions_per_s"]
    for row in rows:
        row["speedup"] = round(row["executions_per_s"] / base, 2)
    return rows


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", dest="json_path", default=None, help="also write the results here")
    parser.add_argument("--iterations", type=int, default=60, help="overhead samples of each kind")
    parser.add_argument("--jobs", type=int, default=40, help="executions per throughput point")
    parser.add_argument("--servers", default="1,2,4", help="comma-separated server counts")


def main(args: argparse.Namespace) -> int:
    try:
        counts = [int(x) for x in args.servers.split(",") if x.strip()]
    except ValueError:
        print(f"wmrl bench sandbox: --servers must be comma-separated integers, got {args.servers!r}", file=sys.stderr)
        return 2
    if args.iterations < 1 or args.jobs < 1 or not counts or min(counts) < 1:
        print("wmrl bench sandbox: --iterations, --jobs and --servers must be positive", file=sys.stderr)
        return 2
    result = {
        "benchmark": "sandbox",
        "cpu_count": os.cpu_count(),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "python": sys.version.split()[0],
        "overhead": measure_overhead(args.iterations),
        "throughput": measure_throughput(counts, args.jobs),
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.json_path:
        with open(args.json_path, "w") as fh:
            fh.write(text + "\n")
    return 0
