"""The hyperexponential service kind (issue 35, part 2: the live lab's own service, an
exponential of mean slow_ms with probability slow_fraction, else of mean fast_ms).

Checked everywhere a service kind is: its moments against scipy's exponentials mixed;
the kernel's draws against the mixture's CDF (Kolmogorov-Smirnov, no queueing); M/G/1
against Pollaczek-Khinchine with an interval over replications; as a think time, a
closed population against M/M/c//N (the finite-source queue is insensitive to the think
distribution: any would do, so a wrong draw of the think's mean shows); the scenario's
checks; and the calibration's fit, which must tell it from the other kinds.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import make_scenario
from scipy import stats

import relakit
from relakit.analytic import finite_source, mg1_mean_response, service_moments
from relakit.calibration.service import N_PARAMS, score_kinds
from relakit.replications import replication_seeds
from relakit.scenario import load_scenario
from relakit.stats import t_interval
from relakit.validate import ScenarioError

LAB = {"fast_ms": 40.0, "slow_ms": 200.0, "slow_fraction": 0.02}  # relakit.lab's default


def _service(**p):
    return {"kind": "hyperexponential", **p}


def _cdf(x_ms, fast_ms, slow_ms, slow_fraction):
    f = slow_fraction
    return (1 - f) * stats.expon(scale=fast_ms).cdf(x_ms) + f * stats.expon(scale=slow_ms).cdf(x_ms)


def _all(result):
    return result.summary.filter(result.summary["tier"] == "all").row(0, named=True)


def test_moments_are_the_mixture_of_two_exponentials():
    m, s2 = service_moments("hyperexponential", **LAB)
    fast, slow = stats.expon(scale=0.040), stats.expon(scale=0.200)
    assert m == pytest.approx(0.98 * fast.mean() + 0.02 * slow.mean(), rel=1e-12)
    assert s2 == pytest.approx(0.98 * fast.moment(2) + 0.02 * slow.moment(2), rel=1e-12)
    assert s2 / m**2 - 1 == pytest.approx(1.24**2, abs=0.01)  # the lab's CV, 1.24
    # bimodal, with the same parameters, has point masses: half the second moment
    assert service_moments("bimodal", **LAB)[1] == pytest.approx(s2 / 2)
    with pytest.raises(ValueError, match="slow_fraction"):
        service_moments("hyperexponential", fast_ms=1, slow_ms=2, slow_fraction=1.5)


def test_the_kernels_draws_follow_the_mixture():
    # 64 servers at 10 req/s: no queueing, latency is the service time drawn
    sc = make_scenario(rate=10, duration=2000, servers=64, service=_service(**LAB))
    lat = relakit.simulate(sc).requests["latency_ms"].to_numpy()
    assert lat.size > 19_000
    ks = stats.kstest(lat, lambda x: _cdf(x, **LAB))
    assert ks.pvalue > 1e-3, ks
    # against the other two-phase kind: the kernel must not draw bimodal's point masses
    assert np.unique(lat).size > 0.99 * lat.size
    # the slow phase's share, read from the tail: P(S > 600 ms) = 0.02 e^-3 + 0.98 e^-15
    tail = 1 - _cdf(600.0, **LAB)
    got = float((lat > 600.0).mean())
    assert abs(got - tail) < 5 * math.sqrt(tail * (1 - tail) / lat.size) + 1 / lat.size, got


def test_mg1_mean_response_is_pollaczek_khinchine_within_the_interval():
    service = _service(fast_ms=1.0, slow_ms=10.0, slow_fraction=0.05)  # CV^2 4.7
    mean_s, m2 = service_moments(**service)
    lam = 0.5 / mean_s
    duration = 1e6 / lam
    exact = mg1_mean_response(lam, mean_s, second_moment=m2) * 1e3
    means = []
    for seed in replication_seeds(11, 8):
        sc = make_scenario(rate=lam, duration=duration, service=service, seed=seed,
                           warmup=0.02 * duration, interval=duration / 10)
        means.append(_all(relakit.simulate(sc, record_requests=False))["mean_ms"])
    ci = t_interval(means, confidence=0.99)
    # the interval holds P-K's mean and is narrow enough (±3 %) to miss a wrong second
    # moment: point masses of the same means (bimodal) give 3.50 ms here, 37 % low
    assert ci.low <= exact <= ci.high, (ci, exact)
    assert ci.high - ci.low < 0.06 * exact, (ci, exact)


def test_a_closed_population_thinking_hyperexponentially_matches_finite_source():
    # M/M/4//380, S = 10 ms, Z = 1 s (near the knee): the finite-source queue's stationary
    # law does not depend on the think distribution, only its mean
    think = _service(fast_ms=500.0, slow_ms=5500.0, slow_fraction=0.1)  # mean 1,000 ms
    assert service_moments(**think)[0] == pytest.approx(1.0)
    n, duration, warmup = 380, 3000.0, 20.0
    exact = finite_source(n, 1.0, 100.0, 4)
    xs, rs = [], []
    for seed in replication_seeds(7, 10):
        sc = make_scenario(servers=4, duration=duration, warmup=warmup, seed=seed,
                           service={"kind": "exponential", "mean_ms": 10.0})
        del sc["workload"]["arrival"]
        sc["workload"]["clients"] = {"population": n, "think": think}
        s = _all(relakit.simulate(sc, record_requests=False))
        xs.append(s["requests"] / (duration - warmup))
        rs.append(s["mean_ms"] / 1000)
    for name, ci, want in (("throughput", t_interval(xs), exact.throughput),
                           ("mean response", t_interval(rs), exact.mean_response)):
        assert abs(ci.low / want - 1) <= 0.02 and abs(ci.high / want - 1) <= 0.02, (
            name, ci, want)


@pytest.mark.parametrize(("params", "key", "says"), [
    ({"fast_ms": 50, "slow_ms": 20, "slow_fraction": 0.1}, "fleet.service.slow_ms",
     "below fast_ms 50"),
    ({"fast_ms": 0, "slow_ms": 20, "slow_fraction": 0.1}, "fleet.service.fast_ms", "> 0"),
    ({"fast_ms": 5, "slow_ms": 20, "slow_fraction": 0}, "fleet.service.slow_fraction", "> 0"),
    ({"fast_ms": 5, "slow_ms": 20, "slow_fraction": 1}, "fleet.service.slow_fraction", "< 1"),
    ({"fast_ms": 5, "slow_ms": 20}, "fleet.service.slow_fraction", "is required"),
    ({"fast_ms": 5, "slow_ms": 20, "slow_fraction": 0.1, "cv": 2}, "fleet.service",
     "'cv'"),
])
def test_bad_parameters_are_one_line_errors_naming_the_key(params, key, says):
    with pytest.raises(ScenarioError) as err:
        load_scenario(make_scenario(service=_service(**params)))
    text = str(err.value)
    assert f"key '{key}'" in text and says in text and "\n" not in text, text


def test_a_think_time_takes_the_kind_and_its_checks():
    sc = make_scenario()
    del sc["workload"]["arrival"]
    sc["workload"]["clients"] = {"population": 3, "think": _service(
        fast_ms=100, slow_ms=10, slow_fraction=0.5)}
    with pytest.raises(ScenarioError, match=r"key 'workload\.clients\.think\.slow_ms'"):
        load_scenario(sc)
    sc["workload"]["clients"]["think"]["slow_ms"] = 1100  # mean 600 ms
    clients = load_scenario(sc).workload.clients
    assert clients.think["gold"].mean_ms == pytest.approx(600.0)


def test_the_calibration_tells_it_from_the_other_kinds():
    assert N_PARAMS["hyperexponential"] == 2
    # the lab's service, in the buckets tests/test_lab_twin.py gives the lab
    bounds = np.array([0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.06, 0.08, 0.1,
                       0.125, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1.0, 1.5, 2.0, 5.0, 10.0,
                       np.inf])
    rng = np.random.default_rng(3)
    n = 5000
    slow = rng.random(n) < LAB["slow_fraction"]
    sample = rng.exponential(np.where(slow, LAB["slow_ms"], LAB["fast_ms"]) / 1000)
    counts = np.bincount(np.searchsorted(bounds, sample), minlength=bounds.size)
    scores = {s["kind"]: s for s in score_kinds(bounds, counts.astype(float), 0.0432)}
    best = min(scores.values(), key=lambda s: s["aic"])
    assert best["kind"] == "hyperexponential", scores
    # by more than the rule's 2 (fewer parameters win a near tie): exponential, the
    # choice before this kind existed, is far behind
    assert all(s["aic"] > best["aic"] + 2 for k, s in scores.items() if k != best["kind"])
    p = best["params"]
    assert 0.01 <= p["slow_fraction"] <= 0.04 and 120 <= p["slow_ms"] <= 320, p
    assert p["fast_ms"] == pytest.approx(40, rel=0.1), p
