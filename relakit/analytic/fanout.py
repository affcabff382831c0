"""Fan-out arithmetic: how per-call reliability and latency compound across n calls.

A request that fans out to n backends is only as good as the combination of its calls:
it needs all of them (``fanout_success``), a quorum (``quorum_success``), and its latency is
set by the slowest one (``prob_any_slow``, ``slowest_of_n_quantile``). All results assume
the calls are *independent*; correlated failures (shared dependencies, common overload)
make reality worse than these numbers for all-of-n and better for any-of-n.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ._validate import (
    as_int,
    as_int_array,
    as_probability,
    as_probability_array,
    scalar_or_array,
)

__all__ = ["fanout_success", "prob_any_slow", "quorum_success", "slowest_of_n_quantile"]


def _per_call_probs(p: float | Sequence[float], n: int | None) -> tuple[np.ndarray | float, int]:
    """Normalise (p, n) to either (scalar p, n) or (array of per-call p, len)."""
    if np.ndim(p) == 0:
        if n is None:
            raise ValueError("n is required when p is a single per-call probability")
        return as_probability("p", p), as_int("n", n, 0)
    if np.ndim(p) != 1:
        raise ValueError(f"p must be a scalar or a 1-d sequence, got shape {np.shape(p)}")
    arr = as_probability_array("p", p)
    if n is not None and as_int("n", n, 0) != arr.size:
        raise ValueError(f"n={n} does not match len(p)={arr.size}; omit n or make them agree")
    return arr, arr.size


def fanout_success(p: float | Sequence[float], n: int | None = None) -> float:
    """Probability that all n independent calls succeed.

    ``p`` scalar with integer ``n``: ``p**n`` (identical calls). ``p`` a sequence of per-call
    success probabilities: their product (``n`` may be omitted, else must equal ``len(p)``).
    Example: 20 calls at 99 % each succeed together only ~81.8 % of the time.
    """
    probs, n_calls = _per_call_probs(p, n)
    if np.ndim(probs) == 0:
        return float(probs) ** n_calls
    return float(np.prod(probs))


def quorum_success(p: float | Sequence[float], n: int | None, k: int) -> float:
    """Probability that at least ``k`` of ``n`` independent calls succeed (0 <= k <= n).

    Scalar ``p``: binomial tail ``P(X >= k) = binom.sf(k-1, n, p)``. Sequence ``p``
    (heterogeneous calls): Poisson-binomial, computed exactly by the O(n^2) dynamic
    programme over the success count, which is stable because it only adds and multiplies
    probabilities.
    """
    probs, n_calls = _per_call_probs(p, n)
    k = as_int("k", k, 0)
    if k > n_calls:
        raise ValueError(f"k must be <= n (cannot need {k} successes out of {n_calls} calls)")
    if k == 0:
        return 1.0
    if np.ndim(probs) == 0:
        from scipy import stats  # here, not at import: scipy.stats costs ~0.5 s to load
        return float(stats.binom.sf(k - 1, n_calls, float(probs)))
    # dist[j] = P(j successes among the calls processed so far).
    dist = np.zeros(n_calls + 1)
    dist[0] = 1.0
    for i, pi in enumerate(probs, start=1):
        dist[1 : i + 1] = dist[1 : i + 1] * (1.0 - pi) + dist[:i] * pi
        dist[0] *= 1.0 - pi
    return float(min(1.0, dist[k:].sum()))


def prob_any_slow(q: float | np.ndarray, n: int | np.ndarray) -> float | np.ndarray:
    """Probability that at least one of ``n`` calls is slow, each slow independently w.p. ``q``.

    ``1 - (1-q)**n`` evaluated as ``-expm1(n * log1p(-q))`` so tiny q (e.g. 1e-9) does not
    round to zero. Vectorised: ``q`` and ``n`` broadcast against each other; scalar inputs
    give a float. This is why tail latency dominates fan-out: a 1 %-slow backend makes
    ~63 % of 100-way requests slow.
    """
    q_arr = as_probability_array("q", q)
    n_arr = as_int_array("n", n, 0).astype(float)
    q_arr, n_arr = np.broadcast_arrays(q_arr, n_arr)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = -np.expm1(n_arr * np.log1p(-q_arr))
    out = np.where(n_arr == 0, 0.0, out)  # q=1, n=0 would give 0 * -inf = nan
    return scalar_or_array(out)


def slowest_of_n_quantile(
    dist: Any | Callable[[Any], Any], n: int | np.ndarray, q: float | np.ndarray
) -> float | np.ndarray:
    """The ``q``-quantile of the maximum of ``n`` iid per-call latencies.

    ``P(max <= x) = F(x)**n``, so the quantile is ``F^{-1}(q**(1/n))``: the p99 of a 10-way
    fan-out is the per-call p99.9. ``dist`` is anything with a ``.ppf`` (e.g. a frozen
    ``scipy.stats`` distribution) or a callable ppf itself; it is called with an array when
    ``q`` or ``n`` is an array (they broadcast), with a float otherwise.
    """
    if hasattr(dist, "ppf"):
        ppf = dist.ppf
    elif callable(dist):
        ppf = dist
    else:
        raise ValueError("dist must have a .ppf method or be a callable ppf")
    q_arr = as_probability_array("q", q)
    n_arr = as_int_array("n", n, 1).astype(float)
    q_arr, n_arr = np.broadcast_arrays(q_arr, n_arr)
    with np.errstate(divide="ignore"):
        per_call = np.exp(np.log(q_arr) / n_arr)  # q**(1/n), exact at q=0 and q=1
    if per_call.ndim == 0:
        return float(ppf(float(per_call)))
    return np.asarray(ppf(per_call), dtype=float)
