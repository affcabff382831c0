"""Edge cases of PromQL against promtool (Prometheus 2.42): the sign of zero through
aggregations, window and math functions, infinite means, atan2's metric name, and
``histogram_quantile`` over duplicate ``le`` bounds, non-monotone buckets, a missing +Inf
bucket and NaN or infinite counts.

promtool compares expected and got samples with Go's ``==`` (-0 == +0), so a zero's
sign is checked through ``1 / x`` (-Inf or +Inf); a NaN cannot be expected (NaN !=
NaN), so each expression E is checked as ``E == E`` (every number, bit for bit),
``1 / (E == E)`` (the sign of every zero) and ``E != bool E`` (where E is NaN).
Every comparison is exact: these inputs are small enough that the order promtool
loads series in does not reach the last bit.
"""

from __future__ import annotations

import math
import shutil
import subprocess
import warnings

import numpy as np
import pytest
import yaml
from test_promql import expand

from relakit.control import promql

needs_promtool = pytest.mark.skipif(shutil.which("promtool") is None,
                                    reason="promtool is installed by `make setup`")
SCRAPE_S, EVAL_S = 15, 30
TIMES = list(range(0, 300, EVAL_S))


def store(spec) -> list[promql.Series]:
    out = []
    for text, values in spec:
        sel = promql.parse(text)
        labels = tuple(sorted((k, v) for k, _, v in sel.matchers))
        vals = expand(values)
        t = np.array([k * SCRAPE_S for k, v in enumerate(vals) if v is not None], dtype=float)
        out.append(promql.Series(labels, t, np.array([x for x in vals if x is not None],
                                                     dtype=float)))
    return out


def cases(spec, exprs) -> list[dict]:
    """promtool cases holding relakit's answers for each form of each expression."""
    t = np.array(TIMES, dtype=float)
    out = []
    for expr in exprs:
        for form in (f"({expr}) == ({expr})", f"1 / (({expr}) == ({expr}))",
                     f"({expr}) != bool ({expr})"):
            res = promql.Evaluator(store(spec), default_step_s=EVAL_S).evaluate(
                promql.parse(form), t)
            for i, te in enumerate(TIMES):
                got = [{"labels": promql.format_labels(lab), "value": float(val[i])}
                       for lab, val, ok in res.series if ok[i]]
                assert not any(math.isnan(s["value"]) for s in got), (form, te)
                out.append({"expr": form, "eval_time": f"{te}s", "exp_samples": got})
    return out


def run_promtool(tmp_path, spec, exprs) -> str:
    """promtool's complaints (empty when it agrees with relakit everywhere)."""
    (tmp_path / "rules.yml").write_text(yaml.safe_dump({"groups": [{"name": "none", "rules": [
        {"record": "unused", "expr": "vector_free_placeholder"}]}]}))
    (tmp_path / "test.yml").write_text(yaml.safe_dump({
        "rule_files": ["rules.yml"], "evaluation_interval": f"{EVAL_S}s",
        "tests": [{"interval": f"{SCRAPE_S}s",
                   "input_series": [{"series": s, "values": v} for s, v in spec],
                   "promql_expr_test": cases(spec, exprs)}]}, sort_keys=False))
    proc = subprocess.run(["promtool", "test", "rules", "test.yml"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    return "" if proc.returncode == 0 else proc.stdout + proc.stderr


ZEROS = [
    ('nz{a="1"}', " ".join(["-0"] * 21)),  # -0.0 throughout
    ('nz{a="2"}', " ".join(["-0"] * 21)),
    ('pz{a="1"}', " ".join(["0"] * 21)),
    ('mixed{a="1"}', "-0 0 -0 0 -0 -0 -0 0 0 0 " + " ".join(["-0"] * 11)),
    ('flat{a="1"}', "5+0x20"),
    ('neg{a="1"}', "-3+0x20"),
    # zeros of both signs among numbers, a NaN (at 270 s)
    ('g{a="1"}', "-3 -2 -1 -0 0 1 2 3 -0 -0 0 0 -0.5 0.5 -1.5 1.5 2.5 -2.5 NaN 7 8"),
    # infinities: 2.42's avg keeps an infinite mean (Inf - Inf would be NaN)
    ('big{a="1"}', " ".join(["Inf"] * 21)), ('big{a="2"}', " ".join(["Inf"] * 21)),
    ('big{a="3"}', "5+1x20"), ('big{a="4"}', " ".join(["-Inf"] * 21)),
    ('huge{a="1"}', " ".join(["1e308"] * 21)), ('huge{a="2"}', " ".join(["1e308"] * 21)),
]
ZERO_EXPRS = [
    "sum(nz)", 'sum(nz{a="1"})', "sum by (a) (nz)", "sum(-pz)", "sum(nz) + 0",
    "avg(nz)", 'avg(nz{a="1"})', "min(nz)", "max(nz)", 'min(nz{a="1"})',
    "sum(mixed)", "sum(-mixed)",
    "rate(nz[1m])", "increase(nz[1m])", "delta(nz[1m])", "rate(flat[1m])",
    "delta(neg[1m])", "irate(nz[1m])", "idelta(nz[1m])", "deriv(nz[1m])",
    "sum_over_time(nz[1m])", "avg_over_time(nz[1m])", "min_over_time(nz[1m])",
    "max_over_time(nz[1m])", "last_over_time(nz[1m])", "quantile_over_time(0.5, nz[1m])",
    "sum(rate(nz[1m]))", "-sum(rate(flat[1m]))", "sum(delta(neg[1m]))",
    'avg(big{a!="4"})', 'avg(big{a=~"1|3"})', "avg(big)", "avg(huge)",
    "avg_over_time(big[1m])", "avg_over_time(huge[1m])", "sum_over_time(big[1m])",
    # Go's math.Max/Min (0.0 over -0.0 and the reverse; an infinity over NaN), Go's sgn
    "clamp(nz, 0, 1)", "clamp(pz, -1, -0)", "clamp_max(g, 0)", "clamp_min(nz, 0)",
    "clamp_min(g, Inf)", "clamp_max(g, -Inf)", "sgn(nz)", "sgn(g)",
    # atan2 keeps the metric name (2.42's shouldDropMetricName), vector or scalar
    "nz atan2 pz", "pz atan2 nz", "nz atan2 1", "1 atan2 nz",
    # "-0" and "0" are two values; equal values in order before the quantile's weights
    'count_values("v", g)', "quantile_over_time(0.5, g[2m])", "quantile(0.5, g)",
    "stddev(nz)", "quantile(0.5, nz)", 'topk(1, nz{a="1"})',  # (ties: promtool's order)
]


@needs_promtool
def test_sign_of_zero_and_infinite_means_equal_promtool(tmp_path):
    assert run_promtool(tmp_path, ZEROS, ZERO_EXPRS) == ""


# one histogram per case: h{case="..."} buckets, promtool notation, cumulative counts
HISTOGRAMS = {
    # "1" and "1.0" are one bound: Prometheus adds their counts
    "dup": [("0.5", "0+1x20"), ("1", "0+2x20"), ("1.0", "0+3x20"), ("+Inf", "0+8x20")],
    # the same bound spelt four ways, and "+Inf" twice
    "spelt": [("0.5", "0+1x20"), ("1", "0+1x20"), ("1e0", "0+1x20"), ("1.00", "0+2x20"),
              ("+Inf", "0+5x20"), ("Inf", "0+1x20")],
    # counts that fall along le (counters scraped at different moments)
    "nonmono": [("0.1", "0+10x20"), ("0.5", "0+5x20"), ("1", "0+20x20"), ("+Inf", "0+20x20")],
    # no +Inf bucket: NaN
    "noinf": [("0.1", "0+1x20"), ("0.5", "0+2x20"), ("1", "0+3x20")],
    # a NaN count
    "nan": [("0.1", "0+1x20"), ("0.5", "NaN 1 2 NaN NaN 5 6 7 NaN 9 10x10"),
            ("1", "0+3x20"), ("+Inf", "0+4x20")],
    "naninf": [("0.1", "0+1x20"), ("0.5", "0+2x20"), ("+Inf", "NaN 1 2 NaN NaN 5+1x15")],
    # an infinite count
    "inf": [("0.1", "0+1x20"), ("0.5", "Inf 1 Inf 3 4x17"), ("1", "0+3x20"),
            ("+Inf", "0+4x20")],
    # a negative bound, and a first bucket at or below zero
    "negative": [("-1", "0+1x20"), ("0", "0+2x20"), ("1", "0+3x20"), ("+Inf", "0+4x20")],
    # a bound of -0 (its sign returned; with a "0" too, Prometheus' own answer follows the
    # order it loaded the series in); -Inf as a bound; counts all 0, below 0, infinite
    "negzero": [("-0", "0+1x20"), ("1", "0+3x20"), ("+Inf", "0+4x20")],
    "neginf": [("-Inf", "0+1x20"), ("1", "0+3x20"), ("+Inf", "0+4x20")],
    "zeros": [("0.5", "0+0x20"), ("1", "0+0x20"), ("+Inf", "0+0x20")],
    "fall": [("0.5", "0-1x20"), ("1", "0-2x20"), ("+Inf", "0-3x20")],
    "infc": [("0.5", "1 Inf Inf " + " ".join(["2"] * 18)), ("1", "0+3x20"),
             ("+Inf", "1 Inf Inf " + " ".join(["5"] * 18))],
    # only +Inf, and +Inf with one finite bound
    "onlyinf": [("+Inf", "0+4x20")],
    "two": [("2", "0+1x20"), ("+Inf", "0+4x20")],
    # an le that is not a number is ignored, and so is one Go's ParseFloat refuses
    # (" 2": Python's float reads 2); Go reads "0x1p-1" as 0.5 (Python's float
    # refuses it) and "1_0" as 10
    "badle": [("0.5", "0+1x20"), ("fast", "0+2x20"), ("1", "0+3x20"), ("+Inf", "0+4x20")],
    "spelling": [("0x1p-1", "0+1x20"), ("1_0", "0+2x20"), (" 2", "0+3x20"), ("3", "0+4x20"),
                 ("+inf", "0+6x20")],
}
HIST_SPEC = [(f'h_bucket{{case="{c}",le="{le}"}}', v)
             for c, buckets in HISTOGRAMS.items() for le, v in buckets]
HIST_SPEC += [  # one bound from two jobs: coalesced once the job is summed away
    (f'j_bucket{{job="{j}",le="{le}"}}', v) for j, les in (("a", ("1", "+Inf")),
                                                            ("b", ("1.0", "+Inf")))
    for le, v in zip(les, ("0+1x20", "0+3x20"), strict=True)]
HIST_EXPRS = [
    "histogram_quantile(0.5, h_bucket)", "histogram_quantile(0.9, h_bucket)",
    "histogram_quantile(0, h_bucket)", "histogram_quantile(1, h_bucket)",
    "histogram_quantile(0.1, h_bucket)", "histogram_quantile(-1, h_bucket)",
    "histogram_quantile(2, h_bucket)",
    "histogram_quantile(0.5, rate(h_bucket[1m]))",
    "histogram_quantile(0.75, sum by (case, le) (rate(h_bucket[1m])))",
    "histogram_quantile(0.5, j_bucket)",
    "histogram_quantile(0.5, sum without (job) (j_bucket))",
    "histogram_quantile(0.5, sum by (le) (rate(j_bucket[1m])))",
]


@needs_promtool
def test_histogram_quantile_edges_equal_promtool(tmp_path):
    assert run_promtool(tmp_path, HIST_SPEC, HIST_EXPRS) == ""


@needs_promtool
def test_histogram_of_two_names_is_two_groups_that_clash(tmp_path):
    """Prometheus groups buckets by every label but ``le``, the name included, and drops
    the name afterwards: two histograms of one label set fail the evaluation (relakit
    once added their buckets together)."""
    spec = [(f'{name}{{le="{le}"}}', v) for name in ("a_bucket", "b_bucket")
            for le, v in (("1", "0+1x20"), ("+Inf", "0+2x20"))]
    expr = 'histogram_quantile(0.5, {__name__=~"a_bucket|b_bucket"})'
    with pytest.raises(promql.PromQLError, match="vector cannot contain metrics with the "
                       "same labelset"):
        promql.Evaluator(store(spec)).evaluate(promql.parse(expr), np.array([60.0]))
    one = promql.Evaluator(store(spec)).evaluate(
        promql.parse('histogram_quantile(0.5, {__name__="a_bucket"})'), np.array([60.0]))
    assert [(lab, val[0]) for lab, val, _ in one.series] == [((), 1.0)]
    spec_exprs = [expr]
    (tmp_path / "rules.yml").write_text(yaml.safe_dump({"groups": [{"name": "none", "rules": [
        {"record": "unused", "expr": "vector_free_placeholder"}]}]}))
    (tmp_path / "test.yml").write_text(yaml.safe_dump({
        "rule_files": ["rules.yml"], "evaluation_interval": f"{EVAL_S}s",
        "tests": [{"interval": f"{SCRAPE_S}s",
                   "input_series": [{"series": s, "values": v} for s, v in spec],
                   "promql_expr_test": [{"expr": e, "eval_time": "60s", "exp_samples": []}
                                        for e in spec_exprs]}]}, sort_keys=False))
    proc = subprocess.run(["promtool", "test", "rules", "test.yml"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "vector cannot contain metrics with the same labelset" in (
        proc.stdout + proc.stderr), proc.stdout + proc.stderr


# infinite counts through the extrapolated rate (rate, increase, delta): Inf - Inf is NaN,
# as in Go, and numpy once said so on stderr ("invalid value encountered in subtract")
INF_COUNTS = [
    ('c{a="1"}', "1 Inf Inf 5 6 7 Inf 9 10+1x12"),  # +Inf, then a reset below it
    ('c{a="2"}', "0+1x20"),
    ('c{a="3"}', "-Inf 1 2 Inf -Inf 3+1x15"),
    ('c{a="4"}', " ".join(["Inf"] * 21)),  # Inf - Inf in every window
]
INF_EXPRS = ["rate(c[1m])", "increase(c[1m])", "delta(c[1m])", "irate(c[1m])",
             "idelta(c[1m])", "sum(rate(c[1m]))", "rate(c[2m])"]


@needs_promtool
def test_infinite_counts_through_rates_equal_promtool_without_a_warning(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a RuntimeWarning from numpy fails the test
        assert run_promtool(tmp_path, INF_COUNTS, INF_EXPRS) == ""


def test_infinite_counts_through_rates_raise_no_warning():
    """The same without promtool: every number a rate of infinite counts gives is
    Prometheus' (NaN where Inf - Inf), and numpy says nothing."""
    t = np.array(TIMES, dtype=float)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res = promql.Evaluator(store(INF_COUNTS), default_step_s=EVAL_S).evaluate(
            promql.parse("increase(c[1m])"), t)
    by = {dict(lab)["a"]: val for lab, val, _ in res.series}
    assert np.isnan(by["4"]).all()  # Inf - Inf: NaN, as Go's float arithmetic gives
    assert np.isinf(by["1"][2])  # the window 0-60 s: 1 Inf Inf 5 -> reset adds Inf
