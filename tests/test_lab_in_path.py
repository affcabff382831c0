"""The in-path mechanisms in the live lab (issue 33, part 4), real processes on loopback.

The lab runs the scenario's ``mitigations.concurrency_limit`` in its instances and its
``mitigations.client_throttle`` in the load generator and the front
(``relakit lab up --mitigations SCENARIO``; :mod:`relakit.lab.in_path`), and each live run
is set beside its simulated twin: the same YAML (params/scenarios/lab-limit.yaml,
lab-throttle.yaml) through ``relakit.simulate``, replicated.

- At twice capacity the limit refuses at once (429, ``rejected``, counted in
  ``rejected_total`` with the ``concurrency_limit`` gauge, scraped by Prometheus) and
  gold's p99 stays within 2x the service time's, where the same lab without it queues
  until nearly every request times out.
- The twin: per tier, the live success share, p50 and p99 within stated limits of the
  simulation's (below, with why they are that wide).
- With the throttle at five times capacity the clients send k times what is accepted,
  live as simulated; a policy's ``throttle_k`` / ``concurrency_max`` reach the lab
  through the config server.
"""

from __future__ import annotations

import math
import os
import shutil
import time
from pathlib import Path

import httpx
import numpy as np
import polars as pl
import pytest
from conftest import ROOT

from relakit.lab import Lab, LabSpec
from relakit.lab.in_path import (
    TWIN_OK_SHARE_SPARE,
    TWIN_P50_RATIO,
    TWIN_P99_RATIO,
    ClientThrottle,
    ConcurrencyLimit,
    lab_mitigations,
)
from relakit.lab.load import run_load
from relakit.measured import measure_runs, tier_latencies, twin_measure
from relakit.scenario import load_scenario
from relakit.stats import prediction_interval
from relakit.validate import ScenarioError
from relakit.vocab import TIERS

LIMIT = ROOT / "params" / "scenarios" / "lab-limit.yaml"
THROTTLE = ROOT / "params" / "scenarios" / "lab-throttle.yaml"
REPLICATIONS = 10
live_only = pytest.mark.skipif(shutil.which("prometheus") is None,
                               reason="the set-up installs prometheus")


def twin_spec(path, mitigations: bool = True) -> LabSpec:
    """The lab a scenario describes: its fleet (exponential service), queue limit,
    deadline and in-path mitigations (``mitigations=False``: none)."""
    sc = load_scenario(path)
    f = sc.fleet
    assert f.service.kind == "exponential" and len(set(f.servers)) == 1
    return LabSpec(instances=f.nodes, servers=f.servers[0], mean_ms=f.service.params["mean_ms"],
                   slow_fraction=0.0, routing=f.routing, queue_limit=f.queue_limit,
                   deadline_ms=sc.workload.deadline_ms,
                   mitigations=lab_mitigations(path) if mitigations else {})


def run_live(path, mitigations: bool = True, seed: int = 0) -> dict:
    """One live run of the scenario's load (Poisson at its rate for its duration)."""
    sc = load_scenario(path)
    tiers = tuple(sc.workload.tiers[t] for t in TIERS)
    with Lab(twin_spec(path, mitigations)) as lab:
        t0 = time.time()
        recs = run_load(lab, [(sc.duration_s, sc.workload.arrival.rates_rps[0])], tiers=tiers,
                        timeout_s=sc.workload.deadline_ms / 1000 + 1.0, seed=seed)
        metrics = "".join(httpx.get(f"{u}/metrics").text for u in lab.instance_urls)
        time.sleep(2 * lab.clocks.scrape_s)
        prom = {name: lab.promql(f"sum({name})", time.time())
                for name in ("rejected_total", "concurrency_limit")}
        recorded = {r["metric"]["__name__"]  # what the agent and `lab record` read
                    for r in lab.query_raw(sc.duration_s + 5)["data"]["result"]}
    req = pl.DataFrame(recs).with_columns(t_s=pl.col("start_s") - t0)
    keep = os.environ.get("RELAKIT_KEEP_IN_PATH_RUN")  # a folder: data/lab-in-path
    if keep:  # notebook 07 reads it: every request, t_s from the load's start
        from relakit.io import write_parquet

        Path(keep).mkdir(parents=True, exist_ok=True)
        write_parquet(req,
                      Path(keep) / f"{Path(path).stem}-{'on' if mitigations else 'off'}.parquet")
    return {"requests": req.filter(pl.col("t_s") >= sc.warmup_s), "metrics": metrics,
            "prom": prom, "rate": req.height / sc.duration_s, "recorded": recorded}


def per_tier(run: dict) -> dict:
    """A live run's numbers per tier (relakit.measured.tier_latencies), after warm-up."""
    return tier_latencies(run["requests"], 0.0, "t_s")


def outcomes(req: pl.DataFrame) -> dict:
    return dict(req["outcome"].value_counts().iter_rows())


def _count(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.split("{")[0].split(" ")[0] == name)


# ---- the keys, and the two mechanisms' rules ------------------------------------------------
def test_the_lab_reads_the_simulators_keys_and_refuses_what_it_cannot_run(tmp_path):
    assert lab_mitigations(LIMIT) == {"concurrency_limit": {
        "algorithm": "aimd", "initial": 4.0, "min": 1.0, "max": 100.0, "backoff": 0.9,
        "latency_ms": 200.0, "window": 100, "period": 10, "buffer": 0.25, "cost_us": 0.0}}
    assert lab_mitigations(THROTTLE)["client_throttle"] == {"k": 2.0, "window_s": 5.0,
                                                            "cost_us": 0.0}
    text = THROTTLE.read_text()
    bad = tmp_path / "codel.yaml"
    bad.write_text(text + "  codel: {target_ms: 5}\n")
    with pytest.raises(ScenarioError, match=r"codel.yaml: key 'mitigations.codel': the live "
                                            r"lab runs only client_throttle and concurrency"):
        lab_mitigations(bad)
    bad.write_text(text.replace("k: 2,", "k: 0.5,"))  # the simulator's own check
    with pytest.raises(ScenarioError, match=r"mitigations.client_throttle.k"):
        lab_mitigations(bad)
    with pytest.raises(ValueError, match="key 'codel'"):
        LabSpec(mitigations={"codel": {}})


def test_the_labs_service_quantile_is_the_mixture_its_instances_draw():
    """LabSpec.service_quantile_ms against the instances' own draw (relakit.lab.dataplane:
    an exponential of mean slow_ms for slow_fraction of requests, else mean_ms), sampled:
    the distribution-free 99.9 % interval of the sample's quantile holds it. The lab's
    default p99 with no queue (~225 ms) is what notebook 07 prints beside rela.yaml's 250."""
    from relakit.stats import quantile_interval

    rng = np.random.default_rng(5)
    for spec in (LabSpec(), LabSpec(mean_ms=10.0, slow_ms=90.0, slow_fraction=0.2),
                 LabSpec(slow_fraction=0.0)):
        slow = rng.random(400_000) < spec.slow_fraction
        draws = rng.exponential(np.where(slow, spec.slow_ms, spec.mean_ms))
        for q in (0.5, 0.99):
            iv = quantile_interval(draws, q, confidence=0.999)
            assert iv.low <= spec.service_quantile_ms(q) <= iv.high, (spec, q, iv)
    assert LabSpec(slow_fraction=0.0).service_quantile_ms(0.99) == pytest.approx(
        40.0 * math.log(100.0))  # one exponential: -mean ln(1 - q)
    assert 220.0 < LabSpec().service_quantile_ms(0.99) < 230.0
    with pytest.raises(ValueError, match="q: must lie strictly between 0 and 1"):
        LabSpec().service_quantile_ms(1.0)


def test_the_throttle_and_the_limit_follow_the_simulators_rules():
    from relakit.sim import kernel as K

    assert K.BUDGET_BUCKETS == 10  # the throttle window's buckets (in_path.WINDOW_BUCKETS)
    class Draw:  # the throttle's random source, fixed at u
        u = 0.0

        def random(self):
            return self.u

    th = ClientThrottle(k=2.0, window_s=10.0)
    th.rng = Draw()
    assert th.judge(0.5) is False  # nothing refused yet: p = 0, whatever is drawn
    th.accepted(0.5)
    for _ in range(99):  # a draw of 1 refuses nothing: 100 requests, 20 accepted
        th.rng.u = 1.0
        assert th.judge(0.5) is False
    for _ in range(19):
        th.accepted(0.5)
    # the judgement itself, as the kernel's throttle_judge: refused iff the draw is
    # below (requests - k accepts) / (requests + 1), k a policy's throttle_k if given
    for k, p in ((None, 60 / 101), (3.0, 40 / 101), (5.0, 0.0)):
        for u, refused in ((p - 1e-9, p > 0), (p + 1e-9, False)):
            th.rng.u = u
            before = th.throttled
            assert th.judge(0.5, k) is refused, (k, u)
            assert th.throttled == before + refused
            th.req[0] -= 1  # (forget the judged request: the same state for the next)
            th.requests -= 1
    th.judge(10.6)  # a window later the buckets it left are forgotten
    assert (th.requests, th.accepts) == (1, 0)
    cl = ConcurrencyLimit(initial=4, min=1, max=10, backoff=0.5, latency_ms=200)
    cl.learn(0.1, False)
    assert cl.limit == pytest.approx(4.25)  # + 1 / limit
    cl.learn(0.3, False)
    assert cl.limit == pytest.approx(2.125)  # x backoff on a slow answer
    cl.learn(0.1, True)
    assert cl.limit == pytest.approx(1.0625)  # ... and on a timeout
    assert not cl.admits(1) and cl.admits(0) and cl.rejected == 1
    cl.limit = 9.0
    cl.set_ceiling(3.0)  # a policy's concurrency_max clamps at once
    assert cl.limit == 3.0
    cl.set_ceiling(None)
    assert cl.ceiling == 10.0
    # the gradient controller against the kernel's own (gradient_limit), window by window
    rng = np.random.default_rng(1)
    g = ConcurrencyLimit(algorithm="gradient", initial=20, min=1, max=1000, window=5, period=3)
    cf, ci = np.zeros(K.CF_CL_BUFFER + 64), np.zeros(K.CI_CL_PERIOD + 64, dtype=np.int64)
    cf[K.CF_CL_BUFFER], ci[K.CI_CL_PERIOD] = 0.25, 3
    ni, nf = np.zeros((1, 64), dtype=np.int64), np.zeros((1, 64))
    nf[0, K.NF_CL_LIMIT], nf[0, K.NF_CL_MIN_RTT], nf[0, K.NF_CL_PERIOD_MIN] = 20, np.inf, np.inf
    for w in range(12):
        samples = rng.exponential(0.05 * (1 + w % 4), 5)
        for s in samples:
            g.learn(float(s), False)
        nf[0, K.NF_CL_SUM], ni[0, K.NI_CL_COUNT] = samples.sum(), 5
        nf[0, K.NF_CL_LIMIT] = min(max(K.gradient_limit(cf, ci, ni, nf, 0), 1.0), 1000.0)
        assert g.limit == pytest.approx(nf[0, K.NF_CL_LIMIT], rel=1e-12), w


# ---- the concurrency limit, live and simulated ---------------------------------------------
SERVICE_P99_MS = -100.0 * math.log(0.01)  # 100 ms exponential work: 461 ms


@pytest.fixture(scope="module")
def limited():
    return run_live(LIMIT, seed=1)


@pytest.fixture(scope="module")
def limit_twin():
    return measure_runs(LIMIT, twin_measure(load_scenario(LIMIT).warmup_s), REPLICATIONS)


@live_only
def test_at_twice_capacity_the_limit_refuses_and_gold_stays_fast(limited):
    live = per_tier(limited)
    assert limited["rate"] > 0.9 * 80  # the generator kept up with the scenario's rate
    out = outcomes(limited["requests"])
    assert set(out) <= {"ok", "rejected"}, out  # refused at once, nothing waited to time out
    assert out["rejected"] > 0.3 * live["all"]["requests"]
    assert live["all"]["ok"] * 80 >= 0.85 * 40  # goodput >= 85 % of the fleet's capacity
    assert live["gold"]["p99_ms"] <= 2 * SERVICE_P99_MS, live["gold"]
    # counted under the simulator's names, per instance, and scraped by Prometheus
    assert _count(limited["metrics"], "rejected_total") >= out["rejected"]
    assert limited["prom"]["rejected_total"] >= out["rejected"]
    assert {"rejected_total", "concurrency_limit"} <= limited["recorded"]  # as the agent reads
    gauges = [float(line.split()[1]) for line in limited["metrics"].splitlines()
              if line.startswith("concurrency_limit ")]
    assert len(gauges) == 2 and all(1.0 <= g <= 100.0 for g in gauges), gauges


@live_only
def test_without_the_limit_the_queue_grows_until_requests_time_out():
    off = run_live(LIMIT, mitigations=False, seed=1)
    live = per_tier(off)["all"]
    assert live["ok"] < 0.05 and live["timeout"] > 0.9, live
    assert _count(off["metrics"], "in_flight") > 200  # still queued at the end
    assert "rejected_total" not in off["metrics"] and "concurrency_limit" not in off["metrics"]
    assert math.isnan(off["prom"]["rejected_total"])  # no series without the mechanism
    assert "requests_total" in off["recorded"] and "rejected_total" not in off["recorded"]


# what a live request adds to the simulated one, and so how far the live numbers may lie
# from the twin's: relakit.lab.in_path's TWIN_* (notebook 07 holds the recorded run to them)
LATENCY_RATIO, P99_RATIO, OK_SHARE_ABS = TWIN_P50_RATIO, TWIN_P99_RATIO, TWIN_OK_SHARE_SPARE


@live_only
def test_the_live_limit_beside_its_simulated_twin(limited, limit_twin):
    live = per_tier(limited)
    for tier in (*TIERS, "all"):
        ok = prediction_interval(limit_twin.values(f"{tier}_ok"))
        assert ok.low - OK_SHARE_ABS <= live[tier]["ok"] <= ok.high + OK_SHARE_ABS, (
            tier, live[tier]["ok"], ok)
        p50 = limit_twin.interval(f"{tier}_p50_ms").mean
        assert LATENCY_RATIO[0] <= live[tier]["p50_ms"] / p50 <= LATENCY_RATIO[1], (
            tier, live[tier]["p50_ms"], p50)
        pi = prediction_interval(limit_twin.values(f"{tier}_p99_ms"))
        assert P99_RATIO[0] * pi.low <= live[tier]["p99_ms"] <= P99_RATIO[1] * pi.high, (
            tier, live[tier]["p99_ms"], pi)
        assert min(limit_twin.values(f"{tier}_rejected")) > 0.3  # it refuses in every run


# ---- the client throttle, live and simulated ------------------------------------------------
def sent_per_accepted(req: pl.DataFrame) -> float:
    """Requests that reached the instance over those it answered ok (as
    tests/test_in_path.py counts them at the node)."""
    out = dict(req["outcome"].value_counts().iter_rows())
    return sum(n for o, n in out.items() if o != "throttled") / out["ok"]


@pytest.fixture(scope="module")
def throttled_lab(tmp_path_factory):
    sc = load_scenario(THROTTLE)
    with Lab(twin_spec(THROTTLE), workdir=str(tmp_path_factory.mktemp("throttle"))) as lab:
        t0 = time.time()
        recs = run_load(lab, [(sc.duration_s, sc.workload.arrival.rates_rps[0])],
                        tiers=tuple(sc.workload.tiers[t] for t in TIERS),
                        timeout_s=sc.workload.deadline_ms / 1000 + 1.0, seed=2)
        req = pl.DataFrame(recs).with_columns(t_s=pl.col("start_s") - t0)
        yield {"lab": lab, "requests": req.filter(pl.col("t_s") >= sc.warmup_s),
               "rate": req.height / sc.duration_s}


@live_only
def test_the_throttled_clients_send_k_times_what_is_accepted_live_as_simulated(throttled_lab):
    req = throttled_lab["requests"]
    assert throttled_lab["rate"] > 0.9 * 100
    live = sent_per_accepted(req)
    assert abs(live / 2.0 - 1) <= 0.10, live  # k = 2 (the simulator's test: +-7 %, 5 runs)
    warm = load_scenario(THROTTLE).warmup_s

    def measure(result) -> dict:
        after = result.requests.filter(pl.col("arrival_s") >= warm)
        return {"ratio": sent_per_accepted(after),
                "throttled": float((after["outcome"] == "throttled").mean())}

    sims = measure_runs(THROTTLE, measure, REPLICATIONS)
    pi = prediction_interval(sims.values("ratio"))
    assert pi.low - 0.1 <= live <= pi.high + 0.1, (live, pi)
    throttled = (req["outcome"] == "throttled").mean()
    sim_thr = prediction_interval(sims.values("throttled"))
    assert sim_thr.low - 0.03 <= throttled <= sim_thr.high + 0.03, (throttled, sim_thr)


@pytest.mark.skipif(shutil.which("wrk") is None, reason="the set-up installs wrk")
@live_only
def test_the_front_throttles_an_outside_load_tool(throttled_lab):
    """wrk through the front (10 clients thinking 100 ms: about 5x the instance's 20
    requests/s): the front answers 429 ``throttled`` without sending, counts
    client_throttled_total, and sends about k times what is accepted after a window."""
    import subprocess

    lab = throttled_lab["lab"]

    def counts() -> dict:
        text = httpx.get(f"{lab.front_url}/metrics").text
        out = {}
        for line in text.splitlines():
            if line.startswith("client_requests_total{"):
                o = line.split('outcome="')[1].split('"')[0]
                out[o] = out.get(o, 0.0) + float(line.rsplit(" ", 1)[1])
        out["client_throttled_total"] = _count(text, "client_throttled_total")
        return out

    wrk = subprocess.Popen(["wrk", "-t1", "-c10", "-d16s", "--timeout", "10s", "-s",
                            str(ROOT / "tools" / "wrk-think.lua"), "-H", "X-Tier: gold",
                            f"{lab.front_url}/work", "--", "100"],
                           stdout=subprocess.PIPE, text=True)
    time.sleep(6.0)  # past the throttle's 5 s window
    a = counts()
    out, _ = wrk.communicate(timeout=60)
    b = counts()
    d = {k: b.get(k, 0.0) - a.get(k, 0.0) for k in b}
    sent = sum(v for k, v in d.items() if k not in ("throttled", "client_throttled_total"))
    assert d["client_throttled_total"] == d["throttled"] > 0.3 * (sent + d["throttled"]), d
    assert abs(sent / d["ok"] / 2.0 - 1) <= 0.15, d  # ~ k; wrk's clients are a closed loop
    assert "429:" in out  # wrk saw the throttle's answers
    # Prometheus scraped the front's counter
    time.sleep(2 * lab.clocks.scrape_s)
    assert lab.promql("sum(client_throttled_total)", time.time()) == b["client_throttled_total"]


@live_only
def test_a_policys_local_flags_reach_the_lab_through_the_config_server(tmp_path):
    """throttle_k and concurrency_max (relakit.vocab.LOCAL_FLAGS) as the agent writes them:
    validated by the config server, served, and a lowered ceiling clamps an instance's limit."""
    with Lab(twin_spec(LIMIT), workdir=str(tmp_path)) as lab:
        auth = {"Authorization": f"Bearer {lab.token}"}
        put = lambda flags: httpx.put(f"{lab.config_url}/state", headers=auth,  # noqa: E731
                                      json={"flags": flags})
        assert put({"concurrency_max": 0.5}).status_code == 422
        bad = put({"throttle_k": True})
        assert bad.status_code == 422 and "throttle_k" in bad.text
        assert put({"concurrency_max": 2, "throttle_k": 1.5}).status_code == 200
        assert httpx.get(f"{lab.config_url}/state").json()["flags"]["throttle_k"] == 1.5

        def limits():
            return [float(line.split()[1]) for u in lab.instance_urls
                    for line in httpx.get(f"{u}/metrics").text.splitlines()
                    if line.startswith("concurrency_limit ")]

        deadline = time.time() + 10
        while time.time() < deadline and max(limits()) > 2.0:
            time.sleep(0.2)
        assert limits() == [2.0, 2.0]  # clamped from the initial 4 within a poll
        assert put({"concurrency_max": None}).status_code == 200


def test_lab_up_refuses_a_mitigation_it_cannot_run_and_a_flag_without_its_mechanism(
        tmp_path, capsys):
    """Both before anything starts, in one line naming the file and the key."""
    from relakit.cli import main

    bad = tmp_path / "codel.yaml"
    bad.write_text(LIMIT.read_text() + "  codel: {target_ms: 5}\n")
    work = tmp_path / "lab"
    code = main(["lab", "up", "--dir", str(work), "--mitigations", str(bad)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert f"{bad}: key 'mitigations.codel'" in err
    policy = tmp_path / "policy.yaml"  # the lab's policy, its survival capping the limit
    text = (ROOT / "params" / "policies" / "rela-lab.yaml").read_text()
    policy.write_text(text.replace("assert: {shed_bronze: true,",
                                   "assert: {concurrency_max: 2, shed_bronze: true,"))
    code = main(["lab", "up", "--dir", str(work), "--policy", str(policy),
                 "--mitigations", str(THROTTLE)])
    err = capsys.readouterr().err
    assert code == 2 and "concurrency_max" in err and "mitigations.concurrency_limit" in err, err
    assert not (work / "state.json").exists()


@pytest.mark.skipif(shutil.which("wrk") is None, reason="the set-up installs wrk")
@live_only
def test_a_policys_throttle_k_reaches_the_load_generator_and_the_front(throttled_lab):
    """A throttle_k so large that nothing is ever throttled once a request was accepted,
    served by the config server: at five times capacity neither the generator nor the
    front throttles after their first second (before any accept, the SRE rule refuses
    (requests - k 0) / (requests + 1) whatever k is, as the simulator's does)."""
    import subprocess

    lab = throttled_lab["lab"]
    auth = {"Authorization": f"Bearer {lab.token}"}
    assert httpx.put(f"{lab.config_url}/state", headers=auth,
                     json={"flags": {"throttle_k": 1e6}}).status_code == 200
    try:
        time.sleep(2 * lab.clocks.poll_s)  # the front's next poll
        wrk = subprocess.Popen(["wrk", "-t1", "-c10", "-d5s", "--timeout", "10s", "-s",
                                str(ROOT / "tools" / "wrk-think.lua"), "-H", "X-Tier: gold",
                                f"{lab.front_url}/work", "--", "100"],
                               stdout=subprocess.PIPE, text=True)
        time.sleep(1.5)
        before = _count(httpx.get(f"{lab.front_url}/metrics").text, "client_throttled_total")
        wrk.communicate(timeout=60)
        after = _count(httpx.get(f"{lab.front_url}/metrics").text, "client_throttled_total")
        assert after == before, (before, after)
        t0 = time.time()
        recs = pl.DataFrame(run_load(lab, [(4.0, 100.0)], seed=4))
        out = outcomes(recs.filter(pl.col("start_s") >= t0 + 1.0))
        assert "throttled" not in out and out.get("ok", 0) > 0, out
    finally:
        httpx.put(f"{lab.config_url}/state", headers=auth, json={"flags": {"throttle_k": None}})
