"""The retry CTMC against relakit's simulation where both reach (issue 34): stationary mean
jobs and the mean first passage empty -> collapsed, on Metafor's worked example and on it
shrunk, with each of the CTMC's approximations switched on alone to say which one moves
which number.

Run with ``python benchmarks/ctmc_vs_simulation.py [--replications 400]
[--mean-replications 100] [--ablation-replications 300] [--record]``.

* **Simulation** (the kernel, ``relakit.metastability.first_passage_runs``): Metafor's
  node (``params/scenarios/metafor-node.yaml``: one server at 10/s, 9.5/s, 100 queue
  places, 3 s timeout, 5 attempts) and the same shrunk to 30 places and a 1 s timeout.
  First passage: runs from empty, the first 0.1 s sample with >= 90 (27) jobs. Stationary
  mean jobs: runs started full (``initial: {queue: capacity}``), the time-average jobs in
  system after 100 s of 600 s. (From empty, a run that collapses late drags the mean
  of the samples after a fixed warm-up down: 99.83 +- 0.12 over 400 runs of the worked
  example against 99.90 +- 0.01 started full; the node collapses after ~10^2 s and
  stays collapsed ~10^21 s, so the collapsed node *is* the stationary one.)
* **CTMC** (``relakit.analytic.retry_ctmc``): the count model over phases, with the
  retries' acceptance solved (the default) and fixed at 1; the workload model at one
  level per job.
* **Ablation** (``relakit.sim.reference.ctmc_ablation_fill``): the node's semantics with
  the doom coin, the exponential retry delay and the attempt share (without and with the
  acceptance) switched on one at a time.

``--record`` writes the simulation's intervals to ``benchmarks/ctmc_vs_simulation.json``,
which ``tests/test_retry_ctmc.py`` pins (beside a cheap simulation of its own). A
measurement, not a test: nothing here asserts.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("NUMBA_CACHE_DIR", str(ROOT / ".numba_cache"))
os.environ.setdefault("NUMBA_NUM_THREADS", "1")
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

RECORD = ROOT / "benchmarks" / "ctmc_vs_simulation.json"
# name: (queue places, timeout s, collapsed level) of Metafor's node (9.5/s, 10/s, 5 attempts)
EXAMPLES = {"worked": (100, 3.0, 90), "shrunk": (30, 1.0, 27)}
EMPTY = lambda j, r: (j == 0) & (r == 0)  # noqa: E731


def scenario(places: int, timeout_s: float, start_full: bool) -> dict:
    """Metafor's node with ``places`` queue places and a ``timeout_s`` deadline, from
    empty for 1,500 s or started full for 600 s."""
    from relakit.metastability import base_scenario

    w = base_scenario(ROOT / "params/scenarios/metafor-node.yaml")
    w["fleet"]["queue_limit"] = places
    w["workload"]["deadline_ms"] = 1000 * timeout_s
    if start_full:
        w["initial"] = {"queue": places + 1}
        w["duration_s"] = 600
    return w


def simulate(places: int, timeout_s: float, level: int, runs: int, mean_runs: int) -> dict:
    """The kernel's first passage (from empty) and stationary mean jobs (started full),
    as t intervals."""
    from relakit.metastability import first_passage_runs
    from relakit.stats import t_interval

    up = first_passage_runs(scenario(places, timeout_s, False), level, runs, workers=1)
    full = first_passage_runs(scenario(places, timeout_s, True), level, mean_runs,
                              workers=1, warmup_s=100)
    out = {"censored": up["first_passage_s"].null_count()}
    for key, values in (("first_passage_s", up["first_passage_s"].drop_nulls()),
                        ("mean_jobs", full["mean_jobs"])):
        ci = t_interval(values.to_numpy())
        out[key] = {"mean": ci.mean, "half_width": ci.half_width, "n": ci.n}
    return out


def ctmc_rows(places: int, timeout_s: float, level: int) -> list[dict]:
    from relakit.analytic import retry_ctmc

    node = (9.5, 10.0, 1, places, timeout_s, 5)
    up = lambda j, r: j >= level  # noqa: E731
    rows = []
    for k in (1, 4, 16, 64, 256, 1024):
        m = retry_ctmc(*node, phases=k, retry_limit=130)
        one = retry_ctmc(*node, phases=k, retry_limit=130, retry_acceptance=1.0)
        rows.append({"model": f"count, {k} phases", "mean_jobs": m.mean_jobs,
                     "first_passage_s": m.first_passage(EMPTY, up),
                     "acceptance": m.params["retry_acceptance"],
                     "mean_jobs_a1": one.mean_jobs, "first_passage_s_a1":
                     one.first_passage(EMPTY, up)})
    w = retry_ctmc(*node, model="workload", retry_limit=130)
    one = retry_ctmc(*node, model="workload", retry_limit=130, retry_acceptance=1.0)
    rows.append({"model": "workload, 1 level per job", "mean_jobs": w.mean_jobs,
                 "first_passage_s": w.first_passage(EMPTY, up),
                 "acceptance": w.params["retry_acceptance"], "mean_jobs_a1": one.mean_jobs,
                 "first_passage_s_a1": one.first_passage(EMPTY, up)})
    return rows


def ablation(places: int, timeout_s: float, level: int, acceptance: float, runs: int,
             mean_runs: int) -> None:
    from relakit.sim.reference import ctmc_ablation_fill
    from relakit.stats import t_interval

    cap = places + 1
    for doom, delay, (count, a) in itertools.product(
            ("exact", "prob"), ("det", "exp"), (("exact", 1.0), ("share", 1.0),
                                                ("share", acceptance))):
        up = np.array([ctmc_ablation_fill(timeout_s, doom, delay, count, s, 20_000.0,
                                          level=level, capacity=cap, acceptance=a)[0]
                       for s in range(runs)])
        jobs = np.array([ctmc_ablation_fill(timeout_s, doom, delay, count, 10**6 + s, 600.0,
                                            start=cap, warmup_s=100.0, capacity=cap,
                                            acceptance=a)[1] for s in range(mean_runs)])
        f, j = t_interval(up[np.isfinite(up)]), t_interval(jobs)
        share = "" if count == "exact" else f", acceptance {a:.4f}"
        print(f"| {doom} | {delay} | {count}{share} | {f.mean:.1f} ± {f.half_width:.1f} "
              f"({np.isfinite(up).sum()}/{runs}) | {j.mean:.4f} ± {j.half_width:.4f} |",
              flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--replications", type=int, default=400)
    ap.add_argument("--mean-replications", type=int, default=100)
    ap.add_argument("--ablation-replications", type=int, default=300)
    ap.add_argument("--record", action="store_true")
    a = ap.parse_args()
    t0, c0 = time.perf_counter(), time.process_time()
    record = {"commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                                       capture_output=True, text=True).stdout.strip()}
    for name, (places, tau, level) in EXAMPLES.items():
        sim = simulate(places, tau, level, a.replications, a.mean_replications)
        record[name] = sim
        fp, mj = sim["first_passage_s"], sim["mean_jobs"]
        print(f"\n{name} ({places} places, {tau:g} s timeout, collapsed >= {level} jobs): "
              f"simulation first passage {fp['mean']:.2f} ± {fp['half_width']:.2f} s "
              f"({fp['n']} runs, {sim['censored']} censored), mean jobs "
              f"{mj['mean']:.4f} ± {mj['half_width']:.4f} ({mj['n']} runs started full)",
              flush=True)
        print("| model | mean jobs | first passage (s) | acceptance | mean jobs, a = 1 | "
              "first passage, a = 1 (s) |\n|---|---|---|---|---|---|")
        rows = ctmc_rows(places, tau, level)
        for r in rows:
            print(f"| {r['model']} | {r['mean_jobs']:.4f} | {r['first_passage_s']:.2f} | "
                  f"{r['acceptance']:.5f} | {r['mean_jobs_a1']:.4f} | "
                  f"{r['first_passage_s_a1']:.2f} |", flush=True)
        print(f"ablation ({a.ablation_replications} runs from empty, {a.mean_replications} "
              "started full):\n| doom | delay | attempts | first passage (s) | mean jobs |\n"
              "|---|---|---|---|---|")
        at_256 = next(r for r in rows if r["model"] == "count, 256 phases")
        ablation(places, tau, level, at_256["acceptance"], a.ablation_replications,
                 a.mean_replications)
    if a.record:
        RECORD.write_text(json.dumps(record, indent=1) + "\n")
        print(f"recorded {RECORD.relative_to(ROOT)}")
    print(f"wall {time.perf_counter() - t0:.1f} s, CPU {time.process_time() - c0:.1f} s")


if __name__ == "__main__":
    main()
