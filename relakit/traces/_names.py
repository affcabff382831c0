"""The long schema's column names and the parsing a streamed Parquet read needs, without
polars: ``relakit replay TRACE.parquet --rules`` reads the trace with pyarrow and never
loads polars (~0.13 s of a fresh process, docs/performance.md)."""

from __future__ import annotations

import re
from pathlib import Path

#: The columns of every trace frame, in order (:data:`SCHEMA` gives their dtypes).
COLUMNS = ("time_s", "node", "name", "tier", "outcome", "le", "value")

#: An optional column after the schema's: every other label of a series (``job``,
#: ``mode``, ...) as one text ``k="v",...`` (sorted, Prometheus' escaping; null: none),
#: dictionary-encoded (``Categorical``), so a label set costs an index per sample, not
#: a string. Importers of real recordings (Prometheus JSON) fill it; the simulator's
#: own series have no such labels and no such column.
LABELS = "labels"
LABEL_PAIR = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')

#: Text exposition snapshots (OpenMetrics / Prometheus' format).
SUFFIXES = (".prom", ".om", ".txt")

#: A sample value as Prometheus writes it (ASCII digits; Inf and NaN in any case).
NUMBER_PATTERN = (r"[+-]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?"
                  r"|(?i:inf|infinity|nan))")
_NUMBER = re.compile(NUMBER_PATTERN)


def parse_label_text(text: str | None) -> tuple:
    """The (name, value) pairs of a ``labels`` text, sorted."""
    if not text:
        return ()
    unesc = {"n": "\n", "\\": "\\", '"': '"'}
    return tuple(sorted((k, re.sub(r"\\(.)", lambda m: unesc.get(m.group(1), m.group(1)), v)
                         if "\\" in v else v) for k, v in LABEL_PAIR.findall(text)))


def parse_number(text: str) -> float:
    """A Prometheus sample value: a decimal, ``NaN``, ``+Inf``/``-Inf`` (any case).

    Stricter than ``float()``: no ``_`` digit separators, no surrounding blanks.
    Raises ``ValueError``.
    """
    if not isinstance(text, str) or not _NUMBER.fullmatch(text):
        raise ValueError(text)
    return float(text)


def kind_by_suffix(p: Path) -> str | None:
    """The trace format a path's suffix names (json, csv, parquet, text), or None: then
    the content tells (:func:`kind_by_content`)."""
    suffix = p.suffix.lower()
    return {".json": "json", ".csv": "csv", ".parquet": "parquet"}.get(
        suffix, "text" if suffix in SUFFIXES else None)


def kind_by_content(head: bytes) -> str | None:
    """The trace format a file's first bytes show, or None: the Parquet magic bytes, a
    leading ``{`` or ``[`` (JSON), a header line with ``time_s`` and a comma (CSV), a
    ``#`` line or a sample (text exposition)."""
    if head.startswith(b"PAR1"):
        return "parquet"
    stripped = head.decode("utf-8", errors="replace").lstrip("\ufeff").lstrip()
    if stripped.startswith(("{", "[")):
        return "json"
    first = stripped.split("\n", 1)[0]
    if "," in first and "time_s" in (c.strip().strip('"') for c in first.split(",")):
        return "csv"
    if stripped.startswith("#") or re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*[{ \t]", stripped):
        return "text"
    return None


def is_parquet(path) -> bool:
    """Whether :func:`read_trace` would read ``path`` as a Parquet long table (a file
    that cannot be read is not: :func:`read_trace` says why)."""
    p = Path(path)
    if not p.is_file():
        return False
    kind = kind_by_suffix(p)
    if kind is not None:
        return kind == "parquet"
    try:
        with open(p, "rb") as fh:
            return kind_by_content(fh.read(4)) == "parquet"
    except OSError:
        return False
