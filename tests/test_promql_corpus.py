"""A corpus of real-looking rule files (tests/data/rules/) against promtool.

Each ``NAME.yml`` is shaped like a public rule collection (node-mixin, kube-prometheus,
sloth/pyrra SLOs, blackbox packs) and together they use every construct issue 32
added; ``NAME.series.yml`` holds promtool input series with the labels such files
read (job, namespace, pod, ...). relakit backtests each file over those series and
its answers become promtool's expected alerts at every instant, and expected samples
of every recorded series (and of ``1 / (x == x)`` for one that is 0 somewhere, so a
zero's sign shows as -Inf or +Inf): promtool must pass.
"""

from __future__ import annotations

import math
import shutil
import subprocess
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import yaml
from test_promql import _label_map, check_promtool, expand, sign_form

from relakit.control import promql, rules

DATA = Path(__file__).parent / "data" / "rules"
FILES = sorted(p for p in DATA.glob("*.yml") if not p.name.endswith(".series.yml"))
SCRAPE_S, EVAL_S = 15, 30
needs_promtool = pytest.mark.skipif(shutil.which("promtool") is None,
                                    reason="promtool is installed by `make setup`")


def series_store(path: Path) -> tuple[list[promql.Series], list[dict]]:
    """The promtool input series of a file, as a promql store and as promtool reads them."""
    spec = yaml.safe_load(path.read_text())
    store = []
    for item in spec:
        sel = promql.parse(item["series"])
        labels = tuple(sorted((k, v) for k, _, v in sel.matchers))
        vals = expand(item["values"])
        t = np.array([k * SCRAPE_S for k, v in enumerate(vals) if v is not None], dtype=float)
        v = np.array([x for x in vals if x is not None], dtype=float)
        store.append(promql.Series(labels, t, v))
    return store, spec


def test_corpus_uses_every_construct_of_issue_32():
    """The corpus is only a proof if it holds each construct: walk every tree."""
    seen = set()

    def walk(node):
        if isinstance(node, promql.Call):
            seen.add(node.func)
        elif isinstance(node, promql.Aggregate):
            seen.add(node.op)
        elif isinstance(node, promql.Binary):
            seen.add(node.op)
            seen.update({node.card} if node.card != "one-to-one" else set())
            seen.update({"on"} if node.on is not None else set())
            seen.update({"ignoring"} if node.ignoring else set())
        elif isinstance(node, promql.Subquery):
            seen.add("subquery")
        if getattr(node, "at", None) is not None:
            seen.add("@")
        if getattr(node, "offset_s", 0):
            seen.add("offset")
        for a in ("expr", "lhs", "rhs", "param"):
            if getattr(node, a, None) is not None:
                walk(getattr(node, a))
        for a in getattr(node, "args", ()):
            walk(a)

    texts = []
    for path in FILES:
        for g in rules.load_rules(path):
            for r in g.rules:
                walk(r.node)
                texts.append(r.expr)
    want = {"and", "or", "unless", "on", "ignoring", "many-to-one", "time", "vector",
            "scalar", "timestamp", "label_replace", "absent", "absent_over_time", "changes",
            "resets", "deriv", "predict_linear", "holt_winters", "round", "ceil", "floor",
            "sqrt", "exp", "ln", "log2", "log10", "clamp", "sgn", "topk", "bottomk",
            "quantile", "count_values", "group", "stddev", "stdvar", "quantile_over_time",
            "stddev_over_time", "present_over_time", "subquery", "@", "offset"}
    assert want <= seen, sorted(want - seen)
    assert any("#" in e for e in texts)  # a comment inside an expression
    assert any(" BY " in e or "ON(" in e for e in texts)  # upper-case keywords
    keep = [r for path in FILES for g in rules.load_rules(path) for r in g.rules
            if r.keep_firing_s > 0]
    assert keep


def zero_subexpressions(groups, ev, t) -> list[str]:
    """The instant-vector sub-expressions of every rule (functions, aggregations, operators;
    not the rule's whole expression) that answer 0 at some instant, as text."""
    found = []

    def walk(node):
        if (isinstance(node, promql.Call | promql.Aggregate | promql.Binary | promql.Unary)
                and not promql.is_range(node) and not promql.is_scalar(node)):
            found.append(promql.to_text(node))
        for a in ("expr", "lhs", "rhs", "param"):
            if getattr(node, a, None) is not None:
                walk(getattr(node, a))
        for a in getattr(node, "args", ()):
            walk(a)

    for g in groups:
        for r in g.rules:
            walk(r.node)
    whole = {promql.to_text(r.node) for g in groups for r in g.rules}
    out = []
    for expr in sorted(set(found) - whole):
        res = ev.evaluate(promql.parse(expr), t)
        if any(((val == 0) & ok).any() for _, val, ok in res.series):
            out.append(expr)
    return out


@needs_promtool
@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_corpus_file_equals_promtool(path, tmp_path):
    check = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True,
                           text=True)
    assert check.returncode == 0, check.stdout + check.stderr  # valid Prometheus
    store, spec = series_store(path.with_name(path.stem + ".series.yml"))
    groups = rules.load_rules(path)
    end = max(s.times[-1] for s in store) + 4 * 60
    times = list(range(0, int(end), EVAL_S))
    alerts, ev = rules.evaluate_rules(store, groups, 0, times[-1])
    assert alerts.filter(pl.col("error").is_not_null()).height == 0
    alert_rules = [r for g in groups for r in g.rules if r.kind == "alert"]
    fired = set(alerts.filter(pl.col("firing_at").is_not_null())["alert"])
    never = sorted({r.name for r in alert_rules} - fired)
    assert never == []  # the series make every alert fire somewhere
    cases, quiet = [], 0
    for r in alert_rules:
        for te in times:
            now = rules.firing_at(alerts.filter(pl.col("alert") == r.name), te)
            quiet += now.height == 0
            exp = [{"exp_labels": _label_map(lab),
                    **({"exp_annotations": dict(r.annotations)} if r.annotations else {})}
                   for lab in now["labels"]]
            cases.append({"eval_time": f"{te}s", "alertname": r.name, "exp_alerts": exp})
    expr_cases = []
    t = np.array(times, dtype=float)
    for name in sorted({r.name for g in groups for r in g.rules if r.kind == "record"}):
        # a NaN sample cannot be expected (promtool compares with DeepEqual): the
        # numbers, then where the NaNs are; and, for a series that is 0 somewhere, the
        # sign of each zero (1 / (x == x): -Inf or +Inf, where == sees -0 == +0)
        forms = [f"{name} == {name}", f"{name} != bool {name}"]
        while forms:
            expr = forms.pop(0)
            res = ev.evaluate(promql.parse(expr), t)
            zero = False
            for i, te in enumerate(times):
                got = [{"labels": promql.format_labels(lab), "value": float(val[i])}
                       for lab, val, ok in res.series if ok[i]]
                assert not any(math.isnan(s["value"]) for s in got)
                zero |= any(s["value"] == 0 for s in got)
                expr_cases.append({"expr": expr, "eval_time": f"{te}s", "exp_samples": got})
            if zero and expr == f"{name} == {name}":
                forms.append(sign_form(name, False))
    # the rules' own sub-expressions that answer 0 somewhere (a rate of a flat counter, a
    # difference, an aggregation of zeros), with each zero's sign: the recorded series
    # alone rarely hold a zero
    for expr in zero_subexpressions(groups, ev, t):
        res = ev.evaluate(promql.parse(sign_form(expr, False)), t)
        for i, te in enumerate(times):
            got = [{"labels": promql.format_labels(lab), "value": float(val[i])}
                   for lab, val, ok in res.series if ok[i]]
            expr_cases.append({"expr": sign_form(expr, False), "eval_time": f"{te}s",
                               "exp_samples": got})
    (tmp_path / path.name).write_text(path.read_text())
    order = [g.name for g in groups]
    test = {"rule_files": [path.name], "evaluation_interval": f"{EVAL_S}s",
            "group_eval_order": order,
            "tests": [{"interval": f"{SCRAPE_S}s", "input_series": spec,
                       "alert_rule_test": cases, "promql_expr_test": expr_cases}]}
    (tmp_path / "test.yml").write_text(yaml.safe_dump(test, sort_keys=False))
    proc = subprocess.run(["promtool", "test", "rules", "test.yml"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    alert_failures = (proc.stdout + proc.stderr).count("alertname:")
    assert alert_failures == 0, (proc.stdout + proc.stderr)[:4000]  # firing sets: exact
    check_promtool(proc)  # recorded values: to 1e-9
    signs = sum(c["expr"].startswith("1 / (") for c in expr_cases)
    print(f"{path.name}: {len(alert_rules)} alerts x {len(times)} instants ({quiet} quiet), "
          f"{signs} cases of zeros' signs, "
          f"{len(expr_cases)} recorded-series cases; never fire: {never}")


def test_acceptance_tool_counts_the_corpus(capsys):
    """tools/promql_acceptance.py (the issue's measure) over this corpus: all of it."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "promql_acceptance", Path(__file__).parents[1] / "tools" / "promql_acceptance.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    assert tool.main([str(DATA)]) == 0
    out = capsys.readouterr().out
    n = sum(1 for p in FILES for g in rules.load_rules(p) for r in g.rules)
    assert f"expressions: {n} of {n} distinct accepted (100.0 %)" in out, out
    assert f"rule files loaded whole: {len(FILES)} of {len(FILES)} (100.0 %)" in out, out
    assert tool.reason("unsupported function 'histogram_count' at column 3") == \
        "unsupported function 'histogram_count'"
