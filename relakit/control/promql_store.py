"""The series PromQL reads: a list of (labels, sample times, sample values).

Why a store of its own rather than the controller's :class:`TSDB`: the TSDB is a
dense (scrapes x series) matrix per target, which a controller wants (a whole scrape
at once), but a rule backtest over a day of 1,500 real series paid ~1 GB for it and
spent most of its time building it. A rule only ever asks for a series' samples in
time order, so the store keeps exactly that: per series two float64 arrays (its
values a view into one flat buffer; its times shared by every series sampled then).

:func:`read_store` builds it from a trace file in two streaming passes over the
rows, a batch of 131,072 rows at a time pulled from ``pyarrow`` (``iter_batches``:
polars' ``collect_batches`` read ahead of a slow consumer and held 650 MB for a 140 MB
store). The first numbers each row's series: its string columns (name, tier, outcome,
le, labels) come as dictionary codes, a row's node and codes are packed into one
64-bit word, and the words are looked up in an open-addressing table, all as array
operations; a batch that lists its series in the same order again and again (a scrape
at a time: the usual layout) is looked up one period only and remembered as that
period. The second pass reads ``time_s`` and ``value`` and writes each sample at its
series' next free place. Series sampled at the same instants then share one array of
times. No numba (in a fresh process it costs ~0.45 s of CPU and ~160 MB before its
first kernel runs), no Python object per sample; peak memory is the two buffers and
a batch's working arrays.
"""

from __future__ import annotations

import mmap
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from relakit.control.tsdb import TSDB, Target

if TYPE_CHECKING:
    import polars as pl

KEY = ("node", "name", "tier", "outcome", "le")
_BATCH_ROWS = 131_072
WORD_BITS = 63  # a series key packed into at most this many bits is exact without hashing


@dataclass
class Series:
    """One stored series: its samples (a NaN value is a sample) and, for recorded
    series, the times of their staleness markers."""

    labels: tuple  # sorted (name, value) pairs, __name__ included
    times: np.ndarray
    values: np.ndarray
    stale: np.ndarray | None = None  # times of staleness markers
    _target: Target | None = field(default=None, repr=False)
    _map: dict | None = field(default=None, repr=False, compare=False)

    def label(self, key: str) -> str:
        if self._map is None:  # (selectors ask every series for a label, again and again)
            self._map = dict(self.labels)
        return self._map.get(key, "")

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
    from relakit.traces import is_parquet

    p = Path(path)
    if is_parquet(p):
        return _build(None, str(p), path=p)
    from relakit.traces import read_trace

    return _build(read_trace(p).lazy(), str(p))


def _build(lf: pl.LazyFrame, source: str, path: Path | None = None) -> list[Series]:
    from relakit.traces import LABELS

    def full_check():  # the importer's one-line error for whatever is wrong
        from relakit.traces import read_trace, validate_trace

        if path is not None:
            read_trace(path)
        else:
            validate_trace(lf.collect(), source)

    import pyarrow as pa

    try:  # columns and dtypes (of a Parquet file: from its schema, nothing read)
        if path is not None:
            import pyarrow.parquet as pq

            schema = pq.ParquetFile(path).schema_arrow
            if not _plain_schema(schema):  # validate_trace's message for what is not
                import polars as pl

                from relakit.traces import validate_trace

                validate_trace(pl.from_arrow(schema.empty_table()), source)
            names = schema.names
        else:
            from relakit.traces import validate_trace

            head = lf.head(0).collect()
            validate_trace(head, source)
            names = head.columns
    except pa.ArrowException:
        full_check()
        raise
    except Exception as exc:  # polars' errors (polars is loaded only if it raised one)
        pl = sys.modules.get("polars")
        if pl is not None and isinstance(exc, pl.exceptions.PolarsError):
            full_check()
        raise
    has_labels = LABELS in names
    key = list(KEY) + ([LABELS] if has_labels else [])
    pool = pa.default_memory_pool()
    pa.set_memory_pool(pa.system_memory_pool())  # mimalloc kept ~30 MB of freed batches
    try:
        return _read(lf, path, key, full_check)
    finally:
        pa.set_memory_pool(pool)


def _read(lf: pl.LazyFrame, path: Path | None, key: list, full_check) -> list[Series]:
    rows = _Rows(lf, path, key)
    parts, codes, strings = _number_series(rows.batches(key), key, full_check)
    n_series = codes.shape[0]
    counts = np.zeros(n_series, dtype=np.int64)
    for n, p, ids in parts:
        if p:
            counts += np.bincount(ids, minlength=n_series) * (n // p)
            counts += np.bincount(ids[:n % p], minlength=n_series)
        else:
            counts += np.bincount(ids, minlength=n_series)
    start = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    times, values = _buffer(int(start[-1])), _buffer(int(start[-1]))
    cursor = start[:-1].copy()
    pieces = _pieces(parts)  # (the second reading's batches need not end where the first's do)
    next(pieces)
    for rb in rows.batches(["time_s", "value"]):
        tcol, vcol = rb.column(0), rb.column(1)
        if tcol.null_count or vcol.null_count:
            full_check()
        t = tcol.to_numpy().astype(np.float64, copy=False)
        v = vcol.to_numpy().astype(np.float64, copy=False)
        if not np.isfinite(t).all():
            full_check()
        at = 0
        for n, p, ids in pieces.send(t.size):
            _place(ids, p, t[at:at + n], v[at:at + n], cursor, times, values)
            at += n
    if "le" in key:
        les = {strings[key.index("le")][c] for c in np.unique(codes[:, key.index("le")])
               if c >= 0}
        _check_le(sorted(les), full_check)
    return _series(codes, strings, key, times, values, start)


def _buffer(n: int) -> np.ndarray:
    """n float64 in ordinary pages (anonymous memory, which the kernel zeroes as it is
    first written). Why not ``np.empty``: numpy advises the kernel to back an array of
    over 4 MB with huge pages, and where memory is fragmented (a busy machine, THP
    ``defrag=madvise``) the first write of each then waits for the kernel to compact
    memory: reading 4 nodes cost 0.15-0.25 s more system time (docs/performance.md).
    The pages are mapped at once (``MAP_POPULATE``, where there is one): one call instead
    of a fault per page as the samples are placed (140 MB: ~0.06 -> ~0.04 s)."""
    size = max(n, 1) * 8
    if hasattr(mmap, "MAP_POPULATE"):
        m = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | mmap.MAP_POPULATE)
    else:
        m = mmap.mmap(-1, size)
    return np.frombuffer(m, dtype=np.float64)[:n]


def _plain_schema(schema) -> bool:
    """Exactly the long schema's columns (and ``labels``), each of a type
    :func:`relakit.traces.validate_trace` takes as it is: checked in pyarrow's terms,
    without polars (whose first computation costs ~35 MB of resident code)."""
    import pyarrow as pa

    from relakit.traces import COLUMNS, LABELS

    if set(schema.names) - {LABELS} != set(COLUMNS) or len(schema.names) != len(
            set(schema.names)):
        return False

    def text(t):
        return pa.types.is_string(t) or pa.types.is_large_string(t) or \
            pa.types.is_string_view(t) or (pa.types.is_dictionary(t) and text(t.value_type))

    for f in schema:
        t = f.type
        if f.name in ("time_s", "value"):
            ok = pa.types.is_floating(t) or pa.types.is_integer(t)
        elif f.name == "node":
            ok = pa.types.is_int32(t)
        else:
            ok = text(t) or pa.types.is_null(t)
        if not ok:
            return False
    return True


class _Rows:
    """A trace's rows as pyarrow record batches of the columns asked, one batch at a time
    (a Parquet file is read a batch at a time: ``iter_batches`` pulls, it never reads
    ahead; polars' ``collect_batches`` read ahead of a slow consumer and held 650 MB for a
    140 MB store). String columns come as dictionaries (codes and the strings once)."""

    def __init__(self, lf: pl.LazyFrame, path: Path | None, key: list):
        self.path, self.strings = path, key[1:]
        self.table = None
        if path is None:  # a frame, or a file its importer read: in memory already
            import polars as pl

            self.table = lf.select(pl.col("node"), *[pl.col(c) for c in key[1:]],
                                   pl.col("time_s"), pl.col("value")).collect().to_arrow()

    def batches(self, names: list):
        if self.table is not None:
            yield from self.table.select(names).to_batches(max_chunksize=_BATCH_ROWS)
            return
        import pyarrow.parquet as pq

        # no pre-buffering (it held a row group's column chunks ahead: ~30 MB), one thread
        # (threads cost ~20 % more CPU for decoding this small a batch)
        f = pq.ParquetFile(self.path, read_dictionary=[c for c in names if c in self.strings],
                           pre_buffer=False)
        yield from f.iter_batches(batch_size=_batch_rows(f.metadata), columns=names,
                                  use_threads=False)


def _batch_rows(meta) -> int:
    """About :data:`_BATCH_ROWS` rows a batch, a whole number of batches a row group (of
    the first: writers make them alike), so that no batch straddles two row groups:
    pyarrow then never joins two dictionaries or two pages' decoded runs into one batch
    (reading 4 nodes, 8.7 M rows in row groups of 123,020: 0.68-0.71 -> 0.63-0.66 s)."""
    rows = meta.row_group(0).num_rows if meta.num_row_groups else 0
    if rows <= 0:
        return _BATCH_ROWS
    return -(-rows // -(-rows // _BATCH_ROWS))  # rows / ceil(rows / _BATCH_ROWS), rounded up


def _indices(col, known: dict, memo: list) -> tuple:
    """A string column as (per row an index, the index's code): codes are numbered
    across the whole trace (-1: null); each batch's dictionary is mapped once
    (``memo``: the last one seen)."""
    import pyarrow as pa

    if pa.types.is_null(col.type):
        return np.zeros(len(col), dtype=np.int32), np.array([-1], dtype=np.int32)
    if not pa.types.is_dictionary(col.type):  # (a Parquet file's come as dictionaries)
        import pyarrow.compute as pc

        col = pc.dictionary_encode(col)
    d = col.dictionary
    if memo and (memo[0] is d or memo[0].equals(d)):
        remap = memo[1]
    else:
        remap = np.array([known.setdefault(x, len(known)) if x is not None else -1
                          for x in d.to_pylist()] + [-1], dtype=np.int32)
        memo[:] = [d, remap]
    return _codes(col.indices, len(remap) - 1), remap


def _codes(idx, null: int) -> np.ndarray:
    """An integer arrow array as numpy, ``null`` where it is null (read from its buffers:
    pyarrow.compute's fill_null would cost its module's import, ~0.035 s of every replay)."""
    dt = np.dtype(idx.type.to_pandas_dtype())
    validity, data = idx.buffers()[:2]
    out = np.frombuffer(data, dtype=dt, count=len(idx), offset=idx.offset * dt.itemsize)
    if idx.null_count:
        valid = np.unpackbits(np.frombuffer(validity, dtype=np.uint8), bitorder="little",
                              count=idx.offset + len(idx))[idx.offset:]
        out = np.where(valid.view(bool), out, null)
    return out


def key_period(columns: list, hint: int = 0) -> int:
    """The smallest p > 0 with every column repeating with period p (0 if none): the
    first row whose values all equal the first row's, checked over the whole batch.
    ``hint``: the period expected (the previous batch's), tried first: only its first
    rows are searched for the first row again."""
    n = columns[0].size
    if n < 2:
        return 0
    if 0 < hint < n:
        same = columns[0][1:hint + 1] == columns[0][0]
        for c in columns[1:]:
            same &= c[1:hint + 1] == c[0]
        if not same[:-1].any() and same[-1]:
            return hint if all(np.array_equal(c[hint:], c[:-hint]) for c in columns) else 0
    same = columns[0][1:] == columns[0][0]
    for c in columns[1:]:
        same &= c[1:] == c[0]
    again = np.flatnonzero(same)
    if again.size == 0:
        return 0
    p = int(again[0]) + 1
    return p if all(np.array_equal(c[p:], c[:-p]) for c in columns) else 0


def _number_series(batches, key: list, full_check):
    """(per batch (rows, period, series numbers: of every row, or of one period's rows
    when the batch repeats them with that period); per series its key as codes,
    numbered in order of first appearance; per key column the strings its codes stand
    for).

    A row's key is its node and its string columns' codes, packed into one 64-bit word
    (each column as many bits as its codes need so far: exact, no hashing of strings),
    looked up in an open-addressing table of the series seen so far; a batch's new keys
    are added in order of first appearance. A batch whose keys repeat with a period
    (a scrape lists its series in the same order every time; found on the batch's own
    dictionary indices) is coded, packed and looked up for one period only. Were
    the codes ever wider than 63 bits
    together, the word is a hash of them instead and every row's codes are compared
    with its series' too (exact either way)."""
    known = [{} for _ in key[1:]]
    memos = [[] for _ in key[1:]]
    index = _KeyIndex(len(key))
    parts = []
    p = 0
    for rb in batches:
        node = rb.column(0)
        if node.null_count:
            full_check()
        nd = node.to_numpy()
        if nd.size and (nd.min() < -1 or nd.max() >= 2**31):
            full_check()
        raw = [_indices(rb.column(j), known[j - 1], memos[j - 1]) for j in range(1, len(key))]
        p = key_period([nd] + [r[0] for r in raw], p)  # one period's codes are enough
        cols = np.empty((len(key), p or nd.size), dtype=np.int32)
        cols[0] = nd[:cols.shape[1]]
        for j, (idx, remap) in enumerate(raw, start=1):
            cols[j] = remap[idx[:cols.shape[1]]]
        if (cols[1] < 0).any():  # a null name
            full_check()
        parts.append((nd.size, p, index.lookup(cols)))  # p: one period's rows, or 0
    strings = [None] + [list(k) for k in known]
    return parts, index.keys[:index.n], strings


class _KeyIndex:
    """Series keys (rows of int32 codes) to series numbers, vectorised over a batch."""

    def __init__(self, width: int):
        self.keys = np.zeros((64, width), dtype=np.int32)
        self.n = 0
        self.bits = np.ones(width, dtype=np.int64)  # bits per column in the packed word
        self.table = np.full(256, -1, dtype=np.int32)
        self.words = np.zeros(64, dtype=np.uint64)

    def _pack(self, cols: np.ndarray) -> np.ndarray:
        """(rows) 64-bit words: the codes packed (+1: null is -1), or a hash of them."""
        if self.bits.sum() <= WORD_BITS:
            w = cols[0].astype(np.int64) + 1
            for j in range(1, cols.shape[0]):
                w <<= int(self.bits[j])
                w |= cols[j] + 1
            return w.view(np.uint64)
        w = np.full(cols.shape[1], 0xCBF29CE484222325, dtype=np.uint64)
        for j in range(cols.shape[0]):
            w ^= (cols[j].astype(np.int64) + 1).view(np.uint64)
            w *= np.uint64(0x100000001B3)
        return w

    def _slots(self, words: np.ndarray) -> np.ndarray:
        shift = np.uint64(64 - int(np.log2(self.table.size)))
        return ((words * np.uint64(0x9E3779B97F4A7C15)) >> shift).astype(np.int64)

    def _rebuild(self):
        """Widths grew or the table filled: every known key packed and placed again."""
        size = self.table.size
        while size < 4 * (self.n + 1):
            size *= 2
        self.table = np.full(size, -1, dtype=np.int32)
        self.words = np.zeros(self.keys.shape[0], dtype=np.uint64)
        self.words[:self.n] = self._pack(self.keys[:self.n].T)
        slots = self._slots(self.words[:self.n])
        for s in range(self.n):
            k = slots[s]
            while self.table[k] >= 0:
                k = (k + 1) & (size - 1)
            self.table[k] = s

    def lookup(self, cols: np.ndarray) -> np.ndarray:
        """The series number of each row (column) of ``cols``; new keys added."""
        need = np.array([int(c.max(initial=0) + 1).bit_length() for c in cols])
        need[0] = max(need[0], 1)
        if (need > self.bits).any():
            self.bits = np.maximum(self.bits, need)
            self._rebuild()
        return self._lookup(cols, self._pack(cols))

    def _lookup(self, cols: np.ndarray, words: np.ndarray) -> np.ndarray:
        """Each row probed from its slot until its key or an empty slot is found; keys
        found nowhere are added in order of first appearance and their rows looked up
        again."""
        sid = np.full(cols.shape[1], -1, dtype=np.int32)
        todo = np.arange(cols.shape[1])
        while todo.size:
            exact = self.bits.sum() <= WORD_BITS
            slot = self._slots(words[todo])
            mask = self.table.size - 1
            missing = []
            while todo.size:
                s = self.table[slot]
                hit = s >= 0
                same = np.zeros(todo.size, dtype=bool)
                same[hit] = self.words[s[hit]] == words[todo[hit]]
                if not exact and same.any():
                    same[same] = (self.keys[s[same]] == cols[:, todo[same]].T).all(axis=1)
                sid[todo[same]] = s[same]
                missing.append(todo[~hit])
                on = hit & ~same  # another key there: the next slot
                todo, slot = todo[on], (slot[on] + 1) & mask
            new = np.sort(np.concatenate(missing))
            if new.size:
                _, first = np.unique(words[new] if exact else
                                     np.ascontiguousarray(cols[:, new].T).view(
                                         np.dtype((np.void, 4 * cols.shape[0]))).ravel(),
                                     return_index=True)
                at = np.sort(new[first])
                self._add(cols[:, at].T, words[at])
            todo = new
        return sid

    def _add(self, keys: np.ndarray, words: np.ndarray):
        if self.n + len(keys) > self.keys.shape[0]:
            cap = max(2 * self.keys.shape[0], self.n + len(keys))
            self.keys = np.resize(self.keys, (cap, self.keys.shape[1]))
            self.words = np.resize(self.words, cap)
        self.keys[self.n:self.n + len(keys)] = keys
        self.words[self.n:self.n + len(keys)] = words
        self.n += len(keys)
        if 4 * self.n > self.table.size:
            self._rebuild()
            return
        mask = self.table.size - 1
        slots = self._slots(words)
        for i, k in enumerate(slots):
            k = int(k)
            while self.table[k] >= 0:
                k = (k + 1) & mask
            self.table[k] = self.n - len(keys) + i


def _pieces(parts):
    """A generator sent a row count n, yielding the next n rows of ``parts`` as a list
    of parts (a periodic part cut anywhere stays periodic, its first period rotated)."""
    parts = iter(parts)
    cur, off = None, 0
    n = yield
    while True:
        out = []
        while n:
            if cur is None or off == cur[0]:
                cur, off = next(parts), 0
            rows, p, ids = cur
            take = min(n, rows - off)
            if p:
                out.append((take, p, np.roll(ids, -(off % p)) if off % p else ids))
            else:
                out.append((take, 0, ids[off:off + take]))
            off += take
            n -= take
        n = yield out


def _place(s, p, t, v, cursor, times, values):
    """Each row's sample at its series' next free place (rows keep their file order
    within a series). ``s``: the rows' series numbers, or with a period ``p`` those of
    the first p rows. Rows repeating p distinct series are a (periods x series) matrix
    whose columns go to their series; any other batch is ordered by series (a stable
    sort) and each run written after what its series holds so far."""
    if t.size == 0:
        return
    if p and np.bincount(s).max() == 1:
        # the whole periods as a (periods x series) matrix written series by series: a
        # run of places per series, read down a column (~2x faster than writing each
        # row across every series' buffer, 4 nodes: 0.4 -> 0.2 s)
        k, rest = divmod(t.size, p)
        if k:
            _transpose_into(cursor[s], k, p, t, times)
            _transpose_into(cursor[s], k, p, v, values)
            cursor[s] += k
        if rest:
            times[cursor[s[:rest]]] = t[k * p:]
            values[cursor[s[:rest]]] = v[k * p:]
            cursor[s[:rest]] += 1
        return
    if p:
        s = np.resize(s, t.size)
    order = np.argsort(s, kind="stable")
    ss = s[order]
    first = np.empty(ss.size, dtype=bool)
    first[0] = True
    np.not_equal(ss[1:], ss[:-1], out=first[1:])
    at = np.flatnonzero(first)
    runs = np.diff(np.append(at, ss.size))
    dest = cursor[ss] + (np.arange(ss.size) - np.repeat(at, runs))
    times[dest] = t[order]
    values[dest] = v[order]
    cursor[ss[at]] += runs


def _transpose_into(at, k: int, p: int, src, buf):
    """The (k x p) matrix ``src[:k * p]`` written down its columns: column j to
    ``buf[at[j]:at[j] + k]``. Columns whose places are evenly spaced (series with as
    many samples each, numbered in the order a scrape lists them: the usual case) are
    one strided view of ``buf`` written at once (a transposing copy, ~4x faster than an
    index array of every place); the rest through indices."""
    m = src[:k * p].reshape(k, p)
    d = np.diff(at)
    # j starts a run unless at[j] continues the spacing of j-2 -> j-1 -> j
    cut = np.ones(p, dtype=bool)
    if p > 2:
        cut[2:] = d[1:] != d[:-1]
    cut[1:2] = False  # two columns are always evenly spaced
    starts = np.flatnonzero(cut)
    ends = np.append(starts[1:], p)
    if starts.size > max(8, p // 16):  # scattered places: one index array is cheaper
        buf[at[:, None] + np.arange(k)[None, :]] = m.T
        return
    for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
        step = int(at[a + 1] - at[a]) if b - a > 1 else k
        if step < k:  # (never for places of distinct series; kept exact anyway)
            buf[at[a:b, None] + np.arange(k)[None, :]] = m[:, a:b].T
            continue
        view = np.lib.stride_tricks.as_strided(buf[int(at[a]):], shape=(b - a, k),
                                               strides=(step * 8, 8))
        view[...] = m[:, a:b].T


def _check_le(les, full_check):
    from relakit.traces import parse_number

    for le in les:
        try:
            parse_number(le)
        except ValueError:
            full_check()


def _unsorted(times, start) -> np.ndarray:
    """The series (by number) whose samples are not in strictly increasing time order,
    looked for in slices of the flat buffer (no temporary the size of the trace)."""
    bad = []
    step = 1 << 20
    for a in range(0, max(times.size - 1, 0), step):
        b = min(a + step, times.size - 1)
        at = np.flatnonzero(times[a + 1:b + 1] <= times[a:b]) + a + 1
        bad.append(at[~np.isin(at, start)])  # a series' first sample follows another's
    at = np.concatenate(bad) if bad else np.zeros(0, dtype=np.int64)
    return np.unique(np.searchsorted(start, at, side="right") - 1)


def _series(codes, strings, key: list, times, values, start) -> list[Series]:
    """Per series, its samples in time order (a trace need not be sorted; of two samples
    at one time the later row wins, as when a TSDB is built), ordered by node, then by
    first sample, as :meth:`TSDB.from_long` orders a target's columns. Series sampled
    at the same instants share one array of times (a copy: the trace-long buffer of
    times is let go), which halves the store of a fleet scraped together."""
    unsorted = set(_unsorted(times, start).tolist())
    shared: dict = {}
    out = []
    for sid in range(codes.shape[0]):
        a, b = start[sid], start[sid + 1]
        t, v = times[a:b], values[a:b]
        if sid in unsorted:
            order = np.argsort(t, kind="stable")
            t, v = t[order], v[order]
            last = np.concatenate([t[1:] != t[:-1], [True]])
            t, v = t[last], v[last]
        sig = (t.size, t[0], t[-1]) if t.size else (0,)
        for u in shared.setdefault(sig, []):
            if np.array_equal(u, t):
                t = u
                break
        else:
            t = t.copy()
            shared[sig].append(t)
        c = codes[sid]
        text = [strings[j][c[j]] if c[j] >= 0 else None for j in range(1, len(key))]
        labels = _labels(int(c[0]), text[0], text[1], text[2], text[3],
                         text[4] if len(key) > 5 else None)
        out.append((int(c[0]), t[0] if t.size else np.inf, sid, Series(labels, t, v)))
    out.sort(key=lambda x: x[:3])
    return [x[3] for x in out]


__all__ = ["Series", "instance_label", "read_store", "store_from_frame", "store_from_tsdb"]
