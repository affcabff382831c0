"""PromQL evaluated on relakit's series at many instants at once.

The expression is parsed by :mod:`relakit.control.promql_parse` (its grammar is
there); values and what operators do to them are :mod:`relakit.control.promql_values`;
the window functions' arithmetic is :mod:`relakit.control.promql_functions` (arrays
only); ``rate``/``increase``/``delta`` are :mod:`relakit.control.tsdb`'s kernel; the
series come from :mod:`relakit.control.promql_store`. This module is the evaluator
that walks the tree, and the one name space the rest of relakit imports PromQL from.

Evaluation follows Prometheus 2.42 (the version ``promtool`` runs): an instant
selector takes the newest sample in ``[t - 5m, t]`` (lookback delta 5 min); a range
selector ``x[W]`` the samples in ``[t - W, t]``; a subquery ``e[W:S]`` evaluates
``e`` at the multiples of ``S`` in that window; ``rate``/``increase``/``delta``
extrapolate as ``extrapolatedRate``; ``histogram_quantile`` as ``bucketQuantile``;
arithmetic drops the metric name, filtering comparisons keep it. A NaN *value* is a
sample (``count`` counts it, ``x > 1`` drops it, it hides older samples); a missing
sample is not. Staleness markers are not modelled for scraped series (relakit's TSDB
stores none); the series a recording rule writes get them, as Prometheus writes
them (see :mod:`relakit.control.rules`).

A value is evaluated at a whole vector of instants ``T`` at once: an instant vector
is a list of series, each with its labels, a value per instant and a mask saying at
which instants it exists. An evaluation error that Prometheus raises at one instant
(many-to-many matching, duplicate output label sets, an invalid ``holt_winters``
factor) fails that instant only: :meth:`Evaluator.evaluate` raises it, or, asked
for, returns it as a mask with the message (rule backtests report it per instant).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from relakit.control import promql_functions as fn
from relakit.control.promql_parse import (  # noqa: F401  (re-exported: promql.X is the API)
    AGGREGATIONS,
    ARITHMETIC,
    COMPARISON,
    DATE_FUNCTIONS,
    FUNCTIONS,
    KEYWORDS,
    LOOKBACK_S,
    MAX_DEPTH,
    MAX_NESTING,
    RANGE_FUNCTIONS,
    SET_OPERATORS,
    SIGNATURES,
    UNSUPPORTED_AGGREGATIONS,
    UNSUPPORTED_FUNCTIONS,
    Aggregate,
    Binary,
    Call,
    Number,
    PromQLError,
    Selector,
    String,
    Subquery,
    Unary,
    format_duration,
    is_range,
    is_scalar,
    kind_of,
    matcher_matches,
    parse,
    reach_s,
    selectors,
    to_text,
    tree_depth,
    where,
)
from relakit.control.promql_store import Series, store_from_tsdb
from relakit.control.promql_values import (  # noqa: F401  (re-exported as above)
    Vector,
    absent_labels,
    aggregate,
    apply_op,
    date_function,
    drop_name,
    format_labels,
    histogram_quantile,
    label_join,
    label_replace,
    label_set_text,
    match_signature,
    result_labels,
    set_operation,
    vector_scalar,
)
from relakit.control.tsdb import (
    TSDB,
    counter_resets,
    extrapolated_rate,
    window,
    window_bounds,
)

DEFAULT_SUBQUERY_STEP_S = 60.0  # a step-less subquery's step: the global evaluation_interval
_BLOCK = 64  # series per array operation of a window function (bounds its temporaries)
WINDOW_CACHE_BYTES = 8 << 20  # store series' rates kept for other selectors (Evaluator._rates)


@dataclass
class _Matrix:
    """A range vector at T instants: series (labels, times, values), each window
    ``[end - range, end]``, and the instant past which samples are not yet written."""

    series: list
    end: np.ndarray
    range_s: float
    cut: list  # per series: None, or (T,) exclusive upper bound on sample times
    stored: bool = False  # the series are the store's (a selector's), not computed




def _subexpressions(root) -> list:
    """The function calls and aggregations of an expression, ``root`` first if it is one."""
    out, stack = [], [root]
    while stack:
        node = stack.pop()
        if isinstance(node, Call | Aggregate):
            out.append(node)
        for a in ("expr", "lhs", "rhs", "param"):
            if getattr(node, a, None) is not None:
                stack.append(getattr(node, a))
        stack.extend(getattr(node, "args", ()))
    return out


class Evaluator:
    """Evaluates parsed expressions over a series store at a vector of instants.

    ``late`` names recorded series whose samples at the evaluation instant itself are
    not written yet (a rule reading a series a later rule records, as Prometheus'
    rule manager evaluates rules in order at each instant)."""

    def __init__(self, store: list[Series], default_step_s: float = DEFAULT_SUBQUERY_STEP_S):
        self.store = store
        self.default_step_s = float(default_step_s)
        self.late: frozenset = frozenset()
        self._by_name: dict = {}
        self._fails: list = []
        self._uses: dict = {}  # text of a shared sub-expression -> evaluations still to come
        self._memo: dict = {}  # text -> (instants' key, late names, result, failed, message)
        self._selected: dict = {}  # (name, matchers) -> the series a selector selects
        self._windows: dict = {}  # (series, function, range, instants) -> values, oldest first
        self._window_bytes = 0
        self._drops: dict = {}  # id(store series' values) -> (values, counter resets)
        self._texts: dict = {}  # id(node) -> (node, text, selected names)
        for s in store:
            self._by_name.setdefault(s.label("__name__"), []).append(s)

    def add(self, series: list[Series]):
        names = set()
        for s in series:
            self.store.append(s)
            names.add(s.label("__name__"))
            self._by_name.setdefault(s.label("__name__"), []).append(s)
        for text in [k for k, m in self._memo.items() if m[1] & names or None in m[1]]:
            del self._memo[text]  # it read a series that has grown
        for key in [k for k in self._selected if k[0] in names or k[0] is None]:
            del self._selected[key]

    def share(self, roots):
        """Remember the value of every function call and aggregation that these
        expressions (a rule file's) compute more than once, until its last use.

        Why: real rule files read the same window again and again (the same
        ``rate(x[5m])`` under five thresholds, a recording rule's expression inside an
        alert); the result depends only on the sub-expression's text, the instants and
        the series it reads, so it is computed once. Entries are dropped after their
        last use, so memory holds only what is still to be read."""
        counts: dict = {}
        for root in roots:
            for node in _subexpressions(root):
                text = to_text(node)
                counts[text] = counts.get(text, 0) + 1
        self._uses = {k: n for k, n in counts.items() if n > 1}
        self._memo = {}

    def evaluate(self, node, t_eval, errors: str = "raise"):
        """A :class:`Vector`, or a (T,) array for a scalar expression.

        An instant at which Prometheus would fail the query (many-to-many matching, ...)
        raises :class:`PromQLError` naming it; with ``errors="return"`` the answer is
        ``(result, failed (T,) mask, message)`` and the result is empty where it failed."""
        t = np.atleast_1d(np.asarray(t_eval, dtype=float))
        self._fails = [[np.zeros(t.size, dtype=bool), None]]
        try:
            res = self._eval(node, t)
        finally:
            failed, msg = self._fails.pop()
        if isinstance(res, _Matrix):
            raise PromQLError("a range vector is not a value at an instant; apply a "
                              "function such as rate() to it", "", getattr(node, "pos", 0))
        if errors == "raise":
            if failed.any():
                text, pos = msg
                raise PromQLError(f"{text} (at {t[np.argmax(failed)]:g} s)", "", pos)
            return res
        if isinstance(res, Vector):
            res = Vector([(lab, val, ok & ~failed) for lab, val, ok in res.series])
        return res, failed, (msg[0] if msg else None)

    def _error(self, mask, text: str, pos: int):
        """Fail the instants in ``mask`` (the first message is kept)."""
        mask = np.asarray(mask, dtype=bool)
        if mask.any():
            cur = self._fails[-1]
            cur[0] |= mask
            if cur[1] is None:
                cur[1] = (text, pos)

    # -- dispatch
    def _eval(self, node, t):
        if not self._uses or not isinstance(node, Call | Aggregate):
            return self._compute(node, t)
        text, names = self._text(node)
        left = self._uses.get(text, 0)
        if not left:
            return self._compute(node, t)
        key = (t.size, float(t[0]) if t.size else 0.0, hash(t.tobytes()), names & self.late)
        hit = self._memo.get(text)
        if hit is None or hit[0] != key:
            self._fails.append([np.zeros(t.size, dtype=bool), None])
            try:
                res = self._compute(node, t)
            finally:
                failed, msg = self._fails.pop()
            hit = (key, names, res, failed, msg)
            self._memo[text] = hit
        else:  # the sub-expressions inside were not evaluated: their uses are spent too
            for inner in _subexpressions(node)[1:]:
                self._spend(self._text(inner)[0])
        self._spend(text)
        if hit[4] is not None:
            self._error(hit[3], *hit[4])
        return hit[2]

    def _text(self, node) -> tuple:
        """(text, names of the series it selects) of a sub-expression, worked out once per
        node (a rule's tree is evaluated at every group, its text asked for each time)."""
        hit = self._texts.get(id(node))
        if hit is None or hit[0] is not node:
            hit = self._texts[id(node)] = (node, to_text(node),
                                           frozenset(s.name for s in selectors(node)))
        return hit[1:]

    def _spend(self, text: str):
        """One use of a shared value is over; after its last, it is forgotten."""
        left = self._uses.get(text, 0)
        if left == 1:
            del self._uses[text]
            self._memo.pop(text, None)
        elif left:
            self._uses[text] = left - 1

    def _compute(self, node, t):
        if isinstance(node, Number):
            return np.full(t.size, node.value)
        if isinstance(node, String):
            return node.value
        if isinstance(node, Selector):
            if node.range_s is not None:
                return self._matrix(node, t)
            return self._instant(node, t)[0]
        if isinstance(node, Subquery):
            return self._matrix(node, t)
        if isinstance(node, Unary):
            v = self._eval(node.expr, t)
            if isinstance(v, np.ndarray):
                return -v
            return Vector([(drop_name(lab), -val, ok) for lab, val, ok in v.series])
        if isinstance(node, Binary):
            return self._binary(node, t)
        if isinstance(node, Aggregate):
            param = self._eval(node.param, t) if node.param is not None else None
            return aggregate(node, self._eval(node.expr, t), param, t.size)
        if isinstance(node, Call):
            return self._unique(self._call(node, t), node.pos)
        raise TypeError(node)

    def select(self, sel: Selector) -> list[Series]:
        key = (sel.name or None, tuple(tuple(m) for m in sel.matchers))
        hit = self._selected.get(key)
        if hit is None:
            hit = self._by_name.get(sel.name, []) if sel.name else self.store
            for m in sel.matchers:  # one matcher at a time, each label value tried once
                seen: dict = {}
                keep = []
                for s in hit:
                    value = s.label(m[0])
                    ok = seen.get(value)
                    if ok is None:
                        ok = seen[value] = matcher_matches(m, value)
                    if ok:
                        keep.append(s)
                hit = keep
            hit = list(hit)
            self._selected[key] = hit
        return list(hit)

    def _when(self, node, t):
        """The instants a selector or subquery reads at: ``@`` then ``offset``."""
        base = t if node.at in (None, "start", "end") else np.full(t.size, float(node.at))
        return base - node.offset_s

    def _cut(self, s: Series, t):
        """Samples at or after ``t`` of a late series are not written yet."""
        return t if s.label("__name__") in self.late else None

    def _instant(self, sel: Selector, t):
        """Newest sample in [t - 5m, t] (offset/@ move t); a stale marker hides it.
        Returns (Vector, per series the sample times)."""
        te = self._when(sel, t)
        out, stamps = [], []
        for s in self.select(sel):
            i = np.searchsorted(s.times, te, side="right") - 1
            cut = self._cut(s, t)
            if cut is not None:
                i = np.minimum(i, np.searchsorted(s.times, cut, side="left") - 1)
            ok = i >= 0
            ok[ok] = s.times[i[ok]] >= te[ok] - LOOKBACK_S
            if s.stale is not None and s.stale.size:
                j = np.searchsorted(s.stale, te, side="right") - 1
                marked = j >= 0
                marked[marked] = s.stale[j[marked]] > np.where(ok, s.times[np.maximum(i, 0)],
                                                               -np.inf)[marked]
                ok &= ~marked
            has = s.times.size > 0
            val = np.where(ok, s.values[np.maximum(i, 0)] if has else np.nan, np.nan)
            stamps.append(np.where(ok, s.times[np.maximum(i, 0)] if has else np.nan, np.nan))
            out.append((s.labels, val, ok))
        return Vector(out), stamps

    def _matrix(self, node, t) -> _Matrix:
        te = self._when(node, t)
        if isinstance(node, Selector):
            chosen = self.select(node)
            return _Matrix([(s.labels, s.times, s.values) for s in chosen], te, node.range_s,
                           [self._cut(s, t) for s in chosen], stored=True)
        # a subquery: the inner expression at the multiples of the step in the window
        step_ms = round((node.step_s or self.default_step_s) * 1000)
        rng_ms = round(node.range_s * 1000)
        te_ms = np.round(te * 1000).astype(np.int64)
        first = (te_ms.min() - rng_ms) // step_ms * step_ms
        if first < te_ms.min() - rng_ms:
            first += step_ms
        grid_ms = np.arange(first, te_ms.max() + 1, step_ms, dtype=np.int64)
        grid = grid_ms / 1000.0
        self._fails.append([np.zeros(grid.size, dtype=bool), None])
        try:
            inner = self._eval(node.expr, grid)
        finally:
            failed, msg = self._fails.pop()
        if failed.any():  # an instant whose window holds a failed step fails
            lo, hi = window(grid[failed], te, node.range_s)
            self._error(hi >= lo, *msg)
        series = [(lab, grid[ok], val[ok]) for lab, val, ok in inner.series if ok.any()]
        return _Matrix(series, te, node.range_s, [None] * len(series))

    def _binary(self, node: Binary, t):
        lhs, rhs = self._eval(node.lhs, t), self._eval(node.rhs, t)
        op = node.op
        if isinstance(lhs, np.ndarray) and isinstance(rhs, np.ndarray):
            value, keep = apply_op(op, lhs, rhs)
            return np.where(keep, 1.0, 0.0) if op in COMPARISON else value
        if isinstance(rhs, np.ndarray) or isinstance(lhs, np.ndarray):
            return self._unique(vector_scalar(node, lhs, rhs), node.pos)
        if op in SET_OPERATORS:
            return self._unique(set_operation(node, lhs, rhs), node.pos)
        return self._unique(self._vector_vector(node, lhs, rhs), node.pos)

    def _unique(self, v, pos: int):
        """Series with the same labels merged; present together, they fail the instant
        ("vector cannot contain metrics with the same labelset", as Prometheus)."""
        if not isinstance(v, Vector):
            return v
        merged: dict = {}
        for lab, val, ok in v.series:
            if lab in merged:
                pv, pok = merged[lab]
                self._error(pok & ok, "vector cannot contain metrics with the same labelset "
                            f"{format_labels(lab)}", pos)
                merged[lab] = (np.where(ok, val, pv), pok | ok)
            else:
                merged[lab] = (val, ok)
        if len(merged) == len(v.series):
            return v
        return Vector([(lab, val, ok) for lab, (val, ok) in merged.items()])

    def _vector_vector(self, node: Binary, lhs: Vector, rhs: Vector) -> Vector:
        """One-to-one, many-to-one (group_left) or one-to-many (group_right) matching on
        the signature (``on``/``ignoring``), as Prometheus' VectorBinop; a match it would
        refuse fails those instants."""
        swap = node.card == "one-to-many"
        many, one = (rhs, lhs) if swap else (lhs, rhs)
        side = "left" if swap else "right"
        ones: dict = {}
        for lab, val, ok in one.series:
            ones.setdefault(match_signature(lab, node), []).append((lab, val, ok))
        for sig, items in ones.items():
            if len(items) > 1:
                dup = np.sum([o for _, _, o in items], axis=0) > 1
                self._error(dup, "found duplicate series for the match group "
                            f"{label_set_text(sig)} on the {side} hand-side of the operation: "
                            "many-to-many matching not allowed: matching labels must be "
                            "unique on one side", node.pos)
        out, count = [], {}
        for lab, val, ok in many.series:
            sig = match_signature(lab, node)
            for olab, oval, ook in ones.get(sig, ()):
                both = ok & ook
                if not both.any():
                    continue
                vl, vr = (oval, val) if swap else (val, oval)
                value, keep = apply_op(node.op, vl, vr)
                if node.op in COMPARISON:
                    if node.bool_:
                        value, present = np.where(keep, 1.0, 0.0), both
                    else:
                        present = both & keep
                else:
                    present = both
                res = result_labels(lab, olab, node)
                key = sig if node.card == "one-to-one" else (sig, res)
                count[key] = count.get(key, 0) + present.astype(np.int64)
                out.append((res, np.where(present, value, np.nan), present))
        for key, n in count.items():
            if node.card == "one-to-one":
                self._error(n > 1, f"multiple matches for labels {label_set_text(key)}: "
                            "many-to-one matching must be explicit (group_left/group_right)",
                            node.pos)
            else:
                self._error(n > 1, "multiple matches for labels "
                            f"{label_set_text(key[0])}: grouping labels must ensure unique "
                            "matches", node.pos)
        return Vector(out)

    # -- functions
    def _call(self, node: Call, t):
        f, args = node.func, node.args
        if f in RANGE_FUNCTIONS or f in ("quantile_over_time", "predict_linear",
                                         "holt_winters"):
            m_arg = next(a for a in args if kind_of(a) == "matrix")
            scalars = [self._eval(a, t) for a in args if kind_of(a) == "scalar"]
            return self._range_function(node, self._eval(m_arg, t), scalars, t)
        if f == "time":
            return t.copy()
        if f == "pi":
            return np.full(t.size, np.pi)
        if f == "vector":
            return Vector([((), self._eval(args[0], t), np.ones(t.size, dtype=bool))])
        if f in DATE_FUNCTIONS and not args:
            return date_function(f, Vector([((), t.copy(), np.ones(t.size, dtype=bool))]))
        if f == "timestamp":
            if isinstance(args[0], Selector):
                v, stamps = self._instant(args[0], t)
                return Vector([(drop_name(lab), ts, ok)
                               for (lab, _, ok), ts in zip(v.series, stamps, strict=True)])
            v = self._eval(args[0], t)
            return Vector([(drop_name(lab), t.copy(), ok) for lab, _, ok in v.series])
        if f == "histogram_quantile":
            return histogram_quantile(self._eval(args[0], t), self._eval(args[1], t))
        v = self._eval(args[0], t)
        rest = [self._eval(a, t) for a in args[1:]]
        if f == "scalar":
            n = np.sum([ok for _, _, ok in v.series], axis=0) if v.series else np.zeros(t.size)
            out = np.full(t.size, np.nan)
            for _, val, ok in v.series:
                out = np.where(ok & (n == 1), val, out)
            return out
        if f == "absent":
            seen = np.zeros(t.size, dtype=bool)
            for _, _, ok in v.series:
                seen |= ok
            lab = absent_labels(args[0]) if isinstance(args[0], Selector) else ()
            return Vector([(lab, np.ones(t.size), ~seen)])
        if f in ("sort", "sort_desc"):
            return v  # an instant vector's order does not matter to rules
        if f == "label_replace":
            return label_replace(v, *rest)
        if f == "label_join":
            return label_join(v, rest[0], rest[1], rest[2:])
        if f in DATE_FUNCTIONS:
            return date_function(f, v)
        return Vector([(drop_name(lab), *fn.instant_function(f, val, ok, rest))
                       for lab, val, ok in v.series])

    def _range_function(self, node: Call, m: _Matrix, scalars: list, t):
        f = node.func
        te, rng = m.end, m.range_s
        out = []
        if f == "absent_over_time":
            seen = np.zeros(te.size, dtype=bool)
            for (_, times, _), cut in zip(m.series, m.cut, strict=True):
                lo, hi = window_bounds(times, te, rng, cut)
                seen |= hi >= lo
            arg = node.args[0]
            lab = absent_labels(arg) if isinstance(arg, Selector) else ()
            return Vector([(lab, np.ones(te.size), ~seen)])
        groups: dict = {}  # series sampled at the same instants share their windows
        for k, ((_, times, _), cut) in enumerate(zip(m.series, m.cut, strict=True)):
            groups.setdefault((id(times), id(cut)), []).append(k)
        done: dict = {}
        for ks in groups.values():
            times, cut = m.series[ks[0]][1], m.cut[ks[0]]
            lo, hi = window_bounds(times, te, rng, cut)
            if f in ("rate", "increase", "delta"):
                ok = hi - lo >= 1  # (v is NaN elsewhere already)
                for k, row in self._rates(f, m, ks, lo, hi):
                    done[k] = (row, ok.copy())
            elif f in ("deriv", "predict_linear"):
                ok = hi - lo >= 1
                for k, row in _regressions(f, m, ks, lo, hi, t, scalars):
                    done[k] = (np.where(ok, row, np.nan), ok.copy())
            else:
                for k in ks:
                    v, ok = self._window_function(node, f, m.series[k][1:], lo, hi, te,
                                                  scalars, t)
                    done[k] = (np.where(ok, v, np.nan), ok)
        for k, (labels, _, _) in enumerate(m.series):
            labels = labels if f == "last_over_time" else drop_name(labels)
            out.append((labels, *done[k]))
        return Vector(out)

    def _rates(self, f: str, m: _Matrix, ks: list, lo, hi):
        """(k, values) of rate/increase/delta for the matrix's series ``ks`` (sampled
        at the same instants), a block of series at a time.

        Why a second level of sharing: rules read one counter through near-identical
        selectors (``x{job="api"}`` and ``x{job="api",code=~"5.."}``, the same selector
        under ``sum by (job)`` and ``sum by (job, le)``), which :meth:`share` (by an
        expression's text) cannot see; a store series' window function at the same
        range and instants is the same whatever selected it, so the last few megabytes
        of them are kept (:data:`WINDOW_CACHE_BYTES`, oldest dropped first)."""
        te, rng = m.end, m.range_s
        keys = {}
        if m.stored:
            tkey = (te.size, float(te[0]) if te.size else 0.0, hash(te.tobytes()))
            cuts: dict = {}  # a late series' cut is the evaluation instants, which an offset
            for k in ks:    # or @ can make differ between two reads of the same window ends
                values, cut = m.series[k][2], m.cut[k]
                ckey = None if cut is None else cuts.setdefault(
                    id(cut), hash(np.asarray(cut, dtype=float).tobytes()))
                keys[k] = (id(values), f, rng, tkey, ckey)
        todo = []
        for k in ks:
            hit = self._windows.pop(keys[k], None) if keys else None
            if hit is None:
                todo.append(k)
            else:
                self._windows[keys[k]] = hit  # (now the newest)
                yield k, hit[1]
        for at in range(0, len(todo), _BLOCK):
            part = todo[at:at + _BLOCK]
            values = [m.series[k][2] for k in part]
            drops = [self._resets(v) for v in values] if m.stored and f != "delta" else None
            v = extrapolated_rate(m.series[part[0]][1], values, lo, hi, te, rng, f == "rate",
                                  f != "delta", drops)
            for k, row in zip(part, v, strict=True):
                if keys:
                    row = row.copy()  # (not a view keeping the whole block)
                    row.flags.writeable = False
                    self._windows[keys[k]] = (m.series[k][2], row)  # (holds the series)
                    self._window_bytes += row.nbytes
                yield k, row
        while self._window_bytes > WINDOW_CACHE_BYTES and self._windows:
            _, row = self._windows.pop(next(iter(self._windows)))
            self._window_bytes -= row.nbytes

    def _resets(self, values):
        """A store series' counter resets (:func:`counter_resets`), found once: rules read
        one counter at several ranges and through several selectors."""
        hit = self._drops.get(id(values))
        if hit is None or hit[0] is not values:
            hit = self._drops[id(values)] = (values, counter_resets([values])[0])
        return hit[1]

    def _window_function(self, node, f, series, lo, hi, te, scalars, t):
        """(values, present) of a range function but rate/increase/delta for one series."""
        times, values = series
        n = hi - lo + 1
        ok = n > 0
        if f in ("irate", "idelta"):
            v, ok = fn.instant_rate(times, values, lo, hi, f == "irate")
        elif f in ("sum_over_time", "avg_over_time"):
            v = fn.sum_count(values, lo, n, f == "avg_over_time")
        elif f == "count_over_time":
            v = n.astype(float)
        elif f == "present_over_time":
            v = np.ones(te.size)
        elif f == "last_over_time":
            v = values[np.clip(hi, 0, max(values.size - 1, 0))] if values.size else \
                np.full(te.size, np.nan)
        elif f in ("min_over_time", "max_over_time"):
            v = fn.reduce_window(values, lo, n, np.fmin if f == "min_over_time" else np.fmax)
        elif f in ("stddev_over_time", "stdvar_over_time"):
            v = fn.stdvar_over_time(values, lo, n)
            if f == "stddev_over_time":
                v = np.sqrt(v)
        elif f == "quantile_over_time":
            v = fn.quantile_window(values, lo, n, scalars[0])
        elif f in ("changes", "resets"):
            v = fn.changes(values, lo, hi, f == "resets")
        elif f == "holt_winters":
            sf, tf = scalars
            bad = ~((sf > 0) & (sf < 1)) | ~((tf > 0) & (tf < 1))
            self._error(bad, "invalid smoothing or trend factor in holt_winters(): "
                        "expected 0 < factor < 1", node.pos)
            v, ok = fn.holt_winters(values, lo, n, sf, tf), n >= 2
        else:
            raise AssertionError(f)
        return v, ok


def _regressions(f: str, m: _Matrix, ks: list, lo, hi, t, scalars):
    """(k, values) of ``deriv``/``predict_linear`` for the matrix's series ``ks``
    (sampled at the same instants), a block of series at a time."""
    times, n = m.series[ks[0]][1], hi - lo + 1
    if f == "deriv":  # x from the window's first sample
        at = times[np.clip(lo, 0, max(times.size - 1, 0))] if times.size else m.end
    else:
        at = t
    slope, icept = fn.regression(times, [m.series[k][2] for k in ks], lo, n, at, _BLOCK)
    rows = slope if f == "deriv" else slope * scalars[0] + icept
    yield from zip(ks, rows, strict=True)


def evaluate(expr, tsdb: TSDB, t_eval) -> Vector | np.ndarray:
    """Parse (if text) and evaluate over a TSDB at the instants ``t_eval``."""
    node = parse(expr) if isinstance(expr, str) else expr
    return Evaluator(store_from_tsdb(tsdb)).evaluate(node, t_eval)


def to_frame(result, t_eval):
    """A long polars table (time_s, labels, value) of an evaluation, for reading."""
    import polars as pl

    t = np.atleast_1d(np.asarray(t_eval, dtype=float))
    if isinstance(result, np.ndarray):
        return pl.DataFrame({"time_s": t, "labels": ["{}"] * t.size, "value": result})
    rows = {"time_s": [], "labels": [], "value": []}
    for lab, val, ok in result.series:
        idx = np.flatnonzero(ok)
        rows["time_s"] += t[idx].tolist()
        rows["labels"] += [format_labels(lab)] * idx.size
        rows["value"] += val[idx].tolist()
    return pl.DataFrame(rows, schema={"time_s": pl.Float64, "labels": pl.String,
                                      "value": pl.Float64}).sort("time_s", "labels")
