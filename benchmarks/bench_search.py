"""Trials per minute of ``relakit search`` on a 15-minute incident, with 1 and 2 workers.

Run with ``python benchmarks/bench_search.py [--trials T] [--duration S]`` (``make
bench`` runs it too). The incident is the metastable spike stretched to 15
minutes (``duration_s: 900``, the spike at 60 s, RelA's policy in closed loop on
1 s clocks: about 2 M requests a run), searched over five keys
(params/searches/metastable-policy.yaml with ``base`` lengthened), each trial 3
replications on common random numbers, no incumbent. Each worker count runs the
same T trials into a fresh folder, numba's cache warm; the wall time includes
the pool's start-up (spawned workers import relakit and load the cached kernel
once per search) and Optuna's ask and tell. The machine is shared: the
one-minute load is printed with the numbers. A benchmark, not a test: nothing
here asserts a speed.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("NUMBA_CACHE_DIR", str(ROOT / ".numba_cache"))
os.environ.setdefault("NUMBA_NUM_THREADS", "1")
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=4)
    ap.add_argument("--duration", type=float, default=900.0, help="incident length, s")
    ap.add_argument("--workers", default="1,2")
    args = ap.parse_args()

    import yaml

    import relakit
    from relakit.counterfactual.run import run_replication
    from relakit.scenario import load_scenario

    spec = yaml.safe_load((ROOT / "params" / "searches" / "metastable-policy.yaml").read_text())
    spec["scenario"] = str(ROOT / "params" / "scenarios" / "metastable.yaml")
    spec["base"].update({"duration_s": args.duration, "workload.arrival.start_s": 60,
                         "policy": str(ROOT / "params" / "policies" / "rela.yaml")})
    spec.update(replications=3, incumbent=False, trials=args.trials)
    sc = load_scenario(spec["scenario"], overrides=spec["base"])
    t = time.perf_counter()
    run_replication(spec["scenario"], spec["base"], 1, ("gold.success_ratio",), None)
    one = time.perf_counter() - t
    print(f"incident: {sc.duration_s:.0f} s, {spec['replications']} replications a trial; "
          f"one run (in this process, cache warm) {one:.1f} s")
    for w in [int(x) for x in args.workers.split(",")]:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "search.yaml"
            path.write_text(yaml.safe_dump({**spec, "name": f"bench-{w}"}))
            load = os.getloadavg()[0]
            t = time.perf_counter()
            res = relakit.search(path, Path(tmp) / "out", workers=w, batch=max(2, w),
                                 notice=lambda line: None)
            wall = time.perf_counter() - t
        print(f"workers={w}: {res.trials.height} trials in {wall:.1f} s = "
              f"{60 * res.trials.height / wall:.2f} trials/min "
              f"(load before {load:.1f} on {os.cpu_count()} cores)")


if __name__ == "__main__":
    main()
