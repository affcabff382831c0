"""import-rules on real rule files (issue 32, part 3): recorded series read with
matchers, ranges and offsets, comments, groups in any order, and ``for:`` per label
set, each checked against relakit's backtest (itself checked against promtool)."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from test_promql import EVAL_TIMES, EXPRESSIONS, LANGUAGE, make_tsdb

from relakit.control import promql, rules
from relakit.control.import_rules import import_rules
from relakit.control.tsdb import TSDB
from relakit.validate import ScenarioError

RULES = {"groups": [
    {"name": "alerts", "interval": "30s", "rules": [
        # reads a recording of the later group, with a matcher: its previous evaluation
        {"alert": "GoldErrors", "expr": 'tier:errors:rate1m{tier="gold"} > 1', "for": "1m",
         "labels": {"severity": "page"}},
        {"alert": "ErrorsRising", "expr": "deriv(tier:errors:rate1m[2m]) > 0.01"},
        {"alert": "NotSilver", "expr": 'tier:errors:rate1m{tier!~"sil.*"} > 1.5'},
    ]},
    {"name": "recordings", "interval": "30s", "rules": [
        {"record": "tier:errors:rate1m",
         "expr": "sum by (tier, instance) (rate(requests_total{outcome=\"error\"}[1m]))"
                 "  # per tier and node\n"},
        {"alert": "ErrorsUp", "expr": "tier:errors:rate1m > 1.5 * tier:errors:rate1m offset 1m"},
        {"record": "fleet:in_flight:max", "expr": "max(in_flight)", "labels": {"source": "rec"}},
        {"alert": "Busy", "expr": 'fleet:in_flight:max{source="rec"} > 10', "for": "1m"},
        {"alert": "NeverRec", "expr": 'fleet:in_flight:max{source="other"} > 0'},
        {"alert": "BusyEach", "expr": "in_flight > 6", "for": "90s"},
    ]},
]}


def strip(node):
    """The tree without positions (to compare a tree with its text parsed back)."""
    from dataclasses import fields, replace

    if not hasattr(node, "__dataclass_fields__"):
        return node
    ch = {"pos": 0} if "pos" in {f.name for f in fields(node)} else {}
    for f in fields(node):
        v = getattr(node, f.name)
        if f.name in ("expr", "lhs", "rhs", "param") and v is not None:
            ch[f.name] = strip(v)
        elif f.name == "args":
            ch[f.name] = tuple(strip(a) for a in v)
    return replace(node, **ch)


@pytest.mark.parametrize("expr", EXPRESSIONS + LANGUAGE)
def test_text_of_a_tree_parses_back_to_it(expr):
    node = promql.parse(expr)
    assert strip(promql.parse(promql.to_text(node))) == strip(node), promql.to_text(node)


def breaches(sig: dict, cond: dict, t) -> np.ndarray:
    v = promql.Evaluator(promql.store_from_tsdb(make_tsdb())).evaluate(
        promql.parse(sig["promql"]), t)
    if isinstance(v, promql.Vector):  # one series (or none): the signal's value
        out = np.full(t.size, np.nan)
        for _, val, ok in v.series:
            out = np.where(ok, val, out)
        v = out
    op = {">": np.greater, ">=": np.greater_equal, "<": np.less, "<=": np.less_equal}[
        cond.get("op", ">")]
    with np.errstate(invalid="ignore"):
        return op(v, cond["threshold"])


def test_imported_signals_breach_exactly_when_the_alerts_fire():
    """Each mapped alert's signal is over its threshold at exactly the evaluations at
    which the backtest (Prometheus' rule manager) has *a* label set of it firing."""
    names = [r["alert"] for g in RULES["groups"] for r in g["rules"] if "alert" in r]
    policy, clocks = import_rules(RULES, dict.fromkeys(names, "survival"))
    assert clocks["eval_s"] == 30.0
    assert all(m["enter_after"] == 1 for m in policy["modes"])
    t = np.array([x for x in EVAL_TIMES if x % 30 == 0], dtype=float)
    alerts = rules.backtest_rules(make_tsdb(), rules.load_rules(RULES), 0, t[-1])
    for name in names:
        mine = alerts.filter(pl.col("alert") == name)
        firing = np.array([rules.firing_at(mine, x).height > 0 for x in t])
        cond = policy["conditions"][name]
        got = breaches(policy["signals"][cond["signal"]], cond, t)
        assert np.array_equal(got, firing), (name, policy["signals"][cond["signal"]],
                                             t[got != firing])
        if name != "NeverRec":
            assert firing.any(), name  # not vacuous
    # the comment inside the recording did not eat the rest of the expression
    assert "#" not in str(policy["signals"])


def test_two_label_sets_taking_turns_never_enter_a_for_mode():
    """Two nodes above 5 in turn, 30 s each: Prometheus never fires a `for: 1m` alert
    (each label set starts over); counting evaluations of *some* breach would."""
    rows = []
    for k in range(40):
        for node in (0, 1):
            hot = (k // 2) % 2 == node and 8 <= k < 32
            rows.append((k * 15.0, node, "g", None, None, None, 9.0 if hot else 1.0))
    df = pl.DataFrame(rows, orient="row", schema={
        "time_s": pl.Float64, "node": pl.Int32, "name": pl.String, "tier": pl.String,
        "outcome": pl.String, "le": pl.String, "value": pl.Float64})
    spec = {"groups": [{"name": "g", "interval": "30s", "rules": [
        {"alert": "Hot", "expr": "g > 5", "for": "1m"}]}]}
    alerts = rules.backtest_rules(df, rules.load_rules(spec))
    assert alerts.height > 0 and alerts["firing_at"].is_null().all()
    policy, _ = import_rules(spec, {"Hot": "survival"})
    sig = next(iter(policy["signals"].values()))
    t = np.arange(0, 585, 30.0)
    v = promql.Evaluator(promql.store_from_tsdb(TSDB.from_long(df))).evaluate(
        promql.parse(sig["promql"]), t)
    assert not any(ok.any() for _, _, ok in v.series)  # no label set held for 1 min


def test_import_refuses_what_it_cannot_honour_by_name():
    spec = {"groups": [{"name": "g", "interval": "30s", "rules": [
        {"record": "r", "expr": "sum(in_flight)"},
        {"alert": "A", "expr": "r offset 45s > 1"},
        {"alert": "B", "expr": "in_flight > 1", "keep_firing_for": "5m"}]}]}
    with pytest.raises(ScenarioError, match=r"key 'groups\[0\]\.rules\[1\]\.expr': .*offset "
                                            r"or @ off its group's 30 s evaluation grid"):
        import_rules(spec, {"A": "survival"})
    with pytest.raises(ScenarioError, match=r"key 'groups\[0\]\.rules\[2\]\.keep_firing_for'"):
        import_rules(spec, {"B": "survival"})
