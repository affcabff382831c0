"""What splitting the kernel's randomness into per-purpose streams cost: before against now.

Run with ``python benchmarks/bench_stream_split.py [--rounds R] [--before COMMIT]``
(``make bench`` runs it). Common random numbers (relakit.sim.rng: one xoshiro256**
stream per purpose, jumped 2**128 apart; demands drawn at arrival for the whole
fan-out) replaced one shared generator. The bar: no more than 10 % fewer simulated
requests per second, plain and mitigated.

``git archive`` extracts the tree of ``--before`` (default: the last commit before the
split) into a temporary directory; each tree runs in its own fresh process, with its
own numba cache directory, alternately round after round so both see the same machine
load. Each process times three models in CPU seconds (``time.process_time``, best of
five, after one untimed run that compiles or loads its kernel): one M/M/8 node at
utilisation 0.9, a 50-node fleet of them, and that fleet with the mitigations on
(hedging after 50 ms, 3 attempts with a 10 % budget, 100 ms deadline, 1 % errors).
The change is the median over rounds of "now / before - 1".

Needs git history (a clone, not an export). A benchmark, not a test: nothing here
asserts a speed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: the merge before ``Merge branch 'crn'`` (125523d), which brought the streams in
BEFORE_SPLIT = "de5776f"

CHILD = r"""
import json, sys, time
import relakit

def mm8(nodes, requests, **extra):
    rate = 0.9 * 8 * 100.0 * nodes
    return {"name": f"bench-{nodes}", "duration_s": requests / rate, "seed": 1,
            "workload": {"arrival": {"kind": "poisson", "rate_rps": rate}, **extra},
            "fleet": {"nodes": nodes, "servers": 8, "routing": "random",
                      "service": {"kind": "exponential", "mean_ms": 10}},
            "metrics": {"interval_s": 10.0}}

def rate(sc, n=5):
    relakit.simulate(sc, record_requests=False)  # compile or load the cache, untimed
    best = 0.0
    for _ in range(n):
        t = time.process_time()
        r = relakit.simulate(sc, record_requests=False)
        best = max(best, r.info["user_requests"] / (time.process_time() - t))
    return best

mit = mm8(50, 2e6, deadline_ms=100)
mit["controls"] = {"hedge_enabled": True}
mit["mitigations"] = {"hedge": {"delay_ms": 50, "cancel": "queued"},
                      "retries": {"max_attempts": 3, "budget_ratio": 0.1}}
mit["faults"] = [{"node": i, "start_s": 0, "end_s": 1e9, "error_rate": 0.01} for i in range(50)]
print(json.dumps({"plain M/M/8": rate(mm8(1, 4e6)), "plain 50 nodes": rate(mm8(50, 2e6)),
                  "mitigated 50 nodes": rate(mit)}))
"""


def run_tree(tree: Path, cache: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree), NUMBA_CACHE_DIR=str(cache),
               NUMBA_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, cwd=tree, check=True,
                         capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--before", default=BEFORE_SPLIT, help="the commit before the split")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="relakit-split-") as tmp:
        before = Path(tmp) / "before"
        before.mkdir()
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.before, "relakit"],
                                 check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(before)], input=archive, check=True)
        trees = {"before": before, "now": ROOT}
        rounds: list[dict] = []
        for r in range(args.rounds):
            got = {name: run_tree(tree, Path(tmp) / f"cache-{name}")
                   for name, tree in trees.items()}
            load = os.getloadavg()[0]
            rounds.append(got)
            print(f"round {r + 1} (load {load:.2f}): " + "; ".join(
                f"{m} {got['before'][m] / 1e6:.2f} -> {got['now'][m] / 1e6:.2f} M/s"
                for m in got["now"]), flush=True)
    print(f"stream split ({args.before} -> working tree), CPU-second throughput, "
          f"median over {args.rounds} rounds of now/before - 1 (bar: no worse than -10 %)")
    for m in rounds[0]["now"]:
        change = statistics.median(x["now"][m] / x["before"][m] - 1 for x in rounds)
        print(f"  {m:<20} {100 * change:+6.1f} %")


if __name__ == "__main__":
    main()
