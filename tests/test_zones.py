"""Zones and sharded controllers (issue 16, item 3): `fleet.zones`, policy `scope`.

An overload in one zone (params/scenarios/zones-overload.yaml): with one fleet-wide
controller the other zones are shed, degraded and hedged too; with one controller
per zone they are not. The blast radius is measured over replications on common
seeds and its paired difference must exclude zero.
"""

from __future__ import annotations

import math

import polars as pl
import pytest
from conftest import ROOT

import relakit
from relakit.experiment import replicate_zoned
from relakit.experiment import run_once as run_zoned
from relakit.experiment import simulate as simulate_fleet
from relakit.scenario import load_scenario
from relakit.stats import paired_difference
from relakit.zones import ZonedResult, zone_scenario

SCENARIO = ROOT / "params" / "scenarios" / "zones-overload.yaml"
REPS = 4


def scoped(scope: str):
    return load_scenario(SCENARIO, overrides={"policy.scope": scope})


def test_a_zone_gets_its_nodes_faults_and_share_of_arrivals():
    sc = load_scenario(SCENARIO, overrides={"fleet.zone_mix": [0.5, 0.25, 0.25]})
    z0, z2 = zone_scenario(sc, 0), zone_scenario(sc, 2)
    assert z0.fleet.nodes == 4 and [f.node for f in z0.faults] == [0, 1, 2, 3]
    assert z2.faults == () and z2.fleet.servers == sc.fleet.servers[8:12]
    assert z0.workload.arrival.rates_rps[0] == pytest.approx(1350 * 0.5)
    assert z2.workload.arrival.rates_rps[0] == pytest.approx(1350 * 0.25)


def test_arrivals_split_by_zone_mix():
    sc = load_scenario(SCENARIO, overrides={"fleet.zone_mix": [0.5, 0.25, 0.25],
                                            "duration_s": 60, "faults": []})
    t = run_zoned(sc).by_zone().filter(pl.col("tier") == "all").sort("zone")
    n = t["requests"].to_list()
    for share, got in zip([0.5, 0.25, 0.25], n, strict=True):
        mean = 1350 * 60 * share  # Poisson: within 4 standard deviations
        assert abs(got - mean) < 4 * math.sqrt(mean), (got, mean)


def test_relakit_simulate_runs_a_zoned_fleet_as_zones_never_as_one_fleet():
    """relakit.simulate (the one simulate: relakit.experiment's) runs a zoned scenario as
    run_once does, on the same seed, as zones: never the zones as one fleet."""
    sc = load_scenario(SCENARIO, overrides={"duration_s": 30, "faults": []})
    assert relakit.simulate is simulate_fleet
    a, b = relakit.simulate(sc, record_requests=True), run_zoned(sc, record_requests=True)
    assert isinstance(a, ZonedResult) and a.summary.equals(b.summary)
    assert a.requests.equals(b.requests)
    with pytest.raises(ValueError, match="key 'replications': a zoned fleet runs one"):
        simulate_fleet(sc, replications=2)


@pytest.fixture(scope="module")
def runs():
    return {s: run_zoned(scoped(s)) for s in ("fleet", "zone")}


def test_audit_rows_carry_the_zone(runs):
    fleet, zone = runs["fleet"].decisions, runs["zone"].decisions
    assert fleet["zone"].null_count() == fleet.height > 0  # the fleet-wide controller
    survival = zone.filter(pl.col("mode") == "survival")
    assert set(survival["zone"].to_list()) == {0}  # only the overloaded zone's controller
    first = survival["decided_at_s"].min()
    assert 60 < first < 100  # after the slowdown at 60 s, within its first 40 s


def test_global_control_reaches_zones_that_were_fine(runs):
    by = {s: r.by_zone().filter(pl.col("tier") == "bronze") for s, r in runs.items()}
    for z in (1, 2):
        assert by["fleet"].filter(pl.col("zone") == z)["dropped"].item() > 1000
        assert by["zone"].filter(pl.col("zone") == z)["dropped"].item() == 0
    assert by["zone"].filter(pl.col("zone") == 0)["dropped"].item() > 1000


def test_per_zone_control_has_a_smaller_blast_radius_with_an_interval():
    a = replicate_zoned(scoped("fleet"), REPS)
    b = replicate_zoned(scoped("zone"), REPS)
    assert a["seed"].to_list() == b["seed"].to_list()  # paired on common seeds
    d = paired_difference(a["blast_radius"], b["blast_radius"])
    assert d.interval.low > 0, d  # global control touches more requests outside zone 0
    share = d.mean_a / a["outside_requests"].mean()
    assert share > 0.2  # a fifth of the healthy zones' requests, at least
    assert b["outside_shed"].max() == 0 and b["outside_degraded"].max() == 0
    # and it buys the healthy zones' gold nothing: they keep it without shedding
    assert b["gold_success_outside"].min() >= a["gold_success_outside"].min() - 1e-3 > 0.99


def test_a_zone_gets_its_nodes_service_scale_and_baseline_errors():
    """Per-node lists are sliced to the zone's nodes: fleet.service_scale (zone 1's nodes
    twice as slow) and fleet.baseline_error_rate (before, the zone's fleet kept the whole
    fleet's list, and its kernel rows named nodes outside the zone)."""
    from relakit.sim.fleet import build_config

    sc = load_scenario(SCENARIO, overrides={
        "fleet.service_scale": [1.0] * 4 + [2.0] * 4 + [1.0] * 4,
        "fleet.baseline_error_rate": [0.0] * 8 + [0.01] * 4, "duration_s": 60, "faults": []})
    z1, z2 = zone_scenario(sc, 1), zone_scenario(sc, 2)
    assert z1.fleet.service_scale == (2.0,) * 4 and z1.fleet.baseline_error_rates == (0.0,) * 4
    assert z2.fleet.baseline_error_rates == (0.01,) * 4
    assert z1.fleet.node_mean_ms == tuple(2 * m for m in z2.fleet.node_mean_ms)
    for z in (z1, z2):
        assert build_config(z, False).fault_i[:, 0].max() < z.fleet.nodes
    t = run_zoned(sc).by_zone().filter(pl.col("tier") == "all").sort("zone")
    mean = dict(zip(t["zone"].to_list(), t["mean_ms"].to_list(), strict=True))
    assert mean[1] > 1.5 * mean[0], mean  # the slow zone's requests take about twice as long
