"""relakit.rivals (issue 33, part 3): the in-path mechanisms against the control plane.

What one run is judged on (run_numbers) is checked against counters it does not read
(the servers' own timeout count, the summary), the variants against what they must and
must not carry, the pairing and the verdicts against relakit.stats, the frontier's winner
rule on runs whose numbers are known, and both figures against the palette.
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from conftest import ROOT, make_scenario

import relakit
from relakit import plots
from relakit import rivals as rv
from relakit.analytic import step_delay
from relakit.stats import paired_difference
from relakit.validate import load_yaml

POLICY = load_yaml(ROOT / "params" / "policies" / "rela.yaml", "policy")[0]
CLOCKS = load_yaml(ROOT / "params" / "clocks" / "rela.yaml", "clocks")[0]
IN_PATH_POLICY = ROOT / "params" / "policies" / "rela-in-path.yaml"
SERVER_POLICY = ROOT / "params" / "policies" / "rela-in-path-server.yaml"


def fleet(rate=300.0, deadline_ms=None, duration=40.0, **kw) -> dict:
    """Two nodes of two 10 ms servers (400 rps), tiers for the policy."""
    sc = make_scenario(rate=rate, duration=duration, nodes=2, servers=2, deadline_ms=deadline_ms,
                       tiers={"gold": 0.1, "silver": 0.3, "bronze": 0.6}, **kw)
    sc.pop("faults")
    return sc


def server_timeouts(r) -> int:
    """Copies the servers themselves counted as finished after their client gave up."""
    m = r.metrics.filter((pl.col("name") == "requests_total") & (pl.col("outcome") == "timeout"))
    return int(m.filter(pl.col("time_s") == pl.col("time_s").max())["value"].sum())


def test_run_numbers_no_waste_without_deadlines_and_the_servers_timeouts_with_them():
    calm = relakit.simulate(fleet(rate=300.0))
    n = rv.run_numbers(calm, end_s=10.0)
    assert n["wasted_share"] == 0.0  # every copy served answered its waiting client
    row = calm.summary.filter(pl.col("tier") == "all").row(0, named=True)
    gold = calm.summary.filter(pl.col("tier") == "gold").row(0, named=True)
    assert n["goodput_rps"] == pytest.approx(row["ok"] / 40.0)
    assert n["gold_success"] == gold["success_ratio"] and n["p99_ms"] == row["p99_ms"]
    assert n["mode_entries"] == 0.0
    # overloaded with a deadline, no retries, no hedges: the only copies served for nobody
    # are those the servers finished after their client gave up
    hot = relakit.simulate(fleet(rate=600.0, deadline_ms=50))
    n = rv.run_numbers(hot, end_s=10.0)
    served = hot.metrics.filter((pl.col("name") == "requests_total")
                                & pl.col("outcome").is_in(["ok", "error", "timeout"]))
    served = int(served.filter(pl.col("time_s") == pl.col("time_s").max())["value"].sum())
    assert server_timeouts(hot) > 100
    assert n["wasted_share"] == pytest.approx(server_timeouts(hot) / served, rel=1e-12)


def test_recovery_time_after_a_spike_and_the_time_left_when_never():
    spike = fleet(arrival={"kind": "spike", "rate_rps": 200, "peak_rps": 800, "start_s": 10,
                           "width_s": 10}, deadline_ms=50, duration=60.0)
    r = relakit.simulate(spike)
    n = rv.run_numbers(r, end_s=20.0, level=0.02, hold_s=5.0)
    assert n["recovered"] == 1.0 and 0.0 < n["recovery_s"] < 40.0, n  # the backlog drains
    s = r.fleet_series().with_columns((1 - pl.col("success_ratio").fill_null(1.0)).alias("fail"))
    at = 20.0 + n["recovery_s"]
    assert s.filter((pl.col("time_s") >= at) & (pl.col("time_s") <= at + 5.0))["fail"].max() <= 0.02
    assert s.filter(pl.col("time_s") < at)["fail"][-1] > 0.02  # failing until just before
    # twice the capacity throughout: the share failing never falls to 2 %
    n = rv.run_numbers(relakit.simulate(fleet(rate=800.0, deadline_ms=50, duration=60.0)),
                       end_s=20.0, level=0.02, hold_s=5.0)
    assert n["recovered"] == 0.0 and n["recovery_s"] == pytest.approx(60.0 - 20.0), n
    assert n["followed_s"] == n["recovery_s"]  # censored: watched until the end
    with pytest.raises(ValueError, match="warmup_s 0"):
        rv.run_numbers(relakit.simulate(fleet(warmup=5.0)), end_s=10.0)


def test_variants_carry_what_their_names_say():
    base = fleet()
    v = rv.rival_variants(base, POLICY, CLOCKS)
    assert list(v) == [rv.CONTROL, *[f"{m} {s}" for m in rv.LOCAL_MECHANISMS
                                     for s in ("alone", "+ RelA")]]
    for name, sc in v.items():
        assert sc["metrics"]["interval_s"] == CLOCKS["scrape_s"]  # one sample grid
        assert ("policy" in sc) == (name == rv.CONTROL or name.endswith("+ RelA")), name
        mit = sc.get("mitigations") or {}
        local = [k for k in ("client_throttle", "concurrency_limit", "codel") if k in mit]
        assert len(local) == (0 if name == rv.CONTROL else 1), name
        relakit.scenario.load_scenario(sc)  # every variant is a valid scenario
    assert v["codel + adaptive_lifo alone"]["fleet"]["queue_discipline"] == "adaptive_lifo"
    assert v["concurrency_limit gradient alone"]["mitigations"]["concurrency_limit"][
        "algorithm"] == "gradient"
    assert base.get("mitigations") in (None, {})  # the base is not changed
    with pytest.raises(ValueError, match="'policy' must be unset"):
        rv.rival_variants({**base, "policy": POLICY}, POLICY, CLOCKS)
    with pytest.raises(ValueError, match="mechanism 'lifo'"):
        rv.with_local(base, "lifo")
    with pytest.raises(ValueError, match="cost_us"):
        rv.with_local(base, "codel + adaptive_lifo", -1.0)
    assert rv.with_local(base, "concurrency_limit aimd", 250.0)["mitigations"][
        "concurrency_limit"]["cost_us"] == 250.0
    # beside a local mechanism RelA runs the policy that sees its refusals; alone, its own
    # (the server-side ones without the clients' throttle_ratio, which only a throttle moves)
    seeing = load_yaml(IN_PATH_POLICY, "policy")[0]
    server = load_yaml(SERVER_POLICY, "policy")[0]
    v = rv.rival_variants(base, POLICY, CLOCKS, in_path_policy=seeing, server_policy=server)
    assert v[rv.CONTROL]["policy"] == POLICY
    assert v["client_throttle + RelA"]["policy"] == seeing
    assert all(sc["policy"] == server for name, sc in v.items()
               if name.endswith("+ RelA") and not name.startswith("client_throttle"))
    from relakit.checks import check_scenario

    for name, sc in v.items():  # each passes the scenario checks (no signal that reads nothing)
        found = [f.text for f in check_scenario(relakit.scenario.load_scenario(sc))
                 if f.severity == "error" or "signals." in f.key]
        assert not found, (name, found)
    # the throttle's policy beside a server-side mechanism: throttle_ratio would read 0
    v = rv.rival_variants(base, POLICY, CLOCKS, in_path_policy=seeing)
    found = [f.key for f in check_scenario(relakit.scenario.load_scenario(
        v["concurrency_limit aimd + RelA"])) if f.severity == "error"]
    assert found == ["policy.signals.throttle_ratio.num.outcome"], found  # (an inline policy)


def _runs(numbers: dict[str, dict[str, list[float]]]) -> pl.DataFrame:
    rows = []
    for variant, cols in numbers.items():
        k = len(next(iter(cols.values())))
        for i in range(k):
            rows.append({"variant": variant, "tier": "all", "replication": i, "seed": i,
                         **{n: cols.get(n, [1.0] * k)[i] for n in rv.NUMBERS}})
    return pl.DataFrame(rows)


def test_rival_table_pairs_by_seed_and_names_the_direction():
    base = {"gold_success": [0.5, 0.7, 0.6, 0.9], "p99_ms": [100.0, 300.0, 200.0, 150.0]}
    runs = _runs({rv.CONTROL: base,
                  # better gold (+0.1 paired, though the spread across seeds is wider)
                  "up": {"gold_success": [0.61, 0.79, 0.70, 1.0], "p99_ms": base["p99_ms"]},
                  # higher p99 is worse
                  "slow": {"gold_success": base["gold_success"],
                           "p99_ms": [110.0, 311.0, 209.0, 161.0]}})
    t = rv.rival_table(runs)
    assert t.height == 2 * len(rv.NUMBERS) and set(t["variant"]) == {"up", "slow"}

    def row(v, n):
        return t.filter((pl.col("variant") == v) & (pl.col("number") == n)).row(0, named=True)

    up = row("up", "gold_success")
    d = paired_difference(np.array([0.61, 0.79, 0.70, 1.0]), np.array(base["gold_success"]))
    assert up["difference"] == pytest.approx(d.interval.mean)
    assert up["difference_ci"] == pytest.approx(d.interval.half_width)
    assert up["verdict"] == "better" and up["baseline"] == pytest.approx(0.675)
    assert row("slow", "p99_ms")["verdict"] == "worse"
    assert row("slow", "gold_success")["verdict"] == "not significant"
    assert row("up", "p99_ms")["verdict"] == "not significant"
    with pytest.raises(ValueError, match="baseline 'nobody'"):
        rv.rival_table(runs, baseline="nobody")


def test_frontier_names_the_winner_from_the_paired_difference(monkeypatch):
    # in the path: gold success 0.9 less 0.2 per share of cost; the control plane: 0.95 less
    # 0.1 per clock factor; per seed noise that leaves the paired difference a 95 %
    # half-width of 0.066 (t with 2 degrees of freedom)
    noise = {"path": [0.0, 0.01, -0.01], "control": [0.02, -0.02, 0.0]}

    def fake_runs(variants, end_s, replications, seed, level, hold_s, workers):
        rows = []
        for name in variants:
            side, x = name.split(" ")
            mean = 0.9 - 0.2 * float(x) if side == "path" else 0.95 - 0.1 * float(x)
            rows += [{"variant": name, "replication": i, "gold_success": mean + e}
                     for i, e in enumerate(noise[side])]
        return pl.DataFrame(rows)

    monkeypatch.setattr(rv, "rival_runs", fake_runs)
    factors = [0.5, 1.5, 2.0, 4.0]
    f = rv.decision_frontier(fleet(), POLICY, CLOCKS, "concurrency_limit aimd", [0.0, 1.0],
                             factors, end_s=20.0, replications=3)
    win = {(r["cost_share"], r["clock_factor"]): r["winner"] for r in f.iter_rows(named=True)}
    # differences: 0.9 - 0.9 (n.s.), 0.9 - 0.8, 0.7 - 0.9, 0.7 - 0.75 (n.s.), 0.7 - 0.55
    assert win[(0.0, 0.5)] == "neither" and win[(0.0, 1.5)] == "in the path"
    assert win[(1.0, 0.5)] == "in a control plane" and win[(1.0, 2.0)] == "neither"
    assert win[(1.0, 4.0)] == "in the path"
    cell = f.filter((pl.col("cost_share") == 1.0) & (pl.col("clock_factor") == 2.0)).row(0)
    cell = dict(zip(f.columns, cell, strict=True))
    assert cell["difference"] == pytest.approx(-0.05) and not cell["significant"]
    # RelA's own clocks (factor 1) are always a row, marked: 0.95 - 0.1 there
    assert (f["delay_s"].unique().sort().to_list()
            == sorted(rv.control_delay_s(POLICY, rv.scaled_clocks(CLOCKS, k))
                      for k in [*factors, 1.0]))
    own = f.filter(pl.col("own_clocks"))
    assert own["clock_factor"].to_list() == [1.0, 1.0] and f.height == 2 * 5
    assert own["delay_s"][0] == pytest.approx(rv.control_delay_s(POLICY, CLOCKS))
    assert own.filter(pl.col("cost_share") == 0.0)["difference"][0] == pytest.approx(0.9 - 0.85)
    assert f.filter(pl.col("cost_share") == 1.0)["cost_us"][0] == pytest.approx(10_000.0)
    with pytest.raises(ValueError, match="server-side"):
        rv.decision_frontier(fleet(), POLICY, CLOCKS, "client_throttle", [0.0], [1.0], 20.0)
    with pytest.raises(ValueError, match="number 'p50'"):
        rv.decision_frontier(fleet(), POLICY, CLOCKS, "codel + adaptive_lifo", [0.0], [1.0],
                             20.0, number="p50")


def test_scaled_clocks_scale_the_control_delay():
    from relakit import metastability

    # one reckoning of the control delay: the frontier of notebook 12 and this one's
    assert rv.control_delay_s is metastability.control_delay_s
    one = rv.control_delay_s(POLICY, CLOCKS)
    enter = POLICY["modes"][0]["enter_after"]
    assert one == pytest.approx(step_delay(CLOCKS["scrape_s"], CLOCKS["eval_s"], CLOCKS["poll_s"],
                                           0.0, enter, lead_s=CLOCKS["window_s"] / 2).mean)
    assert rv.control_delay_s(POLICY, rv.scaled_clocks(CLOCKS, 2.0)) == pytest.approx(2 * one)
    phased = rv.scaled_clocks({**CLOCKS, "scrape_phase_s": 4.0, "poll_phase_s": 1.0}, 0.5)
    assert (phased["scrape_phase_s"], phased["poll_phase_s"]) == (2.0, 0.5)  # phases too
    with pytest.raises(ValueError, match="clock factor"):
        rv.scaled_clocks(CLOCKS, 0)


def test_a_small_comparison_end_to_end():
    """Two variants on a spike, the same seeds: a local limit against RelA alone."""
    spike = fleet(arrival={"kind": "spike", "rate_rps": 250, "peak_rps": 700, "start_s": 10,
                           "width_s": 15}, deadline_ms=100, duration=60.0)
    v = rv.rival_variants(spike, POLICY, CLOCKS, ["concurrency_limit aimd"])
    runs = rv.rival_runs({k: v[k] for k in (rv.CONTROL, "concurrency_limit aimd alone")},
                         end_s=25.0, replications=3)
    assert runs.height == 6
    assert (runs.filter(pl.col("variant") == rv.CONTROL)["seed"].to_list()
            == runs.filter(pl.col("variant") != rv.CONTROL)["seed"].to_list())
    t = rv.rival_table(runs)
    assert (t["pairs"] == 3).all() and t.height == len(rv.NUMBERS)
    # the limit refuses what it cannot serve at once: far less work wasted than RelA's
    # queue, which serves copies whose clients gave up
    w = t.filter(pl.col("number") == "wasted_share").row(0, named=True)
    assert w["value"] < w["baseline"] and w["verdict"] == "better", w


# DejaVu Sans (the theme's font) advance widths, in ems, of what a number's tick label holds
_EM = {**dict.fromkeys("0123456789", 0.636), "\u2212": 0.838, "-": 0.361, ".": 0.318, ",": 0.318,
       "%": 0.950}


def _axis_labels(spec) -> list[list[tuple[float, float]]]:
    """(left, right) x of each label drawn on each x axis of a rendered chart (vl-convert's
    scene graph: a label Vega dropped for overlapping has opacity 0; one at the panel's edge
    is aligned left or right of its tick)."""
    import vl_convert as vlc

    groups: list = []
    share = {"left": 0.0, "center": 0.5, "right": 1.0}  # of its width left of its anchor

    def walk(node):
        if isinstance(node, dict):
            if node.get("marktype") == "text" and node.get("role") == "axis-label":
                items = [it for it in node["items"] if it.get("opacity", 1) > 0]
                if items and all(it.get("baseline") == "top" for it in items):  # an x axis
                    widths = [sum(_EM.get(ch, 0.7) for ch in it["text"]) * it["fontSize"]
                              for it in items]
                    groups.append([(it["x"] - share[it["align"]] * w,
                                    it["x"] + (1 - share[it["align"]]) * w)
                                   for it, w in zip(items, widths, strict=True)])
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(vlc.vegalite_to_scenegraph(spec))
    return groups


def test_the_differences_chart_never_writes_tick_labels_into_each_other():
    """The ramp's gold success spans -0.44 to +0.05 in a 150 px panel: its labels were drawn
    edge to edge (-0.4-0.3-0.2-0.1 0.0 0.1). Every x axis keeps 2 px between labels."""
    spans = {"gold_success": (-0.44, 0.05), "goodput_rps": (-1200.0, 1900.0),
             "p99_ms": (-900.0, 10.0), "wasted_share": (-0.2, 0.05)}
    rows = [{"variant": v, "number": n, "difference": d, "difference_ci": abs(d) * 0.02,
             "value": 0.5, "value_ci": 0.01, "baseline": 0.5, "verdict": "better"}
            for n, span in spans.items() for v, d in zip("ab", span, strict=True)]
    spec = plots.rival_differences_chart(pl.DataFrame(rows), rv.NUMBER_TITLES, title="t",
                                         baseline=rv.CONTROL).to_dict()
    axes = _axis_labels(spec)
    assert len(axes) == len(spans) and all(len(a) >= 2 for a in axes), axes  # still labelled
    for labels in axes:
        for (_, right), (left, _) in zip(labels[:-1], labels[1:], strict=True):
            assert left - right >= 2.0, labels


def test_figures_use_the_palette():
    table = pl.DataFrame({"variant": ["a", "b", "a", "b"], "number": ["gold_success"] * 2
                          + ["p99_ms"] * 2, "difference": [0.1, 0.0, -5.0, 3.0],
                          "difference_ci": [0.02, 0.05, 1.0, 1.0], "value": [0.9, 0.8, 50, 58],
                          "value_ci": [0.01] * 4, "baseline": [0.8, 0.8, 55, 55],
                          "verdict": ["better", "not significant", "better", "worse"]})
    spec = plots.rival_differences_chart(
        table, {"gold_success": "gold success", "p99_ms": "p99 (ms)"}, title="t",
        baseline=rv.CONTROL).to_dict()
    scale = spec["hconcat"][0]["layer"][2]["encoding"]["color"]["scale"]
    assert dict(zip(scale["domain"], scale["range"], strict=True)) == {
        **plots.PALETTE["verdict"], "not significant": plots.NEUTRAL["not significant"]}
    with pytest.raises(ValueError, match="no rows for number 'goodput_rps'"):
        plots.rival_differences_chart(table, {"goodput_rps": "goodput"}, title="t",
                                      baseline=rv.CONTROL)
    frontier = pl.DataFrame({"cost_share": [0.0, 0.5], "cost_us": [0.0, 5000.0],
                             "delay_s": [4.35, 4.35], "scrape_s": [1.5] * 2, "eval_s": [0.2] * 2,
                             "in_path": [0.85, 0.74], "control_plane": [0.97, 0.97],
                             "difference": [-0.12, -0.23], "difference_ci": [0.02, 0.02],
                             "winner": ["in a control plane", "neither"]})
    spec = plots.decision_frontier_chart(frontier, number_title="gold success",
                                         title="t").to_dict()
    assert len(spec["layer"]) == 2  # no own-clocks column: no outline
    spec = plots.decision_frontier_chart(frontier.with_columns(
        own_clocks=pl.Series([False, True])), number_title="gold success", title="t").to_dict()
    outline = spec["layer"][2]
    assert outline["mark"]["stroke"] == plots.NEUTRAL["reference"] and not outline["mark"]["filled"]
    assert "own clocks" in " ".join(spec["title"]["subtitle"])
    scale = spec["layer"][0]["encoding"]["color"]["scale"]
    assert dict(zip(scale["domain"], scale["range"], strict=True)) == {
        **plots.PALETTE["winner"], "neither": plots.NEUTRAL["not significant"]}


# ---- issue: the comparison made fair (RelA sees the refusals; one span; censored recovery) ----


def read_at(r, name, outcomes, t, node_filter) -> float:
    m = r.metrics.filter((pl.col("name") == name) & pl.col("outcome").is_in(outcomes)
                         & (pl.col("time_s") == t) & node_filter)
    return float(m["value"].sum())


def test_wasted_work_reads_servers_and_clients_over_one_span_and_is_never_negative():
    # a 15 s grid on a 40 s run: the last sample (30 s) is 10 s before the end, so the
    # clients' whole-run counts hold requests the servers' last sample does not
    sc = fleet(rate=300.0, deadline_ms=50)  # 75 % load: most answered in time, some late
    sc["metrics"] = {"interval_s": 15.0}
    r = relakit.simulate(sc, record_requests=True)
    nodes, t_client = rv.counts_span(r)
    assert set(nodes.values()) == {30.0} and t_client == 30.0
    served, wasted = rv.wasted_copies(r)
    # the hand count: with fan-out 1, no retries and no hedges, the only copies served for
    # nobody are those a server finished after its client gave up (its own timeouts)
    assert wasted == read_at(r, "requests_total", ["timeout"], 30.0, pl.col("node") >= 0) > 100
    assert served == read_at(r, "requests_total", ["ok", "error", "timeout"], 30.0,
                             pl.col("node") >= 0)
    # the records ended ok by the read time are the copies that answered (fan-out 1)
    done = r.requests.filter((pl.col("outcome") == "ok")
                             & (pl.col("arrival_s") + pl.col("latency_ms") / 1000 <= 30.0))
    assert served - wasted == done.height
    # without records the clients' counter at the same sample says the same
    r2 = relakit.simulate(sc, record_requests=False)
    assert rv.wasted_copies(r2) == (served, wasted)
    # the old reading (servers at their last sample, clients over the whole run) went negative
    whole = r.summary.filter(pl.col("tier") == "all").row(0, named=True)
    assert served - (whole["ok"] + whole["error"]) < 0
    assert rv.run_numbers(r, end_s=10.0)["wasted_share"] == pytest.approx(wasted / served)


def test_wasted_work_at_fan_out_three_counts_each_requests_copies_from_its_records():
    sc = make_scenario(rate=150.0, duration=40.0, nodes=4, servers=2, deadline_ms=50, fanout=3,
                       tiers={"gold": 0.1, "silver": 0.3, "bronze": 0.6}, interval=15.0)
    sc.pop("faults")
    r = relakit.simulate(sc, record_requests=True)
    served, wasted = rv.wasted_copies(r)  # the run's fan-out (3), read from the run
    t = rv.counts_span(r)[1]
    recs = r.requests.with_columns((pl.col("arrival_s") + pl.col("latency_ms") / 1000).alias("end"))
    ended = recs.filter(pl.col("end") <= t)
    # every copy of a request answered ok is useful; what is left is bounded by hand: at
    # least the copies the servers finished late (their own timeouts), at most every copy
    # of the requests that timed out by then and of those still open at the read time
    late = read_at(r, "requests_total", ["timeout"], t, pl.col("node") >= 0)
    open_at_t = recs.filter((pl.col("arrival_s") <= t) & (pl.col("end") > t)).height
    timed_out = ended.filter(pl.col("outcome") == "timeout").height
    assert served - wasted == 3 * ended.filter(pl.col("outcome") == "ok").height
    assert 0 < late <= wasted <= 3 * (timed_out + open_at_t), (late, wasted, timed_out, open_at_t)
    with pytest.raises(ValueError, match="record_requests=True"):  # fan-out 3, no records
        rv.wasted_copies(relakit.simulate(sc, record_requests=False))


def test_recovery_is_read_as_censored():
    # 10 and 20 s observed, two runs censored at 30 s: Kaplan-Meier 3/4 after 10 s, 1/2
    # after 20 s (the median); all censored: no median
    assert rv.km_median([10.0, 20.0, 30.0, 30.0], [True, True, False, False]) == 20.0
    assert rv.km_median([10.0, 30.0, 30.0], [True, False, False]) is None
    assert rv.km_median([5.0, 5.0, 9.0], [True, True, True]) == 5.0
    runs = pl.DataFrame({"variant": ["a"] * 4 + ["b"] * 4,
                         "recovery_s": [10.0, 20.0, 30.0, 30.0, 5.0, 6.0, 7.0, 30.0],
                         "recovered": [1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0]})
    s = rv.recovery_summary(runs)
    a, b = (s.filter(pl.col("variant") == v).row(0, named=True) for v in ("a", "b"))
    assert a["within_s"] == 30.0 and (a["recovered"], a["runs"]) == (2, 4)
    assert a["km_median_s"] == 20.0 and b["km_median_s"] == 6.0
    iv = relakit.stats.binomial_interval(3, 4)
    assert (b["share_within"], b["share_low"], b["share_high"]) == (0.75, iv.low, iv.high)
    # the follow-up the runs report wins over what the times suggest
    s = rv.recovery_summary(runs.with_columns(pl.lit(40.0).alias("followed_s")))
    assert s["within_s"].to_list() == [40.0, 40.0] and s["recovered"].to_list() == [2, 3]
    assert s.filter(pl.col("variant") == "a")["share_within"].item() == 0.5
    with pytest.raises(ValueError, match="within_s"):  # longer than any run was watched
        rv.recovery_summary(runs.with_columns(pl.lit(40.0).alias("followed_s")), within_s=41.0)
    with pytest.raises(ValueError, match="km_median"):
        rv.km_median([], [])
    assert "recovery_s" not in rv.NUMBERS  # never a paired mean of censored times


def limited(mechanism: str) -> dict:
    """Twice the capacity of two nodes of two 10 ms servers for 90 s, one local mechanism."""
    sc = fleet(rate=800.0, duration=90.0)
    if mechanism == "client_throttle":
        sc["fleet"]["queue_limit"] = 2  # fast refusals, so the throttle's window fills
        sc["workload"]["arrival"] = {"kind": "poisson", "rate_rps": 2000.0}
    return rv.with_local(sc, mechanism)


def moves(r) -> list[tuple[str, str, str]]:
    """(action, mode, signal) of every change of mode the control plane made."""
    d = r.decisions.filter(pl.col("action").is_in(["enter", "preempt", "exit"]))
    return list(zip(d["action"], d["mode"], d["signal"], strict=True))


def test_rela_sees_a_servers_refusals_only_through_the_in_path_policy():
    """rela.yaml counts no `rejected`: beside a concurrency limit that keeps the queue
    short it sees a slow tail at most (performance: hedging, more load), never survival;
    rela-in-path-server.yaml (rela-in-path.yaml without the clients' throttle_ratio) counts
    the refusals as failures and sheds."""
    sc = limited("concurrency_limit aimd")
    blind = relakit.simulate(rv.with_control(sc, POLICY, CLOCKS))
    seeing = relakit.simulate(rv.with_control(sc, load_yaml(SERVER_POLICY, "policy")[0], CLOCKS))
    assert blind.summary.filter(pl.col("tier") == "all")["rejected"][0] > 10_000  # overloaded
    assert "survival" not in {m for _, m, _ in moves(blind)}, moves(blind)
    assert ("preempt", "survival", "error_ratio") in moves(seeing), moves(seeing)
    assert seeing.summary.filter(pl.col("tier") == "all")["dropped"][0] > 10_000  # it shed


def test_rela_sees_a_clients_throttle_only_through_the_in_path_policy():
    """Five times the capacity all run: the throttle's refusals hide the overload from
    rela.yaml, which goes back to normal while it goes on; rela-in-path.yaml reads the
    clients' throttled share and moves to relief (no hedging, degraded), not to shedding."""
    sc = limited("client_throttle")
    blind = relakit.simulate(rv.with_control(sc, POLICY, CLOCKS))
    seeing = relakit.simulate(rv.with_control(sc, load_yaml(IN_PATH_POLICY, "policy")[0], CLOCKS))
    for r in (blind, seeing):
        every = r.summary.filter(pl.col("tier") == "all").row(0, named=True)
        assert every["throttled"] > every["requests"] / 2  # most refused by the clients
    assert moves(blind)[-1][:2] == ("exit", "normal"), moves(blind)
    assert moves(seeing)[-1] == ("enter", "relief", "throttle_ratio"), moves(seeing)
    assert seeing.info["flags_at_end"]["degraded_mode"] is True
    assert seeing.info["flags_at_end"]["shed_bronze"] is False  # relief never sheds
    last = seeing.timeline.filter(pl.col("time_s") >= 80.0)
    assert (last["throttle_ratio"] > 0.05).all(), last


def test_the_in_path_policy_is_checked_like_any_other(tmp_path):
    from relakit.checkfiles import check_files
    from relakit.control.policy import load_policy

    pol = load_policy(IN_PATH_POLICY)
    assert pol.signals["throttle_ratio"].selector.source == "client"
    assert "rejected" in pol.signals["error_ratio"].selector.labels["outcome"]
    text = IN_PATH_POLICY.read_text().replace("[error, timeout, rejected]",
                                              "[error, timeout, refused]")
    bad = tmp_path / "typo.yaml"
    bad.write_text(text)
    (f,) = [f for f in check_files([str(bad)])[0] if f.severity == "error"]
    msg = f.line()
    assert "\n" not in msg and f.file == str(bad) and f.key == "signals.error_ratio.num.outcome"
    assert "'refused'" in msg and "rejected" in msg  # names the mistake and what is allowed
    # on a fleet without in-path mechanisms no throttled series exists: refused, by key
    plain = rv.with_control(fleet(), load_yaml(IN_PATH_POLICY, "policy")[0], CLOCKS)
    with pytest.raises(Exception, match="throttle_ratio"):
        relakit.simulate(plain)
