"""Prometheus' functions as numpy over a whole vector of instants (for :mod:`promql`).

Each takes arrays only: a series' samples (``values``, and ``times``), and per
instant the first sample of its window ``lo`` and how many it holds ``n`` (from
:func:`relakit.control.tsdb.window_bounds`); it returns a value per instant. Windows hold different
numbers of samples, so a reduction steps through window *positions* (the j-th
sample of every window at once) in the order Prometheus adds them: the same float
operations, hence the same bits. Go's conventions are kept where numpy's differ
(quantiles sort NaN first; ``min``/``max_over_time`` are NaN only if every sample is).
"""

from __future__ import annotations

import numpy as np


def nth_sample(values, lo, n, j):
    """The j-th sample of each window (garbage where j >= n), and where it exists."""
    on = j < n
    if values.size == 0:
        return np.full(lo.size, np.nan), on
    return values[np.clip(lo + j, 0, values.size - 1)], on


def steps_in_window(step, lo, last):
    """How many flagged steps each window of samples ``lo..last`` holds, from prefix
    sums: ``step[i]`` flags the step from sample i to i+1 ((S-1,), or (S-1, series));
    a window of one sample (or none) holds none. The one place of the idiom "one value
    in the window" (no step: :func:`sum_count`'s flat windows, :func:`regression`'s
    constant series) and of ``changes``/``resets`` (the steps counted)."""
    c = np.zeros((step.shape[0] + 1, *step.shape[1:]), dtype=np.int64)
    np.cumsum(step, axis=0, out=c[1:])
    top = step.shape[0]
    held = c[np.clip(last, 0, top)] - c[np.clip(lo, 0, top)]
    more = (last > lo).reshape(-1, *(1,) * (step.ndim - 1))
    return np.where(more, held, 0)


def kahan_inc(inc, acc, c):
    """Prometheus' kahanSumInc, in place: ``acc`` += ``inc``, its rounding error added to
    ``c`` (views of the windows still adding). Go takes the error as Neumaier does,
    branching on the larger magnitude; here it is Knuth's branch-free TwoSum: both give
    the exact error, hence the same bits (tests/test_promql_functions.py, infinities and
    overflow included), and numpy makes no temporary for the branch."""
    t = acc + inc
    bb = t - acc
    c += (acc - (t - bb)) + (inc - bb)
    acc[...] = t


def kahan_into(inc, acc, c, t, bb, e):
    """:func:`kahan_inc` with its temporaries in the given buffers (same operations in the
    same order, so the same bits): for the large blocks of :func:`regression`."""
    np.add(acc, inc, out=t)
    np.subtract(t, acc, out=bb)
    np.subtract(t, bb, out=e)
    np.subtract(acc, e, out=e)
    np.subtract(inc, bb, out=bb)
    e += bb
    c += e
    acc[...] = t


def longest_first(lo, n):
    """The windows (instants) ordered by how many samples they hold, most first, and per
    position j how many hold a j-th sample: at step j the windows still adding are a
    prefix (``[:active[j]]``), so a position-by-position reduction needs no masks.
    Returns (order, lo, n in that order, active)."""
    order = np.argsort(-n, kind="stable")
    n_o = n[order]
    width = int(n_o[0]) if n_o.size else 0
    active = n_o.size - np.searchsorted(n_o[::-1], np.arange(max(width, 0)), side="right")
    return order, lo[order], n_o, active


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
    (Kahan-Neumaier; ``avg`` as its incremental mean), one step per window position.

    The mean of a window whose samples are one finite value v is v (+ 0.0) without
    stepping: the first step sets the mean to v, every later one adds v/j - v/j = 0
    with no rounding error (``up`` over an hour: 240 steps for nothing)."""
    out = np.empty(lo.size)
    if mean and values.size:
        first = np.clip(lo, 0, values.size - 1)
        # (NaN != NaN: a step)
        flat = (n >= 1) & (steps_in_window(values[1:] != values[:-1], lo, lo + n - 1) == 0)
        flat &= np.isfinite(values[first])
        if flat.any():
            out[flat] = values[first[flat]] + 0.0
            rest = np.flatnonzero(~flat)
            out[rest] = _sum_count(values, lo[rest], n[rest], mean)
            return out
    return _sum_count(values, lo, n, mean)


def _sum_count(values, lo, n, mean: bool):
    order, lo_o, _, active = longest_first(lo, n)
    acc, c = np.zeros(lo.size), np.zeros(lo.size)
    careful = mean and bool(np.isinf(values).any())  # (an infinite mean: decided once)
    with np.errstate(all="ignore"):
        for j, k in enumerate(active):
            v = values[lo_o[:k] + j]
            if careful:
                step = v / (j + 1) - acc[:k] / (j + 1)
                kahan_inc(np.where(mean_stays(acc[:k], v), 0.0, step), acc[:k], c[:k])
            else:
                kahan_inc(v / (j + 1) - acc[:k] / (j + 1) if mean else v, acc[:k], c[:k])
        out = np.empty(lo.size)
        out[order] = np.where(np.isinf(acc), acc, acc + c)
        return out


def mean_stays(mean, v):
    """Where Prometheus 2.42's incremental mean keeps an infinite mean as it is: ``v``
    the same infinity, or a number (``mean += v/n - mean/n`` would give Inf - Inf, NaN).
    (Adding 0.0 there instead leaves the mean's bits; its compensation, NaN as Go's, is
    not read when the mean is infinite.)"""
    return np.isinf(mean) & ((np.isinf(v) & ((mean > 0) == (v > 0))) | np.isfinite(v))


def reduce_window(values, lo, n, fn):
    """``min``/``max_over_time``: NaN only if every sample is (Prometheus keeps a number)."""
    acc = np.full(lo.size, np.nan)
    for j in range(int(n.max(initial=0))):
        v, on = nth_sample(values, lo, n, j)
        acc = np.where(on, fn(acc, v), acc)
    return acc


def stdvar_over_time(values, lo, n):
    """Prometheus 2.42's funcStdvarOverTime: Welford's update, Kahan-compensated."""
    order, lo_o, n_o, active = longest_first(lo, n)
    mean, cmean, aux, caux = (np.zeros(lo.size) for _ in range(4))
    with np.errstate(all="ignore"):
        for j, k in enumerate(active):
            v = values[lo_o[:k] + j]
            delta = v - (mean[:k] + cmean[:k])
            kahan_inc(delta / (j + 1), mean[:k], cmean[:k])
            kahan_inc(delta * (v - (mean[:k] + cmean[:k])), aux[:k], caux[:k])
        out = np.empty(lo.size)
        out[order] = (aux + caux) / np.maximum(n_o, 0)  # (no sample: 0 / 0)
        return out


def go_quantile(rows, n, q):
    """Prometheus' ``quantile`` over each row's first n values (sorted NaN first, as its
    vectorByValueHeap), weighted between the two nearest ranks."""
    width = rows.shape[1]
    pad = np.where(np.arange(width)[None, :] < n[:, None], rows, np.inf)
    nan = np.isnan(pad)
    n_nan = nan.sum(axis=1)
    # numbers first, then padding; equal values (-0.0 and 0.0: no others differ) in their
    # order, as Go's sort.Sort keeps them in the windows it sorts by insertion (up to 12
    # values); a stable sort costs ~4x, so only where a -0.0 is
    keys = np.where(nan, np.inf, pad)
    signed = bool(((keys == 0) & np.signbit(keys)).any())
    ordered = np.sort(keys, axis=1, kind="stable" if signed else None)

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
    if values.size == 0:
        return np.full(lo.size, np.nan)
    # every window's samples as one gather (what lies past a window's end is not read)
    rows = values[np.clip(lo[:, None] + np.arange(width)[None, :], 0, values.size - 1)]
    return go_quantile(rows, n, q)


def changes(values, lo, hi, resets: bool):
    """``changes``/``resets``: the steps of the window, counted with prefix sums."""
    a, b = values[1:], values[:-1]
    step = (a < b) if resets else ((a != b) & ~(np.isnan(a) & np.isnan(b)))
    return steps_in_window(step, lo, hi).astype(float)


def regression(times, series, lo, n, intercept_t, block: int = 64):
    """Prometheus' linearRegression of several series sampled at the same ``times``
    (Kahan sums, a constant series has slope 0), x in seconds from ``intercept_t`` (per
    instant) computed from milliseconds as it does: (slope, intercept), each (series, T).

    numpy over window positions, every window of ``block`` series at once, in Go's
    order of additions (the same bits: tests/test_promql_functions.py against a
    transcription of its Go). The windows are taken longest first, so that the ones
    still adding at position j are a prefix (no masks); a position's sums are one
    contiguous array, one :func:`kahan_into`, written in place. Sums of whole-number terms
    (:func:`whole_x_sums`, :func:`whole_sums`, :func:`whole_xy_sums`) come from integer
    prefix sums instead: Go's compensated sum of such terms is the exact sum rounded
    once; float prefix sums of every term would be faster still but change the bits
    (docs/performance.md).
    Why not a compiled loop, ~3.5x faster: a rule backtest then never loads numba, whose
    start in a fresh process (~0.45 s of CPU, ~125 MB) is more than the 300-rule
    benchmark's regressions gain from it (docs/performance.md)."""
    t_ms = np.round(np.asarray(times, dtype=float) * 1000).astype(np.int64)
    i_ms = np.broadcast_to(np.round(np.asarray(intercept_t, dtype=float) * 1000)
                           .astype(np.int64), lo.shape)
    slope = np.full((len(series), lo.size), np.nan)
    icept = np.full((len(series), lo.size), np.nan)
    if not np.any(n > 0) or not len(series):
        return slope, icept
    order, lo_o, n_o, active = longest_first(lo, n)
    i_o = i_ms[order]
    cnt = n_o.astype(float)[:, None]
    none = n_o[:, None] <= 0  # an empty window: nothing
    last = np.clip(lo_o + n_o - 1, 0, None)
    size = min(block, len(series))
    on = n_o > 0
    ends = (lo_o[on], lo_o[on] + n_o[on])
    x_sums = whole_x_sums(t_ms, i_o, on, ends)
    ax = 0 if x_sums is not None else 2
    # one array holds a position's increments of every sum Kahan must add in order,
    # [x, x*x (unless whole), y.. (unless whole), x*y..]: ~15 numpy calls a position
    # whatever the number of series; the buffers are made once and written in place
    # (a fresh array per operation costs page faults)
    # (flat, so that a position's (k, w) view is contiguous: one loop per operation)
    inc, t_b, d_b, e_b = (np.empty(order.size * (2 + 2 * size)) for _ in range(4))
    x_b, v_b = np.empty(order.size), np.empty(order.size * size)
    for b in range(0, len(series), size):
        part = series[b:b + size]
        vals = np.column_stack([np.asarray(v, dtype=float) for v in part])  # (samples, series)
        m = vals.shape[1]
        y_sums = whole_sums(vals, on, ends)
        ay = m if y_sums is None else 0
        xy_sums = (whole_xy_sums(t_ms, i_o, on, ends, vals)
                   if x_sums is not None and y_sums is not None else None)
        axy = m if xy_sums is None else 0
        w = ax + ay + axy
        first = vals[np.minimum(lo_o, vals.shape[0] - 1)]
        # constant over the window (Go: every sample == the first; NaN never is): no
        # sample differs from the one before it
        const = steps_in_window(vals[1:] != vals[:-1], lo_o, last) == 0
        acc, c = np.zeros((order.size, w)), np.zeros((order.size, w))
        with np.errstate(all="ignore"):
            for j, k in enumerate(active if w else ()):  # windows holding a j-th sample: [:k]
                at = lo_o[:k] + j
                row = inc[:k * w].reshape(k, w)
                x = row[:, 0] if ax else x_b[:k]
                np.divide(t_ms[at] - i_o[:k], 1e3, out=x)
                if ax:
                    np.multiply(x, x, out=row[:, 1])
                v = row[:, ax:ax + m] if ay else v_b[:k * m].reshape(k, m)
                np.take(vals, at, axis=0, out=v, mode="clip")
                np.multiply(x[:, None], v, out=row[:, ax + ay:])
                kahan_into(row, acc[:k], c[:k], *(a[:k * w].reshape(k, w) for a in (t_b, d_b,
                                                                                  e_b)))
            tot = acc + c
            sx, sx2 = (x_sums if x_sums is not None else (tot[:, :1], tot[:, 1:2]))
            sy = tot[:, ax:ax + m] if ay else y_sums
            sxy = tot[:, ax + ay:] if axy else xy_sums
            cov = sxy - sx * sy / cnt
            var = sx2 - sx * sx / cnt
            sl = cov / var
            ic = sy / cnt - sl * sx / cnt
        inf = np.isinf(first)  # a constant series: slope 0 at its value (NaN if infinite)
        sl = np.where(const, np.where(inf, np.nan, 0.0), sl)
        ic = np.where(const, np.where(inf, np.nan, first), ic)
        slope[b:b + m, order] = np.where(none, np.nan, sl).T
        icept[b:b + m, order] = np.where(none, np.nan, ic).T
    return slope, icept


_EXACT = 2.0 ** 52  # below 2**53: every integer and every sum of two is a double exactly
_INT = 2.0 ** 62  # below 2**63: an int64 sum (its partial sums may wrap) is the true sum


def whole_x_sums(t_ms, i_o, on, ends):
    """Per window (columns of shape (T, 1)) the sums of x and x*x as Go's Kahan sums
    give them, when every x is a whole number of seconds and every partial sum a whole
    number below 2**53: then every addition is exact and the compensation stays 0, so
    the sums are the exact sums whatever the order, here from prefix sums of integers
    (scrapes on whole seconds evaluated on whole seconds: the usual case). None when
    that does not hold."""
    whole = _whole_x(t_ms, i_o, on, ends)
    if whole is None:
        return None
    ts, xi, reach = whole
    a, e = ends
    if ((e - a) * reach * reach >= _EXACT).any():
        return None
    p1 = np.concatenate([[0], np.cumsum(ts)])
    p2 = np.concatenate([[0], np.cumsum(ts * ts)])
    s1, s2, k = p1[e] - p1[a], p2[e] - p2[a], e - a
    sx, sx2 = np.zeros((i_o.size, 1)), np.zeros((i_o.size, 1))
    sx[on, 0] = s1 - k * xi  # sum (t - i) and sum (t - i)**2, in integers
    sx2[on, 0] = s2 - 2 * xi * s1 + k * xi * xi  # (int64 wraps: exact, as the result fits)
    return sx, sx2


def _whole_x(t_ms, i_o, on, ends):
    """(sample times in whole seconds from the first, each window's intercept in the
    same seconds, each window's largest |x|) when every x is a whole number of seconds
    (and small), else None."""
    if t_ms.size == 0 or t_ms.size >= 1 << 20:
        return None
    r = t_ms[0] % 1000
    if (t_ms % 1000 != r).any() or (i_o[on] % 1000 != r).any():
        return None
    ts = (t_ms - t_ms[0]) // 1000
    xi = (i_o[on] - t_ms[0]) // 1000
    if (np.diff(ts) < 0).any() or ts[-1] >= 1 << 21 or (np.abs(xi) >= 1 << 21).any():
        return None
    a, e = ends
    reach = np.maximum(np.abs(ts[a] - xi), np.abs(ts[e - 1] - xi)).astype(float)
    return ts, xi, reach


def _whole_y(vals, ends):
    """Per series the largest |y|, when every value is a whole number and every window's
    sum of |y| is below 2**62; else None."""
    with np.errstate(invalid="ignore"):
        whole = np.isfinite(vals).all() and (vals == np.round(vals)).all()
    if not whole or vals.size == 0:
        return None
    top = np.abs(vals).max(axis=0)
    a, e = ends
    longest = float((e - a).max(initial=0))
    if (top >= _EXACT).any() or (longest * top >= _INT).any():
        return None
    return top


def whole_sums(vals, on, ends):
    """Per window and series the sums of y as Go's Kahan sums give them, when every value
    of every series is a whole number below 2**52 and every window's sum of magnitudes
    is below 2**62 (counters, bytes); None otherwise.

    Why exact: every term is an integer, so each addition's rounding error (which the
    compensation captures exactly: TwoSum/Fast2Sum) is an integer, and their sum, below
    2**53 here, is added without rounding; hence ``sum + c`` is the exact sum rounded
    once, whatever the order -- the exact sum (int64 prefix sums) converted to a double,
    which rounds to nearest-even as Go's last addition does. Below 2**53 the sum is the
    exact sum itself (the compensation stays 0)."""
    if _whole_y(vals, ends) is None:
        return None
    p = np.zeros((vals.shape[0] + 1, vals.shape[1]), dtype=np.int64)
    np.cumsum(vals.astype(np.int64), axis=0, out=p[1:])
    a, e = ends
    out = np.zeros((on.size, vals.shape[1]))
    out[on] = p[e] - p[a]
    return out


def whole_xy_sums(t_ms, i_o, on, ends, vals):
    """Per window and series the sums of x*y as Go's Kahan sums give them, when every x
    is a whole number of seconds, every y a whole number, every product below 2**52 (so
    that Go's x*y is exact) and every window's sum of |x*y| below 2**62: the exact sum
    rounded once, as :func:`whole_sums` argues, from int64 prefix sums of t*y
    (sum (t - i) y = sum t y - i sum y; the prefix sums may wrap, the window's sum does
    not). None otherwise."""
    whole = _whole_x(t_ms, i_o, on, ends)
    top = _whole_y(vals, ends) if whole is not None else None
    if top is None:
        return None
    ts, xi, reach = whole
    a, e = ends
    far = float(reach.max(initial=0))
    if (far * top >= _EXACT).any() or (float(((e - a) * reach).max(initial=0)) * top
                                      >= _INT).any():
        return None
    y = vals.astype(np.int64)
    with np.errstate(over="ignore"):
        py = np.zeros((y.shape[0] + 1, y.shape[1]), dtype=np.int64)
        np.cumsum(y, axis=0, out=py[1:])
        pty = np.zeros_like(py)
        np.cumsum(ts[:, None] * y, axis=0, out=pty[1:])  # (wraps past 2**63: modular)
        s = (pty[e] - pty[a]) - xi[:, None] * (py[e] - py[a])
    out = np.zeros((on.size, vals.shape[1]))
    out[on] = s
    return out


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
                return go_max(lo_, go_min(hi_, val)), ok & ~(hi_ < lo_)
            return (go_max if f == "clamp_min" else go_min)(args[0], val), ok
        if f == "sgn":  # Go's: v itself when it is neither < 0 nor > 0 (-0.0, NaN)
            return np.where(val < 0, -1.0, np.where(val > 0, 1.0, val)), ok
        fn = {"abs": np.abs, "ceil": np.ceil, "floor": np.floor, "sqrt": np.sqrt,
              "exp": np.exp, "ln": np.log, "log2": np.log2, "log10": np.log10,
              "acos": np.arccos, "acosh": np.arccosh, "asin": np.arcsin,
              "asinh": np.arcsinh, "atan": np.arctan, "atanh": np.arctanh, "cos": np.cos,
              "cosh": np.cosh, "sin": np.sin, "sinh": np.sinh, "tan": np.tan,
              "tanh": np.tanh, "deg": np.degrees, "rad": np.radians}[f]
        return fn(val), ok


def go_max(x, y):
    """Go's math.Max: +Inf over NaN, then NaN, and 0.0 over -0.0 (numpy's maximum gives
    NaN, and the first of two zeros)."""
    with np.errstate(invalid="ignore"):
        r = np.where(np.isnan(x) | np.isnan(y), np.nan, np.where(x > y, x, y))
        r = np.where((x == 0) & (y == 0), np.where(np.signbit(x), y, x), r)
        return np.where((x == np.inf) | (y == np.inf), np.inf, r)


def go_min(x, y):
    """Go's math.Min: -Inf over NaN, then NaN, and -0.0 over 0.0."""
    with np.errstate(invalid="ignore"):
        r = np.where(np.isnan(x) | np.isnan(y), np.nan, np.where(x < y, x, y))
        r = np.where((x == 0) & (y == 0), np.where(np.signbit(x), x, y), r)
        return np.where((x == -np.inf) | (y == -np.inf), -np.inf, r)


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
    in order, vectorised over the instants: the same float operations, the same bits.
    Both start from the first present value, as Prometheus' aggregation does (not from
    0 + v: the sum of -0.0 alone is -0.0), and an infinite mean stays as Prometheus
    keeps it (:func:`mean_stays`; tests/test_promql_edges.py)."""
    acc = np.zeros(vals.shape[1])
    n = np.zeros(vals.shape[1])
    careful = mean and bool(np.isinf(vals).any())  # (an infinite mean: decided once)
    with np.errstate(all="ignore"):
        if oks.all():  # every series at every instant (the usual case): no masks
            for j, v in enumerate(vals):
                if j == 0:
                    acc = v.copy()
                elif careful:
                    acc = np.where(mean_stays(acc, v), acc, acc + (v / (j + 1) - acc / (j + 1)))
                else:
                    acc = acc + (v / (j + 1) - acc / (j + 1)) if mean else acc + v
            return acc
        for v, ok in zip(vals, oks, strict=True):
            n = n + ok
            step = acc + (v / n - acc / n) if mean else acc + v
            if careful:
                step = np.where(mean_stays(acc, v), acc, step)
            acc = np.where(ok, np.where(n == 1, v, step), acc)
    return acc
