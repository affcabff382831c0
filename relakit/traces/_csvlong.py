"""The long metrics schema as CSV, both ways."""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path

import polars as pl

from relakit.io import atomic_write
from relakit.traces._schema import (
    LABELS,
    NUMBER_HINT,
    NUMBER_PATTERN,
    Rows,
    TraceError,
    assemble,
    canonical_labels,
    columns_of,
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
    ``node``, ``tier``, ``outcome``, ``le``, ``instance`` and ``labels`` (the other
    labels of the series, ``job="api",mode="user"``), in any order; other columns
    are ignored (dropped). An empty
    cell is null, so an empty-string label cannot be told from a missing one.
    ``value`` may be ``NaN``, ``+Inf``/``inf``, ``-Inf``. The node of a row is
    its ``instance`` numbered (natural sort of the names, or the order of
    ``instances`` when given), else its ``node`` cell, else -1. Rows that differ
    only in ignored columns are added up; a row repeated exactly counts once.
    Plain files (no quotes) are read at polars speed; anything unusual is read
    row by row, so that an error can name its line.

    Raises :class:`TraceError` naming the file, the line (1-based, the header
    is line 1) and the column, and what was expected there.
    """
    source = str(path)
    text = read_text(path)
    col, width = _read_header(source, text)
    fast = _read_fast(source, text, col, width, instances)
    if fast is not None:
        return fast
    rows = Rows(source)  # something is odd: go row by row, to say where
    reader = csv.reader(io.StringIO(text))
    try:
        next(reader)
        _read_records(reader, rows, col, width)
    except csv.Error as e:
        raise trace_error(source, f"line {reader.line_num}", f"malformed CSV ({e})") from None
    return rows.frame(instances)


def _read_header(source: str, text: str) -> tuple[dict[str, int], int]:
    reader = csv.reader(io.StringIO(text))
    try:
        header = next(reader, None)
    except csv.Error as e:
        raise trace_error(source, "line 1", f"malformed CSV header ({e})") from None
    if header is None:
        raise trace_error(source, "line 1", "the file is empty; expected a header with "
                                            "time_s,name,value")
    header = [h.strip() for h in header]
    dup = sorted({h for h in header if header.count(h) > 1 and h})
    missing = [c for c in REQUIRED if c not in header]
    if dup or missing:
        problem = (f"column(s) {', '.join(dup)} appear twice" if dup else
                   f"missing column(s) {', '.join(missing)}")
        raise trace_error(source, "line 1", f"{problem}; expected a header with at least "
                                            f"{','.join(REQUIRED)} (optional: "
                                            f"{','.join(OPTIONAL)})")
    return {h: i for i, h in enumerate(header)}, len(header)


_NUMBER_RE = f"^(?:{NUMBER_PATTERN})$"


def _read_fast(source: str, text: str, col: dict[str, int], width: int,
               instances) -> pl.DataFrame | None:
    """The whole file at once with polars, or None at the first oddity.

    Only plain files qualify (no quotes, no lone carriage returns), where
    polars splits lines and fields exactly as :mod:`csv` does; then every cell
    is checked as the row-by-row reader would, and anything it might word
    differently (or reject) sends the file to it instead.
    """
    if '"' in text or text.count("\r") != text.count("\r\n"):
        return None
    try:
        raw = pl.read_csv(io.BytesIO(text.encode()), infer_schema=False, quote_char=None,
                          truncate_ragged_lines=False, raise_if_empty=False)
    except Exception:  # too many fields on a line, and the like
        return None
    if raw.width != width or text.count(",") != (width - 1) * (raw.height + 1):
        return None  # a short line or a blank one (polars pads those, csv would not)
    raw = raw.rename({c: f"_k{i}" for i, c in enumerate(raw.columns)})
    k = {name: pl.col(f"_k{i}") for name, i in col.items()}
    t, v, name = (k[c].str.strip_chars() for c in ("time_s", "value", "name"))
    checks = raw.select(
        t.str.contains(_NUMBER_RE).all(ignore_nulls=False).alias("t"),
        v.str.contains(_NUMBER_RE).all(ignore_nulls=False).alias("v"),
        (name.str.len_chars() > 0).all(ignore_nulls=False).alias("name"),
        t.cast(pl.Float64, strict=False).is_finite().all(ignore_nulls=False).alias("finite"))
    if raw.height and not all(checks.row(0)):  # nulls (empty cells) make all() false too
        return None
    cols = {"time_s": t.cast(pl.Float64), "value": v.cast(pl.Float64), "name": name}
    for lab in ("tier", "outcome"):
        cols[lab] = k[lab] if lab in k else pl.lit(None, dtype=pl.String)
    cols["instance"] = k["instance"] if "instance" in k else pl.lit(None, dtype=pl.String)
    if LABELS in k:
        texts = {}
        for text_ in raw.get_column(f"_k{col[LABELS]}").drop_nulls().unique().to_list():
            try:
                texts[text_] = canonical_labels(text_, source, "")
            except TraceError:
                return None
        cols[LABELS] = k[LABELS].replace_strict(texts, default=None, return_dtype=pl.String)
    seen: set[str] = set()
    if "instance" in k:
        seen = set(raw.get_column(f"_k{col['instance']}").drop_nulls().unique().to_list())
        if instances is not None and not seen <= set(instances):
            return None  # the row-by-row pass names the line
    cols["node"] = pl.lit(-1, dtype=pl.Int32)
    if "node" in k:
        nodes = {}
        for text_ in raw.get_column(f"_k{col['node']}").drop_nulls().unique().to_list():
            try:
                nodes[text_] = int(text_) if text_.strip() else -1
            except ValueError:
                return None
            if nodes[text_] < -1:
                return None
        cols["node"] = k["node"].replace_strict(nodes, default=-1, return_dtype=pl.Int32)
    cols["le"] = pl.lit(None, dtype=pl.String)
    if "le" in k:
        rows = Rows(source)
        les = {}
        for text_ in raw.get_column(f"_k{col['le']}").drop_nulls().unique().to_list():
            try:
                les[text_] = rows.le_label(text_.strip(), "")
            except TraceError:
                return None
        cols["le"] = k["le"].replace_strict(les, default=None, return_dtype=pl.String)
    keys = [f"_k{i}" for i in range(width) if i not in (col["time_s"], col["value"])]
    df = raw.select(*(e.alias(c) for c, e in cols.items()), *keys)
    return assemble(df, keys, {s: (source, "") for s in seen}, instances, source)


def _read_records(reader, rows: Rows, col: dict[str, int], width: int) -> None:
    src = rows.source
    i_t, i_name, i_v = col["time_s"], col["name"], col["value"]
    i_node, i_inst = col.get("node"), col.get("instance")
    i_tier, i_out, i_le = col.get("tier"), col.get("outcome"), col.get("le")
    i_lab = col.get(LABELS)
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
        lab = _cell(rec, i_lab)
        if lab is not None:
            lab = canonical_labels(lab, src, f"{where}, column {LABELS}")
        rows.add(t, v, name=name, instance=inst, node=node,
                 tier=_cell(rec, i_tier), outcome=_cell(rec, i_out), le=le, where=where,
                 key=tuple(c for i, c in enumerate(rec) if i != i_t and i != i_v),
                 labels=lab)


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
    return atomic_write(path, lambda tmp: out.select(columns_of(out)).write_csv(tmp))
