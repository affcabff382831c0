"""Prometheus' functions as numpy over a whole vector of instants (for :mod:`promql`).

Each takes arrays only: a series' samples (``values``, and ``times``), and per
instant the first sample of its window ``lo`` and how many it holds ``n`` (from
:func:`window_bounds`); it returns a value per instant. Windows hold different
numbers of samples, so a reduction steps through window *positions* (the j-th
sample of every window at once) in the order Prometheus adds them: the same float
operations, hence the same bits. Go's conventions are kept where numpy's differ
(quantiles sort NaN first; ``min``/``max_over_time`` are NaN only if every sample is).
"""

from __future__ import annotations

import numpy as np

from relakit.control.tsdb import window
from relakit.jit import njit, register_jitable


def window_bounds(times, te, rng, cut=None):
    """First and last sample index in [te - rng, te] (and before ``cut``) per instant."""
    lo, hi = window(times, te, rng)
    if cut is not None:
        hi = np.minimum(hi, np.searchsorted(times, cut, side="left") - 1)
    return lo, hi


def extrapolated_rate(times, series, lo, hi, te, rng, is_rate: bool, is_counter: bool):
    """Prometheus' ``extrapolatedRate`` (``rate``/``increase``; ``delta`` with
    ``is_counter`` false) of several series sampled at the same ``times``, at every
    instant at once: a (len(series), T) array, NaN where a window holds fewer than two
    samples. ``lo``/``hi``: each instant's first and last sample (:func:`window_bounds`).

    Every float operation is Prometheus' (and :func:`relakit.control.tsdb.increase`'s),
    in its order, so the bits are the same: the increase is last - first, plus, in
    sample order, the value before each counter reset in the window (found among the
    series' resets, which are few); the extrapolation's terms are the same for every
    series (they depend on times only) except the clamp at the counter's zero point.
    Why numpy rather than a compiled loop: a rules-only replay then never loads numba
    (~0.45 s of CPU and ~160 MB in a fresh process), and a whole block of series is one
    array operation."""
    if times.size == 0 or not series:
        return np.full((len(series), te.size), np.nan)
    n = hi - lo + 1
    ok = n >= 2
    a, b = np.where(ok, lo, 0), np.where(ok, hi, 0)
    first = np.stack([v[a] for v in series])
    result = np.stack([v[b] for v in series]) - first
    with np.errstate(all="ignore"):
        if is_counter:
            for r, v in enumerate(series):
                drops = np.flatnonzero(v[1:] < v[:-1]) + 1  # the sample after each reset
                if drops.size == 0:
                    continue
                k0 = np.searchsorted(drops, a + 1, side="left")
                k1 = np.searchsorted(drops, b + 1, side="left")
                k1 = np.where(ok, k1, k0)
                for k in range(int((k1 - k0).max(initial=0))):
                    on = k0 + k < k1
                    j = drops[np.minimum(k0 + k, drops.size - 1)]
                    result[r, on] += v[j[on] - 1]
        t_first, t_last = times[a], times[b]
        sampled = t_last - t_first
        to_start = t_first - (te - rng)
        to_end = te - t_last
        avg_gap = sampled / (n - 1)
        if is_counter:  # counters cannot go below zero: never extrapolate past that point
            to_zero = sampled * (first / result)
            to_start = np.where((result > 0) & (first >= 0) & (to_zero < to_start), to_zero,
                                to_start)
        threshold = avg_gap * 1.1
        interval = sampled + np.where(to_start < threshold, to_start, avg_gap / 2)
        interval = interval + np.where(to_end < threshold, to_end, avg_gap / 2)
        factor = interval / sampled
        if is_rate:
            factor = factor / rng
        return np.where(ok, result * factor, np.nan)


def nth_sample(values, lo, n, j):
    """The j-th sample of each window (garbage where j >= n), and where it exists."""
    on = j < n
    if values.size == 0:
        return np.full(lo.size, np.nan), on
    return values[np.clip(lo + j, 0, values.size - 1)], on


def kahan_inc(inc, acc, c):
    """Prometheus' kahanSumInc (Neumaier): the new sum and compensation."""
    t = acc + inc
    c = c + np.where(np.abs(acc) >= np.abs(inc), (acc - t) + inc, (inc - t) + acc)
    return t, c


def instant_rate(times, values, lo, hi, is_rate):
    """``irate``/``idelta``: the last two samples of the window."""
    ok = hi - lo >= 1
    out = np.full(lo.size, np.nan)
    last, prev = values[hi[ok]], values[hi[ok] - 1]
    with np.errstate(all="ignore"):
        if is_rate:
            inc = np.where(last < prev, last, last - prev)  # a counter reset: the new value
            dt = times[hi[ok]] - times[hi[ok] - 1]
            out[ok] = inc / dt
        else:
            out[ok] = last - prev
    return out, ok


def sum_count(values, lo, n, mean: bool):
    """``sum``/``avg_over_time``, adding in sample order as Prometheus 2.42 does
    (Kahan-Neumaier; ``avg`` as its incremental mean), one step per window position."""
    acc, c = np.zeros(lo.size), np.zeros(lo.size)
    with np.errstate(all="ignore"):
        for j in range(int(n.max(initial=0))):
            v, on = nth_sample(values, lo, n, j)
            inc = v / (j + 1) - acc / (j + 1) if mean else v
            t, c2 = kahan_inc(inc, acc, c)
            c = np.where(on, c2, c)
            acc = np.where(on, t, acc)
        return np.where(np.isinf(acc), acc, acc + c)


def reduce_window(values, lo, n, fn):
    """``min``/``max_over_time``: NaN only if every sample is (Prometheus keeps a number)."""
    acc = np.full(lo.size, np.nan)
    for j in range(int(n.max(initial=0))):
        v, on = nth_sample(values, lo, n, j)
        acc = np.where(on, fn(acc, v), acc)
    return acc


def stdvar_over_time(values, lo, n):
    """Prometheus 2.42's funcStdvarOverTime: Welford's update, Kahan-compensated."""
    count = np.zeros(lo.size)
    mean, cmean, aux, caux = (np.zeros(lo.size) for _ in range(4))
    with np.errstate(all="ignore"):
        for j in range(int(n.max(initial=0))):
            v, on = nth_sample(values, lo, n, j)
            c1 = count + 1
            delta = v - (mean + cmean)
            m2, cm2 = kahan_inc(delta / c1, mean, cmean)
            a2, ca2 = kahan_inc(delta * (v - (m2 + cm2)), aux, caux)
            count = np.where(on, c1, count)
            mean, cmean = np.where(on, m2, mean), np.where(on, cm2, cmean)
            aux, caux = np.where(on, a2, aux), np.where(on, ca2, caux)
        return (aux + caux) / count


def go_quantile(rows, n, q):
    """Prometheus' ``quantile`` over each row's first n values (sorted NaN first, as its
    vectorByValueHeap), weighted between the two nearest ranks."""
    width = rows.shape[1]
    pad = np.where(np.arange(width)[None, :] < n[:, None], rows, np.inf)
    nan = np.isnan(pad)
    n_nan = nan.sum(axis=1)
    ordered = np.sort(np.where(nan, np.inf, pad), axis=1)  # numbers first, then padding

    def pick(i):  # the i-th value in Go's order: n_nan NaNs, then the numbers
        idx = np.clip(i - n_nan, 0, width - 1)
        got = ordered[np.arange(rows.shape[0]), idx]
        return np.where(i < n_nan, np.nan, got)

    with np.errstate(all="ignore"):
        rank = q * (n - 1)
        lower = np.maximum(0, np.floor(rank))
        upper = np.minimum(n - 1, lower + 1)
        weight = rank - np.floor(rank)
        li = np.nan_to_num(lower).astype(np.int64)
        ui = np.nan_to_num(upper).astype(np.int64)
        out = pick(li) * (1 - weight) + pick(ui) * weight
    out = np.where(q < 0, -np.inf, np.where(q > 1, np.inf, out))
    return np.where(n > 0, out, np.nan)


def quantile_window(values, lo, n, q):
    width = int(n.max(initial=0))
    if width == 0:
        return np.full(lo.size, np.nan)
    rows = np.column_stack([nth_sample(values, lo, n, j)[0] for j in range(width)])
    return go_quantile(rows, n, q)


def changes(values, lo, hi, resets: bool):
    """``changes``/``resets`` as differences counted with prefix sums."""
    if values.size < 2:
        return np.zeros(lo.size)
    a, b = values[1:], values[:-1]
    step = (a < b) if resets else ((a != b) & ~(np.isnan(a) & np.isnan(b)))
    c = np.concatenate([[0], np.cumsum(step)])  # c[i]: steps among samples 0..i
    lo_c = np.clip(lo, 0, values.size - 1)
    hi_c = np.clip(hi, 0, values.size - 1)
    return np.where(hi > lo, c[hi_c] - c[lo_c], 0).astype(float)


def regression(times, values, lo, n, intercept_t):
    """Prometheus' linearRegression (Kahan sums, a constant series has slope 0), x in
    seconds from ``intercept_t`` (per instant) computed from milliseconds as it does.
    Compiled: a ``predict_linear(x[6h], ...)`` sums 1,440 samples per instant, and as
    numpy steps over window positions it was half of a 300-rule backtest's time."""
    t_ms = np.round(np.asarray(times, dtype=float) * 1000).astype(np.int64)
    i_ms = np.broadcast_to(np.round(np.asarray(intercept_t, dtype=float) * 1000)
                           .astype(np.int64), lo.shape).copy()
    slope, icept = np.full(lo.size, np.nan), np.full(lo.size, np.nan)
    _regression_kernel(t_ms, np.asarray(values, dtype=float), np.asarray(lo, dtype=np.int64),
                       np.asarray(n, dtype=np.int64), i_ms, slope, icept)
    return slope, icept


@register_jitable(error_model="numpy")
def _kahan(inc, acc, c):
    t = acc + inc
    if abs(acc) >= abs(inc):
        c += (acc - t) + inc
    else:
        c += (inc - t) + acc
    return t, c


@njit(cache=True, error_model="numpy")
def _regression_kernel(t_ms, values, lo, n, i_ms, slope, icept):
    """linearRegression per instant over samples lo..lo+n-1, in Go's order of operations
    (kahanSumInc is Neumaier's), so the bits equal promtool's."""
    for i in range(lo.size):
        if n[i] <= 0:
            continue
        first = values[lo[i]]
        const = True
        cnt = 0.0
        sx = cx = sy = cy = sxy = cxy = sx2 = cx2 = 0.0
        for j in range(lo[i], lo[i] + n[i]):
            v = values[j]
            if const and j > lo[i] and v != first:
                const = False
            cnt += 1.0
            x = (t_ms[j] - i_ms[i]) / 1e3
            sx, cx = _kahan(x, sx, cx)
            sy, cy = _kahan(v, sy, cy)
            sxy, cxy = _kahan(x * v, sxy, cxy)
            sx2, cx2 = _kahan(x * x, sx2, cx2)
        if const:
            if np.isinf(first):
                slope[i], icept[i] = np.nan, np.nan
            else:
                slope[i], icept[i] = 0.0, first
            continue
        sx, sy, sxy, sx2 = sx + cx, sy + cy, sxy + cxy, sx2 + cx2
        cov = sxy - sx * sy / cnt
        var = sx2 - sx * sx / cnt
        slope[i] = cov / var
        icept[i] = sy / cnt - slope[i] * sx / cnt


def holt_winters(values, lo, n, sf, tf):
    """Prometheus' double exponential smoothing, sample by sample across instants."""
    s0 = np.zeros(lo.size)
    s1, _ = nth_sample(values, lo, n, 0)
    v1, _ = nth_sample(values, lo, n, 1)
    b = v1 - s1
    with np.errstate(all="ignore"):
        for j in range(1, int(n.max(initial=0))):
            v, on = nth_sample(values, lo, n, j)
            x = sf * v
            b2 = b if j == 1 else tf * (s1 - s0) + (1 - tf) * b
            y = (1 - sf) * (s1 + b2)
            s0, s1, b = np.where(on, s1, s0), np.where(on, x + y, s1), np.where(on, b2, b)
    return s1


# ---- instant-vector functions -----------------------------------------------------------
def instant_function(f: str, val, ok, args):
    """(values, present) of a math function, as Go's math package computes it."""
    with np.errstate(all="ignore"):
        if f == "round":
            inv = 1.0 / (args[0] if args else 1.0)
            return np.floor(val * inv + 0.5) / inv, ok
        if f in ("clamp", "clamp_min", "clamp_max"):
            if f == "clamp":
                lo_, hi_ = args
                return np.maximum(lo_, np.minimum(hi_, val)), ok & ~(hi_ < lo_)
            return (np.maximum if f == "clamp_min" else np.minimum)(val, args[0]), ok
        fn = {"abs": np.abs, "ceil": np.ceil, "floor": np.floor, "sqrt": np.sqrt,
              "exp": np.exp, "ln": np.log, "log2": np.log2, "log10": np.log10,
              "sgn": np.sign, "acos": np.arccos, "acosh": np.arccosh, "asin": np.arcsin,
              "asinh": np.arcsinh, "atan": np.arctan, "atanh": np.arctanh, "cos": np.cos,
              "cosh": np.cosh, "sin": np.sin, "sinh": np.sinh, "tan": np.tan,
              "tanh": np.tanh, "deg": np.degrees, "rad": np.radians}[f]
        return fn(val), ok


def date_field(f: str, val: np.ndarray) -> np.ndarray:
    """``hour(v)`` and friends: the UTC calendar field of each value (Unix seconds)."""
    bad = ~np.isfinite(val)
    sec = np.trunc(np.where(bad, 0, val)).astype(np.int64)
    day = np.floor_divide(sec, 86400)
    d = day.astype("datetime64[D]")
    month_start = d.astype("datetime64[M]")
    if f == "minute":
        r = np.floor_divide(sec, 60) % 60
    elif f == "hour":
        r = np.floor_divide(sec, 3600) % 24
    elif f == "day_of_week":
        r = (day + 4) % 7  # 1970-01-01 was a Thursday
    elif f == "day_of_month":
        r = (d - month_start).astype(np.int64) + 1
    elif f == "day_of_year":
        r = (d - d.astype("datetime64[Y]").astype("datetime64[D]")).astype(np.int64) + 1
    elif f == "days_in_month":
        r = ((month_start + 1).astype("datetime64[D]")
             - month_start.astype("datetime64[D]")).astype(np.int64)
    elif f == "month":
        r = month_start.astype(np.int64) % 12 + 1
    else:
        r = d.astype("datetime64[Y]").astype(np.int64) + 1970
    return np.where(bad, np.nan, r.astype(float))


def welford(vals: np.ndarray, oks: np.ndarray) -> np.ndarray:
    """Prometheus 2.42's stdvar aggregation: Welford's update, series in order."""
    n = np.zeros(vals.shape[1])
    mean = np.zeros(vals.shape[1])
    acc = np.zeros(vals.shape[1])
    with np.errstate(all="ignore"):
        for v, ok in zip(vals, oks, strict=True):
            first = ok & (n == 0)
            n2 = n + ok
            delta = v - mean
            m2 = mean + delta / n2
            a2 = acc + delta * (v - m2)
            mean = np.where(first, v, np.where(ok, m2, mean))
            acc = np.where(first, 0.0, np.where(ok, a2, acc))
            n = n2
        return acc / n


def sequential(vals: np.ndarray, oks: np.ndarray, mean: bool) -> np.ndarray:
    """Sum, or Prometheus' incremental mean (``mean += v/n - mean/n``), series by series
    in order, vectorised over the instants: the same float operations, the same bits."""
    acc = np.zeros(vals.shape[1])
    n = np.zeros(vals.shape[1])
    with np.errstate(all="ignore"):
        for v, ok in zip(vals, oks, strict=True):
            n = n + ok
            if mean:
                step = np.where(n == 1, v, acc + (v / n - acc / n))
            else:
                step = acc + v
            acc = np.where(ok, step, acc)
    return acc
