"""Confidence intervals for simulation output (numpy and scipy only).

A single seeded run is one draw from a random experiment; reporting it without
its uncertainty lets noise pass for a finding. This module turns output into
intervals, and is a layer others call (the replication runner, ``compare``,
figures): it imports neither numba, the kernel nor the control plane.

Two honest routes to an interval for a steady-state mean, as in every
simulation text (Law, *Simulation Modeling and Analysis*, 5th ed., ch. 9):

* **Independent replications** (:func:`t_interval`): run the model ``n`` times
  with independent seeds, take one number per run, and use the Student t
  interval across those ``n`` numbers. The runs are independent by
  construction, so the only assumptions are near-normality of the per-run
  numbers and that warm-up bias is small next to the half-width.
* **Batch means within one long run** (:func:`batch_means`): observations in
  one run are autocorrelated (strongly near saturation), so the textbook
  ``s / sqrt(N)`` of the raw observations is far too small. Cutting the run
  into a few (20-30) long non-overlapping batches gives batch means that are
  nearly independent and nearly normal, if each batch is much longer than the
  correlation time; the lag-1 autocorrelation of the batch means is returned
  so a caller can tell when they are not.

Both need the initial transient removed: a run that starts empty
under-estimates a congested mean. :func:`mser5` picks the truncation point from
the data (White 1997; White, Cobb & Spratt 2000).

:func:`paired_difference` compares two configurations run on the same seeds
(common random numbers): the interval of the per-pair differences, and the
variance ratio ``(var a + var b) / var(a - b)`` that says how many times fewer
replications the pairing needed than independent sampling would have.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = [
    "BatchMeans",
    "ChanceMisses",
    "Interval",
    "PairedDifference",
    "batch_means",
    "binomial_interval",
    "chance_misses",
    "mser5",
    "paired_difference",
    "prediction_interval",
    "quantile_interval",
    "interval_text",
    "t_interval",
]

#: Batch count used when none is given. CONVENTIONS asks for about 20-30; the
#: coverage test (tests/test_stats.py) measures 20 at the stated run lengths.
DEFAULT_BATCHES = 20


def _scipy_stats():
    """``scipy.stats``, imported when an interval is first computed, not with this module:
    it costs 0.6-1 s (it pulls scipy.spatial, scipy.optimize, scipy.interpolate and
    parses every distribution's docstring), and ``relakit.simulate`` imports this module
    (through the rollout keys) without needing an interval."""
    from scipy import stats

    return stats


@dataclass(frozen=True)
class Interval:
    """A two-sided confidence interval for a mean: ``mean ± half_width``.

    ``n`` is the number of values the interval was built from (replications,
    or batches). With ``n == 1`` there is no estimate of spread, so
    ``half_width``, ``low`` and ``high`` are ``nan`` rather than a misleading 0.
    """

    mean: float
    half_width: float
    n: int
    low: float
    high: float
    confidence: float = 0.95

    def contains(self, value: float) -> bool:
        """True if ``value`` lies in ``[low, high]`` (False when the width is unknown)."""
        return bool(self.low <= value <= self.high)


@dataclass(frozen=True)
class BatchMeans:
    """Batch-means interval from one run, with what a reader needs to trust it.

    ``warmup`` observations were deleted from the front (chosen by MSER-5 when
    asked); ``batch_size * batches`` observations were used; ``lag1`` is the
    lag-1 autocorrelation of the batch means: well above ~0.2 says the batches
    are too short for the correlation time and the interval under-covers.
    """

    interval: Interval
    warmup: int
    batches: int
    batch_size: int
    lag1: float


@dataclass(frozen=True)
class PairedDifference:
    """Interval of ``a - b`` over paired runs, and the variance reduction of pairing.

    ``variance_ratio = (var(a) + var(b)) / var(a - b)``: the variance of the
    difference of two independent samples over that of the paired one. With
    common random numbers it is > 1 (the pairing paid); ~1 means the pairs
    were effectively independent; < 1 means the pairing hurt.
    """

    interval: Interval
    mean_a: float
    mean_b: float
    variance_ratio: float

    @property
    def significant(self) -> bool | None:
        """Whether the interval excludes zero (None when it could not be computed)."""
        iv = self.interval
        return bool(iv.low > 0 or iv.high < 0) if np.isfinite(iv.half_width) else None

    def columns(self) -> dict:
        """The difference as the columns every paired table carries (``relakit
        compare``, a search's incumbent table, a rollout's observations)."""
        iv = self.interval
        return {"difference": iv.mean, "difference_ci": iv.half_width,
                "difference_low": iv.low, "difference_high": iv.high,
                "significant": self.significant, "variance_ratio": self.variance_ratio}


def _as_series(values, what: str) -> np.ndarray:
    x = np.asarray(values, dtype=float)
    if x.ndim != 1:
        raise ValueError(f"{what}: expected a 1-D sequence of numbers, got shape {x.shape}")
    if x.size == 0:
        raise ValueError(f"{what}: empty; at least one value is needed")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"{what}: contains nan or inf at index {int(np.argmin(np.isfinite(x)))}")
    return x


def _check_confidence(confidence: float) -> float:
    c = float(confidence)
    if not 0.0 < c < 1.0:
        raise ValueError(f"confidence: must lie strictly between 0 and 1, got {confidence!r}")
    return c


def _student(values, confidence: float, spread) -> Interval:
    """``mean ± t_{(1+c)/2, n-1} * s * spread(n)``: the t and prediction intervals."""
    x = _as_series(values, "values")
    c = _check_confidence(confidence)
    n = int(x.size)
    mean = float(x.mean())
    if n == 1:
        return Interval(mean, float("nan"), 1, float("nan"), float("nan"), c)
    half = float(_scipy_stats().t.ppf(0.5 + c / 2.0, n - 1) * x.std(ddof=1) * spread(n))
    return Interval(mean, half, n, mean - half, mean + half, c)


def t_interval(values, confidence: float = 0.95) -> Interval:
    """Student t interval for the mean of independent values (e.g. one per replication).

    ``mean ± t_{(1+c)/2, n-1} * s / sqrt(n)`` with ``s`` the sample standard
    deviation (``ddof=1``). Use t, not the normal 1.96: with the 5-10
    replications a study can afford, z under-covers (P(|T_4| < 1.96) is about
    0.88 for five values). With one value the half-width is ``nan``: one run
    carries no information about its own spread.
    """
    return _student(values, confidence, lambda n: np.sqrt(1.0 / n))


def mser5(series) -> int:
    """Number of leading observations to delete as warm-up, by MSER-5.

    MSER (marginal standard error rule, White 1997, "An effective truncation
    heuristic for bias reduction in simulation output", *Simulation* 69(6);
    White, Cobb & Spratt 2000, WSC) picks the truncation ``d`` minimising
    ``sum_{j>d} (Z_j - mean_{j>d} Z)^2 / (m - d)^2`` - the squared standard
    error of the truncated mean, had the rest been independent. Deleting
    biased early values shrinks the spread faster than losing data widens it;
    once the bias is gone, deleting more only costs. MSER-5 applies the rule
    to means ``Z_j`` of non-overlapping batches of 5, which smooths the
    statistic; ``d`` ranges over the first half of the batches only, since
    near the end the statistic is noise. A result at that limit (about half
    the series) means the run never settled: run longer.

    Returns the truncation point in observations (a multiple of 5).
    Vectorised: suffix sums, no loop over observations.
    """
    x = _as_series(series, "series")
    m = x.size // 5
    if m < 2:
        return 0
    z = x[: 5 * m].reshape(m, 5).mean(axis=1)
    z = z - z.mean()  # centring keeps the sum-of-squares difference well conditioned
    # suffix sums: s1[d] = sum_{j>=d} z_j, s2[d] = sum_{j>=d} z_j^2, for d = 0..m-1
    s1 = np.cumsum(z[::-1])[::-1]
    s2 = np.cumsum((z * z)[::-1])[::-1]
    k = np.arange(m, 0, -1, dtype=float)  # batches remaining after deleting d
    stat = (s2 - s1 * s1 / k) / (k * k)
    half = max(1, (m + 1) // 2)  # candidates d = 0 .. ceil(m/2) - 1
    return int(np.argmin(stat[:half])) * 5


def batch_means(series, batches: int = DEFAULT_BATCHES, warmup: int | str = 0,
                confidence: float = 0.95) -> BatchMeans:
    """Interval for the steady-state mean of one long, autocorrelated series.

    ``series`` is the output in time order (e.g. response times by arrival).
    ``warmup`` is the number of leading observations to delete, or ``"auto"``
    for :func:`mser5`. The rest is cut into ``batches`` equal non-overlapping
    batches (the remainder that does not divide evenly is deleted from the
    front, next to the warm-up, where residual bias would be); the interval is
    :func:`t_interval` over the batch means, with ``batches - 1`` degrees of
    freedom.

    Why a fixed, small batch count (Schmeiser 1982, "Batch size effects in
    the analysis of simulation experiments", *Oper. Res.* 30(3)): past ~30
    batches the t quantile barely improves, while shorter batches are more
    correlated; 20-30 long batches is the safe middle. Check ``lag1``.
    """
    x = _as_series(series, "series")
    b = int(batches)
    if b != batches or b < 2:
        raise ValueError(f"batches: must be an integer >= 2, got {batches!r}")
    if isinstance(warmup, str):
        if warmup != "auto":
            raise ValueError(f"warmup: expected a number of observations or 'auto', got {warmup!r}")
        cut = mser5(x)
    else:
        cut = int(warmup)
        if cut != warmup or cut < 0:
            raise ValueError(f"warmup: must be a non-negative integer or 'auto', got {warmup!r}")
    size = (x.size - cut) // b
    if size < 1:
        raise ValueError(f"series: {x.size} observations, {cut} deleted as warm-up, "
                         f"too few for {b} batches")
    cut = x.size - size * b  # delete the uneven remainder with the warm-up
    means = x[cut:].reshape(b, size).mean(axis=1)
    dev = means - means.mean()
    denom = float(dev @ dev)
    lag1 = float(dev[:-1] @ dev[1:] / denom) if denom > 0 else float("nan")
    return BatchMeans(t_interval(means, confidence), cut, b, size, lag1)


def paired_difference(a, b, confidence: float = 0.95) -> PairedDifference:
    """Interval of the mean of ``a - b`` over paired runs, and the variance ratio.

    ``a[i]`` and ``b[i]`` must come from the same replication seed (common
    random numbers), so the pair shares its noise and the difference cancels
    it. The interval is :func:`t_interval` of the differences (paired t).
    ``variance_ratio = (var a + var b) / var(a - b)`` (sample variances,
    ``ddof=1``) is the factor by which independent seeds would need more
    replications for the same half-width (Law 2015, sec. 11.2): ``inf`` when
    the differences do not vary at all, ``nan`` with fewer than two pairs.
    """
    xa = _as_series(a, "a")
    xb = _as_series(b, "b")
    if xa.size != xb.size:
        raise ValueError(f"a and b: paired samples need equal lengths, got {xa.size} and {xb.size}")
    d = xa - xb
    iv = t_interval(d, confidence)
    if d.size < 2:
        ratio = float("nan")
    else:
        vd = float(d.var(ddof=1))
        vs = float(xa.var(ddof=1) + xb.var(ddof=1))
        ratio = vs / vd if vd > 0 else (float("nan") if vs == 0 else float("inf"))
    return PairedDifference(iv, float(xa.mean()), float(xb.mean()), ratio)


def prediction_interval(values, confidence: float = 0.95) -> Interval:
    """Where one *more* independent value would fall: ``mean ± t s sqrt(1 + 1/n)``.

    :func:`t_interval` says where the mean is; this says where a single new run
    lands (Student t prediction interval, for near-normal values), which is the
    question when one outside observation (a recorded live run, say) is set
    beside ``n`` simulated replications: a value outside it is unlikely to be
    one more draw of the same model. ``nan`` half-width with one value.
    """
    return _student(values, confidence, lambda n: np.sqrt(1.0 + 1.0 / n))


def binomial_interval(successes: int, trials: int, confidence: float = 0.95) -> Interval:
    """Clopper-Pearson (exact) interval for a share of ``trials`` independent trials.

    A share of a dozen trials that came out 0 or 1 has no spread for a t
    interval to use, yet it is not certain; the exact interval (beta quantiles)
    is the honest one there: 0 of 12 gives [0, 0.26]. ``mean`` is the observed
    share, ``half_width`` the larger of its distances to the two ends (the
    interval is not symmetric), ``n`` the trials.
    """
    k, n = int(successes), int(trials)
    if n < 1 or not 0 <= k <= n or k != successes or n != trials:
        raise ValueError(f"successes and trials: need integers 0 <= successes <= trials and "
                         f"trials >= 1, got {successes!r} of {trials!r}")
    c = _check_confidence(confidence)
    alpha = 1.0 - c
    beta = _scipy_stats().beta
    low = 0.0 if k == 0 else float(beta.ppf(alpha / 2, k, n - k + 1))
    high = 1.0 if k == n else float(beta.ppf(1 - alpha / 2, k + 1, n - k))
    share = k / n
    return Interval(share, max(share - low, high - share), n, low, high, c)


@dataclass(frozen=True)
class ChanceMisses:
    """How many of ``intervals`` independent intervals miss their true value by chance.

    ``p_any``: the probability that one or more miss; ``allowed``: the most misses
    a correct model is expected to show, i.e. the fewest with
    P(more than ``allowed``) <= ``level``; ``p_more``: that probability.
    """

    intervals: int
    confidence: float
    p_any: float
    allowed: int
    p_more: float


def chance_misses(intervals: int, confidence: float = 0.95, level: float = 0.05) -> ChanceMisses:
    """Misses of a family of ``intervals`` independent ``confidence`` intervals around
    correct closed forms (each misses with probability ``1 - confidence``): Binomial.

    A notebook that tests many closed forms against their intervals quotes these
    instead of typing them: 12 intervals at 95 % miss at least once with probability
    46 %, and 3 or more (``allowed`` 2) with probability 2 %.
    """
    k = int(intervals)
    if k < 1 or k != intervals:
        raise ValueError(f"intervals: need an integer >= 1, got {intervals!r}")
    c = _check_confidence(confidence)
    if not 0.0 < level < 1.0:
        raise ValueError(f"level: must lie strictly between 0 and 1, got {level!r}")
    binom = _scipy_stats().binom
    allowed = 0
    while float(binom.sf(allowed, k, 1.0 - c)) > level * (1 + 1e-9):  # 1e-9: rounding at the level
        allowed += 1
    return ChanceMisses(k, c, float(1.0 - c ** k), allowed, float(binom.sf(allowed, k, 1.0 - c)))


def quantile_interval(values, q: float, confidence: float = 0.95) -> Interval:
    """Distribution-free interval for the ``q`` quantile of independent values.

    The number of values below the true quantile is Binomial(n, q), so the
    order statistics at that binomial's ``(1 - c)/2`` and ``(1 + c)/2`` quantiles
    bracket it with probability at least ``c`` whatever the distribution (no
    normality, unlike a t interval; Conover, *Practical Nonparametric
    Statistics*, sec. 3.2). ``mean`` is ``numpy.quantile(values, q)``,
    ``half_width`` the larger distance to an end; ends beyond the sample (too
    few values for that confidence) are ``nan``.
    """
    x = np.sort(_as_series(values, "values"))
    c = _check_confidence(confidence)
    if not 0.0 < q < 1.0:
        raise ValueError(f"q: must lie strictly between 0 and 1, got {q!r}")
    n = int(x.size)
    binom = _scipy_stats().binom
    lo_k = int(binom.ppf((1.0 - c) / 2.0, n, q))  # values below the low end
    hi_k = int(binom.ppf((1.0 + c) / 2.0, n, q)) + 1  # 1-based rank of the high end
    low = float(x[lo_k - 1]) if lo_k >= 1 else float("nan")
    high = float(x[hi_k - 1]) if hi_k <= n else float("nan")
    est = float(np.quantile(x, q))
    half = max(est - low, high - est) if low == low and high == high else float("nan")
    return Interval(est, half, n, low, high, c)


def interval_text(mean: float, half_width: float, decimals: int = 3, signed: bool = False
                  ) -> str:
    """``mean ± half-width`` with at least ``decimals`` decimals, as many more as the
    half-width's first significant digit needs (the mean's, when the half-width is 0), and
    more again until the interval as printed excludes 0 exactly when the interval does: a
    paired difference of 0.0004 ± 0.0002 was printed ``+0.000 ± 0.000`` and counted
    better, one of -0.0024 ± 0.0018 would read ``-0.002 ± 0.002``. ``signed``: the mean
    with its sign (a difference). A NaN half-width (one run): the mean alone."""
    lead = abs(half_width) if half_width == half_width and half_width else abs(mean)
    d = decimals
    if lead and np.isfinite(lead):
        d = max(decimals, -int(np.floor(np.log10(lead))))
    if half_width == half_width and np.isfinite(mean) and np.isfinite(half_width):

        def excludes(m, h):
            return m - h > 0 or m + h < 0

        while d < 17 and excludes(mean, half_width) != excludes(round(mean, d),
                                                               round(abs(half_width), d)):
            d += 1
    head = f"{mean:+.{d}f}" if signed else f"{mean:.{d}f}"
    return head if half_width != half_width else f"{head} ± {abs(half_width):.{d}f}"
