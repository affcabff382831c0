"""The series PromQL reads: a list of (labels, sample times, sample values).

Why a store of its own rather than the controller's :class:`TSDB`: the TSDB is a
dense (scrapes x series) matrix per target, which a controller wants (a whole scrape
at once), but a rule backtest over a day of 1,500 real series paid ~1 GB for it and
spent most of its time building it. A rule only ever asks for a series' samples in
time order, so the store keeps exactly that: per series two float64 arrays, views
into one flat buffer each.

:func:`read_store` builds it from a trace file in two streaming passes over the
rows, in batches pulled one at a time (``pyarrow``'s ``iter_batches``: polars'
``collect_batches`` reads ahead of a slow consumer and held 650 MB for a 140 MB
store): the first numbers each row's
series (its key columns: node, name, tier, outcome, le, labels), the second reads only
``time_s`` and ``value`` and writes each sample at its series' next free place. Peak
memory is the two buffers plus a 4-byte series number per sample, whatever the
trace's size; no Python object is made per sample.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl

from relakit.control.tsdb import TSDB, Target
from relakit.jit import njit

KEY = ("node", "name", "tier", "outcome", "le")
_BATCH_ROWS = 131_072


@dataclass
class Series:
    """One stored series: its samples (a NaN value is a sample) and, for recorded
    series, the times of their staleness markers."""

    labels: tuple  # sorted (name, value) pairs, __name__ included
    times: np.ndarray
    values: np.ndarray
    stale: np.ndarray | None = None  # times of staleness markers
    _target: Target | None = field(default=None, repr=False)

    def label(self, key: str) -> str:
        return dict(self.labels).get(key, "")

    def target(self) -> Target:
        """The series as a one-column :class:`Target`, for the tsdb functions."""
        if self._target is None:
            self._target = Target(-1, self.times, self.values[:, None], [self.labels])
        return self._target


def instance_label(node: int) -> str:
    """The ``instance`` label of a TSDB target: the node number, or ``client``."""
    return str(node) if node >= 0 else "client"


def _labels(node: int, name: str, tier, outcome, le, text) -> tuple:
    """A series' Prometheus labels: ``__name__`` is the series name; ``tier``,
    ``outcome`` and ``le`` keep their names (an empty or missing value is an absent
    label, as in Prometheus); the scrape target becomes ``instance="<node>"``
    (``instance="client"`` for the fleet-wide series); every other label a recording
    kept (the trace's ``labels`` column) is a label."""
    from relakit.traces import parse_label_text

    labels = dict(parse_label_text(text)) if text else {}
    labels.update({"__name__": name, "instance": instance_label(node)})
    for key, value in (("tier", tier), ("outcome", outcome), ("le", le)):
        if value is not None and value != "":
            labels[key] = str(value)
    return tuple(sorted(labels.items()))


def store_from_tsdb(tsdb: TSDB) -> list[Series]:
    """Every series of the TSDB with Prometheus labels (as :func:`_labels`).
    A sample whose value is NaN stays a sample (Prometheus stores NaN)."""
    store = []
    for tgt in tsdb.targets:
        for k, col in enumerate(tgt.columns):
            text = tgt.labels[k] if tgt.labels is not None else None
            ok = tgt.has(k)
            store.append(Series(_labels(tgt.node, col[0], *col[1:4], text), tgt.times[ok],
                                tgt.values[ok, k]))
    return store


def store_from_frame(frame: pl.DataFrame | pl.LazyFrame, source: str = "<trace>") -> list[Series]:
    """Every series of a long trace (relakit's schema), as :func:`read_store` builds it."""
    return _build(frame.lazy(), source)


def read_store(path) -> list[Series]:
    """The series of a trace file. A Parquet long table is streamed (two passes in
    batches, checked as :func:`relakit.traces.validate_trace` checks it); every other
    format is read by its importer (:func:`relakit.traces.read_trace`) first."""
    from relakit.traces import is_parquet, read_trace

    p = Path(path)
    if is_parquet(p):
        return _build(pl.scan_parquet(p), str(p), path=p)
    return _build(read_trace(p).lazy(), str(p))


def _build(lf: pl.LazyFrame, source: str, path: Path | None = None) -> list[Series]:
    from relakit.traces import LABELS, read_trace, validate_trace

    def full_check():  # the importer's one-line error for whatever is wrong
        if path is not None:
            read_trace(path)
        else:
            validate_trace(lf.collect(), source)

    try:
        validate_trace(lf.head(0).collect(), source)  # columns and dtypes
    except pl.exceptions.PolarsError:
        full_check()
        raise
    has_labels = LABELS in lf.collect_schema().names()
    key = list(KEY) + ([LABELS] if has_labels else [])
    # the label columns stay as read: a Parquet file's string columns are read as
    # dictionaries (Categorical), whose codes hash three times faster than the strings
    casts = [pl.col("node").cast(pl.Int32)] + [pl.col(c) for c in key[1:]]

    def batches(exprs, names):
        """The trace's rows in batches, one at a time, as ``exprs`` of ``names``."""
        if path is None:
            yield from lf.select(exprs).collect().iter_slices(_BATCH_ROWS)
            return
        import pyarrow.parquet as pq

        f = pq.ParquetFile(path, read_dictionary=[c for c in key[1:] if c in names])
        for rb in f.iter_batches(batch_size=_BATCH_ROWS, columns=names):
            yield pl.from_arrow(rb).select(exprs)

    # another seed, hashing the strings themselves, if two keys ever share a hash
    for seed, codes in ((0, True), (1, False), (2, False)):
        found = _number_series(batches(casts, key), key, seed, full_check, codes)
        if found is not None:
            break
    else:
        raise RuntimeError(f"{source}: series keys collide under three hash seeds")
    sid, known = found
    counts = np.bincount(sid, minlength=known.height)
    start = np.concatenate([[0], np.cumsum(counts)])
    times, values = np.empty(sid.size), np.empty(sid.size)
    cursor, row = start[:-1].copy(), 0
    for b in batches([pl.col("time_s").cast(pl.Float64), pl.col("value").cast(pl.Float64)],
                     ["time_s", "value"]):
        t, v = b["time_s"].to_numpy(), b["value"].to_numpy()
        if b["time_s"].null_count() or b["value"].null_count() or not np.isfinite(t).all():
            full_check()
        _scatter(sid[row:row + t.size], t, v, cursor, times, values)
        row += t.size
    del sid
    if known.filter(pl.col("le").is_not_null()).height:
        _check_le(known["le"].drop_nulls().unique().to_list(), full_check)
    return _series(known, key, times, values, start)


def _number_series(batches, key: list, seed: int, full_check, codes: bool):
    """(per row its series number, the key of each series numbered in order of first
    appearance), or None if two keys hash alike. A row's series is found by a 64-bit
    hash of its key columns (a fraction of the cost of comparing the strings); a
    second, independent hash of every row must equal its series' too, so two keys
    alike under the first (odds ~1e-12 for 10,000 series) are caught, never merged.
    With ``codes``, a dictionary column is hashed by its codes (polars' categories are
    global, so one string has one code in every batch; were it not so, one key would
    get two numbers, which is caught too)."""
    index = pl.DataFrame(schema={"h": pl.UInt64, "sid": pl.Int32, "want": pl.UInt64})
    keys: list = []
    sids = []
    for b in batches:
        if b["node"].null_count() or b["name"].null_count() or (b["node"] < -1).any():
            full_check()
        cols = [pl.col(c).to_physical() if codes and isinstance(b.schema[c], pl.Categorical)
                else pl.col(c).cast(pl.String) if isinstance(b.schema[c], pl.Categorical)
                else pl.col(c) for c in key]
        hh = b.select(pl.struct(cols).hash(2 * seed).alias("h"),
                      pl.struct(cols).hash(2 * seed + 1).alias("check"))
        m = hh.join(index, on="h", how="left", maintain_order="left")
        if m["sid"].null_count():
            new = hh.with_row_index("row").filter(m["sid"].is_null()).unique(
                "h", keep="first", maintain_order=True)
            keys.append(b[new["row"]])
            index = pl.concat([index, new.select(
                "h", sid=pl.int_range(index.height, index.height + new.height,
                                      dtype=pl.Int32), want="check")])
            m = hh.join(index, on="h", how="left", maintain_order="left")
        if (m["want"] != m["check"]).any():
            return None
        sids.append(m["sid"].to_numpy())
    sid = np.concatenate(sids) if sids else np.zeros(0, dtype=np.int32)
    table = pl.concat([k.with_columns(pl.col(c).cast(pl.String) for c in key[1:])
                       for k in keys]) if keys else \
        pl.DataFrame(schema={"node": pl.Int32, **dict.fromkeys(key[1:], pl.String)})
    if table.is_duplicated().any():  # one key numbered twice: codes differed across batches
        return None
    return sid, table.with_columns(sid=pl.int_range(table.height, dtype=pl.Int32))


@njit(cache=True)
def _scatter(sid, t, v, cursor, times, values):
    """Each row's sample at its series' next free place (rows keep their file order)."""
    for i in range(sid.size):
        k = cursor[sid[i]]
        times[k] = t[i]
        values[k] = v[i]
        cursor[sid[i]] = k + 1


def _check_le(les, full_check):
    from relakit.traces import parse_number

    for le in les:
        try:
            parse_number(le)
        except ValueError:
            full_check()


def _series(known: pl.DataFrame, key: list, times, values, start) -> list[Series]:
    """Per series, its samples in time order (a trace need not be sorted; of two samples
    at one time the later row wins, as when a TSDB is built), ordered by node, then by
    first sample, as :meth:`TSDB.from_long` orders a target's columns."""
    out = []
    for r in known.iter_rows():
        sid = r[-1]
        a, b = start[sid], start[sid + 1]
        t, v = times[a:b], values[a:b]
        d = np.diff(t)
        if (d <= 0).any():
            order = np.argsort(t, kind="stable")
            t, v = t[order], v[order]
            last = np.concatenate([t[1:] != t[:-1], [True]])
            t, v = t[last], v[last]
        text = r[5] if len(key) > 5 else None
        out.append((r[0], t[0] if t.size else np.inf, sid,
                    Series(_labels(r[0], r[1], r[2], r[3], r[4], text), t, v)))
    out.sort(key=lambda x: x[:3])
    return [x[3] for x in out]


__all__ = ["Series", "instance_label", "read_store", "store_from_frame", "store_from_tsdb"]
