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
directly when there is no instance. ``job`` is read but not kept. EVERY OTHER
LABEL IS DROPPED, and series that differ only in dropped labels are added up
(as ``sum without (...)`` would); one series given twice (overlapping
queries, repeated snapshots) counts once. Summary quantile series and
``*_created`` series are skipped.

Problems in the input raise :class:`TraceError`, a ``ValueError`` whose message
names the file, the place in it (line, column, JSON path such as
``data.result[3].values[7]``) and what was expected.
"""

from relakit.traces._csvlong import read_csv_long, write_csv_long
from relakit.traces._dispatch import is_parquet, read_trace
from relakit.traces._openmetrics import read_openmetrics
from relakit.traces._promjson import parse_prometheus_json, read_prometheus_json
from relakit.traces._schema import (
    LABELS,
    SCHEMA,
    TraceError,
    label_text,
    natural_key,
    parse_label_text,
    parse_number,
    validate_trace,
)
from relakit.traces.synthetic import SHAPES, shape_level, synthetic_trace  # noqa: E402

__all__ = [
    "LABELS",
    "SCHEMA",
    "SHAPES",
    "TraceError",
    "is_parquet",
    "label_text",
    "natural_key",
    "parse_label_text",
    "parse_number",
    "parse_prometheus_json",
    "read_csv_long",
    "read_openmetrics",
    "read_prometheus_json",
    "read_trace",
    "shape_level",
    "synthetic_trace",
    "validate_trace",
    "write_csv_long",
]
