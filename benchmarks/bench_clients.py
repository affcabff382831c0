"""What closed clients cost: off (the general loop with and without their code) and on.

Run with ``python benchmarks/bench_clients.py [--requests N] [--rounds R]``. In one
process, rounds interleaved so every variant sees the same machine load:

* ``general, open``: bench_kernel's 50-node M/M/8 fleet at 0.9 through the general
  loop (``Fleet.specialise = False``), whose constant CLIENTS is True: the clients'
  code is compiled in and never taken;
* ``general without clients, open``: the same, through ``kernel.advance`` compiled
  with every mechanism but clients (``kernel.specialised(FEATURES - {"clients"})``):
  what the clients' code costs a loop where it is compiled in but off (the plain and
  lean loops fold it away altogether);
* ``closed``: the same fleet driven by a closed population sized to the same
  throughput (N = 0.9 x capacity x (Z + S), Z = 1 s), as it runs: in the general loop;
* ``closed, clients-only loop``: the closed fleet through ``kernel.advance`` compiled
  with the clients alone (``kernel.specialised({"clients"})``): what a loop of its own
  would buy.

Rates are user requests per CPU second of a whole ``relakit.simulate``, records off;
printed per round with the load average, then the best and the median of the rounds.
A benchmark, not a test: nothing here asserts a speed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_kernel import general_rate_of, mm8, rate_of, rounds  # noqa: E402

from relakit.sim import kernel as K  # noqa: E402

NODES = 50


def closed(requests: float) -> dict:
    sc = mm8(NODES, requests)
    rate = sc["workload"]["arrival"]["rate_rps"]
    del sc["workload"]["arrival"]
    sc["workload"]["clients"] = {"population": int(rate * (1.0 + 0.010)),
                                 "think": {"kind": "exponential", "mean_ms": 1000}}
    return sc


def rate(sc: dict, general: bool, loop=None) -> float:
    saved = K.advance
    if loop is not None:
        K.advance = loop  # kernel.run looks it up at each call
    try:
        return general_rate_of(sc) if general else rate_of(sc)
    finally:
        K.advance = saved


def variants(requests: float):
    without = K.specialised(frozenset(K.FEATURES) - {"clients"})
    alone = K.specialised(frozenset({"clients"}))
    return [("general, open", mm8(NODES, requests), True, None),
            ("general without clients, open", mm8(NODES, requests), True, without),
            ("closed", closed(requests), False, None),
            ("closed, clients-only loop", closed(requests), True, alone)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=float, default=2e6, help="user requests a run (2e6)")
    ap.add_argument("--rounds", type=int, default=5, help="rounds of every variant (5)")
    args = ap.parse_args()
    rounds(variants, rate, args.rounds, args.requests, width=30)


if __name__ == "__main__":
    main()
