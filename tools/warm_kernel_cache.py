"""Fill NUMBA_CACHE_DIR with the kernels runs use (``make setup`` runs it).

relakit.sim.fleet picks, before each kernel call, the plain kernel
(relakit.sim.plain: no mechanism on; its simple specialisation for fan-out 1,
exponential demand, Poisson arrivals and uniform routing, the other plain
stretches; ~5-20 s each to compile from an empty cache on this machine) or the
general one (relakit.sim.kernel.advance: any mechanism on; ~30-60 s). Compiled
once here, every later process (tests, sweep workers, notebooks) sharing the
cache directory loads them in about a second. One scenario of each kind is
enough: every scenario gives the kernels the same argument types.
"""

from __future__ import annotations

import time

import relakit

PLAIN = {"duration_s": 1, "workload": {"arrival": {"kind": "poisson", "rate_rps": 700}},
         "fleet": {"servers": 8, "service": {"kind": "exponential", "mean_ms": 10}}}
PLAIN_LOGNORMAL = {**PLAIN, "fleet": {"servers": 8, "service": {"kind": "lognormal",
                                                                "mean_ms": 10, "cv": 1}}}
MITIGATED = {**PLAIN, "workload": {**PLAIN["workload"], "deadline_ms": 100},
             "controls": {"hedge_enabled": True},
             "mitigations": {"hedge": {"delay_ms": 50},
                             "retries": {"max_attempts": 3, "budget_ratio": 0.1}},
             "faults": [{"node": 0, "start_s": 0, "end_s": 1, "error_rate": 0.01}]}

if __name__ == "__main__":
    for name, sc in (("plain, simple", PLAIN), ("plain", PLAIN_LOGNORMAL),
                     ("mitigated", MITIGATED)):
        t = time.perf_counter()
        relakit.simulate(sc, record_requests=False)
        print(f"kernel cache: {name} ready in {time.perf_counter() - t:.1f} s")
