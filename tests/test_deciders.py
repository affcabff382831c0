"""One decider protocol: the policy's controller and the chain, driven the same way."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from conftest import ROOT

from relakit.chain import Chain, ChainRun, load_chain
from relakit.control import Clocks, Controller
from relakit.control.decider import Decision, latest_in_force
from relakit.traces import synthetic
from relakit.vocab import Flags

CHAIN = ROOT / "params" / "chains" / "aegis.yaml"
RELA = ROOT / "params" / "policies" / "rela.yaml"


def test_the_clock_rules_live_on_clocks():
    clk = Clocks(scrape_s=15, window_s=60, eval_s=2, poll_s=5, poll_phase_s=1.5,
                 propagation_s=1)
    assert clk.lookback_s == 90
    polls = clk.poll_times(0.0, 20.0)
    assert polls.tolist() == [1.5, 6.5, 11.5, 16.5]
    # a decision is in force from the first poll at or after decided + propagation
    assert float(clk.effective_at(5.5)) == 6.5 and float(clk.effective_at(5.6)) == 11.5
    wants = {t: Flags(breaker=b) for t, b in ((4.0, "open"), (6.0, "half_open"), (10.0, "closed"))}
    pending = [(float(clk.effective_at(t)), Decision(flags=wants[t])) for t in (4.0, 6.0, 10.0)]
    assert latest_in_force(pending, 6.5, "flags") == wants[4.0]
    assert latest_in_force(pending, 11.5, "flags") == wants[10.0]
    assert latest_in_force(pending, 1.5, "flags") is None
    assert latest_in_force(pending, 11.5, "nodes") is None


def test_a_chain_is_frozen_and_each_run_starts_afresh():
    chain = load_chain(CHAIN)
    with pytest.raises(dataclasses.FrozenInstanceError):
        chain.name = "other"
    assert isinstance(chain, Chain) and all(hasattr(s, "reset") for s in chain.stages)
    tsdb = _trace()
    clk = Clocks(scrape_s=5, window_s=30, eval_s=5, poll_s=5)
    times = clk.eval_times(30.0, 600.0)
    first, second = chain.run(clk), chain.run(clk)
    first.run(tsdb, times)
    assert first.actions and not second.actions  # the run state is the run's, not the chain's
    second.run(tsdb, times)
    assert first.decisions().equals(second.decisions())
    assert first.timeline().equals(second.timeline())


def test_both_deciders_follow_one_protocol_step_by_step_or_all_at_once():
    tsdb = _trace()
    clk = Clocks(scrape_s=5, window_s=30, eval_s=5, poll_s=5)
    times = clk.eval_times(30.0, 600.0)
    for make in (lambda: Controller(RELA, clk), lambda: load_chain(CHAIN).run(clk)):
        stepped, batch = make(), make()
        wanted = [stepped.decide(tsdb, float(t)) for t in times]
        assert all(isinstance(w, Decision) for w in wanted)
        kind = "flags" if isinstance(stepped, Controller) else "nodes"
        assert all(getattr(w, kind) is not None for w in wanted)
        batch.run(tsdb, times)
        assert stepped.decisions().equals(batch.decisions())
        assert stepped.timeline().equals(batch.timeline())
        assert stepped.timeline()["time_s"].to_list() == times.tolist()
    assert isinstance(load_chain(CHAIN).run(clk), ChainRun)


def test_the_fleet_hands_out_plain_samples():
    import relakit
    from relakit.sim import Fleet

    sc = relakit.load_scenario(ROOT / "params" / "scenarios" / "mmc-demo.yaml",
                               overrides={"duration_s": 20})
    fleet = Fleet(sc, record_requests=False)
    fleet.advance(20.0)
    node_series, fleet_series = fleet.sample_series()
    got = fleet.samples(10.0)
    assert [g[0] for g in got] == [*range(sc.fleet.nodes), -1]
    for node, times, values in got:
        assert times.size and (times >= 10.0).all() and times.max() <= 20.0
        assert values.shape == (times.size, len(node_series if node >= 0 else fleet_series))
        assert np.isfinite(values).all()
    # the counters it hands out are the recorded metrics table's
    metrics = fleet.result().metrics
    col = node_series.index(("requests_total", "gold", "ok", None))
    row = metrics.filter((metrics["node"] == 0) & (metrics["name"] == "requests_total")
                         & (metrics["tier"] == "gold") & (metrics["outcome"] == "ok")
                         & (metrics["time_s"] == float(got[0][1][-1])))
    assert row.height == 1 and row["value"][0] == got[0][2][-1, col]


def _trace():
    from relakit.control import TSDB

    # four nodes whose errors step to 40 % at 200 s, scraped every 5 s
    return TSDB.from_long(synthetic.synthetic_trace("step", 600.0, scrape_s=5.0, nodes=4,
                                                    error_ratio=(0.0, 0.4), at_s=200.0,
                                                    seed=3))
