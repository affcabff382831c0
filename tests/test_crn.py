"""Common random numbers: each kind of randomness has its own stream.

Two runs with the same seed that differ only in policy, thresholds or
mitigations must see the same arrivals (times and tiers) and the same service
demand request for request, even when the change alters how many jobs exist
(shedding, hedges, retries, degraded fan-out). Each test also checks that the
change did change what happened, so the equality is not vacuous.
"""

from __future__ import annotations

import copy

import numpy as np
import polars as pl
import pytest
import yaml
from conftest import ROOT, make_scenario

import relakit
from relakit.sim import kernel as K
from relakit.sim.rng import XoshiroPy, new_state

SLOW_PATH = {"kind": "bimodal", "fast_ms": 5, "slow_ms": 200, "slow_fraction": 0.05}
DRAWN = ["tier", "service_ms"]  # what the arrivals and service streams decide


def _paired(a, b) -> pl.DataFrame:
    """The requests both runs recorded, joined on arrival time (each is unique: a
    continuous draw), with both runs' drawn columns side by side."""
    ra, rb = a.requests, b.requests
    assert ra["arrival_s"].n_unique() == ra.height and rb["arrival_s"].n_unique() == rb.height
    joined = ra.join(rb, on="arrival_s", how="inner", suffix="_b")
    # only requests still in flight when a run ended may be missing from the other
    for r, other in ((a, b), (b, a)):
        assert joined.height >= r.requests.height - other.info["in_flight_at_end"]
    assert a.info["user_requests"] == b.info["user_requests"]  # same arrivals, same count
    return joined


def _assert_same_draws(a, b) -> pl.DataFrame:
    joined = _paired(a, b)
    assert joined.height > 1000
    for col in DRAWN:
        assert (joined[col] == joined[f"{col}_b"]).all(), col
    return joined


def _ramp() -> dict:
    """params/scenarios/rela-ramp.yaml shrunk to two nodes and 240 s (RelA's policy and
    clocks inline), so survival is entered within the run."""
    sc = yaml.safe_load((ROOT / "params/scenarios/rela-ramp.yaml").read_text())
    sc["policy"] = yaml.safe_load((ROOT / "params/policies/rela.yaml").read_text())
    sc["clocks"] = yaml.safe_load((ROOT / "params/clocks/rela.yaml").read_text())
    sc["duration_s"] = 240
    sc["fleet"]["nodes"] = 2  # capacity about 1,480 req/s
    sc["workload"]["arrival"]["points"] = [[0, 600], [30, 600], [150, 2100], [240, 2100]]
    return sc


def test_a_threshold_change_keeps_arrivals_and_demands_request_for_request():
    base = _ramp()
    latency_only = copy.deepcopy(base)  # survival on errors and timeouts alone
    latency_only["policy"]["conditions"]["overloaded"]["threshold"] = 1e9
    a, b = relakit.simulate(base), relakit.simulate(latency_only)
    # the threshold changed what the controller decided, and when
    changes = [[(m["mode"], m["decided_at_s"]) for m in r.info["control"]["mode_changes"]]
               for r in (a, b)]
    assert changes[0] != changes[1]
    first = [min(t for mode, t in c if mode == "survival") for c in changes]
    assert first[0] < first[1]  # on latency, survival comes sooner
    joined = _assert_same_draws(a, b)
    # ... and so what the fleet did to the same requests: shed, degraded, latency
    assert (joined["degraded"] != joined["degraded_b"]).sum() > 1000
    assert ((joined["outcome"] == "dropped") != (joined["outcome_b"] == "dropped")).sum() > 1000
    assert not np.allclose(joined["latency_ms"], joined["latency_ms_b"])


def _fanout(**extra) -> dict:
    """Three calls a request over eight nodes with a slow path and 2 % errors, deadlines,
    retries and hedging on: every mitigation makes extra copies."""
    faults = [{"node": i, "start_s": 0, "end_s": 1e9, "error_rate": 0.02} for i in range(8)]
    sc = make_scenario(rate=500, duration=60, nodes=8, servers=4, fanout=3, service=SLOW_PATH,
                       deadline_ms=150, faults=faults,
                       tiers={"gold": 0.2, "silver": 0.3, "bronze": 0.5})
    sc["controls"] = {"hedge_enabled": True}
    sc["mitigations"] = {"hedge": {"delay_ms": 20, "cancel": "queued"},
                         "retries": {"max_attempts": 3, "backoff_ms": 5},
                         "degraded": {"fanout": 1, "service_factor": 0.5}}
    for key, value in extra.items():
        sc[key] = {**sc.get(key, {}), **value}
    return sc


def test_a_hedge_delay_change_keeps_arrivals_and_demands_request_for_request():
    early = relakit.simulate(_fanout())
    late = relakit.simulate(_fanout(mitigations={
        "hedge": {"delay_ms": 60, "cancel": "queued"},
        "retries": {"max_attempts": 3, "backoff_ms": 5},
        "degraded": {"fanout": 1, "service_factor": 0.5}}))
    assert early.info["hedges"] > late.info["hedges"] > 0
    assert early.info["retries"] != late.info["retries"]
    joined = _assert_same_draws(early, late)
    assert (joined["attempts"] != joined["attempts_b"]).sum() > 1000


def test_shedding_and_degraded_fanout_keep_demands_of_the_requests_they_spare():
    plain = relakit.simulate(_fanout())
    cut = relakit.simulate(_fanout(controls={"hedge_enabled": True, "shed_bronze": True,
                                             "degraded_mode": True}))
    joined = _assert_same_draws(plain, cut)
    assert (joined["fanout"] == 3).all() and (joined["fanout_b"] == 1).all()
    shed = joined.filter(pl.col("tier") == "bronze")
    assert (shed["outcome_b"] == "dropped").all() and (shed["outcome"] != "dropped").any()
    # a shed or degraded request still had its demand drawn: the ones after it match too
    last = joined.sort("arrival_s").tail(100)
    assert (last["service_ms"] == last["service_ms_b"]).all()


@pytest.mark.parametrize("routing", ["round_robin", "jsq", "p2c"])
def test_routing_draws_do_not_move_arrivals_or_demands(routing):
    sc = make_scenario(rate=2500, duration=20, nodes=4, servers=8,
                       tiers={"gold": 0.2, "silver": 0.3, "bronze": 0.5})
    other = make_scenario(rate=2500, duration=20, nodes=4, servers=8, routing=routing,
                          tiers={"gold": 0.2, "silver": 0.3, "bronze": 0.5})
    a, b = relakit.simulate(sc), relakit.simulate(other)
    joined = _assert_same_draws(a, b)
    assert (joined["node"] != joined["node_b"]).sum() > 1000  # the routing did differ


def test_changing_the_seed_changes_every_stream():
    a = relakit.simulate(make_scenario(rate=500, duration=10, nodes=2, seed=1))
    b = relakit.simulate(make_scenario(rate=500, duration=10, nodes=2, seed=2))
    n = min(a.requests.height, b.requests.height)
    sa, sb = a.requests.sort("arrival_s").head(n), b.requests.sort("arrival_s").head(n)
    assert (sa["arrival_s"] != sb["arrival_s"]).all()
    assert (sa["service_ms"] != sb["service_ms"]).all()


def test_the_numpy_jump_is_the_python_twins_jump():
    """rng.new_state jumps with a 256 x 256 bit matrix (numpy, no compile); XoshiroPy
    runs Vigna's 256 steps: the same words for many seeds and streams, and for any
    state, not only a seed's."""
    from relakit.sim.rng import jump_words

    for seed in (0, 1, 7, 2**32 + 3, 2**63 + 5, 2**64 - 1, 123456789):
        state = new_state(seed, 24)
        twin = XoshiroPy(seed)
        for k in range(24):
            assert [int(w) for w in state[k]] == twin.s, (seed, k)
            twin.jump()
    draws = np.random.default_rng(3).integers(0, 2**64, size=(50, 4), dtype=np.uint64)
    for words in draws:
        twin = XoshiroPy.from_words(words)
        twin.jump()
        assert [int(w) for w in jump_words(words)] == twin.s
    assert [int(w) for w in jump_words(np.zeros(4, dtype=np.uint64))] == [0, 0, 0, 0]


def test_streams_are_jumped_apart_and_match_the_python_twin():
    state = new_state(7, K.N_STREAMS)
    assert state.shape == (K.N_STREAMS, 4) and len(set(map(tuple, state.tolist()))) == K.N_STREAMS
    assert len(K.STREAMS) == len(set(K.STREAMS)) == K.N_STREAMS
    for i in range(K.N_STREAMS):
        twin = XoshiroPy(7, stream=i)
        assert twin.s == [int(w) for w in state[i]]
    # stream 0 is the seed's own state: XoshiroPy(seed) is unchanged by the split
    assert XoshiroPy(7).s == [int(w) for w in state[0]]
    # a kernel draw from one stream leaves the others where they were
    from relakit.sim.rng import uniform

    @__import__("numba").njit
    def draw(s, k):
        return uniform(s, k)

    before = state.copy()
    twin = XoshiroPy(7, stream=K.RNG_SERVICE)
    assert draw(state, K.RNG_SERVICE) == twin.random()
    changed = np.any(state != before, axis=1)
    assert changed.tolist() == [i == K.RNG_SERVICE for i in range(K.N_STREAMS)]


def test_a_service_scale_keeps_arrivals_demands_and_routing():
    """fleet.service_scale scales a demand where it is served, so nothing new is drawn:
    a fleet with one node three times as slow sees the same arrivals, tiers, demands
    and (random routing) nodes request for request; only that node's requests change."""
    sc = make_scenario(rate=700, duration=60, nodes=3, servers=4,
                       service={"kind": "exponential", "mean_ms": 3})
    slow = copy.deepcopy(sc)
    slow["fleet"]["service_scale"] = [1.0, 3.0, 1.0]
    a, b = relakit.simulate(sc), relakit.simulate(slow)
    joined = _assert_same_draws(a, b)
    assert (joined["node"] == joined["node_b"]).all()
    on1 = joined.filter(pl.col("node") == 1)
    assert on1["latency_ms_b"].mean() > 2.5 * on1["latency_ms"].mean()  # it did change
    off1 = joined.filter(pl.col("node") != 1)
    assert (off1["latency_ms"] == off1["latency_ms_b"]).all()  # the other nodes untouched
