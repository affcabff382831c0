"""Prometheus HTTP API query results (JSON) -> the long metrics schema."""

from __future__ import annotations

import json
import math

import polars as pl

from relakit.traces._schema import (
    NUMBER_HINT,
    Rows,
    label_text,
    parse_number,
    parse_numbers,
    read_text,
    trace_error,
)

_RANGE_HINT = ("a range query (/api/v1/query_range) or an instant query of a range selector "
               "such as requests_total[5m]")


def read_prometheus_json(path, instances: list[str] | None = None) -> pl.DataFrame:
    """Read the JSON body of a Prometheus range query into the long metrics schema.

    ``path`` holds ``{"status": "success", "data": {"resultType": "matrix",
    "result": [{"metric": {...}, "values": [[<unix s>, "<value>"], ...]}, ...]}}``
    as ``/api/v1/query_range`` (or ``/api/v1/query`` of a range selector) returns
    it, or a JSON array of such bodies (several queries saved into one file).

    Labels: ``__name__`` becomes ``name``; ``tier``, ``outcome`` and ``le`` keep
    their columns (``le`` normalised, ``"1.0"`` -> ``"1"``); ``instance`` is
    numbered into ``node`` (natural sort of the names, or the order of
    ``instances`` when given); a ``node`` label is used as the index directly
    when there is no ``instance``; a series with neither gets node -1. ``job``
    and every other label are kept in the ``labels`` column (dictionary-encoded,
    see :data:`relakit.traces.LABELS`), so rules that select on them select as
    Prometheus would; the same series in two bodies (overlapping queries) counts
    once. Summary quantile
    series (a ``quantile`` label) are skipped; their ``_sum``/``_count`` stay.
    Values may be ``"NaN"``, ``"+Inf"``, ``"-Inf"``.

    Raises :class:`TraceError` naming the file and the JSON path, e.g.
    ``data.result[3].values[7]``: a status other than success (with
    Prometheus' error message), a result type other than matrix, a missing key,
    a series without ``__name__``, a value that is not a number.
    """
    source = str(path)
    text = read_text(path)
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise trace_error(source, f"line {e.lineno}, column {e.colno}",
                          f"invalid JSON ({e.msg}); expected a Prometheus query result") from None
    return parse_prometheus_json(doc, source, instances)


def parse_prometheus_json(doc, source: str = "<prometheus>",
                          instances: list[str] | None = None) -> pl.DataFrame:
    """The same, from an already decoded body (what an HTTP client returns)."""
    rows = Rows(source)
    if isinstance(doc, list):
        if not doc:
            raise trace_error(source, "top level", "is an empty array; expected one or more "
                                                   "Prometheus query results")
        for i, body in enumerate(doc):
            _read_body(rows, body, f"[{i}]")
    else:
        _read_body(rows, doc, "")
    return rows.frame(instances)


def _at(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix and not key.startswith("[") else prefix + key


def _get(rows: Rows, obj: dict, key: str, prefix: str, expected: str, kind=None):
    if key not in obj:
        raise trace_error(rows.source, prefix or "top level",
                          f"missing key {key!r}; expected {expected}")
    val = obj[key]
    if kind is not None and not isinstance(val, kind):
        raise trace_error(rows.source, _at(prefix, key),
                          f"is {_json_kind(val)}; expected {expected}")
    return val


def _json_kind(v) -> str:
    if v is None:
        return "null"
    return {bool: "a boolean", int: "a number", float: "a number", str: f"the string {v!r}",
            list: "an array", dict: "an object"}.get(type(v), type(v).__name__)


def _read_body(rows: Rows, body, prefix: str) -> None:
    src = rows.source
    if not isinstance(body, dict):
        raise trace_error(src, prefix or "top level",
                          f"is {_json_kind(body)}; expected a Prometheus query result object "
                          '{"status": ..., "data": ...}')
    status = _get(rows, body, "status", prefix, '"success"')
    if status != "success":
        detail = ""
        if body.get("error") is not None:
            kind = body.get("errorType")
            detail = f" ({kind}: {body['error']})" if kind else f" ({body['error']})"
        raise trace_error(src, _at(prefix, "status"),
                          f"is {status!r}{detail}; expected 'success'")
    data = _get(rows, body, "data", prefix, "an object with resultType and result", dict)
    p_data = _at(prefix, "data")
    rtype = _get(rows, data, "resultType", p_data, "'matrix'")
    if rtype != "matrix":
        raise trace_error(src, _at(p_data, "resultType"),
                          f"is {rtype!r}; expected 'matrix' ({_RANGE_HINT})")
    result = _get(rows, data, "result", p_data, "an array of series", list)
    for k, series in enumerate(result):
        _read_series(rows, series, _at(p_data, f"result[{k}]"))


def _read_series(rows: Rows, series, p: str) -> None:
    src = rows.source
    if not isinstance(series, dict):
        raise trace_error(src, p, f"is {_json_kind(series)}; expected an object with "
                                  f"metric and values")
    metric = _get(rows, series, "metric", p, "an object of labels", dict)
    p_metric = _at(p, "metric")
    for key, val in metric.items():
        if not isinstance(val, str):
            raise trace_error(src, _at(p_metric, key),
                              f"is {_json_kind(val)}; expected a string label value")
    if "" in metric.values():  # an empty label is no label, in Prometheus
        metric = {key: val for key, val in metric.items() if val}
    if "values" not in series and ("histograms" in series or "histogram" in series):
        raise trace_error(src, p, "holds a native histogram; expected float samples in "
                                  "'values' (query the classic _bucket, _sum, _count series)")
    values = _get(rows, series, "values", p, "an array of [<unix s>, \"<value>\"] pairs", list)
    name = metric.get("__name__")
    if not name:
        raise trace_error(src, p_metric,
                          "has no __name__; expected the metric name (functions such as rate() "
                          "or sum() drop it: query the raw series, or set it with label_replace)")
    if "quantile" in metric:
        return  # a summary quantile: no place in the schema
    instance = metric.get("instance")
    node = None
    if instance is None and "node" in metric:
        try:
            node = int(metric["node"])
        except ValueError:
            node = None
        if node is None or node < -1:
            raise trace_error(src, _at(p_metric, "node"),
                              f"is {metric['node']!r}; expected an integer node index >= -1")
    le = rows.le_label(metric.get("le"), _at(p_metric, "le"))
    p_values = _at(p, "values")
    fast = _fast_values(values)
    times, vals = fast if fast is not None else _slow_values(src, values, p_values)
    other = {k: v for k, v in metric.items()
             if k not in ("__name__", "instance", "tier", "outcome", "le")
             and not (k == "node" and instance is None)}
    rows.add_series(times, vals, name=name, instance=instance, node=node,
                    tier=metric.get("tier"), outcome=metric.get("outcome"), le=le,
                    where=p_metric, key=tuple(sorted(metric.items())),
                    labels=label_text(other))


def _fast_values(values: list) -> tuple[list[float], list[float]] | None:
    """All the pairs at C speed, or None if any is odd (then :func:`_slow_values` says which)."""
    try:
        times = [t for t, _ in values]
        raws = [v for _, v in values]
    except (TypeError, ValueError):
        return None
    if not set(map(type, times)) <= {int, float}:
        return None
    vals = parse_numbers(raws)
    if vals is None:
        return None
    times = list(map(float, times))
    if not all(map(math.isfinite, times)):
        return None
    return times, vals


def _slow_values(src: str, values: list, p_values: str) -> tuple[list[float], list[float]]:
    times: list[float] = []
    vals: list[float] = []
    for j, pair in enumerate(values):
        try:
            ts, raw = pair
            if isinstance(ts, bool) or not isinstance(ts, int | float) or not math.isfinite(ts):
                raise TypeError
            if isinstance(raw, str):
                v = parse_number(raw)
            elif isinstance(raw, int | float) and not isinstance(raw, bool):
                v = float(raw)
            else:
                raise ValueError(raw)
        except (TypeError, ValueError):
            raise trace_error(src, f"{p_values}[{j}]", _bad_pair(pair)) from None
        times.append(float(ts))
        vals.append(v)
    return times, vals


def _bad_pair(pair) -> str:
    if not isinstance(pair, list) or len(pair) != 2:
        return f"is {json.dumps(pair)}; expected a [<unix seconds>, \"<value>\"] pair"
    ts, raw = pair
    if isinstance(ts, bool) or not isinstance(ts, int | float) or not math.isfinite(ts):
        return f"has timestamp {json.dumps(ts)}; expected finite Unix seconds (a number)"
    return f"has value {json.dumps(raw)}; expected {NUMBER_HINT} as a string"
