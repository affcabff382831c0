"""Semantic checks through the Python API (the corpus in test_bad_inputs.py covers the CLI)."""

from __future__ import annotations

import math
import warnings

import numpy as np
import polars as pl
import pytest
import yaml
from conftest import ROOT, make_scenario

from relakit.checkfiles import check_files
from relakit.checks import CheckError, RelakitWarning, check_memory, check_scenario
from relakit.control import Clocks, load_policy
from relakit.control.tsdb import Target, over_time
from relakit.experiment import simulate
from relakit.openloop import replay
from relakit.scenario import OverrideError, load_scenario
from relakit.sim import run_memory

POLICY = {
    "signals": {"errors": {"kind": "ratio", "num": {"metric": "requests_total",
                                                   "outcome": ["error", "timeout"]},
                           "den": {"metric": "requests_total"}}},
    "conditions": {"failing": {"signal": "errors", "op": ">", "threshold": 0.05}},
    "modes": [{"name": "survival", "when": {"any": ["failing"]}}],
}


def test_avg_over_time_of_an_empty_window_is_nan_without_a_runtime_warning():
    tgt = Target(0, np.array([0.0, 10.0]), np.array([[1.0], [3.0]]), [("g", None, None, None)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = over_time(tgt, np.array([0]), np.array([5.0, 10.0, 30.0]), 2.0, "avg")
    assert np.isnan(got[0, 0]) and got[1, 0] == 3.0 and np.isnan(got[2, 0])


def test_an_overloaded_run_counts_what_is_in_flight_against_the_fluid_limit():
    # M/M/4 offered 500 rps for 400 rps of capacity, unbounded: the backlog grows by
    # (lambda - c mu) T = 100 x 60 = 6,000 (plus the 4 in service); the noise of
    # arrivals and departures over 60 s is about sqrt(500 x 60 + 400 x 60) ~ 232.
    sc = make_scenario(rate=500.0, duration=60.0, servers=4)
    with pytest.warns(RelakitWarning, match="1.25x the fleet's capacity"):
        r = simulate(sc, record_requests=False)
    info = r.info
    assert info["user_requests"] == info["counted_requests"] + info["in_flight_at_end"]
    assert abs(info["in_flight_at_end"] - 6004) < 5 * 232
    assert info["steady_state"] is False
    assert info["offered_utilisation"] == pytest.approx(1.25)
    text = r.format_summary()
    assert f"{info['in_flight_at_end']} requests" in text
    assert "did not reach a steady state" in text


def test_a_stable_run_is_a_steady_state_and_says_nothing_more():
    with warnings.catch_warnings():
        warnings.simplefilter("error", RelakitWarning)
        r = simulate(make_scenario(rate=200.0, duration=20.0, servers=4), record_requests=False)
    assert r.info["steady_state"] is True
    assert r.info["in_flight_at_end"] < 20
    assert "steady state" not in r.format_summary()


def _refused(policy):
    """The one finding that refuses a short closed loop with ``policy``."""
    sc = {**make_scenario(rate=50.0, duration=10.0, interval=1.0), "policy": policy,
          "clocks": {"scrape_s": 1, "window_s": 4, "eval_s": 1, "poll_s": 1}}
    with pytest.raises(CheckError) as info:
        simulate(sc)
    (f,) = info.value.findings
    return f


def test_a_closed_loop_on_a_metric_the_simulator_does_not_export_is_refused():
    pol = {**POLICY, "signals": {"errors": {**POLICY["signals"]["errors"],
                                            "num": {"metric": "requests_totl"}}}}
    f = _refused(pol)
    assert f.key == "policy.signals.errors.num.metric" and "requests_total" in f.message


def _trace(names=("requests_total",)) -> pl.DataFrame:
    rows = [(float(t), 0, n, "gold", "ok", None, float(10 * t)) for t in range(30) for n in names]
    return pl.DataFrame(rows, orient="row", schema={"time_s": pl.Float64, "node": pl.Int32,
                                                    "name": pl.String, "tier": pl.String,
                                                    "outcome": pl.String, "le": pl.String,
                                                    "value": pl.Float64})


def test_replay_refuses_a_trace_without_any_signal_and_warns_about_one_missing():
    clocks = Clocks(scrape_s=1, window_s=5, eval_s=1, poll_s=1)
    with pytest.raises(CheckError, match="no samples for any signal"):
        replay(_trace(("node_cpu_seconds_total",)), POLICY, clocks)
    two = {**POLICY, "signals": {**POLICY["signals"],
                                 "late": {"kind": "rate", "metric": "hedges_total",
                                          "source": "client"}}}
    with pytest.warns(RelakitWarning, match="hedges_total"):
        rep = replay(_trace(), two, clocks)
    assert rep.timeline.height == 30
    with pytest.raises(CheckError, match="after the last"):
        replay(_trace(), POLICY, clocks, start_s=20.0, end_s=10.0)


def test_memory_is_estimated_before_allocating_and_judged_against_what_is_free():
    sc = load_scenario(make_scenario(duration=3600.0, nodes=10, interval=1.0))
    est = run_memory(sc, record_requests=False)
    assert est["samples"] == pytest.approx(3602)
    need = est["total"]
    assert check_memory(sc, False, available=int(4 * need)) == []
    (warn,) = check_memory(sc, False, available=int(1.5 * need))
    (err,) = check_memory(sc, False, available=int(0.5 * need))
    assert (warn.severity, err.severity) == ("warning", "error")
    assert warn.key == "duration_s" and "metrics.interval_s" in err.message


def test_override_keys_that_lead_nowhere_say_where():
    with pytest.raises(OverrideError, match="'x'") as info:
        load_scenario(make_scenario(), overrides={"duration_s.x": 1})
    assert info.value.key == "duration_s.x"
    pol = {**make_scenario(), "policy": POLICY}
    with pytest.raises(OverrideError, match="index from 0 to 0"):
        load_scenario(pol, overrides={"policy.modes.9.enter_after": 2})


def test_cyclic_escalation_is_refused_and_an_impossible_threshold_too():
    cyc = {**POLICY, "modes": [
        {"name": "a", "when": {"any": ["failing"]}, "max_duration_s": 5, "escalate_to": "b"},
        {"name": "b", "when": {"any": ["failing"]}, "max_duration_s": 5, "escalate_to": "a"}]}
    with pytest.raises(ValueError, match="a -> b -> a"):
        load_policy(cyc)
    bad = {**POLICY, "conditions": {"failing": {"signal": "errors", "op": ">", "threshold": 5}}}
    sc = {**make_scenario(rate=50.0, duration=10.0, interval=1.0), "policy": bad,
          "clocks": {"scrape_s": 1, "window_s": 4, "eval_s": 1, "poll_s": 1}}
    with pytest.raises(CheckError, match="can never hold"):
        simulate(sc)
    assert math.isfinite(load_policy(POLICY).conditions[0].threshold)


def test_a_promql_signal_on_a_metric_no_series_has_is_named(tmp_path):
    """A typo inside a PromQL expression type-checks; the check names it and guesses."""
    import yaml

    from relakit.cli import main

    policy = yaml.safe_load((ROOT / "params" / "policies" / "rela.yaml").read_text())
    policy["signals"]["error_ratio"] = {
        "promql": 'sum(rate(requests_totl{outcome=~"error|timeout"}[1m])) '
                  '/ sum(rate(requests_total[1m]))'}
    path = tmp_path / "typo.yaml"
    path.write_text(yaml.safe_dump(policy))
    trace = ROOT / "data" / "traces" / "step-errors.csv"
    findings = check_files([str(path), str(trace)])[0]
    named = [f for f in findings if f.key == "signals.error_ratio.promql"]
    assert len(named) == 1 and named[0].severity == "warning", findings
    assert "'requests_totl'" in named[0].message and "did you mean 'requests_total'" in (
        named[0].message)
    assert main(["check", str(path), str(trace)]) == 1
    # the same expression spelled right raises nothing about it
    policy["signals"]["error_ratio"]["promql"] = policy["signals"]["error_ratio"][
        "promql"].replace("requests_totl", "requests_total")
    path.write_text(yaml.safe_dump(policy))
    assert not [f for f in check_files([str(path), str(trace)])[0]
                if f.key.startswith("signals.error_ratio")]


def test_a_rule_on_a_metric_no_series_has_is_named_once(tmp_path, capsys):
    """A misspelt metric in a rule file parses, and the alert would silently never fire."""
    from relakit.cli import main

    rules = ROOT / "params" / "rules" / "slo.yml"
    typo = tmp_path / "typo.yml"
    typo.write_text(rules.read_text().replace("requests_total", "requests_totl"))
    trace = ROOT / "data" / "traces" / "step-errors.csv"
    assert main(["check", str(rules), str(trace)]) == 0
    capsys.readouterr()
    assert main(["check", str(typo), str(trace)]) == 1
    assert "rules: " in capsys.readouterr().out
    assert main(["replay", str(trace), "--rules", str(typo), "--out",
                 str(tmp_path / "out")]) == 0
    warned = [line for line in capsys.readouterr().err.splitlines()
              if "requests_totl" in line]
    keys = [line.split("key '")[1].split("'")[0] for line in warned]
    assert keys and len(keys) == len(set(keys)), warned  # one line per rule, not per selector
    assert all(k.endswith(".expr") and "did you mean 'requests_total'" in w
               for k, w in zip(keys, warned, strict=True))


def test_relakit_check_knows_every_file_the_project_ships_and_finds_nothing(capsys):
    """Every file under params/ and data/ is told by its kind (scenarios, policies,
    chains, clocks, sweeps, searches, rules, traces, rate traces, audits, requests
    tables, papermill parameters, documentation) and passes: an intended overload is
    declared in its scenario (``intended: [overload]``), not warned about."""
    from conftest import ROOT

    from relakit.cli import main

    files = sorted(str(p.relative_to(ROOT)) for top in ("params", "data")
                   for p in (ROOT / top).rglob("*") if p.is_file())
    assert len(files) > 40
    import os

    here, kinds = os.getcwd(), set()
    os.chdir(ROOT)
    try:
        for f in files:  # each on its own (given together, each is checked against each)
            code = main(["check", f])
            out, err = capsys.readouterr()
            assert code == 0, err
            kinds.add(out.strip().rsplit(": ", 2)[-2])
    finally:
        os.chdir(here)
    assert {"scenario", "policy", "chain", "clocks", "sweep", "search", "rules", "trace",
            "rate trace", "audit", "requests", "papermill parameters", "alert mapping",
            "documentation"} <= kinds, kinds


def test_an_outcome_of_its_own_is_refused_by_the_simulator_yet_replays_over_a_recording(tmp_path):
    """relakit's outcomes are a closed set, a recording's are not: ``outcome: 5xx`` is an
    error against the simulator (and `relakit check POLICY` alone) but a recording that
    carries it replays, and its series are read."""
    pol = {**POLICY, "signals": {**POLICY["signals"],
                                 "errors": {"kind": "ratio",
                                            "num": {"metric": "requests_total", "outcome": "5xx"},
                                            "den": {"metric": "requests_total"}}}}
    f = _refused(pol)
    assert f.key == "policy.signals.errors.num.outcome" and "rejected" in f.message
    path = tmp_path / "pol.yaml"
    path.write_text(yaml.safe_dump(pol))
    findings, _ = check_files([str(path)])
    assert [(x.severity, x.key) for x in findings if "5xx" in x.message] == [
        ("error", "signals.errors.num.outcome")]
    trace = _trace().with_columns(pl.when(pl.col("time_s") >= 20).then(pl.lit("5xx"))
                                  .otherwise(pl.col("outcome")).alias("outcome"))
    rep = replay(trace, pol, Clocks(scrape_s=1, window_s=5, eval_s=1, poll_s=1))
    errors = rep.timeline.filter(pl.col("time_s") == 29.0)["errors"]
    assert errors.len() == 1 and errors[0] > 0


IN_PATH_POLICY = ROOT / "params" / "policies" / "rela-in-path.yaml"
SERVER_POLICY = ROOT / "params" / "policies" / "rela-in-path-server.yaml"


def _in_path(policy, discipline="fifo", **mitigations):
    """A short closed loop under ``policy`` beside the given in-path mechanisms."""
    sc = {**make_scenario(rate=50.0, duration=30.0, interval=1.0,
                          tiers={"gold": 0.1, "silver": 0.3, "bronze": 0.6}),
          "policy": str(policy) if not isinstance(policy, dict) else policy,
          "clocks": {"scrape_s": 1, "window_s": 4, "eval_s": 1, "poll_s": 1}}
    sc["fleet"]["queue_discipline"] = discipline
    sc["mitigations"] = mitigations
    return sc


def test_a_signal_on_a_counter_no_configured_mechanism_moves_is_refused():
    """LIFO alone makes the run an in-path one (the throttled and rejected series exist),
    but nothing there throttles: rela-in-path.yaml's throttle_ratio would read 0 all run.
    Refused by file and key, naming what would move it; the same beside a server-side
    mechanism only, and for each in-path series by name."""
    with pytest.raises(CheckError) as info:
        simulate(_in_path(IN_PATH_POLICY, "lifo"))
    (f,) = info.value.findings
    assert f.key == "signals.throttle_ratio.num.outcome", f
    assert f.file.endswith("rela-in-path.yaml") and "\n" not in f.line()
    assert "mitigations.client_throttle" in f.message and "lifo" in f.message, f.message
    limit = {"algorithm": "aimd", "initial": 4}
    with pytest.raises(CheckError, match="throttle_ratio.num.outcome"):
        simulate(_in_path(IN_PATH_POLICY, concurrency_limit=limit))
    # what is allowed: the throttle's own fleet (rejected counted among other outcomes is
    # read, not refused), and the server policy beside a server-side mechanism
    throttle = {"k": 2.0, "window_s": 10.0}
    for sc in (_in_path(IN_PATH_POLICY, client_throttle=throttle, concurrency_limit=limit),
               _in_path(IN_PATH_POLICY, "lifo", client_throttle=throttle),
               _in_path(SERVER_POLICY, concurrency_limit=limit),
               _in_path(SERVER_POLICY, "lifo")):
        assert not [x for x in check_scenario(load_scenario(sc)) if x.severity == "error"], sc
    # every in-path series, by name: a gauge or counter only its own mechanism moves
    for metric, source, mechanism, mit in (
            ("concurrency_limit", None, "concurrency_limit", {}),
            ("codel_dropped_total", None, "codel", {"concurrency_limit": limit}),
            ("rejected_total", None, "concurrency_limit or mitigations.codel",
             {"client_throttle": throttle}),
            ("client_throttled_total", "client", "client_throttle", {"concurrency_limit": limit})):
        sel = {"metric": metric, **({"source": source} if source else {})}
        pol = {**POLICY, "signals": {"errors": {"kind": "rate", **sel}}}
        (f,) = [x for x in check_scenario(load_scenario(_in_path(pol, "lifo", **mit)))
                if x.severity == "error"]
        assert f.key == "policy.signals.errors.metric" and f"mitigations.{mechanism}" in f.message
    # a PromQL signal: refused when all it reads is such a series, not when it reads others
    for expr, refused in (('sum(rate(client_requests_total{outcome="throttled"}[4s]))', True),
                          ("sum(rate(client_throttled_total[4s]))", True),
                          ('sum(rate(client_throttled_total[4s])) / sum(rate(requests_total[4s]))',
                           False)):
        pol = {**POLICY, "signals": {"errors": {"promql": expr}}}
        found = [x.key for x in check_scenario(load_scenario(_in_path(pol, "lifo")))
                 if x.severity == "error"]
        assert found == (["policy.signals.errors.promql"] if refused else []), (expr, found)


def test_a_rollouts_new_policy_meets_the_same_checks_as_the_current_one():
    """The canary runs the rollout's policy on the same fleet: a signal there that reads a
    counter nothing moves is refused as it is for ``policy:`` (it was not checked), the
    key under ``rollout.policy`` when the policy is inline, the file's own otherwise."""
    sc = _in_path(SERVER_POLICY, "lifo")
    sc["fleet"]["nodes"] = 4
    sc["rollout"] = {"policy": str(IN_PATH_POLICY), "canary": {"fraction": 0.25},
                     "start_s": 10, "observe_s": 10,
                     "promote_if": {"all": [{"metric": "success_ratio", "tier": "all",
                                             "op": ">", "margin": 0}]}}
    (f,) = [x for x in check_scenario(load_scenario(sc)) if x.severity == "error"]
    assert f.key == "signals.throttle_ratio.num.outcome" and f.file.endswith(
        "rela-in-path.yaml") and "mitigations.client_throttle" in f.message, f
    sc["rollout"]["policy"] = yaml.safe_load(IN_PATH_POLICY.read_text())
    (f,) = [x for x in check_scenario(load_scenario(sc)) if x.severity == "error"]
    assert f.key == "rollout.policy.signals.throttle_ratio.num.outcome", f
    sc["rollout"]["policy"] = str(SERVER_POLICY)  # what is allowed
    assert not [x for x in check_scenario(load_scenario(sc)) if x.severity == "error"]


def test_the_lab_refuses_a_signal_on_an_outcome_its_mechanisms_never_count():
    """The live lab's instances count `rejected` only with a concurrency limit and never
    `throttled` (the clients' throttle refuses before sending): a signal reading only one
    of them reads nothing there, refused as in the simulator; counted among others, read."""
    from relakit.checks import check_lab
    from relakit.control import load_clocks

    clocks = load_clocks({}, scrape_s=1, window_s=5, eval_s=1, poll_s=1)

    def errors(outcome, **kw):
        pol = load_policy({**POLICY, "signals": {"errors": {
            "kind": "ratio", "num": {"metric": "requests_total", "outcome": outcome},
            "den": {"metric": "requests_total"}}}})
        return [f for f in check_lab(pol, clocks, **kw) if f.severity == "error"]

    limit = {"extra_series": ("rejected_total", "concurrency_limit"),
             "mechanisms": ("concurrency_limit",)}
    (f,) = errors("rejected")
    assert f.key == "signals.errors.num.outcome" and "concurrency limit" in f.message, f
    assert not errors("rejected", **limit)
    (f,) = errors("throttled", mechanisms=("client_throttle",))
    assert "never count" in f.message, f
    assert not errors(["error", "timeout", "rejected"])  # read beside what there is
    server = load_policy(SERVER_POLICY)
    assert not [f for f in check_lab(server, clocks) if f.severity == "error"]

    def promql_errors(expr, **kw):  # the same refusal for the signal written in PromQL
        pol = load_policy({**POLICY, "signals": {"errors": {"promql": expr}}})
        return [f for f in check_lab(pol, clocks, **kw) if f.severity == "error"]

    (f,) = promql_errors('sum(rate(requests_total{outcome="throttled"}[1m]))')
    assert f.key == "signals.errors.promql" and "never count" in f.message, f
    (f,) = promql_errors('sum(rate(requests_total{outcome="rejected"}[1m])) / '
                         'sum(rate(requests_total{outcome="throttled"}[1m]))')
    assert "concurrency limit" in f.message, f
    assert not promql_errors('sum(rate(requests_total{outcome="rejected"}[1m]))', **limit)
    assert not promql_errors('sum(rate(requests_total{outcome="throttled"}[1m])) / '
                             'sum(rate(requests_total[1m]))')  # read beside what there is


def test_the_in_path_series_table_names_every_series_an_in_path_run_adds():
    from relakit.checks import IN_PATH_SERIES_COUNTED_BY, simulator_series
    from relakit.vocab import IN_PATH_KEYS

    added = ({s[1] for s in simulator_series((0.1,), True)}
             - {s[1] for s in simulator_series((0.1,), False)})
    assert added == set(IN_PATH_SERIES_COUNTED_BY)
    assert {k for v in IN_PATH_SERIES_COUNTED_BY.values() for k in v} == set(IN_PATH_KEYS)


def test_a_signal_on_an_in_path_outcome_names_the_mechanism_that_counts_it():
    from relakit.checks import check_signals, simulator_series

    pol = load_policy({**POLICY, "signals": {**POLICY["signals"],
                       "errors": {"kind": "ratio",
                                  "num": {"metric": "requests_total", "outcome": "rejected"},
                                  "den": {"metric": "requests_total"}}}})
    (f,) = check_signals(pol, simulator_series((0.1, 1.0)), missing="error",
                         what="the simulator", own=True)
    assert f.key == "signals.errors.num.outcome", f
    assert "mitigations.concurrency_limit or mitigations.codel" in f.message
    assert "client_throttle" not in f.message


# ---- a run's last seconds after its last metrics sample ------------------------------------
def test_unsampled_tail_is_the_duration_modulo_the_scrape_and_is_warned_by_name():
    from relakit.checks import check_sampled, unsampled_s
    from relakit.scenario import load_scenario

    assert unsampled_s(100, 15) == pytest.approx(10)  # notebook 11's run: last sample at 90 s
    assert unsampled_s(105, 15) == 0 and unsampled_s(0.9, 0.3) == 0  # float multiples
    assert unsampled_s(105, 1.5) == 0 and unsampled_s(2, 0.75) == pytest.approx(0.5)
    sc = load_scenario(make_scenario(duration=100, interval=15))
    (f,) = [f for f in check_scenario(sc) if f.key == "duration_s"]
    assert f.severity == "warning" and f.file == sc.source
    for said in ("100 s", "metrics.interval_s (15 s)", "last 10 s", "at 90 s",
                 "duration_s 90 or 105"):
        assert said in f.message, f.message
    assert not check_sampled(load_scenario(make_scenario(duration=105, interval=15)))
    # a run shorter than one scrape: only the longer multiple is offered
    short = check_sampled(load_scenario(make_scenario(duration=10, interval=15)))
    assert "use duration_s 15 " in short[0].message, short[0].message


def test_unsampled_tail_names_clocks_scrape_when_the_clocks_set_the_interval():
    from relakit.checks import check_sampled
    from relakit.scenario import load_scenario

    sc = make_scenario(duration=62)
    del sc["metrics"]
    sc["policy"] = str(ROOT / "params/policies/rela-eager-shed.yaml")
    sc["clocks"] = {"scrape_s": 5, "window_s": 30, "eval_s": 2, "poll_s": 2}
    (f,) = check_sampled(load_scenario(sc))
    assert "metrics.interval_s (5 s, clocks.scrape_s)" in f.message and "last 2 s" in f.message


def test_unsampled_tail_is_said_by_every_path_that_runs_a_scenario(tmp_path):
    """simulate, the checks of a sweep, and the maps and rivals whose workers run with the
    semantic warnings off (they say it before the workers start)."""
    from relakit.experiment import simulate
    from relakit.metastability import Recovery, basin_map
    from relakit.rivals import rival_runs

    sc = make_scenario(duration=10, interval=3, rate=50, nodes=1, servers=2)
    with pytest.warns(RelakitWarning, match="last 1 s"):
        simulate(sc, record_requests=False)
    with pytest.warns(RelakitWarning, match="not a multiple of metrics.interval_s"):
        basin_map(sc, "spike", [1.0], [1.0], Recovery(level=10, hold_s=1, within_s=6),
                  replications=1, start_s=2.0, workers=1)  # a 2 + 1 + 6 + 1 = 10 s run
    with pytest.warns(RelakitWarning, match="last 1 s"):
        rival_runs({"a": sc}, end_s=5.0, replications=1, hold_s=1.0, workers=1)
