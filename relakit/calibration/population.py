"""Open arrivals or a closed population, per tier: which the recording shows, and N and Z.

A closed population of N clients, each thinking Z seconds between an answer and its
next request, sends at X = N / (R + Z) (the interactive response-time law, R the mean
response time): its offered rate *falls* as latency rises, and X (R + Z) stays at N
whatever the load. Open arrivals come whatever the latency: where their rate rises,
the latency rises with it.

Per tier, over the arrival bins: X_b from the tier's request counter (the fleet's
``client_requests_total{tier}``, else the nodes' ``requests_total{tier}``), R_b from
the nodes' ``latency_seconds_sum`` over ``latency_seconds_count`` (the servers' view of
the response time: the client's when a request is one copy, fan-out 1). The law is
linear in 1 / X: 1 / X_b = R_b / N + Z / N, so a least-squares line of 1 / X on R
gives N = 1 / slope and Z = intercept / slope, with intervals from the line's
(Student's t over the bins, the slope's and intercept's standard errors propagated);
the slope is an instrumental-variable one (:func:`_line`), since a bin's latency is
measured with noise.

A tier is judged **closed** when all of these hold, else **open** (the default, as
before), and the report says which test decided:

* the slope is positive and its 95 % interval excludes 0: the rate falls as latency
  rises, beyond chance (a load step in an open workload gives a negative slope; a
  steady one, no significant slope: nothing tells a closed population from open
  arrivals then, and the twin keeps the open curve);
* Z > 0 (a negative think time is no population);
* N_b = X_b (R_b + Z) is steady: its coefficient of variation over the bins is at
  most :data:`MAX_SPREAD` (a tier thinking long varies its rate little, so its spread
  is mostly the counts' own noise: the slope's test, not the spread, is the evidence).

Known bias: the recording's latency has no tier label, so R_b is every tier's. A closed
client arrives to a shorter queue than an open (Poisson) one (the arrival theorem), so
beside open tiers or closed tiers of other think times, a closed tier's own latency is
below R_b under load, the slope is flattened and N reads high: by 4 % (two closed tiers)
and 10 % (a closed tier beside an open one) in the tests, against none for one tier.

The think-time distribution's shape cannot be told from counters: the twin writes it
exponential, and says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from relakit.calibration.arrivals import monotone
from relakit.calibration.recording import Recording
from relakit.vocab import TIERS

MAX_SPREAD = 0.10    # at most this coefficient of variation of X (R + Z) over the bins
MIN_REQUESTS = 200   # a tier with fewer requests than this is left open (too few to judge)


@dataclass
class TierPopulation:
    """One tier's verdict, with its numbers."""

    tier: str
    closed: bool
    reason: str                      # which test decided, with its numbers
    population: float = math.nan     # N
    population_ci: tuple = (math.nan, math.nan)
    think_s: float = math.nan        # Z
    think_ci: tuple = (math.nan, math.nan)
    spread: float = math.nan         # coefficient of variation of X (R + Z) over the bins
    rate_spread: float = math.nan    # coefficient of variation of X over the bins


@dataclass
class PopulationFit:
    tiers: dict                      # tier -> TierPopulation (tiers with requests)
    bin_s: float
    latency_source: str

    @property
    def closed_tiers(self) -> tuple[str, ...]:
        return tuple(t for t in TIERS if t in self.tiers and self.tiers[t].closed)

    @property
    def open_tiers(self) -> tuple[str, ...]:
        return tuple(t for t in TIERS if t in self.tiers and not self.tiers[t].closed)

    @property
    def kind(self) -> str:
        """'open', 'closed' or 'mixed'."""
        if not self.closed_tiers:
            return "open"
        return "mixed" if self.open_tiers else "closed"

    def note(self) -> str:
        """Which workload was chosen and why, tier by tier, in one line."""
        return f"{self.kind}: " + "; ".join(f"{t} {'closed' if p.closed else 'open'} ({p.reason})"
                                            for t, p in self.tiers.items())


def _binned(t: np.ndarray, cum: np.ndarray, edges: np.ndarray) -> np.ndarray:
    return np.diff(np.interp(edges, t, monotone(cum)))


def tier_counts(rec: Recording, edges: np.ndarray) -> np.ndarray:
    """(tiers, bins): requests counted per tier in each bin (every outcome)."""
    if rec.client_requests is not None and rec.client_requests.sum() > 0:
        return np.array([_binned(rec.fleet_t, rec.client_requests[:, k, :].sum(axis=1), edges)
                         for k in range(len(TIERS))])
    return np.array([sum(_binned(n.t, n.requests[:, k, :].sum(axis=1), edges)
                         for n in rec.nodes) for k in range(len(TIERS))])


def response_times(rec: Recording, edges: np.ndarray) -> tuple[np.ndarray, str]:
    """Per bin, the mean latency the servers measured (s); NaN where none was served."""
    nodes = [n for n in rec.nodes if n.lat_sum is not None and n.lat_count is not None]
    if not nodes:
        return np.full(edges.size - 1, np.nan), "none (no latency_seconds_sum and _count)"
    total = sum(_binned(n.t, n.lat_sum, edges) for n in nodes)
    count = sum(_binned(n.t, n.lat_count, edges) for n in nodes)
    with np.errstate(invalid="ignore", divide="ignore"):
        r = np.where(count > 0, total / count, np.nan)
    return r, "the nodes' latency_seconds_sum / latency_seconds_count"


def _line(x: np.ndarray, y: np.ndarray):
    """y = a + b x where x is measured with noise: (a, b, se_a, se_b, cov_ab, dof).

    A bin's mean latency is itself an estimate, and noise in x flattens a least-squares
    slope by var(x) / (var(x) + noise) (regression dilution: N came out 10 % high in the
    round trip). So the slope is an instrumental-variable one, the previous bin's latency
    the instrument: it moves with the true latency (which persists from bin to bin) and
    not with this bin's noise (independent from bin to bin). Taking the noise variance
    out of the sum of squares instead (from successive differences) overcorrected: real
    bin-to-bin changes of the latency, which the rate follows, counted as noise."""
    z, x, y = x[:-1], x[1:], y[1:]
    n = x.size
    zm, xm, ym = z.mean(), x.mean(), y.mean()
    szx = ((z - zm) * (x - xm)).sum()
    szz = ((z - zm) ** 2).sum()
    b = ((z - zm) * (y - ym)).sum() / szx
    a = ym - b * xm
    resid = y - a - b * x
    s2 = (resid ** 2).sum() / (n - 2)
    se_b = math.sqrt(s2 * szz / szx ** 2)
    se_a = math.sqrt(s2 / n + (xm * se_b) ** 2)
    cov = -xm * se_b ** 2
    return a, b, se_a, se_b, cov, n - 2


def judge_tier(tier: str, counts: np.ndarray, r: np.ndarray, bin_s: float) -> TierPopulation:
    """One tier's verdict from its per-bin counts and the per-bin response time."""
    from scipy import stats

    total = counts.sum()
    ok = np.isfinite(r) & (counts > 0)
    if total < MIN_REQUESTS or ok.sum() < 5:
        return TierPopulation(tier, False, f"{total:.0f} requests in {ok.sum()} bins: too few "
                                           "to judge")
    x = counts[ok] / bin_s
    rr = r[ok]
    if rr.std() <= 0:
        return TierPopulation(tier, False, "latency never varied: a closed population cannot "
                                           "be told from open arrivals")
    a, b, se_a, se_b, cov, dof = _line(rr, 1.0 / x)
    tq = float(stats.t.ppf(0.975, dof))
    rate_cv = float(x.std() / x.mean())
    if b - tq * se_b <= 0:
        return TierPopulation(tier, False, f"the rate does not fall as latency rises (slope of "
                                           f"1/X on R {b:.3g} ± {tq * se_b:.2g})",
                              rate_spread=rate_cv)
    n_hat, z_hat = 1.0 / b, a / b
    if z_hat <= 0:
        return TierPopulation(tier, False, f"the law's think time is {z_hat:.3g} s, not > 0",
                              rate_spread=rate_cv)
    spread = float(np.std(x * (rr + z_hat)) / np.mean(x * (rr + z_hat)))
    # intervals: N = 1/b by its slope's; Z = a/b by the delta method
    n_ci = (1.0 / (b + tq * se_b), 1.0 / (b - tq * se_b))
    se_z = math.sqrt((se_a / b) ** 2 + (a * se_b / b ** 2) ** 2 - 2 * a * cov / b ** 3)
    z_ci = (z_hat - tq * se_z, z_hat + tq * se_z)
    fit = TierPopulation(tier, False, "", n_hat, n_ci, z_hat, z_ci, spread, rate_cv)
    if spread > MAX_SPREAD:
        fit.reason = (f"X (R + Z) varies by {spread:.1%} over the bins (X by {rate_cv:.1%}): "
                      "the law does not hold")
        return fit
    fit.closed = True
    fit.reason = (f"the rate falls as latency rises; X (R + Z) steady within {spread:.1%} while "
                  f"X varies {rate_cv:.1%}: N {n_hat:.1f} [{n_ci[0]:.1f}, {n_ci[1]:.1f}], Z "
                  f"{1000 * z_hat:.0f} ms [{1000 * z_ci[0]:.0f}, {1000 * z_ci[1]:.0f}]")
    return fit


def fit_population(rec: Recording, edges: np.ndarray) -> PopulationFit:
    """Per tier with requests: open or closed, and N, Z for a closed one."""
    counts = tier_counts(rec, edges)
    r, source = response_times(rec, edges)
    bin_s = float(edges[1] - edges[0])
    tiers = {t: judge_tier(t, counts[k], r, bin_s) for k, t in enumerate(TIERS)
             if counts[k].sum() > 0}
    return PopulationFit(tiers, bin_s, source)


def open_share(rec: Recording, edges: np.ndarray, fit: PopulationFit) -> np.ndarray:
    """Per bin, the open tiers' share of the requests (the rest are the closed tiers')."""
    counts = tier_counts(rec, edges)
    open_k = [TIERS.index(t) for t in fit.open_tiers]
    total = counts.sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        share = np.where(total > 0, counts[open_k].sum(axis=0) / total, 0.0)
    return share
