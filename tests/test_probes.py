"""Silent failures caught by correctness probes (issue 16, item 5): the kernel's probes,
the chain isolating on them, and the detection delay's closed form against simulation."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest
from conftest import ROOT, make_scenario

from relakit.analytic import probe_cost, probe_detection, wrong_before_isolation
from relakit.experiment import simulate
from relakit.probes import detection_runs, probe_report
from relakit.replications import replication_seeds
from relakit.scenario import load_scenario
from relakit.stats import t_interval

SCEN = ROOT / "params" / "scenarios"
PROBES = SCEN / "chain-silent-probes.yaml"


def _last(result, name):
    m = result.metrics.filter(pl.col("name") == name)
    return m.group_by("node").agg(pl.col("value").max()).sort("node")["value"].to_numpy()


@pytest.fixture(scope="module")
def open_loop():
    """Open loop, 4 nodes, node 1 answers 40 % wrongly all along: with and without probes."""
    base = make_scenario(rate=800, nodes=4, servers=4, duration=200, seed=5,
                         faults=[{"node": 1, "start_s": 0, "end_s": 1000, "wrong_rate": 0.4}])
    with_probes = load_scenario(base, overrides={"fleet.probes": {"rate_rps": 5}})
    return simulate(load_scenario(base)), simulate(with_probes)


def test_probes_are_counted_apart_with_their_answers_checked(open_loop):
    off, on = open_loop
    probes, failed = _last(on, "probe_requests_total"), _last(on, "probe_failures_total")
    # 5 a second per node for 200 s: Poisson(1000) each, within 4 sd
    assert np.all(np.abs(probes - 1000) < 4 * math.sqrt(1000))
    assert failed[[0, 2, 3]].sum() == 0
    assert abs(failed[1] / probes[1] - 0.4) < 4 * math.sqrt(0.24 / probes[1])
    assert _last(off, "probe_requests_total").sum() == 0  # off by default
    # probes never reach requests_total nor the users' summary
    req = lambda r: r.metrics.filter(pl.col("name") == "requests_total").group_by(  # noqa: E731
        "node", "tier", "outcome").agg(pl.col("value").max())["value"].sum()
    assert req(on) == on.summary.filter(pl.col("tier") == "all")["requests"][0]
    assert off.summary["requests"].to_list() == on.summary["requests"].to_list()


def test_probes_cost_load_like_requests(open_loop):
    off, on = open_loop
    extra = _last(on, "busy_seconds_total").sum() - _last(off, "busy_seconds_total").sum()
    expect = _last(on, "probe_requests_total").sum() * 0.010  # mean service 10 ms
    assert abs(extra - expect) < 0.1 * expect


def test_probes_leave_the_users_dice_alone(open_loop):
    """Own random stream: arrivals, tiers and service demands are the same with probes on."""
    off, on = open_loop
    cols = ["arrival_s", "tier", "service_ms"]
    a, b = (r.requests.sort("arrival_s").select(cols) for r in (off, on))  # completion order
    assert a.equals(b)


def test_a_crashed_node_fails_every_probe():
    sc = load_scenario(make_scenario(rate=200, nodes=2, servers=2, duration=60, faults=[
        {"node": 0, "start_s": 0, "end_s": 1000, "crash": True}]),
        overrides={"fleet.probes": {"rate_rps": 3}})
    r = simulate(sc)
    probes, failed = _last(r, "probe_requests_total"), _last(r, "probe_failures_total")
    assert probes[0] > 100 and failed[0] == probes[0] and failed[1] == 0


@pytest.fixture(scope="module")
def caught():
    sc = load_scenario(PROBES)
    return sc, simulate(sc)


def test_chain_silent_is_caught_by_probes(caught):
    sc, r = caught
    rep = probe_report(sc, r)
    assert rep["detected"] == 1 and 0 < rep["detection_delay_s"] < 20
    iso = r.decisions.filter((pl.col("action") == "isolate") & (pl.col("target") == "node 2"))
    assert iso["signal"][0] == "probe_failure_ratio" and iso["threshold"][0] == 0.1
    assert "threshold: fixed, probes" in iso["reason"][0] and "baseline" in iso["reason"][0]
    # no other node is touched; the probes cost what the closed form says
    assert set(r.decisions.filter(pl.col("action") == "isolate")["target"]) == {"node 2"}
    assert rep["probe_cost"] == pytest.approx(probe_cost(2, 0.010, 4), rel=0.05)
    # the wrong answers served: a few hundred before isolation, instead of thousands
    blind = simulate(load_scenario(SCEN / "chain-silent.yaml"))
    assert rep["wrong_before_isolation"] < 0.1 * blind.summary.filter(
        pl.col("tier") == "all")["wrong"][0]
    assert r.summary.filter(pl.col("tier") == "all")["wrong"][0] < 0.1 * blind.summary.filter(
        pl.col("tier") == "all")["wrong"][0]


def test_too_few_probes_are_not_judged():
    sc = load_scenario(PROBES, overrides={"fleet.probes.rate_rps": 0.2, "duration_s": 120})
    r = simulate(sc)
    assert r.decisions.filter(pl.col("action") == "isolate").height == 0
    hold = r.decisions.filter((pl.col("action") == "hold") & (pl.col("signal") == "probe_volume"))
    assert hold.height > 0 and (hold["value"] < 10).all()


@pytest.mark.parametrize("rate,wrong,k,m", [(2, 0.3, 0.1, 10), (5, 0.15, 0.05, 20)])
def test_detection_delay_closed_form_against_simulation(rate, wrong, k, m):
    """20 replications, the onset moved by U(0, 10 s) (phases independent of it): the
    closed form's mean lies in the simulated mean's 95 % interval, and so does the
    closed form's count of wrong answers served before isolation."""
    runs = detection_runs(PROBES, replications=20, onset_jitter_s=10.0, overrides={
        "duration_s": 120, "fleet.probes.rate_rps": rate,
        "faults": [{"node": 2, "start_s": 60, "end_s": 1000, "wrong_rate": wrong}],
        "chain.aegis.wrong_threshold": k, "chain.aegis.min_probe_volume": m})
    assert runs["detected"].min() == 1
    cf = probe_detection(rate, wrong, k, window_s=20, scrape_s=5, eval_s=2, min_volume=m)
    sim = t_interval(runs["detection_delay_s"].to_numpy())
    assert sim.low < cf.mean < sim.high, (sim, cf.mean)
    assert 0.6 < runs["detection_delay_s"].std() / cf.sd < 1.5
    # the config poll coincides with the evaluation here (poll_s = eval_s = 2)
    assert (runs["effective_delay_s"] - runs["detection_delay_s"]).abs().max() < 1e-9
    served = t_interval(runs["wrong_before_isolation"].to_numpy())
    expect = wrong_before_isolation(1500 / 6, wrong, cf.mean)
    assert served.low < expect < served.high, (served, expect)


def test_detection_delay_closed_form_limits():
    d = probe_detection(2, 0.3, 0.1, window_s=20, scrape_s=5, eval_s=2, min_volume=10)
    assert d.detectable and d.span_s == 15
    # with very many probes the lead is the fluid one, k S / w
    big = probe_detection(1e4, 0.3, 0.1, window_s=20, scrape_s=5, eval_s=2)
    assert big.mean == pytest.approx(big.fluid_lead_s + 2.5 + 1.0, rel=1e-3)
    assert d.mean > d.fluid_lead_s + 3.5  # few probes: the n-th failure comes later
    cdf = d.cdf([0.0, d.mean, 200.0])
    assert cdf[0] == 0 and 0.3 < cdf[1] < 0.7 and cdf[2] == pytest.approx(1, abs=1e-3)
    with pytest.raises(ValueError, match="never exceeds the threshold"):
        probe_detection(2, 0.05, 0.1, 20, 5, 2)
    with pytest.raises(ValueError, match="minimum volume"):
        probe_detection(0.01, 0.5, 0.1, 20, 5, 2, min_volume=50)


def test_delay_cdf_figure_draws_the_closed_form_as_a_line_and_the_runs_as_steps():
    from relakit.plots import delay_cdf_figure, delay_cdf_frames

    d = probe_detection(2, 0.3, 0.1, window_s=20, scrape_s=5, eval_s=2, min_volume=10)
    closed, sim = delay_cdf_frames(d, [9.0, 11.0, 7.5])
    assert sim["cdf"].to_list() == pytest.approx([0, 1 / 3, 2 / 3, 1])
    assert closed["cdf"].is_sorted() and closed["cdf"][-1] > 0.99
    spec = delay_cdf_figure(d, [9.0, 11.0, 7.5], "t").to_dict()
    band, *rest = spec["layer"]
    views = [v for r in rest for v in r.get("layer", [r])]
    assert views[0]["encoding"]["x"]["title"] == "delay from the onset to isolation (s)"
    assert views[1]["mark"]["interpolate"] == "step-after"
    legends = [v["encoding"]["strokeDash"]["scale"]["domain"][0] for v in views]
    assert legends[0].startswith("closed form") and legends[1].startswith("simulated (3")
    # the replications' band is drawn, and the figure says what it is and that it is cut off
    assert band["mark"]["type"] == "area" and "y2" in band["encoding"]
    rows = spec["datasets"][band["data"]["name"]]
    assert min(r["low"] for r in rows) >= 0 and max(r["high"] for r in rows) <= 1
    assert "95 % band" in spec["title"]["subtitle"] and "cut off" in spec["title"]["subtitle"]


@pytest.mark.parametrize("mechanism", [
    {"concurrency_limit": {"algorithm": "aimd", "initial": 50, "min": 50, "max": 50,
                           "cost_us": 2000}},
    {"codel": {"target_ms": 5, "interval_ms": 100, "cost_us": 2000}}])
def test_a_probes_service_does_not_depend_on_the_queue_ahead(mechanism):
    """One server, 10 ms fixed demand, probes at 40 a second (utilisation 0.4: in an M/D/1
    queue 40 % of them wait) beside a trickle of user requests, with a server-side in-path
    mechanism whose decisions cost 2 ms. A probe, judged by no in-path mechanism, pays no
    decision cost whether it started at once (a probe's start_service) or after a queue
    (the loop's "start service"); a user request pays it. So whenever the node is idle at a
    sample, its busy seconds are exactly probes x 10 ms + requests served x 12 ms (the old code
    charged the 2 ms to every probe that had waited: ~0.4 x 4,000 x 2 ms too much)."""
    base = make_scenario(rate=2, nodes=1, servers=1, duration=100, seed=11,
                         service={"kind": "deterministic", "mean_ms": 10})
    sc = load_scenario({**base, "mitigations": mechanism},
                       overrides={"fleet.probes": {"rate_rps": 40}})
    m = simulate(sc).metrics.filter(pl.col("node") == 0)
    wide = m.group_by("time_s", "name").agg(pl.col("value").sum()).pivot(
        on="name", index="time_s").sort("time_s")
    idle = wide.filter((pl.col("busy_servers") == 0) & (pl.col("queue_length") == 0))
    assert idle.height > 40 and wide["queue_length"].max() >= 1  # it idled, it queued
    assert idle["probe_requests_total"][-1] > 3500 and idle["requests_total"][-1] > 100
    served = idle["requests_total"] - idle["rejected_total"]  # (CoDel's drops: no service)
    expect = idle["probe_requests_total"] * 0.010 + served * 0.012
    np.testing.assert_allclose(idle["busy_seconds_total"].to_numpy(), expect.to_numpy(),
                               rtol=1e-9, atol=1e-9)


def test_codel_sees_probes_leave_the_queue():
    """CoDel judges the queue's standing delay, so a probe's dequeue updates its state like a
    request's (RFC 8289: every dequeue); it only never drops a probe. One server, 10 ms fixed
    demand, CoDel 5 ms / 100 ms, utilisation 0.42 either way: 10 requests + 32 probes a second
    drop about the share of requests that 42 requests a second alone do (~0.1 %, five
    replications each). The old code, blind to probes' dequeues, thought the node congested
    after a stretch of probes only and dropped ~10 % of the requests (102 of ~1,000 a run)."""
    def shares(requests, probes):
        out = []
        for seed in replication_seeds(11, 5):
            base = make_scenario(rate=requests, nodes=1, servers=1, duration=100, seed=seed,
                                 service={"kind": "deterministic", "mean_ms": 10})
            sc = load_scenario({**base, "mitigations": {"codel": {"target_ms": 5,
                                                                   "interval_ms": 100}}},
                               overrides={"fleet.probes": {"rate_rps": probes}} if probes else {})
            r = simulate(sc)
            assert r.info["user_requests"] > 0.9 * requests * 100
            out.append(r.info["codel_dropped"] / r.info["user_requests"])
        return np.array(out)
    mixed, alone = shares(10, 32), shares(42, 0)
    assert alone.max() > 0  # CoDel does drop at this load: the comparison is not 0 vs 0
    diff = t_interval(mixed - alone)
    assert diff.low <= 0.0 <= diff.high, (mixed, alone)
    assert t_interval(mixed).high < 0.01, mixed  # (the old code: ~0.10)
