"""Prometheus / OpenMetrics text exposition snapshots -> the long metrics schema."""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from urllib.parse import unquote

import polars as pl

from relakit.traces._names import SUFFIXES
from relakit.traces._schema import (
    NUMBER_HINT,
    Rows,
    label_text,
    natural_key,
    parse_number,
    read_text,
    trace_error,
)

_FILE_NAME = re.compile(r"(?P<instance>.+)@(?P<ts>\d+(?:\.\d+)?)\.(?:prom|om|txt)")
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_INT = re.compile(r"[+-]?\d+")
_TYPES = {"counter", "gauge", "histogram", "gaugehistogram", "summary", "info", "stateset",
          "untyped", "unknown"}
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}
_QUOTED = re.compile(r'((?:[^"\\]|\\.)*)"', re.DOTALL)
_ESCAPE = re.compile(r"\\(.)", re.DOTALL)
_NAME_HINT = "<instance>@<unix_seconds>.prom (or .om, .txt)"


def read_openmetrics(paths_or_dir, instances: list[str] | None = None) -> pl.DataFrame:
    """Read text exposition snapshots (what ``curl host/metrics`` returns).

    ``paths_or_dir`` is one file, a directory (its ``.prom``, ``.om`` and
    ``.txt`` files) or a list of files and directories. Each file is one scrape
    of one target:

    * the instance is the sample's ``instance`` label if it has one, else the
      file name's ``<instance>`` in ``<instance>@<unix_seconds>.prom`` (or
      ``.om``, ``.txt``; percent-escapes such as ``%3A`` for ``:`` are decoded,
      for file systems that forbid ``:``), else none (node -1). A ``node``
      label is the index directly when there is no instance. Instances are
      numbered by natural sort, or by their order in ``instances``.
    * the time is the sample's own timestamp if it has one -- integer
      milliseconds in the Prometheus text format, seconds in OpenMetrics (a file
      whose last line is ``# EOF``) -- else the file name's ``<unix_seconds>``.

    ``# HELP``, ``# TYPE``, ``# UNIT`` and other comments are read past; label
    values may hold ``\\"``, ``\\\\`` and ``\\n``; values may be ``NaN``,
    ``+Inf``, ``-Inf``; OpenMetrics exemplars are ignored. Series named
    ``*_created`` and summary quantiles (a ``quantile`` label) are skipped.
    ``tier``, ``outcome`` and ``le`` keep their columns (``le`` normalised,
    ``"1.0"`` -> ``"1"``); ``job`` and every other label are kept in the ``labels``
    column (dictionary-encoded), as the JSON importer keeps them, so rules that
    select or group on them work as over Prometheus itself.

    Raises :class:`TraceError` naming the file and line: a malformed sample,
    label or value, a bad timestamp, or a sample with no time at all.
    """
    files = _expand(paths_or_dir)
    rows = Rows(paths_or_dir if isinstance(paths_or_dir, str | os.PathLike) else "<snapshots>")
    for path in files:
        _read_file(rows, path)
    return rows.frame(instances)


def _expand(paths_or_dir) -> list[Path]:
    items = [paths_or_dir] if isinstance(paths_or_dir, str | os.PathLike) else list(paths_or_dir)
    files: list[Path] = []
    for item in items:
        p = Path(item)
        if p.is_dir():
            found = sorted((f for f in p.iterdir() if f.is_file() and f.suffix in SUFFIXES
                            and not f.name.startswith(".")), key=lambda f: natural_key(f.name))
            if not found:
                raise trace_error(p, None, "holds no .prom, .om or .txt files; expected text "
                                           f"exposition snapshots named {_NAME_HINT}")
            files.extend(found)
        else:
            files.append(p)
    if not files:
        raise trace_error("<snapshots>", None, "no files given; expected snapshot files or a "
                                               "directory of them")
    return files


def _read_file(rows: Rows, path: Path) -> None:
    src = str(path)
    lines = read_text(path).split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    lines = [ln[:-1] if ln.endswith("\r") else ln for ln in lines]
    last = next((i for i in range(len(lines) - 1, -1, -1) if lines[i].strip()), None)
    is_om = last is not None and lines[last].rstrip() == "# EOF"
    m = _FILE_NAME.fullmatch(path.name)
    file_instance = unquote(m["instance"]) if m else None
    file_time = float(m["ts"]) if m else None
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"line {lineno}"
        if line.lstrip(" \t").startswith("#"):
            _read_comment(src, where, line.lstrip(" \t"), is_om and lineno - 1 == last)
            continue
        name, labels, value, ts = _parse_sample(src, where, line, is_om)
        if "" in labels.values():  # an empty label is no label, in Prometheus
            labels = {key: val for key, val in labels.items() if val}
        if name.endswith("_created") or "quantile" in labels:
            continue
        t = ts if ts is not None else file_time
        if t is None:
            raise trace_error(src, where, f"sample {name} has no timestamp and the file name "
                                          f"gives none; expected a timestamp after the value "
                                          f"or a file named {_NAME_HINT}")
        instance = labels.get("instance", file_instance)
        node = None
        if instance is None and "node" in labels:
            try:
                node = int(labels["node"])
            except ValueError:
                node = None
            if node is None or node < -1:
                raise trace_error(src, where, f"label node={labels['node']!r}; expected an "
                                              f"integer node index >= -1")
        other = {k: v for k, v in labels.items() if k not in ("instance", "tier", "outcome", "le")
                 and not (k == "node" and instance is None)}
        rows.add(t, value, name=name, instance=instance, node=node, tier=labels.get("tier"),
                 outcome=labels.get("outcome"), le=rows.le_label(labels.get("le"), where, src),
                 where=where, source=src, key=(name, instance, tuple(sorted(labels.items()))),
                 labels=label_text(other))


def _read_comment(src: str, where: str, line: str, is_eof_line: bool) -> None:
    parts = line.split(None, 3)
    if len(parts) >= 2 and parts[0] == "#" and parts[1] == "EOF" and len(parts) == 2:
        if not is_eof_line:
            raise trace_error(src, where, "'# EOF' before the end of the file; expected it "
                                          "as the last line only")
        return
    if len(parts) >= 2 and parts[0] == "#" and parts[1] == "TYPE":
        if len(parts) < 4 or parts[3].strip().lower() not in _TYPES:
            got = parts[3].strip() if len(parts) == 4 else "nothing"
            raise trace_error(src, where, f"# TYPE gives {got!r}; expected '# TYPE <name> "
                                          f"<type>' with type one of {', '.join(sorted(_TYPES))}")
    # HELP, UNIT and free comments carry nothing the schema holds


def _parse_sample(src: str, where: str, line: str, is_om: bool):
    """``name{labels} value [timestamp] [# exemplar]`` -> (name, labels, value, time_s)."""
    name = None
    pos = len(line) - len(line.lstrip(" \t"))
    m = _NAME.match(line, pos)
    if m:
        name, pos = m.group(), m.end()
    elif line.startswith("{", pos):
        pass
    else:
        raise trace_error(src, where, f"{_clip(line.strip())!r} does not start with a metric "
                                      f"name; expected a sample 'name{{labels}} value "
                                      f"[timestamp]'")
    labels: dict[str, str] = {}
    if pos < len(line) and line[pos] == "{":
        name, pos = _parse_labels(src, where, line, pos + 1, name, labels)
    if not name:
        raise trace_error(src, where, "sample has no metric name; expected 'name{labels} value'")
    rest = line[pos:]
    if rest and rest[0] not in " \t":
        raise trace_error(src, where, f"unexpected {rest[0]!r} after {name}; expected a space "
                                      f"and the value")
    tokens = rest.split()
    if "#" in tokens:  # an OpenMetrics exemplar follows
        tokens = tokens[:tokens.index("#")]
    if not tokens or len(tokens) > 2:
        raise trace_error(src, where, f"sample {name} has {len(tokens)} field(s) after the "
                                      f"labels; expected a value and an optional timestamp")
    try:
        value = parse_number(tokens[0])
    except ValueError:
        raise trace_error(src, where, f"value {tokens[0]!r} of {name} is not a number; "
                                      f"expected {NUMBER_HINT}") from None
    ts = None
    if len(tokens) == 2:
        ts = _parse_timestamp(src, where, tokens[1], is_om)
    return name, labels, value, ts


def _parse_timestamp(src: str, where: str, tok: str, is_om: bool) -> float:
    if is_om:
        try:
            ts = parse_number(tok)
            if not math.isfinite(ts):
                raise ValueError
        except ValueError:
            raise trace_error(src, where, f"timestamp {tok!r} is not a number; expected Unix "
                                          f"seconds (OpenMetrics)") from None
        return ts
    if not _INT.fullmatch(tok):
        raise trace_error(src, where, f"timestamp {tok!r} is not an integer; expected Unix "
                                      f"milliseconds (Prometheus text format; an OpenMetrics "
                                      f"file, with timestamps in seconds, ends with '# EOF')")
    return int(tok) / 1000.0


def _parse_labels(src, where, line, pos, name, labels):
    """Labels from just after ``{``; returns (metric name, position after ``}``)."""
    n = len(line)
    while True:
        while pos < n and line[pos] in " \t":
            pos += 1
        if pos >= n:
            raise trace_error(src, where, "labels are not closed; expected '}'")
        if line[pos] == "}":
            return name, pos + 1
        quoted = line[pos] == '"'
        if quoted:  # a quoted name: UTF-8 metric or label names (Prometheus 3)
            key, pos = _parse_quoted(src, where, line, pos + 1)
        else:
            m = _LABEL.match(line, pos)
            if not m:
                raise trace_error(src, where, f"unexpected {line[pos]!r} at column {pos + 1}; "
                                              f"expected a label name")
            key, pos = m.group(), m.end()
        while pos < n and line[pos] in " \t":
            pos += 1
        if quoted and name is None and pos < n and line[pos] in ",}":
            name = key  # {"metric.name", ...}
        else:
            if pos >= n or line[pos] != "=":
                raise trace_error(src, where, f"label {key} has no value at column {pos + 1}; "
                                              f"expected {key}=\"...\"")
            pos += 1
            while pos < n and line[pos] in " \t":
                pos += 1
            if pos >= n or line[pos] != '"':
                raise trace_error(src, where, f"value of label {key} is not quoted at column "
                                              f"{pos + 1}; expected {key}=\"...\"")
            val, pos = _parse_quoted(src, where, line, pos + 1)
            if key in labels:
                raise trace_error(src, where, f"label {key} appears twice; expected each "
                                              f"label once")
            labels[key] = val
        while pos < n and line[pos] in " \t":
            pos += 1
        if pos < n and line[pos] == ",":
            pos += 1
        elif pos >= n or line[pos] != "}":
            got = repr(line[pos]) if pos < n else "the end of the line"
            raise trace_error(src, where, f"unexpected {got} at column {pos + 1}; expected ',' "
                                          f"or '}}' after a label")


def _parse_quoted(src, where, line, pos):
    """A double-quoted string from just after the opening quote, with \\\\, \\" and \\n."""
    m = _QUOTED.match(line, pos)
    if m is None:
        raise trace_error(src, where, f"string opened at column {pos} is not closed; "
                                      f"expected a closing '\"'")
    text = m.group(1)
    if "\\" in text:
        for esc in _ESCAPE.finditer(text):  # left to right: \\\\n is an escaped \\ then n
            if esc.group(1) not in _ESCAPES:
                raise trace_error(src, where, f"escape {esc.group()} at column "
                                              f"{pos + esc.start() + 1}; expected "
                                              f'\\\\, \\" or \\n')
        text = _ESCAPE.sub(lambda e: _ESCAPES[e.group(1)], text)
    return text, m.end()


def _clip(s: str, n: int = 40) -> str:
    return s if len(s) <= n else s[:n] + "..."
