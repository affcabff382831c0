"""Signals: what a policy reads, defined once, computed with Prometheus semantics.

A signal is a small structured definition (not PromQL text, so it can be
validated and computed vectorised), and it renders itself as the PromQL a live
controller would send (:meth:`Signal.promql`). Kinds:

* ``rate``: ``sum(rate(metric{labels}[window]))``;
* ``ratio``: ``sum(rate(num[w])) / sum(rate(den[w]))`` (error ratio, drop ratio);
* ``histogram_quantile``: ``histogram_quantile(q, sum by (le) (rate(metric_bucket[w])))``;
* ``gauge``: ``<across>(<over_time>_over_time(metric[w]))``.

Fleet-wide by default; ``by: node`` keeps one column per scrape target.
``scale`` multiplies the result (1000 turns seconds into milliseconds).

A signal may instead be written as PromQL, ``{promql: "<expr>"}`` (kind ``promql``):
the expression is parsed when the policy is loaded (an error names the file, the key
``signals.NAME.promql`` and the column) and evaluated by :mod:`relakit.control.promql`
over the same TSDB, at all instants at once; its windows are the expression's own
(the clocks' ``window_s`` does not apply). It must give one number per instant: a
scalar, or a vector with at most one series present at each instant (none: NaN, "no
data"). Two series present at once is an error naming them, never a silent pick:
aggregate them in the expression (``max(...)``, ``sum(...)``).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import numpy as np

from relakit.control.tsdb import TSDB, bucket_quantile, increases, over_time
from relakit.validate import Reader

KINDS = ("rate", "ratio", "histogram_quantile", "gauge")  # and "promql" (``promql:`` key)
OVER_TIME = ("avg", "max", "min", "last")
ACROSS = ("sum", "avg", "max", "min")


@dataclass(frozen=True)
class Selector:
    """A metric name and label matchers (a label given a list matches any of it)."""

    metric: str
    labels: dict = field(default_factory=dict)
    source: str = "nodes"  # nodes (per-target series) | client (the fleet-wide series)

    def promql(self, window_s: float | None = None) -> str:
        parts = []
        for k, v in self.labels.items():
            parts.append(f'{k}=~"{"|".join(v)}"' if isinstance(v, list | tuple)
                         else f'{k}="{v}"')
        sel = self.metric + ("{" + ",".join(parts) + "}" if parts else "")
        return sel + (f"[{window_s:g}s]" if window_s is not None else "")


@dataclass(frozen=True)
class Signal:
    name: str
    kind: str
    selector: Selector | None = None
    den: Selector | None = None
    q: float = 0.99
    over_time: str = "avg"
    across: str = "sum"
    by_node: bool = False
    scale: float = 1.0
    expr: str = ""  # kind promql: the expression's text, and its parsed tree
    node: object = field(default=None, compare=False, repr=False)

    # ---- computation ---------------------------------------------------------------
    def evaluate(self, tsdb: TSDB, t_eval, window_s: float) -> np.ndarray:
        """Values at each evaluation time: shape (T,), or (T, nodes) when ``by: node``."""
        t_eval = np.atleast_1d(np.asarray(t_eval, dtype=float))
        if self.kind == "promql":
            return self._promql(tsdb, t_eval)
        if self.kind == "rate":
            out = self._rates(tsdb, self.selector, t_eval, window_s)
        elif self.kind == "ratio":
            num = self._rates(tsdb, self.selector, t_eval, window_s)
            den = self._rates(tsdb, self.den, t_eval, window_s)
            with np.errstate(divide="ignore", invalid="ignore"):
                out = np.where(den > 0, num / den, np.nan)
        elif self.kind == "histogram_quantile":
            out = self._quantile(tsdb, t_eval, window_s)
        else:
            out = self._gauge(tsdb, t_eval, window_s)
        return out * self.scale

    def _targets(self, tsdb, sel):
        want_client = sel.source == "client"
        return [t for t in tsdb.targets if (t.node < 0) == want_client]

    def _per_target(self, tsdb, sel, fn):
        cols = []
        for tgt in self._targets(tsdb, sel):
            idx = tgt.select(sel.metric, **sel.labels)
            cols.append(fn(tgt, idx))
        return cols

    def _combine(self, per_target: list[np.ndarray], how: str, n_t: int) -> np.ndarray:
        """Fleet: aggregate across targets (NaN targets dropped, all NaN → NaN)."""
        if not per_target:
            return np.full((n_t, 1) if self.by_node else n_t, np.nan)
        stack = np.column_stack(per_target)
        if self.by_node:
            return stack
        present = ~np.isnan(stack)
        count = present.sum(axis=1)
        if how in ("sum", "avg"):
            value = np.where(present, stack, 0.0).sum(axis=1)
            if how == "avg":
                value = value / np.maximum(count, 1)
        else:
            fill = -np.inf if how == "max" else np.inf
            reduce = np.max if how == "max" else np.min
            value = reduce(np.where(present, stack, fill), axis=1)
        return np.where(count > 0, value, np.nan)

    def _rates(self, tsdb, sel, t_eval, window_s):
        parts = [(tgt, tgt.select(sel.metric, **sel.labels)) for tgt in self._targets(tsdb, sel)]
        rates = increases(parts, t_eval, window_s, as_rate=True)
        return self._combine([_nansum_rows(r) for r in rates], "sum", t_eval.size)

    def _gauge(self, tsdb, t_eval, window_s):
        def per(tgt, idx):
            return _nansum_rows(over_time(tgt, idx, t_eval, window_s, self.over_time))

        return self._combine(self._per_target(tsdb, self.selector, per), self.across,
                             t_eval.size)

    def _quantile(self, tsdb, t_eval, window_s):
        bucket = Selector(self.selector.metric + "_bucket", self.selector.labels,
                          self.selector.source)
        per_target = []  # (bounds, (T, B) windowed bucket increases) per target
        found = [(tgt, *tgt.buckets(bucket.metric, **bucket.labels))
                 for tgt in self._targets(tsdb, bucket)]
        found = [f for f in found if f[1].size]
        incs = increases([(tgt, idx) for tgt, idx, _, _ in found], t_eval, window_s)
        for (_, _, bounds, onehot), inc in zip(found, incs, strict=True):
            # sum by (le): series with the same bound and other labels add up
            by_le = np.nan_to_num(inc) @ onehot
            by_le[np.isnan(inc).all(axis=1)] = np.nan
            per_target.append((bounds, by_le))
        if not per_target:
            return np.full((t_eval.size, 1) if self.by_node else t_eval.size, np.nan)
        if self.by_node:
            return np.column_stack([bucket_quantile(self.q, b, c) for b, c in per_target])
        bounds = per_target[0][0]
        total = np.zeros((t_eval.size, bounds.size))
        any_seen = np.zeros(t_eval.size, dtype=bool)
        for b, c in per_target:
            if b.shape != bounds.shape or not np.array_equal(b, bounds):
                raise ValueError(f"signal {self.name}: targets have different bucket bounds")
            ok = ~np.isnan(c[:, 0])
            total[ok] += c[ok]
            any_seen |= ok
        out = bucket_quantile(self.q, bounds, total)
        return np.where(any_seen, out, np.nan)

    def _promql(self, tsdb, t_eval) -> np.ndarray:
        from relakit.control import promql

        try:
            res = promql.Evaluator(_store(tsdb)).evaluate(self.node, t_eval)
        except promql.PromQLError as exc:
            raise ValueError(f"signal {self.name}: {exc.problem} (in {self.expr!r})") from None
        if isinstance(res, np.ndarray):
            return res.astype(float)
        out = np.full(t_eval.size, np.nan)
        seen = np.zeros(t_eval.size, dtype=bool)
        for _labels, values, ok in res.series:
            both = seen & ok
            if both.any():
                others = [promql.format_labels(lab) for lab, _, o in res.series if o[both].any()]
                raise ValueError(
                    f"signal {self.name}: {self.expr!r} gives {len(others)} series at "
                    f"{t_eval[both][0]:g} s ({', '.join(others[:3])}"
                    f"{', ...' if len(others) > 3 else ''}); a signal is one number per "
                    "instant: aggregate it, e.g. max(...) or sum(...)")
            out[ok] = values[ok]
            seen |= ok
        return out

    # ---- the same signal, as a live controller would ask Prometheus -------------------------
    def promql(self, window_s: float) -> str:
        if self.kind == "promql":
            return self.expr
        by = " by (instance)" if self.by_node else ""
        if self.kind == "rate":
            q = f"sum{by}(rate({self.selector.promql(window_s)}))"
        elif self.kind == "ratio":
            q = (f"sum{by}(rate({self.selector.promql(window_s)})) / "
                 f"sum{by}(rate({self.den.promql(window_s)}))")
        elif self.kind == "histogram_quantile":
            le_by = " by (le, instance)" if self.by_node else " by (le)"
            b = Selector(self.selector.metric + "_bucket", self.selector.labels)
            q = f"histogram_quantile({self.q:g}, sum{le_by}(rate({b.promql(window_s)})))"
        else:
            inner = f"{self.over_time}_over_time({self.selector.promql(window_s)})"
            q = inner if self.by_node else f"{self.across}({inner})"
        return q if self.scale == 1.0 else f"({q}) * {self.scale:g}"


def _nansum_rows(a: np.ndarray) -> np.ndarray:
    """Sum across a target's matching series; NaN when none has a value."""
    if a.shape[1] == 0:
        return np.full(a.shape[0], np.nan)
    if a.shape[1] == 1:  # one series: itself, + 0.0 as the sum makes -0.0 (a closed loop
        return a[:, 0] + 0.0  # asks this thousands of times)
    present = a == a  # np.nansum's arithmetic, without its call overhead
    return np.where(present.any(axis=1), np.where(present, a, 0.0).sum(axis=1), np.nan)


def _selector(r: Reader, key: str) -> Selector:
    return _selector_from(r.sub(key))


def _selector_from(s: Reader) -> Selector:
    s.only({"metric", "tier", "outcome", "le", "source"})
    metric = s.data.get("metric")
    if not isinstance(metric, str) or not metric:
        s.fail("expected a metric name", "metric")
    labels = {}
    for lab in ("tier", "outcome", "le"):
        v = s.data.get(lab)
        if v is None:
            continue
        if isinstance(v, str):
            labels[lab] = v
        elif isinstance(v, list) and v and all(isinstance(x, str) for x in v):
            labels[lab] = tuple(v)
        else:
            s.fail(f"expected a label value or a list of them, got {v!r}", lab)
    return Selector(metric, labels, s.choice("source", ("nodes", "client"), "nodes"))


def policy_reach_s(policy) -> float:
    """:func:`history_s` of a policy's signals (0 without a policy)."""
    return history_s(policy.signals.values()) if policy is not None else 0.0


def history_s(signals) -> float:
    """How far back the promql signals read: the longest range (or, for an instant
    selector, Prometheus' 5 min lookback) plus its offset, a subquery's range added
    to what its expression reads; 0 without promql signals. The closed loop hands
    the controller that much history (structured signals need only the clocks'
    window)."""
    from relakit.control import promql

    return max((promql.reach_s(sig.node) for sig in signals if sig.kind == "promql"),
               default=0.0)


_STORES: dict = {}  # id(tsdb) -> (weak reference to it, its promql series store)


def _store(tsdb: TSDB) -> list:
    """The TSDB's series as promql's store, built once per TSDB object (a policy with
    several promql signals reads one trace; the closed loop makes a new TSDB per
    evaluation, so a stale store is never reused)."""
    from relakit.control import promql

    hit = _STORES.get(id(tsdb))
    if hit is not None and hit[0]() is tsdb:
        return list(hit[1])
    store = promql.store_from_tsdb(tsdb)
    for key in [k for k, (ref, _) in _STORES.items() if ref() is None]:
        del _STORES[key]
    _STORES[id(tsdb)] = (weakref.ref(tsdb), store)
    return list(store)


def _promql_signal(r: Reader, name: str) -> Signal:
    from relakit.control import promql

    r.only({"promql"})
    expr = r.data.get("promql")
    if isinstance(expr, int | float) and not isinstance(expr, bool):
        expr = str(expr)
    if not isinstance(expr, str) or not expr.strip():
        r.fail("expected a PromQL expression", "promql")
    try:
        node = promql.parse(expr)
    except promql.PromQLError as exc:
        r.fail(str(exc), "promql")
    if promql.is_range(node):
        r.fail("a range vector is not a signal: apply a function to it, e.g. rate(...)",
               "promql")
    return Signal(name, "promql", expr=expr, node=node)


def parse_signal(r: Reader, name: str) -> Signal:
    if isinstance(r.data, dict) and "promql" in r.data:
        return _promql_signal(r, name)
    kind = r.choice("kind", KINDS)
    common = {"kind", "by", "scale"}
    by = r.choice("by", ("fleet", "node"), "fleet") == "node"
    scale = r.number("scale", 1.0)
    if scale == 0:
        r.fail("0 makes every value of the signal 0, so no threshold ever sees the metric; "
               "give 1 (as recorded) or 1000 (seconds as milliseconds)", "scale")
    if kind == "ratio":
        r.only(common | {"num", "den"})
        return Signal(name, kind, _selector(r, "num"), _selector(r, "den"), by_node=by,
                      scale=scale)
    if kind == "histogram_quantile":
        r.only(common | {"metric", "q", "tier", "outcome", "source"})
        return Signal(name, kind, _selector_inline(r), q=r.number("q", 0.99, lo=0, hi=1),
                      by_node=by, scale=scale)
    if kind == "gauge":
        r.only(common | {"metric", "over_time", "across", "tier", "outcome", "source"})
        return Signal(name, kind, _selector_inline(r),
                      over_time=r.choice("over_time", OVER_TIME, "avg"),
                      across=r.choice("across", ACROSS, "sum"), by_node=by, scale=scale)
    r.only(common | {"metric", "tier", "outcome", "le", "source"})
    return Signal(name, kind, _selector_inline(r), by_node=by, scale=scale)


def _selector_inline(r: Reader) -> Selector:
    data = {k: r.data[k] for k in ("metric", "tier", "outcome", "le", "source") if k in r.data}
    return _selector_from(Reader(data, r.source, r.path))
