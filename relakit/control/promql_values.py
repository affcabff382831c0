"""PromQL's values and what operators do to them: instant vectors over many instants,
label matching, binary operators with their vector matching, set operators,
aggregations, and the label and histogram functions.

Why apart from the evaluator (:mod:`relakit.control.promql`): these are pure
functions of values (a :class:`Vector` in, a :class:`Vector` out), Prometheus'
``VectorBinop``/``aggregation``/``funcLabelReplace`` rewritten over a whole vector
of instants; the evaluator walks the tree and decides which to call. What a
function of a window computes is :mod:`relakit.control.promql_functions`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from relakit.control import promql_functions as fn
from relakit.control.promql_parse import (
    COMPARISON,
    Aggregate,
    Binary,
    Selector,
    compiled_regex,
)
from relakit.control.tsdb import bucket_quantile


@dataclass
class Vector:
    """An instant vector at T instants: per series, labels, values (T,) and presence (T,)."""

    series: list  # [(labels tuple, values, present)]


def date_function(f: str, v: Vector) -> Vector:
    return Vector([(drop_name(lab), fn.date_field(f, val), ok) for lab, val, ok in v.series])


def _go_expand(template: str, m: re.Match) -> str:
    """Go's Regexp.ExpandString: ``$1``, ``${1}``, ``$name``, ``${name}``, ``$$``; an
    unknown group is empty."""
    def group(name: str) -> str:
        try:
            g = m.group(int(name)) if name.isdigit() else m.group(name)
        except IndexError:  # no such group
            return ""
        return g or ""

    def sub(x: re.Match) -> str:
        if x.group(0) == "$$":
            return "$"
        return group(x.group(1) or x.group(2))

    return re.sub(r"\$\$|\$\{(\w+)\}|\$(\w+)", sub, template)


def _set_label(labels: tuple, key: str, value: str) -> tuple:
    d = dict(labels)
    if value:
        d[key] = value
    else:
        d.pop(key, None)
    return tuple(sorted(d.items()))


def label_replace(v: Vector, dst: str, repl: str, src: str, regex: str) -> Vector:
    pattern = compiled_regex(regex)
    out = []
    for lab, val, ok in v.series:
        m = pattern.fullmatch(dict(lab).get(src, ""))
        out.append((lab if m is None else _set_label(lab, dst, _go_expand(repl, m)), val, ok))
    return Vector(out)


def label_join(v: Vector, dst: str, sep: str, srcs) -> Vector:
    out = []
    for lab, val, ok in v.series:
        d = dict(lab)
        out.append((_set_label(lab, dst, sep.join(d.get(s, "") for s in srcs)), val, ok))
    return Vector(out)


def absent_labels(sel: Selector) -> tuple:
    """The labels ``absent`` gives: the selector's equality matchers, except a label
    matched twice or otherwise (Prometheus' createLabelsForAbsentFunction)."""
    d, drop = {}, set()
    for k, op, v in sel.matchers:
        if k == "__name__":
            continue
        if op == "=" and k not in d:
            d[k] = v
        else:
            drop.add(k)
    return tuple(sorted((k, v) for k, v in d.items() if k not in drop))


_GO_SPECIAL = {"inf": np.inf, "+inf": np.inf, "-inf": -np.inf, "infinity": np.inf,
               "+infinity": np.inf, "-infinity": -np.inf, "nan": np.nan}


_GO_DIGITS = r"\d(?:_?\d)*"  # digits, "_" only between two of them (Go's underscoreOK)
_GO_DECIMAL = re.compile(rf"[+-]?(?:{_GO_DIGITS}\.?(?:{_GO_DIGITS})?|\.{_GO_DIGITS})"
                         rf"(?:[eE][+-]?{_GO_DIGITS})?")
_GO_HEX = re.compile(r"[+-]?0[xX](?:(?:_?[0-9a-fA-F])+(?:\.[0-9a-fA-F]*)?|_?\.[0-9a-fA-F]+)"
                     r"[pP][+-]?\d+")  # a hexadecimal float needs its exponent


def go_parse_float(text: str) -> float | None:
    """A float as Go's strconv.ParseFloat reads it, None where it refuses: no spaces
    around it (Python's float strips them), hexadecimal only with a ``p`` exponent
    (``0x1p-1``; Python's float refuses it), ``Inf``/``Infinity``/``NaN`` in any case,
    signed infinities but no signed NaN. (An ``le`` Go cannot read is not a bucket.)"""
    special = _GO_SPECIAL.get(text.lower())
    if special is not None:
        return special
    if _GO_DECIMAL.fullmatch(text):
        return float(text)
    if _GO_HEX.fullmatch(text):
        return float.fromhex(text.replace("_", ""))
    return None


def histogram_quantile(q: np.ndarray, v: Vector) -> Vector:
    """Per group of series equal but for ``le``: Prometheus' bucketQuantile at each instant.

    As Prometheus 2.42: a group is the series' labels but ``le`` (two metric names are two
    groups, whose results then clash), buckets with the same bound add up however ``le``
    is spelt ("1", "1.0", "1e0": coalesceBuckets), in order of the bound; a NaN count is a
    sample, not a missing bucket (tests/test_promql_edges.py)."""
    groups: dict = {}
    for lab, val, ok in v.series:
        d = dict(lab)
        le = go_parse_float(d.pop("le")) if "le" in d else None
        if le is None:
            continue  # Prometheus ignores series without a usable le
        groups.setdefault(tuple(sorted(d.items())), []).append((le, val, ok))
    out = []
    for key, buckets in groups.items():
        key = drop_name(key)
        les = np.array([b[0] for b in buckets])
        vals = np.column_stack([b[1] for b in buckets])
        oks = np.column_stack([b[2] for b in buckets])
        present = oks.any(axis=1)
        res = np.full(q.size, np.nan)
        seen = oks[present]
        if seen.shape[0] and (seen == seen[0]).all():  # one pattern: no sort of the rows
            patterns = seen[:1]
        else:
            patterns = np.unique(seen, axis=0)
        for pat in patterns:  # usually one: every bucket present together
            cols = np.flatnonzero(pat)
            rows = present & (oks == pat).all(axis=1)
            cols = cols[np.argsort(les[cols], kind="stable")]  # by bound (sort.Sort)
            bounds, first = np.unique(les[cols], return_index=True)
            # buckets with the same bound add up, left to right (coalesceBuckets)
            counts = np.add.reduceat(vals[np.ix_(rows, cols)], first, axis=1) if (
                first.size < cols.size) else vals[np.ix_(rows, cols)]
            for qv in np.unique(q[rows]):
                sub = rows & (q == qv)
                if np.isnan(qv):
                    res[sub] = np.nan
                elif qv < 0 or qv > 1:
                    res[sub] = -np.inf if qv < 0 else np.inf
                else:
                    res[sub] = bucket_quantile(qv, bounds, counts[(q[rows] == qv)],
                                               nan_is_missing=False)
        out.append((key, res, present))
    return Vector(out)


# ---- operators ----------------------------------------------------------------------------
# the operators whose result drops the metric name (2.42's shouldDropMetricName): not
# atan2, whose result keeps it (tests/test_promql_edges.py)
DROPS_NAME = ("+", "-", "*", "/", "%", "^")


def apply_op(op: str, a, b):
    """(value, keep): the arithmetic result, or the comparison's truth with a's value."""
    with np.errstate(all="ignore"):
        if op == "+":
            return a + b, None
        if op == "-":
            return a - b, None
        if op == "*":
            return a * b, None
        if op == "/":
            return a / b, None
        if op == "%":
            return np.fmod(a, b), None
        if op == "^":
            return np.power(a, b), None
        if op == "atan2":
            return np.arctan2(a, b), None
        keep = {"==": np.equal, "!=": np.not_equal, ">": np.greater, "<": np.less,
                ">=": np.greater_equal, "<=": np.less_equal}[op](a, b)
        return a, keep


def drop_name(labels: tuple) -> tuple:
    if labels and labels[0][0] == "__name__":  # sorted: first unless a name sorts before it
        return tuple(labels[1:])  # (a label set names each label once)
    return tuple(kv for kv in labels if kv[0] != "__name__")


def label_set_text(labels: tuple) -> str:
    """A label set as Prometheus prints it in a match error (``{}`` when empty)."""
    return format_labels(labels) if labels else "{}"


def vector_scalar(node: Binary, lhs, rhs) -> Vector:
    swap = isinstance(lhs, np.ndarray)
    vec, scalar = (rhs, lhs) if swap else (lhs, rhs)
    out = []
    for lab, val, ok in vec.series:
        a, b = (scalar, val) if swap else (val, scalar)
        value, keep = apply_op(node.op, a, b)
        if node.op in COMPARISON:
            value = val  # a filter keeps the vector's own value, whichever side it is on
            if node.bool_:
                value, keep = np.where(keep, 1.0, 0.0), np.ones_like(keep)
            present = ok & keep
            lab = drop_name(lab) if node.bool_ else lab
        else:
            present, lab = ok, drop_name(lab) if node.op in DROPS_NAME else lab
        out.append((lab, np.where(present, value, np.nan), present))
    return Vector(out)


def match_signature(labels: tuple, node: Binary) -> tuple:
    if node.on is not None:
        return tuple(kv for kv in labels if kv[0] in node.on)
    return tuple(kv for kv in labels if kv[0] != "__name__" and kv[0] not in node.ignoring)


def result_labels(many: tuple, one: tuple, node: Binary) -> tuple:
    """Prometheus' resultMetric: the "many" side's labels, name dropped by arithmetic
    and ``bool``, reduced to the matching labels one-to-one, ``group_x`` labels copied."""
    res = many
    if node.op in DROPS_NAME or node.bool_:
        res = drop_name(res)
    if node.card == "one-to-one":
        if node.on is not None:
            res = tuple(kv for kv in res if kv[0] in node.on)
        else:
            res = tuple(kv for kv in res if kv[0] not in node.ignoring)
    for key in node.include:
        res = _set_label(res, key, dict(one).get(key, ""))
    return res


def set_operation(node: Binary, lhs: Vector, rhs: Vector) -> Vector:
    """``and``/``or``/``unless`` per instant, on the matching signature (``or`` without
    on/ignoring: every label but the name), as VectorAnd/VectorOr/VectorUnless."""
    def presence(v: Vector) -> dict:
        seen: dict = {}
        for lab, _, ok in v.series:
            sig = match_signature(lab, node)
            seen[sig] = seen[sig] | ok if sig in seen else ok
        return seen

    if node.op in ("and", "unless"):
        right = presence(rhs)
        out = []
        for lab, val, ok in lhs.series:
            there = right.get(match_signature(lab, node), np.zeros_like(ok))
            keep = ok & there if node.op == "and" else ok & ~there
            out.append((lab, np.where(keep, val, np.nan), keep))
        return Vector(out)
    left = presence(lhs)
    out = list(lhs.series)
    for lab, val, ok in rhs.series:
        keep = ok & ~left.get(match_signature(lab, node), np.zeros_like(ok))
        out.append((lab, np.where(keep, val, np.nan), keep))
    return Vector(out)


def _format_value(v: float) -> str:
    """A float as Go's strconv.FormatFloat(v, 'f', -1, 64) writes it (count_values)."""
    if np.isnan(v):
        return "NaN"
    if np.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return np.format_float_positional(v, trim="-")


def aggregate(node: Aggregate, v: Vector, param, n_t: int) -> Vector:
    groups: dict = {}
    for lab, val, ok in v.series:
        if node.without:
            key = tuple(kv for kv in lab if kv[0] != "__name__" and kv[0] not in node.labels)
        else:
            key = tuple(kv for kv in lab if kv[0] in node.labels)
        groups.setdefault(key, []).append((lab, val, ok))
    out = []
    for key, items in groups.items():
        items.sort(key=lambda i: i[0])  # Prometheus adds in its series order: sorted labels
        vals = np.vstack([i[1] for i in items])
        oks = np.vstack([i[2] for i in items])
        n = oks.sum(axis=0)
        present = n > 0
        op = node.op
        if op in ("topk", "bottomk"):
            out += _topk(items, vals, oks, param, op == "topk")
            continue
        if op == "count_values":
            out += _count_values(key, vals, oks, param)
            continue
        with np.errstate(all="ignore"):
            if op == "count":
                value = n.astype(float)
            elif op == "group":
                value = np.ones(n_t)
            elif op in ("sum", "avg"):
                value = fn.sequential(vals, oks, op == "avg")
            elif op in ("stddev", "stdvar"):
                value = fn.welford(vals, oks)
                value = np.sqrt(value) if op == "stddev" else value
            elif op == "quantile":
                order = np.argsort(~oks, axis=0, kind="stable")  # present values first
                rows = np.take_along_axis(vals, order, axis=0).T
                value = fn.go_quantile(rows, n, param)
            else:
                masked = np.where(oks, vals, np.nan)
                reduce = np.fmin if op == "min" else np.fmax  # NaN only if all are NaN
                value = reduce.reduce(masked, axis=0)
        out.append((key, np.where(present, value, np.nan), present))
    return Vector(out)


def _topk(items, vals, oks, param, top: bool) -> list:
    """The k largest (smallest) present values of the group per instant; NaN ranks last
    for both, as Prometheus' heaps do."""
    k = np.nan_to_num(np.asarray(param, dtype=float), nan=0.0)
    k = np.trunc(np.clip(k, -1e18, 1e18))
    key = np.where(np.isnan(vals), np.inf, -vals if top else vals)
    key = np.where(oks, key, np.nan)  # absent: after everything
    rank = np.argsort(np.argsort(key, axis=0, kind="stable"), axis=0, kind="stable")
    keep = oks & (rank < k[None, :]) & (k[None, :] >= 1)
    return [(lab, np.where(kp, val, np.nan), kp)
            for (lab, val, _), kp in zip(items, keep, strict=True) if kp.any()]


def _count_values(key: tuple, vals, oks, label: str) -> list:
    """One series per distinct value: the group's labels plus ``label`` = the value."""
    out = []
    present_vals = vals[oks]
    if present_vals.size == 0:
        return out
    texts = {}
    # NaN once (np.unique keeps NaNs apart: merge); -0.0 apart from 0.0 ("-0" and "0",
    # as Go's FormatFloat writes them; np.unique holds one zero)
    zeros = [np.copysign(0.0, -1.0 if neg else 1.0)
             for neg in np.unique(np.signbit(present_vals[present_vals == 0]))]
    for x in [*np.unique(present_vals[present_vals != 0]), *zeros]:
        texts.setdefault(_format_value(float(x)), []).append(x)
    for text, xs in texts.items():
        hit = np.zeros_like(oks)
        for x in xs:
            hit |= oks & (((vals == x) & (np.signbit(vals) == np.signbit(x)))
                          | (np.isnan(vals) & np.isnan(x)))
        n = hit.sum(axis=0)
        out.append((_set_label(key, label, text), n.astype(float), n > 0))
    return out


def format_labels(labels) -> str:
    """``{a="x", b="y"}`` with ``__name__`` first written as the metric name, as Prometheus."""
    d = dict(labels)
    name = d.pop("__name__", "")
    body = ", ".join(f'{k}="{_escape(v)}"' for k, v in sorted(d.items()))
    return f"{name}{{{body}}}"


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
