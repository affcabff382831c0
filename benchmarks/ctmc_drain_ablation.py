"""Why the CTMC says a full node at a 10 s timeout stays full ~10^5 s where the simulation
drains it in minutes (issue 34's known failure): each of the CTMC's three approximations
switched on alone in a small model of one FCFS server, started where the CTMC starts
(:func:`relakit.sim.reference.ctmc_ablation_drain`).

Run with ``python benchmarks/ctmc_drain_ablation.py [--timeout-s 10] [--replications 40]
[--cap-s 3000]``. The node is Metafor's worked example (``params/scenarios/metafor-node.yaml``:
one server at 10/s, arrivals 9.5/s, 101 places, 5 attempts, retries at the deadline),
started with 101 first attempts sent at t = 0 and no retry pending (the kernel's
``initial: {queue: 101}``; the CTMC's state (101, 0)). Drained: <= 1 job and no retry
pending, as the CTMC's target. The model switches:

* ``doom``: ``exact`` (an attempt times out iff its own sojourn, service times drawn as
  they come, passes the deadline) or ``prob`` (the CTMC's: a coin of probability
  ``doom_probability(n found)``, independent of the services that then drain the queue);
* ``delay``: ``det`` (the retry is sent at the deadline, as the kernel does) or ``exp``
  (the CTMC's: an exponential delay of the same mean);
* ``count``: ``exact`` (each request makes at most 5 attempts) or ``share`` (the CTMC's:
  a doomed retry retries again with the stationary share ``_retry_allowed``).

``exact det exact`` is the kernel's node; it is printed beside the kernel's own runs
from the same start state (``relakit.metastability.basin_map``, trigger ``start``) as
its check. A measurement, not a test: nothing here asserts.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("NUMBA_CACHE_DIR", str(ROOT / ".numba_cache"))
os.environ.setdefault("NUMBA_NUM_THREADS", "1")
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from relakit.sim.reference import ctmc_ablation_drain  # noqa: E402

LAM, MU, CAP, ATTEMPTS = 9.5, 10.0, 101, 5


def main() -> None:
    from relakit.analytic import retry_ctmc
    from relakit.metastability import Recovery, base_scenario, basin_map
    from relakit.stats import binomial_interval, t_interval

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--timeout-s", type=float, default=10.0)
    ap.add_argument("--replications", type=int, default=40)
    ap.add_argument("--cap-s", type=float, default=3000.0)
    a = ap.parse_args()
    t0, c0 = time.perf_counter(), time.process_time()
    print(f"timeout {a.timeout_s:g} s, {a.replications} runs per model, each up to "
          f"{a.cap_s:g} s; drained = <= 1 job, no retry pending")
    for doom, delay, count in itertools.product(("exact", "prob"), ("det", "exp"),
                                                ("exact", "share")):
        xs = np.array([ctmc_ablation_drain(a.timeout_s, doom, delay, count, s, a.cap_s)
                       for s in range(a.replications)])
        ok = xs[np.isfinite(xs)]
        p = binomial_interval(ok.size, xs.size)
        mean = (f"mean {t_interval(ok).mean:.0f} ± {t_interval(ok).half_width:.0f} s"
                if ok.size > 1 else "")
        print(f"doom={doom:5s} delay={delay:3s} count={count:5s}: drained {ok.size}/{xs.size} "
              f"[{p.low:.2f}, {p.high:.2f}] {mean}", flush=True)
    w = base_scenario(ROOT / "params/scenarios/metafor-node.yaml")
    w["workload"]["deadline_ms"] = 1000 * a.timeout_s
    w["metrics"] = {"interval_s": 0.1}
    rec = Recovery(level=1, hold_s=0.0, within_s=a.cap_s)
    cell = basin_map(w, "start", [CAP], [0], rec, a.replications, workers=1).cells.row(
        0, named=True)
    print(f"kernel, initial: {{queue: {CAP}}}: drained {cell['recovered']}/"
          f"{cell['replications']} [{cell['p_low']:.2f}, {cell['p_high']:.2f}], mean "
          f"{cell['recovery_mean_s']:.0f} ± {cell['recovery_mean_s_ci']:.0f} s (<= 1 job)")
    node = dict(arrival_rate=LAM, service_rate=MU, servers=1, queue_limit=CAP - 1,
                timeout_s=a.timeout_s, max_attempts=ATTEMPTS, retry_limit=130)
    m = retry_ctmc(**node, phases=32)
    drained = m.first_passage(m.state(CAP, 0), lambda j, r: (j <= 1) & (r == 0))
    print(f"CTMC (32 phases): {drained:.3g} s from (101, 0)")
    for levels in (1, 2):
        w = retry_ctmc(**node, phases=levels, model="workload")
        t = w.first_passage(w.initial(CAP), lambda j, r: (j <= 1) & (r == 0))
        print(f"CTMC, workload model ({levels} level(s) per job): {t:.3g} s from {CAP} jobs")
    print(f"wall {time.perf_counter() - t0:.1f} s, CPU {time.process_time() - c0:.1f} s")


if __name__ == "__main__":
    main()
