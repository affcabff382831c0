"""Closed client populations (workload.clients) against the finite-source queue M/M/c//N.

Each point runs ten replications of 1,000 s (seeds spawned from one, relakit.replications) and
puts a Student-t interval on throughput and mean response time; the interval must lie
within 2 % of the closed form (relakit.analytic.finite_source) at each point from light
load to saturation, and the interactive response-time law R = N / X - Z must hold on
the measured numbers. A kernel that re-armed a client twice, lost one, or drew its tier
or think time wrong misses by far more (a lost client at N = 20 is 5 %).
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import make_scenario

import relakit
from relakit.analytic import finite_source
from relakit.replications import replication_seeds
from relakit.stats import t_interval

SERVERS, MEAN_MS, THINK_MS = 4, 10.0, 1000.0
DURATION, WARMUP = 1000.0, 20.0


def closed(population, *, think=None, servers=SERVERS, seed=1, duration=DURATION, **kw):
    sc = make_scenario(servers=servers, duration=duration, warmup=WARMUP, seed=seed,
                       service={"kind": "exponential", "mean_ms": MEAN_MS}, **kw)
    del sc["workload"]["arrival"]
    sc["workload"]["clients"] = {"population": population,
                                 "think": think or {"kind": "exponential", "mean_ms": THINK_MS}}
    return sc


def _all(result):
    return result.summary.filter(result.summary["tier"] == "all").row(0, named=True)


# (clients, what it is): M/M/4//N with S = 10 ms, Z = 1 s: the knee N* = (Z + S) / S x c
# = 404; utilisation 0.25, 0.86, 1.00
POINTS = [(100, "light"), (380, "near the knee"), (800, "saturated")]


@pytest.mark.parametrize("population,label", POINTS)
def test_throughput_and_response_match_finite_source(population, label):
    exact = finite_source(population, THINK_MS / 1000, 1000 / MEAN_MS, SERVERS)
    xs, rs = [], []
    for seed in replication_seeds(7, 10):
        s = _all(relakit.simulate(closed(population, seed=seed), record_requests=False))
        xs.append(s["requests"] / (DURATION - WARMUP))
        rs.append(s["mean_ms"] / 1000)
    x, r = t_interval(xs), t_interval(rs)
    for name, ci, want in (("throughput", x, exact.throughput),
                           ("mean response", r, exact.mean_response)):
        assert abs(ci.low / want - 1) <= 0.02 and abs(ci.high / want - 1) <= 0.02, (
            f"{label}: {name} {ci} against M/M/c//N {want:.6g}")
    # the interactive response-time law on the measured numbers: R = N / X - Z
    law = [population / xi - THINK_MS / 1000 for xi in xs]
    assert t_interval(law).low <= np.mean(rs) * 1.02 and t_interval(law).high >= np.mean(rs) * 0.98
