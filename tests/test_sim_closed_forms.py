"""The fleet kernel against closed forms and against the pure-Python reference.

Tolerances are statistical, set from the spread seen over seeds (recorded
beside each test); a wrong kernel misses them by far more.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import make_scenario

import relakit
from relakit.analytic import fanout_success, mg1_mean_response, mmc, prob_any_slow, service_moments


def _all(result):
    return result.summary.filter(result.summary["tier"] == "all").row(0, named=True)


# (servers, utilisation, requests per run, seeds). At 0.95 one run's p99 wanders by
# ±4 % (M/M/1, 12 M requests), so three seeds are pooled there.
MMC_CASES = [(1, 0.5, 3e6, (1,)), (1, 0.8, 4e6, (1,)), (1, 0.95, 12e6, (1, 2, 3)),
             (8, 0.5, 3e6, (1,)), (8, 0.8, 4e6, (1,)), (8, 0.95, 10e6, (1, 2, 3))]


@pytest.mark.parametrize("servers,rho,n,seeds", MMC_CASES)
def test_mmc_mean_and_tail_response_match_erlang_c(servers, rho, n, seeds):
    mu = 1000.0  # 1 ms mean service
    lam = rho * servers * mu
    duration = n / lam
    exact = mmc(lam, mu, servers)
    means, p99s, p999s = [], [], []
    for seed in seeds:
        sc = make_scenario(rate=lam, duration=duration, servers=servers, seed=seed,
                           service={"kind": "exponential", "mean_ms": 1.0},
                           warmup=0.02 * duration, interval=duration / 10)
        s = _all(relakit.simulate(sc, record_requests=False))
        means.append(s["mean_ms"])
        p99s.append(s["p99_ms"])
        p999s.append(s["p999_ms"])
    tol_mean, tol_p99 = (0.03, 0.05) if rho > 0.9 else (0.02, 0.03)
    if rho < 0.9:
        assert np.mean(p999s) == pytest.approx(exact.response_quantile(0.999) * 1e3, rel=0.05)
    assert np.mean(means) == pytest.approx(exact.mean_response * 1e3, rel=tol_mean)
    assert np.mean(p99s) == pytest.approx(exact.response_quantile(0.99) * 1e3, rel=tol_p99)


def test_histogram_quantiles_agree_with_exact_record_quantiles():
    r = relakit.simulate(make_scenario(rate=700, duration=300, servers=8))
    lat = r.requests.filter(r.requests["outcome"] == "ok")["latency_ms"].to_numpy()
    s = _all(r)
    for col, q in (("p50_ms", 0.5), ("p99_ms", 0.99), ("p999_ms", 0.999)):
        assert s[col] == pytest.approx(np.quantile(lat, q), rel=0.006)
    assert s["mean_ms"] == pytest.approx(lat.mean(), rel=1e-9)


def test_fanout_of_20_calls_at_99_percent_succeeds_81_8_percent():
    faults = [{"node": i, "start_s": 0, "end_s": 1e9, "error_rate": 0.01} for i in range(20)]
    sc = make_scenario(rate=2000, duration=100, nodes=20, servers=4, fanout=20, faults=faults,
                       service={"kind": "exponential", "mean_ms": 1})
    s = _all(relakit.simulate(sc, record_requests=False))
    expected = fanout_success(0.99, 20)
    assert expected == pytest.approx(0.8179, abs=1e-4)
    se = math.sqrt(expected * (1 - expected) / s["requests"])
    assert s["requests"] > 190_000
    assert abs(s["success_ratio"] - expected) < 5 * se
    assert s["error"] == s["requests"] - s["ok"]


@pytest.mark.parametrize("width", [1, 10, 100])
def test_share_of_fanout_requests_hit_by_a_one_percent_slow_path(width):
    # Light load on many servers: no queueing, so a request is slow iff one call is.
    service = {"kind": "bimodal", "fast_ms": 1, "slow_ms": 100, "slow_fraction": 0.01}
    sc = make_scenario(rate=200, duration=200, nodes=100, servers=50, fanout=width,
                       service=service)
    req = relakit.simulate(sc).requests
    slow = (req["latency_ms"] >= 99.999).mean()
    p = prob_any_slow(0.01, width)
    assert abs(slow - p) < 5 * math.sqrt(p * (1 - p) / req.height)
    assert (req["fanout"] == width).all()


@pytest.mark.parametrize("service", [
    {"kind": "deterministic", "mean_ms": 1},
    {"kind": "lognormal", "mean_ms": 1, "cv": 1.5},
    {"kind": "bimodal", "fast_ms": 0.5, "slow_ms": 10, "slow_fraction": 0.05},
])
def test_mg1_mean_response_matches_pollaczek_khinchine(service):
    kind = service["kind"]
    params = {k: v for k, v in service.items() if k != "kind"}
    mean_s, m2 = service_moments(kind, **params)
    lam = 0.7 / mean_s
    duration = 4e6 / lam
    sc = make_scenario(rate=lam, duration=duration, service=service, warmup=0.02 * duration,
                       interval=duration / 10)
    s = _all(relakit.simulate(sc, record_requests=False))
    exact = mg1_mean_response(lam, mean_s, second_moment=m2) * 1e3
    assert s["mean_ms"] == pytest.approx(exact, rel=0.03)


def test_pareto_service_has_the_mean_it_was_given():
    sc = make_scenario(rate=100, duration=2000, servers=64,
                       service={"kind": "pareto", "mean_ms": 5, "alpha": 2.5})
    s = _all(relakit.simulate(sc, record_requests=False))
    assert s["mean_ms"] == pytest.approx(5.0, rel=0.03)  # no queueing at 64 servers
    assert s["p999_ms"] > 10 * s["p50_ms"]  # and a heavy tail


def test_bounded_queue_blocks_as_mm1k_predicts():
    # M/M/1/K with K = 1 + queue_limit: P(block) = (1-ρ) ρ^K / (1-ρ^(K+1)), errors not drops
    rho, q = 0.9, 4
    k = q + 1
    sc = make_scenario(rate=900, duration=2000, servers=1, queue_limit=q,
                       service={"kind": "exponential", "mean_ms": 1})
    s = _all(relakit.simulate(sc, record_requests=False))
    expected = (1 - rho) * rho**k / (1 - rho ** (k + 1))
    assert s["error"] / s["requests"] == pytest.approx(expected, rel=0.03)
    assert s["dropped"] == 0


def test_heterogeneous_fleet_nodes_each_match_erlang_c():
    """fleet.service_scale: three nodes of 1, 2 and 4 servers whose mean service is 2, 1
    and 0.5 ms (one fleet.service of 1 ms, scaled per node), fed by weighted random
    routing at utilisations 0.5, 0.7 and 0.8. A Bernoulli split of Poisson arrivals is
    Poisson, so each node is M/M/c at its own rho: its mean response and its busy share
    must match Erlang C, within the 99 % interval over five replications."""
    from scipy.stats import t as student

    from relakit.replications import replication_seeds

    servers, scale, rho = [1, 2, 4], [2.0, 1.0, 0.5], [0.5, 0.7, 0.8]
    mu = [1000.0 / s for s in scale]  # per second
    lam = [r * c * m for r, c, m in zip(rho, servers, mu, strict=True)]  # 250, 1400, 6400
    sc = make_scenario(rate=sum(lam), duration=300, nodes=3, servers=servers, weights=lam,
                       service={"kind": "exponential", "mean_ms": 1.0}, interval=5)
    sc["fleet"]["service_scale"] = scale
    warm = 5.0
    runs = []  # per replication: (per node mean response ms, per node busy share)
    for seed in replication_seeds(7, 5):
        m = relakit.simulate(sc, seed=seed, record_requests=False).metrics
        row = []
        for name in ("latency_seconds_sum", "latency_seconds_count", "busy_seconds_total"):
            f = m.filter(m["name"] == name).sort("time_s")
            at = {n: (f.filter((f["node"] == n) & (f["time_s"] <= warm))["value"][-1],
                      f.filter(f["node"] == n)["value"][-1],
                      f.filter(f["node"] == n)["time_s"][-1]) for n in range(3)}
            row.append(at)
        lat_sum, lat_n, busy = row
        runs.append(([1e3 * (lat_sum[n][1] - lat_sum[n][0]) / (lat_n[n][1] - lat_n[n][0])
                      for n in range(3)],
                     [(busy[n][1] - busy[n][0]) / (servers[n] * (busy[n][2] - warm))
                      for n in range(3)]))
    q = student.ppf(0.995, 4)
    for n in range(3):
        exact = mmc(lam[n], mu[n], servers[n])
        for k, want in ((0, exact.mean_response * 1e3), (1, rho[n])):
            x = np.array([r[k][n] for r in runs])
            half = q * x.std(ddof=1) / math.sqrt(x.size)
            assert half < 0.05 * want, (n, k, x)  # a narrow interval, not a vacuous one
            assert abs(x.mean() - want) <= half, (n, k, x.mean(), half, want)
