"""Recorded Prometheus metrics -> relakit's one long metrics schema.

Every importer returns a polars DataFrame with exactly these columns, sorted by
``time_s``, ``node``, ``name`` (then bucket bound):

=========  =======  ==========================================================
column     dtype    meaning
=========  =======  ==========================================================
time_s     Float64  seconds; Unix seconds for recorded data
node       Int32    the scrape target's index; -1 for series with no instance
name       String   the metric name; ``X_bucket``, ``X_sum``, ``X_count`` kept
tier       String   the ``tier`` label, or null
outcome    String   the ``outcome`` label, or null
le         String   a histogram bucket bound as Prometheus writes it ("0.005",
                    "1", "+Inf"), or null
value      Float64  the sample; NaN and +/-Inf kept
=========  =======  ==========================================================

This is the frame the simulator writes (``SimulationResult.metrics``), so
recorded and simulated runs go through the same analysis.

Labels: ``__name__`` becomes ``name``; ``tier``, ``outcome``, ``le`` keep
their columns; ``instance`` is turned into ``node``: the instances are put in
natural order ("host:9102" < "host:9110", "node-2" < "node-10") and numbered
0..n-1, unless ``instances=[...]`` fixes the order; a ``node`` label is used
directly when there is no instance. ``job`` and every other label are kept in
an optional ``labels`` column after these (:data:`LABELS`: one dictionary-encoded
text per label set), so rules select on them as Prometheus would; one series
given twice (overlapping queries, repeated snapshots) counts once. Summary quantile series and
``*_created`` series are skipped.

Problems in the input raise :class:`TraceError`, a ``ValueError`` whose message
names the file, the place in it (line, column, JSON path such as
``data.result[3].values[7]``) and what was expected.
"""

_NAMES = {  # name: the module defining it, imported when the name is first asked for
    "read_csv_long": "_csvlong", "write_csv_long": "_csvlong", "read_trace": "_dispatch",
    "read_openmetrics": "_openmetrics", "parse_prometheus_json": "_promjson",
    "read_prometheus_json": "_promjson", "COLUMNS": "_names", "LABELS": "_names",
    "is_parquet": "_names", "parse_label_text": "_names", "parse_number": "_names",
    "SCHEMA": "_schema", "TraceError": "_schema", "label_text": "_schema",
    "natural_key": "_schema", "validate_trace": "_schema", "SHAPES": "synthetic",
    "shape_level": "synthetic", "synthetic_trace": "synthetic",
}


def __getattr__(name: str):
    """The package's names, each imported when first asked for (PEP 562): reading a
    Parquet trace for ``replay --rules`` needs only :mod:`relakit.traces._names` and
    never loads polars, which every importer imports (~0.13 s of a fresh process)."""
    from importlib import import_module

    if name not in _NAMES:
        raise AttributeError(f"module 'relakit.traces' has no attribute {name!r}")
    value = getattr(import_module(f"relakit.traces.{_NAMES[name]}"), name)
    globals()[name] = value
    return value


__all__ = sorted(_NAMES)  # every name, each defined where _NAMES says
