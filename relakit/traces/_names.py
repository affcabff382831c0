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


def is_parquet(path) -> bool:
    """Whether :func:`read_trace` would read ``path`` as a Parquet long table (a file
    that cannot be read is not: :func:`read_trace` says why): a ``.parquet`` file, or
    one of no known suffix that starts with Parquet's magic bytes."""
    p = Path(path)
    if not p.is_file():
        return False
    suffix = p.suffix.lower()
    if suffix in (".json", ".csv") or suffix in SUFFIXES:
        return False
    if suffix == ".parquet":
        return True
    try:
        with open(p, "rb") as fh:
            return fh.read(4) == b"PAR1"
    except OSError:
        return False
