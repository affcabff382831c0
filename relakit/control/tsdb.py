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

import numpy as np
import polars as pl

LABELS = ("tier", "outcome", "le")


@dataclass
class Target:
    """One scrape target: its scrape times and, per series, the values scraped."""

    node: int
    times: np.ndarray  # (S,)
    values: np.ndarray  # (S, K)
    columns: list[tuple]  # (name, tier, outcome, le) per column
    _selected: dict = field(default_factory=dict, repr=False, compare=False)

    def select(self, name: str, **labels) -> np.ndarray:
        """Column indices of the series named ``name`` whose labels match (None: any).

        Remembered per target: the columns do not change, and a controller asks the
        same questions at every evaluation."""
        key = (name, tuple(sorted((k, v) for k, v in labels.items() if v is not None)))
        if key not in self._selected:
            self._selected[key] = self._select(name, labels)
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
        """Pivot the long metrics table (one row per sample) into targets."""
        targets = []
        for (node,), part in df.sort("time_s").group_by(["node"], maintain_order=True):
            keys = part.select(["name", *LABELS]).unique(maintain_order=True)
            columns = [tuple(r) for r in keys.iter_rows()]
            times = np.unique(part["time_s"].to_numpy())
            values = np.full((times.size, len(columns)), np.nan)
            col_of = {c: i for i, c in enumerate(columns)}
            key_col = np.array([col_of[tuple(r)] for r in
                                part.select(["name", *LABELS]).iter_rows()], dtype=np.int64)
            row = np.searchsorted(times, part["time_s"].to_numpy())
            values[row, key_col] = part["value"].to_numpy()
            targets.append(Target(int(node), times, values, columns))
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


def increase(target: Target, cols: np.ndarray, t_eval: np.ndarray, range_s: float,
             as_rate: bool = False, counter: bool = True) -> np.ndarray:
    """``increase(x[range])`` (or ``rate``) per column at each time: shape (T, len(cols)).

    NaN where the window holds fewer than two samples, as Prometheus returns nothing.
    ``counter=False`` is ``delta``: no reset correction, no clamp at the zero point.
    """
    return _per_series(_increase, target, cols, t_eval, range_s, as_rate, counter)


def _increase(times, v, t_eval, range_s, as_rate, counter=True):
    t_eval = np.atleast_1d(np.asarray(t_eval, dtype=float))
    out = np.full((t_eval.size, v.shape[1]), np.nan)
    if times.size < 2 or v.shape[1] == 0:
        return out
    lo, hi = window(times, t_eval, range_s)
    ok = hi - lo >= 1
    if not ok.any():
        return out
    lo, hi, te = lo[ok], hi[ok], t_eval[ok]
    # only the rows some window touches: the cost follows the windows, not the history
    start = lo.min()
    v, times = v[start: hi.max() + 1], times[start: hi.max() + 1]
    lo, hi = lo - start, hi - start
    # counter resets: a drop adds back the value before it (Prometheus' correction)
    drop = np.zeros_like(v)
    if counter:
        drop[1:] = np.where(v[1:] < v[:-1], v[:-1], 0.0)
    corr = np.cumsum(drop, axis=0)
    first, last = v[lo], v[hi]
    result = last - first + (corr[hi] - corr[lo])
    t_first, t_last = times[lo], times[hi]
    sampled = (t_last - t_first)[:, None]
    to_start = (t_first - (te - range_s))[:, None] * np.ones_like(result)
    to_end = (te - t_last)[:, None] * np.ones_like(result)
    avg_gap = sampled / (hi - lo)[:, None]
    # counters cannot go below zero: never extrapolate past the zero point
    with np.errstate(divide="ignore", invalid="ignore"):
        to_zero = np.where(counter & (result > 0) & (first >= 0), sampled * (first / result),
                           np.inf)
    to_start = np.minimum(to_start, to_zero)
    threshold = avg_gap * 1.1
    interval = sampled + np.where(to_start < threshold, to_start, avg_gap / 2) + np.where(
        to_end < threshold, to_end, avg_gap / 2)
    factor = interval / sampled  # in Prometheus' order of operations, to the last bit
    if as_rate:
        factor = factor / range_s
    result = result * factor
    out[ok] = result
    return out


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


def bucket_quantile(q: float, upper: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """``histogram_quantile`` over cumulative bucket counts, one row per time.

    ``upper`` holds the bucket bounds (ascending, the last +Inf); ``counts`` is
    (T, B). Follows Prometheus' bucketQuantile: monotonic fix-up, linear
    interpolation in the bucket, the highest finite bound when the rank falls
    in +Inf, NaN without observations.
    """
    counts = np.maximum.accumulate(np.nan_to_num(counts, nan=0.0), axis=1)
    total = counts[:, -1]
    out = np.full(counts.shape[0], np.nan)
    if upper.size < 2 or not np.isinf(upper[-1]):
        return out
    rank = q * total
    b = np.array([np.searchsorted(row[:-1], r, side="left") for row, r in zip(counts, rank,
                                                                              strict=True)])
    has = total > 0
    in_inf = b == upper.size - 1
    start = np.where(b > 0, upper[np.maximum(b - 1, 0)], 0.0)
    end = upper[np.minimum(b, upper.size - 1)]
    below = np.where(b > 0, counts[np.arange(b.size), np.maximum(b - 1, 0)], 0.0)
    in_bucket = counts[np.arange(b.size), np.minimum(b, upper.size - 1)] - below
    with np.errstate(divide="ignore", invalid="ignore"):
        value = start + (end - start) * ((rank - below) / in_bucket)  # bucketQuantile's order
    value = np.where(in_inf, upper[-2], value)
    value = np.where((b == 0) & (upper[0] <= 0), upper[0], value)
    out[has] = value[has]
    return out
