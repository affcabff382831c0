"""Prometheus rule files, backtested over a TSDB as Prometheus would have evaluated them.

A rule file is ``groups: [{name, interval, rules: [{alert|record, expr, for,
keep_firing_for, labels, annotations}]}]``. :func:`load_rules` validates it (one-line
errors naming file and key, PromQL errors with their position); :func:`backtest_rules`
evaluates every group at its evaluation instants (multiples of ``interval``, as
``promtool test rules`` does: real Prometheus shifts each group by a hash-derived
phase), open loop:

* a recording rule's result is written back as series named ``record`` (sample
  labels, the rule's labels on top), with staleness markers where a series vanishes,
  so later rules read it as Prometheus' would;
* an alerting rule follows Prometheus' state machine: a label set returned by the
  expression becomes *pending* at the first instant it appears, *firing* at the first
  evaluation instant at least ``for`` after that, and is *resolved* at the first
  instant the expression no longer returns it, or, with ``keep_firing_for``, the
  first instant it has not returned it for that long (a pending alert that
  disappears never fires; a label set that comes back starts over as pending);
* an evaluation Prometheus would fail (many-to-many matching, two series with one
  label set) fails at that instant only: the rule writes nothing there and its
  alerts keep their state, as the rule manager does, and the table gets an error row.

The result is an ``alerts`` table, one row per episode: ``alert`` (the rule's name),
``labels`` (the alert's labels as Prometheus writes them, ``{k="v", ...}``, sorted,
``alertname`` left out: a string, so the table joins, sorts and prints plainly),
``pending_at``, ``firing_at`` (null: it never fired), ``resolved_at`` (null: still
active at the end), in seconds on the trace's clock, and ``error`` (null). An error
row names the rule (alerting or recording) in ``alert``, has ``labels`` ``{}``, the
first failed instant of a run of them in ``pending_at``, the next instant the rule
evaluated in ``resolved_at``, and Prometheus' message in ``error``.

Rules may read series recorded anywhere in the file, as Prometheus allows. relakit
evaluates groups and rules in file order at each instant, as ``promtool test rules``
does with ``group_eval_order`` in file order (without it promtool takes a map order;
a live Prometheus runs groups concurrently at hash-derived phases), so a rule reading
a series recorded by a *later* rule sees that rule's previous evaluation. relakit
evaluates rule by rule over all instants at once, writers first; such a read sees
only samples written before the instant. A file whose rules read each other in a
cycle (a rule reading its own output included) cannot be evaluated that way and is
refused with the rules of the cycle.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from relakit.control import promql
from relakit.control.promql_store import read_store, store_from_frame
from relakit.control.tsdb import TSDB
from relakit.validate import ScenarioError, load_yaml

if TYPE_CHECKING:
    import polars as pl

DEFAULT_INTERVAL_S = 60.0  # Prometheus' global evaluation_interval default
_DURATION = re.compile(r"^(?:(\d+)y)?(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?"
                       r"(?:(\d+)ms)?$")
_METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
#: The alerts table's columns: alert, labels and error are text, the times float seconds.
ALERT_COLUMNS = ("alert", "labels", "pending_at", "firing_at", "resolved_at", "error")


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
    keep_firing_s: float = 0.0


@dataclass(frozen=True)
class Group:
    name: str
    interval_s: float
    rules: tuple = field(default_factory=tuple)


def parse_duration(text, fail) -> float:
    """A Prometheus duration (``1h30m``, ``90s``, ``0s``) in seconds."""
    if text == "0" or text == 0:  # Prometheus' ParseDuration takes a bare 0
        return 0.0
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
    if groups_data is None:  # Prometheus loads a file without groups: nothing to do
        groups_data = []
    if not isinstance(groups_data, list):
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
        if rules_data is None:  # an empty group is valid Prometheus: it evaluates nothing
            rules_data = []
        if not isinstance(rules_data, list):
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
    allowed = ({"alert", "expr", "for", "keep_firing_for", "labels", "annotations"}
               if kind == "alert"
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
    if promql.kind_of(node) not in ("vector", "scalar"):
        failer(f"{key}.expr")(f"a rule's expression gives an instant vector or a scalar, not "
                              f"a {'range vector' if promql.is_range(node) else 'string'}")
    for_s = parse_duration(r["for"], failer(f"{key}.for")) if "for" in r else 0.0
    keep_s = (parse_duration(r["keep_firing_for"], failer(f"{key}.keep_firing_for"))
              if "keep_firing_for" in r else 0.0)
    labels = _string_map(r.get("labels", {}), f"{key}.labels", failer, labels=True)
    annotations = _string_map(r.get("annotations", {}), f"{key}.annotations", failer)
    return Rule(kind, name, expr, node, for_s, labels, annotations, key, keep_s)


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
    """Refuse rules that read each other in a cycle (see the module's docstring)."""
    evaluation_order(groups, name)


def evaluation_order(groups: list[Group], name: str = "<rules>") -> list:
    """(group, rule, late names) in an order where every rule comes after the rules
    recording what it reads; ``late``: the names it reads that a rule at or after it
    in the file records (it sees their samples written before each instant only)."""
    flat = [(g, r) for g in groups for r in g.rules]
    writers: dict = {}
    for i, (_, r) in enumerate(flat):
        if r.kind == "record":
            writers.setdefault(r.name, []).append(i)
    reads = [{s.name for s in promql.selectors(r.node) if s.name in writers} for _, r in flat]
    deps = [sorted({j for x in names for j in writers[x]}) for names in reads]
    done, order, state = set(), [], {}

    def visit(i, path):
        if i in done:
            return
        if state.get(i) == "open":
            cyc = path[path.index(i):-1]
            keys = ", ".join(flat[k][1].key for k in cyc)
            r = flat[i][1]
            raise ScenarioError(
                f"{name}: key '{r.key}.expr': "
                + (f"reads {r.name!r}, recorded by this rule" if len(cyc) == 1 else
                   f"rules read each other in a cycle ({keys})")
                + "; relakit cannot evaluate a rule that reads its own output")
        state[i] = "open"
        for j in deps[i]:
            visit(j, [*path, j])
        state[i] = "done"
        done.add(i)
        order.append(i)

    for i in range(len(flat)):
        visit(i, [i])
    return [(flat[i][0], flat[i][1],
             frozenset(x for x in reads[i] if max(writers[x]) >= i)) for i in order]


def _eval_times(interval: float, lo: float, hi: float) -> np.ndarray:
    first = np.ceil(lo / interval - 1e-9) * interval
    n = int(np.floor((hi - first) / interval + 1e-9)) + 1
    return first + interval * np.arange(max(n, 0))




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


def _merge(series: list, t: np.ndarray, failed: np.ndarray, what: str):
    """Result series by final label set; two at once with the same set fail that
    instant (Prometheus: "vector contains metrics with the same labelset after
    applying rule labels"). Returns (merged dict, failed mask, message or None)."""
    out: dict = {}
    msg = None
    for lab, val, ok in series:
        if lab in out:
            pv, pok = out[lab]
            clash = pok & ok
            if clash.any():
                failed = failed | clash
                msg = msg or (f"vector contains metrics with the same labelset "
                              f"{promql.format_labels(lab)} after applying {what} labels")
            out[lab] = (np.where(ok, val, pv), pok | ok)
        else:
            out[lab] = (val, ok)
    return out, failed, msg


def evaluate_rules(trace_or_tsdb, rules, start_s=None, end_s=None, *, arrow=False):
    """(alerts table, evaluator holding the recorded series) for a rule file, over a
    trace (path or long table), a TSDB, or a list of :class:`promql.Series` (whose
    labels may be any). The table is a polars DataFrame, or with ``arrow=True`` the same
    table as a pyarrow Table (``replay --rules`` writes it so and never loads polars)."""
    pl = sys.modules.get("polars")  # a polars frame exists only if polars is loaded
    if isinstance(trace_or_tsdb, TSDB):
        store = promql.store_from_tsdb(trace_or_tsdb)
    elif pl is not None and isinstance(trace_or_tsdb, pl.DataFrame):
        store = store_from_frame(trace_or_tsdb)
    elif isinstance(trace_or_tsdb, list):  # a promql series store: any labels
        store = list(trace_or_tsdb)
    else:
        store = read_store(trace_or_tsdb)
    times = [s.times for s in store if s.times.size]
    span = (min(t[0] for t in times), max(t[-1] for t in times)) if times else (0.0, 0.0)
    groups = rules if isinstance(rules, list) else load_rules(rules)
    lo = span[0] if start_s is None else float(start_s)
    hi = span[1] if end_s is None else float(end_s)
    ev = promql.Evaluator(store)
    ev.share([r.node for g in groups for r in g.rules])
    rows = []
    for g, rule, late in evaluation_order(groups):
        t = _eval_times(g.interval_s, lo, hi)
        if t.size == 0:
            continue
        ev.late = late
        try:
            res, failed, msg = ev.evaluate(rule.node, t, errors="return")
        except promql.PromQLError as exc:
            raise ScenarioError(f"rule {rule.name!r} ({rule.key}): {exc.problem}") from None
        res = _result_vector(res, t)
        if rule.kind == "record":
            merged, failed, msg2 = _merge([(_with_labels(lab, rule.labels, __name__=rule.name),
                                            v, ok) for lab, v, ok in res.series], t, failed,
                                          "rule")
        else:
            merged, failed, msg2 = _merge([(_with_labels(promql.drop_name(lab), rule.labels),
                                            v, ok) for lab, v, ok in res.series], t, failed,
                                          "alert")
        msg = msg or msg2
        keep = ~failed  # a failed evaluation writes nothing and changes no alert's state
        if rule.kind == "record":
            ev.add([_recorded(lab, v[keep], ok[keep], t[keep]) for lab, (v, ok)
                     in merged.items()])
        else:
            for lab, (_, ok) in merged.items():
                rows += _episodes(rule, lab, ok[keep], t[keep])
        rows += _error_rows(rule, failed, t, msg)
    ev.late = frozenset()
    rows.sort(key=lambda r: (r[2], r[0], r[1]))  # pending_at, alert, labels (never null)
    alerts = _arrow_table(rows)
    if arrow:
        return alerts, ev
    import polars as pl

    return pl.from_arrow(alerts), ev


def _arrow_table(rows: list) -> object:
    """The alerts rows as a pyarrow Table of :data:`ALERT_COLUMNS` (None: null)."""
    import pyarrow as pa

    types = (pa.string(), pa.string(), pa.float64(), pa.float64(), pa.float64(), pa.string())
    cols = list(zip(*rows, strict=True)) if rows else [()] * len(types)
    return pa.table([pa.array(c, type=t) for c, t in zip(cols, types, strict=True)],
                    names=list(ALERT_COLUMNS))


def _error_rows(rule: Rule, failed: np.ndarray, t: np.ndarray, msg) -> list:
    """One row per run of failed evaluations: where it starts and the next instant."""
    if not failed.any():
        return []
    prev = np.concatenate([[False], failed[:-1]])
    nxt = np.concatenate([failed[1:], [False]])
    starts = np.flatnonzero(failed & ~prev)
    ends = np.flatnonzero(failed & ~nxt) + 1
    return [(rule.name, "{}", float(t[s]), None, float(t[e]) if e < t.size else None, msg)
            for s, e in zip(starts, ends, strict=True)]


def _recorded(labels, v, ok, t) -> promql.Series:
    gone = np.zeros(t.size, dtype=bool)
    gone[1:] = ok[:-1] & ~ok[1:]  # Prometheus writes a staleness marker there
    return promql.Series(labels, t[ok], v[ok], stale=t[gone])


def _episodes(rule: Rule, labels: tuple, ok: np.ndarray, t: np.ndarray) -> list:
    """Runs of consecutive instants with the label set present, as alert episodes; a
    firing alert outlives its run by ``keep_firing_for`` and runs it meets join it."""
    prev = np.concatenate([[False], ok[:-1]])
    nxt = np.concatenate([ok[1:], [False]])
    starts = np.flatnonzero(ok & ~prev)
    ends = np.flatnonzero(ok & ~nxt) + 1  # first instant it is gone (may be t.size)
    fire = np.searchsorted(t, t[starts] + rule.for_s - 1e-9, side="left")
    text = promql.format_labels(labels)
    rows, i = [], 0
    while i < starts.size:
        s, e, f = starts[i], ends[i], fire[i]
        if f >= e:  # never fired: resolved when it is gone
            rows.append((rule.name, text, float(t[s]), None,
                         float(t[e]) if e < t.size else None, None))
            i += 1
            continue
        while True:  # firing: it stays so for keep_firing_for after each run
            stop = e if e >= t.size else int(np.searchsorted(
                t, t[e] + rule.keep_firing_s - 1e-9, side="left"))
            if i + 1 < starts.size and starts[i + 1] <= stop:
                i += 1
                e = ends[i]
                continue
            break
        rows.append((rule.name, text, float(t[s]), float(t[f]),
                     float(t[stop]) if stop < t.size else None, None))
        i += 1
    return rows


def label_warnings(groups: list[Group], store: list, source: str = "<rules>") -> list:
    """Label names and values the rules read that no series has: a selector matching
    them selects nothing, a ``by``/``on`` list naming them groups nothing, a
    ``without``/``ignoring`` list naming them drops nothing (a misspelt label there
    changes what is matched or summed, silently), and an alert built on them silently
    never fires. One (file, key, message) per (rule, label), naming both
    (:func:`relakit.checks.check_rule_labels` makes them warnings, which ``replay
    --rules`` and ``relakit check RULES TRACE`` print).

    Labels the file makes itself (rule labels, ``label_replace``/``label_join``
    destinations, ``count_values`` labels) are not reported; nor are series recorded
    by the file (their labels come from expressions)."""
    made = {k for g in groups for r in g.rules for k, _ in r.labels}
    recorded = {r.name for g in groups for r in g.rules if r.kind == "record"}
    by_name: dict = {}
    for s in store:
        d = dict(s.labels)
        for k, v in d.items():
            by_name.setdefault(d.get("__name__", ""), {}).setdefault(k, set()).add(v)
    everywhere = {k for labels in by_name.values() for k in labels}

    def walk(node, out):
        if isinstance(node, promql.Call) and node.func in ("label_replace", "label_join"):
            made.add(node.args[1].value)
        if isinstance(node, promql.Aggregate) and node.op == "count_values":
            made.add(node.param.value)
        out.append(node)
        for a in ("expr", "lhs", "rhs", "param"):
            if getattr(node, a, None) is not None:
                walk(getattr(node, a), out)
        for a in getattr(node, "args", ()):
            walk(a, out)
        return out

    found = []
    for g in groups:
        for r in g.rules:
            nodes = walk(r.node, [])
            seen = set()

            def warn(label, text, r=r, seen=seen):
                if label not in seen and label not in made:
                    seen.add(label)
                    found.append((source, f"{r.key}.expr", f"{r.kind} {r.name!r} {text}"))

            for node in nodes:
                if isinstance(node, promql.Selector) and node.name and \
                        node.name not in recorded and node.name in by_name:
                    have = by_name[node.name]
                    for k, op, v in node.matchers:
                        if k == "__name__" or promql.matcher_matches((k, op, v), ""):
                            continue  # a matcher an absent label satisfies
                        if k not in have:
                            warn(k, f"reads label '{k}', which no series named "
                                    f"{node.name!r} has: {node.name}{{{k}{op}\"{v}\"}} "
                                    "selects nothing")
                        elif not any(promql.matcher_matches((k, op, v), x) for x in have[k]):
                            warn(k, f"reads {k}{op}\"{v}\", which no series named "
                                    f"{node.name!r} has (its {k} values: "
                                    f"{', '.join(sorted(have[k])[:5])}): it selects nothing")
                names, dropped = (), ()
                if isinstance(node, promql.Aggregate):
                    names, dropped = ((), node.labels) if node.without else (node.labels, ())
                if isinstance(node, promql.Binary):
                    names, dropped = (node.on or ()) + node.include, node.ignoring
                for k in names:
                    if k not in everywhere:
                        warn(k, f"groups or matches on label '{k}', which no series has")
                for k in dropped:
                    if k not in everywhere and k != "__name__":
                        warn(k, f"leaves out label '{k}' (without/ignoring), which no series "
                                "has: it leaves out nothing")
    return found


def backtest_rules(trace_or_tsdb, rules_path, start_s=None, end_s=None, *,
                   arrow=False) -> pl.DataFrame:
    """The ``alerts`` table of a rule file evaluated over a trace (path, long table or
    TSDB) from ``start_s`` to ``end_s`` (default: the trace's span), open loop (a
    pyarrow Table with ``arrow=True``)."""
    return evaluate_rules(trace_or_tsdb, rules_path, start_s, end_s, arrow=arrow)[0]


def firing_at(alerts: pl.DataFrame, t: float) -> pl.DataFrame:
    """The alerts firing at instant ``t`` (alert, labels), as Prometheus would list them."""
    import polars as pl

    return alerts.filter(pl.col("firing_at").is_not_null() & (pl.col("firing_at") <= t)
                         & (pl.col("resolved_at").is_null() | (pl.col("resolved_at") > t))
                         & pl.col("error").is_null()
                         ).select("alert", "labels").sort("alert", "labels")
