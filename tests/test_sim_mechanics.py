"""The kernel's mechanisms one by one: stepping, routing, controls, faults, deadlines,
arrival profiles and the sampled metrics, each with an effect that could fail."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest
from conftest import ROOT, make_scenario

import relakit
from relakit import Fleet, load_scenario


def _counts_by_node(result) -> np.ndarray:
    """Sub-requests each node received: finished (counters) plus still in flight."""
    m = result.metrics.filter(pl.col("name").is_in(["requests_total", "in_flight"]))
    last = m.filter(pl.col("time_s") == m["time_s"].max())
    return last.group_by("node").agg(pl.col("value").sum()).sort("node")["value"].to_numpy()


def test_stepping_in_uneven_pieces_equals_one_run():
    sc = load_scenario(make_scenario(rate=2000, duration=30, nodes=5, servers=2,
                                     routing="jsq", deadline_ms=30))
    whole = relakit.simulate(sc)
    fleet = Fleet(sc)
    for t in (0.3, 0.30001, 7.7, 8.0, 19.123, 29.9, 30.0):
        fleet.advance(t)
    pieces = fleet.result()
    assert whole.requests.equals(pieces.requests)
    assert whole.metrics.equals(pieces.metrics)
    assert whole.summary.equals(pieces.summary)
    with pytest.raises(ValueError, match="already at"):
        fleet.advance(1.0)


def test_memory_stays_flat_without_records():
    def pools(duration):
        fleet = Fleet(load_scenario(make_scenario(rate=700, duration=duration, servers=8,
                                                  interval=duration)),
                      record_requests=False)
        fleet.advance(duration)
        return (fleet.st.job_i.shape, fleet.st.usr_i.shape, fleet.st.heap_t.shape,
                fleet.out.rec_f.shape, fleet.out.metrics.shape)

    short, long = pools(20.0), pools(2000.0)
    # 100x the requests: pools follow the peak concurrency (a rarer peak may double
    # them once), never the number of requests; no records; the grid is set by interval
    for a, b in zip(short[:3], long[:3], strict=True):
        assert b[0] <= 2 * a[0]
    assert short[3][0] == long[3][0] == 0
    assert short[4] == long[4]


def test_round_robin_spreads_exactly_evenly():
    r = relakit.simulate(make_scenario(rate=500, duration=20, nodes=7, servers=4,
                                       routing="round_robin"))
    counts = _counts_by_node(r)
    assert counts.max() - counts.min() <= 1


def test_weights_steer_random_and_round_robin_traffic():
    for routing in ("random", "round_robin"):
        r = relakit.simulate(make_scenario(rate=1000, duration=50, nodes=3, servers=16,
                                           routing=routing, weights=[1, 2, 5]))
        share = _counts_by_node(r) / _counts_by_node(r).sum()
        np.testing.assert_allclose(share, [1 / 8, 2 / 8, 5 / 8], atol=0.01)


def test_jsq_and_two_choices_beat_random_routing_near_saturation():
    means = {}
    for routing in ("random", "p2c", "jsq"):
        sc = make_scenario(rate=8 * 90, duration=200, nodes=8, servers=1, routing=routing,
                           warmup=10)
        means[routing] = relakit.simulate(sc, record_requests=False).summary["mean_ms"][-1]
    # random over 8 M/M/1 at 0.9 gives 100 ms; two choices cut it to about 26 ms in the
    # mean-field limit (sum of 0.9^(2^i - 2) service times), a little more at 8 nodes
    assert means["random"] == pytest.approx(100, rel=0.15)
    assert 26 < means["p2c"] < means["random"] / 2.5
    assert means["jsq"] < means["p2c"]


def test_an_unroutable_node_gets_nothing_new():
    sc = load_scenario(make_scenario(rate=800, duration=40, nodes=4, servers=2))
    fleet = Fleet(sc)
    fleet.advance(20.0)
    fleet.set_node_controls(2, routable=False)
    fleet.advance(40.0)
    r = fleet.result()
    late = r.requests.filter(pl.col("arrival_s") > 20.0)
    assert late.height > 10000
    assert (late["node"] != 2).all()
    assert (r.requests.filter(pl.col("arrival_s") < 20.0)["node"] == 2).sum() > 3000
    assert not fleet.node_controls()["routable"][2]


def test_intake_limit_caps_in_flight_and_drops_the_excess():
    sc = load_scenario(make_scenario(rate=1500, duration=20, nodes=1, servers=4))
    fleet = Fleet(sc)
    fleet.set_node_controls(0, intake_limit=6)
    fleet.advance(20.0)
    r = fleet.result()
    in_flight = r.metrics.filter(pl.col("name") == "in_flight")["value"]
    assert in_flight.max() <= 6
    s = r.summary.filter(pl.col("tier") == "all").row(0, named=True)
    assert s["dropped"] > 0.3 * s["requests"]  # offered 1.5x capacity
    assert s["error"] == 0


def test_shedding_drops_bronze_and_never_gold():
    sc = load_scenario(make_scenario(rate=600, duration=20, servers=8))
    fleet = Fleet(sc)
    fleet.set_flags(fleet.flag_state().updated(shed_tiers=["bronze", "gold"]))
    fleet.advance(20.0)
    by = {row["tier"]: row for row in fleet.result().summary.iter_rows(named=True)}
    assert by["bronze"]["dropped"] == by["bronze"]["requests"] > 1000
    assert by["gold"]["dropped"] == 0 and by["silver"]["dropped"] == 0
    assert by["all"]["error"] == 0  # drops are not errors
    with pytest.raises(ValueError, match="unknown tier"):
        fleet.set_flags(fleet.flag_state().updated(shed_tiers=["copper"]))


def test_crash_fails_the_node_for_its_window_only():
    faults = [{"node": 1, "start_s": 10, "end_s": 20, "crash": True}]
    r = relakit.simulate(make_scenario(rate=400, duration=30, nodes=4, servers=4,
                                       faults=faults))
    req = r.requests
    errors = req.filter(pl.col("outcome") == "error")
    assert (errors["node"] == 1).all()
    during = req.filter((pl.col("node") == 1) & pl.col("arrival_s").is_between(10.01, 19.99))
    assert during.height > 500 and (during["outcome"] == "error").all()
    outside = req.filter((pl.col("node") == 1) & ((pl.col("arrival_s") < 9.9)
                                                  | (pl.col("arrival_s") > 20)))
    assert (outside["outcome"] == "ok").all()


def test_error_rate_fault_fails_that_share_of_the_nodes_requests():
    faults = [{"node": 0, "start_s": 0, "end_s": 100, "error_rate": 0.3}]
    r = relakit.simulate(make_scenario(rate=400, duration=100, nodes=2, servers=4,
                                       faults=faults))
    on0 = r.requests.filter(pl.col("node") == 0)
    share = (on0["outcome"] == "error").mean()
    assert abs(share - 0.3) < 5 * math.sqrt(0.3 * 0.7 / on0.height)
    assert (r.requests.filter(pl.col("node") == 1)["outcome"] == "ok").all()


def test_slowdown_stretches_service_on_its_node():
    faults = [{"node": 0, "start_s": 0, "end_s": 100, "slowdown": 4.0}]
    r = relakit.simulate(make_scenario(rate=20, duration=100, nodes=2, servers=16,
                                       faults=faults))
    mean = r.requests.group_by("node").agg(pl.col("latency_ms").mean()).sort("node")
    ratio = mean["latency_ms"][0] / mean["latency_ms"][1]
    assert ratio == pytest.approx(4.0, rel=0.15)


def test_deadline_turns_slow_requests_into_timeouts_at_the_deadline():
    sc = make_scenario(rate=50, duration=20, servers=4, deadline_ms=5,
                       service={"kind": "deterministic", "mean_ms": 10})
    r = relakit.simulate(sc)
    assert (r.requests["outcome"] == "timeout").all()
    np.testing.assert_allclose(r.requests["latency_ms"].to_numpy(), 5.0, rtol=1e-9)
    # the servers still did the work: the node counts those completions as late
    counters = r.metrics.filter((pl.col("name") == "requests_total")
                                & (pl.col("time_s") == r.metrics["time_s"].max()))
    assert counters.filter(pl.col("outcome") == "timeout")["value"].sum() >= r.requests.height - 1


def test_counters_are_monotone_and_sum_to_the_records():
    r = relakit.simulate(make_scenario(rate=900, duration=30, nodes=3, servers=3,
                                       faults=[{"node": 0, "start_s": 5, "end_s": 15,
                                                "error_rate": 0.2}]))
    c = r.metrics.filter(pl.col("name") == "requests_total").sort("time_s")
    diffs = c.group_by(["node", "tier", "outcome"], maintain_order=True).agg(
        pl.col("value").diff().min().alias("min_step"))
    assert diffs["min_step"].min() >= 0
    final = c.filter(pl.col("time_s") == c["time_s"].max()).group_by(["tier", "outcome"]).agg(
        pl.col("value").sum())
    rec = r.requests.group_by(["tier", "outcome"]).len()
    joined = final.join(rec, on=["tier", "outcome"], how="left").fill_null(0)
    assert (joined["value"] == joined["len"]).all()
    assert joined["value"].sum() == r.requests.height > 20000


def test_busy_seconds_give_the_utilisation():
    r = relakit.simulate(make_scenario(rate=600, duration=200, servers=8))
    busy = r.metrics.filter(pl.col("name") == "busy_seconds_total")
    assert busy["value"].max() / (8 * 200) == pytest.approx(0.75, rel=0.02)
    assert r.info["utilisation"] == pytest.approx(0.75, rel=0.02)


@pytest.mark.parametrize("arrival", [
    {"kind": "step", "rate_rps": 200, "to_rps": 800, "at_s": 50},
    {"kind": "spike", "rate_rps": 200, "peak_rps": 1000, "start_s": 40, "width_s": 10},
    {"kind": "ramp", "from_rps": 100, "to_rps": 900, "start_s": 10, "end_s": 90},
    {"kind": "diurnal", "mean_rps": 400, "amplitude": 0.8, "period_s": 50},
    {"kind": "trace", "points": [[0, 100], [30, 700], [60, 300]], "interpolation": "step"},
])
def test_time_varying_arrivals_follow_their_rate(arrival):
    sc = load_scenario(make_scenario(arrival=arrival, duration=100, servers=64,
                                     service={"kind": "deterministic", "mean_ms": 1}))
    r = relakit.simulate(sc)
    counts, edges = np.histogram(r.requests["arrival_s"].to_numpy(), bins=20, range=(0, 100))
    grid = np.linspace(0, 100, 20 * 200 + 1)
    rate = sc.workload.arrival.rate_at(grid)
    expected = np.array([np.trapezoid(rate[i * 200:(i + 1) * 200 + 1], grid[i * 200:(i + 1) * 200
                                                                           + 1])
                         for i in range(20)])
    assert np.all(np.abs(counts - expected) < 5 * np.sqrt(expected) + 5)


@pytest.mark.parametrize("path", sorted((ROOT / "params" / "scenarios").glob("*.yaml")),
                         ids=lambda p: p.stem)
def test_every_shipped_scenario_loads_and_runs(path):
    overrides = {"duration_s": 30.0, "warmup_s": 0.0}
    if "control_plane:" in path.read_text():  # its intervals must end within the run
        overrides["control_plane"] = {}
    if "\nrollout:" in path.read_text():  # start the canary at once: one observation in 30 s
        overrides["rollout.start_s"] = 0
    if "\noverrides:" in path.read_text():  # their intervals must end within the run
        overrides["overrides"] = None
    sc = load_scenario(path, overrides=overrides)
    r = relakit.simulate(sc)
    assert r.requests.height > 0
    assert r.summary["requests"][-1] > 0
