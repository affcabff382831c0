"""What each mitigation costs the general kernel: the 50-node mitigated fleet, one off at a time.

Run with ``python benchmarks/bench_mitigations.py [--requests N] [--rounds R]``.
``bench_kernel.py`` gives issue 17's one figure (plain against everything on);
this splits it, in one process, rounds interleaved so every variant sees the
same machine load:

* ``plain kernel``: the fleet with no mechanism, in its plain specialisation (relakit.sim.loops);
* ``general kernel, plain``: the same fleet forced through kernel.advance
  (``Fleet.specialise = False``): what the general loop costs by itself;
* ``all on``: bench_kernel's ``mitigated`` fleet (hedging after 50 ms with
  cancellation of queued losers, 3 attempts with a 10 % retry budget, a 100 ms
  per-attempt deadline, 1 % errors on every node);
* ``no hedging``, ``no deadline``, ``no errors or retries``: all on but one.

Rates are user requests per CPU second of a whole ``relakit.simulate``,
records off; printed per round with the load average, then the best and the
median of the rounds. A benchmark, not a test: nothing here asserts a speed.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_kernel import mitigated, mm8  # noqa: E402

import relakit  # noqa: E402
from relakit.sim.fleet import Fleet  # noqa: E402


def variants(nodes: int, requests: float):
    """(name, scenario, whether the plain kernel may run) for each variant."""
    on = mitigated(nodes, requests)
    no_hedge = copy.deepcopy(on)
    no_hedge["controls"] = {}
    del no_hedge["mitigations"]["hedge"]
    no_deadline = copy.deepcopy(on)
    no_deadline["workload"]["deadline_ms"] = None
    no_errors = copy.deepcopy(on)
    no_errors["faults"] = []
    del no_errors["mitigations"]["retries"]
    return [("plain kernel", mm8(nodes, requests), True),
            ("general kernel, plain", mm8(nodes, requests), False),
            ("all on", on, True), ("no hedging", no_hedge, True),
            ("no deadline", no_deadline, True), ("no errors or retries", no_errors, True)]


def rate(sc: dict, specialise: bool) -> float:
    Fleet.specialise = specialise
    try:
        t = time.process_time()
        r = relakit.simulate(sc, record_requests=False)
        return r.info["user_requests"] / (time.process_time() - t)
    finally:
        Fleet.specialise = True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=float, default=2e6, help="user requests a run (2e6)")
    ap.add_argument("--rounds", type=int, default=5, help="rounds of every variant (5)")
    args = ap.parse_args()
    for _, sc, plain in variants(50, 1e4):  # compile (or load) both kernels first
        rate(sc, plain)
    rates: dict[str, list[float]] = {}
    for r in range(args.rounds):
        row = []
        for name, sc, plain in variants(50, args.requests):
            v = rate(sc, plain) / 1e6
            rates.setdefault(name, []).append(v)
            row.append(f"{name} {v:.2f}")
        print(f"round {r + 1} (load {os.getloadavg()[0]:.2f}): " + ", ".join(row), flush=True)
    print("\nM user requests per CPU second (best, median):")
    for name, vs in rates.items():
        print(f"  {name.ljust(22)} {max(vs):6.3f} {statistics.median(vs):6.3f}")
    best = {k: max(v) for k, v in rates.items()}
    print(f"slowdown of all on against the plain kernel (bests): "
          f"{best['plain kernel'] / best['all on']:.2f}")


if __name__ == "__main__":
    main()
