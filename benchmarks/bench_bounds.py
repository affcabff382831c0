"""Where the lean mitigated loop's time goes: its slowdown against the simple loop, split.

Run with ``python benchmarks/bench_bounds.py [--rounds N]``. Not part of ``make bench``.
A benchmark, not a test: nothing here asserts a speed.

the lean mitigated loop's slowdown is split in two: its *structure* (the fleet
without mitigations run through it, plain stretches refused to the plain
specialisations, against the simple one) and the *mechanisms* (the mitigated fleet
against that). Also the mitigated fleet with a hedge delay no request reaches (timers
pushed and dropped, no hedge sent), and the plain fleet through the plain
specialisation that is not simple. No variant: the loops as they are, same process.

Two earlier experiments here (a bound on the mitigated slowdown on the state layout,
and on the cold start without helpers) compiled text edits of the separate plain loop;
that loop is now a specialisation of ``kernel.advance`` (issue 30), and their figures
stay in docs/performance.md, dated by the commit they ran on.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


# ---- where the mitigated loop's time goes ---------------------------------------------
def mitigated_split(rounds: int, requests: float) -> dict:
    import copy

    import bench_kernel as b

    import relakit
    from relakit.sim import fleet as F
    from relakit.sim import loops as P

    never = copy.deepcopy(b.mitigated(50, requests))
    never["mitigations"]["hedge"]["delay_ms"] = 1e6  # pushed and dropped, never sent
    runs = {  # name: (scenario, the loop plain stretches get: simple, plain or mitigated)
        "plain fleet, simple loop": (b.mm8(50, requests), "simple"),
        "plain fleet, plain loop": (b.mm8(50, requests), "plain"),
        "plain fleet, mitigated loop": (b.mm8(50, requests), "mitigated"),
        "mitigated fleet, mitigated loop": (b.mitigated(50, requests), "simple"),
        "mitigated fleet, no hedge reaches its delay": (never, "simple"),
    }

    def rate(sc: dict, loop: str) -> float:
        saved = F.plain_ok, P.simple_ok, F.Fleet._kernel
        used = set()  # the kernels Fleet picked: this figure is the loop's, or none

        def counted(fleet, t_s):
            picked = saved[2](fleet, t_s)
            used.add({F.run_plain: "plain", F.run_mitigated: "mitigated"}.get(picked[0],
                                                                            "general"))
            return picked

        F.Fleet._kernel = counted
        if loop != "simple":
            P.simple_ok = lambda cfg, st: False
        if loop == "mitigated":  # Fleet then asks mitigated_ok, which takes plain stretches
            F.plain_ok = lambda *a, **k: False
        try:
            t = time.process_time()
            r = relakit.simulate(sc, record_requests=False)
            dt = time.process_time() - t
        finally:
            F.plain_ok, P.simple_ok, F.Fleet._kernel = saved
        want = "mitigated" if loop == "mitigated" or "mitigations" in sc else "plain"
        if used != {want}:
            raise SystemExit(f"bench_bounds: {sc['name']} ({loop} loop) ran {sorted(used)}, "
                             f"not {want} alone; update mitigated_split")
        return r.info["user_requests"] / dt / 1e6

    for sc, loop in runs.values():  # compile, or load from the cache
        rate({**sc, "duration_s": 0.5}, loop)
    got = {name: [] for name in runs}
    for _ in range(rounds):
        for name, (sc, loop) in runs.items():
            got[name].append(rate(sc, loop))
    return {name: statistics.median(v) for name, v in got.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=float, default=3e6)
    args = ap.parse_args()
    if args.rounds < 1 or args.requests < 1e4:
        ap.error(f"--rounds must be at least 1 (got {args.rounds}) and --requests at least "
                 f"1e4 (got {args.requests:g})")
    print(f"load average {os.getloadavg()[0]:.2f}; medians of {args.rounds} rounds")
    m = mitigated_split(args.rounds, args.requests)
    for name, v in m.items():
        print(f"  {name}: {v:.2f} M requests per CPU s")
    simple, floor = m["plain fleet, simple loop"], m["plain fleet, mitigated loop"]
    full = m["mitigated fleet, mitigated loop"]
    print(f"  mitigated slowdown {simple / full:.2f} = structure {simple / floor:.2f} "
          f"x mechanisms {floor / full:.2f} (target <= 1.5)")


if __name__ == "__main__":
    main()
