"""Prometheus' Go functions transcribed sample by sample in Python (2.42, promql/*.go):
the oracles the numpy functions are held equal to, bit for bit, in one place."""

from __future__ import annotations

import math


def div(a, b):
    """a / b as Go divides floats (Python raises on a zero divisor)."""
    if b != 0 or math.isnan(b):
        return a / b
    if a == 0 or math.isnan(a):
        return math.nan
    return math.copysign(math.inf, a) * math.copysign(1.0, b)


def extrapolated_rate(samples, t, range_s, is_counter, is_rate):
    """extrapolatedRate (promql/functions.go, 2.42) over the window's samples."""
    if len(samples) < 2:
        return math.nan
    (t_first, first), (t_last, last) = samples[0], samples[-1]
    result = last - first
    if is_counter:
        prev = 0.0
        for _, v in samples:
            if v < prev:
                result += prev
            prev = v
    to_start, to_end = t_first - (t - range_s), t - t_last
    sampled = t_last - t_first
    avg = sampled / (len(samples) - 1)
    if is_counter and result > 0 and first >= 0:
        to_zero = sampled * (first / result)
        if to_zero < to_start:
            to_start = to_zero
    threshold = avg * 1.1
    interval = sampled + (to_start if to_start < threshold else avg / 2)
    interval += to_end if to_end < threshold else avg / 2
    factor = div(interval, sampled)
    if is_rate:
        factor /= range_s
    return result * factor
