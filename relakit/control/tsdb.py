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

from relakit.jit import njit, register_jitable

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
    t_eval = np.atleast_1d(np.asarray(t_eval, dtype=float))
    cols = np.asarray(cols, dtype=np.int64)
    out = np.empty((t_eval.size, cols.size))
    if cols.size:
        cut = np.full(t_eval.size, np.inf) if cut is None else np.asarray(cut, dtype=float)
        _increase_kernel(target.times, target.values, cols, t_eval, float(range_s),
                         bool(as_rate), bool(counter), bool(nan_samples), cut, out)
    return out


@njit(cache=True, error_model="numpy")
def _increase_kernel(times, values, cols, t_eval, range_s, as_rate, counter, nan_samples,
                     cut, out):
    """Prometheus' ``extrapolatedRate``, one evaluation time and column at a time.

    Compiled: a closed-loop run evaluates its signals every few simulated seconds, at one
    instant, over a few samples per series; as numpy array operations each call cost
    ~0.15 ms of call overhead (the chain's Sentinel spent 80 % of a run there). Every
    sum and product is made in Prometheus' order (``extrapolatedRate``), so the
    result equals its to the last bit on the same samples (tests/test_control.py; and
    promtool's, tests/test_promql.py).
    """
    # with every row a sample, a window's samples are lo..hi-1 and its counter resets
    # are counted by prefix sums, so the sample-by-sample walk (Prometheus' order of
    # additions) runs only over windows that hold a reset
    prefix = nan_samples and counter
    drops = np.zeros((times.size + 1 if prefix else 1, cols.size), dtype=np.int64)
    if prefix:
        for k in range(cols.size):
            for j in range(1, times.size):
                drops[j + 1, k] = drops[j, k] + (values[j, cols[k]] < values[j - 1, cols[k]])
    for i in range(t_eval.size):
        te = t_eval[i]
        start = te - range_s
        lo = _bisect(times, start, False)  # the window's first sample
        hi = min(_bisect(times, te, True), _bisect(times, cut[i], False))  # one past its last
        for k in range(cols.size):
            if nan_samples and hi - lo >= 2 and (not counter or drops[hi, k] == drops[lo + 1, k]):
                out[i, k] = _extrapolate(times, values, cols[k], lo, hi - 1, hi - lo,
                                         values[hi - 1, cols[k]] - values[lo, cols[k]], start,
                                         te, range_s, as_rate, counter)
            else:
                out[i, k] = _window_increase(times, values, cols[k], lo, hi, start, te,
                                             range_s, as_rate, counter, nan_samples)


@register_jitable(error_model="numpy")
def _bisect(a, x, right):
    """``np.searchsorted(a, x, side="right" if right else "left")`` for sorted ``a``,
    written out as ``relakit.sim.kernel.bisect_right`` is (numba's adds ~1 s to a cold
    compile); not that one, because the control plane never imports the kernel."""
    lo, hi = 0, a.size
    while lo < hi:
        mid = (lo + hi) >> 1
        if a[mid] < x or (right and a[mid] == x):
            lo = mid + 1
        else:
            hi = mid
    return lo


@register_jitable(error_model="numpy")
def _window_increase(times, values, c, lo, hi, start, te, range_s, as_rate, counter,
                     nan_samples):
    """One series' increase over the samples lo..hi-1 it has (NaN ones skipped unless
    ``nan_samples``)."""
    first_j, last_j, count = -1, -1, 0
    for j in range(lo, hi):
        if nan_samples or values[j, c] == values[j, c]:
            if first_j < 0:
                first_j = j
            last_j = j
            count += 1
    if count < 2:
        return np.nan
    first, last = values[first_j, c], values[last_j, c]
    result = last - first
    if counter:  # counter resets: a drop adds back the value before it
        prev = first
        for j in range(first_j + 1, last_j + 1):
            x = values[j, c]
            if nan_samples or x == x:
                if x < prev:
                    result += prev
                prev = x
    return _extrapolate(times, values, c, first_j, last_j, count, result, start, te, range_s,
                        as_rate, counter)


@register_jitable(error_model="numpy")
def _extrapolate(times, values, c, first_j, last_j, count, result, start, te, range_s,
                 as_rate, counter):
    """extrapolatedRate's tail: the increase ``result`` over samples first_j..last_j
    (``count`` of them) stretched towards the window's edges."""
    first = values[first_j, c]
    t_first, t_last = times[first_j], times[last_j]
    sampled = t_last - t_first
    to_start = t_first - start
    to_end = te - t_last
    avg_gap = sampled / (count - 1)
    # counters cannot go below zero: never extrapolate past the zero point
    if counter and result > 0 and first >= 0:
        to_zero = sampled * (first / result)
        if to_zero < to_start:
            to_start = to_zero
    threshold = avg_gap * 1.1
    interval = sampled + (to_start if to_start < threshold else avg_gap / 2)
    interval = interval + (to_end if to_end < threshold else avg_gap / 2)
    factor = interval / sampled
    if as_rate:
        factor = factor / range_s
    return result * factor


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
    upper = np.asarray(upper, dtype=float)
    counts = np.asarray(counts, dtype=float)
    out = np.full(counts.shape[0], np.nan)
    if upper.size < 2 or not np.isinf(upper[-1]):
        return out
    _bucket_quantile_kernel(float(q), upper, counts, np.empty(counts.shape[1]), out)
    return out


@njit(cache=True, error_model="numpy")
def _bucket_quantile_kernel(q, upper, counts, row, out):
    """One row at a time, in bucketQuantile's order of operations (compiled for the
    reason :func:`_increase_kernel` is); ``row`` is scratch space of one row."""
    n_b = upper.size
    for i in range(counts.shape[0]):
        running = 0.0
        for j in range(n_b):  # missing buckets count 0; counts never decrease along le
            x = counts[i, j]
            x = 0.0 if x != x else x
            running = x if x > running or j == 0 else running
            row[j] = running
        total = row[n_b - 1]
        if not total > 0:
            continue  # no observations: NaN
        rank = q * total
        b = n_b - 1  # the first bucket (+Inf excluded) holding the rank
        for j in range(n_b - 1):
            if row[j] >= rank:
                b = j
                break
        if b == n_b - 1:
            out[i] = upper[n_b - 2]  # in +Inf: the highest finite bound
        elif b == 0 and upper[0] <= 0:
            out[i] = upper[0]
        else:
            start = upper[b - 1] if b > 0 else 0.0
            below = row[b - 1] if b > 0 else 0.0
            out[i] = start + (upper[b] - start) * ((rank - below) / (row[b] - below))
