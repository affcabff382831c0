"""The client latency histogram's bins, found without a logarithm.

The kernels count every finished user request in a log-spaced histogram: bin
``b`` holds latencies (ms) with ``floor((log10(ms) - HIST_LOG10_MIN) *
HIST_BINS_PER_DECADE) == b``, clamped to ``[0, HIST_BINS - 1]``
(:func:`hist_bin_log10`, the definition). A ``log10`` per request was 16-19 %
of a plain M/M/8 run (benchmarks/bench_kernel.py, A/B in one process), more
than the two logs that draw the request's gap and demand together cost beyond
C's; so :func:`hist_bin` finds the same bin from the float's bits instead.

How: the exponent and the top ``CELL_BITS`` bits of the mantissa name a
*cell*, a slice of one binade 2^(1/256) wide, narrower than a bin
(10^(1/200)), so at most one bin edge falls inside a cell. ``CELL_BIN[cell]``
is the bin of the cell's lowest value; one compare with the next edge
(``EDGES``) finishes. The edges are the definition's own: ``EDGES[b]`` is the
smallest double whose :func:`hist_bin_log10` is ``b`` or more, found by
stepping ulps from 10^(b/200 - 3) with the same ``math.log10`` (Python's and
numba's both call the C library's). So the two functions agree on every
double, not approximately (tests/test_latency_bins.py checks millions of
latencies, the edges and their neighbours, against the numba-compiled
definition).

Both tables are module globals, which numba freezes into the compiled kernels
as constants: an edit here must rename the kernels' cache entries (cachename.py
digests this file with kernel.py and rng.py).
"""

from __future__ import annotations

import math

import numpy as np

from relakit.jit import intrinsic, njit, register_jitable

HIST_LOG10_MIN, HIST_BINS_PER_DECADE, HIST_DECADES = -3.0, 200, 10
HIST_BINS = HIST_BINS_PER_DECADE * HIST_DECADES
CELL_BITS = 8  # mantissa bits naming a cell: 2^(1/256) < 10^(1/200), one edge at most


def _bin_log10(latency_ms):
    """The bin by its definition (one log10). In Python it finds the edges; compiled
    (:func:`hist_bin_log10`) it is what :func:`hist_bin` is tested against."""
    if latency_ms <= 0.0:
        return 0
    x = (math.log10(latency_ms) - HIST_LOG10_MIN) * HIST_BINS_PER_DECADE
    if x < 0.0:
        return 0
    if x >= HIST_BINS:
        return HIST_BINS - 1
    return int(x)


hist_bin_log10 = njit(cache=True, error_model="numpy")(_bin_log10)


def _edges() -> np.ndarray:
    """EDGES[b]: the smallest double in bin b or above (b = 1 .. HIST_BINS - 1);
    EDGES[0] = 0 and EDGES[HIST_BINS] = inf bracket them."""
    edges = np.empty(HIST_BINS + 1)
    edges[0], edges[HIST_BINS] = 0.0, math.inf
    log10, nextafter = math.log10, math.nextafter
    for b in range(1, HIST_BINS):
        x = 10.0 ** (HIST_LOG10_MIN + b / HIST_BINS_PER_DECADE)
        # _bin_log10(x) >= b, written out (x > 0, and 1 <= b < HIST_BINS, so its clamps and
        # int() change no comparison): every import runs this, 6 ms instead of 14 ms here
        while (log10(x) - HIST_LOG10_MIN) * HIST_BINS_PER_DECADE >= b:
            x = nextafter(x, 0.0)  # step down below the edge, then up onto it
        while (log10(x) - HIST_LOG10_MIN) * HIST_BINS_PER_DECADE < b:
            x = nextafter(x, math.inf)
        edges[b] = x
    return edges


EDGES = _edges()
# the binades the edges span: below E_MIN every double is in bin 0, above E_MAX in the last
E_MIN = math.frexp(EDGES[1])[1] - 1
E_MAX = math.frexp(EDGES[HIST_BINS - 1])[1] - 1


def _cell_bins() -> np.ndarray:
    """CELL_BIN[cell]: the bin of each cell's lowest double (by the edges, exactly)."""
    exps = np.arange(E_MIN, E_MAX + 1, dtype=np.float64)
    frac = 1.0 + np.arange(1 << CELL_BITS) / (1 << CELL_BITS)
    lows = (np.exp2(exps)[:, None] * frac[None, :]).ravel()  # exact: powers of 2 times frac
    return (np.searchsorted(EDGES, lows, side="right") - 1).astype(np.int16)


CELL_BIN = _cell_bins()


@intrinsic
def float_bits(typingctx, x):
    """The IEEE-754 bits of a float64, as an int64 (a bitcast: no memory round trip)."""
    from llvmlite import ir
    from numba import types

    if x != types.float64:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(64))

    return types.int64(types.float64), codegen


# compiled into the loops that call it, without a C wrapper (kernel.py says why)
@register_jitable(error_model="numpy", no_cfunc_wrapper=True)
def hist_bin(latency_ms):
    """The histogram bin of a latency in ms: :func:`hist_bin_log10`'s, for every double."""
    if latency_ms <= 0.0:
        return 0
    bits = float_bits(latency_ms)
    e = ((bits >> 52) & 0x7FF) - 1023
    if e < E_MIN:
        return 0
    if e > E_MAX:
        return HIST_BINS - 1
    cell = (e - E_MIN) * (1 << CELL_BITS) + ((bits >> (52 - CELL_BITS)) & ((1 << CELL_BITS) - 1))
    b = np.int64(CELL_BIN[cell])
    return b + (latency_ms >= EDGES[b + 1])  # branch-free: the edge is above in most cells
