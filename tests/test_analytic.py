"""Tests for relakit.analytic: each closed form against an independent computation."""

from __future__ import annotations

import ast
import itertools
import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

import relakit.analytic as analytic
from relakit.analytic import (
    MMc,
    UnstableSystemError,
    erlang_c,
    fanout_success,
    kingman_wait,
    mg1_mean_response,
    mg1_mean_wait,
    mm1,
    mmc,
    prob_any_slow,
    quorum_success,
    service_moments,
    service_quantile,
    slowest_of_n_quantile,
)

# ---------------------------------------------------------------------------- package hygiene


def test_public_api_is_flat_and_complete():
    for name in analytic.__all__:
        assert hasattr(analytic, name), name
    assert len(set(analytic.__all__)) == len(analytic.__all__)


def test_imports_only_numpy_scipy_and_stdlib():
    pkg_dir = Path(analytic.__file__).parent
    for path in pkg_dir.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                roots = [node.module.split(".")[0]]
            elif isinstance(node, ast.Import):
                roots = [alias.name.split(".")[0] for alias in node.names]
            else:
                continue
            for root in roots:
                assert root not in {"relakit", "numba", "polars"}, (path.name, root)


# ---------------------------------------------------------------------------- fan-out


def test_fanout_success_scalar_example():
    assert fanout_success(0.99, 20) == pytest.approx(0.8179, abs=1e-4)
    assert fanout_success(0.5, 0) == 1.0


def test_fanout_success_sequence_is_product():
    ps = [0.9, 0.99, 0.95]
    expected = 0.9 * 0.99 * 0.95
    assert fanout_success(ps) == pytest.approx(expected, rel=1e-15)
    assert fanout_success(ps, 3) == pytest.approx(expected, rel=1e-15)
    assert fanout_success(np.array(ps)) == pytest.approx(expected, rel=1e-15)


@pytest.mark.parametrize(
    "args",
    [
        (1.1, 3),
        (-0.1, 3),
        (float("nan"), 3),
        (0.9, -1),
        (0.9, 2.5),
        (0.9, 2.0),
        (0.9, None),
        ([0.9, 1.2],),
        ([0.9, 0.8], 3),
    ],
)
def test_fanout_success_rejects_bad_input(args):
    with pytest.raises(ValueError):
        fanout_success(*args)


def _brute_force_quorum(ps, k):
    total = 0.0
    for outcome in itertools.product([0, 1], repeat=len(ps)):
        if sum(outcome) >= k:
            total += math.prod(p if ok else 1 - p for p, ok in zip(ps, outcome, strict=True))
    return total


@pytest.mark.parametrize("k", range(0, 7))
def test_quorum_success_poisson_binomial_matches_enumeration(k):
    ps = [0.9, 0.5, 0.99, 0.3, 0.75, 0.01]
    assert quorum_success(ps, 6, k) == pytest.approx(_brute_force_quorum(ps, k), abs=1e-14)
    assert quorum_success(ps, None, k) == pytest.approx(_brute_force_quorum(ps, k), abs=1e-14)


@pytest.mark.parametrize("k", range(0, 6))
def test_quorum_success_binomial_matches_enumeration(k):
    p = 0.8
    assert quorum_success(p, 5, k) == pytest.approx(_brute_force_quorum([p] * 5, k), abs=1e-14)


def test_quorum_edge_cases_agree_with_fanout():
    ps = [0.9, 0.8, 0.7]
    assert quorum_success(ps, 3, 3) == pytest.approx(fanout_success(ps), rel=1e-14)
    assert quorum_success(0.99, 20, 20) == pytest.approx(fanout_success(0.99, 20), rel=1e-12)
    # majority of 3 at p: 3p^2 - 2p^3
    assert quorum_success(0.9, 3, 2) == pytest.approx(3 * 0.81 - 2 * 0.729, rel=1e-14)
    with pytest.raises(ValueError):
        quorum_success(0.9, 3, 4)
    with pytest.raises(ValueError):
        quorum_success(0.9, 3, -1)
    with pytest.raises(ValueError):
        quorum_success([0.9, 0.9], 3, 1)


def test_prob_any_slow_matches_naive_and_is_vectorised():
    n = np.array([1, 10, 100])
    got = prob_any_slow(0.01, n)
    assert isinstance(got, np.ndarray) and got.shape == (3,)
    np.testing.assert_allclose(got, 1 - (1 - 0.01) ** n, rtol=1e-12)
    assert isinstance(prob_any_slow(0.01, 10), float)
    assert prob_any_slow(0.3, 0) == 0.0
    assert prob_any_slow(1.0, 0) == 0.0
    assert prob_any_slow(1.0, 5) == 1.0


def test_prob_any_slow_accurate_for_tiny_q():
    # 1 - (1 - 1e-15)**3 is garbage in floating point; the answer is 3e-15 to ~1e-15 rel.
    assert prob_any_slow(1e-15, 3) == pytest.approx(3e-15, rel=1e-9)


def test_prob_any_slow_rejects_bad_input():
    for q, n in [(1.5, 3), (0.1, -1), (0.1, [1, 2.5])]:
        with pytest.raises(ValueError):
            prob_any_slow(q, n)


def test_slowest_of_n_quantile_exponential_closed_form():
    rate = 50.0  # per-call latency ~ Exp(mean 20 ms)
    dist = stats.expon(scale=1 / rate)
    q, n = 0.99, 10
    expected = -math.log(1 - q ** (1 / n)) / rate  # (1 - e^{-rate x})^n = q
    assert slowest_of_n_quantile(dist, n, q) == pytest.approx(expected, rel=1e-12)
    assert slowest_of_n_quantile(dist.ppf, n, q) == pytest.approx(expected, rel=1e-12)
    assert slowest_of_n_quantile(dist, 1, q) == pytest.approx(dist.ppf(q), rel=1e-12)


def test_slowest_of_n_quantile_vectorised():
    dist = stats.expon()
    ns = np.array([1, 10, 100])
    got = slowest_of_n_quantile(dist, ns, 0.99)
    np.testing.assert_allclose(got, -np.log(1 - 0.99 ** (1 / ns)), rtol=1e-12)
    qs = np.array([0.5, 0.9, 0.99])
    got = slowest_of_n_quantile(dist, 10, qs)
    np.testing.assert_allclose(got, -np.log(1 - qs ** (1 / 10)), rtol=1e-12)


def test_slowest_of_n_quantile_monte_carlo():
    rng = np.random.default_rng(20240607)
    dist = stats.lognorm(s=0.8, scale=0.02)
    n, q = 10, 0.99
    maxima = dist.rvs(size=(200_000, n), random_state=rng).max(axis=1)
    assert slowest_of_n_quantile(dist, n, q) == pytest.approx(np.quantile(maxima, q), rel=0.03)


def test_slowest_of_n_quantile_rejects_bad_input():
    with pytest.raises(ValueError):
        slowest_of_n_quantile(stats.expon(), 0, 0.9)
    with pytest.raises(ValueError):
        slowest_of_n_quantile(stats.expon(), 3, 1.5)
    with pytest.raises(ValueError):
        slowest_of_n_quantile(42, 3, 0.9)


# ---------------------------------------------------------------------------- Erlang C


def test_erlang_c_table_values():
    assert erlang_c(2, 1.0) == pytest.approx(1 / 3, rel=1e-12)
    assert erlang_c(10, 8.0) == pytest.approx(0.4092, abs=1e-4)
    assert erlang_c(1, 0.7) == pytest.approx(0.7, rel=1e-12)  # M/M/1: P_w = rho
    assert erlang_c(5, 0.0) == 0.0


@pytest.mark.parametrize(("c", "a"), [(50, 45.0), (1000, 950.0), (2000, 1990.0), (1000, 880.0)])
def test_erlang_c_large_c_matches_poisson_form(c, a):
    # C = pmf(c) c/(c-a) / (cdf(c-1) + pmf(c) c/(c-a)), with N ~ Poisson(a), in logs.
    log_tail = stats.poisson.logpmf(c, a) + math.log(c / (c - a))
    log_head = stats.poisson.logcdf(c - 1, a)
    expected = math.exp(log_tail - np.logaddexp(log_head, log_tail))
    assert erlang_c(c, a) == pytest.approx(expected, rel=1e-9)


def test_erlang_c_errors():
    with pytest.raises(UnstableSystemError, match="utilisation"):
        erlang_c(2, 2.0)
    for c, a in [(0, 0.5), (2.0, 1.0), (2, -1.0), (2, float("nan"))]:
        with pytest.raises(ValueError):
            erlang_c(c, a)


# ---------------------------------------------------------------------------- M/M/1, M/M/c


def test_mm1_closed_forms():
    lam, mu = 8.0, 10.0
    q = mm1(lam, mu)
    assert isinstance(q, MMc) and q.servers == 1
    rho = lam / mu
    assert q.utilisation == pytest.approx(rho)
    assert q.p_wait == pytest.approx(rho)
    assert q.mean_response == pytest.approx(1 / (mu - lam), rel=1e-12)
    assert q.mean_wait == pytest.approx(rho / (mu - lam), rel=1e-12)
    assert q.mean_in_system == pytest.approx(rho / (1 - rho), rel=1e-12)
    assert q.mean_queue_length == pytest.approx(rho**2 / (1 - rho), rel=1e-12)
    assert q.response_quantile(0.99) == pytest.approx(math.log(100) / (mu - lam), rel=1e-10)


def test_mmc_response_reduces_to_exponential_for_one_server():
    lam, mu = 3.0, 7.0
    q = mmc(lam, mu, 1)
    t = np.linspace(0, 3, 31)
    np.testing.assert_allclose(q.response_sf(t), np.exp(-(mu - lam) * t), rtol=1e-12)
    np.testing.assert_allclose(q.response_cdf(t), -np.expm1(-(mu - lam) * t), atol=1e-15)
    qs = np.array([0.1, 0.5, 0.9, 0.999])
    np.testing.assert_allclose(q.response_quantile(qs), -np.log1p(-qs) / (mu - lam), rtol=1e-9)


def test_mmc_mean_wait_from_erlang_c_and_little():
    q = mmc(8.0, 1.0, 10)
    assert q.p_wait == pytest.approx(0.4092, abs=1e-4)
    assert q.mean_wait == pytest.approx(q.p_wait / (10 - 8), rel=1e-12)
    assert q.mean_response == pytest.approx(q.mean_wait + 1.0, rel=1e-12)
    assert q.mean_in_system == pytest.approx(q.mean_queue_length + 8.0, rel=1e-12)


def test_mmc_wait_distribution():
    q = mmc(8.0, 1.0, 10)
    assert q.wait_cdf(0.0) == pytest.approx(1 - q.p_wait)
    assert q.wait_cdf(-1.0) == 0.0
    assert q.wait_quantile(0.5) == 0.0  # 1 - P_w ~ 0.59 > 0.5
    for p in (0.7, 0.95, 0.999):
        assert q.wait_cdf(q.wait_quantile(p)) == pytest.approx(p, rel=1e-12)
    # mean from the distribution: P_w / theta
    t = np.linspace(0, 50, 200_001)
    assert np.trapezoid(1 - q.wait_cdf(t), t) == pytest.approx(q.mean_wait, rel=1e-6)


def test_mmc_response_quantile_monte_carlo():
    lam, mu, c = 3.4, 1.0, 4
    q = mmc(lam, mu, c)
    rng = np.random.default_rng(12345)
    size = 400_000
    theta = c * mu - lam
    waits = np.where(rng.random(size) < q.p_wait, rng.exponential(1 / theta, size), 0.0)
    resp = waits + rng.exponential(1 / mu, size)
    assert resp.mean() == pytest.approx(q.mean_response, rel=0.01)
    for p in (0.5, 0.9, 0.99):
        assert q.response_quantile(p) == pytest.approx(np.quantile(resp, p), rel=0.02)


def test_response_cdf_monotone_and_quantile_roundtrip():
    q = mmc(45.0, 1.0, 50)
    t = np.linspace(0, 20, 2001)
    cdf = q.response_cdf(t)
    assert cdf[0] == 0.0 and np.all(np.diff(cdf) >= 0) and cdf[-1] < 1.0
    for ti in (0.01, 0.3, 1.0, 4.0, 12.0):
        assert q.response_quantile(q.response_cdf(ti)) == pytest.approx(ti, rel=1e-8)
    qs = np.array([[0.1, 0.5], [0.99, 0.9999]])
    got = q.response_quantile(qs)
    assert got.shape == (2, 2)
    np.testing.assert_allclose(q.response_cdf(got), qs, rtol=1e-10)


def test_response_sf_theta_equal_mu_is_continuous():
    mu, c = 1.0, 2
    exact = mmc(1.0, mu, c)  # theta = c mu - lambda = 1 = mu exactly
    t = np.array([0.0, 0.5, 1.0, 3.0, 10.0])
    pw = exact.p_wait
    erlang2 = (1 + mu * t) * np.exp(-mu * t)
    expected = (1 - pw) * np.exp(-mu * t) + pw * erlang2
    np.testing.assert_allclose(exact.response_sf(t), expected, rtol=1e-14)
    for eps in (1e-12, 1e-9, 1e-6):
        for lam in (1.0 - eps, 1.0 + eps):
            np.testing.assert_allclose(mmc(lam, mu, c).response_sf(t), expected, rtol=10 * eps)


def test_response_sf_matches_textbook_form_away_from_equality():
    lam, mu, c = 2.5, 1.0, 4  # theta = 1.5
    q = mmc(lam, mu, c)
    theta, pw = c * mu - lam, q.p_wait
    t = np.linspace(0, 15, 16)
    hypo = (theta * np.exp(-mu * t) - mu * np.exp(-theta * t)) / (theta - mu)
    expected = (1 - pw) * np.exp(-mu * t) + pw * hypo
    np.testing.assert_allclose(q.response_sf(t), expected, rtol=1e-12)
    # and theta < mu (lightly loaded single server, large t): no overflow / nan
    sf = mmc(0.1, 1.0, 1).response_sf(np.array([1e3, 1e5]))
    assert np.all(np.isfinite(sf)) and np.all(sf >= 0)


@pytest.mark.parametrize(
    "args", [(10.0, 10.0, 1), (12.0, 10.0, 1), (25.0, 1.0, 20), (20.0, 1.0, 20)]
)
def test_mmc_unstable_raises(args):
    with pytest.raises(UnstableSystemError, match="utilisation") as info:
        mmc(*args)
    msg = str(info.value)
    assert "arrival_rate" in msg and "service_rate" in msg and "servers" in msg
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    "args",
    [(-1.0, 10.0, 1), (1.0, 0.0, 1), (1.0, 10.0, 0), (1.0, 10.0, 1.5), (float("nan"), 1.0, 1)],
)
def test_mmc_bad_input(args):
    with pytest.raises(ValueError):
        mmc(*args)


def test_quantile_rejects_q_outside_open_unit_interval():
    q = mm1(1.0, 2.0)
    for bad in (0.0, 1.0, -0.5, 1.5, float("nan")):
        with pytest.raises(ValueError):
            q.response_quantile(bad)
        with pytest.raises(ValueError):
            q.wait_quantile(bad)


def test_mmc_is_frozen():
    q = mm1(1.0, 2.0)
    with pytest.raises(AttributeError):
        q.arrival_rate = 3.0  # type: ignore[misc]


# ---------------------------------------------------------------------------- M/G/1, Kingman


def test_pollaczek_khinchine_special_cases():
    lam, mu = 8.0, 10.0
    mm1_wait = mm1(lam, mu).mean_wait
    assert mg1_mean_wait(lam, 1 / mu, scv=1.0) == pytest.approx(mm1_wait, rel=1e-12)
    assert mg1_mean_wait(lam, 1 / mu, second_moment=2 / mu**2) == pytest.approx(mm1_wait)
    assert mg1_mean_wait(lam, 1 / mu, scv=0.0) == pytest.approx(mm1_wait / 2, rel=1e-12)
    assert mg1_mean_response(lam, 1 / mu, scv=1.0) == pytest.approx(1 / (mu - lam), rel=1e-12)
    assert mg1_mean_wait(lam, 1 / mu, second_moment=math.inf) == math.inf


def test_pollaczek_khinchine_md1_monte_carlo_lindley():
    # Lindley: W_{n+1} = max(0, W_n + S_n - A_{n+1}), i.e. W_n = C_n - min_{k<=n} C_k.
    lam, s = 5.0, 0.12  # rho = 0.6, deterministic service
    rng = np.random.default_rng(7)
    x = s - rng.exponential(1 / lam, 1_000_000)
    cum = np.concatenate([[0.0], np.cumsum(x)])
    waits = cum - np.minimum.accumulate(cum)
    assert waits[1000:].mean() == pytest.approx(mg1_mean_wait(lam, s, scv=0.0), rel=0.03)


def test_mg1_errors():
    with pytest.raises(UnstableSystemError, match="utilisation"):
        mg1_mean_wait(2.0, 0.5, scv=1.0)
    with pytest.raises(UnstableSystemError, match="utilisation"):
        mg1_mean_response(3.0, 0.5, scv=1.0)
    for kwargs in ({}, {"scv": 1.0, "second_moment": 2.0}, {"scv": -1.0}, {"second_moment": 0.1}):
        with pytest.raises(ValueError):
            mg1_mean_wait(1.0, 0.5, **kwargs)
    with pytest.raises(ValueError):
        mg1_mean_wait(1.0, -0.5, scv=1.0)


def test_kingman_exact_for_markovian_cases():
    lam, mu = 8.0, 10.0
    assert kingman_wait(lam, 1 / mu, 1.0, 1.0) == pytest.approx(mm1(lam, mu).mean_wait, rel=1e-12)
    q = mmc(8.0, 1.0, 10)
    assert kingman_wait(8.0, 1.0, 1.0, 1.0, servers=10) == pytest.approx(q.mean_wait, rel=1e-12)
    # ca2 = 1 makes Kingman coincide with P-K for any cs2.
    assert kingman_wait(lam, 1 / mu, 1.0, 0.0) == pytest.approx(
        mg1_mean_wait(lam, 1 / mu, scv=0.0), rel=1e-12
    )
    # Allen-Cunneen at c = 1 is the same as Kingman.
    ac1 = erlang_c(1, lam / mu) / (mu - lam) * (0.5 + 2.0) / 2
    assert kingman_wait(lam, 1 / mu, 0.5, 2.0) == pytest.approx(ac1, rel=1e-12)


def test_kingman_errors():
    with pytest.raises(UnstableSystemError, match="utilisation"):
        kingman_wait(10.0, 0.1, 1.0, 1.0)
    with pytest.raises(UnstableSystemError, match="utilisation"):
        kingman_wait(30.0, 0.1, 1.0, 1.0, servers=3)
    for args in ((1.0, 0.1, -1.0, 1.0), (1.0, 0.1, 1.0, 1.0, 0), (0.0, 0.1, 1.0, 1.0)):
        with pytest.raises(ValueError):
            kingman_wait(*args)


# ---------------------------------------------------------------------------- service moments


def test_service_moments_against_scipy():
    m, s2 = service_moments("exponential", mean_ms=20.0)
    d = stats.expon(scale=0.020)
    assert (m, s2) == pytest.approx((d.mean(), d.moment(2)), rel=1e-12)

    assert service_moments("deterministic", mean_ms=5.0) == pytest.approx((0.005, 0.005**2))

    mean_s, cv = 0.030, 1.5
    sigma2 = math.log(1 + cv**2)
    d = stats.lognorm(s=math.sqrt(sigma2), scale=mean_s * math.exp(-sigma2 / 2))
    m, s2 = service_moments("lognormal", mean_ms=30.0, cv=cv)
    assert (m, s2) == pytest.approx((d.mean(), d.moment(2)), rel=1e-9)

    alpha = 3.0
    d = stats.pareto(b=alpha, scale=0.010 * (alpha - 1) / alpha)
    m, s2 = service_moments("pareto", mean_ms=10.0, alpha=alpha)
    assert (m, s2) == pytest.approx((d.mean(), d.moment(2)), rel=1e-9)
    assert service_moments("pareto", mean_ms=10.0, alpha=1.5)[1] == math.inf
    assert service_moments("pareto", mean_ms=10.0, alpha=2.0)[1] == math.inf

    m, s2 = service_moments("bimodal", fast_ms=2.0, slow_ms=200.0, slow_fraction=0.01)
    assert m == pytest.approx((0.99 * 2 + 0.01 * 200) / 1e3)
    assert s2 == pytest.approx((0.99 * 4 + 0.01 * 40_000) / 1e6)


def test_service_quantile_against_scipy_and_a_sample():
    """Each kind's quantile against scipy's exact distribution (the simulator's
    parameterisation, as in test_service_moments_against_scipy), the bimodal against its
    two masses, and the hyperexponential (no closed form) against its own survival and the
    distribution-free 99.9 % interval of a 400 000-draw sample's quantile."""
    from relakit.stats import quantile_interval

    for q in (0.01, 0.5, 0.99, 0.9999):
        assert service_quantile("exponential", q, mean_ms=20.0) == pytest.approx(
            stats.expon(scale=0.020).ppf(q), rel=1e-12)
        assert service_quantile("deterministic", q, mean_ms=5.0) == 0.005
        sigma2 = math.log(1 + 1.5**2)
        d = stats.lognorm(s=math.sqrt(sigma2), scale=0.030 * math.exp(-sigma2 / 2))
        assert service_quantile("lognormal", q, mean_ms=30.0, cv=1.5) == pytest.approx(
            d.ppf(q), rel=1e-9)
        d = stats.pareto(b=3.0, scale=0.010 * 2 / 3)
        assert service_quantile("pareto", q, mean_ms=10.0, alpha=3.0) == pytest.approx(
            d.ppf(q), rel=1e-9)
    # two masses, given in either order: the lighter point while q <= its probability
    two = {"fast_ms": 2.0, "slow_ms": 200.0, "slow_fraction": 0.01}  # 2 ms holds 0.99
    assert [service_quantile("bimodal", q, **two) for q in (0.5, 0.99, 0.995)] == [
        0.002, 0.002, 0.2]
    swapped = {"fast_ms": 200.0, "slow_ms": 2.0, "slow_fraction": 0.01}  # 2 ms holds 0.01
    assert [service_quantile("bimodal", q, **swapped) for q in (0.005, 0.01, 0.5)] == [
        0.002, 0.002, 0.2]
    rng = np.random.default_rng(11)
    for fast, slow, f in ((40.0, 1000.0, 0.02), (10.0, 90.0, 0.2), (40.0, 1000.0, 0.0)):
        draws = rng.exponential(np.where(rng.random(400_000) < f, slow, fast))
        for q in (0.5, 0.99, 0.999):
            t = service_quantile("hyperexponential", q, fast_ms=fast, slow_ms=slow,
                                 slow_fraction=f)
            sf = (1 - f) * math.exp(-t * 1e3 / fast) + f * math.exp(-t * 1e3 / slow)
            assert sf == pytest.approx(1 - q, rel=1e-9, abs=1e-15)
            iv = quantile_interval(draws, q, confidence=0.999)
            assert iv.low <= t * 1e3 <= iv.high, (fast, slow, f, q, iv)
    with pytest.raises(ValueError, match="q: must lie strictly between 0 and 1"):
        service_quantile("exponential", 1.0, mean_ms=1.0)
    with pytest.raises(ValueError, match="takes parameters"):
        service_quantile("hyperexponential", 0.5, mean_ms=1.0)


def test_service_moments_feed_pk():
    m, s2 = service_moments("exponential", mean_ms=100.0)
    assert mg1_mean_wait(8.0, m, second_moment=s2) == pytest.approx(mm1(8.0, 10.0).mean_wait)


@pytest.mark.parametrize(
    ("kind", "params"),
    [
        ("weibull", {"mean_ms": 1.0}),
        ("exponential", {}),
        ("exponential", {"mean_ms": 1.0, "cv": 1.0}),
        ("exponential", {"mean_ms": -1.0}),
        ("lognormal", {"mean_ms": 1.0, "cv": -0.1}),
        ("pareto", {"mean_ms": 1.0, "alpha": 1.0}),
        ("bimodal", {"fast_ms": 1.0, "slow_ms": 10.0, "slow_fraction": 1.5}),
    ],
)
def test_service_moments_bad_input(kind, params):
    with pytest.raises(ValueError):
        service_moments(kind, **params)
