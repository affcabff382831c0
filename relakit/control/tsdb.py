"""What Prometheus holds, and its functions over it, evaluated at many instants at once.

The control plane sees nothing but scraped samples. A :class:`TSDB` is a set of
scrape targets; every series of one target shares the target's scrape
timestamps (Prometheus stamps a whole scrape with one time), so a target is a
time vector and a value matrix, one column per series. That shape lets each
PromQL function below run vectorised over a whole vector of evaluation times
(replay) or at a single instant (closed loop) with the same code.

Semantics follow Prometheus 2.x (the version the live lab runs): a range
selector ``x[W]`` evaluated at ``t`` takes the samples with ``t - W <= ts <= t``;
``increase``/``rate`` extrapolate towards the window's edges exactly as
``extrapolatedRate`` does; ``histogram_quantile`` interpolates linearly inside
the bucket as ``bucketQuantile`` does. Samples after ``t`` are invisible: a
controller cannot see the future.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import polars as pl

LABELS = ("tier", "outcome", "le")


@dataclass
class Target:
    """One scrape target: its scrape times and, per series, the values scraped."""

    node: int
    times: np.ndarray  # (S,)
    values: np.ndarray  # (S, K)
    columns: list[tuple]  # (name, tier, outcome, le) per column
    present: np.ndarray | None = None  # (S, K) where a sample exists; None: where not NaN
    labels: list | None = None  # per column, the other labels' text (traces' LABELS), or None
    _selected: dict = field(default_factory=dict, repr=False, compare=False)

    def has(self, k: int) -> np.ndarray:
        """Where column ``k`` has a sample (a NaN value is one when ``present`` says so)."""
        if self.present is None:
            return ~np.isnan(self.values[:, k])
        return self.present[:, k]

    def select(self, name: str, **labels) -> np.ndarray:
        """Column indices of the series named ``name`` whose labels match (None: any).

        Remembered per target: the columns do not change, and a controller asks the
        same questions at every evaluation."""
        key = (name, tuple(sorted((k, v) for k, v in labels.items() if v is not None)))
        if key not in self._selected:
            self._selected[key] = self._select(name, labels)
        return self._selected[key]

    def buckets(self, name: str, **labels) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """A histogram's bucket series: their column indices, the distinct ``le`` bounds
        in increasing order, and the (series, bounds) 0/1 matrix that sums the series by
        ``le``. Remembered like :meth:`select` (a closed loop asks at every evaluation)."""
        key = ("le", name, tuple(sorted((k, v) for k, v in labels.items() if v is not None)))
        if key not in self._selected:
            idx = self.select(name, **labels)
            les = np.array([float("inf") if self.columns[i][3] in ("+Inf", "Inf", "inf")
                            else float(self.columns[i][3]) for i in idx])
            bounds = np.unique(les)
            self._selected[key] = (idx, bounds, (les[:, None] == bounds[None, :]).astype(float))
        return self._selected[key]

    def _select(self, name: str, labels: dict) -> np.ndarray:
        want = {k: v for k, v in labels.items() if v is not None}
        idx = []
        for i, (n, tier, outcome, le) in enumerate(self.columns):
            if n != name:
                continue
            have = {"tier": tier, "outcome": outcome, "le": le}
            if all((have[k] in v) if isinstance(v, list | tuple | set) else have[k] == v
                   for k, v in want.items()):
                idx.append(i)
        return np.asarray(idx, dtype=np.int64)


@dataclass
class TSDB:
    targets: list[Target] = field(default_factory=list)

    @property
    def nodes(self) -> list[int]:
        return [t.node for t in self.targets if t.node >= 0]

    def target(self, node: int) -> Target | None:
        for t in self.targets:
            if t.node == node:
                return t
        return None

    @property
    def span(self) -> tuple[float, float]:
        lo = min((t.times[0] for t in self.targets if t.times.size), default=0.0)
        hi = max((t.times[-1] for t in self.targets if t.times.size), default=0.0)
        return float(lo), float(hi)

    @classmethod
    def from_long(cls, df: pl.DataFrame) -> TSDB:
        """Pivot the long metrics table (one row per sample) into targets; a series is
        (name, tier, outcome, le) and, when the table has one, its ``labels``."""
        import polars as pl

        extra = "labels" in df.columns
        key = ["name", *LABELS] + (["labels"] if extra else [])
        if extra:
            df = df.with_columns(pl.col("labels").cast(pl.String))
        targets = []
        for (node,), part in df.sort("time_s").group_by(["node"], maintain_order=True):
            keys = part.select(key).unique(maintain_order=True)
            full = [tuple(r) for r in keys.iter_rows()]
            times = np.unique(part["time_s"].to_numpy())
            values = np.full((times.size, len(full)), np.nan)
            col_of = {c: i for i, c in enumerate(full)}
            key_col = np.array([col_of[tuple(r)] for r in part.select(key).iter_rows()],
                               dtype=np.int64)
            row = np.searchsorted(times, part["time_s"].to_numpy())
            vals = part["value"].to_numpy()
            values[row, key_col] = vals
            present = None
            if np.isnan(vals).any():  # NaN samples: remember which cells hold one
                present = np.zeros(values.shape, dtype=bool)
                present[row, key_col] = True
            targets.append(Target(int(node), times, values, [c[:4] for c in full], present,
                                  [c[4] for c in full] if extra else None))
        targets.sort(key=lambda t: t.node)
        return cls(targets)


# ---- Prometheus functions over one target, at evaluation times T ------------------------
def window(times: np.ndarray, t_eval: np.ndarray, range_s: float):
    """First and last sample index inside [t - range, t] for each t (last < first: none)."""
    lo = np.searchsorted(times, t_eval - range_s, side="left")
    hi = np.searchsorted(times, t_eval, side="right") - 1
    return lo, hi


def _per_series(fn, target: Target, cols: np.ndarray, t_eval, *args) -> np.ndarray:
    """Run fn on the whole block, or series by series where some are missing samples.

    A target's series share its scrape times, except a series that did not exist
    yet (client libraries create a labelled series on first use): its missing
    samples are NaN, and for it only its own samples count, as in Prometheus.
    """
    v = target.values[:, cols]
    if not np.isnan(v).any():
        return fn(target.times, v, t_eval, *args)
    t_eval = np.atleast_1d(np.asarray(t_eval, dtype=float))
    out = np.full((t_eval.size, cols.size), np.nan)
    for k in range(cols.size):
        ok = ~np.isnan(v[:, k])
        if ok.any():
            out[:, k] = fn(target.times[ok], v[ok, k:k + 1], t_eval, *args)[:, 0]
    return out


def window_bounds(times, te, rng, cut=None):
    """First and last sample index in [te - rng, te] (and before ``cut``) per instant."""
    lo, hi = window(times, te, rng)
    if cut is not None:
        hi = np.minimum(hi, np.searchsorted(times, cut, side="left") - 1)
    return lo, hi


def increase(target: Target, cols: np.ndarray, t_eval: np.ndarray, range_s: float,
             as_rate: bool = False, counter: bool = True, nan_samples: bool = False,
             cut: np.ndarray | None = None) -> np.ndarray:
    """``increase(x[range])`` (or ``rate``) per column at each time: shape (T, len(cols)).

    NaN where the window holds fewer than two samples, as Prometheus returns nothing.
    ``counter=False`` is ``delta``: no reset correction, no clamp at the zero point.
    A series' NaN samples are samples it does not have (it did not exist yet), unless
    ``nan_samples`` (every row is a sample, a NaN value included, as PromQL's series
    store holds them); ``cut`` (T,) excludes samples at or after it (not written yet).
    """
    return increases([(target, cols)], t_eval, range_s, as_rate, counter, nan_samples,
                     cut)[0]


def increases(parts: list, t_eval, range_s: float, as_rate: bool = False,
              counter: bool = True, nan_samples: bool = False, cut=None) -> list:
    """:func:`increase` of several targets' columns (``parts``: (target, columns) pairs),
    a (T, len(columns)) array each. Only the samples some window holds are read (a
    closed loop asks at one instant of a long history), and targets scraped at the same
    instants are one block, one :func:`extrapolated_rate`: a call costs its numpy calls,
    not its columns, and a closed loop asks thousands of times a run (rela-ramp: 50
    target-and-selector pairs an evaluation)."""
    t_eval = np.atleast_1d(np.asarray(t_eval, dtype=float))
    blocks: list = []  # (times, [part indices])
    for i, (tgt, _) in enumerate(parts):
        for times, members in blocks:
            if times is tgt.times or (times.size == tgt.times.size
                                      and np.array_equal(times, tgt.times)):
                members.append(i)
                break
        else:
            blocks.append((tgt.times, [i]))
    out: list = [None] * len(parts)
    for times, members in blocks:
        a = b = 0
        if t_eval.size:  # (only the samples some window holds)
            a = int(times.searchsorted(t_eval.min() - range_s, side="left"))
            b = int(times.searchsorted(t_eval.max(), side="right"))
        times = times[a:b]
        rows = [parts[i][0].values[a:b, np.asarray(parts[i][1], dtype=np.int64)].T
                for i in members]
        v = rows[0] if len(rows) == 1 else np.concatenate(rows)  # (columns, samples)
        gaps = np.zeros(0, dtype=np.int64) if nan_samples else np.flatnonzero(
            np.isnan(v).any(axis=1))
        if not gaps.size:  # every series has every sample: one block
            lo, hi = window_bounds(times, t_eval, range_s, cut)
            res = extrapolated_rate(times, v, lo, hi, t_eval, range_s, as_rate, counter)
        else:
            res = np.full((v.shape[0], t_eval.size), np.nan)
            whole = np.setdiff1d(np.arange(v.shape[0]), gaps)
            if whole.size:  # the series with every sample: still one block
                lo, hi = window_bounds(times, t_eval, range_s, cut)
                res[whole] = extrapolated_rate(times, v[whole], lo, hi, t_eval, range_s,
                                               as_rate, counter)
            for k in gaps:  # a series missing samples: its own samples only, alone
                ok = ~np.isnan(v[k])
                lo, hi = window_bounds(times[ok], t_eval, range_s, cut)
                res[k] = extrapolated_rate(times[ok], v[k:k + 1, ok], lo, hi, t_eval,
                                           range_s, as_rate, counter)[0]
        at = 0
        for i, r in zip(members, rows, strict=True):
            out[i] = res[at:at + r.shape[0]].T
            at += r.shape[0]
    return out


def extrapolated_rate(times, series, lo, hi, te, rng, is_rate: bool, is_counter: bool,
                      drops=None):
    """Prometheus' ``extrapolatedRate`` (``rate``/``increase``; ``delta`` with
    ``is_counter`` false) of several series sampled at the same ``times`` (a list of
    value arrays, or the rows of one array), at every instant at once: a (series, T)
    array, NaN where a window holds fewer than two samples. ``lo``/``hi``: each
    instant's first and last sample (:func:`window_bounds`). ``drops``: per series the
    samples that follow a counter reset (:func:`counter_resets`), if known already.

    Every float operation is Prometheus', in its order, so the bits are the same
    (tests/test_control.py against a sample-by-sample transcription of its Go): the
    increase is last - first, plus, in sample order, the value before each counter reset
    in the window (found among the series' resets, which are few); the extrapolation's
    terms are the same for every series (they depend on times only) and are computed
    once per instant, except where a counter's zero point clamps the start (few
    windows: those are computed again). Why numpy rather than a compiled loop: PromQL
    and the control plane then never load numba (~0.45 s of CPU and ~145 MB in a fresh
    process), and a whole block of series is one array operation."""
    if times.size == 0 or len(series) == 0:
        return np.full((len(series), te.size), np.nan)
    n = hi - lo + 1
    ok = n >= 2
    a, b = np.where(ok, lo, 0), np.where(ok, hi, 0)
    block = isinstance(series, np.ndarray)
    if block:
        first, result = series[:, a], series[:, b]
    else:
        first, result = np.stack([v[a] for v in series]), np.stack([v[b] for v in series])
    with np.errstate(all="ignore"):  # Inf - Inf is NaN, as in Go, and said nowhere
        result -= first
        if is_counter:
            if drops is None:
                drops = counter_resets(series)
            for r, d in enumerate(drops):
                if d is None or d.size == 0:
                    continue
                v = series[r]
                k0 = np.searchsorted(d, a + 1, side="left")
                k1 = np.searchsorted(d, b + 1, side="left")
                k1 = np.where(ok, k1, k0)
                for k in range(int((k1 - k0).max(initial=0))):
                    on = k0 + k < k1
                    j = d[np.minimum(k0 + k, d.size - 1)]
                    result[r, on] += v[j[on] - 1]
        t_first, t_last = times[a], times[b]
        sampled = t_last - t_first
        to_start = t_first - (te - rng)
        to_end = te - t_last
        avg_gap = sampled / (n - 1)
        threshold = avg_gap * 1.1

        def factor(to_start, sampled, to_end, avg_gap, threshold):
            interval = sampled + np.where(to_start < threshold, to_start, avg_gap / 2)
            interval = interval + np.where(to_end < threshold, to_end, avg_gap / 2)
            f = interval / sampled
            return f / rng if is_rate else f

        out = result * factor(to_start, sampled, to_end, avg_gap, threshold)
        if is_counter:  # counters cannot go below zero: never extrapolate past that point
            to_zero = first / result
            np.multiply(sampled, to_zero, out=to_zero)
            clamp = to_zero < to_start
            clamp &= result > 0
            clamp &= first >= 0
            if clamp.any():  # those windows' start is the zero point
                r, i = np.nonzero(clamp)
                out[r, i] = result[r, i] * factor(to_zero[r, i], sampled[i], to_end[i],
                                                  avg_gap[i], threshold[i])
        out[:, ~ok] = np.nan
        return out


def counter_resets(series) -> list:
    """Per series (a list of value arrays, or the rows of one array) the samples that
    follow a counter reset (a value below the one before it), as indices."""
    if isinstance(series, np.ndarray) and series.ndim == 2 and series.shape[1] > 1:
        rows = set(np.flatnonzero((series[:, 1:] < series[:, :-1]).any(axis=1)).tolist())
        return [np.flatnonzero(series[r, 1:] < series[r, :-1]) + 1 if r in rows else None
                for r in range(series.shape[0])]
    return [np.flatnonzero(v[1:] < v[:-1]) + 1 for v in series]


def over_time(target: Target, cols: np.ndarray, t_eval: np.ndarray, range_s: float,
              how: str) -> np.ndarray:
    """``avg_over_time`` / ``max_over_time`` / ``min_over_time`` / ``last_over_time``."""
    return _per_series(_over_time, target, cols, t_eval, range_s, how)


def _over_time(times, v, t_eval, range_s, how):
    t_eval = np.atleast_1d(np.asarray(t_eval, dtype=float))
    out = np.full((t_eval.size, v.shape[1]), np.nan)
    if times.size == 0 or v.shape[1] == 0:
        return out
    lo, hi = window(times, t_eval, range_s)
    cols = np.arange(v.shape[1])
    if how == "last":
        ok = hi >= lo
        out[ok] = v[hi[ok]]
        return out
    if how == "avg":
        c = np.vstack([np.zeros((1, cols.size)), np.cumsum(v, axis=0)])
        ok = hi >= lo  # an empty window has no average (and must not divide by zero)
        lo, hi = lo[ok], hi[ok]
        out[ok] = (c[hi + 1] - c[lo]) / (hi - lo + 1)[:, None]
        return out
    reducer = np.max if how == "max" else np.min
    for i in np.flatnonzero(hi >= lo):  # per evaluation time; windows hold few samples
        out[i] = reducer(v[lo[i]: hi[i] + 1], axis=0)
    return out


def bucket_quantile(q: float, upper: np.ndarray, counts: np.ndarray,
                    nan_is_missing: bool = True) -> np.ndarray:
    """``histogram_quantile`` over cumulative bucket counts, one row per time.

    ``upper`` holds the bucket bounds (ascending, distinct, the last +Inf); ``counts`` is
    (T, B). Follows Prometheus' bucketQuantile: monotonic fix-up, linear
    interpolation in the bucket, the highest finite bound when the rank falls
    in +Inf, NaN without observations. Every row at once, each with bucketQuantile's
    float operations in its order (the same bits: tests/test_control.py).
    A NaN count is a missing bucket (0) by default, as the TSDB's dense columns hold
    them; with ``nan_is_missing=False`` it is a NaN sample, kept as Prometheus keeps it
    (PromQL: a NaN count is left out of the fix-up, and its bucket found or not by the
    same binary search, tests/test_promql_edges.py).
    """
    upper = np.asarray(upper, dtype=float)
    counts = np.asarray(counts, dtype=float)
    out = np.full(counts.shape[0], np.nan)
    n_b = upper.size
    if n_b < 2 or not upper[-1] == np.inf or counts.shape[0] == 0:
        return out
    # counts never decrease along le (ensureMonotonic), a NaN count left as it is
    if nan_is_missing:
        counts = np.where(np.isnan(counts), 0.0, counts)
    row = np.fmax.accumulate(counts, axis=1)
    row = np.where(np.isnan(counts), counts, row)
    total = row[:, -1]
    with np.errstate(invalid="ignore"):
        rank = q * total
    # the rank's bucket as Go's sort.Search finds it: a binary search over the finite
    # buckets for count >= rank (the first such bucket, unless a NaN count breaks the
    # order; none: +Inf's)
    lo_b, hi_b = np.zeros(row.shape[0], dtype=np.int64), np.full(row.shape[0], n_b - 1)
    every = np.arange(row.shape[0])
    with np.errstate(invalid="ignore"):
        while (on := lo_b < hi_b).any():
            h = (lo_b + hi_b) >> 1
            yes = row[every, np.minimum(h, n_b - 1)] >= rank
            lo_b = np.where(on & ~yes, h + 1, lo_b)
            hi_b = np.where(on & yes, h, hi_b)
    b = lo_b
    seen = total != 0  # no observations: NaN (a NaN total is not 0, as in Go)
    inf = seen & (b == n_b - 1)
    out[inf] = upper[n_b - 2]  # in +Inf: the highest finite bound
    low = seen & (b == 0) & (upper[0] <= 0)
    out[low] = upper[0]
    mid = np.flatnonzero(seen & ~inf & ~low)
    bm = b[mid]
    prev = np.maximum(bm - 1, 0)
    start = np.where(bm > 0, upper[prev], 0.0)
    below = np.where(bm > 0, row[mid, prev], 0.0)
    with np.errstate(all="ignore"):
        out[mid] = start + (upper[bm] - start) * ((rank[mid] - below) / (row[mid, bm] - below))
    return out
    # missing buckets count 0; counts never decrease along le (ensureMonotonic)
    row = np.maximum.accumulate(np.where(np.isnan(counts), 0.0, counts), axis=1)
    total = row[:, -1]
    rank = q * total
    hit = row[:, :-1] >= rank[:, None]
    b = np.where(hit.any(axis=1), hit.argmax(axis=1), n_b - 1)  # the rank's bucket
    seen = total > 0  # no observations: NaN
    inf = seen & (b == n_b - 1)
    out[inf] = upper[n_b - 2]  # in +Inf: the highest finite bound
    low = seen & (b == 0) & (upper[0] <= 0)
    out[low] = upper[0]
    mid = np.flatnonzero(seen & ~inf & ~low)
    bm = b[mid]
    prev = np.maximum(bm - 1, 0)
    start = np.where(bm > 0, upper[prev], 0.0)
    below = np.where(bm > 0, row[mid, prev], 0.0)
    with np.errstate(all="ignore"):
        out[mid] = start + (upper[bm] - start) * ((rank[mid] - below) / (row[mid, bm] - below))
    return out
