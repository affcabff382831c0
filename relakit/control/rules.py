"""Prometheus rule files, backtested over a TSDB as Prometheus would have evaluated them.

A rule file is ``groups: [{name, interval, rules: [{alert|record, expr, for, labels,
annotations}]}]``. :func:`load_rules` validates it (one-line errors naming file and
key, PromQL errors with their position); :func:`backtest_rules` evaluates every group
at its evaluation instants (multiples of ``interval``, as ``promtool test rules``
does: real Prometheus shifts each group by a hash-derived phase), open loop:

* a recording rule's result is written back as series named ``record`` (sample
  labels, the rule's labels on top), with staleness markers where a series vanishes,
  so later rules read it as Prometheus' would;
* an alerting rule follows Prometheus' state machine: a label set returned by the
  expression becomes *pending* at the first instant it appears, *firing* at the first
  evaluation instant at least ``for`` after that, and is *resolved* at the first
  instant the expression no longer returns it (a pending alert that disappears never
  fires; a label set that comes back starts over as pending).

The result is an ``alerts`` table, one row per episode: ``alert`` (the rule's name),
``labels`` (the alert's labels as Prometheus writes them, ``{k="v", ...}``, sorted,
``alertname`` left out: a string, so the table joins, sorts and prints plainly),
``pending_at``, ``firing_at`` (null: it never fired) and ``resolved_at`` (null: still
active at the end), in seconds on the trace's clock.

Rules are evaluated in file order, each over all instants at once. That equals
Prometheus' per-instant order as long as no rule reads a series recorded by itself
or by a later rule; such a file is refused with the rule that breaks the order.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from relakit.control import promql
from relakit.control.tsdb import TSDB
from relakit.validate import ScenarioError, load_yaml

DEFAULT_INTERVAL_S = 60.0  # Prometheus' global evaluation_interval default
_DURATION = re.compile(r"^(?:(\d+)y)?(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?"
                       r"(?:(\d+)ms)?$")
_METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
ALERT_SCHEMA = {"alert": pl.String, "labels": pl.String, "pending_at": pl.Float64,
                "firing_at": pl.Float64, "resolved_at": pl.Float64}


@dataclass(frozen=True)
class Rule:
    kind: str  # alert | record
    name: str
    expr: str
    node: object
    for_s: float = 0.0
    labels: tuple = ()
    annotations: tuple = ()
    key: str = ""  # where it is in the file, for messages


@dataclass(frozen=True)
class Group:
    name: str
    interval_s: float
    rules: tuple = field(default_factory=tuple)


def parse_duration(text, fail) -> float:
    """A Prometheus duration (``1h30m``, ``90s``, ``0s``) in seconds."""
    m = _DURATION.match(text) if isinstance(text, str) and text else None
    if not m:
        fail(f"expected a duration such as 30s, 5m or 1h, got {text!r}")
    units = (31536000, 604800, 86400, 3600, 60, 1, 0.001)
    return float(sum(int(g) * u for g, u in zip(m.groups(), units, strict=True) if g))


def load_rules(source) -> list[Group]:
    """Read and check a rule file (a path, or an already loaded mapping)."""
    data, name, _ = load_yaml(source, "rules")  # also: binary files, keys given twice

    def failer(key):
        def fail(problem):
            raise ScenarioError(f"{name}: key '{key}': {problem}")
        return fail

    if not isinstance(data, dict):
        failer("(top level)")("expected a mapping with 'groups'")
    extra = sorted(set(data) - {"groups"})
    if extra:
        failer("(top level)")(f"unknown key(s) {extra}; allowed keys here: ['groups']")
    groups_data = data.get("groups")
    if not isinstance(groups_data, list) or not groups_data:
        failer("groups")("expected a list of rule groups")
    groups, seen = [], set()
    for gi, g in enumerate(groups_data):
        gkey = f"groups[{gi}]"
        if not isinstance(g, dict):
            failer(gkey)("expected a mapping with name, interval and rules")
        extra = sorted(set(g) - {"name", "interval", "rules"})
        if extra:
            failer(gkey)(f"unknown key(s) {extra}; allowed keys here: "
                         "['interval', 'name', 'rules']")
        gname = g.get("name")
        if not isinstance(gname, str) or not gname:
            failer(f"{gkey}.name")("expected the group's name")
        if gname in seen:
            failer(f"{gkey}.name")(f"group name {gname!r} is used twice")
        seen.add(gname)
        interval = (parse_duration(g["interval"], failer(f"{gkey}.interval"))
                    if "interval" in g else DEFAULT_INTERVAL_S)
        if interval <= 0:
            failer(f"{gkey}.interval")("must be positive")
        rules_data = g.get("rules")
        if not isinstance(rules_data, list) or not rules_data:
            failer(f"{gkey}.rules")("expected a list of alerting or recording rules")
        rules = tuple(_rule(r, f"{gkey}.rules[{ri}]", failer) for ri, r in enumerate(rules_data))
        groups.append(Group(gname, interval, rules))
    _check_order(groups, name)
    return groups


def _rule(r, key: str, failer) -> Rule:
    if not isinstance(r, dict):
        failer(key)("expected a mapping with alert or record, and expr")
    kinds = [k for k in ("alert", "record") if k in r]
    if len(kinds) != 1:
        failer(key)("a rule has exactly one of 'alert' and 'record'")
    kind = kinds[0]
    allowed = ({"alert", "expr", "for", "labels", "annotations"} if kind == "alert"
               else {"record", "expr", "labels"})
    extra = sorted(set(r) - allowed)
    if extra:
        failer(key)(f"unknown key(s) {extra}; allowed keys in an {kind} rule: {sorted(allowed)}"
                    if kind == "alert" else f"unknown key(s) {extra}; allowed keys in a record "
                    f"rule: {sorted(allowed)}")
    name = r[kind]
    if not isinstance(name, str) or not name:
        failer(f"{key}.{kind}")("expected a name")
    if kind == "record" and not _METRIC_NAME.match(name):
        failer(f"{key}.record")(f"{name!r} is not a valid metric name")
    expr = r.get("expr")
    if isinstance(expr, int | float) and not isinstance(expr, bool):
        expr = str(expr)
    if not isinstance(expr, str) or not expr.strip():
        failer(f"{key}.expr")("expected a PromQL expression")
    try:
        node = promql.parse(expr)
    except promql.PromQLError as exc:
        failer(f"{key}.expr")(str(exc))
    for_s = parse_duration(r["for"], failer(f"{key}.for")) if "for" in r else 0.0
    labels = _string_map(r.get("labels", {}), f"{key}.labels", failer, labels=True)
    annotations = _string_map(r.get("annotations", {}), f"{key}.annotations", failer)
    return Rule(kind, name, expr, node, for_s, labels, annotations, key)


def _string_map(m, key: str, failer, labels: bool = False) -> tuple:
    if m is None:
        return ()
    if not isinstance(m, dict):
        failer(key)("expected a mapping of names to strings")
    for k, v in m.items():
        if not isinstance(k, str) or not _LABEL_NAME.match(k):
            failer(f"{key}.{k}")(f"{k!r} is not a valid label name")
        if not isinstance(v, str | int | float) or isinstance(v, bool):
            failer(f"{key}.{k}")(f"expected a string, got {v!r}")
        if labels and "{{" in str(v):
            failer(f"{key}.{k}")("label templates ({{ ... }}) are not supported; give a "
                                 "fixed value")
        if labels and k == "__name__":
            failer(f"{key}.{k}")("a rule cannot set __name__")
    return tuple(sorted((k, str(v)) for k, v in m.items()))


def _check_order(groups: list[Group], name: str):
    """Refuse a rule reading a series recorded by itself or by a later rule."""
    later: dict = {}
    flat = [r for g in groups for r in g.rules]
    for i, r in enumerate(flat):
        if r.kind == "record":
            later.setdefault(r.name, i)
    for i, r in enumerate(flat):
        for sel in promql.selectors(r.node):
            j = later.get(sel.name)
            if j is not None and j >= i:
                raise ScenarioError(
                    f"{name}: key '{r.key}.expr': reads {sel.name!r}, recorded by "
                    f"{'this rule' if j == i else 'a later rule (' + flat[j].key + ')'}; put "
                    "a recording rule before the rules that read it")


def _eval_times(interval: float, lo: float, hi: float) -> np.ndarray:
    first = np.ceil(lo / interval - 1e-9) * interval
    n = int(np.floor((hi - first) / interval + 1e-9)) + 1
    return first + interval * np.arange(max(n, 0))


def _as_tsdb(trace) -> TSDB:
    if isinstance(trace, TSDB):
        return trace
    if isinstance(trace, pl.DataFrame):
        return TSDB.from_long(trace)
    from relakit.traces import read_trace

    return TSDB.from_long(read_trace(trace))


def _result_vector(result, t) -> promql.Vector:
    """A scalar result becomes one series with no labels, as the rule manager does."""
    if isinstance(result, np.ndarray):
        return promql.Vector([((), result, np.ones(t.size, dtype=bool))])
    return result


def _with_labels(labels: tuple, extra: tuple, **force) -> tuple:
    d = dict(labels)
    d.update(extra)
    d.update(force)
    return tuple(sorted(d.items()))


def _merge(series: list, rule: Rule) -> dict:
    """Result series by final label set; two at once with the same set is an error."""
    out: dict = {}
    for lab, val, ok in series:
        if lab in out:
            pv, pok = out[lab]
            if (pok & ok).any():
                raise ScenarioError(f"rule {rule.name!r} ({rule.key}): vector contains "
                                    f"metrics with the same labelset {promql.format_labels(lab)}"
                                    " after applying rule labels")
            out[lab] = (np.where(ok, val, pv), pok | ok)
        else:
            out[lab] = (val, ok)
    return out


def evaluate_rules(trace_or_tsdb, rules, start_s=None, end_s=None):
    """(alerts table, evaluator holding the recorded series) for a rule file."""
    tsdb = _as_tsdb(trace_or_tsdb)
    groups = rules if isinstance(rules, list) else load_rules(rules)
    lo, hi = tsdb.span
    lo = lo if start_s is None else float(start_s)
    hi = hi if end_s is None else float(end_s)
    ev = promql.Evaluator(promql.store_from_tsdb(tsdb))
    rows = []
    for g in groups:
        t = _eval_times(g.interval_s, lo, hi)
        if t.size == 0:
            continue
        for rule in g.rules:
            try:
                res = _result_vector(ev.evaluate(rule.node, t), t)
            except promql.PromQLError as exc:
                raise ScenarioError(f"rule {rule.name!r} ({rule.key}): {exc.problem}") from None
            if rule.kind == "record":
                merged = _merge([(_with_labels(lab, rule.labels, __name__=rule.name), v, ok)
                                 for lab, v, ok in res.series], rule)
                ev.add([_recorded(lab, v, ok, t) for lab, (v, ok) in merged.items()])
            else:
                merged = _merge([(_with_labels(promql._drop_name(lab), rule.labels), v, ok)
                                 for lab, v, ok in res.series], rule)
                for lab, (_, ok) in merged.items():
                    rows += _episodes(rule, lab, ok, t)
    alerts = pl.DataFrame(rows, schema=ALERT_SCHEMA, orient="row")
    return alerts.sort("pending_at", "alert", "labels"), ev


def _recorded(labels, v, ok, t) -> promql.Series:
    gone = np.zeros(t.size, dtype=bool)
    gone[1:] = ok[:-1] & ~ok[1:]  # Prometheus writes a staleness marker there
    return promql.Series(labels, t[ok], v[ok], stale=t[gone])


def _episodes(rule: Rule, labels: tuple, ok: np.ndarray, t: np.ndarray) -> list:
    """Runs of consecutive instants with the label set present, as alert episodes."""
    prev = np.concatenate([[False], ok[:-1]])
    nxt = np.concatenate([ok[1:], [False]])
    starts = np.flatnonzero(ok & ~prev)
    ends = np.flatnonzero(ok & ~nxt) + 1  # first instant it is gone (may be t.size)
    fire = np.searchsorted(t, t[starts] + rule.for_s - 1e-9, side="left")
    text = promql.format_labels(labels)
    rows = []
    for s, e, f in zip(starts, ends, fire, strict=True):
        rows.append((rule.name, text, float(t[s]), float(t[f]) if f < e else None,
                     float(t[e]) if e < t.size else None))
    return rows


def backtest_rules(trace_or_tsdb, rules_path, start_s=None, end_s=None) -> pl.DataFrame:
    """The ``alerts`` table of a rule file evaluated over a trace (path, long table or
    TSDB) from ``start_s`` to ``end_s`` (default: the trace's span), open loop."""
    return evaluate_rules(trace_or_tsdb, rules_path, start_s, end_s)[0]


def firing_at(alerts: pl.DataFrame, t: float) -> pl.DataFrame:
    """The alerts firing at instant ``t`` (alert, labels), as Prometheus would list them."""
    return alerts.filter(pl.col("firing_at").is_not_null() & (pl.col("firing_at") <= t)
                         & (pl.col("resolved_at").is_null() | (pl.col("resolved_at") > t))
                         ).select("alert", "labels").sort("alert", "labels")
