"""The control plane's own faults and its replicas (issue 16, items 1 and 2).

The model (:mod:`relakit.control.plane`) is tested alone with a decider that
records its calls (fast, exact instants), then through the closed loop on the
shipped scenario ``control-plane-outage.yaml`` (fail-static vs fail-safe) and on
``control-plane-handover.yaml`` (the leader dies, the follower takes over).
"""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest
from conftest import ROOT

from relakit.control import Controller, load_clocks
from relakit.control.decider import Decision
from relakit.control.faults import (
    AgentDown,
    Agents,
    ControlPlaneFaults,
    DataPlaneStale,
    ScrapeGap,
    ServerDown,
)
from relakit.control.plane import ControlPlane
from relakit.control.tsdb import TSDB, Target
from relakit.experiment import simulate
from relakit.scenario import load_scenario
from relakit.vocab import Flags

OUTAGE = ROOT / "params" / "scenarios" / "control-plane-outage.yaml"
HANDOVER = ROOT / "params" / "scenarios" / "control-plane-handover.yaml"
CLOCKS = load_clocks({"scrape_s": 5, "window_s": 20, "eval_s": 2, "poll_s": 2})


class Recorder:
    """A decider that wants hedging on, and node controls naming the instant it decided at
    (what the data plane holds is read from those)."""

    def __init__(self):
        self.times: list[float] = []

    def decide(self, tsdb, t):
        self.times.append(t)
        return Decision(flags=Flags(hedge_enabled=True), nodes={"decided_at": t})

    def decisions(self):
        return pl.DataFrame()

    def timeline(self):
        return pl.DataFrame({"time_s": self.times})


NO_FAULTS, ONE_AGENT, KEEP = ControlPlaneFaults(), Agents(), DataPlaneStale()


def _run(faults=NO_FAULTS, agents=ONE_AGENT, data_plane=KEEP, end_s=120.0):
    plane = ControlPlane(lambda: [Recorder()], CLOCKS, faults, agents, data_plane, 30.0)
    evals = CLOCKS.eval_times(0, end_s)
    renews = plane.agent_times(0, end_s)
    polls = CLOCKS.poll_times(0, end_s)
    seen = []  # (poll time, status, the decision time the data plane holds)
    holding = None
    for t in np.union1d(np.union1d(evals, renews), polls):
        t = float(t)
        if t in set(evals.tolist()) | set(renews.tolist()):
            plane.step(t, t in set(evals.tolist()), lambda _t: None)
        if t in set(polls.tolist()):
            status, flags, nodes = plane.poll(t)
            if status == "defaults":
                holding = "defaults"
            elif nodes is not None:
                assert flags == Flags(hedge_enabled=True)
                holding = nodes["decided_at"]
            seen.append((t, status, holding))
    return plane, seen


def _actions(plane, action):
    return plane.decisions().filter(pl.col("action") == action)


def test_a_down_agent_neither_evaluates_nor_writes_and_each_skip_is_audited():
    plane, seen = _run(ControlPlaneFaults(agent=(AgentDown(20, 40, "warm"),)))
    times = plane.agents[0].deciders[0].times
    assert not [t for t in times if 20 <= t < 40]
    assert 18.0 in times and 40.0 in times
    skips = _actions(plane, "skip")
    assert skips["decided_at_s"].to_list() == [float(t) for t in range(20, 40, 2)]
    assert all("agent 0 down" in r for r in skips["reason"])
    # the data plane keeps reading the last accepted state: 18 s's decision until 40 s
    held = {t: h for t, _, h in seen}
    assert held[38.0] == 18.0 and held[40.0] == 40.0


def test_warm_resume_keeps_the_deciders_and_resends_cold_restart_starts_fresh():
    warm, _ = _run(ControlPlaneFaults(agent=(AgentDown(20, 41, "warm"),)))
    assert len(warm.agents[0].generations) == 1
    row = _actions(warm, "write").row(0, named=True)  # the held write, re-sent at 41 s
    assert row["decided_at_s"] == 41.0 and "held write accepted" in row["reason"]
    cold, _ = _run(ControlPlaneFaults(agent=(AgentDown(20, 41, "cold"),)))
    gens = cold.agents[0].generations
    assert len(gens) == 2 and gens[1][0].times[0] == 42.0  # fresh deciders from 42 s
    assert _actions(cold, "write").height == 0
    assert "restarted cold" in _actions(cold, "restart")["reason"][0]


def test_config_server_unreachable_fails_writes_and_polls_keep_or_defaults():
    down = ControlPlaneFaults(config_server=(ServerDown(30, 60),))
    keep, seen = _run(down)
    failed = _actions(keep, "write_failed")
    assert failed["decided_at_s"].to_list() == [float(t) for t in range(30, 60, 2)]
    assert all(r.startswith("config server unreachable: agent 0's write failed")
               for r in failed["reason"])
    held = {t: (s, h) for t, s, h in seen}
    assert held[58.0] == ("keep", 28.0)  # fail-static: the last state read, at 28 s
    assert held[60.0] == ("ok", 60.0)
    safe, seen = _run(down, data_plane=DataPlaneStale("defaults", 10.0))
    held = {t: (s, h) for t, s, h in seen}
    # the last successful poll was at 28 s: defaults from the first poll >= 38 s
    assert held[36.0] == ("keep", 28.0) and held[38.0] == ("defaults", "defaults")
    assert held[58.0][1] == "defaults" and held[60.0] == ("ok", 60.0)
    row = _actions(safe, "defaults").row(0, named=True)
    assert row["decided_at_s"] == 38.0 and "stale_after_s 10" in row["reason"]


def test_the_follower_takes_over_within_lease_plus_one_evaluation_and_fencing_holds():
    lease = Agents(replicas=2, lease_s=7.0, renew_s=3.0)
    # agent 0 (the first leader) is frozen at 31 s and resumes warm at 60 s
    plane, seen = _run(ControlPlaneFaults(agent=(AgentDown(31, 60, "warm"),)), lease)
    acq = plane.server.acquisitions
    assert acq[0] == (0.0, 0, 1)
    t_new, who, epoch = acq[1]
    assert (who, epoch) == (1, 2)
    first_write = min(t for t, a, e, s in plane.server.writes if a == 1 and s == "accepted")
    assert 31.0 < first_write <= 31.0 + lease.lease_s + CLOCKS.eval_s
    # agent 0 resumes and sends its held write with epoch 1: refused, then it is deposed
    refused = _actions(plane, "write_refused")
    assert refused.height == 1 and refused["decided_at_s"][0] == 60.0
    assert "epoch 1 is stale" in refused["reason"][0]
    late = [w for w in plane.server.writes if w[1] == 0 and w[0] >= t_new]
    assert late and all(w[3] != "accepted" for w in late)
    assert not plane.agents[0].leading and plane.agents[1].leading
    # one leader at a time: agent 0 evaluated before the freeze only
    assert max(plane.agents[0].deciders[0].times) < 31.0


def test_a_lease_lost_to_an_unreachable_config_server_stops_the_leader_by_itself():
    plane, _ = _run(ControlPlaneFaults(config_server=(ServerDown(30, 60),)),
                    Agents(replicas=2, lease_s=7.0, renew_s=3.0))
    expired = _actions(plane, "lease_expired")
    assert expired.height == 1 and expired["decided_at_s"][0] <= 30.0 + 7.0
    # after the outage one agent acquires a new term; the old term's writes are refused
    assert plane.server.acquisitions[-1][2] == 2
    assert all(w[3] != "accepted" for w in plane.server.writes if 30 <= w[0] < 60)


# ---- absent signals -----------------------------------------------------------------
def _gauge_policy(rule):
    return {"name": "p", "on_missing": rule,
            "signals": {"q": {"kind": "gauge", "metric": "in_flight", "over_time": "last",
                              "across": "max"}},
            "conditions": {"high": {"signal": "q", "threshold": 5}},
            "modes": [{"name": "survival", "when": {"any": ["high"]}, "enter_after": 2,
                       "exit_after": 2, "assert": {"shed_bronze": True}}]}


@pytest.mark.parametrize("rule, modes", [
    ("clear", ["normal", "survival", "survival", "survival", "normal", "normal"]),
    ("hold", ["normal", "survival", "survival", "survival", "survival", "survival"]),
    ("breach", ["normal", "survival", "survival", "survival", "survival", "survival"]),
])
def test_on_missing_says_what_an_absent_signal_counts_as(rule, modes):
    # a gauge above its threshold, then no samples at all from 6 s on (a scrape gap)
    times = np.arange(0.0, 6.0)
    tsdb = TSDB([Target(0, times, np.full((times.size, 1), 9.0),
                        [("in_flight", "", "", "")])])
    c = Controller(_gauge_policy(rule), load_clocks({"scrape_s": 1, "window_s": 2,
                                                     "eval_s": 2, "poll_s": 2}))
    for t in (2.0, 4.0, 6.0, 10.0, 12.0, 14.0):
        c.decide(tsdb, t)
    assert c.timeline()["mode"].to_list() == modes
    assert [bool(a[0]) for a in c.absent] == [False, False, False, True, True, True]
    # replay's vectorised path agrees
    batch = Controller(_gauge_policy(rule), c.clocks)
    batch.run(tsdb, [2.0, 4.0, 6.0, 10.0, 12.0, 14.0])
    assert batch.timeline()["mode"].to_list() == modes


def test_breach_needs_conditions_that_point_one_way():
    from relakit.control import load_policy
    from relakit.validate import ScenarioError

    p = _gauge_policy("breach")
    p["conditions"]["low"] = {"signal": "q", "op": "<", "threshold": 1}
    with pytest.raises(ScenarioError, match=r"key 'signals.q.on_missing': breach needs"):
        load_policy(p)


def test_a_scrape_gap_loses_the_samples_and_the_audit_names_the_absent_signal():
    sc = load_scenario(OUTAGE, overrides={
        "control_plane": {"prometheus": {"start_s": 100, "end_s": 160}},
        "duration_s": 200, "workload.arrival": {"kind": "poisson", "rate_rps": 1400}})
    res = simulate(sc, record_requests=False)
    rows = res.decisions.filter(pl.col("action") == "signal_absent")
    # a 20 s window with a 5 s scrape is empty from 120 s (the last sample at 95 s...)
    # until the first scrape after the gap plus one: absent signals in [~117, 165]
    assert rows.height > 0
    assert rows["decided_at_s"].min() >= 100 and rows["decided_at_s"].max() <= 170
    assert set(rows["signal"]) == {"p99_ms", "error_ratio", "drop_ratio"}
    assert all("scrape gap 100–160 s on all targets): on_missing clear" in r
               for r in rows["reason"])
    line = res.timeline.filter((pl.col("time_s") > 125) & (pl.col("time_s") < 160))
    assert line["p99_ms"].is_nan().all() and line.height > 0


def test_a_partial_gap_removes_only_its_targets():
    from relakit.experiment import FleetView
    from relakit.sim import Fleet

    sc = load_scenario(OUTAGE, overrides={"duration_s": 40, "control_plane": {}})
    fleet = Fleet(sc, seed=1, record_requests=False).advance(40)
    view = FleetView(fleet, 60.0, gaps=(ScrapeGap(10, 30, (1, 3)),))
    tsdb = view.tsdb(40.0)
    for tgt in tsdb.targets:
        inside = ((tgt.times >= 10) & (tgt.times < 30)).sum()
        assert (inside == 0) == (tgt.node in (1, 3)), tgt.node


# ---- fail-static vs fail-safe, the shipped scenario ----------------------------------
SURVIVAL_DEFAULTS = {"shed_tiers": ["bronze"], "hedge_enabled": False, "degraded_mode": True}
VARIANTS = {"keep": {"data_plane": {"on_stale": "keep"}},
            "defaults": {"data_plane": {"on_stale": "defaults", "stale_after_s": 10}},
            "safe defaults": {"data_plane": {"on_stale": "defaults", "stale_after_s": 10},
                              "controls": SURVIVAL_DEFAULTS}}


@pytest.fixture(scope="module")
def outage():
    return {name: simulate(load_scenario(OUTAGE, overrides=ov)) for name, ov in
            VARIANTS.items()}


def _overload(res):
    w = res.requests.filter(pl.col("arrival_s").is_between(90, 150, closed="left"))
    gold = w.filter(pl.col("tier") == "gold")
    return float((gold["outcome"] == "ok").mean()), float((w["outcome"] == "dropped").mean())


# Tolerances: the runs are deterministic for a seed, but the kernel's random streams may
# change; measured over seeds 7, 1 and 2, gold's success spread by 0.009 (keep) and 0.007
# (defaults): +-0.03 is three times that. Shedding drops bronze, 60 % of arrivals: the
# binomial sd over ~228 k requests is 0.001, so +-0.01 is ten of them.
def test_fail_static_keeps_hedging_into_the_overload(outage):
    gold, shed = _overload(outage["keep"])
    assert gold == pytest.approx(0.553, abs=0.03)  # measured 0.549-0.558
    assert shed == 0.0
    applied = outage["keep"].info["control_plane"]["flags_applied"]
    assert not [a for a in applied if 60 <= a["time_s"] < 180]  # nothing changed
    before = [a for a in applied if a["time_s"] < 60][-1]
    assert before["hedge_enabled"] and not before["shed_bronze"]


def test_fail_safe_is_as_safe_as_its_defaults(outage):
    gold, shed = _overload(outage["defaults"])  # all flags off: hedging stops
    assert gold == pytest.approx(0.840, abs=0.03)  # measured 0.837-0.844
    assert shed == 0.0
    gold_safe, shed_safe = _overload(outage["safe defaults"])  # RelA's survival flags
    assert gold_safe >= 0.999  # measured 1.0 at the three seeds
    assert shed_safe == pytest.approx(0.60, abs=0.01)  # measured 0.5993-0.5996
    for name in ("defaults", "safe defaults"):
        applied = outage[name].info["control_plane"]["flags_applied"]
        at = [a for a in applied if a["source"] == "defaults"]
        assert at[0]["time_s"] == 68.0  # the last good poll at 58 s, plus stale_after_s
        assert not at[0]["hedge_enabled"]
        assert at[0]["shed_bronze"] == (name == "safe defaults")


def test_the_audit_names_every_fault_driven_decision(outage):
    for variant, res in outage.items():
        d = res.decisions.filter(pl.col("stage") == "control_plane")
        acts = d["action"].to_list()
        assert acts.count("skip") == 60  # evaluations at 60, 62, ..., 178 s
        assert "down" in acts and "restart" in acts and "poll_failed" in acts
        assert ("defaults" in acts) == (variant != "keep")
        restart = d.filter(pl.col("action") == "restart")["reason"][0]
        assert "restarted cold" in restart
        poll_ok = d.filter(pl.col("action") == "poll_ok").row(0, named=True)
        assert poll_ok["decided_at_s"] == 180.0
    # no policy evaluation while the agent was down
    line = outage["keep"].timeline
    assert line.filter(pl.col("time_s").is_between(60, 178)).height == 0
    assert math.isclose(sum(outage["keep"].info["control"]["time_in_mode_s"].values()), 240.0)


# ---- high availability, the shipped scenario ------------------------------------------
def test_the_follower_takes_over_from_a_frozen_leader_and_its_late_write_is_refused():
    sc = load_scenario(HANDOVER)
    res = simulate(sc, record_requests=False)
    info = res.info["control_plane"]
    lease_s, eval_s = sc.agents.lease_s, sc.clocks.eval_s
    freeze = sc.control_plane.agent[0]
    assert [a[1:] for a in info["acquisitions"]] == [[0, 1], [1, 2]]
    d = res.decisions.filter(pl.col("stage") == "control_plane")
    took_over = info["acquisitions"][1][0]
    assert freeze.start_s < took_over <= freeze.start_s + lease_s + eval_s
    # the deposed leader's write, sent when it resumes, is refused and nothing of it
    # is accepted afterwards
    refused = d.filter(pl.col("action") == "write_refused")
    assert refused["decided_at_s"].to_list() == [freeze.end_s]
    assert "epoch 1 is stale" in refused["reason"][0]
    assert info["writes"]["refused"] == 1 and info["writes"]["accepted_stale"] == 0
    plane_writes = res.decisions.filter(pl.col("action") == "write")  # held writes accepted
    assert plane_writes.height == 0
    # the new leader runs the loop: it enters survival during the overload (120-180 s)
    entered = res.decisions.filter((pl.col("stage") == "policy") & (pl.col("mode") == "survival")
                                   & (pl.col("action") != "hold"))
    assert entered.height >= 1 and 120 < entered["decided_at_s"][0] < 150
    # one leader evaluates at a time: no evaluation instant appears twice
    assert res.timeline["time_s"].is_duplicated().sum() == 0


# ---- the notebook's figures ---------------------------------------------------------
def test_the_fail_static_vs_safe_figure_draws_what_the_runs_applied(outage):
    from relakit import plots

    runs = {"fail-static": outage["keep"], "fail-safe": outage["safe defaults"]}
    steps = plots.flag_steps_frame(runs)
    safe = steps.filter((pl.col("variant") == "fail-safe") & (pl.col("flag") == "shed_bronze"))
    assert safe["time_s"].max() == 240.0  # the last step is drawn to the run's end
    assert safe.filter(pl.col("time_s") == 68.0)["on"].to_list() == [1]
    ok = plots.tier_success_frame(runs, "gold", 5.0)
    assert ok.filter(pl.col("variant") == "fail-static").height == 48  # 240 s in 5 s bins
    spec = plots.fail_static_vs_safe(runs, (60, 180)).to_dict()
    titles = [p["layer"][1]["encoding"]["y"]["title"] for p in spec["vconcat"]]
    assert titles == ["bronze shed (1 = yes)", "hedging on (1 = yes)",
                      "gold answered ok (share)"]
    x = spec["vconcat"][2]["layer"]
    assert x[0]["encoding"]["x"]["title"] == x[1]["encoding"]["x"]["title"]
    assert all(p["layer"][0]["mark"]["color"] == plots.OUTAGE_COLOR for p in spec["vconcat"])


def test_the_handover_timeline_shows_the_terms_the_freeze_and_the_refused_write():
    from relakit import plots

    res = simulate(load_scenario(HANDOVER), record_requests=False)
    spans = plots.lease_spans(res)
    lead = spans.filter(pl.col("state") == "leader").sort("start_s")
    assert lead["agent"].to_list() == ["agent 0", "agent 1"]
    assert lead["end_s"][0] == lead["start_s"][1] == 110.0
    frozen = spans.filter(pl.col("state") == "down").row(0, named=True)
    assert (frozen["agent"], frozen["start_s"], frozen["end_s"]) == ("agent 0", 100.0, 160.0)
    spec = plots.handover_timeline(res).to_dict()
    assert spec["vconcat"][0]["layer"][1]["encoding"]["shape"]["title"] is None


def test_the_fail_static_figure_draws_the_replications_mean_in_its_band(outage):
    from relakit import plots

    runs = {"fail-static": outage["keep"], "fail-safe": outage["safe defaults"]}
    # two 'replications' per variant that differ: the band's numbers can be checked by hand
    replicated = {"fail-static": [outage["keep"], outage["safe defaults"]],
                  "fail-safe": [outage["safe defaults"], outage["keep"]]}
    bands = plots.tier_success_bands(replicated, "gold", 5.0)
    one = plots.tier_success_frame({"a": outage["keep"]}, "gold", 5.0)
    two = plots.tier_success_frame({"a": outage["safe defaults"]}, "gold", 5.0)
    both = one.join(two, on="t", suffix="_2").drop_nulls()
    row = bands.filter((pl.col("variant") == "fail-static") & (pl.col("t") == both["t"][20]))
    assert row["ok_share"][0] == pytest.approx((both["ok_share"][20] + both["ok_share_2"][20]) / 2)
    assert (bands["replications"] == 2).all() and bands["ok_share_ci"].max() > 0
    spec = plots.fail_static_vs_safe(runs, (60, 180), replicated=replicated).to_dict()
    panel = spec["vconcat"][2]
    area = next(v for v in panel["layer"] if v.get("mark", {}).get("type") == "area")
    rows = spec["datasets"][area["data"]["name"]] if "data" in area else []
    assert rows and all(0 <= r["_low"] <= r["_high"] <= 1 for r in rows if r["_low"] is not None)
    sub = panel["title"]["subtitle"]
    assert "95 % intervals over 2 replications" in sub and "cut off at 0 % and 100 %" in sub
    assert "one run each" in spec["vconcat"][0]["title"]  # the flags are one run's
