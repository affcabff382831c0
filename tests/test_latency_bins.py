"""The client latency histogram's bins, found from a float's bits (relakit.sim.latency_bins),
are the bins of their log10 definition for every double: checked on millions of latencies
over the whole range and beyond, on every edge and the doubles beside it."""

from __future__ import annotations

import numpy as np
from numba import njit

from relakit.sim import latency_bins as LB


@njit(cache=True)
def _disagreements(xs):
    bad = 0
    for x in xs:
        bad += LB.hist_bin(x) != LB.hist_bin_log10(x)
    return bad


def test_bins_equal_the_log10_definition_everywhere():
    rng = np.random.default_rng(17)
    spread = 10.0 ** rng.uniform(-6.0, 10.0, 3_000_000)  # beyond both ends of the range
    inner = LB.EDGES[1:-1]
    beside = np.concatenate([inner, np.nextafter(inner, 0.0), np.nextafter(inner, np.inf),
                             np.nextafter(np.nextafter(inner, 0.0), 0.0)])
    odd = np.array([0.0, -1.0, 5e-324, 1e-300, 1e-3, 1e7, 1e300, np.inf])
    for xs in (spread, beside, odd):
        assert _disagreements(xs) == 0


def test_edges_are_the_first_double_of_each_bin():
    b = np.arange(1, LB.HIST_BINS)
    edges = LB.EDGES[1:-1]
    at = np.array([LB.hist_bin_log10(x) for x in edges])
    below = np.array([LB.hist_bin_log10(x) for x in np.nextafter(edges, 0.0)])
    np.testing.assert_array_equal(at, b)
    np.testing.assert_array_equal(below, b - 1)
    # the bins are log-spaced as documented: 200 a decade from 1 us
    np.testing.assert_allclose(edges, 10.0 ** (LB.HIST_LOG10_MIN + b / LB.HIST_BINS_PER_DECADE),
                               rtol=1e-12)


def test_a_cell_never_holds_two_edges():
    # what the one compare in hist_bin relies on
    bits = LB.EDGES[1:-1].view(np.int64)
    cells = (((bits >> 52) & 0x7FF) - 1023 - LB.E_MIN) * (1 << LB.CELL_BITS) + (
        (bits >> (52 - LB.CELL_BITS)) & ((1 << LB.CELL_BITS) - 1))
    assert np.unique(cells).size == cells.size
