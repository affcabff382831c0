"""Progressive rollout of a policy change, and overrides (issue 16, item 4).

params/scenarios/rollout-promote.yaml: RelA's hedging rolled out on zone 0 against a
policy that never hedges, one slow node per zone: promoted at the first observation.
params/scenarios/rollout-rollback.yaml: an eager-shedding RelA on a canary cell of a
quarter of the fleet: rolled back at the first observation. The numbers asserted
were measured on seeds 16, 1 and 2 (the same step in each).
"""

from __future__ import annotations

import math

import polars as pl
import pytest
from conftest import ROOT

import relakit
from relakit.control.rollout import Condition, bucket_quantile, paired_batches
from relakit.experiment import replicate_rollout as replicate
from relakit.experiment import run_once
from relakit.experiment import run_once as run_rollout
from relakit.experiment import simulate as simulate_fleet
from relakit.rollout import RolloutResult
from relakit.scenario import load_scenario
from relakit.stats import Interval

SCENARIOS = ROOT / "params" / "scenarios"
PROMOTE = SCENARIOS / "rollout-promote.yaml"
ROLLBACK = SCENARIOS / "rollout-rollback.yaml"


@pytest.fixture(scope="module")
def promoted() -> RolloutResult:
    return run_rollout(load_scenario(PROMOTE))


@pytest.fixture(scope="module")
def rolled_back() -> RolloutResult:
    return run_rollout(load_scenario(ROLLBACK))


def _stage(result, stage):
    return result.decisions.filter(pl.col("stage") == stage)


def test_a_better_policy_is_promoted_at_the_first_observation(promoted):
    assert promoted.outcome == {"action": "promote", "at_s": 60.0, "observation": 1}
    rows = _stage(promoted, "rollout")
    assert rows.filter(pl.col("action") == "start")["decided_at_s"].to_list() == [30.0]
    assert rows.filter(pl.col("action") == "promote")["decided_at_s"].to_list() == [60.0]
    assert rows.filter(pl.col("action") == "promote")["target"][0] == "zone 1, zone 2"
    seen = rows.filter(pl.col("action") == "observe")
    assert seen["decided_at_s"].unique().to_list() == [60.0]  # nothing observed after
    assert set(seen["signal"]) == {"success_ratio[all]", "shed_share[all]"}
    assert all("paired slots" in r and "[" in r for r in seen["reason"])
    # the evidence: the whole interval of canary - rest above 0, over six 5 s slots
    first = promoted.observation("success_ratio").filter(pl.col("observation") == 1).row(
        0, named=True)
    assert first["phase"] == "promote" and first["batches"] == 6
    assert 0 < first["low"] < first["diff"] < first["high"] < 0.05, first
    # after the promotion every zone's controller runs the new policy
    after = promoted.decisions.filter((pl.col("stage") == "policy")
                                      & (pl.col("decided_at_s") > 60))
    assert set(after["policy"]) == {"new"} and set(after["zone"]) == {0, 1, 2}


def test_a_worse_policy_is_rolled_back_at_the_first_observation(rolled_back):
    r = rolled_back
    assert r.outcome == {"action": "rollback", "at_s": 60.0, "observation": 1}
    assert r.labels == ["canary cell (nodes 0-3)", "rest (nodes 4-15)"]
    rows = _stage(r, "rollout")
    assert rows.filter(pl.col("action") == "rollback")["decided_at_s"].to_list() == [60.0]
    shed = r.observation("shed_share").row(0, named=True)
    assert shed["phase"] == "rollback" and shed["rest"] == 0.0
    assert 0.5 < shed["low"] <= shed["high"] < 0.7, shed  # bronze is 60 % of arrivals
    # the canary is back on the current policy: it sheds nothing afterwards
    later = r.observation("shed_share").filter(pl.col("phase") == "after")
    assert later.height == 8 and later["canary"].max() == 0.0
    back = r.decisions.filter((pl.col("stage") == "policy") & (pl.col("zone") == 0)
                              & (pl.col("decided_at_s") > 60))
    assert set(back["policy"]) <= {"current"}
    # a quarter of the nodes, a quarter of the arrivals
    n = [int(z.summary.filter(pl.col("tier") == "all")["requests"][0]) for z in r.zones]
    assert n[0] / sum(n) == pytest.approx(0.25, abs=0.01)


def _counter(result, name: str, t: float) -> float:
    m = result.metrics.filter((pl.col("name") == name) & (pl.col("node") == -1)
                              & (pl.col("time_s") <= t))
    return float(m.sort("time_s")["value"][-1])


def test_an_override_holds_against_the_policy(promoted):
    pins = _stage(promoted, "override")
    pin = pins.filter(pl.col("action") == "pin").row(0, named=True)
    assert pin["target"] == "zone 2" and pin["signal"] == "hedge_enabled"
    assert 200 <= pin["decided_at_s"] < 260 and "asked true" in pin["reason"]
    release = pins.filter(pl.col("action") == "release")
    assert release["decided_at_s"].max() == 260.0  # the interval's end
    # zone 2's policy asked for hedging while pinned (performance mode) ...
    z2 = promoted.decisions.filter((pl.col("zone") == 2) & (pl.col("stage") == "policy")
                                   & pl.col("decided_at_s").is_between(pin["decided_at_s"],
                                                                       258))
    assert (z2["mode"] == "performance").sum() > 5
    # ... and sent no hedge; zone 1, not pinned, kept hedging
    lo, hi = pin["decided_at_s"] + 5, 255.0
    hedges = [_counter(z, "hedges_total", hi) - _counter(z, "hedges_total", lo)
              for z in promoted.zones]
    assert hedges[2] == 0 and hedges[1] > 100, hedges


def test_overrides_that_never_contradict_the_policy_change_nothing():
    """The rollout loop on one cell is the closed loop: same seed, same tables."""
    plain = load_scenario(ROLLBACK, overrides={"rollout": None, "duration_s": 120})
    pinned = load_scenario(ROLLBACK, overrides={
        "rollout": None, "duration_s": 120,
        "overrides": [{"flag": "degraded_mode", "value": False}]})  # RelA never degrades here
    a = simulate_fleet(plain, record_requests=True)
    b = relakit.simulate(pinned)
    assert isinstance(b, RolloutResult) and b.labels == ["fleet"]
    assert _stage(b, "override").height == 0
    assert a.summary.equals(b.zones[0].summary)
    assert a.requests.equals(b.zones[0].requests)
    policy_rows = b.decisions.filter(pl.col("stage") == "policy").drop("zone", "policy")
    assert a.decisions.filter(pl.col("stage") == "policy").equals(policy_rows)


def test_a_fleet_wide_override_pins_every_poll():
    """Hedging pinned on in a fleet whose policy asks it off most of the time: every
    request that waits past the hedge delay is hedged, where the policy alone hedged
    a few."""
    base = {"rollout": None, "duration_s": 120}
    free = run_rollout(load_scenario(ROLLBACK, overrides={
        **base, "overrides": [{"flag": "degraded_mode", "value": False}]}))
    r = run_rollout(load_scenario(ROLLBACK, overrides={
        **base, "overrides": [{"flag": "hedge_enabled", "value": True}]}))

    def hedges(res):
        return int(res.zones[0].summary.filter(pl.col("tier") == "all")["hedges"][0])

    assert hedges(r) > 5 * max(hedges(free), 1), (hedges(r), hedges(free))
    pins = _stage(r, "override")
    assert set(pins["target"]) == {"fleet"} and pins["decided_at_s"][0] == 0.0
    assert "asked false" in pins.filter(pl.col("action") == "pin")["reason"][0]


def test_a_scenario_without_rollout_or_overrides_runs_as_before():
    for path in sorted(SCENARIOS.glob("*.yaml")):
        if path.name.startswith("rollout-"):
            continue
        sc = load_scenario(path)
        assert sc.rollout is None and sc.overrides == (), path
    sc = load_scenario(SCENARIOS / "rela-ramp.yaml", overrides={"duration_s": 60})
    a = relakit.simulate(sc, record_requests=True)
    b = run_once(sc, None, True)
    assert a.summary.equals(b.summary) and a.requests.equals(b.requests)
    assert a.decisions.equals(b.decisions)


def test_replications_repeat_the_decision_step():
    sc = load_scenario(ROLLBACK, overrides={"duration_s": 90})
    reps = replicate(sc, 3)
    assert reps["action"].to_list() == ["rollback"] * 3
    assert reps["at_s"].to_list() == [60.0] * 3


def test_a_difference_whose_interval_holds_the_margin_is_no_evidence():
    up = Condition("success_ratio", "all", ">", 0.0)
    down = Condition("success_ratio", "all", "<", -0.02)
    iv = Interval(0.01, 0.02, 6, -0.01, 0.03)
    assert not up.holds(iv) and not down.holds(iv)
    assert up.holds(Interval(0.02, 0.01, 6, 0.01, 0.03))
    assert down.holds(Interval(-0.05, 0.01, 6, -0.06, -0.04))
    assert not up.holds(None) and not up.holds(Interval(0.1, math.nan, 1, math.nan, math.nan))
    assert paired_batches([0.9, math.nan], [0.8, 0.7]) is None  # one slot is not a spread


def test_bucket_quantile_interpolates_as_prometheus():
    # 100 observations: 50 in (0, 0.1], 49 in (0.1, 0.2], 1 above 0.2
    assert bucket_quantile(0.5, [50, 49, 1], [0.1, 0.2]) == pytest.approx(0.1)
    assert bucket_quantile(0.99, [50, 49, 1], [0.1, 0.2]) == pytest.approx(0.2)
    assert bucket_quantile(0.75, [50, 50, 0], [0.1, 0.2]) == pytest.approx(0.15)
    assert math.isnan(bucket_quantile(0.5, [0, 0, 0], [0.1, 0.2]))


# ---- a tier canary, per-tier flags -----------------------------------------------------------
def test_a_tier_canary_is_compared_with_its_shadow_run_and_rolled_back():
    """The eager policy on bronze alone: bronze is shed, gold and silver keep RelA's flags;
    the shadow run (RelA alone, same seed) is the baseline, tier by tier."""
    sc = load_scenario(ROLLBACK, overrides={"rollout.canary": {"tier": "bronze"},
                                            "duration_s": 120})
    r = run_rollout(sc)
    assert r.outcome == {"action": "rollback", "at_s": 60.0, "observation": 1}
    assert r.labels == ["fleet"] and r.shadow is not None
    rows = _stage(r, "rollout")
    assert rows.filter(pl.col("action") == "start")["target"][0] == "tier bronze"
    assert all("shadow" in x for x in rows.filter(pl.col("action") == "observe")["reason"])
    summary = r.zones[0].summary
    dropped = dict(zip(summary["tier"], summary["dropped"], strict=True))
    assert dropped["bronze"] > 1000 and dropped["gold"] == dropped["silver"] == 0
    assert int(r.shadow.summary.filter(pl.col("tier") == "all")["dropped"][0]) == 0
    gold = r.observation("success_ratio", "gold").row(0, named=True)
    assert gold["low"] < 0 < gold["high"]  # gold is not what changed: no evidence either way
    shed = r.observation("success_ratio", "bronze").row(0, named=True)
    assert shed["high"] < -0.9  # bronze lost nearly everything against its shadow
    # common random numbers: after the rollback the run and its shadow agree again
    late = r.observation("success_ratio", "all").filter(pl.col("observation") == 3)
    assert late["diff"][0] == 0.0 and late["canary"][0] == late["rest"][0]
    pols = r.decisions.filter(pl.col("stage") == "policy")["policy"].unique().to_list()
    assert pols == ["new (tier bronze)"]  # only the tier's controller left normal


def test_a_tier_override_pins_one_tier_only():
    sc = load_scenario(ROLLBACK, overrides={
        "rollout": None, "duration_s": 60,
        "overrides": [{"flag": "hedge_enabled", "value": True, "tier": "gold"},
                      {"flag": "degraded_mode", "value": True, "tier": "silver"}]})
    r = run_rollout(sc)
    s = r.zones[0].summary
    hedges = dict(zip(s["tier"], s["hedges"], strict=True))
    degraded = dict(zip(s["tier"], s["degraded"], strict=True))
    assert hedges["gold"] > 50 and hedges["silver"] == hedges["bronze"] == 0, hedges
    assert degraded["silver"] > 1000 and degraded["gold"] == degraded["bronze"] == 0, degraded
    pins = _stage(r, "override").filter(pl.col("action") == "pin")
    assert {"fleet"} == set(pins["target"]) and any("tier gold" in x for x in pins["reason"])


def test_per_tier_flags_specialised_equals_general(monkeypatch):
    """Hedging for gold only and degraded mode for bronze only: the specialised kernel
    and the general one agree bit for bit, and the masks reach only their tiers."""
    import numpy as np
    from conftest import make_scenario

    from relakit.sim import kernel as K
    from relakit.sim.fleet import Fleet

    sc = make_scenario(rate=1400, duration=20, nodes=4, servers=4, deadline_ms=40)
    sc["mitigations"] = {"hedge": {"delay_ms": 5, "cancel": "queued"},
                         "degraded": {"service_factor": 0.5}}

    def run(kernel, specialise):
        monkeypatch.setattr(Fleet, "specialise", specialise)
        monkeypatch.setattr(K, "advance", kernel)
        fleet = Fleet(load_scenario(sc))
        fleet.set_tier_flags(hedge_tiers=["gold"], degraded_tiers=["bronze"])
        for t in (5.0, 12.5, 20.0):
            fleet.advance(t)
        return fleet

    general = K.advance
    probe = Fleet(load_scenario(sc))
    probe.set_tier_flags(hedge_tiers=["gold"], degraded_tiers=["bronze"])
    features = K.features_of(probe.cfg, probe.st)
    assert {"hedging", "degraded"} <= features
    fast = run(K.specialised(features), False)
    slow = run(general, False)
    for part in ("st", "out"):
        a, b = getattr(fast, part), getattr(slow, part)
        for name in a._fields:
            np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    ext = fast.out.tier_ext
    gold, bronze = K.TIERS.index("gold"), K.TIERS.index("bronze")
    assert ext[gold, K.TX_HEDGES] > 0 and ext[:, K.TX_HEDGES].sum() == ext[gold, K.TX_HEDGES]
    assert ext[bronze, K.TX_DEGRADED] > 0
    assert ext[:, K.TX_DEGRADED].sum() == ext[bronze, K.TX_DEGRADED]
    assert fast.tier_flags() == {"hedge_enabled": ("gold",), "degraded_mode": ("bronze",),
                                 "shed": ()}


def test_the_rollout_figure_says_what_its_whiskers_are_and_reads_shares_as_percent(promoted):
    from relakit import plots

    spec = plots.rollout_chart(promoted, "success_ratio", "all", title="t").to_dict()
    top, bottom = spec["vconcat"]
    assert "whiskers: 95 % intervals" in " ".join(top["title"]["subtitle"])
    formats = {v["encoding"]["y"]["axis"]["format"] for p in (top, bottom) for v in p["layer"]
               if isinstance(v.get("encoding", {}).get("y"), dict)
               and "axis" in v["encoding"]["y"]}
    assert formats == {".1%", "+.1%"}
