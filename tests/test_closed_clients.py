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
from relakit.validate import ScenarioError

SERVERS, MEAN_MS, THINK_MS = 4, 10.0, 1000.0
DURATION, WARMUP = 1000.0, 20.0


def closed(population, *, think=None, servers=SERVERS, seed=1, duration=DURATION, **kw):
    sc = make_scenario(servers=servers, duration=duration, warmup=WARMUP, seed=seed,
                       service={"kind": "exponential", "mean_ms": MEAN_MS}, **kw)
    if "arrival" not in kw:  # closed only
        del sc["workload"]["arrival"]
    sc["workload"]["clients"] = {"population": population,
                                 "think": think or {"kind": "exponential", "mean_ms": THINK_MS}}
    return sc


def _all(result):
    return result.summary.filter(result.summary["tier"] == "all").row(0, named=True)


# (clients, what it is): M/M/4//N with S = 10 ms, Z = 1 s: the knee N* = (Z + S) / S x c
# = 404; utilisation 0.25, 0.92, 1.00
POINTS = [(100, "light"), (380, "near the knee"), (800, "saturated")]


@pytest.mark.parametrize("population,label", POINTS)
def test_throughput_and_response_match_finite_source(population, label):
    exact = finite_source(population, THINK_MS / 1000, 1000 / MEAN_MS, SERVERS)
    xs, rs, p99s = [], [], []
    for seed in replication_seeds(7, 10):
        s = _all(relakit.simulate(closed(population, seed=seed), record_requests=False))
        xs.append(s["requests"] / (DURATION - WARMUP))
        rs.append(s["mean_ms"] / 1000)
        p99s.append(s["p99_ms"] / 1000)
    x, r, p99 = t_interval(xs), t_interval(rs), t_interval(p99s)
    # the p99 (by the arrival theorem) too, within 3 %: its interval is the widest
    for name, ci, want, tol in (("throughput", x, exact.throughput, 0.02),
                                ("mean response", r, exact.mean_response, 0.02),
                                ("p99 response", p99, exact.response_quantile(0.99), 0.03)):
        assert abs(ci.low / want - 1) <= tol and abs(ci.high / want - 1) <= tol, (
            f"{label}: {name} {ci} against M/M/c//N {want:.6g}")
    # the interactive response-time law on the measured numbers: R = N / X - Z
    law = [population / xi - THINK_MS / 1000 for xi in xs]
    assert t_interval(law).low <= np.mean(rs) * 1.02 and t_interval(law).high >= np.mean(rs) * 0.98


def test_a_closed_fleet_runs_the_general_loop_as_chosen_and_as_forced(monkeypatch):
    """Closed clients are the general loop's alone (the plain and lean loops fold them
    away): the fleet's own choice and the general loop forced give the same run."""
    from relakit.scenario import load_scenario
    from relakit.sim import kernel as K
    from relakit.sim.fleet import Fleet

    sc = closed({"gold": 7, "bronze": 30}, duration=60,
                think={"gold": {"kind": "deterministic", "mean_ms": 80},
                       "bronze": {"kind": "lognormal", "mean_ms": 300, "cv": 1.5}},
                arrival={"kind": "poisson", "rate_rps": 50})
    assert Fleet(load_scenario(sc))._choose()[0] is K.run
    lean = relakit.simulate(sc)
    monkeypatch.setattr(Fleet, "specialise", False)
    general = relakit.simulate(sc)
    assert lean.requests.height > 5000
    assert lean.requests.equals(general.requests)
    assert lean.summary.equals(general.summary)


def test_a_run_split_into_many_advances_is_the_same_run():
    from relakit.scenario import load_scenario
    from relakit.sim.fleet import Fleet

    sc = load_scenario(closed(30, duration=30))
    one = Fleet(sc).advance(30.0).result()
    fleet = Fleet(sc)
    for t in np.linspace(0.37, 30.0, 41):
        fleet.advance(float(t))
    assert one.requests.equals(fleet.result().requests)


def test_each_client_waits_for_its_outcome_through_deadline_and_retries():
    """Eight clients on one server of 10 ms (at most 0.4 of it if answers were instant), a
    50 ms deadline and three attempts: some requests succeed on a retry, some time out
    after all three. Whatever the outcome, a client has one request at a time, so
    N = X (E[latency over every outcome] + Z) (the law behind R = N / X - Z), and the
    requests in flight never exceed N."""
    n, think_ms = 8, 200.0
    sc = closed(n, servers=1, duration=600, think={"kind": "exponential", "mean_ms": think_ms},
                deadline_ms=50)
    sc["mitigations"] = {"retries": {"max_attempts": 3, "backoff_ms": 5}}
    r = relakit.simulate(sc)
    req = r.requests.filter(r.requests["arrival_s"] >= WARMUP)
    outcomes = set(req["outcome"].unique())
    assert {"ok", "timeout"} <= outcomes
    assert req["attempts"].max() == 3
    x = req.height / (600 - WARMUP)
    cycle = req["latency_ms"].mean() / 1000 + think_ms / 1000
    assert x * cycle == pytest.approx(n, rel=0.02)
    assert r.info["in_flight_at_end"] <= n


def test_tiers_keep_their_own_populations_and_think_times_beside_open_arrivals():
    """Per tier: gold 10 clients thinking 100 ms, bronze 40 thinking 1 s, plus 30 req/s of
    open arrivals all silver (the mix): at light load each closed tier sends
    N / (Z + R) and silver the open rate."""
    sc = closed({"gold": 10, "bronze": 40}, duration=400,
                think={"gold": {"kind": "exponential", "mean_ms": 100},
                       "bronze": {"kind": "deterministic", "mean_ms": 1000}},
                arrival={"kind": "poisson", "rate_rps": 30},
                tiers={"gold": 0, "silver": 1, "bronze": 0})
    r = relakit.simulate(sc)
    req = r.requests.filter(r.requests["arrival_s"] >= WARMUP)
    span = 400 - WARMUP
    for tier, n, z in (("gold", 10, 0.1), ("bronze", 40, 1.0)):
        t = req.filter(req["tier"] == tier)
        law = n / (t.height / span) - z
        assert law == pytest.approx(t["latency_ms"].mean() / 1000, abs=0.004), tier
    silver = req.filter(req["tier"] == "silver").height / span
    assert silver == pytest.approx(30, rel=0.05)


def test_bad_clients_are_refused_by_key():
    bad = closed(0)
    with pytest.raises(ScenarioError, match="key 'workload.clients.population'"):
        relakit.simulate(bad)


def test_the_dashboard_says_a_closed_populations_load_is_an_outcome():
    from relakit import plots

    r = relakit.simulate(closed(40, duration=60), record_requests=False)
    spec = plots.run_dashboard(r).to_dict()
    subtitle = spec["vconcat"][0]["title"]["subtitle"]
    assert any("40 closed clients" in line and "outcome of the run" in line
               for line in subtitle)
    assert "closed clients" in r.format_summary() and "outcome of the run" in r.format_summary()
    assert subtitle[0].startswith("from the clients' counters")  # no records: counters
    # with records, the first line names what is counted: the requests the clients sent
    # (plots.offered_load_subtitle), never "arrivals", which a closed population has none of
    r = relakit.simulate(closed(40, duration=60))
    lines = plots.run_dashboard(r).to_dict()["vconcat"][0]["title"]["subtitle"]
    assert lines[0] == "requests sent per second, 10 s bins"
    assert not any("arrivals" in line for line in lines)
    assert plots.offered_load_subtitle("requests", 5.0) == "arrivals per second, 5 s bins"


@pytest.mark.parametrize(("clients", "servers"), [(1, 1), (20, 1), (380, 4), (800, 4)])
def test_the_response_time_tail_integrates_to_the_mean_and_one_client_is_exponential(
        clients, servers):
    """The M/M/c//N response-time tail (drawn by ``simulate --figure``): its area is the
    mean response time (E[R] = integral of P(R > t)), and one client never queues, so its
    response time is the service's exponential."""
    from scipy.integrate import quad

    m = finite_source(clients, THINK_MS / 1000, 1000 / MEAN_MS, servers)
    area, _ = quad(lambda t: m.response_sf(t)[0], 0, np.inf, limit=200)
    assert area == pytest.approx(m.mean_response, rel=1e-4)
    if clients == 1:
        t = np.array([0.0, 0.005, 0.01, 0.05])
        np.testing.assert_allclose(m.response_sf(t), np.exp(-t * 1000 / MEAN_MS), rtol=1e-12)
