"""What running replications through the shared runner costs, against a plain loop.

Run with ``python benchmarks/bench_replications.py [--long] [--rounds R]``
(``make bench`` runs it too). The same N replications of ``mmc-demo`` (M/M/8 at
utilisation 0.9; 1.3 M requests a run, records off; ``--long``: 10x the
duration), timed in one process with numba's cache warm, the modes interleaved
round after round (the machine is shared; the median of the rounds is printed):

* ``sequential``: a plain loop of ``relakit.simulate(sc, seed=s)``, one by one;
* ``default, first``: ``relakit.simulate(sc, replications=N)`` as the first batch
  of a process (no helper running): this process runs replications while the
  runner's helpers (:mod:`relakit.runner`) start, if the first replication says the
  work left outlasts their start-up; plus folding the N summaries;
* ``default, warm``: the same again, with the helpers the previous batch left;
* ``workers=1``: every replication in this process;
* ``pool of 2``: forced onto a pool of 2 spawned processes, this one waiting (what
  handing the work over costs: a Python, relakit's imports, numba's cached kernel,
  and pickling each replication's tables back).

The issue's bar: replications no more than 10 % slower than the same runs one by
one. A benchmark, not a test: nothing here asserts a speed.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("NUMBA_CACHE_DIR", str(ROOT / ".numba_cache"))
os.environ.setdefault("NUMBA_NUM_THREADS", "1")
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--long", action="store_true", help="18000 s runs instead of 1800 s")
    ap.add_argument("--replications", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()

    import relakit
    from relakit.replications import replication_seeds
    from relakit.scenario import load_scenario

    sc = load_scenario(ROOT / "params" / "scenarios" / "mmc-demo.yaml",
                       overrides={"duration_s": 18000} if args.long else None)
    n = args.replications
    seeds = replication_seeds(sc.seed, n)
    relakit.simulate(sc, seed=seeds[0], record_requests=False)  # compile or load the cache

    from relakit import runner
    from relakit.experiment import run_replications
    from relakit.runner import close_helpers

    modes = {
        "sequential": lambda: [relakit.simulate(sc, seed=s, record_requests=False).summary
                               for s in seeds],
        "default, first": lambda: relakit.simulate(sc, replications=n),
        "default, warm": lambda: relakit.simulate(sc, replications=n),
        "workers=1": lambda: relakit.simulate(sc, replications=n, workers=1),
        "pool of 2": lambda: run_replications(sc, n, workers=2, processes=True),
    }
    times: dict = {m: [] for m in modes}
    helped: dict = {m: [] for m in modes}
    out: dict = {}
    for _ in range(args.rounds):
        for m, run in modes.items():
            if m == "default, first":
                close_helpers()  # untimed: this batch starts with no helper running
            t = time.perf_counter()
            out[m] = run()
            times[m].append(time.perf_counter() - t)
            if m.startswith("default"):  # whether this batch found or started helpers
                helped[m].append(runner._HELPERS is not None)
    loop, one = out["sequential"], out["workers=1"]
    for name in ("default, first", "default, warm", "pool of 2"):  # the same numbers whichever way
        assert out[name].runs.equals(one.runs), name
    for i, s in enumerate(loop):
        assert s.equals(one.runs.filter(one.runs["replication"] == i).drop("replication",
                                                                            "seed"))
    requests = int(one.runs.filter(one.runs["tier"] == "all")["requests"].sum())
    print(f"{n} replications of {sc.name} ({sc.duration_s:g} s, {requests / n / 1e6:.2f} M "
          f"requests each), {os.cpu_count()} cores")
    import statistics

    base = statistics.median(times["sequential"])
    print(f"  median of {args.rounds} rounds (all rounds in brackets)")
    for name, walls in times.items():
        wall = statistics.median(walls)
        extra = "" if name == "sequential" else \
            f"  {100 * (wall / base - 1):+6.1f} % vs sequential"
        rounds = ", ".join(f"{w:.2f}" for w in walls)
        used = "" if not helped[name] else \
            f"  helpers in {sum(helped[name])} of {len(helped[name])} rounds"
        print(f"  {name:<14} {wall:7.2f} s  {wall / n:6.2f} s a replication{extra}  "
              f"[{rounds}]{used}")


if __name__ == "__main__":
    main()
