"""What a basin map costs: issue 34's bar, a 20 x 20 map of 10 replications each over
~1,000 s at ~10 req/s, under a minute on two cores.

Run with ``python benchmarks/bench_basin_map.py [--side N] [--replications R]
[--workers W]``. The map is ``params/scenarios/metastable-node.yaml`` (7 req/s on one
server at 10/s) spiked to 1-4x its rate for 2-80 s from t = 60 s, each run lasting
the trigger, 900 s to recover and a 10 s hold (about 1,000 s). Prints wall time and
CPU time (this process and its children: the machine is shared, so wall time alone
says little). A benchmark, not a test: nothing here asserts a speed.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("NUMBA_CACHE_DIR", str(ROOT / ".numba_cache"))
os.environ.setdefault("NUMBA_NUM_THREADS", "1")
sys.path.insert(0, str(ROOT))


def main() -> None:
    import numpy as np

    from relakit.metastability import Recovery, base_scenario, basin_map

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--side", type=int, default=20)
    ap.add_argument("--replications", type=int, default=10)
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args()
    base = base_scenario(ROOT / "params/scenarios/metastable-node.yaml")
    sizes = np.round(np.linspace(1.0, 4.0, a.side), 3).tolist()
    durations = np.round(np.linspace(2.0, 80.0, a.side), 2).tolist()
    rec = Recovery(level=10, hold_s=10, within_s=900)
    basin_map(base, "spike", sizes[:2], durations[:1], rec, 2, workers=1)  # warm the cache
    wall = time.perf_counter()
    m = basin_map(base, "spike", sizes, durations, rec, a.replications, workers=a.workers)
    wall = time.perf_counter() - wall
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime
    runs = a.side * a.side * a.replications
    sim_s = float(np.mean([60 + d + 910 for d in durations]))
    print(f"basin map {a.side} x {a.side} x {a.replications} replications = {runs} runs of "
          f"~{sim_s:.0f} s simulated, workers={a.workers}")
    print(f"wall {wall:.1f} s  cpu (all processes, incl. warm-up) {cpu:.1f} s  "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"cells recovered in every replication: {(m.cells['recovered'] == a.replications).sum()}"
          f", in none: {(m.cells['recovered'] == 0).sum()}")


if __name__ == "__main__":
    main()
