"""Pick the importer for a recorded trace by its suffix, or failing that its content."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from relakit.traces._csvlong import read_csv_long
from relakit.traces._names import kind_by_content, kind_by_suffix
from relakit.traces._openmetrics import read_openmetrics
from relakit.traces._promjson import read_prometheus_json
from relakit.traces._schema import trace_error, validate_trace

_FORMATS = ("expected a .json Prometheus query result, a .csv long table, a .parquet long "
            "table, .prom/.om/.txt snapshots or a directory of them")


def read_trace(path, instances: list[str] | None = None) -> pl.DataFrame:
    """Read a recorded trace into the long metrics schema, whatever its format.

    By suffix: ``.json`` -> :func:`read_prometheus_json`; ``.csv`` ->
    :func:`read_csv_long`; a directory or ``.prom``/``.om``/``.txt`` ->
    :func:`read_openmetrics`; ``.parquet`` -> read and checked with
    :func:`validate_trace` (its nodes are already numbered, so ``instances``
    does not apply). Any other suffix is told by the content: the Parquet magic
    bytes, a leading ``{`` or ``[`` (JSON), a header line with ``time_s`` and a
    comma (CSV), else a ``#`` line or a sample (text exposition).
    """
    p = Path(path)
    if p.is_dir():
        return read_openmetrics(p, instances)
    kind = kind_by_suffix(p) or _sniff(p)
    if kind == "json":
        return read_prometheus_json(p, instances)
    if kind == "csv":
        return read_csv_long(p, instances)
    if kind == "text":
        return read_openmetrics(p, instances)
    try:
        df = pl.read_parquet(p)
    except FileNotFoundError:
        raise trace_error(p, None, "no such file; " + _FORMATS) from None
    except Exception as e:  # polars raises several kinds for a damaged file
        raise trace_error(p, None, f"cannot read as Parquet ({e}); expected a Parquet file "
                                   f"with the long metrics columns") from None
    return validate_trace(df, source=str(p))


def _sniff(p: Path) -> str:
    try:
        with open(p, "rb") as fh:
            head = fh.read(4096)
    except OSError as e:
        raise trace_error(p, None, f"cannot read: {e.strerror or e}") from None
    kind = kind_by_content(head)
    if kind is None:
        raise trace_error(p, None, "cannot tell the format from the suffix or content; "
                          + _FORMATS)
    return kind
