"""The long metrics schema as CSV, both ways."""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path

import polars as pl

from relakit.io import atomic_write
from relakit.traces._schema import (
    NUMBER_HINT,
    SCHEMA,
    Rows,
    parse_number,
    read_text,
    trace_error,
    validate_trace,
)

REQUIRED = ("time_s", "name", "value")
OPTIONAL = ("node", "tier", "outcome", "le", "instance")


def read_csv_long(path, instances: list[str] | None = None) -> pl.DataFrame:
    """Read a long-form metrics CSV into the long metrics schema.

    The header names at least ``time_s``, ``name`` and ``value``, and optionally
    ``node``, ``tier``, ``outcome``, ``le`` and ``instance``, in any order; other
    columns are ignored (dropped, like any label outside the schema). An empty
    cell is null, so an empty-string label cannot be told from a missing one.
    ``value`` may be ``NaN``, ``+Inf``/``inf``, ``-Inf``. The node of a row is
    its ``instance`` numbered (natural sort of the names, or the order of
    ``instances`` when given), else its ``node`` cell, else -1. Rows that
    coincide are added up, as in the other importers.

    Raises :class:`TraceError` naming the file, the line (1-based, the header
    is line 1) and the column, and what was expected there.
    """
    source = str(path)
    reader = csv.reader(io.StringIO(read_text(path)))
    try:
        header = next(reader, None)
        if header is None:
            raise trace_error(source, "line 1", "the file is empty; expected a header with "
                                                "time_s,name,value")
        header = [h.strip() for h in header]
        if header and header[0].startswith("\ufeff"):
            header[0] = header[0][1:]
        dup = sorted({h for h in header if header.count(h) > 1 and h})
        missing = [c for c in REQUIRED if c not in header]
        if dup or missing:
            problem = (f"column(s) {', '.join(dup)} appear twice" if dup else
                       f"missing column(s) {', '.join(missing)}")
            raise trace_error(source, "line 1", f"{problem}; expected a header with at least "
                                                f"{','.join(REQUIRED)} (optional: "
                                                f"{','.join(OPTIONAL)})")
        col = {h: i for i, h in enumerate(header)}
        rows = Rows(source)
        _read_records(reader, rows, col, len(header))
    except csv.Error as e:
        raise trace_error(source, f"line {reader.line_num}", f"malformed CSV ({e})") from None
    return rows.frame(instances)


def _read_records(reader, rows: Rows, col: dict[str, int], width: int) -> None:
    src = rows.source
    i_t, i_name, i_v = col["time_s"], col["name"], col["value"]
    i_node, i_inst = col.get("node"), col.get("instance")
    i_tier, i_out, i_le = col.get("tier"), col.get("outcome"), col.get("le")
    while True:
        line = reader.line_num + 1
        rec = next(reader, None)
        if rec is None:
            return
        if not rec:
            continue  # a blank line
        where = f"line {line}"
        if len(rec) != width:
            raise trace_error(src, where, f"has {len(rec)} field(s); expected {width}, "
                                          f"as in the header")
        try:
            t = parse_number(rec[i_t].strip())
            if not math.isfinite(t):
                raise ValueError
        except ValueError:
            raise trace_error(src, f"{where}, column time_s",
                              f"{rec[i_t]!r} is not a time; expected finite seconds") from None
        try:
            v = parse_number(rec[i_v].strip())
        except ValueError:
            raise trace_error(src, f"{where}, column value",
                              f"{rec[i_v]!r} is not a number; expected {NUMBER_HINT}") from None
        name = rec[i_name].strip()
        if not name:
            raise trace_error(src, f"{where}, column name", "is empty; expected a metric name")
        inst = rec[i_inst] if i_inst is not None and rec[i_inst] != "" else None
        node = None
        if inst is None and i_node is not None and rec[i_node].strip() != "":
            try:
                node = int(rec[i_node])
            except ValueError:
                node = None
            if node is None or node < -1:
                raise trace_error(src, f"{where}, column node",
                                  f"{rec[i_node]!r} is not a node; expected an integer >= -1 "
                                  f"(or an empty cell)")
        le = None
        if i_le is not None and rec[i_le] != "":
            le = rows.le_label(rec[i_le].strip(), f"{where}, column le")
        rows.add(t, v, name=name, instance=inst, node=node,
                 tier=_cell(rec, i_tier), outcome=_cell(rec, i_out), le=le, where=where)


def _cell(rec: list[str], i: int | None) -> str | None:
    if i is None or rec[i] == "":
        return None
    return rec[i]


def write_csv_long(df: pl.DataFrame, path) -> Path:
    """Write a long metrics frame as CSV, the inverse of :func:`read_csv_long`.

    The frame is validated (and normalised) first; columns are written in schema
    order, nulls as empty cells. The file is written under a temporary name in
    the same folder and renamed into place, so a reader never sees half of it.
    Returns the path written.
    """
    out = validate_trace(df, source=f"<frame for {path}>")
    return atomic_write(path, lambda tmp: out.select(list(SCHEMA)).write_csv(tmp))
