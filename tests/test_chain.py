"""The containment chain's scenarios, each asserted with numbers, and its audit."""

from __future__ import annotations

import polars as pl
import pytest
import yaml
from conftest import ROOT

import relakit
from relakit.chain import SEED_ORDER, load_chain
from relakit.control import TSDB, Clocks
from relakit.openloop import replay

SCEN = ROOT / "params" / "scenarios"
CHAINS = ROOT / "params" / "chains"


def _run(name, chain=None, **aegis):
    overrides = {}
    if chain is not None or aegis:
        spec = yaml.safe_load((CHAINS / (chain or "aegis.yaml")).read_text())
        spec["aegis"].update(aegis)
        overrides["chain"] = spec
    return relakit.simulate(relakit.load_scenario(SCEN / name, overrides=overrides))


def _acts(result, action, target=None):
    d = result.decisions.filter(pl.col("action") == action)
    return d if target is None else d.filter(pl.col("target") == target)


def _success(result, start, end=None):
    req = result.requests.filter(pl.col("arrival_s") >= start)
    if end is not None:
        req = req.filter(pl.col("arrival_s") < end)
    return req["outcome"].eq("ok").mean()


@pytest.fixture(scope="module")
def one_node():
    return _run("chain-one-node.yaml")


def test_a_failing_node_is_isolated_repaired_and_readmitted(one_node):
    iso = _acts(one_node, "isolate", "node 3")
    assert iso.height == 1 and 60 < iso["decided_at_s"][0] <= 72
    assert "error rate" in iso["reason"][0] and iso["threshold"][0] == 0.2
    repaired = _acts(one_node, "repaired", "node 3")["decided_at_s"][0]
    assert repaired == pytest.approx(iso["decided_at_s"][0] + 30)
    readmit = _acts(one_node, "readmit", "node 3")["decided_at_s"][0]
    admit = _acts(one_node, "admit", "node 3")["decided_at_s"][0]
    assert readmit == repaired and admit == pytest.approx(readmit + 60)
    assert one_node.info["chain"]["faulty_at_end"] == []
    # before the fault nothing fails: every request answered before t = 60 s succeeded (one
    # that arrived just before 60 s and was answered just after may meet the fault)
    before = one_node.requests.filter((pl.col("arrival_s") >= 30)
                                      & (pl.col("arrival_s") + pl.col("latency_ms") / 1e3 < 60))
    assert before.height > 50_000 and before["outcome"].eq("ok").all()
    assert _success(one_node, 62, 75) < 0.99  # the failing node's share, before isolation
    assert _success(one_node, 120) == 1.0  # restored
    # no other node was touched
    assert set(one_node.decisions.filter(pl.col("target").str.starts_with("node"))["target"]) \
        == {"node 3"}


def test_every_action_has_a_reason_a_signal_value_and_a_threshold(one_node):
    runs = [one_node, _run("chain-cascade.yaml")]
    for r in runs:
        d = r.decisions
        assert d.height > 0
        assert (d["reason"].str.len_chars() > 15).all()
        assert d["stage"].is_in(list(SEED_ORDER)).all()
        assert d["value"].is_not_null().all() and d["threshold"].is_not_null().all()
        assert d["signal"].is_not_null().all() and d["target"].is_not_null().all()
        assert (d["effective_at_s"] >= d["decided_at_s"]).all()


def test_the_seed_over_isolates_into_collapse_and_the_guards_stop_it():
    seed = _run("chain-cascade.yaml", breakers=False)
    guarded = _run("chain-cascade.yaml", chain="aegis-guarded.yaml", breakers=False)
    # node after node: every node out at some point; load errors, not faults
    assert seed.info["chain"]["min_working_nodes"] == 0
    assert _acts(seed, "isolate").filter(pl.col("stage") == "aegis").height >= 5
    assert _success(seed, 120) < 0.05
    assert guarded.info["chain"]["min_working_nodes"] >= 2
    assert _success(guarded, 120) > 0.4
    holds = _acts(guarded, "hold")
    assert holds.height > 0 and holds["reason"].str.contains("cap|panic").any()


def test_throttling_keeps_an_overloaded_healthy_node_working():
    throttled = _run("chain-throttle.yaml")
    unthrottled = _run("chain-throttle.yaml", load_threshold=10.0)
    assert _acts(throttled, "throttle", "node 0").height == 1
    assert _acts(throttled, "isolate").height == 0
    late = throttled.requests.filter(pl.col("arrival_s") > 160)
    node0 = late.filter((pl.col("node") == 0) & (pl.col("outcome") == "ok")).height / 80
    assert node0 > 300  # near its 400 req/s capacity, doing useful work
    assert late["outcome"].eq("ok").all()
    assert _acts(unthrottled, "isolate", "node 0").height >= 1  # healthy, but isolated
    late_u = unthrottled.requests.filter(pl.col("arrival_s") > 160)
    assert late_u.filter((pl.col("node") == 0) & (pl.col("outcome") == "ok")).height / 80 < \
        node0 / 2


def test_a_silent_failure_is_never_caught():
    r = _run("chain-silent.yaml")
    assert _acts(r, "isolate").height == 0
    served = r.requests.filter(pl.col("arrival_s") > 60)
    wrong = 1 - served["correct"].mean()
    on2 = served.filter(pl.col("node") == 2)
    assert wrong == pytest.approx(0.3 * on2.height / served.height, rel=0.1)
    assert wrong > 0.03 and served["outcome"].eq("ok").all()


def test_wrong_attribution_and_the_call_graph_that_fixes_it():
    seed = _run("chain-attribution.yaml")
    aware = _run("chain-attribution.yaml", chain="aegis-callgraph.yaml")
    isolated = set(_acts(seed, "isolate")["target"])
    assert isolated == {"node 2"}  # the caller, not the culprit
    assert seed.info["chain"]["faulty_at_end"] == [5]
    assert _success(seed, 200) < 0.95
    assert set(_acts(aware, "isolate")["target"]) == {"node 5"}
    assert aware.info["chain"]["faulty_at_end"] == []
    assert _success(aware, 200) == 1.0


def test_swapping_aegis_and_atlas_sends_work_to_nodes_that_should_be_out():
    swapped_spec = yaml.safe_load((CHAINS / "aegis-atlas-swapped.yaml").read_text())
    seed_spec = dict(swapped_spec, order=list(SEED_ORDER))
    assert load_chain(swapped_spec).order.index("atlas") < load_chain(
        swapped_spec).order.index("aegis")
    sent = {}
    for name, spec in (("swapped", swapped_spec), ("seed", seed_spec)):
        r = relakit.simulate(relakit.load_scenario(SCEN / "chain-swapped.yaml",
                                                   overrides={"chain": spec}))
        total = 0
        for node, start in ((1, 60.0), (2, 90.0)):
            out = _acts(r, "isolate", f"node {node}")["effective_at_s"][0]
            total += r.requests.filter((pl.col("node") == node)
                                       & pl.col("arrival_s").is_between(start, out)).height
        sent[name] = total
    # one evaluation's worth (2 s of a node's ~250 req/s) more per failing node
    assert sent["swapped"] > sent["seed"] + 600


def test_the_chain_replays_over_recorded_metrics_with_the_same_isolation(one_node):
    rep = replay(TSDB.from_long(one_node.metrics), chain=CHAINS / "aegis.yaml",
                 clocks=Clocks(scrape_s=5, window_s=20), servers=[4] * 10, start_s=0.0,
                 end_s=90.0)
    iso = rep.decisions.filter(pl.col("action") == "isolate")
    assert iso["target"].to_list() == ["node 3"]
    closed = _acts(one_node, "isolate", "node 3")
    assert iso["decided_at_s"][0] == closed["decided_at_s"][0]
    assert iso["value"][0] == pytest.approx(closed["value"][0])


def test_bad_chain_files_name_the_key(tmp_path):
    for text, key in (("order: [aegis, sentinel, oracle]\n", "order"),
                      ("aegis: {error_treshold: 0.2}\n", "aegis"),
                      ("atlas: {balance: greedy}\n", "atlas.balance")):
        path = tmp_path / "c.yaml"
        path.write_text(text)
        with pytest.raises(relakit.ScenarioError) as err:
            load_chain(path)
        assert "c.yaml" in str(err.value) and key in str(err.value)


def test_simulate_command_with_a_chain_prints_its_actions(tmp_path, capsys):
    from relakit.cli import main

    assert main(["simulate", str(SCEN / "chain-one-node.yaml"), "--out", str(tmp_path),
                 "--no-requests"]) == 0
    out = capsys.readouterr().out
    assert "[aegis] isolate" in out and "chain actions" in out
    d = pl.read_parquet(tmp_path / "decisions.parquet")
    assert set(d["stage"]) >= {"aegis", "punisher", "phoenix"}
