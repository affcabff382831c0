"""Kernel throughput: simulated user requests per second of wall time.

Run with ``make bench`` (or ``python benchmarks/bench_kernel.py [--quick]``).
Reports, in one run on this machine:

* cold start (numba compiling into an empty cache) and warm start (loading
  the cache) of a fresh process, import included;
* ``relakit.simulate`` on one M/M/8 node at utilisation 0.9 and on a 50-node
  fleet of M/M/8 nodes (random routing), per-request records off;
* the same 50-node fleet with the mitigations on (hedging after 50 ms, about the p95, with
  cancellation of queued losers, 3 attempts with a 10 % retry budget, a 100 ms
  per-attempt deadline) and 1 % errors on every node, beside the plain run;
* the pure-Python event-heap reference of the same M/M/8 model, with
  ``random.Random``, for scale.

A benchmark, not a test: nothing here asserts a speed.
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import relakit  # noqa: E402
from relakit.sim.reference import mmc_reference  # noqa: E402

STARTUP = """
import time; t = time.perf_counter()
import relakit
relakit.simulate({'duration_s': 1, 'workload': {'arrival': {'kind': 'poisson', 'rate_rps': 700}},
                  'fleet': {'servers': 8, 'service': {'kind': 'exponential', 'mean_ms': 10}}})
print(time.perf_counter() - t)
"""


def startup_seconds(cache_dir: str) -> float:
    env = dict(os.environ, NUMBA_CACHE_DIR=cache_dir)
    out = subprocess.run([sys.executable, "-c", STARTUP], env=env, check=True,
                         capture_output=True, text=True, cwd=ROOT)
    return float(out.stdout.strip().splitlines()[-1])


def mm8(nodes: int, requests: float, **extra) -> dict:
    rate = 0.9 * 8 * 100.0 * nodes  # 10 ms mean service, 8 servers a node
    sc = {"name": f"bench-{nodes}", "duration_s": requests / rate, "seed": 1,
          "workload": {"arrival": {"kind": "poisson", "rate_rps": rate}, **extra},
          "fleet": {"nodes": nodes, "servers": 8, "routing": "random",
                    "service": {"kind": "exponential", "mean_ms": 10}},
          "metrics": {"interval_s": 10.0}}
    return sc


def rate_of(sc: dict, repeats: int) -> float:
    best = 0.0
    for _ in range(repeats):
        t = time.perf_counter()
        r = relakit.simulate(sc, record_requests=False)
        best = max(best, r.info["user_requests"] / (time.perf_counter() - t))
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller runs (for a smoke check)")
    ap.add_argument("--json", default=None, help="also write the figures to this JSON file")
    args = ap.parse_args()
    scale = 0.1 if args.quick else 1.0
    figures = {}
    with tempfile.TemporaryDirectory() as cache:
        figures["cold_start_s"] = startup_seconds(cache)
        figures["warm_start_s"] = startup_seconds(cache)
    relakit.simulate(mm8(1, 1e4), record_requests=False)  # compile in this process
    figures["mm8_requests_per_s"] = rate_of(mm8(1, 2e7 * scale), 3)
    figures["fleet50_requests_per_s"] = rate_of(mm8(50, 1e7 * scale), 3)
    mitigated = mm8(50, 1e7 * scale, deadline_ms=100)
    mitigated["controls"] = {"hedge_enabled": True}
    mitigated["mitigations"] = {"hedge": {"delay_ms": 50, "cancel": "queued"},
                                "retries": {"max_attempts": 3, "budget_ratio": 0.1}}
    mitigated["faults"] = [{"node": i, "start_s": 0, "end_s": 1e9, "error_rate": 0.01}
                           for i in range(50)]
    figures["fleet50_mitigated_requests_per_s"] = rate_of(mitigated, 3)
    figures["mitigated_slowdown"] = (figures["fleet50_requests_per_s"]
                                     / figures["fleet50_mitigated_requests_per_s"])
    n_ref = int(1e6 * scale)
    t = time.perf_counter()
    done = mmc_reference(720.0, 10.0, 8, n_ref / 720.0, random.Random(1), record=False)
    figures["python_heap_mm8_requests_per_s"] = done / (time.perf_counter() - t)
    figures["speedup_vs_python"] = (figures["mm8_requests_per_s"]
                                    / figures["python_heap_mm8_requests_per_s"])
    figures["versions"] = relakit.sim.results.versions()
    width = max(len(k) for k in figures)
    for k, v in figures.items():
        shown = f"{v:,.3f}" if isinstance(v, float) and v < 100 else (
            f"{v:,.0f}" if isinstance(v, float) else str(v))
        print(f"{k.ljust(width)}  {shown}")
    if args.json:
        relakit.io.write_json(figures, args.json)


if __name__ == "__main__":
    main()
