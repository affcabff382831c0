"""The jobs-and-work CTMC (``retry_ctmc(..., model="jobs_work")``) over phases, against the
simulation's recorded intervals (issue 34): does the first passage converge, and into the
interval?

Run with ``python benchmarks/ctmc_jobs_work.py [--example worked|shrunk] [--phases 1 2 3]
[--record]``. Each (example, phases) runs in its own process (so its peak RSS is its own)
and reports states, CPU seconds and peak RSS beside:

* the mean first passage empty -> collapsed (>= 90 jobs; shrunk >= 27), the retries'
  acceptance 1 (exact for a build-up from empty: nothing is dropped before the node
  first holds the collapsed level) and at the stationary fixed point;
* the stationary mean jobs, the acceptance fixed at the one-level chain's fixed point
  (the residual |g(a) - a| of that a in the finer chain is reported: a full node's
  acceptance does not depend on how the work is cut);
* the worked example at a 10 s timeout: the mean time from a full queue (101 jobs queued,
  no retry pending, their work n + NegBin(n, 1/phases) levels) to <= 1 job.

The simulation's intervals are ``benchmarks/ctmc_vs_simulation.json`` (400 runs from
empty, 100 started full; ``benchmarks/ctmc_vs_simulation.py``) and, for the drain, 213 +-
43 s over 40 runs (docs/performance.md, "Start states"). ``--record`` writes
``benchmarks/ctmc_jobs_work.json``, which tests/test_retry_ctmc.py and notebook 12 read.
A measurement, not a test: nothing here asserts.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RECORD = ROOT / "benchmarks" / "ctmc_jobs_work.json"
SIM = ROOT / "benchmarks" / "ctmc_vs_simulation.json"
# name: (queue places, timeout s, collapsed level, retry_limit)
EXAMPLES = {"worked": (100, 3.0, 90, 80), "shrunk": (30, 1.0, 27, 60)}
DEFAULT_PHASES = {"worked": [1, 2], "shrunk": [1, 2, 3, 4, 6]}


def one(example: str, phases: int, acceptance: float | None, full: bool) -> dict:
    """The numbers for one (example, phases), in this process: the first passage always,
    the stationary mean jobs and the drain when ``full``."""
    from relakit.analytic import retry_ctmc

    places, timeout_s, level, rl = EXAMPLES[example]
    node = dict(arrival_rate=9.5, service_rate=10.0, servers=1, queue_limit=places,
                timeout_s=timeout_s, max_attempts=5, phases=phases, retry_limit=rl,
                model="jobs_work")
    empty = lambda j, r: (j == 0) & (r == 0)  # noqa: E731
    collapsed = lambda j, r: j >= level  # noqa: E731
    out = {"example": example, "phases": phases}
    cpu = time.process_time()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        up = retry_ctmc(**node, retry_acceptance=1.0)
        out["states"] = up.states
        out["tangible_states"] = up.params["tangible_states"]
        out["first_passage_s"] = up.first_passage(empty, collapsed)
        out["first_passage_cpu_s"] = time.process_time() - cpu
        if not full:
            return out | {"cpu_s": out["first_passage_cpu_s"], "peak_rss_mb":
                          resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                          "warnings": [str(w.message) for w in caught]}
        stat = retry_ctmc(**node, retry_acceptance=acceptance)
        a = stat.params["retry_acceptance"]
        pi, rets, full = stat.stationary, stat.retries, stat.jobs == stat.jobs.max()
        out |= {"mean_jobs": stat.mean_jobs, "retry_acceptance": a,
                "acceptance_residual": abs(1 - float(pi @ (rets * full)) / float(pi @ rets) - a),
                "boundary_mass": stat.boundary_mass,
                "window_mass": stat.params["window_mass"]}
        if example == "worked":
            ten = retry_ctmc(**(node | {"timeout_s": 10.0}), retry_acceptance=acceptance)
            out["drain_10s_from_full_s"] = ten.first_passage(ten.initial(places + 1, 0),
                                                             lambda j, r: j <= 1)
            out["drain_retry_acceptance"] = ten.params["retry_acceptance"]
    out["warnings"] = [str(w.message) for w in caught]
    out["cpu_s"] = time.process_time() - cpu
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--example", choices=sorted(EXAMPLES), action="append")
    ap.add_argument("--phases", type=int, nargs="+")
    ap.add_argument("--record", action="store_true")
    ap.add_argument("--one", nargs=4, help=argparse.SUPPRESS)
    ap.add_argument("--full-max-phases", type=int, default=1,
                    help="the stationary mean and the drain up to these phases (their "
                         "stationary solves cost ~400 s CPU at 2 phases on the shrunk node)")
    ap.add_argument("--timeout-s", type=float, default=3000.0)
    args = ap.parse_args()
    if args.one:
        ex, k, a, full = args.one
        print(json.dumps(one(ex, int(k), None if a == "none" else float(a), full == "1")))
        return
    sim = json.loads(SIM.read_text())
    rows = []
    env = os.environ | {"NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    for ex in args.example or ["shrunk", "worked"]:
        print(f"{ex}: simulated mean jobs {sim[ex]['mean_jobs']['mean']:.4f} +- "
              f"{sim[ex]['mean_jobs']['half_width']:.4f}", flush=True)
        a = "none"
        for k in args.phases or DEFAULT_PHASES[ex]:
            t0 = time.time()
            try:
                res = subprocess.run([sys.executable, __file__, "--one", ex, str(k), a,
                                      str(int(k <= args.full_max_phases))],
                                     capture_output=True, text=True, env=env,
                                     timeout=args.timeout_s)
            except subprocess.TimeoutExpired:
                print(f"{ex} phases {k}: not done within {args.timeout_s:.0f} s wall", flush=True)
                break
            if res.returncode != 0:
                print(f"{ex} phases {k}: failed: {res.stderr.strip().splitlines()[-1:]}",
                      flush=True)
                break
            row = json.loads(res.stdout.strip().splitlines()[-1])
            row["wall_s"] = time.time() - t0
            row["load_avg"] = os.getloadavg()[0]
            if k == 1:
                a = repr(row["retry_acceptance"])  # finer chains reuse the fixed point
            rows.append(row)
            s = sim[ex]
            fp, mj = s["first_passage_s"], s["mean_jobs"]
            print(f"{ex} phases {k}: {row['states']:,} states ({row['tangible_states']:,} "
                  f"tangible), first passage {row['first_passage_s']:.2f} s (sim "
                  f"{fp['mean']:.1f} +- {fp['half_width']:.1f})"
                  + (f", mean jobs {row['mean_jobs']:.4f} (sim {mj['mean']:.4f} +- "
                     f"{mj['half_width']:.4f})" if "mean_jobs" in row else "")
                  + (f", drain at 10 s {row['drain_10s_from_full_s']:.1f} s (sim 213 +- 43)"
                     if "drain_10s_from_full_s" in row else "")
                  + f"; {row['cpu_s']:.1f} s CPU, {row['peak_rss_mb']:.0f} MB, load "
                  f"{row['load_avg']:.1f}", flush=True)
    if args.record:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                                capture_output=True, text=True).stdout.strip()
        RECORD.write_text(json.dumps({"commit": commit, "runs": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
