"""Fill NUMBA_CACHE_DIR with the kernels runs use (``make setup`` runs it).

relakit.sim.fleet picks, when flags, controls or faults change, the plain kernel
(relakit.sim.loops: no mechanism on; its simple specialisation for fan-out 1,
exponential demand, Poisson arrivals and uniform routing, the other plain
stretches; ~5-20 s each to compile from an empty cache on this machine), the lean
mitigated specialisations (relakit.sim.loops: hedging, deadlines, retries, node
errors; for requests of one call and of several; ~25 s each) or the general one
(relakit.sim.kernel.advance: any other mechanism; ~30-60 s). Compiled once here,
every later process (tests, sweep workers, notebooks) sharing the cache directory
loads them in about a second. One scenario of each kind is
enough: every scenario gives the kernels the same argument types. A short closed
loop with RelA's policy and one with a chain fill in the control plane's compiled
piece too (the policy's step; its PromQL functions are numpy).
"""

from __future__ import annotations

import time
import warnings
from pathlib import Path

import relakit

SCENARIOS = Path(__file__).resolve().parents[1] / "params" / "scenarios"

PLAIN = {"duration_s": 1, "workload": {"arrival": {"kind": "poisson", "rate_rps": 700}},
         "fleet": {"servers": 8, "service": {"kind": "exponential", "mean_ms": 10}}}
PLAIN_LOGNORMAL = {**PLAIN, "fleet": {"servers": 8, "service": {"kind": "lognormal",
                                                                "mean_ms": 10, "cv": 1}}}
MITIGATED = {**PLAIN, "workload": {**PLAIN["workload"], "deadline_ms": 100},
             "controls": {"hedge_enabled": True},
             "mitigations": {"hedge": {"delay_ms": 50},
                             "retries": {"max_attempts": 3, "budget_ratio": 0.1}},
             "faults": [{"node": 0, "start_s": 0, "end_s": 1, "error_rate": 0.01}]}
MITIGATED_FANOUT = {**MITIGATED, "fleet": {**MITIGATED["fleet"], "nodes": 3},
                    "workload": {**MITIGATED["workload"], "fanout": 2}}
# a closed client population: the general loop (relakit.sim.fleet: clients are its alone)
CLIENTS = {**PLAIN, "workload": {"clients": {"population": 20,
                                             "think": {"kind": "exponential", "mean_ms": 50}}}}
# a queue limit is an admission check: the general kernel's
GENERAL = {**MITIGATED, "fleet": {**MITIGATED["fleet"], "queue_limit": 50}}

if __name__ == "__main__":
    for name, sc in (("plain, simple", PLAIN), ("plain", PLAIN_LOGNORMAL),
                     ("mitigated", MITIGATED), ("mitigated, fan-out", MITIGATED_FANOUT),
                     ("general", GENERAL), ("closed clients", CLIENTS)):
        t = time.perf_counter()
        relakit.simulate(sc, record_requests=False)
        print(f"kernel cache: {name} ready in {time.perf_counter() - t:.1f} s")
    for name in ("rela-ramp.yaml", "chain-heterogeneous.yaml"):
        t = time.perf_counter()
        with warnings.catch_warnings():  # cut short, the scenarios' faults never happen
            warnings.simplefilter("ignore")
            relakit.simulate(relakit.load_scenario(SCENARIOS / name, overrides={"duration_s": 30}),
                             record_requests=False)
        print(f"kernel cache: closed loop ({name}) ready in {time.perf_counter() - t:.1f} s")
