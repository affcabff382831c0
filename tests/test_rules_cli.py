"""Prometheus rule files through the command line and as relakit policies (issue 15)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from relakit.cli import main
from relakit.control.rules import backtest_rules

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "data" / "traces" / "step-errors.csv"
RULES = ROOT / "params" / "rules" / "slo.yml"


def test_replay_rules_alone_writes_the_alerts_of_backtest_rules(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["replay", str(TRACE), "--rules", str(RULES), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    written = pl.read_parquet(out / "alerts.parquet")
    expected = backtest_rules(TRACE, RULES)
    assert written.equals(expected)
    assert written.filter(pl.col("firing_at").is_not_null()).height > 0  # the trace breaches
    for row in expected.iter_rows(named=True):
        assert row["alert"] in printed
    assert not (out / "decisions.parquet").exists()  # no policy, no chain: no decisions


def test_replay_rules_over_parquet_never_loads_polars_and_keeps_rule_file_order(tmp_path):
    """A Parquet trace is read and the alerts written by pyarrow: the command never imports
    polars (~0.13 s of its start, docs/performance.md), and the file is backtest_rules'
    table. Rows tied on (pending_at, alert, labels) -- two rules of one name -- keep the
    rule file's order."""
    from relakit.traces import read_trace

    trace, rules, out = tmp_path / "t.parquet", tmp_path / "dup.yml", tmp_path / "out"
    read_trace(TRACE).write_parquet(trace)
    rules.write_text(RULES.read_text() + """
  - name: dup
    rules:
      - alert: Twice
        expr: vector(1)
        for: 5m
      - alert: Twice
        expr: vector(1)
""")
    code = ("import sys; from relakit.cli import main; "
            f"rc = main(['replay', {str(trace)!r}, '--rules', {str(rules)!r}, '--out', "
            f"{str(out)!r}]); print(rc, 'polars' in sys.modules)")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, timeout=300)
    assert run.stdout.split()[-2:] == ["0", "False"], run.stderr[-2000:]
    written = pl.read_parquet(out / "alerts.parquet")
    expected = backtest_rules(trace, rules)
    assert written.equals(expected) and written.height > 2
    twice = expected.filter(pl.col("alert") == "Twice")
    t0 = twice["pending_at"][0]
    assert twice["pending_at"].to_list() == [t0, t0]
    assert twice["firing_at"].to_list() == [t0 + 300.0, t0]


def test_replay_rules_respects_start_and_end_and_runs_beside_a_policy(tmp_path, capsys):
    out = tmp_path / "out"
    policy = ROOT / "params" / "policies" / "rela.yaml"
    assert main(["replay", str(TRACE), "--rules", str(RULES), "--policy", str(policy),
                 "--start", "0", "--end", "500", "--out", str(out)]) == 0
    written = pl.read_parquet(out / "alerts.parquet")
    assert written.equals(backtest_rules(TRACE, RULES, 0.0, 500.0))
    full = backtest_rules(TRACE, RULES)
    # the slow burn goes pending at 480 s and fires at 600 s: within 500 s it only pends
    assert full.filter(pl.col("alert") == "ErrorBudgetSlowBurn")["firing_at"].to_list() == [600.0]
    assert written.filter(pl.col("alert") == "ErrorBudgetSlowBurn")["firing_at"].to_list() == [None]
    assert written["pending_at"].max() <= 500.0
    assert (out / "decisions.parquet").exists()


def test_replay_bad_rule_file_is_one_line_and_writes_nothing(tmp_path, capsys):
    bad = tmp_path / "bad.yml"
    bad.write_text("groups:\n  - name: g\n    rules:\n      - alert: A\n        expr: "
                   "limitk(2, x) > 1\n")
    out = tmp_path / "out"
    assert main(["replay", str(TRACE), "--rules", str(bad), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"relakit: error: {bad}: key 'groups[0].rules[0].expr':")
    assert "\n" not in err
    assert not out.exists()


def test_replay_needs_something_to_run(tmp_path, capsys):
    assert main(["replay", str(TRACE), "--out", str(tmp_path / "o")]) == 2
    assert "--rules" in capsys.readouterr().err


# ---- promql signals -----------------------------------------------------------------------
POLICY = ROOT / "params" / "policies" / "rela.yaml"
SERVERS = 'instance!="client"'  # structured signals read the servers' series (source: nodes)
PROMQL_SIGNALS = {
    "p99_ms": "histogram_quantile(0.99, sum by (le) "
              f"(rate(latency_seconds_bucket{{{SERVERS}}}[60s]))) * 1000",
    "error_ratio": f'sum(rate(requests_total{{{SERVERS}, outcome=~"error|timeout"}}[60s])) / '
                   f'sum(rate(requests_total{{{SERVERS}, outcome=~"ok|error|timeout"}}[60s]))',
    "drop_ratio": f'sum(rate(requests_total{{{SERVERS}, outcome="dropped"}}[60s])) / '
                  f"sum(rate(requests_total{{{SERVERS}}}[60s]))",
}


def promql_policy(tmp_path) -> Path:
    import yaml

    data = yaml.safe_load(POLICY.read_text())
    data["signals"] = {k: {"promql": v} for k, v in PROMQL_SIGNALS.items()}
    path = tmp_path / "rela-promql.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.mark.parametrize("trace", ["step-errors.csv", "ramp-latency.csv"])
def test_promql_signals_equal_the_structured_ones_and_decide_alike(tmp_path, trace):
    from relakit.openloop import replay

    path = ROOT / "data" / "traces" / trace
    a = replay(path, POLICY)
    b = replay(path, promql_policy(tmp_path))
    for name in PROMQL_SIGNALS:
        x, y = a.timeline[name].to_numpy(), b.timeline[name].to_numpy()
        assert np.array_equal(np.isnan(x), np.isnan(y)), name
        ok = np.isfinite(x)
        assert np.all(np.abs(x[ok] - y[ok]) <= 1e-9 * np.maximum(1.0, np.abs(x[ok]))), name
        if name != "drop_ratio":  # the traces hold no dropped requests: NaN in both
            assert ok.sum() > 0.9 * x.size, name  # not vacuous
    assert a.timeline["mode"].to_list() == b.timeline["mode"].to_list()
    assert a.decisions.drop("reason", "value").equals(b.decisions.drop("reason", "value"))
    va, vb = a.decisions["value"].to_numpy(), b.decisions["value"].to_numpy()
    assert np.allclose(va, vb, rtol=1e-9, atol=1e-12, equal_nan=True)
    assert a.timeline["mode"].n_unique() > 1  # the trace drives the policy somewhere


def test_promql_signal_renders_itself_and_bad_expression_names_the_key(tmp_path):
    from relakit.control.policy import load_policy
    from relakit.validate import ScenarioError

    pol = load_policy(promql_policy(tmp_path))
    assert pol.signals["p99_ms"].promql(60.0) == PROMQL_SIGNALS["p99_ms"]
    bad = tmp_path / "bad.yaml"
    bad.write_text(promql_policy(tmp_path).read_text().replace("sum by (le)", "topk(3,", 1))
    with pytest.raises(ScenarioError, match=rf"^{bad}: key 'signals.p99_ms.promql': .*"
                                            r"column \d+"):
        load_policy(bad)


def test_promql_signal_with_many_series_is_refused_clearly():
    from relakit.control.policy import load_policy
    from relakit.openloop import replay

    pol = load_policy({"signals": {"busy": {"promql": "in_flight"}},
                       "conditions": {"hot": {"signal": "busy", "threshold": 8}},
                       "modes": [{"name": "survival", "when": {"any": ["hot"]}}]})
    with pytest.raises(ValueError, match=r"signal busy: 'in_flight' gives \d+ series .* "
                                         r"aggregate it"):
        replay(TRACE, pol)


def test_closed_loop_simulate_with_promql_signals_matches_the_structured_policy(tmp_path):
    import yaml

    from relakit.experiment import simulate

    sc = yaml.safe_load((ROOT / "params" / "scenarios" / "rela-ramp.yaml").read_text())
    sc.update(duration_s=120, name="promql-loop")
    sc["fleet"]["nodes"] = 2
    # 2 nodes of 8 servers hold about 1,500 req/s: the ramp crosses it within the run
    sc["workload"]["arrival"] = {"kind": "trace", "points": [[0, 600], [120, 2400]]}
    sc["clocks"] = str(ROOT / "params" / "clocks" / "rela.yaml")
    runs = {}
    for label, pol in (("structured", POLICY), ("promql", promql_policy(tmp_path))):
        runs[label] = simulate({**sc, "policy": str(pol)}, record_requests=False)
    a, b = runs["structured"].timeline, runs["promql"].timeline
    assert a["mode"].to_list() == b["mode"].to_list()
    assert a["mode"].n_unique() > 1  # the loop did act
    for name in ("p99_ms", "error_ratio"):
        x, y = a[name].to_numpy(), b[name].to_numpy()
        assert np.array_equal(np.isnan(x), np.isnan(y)), name
        ok = np.isfinite(x)
        assert ok.any(), name
        assert np.all(np.abs(x[ok] - y[ok]) <= 1e-9 * np.maximum(1.0, np.abs(x[ok]))), name


# ---- import-rules --------------------------------------------------------------------------
MAPPING = {"ErrorBudgetFastBurn": "survival", "ErrorBudgetSlowBurn": "survival",
           "Overloaded": "survival", "LatencyP99High": "performance"}


@pytest.mark.parametrize("trace", ["step-errors.csv", "ramp-latency.csv"])
def test_imported_rules_enter_each_mode_when_its_alert_fires(tmp_path, capsys, trace):
    from relakit.control.policy import load_policy
    from relakit.openloop import replay

    mapping = tmp_path / "mapping.yml"
    mapping.write_text("".join(f"{k}: {v}\n" for k, v in MAPPING.items() if k != "Overloaded"))
    assert main(["import-rules", str(RULES), "--out", str(tmp_path / "slo"), "--mapping",
                 str(mapping), "--map", "Overloaded=survival"]) == 0
    out, clocks = tmp_path / "slo" / "policy.yaml", tmp_path / "slo" / "clocks.yaml"
    pol = load_policy(out)
    assert [m.name for m in pol.modes] == ["ErrorBudgetFastBurn", "ErrorBudgetSlowBurn",
                                           "Overloaded", "LatencyP99High"]
    path = ROOT / "data" / "traces" / trace
    result = replay(path, out, clocks)
    alerts = backtest_rules(path, RULES)
    entered = result.decisions.filter(pl.col("action").is_in(["enter", "preempt"]))
    assert entered.height > 0
    for row in entered.iter_rows(named=True):
        fired = alerts.filter(pl.col("alert") == row["mode"])["firing_at"].drop_nulls()
        # Prometheus' firing instant and the policy's entry: the same evaluation
        assert row["decided_at_s"] == fired.min(), row["mode"]
        assert row["mode"] in row["reason"] and "severity=" in row["reason"]
    # every alert that fires enters its mode then, unless a higher-priority mode holds
    names = [m.name for m in pol.modes]
    for alert, t in alerts.group_by("alert").agg(pl.col("firing_at").min()).iter_rows():
        if t is None:
            continue
        mode_then = result.timeline.filter(pl.col("time_s") == t)["mode"].item()
        assert mode_then == alert or names.index(mode_then) < names.index(alert), alert


def test_import_rules_bad_mapping_is_one_line_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "p"
    assert main(["import-rules", str(RULES), "--out", str(out), "--map", "NoSuch=survival"]) == 2
    err = capsys.readouterr().err.strip()
    assert "NoSuch" in err and "ErrorBudgetFastBurn" in err and "\n" not in err
    assert main(["import-rules", str(RULES), "--out", str(out), "--map", "Overloaded=panic"]) == 2
    assert "survival, performance" in capsys.readouterr().err
    # one alert mapped twice to different modes: the last once won without a word
    assert main(["import-rules", str(RULES), "--out", str(out), "--map", "Overloaded=survival",
                 "--map", "Overloaded=performance"]) == 2
    err = capsys.readouterr().err.strip()
    assert "already mapped to survival" in err and "\n" not in err
    assert not out.exists() or not any(out.iterdir())


def test_alert_timeline_spans_pending_then_firing_up_to_resolution_or_the_end():
    from relakit import plots

    alerts = pl.DataFrame({"alert": ["A", "B", "C"], "labels": ["{}", '{x="1"}', "{}"],
                           "pending_at": [10.0, 20.0, 30.0], "firing_at": [40.0, None, 50.0],
                           "resolved_at": [70.0, 25.0, None]})
    spans = plots.alert_episodes(alerts, 100.0)
    got = {(r["alert"], r["state"]): (r["start_s"], r["end_s"])
           for r in spans.iter_rows(named=True)}
    assert got == {("A {}", "pending"): (10.0, 40.0), ("A {}", "firing"): (40.0, 70.0),
                   ('B {x="1"}', "pending"): (20.0, 25.0),
                   ("C {}", "pending"): (30.0, 50.0), ("C {}", "firing"): (50.0, 100.0)}
    spec = plots.alert_timeline(alerts, (0.0, 100.0)).to_dict()
    assert spec["encoding"]["color"]["scale"]["domain"] == ["pending", "firing"]
    assert "(s)" in spec["encoding"]["x"]["title"]


def test_closed_loop_hands_a_promql_signal_its_whole_range(tmp_path):
    """A 5 min rate in closed loop sees 5 min of samples (not just the clocks' window):
    its values equal the same policy replayed over the run's recorded metrics."""
    import yaml

    from relakit.experiment import simulate
    from relakit.openloop import replay

    sc = yaml.safe_load((ROOT / "params" / "scenarios" / "rela-ramp.yaml").read_text())
    sc.update(duration_s=420, name="promql-reach")
    sc["fleet"]["nodes"] = 2
    sc["workload"]["arrival"] = {"kind": "trace", "points": [[0, 300], [420, 1200]]}
    sc["clocks"] = {"scrape_s": 15, "window_s": 60, "eval_s": 10, "poll_s": 10}
    sc["policy"] = {"signals": {"rps5m": {"promql": 'sum(rate(requests_total{instance!="client"}'
                                                    '[5m]))'}},
                    "conditions": {"busy": {"signal": "rps5m", "threshold": 1e9}},
                    "modes": [{"name": "survival", "when": {"any": ["busy"]}}]}
    run = simulate(sc, record_requests=False)
    closed = run.timeline
    replayed = replay(run.metrics, sc["policy"], sc["clocks"],
                      times=closed["time_s"].to_numpy()).timeline
    x, y = closed["rps5m"].to_numpy(), replayed["rps5m"].to_numpy()
    late = closed["time_s"].to_numpy() > 330  # a full 5 min (and a scrape) into the run
    assert late.sum() >= 8 and np.isfinite(x[late]).all()
    assert np.allclose(x, y, rtol=1e-9, equal_nan=True)


def test_replay_rules_warns_about_labels_no_series_has(tmp_path, capsys):
    """Issue 32: `x{job="api"} == 0` over series without a job label never fires;
    say so, naming the rule and the label, instead of a silent never-fire."""
    spec = tmp_path / "labels.yml"
    spec.write_text(
        "groups:\n  - name: g\n    rules:\n"
        "      - alert: ApiDown\n        expr: 'requests_total{job=\"api\"} == 0'\n"
        "      - alert: Platinum\n        expr: 'requests_total{tier=\"platinum\"} > 0'\n"
        "      - alert: ByJob\n        expr: 'sum by (job) (rate(requests_total[1m])) > 0'\n"
        "      - alert: Fine\n        expr: 'label_replace(requests_total, \"job\", \"x\", \"\","
        " \"\") > 1e12'\n        labels: {team: core}\n"
        "      - alert: Without\n        expr: 'sum without (nod) (rate(requests_total[1m])) > 0'\n"
        "      - alert: Ignoring\n        expr: 'rate(requests_total[1m]) / ignoring (outcom) "
        "rate(requests_total[1m]) > 2'\n"
        "      - alert: FineToo\n        expr: 'sum without (instance) (requests_total) > 0'\n")
    assert main(["replay", str(TRACE), "--rules", str(spec), "--out", str(tmp_path / "o")]) == 0
    texts = capsys.readouterr().err.splitlines()
    mine = [t for t in texts if t.startswith(f"relakit: warning: {spec}: key 'groups[0].rules[")]
    assert any("alert 'ApiDown'" in t and "label 'job'" in t and "selects nothing" in t
               for t in mine), texts
    assert any("alert 'Platinum'" in t and 'tier="platinum"' in t and "gold" in t
               for t in mine), texts
    assert any("alert 'ByJob'" in t and "label 'job'" in t for t in mine), texts
    assert any("alert 'Without'" in t and "label 'nod'" in t and "leaves out nothing" in t
               for t in mine), texts
    assert any("alert 'Ignoring'" in t and "label 'outcom'" in t for t in mine), texts
    assert not any("'Fine'" in t or "'FineToo'" in t for t in mine), texts
    # relakit check RULES TRACE says the same, without running anything (exit 1: warnings)
    assert main(["check", str(spec), str(TRACE)]) == 1
    checked = [t for t in capsys.readouterr().err.splitlines() if "groups[0].rules[" in t]
    assert sorted(checked) == sorted(mine), checked
    from relakit.control import promql, rules
    from relakit.control.tsdb import TSDB
    from relakit.traces import read_trace

    store = promql.store_from_tsdb(TSDB.from_long(read_trace(TRACE)))
    assert rules.label_warnings(rules.load_rules(RULES), store) == []  # the shipped file


def test_a_recordings_labels_are_data(tmp_path, capsys):
    """Issue 32's minimal case: `up{job="api"} == 0` over a Prometheus export holding
    job="api" and job="db" series fires (the job label is kept, dictionary-encoded),
    and series differing only in such labels are no longer added up."""
    import json

    from relakit.traces import LABELS, read_trace

    def series(job, vals):
        return {"metric": {"__name__": "up", "job": job, "instance": "h:9100"},
                "values": [[15 * k, str(v)] for k, v in enumerate(vals)]}

    doc = {"status": "success", "data": {"resultType": "matrix", "result": [
        series("api", [1] * 10 + [0] * 10 + [1] * 10), series("db", [1] * 30)]}}
    trace = tmp_path / "export.json"
    trace.write_text(json.dumps(doc))
    frame = read_trace(trace)
    assert frame.schema[LABELS] == pl.Categorical
    assert sorted(frame[LABELS].unique().to_list()) == ['job="api"', 'job="db"']
    assert frame.filter(pl.col("time_s") == 0)["value"].to_list() == [1.0, 1.0]  # not summed
    spec = tmp_path / "up.yml"
    spec.write_text("groups:\n  - name: g\n    interval: 15s\n    rules:\n"
                    "      - alert: ApiDown\n        expr: 'up{job=\"api\"} == 0'\n"
                    "        for: 30s\n"
                    "      - alert: AnyDown\n        expr: 'sum by (job) (up) < 1'\n")
    out = tmp_path / "o"
    assert main(["replay", str(trace), "--rules", str(spec), "--out", str(out)]) == 0
    assert "warning" not in capsys.readouterr().err  # job exists: nothing to warn about
    alerts = pl.read_parquet(out / "alerts.parquet")
    down = alerts.filter(pl.col("alert") == "ApiDown").to_dicts()
    assert [(d["labels"], d["pending_at"], d["firing_at"], d["resolved_at"]) for d in down] == [
        ('{instance="0", job="api"}', 150.0, 180.0, 300.0)]
    anyd = alerts.filter(pl.col("alert") == "AnyDown")["labels"].to_list()
    assert anyd == ['{job="api"}']
    # the labels survive a Parquet round trip (validate_trace keeps the column)
    frame.write_parquet(tmp_path / "t.parquet")
    again = read_trace(tmp_path / "t.parquet")
    assert again[LABELS].cast(pl.String).to_list() == frame[LABELS].cast(pl.String).to_list()
