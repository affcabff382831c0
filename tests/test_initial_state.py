"""Start states (``initial:``) and ``retries.on_timeout`` (issue 34, part 1).

The kernel against :func:`relakit.sim.reference.retry_node_reference`, a pure-Python
node written from the scenario language's definitions: request for request (arrival,
latency, outcome, attempts) over abandon and keep_listening, started idle, full, and
with pending retries, in the loop a fleet chooses and in the general one. Then the
one-line errors, and the zone split of a start state.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import yaml

from relakit.experiment import run_once
from relakit.scenario import ScenarioError, load_scenario
from relakit.sim import Fleet
from relakit.sim import kernel as K
from relakit.sim.reference import retry_node_reference

NODE = {
    "name": "node", "duration_s": 300, "seed": 7,
    "workload": {"arrival": {"kind": "poisson", "rate_rps": 9.5}, "tiers": {"gold": 1.0},
                 "deadline_ms": 3000},
    "fleet": {"nodes": 1, "servers": 1, "service": {"kind": "exponential", "mean_ms": 100},
              "queue_limit": 100},
    "mitigations": {"retries": {"max_attempts": 5, "backoff_ms": 0, "jitter": False,
                                "retry_on": ["timeout"]}},
    "metrics": {"interval_s": 1.0},
}


def node(on_timeout="abandon", queue=0, pending=0, backoff_ms=0, jitter=False, deadline_ms=3000,
         rate=9.5, queue_limit=100, attempts=5):
    d = copy.deepcopy(NODE)
    d["workload"]["arrival"]["rate_rps"] = rate
    d["workload"]["deadline_ms"] = deadline_ms
    d["fleet"]["queue_limit"] = queue_limit
    r = d["mitigations"]["retries"]
    r.update(backoff_ms=backoff_ms, jitter=jitter, on_timeout=on_timeout, max_attempts=attempts)
    if deadline_ms is None:
        del d["workload"]["deadline_ms"]
        d["mitigations"] = {}
    if queue or pending:
        d["initial"] = {"queue": queue, "pending_retries": pending}
    return d


def kernel_requests(d, general=False):
    sc = load_scenario(d)
    if general:
        fleet = Fleet(sc, seed=d["seed"])
        fleet.specialise = False
        fleet.advance(d["duration_s"])
        req = fleet.result().requests
    else:
        req = run_once(sc, d["seed"], record_requests=True).requests
    return (req["arrival_s"].to_numpy(), req["latency_ms"].to_numpy(),
            req["outcome"].to_list(), req["attempts"].to_numpy())


def reference_requests(d):
    r = d.get("mitigations", {}).get("retries", {})
    dl = d["workload"].get("deadline_ms")
    ini = d.get("initial", {})
    out = retry_node_reference(
        d["workload"]["arrival"]["rate_rps"], 100.0, 1, d["fleet"]["queue_limit"],
        np.inf if dl is None else dl / 1000.0, r.get("max_attempts", 1),
        r.get("backoff_ms", 0) / 1000.0, 1.0, r.get("jitter", False), d["duration_s"], d["seed"],
        on_timeout=r.get("on_timeout", "abandon"), initial_queue=ini.get("queue", 0),
        pending_retries=ini.get("pending_retries", 0))
    return (np.array([o[0] for o in out]), np.array([o[1] for o in out]), [o[2] for o in out],
            np.array([o[3] for o in out]))


CASES = {
    "idle, abandon": node(),
    "idle, keep_listening": node("keep_listening"),
    "full, abandon": node(queue=101),
    "full, keep_listening": node("keep_listening", queue=101),
    "pending retries, abandon": node(queue=60, pending=20, backoff_ms=50, jitter=True),
    "pending retries, keep_listening": node("keep_listening", queue=60, pending=20,
                                            backoff_ms=50, jitter=True),
    "small node, keep_listening": node("keep_listening", queue=30, pending=5, backoff_ms=20,
                                       jitter=True, deadline_ms=1000, rate=9.0, queue_limit=30),
    "no deadline, started with a queue (the plain loops)": node(queue=40, deadline_ms=None,
                                                                queue_limit=None),
}


@pytest.mark.parametrize("general", [False, True], ids=["chosen loop", "general loop"])
@pytest.mark.parametrize("d", CASES.values(), ids=CASES.keys())
def test_kernel_equals_the_reference_request_for_request(d, general):
    a, lat, outcome, attempts = kernel_requests(d, general)
    ra, rlat, routcome, rattempts = reference_requests(d)
    assert len(a) == len(ra) > 2000
    np.testing.assert_allclose(a, ra, rtol=0, atol=1e-9)
    np.testing.assert_allclose(lat, rlat, rtol=0, atol=1e-6)
    assert outcome == routcome
    np.testing.assert_array_equal(attempts, rattempts)


def test_the_cases_exercise_what_they_name():
    """Each mode meets what it exists for: a late answer that answers (keep_listening: ok
    after more than one attempt with latency past a deadline it could not otherwise
    beat), abandonment (timeouts), refusals, and pending retries (two attempts at once)."""
    _, lat, outcome, attempts = reference_requests(CASES["full, keep_listening"])
    late_ok = [o == "ok" and n > 1 and (lt / 1000.0) % 3.0 > 0 for o, n, lt in
               zip(outcome, attempts, lat, strict=True)]
    assert sum(late_ok) > 50
    _, _, outcome, _ = reference_requests(CASES["full, abandon"])
    assert outcome.count("timeout") > 50 and outcome.count("error") > 500
    a, _, _, attempts = reference_requests(CASES["pending retries, abandon"])
    assert ((a == 0.0) & (attempts >= 2)).sum() >= 20


def test_a_start_state_is_seeded_as_the_loop_would_hold_it():
    sc = load_scenario(node(queue=101))
    fleet = Fleet(sc)
    st = fleet.st
    assert st.node_i[0, K.NI_BUSY] == 1 and st.node_i[0, K.NI_QLEN] == 100
    assert st.is_[K.IS_IN_FLIGHT_USERS] == 101 and fleet.users_in_flight == 101
    assert st.tq_n[K.TQ_TIMEOUT, 1] == 101  # a deadline per attempt, in the order sent
    t, jobs = run_once(sc, 7, record_requests=False).jobs_in_system()
    assert jobs[0] >= 100


def test_no_start_state_draws_nothing_and_changes_nothing():
    """An empty ``initial`` is the idle start: the streams and rows are untouched."""
    a = Fleet(load_scenario(node()))
    b = Fleet(load_scenario(dict(node(), initial={"queue": 0, "pending_retries": 0})))
    np.testing.assert_array_equal(a.st.rng, b.st.rng)
    np.testing.assert_array_equal(a.st.job_i, b.st.job_i)


BAD = {
    "a queue list of the wrong length": (
        dict(node(), initial={"queue": [1, 2]}), ["initial.queue", "one entry per node (1)"]),
    "a queue that does not fit": (
        dict(node(), initial={"queue": 102}),
        ["initial.queue", "102", "queue_limit 100", "at most 101"]),
    "a negative queue": (dict(node(), initial={"queue": -1}), ["initial.queue", ">= 0"]),
    "a fractional pending count": (
        dict(node(), initial={"pending_retries": 2.5}), ["initial.pending_retries", "whole"]),
    "pending retries without retries": (
        dict(node(attempts=1), initial={"pending_retries": 3}),
        ["initial.pending_retries", "max_attempts >= 2"]),
    "an unknown key": (dict(node(), initial={"queued": 3}),
                       ["'initial'", "queued", "pending_retries"]),
    "a start state with fan-out": (
        {**copy.deepcopy(node()), "initial": {"queue": 3},
         "fleet": {"nodes": 2, "servers": 1, "service": {"kind": "exponential", "mean_ms": 100}},
         "workload": {"arrival": {"kind": "poisson", "rate_rps": 5}, "fanout": 2}},
        ["'initial'", "fan-out is 2"]),
    "an unknown on_timeout": (
        node("listen"), ["mitigations.retries.on_timeout", "'listen'", "keep_listening"]),
    "keep_listening with no deadline": (
        {**node("keep_listening"), "workload": {"arrival": {"kind": "poisson", "rate_rps": 5}}},
        ["mitigations.retries.on_timeout", "workload.deadline_ms"]),
    "keep_listening with no retry": (
        node("keep_listening", attempts=1),
        ["mitigations.retries.on_timeout", "max_attempts >= 2"]),
}


@pytest.mark.parametrize("data, expected", BAD.values(), ids=BAD.keys())
def test_bad_start_states_and_on_timeout_are_one_line_errors(tmp_path, data, expected):
    path = tmp_path / "bad-start.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    msg = str(info.value)
    assert msg.startswith(str(path)) and "\n" not in msg, msg
    for part in expected:
        assert part in msg, (part, msg)


def test_keep_listening_runs_the_general_loop_and_folds_away_elsewhere():
    sc = load_scenario(node("keep_listening"))
    fleet = Fleet(sc)
    assert "keep_listening" in K.features_of(fleet.cfg, fleet.st)
    plain = Fleet(load_scenario(node()))
    assert "keep_listening" not in K.features_of(plain.cfg, plain.st)


def test_a_zoned_start_state_splits_by_node_and_by_share():
    from relakit.zones import zone_scenario

    d = copy.deepcopy(node(deadline_ms=None, queue_limit=None))
    d["fleet"] = {"nodes": 3, "servers": 1, "zones": [2, 1], "zone_mix": [0.5, 0.5],
                  "service": {"kind": "exponential", "mean_ms": 100}}
    d["mitigations"] = {"retries": {"max_attempts": 2}}
    d["initial"] = {"queue": [4, 5, 6], "pending_retries": 3}
    sc = load_scenario(d)
    z0, z1 = zone_scenario(sc, 0), zone_scenario(sc, 1)
    assert z0.initial.queue == (4, 5) and z1.initial.queue == (6,)
    assert z0.initial.pending_retries + z1.initial.pending_retries == 3


def test_the_ctmc_ablation_model_drains_as_the_kernel_and_its_coin_does_not():
    """ctmc_ablation_drain's exact model against the kernel started full (10 s timeout:
    both drain, means within each other's intervals), and the CTMC's independent doom
    coin, switched on alone, the one that keeps the node full (issue 34's known failure)."""
    from relakit.metastability import Recovery, base_scenario, basin_map
    from relakit.sim.reference import ctmc_ablation_drain
    from relakit.stats import t_interval

    w = base_scenario("params/scenarios/metafor-node.yaml")
    w["workload"]["deadline_ms"] = 10_000
    w["metrics"] = {"interval_s": 0.1}
    cell = basin_map(w, "start", [101], [0], Recovery(level=1, hold_s=0.0, within_s=1500), 16,
                     workers=1).cells.row(0, named=True)
    model = np.array([ctmc_ablation_drain(10.0, "exact", "det", "exact", s, 1500)
                      for s in range(16)])
    assert cell["recovered"] == 16 and np.isfinite(model).all()
    m = t_interval(model)
    gap = abs(m.mean - cell["recovery_mean_s"])
    assert gap < m.half_width + cell["recovery_mean_s_ci"], (m, cell)
    coin = np.array([ctmc_ablation_drain(10.0, "prob", "det", "exact", s, 1500)
                     for s in range(16)])
    assert np.isfinite(coin).sum() <= 8
    with pytest.raises(ValueError, match="doom: expected one of exact, prob"):
        ctmc_ablation_drain(10.0, "coin", "det", "exact", 0, 10)


def test_the_ablation_models_mean_jobs_is_the_kernels_and_the_share_alone_moves_it():
    """ctmc_ablation_fill started full (Metafor's node, 3 s): the exact model's stationary
    mean jobs against the kernel's recorded interval (benchmarks/ctmc_vs_simulation.json,
    100 runs started full); the CTMC's attempt share without the retries' acceptance,
    switched on alone, puts it ~0.11 below; with the acceptance, back."""
    import json
    from pathlib import Path

    from relakit.sim.reference import ctmc_ablation_fill
    from relakit.stats import t_interval

    rec = json.loads((Path(__file__).resolve().parents[1] / "benchmarks"
                      / "ctmc_vs_simulation.json").read_text())["worked"]["mean_jobs"]
    lo, hi = rec["mean"] - rec["half_width"], rec["mean"] + rec["half_width"]

    def mean(count, acceptance):
        return t_interval(np.array([ctmc_ablation_fill(
            3.0, "exact", "det", count, s, 400.0, start=101, warmup_s=100.0,
            acceptance=acceptance)[1] for s in range(20)]))

    exact, share, accepted = mean("exact", 1.0), mean("share", 1.0), mean("share", 0.5228)
    assert exact.low < hi and lo < exact.high, (exact, lo, hi)
    assert share.high < lo and share.high < exact.low
    assert accepted.low < hi and lo < accepted.high, (accepted, lo, hi)
    up, _ = ctmc_ablation_fill(3.0, "exact", "det", "exact", 0, 5000.0, level=90)
    assert 0 < up < 5000
    with pytest.raises(ValueError, match="level, warmup_s: give exactly one"):
        ctmc_ablation_fill(3.0, "exact", "det", "exact", 0, 100.0)


def test_a_start_state_and_the_retry_semantics_show_in_the_scenario_facts():
    facts = load_scenario(node("keep_listening", queue=30, pending=5, backoff_ms=20,
                               jitter=True)).facts()
    assert "starts with 30 request(s) at the nodes ([30]) and 5 retry(ies) pending" in facts
    assert any("a timed-out attempt: keep_listening" in f for f in facts)


def test_a_start_state_counts_in_the_memory_estimate():
    from relakit.sim import run_memory

    idle = run_memory(load_scenario(node(queue_limit=None, deadline_ms=None)), False)
    big = load_scenario(node(queue=5_000_000, queue_limit=None, deadline_ms=None))
    assert run_memory(big, False)["pools"] > 1000 * idle["pools"]
