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
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_kernel import general_rate_of, mitigated, mm8, rate_of, rounds  # noqa: E402


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
    return rate_of(sc) if specialise else general_rate_of(sc)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=float, default=2e6, help="user requests a run (2e6)")
    ap.add_argument("--rounds", type=int, default=5, help="rounds of every variant (5)")
    args = ap.parse_args()
    rounds(lambda requests: variants(50, requests), rate, args.rounds, args.requests)


if __name__ == "__main__":
    main()
