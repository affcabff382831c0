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

R_b is the tier's own mean latency where the nodes' latency_seconds_sum and _count carry
the tier label (the lab's do), else every tier's. From every tier's, a closed client
arrives to a shorter queue than an open (Poisson) one (the arrival theorem), so beside open
tiers or closed tiers of other think times, its own latency is below R_b under load, the
slope is flattened and N reads high: by 4 % (two closed tiers) and 12 % (a closed tier
beside an open one: 22.4 for 20) in the tests, against none for one tier or the tier's own latency.

The intervals take the bins' residuals as independent: the bins' rate and latency carry
over, the residuals of the line do not (lag-1 autocorrelation -0.08 over 39 lab
recordings), and Newey-West errors covered less, synthetic and live (docs/performance.md).

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
LEVEL = 0.95         # the intervals' confidence; the verdicts' tests stay at 95 % whatever
#                      level the intervals are asked at (``level``: a joint check's wider)


@dataclass
class Phase:
    """A stretch of a stepped population (a load test run in phases): N from start_s on."""

    start_s: float
    population: float
    population_ci: tuple
    bins: int                        # bins inside it that the fit used
    ci_at_z: tuple = (math.nan, math.nan)  # N's interval at the point Z (phases compared:
    #                                        Z's own uncertainty moves them all together)


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
    phases: list | None = None       # a population schedule (list of Phase); None: constant N
    awaits_think: bool = False       # stepped, judged without a Z: judged again given one
    level: float = LEVEL             # the intervals' confidence


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


def tiers_labelled(rec: Recording) -> bool:
    """Whether every node's latency series carry the tier label (the lab's do): each
    tier's own latency can then be read (a node without: every tier's, for all)."""
    nodes = [n for n in rec.nodes if n.lat_sum is not None and n.lat_count is not None]
    return bool(nodes) and all(n.tier_lat_sum is not None and n.tier_lat_count is not None
                               for n in nodes)


def response_times(rec: Recording, edges: np.ndarray,
                   tier: str | None = None) -> tuple[np.ndarray, str]:
    """Per bin, the mean latency the servers measured (s); NaN where none was served.

    ``tier``: that tier's own, where the nodes' latency series carry the tier label (the
    lab's do); else, and for ``None``, every tier's."""
    nodes = [n for n in rec.nodes if n.lat_sum is not None and n.lat_count is not None]
    if not nodes:
        return np.full(edges.size - 1, np.nan), "none (no latency_seconds_sum and _count)"
    if tier is not None and tiers_labelled(rec):
        k = TIERS.index(tier)
        parts = [(n.tier_lat_sum[:, k], n.tier_lat_count[:, k]) for n in nodes]
        source = "the nodes' latency_seconds_sum / _count per tier (each tier's own)"
    else:
        parts = [(n.lat_sum, n.lat_count) for n in nodes]
        source = "the nodes' latency_seconds_sum / latency_seconds_count"
    total = sum(_binned(n.t, lat_sum, edges) for n, (lat_sum, _) in zip(nodes, parts, strict=True))
    count = sum(_binned(n.t, lat_n, edges) for n, (_, lat_n) in zip(nodes, parts, strict=True))
    with np.errstate(invalid="ignore", divide="ignore"):
        r = np.where(count > 0, total / count, np.nan)
    return r, source


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


def _quantile(level: float) -> float:
    """The two-sided interval's upper probability, ``level`` checked (a probability)."""
    if not 0.5 <= level < 1.0:
        raise ValueError(f"population fit: level is an interval's confidence in [0.5, 1), "
                         f"got {level!r}")
    return 1.0 - (1.0 - level) / 2.0


def fieller(a: float, b: float, se_a: float, se_b: float, cov: float,
            tq: float) -> tuple[float, float]:
    """Fieller's interval for the ratio a / b of two jointly normal estimates: the Z with
    (a - Z b)^2 <= tq^2 var(a - Z b); (-inf, inf) when b's own interval holds 0.

    The delta method's (a / b plus or minus tq times its linearised standard error) is
    narrow exactly when b reads high, which is when a / b reads low: on the kept lab
    recordings it missed wrk's 500 ms at 258 ms [149, 367] (r27, docs/performance.md)."""
    qa = b * b - tq * tq * se_b * se_b
    if qa <= 0:
        return (-math.inf, math.inf)
    qb = a * b - tq * tq * cov
    qc = a * a - tq * tq * se_a * se_a
    root = math.sqrt(max(0.0, qb * qb - qa * qc))
    return ((qb - root) / qa, (qb + root) / qa)


def judge_tier(tier: str, counts: np.ndarray, r: np.ndarray, bin_s: float,
               level: float = LEVEL) -> TierPopulation:
    """One tier's verdict from its per-bin counts and the per-bin response time; N's and
    Z's intervals at ``level`` (the verdict's tests at 95 % whatever it is)."""
    from scipy import stats

    total = counts.sum()
    ok = np.isfinite(r) & (counts > 0)
    sent = np.flatnonzero(counts > 0)  # the first and last bins it sent in are partial (a
    if sent.size > 2:  # load test starting or ending inside one): a false rate each
        ok[[sent[0], sent[-1]]] = False
    if total < MIN_REQUESTS or ok.sum() < 5:
        return TierPopulation(tier, False, f"{total:.0f} requests in {ok.sum()} bins: too few "
                                           "to judge")
    x = counts[ok] / bin_s
    rr = r[ok]
    if rr.std() <= 0:
        return TierPopulation(tier, False, "latency never varied: a closed population cannot "
                                           "be told from open arrivals")
    a, b, se_a, se_b, cov, dof = _line(rr, 1.0 / x)
    tq = float(stats.t.ppf(_quantile(level), dof))
    rate_cv = float(x.std() / x.mean())
    # does the rate fall as latency rises? Tested on the least-squares slope: noise in R
    # flattens it (against closed: the test stays honest), but it is not the instrument's
    # extra variance (12 gold clients read 0.040 ± 0.047 instrumented, 0.047 ± 0.035 so)
    ls = stats.linregress(rr, 1.0 / x)
    tl = float(stats.t.ppf(0.975, rr.size - 2))
    if ls.slope - tl * ls.stderr <= 0 or b <= 0:
        return TierPopulation(tier, False, f"the rate does not fall as latency rises (slope of "
                                           f"1/X on R {ls.slope:.3g} ± {tl * ls.stderr:.2g})",
                              rate_spread=rate_cv)
    n_hat, z_hat = 1.0 / b, a / b
    if z_hat <= 0:
        return TierPopulation(tier, False, f"the law's think time is {z_hat:.3g} s, not > 0",
                              rate_spread=rate_cv)
    # beyond the counts' own noise (a bin of c requests varies by 1 / sqrt(c) as Poisson):
    # a few clients in short bins vary more than MAX_SPREAD by counting alone
    cv = float(np.std(x * (rr + z_hat)) / np.mean(x * (rr + z_hat)))
    spread = math.sqrt(max(0.0, cv ** 2 - 1.0 / max(counts[ok].mean(), 1.0)))
    # intervals: N = 1/b by its slope's; Z = a/b by Fieller's (:func:`fieller`)
    n_ci = (1.0 / (b + tq * se_b), 1.0 / (b - tq * se_b) if b > tq * se_b else math.inf)
    z_ci = fieller(a, b, se_a, se_b, cov, tq)
    fit = TierPopulation(tier, False, "", n_hat, n_ci, z_hat, z_ci, spread, rate_cv, level=level)
    if spread > MAX_SPREAD:
        fit.reason = (f"X (R + Z) varies by {spread:.1%} over the bins beyond the counts' noise "
                      f"(X by {rate_cv:.1%}): the law does not hold")
        return fit
    fit.closed = True
    fit.reason = (f"the rate falls as latency rises; X (R + Z) steady within {spread:.1%} beyond "
                  "the counts' noise while "
                  f"X varies {rate_cv:.1%}: N {n_hat:.1f} [{n_ci[0]:.1f}, {n_ci[1]:.1f}], Z "
                  f"{1000 * z_hat:.0f} ms [{1000 * z_ci[0]:.0f}, {1000 * z_ci[1]:.0f}]")
    return fit


PHASE_LLR = 12.0       # a split of a tier's counts into two rates: twice the log-likelihood
#                        ratio at least this (searched over every bin of the stretch; a split
#                        where N did not change is merged back once N is fitted)
MIN_STEP = 0.15        # and the two rates differ by at least this share of the larger
MIN_PHASE_BINS = 3     # bins in a phase, at least


def phase_starts(counts: np.ndarray, exposure: np.ndarray | None = None) -> list[int]:
    """The bins where a tier's rate steps (binary segmentation of its counts as Poisson
    stretches of constant rate): each index starts a phase; [] for one phase.

    ``exposure``: per bin, what the count is proportional to within a phase (1 for open
    arrivals; 1 / (R_b + Z) for a closed population, whose count is N / (R_b + Z) a
    unit of time): the stretches are then of constant N, and a rate that fell only
    because the latency rose (another tier's overload) is no step."""
    out: list[int] = []
    expo = np.ones(counts.size) if exposure is None else exposure / np.mean(exposure)

    def split(lo: int, hi: int) -> None:
        n = hi - lo
        if n < 2 * MIN_PHASE_BINS:
            return
        cs = np.cumsum(counts[lo:hi])
        es = np.cumsum(expo[lo:hi])
        k = np.arange(MIN_PHASE_BINS, n - MIN_PHASE_BINS + 1)
        c1, e1 = cs[k - 1], es[k - 1]
        c2, e2 = cs[-1] - c1, es[-1] - e1

        def ll(c, m):
            return np.where(c > 0, c * np.log(np.maximum(c, 1e-300) / m), 0.0) - c
        llr = 2.0 * (ll(c1, e1) + ll(c2, e2) - ll(cs[-1], es[-1]))
        b = int(np.argmax(llr))
        r1, r2 = c1[b] / e1[b], c2[b] / e2[b]
        if llr[b] < PHASE_LLR or abs(r2 - r1) < MIN_STEP * max(r1, r2):
            return
        split(lo, lo + int(k[b]))
        out.append(lo + int(k[b]))
        split(lo + int(k[b]), hi)

    split(0, counts.size)
    return out


def step_time(counts: np.ndarray, edges: np.ndarray, bounds: list, near: np.ndarray,
              p: int) -> float:
    """When phase ``p`` began: within the two bins around its first (left out of the fit),
    where a step from the rate before to the rate after gives their count."""
    if p == 0:
        return float(edges[0])
    s = bounds[p]
    bin_s = float(edges[1] - edges[0])

    def rate(q):
        m = ~near[bounds[q]:bounds[q + 1]]
        return counts[bounds[q]:bounds[q + 1]][m].mean() / bin_s if m.any() else 0.0
    before, after = rate(p - 1), rate(p)
    lo, hi = float(edges[max(s - 1, 0)]), float(edges[min(s + 1, counts.size)])
    if before == after:
        return float(edges[s])
    c = counts[max(s - 1, 0):min(s + 1, counts.size)].sum()
    return float(np.clip((after * hi - before * lo - c) / (after - before), lo, hi))


def judge_stepped(tier: str, counts: np.ndarray, r: np.ndarray, edges: np.ndarray,
                  starts: list[int], shared=None, level: float = LEVEL) -> TierPopulation:
    """A tier whose rate steps between phases (``starts``): a closed population whose N
    changes per phase (a load test run in phases), or open arrivals.

    Inside such a tier Z cannot be told: between phases N and Z trade off (one rate and
    one latency per phase, two unknowns), and within a phase the latency follows the
    rate's own noise (a burst of sends queues), which pushes a fit of X = N / (R + Z)
    towards an open stream (on the lab at 80 % load Z's interval came out 1.3 s to
    unbounded for a true 0.5 s). A tier whose N stayed put while the others' steps moved
    the latency does tell it (:func:`judge_tier`): ``shared`` is that (tier, Z, Z's
    interval); one load tool, one think time. Given it, N per phase is the mean of
    X_b (R_b + Z) over the phase's bins (bins next to a step left out: the step falls
    inside one), with a t interval widened to N at the ends of Z's interval; the tier is
    closed when X (R + Z) is steady within each phase beyond the counts' own noise
    (:data:`MAX_SPREAD`). Without it the tier stays open, and says why. The phases' N
    intervals at ``level`` (Z's, given, at the same); ``ci_at_z``, which the phases' merge
    reads, and the closed-or-open test stay at 95 %."""
    from scipy import stats

    bin_s = float(edges[1] - edges[0])
    bounds = [0, *starts, counts.size]
    phase = np.repeat(np.arange(len(bounds) - 1), np.diff(bounds))
    near = np.zeros(counts.size, bool)
    for s in starts:
        near[max(s - 1, 0):s + 1] = True
    use = ~near & np.isfinite(r) & (counts > 0)
    sent = np.flatnonzero(counts > 0)
    use[[sent[0], sent[-1]]] = False  # partial bins, as in judge_tier
    steps = (f"{len(bounds) - 1} phases (rate steps at "
             f"{', '.join(f'{edges[s]:g}' for s in starts)} s)")
    rate_cv = float((counts / bin_s).std() / (counts / bin_s).mean())
    if shared is None:
        return TierPopulation(tier, False, f"{steps}: inside a stepped tier Z cannot be told "
                                           "from N, and no tier with a steady N told it",
                              rate_spread=rate_cv, awaits_think=True)
    z_hat, z_ci = shared[1], tuple(shared[2])
    # closed or open: within its phases, does the rate follow N / (R + Z)? Each bin's rate
    # and 1 / (R + Z) less their phase's means, the latter scaled so that a closed tier's
    # slope is 1 and an open one's 0; closed when the slope's interval excludes 0. The
    # latency must move within a phase for other reasons (another tier's step, a fault):
    # its own noise biases the slope down (a burst of sends queues), against closed.
    x_all, w_all, ph_all = counts[use] / bin_s, 1.0 / (r[use] + z_hat), phase[use]
    xd, wd = np.empty_like(x_all), np.empty_like(w_all)
    for p in np.unique(ph_all):
        m = ph_all == p
        xd[m] = x_all[m] - x_all[m].mean()
        wd[m] = (w_all[m] - w_all[m].mean()) * x_all[m].mean() / w_all[m].mean()
    dof = x_all.size - np.unique(ph_all).size - 1
    if dof < 3 or not (wd ** 2).sum() > 0:
        return TierPopulation(tier, False, f"{steps}: too few bins to judge", rate_spread=rate_cv)
    slope = float((xd * wd).sum() / (wd ** 2).sum())
    se = math.sqrt(((xd - slope * wd) ** 2).sum() / dof / (wd ** 2).sum())
    tq = float(stats.t.ppf(0.975, dof))
    if slope - tq * se <= 0:
        return TierPopulation(tier, False, f"{steps}: within them the rate does not follow "
                                           f"N / (R + Z) at Z {1000 * z_hat:.0f} ms from "
                                           f"{shared[0]} (slope {slope:.2f} ± {tq * se:.2f}, "
                                           "1 closed, 0 open)", rate_spread=rate_cv)
    phases, spreads = [], []
    for p in range(len(bounds) - 1):
        m = use & (phase == p)
        t0 = step_time(counts, edges, bounds, near, p)
        if counts[phase == p].sum() < MIN_PHASE_BINS:  # nothing sent: N = 0
            phases.append(Phase(t0, 0.0, (0.0, 0.0), 0))
            continue
        if m.sum() < 2:  # sent, but too short to fit once the bins by its steps are left
            q = (phase == p) & np.isfinite(r)  # out (a step's transient cut in two): its
            rough = float((counts[q] / bin_s * (r[q] + z_hat)).mean()) if q.any() else 0.0
            phases.append(Phase(t0, rough, (math.nan, math.nan), 0))  # rough N; merged
            continue
        x, rr = counts[m] / bin_s, r[m]
        nb = x * (rr + z_hat)
        n_hat = float(nb.mean())
        se_n = nb.std(ddof=1) / math.sqrt(nb.size)
        half = float(stats.t.ppf(_quantile(level), nb.size - 1)) * se_n
        half95 = float(stats.t.ppf(0.975, nb.size - 1)) * se_n
        ends = [float((x * (rr + z)).mean()) for z in z_ci]
        phases.append(Phase(t0, n_hat, (min(n_hat - half, *ends), max(n_hat + half, *ends)),
                            int(m.sum()), (n_hat - half95, n_hat + half95)))
        # per bin: its squared relative deviation from the phase's N, less a Poisson
        # count's own (1 / c), weighted by its count (a phase of 2 clients is mostly noise)
        c = counts[m]
        spreads.append((c * ((nb - n_hat) / n_hat) ** 2 - 1.0, c))
    peak = max(phases, key=lambda q: q.population)
    spread = (math.sqrt(max(0.0, np.concatenate([d for d, _ in spreads]).sum()
                            / np.concatenate([c for _, c in spreads]).sum()))
              if spreads else math.nan)
    fit = TierPopulation(tier, False, "", peak.population, peak.population_ci, z_hat, z_ci,
                         spread, rate_cv, phases, level=level)
    told = f"Z {1000 * z_hat:.0f} ms [{1000 * z_ci[0]:.0f}, {1000 * z_ci[1]:.0f}] from {shared[0]}"
    if not spread <= MAX_SPREAD:
        fit.reason = (f"{steps}; at {told}, X (R + Z) varies by {spread:.1%} within a phase "
                      "beyond the counts' noise: the law does not hold")
        return fit
    fit.closed = True
    fit.reason = (f"{steps}; at {told} (a tier with a steady N: one load tool, one think "
                  f"time) the rate follows N / (R + Z) within them (slope {slope:.2f} ± "
                  f"{tq * se:.2f}, 1 closed, 0 open) and X (R + Z) is steady within "
                  f"{spread:.1%} beyond the counts' noise: N "
                  + " → ".join(f"{q.population:.1f}" for q in phases))
    return fit


def fit_population(rec: Recording, edges: np.ndarray, level: float = LEVEL) -> PopulationFit:
    """Per tier with requests: open or closed, and N, Z for a closed one; the intervals at
    ``level`` (the verdicts' tests stay at 95 %: a joint check asks for wider intervals)."""
    _quantile(level)
    counts = tier_counts(rec, edges)
    # each tier's own latency where the series carry the tier (the lab's): a closed
    # client arrives to a shorter queue than the mean (the arrival theorem)
    if tiers_labelled(rec):
        own = {t: response_times(rec, edges, t) for t in TIERS}
        source = own[TIERS[0]][1]
    else:  # every tier's, once
        own = dict.fromkeys(TIERS, response_times(rec, edges))
        source = own[TIERS[0]][1]
    bin_s = float(edges[1] - edges[0])
    def judge(k: int, t: str, shared=None) -> TierPopulation:
        r = own[t][0]
        steady = judge_tier(t, counts[k], r, bin_s, level)
        starts = phase_starts(counts[k])  # a rate that steps beyond what one N explains:
        if steady.closed or not starts or counts[k].sum() < MIN_REQUESTS:  # phases of a
            return steady  # load test; too few requests are too few, steps or not
        if shared is not None:  # given Z, steps of N: a rate that fell as the latency rose
            rz = np.where(np.isfinite(r), r, np.nanmean(r)) + shared[1]  # is one phase
            starts = phase_starts(counts[k], 1.0 / rz)
            if not starts:  # no step of N given Z: one phase, as merging down to one ends
                return steady
        fit = judge_stepped(t, counts[k], r, edges, starts, shared, level)
        while fit is not None and fit.phases:  # neighbours of one N (a rate that fell as
            ph = fit.phases  # latency rose, not a step of N) are one phase
            short = [i for i, q in enumerate(ph) if q.bins == 0 and q.population > 0]
            if short:  # a phase too short to fit joins the neighbour nearer its rough N
                i = short[0]
                j = min((e for e in (i - 1, i + 1) if 0 <= e < len(ph)),
                        key=lambda e: abs(ph[e].population - ph[i].population))
                starts = [s for e, s in enumerate(starts, 1) if e != max(i, j)]
                fit = (judge_stepped(t, counts[k], r, edges, starts, shared, level)
                       if starts else None)
                continue
            same = [i for i in range(1, len(ph)) if ph[i].population > 0
                    and ph[i - 1].population > 0
                    and (ph[i].ci_at_z[0] <= ph[i - 1].population <= ph[i].ci_at_z[1]
                         or ph[i - 1].ci_at_z[0] <= ph[i].population <= ph[i - 1].ci_at_z[1])]
            if not same:
                break
            # the closest pair first: a short phase's wide interval may hold both neighbours
            # (a 4 s phase after a real step held the N before it: that step was dropped)
            near_n = min(same, key=lambda i: abs(math.log(ph[i].population / ph[i - 1].population)))
            starts = [s for i, s in enumerate(starts, 1) if i != near_n]
            fit = judge_stepped(t, counts[k], r, edges, starts, shared, level) if starts else None
        return fit if fit is not None else steady

    tiers = {t: judge(k, t) for k, t in enumerate(TIERS) if counts[k].sum() > 0}
    told = [(t, p.think_s, p.think_ci) for t, p in tiers.items() if p.closed and not p.phases]
    if told:  # the tightest Z a steady tier told, for the stepped tiers, which cannot
        shared = min(told, key=lambda z: z[2][1] - z[2][0])
        for k, t in enumerate(TIERS):
            if t in tiers and tiers[t].awaits_think:
                tiers[t] = judge(k, t, shared)
    return PopulationFit(tiers, bin_s, source)


def open_share(rec: Recording, edges: np.ndarray, fit: PopulationFit) -> np.ndarray:
    """Per bin, the open tiers' share of the requests (the rest are the closed tiers')."""
    counts = tier_counts(rec, edges)
    open_k = [TIERS.index(t) for t in fit.open_tiers]
    total = counts.sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        share = np.where(total > 0, counts[open_k].sum(axis=0) / total, 0.0)
    return share
