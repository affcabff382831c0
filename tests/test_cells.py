"""One closed loop over cells (issue 30, part 2): every layout — the whole fleet, zones,
a rollout's canary and rest — runs through ``experiment.run_closed_loop`` with its
deciders, control-plane faults and agents, and no run ignores a key it was given.

params/scenarios/zones-chain.yaml: the containment chain over two zones, one control
plane for the fleet, a config-server outage. params/scenarios/rollout-agent-fault.yaml:
a canary-cell rollout while the agents are down. The last test toggles, on each
layout, every scenario key that changes what the control plane does: the run with the
key must differ (audit or summary) from the run without it, or be refused with an
error naming the key.
"""

from __future__ import annotations

import polars as pl
import pytest
from conftest import ROOT

import relakit
from relakit.scenario import ScenarioError, load_scenario
from relakit.vocab import OUTCOMES
from relakit.zones import ZonedResult

SCENARIOS = ROOT / "params" / "scenarios"


def _node_requests(result, node: int, t0: float, t1: float) -> float:
    """Requests a node of one cell received between two metrics samples."""
    m = result.metrics.filter((pl.col("name") == "requests_total") & (pl.col("node") == node))
    at = m.group_by("time_s").agg(pl.col("value").sum())

    def value(t):
        return float(at.filter(pl.col("time_s") == t)["value"][0])

    return value(t1) - value(t0)


@pytest.fixture(scope="module")
def zoned_chain() -> ZonedResult:
    return relakit.simulate(SCENARIOS / "zones-chain.yaml", record_requests=False)


def test_a_chain_over_zones_isolates_a_node_in_its_own_zone_only(zoned_chain):
    d = zoned_chain.decisions
    isolate = d.filter((pl.col("stage") == "aegis") & (pl.col("action") == "isolate"))
    assert isolate["target"].to_list() == ["node 5"]  # numbered fleet-wide
    assert isolate["zone"].null_count() == isolate.height  # the fleet's control plane
    readmit = d.filter((pl.col("stage") == "phoenix") & (pl.col("action") == "readmit"))
    t0 = float(isolate["effective_at_s"][0]) + 4.0  # the next poll, and a sample after
    t1 = float(readmit["decided_at_s"].min()) - 2.0
    t0, t1 = 5 * (t0 // 5 + 1), 5 * (t1 // 5)  # on the metrics grid (5 s)
    assert t1 - t0 >= 10, (t0, t1)
    zone0, zone1 = zoned_chain.zones
    assert _node_requests(zone1, 1, t0, t1) == 0  # node 5 is zone 1's second node
    for node in (0, 2, 3):
        assert _node_requests(zone1, node, t0, t1) > 1000
    for node in range(4):  # zone 0 never lost a node
        assert _node_requests(zone0, node, t0, t1) > 1000
    errors = zoned_chain.by_zone().filter(pl.col("tier") == "all").sort("zone")["error"]
    assert errors[0] == 0 and errors[1] > 0


def test_the_config_server_outage_reaches_a_zoned_chain(zoned_chain):
    cp = zoned_chain.decisions.filter(pl.col("stage") == "control_plane")
    failed = cp.filter(pl.col("action") == "write_failed")["decided_at_s"]
    assert failed.min() >= 150 and failed.max() < 170 and failed.len() == 10  # 150, ..., 168
    assert set(cp["action"]) == {"write_failed", "poll_failed", "poll_ok"}
    assert zoned_chain.info["control_plane"]["writes"]["unreachable"] == 10
    assert zoned_chain.info["chain"]["actions"]["aegis.isolate"] >= 1


def test_a_chain_per_zone_is_refused_naming_the_key():
    with pytest.raises(ScenarioError, match="key 'chain': a chain judges the whole fleet"):
        load_scenario(SCENARIOS / "zones-chain.yaml",
                      overrides={"policy": str(ROOT / "params" / "policies" / "rela.yaml"),
                                 "policy.scope": "zone"})


@pytest.fixture(scope="module")
def rollout_agents():
    return relakit.simulate(SCENARIOS / "rollout-agent-fault.yaml", record_requests=False)


def test_a_rollout_runs_with_its_cells_agents_down(rollout_agents):
    d = rollout_agents.decisions
    cp = d.filter(pl.col("stage") == "control_plane")
    for cell in (0, 1):  # each cell's agent: down at 20 s, back cold at 50 s
        mine = cp.filter(pl.col("zone") == cell)
        assert mine.filter(pl.col("action") == "down")["decided_at_s"].to_list() == [20.0]
        assert mine.filter(pl.col("action") == "restart")["decided_at_s"].to_list() == [50.0]
        assert mine.filter(pl.col("action") == "skip").height == 15  # 20, 22, ..., 48
    policy = d.filter(pl.col("stage") == "policy")
    assert policy.filter(pl.col("decided_at_s").is_between(20, 50, closed="left")).height == 0
    start = d.filter((pl.col("stage") == "rollout") & (pl.col("action") == "start"))
    assert start["decided_at_s"].to_list() == [30.0]  # while the agents were down
    # the canary's agent came back running the configuration installed meanwhile
    canary = policy.filter((pl.col("zone") == 0) & pl.col("decided_at_s").is_between(50, 60))
    assert canary.height > 0 and set(canary["policy"]) == {"new"}
    rest = policy.filter((pl.col("zone") == 1) & (pl.col("decided_at_s") >= 50))
    assert set(rest["policy"]) == {"current"}
    o = rollout_agents.outcome
    assert o["action"] == "rollback" and o["at_s"] > 50
    back = policy.filter((pl.col("zone") == 0) & (pl.col("decided_at_s") > o["at_s"]))
    assert set(back["policy"]) <= {"current"}


def test_a_fleet_scope_zoned_run_has_its_agent_fault():
    """Found by running it (issue 30): this ran with exit 0 and no control-plane rows."""
    sc = load_scenario(SCENARIOS / "zones-overload.yaml", overrides={
        "duration_s": 120, "control_plane": {"agent": {"start_s": 60, "end_s": 90}}})
    d = relakit.simulate(sc, record_requests=False).decisions
    cp = d.filter(pl.col("stage") == "control_plane")
    assert cp.filter(pl.col("action") == "skip").height == 15  # 60, 62, ..., 88
    assert cp["zone"].null_count() == cp.height
    policy = d.filter(pl.col("stage") == "policy")
    assert policy.filter(pl.col("decided_at_s").is_between(60, 90, closed="left")).height == 0


# ---- no run ignores a key it was given ------------------------------------------------------
POLICY = str(ROOT / "params" / "policies" / "rela.yaml")
CHAIN = str(ROOT / "params" / "chains" / "aegis.yaml")
BASE = {
    "name": "keys", "duration_s": 60, "seed": 5,
    "workload": {"arrival": {"kind": "poisson", "rate_rps": 1600},
                 "tiers": {"gold": 0.1, "silver": 0.3, "bronze": 0.6}, "deadline_ms": 200},
    "fleet": {"nodes": 6, "servers": 4, "routing": "p2c", "queue_limit": 100,
              "service": {"kind": "exponential", "mean_ms": 10}},
    "faults": [{"node": 1, "start_s": 5, "end_s": 60, "error_rate": 0.4},
               {"node": 4, "start_s": 5, "end_s": 60, "slowdown": 3}],
    "mitigations": {"hedge": {"delay_ms": 30, "cancel": "started"},
                    "degraded": {"service_factor": 0.6}},
    "policy": POLICY, "clocks": {"scrape_s": 2, "window_s": 10, "eval_s": 2, "poll_s": 2},
    "metrics": {"interval_s": 2},
}
ROLLOUT = {"policy": str(ROOT / "params" / "policies" / "rela-eager-shed.yaml"),
           "canary": {"fraction": 0.5}, "start_s": 10, "observe_s": 10,
           "promote_if": {"all": [{"metric": "success_ratio", "tier": "all", "op": ">",
                                   "margin": 0.5}]}}
LAYOUTS = {
    "fleet": {},
    "zones, scope fleet": {"fleet.zones": [3, 3]},
    "zones, scope zone": {"fleet.zones": [3, 3], "policy.scope": "zone"},
    "rollout": {"rollout": ROLLOUT},
}
# (key, overrides in both runs, overrides of the run with the key)
SLOW_NODE_0 = {"node": 0, "start_s": 5, "end_s": 60, "slowdown": 40}  # attempts time out
SERVER_DOWN = {"control_plane": {"config_server": {"start_s": 20, "end_s": 40}}}
TOGGLES = [
    ("control_plane.agent", {}, {"control_plane": {"agent": {"start_s": 20, "end_s": 30}}}),
    ("control_plane.config_server", {}, SERVER_DOWN),
    ("control_plane.prometheus", {}, {"control_plane": {"prometheus": {
        "start_s": 10, "end_s": 40}}}),
    ("agents", {"control_plane": {"agent": {"start_s": 20, "end_s": 40}}},
     {"agents": {"replicas": 2, "lease_s": 6, "renew_s": 2}}),
    ("data_plane", SERVER_DOWN, {"data_plane": {"on_stale": "defaults", "stale_after_s": 4}}),
    ("chain", {}, {"chain": CHAIN}),
    ("overrides", {}, {"overrides": [{"flag": "shed_bronze", "value": True, "start_s": 10,
                                      "end_s": 30}]}),
    ("faults", {}, {"faults": [{"node": 2, "start_s": 10, "end_s": 40, "crash": True}]}),
    # the data plane's keys that came after the one closed loop (issues 33-35)
    ("mitigations.client_throttle", {},
     {"mitigations.client_throttle": {"k": 1.1, "window_s": 10}}),
    ("mitigations.concurrency_limit", {},
     {"mitigations.concurrency_limit": {"algorithm": "aimd", "initial": 4, "max": 6}}),
    ("mitigations.codel", {}, {"mitigations.codel": {"target_ms": 1, "interval_ms": 20}}),
    ("fleet.queue_discipline", {}, {"fleet.queue_discipline": "lifo"}),
    ("initial", {"mitigations.retries": {"max_attempts": 3}},
     {"initial": {"queue": 60, "pending_retries": 200}}),
    ("mitigations.retries.on_timeout", {"mitigations.retries": {"max_attempts": 3},
                                        "faults": [*BASE["faults"], SLOW_NODE_0]},
     {"mitigations.retries.on_timeout": "keep_listening"}),
    ("workload.clients", {}, {"workload.clients": {
        "population": 40, "think": {"kind": "exponential", "mean_ms": 20}}}),
]
COUNTS = ["tier", "requests", *OUTCOMES]


def _run(layout: str, *overrides: dict):
    merged = dict(LAYOUTS[layout])
    for o in overrides:
        merged.update(o)
    sc = load_scenario(BASE, overrides=merged)
    r = relakit.simulate(sc, record_requests=False)
    audit = (r.decisions.select("decided_at_s", "stage", "action", "target")
             .sort(pl.all()) if r.decisions is not None else None)
    # every count column in both runs (0 where an outcome cannot occur): a table that gains a
    # column only because the fleet is configured is not a trace of the key
    return r.summary.select(pl.col(c) if c in r.summary.columns else pl.lit(0).alias(c)
                            for c in COUNTS), audit


_BASES: dict = {}


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize(("key", "both", "on"), TOGGLES, ids=[t[0] for t in TOGGLES])
def test_no_run_ignores_a_key_it_was_given(layout, key, both, on):
    """The run with the key differs from the run without it in its audit or its summary
    (same seed: a key the run ignored gives identical tables), or the scenario is
    refused with an error naming the key. Keys of the control plane must leave
    control-plane rows."""
    try:
        with_key = _run(layout, both, on)
    except (ScenarioError, ValueError) as e:
        assert f"key '{key.split('.')[0]}" in str(e), str(e)
        return
    base_key = (layout, str(both))
    if base_key not in _BASES:
        _BASES[base_key] = _run(layout, both)
    without = _BASES[base_key]
    assert not (with_key[0].equals(without[0]) and with_key[1].equals(without[1])), (
        f"{layout}: {key} left no trace")
    if key.startswith(("control_plane", "agents", "data_plane")):
        new = with_key[1].join(without[1], on=with_key[1].columns, how="anti")
        assert new.filter(pl.col("stage") == "control_plane").height > 0, (layout, key)


def test_what_reads_one_fleet_refuses_cells_naming_the_key():
    """Replications, comparisons, sweep points and search trials read one fleet's result
    (latency quantiles, one controller): a zoned fleet or a rollout is refused there,
    never summed into a wrong table."""
    from relakit.comparison import compare

    zoned = load_scenario(SCENARIOS / "zones-overload.yaml",
                          overrides={"duration_s": 20, "faults": []})
    with pytest.raises(ValueError, match="key 'replications': a zoned fleet runs one"):
        relakit.simulate(zoned, replications=2)
    with pytest.raises(ValueError, match="key 'fleet.zones': a replicated run reads one"):
        compare(zoned, zoned, replications=2)
    rollout = SCENARIOS / "rollout-agent-fault.yaml"
    with pytest.raises(ValueError, match="key 'rollout': a replicated run reads one"):
        compare(rollout, rollout, replications=2)


def test_a_closed_population_in_a_fraction_canary_is_refused_at_load():
    """Refused when the scenario is read (it was refused by the cells once the run had
    started), naming the population."""
    with pytest.raises(ScenarioError, match="key 'workload.clients': a closed client"):
        load_scenario(BASE, overrides={"rollout": ROLLOUT, "workload.clients": {
            "population": 40, "think": {"kind": "exponential", "mean_ms": 20}}})
