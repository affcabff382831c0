"""The retry CTMC (relakit.analytic.retry_ctmc) against closed forms, its own limits, its
speed and the simulation's recorded intervals (benchmarks/ctmc_vs_simulation.json, with a
cheap simulation of its own); the basin maps' comparison is in tests/test_metastability.py."""

from __future__ import annotations

import json
import math
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

from relakit.analytic import RetryCTMCWarning, retry_ctmc
from relakit.analytic.retry_ctmc import doom_probability


def mmck(lam: float, mu: float, c: int, cap: int) -> np.ndarray:
    """M/M/c/K stationary distribution from the product formula (written here, not
    taken from the module under test)."""
    a = lam / mu
    w = np.array([a ** n / math.factorial(n) if n <= c
                  else a ** n / (math.factorial(c) * c ** (n - c)) for n in range(cap + 1)])
    return w / w.sum()


@pytest.mark.parametrize("lam,mu,c,ql", [(9.5, 10.0, 1, 100), (30.0, 4.0, 8, 20),
                                         (3.0, 1.0, 2, 0)])
def test_without_timeouts_it_is_mmck_to_1e10(lam, mu, c, ql):
    m = retry_ctmc(lam, mu, c, ql, math.inf, 5)
    assert m.states == c + ql + 1  # nothing is ever retried: no retry dimension
    expect = mmck(lam, mu, c, c + ql)
    assert np.abs(m.stationary - expect).max() < 1e-10
    assert m.mean_jobs == pytest.approx(expect @ np.arange(c + ql + 1), abs=1e-9)
    # one attempt only: timeouts make no retries, so it is M/M/c/K as well
    one = retry_ctmc(lam, mu, c, ql, 0.5, 1)
    assert np.abs(one.stationary - expect).max() < 1e-10


def test_mm1k_first_passage_matches_the_birth_death_sum():
    lam, mu, cap = 9.5, 10.0, 40
    m = retry_ctmc(lam, mu, 1, cap - 1, math.inf, 1)
    # E[T_{n -> n+1}] for a birth-death chain: sum_{i<=n} pi_i / (pi_n lam)
    pi = mmck(lam, mu, 1, cap)
    expect = sum(pi[: n + 1].sum() / (pi[n] * lam) for n in range(cap))
    got = m.first_passage(lambda j, r: j == 0, lambda j, r: j == cap)
    assert got == pytest.approx(expect, rel=1e-9)


def test_doom_probability_converges_to_the_deterministic_timeout():
    # one server: the sojourn of an attempt finding n jobs is Erlang(n + 1, mu)
    from scipy.stats import poisson

    n, mu, tau = np.arange(60), 10.0, 3.0
    exact = poisson.cdf(n, mu * tau)  # P(Erlang(n+1, mu) > tau)
    errs = [np.abs(doom_probability(n, 1, mu, tau, k) - exact).max() for k in (4, 64, 1024)]
    assert errs[0] > errs[1] > errs[2] and errs[2] < 0.02


def test_first_passage_converges_as_phases_grow():
    """Worked example shrunk (30 places) so it runs in a test: the empty -> 27 jobs times
    settle as the Erlang clock sharpens (the full-size table is in docs/performance.md)."""
    times = []
    for k in (4, 16, 64, 256):
        m = retry_ctmc(9.5, 10.0, 1, 30, 1.0, 5, phases=k, retry_limit=100)
        times.append(m.first_passage(lambda j, r: (j == 0) & (r == 0), lambda j, r: j >= 27))
    steps = np.abs(np.diff(times))
    assert steps[0] > steps[1] > steps[2]
    assert steps[2] < 0.05 * times[-1]


def test_worked_example_solves_in_under_five_seconds():
    """Metafor's example: one server at 10/s, 9.5/s, 100 places, 3 s timeout, 4 retries
    (= 5 attempts). Stationary solve, one first passage and the spectral gap."""
    retry_ctmc(9.5, 10.0, 1, 20, 3.0, 5)  # compile (cached on disk)
    cpu = time.process_time()
    m = retry_ctmc(9.5, 10.0, 1, 100, 3.0, 5, phases=16)
    up = m.first_passage(lambda j, r: (j == 0) & (r == 0), lambda j, r: j >= 90)
    gap = m.spectral_gap()
    cpu = time.process_time() - cpu
    assert m.states == 102 * 102 and m.boundary_mass < 1e-12
    assert 99 < m.mean_jobs < 100 and 10 < up < 1000 and gap > 0
    assert cpu < 5.0, cpu


def test_recovery_times_beyond_any_simulation_are_finite_and_positive():
    m = retry_ctmc(9.5, 10.0, 1, 100, 3.0, 5, phases=16)
    down = m.hitting_times(lambda j, r: (j <= 1) & (r == 0))
    full = m.state(101, 0)
    assert 1e12 < down[full] < np.inf  # LU gave negative times here; GTH cannot
    assert (down >= 0).all() and down[m.state(0, 0)] == 0.0


def test_spectral_gap_matches_dense_eigenvalues_on_a_small_chain():
    m = retry_ctmc(5.0, 4.0, 2, 6, 0.8, 3, phases=2, retry_limit=12)
    ev = np.linalg.eigvals(m.generator.toarray())
    expect = np.sort(np.abs(ev.real))[1]
    assert m.spectral_gap() == pytest.approx(expect, rel=1e-6)
    assert m.mixing_time() == pytest.approx(1 / expect, rel=1e-6)


def test_truncation_mass_is_reported_and_warned_about():
    with pytest.warns(RetryCTMCWarning, match="retry_limit"):
        small = retry_ctmc(9.5, 10.0, 1, 30, 1.0, 5, retry_limit=3)
    assert small.boundary_mass > 1e-6
    with warnings.catch_warnings():
        warnings.simplefilter("error", RetryCTMCWarning)
        big = retry_ctmc(9.5, 10.0, 1, 30, 1.0, 5, retry_limit=120)
    assert big.boundary_mass < 1e-6


@pytest.mark.parametrize("kwargs,name", [
    ({"arrival_rate": -1.0}, "arrival_rate"), ({"service_rate": 0.0}, "service_rate"),
    ({"servers": 1.0}, "servers"), ({"queue_limit": -1}, "queue_limit"),
    ({"timeout_s": 0.0}, "timeout_s"), ({"max_attempts": 0}, "max_attempts"),
    ({"phases": 0}, "phases"), ({"on_timeout": "keep_listening"}, "on_timeout"),
    ({"backoff_s": -0.1}, "backoff_s"), ({"jitter": "yes"}, "jitter"),
    ({"retry_limit": 10 ** 6}, "retry_limit"),
    ({"model": "work"}, "model"), ({"model": "workload", "servers": 2}, "model"),
    ({"model": "workload", "phases": 0}, "phases"),
    ({"retry_acceptance": 1.5}, "retry_acceptance"), ({"retry_acceptance": "all"},
                                                       "retry_acceptance"),
])
def test_bad_inputs_are_refused_by_name(kwargs, name):
    args = {"arrival_rate": 9.5, "service_rate": 10.0, "servers": 1, "queue_limit": 10,
            "timeout_s": 1.0, "max_attempts": 3} | kwargs
    with pytest.raises(ValueError, match=name) as err:
        retry_ctmc(**args)
    assert "\n" not in str(err.value)


def test_sets_are_checked():
    m = retry_ctmc(5.0, 10.0, 1, 5, 1.0, 2, retry_limit=5)
    with pytest.raises(ValueError, match="empty"):
        m.first_passage(lambda j, r: j == 0, lambda j, r: j > 99)
    with pytest.raises(ValueError, match="state"):
        m.state(7, 0)
    with pytest.raises(ValueError, match="integer state indices"):
        m.share(np.array([0.5, 1.5]))
    assert m.share(np.array([0, 1])) == pytest.approx(m.stationary[:2].sum())


# --- the workload model (model="workload"): the node's work in levels, not the count ---

@pytest.mark.parametrize("phases", [1, 3])
def test_workload_model_without_timeouts_is_mm1k_to_1e10(phases):
    # no deadline: one level per job whatever phases says, so the level is the count
    m = retry_ctmc(9.5, 10.0, 1, 100, math.inf, 5, phases=phases, model="workload")
    expect = mmck(9.5, 10.0, 1, 101)
    assert m.states == 102 and np.abs(m.stationary - expect).max() < 1e-10
    one = retry_ctmc(9.5, 10.0, 1, 100, 0.5, 1, phases=1, model="workload")
    assert np.abs(one.stationary[: 102] - expect).max() < 1e-10


def test_workload_doom_is_decided_by_the_work_found_not_a_coin():
    """One level per job: an attempt is doomed iff it finds at least mu * T jobs (the
    deadline counted in service completions), so the doom is 0 or 1, never a coin; with
    finer levels it is P(own levels > levels left to the deadline), a geometric tail."""
    m = retry_ctmc(9.5, 10.0, 1, 100, 3.0, 5, phases=1, model="workload")
    assert m.params["deadline_levels"] == 30
    np.testing.assert_array_equal(m.doom, (np.arange(m.doom.size) + 1 > 30).astype(float))
    fine = retry_ctmc(9.5, 10.0, 1, 30, 1.0, 3, phases=2, model="workload", retry_limit=40,
                      retry_acceptance=1.0)  # (the doom does not depend on it)
    w = np.arange(fine.doom.size)
    expect = np.where(w < 20, 0.5 ** np.maximum(20 - w, 0), 1.0)
    np.testing.assert_allclose(fine.doom, expect, rtol=1e-12)


def test_workload_start_distribution_is_the_work_of_the_jobs_queued():
    from scipy.stats import nbinom

    m = retry_ctmc(9.5, 10.0, 1, 30, 1.0, 3, phases=2, model="workload", retry_limit=40,
                   retry_acceptance=1.0)  # (the start does not depend on it)
    p = m.initial(31, 2)
    assert p.sum() == pytest.approx(1.0, abs=1e-12) and (p >= 0).all()
    assert set(m.retries[p > 0]) == {2}
    lv, pv = m.levels[p > 0], p[p > 0]  # by level, not by position
    below = lv < lv.max()  # the top level also takes the tail past it
    assert lv.min() == 31
    np.testing.assert_allclose(pv[below], nbinom.pmf(lv[below] - 31, 31, 0.5), rtol=1e-12)
    assert pv[~below].sum() == pytest.approx(1.0 - pv[below].sum(), rel=1e-12)
    one = retry_ctmc(9.5, 10.0, 1, 30, 1.0, 3, phases=1, model="workload", retry_limit=40)
    assert np.flatnonzero(one.initial(31, 0)).tolist() == [one.state(31, 0)]
    assert 0 <= m.state(31, 40) < m.states and m.jobs[m.state(31, 40)] >= 31 - 1e-6
    with pytest.raises(ValueError, match="from_set: a start distribution"):
        m.first_passage(p * 2, lambda j, r: j <= 1)


def test_workload_worked_example_solves_in_under_five_seconds():
    cpu = time.process_time()
    m = retry_ctmc(9.5, 10.0, 1, 100, 3.0, 5, phases=1, model="workload", retry_limit=130)
    up = m.first_passage(lambda j, r: (j == 0) & (r == 0), lambda j, r: j >= 90)
    cpu = time.process_time() - cpu
    assert m.states == 102 * 131 and m.boundary_mass < 1e-12
    assert 99 < m.mean_jobs < 100 and 10 < up < 1000
    assert cpu < 5.0, cpu


def test_workload_deadline_past_a_full_queue_never_dooms():
    # 12 s against at most 101 jobs at 10/s, one level per job: no attempt can time out,
    # so no retry is ever made and the levels are M/M/1/K (a level past the capacity
    # would be unreachable and, kept, would take the stationary mass)
    m = retry_ctmc(9.5, 10.0, 1, 100, 12.0, 5, model="workload", retry_limit=20)
    assert m.params["levels"] == 102 and not m.doom.any() and m.states == 102
    by_level = np.bincount(m.levels, weights=m.stationary)
    assert np.abs(by_level - mmck(9.5, 10.0, 1, 101)).max() < 1e-10


def test_the_generator_alone_has_the_models_default_phases():
    from relakit.analytic import retry_generator
    from relakit.metastability import Recovery, ctmc_recovery_map

    args = {"arrival_rate": 9.5, "service_rate": 10.0, "servers": 1, "queue_limit": 10,
            "timeout_s": 1.0, "max_attempts": 3, "retry_limit": 20, "model": "workload"}
    assert retry_generator(**args)[4]["phases"] == retry_ctmc(**args).params["phases"] == 1
    with pytest.raises(ValueError, match="trigger start: .* model: count"):
        ctmc_recovery_map(args, "start", [5], [0], Recovery(level=1, hold_s=1, within_s=10),
                          0.0, 9)


# --- the retries' acceptance: a dropped attempt ends its request (module docstring) ---

RECORD = json.loads((Path(__file__).resolve().parents[1] / "benchmarks"
                     / "ctmc_vs_simulation.json").read_text())
WORKED = (9.5, 10.0, 1, 100, 3.0, 5)
SHRUNK = (9.5, 10.0, 1, 30, 1.0, 5)


def EMPTY(jobs, retries):  # noqa: N802 (a set of states, named as the notebook's)
    return (jobs == 0) & (retries == 0)


def recorded(example: str, key: str) -> tuple[float, float]:
    r = RECORD[example][key]
    return r["mean"] - r["half_width"], r["mean"] + r["half_width"]


def test_the_retries_acceptance_is_a_full_nodes_closed_form():
    """At a full node every accepted attempt is doomed and the server never idles: with
    retries accepted with probability a, a request's accepted attempts are a + ... + a^5
    (a dropped one ends it), so lambda (a + ... + a^5) = mu; and near the top the count is
    a birth-death walk (attempts at lambda / a, services at mu) whose mean gap below the
    capacity is a / (1 - a). Both written here, not read from the module."""
    from scipy.optimize import brentq

    a = brentq(lambda x: 9.5 * sum(x ** i for i in range(1, 6)) - 10.0, 0.01, 1.0)
    m = retry_ctmc(*WORKED, phases=64)
    assert m.params["retry_acceptance"] == pytest.approx(a, abs=1e-3)
    assert m.params["acceptance_residual"] < 1e-3 and m.params["acceptance_solves"] <= 6
    assert 101 - m.mean_jobs == pytest.approx(a / (1 - a), rel=2e-3)
    old = retry_ctmc(*WORKED, phases=64, retry_acceptance=1.0)  # the share without it
    assert old.params["acceptance_solves"] == 1 and 101 - old.mean_jobs > 1.1 * a / (1 - a)


def test_stationary_mean_jobs_inside_the_simulations_interval():
    """Both examples, the recorded intervals (100 runs started full, 600 s) and a cheap
    simulation run here (15 runs of 400 s each, which must agree with the record): the chain's mean
    jobs inside both, the chain with the acceptance left out (a = 1, the model before)
    below the recorded interval, 0.11 low."""
    from relakit.metastability import base_scenario, first_passage_runs
    from relakit.stats import t_interval

    for name, node in (("worked", WORKED), ("shrunk", SHRUNK)):
        lo, hi = recorded(name, "mean_jobs")
        w = base_scenario("params/scenarios/metafor-node.yaml")
        w["fleet"]["queue_limit"], w["workload"]["deadline_ms"] = node[3], 1000 * node[4]
        w["initial"], w["duration_s"] = {"queue": node[3] + 1}, 400
        cheap = t_interval(first_passage_runs(w, 1, 15, seed=34, workers=1,
                                              warmup_s=100)["mean_jobs"].to_numpy())
        assert cheap.low < hi and lo < cheap.high, (name, cheap, lo, hi)  # the same node
        for model, phases in (("count", 64), ("workload", 1)):
            m = retry_ctmc(*node, phases=phases, model=model, retry_limit=130)
            assert lo < m.mean_jobs < hi and cheap.low < m.mean_jobs < cheap.high, (
                name, model, m.mean_jobs, lo, hi, cheap)
        old = retry_ctmc(*node, phases=64, retry_limit=130, retry_acceptance=1.0)
        assert old.mean_jobs < lo and old.mean_jobs < hi - 0.1


def test_first_passage_converges_in_phases_to_a_stated_bias():
    """The count model's first passage from empty (worked example, >= 90 jobs) settles as
    the Erlang clock sharpens, but 29 % short of the simulation's recorded mean (400
    runs), below its interval: the doom coin's bias, not the phases' (the ablation in
    benchmarks/ctmc_vs_simulation.py: the coin alone, switched on in the node's own
    semantics, brings the collapse a fifth sooner). The workload model (the work decides
    the fate, no coin) is inside the interval.
    The acceptance hardly matters here: a build-up from empty drops nothing."""
    lo, hi = recorded("worked", "first_passage_s")
    collapsed = lambda j, r: j >= 90  # noqa: E731
    ups = [retry_ctmc(*WORKED, phases=k, retry_acceptance=1.0).first_passage(EMPTY, collapsed)
           for k in (16, 64, 256, 1024)]
    steps = np.diff(ups)
    assert (steps > 0).all() and steps[0] > steps[1] > steps[2] and steps[2] < 0.02 * ups[-1]
    assert 0.6 * lo < ups[-1] < lo  # below the interval: the stated bias (doom coin)
    stat = retry_ctmc(*WORKED, phases=64)  # the stationary acceptance instead of 1
    assert abs(stat.first_passage(EMPTY, collapsed) / ups[1] - 1) < 0.01
    work = retry_ctmc(*WORKED, model="workload", retry_limit=130)
    assert lo < work.first_passage(EMPTY, collapsed) < hi


# --- the jobs-and-work model (model="jobs_work"): the count kept beside the work ---

TINY = (9.5, 10.0, 1, 15, 0.5, 5)  # Metafor's node with 15 places and a 0.5 s timeout


def test_jobs_work_with_one_level_per_job_is_the_workload_model():
    cpu = time.process_time()
    j = retry_ctmc(*WORKED, model="jobs_work", retry_limit=130)
    w = retry_ctmc(*WORKED, model="workload", retry_limit=130)
    assert j.params["tangible_states"] == w.states  # (jobs, work = jobs, retries)
    assert j.params["retry_acceptance"] == pytest.approx(w.params["retry_acceptance"], abs=1e-9)
    assert j.mean_jobs == pytest.approx(w.mean_jobs, abs=1e-9)
    collapsed = lambda a, r: a >= 90  # noqa: E731
    assert j.first_passage(EMPTY, collapsed) == pytest.approx(
        w.first_passage(EMPTY, collapsed), rel=1e-8)
    assert time.process_time() - cpu < 10.0
    with pytest.raises(ValueError, match="model: 'jobs_work'"):
        j.spectral_gap()


@pytest.mark.parametrize("phases", [1, 3])
def test_jobs_work_without_timeouts_counts_jobs_as_mm1k_to_1e10(phases):
    """No deadline: the count's law is M/M/1/K exactly at any phases (the jobs of the
    work, (n - 1)/(w - 1), are the product-geometric law's: exact when no fate depends on
    the work), and the work given the count is n + NegBin(n, 1/phases)."""
    from scipy.stats import nbinom

    m = retry_ctmc(9.5, 10.0, 1, 30, math.inf, 5, phases=phases, model="jobs_work")
    by_jobs = np.bincount(m.jobs, weights=m.stationary)
    assert np.abs(by_jobs - mmck(9.5, 10.0, 1, 31)).max() < 1e-10
    at = m.tangible & (m.jobs == 20)
    got = m.stationary[at] / m.stationary[at].sum()
    np.testing.assert_allclose(got[:40], nbinom.pmf(m.levels[at][:40] - 20, 20, 1 / phases),
                               atol=1e-10)


def test_jobs_work_drops_at_the_hard_limit_and_dooms_by_the_work():
    m = retry_ctmc(*TINY, phases=3, model="jobs_work", retry_limit=40, retry_acceptance=1.0)
    assert m.params["deadline_levels"] == 15 and m.jobs.max() == 16  # a hard limit
    w = np.arange(m.doom.size)
    np.testing.assert_allclose(m.doom, np.where(w < 15, (2 / 3) ** np.maximum(15 - w, 0), 1.0),
                               rtol=1e-12)
    p = m.initial(16, 0)  # a full queue: 16 jobs' work, n + NegBin(n, 1/3) levels
    assert p.sum() == pytest.approx(1.0) and set(m.jobs[p > 0]) == {16}
    assert (p[~m.tangible] == 0).all()


def test_jobs_work_first_passage_converges_in_phases_into_a_cheap_simulation():
    """The doom coin removed and the count kept: the first passage from empty settles as
    the levels get finer (steps shrinking), inside a simulation of the same node run here,
    where the count model, converged, is below it (the coin; docs/performance.md)."""
    from relakit.metastability import base_scenario, first_passage_runs
    from relakit.stats import t_interval

    collapsed = lambda a, r: a >= 13  # noqa: E731
    ups = [retry_ctmc(*TINY, phases=k, model="jobs_work", retry_limit=40,
                      retry_acceptance=1.0).first_passage(EMPTY, collapsed) for k in (1, 2, 3)]
    steps = -np.diff(ups)
    assert (steps > 0).all() and steps[1] < 0.5 * steps[0]
    w = base_scenario("params/scenarios/metafor-node.yaml")
    w["fleet"]["queue_limit"], w["workload"]["deadline_ms"], w["duration_s"] = 15, 500, 200
    sim = first_passage_runs(w, 13, 300, seed=34, workers=1)["first_passage_s"]
    assert sim.null_count() == 0
    ci = t_interval(sim.to_numpy())
    assert ci.low < ups[-1] < ci.high, (ups, ci)
    coin = retry_ctmc(*TINY, phases=256, retry_limit=40, retry_acceptance=1.0)
    assert coin.first_passage(EMPTY, collapsed) < ci.low


def test_jobs_work_record_converges_inside_the_recorded_simulation():
    """benchmarks/ctmc_jobs_work.json (the chain over phases) against
    benchmarks/ctmc_vs_simulation.json (400 runs from empty): the recorded first passages
    fall with phases by shrinking steps and stay inside the simulation's interval; the
    one-level chain recomputed here equals its record."""
    rec = json.loads((Path(__file__).resolve().parents[1] / "benchmarks"
                      / "ctmc_jobs_work.json").read_text())["runs"]
    for name in ("shrunk", "worked"):
        lo, hi = recorded(name, "first_passage_s")
        rows = sorted((r for r in rec if r["example"] == name), key=lambda r: r["phases"])
        ups = [r["first_passage_s"] for r in rows]
        assert len(ups) >= 2 and all(lo < u < hi for u in ups), (name, ups, lo, hi)
        if len(ups) >= 3:
            steps = -np.diff(ups)
            assert (steps > 0).all() and steps[-1] < steps[0]
    shrunk = next(r for r in rec if r["example"] == "shrunk" and r["phases"] == 1)
    m = retry_ctmc(*SHRUNK, phases=1, model="jobs_work", retry_limit=60, retry_acceptance=1.0)
    assert m.first_passage(EMPTY, lambda a, r: a >= 27) == pytest.approx(
        shrunk["first_passage_s"], rel=1e-9)
    lo, hi = recorded("shrunk", "mean_jobs")
    assert lo < shrunk["mean_jobs"] < hi
