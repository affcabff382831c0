"""PromQL and rules: relakit against the real thing (``promtool test rules``).

The same input series are written in promtool's expanding notation and expanded
here into a relakit TSDB; relakit evaluates every expression and every rule, and its
answers are written as promtool's *expected* values and alerts. promtool (Prometheus
2.42's own engine and rule manager) must then pass, so relakit's values and firing
sets equal Prometheus' at every tested instant, including instants where nothing
fires. promtool 2.42 compares sample values exactly (``reflect.DeepEqual``); on a
mismatch its printed values are parsed and compared to 1e-9 relative for the report
(an infinity only to itself). Go's ``==`` holds -0 == +0, so an expression that answers
0 somewhere is asked again as ``1 / (E == E)`` (:func:`sign_form`): each zero's sign
becomes -Inf or +Inf, as tests/test_promql_edges.py does.
"""

from __future__ import annotations

import math
import re
import shutil
import subprocess

import numpy as np
import polars as pl
import pytest
import yaml

from relakit.control import promql, rules
from relakit.control.tsdb import TSDB
from relakit.validate import ScenarioError

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool is installed by "
                                    "`make setup`; without it parity cannot be checked")
SCRAPE_S = 15  # promtool's `interval`: the input series' sample spacing
EVAL_S = 30  # evaluation_interval, and every group's interval


def expand(values: str) -> list[float | None]:
    """promtool's expanding notation: ``a+bxn`` / ``a-bxn`` (n+1 values), ``axn``
    (n+1 copies), ``_`` and ``_xn`` (missing samples), plain numbers."""
    out: list[float | None] = []
    for item in values.split():
        m = re.fullmatch(r"(_|-?[\d.]+)(?:([+-][\d.]+))?x(\d+)", item)
        if item == "_":
            out.append(None)
        elif m and m.group(1) == "_":
            out += [None] * int(m.group(3))
        elif m:
            start, step = float(m.group(1)), float(m.group(2) or 0)
            v = start
            for _ in range(int(m.group(3)) + 1):  # promtool adds step by step
                out.append(v)
                v += step
        else:
            out.append(float(item))
    return out


# instance, name, tier, outcome, le, values (promtool notation)
SERIES = [
    ("0", "requests_total", "gold", "ok", None, "0+90x20 1800+100x40"),
    ("0", "requests_total", "gold", "error", None, "0+1x20 20+30x20 620+2x20"),
    ("0", "requests_total", "silver", "ok", None, "0+50x30 _x4 1700+50x25"),
    ("0", "requests_total", "silver", "error", None, "0+0x30 _x4 5+0x25"),
    ("1", "requests_total", "gold", "ok", None, "0+80x25 40+80x35"),  # a counter reset
    ("1", "requests_total", "gold", "error", None, "0+2x25 3+2x35"),
    ("1", "requests_total", "silver", "ok", None, "10+45x60"),
    ("1", "requests_total", "silver", "error", None, "0+9x60"),
    ("0", "in_flight", None, None, None, "3 5 8 13 21 13 8 5 3 2x20 7+1x30 40 _x5"),
    ("1", "in_flight", None, None, None, "4x30 -2+1x29"),
    # NaN samples are samples: they hide older ones, count, and compare false
    ("0", "temp_celsius", None, None, None,
     "10 12 NaN 14 NaN NaN 9 8x10 NaN 7x20 NaN NaN NaN 6x15"),
    ("1", "temp_celsius", None, None, None, "5+1x20 NaN 30x38"),
    # two series of one instance until 150 s, then one (the second stops): a match on
    # instance is many-to-many until the lookback lets the stopped one go
    ("0", "up_flag", "a", None, None, "1x60"),
    ("0", "up_flag", "b", None, None, "1x10"),
    ("1", "up_flag", "a", None, None, "1x60"),
]
BOUNDS = ("0.025", "0.05", "0.1", "0.25", "+Inf")
LAT = {"0": [("0+40x20 800+10x40"), ("0+70x20 1400+30x40"), ("0+85x20 1700+60x40"),
             ("0+90x20 1800+95x40"), ("0+91x20 1820+101x40")],
       "1": [("0+30x60"), ("0+60x60"), ("0+75x60"), ("0+79x60"), ("0+80x60")]}
for inst, per_le in LAT.items():
    for le, vals in zip(BOUNDS, per_le, strict=True):
        SERIES.append((inst, "latency_seconds_bucket", None, None, le, vals))
END_S = 60 * SCRAPE_S  # the longest series has 61 samples: 0 .. 900 s


def promtool_series(inst, name, tier, outcome, le) -> str:
    labels = {"__name__": name, "instance": inst, "tier": tier, "outcome": outcome, "le": le}
    return promql.format_labels({k: v for k, v in labels.items() if v is not None}.items())


def make_tsdb() -> TSDB:
    rows = []
    for inst, name, tier, outcome, le, values in SERIES:
        for k, v in enumerate(expand(values)):
            if v is not None:
                rows.append((float(k * SCRAPE_S), int(inst), name, tier, outcome, le, v))
    df = pl.DataFrame(rows, orient="row", schema={
        "time_s": pl.Float64, "node": pl.Int32, "name": pl.String, "tier": pl.String,
        "outcome": pl.String, "le": pl.String, "value": pl.Float64})
    return TSDB.from_long(df)


# every construct of the supported table, in at least one expression
EXPRESSIONS = [
    'requests_total{tier="gold",outcome="error"}',
    'requests_total{outcome!="ok",instance=~"0|1"}',
    'requests_total{tier!~"gold"} offset 1m',
    "rate(requests_total[1m])",
    'irate(requests_total{tier="gold"}[1m])',
    "increase(requests_total[2m])",
    "delta(in_flight[2m])",
    "avg_over_time(in_flight[1m])",
    "min_over_time(in_flight[2m])",
    "max_over_time(in_flight[90s])",
    "sum_over_time(in_flight[1m])",
    "count_over_time(in_flight[2m])",
    "last_over_time(in_flight[1m])",
    "histogram_quantile(0.9, sum by (le) (rate(latency_seconds_bucket[2m])))",
    "histogram_quantile(0.5, rate(latency_seconds_bucket[1m]))",
    "clamp_min(in_flight, 4)",
    "clamp_max(in_flight offset 30s, 6)",
    "abs(in_flight - 10)",
    "sum by (tier) (rate(requests_total[1m]))",
    "avg without (outcome, tier) (rate(requests_total[1m]))",
    "min(in_flight)",
    "max by (instance) (rate(requests_total[2m]))",
    "count without (instance) (requests_total)",
    'sum by (instance) (rate(requests_total{outcome="error"}[2m])) / '
    "sum by (instance) (rate(requests_total[2m]))",
    'rate(requests_total{outcome="error"}[1m]) / ignoring(outcome) '
    'rate(requests_total{outcome="ok"}[1m])',
    'sum by (instance, tier) (increase(requests_total{outcome="error"}[2m])) - on(instance, '
    "tier) sum by (instance, tier) (increase(requests_total{outcome=\"ok\"}[2m])) * 0.01",
    "in_flight > 5",
    "in_flight >= bool 8",
    "2 * in_flight + 1",
    "10 < in_flight",
    "-in_flight % 3",
    "in_flight ^ 2 / 4",
    "rate(requests_total[1m]) != bool 0",
    'in_flight == on(instance) in_flight offset 15s',
    "3 > bool 2",
    "histogram_quantile(0.99, sum by (le, instance) (rate(latency_seconds_bucket[2m]))) "
    "* 1000 > 200",
]
# every construct issue 32 added, in at least one expression (values never NaN at a
# tested instant: promtool compares them with reflect.DeepEqual, NaN != NaN; a NaN
# result is tested through `x != bool x`, which is 1 exactly where x is NaN)
LANGUAGE = [
    # set operators, anywhere an expression stands, with on/ignoring
    "in_flight > 3 and in_flight < 9",
    "in_flight > 20 or in_flight < 4",
    'rate(requests_total[1m]) unless on(instance, tier) rate(requests_total{outcome="error"}'
    "[1m]) > 0.5",
    "sum by (instance) ((in_flight > 5) or on(instance) (in_flight * 0))",
    "max(in_flight) and on() (min(in_flight) > 0)",
    "(in_flight and in_flight > 4) or vector(0)",
    'rate(requests_total{tier="gold"}[1m]) and ignoring(outcome) '
    'rate(requests_total{outcome="error"}[1m]) > 1',
    "in_flight > 5 and in_flight < 30 or in_flight > 35 unless in_flight == 37",
    'label_replace(in_flight and on(instance) in_flight > 5, "node", "n$1", "instance", '
    '"(.*)")',
    # group_left / group_right with extra labels
    'rate(requests_total{outcome="error"}[1m]) / on(instance, tier) group_left(job) '
    'label_replace(sum by (instance, tier) (rate(requests_total[1m])), "job", "api-$1", '
    '"tier", "(.*)")',
    "max by (instance) (in_flight) * on(instance) group_right rate(requests_total[1m])",
    "rate(requests_total[1m]) > ignoring(tier, outcome) group_left max by (instance) "
    "(in_flight)",
    "in_flight + on(instance) group_left(tier) max by (instance, tier) "
    "(requests_total{tier=\"gold\"})",
    # time, vector, scalar, timestamp
    "time() - 100",
    "timestamp(in_flight)",
    "timestamp(in_flight offset 1m)",
    "timestamp(rate(requests_total[1m]))",
    "vector(time() / 60)",
    "scalar(max(in_flight)) * 2",
    "scalar(in_flight) != bool scalar(in_flight)",
    "in_flight > bool scalar(min(in_flight))",
    # label_replace, label_join
    'label_replace(requests_total, "kind", "${1}-x", "outcome", "(err)or")',
    'label_replace(in_flight, "instance", "", "instance", "1")',
    'label_join(in_flight, "both", "-", "instance", "__name__")',
    'label_join(requests_total{tier="gold"}, "tier", "/", "outcome", "tier")',
    # absent, absent_over_time
    'absent(nonexistent_total{job="api", tier=~"g.*", instance="a", instance="b"})',
    'absent(in_flight{instance="0"} offset -5m)',
    "absent(sum(nonexistent))",
    'absent_over_time(in_flight{instance="0"}[1m])',
    "absent_over_time(nonexistent[1m])",
    # changes, resets, deriv, predict_linear, holt_winters, idelta
    "changes(in_flight[2m])",
    "resets(requests_total[5m])",
    "deriv(in_flight[2m])",
    "predict_linear(in_flight[2m], 60)",
    "predict_linear(requests_total[3m] offset 1m, 120)",
    "holt_winters(in_flight[2m], 0.5, 0.3)",
    "idelta(in_flight[1m])",
    # math
    "round(rate(requests_total[1m]))",
    "round(in_flight / 3, 0.5)",
    "ceil(in_flight / 4)",
    "floor(in_flight / 4)",
    "sqrt(abs(in_flight))",
    "exp(in_flight / 10)",
    "ln(in_flight > 0)",
    "log2(in_flight > 0)",
    "log10(in_flight > 0)",
    "clamp(in_flight, 2, 10)",
    "clamp(in_flight, 10, 2)",
    "sgn(in_flight - 8)",
    "in_flight atan2 on(instance) (in_flight offset 15s)",
    "sort_desc(in_flight)",
    "hour(vector(time() * 1000))",
    "day_of_week(in_flight * 86400 * 17)",
    "minute()",
    # aggregations
    "topk(1, in_flight)",
    "topk by (instance) (2, rate(requests_total[1m]))",
    "bottomk(1, in_flight)",
    "quantile(0.5, rate(requests_total[1m]))",
    "quantile by (tier) (0.9, rate(requests_total[1m]))",
    'count_values("value", in_flight)',
    'count_values by (instance) ("v", round(rate(requests_total[1m])))',
    "group by (tier) (requests_total)",
    "stddev(in_flight)",
    "stdvar by (tier) (rate(requests_total[1m]))",
    # range functions
    "quantile_over_time(0.9, in_flight[2m])",
    "quantile_over_time(0.25, requests_total[1m])",
    "stddev_over_time(in_flight[2m])",
    "stdvar_over_time(in_flight[1m])",
    "present_over_time(in_flight[1m])",
    # subqueries and @
    "max_over_time(rate(requests_total[1m])[5m:1m])",
    "avg_over_time(in_flight[2m:30s])",
    "min_over_time(in_flight[2m:])",
    "rate(requests_total[2m:15s] offset 1m)",
    "in_flight @ 300",
    "rate(requests_total[1m] @ 600)",
    "in_flight offset -1m",
    "max_over_time(in_flight[1m:15s] @ 450)",
    # keywords in any case, comments inside the expression
    "SUM BY (instance) (in_flight) AND ON(instance) in_flight > 5",
    "Sum(in_flight) # the fleet\n + 1",
    "count(in_flight) BY (instance) OR vector(1)",
    # NaN samples (temp_celsius has some): hidden older samples, counted, compared false
    "temp_celsius > 9",
    "count(temp_celsius)",
    "temp_celsius != bool temp_celsius",
    "count_over_time(temp_celsius[1m])",
    "max_over_time(temp_celsius[1m])",
    "last_over_time(temp_celsius[1m]) > 0",
    "sum(temp_celsius) != bool 0",
    "rate(temp_celsius[1m]) != bool rate(temp_celsius[1m])",
    "changes(temp_celsius[2m])",
    "topk(1, temp_celsius)",
    "quantile_over_time(0.5, temp_celsius[2m]) > 0",
    "avg_over_time(temp_celsius[1m]) != bool avg_over_time(temp_celsius[1m])",
    'count_values("t", temp_celsius)',
]
EVAL_TIMES = list(range(0, END_S + 4 * 60, EVAL_S))  # past the end: lookback, staleness

RULES = {"groups": [{"name": "slo", "interval": f"{EVAL_S}s", "rules": [
    {"record": "instance:error_ratio:rate1m",
     "expr": 'sum by (instance) (rate(requests_total{outcome="error"}[1m])) / '
             "sum by (instance) (rate(requests_total[1m]))"},
    {"record": "job:p90_seconds:rate2m",
     "expr": "histogram_quantile(0.9, sum by (le) (rate(latency_seconds_bucket[2m])))",
     "labels": {"source": "test"}},
    {"alert": "HighErrorRatio", "expr": "instance:error_ratio:rate1m > 0.05", "for": "1m",
     "labels": {"severity": "page"}},
    {"alert": "ErrorsNow", "expr": "instance:error_ratio:rate1m > 0.02"},
    {"alert": "SlowP90", "expr": "job:p90_seconds:rate2m > 0.1", "for": "30s"},
    {"alert": "Busy", "expr": "max_over_time(in_flight[1m]) > 6", "for": "90s",
     "labels": {"team": "core"}, "annotations": {"summary": "many requests in flight"}},
    {"alert": "ErrorsLong", "expr": "instance:error_ratio:rate1m > 0.02", "for": "4m"},
]}]}


def run_promtool(tmp_path, tests: list[dict], rule_data=None,
                 group_order=None) -> subprocess.CompletedProcess:
    rule_file = tmp_path / "rules.yml"
    rule_file.write_text(yaml.safe_dump(rule_data or {"groups": [{"name": "none", "rules": [
        {"record": "unused", "expr": "vector_free_placeholder"}]}]}))
    # in relakit's store order: Prometheus aggregates in its series' creation order, and
    # float addition is not associative, so the same order gives the same bits
    values = {promtool_series(*s[:5]): s[5] for s in SERIES}
    series = [{"series": promql.format_labels(s.labels), "values": values[
        promql.format_labels(s.labels)]} for s in promql.store_from_tsdb(make_tsdb())]
    test_file = tmp_path / "test.yml"
    test_file.write_text(yaml.safe_dump({
        "rule_files": [rule_file.name], "evaluation_interval": f"{EVAL_S}s",
        **({"group_eval_order": group_order} if group_order else {}),
        "tests": [{"interval": f"{SCRAPE_S}s", "input_series": series, **t} for t in tests]},
        sort_keys=False))
    return subprocess.run([PROMTOOL, "test", "rules", test_file.name], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)


def _samples(result, i: int) -> list[dict]:
    if isinstance(result, np.ndarray):
        raise AssertionError("scalar result")
    out = []
    for lab, val, ok in result.series:
        if ok[i]:
            out.append({"labels": promql.format_labels(lab), "value": float(val[i])})
    return out


_SAMPLE = re.compile(r'((?:[a-zA-Z_:][\w:]*)?\{[^}]*\}) ([-+]?\d(?:\.\d+)?E[-+]\d+|NaN|'
                     r'[-+]?Inf)')


def check_promtool(proc) -> int:
    """promtool passed, or failed only on values within 1e-9 relative; the number of
    (expression, instant) cases that differed in the last bits.

    promtool 2.42 compares values exactly, and its own last bit varies from run to run:
    it loads the input series in Go map order, and an aggregation adds them in that
    order. Labels and presence must match exactly, values to 1e-9 relative."""
    out = proc.stdout + proc.stderr
    if proc.returncode == 0:
        return 0
    blocks = re.findall(r"\n\s+exp: (.*)\n\s+got: (.*)", out)
    assert blocks, out[:3000]
    # every failure is an exp/got pair: no other kind of error
    assert out.count("expr:") == len(blocks), out[:3000]
    for exp_line, got_line in blocks:
        exp, got = _SAMPLE.findall(exp_line), _SAMPLE.findall(got_line)
        assert [lab for lab, _ in exp] == [lab for lab, _ in got], (exp_line, got_line)
        for (_, e), (_, g) in zip(exp, got, strict=True):
            e, g = float(e), float(g)  # an infinity (a zero's sign, in 1 / x) only equal
            assert e == g or (math.isfinite(g) and abs(e - g) <= 1e-9 * max(abs(g), 1e-300)
                              ), (exp_line, got_line)
    return len(blocks)


def sign_form(expr: str, scalar: bool) -> str:
    """``expr`` with every zero shown as its sign: ``1 / (E == E)`` (-Inf or +Inf; promtool
    compares values with Go's ``==``, where -0 == +0), ``1 / (E)`` for a scalar."""
    return f"1 / ({expr})" if scalar else f"1 / (({expr}) == ({expr}))"


def expr_cases(exprs: list[str], times=EVAL_TIMES) -> tuple[list[dict], int]:
    """promtool cases holding relakit's answers for each expression at each instant; an
    expression that answers 0 anywhere is also asked as :func:`sign_form`."""
    tsdb = make_tsdb()
    t = np.array(times, dtype=float)
    cases, n_samples = [], 0
    queue = list(exprs)
    signed = set()
    while queue:
        expr = queue.pop(0)
        # a step-less subquery steps at the evaluation_interval, as promtool's
        ev = promql.Evaluator(promql.store_from_tsdb(tsdb), default_step_s=EVAL_S)
        res = ev.evaluate(promql.parse(expr), t)
        scalar = isinstance(res, np.ndarray)
        if scalar:  # a scalar: promtool takes it as one unlabelled sample
            res = promql.Vector([((), res, np.ones(t.size, dtype=bool))])
        zero = False
        for i, te in enumerate(times):
            samples = _samples(res, i)
            assert all(not math.isnan(s["value"]) for s in samples), (expr, te)
            zero |= any(s["value"] == 0 for s in samples)
            n_samples += len(samples)
            cases.append({"expr": expr, "eval_time": f"{te}s", "exp_samples": samples})
        if zero and expr not in signed and expr in exprs:
            signed.add(expr)
            queue.append(sign_form(expr, scalar))
    return cases, n_samples


@needs_promtool
def test_expressions_equal_promtool(tmp_path):
    assert len(set(EXPRESSIONS)) >= 20
    cases, n_samples = expr_cases(EXPRESSIONS)
    # every expression returns something somewhere, and nothing somewhere else is checked too
    assert n_samples > 2000
    proc = run_promtool(tmp_path, [{"promql_expr_test": cases}])
    last_bits = check_promtool(proc)
    assert last_bits < len(cases) // 4  # most cases agree to the last bit
    print(f"{len(EXPRESSIONS)} expressions x {len(EVAL_TIMES)} instants = {len(cases)} cases, "
          f"{n_samples} samples; {last_bits} cases differ below 1e-9 relative")


@needs_promtool
def test_language_equals_promtool(tmp_path):
    """Every construct of issue 32 (set operators, group_left/right, the functions and
    aggregations, subqueries, @, any-case keywords, NaN samples) against promtool."""
    cases, n_samples = expr_cases(LANGUAGE)
    answered = {c["expr"] for c in cases if c["exp_samples"]}
    silent = sorted(set(LANGUAGE) - answered)
    # each returns something at some instant, except what must be empty everywhere
    assert silent == ["clamp(in_flight, 10, 2)"], silent  # max < min: nothing
    proc = run_promtool(tmp_path, [{"promql_expr_test": cases}])
    last_bits = check_promtool(proc)
    assert last_bits < len(cases) // 10
    print(f"{len(LANGUAGE)} expressions x {len(EVAL_TIMES)} instants = {len(cases)} cases, "
          f"{n_samples} samples; {last_bits} cases differ below 1e-9 relative")


@needs_promtool
def test_alerts_equal_promtool(tmp_path):
    tsdb = make_tsdb()
    alerts, ev = rules.evaluate_rules(tsdb, rules.load_rules(RULES), 0, EVAL_TIMES[-1])
    # the rules do something: each alert fires at some instant, and each resolves
    fired = alerts.filter(pl.col("firing_at").is_not_null())
    assert set(fired["alert"]) >= {"HighErrorRatio", "ErrorsNow", "SlowP90", "Busy"}
    assert alerts.filter(pl.col("firing_at").is_null()).height > 0  # pending, never fired
    cases, quiet = [], 0
    for name in ("HighErrorRatio", "ErrorsNow", "SlowP90", "Busy", "ErrorsLong"):
        for te in EVAL_TIMES:
            now = rules.firing_at(alerts.filter(pl.col("alert") == name), te)
            quiet += now.height == 0
            exp = [{"exp_labels": _label_map(lab)} for lab in now["labels"]]
            if name == "Busy":
                for e in exp:
                    e["exp_annotations"] = {"summary": "many requests in flight"}
            cases.append({"eval_time": f"{te}s", "alertname": name, "exp_alerts": exp})
    assert quiet > 20 and len(cases) - quiet > 20
    # the recorded series, as later rules read them, equal Prometheus' too
    t = np.array(EVAL_TIMES, dtype=float)
    exprs = ["instance:error_ratio:rate1m", "job:p90_seconds:rate2m",
             "max_over_time(instance:error_ratio:rate1m[2m])"]
    expr_cases = []
    for expr in exprs:
        res = ev.evaluate(promql.parse(expr), t)
        for i, te in enumerate(EVAL_TIMES):
            expr_cases.append({"expr": expr, "eval_time": f"{te}s",
                               "exp_samples": _samples(res, i)})
    proc = run_promtool(tmp_path, [{"alert_rule_test": cases}], RULES)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[:4000]  # firing sets: exact
    check_promtool(run_promtool(tmp_path, [{"promql_expr_test": expr_cases}], RULES))
    print(f"{len(cases)} alert cases ({quiet} with nothing firing), {len(expr_cases)} "
          "recorded-series cases")


# rule-manager behaviour issue 32 added: groups read in any order, NaN samples,
# keep_firing_for, an evaluation that fails at some instants only, comments
RULES_REACH = {"groups": [
    {"name": "reads-later", "interval": f"{EVAL_S}s", "rules": [
        {"alert": "NanHigh", "expr": "temp_celsius > 9"},
        {"alert": "NanCount", "expr": "count(temp_celsius) > 1", "for": "1m"},
        {"alert": "Kept", "expr": "in_flight > 20", "keep_firing_for": "2m"},
        {"alert": "KeptLong", "expr": "max(in_flight) > 12 unless max(in_flight) > 30",
         "for": "30s", "keep_firing_for": "5m"},
        {"alert": "ReadsLater", "expr": "fleet:in_flight:max > 10"},
        {"record": "fleet:in_flight:half",
         "expr": "fleet:in_flight:max # recorded by the next group\n / 2"},
        {"alert": "Chain", "expr": "fleet:in_flight:half > 5", "for": "1m"},
    ]},
    {"name": "records", "interval": f"{EVAL_S}s", "rules": [
        {"record": "fleet:in_flight:max", "expr": "max(in_flight)"},
        {"alert": "GroupLeft", "expr": 'rate(requests_total{outcome="error"}[1m]) / '
         "on(instance, tier) group_left sum by (instance, tier) (rate(requests_total[1m])) "
         "> 0.05 and on(instance) in_flight > 3"},
    ]},
]}


@needs_promtool
def test_rule_manager_equals_promtool(tmp_path):
    tsdb = make_tsdb()
    alerts, ev = rules.evaluate_rules(tsdb, rules.load_rules(RULES_REACH), 0, EVAL_TIMES[-1])
    names = [r["alert"] for g in RULES_REACH["groups"] for r in g["rules"] if "alert" in r]
    episodes = alerts.filter(pl.col("error").is_null())
    fired = set(episodes.filter(pl.col("firing_at").is_not_null())["alert"])
    assert fired == set(names), set(names) - fired  # every alert fires somewhere
    assert alerts.filter(pl.col("error").is_not_null()).height == 0
    # keep_firing_for holds Kept past the instants in_flight > 20 stops
    kept = episodes.filter(pl.col("alert") == "Kept").to_dicts()
    assert all(k["resolved_at"] is None or k["resolved_at"] - k["firing_at"] >= 120
               for k in kept), kept
    cases, quiet = [], 0
    for name in names:
        for te in EVAL_TIMES:
            now = rules.firing_at(alerts.filter(pl.col("alert") == name), te)
            quiet += now.height == 0
            exp = [{"exp_labels": _label_map(lab)} for lab in now["labels"]]
            cases.append({"eval_time": f"{te}s", "alertname": name, "exp_alerts": exp})
    assert quiet > 20 and len(cases) - quiet > 20
    t = np.array(EVAL_TIMES, dtype=float)
    expr_cases = []
    for expr in ["fleet:in_flight:max", "fleet:in_flight:half"]:
        res = ev.evaluate(promql.parse(expr), t)
        for i, te in enumerate(EVAL_TIMES):
            expr_cases.append({"expr": expr, "eval_time": f"{te}s",
                               "exp_samples": _samples(res, i)})
    # promtool evaluates groups in map order unless told: file order, as relakit
    order = [g["name"] for g in RULES_REACH["groups"]]
    proc = run_promtool(tmp_path, [{"alert_rule_test": cases}], RULES_REACH, order)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[:4000]  # firing sets: exact
    check_promtool(run_promtool(tmp_path, [{"promql_expr_test": expr_cases}], RULES_REACH,
                                order))
    print(f"{len(cases)} alert cases ({quiet} with nothing firing)")


DUP = "in_flight > on(instance) up_flag"


@needs_promtool
def test_many_to_many_fails_those_evaluations_only(tmp_path):
    """up_flag has two series of instance 0 until the second leaves the lookback (its
    last sample at 150 s): the match fails until then, and only then. promtool stops
    a rule test at a failed evaluation, so its answer is checked instant by instant."""
    spec = {"groups": [{"name": "g", "interval": f"{EVAL_S}s", "rules": [
        {"alert": "Dup", "expr": DUP},
        {"alert": "Other", "expr": "in_flight > 20"}]}]}
    alerts = rules.backtest_rules(make_tsdb(), rules.load_rules(spec), 0, EVAL_TIMES[-1])
    errors = alerts.filter(pl.col("error").is_not_null()).to_dicts()
    assert [(e["alert"], e["pending_at"], e["resolved_at"]) for e in errors] == [
        ("Dup", 0.0, 480.0)], errors
    assert "many-to-many matching not allowed" in errors[0]["error"]
    assert alerts.filter(pl.col("alert") == "Other").height > 0  # the file still runs
    dup = alerts.filter((pl.col("alert") == "Dup") & pl.col("error").is_null()).to_dicts()
    assert dup and dup[0]["pending_at"] == 480.0  # the first evaluation that succeeds
    t = np.array(EVAL_TIMES, dtype=float)
    with pytest.raises(promql.PromQLError, match="many-to-many.* \\(at 0 s\\)"):
        promql.evaluate(DUP, make_tsdb(), t)
    after = [te for te in EVAL_TIMES if te >= 480]
    cases, _ = expr_cases([DUP], after)
    assert check_promtool(run_promtool(tmp_path, [{"promql_expr_test": cases}])) == 0
    for te in (0, 450):  # and promtool fails there, with the same complaint
        proc = run_promtool(tmp_path, [{"promql_expr_test": [
            {"expr": DUP, "eval_time": f"{te}s", "exp_samples": []}]}])
        assert proc.returncode == 1 and "many-to-many matching not allowed" in (
            proc.stdout + proc.stderr)


def _label_map(text: str) -> dict:
    return dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', text))


def test_expand_notation():
    assert expand("0+10x3 _x2 300 1x2 5-1x2") == [0, 10, 20, 30, None, None, 300, 1, 1, 1,
                                                   5, 4, 3]


UNSUPPORTED = [
    # still refused: native histograms, Prometheus 3 syntax, strings as values
    ("histogram_count(rate(x[5m]))", "unsupported function 'histogram_count'", 1),
    ("sum(rate(x[5m])) / histogram_sum(y)", "unsupported function 'histogram_sum'", 20),
    ("limitk(3, in_flight)", "unsupported aggregation 'limitk'", 1),
    ('{"in_flight"}', "unsupported quoted metric or label name", 2),
    ('sum by ("tier") (x)', "unsupported quoted label name", 9),
    ('"text"', "unsupported string literal", 1),
    # a refusal inside parentheses or arguments names the construct, not a bracket
    ("sum(in_flight and limitk(1, x))", "unsupported aggregation 'limitk'", 19),
    ("(a or histogram_count(b))", "unsupported function 'histogram_count'", 7),
    ("rate(x[5m]) AND ON(instance) foo(y)", "unsupported function 'foo'", 30),
]


@pytest.mark.parametrize(("expr", "message", "column"), UNSUPPORTED)
def test_unsupported_constructs_are_named_with_their_position(expr, message, column):
    with pytest.raises(promql.PromQLError) as err:
        promql.parse(expr)
    assert message in str(err.value)
    assert str(err.value).endswith(f"at column {column}"), str(err.value)


@pytest.mark.parametrize(("expr", "message"), [
    ("rate(in_flight)", "rate() expects a range vector such as x[5m] as argument 1, got an "
     "instant vector"),
    ("sum(in_flight", "expected ')' closing sum("),
    ("(in_flight and", "expected an expression, found the end of the expression"),
    ("in_flight and 1", "set operator 'and' not allowed with a scalar operand"),
    ("a + group_left b", "'group_left' must follow on(...) or ignoring(...)"),
    ("a and on(x) group_left b", "no grouping (group_left) allowed for 'and'"),
    ("topk(in_flight)", "topk takes a parameter and an expression"),
    ("(a + b)[5m]", "use a subquery [range:step]"),
    ("sum(a) offset 5m", "'offset' must follow a selector"),
    ('label_replace(a, "1x", "", "b", "")', "invalid destination label name '1x'"),
    ('label_replace(a, "x", "", "b", "(")', "invalid regular expression '('"),
    ("in_flight @ foo", "expected a time (seconds), start() or end() after '@'"),
    ("time(1)", "time() expects 0 argument(s), got 1"),
    ("round(a, 1, 2)", "round() expects 1 to 2 argument(s), got 3"),
    ("sum(in_flight", "expected ')'"),
    ('in_flight{tier=}', "expected string"),
    ("1 > 2", "must use the 'bool' modifier"),
    ("in_flight[5m] + 1", "range vector cannot be an operand"),
    ('{tier=""}', "at least one matcher"),
    ("clamp_min(in_flight)", "expects 2 argument"),
])
def test_syntax_errors_say_what(expr, message):
    with pytest.raises(promql.PromQLError, match=re.escape(message)):
        promql.parse(expr)


def test_rule_file_errors_name_file_and_key(tmp_path):
    bad = {"groups": [{"name": "g", "rules": [
        {"record": "a:b", "expr": "sum(in_flight)"},
        {"alert": "X", "expr": "in_flight > 1"},
        {"alert": "Y", "expr": "histogram_count(in_flight[5m]) > 1"}]}]}
    path = tmp_path / "RULES.yml"
    path.write_text(yaml.safe_dump(bad))
    with pytest.raises(ScenarioError) as err:
        rules.load_rules(path)
    assert str(err.value) == (f"{path}: key 'groups[0].rules[2].expr': unsupported function "
                              "'histogram_count' at column 1")
    for mutate, key, text in [
        (lambda d: d["groups"][0]["rules"][1].update({"for": "5 minutes"}),
         "groups[0].rules[1].for", "expected a duration"),
        (lambda d: d["groups"][0].update({"interval": 30}), "groups[0].interval",
         "expected a duration"),
        (lambda d: d["groups"][0]["rules"][0].update({"for": "1m"}), "groups[0].rules[0]",
         "unknown key(s) ['for']"),
        (lambda d: d["groups"][0]["rules"][1].update({"record": "z"}), "groups[0].rules[1]",
         "exactly one of"),
        (lambda d: d["groups"][0]["rules"][1].update({"labels": {"s": "{{ $value }}"}}),
         "groups[0].rules[1].labels.s", "label templates"),
        (lambda d: d["groups"][0]["rules"].insert(0, {"record": "c:d", "expr": "c:d + 1"}),
         "groups[0].rules[0].expr", "recorded by this rule"),
        (lambda d: d["groups"][0]["rules"].extend([{"record": "e", "expr": "f + 1"},
                                                    {"record": "f", "expr": "e * 2"}]),
         "groups[0].rules[2].expr", "read each other in a cycle (groups[0].rules[2], "
         "groups[0].rules[3])"),
        (lambda d: d["groups"][0]["rules"][1].update({"keep_firing_for": "soon"}),
         "groups[0].rules[1].keep_firing_for", "expected a duration"),
        (lambda d: d["groups"][0]["rules"][0].update({"expr": "in_flight[5m]"}),
         "groups[0].rules[0].expr", "not a range vector"),
    ]:
        data = yaml.safe_load(yaml.safe_dump(bad))
        data["groups"][0]["rules"].pop()
        mutate(data)
        path.write_text(yaml.safe_dump(data))
        with pytest.raises(ScenarioError) as err:
            rules.load_rules(path)
        assert f"key '{key}'" in str(err.value) and text in str(err.value), str(err.value)


def test_alert_state_machine_by_hand():
    """A gauge above 5 at 60..150 s, and again at 240 s: episodes as Prometheus' manager."""
    rows = [(float(k * 15), 0, "g", None, None, None, float(v)) for k, v in enumerate(
        [0, 0, 0, 0, 9, 9, 9, 9, 9, 9, 9, 0, 0, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0, 0])]
    df = pl.DataFrame(rows, orient="row", schema={
        "time_s": pl.Float64, "node": pl.Int32, "name": pl.String, "tier": pl.String,
        "outcome": pl.String, "le": pl.String, "value": pl.Float64})
    spec = {"groups": [{"name": "g", "interval": "15s", "rules": [
        {"alert": "High", "expr": "g > 5", "for": "1m"}]}]}
    alerts = rules.backtest_rules(df, rules.load_rules(spec))
    assert alerts.to_dicts() == [
        {"alert": "High", "labels": '{instance="0"}', "pending_at": 60.0, "firing_at": 120.0,
         "resolved_at": 165.0, "error": None},
        {"alert": "High", "labels": '{instance="0"}', "pending_at": 240.0, "firing_at": None,
         "resolved_at": 255.0, "error": None}]


def test_shipped_slo_rules_over_shipped_traces():
    """params/rules/slo.yml over the shipped traces: each alert where the trace says."""
    step = rules.backtest_rules("data/traces/step-errors.csv", "params/rules/slo.yml")
    slow = step.filter(pl.col("alert") == "ErrorBudgetSlowBurn").to_dicts()
    # errors step from 0.2 % to 12 % at 300 s: the 5-min ratio passes 6 % about 150 s
    # later (half the window), evaluated every 30 s; firing 2 min (for:) after that
    assert len(slow) == 1 and 420 <= slow[0]["pending_at"] <= 510
    assert slow[0]["firing_at"] == slow[0]["pending_at"] + 120
    assert slow[0]["labels"] == '{severity="ticket"}'
    # 12 % stays under the fast-burn threshold (14.4 %), latency under 250 ms
    assert set(step["alert"]) == {"ErrorBudgetSlowBurn", "Overloaded"}
    ramp = rules.backtest_rules("data/traces/ramp-latency.csv", "params/rules/slo.yml")
    lat = ramp.filter(pl.col("alert") == "LatencyP99High").to_dicts()
    # the median climbs 30 -> 400 ms from 200 s: p99 passes 250 ms after the ramp starts
    assert len(lat) == 1 and 200 < lat[0]["pending_at"] < 700
    assert lat[0]["firing_at"] == lat[0]["pending_at"] + 60
    assert not ramp.filter(pl.col("alert").str.starts_with("ErrorBudget")).height
    over = ramp.filter(pl.col("alert") == "Overloaded")
    assert sorted(over["labels"]) == [f'{{instance="{i}", severity="ticket"}}' for i in range(4)]


@pytest.mark.parametrize("expr, words", [
    ("(" * 60 + "up" + ")" * 60, "nested more than 48 levels"),
    ("abs(" * 60 + "up" + ")" * 60, "nested more than 48 levels"),
    (" + ".join(["up"] * 250), "250 operations deep"),
    (" and ".join(["up"] * 5000), "more than 400 operations"),
])
def test_deep_or_long_expressions_are_refused_by_name_not_recursion(expr, words):
    """A 200-deep expression once ended a backtest in RecursionError (exit 3)."""
    with pytest.raises(promql.PromQLError, match=words):
        promql.parse(expr)


def test_the_deepest_expression_allowed_evaluates():
    tsdb = make_tsdb()
    name = promql.store_from_tsdb(tsdb)[0].labels
    metric = dict(name)["__name__"]
    deep = " + ".join([f"sum({metric})"] * 150)  # 150 operations, 151 deep
    one = promql.evaluate(f"sum({metric})", tsdb, np.array([60.0])).series
    got = promql.evaluate(deep, tsdb, np.array([60.0])).series
    assert len(one) == len(got) == 1 and one[0][2][0] and got[0][2][0]  # present
    assert got[0][1][0] == pytest.approx(150 * one[0][1][0])
