"""The in-path mechanisms (issue 33): client-side adaptive throttling, a server's adaptive
concurrency limit, CoDel and the queue's discipline, with their cost of deciding.

Each is held to its closed form (relakit.analytic.in_path) or to the property that defines
it, over replications with Student-t intervals; every specialisation of the loop that runs
them equals the general kernel bit for bit; their outcomes reach every table.
"""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest

import relakit
from relakit.analytic import decision_capacity, throttle_steady_state
from relakit.replications import replication_seeds
from relakit.scenario import load_scenario
from relakit.sim import kernel as K
from relakit.sim.fleet import Fleet
from relakit.stats import t_interval
from relakit.validate import ScenarioError
from relakit.vocab import Flags

MEAN_MS = 10.0
SERVERS = 4
CAPACITY = SERVERS / (MEAN_MS / 1000)  # 400 rps


def node(rate, mitigations=None, *, duration=60.0, warmup=10.0, queue_limit=None,
         deadline_ms=None, fleet=None, seed=3) -> dict:
    """One node of four 10 ms servers (exponential), Poisson arrivals at ``rate``."""
    return {"name": "in-path", "duration_s": duration, "warmup_s": warmup, "seed": seed,
            "workload": {"arrival": {"kind": "poisson", "rate_rps": rate},
                         "deadline_ms": deadline_ms},
            "fleet": {"nodes": 1, "servers": SERVERS, "queue_limit": queue_limit,
                      "service": {"kind": "exponential", "mean_ms": MEAN_MS}, **(fleet or {})},
            "mitigations": mitigations or {}}


def runs(sc: dict, n: int = 5, records: bool = False):
    """``n`` replications (seeds spawned from the scenario's)."""
    out = []
    for seed in replication_seeds(sc["seed"], n):
        out.append(relakit.simulate({**sc, "seed": seed}, record_requests=records))
    return out


def all_row(r) -> dict:
    return r.summary.filter(pl.col("tier") == "all").to_dicts()[0]


def sent_per_accepted(r) -> float:
    """Requests that reached the node over the requests it served, after warm-up: the
    node's requests_total (every outcome) over its ok count (no deadline: every copy
    served is answered to a waiting client, and accepted)."""
    m = r.metrics.filter((pl.col("name") == "requests_total") & (pl.col("node") == 0))
    last = m["time_s"].max()
    warm = r.info["warmup_s"]
    at = (m.filter(pl.col("time_s").is_in([warm, last]))
          .group_by("time_s", "outcome").agg(pl.col("value").sum()))
    inc = at.pivot(on="time_s", index="outcome", values="value")
    inc = dict(zip(inc["outcome"], (inc[str(last)] - inc[str(warm)]).to_list(), strict=True))
    return sum(inc.values()) / inc["ok"]


# ---- client-side adaptive throttling -------------------------------------------------
@pytest.mark.parametrize(("k", "window_s", "warmup"), [(2.0, 10.0, 20.0), (1.1, 1.0, 40.0)])
def test_throttle_sends_k_times_what_is_accepted(k, window_s, warmup):
    """Offered 5x capacity, a short queue limit (fast rejections), no retries: in steady
    state the client sends k x what the node accepts (SRE book), within +-7 %. k = 1.1
    needs a short window: its transient grows by about k (1 - blocking) a window
    (a 10 s window had not settled in 60 s, measured)."""
    sc = node(5 * CAPACITY, {"client_throttle": {"k": k, "window_s": window_s}},
              duration=warmup + 60, warmup=warmup, queue_limit=2)
    ratios = [sent_per_accepted(r) for r in runs(sc)]
    iv = t_interval(ratios)
    assert abs(iv.low / k - 1) <= 0.07 and abs(iv.high / k - 1) <= 0.07, (k, ratios, iv)
    r = runs(sc, 1)[0]
    row = all_row(r)
    assert row["throttled"] > 0.5 * row["requests"]  # most requests never left the client
    assert r.info["throttled"] >= row["throttled"]
    ss = throttle_steady_state(5 * CAPACITY, row["ok"] / (r.info["duration_s"] - warmup), k)
    assert ss.sent_per_accepted == pytest.approx(k)


def test_without_throttling_the_client_sends_the_overload():
    """The same node without the throttle: sent / accepted is the offered 5x (+-7 %)."""
    ratios = [sent_per_accepted(r) for r in runs(node(5 * CAPACITY, queue_limit=2))]
    iv = t_interval(ratios)
    assert 5 * 0.93 <= iv.low and iv.high <= 5 * 1.07, (ratios, iv)


# ---- the cost of deciding in the path ---------------------------------------------------
def test_decision_cost_takes_capacity():
    """A server-side decision costing 20 % of the mean service: saturated goodput within
    2 % of c / (s + cost) (a fixed limit of 50 in flight keeps the node saturated and
    its queue finite)."""
    cost_us = 0.2 * MEAN_MS * 1000
    limit = {"algorithm": "aimd", "initial": 50, "min": 50, "max": 50, "cost_us": cost_us}
    sc = node(2 * CAPACITY, {"concurrency_limit": limit}, duration=70)
    good = [all_row(r)["ok"] / 60.0 for r in runs(sc)]
    iv = t_interval(good)
    want = decision_capacity(SERVERS, MEAN_MS / 1000, cost_us / 1e6)
    assert want == pytest.approx(333.33, rel=1e-3)
    assert abs(iv.low / want - 1) <= 0.02 and abs(iv.high / want - 1) <= 0.02, (good, iv)


# ---- adaptive concurrency limit ------------------------------------------------------------
@pytest.mark.parametrize("algorithm", ["aimd", "gradient"])
def test_concurrency_limit_keeps_goodput_at_twice_capacity(algorithm):
    """Offered 2x capacity, no queue limit, a 1 s deadline: without a limit the queue
    grows and everything times out; with one, goodput >= 90 % of capacity. AIMD (40 ms
    threshold) also keeps the accepted requests' p99 near the service time's (46 ms for
    10 ms exponential): within 2x. The gradient controller's minimum RTT is never
    measured at a pinned low concurrency (Envoy does), so under sustained overload its
    limit drifts up: its p99 is held below the deadline only."""
    base = node(2 * CAPACITY, duration=40, deadline_ms=1000)
    none = runs(base, 2)
    assert all(all_row(r)["success_ratio"] < 0.05 for r in none)
    cl = {"algorithm": algorithm, "initial": 8}
    cl |= {"latency_ms": 40} if algorithm == "aimd" else {"window": 50}
    limited = runs({**base, "mitigations": {"concurrency_limit": cl}}, 3)
    good = t_interval([all_row(r)["ok"] / 30.0 for r in limited])
    assert good.low >= 0.9 * CAPACITY, good
    p99 = [all_row(r)["p99_ms"] for r in limited]
    service_p99 = -MEAN_MS * np.log(0.01)
    assert max(p99) <= (2 * service_p99 if algorithm == "aimd" else 1000), p99
    for r in limited:
        assert all_row(r)["rejected"] > 0.3 * all_row(r)["requests"]
        gauge = r.metrics.filter(pl.col("name") == "concurrency_limit")["value"]
        assert gauge.len() > 0 and 1 <= gauge.min() and gauge.max() <= 1000


# ---- CoDel ----------------------------------------------------------------------------------
def standing_delays(r, interval_ms: float) -> np.ndarray:
    """CoDel's standing queue: the least wait of the requests served in each interval
    (wait = latency - demand: one attempt each, no slowdown), after warm-up."""
    q = (r.requests.filter((pl.col("outcome") == "ok") & (pl.col("arrival_s") > 10))
         .with_columns(wait=pl.col("latency_ms") - pl.col("service_ms")))
    q = q.with_columns(bin=((pl.col("arrival_s") * 1000 + pl.col("wait")) // interval_ms))
    return q.group_by("bin").agg(pl.col("wait").min())["wait"].to_numpy()


def test_codel_holds_the_standing_delay_at_target():
    """1.5x overload, no queue limit: with CoDel (5 ms / 100 ms) the standing delay (the
    least wait in each interval) of the accepted requests stays at or below the target
    in 90 % of the intervals, and its mean below it; without, it grows without bound."""
    codel = {"codel": {"target_ms": 5, "interval_ms": 100}}
    mean, p90 = [], []
    for r in runs(node(1.5 * CAPACITY, codel, duration=40), 3, records=True):
        s = standing_delays(r, 100)
        mean.append(s.mean())
        p90.append(np.quantile(s, 0.9))
        row = all_row(r)
        assert row["rejected"] > 0.25 * row["requests"]  # the excess third, shed
        assert r.info["codel_dropped"] == r.info["rejected"]
    assert t_interval(mean).high <= 5.0 and max(p90) <= 5.0, (mean, p90)
    r = runs(node(1.5 * CAPACITY, duration=40), 1, records=True)[0]
    assert np.median(standing_delays(r, 100)) > 10 * 5.0


def test_adaptive_lifo_serves_the_newest_while_congested():
    """With adaptive LIFO beside CoDel the median latency of what is served is lower
    than FIFO's (the newest waits least), on the same seeds."""
    mit = {"codel": {"target_ms": 20, "interval_ms": 100}}
    fifo = runs(node(1.5 * CAPACITY, mit, duration=30), 3)
    lifo = runs(node(1.5 * CAPACITY, mit, duration=30, fleet={"queue_discipline":
                                                                "adaptive_lifo"}), 3)
    assert all(all_row(b)["p50_ms"] < all_row(a)["p50_ms"] for a, b in zip(fifo, lifo,
                                                                           strict=True))


# ---- every specialisation equals the general kernel --------------------------------------
def _fleet(sc, kernel, monkeypatch):
    monkeypatch.setattr(Fleet, "specialise", False)
    monkeypatch.setattr(K, "advance", kernel)
    fleet = Fleet(load_scenario(sc))
    for t in (5.0, 12.5, sc["duration_s"]):
        fleet.advance(t)
    return fleet


def _throttled_limited():
    sc = node(5 * CAPACITY, {"client_throttle": {"k": 2, "window_s": 5, "cost_us": 300},
                             "concurrency_limit": {"algorithm": "gradient", "window": 20,
                                                   "cost_us": 100},
                             "retries": {"max_attempts": 2, "retry_on": ["rejected"]}},
              duration=20, deadline_ms=200)
    sc["fleet"]["nodes"] = 3
    return sc, frozenset({"throttle", "concurrency", "deadlines", "retries"})


def _codel_lifo():
    sc = node(1.5 * CAPACITY, {"codel": {"target_ms": 5, "interval_ms": 50, "cost_us": 200},
                               "concurrency_limit": {"algorithm": "aimd", "latency_ms": 30}},
              duration=20, fleet={"queue_discipline": "adaptive_lifo"})
    return sc, frozenset({"codel", "concurrency"})


@pytest.mark.parametrize("make", [_throttled_limited, _codel_lifo], ids=["throttle", "codel"])
def test_specialised_equals_general(make, monkeypatch):
    monkeypatch.setenv("RELAKIT_AOT", "0")
    sc, features = make()
    fleet = Fleet(load_scenario(sc))
    assert K.features_of(fleet.cfg, fleet.st) == features
    general_kernel = K.advance
    fast = _fleet(sc, K.specialised(features), monkeypatch)
    general = _fleet(sc, general_kernel, monkeypatch)
    for part in ("st", "out"):
        a, b = getattr(fast, part), getattr(general, part)
        for name in a._fields:
            np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    cnt = fast.out.tier_cnt  # the mechanisms did something
    assert cnt[:, K.REJECTED].sum() > 0
    if "throttle" in features:
        assert cnt[:, K.THROTTLED].sum() > 0 and fast.st.fleet_c[K.F_RETRIES] > 0
    else:
        assert fast.st.node_c[:, K.NC_CODEL_DROPPED].sum() > 0


# ---- the outcomes reach every table, and only runs that have them ---------------------------
def test_outcomes_in_every_table(tmp_path):
    sc = node(3 * CAPACITY, {"client_throttle": {"k": 1.5, "window_s": 5},
                             "codel": {"target_ms": 5, "interval_ms": 100}}, duration=30)
    r = relakit.simulate(sc)
    assert {"throttled", "rejected"} <= set(r.summary.columns)
    assert {"throttled", "rejected"} <= set(r.requests["outcome"].unique())
    names = set(r.metrics["name"].unique())
    assert {"client_throttled_total", "rejected_total", "codel_dropped_total",
            "concurrency_limit"} <= names
    outcomes = set(r.metrics.filter(pl.col("name") == "client_requests_total")["outcome"])
    assert {"throttled", "rejected"} <= outcomes
    assert "throttled" not in set(r.metrics.filter(pl.col("name") == "requests_total")["outcome"])
    r.write(tmp_path)
    tiers = json.loads((tmp_path / "summary.json").read_text())["tiers"]
    assert tiers[-1]["throttled"] == all_row(r)["throttled"] > 0
    head = r.format_summary().splitlines()[1]
    assert "throttled" in head and "rejected" in head
    from relakit import plots

    shares = plots.outcome_share_frame(plots.request_counts(r.requests, 5.0))
    assert {"throttled", "rejected"} <= set(shares["outcome"])
    series = r.fleet_series()
    assert series["throttled_rps"].sum() > 0
    plain = relakit.simulate(node(0.5 * CAPACITY, duration=20))  # no mechanism: as before
    assert "throttled" not in plain.summary.columns
    assert "client_throttled_total" not in set(plain.metrics["name"].unique())
    assert "throttled" not in plain.format_summary()
    assert "rejected" not in set(plots.outcome_share_frame(
        plots.request_counts(plain.requests, 5.0))["outcome"])


# ---- closed forms -----------------------------------------------------------------------------
def test_closed_forms():
    ss = throttle_steady_state(2000.0, 400.0, 2.0)
    assert ss.sent_rps == 800.0 and ss.throttled_share == pytest.approx(0.6)
    assert throttle_steady_state(300.0, 300.0, 2.0).throttled_rps == 0.0
    assert decision_capacity(8, 0.010, 0.0) == pytest.approx(800.0)
    with pytest.raises(ValueError, match="k must be >= 1"):
        throttle_steady_state(10.0, 5.0, 0.5)
    with pytest.raises(ValueError, match="cost_s"):
        decision_capacity(4, 0.01, -1.0)


# ---- bad inputs: one line naming the key and what is allowed ------------------------------------
@pytest.mark.parametrize(("mit", "fleet", "key", "says"), [
    ({"client_throttle": {"k": 0.5}}, {}, "mitigations.client_throttle.k", ">= 1"),
    ({"client_throttle": {"window_s": 0}}, {}, "mitigations.client_throttle.window_s", "> 0"),
    ({"client_throttle": {"kk": 2}}, {}, "mitigations.client_throttle", "unknown key"),
    ({"client_throttle": {"cost_us": -1}}, {}, "mitigations.client_throttle.cost_us", ">= 0"),
    ({"concurrency_limit": {"algorithm": "vegas"}}, {}, "mitigations.concurrency_limit.algorithm",
     "aimd, gradient"),
    ({"concurrency_limit": {"algorithm": "gradient", "backoff": 0.5}}, {},
     "mitigations.concurrency_limit", "unknown key(s) ['backoff']"),
    ({"concurrency_limit": {"algorithm": "aimd", "window": 10}}, {},
     "mitigations.concurrency_limit", "unknown key(s) ['window']"),
    ({"concurrency_limit": {"min": 10, "max": 5}}, {}, "mitigations.concurrency_limit.max",
     "below min"),
    ({"concurrency_limit": {"initial": 5000}}, {}, "mitigations.concurrency_limit.initial",
     "within min and max"),
    ({"concurrency_limit": {"backoff": 1}}, {}, "mitigations.concurrency_limit.backoff",
     "never decreases"),
    ({"codel": {"target_ms": 100, "interval_ms": 50}}, {}, "mitigations.codel.target_ms",
     "not below interval_ms"),
    ({"codel": {"target_ms": "5"}}, {}, "mitigations.codel.target_ms", "expected a number"),
    ({}, {"queue_discipline": "lifo-ish"}, "fleet.queue_discipline", "fifo, lifo, adaptive_lifo"),
    ({}, {"queue_discipline": "adaptive_lifo"}, "fleet.queue_discipline",
     "give mitigations.codel too"),
])
def test_bad_inputs_name_the_key(mit, fleet, key, says):
    with pytest.raises(ScenarioError) as e:
        load_scenario(node(100, mit, fleet=fleet))
    msg = str(e.value)
    assert "\n" not in msg and f"key '{key}" in msg and says in msg, msg


# ---- part 2: central policy, local enforcement ----------------------------------------------
def _policy(asserts: dict) -> dict:
    """Survival while the nodes' rejected share is over 10 %: asserts ``asserts``."""
    return {"name": "local", "signals": {"rejected_ratio": {
        "kind": "ratio", "num": {"metric": "requests_total", "outcome": "rejected"},
        "den": {"metric": "requests_total"}}},
        "conditions": {"shedding": {"signal": "rejected_ratio", "op": ">", "threshold": 0.1}},
        "modes": [{"name": "survival", "when": {"any": ["shedding"]}, "enter_after": 1,
                   "exit_after": 1, "assert": asserts}],
        "normal": {"hedge_enabled": False}}


def test_a_policy_sets_the_local_mechanisms_through_the_flags():
    """At 2x capacity AIMD rejects half, so the policy enters survival and lowers the
    concurrency limit's ceiling to 3 (below the 4 servers): the nodes' limit gauge
    stays <= 3 after the first poll in survival, goodput falls to about 3/4, and the
    audit records the flag as the desired state."""
    sc = node(2 * CAPACITY, {"concurrency_limit": {"algorithm": "aimd", "latency_ms": 40,
                                                   "initial": 8}}, duration=40)
    sc["policy"] = _policy({"concurrency_max": 3})
    sc["clocks"] = {"scrape_s": 1, "window_s": 5, "eval_s": 1, "poll_s": 1}
    r = relakit.simulate(sc, record_requests=False)
    entered = r.decisions.filter(pl.col("mode") == "survival")["effective_at_s"].min()
    assert entered is not None and entered < 20
    desired = json.loads(r.decisions.filter(pl.col("mode") == "survival")["desired"][0])
    assert desired["concurrency_max"] == 3
    gauge = r.metrics.filter((pl.col("name") == "concurrency_limit")
                             & (pl.col("time_s") > entered + 1))["value"]
    assert gauge.len() > 0 and gauge.max() <= 3.0
    assert r.info["flags_at_end"]["concurrency_max"] == 3
    assert all_row(r)["ok"] / 30.0 < 0.85 * CAPACITY  # 3 of 4 servers at most


def test_a_local_flag_without_its_mechanism_is_refused():
    from relakit.checks import ERROR, check_scenario

    sc = node(100.0)
    sc["policy"] = _policy({"throttle_k": 1.5})
    found = [f for f in check_scenario(load_scenario(sc))
             if f.severity == ERROR and "throttle_k" in f.key]
    assert len(found) == 1 and found[0].key == "policy.modes[0].assert.throttle_k", found
    assert "mitigations.client_throttle" in found[0].message
    with pytest.raises(ValueError, match="must be a number >= 1"):
        Flags(throttle_k=0.5)
    with pytest.raises(ScenarioError, match="throttle_k"):
        load_scenario({**sc, "policy": _policy({"throttle_k": "high"})})


def test_a_throttle_that_can_never_throttle_is_warned_about():
    from relakit.checks import WARNING, check_scenario

    def warned(sc):
        return [f for f in check_scenario(load_scenario(sc))
                if f.severity == WARNING and f.key == "mitigations.client_throttle"]

    found = warned(node(100.0, {"client_throttle": {"k": 2}}))
    assert len(found) == 1 and "never throttles" in found[0].message
    assert warned(node(100.0, {"client_throttle": {"k": 2}}, queue_limit=5)) == []
    assert warned(node(100.0, {"client_throttle": {"k": 2}}, deadline_ms=50)) == []


def test_compare_shows_an_in_path_outcome_only_one_side_has():
    """relakit.compare of a run without a mechanism against one with: the rejected
    count is a row (0 on the side without), not dropped for want of a column."""
    a = node(1.5 * CAPACITY, duration=15, queue_limit=50)
    b = node(1.5 * CAPACITY, {"codel": {"target_ms": 5, "interval_ms": 100}}, duration=15,
             queue_limit=50)
    c = relakit.compare(a, b, replications=3, workers=1)
    row = c.row("all", "rejected")
    assert row["a"] == 0 and row["b"] > 0 and row["significant"]
    assert c.row("all", "error")["difference"] < 0  # the queue limit refuses less


def test_replay_reads_the_in_path_series():
    """The control plane reads an in-path run's series like any other: a policy on the
    client_throttled_total rate, replayed over the run's metrics, enters its mode and
    asserts the throttle's k (the audit's desired state)."""
    sc = node(5 * CAPACITY, {"client_throttle": {"k": 2, "window_s": 5}}, queue_limit=2,
              duration=30, warmup=5)
    r = relakit.simulate(sc, record_requests=False)
    policy = {"name": "throttling", "signals": {"throttled_rps": {
        "kind": "rate", "metric": "client_throttled_total", "source": "client"}},
        "conditions": {"throttling": {"signal": "throttled_rps", "op": ">", "threshold": 100}},
        "modes": [{"name": "survival", "when": {"any": ["throttling"]},
                   "assert": {"throttle_k": 1.5}}],
        "normal": {"hedge_enabled": False}}
    rep = relakit.replay(r.metrics, policy=policy,
                         clocks={"scrape_s": 1, "window_s": 5, "eval_s": 1, "poll_s": 1})
    entered = rep.decisions.filter(pl.col("mode") == "survival")
    assert entered.height > 0
    assert json.loads(entered["desired"][0])["throttle_k"] == 1.5


def test_each_in_path_outcome_is_counted_by_the_mechanisms_vocab_names():
    """vocab.IN_PATH_COUNTED_BY (the checks' hints read it) against the kernel: under 3x
    overload each mechanism alone counts its own refusal and never the other's."""
    from relakit.vocab import IN_PATH_COUNTED_BY

    alone = {"client_throttle": {"k": 1.1, "window_s": 5},
             "concurrency_limit": {"algorithm": "aimd", "initial": 4, "min": 1, "max": 8},
             "codel": {"target_ms": 5, "interval_ms": 100}}
    assert {k for ks in IN_PATH_COUNTED_BY.values() for k in ks} == set(alone)
    for key, cfg in alone.items():
        row = all_row(relakit.simulate(node(3 * CAPACITY, {key: cfg}, duration=30.0,
                                            deadline_ms=200)))
        for outcome, by in IN_PATH_COUNTED_BY.items():
            assert (row[outcome] > 0) == (key in by), (key, outcome, row[outcome])
