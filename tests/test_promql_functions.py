"""PromQL's window functions (numpy over every instant at once) against Prometheus' Go,
transcribed sample by sample in plain Python floats (IEEE doubles, as Go's): equal to
the last bit, NaN, infinities, overflow and windows of 0, 1 and 2 samples included."""

from __future__ import annotations

import math
import zlib

import numpy as np
import pytest
from prometheus_go import div as _div
from prometheus_go import extrapolated_rate as _extrapolated_rate

from relakit.control import promql_functions as fn
from relakit.control.tsdb import Target, extrapolated_rate, increase, window_bounds


def _kahan_inc(inc, s, c):
    """kahanSumInc (promql/functions.go, 2.42), as Go writes it (Neumaier's branch)."""
    t = s + inc
    if abs(s) >= abs(inc):
        c += (s - t) + inc
    else:
        c += (inc - t) + s
    return t, c


def _linear_regression(ts_ms, vs, intercept_ms):
    """linearRegression (promql/functions.go, 2.42)."""
    n = sx = cx = sy = cy = sxy = cxy = sx2 = cx2 = 0.0
    init, const = vs[0], True
    for i, (t, v) in enumerate(zip(ts_ms, vs, strict=True)):
        if const and i > 0 and v != init:
            const = False
        n += 1.0
        x = (t - intercept_ms) / 1e3
        sx, cx = _kahan_inc(x, sx, cx)
        sy, cy = _kahan_inc(v, sy, cy)
        sxy, cxy = _kahan_inc(x * v, sxy, cxy)
        sx2, cx2 = _kahan_inc(x * x, sx2, cx2)
    if const:
        return (math.nan, math.nan) if math.isinf(init) else (0.0, init)
    sx, sy, sxy, sx2 = sx + cx, sy + cy, sxy + cxy, sx2 + cx2
    cov = sxy - sx * sy / n
    var = sx2 - sx * sx / n
    slope = _div(cov, var)
    return slope, sy / n - slope * sx / n


def _sum_over_time(vs):
    s = c = 0.0
    for v in vs:
        s, c = _kahan_inc(v, s, c)
    return s if math.isinf(s) else s + c


def _avg_over_time(vs):
    """The incremental mean, Kahan-compensated (funcAvgOverTime's loop)."""
    mean = c = 0.0
    for count, v in enumerate(vs, start=1):
        if _mean_stays(mean, v):
            continue
        mean, c = _kahan_inc(v / count - mean / count, mean, c)
    return mean if math.isinf(mean) else mean + c


def _mean_stays(mean, v):
    """2.42's avg and avg_over_time: an infinite mean is kept when v is the same
    infinity or a number (Inf - Inf would make it NaN)."""
    if not math.isinf(mean):
        return False
    if math.isinf(v):
        return (mean > 0) == (v > 0)
    return not math.isnan(v)


def _stdvar_over_time(vs):
    """funcStdvarOverTime (2.42): Welford, both sums Kahan-compensated."""
    count = mean = cmean = aux = caux = 0.0
    for v in vs:
        count += 1
        delta = v - (mean + cmean)
        mean, cmean = _kahan_inc(delta / count, mean, cmean)
        aux, caux = _kahan_inc(delta * (v - (mean + cmean)), aux, caux)
    return (aux + caux) / count if count else math.nan


def _same(got, want, what):
    assert got == want or (math.isnan(got) and math.isnan(want)), (what, got, want)


def _series(rng, size, kind):
    if kind == "counter":
        return np.cumsum(rng.integers(0, 1000, size)).astype(float) * 1e6
    if kind == "gauge":
        return rng.normal(5e10, 3e8, size)
    if kind == "constant":
        return np.full(size, 7.5)
    v = rng.normal(0, 1e3, size)
    if kind == "special":  # NaN, infinities, values whose sums overflow
        at = rng.choice(size, max(size // 5, 1), replace=False)
        v[at] = rng.choice([np.nan, np.inf, -np.inf, 1.7e308, -1.7e308, 0.0, -0.0], at.size)
    return v


@pytest.mark.parametrize("kind", ["counter", "gauge", "constant", "noise", "special"])
def test_regression_equals_prometheus_bit_for_bit(kind):
    """deriv/predict_linear's linearRegression on series sharing times (one and several
    series, in blocks of two), irregular millisecond times, windows of 0 to 80 samples."""
    rng = np.random.default_rng(zlib.crc32(kind.encode()))  # (str hashes vary per process)
    times = np.cumsum(rng.choice([15.0, 15.0, 14.999, 15.2, 30.0], 400)) + 1.7e9
    series = [_series(rng, times.size, kind) for _ in range(3)]
    te = np.sort(rng.uniform(times[0] - 100, times[-1] + 100, 150))
    t_ms = np.round(times * 1000).astype(np.int64)
    compared = 0
    for rng_s in (14.0, 30.0, 300.0, 1200.0):
        lo, hi = window_bounds(times, te, rng_s)
        n = hi - lo + 1
        for block in (series, series[1:2]):
            for at in (te, times[np.clip(lo, 0, times.size - 1)]):  # predict_linear, deriv
                # blocks of 2 series: the x sums shared between blocks, the last one short
                slope, icept = fn.regression(times, block, lo, n, at, block=2)
                i_ms = np.round(at * 1000).astype(np.int64)
                for b, v in enumerate(block):
                    for i in range(te.size):
                        if n[i] <= 0:
                            assert np.isnan(slope[b, i]) and np.isnan(icept[b, i])
                            continue
                        want = _linear_regression(t_ms[lo[i]:hi[i] + 1].tolist(),
                                                  v[lo[i]:hi[i] + 1].tolist(), int(i_ms[i]))
                        _same(slope[b, i], want[0], ("slope", kind, rng_s, i))
                        _same(icept[b, i], want[1], ("intercept", kind, rng_s, i))
                        compared += 1
    assert compared > 3000


@pytest.mark.parametrize("kind", ["bytes", "counter", "small", "mixed", "disk", "huge"])
def test_regression_of_whole_numbers_equals_prometheus_bit_for_bit(kind):
    """Scrapes on whole seconds evaluated on whole seconds, whole-number values: the sums
    of whole-number terms are taken from prefix sums of integers, rounded once (and not
    where a value is fractional, a product x*y would be inexact or a term too big): the
    same bits as Go's order, also where Go's partial sums pass 2**53 and round ("disk":
    the x*y sums; "huge": the y sums too)."""
    rng = np.random.default_rng(len(kind))
    times = np.cumsum(rng.choice([15.0, 15.0, 30.0, 60.0], 300)) + 1.7e9
    v = {"bytes": np.cumsum(rng.integers(-1e6, 1e6, times.size)) + 5e10,
         "counter": np.cumsum(rng.integers(0, 1000, times.size)).astype(float),
         "small": rng.integers(-3, 4, times.size).astype(float),
         "mixed": np.round(rng.normal(0, 1e3, times.size)) + 0.5 * (rng.random(times.size)
                                                                    < 0.01),
         "disk": np.cumsum(rng.integers(-1e9, 1e9, times.size)) + 1.1e12,
         "huge": np.cumsum(rng.integers(-1e12, 1e12, times.size)) + 8e13}[kind]
    series = [v, v[::-1].copy(), np.full(times.size, 2.0 ** 52)]  # the last: terms too big
    te = np.round(np.sort(rng.uniform(times[0] - 100, times[-1] + 100, 120)))
    t_ms = np.round(times * 1000).astype(np.int64)
    took, xy, past = set(), set(), 0
    for rng_s in (60.0, 900.0, 3600.0):
        lo, hi = window_bounds(times, te, rng_s)
        n = hi - lo + 1
        for at in (te, times[np.clip(lo, 0, times.size - 1)]):
            on = n > 0
            i_ms = np.round(at * 1000).astype(np.int64)
            ends = (lo[on], lo[on] + n[on])
            took.add(fn.whole_x_sums(t_ms, i_ms, on, ends) is not None)
            took.add(fn.whole_sums(np.column_stack(series[:2]), on, ends) is not None)
            xy.add(fn.whole_xy_sums(t_ms, i_ms, on, ends, np.column_stack(series[:2]))
                   is not None)
            assert fn.whole_sums(np.column_stack(series), on, ends) is None
            x = (t_ms[:, None] - i_ms[on][None, :]) / 1e3  # (samples, windows)
            inside = (np.arange(times.size)[:, None] >= ends[0]) & (
                np.arange(times.size)[:, None] < ends[1])
            past = max(past, np.abs(np.where(inside, x * v[:, None], 0)).sum(axis=0).max(),
                       np.where(inside, np.abs(v)[:, None], 0).sum(axis=0).max())
            for blk in (series[:2], series):
                slope, icept = fn.regression(times, blk, lo, n, at, block=2)
                for b, s in enumerate(blk):
                    for i in np.flatnonzero(on):
                        want = _linear_regression(t_ms[lo[i]:hi[i] + 1].tolist(),
                                                  s[lo[i]:hi[i] + 1].tolist(), int(i_ms[i]))
                        _same(slope[b, i], want[0], ("slope", kind, rng_s, b, i))
                        _same(icept[b, i], want[1], ("intercept", kind, rng_s, b, i))
    assert took == ({True, False} if kind == "mixed" else {True})
    # (huge: the x*y of long windows would be inexact in Go, those of short ones are not)
    assert xy == {"mixed": {False}, "huge": {True, False}}.get(kind, {True})
    if kind in ("disk", "huge"):
        assert past > 2.0 ** 53  # Go's partial sums round: the compensation is not 0


@pytest.mark.parametrize("kind", ["gauge", "noise", "special", "steps"])
def test_kahan_window_sums_equal_prometheus_bit_for_bit(kind):
    """sum/avg/stdvar_over_time's compensated sums (TwoSum for Go's Neumaier branch);
    "steps": runs of one value (0, -0.0, 1, 0.1, 1e300, infinities, NaN), whose windows
    inside a run skip the mean's steps."""
    rng = np.random.default_rng(len(kind))
    if kind == "steps":
        values = np.repeat(rng.choice([0.0, -0.0, 1.0, 0.1, 1e300, np.inf, -np.inf, np.nan],
                                      30), rng.integers(1, 20, 30))[:300]
    else:
        values = _series(rng, 300, kind)
    times = np.arange(values.size, dtype=float)
    te = np.sort(rng.uniform(-5, values.size + 5, 200))
    for rng_s in (0.5, 3.0, 40.0):
        lo, hi = window_bounds(times, te, rng_s)
        n = hi - lo + 1
        total = fn.sum_count(values, lo, n, mean=False)
        avg = fn.sum_count(values, lo, n, mean=True)
        var = fn.stdvar_over_time(values, lo, n)
        for i in range(te.size):
            if n[i] <= 0:
                continue
            w = values[lo[i]:hi[i] + 1].tolist()
            _same(total[i], _sum_over_time(w), ("sum", i))
            _same(avg[i], _avg_over_time(w), ("avg", i))
            if avg[i] == 0:  # (0.0, not -0.0, as Go's mean + c)
                assert np.signbit(avg[i]) == (math.copysign(1, _avg_over_time(w)) < 0)
            _same(var[i], _stdvar_over_time(w), ("stdvar", i))


def test_window_rate_equals_prometheus_bit_for_bit():
    """rate/increase/delta of a block of series (a list of arrays, as PromQL's store gives
    them, and a Target's columns, as the controller reads them), with counter resets (one
    and several in a window), NaN samples, negative values, windows of 0, 1 and 2 samples
    and a cut (samples not written yet)."""
    rng = np.random.default_rng(7)
    times = np.sort(rng.choice(np.arange(0.0, 4000.0, 0.5), 900, replace=False))
    series = []
    for k in range(9):
        v = np.cumsum(rng.exponential(3.0, times.size))
        for at in rng.choice(times.size, k, replace=False):  # k counter resets
            v[at:] -= v[at] - rng.uniform(0, 2)
        if k % 3 == 0:
            v[rng.choice(times.size, 5, replace=False)] = np.nan
        if k == 4:
            v -= 50.0
        series.append(v)
    te = np.sort(rng.uniform(-100.0, 4200.0, 300))
    tgt = Target(-1, times, np.column_stack(series), [()] * len(series))
    compared = 0
    for rng_s, cut in ((1.0, None), (60.0, None), (300.0, te - 20.0), (2000.0, None)):
        lo, hi = window_bounds(times, te, rng_s, cut)
        assert (hi - lo + 1 <= 1).any() and (hi - lo + 1 == 2).any() or rng_s > 100
        for f, as_rate, counter in (("rate", True, True), ("increase", False, True),
                                    ("delta", False, False)):
            got = extrapolated_rate(times, series, lo, hi, te, rng_s, as_rate, counter)
            cols = increase(tgt, np.arange(len(series)), te, rng_s, as_rate=as_rate,
                            counter=counter, nan_samples=True, cut=cut)
            np.testing.assert_array_equal(cols.T, got)
            for v, row in zip(series, got, strict=True):
                for i in range(0, te.size, 3):
                    inside = [(times[j], v[j]) for j in range(lo[i], hi[i] + 1)]
                    _same(row[i], _extrapolated_rate(inside, te[i], rng_s, counter, as_rate),
                          (f, rng_s, i))
                    compared += 1
    assert np.isfinite(got).sum() > 1000 and compared > 5000


@pytest.mark.parametrize("present", ["all", "some"])
def test_sum_and_avg_across_series_add_in_order_to_the_bit(present):
    """``sum``/``avg`` aggregations: series added one by one in order (the mean as
    Prometheus' incremental mean), with every series present (no masks) and without."""
    rng = np.random.default_rng(11 if present == "all" else 12)
    for _ in range(60):
        m, t = int(rng.integers(1, 7)), int(rng.integers(1, 30))
        vals = rng.normal(0, 1e3, (m, t)) * 10.0 ** rng.integers(-5, 300)
        odd = rng.random((m, t)) < 0.1
        vals[odd] = rng.choice([np.nan, np.inf, -np.inf, -0.0, 1.7e308], odd.sum())
        oks = np.ones((m, t), dtype=bool) if present == "all" else rng.random((m, t)) < 0.7
        for mean in (False, True):
            got = fn.sequential(vals, oks, mean)
            for i in range(t):
                acc, n = 0.0, 0
                for v in vals[oks[:, i], i].tolist():
                    n += 1
                    # (Prometheus starts from the first value: -0.0 alone stays -0.0)
                    if n == 1 or not mean or not _mean_stays(acc, v):
                        acc = v if n == 1 else acc + (v / n - acc / n) if mean else acc + v
                _same(got[i], acc, ("mean" if mean else "sum", i))
                if acc == 0:
                    assert np.signbit(got[i]) == (math.copysign(1, acc) < 0)
