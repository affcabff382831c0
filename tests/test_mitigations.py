"""The data plane's mitigations, each with an expected effect that could fail:
hedging, retries and their budget, shedding, degraded mode, the breaker,
throttling, isolation with failover, silent and load-dependent failures, and
the metastable failure they can cause or cure."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest
from conftest import ROOT, make_scenario

import relakit
from relakit import Fleet, load_scenario

SLOW_PATH = {"kind": "bimodal", "fast_ms": 5, "slow_ms": 200, "slow_fraction": 0.05}


def _with(sc: dict, **sections) -> dict:
    out = dict(sc)
    out.update(sections)
    return out


def _all(result) -> dict:
    return result.summary.filter(pl.col("tier") == "all").row(0, named=True)


def _by_tier(result) -> dict:
    return {row["tier"]: row for row in result.summary.iter_rows(named=True)}


# ---- hedging -----
def test_hedging_at_low_load_cuts_the_slow_path_tail_for_about_its_share_of_load():
    base = make_scenario(rate=400, duration=200, nodes=10, servers=8, service=SLOW_PATH,
                         warmup=5)
    plain = relakit.simulate(base)
    hedged = relakit.simulate(_with(base, controls={"hedge_enabled": True},
                                    mitigations={"hedge": {"delay_ms": 20, "cancel": "queued"}}))
    p, h = _all(plain), _all(hedged)
    assert p["p99_ms"] > 190  # the slow path sets the plain p99
    assert h["p99_ms"] < p["p99_ms"] / 5
    # a hedge is sent for each call still unanswered at 20 ms: the slow-path share
    still_waiting = (plain.requests["latency_ms"] > 20).mean()
    assert still_waiting == pytest.approx(0.05, abs=0.005)
    assert h["amplification"] - 1 == pytest.approx(still_waiting, rel=0.15)
    # a hedge (sent at 20 ms to a slow primary of 200 ms) wins unless it is slow itself
    assert hedged.info["hedges_won"] / hedged.info["hedges"] == pytest.approx(0.95, abs=0.015)


def test_hedging_without_cancellation_makes_p99_worse_near_saturation():
    base = make_scenario(rate=0.9 * 800, duration=150, nodes=4, servers=2, warmup=20,
                         service={"kind": "exponential", "mean_ms": 10})
    p99 = {"off": _all(relakit.simulate(base))["p99_ms"]}
    for cancel in ("never", "queued", "started"):
        sc = _with(base, controls={"hedge_enabled": True},
                   mitigations={"hedge": {"delay_ms": 30, "cancel": cancel}})
        p99[cancel] = _all(relakit.simulate(sc))["p99_ms"]
    assert p99["never"] > 1.5 * p99["off"]  # duplicates eat the capacity left
    assert p99["started"] < p99["never"]  # cancelling the loser gives some of it back


def test_hedges_go_to_another_node_and_none_is_sent_while_the_flag_is_off():
    sc = load_scenario(make_scenario(rate=200, duration=40, nodes=3, servers=4,
                                     service=SLOW_PATH))
    fleet = Fleet(sc)
    fleet.advance(20.0)
    assert fleet.result().info["hedges"] == 0
    fleet.set_flags(fleet.flag_state().updated(hedge_enabled=True))
    fleet.advance(40.0)
    r = fleet.result()
    assert r.info["hedges"] > 100
    late = r.requests.filter(pl.col("arrival_s") > 20.5)
    assert (late["attempts"] > 1).mean() == pytest.approx(0.05, abs=0.02)


# ---- retries -----
def test_retry_budget_bounds_amplification_during_a_total_outage():
    outage = [{"node": 0, "start_s": 0, "end_s": 1e9, "error_rate": 1.0}]
    base = make_scenario(rate=500, duration=60, nodes=1, servers=8, faults=outage)
    free = _with(base, mitigations={"retries": {"max_attempts": 3, "backoff_ms": 5}})
    capped = _with(base, mitigations={"retries": {"max_attempts": 3, "backoff_ms": 5,
                                                  "budget_ratio": 0.1}})
    assert _all(relakit.simulate(free))["amplification"] == pytest.approx(3.0, abs=0.01)
    r = relakit.simulate(capped)
    assert _all(r)["amplification"] == pytest.approx(1.1, abs=0.02)
    assert r.info["retries_denied"] > 0.8 * r.info["user_requests"]


def test_retries_recover_transient_errors_at_the_cost_of_attempts():
    faults = [{"node": i, "start_s": 0, "end_s": 1e9, "error_rate": 0.2} for i in range(4)]
    base = make_scenario(rate=300, duration=60, nodes=4, servers=4, faults=faults)
    one = _all(relakit.simulate(base))
    three = _all(relakit.simulate(_with(base, mitigations={"retries": {"max_attempts": 3}})))
    assert one["success_ratio"] == pytest.approx(0.8, abs=0.01)
    assert three["success_ratio"] == pytest.approx(1 - 0.2**3, abs=0.005)
    assert three["amplification"] == pytest.approx(1 + 0.2 + 0.04, abs=0.01)


def test_backoff_delays_each_retry():
    outage = [{"node": 0, "start_s": 0, "end_s": 1e9, "error_rate": 1.0}]
    sc = make_scenario(rate=50, duration=30, servers=4, faults=outage,
                       service={"kind": "deterministic", "mean_ms": 1})
    sc = _with(sc, mitigations={"retries": {"max_attempts": 3, "backoff_ms": 100,
                                            "jitter": False}})
    lat = relakit.simulate(sc).requests["latency_ms"].to_numpy()
    # three 1 ms attempts with 100 ms then 200 ms between them
    np.testing.assert_allclose(lat, 303.0, rtol=1e-6)


# ---- metastable failure -----
def _goodput(result, a, b):
    ok = result.requests.filter(pl.col("arrival_s").is_between(a, b) & (pl.col("outcome") == "ok"))
    return ok.height / (b - a)


METASTABLE = ROOT / "params" / "scenarios" / "metastable.yaml"


def test_metastable_failure_persists_after_its_trigger_without_a_budget():
    r = relakit.simulate(METASTABLE)
    before, after = _goodput(r, 10, 60), _goodput(r, 150, 230)
    assert before == pytest.approx(2240, rel=0.03)
    assert after < 0.05 * before  # the spike ended at 80 s; the fleet did not recover
    late = r.requests.filter(pl.col("arrival_s") > 150)
    assert late["attempts"].mean() > 2.9  # every request now costs three attempts


def test_a_ten_percent_retry_budget_gets_out_of_it():
    sc = load_scenario(METASTABLE, overrides={"mitigations.retries.budget_ratio": 0.1})
    r = relakit.simulate(sc)
    assert _goodput(r, 150, 230) == pytest.approx(2240, rel=0.03)
    assert r.requests.filter(pl.col("arrival_s") > 60)["attempts"].mean() < 1.12


def test_shedding_until_the_backlog_drains_gets_out_of_it():
    sc = load_scenario(METASTABLE)
    fleet = Fleet(sc)
    fleet.advance(90.0)  # ten seconds after the spike, still failed, 150k jobs queued
    # offered load falls to 0.2 of capacity
    fleet.set_flags(fleet.flag_state().updated(shed_tiers=["silver", "bronze"]))
    fleet.advance(180.0)  # the backlog drains at about 2,500 jobs/s
    assert fleet.st.node_i[:, 2].sum() == 0
    fleet.set_flags(fleet.flag_state().updated(shed_tiers=[]))
    fleet.advance(sc.duration_s)
    r = fleet.result()
    assert _goodput(r, 85, 90) < 300
    assert _goodput(r, 190, 235) == pytest.approx(2240, rel=0.03)  # healthy with all tiers back
    during = r.requests.filter(pl.col("arrival_s").is_between(100, 170))
    assert (during.filter(pl.col("tier") != "gold")["outcome"] == "dropped").all()


def test_static_shedding_never_lets_it_start():
    sc = load_scenario(METASTABLE, overrides={"controls.shed_bronze": True})
    by = _by_tier(relakit.simulate(sc))
    assert by["gold"]["success_ratio"] > 0.999 and by["silver"]["success_ratio"] > 0.999
    assert by["bronze"]["dropped"] == by["bronze"]["requests"]


# ---- shedding, degraded mode, breaker -----
def test_shedding_bronze_at_overload_keeps_gold_succeeding():
    base = make_scenario(rate=1300, duration=60, nodes=2, servers=5, deadline_ms=200,
                         warmup=5)  # capacity 1000 req/s
    overloaded = _by_tier(relakit.simulate(base))
    shed = _by_tier(relakit.simulate(_with(base, controls={"shed_bronze": True})))
    assert overloaded["gold"]["success_ratio"] < 0.5
    assert shed["gold"]["success_ratio"] > 0.999
    assert shed["bronze"]["dropped"] / shed["bronze"]["requests"] > 0.999
    assert shed["all"]["error"] == 0 and overloaded["all"]["dropped"] == 0


def test_degraded_mode_serves_faster_and_counts_its_quality_loss():
    base = make_scenario(rate=100, duration=60, nodes=5, servers=8, fanout=4)
    normal = _all(relakit.simulate(base))
    deg = relakit.simulate(_with(base, controls={"degraded_mode": True},
                                 mitigations={"degraded": {"service_factor": 0.5, "fanout": 2}}))
    d = _all(deg)
    assert d["degraded"] == d["requests"]
    assert (deg.requests["fanout"] == 2).all()
    # max of 2 exponentials at half the mean vs max of 4 at full: 0.5*1.5 vs 2.083 means
    assert d["mean_ms"] / normal["mean_ms"] == pytest.approx(0.75 / (25 / 12), rel=0.05)
    assert normal["degraded"] == 0


def test_open_breaker_rejects_its_tiers_and_half_open_admits_a_share():
    base = make_scenario(rate=1000, duration=20, servers=16)
    opened = _by_tier(relakit.simulate(_with(base, controls={"breaker": "open"})))
    assert opened["gold"]["success_ratio"] == 1.0
    assert opened["bronze"]["dropped"] == opened["bronze"]["requests"]
    assert opened["silver"]["dropped"] == opened["silver"]["requests"]
    half = _by_tier(relakit.simulate(_with(base, controls={"breaker": "half_open"},
                                           mitigations={"breaker": {"half_open_admit": 0.25}})))
    n = half["bronze"]["requests"]
    assert abs(half["bronze"]["ok"] / n - 0.25) < 5 * math.sqrt(0.25 * 0.75 / n)


# ---- per-node controls -----
def test_token_bucket_throttles_and_excess_can_go_elsewhere():
    base = make_scenario(rate=600, duration=40, nodes=3, servers=8,
                         service={"kind": "exponential", "mean_ms": 5})
    for excess, expect_drop in (("reject", True), ("elsewhere", False)):
        fleet = Fleet(load_scenario(_with(base, controls={"throttle_excess": excess})))
        fleet.set_node_controls(0, intake_rate=50.0, intake_burst=5)
        fleet.advance(40.0)
        r = fleet.result()
        on0 = r.requests.filter((pl.col("node") == 0) & (pl.col("outcome") == "ok"))
        assert on0.height / 40 == pytest.approx(50, rel=0.1)  # node 0 admits 50 req/s
        dropped = _all(r)["dropped"] / 40
        if expect_drop:
            assert dropped == pytest.approx(150, rel=0.1)  # it was offered 200 req/s
        else:
            assert dropped == 0


def test_failover_moves_queued_work_off_an_isolated_node():
    base = make_scenario(rate=300, duration=30, nodes=3, servers=1,
                         service={"kind": "exponential", "mean_ms": 5})
    for isolation in ("finish", "failover"):
        fleet = Fleet(load_scenario(_with(base, controls={"isolation": isolation})))
        fleet.set_node_controls(0, weight=20.0)  # pile work onto node 0
        fleet.advance(15.0)
        queued = fleet.st.node_i[0, 2]  # queue length at isolation time
        assert queued > 20
        fleet.set_node_controls(0, routable=False)
        fleet.advance(15.0001)
        after = fleet.st.node_i[0, 2]
        fleet.advance(30.0)
        if isolation == "failover":
            assert after == 0
        else:
            assert after >= queued - 5
        assert _all(fleet.result())["error"] == 0


# ---- failures the error rate does not show -----
def test_silent_failures_answer_wrongly_without_errors():
    faults = [{"node": 1, "start_s": 0, "end_s": 1e9, "wrong_rate": 0.3}]
    r = relakit.simulate(make_scenario(rate=400, duration=50, nodes=4, servers=4, faults=faults))
    on1 = r.requests.filter(pl.col("node") == 1)
    assert (on1["outcome"] == "ok").all()
    share = 1 - on1["correct"].mean()
    assert abs(share - 0.3) < 5 * math.sqrt(0.21 / on1.height)
    assert r.requests.filter(pl.col("node") != 1)["correct"].all()
    wrong = r.metrics.filter((pl.col("name") == "wrong_answers_total") & (pl.col("node") == 1))
    assert wrong["value"].max() == pytest.approx((~on1["correct"]).sum(), abs=5)
    assert _all(r)["wrong"] == (~on1["correct"]).sum()


def test_load_dependent_errors_rise_with_load():
    fleet = {"load_errors": {"points": [[0.5, 0.0], [1.0, 0.2], [3.0, 0.9]]}}
    rates = {}
    for rate in (200, 780):  # utilisation 0.25 and 0.975 on 8 servers of 10 ms
        sc = make_scenario(rate=rate, duration=100, servers=8, warmup=10)
        sc["fleet"].update(fleet)
        rates[rate] = 1 - _all(relakit.simulate(sc))["success_ratio"]
    assert rates[200] < 0.03
    assert rates[780] > 0.15


# ---- what the control plane sees -----
def test_latency_histogram_buckets_are_cumulative_and_place_requests_right():
    sc = make_scenario(rate=100, duration=30, nodes=2, servers=8,
                       service={"kind": "bimodal", "fast_ms": 3, "slow_ms": 70,
                                "slow_fraction": 0.2})
    r = relakit.simulate(sc)
    last = r.metrics.filter((pl.col("name") == "latency_seconds_bucket")
                            & (pl.col("time_s") == pl.col("time_s").max().over("node")))
    node0 = {row["le"]: row["value"] for row in last.filter(pl.col("node") == 0).iter_rows(
        named=True)}
    total = node0["+Inf"]
    assert node0["0.005"] / total == pytest.approx(0.8, abs=0.03)  # the 3 ms path
    assert node0["0.05"] == node0["0.005"]
    assert node0["0.1"] == total  # the 70 ms path lands in (0.05, 0.1]
    buckets = last.sort(["node", "value"])
    assert (buckets.group_by("node").agg(pl.col("value").diff().min())["value"] >= 0).all()


def test_each_target_is_sampled_on_its_own_phase():
    sc = make_scenario(rate=100, duration=10, nodes=3, servers=2, interval=1.0)
    sc["metrics"]["phase_s"] = [0.0, 0.25, 0.5]
    m = relakit.simulate(sc).metrics.filter(pl.col("name") == "in_flight")
    for node, phase in enumerate((0.0, 0.25, 0.5)):
        t = np.sort(m.filter(pl.col("node") == node)["time_s"].to_numpy())
        np.testing.assert_allclose(t, phase + np.arange(len(t)))


def test_client_counters_match_the_records_and_flags_are_exported():
    sc = make_scenario(rate=500, duration=20, nodes=2, servers=4)
    fleet = Fleet(load_scenario(sc))
    fleet.set_flags(fleet.flag_state().updated(shed_tiers=["bronze"], hedge_enabled=True))
    fleet.advance(20.0)
    r = fleet.result()
    c = r.metrics.filter((pl.col("name") == "client_requests_total")
                         & (pl.col("time_s") == 20.0))
    rec = r.requests.group_by(["tier", "outcome"]).len()
    joined = c.join(rec, on=["tier", "outcome"], how="left").fill_null(0)
    assert (joined["value"] == joined["len"]).all()
    shedding = r.metrics.filter((pl.col("name") == "shedding") & (pl.col("time_s") == 20.0))
    assert dict(zip(shedding["tier"], shedding["value"], strict=True)) == {
        "gold": 0, "silver": 0, "bronze": 1}
    assert r.info["flags_at_end"]["hedge_enabled"] is True


def test_adaptive_hedge_delay_follows_the_observed_quantile():
    # fast path 5 ms for 95 %: the observed p90 is about 5 ms, so about 5 % of calls
    # (the slow ones) are still unanswered there and get a hedge, after a short warm-up
    sc = make_scenario(rate=400, duration=60, nodes=10, servers=8, service=SLOW_PATH)
    sc = _with(sc, controls={"hedge_enabled": True},
               mitigations={"hedge": {"delay_ms": 1000, "delay_quantile": 0.9}})
    r = relakit.simulate(sc)
    late = r.requests.filter(pl.col("arrival_s") > 5)
    assert (late["attempts"] > 1).mean() == pytest.approx(0.05, abs=0.01)
    assert _all(r)["p99_ms"] < 30  # hedged after ~5 ms, not after the 1 s fallback


@pytest.mark.parametrize("section,value,key,allowed", [
    ("controls", {"hedge_enabled": "yes"}, "controls.hedge_enabled", "true or false"),
    ("controls", {"shed_tiers": ["gold"]}, "controls.shed_tiers", "gold bypasses"),
    ("controls", {"breaker": "ajar"}, "controls.breaker", "half_open"),
    ("controls", {"isolation": "drop"}, "controls.isolation", "failover"),
    ("mitigations", {"hedge": {"cancel": "always"}}, "mitigations.hedge.cancel", "started"),
    ("mitigations", {"retries": {"max_attempts": 0}}, "mitigations.retries.max_attempts", ">= 1"),
    ("mitigations", {"retries": {"retry_on": ["panic"]}}, "mitigations.retries.retry_on",
     "timeout"),
    ("mitigations", {"degraded": {"service_factor": 1.5}}, "mitigations.degraded.service_factor",
     "<= 1"),
    ("mitigations", {"breaker": {"reject_tiers": ["tin"]}}, "mitigations.breaker.reject_tiers",
     "bronze"),
    ("metrics", {"latency_buckets_s": [0.1, 0.05]}, "metrics.latency_buckets_s", "increasing"),
    ("metrics", {"phase_s": [0.1]}, "metrics.phase_s", "one entry per node"),
])
def test_bad_mitigation_keys_name_the_key_and_what_is_allowed(tmp_path, section, value, key,
                                                             allowed):
    sc = make_scenario(nodes=2)
    sc[section] = {**sc.get(section, {}), **value}
    path = tmp_path / "bad.yaml"
    path.write_text(__import__("yaml").safe_dump(sc))
    with pytest.raises(relakit.ScenarioError) as err:
        load_scenario(path)
    msg = str(err.value)
    assert str(path) in msg and key in msg and allowed in msg


def test_rela_flags_load_from_the_scenario():
    sc = load_scenario(_with(make_scenario(), controls={
        "hedge_enabled": True, "shed_bronze": True, "degraded_mode": True}))
    assert sc.controls.shed_bronze and sc.controls.shed_tiers == ("bronze",)
    flags = Fleet(sc).flags()
    assert flags == {"hedge_enabled": True, "degraded_mode": True, "shed_tiers": ("bronze",),
                     "shed_bronze": True, "breaker": "closed"}


def test_every_request_is_accounted_for_exactly_once_with_every_mechanism_on():
    sc = make_scenario(rate=1500, duration=40, nodes=5, servers=3, deadline_ms=60, fanout=2,
                       faults=[{"node": 1, "start_s": 10, "end_s": 30, "error_rate": 0.3},
                               {"node": 2, "start_s": 15, "end_s": 25, "crash": True}])
    sc = _with(sc, controls={"hedge_enabled": True, "shed_tiers": ["bronze"]},
               mitigations={"hedge": {"delay_ms": 15, "cancel": "started"},
                            "retries": {"max_attempts": 3, "backoff_ms": 5,
                                        "budget_ratio": 0.5}})
    fleet = Fleet(load_scenario(sc))
    fleet.advance(40.0)
    r = fleet.result()
    # arrivals = finished + still in flight
    assert r.info["user_requests"] == r.requests.height + r.info["in_flight_at_end"]
    # copies: the per-request attempts add up to the fleet's counter (in-flight ones aside)
    assert r.requests["attempts"].sum() <= r.info["attempts"]
    assert r.info["attempts"] - r.requests["attempts"].sum() <= 2 * 3 * r.info["in_flight_at_end"]
    assert 0 < r.info["hedges_won"] <= r.info["hedges"]
    assert r.info["retries"] > 0 and r.info["cancelled"] > 0
    # the client counters equal the records, tier by tier and outcome by outcome
    c = r.metrics.filter((pl.col("name") == "client_requests_total")
                         & (pl.col("time_s") == pl.col("time_s").max()))
    rec = r.requests.group_by(["tier", "outcome"]).len()
    joined = c.join(rec, on=["tier", "outcome"], how="left").fill_null(0)
    assert (joined["value"] == joined["len"]).all()
    # server-side counters are monotone
    nodes = r.metrics.filter(pl.col("name") == "requests_total").sort("time_s")
    steps = nodes.group_by(["node", "tier", "outcome"]).agg(pl.col("value").diff().min())
    assert steps["value"].min() >= 0


def test_simulated_metrics_survive_the_trace_format_and_replay_the_same(tmp_path):
    from relakit.control import Clocks
    from relakit.openloop import replay
    from relakit.traces import read_trace, write_csv_long

    sc = load_scenario(ROOT / "params" / "scenarios" / "rela-ramp.yaml",
                       overrides={"duration_s": 480.0})
    r = relakit.simulate(sc, record_requests=False)
    write_csv_long(r.metrics, tmp_path / "m.csv")
    back = read_trace(tmp_path / "m.csv")
    assert back.height == r.metrics.height
    policy = ROOT / "params" / "policies" / "rela.yaml"
    a = replay(r.metrics, policy, Clocks(), start_s=0.0, end_s=480.0).decisions
    b = replay(back, policy, Clocks(), start_s=0.0, end_s=480.0).decisions
    assert a.select("decided_at_s", "action", "mode").equals(
        b.select("decided_at_s", "action", "mode"))
    assert a.filter(pl.col("action") != "hold").height >= 2
