"""What the clients did, as far as the servers' and the fleet's counters show it: the
per-attempt deadline and retries.

Deadline. A server counts a request it finished ``ok`` after its client stopped
waiting as ``requests_total{outcome="timeout"}`` (relakit's simulator and the live
lab both do); its latency histogram holds every request it finished, the timed-out
ones included (the server goes on working on them). So the share of finished,
not-failed requests counted as timeouts, T / (ok + T), is the share of latencies
above the deadline D: D is where the histogram's exceedance falls to that share.
Inside a bucket the exceedance is interpolated by a monotone cubic (PCHIP) through
log exceedance against log latency at the bounds (linear in the first bucket); a
deadline on a bucket bound comes out on the bound. The
bucket that holds D is the estimate's resolution and the comment says so. An
error's latency is in the histogram, but whether its client had given up is not in
its outcome, so the scrape intervals where a node answered errors are left out.

Retries. ``retries_total`` (the fleet's client counter) staying at 0 means clients
did not retry (``max_attempts: 1``). Otherwise the attempts per request are
matched: with a share q of attempts failing (``error`` or ``timeout``, relakit's
default ``retry_on``), independently, m attempts give q + q^2 + ... + q^(m-1)
retries per first attempt; the m closest to the recorded ratio is written, and a
retry budget that denied retries (``retries_denied_total``) makes it a lower bound
and is not itself estimated (the caution says so).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.interpolate import PchipInterpolator

from relakit.calibration.recording import Recording, increments
from relakit.vocab import FAILED, OUTCOMES

MIN_TIMEOUTS = 20   # fewer timed-out requests than this: too few to place the deadline
MAX_ATTEMPTS = 10   # the largest attempt count the retry match considers


@dataclass
class DeadlineFit:
    deadline_ms: float | None  # None: none written (no timeouts, or not placeable)
    note: str                  # where it came from, or why there is none
    timeouts: float            # requests the servers counted as timed out
    share: float               # timeouts / (ok + timeouts)
    bucket_s: tuple[float, float] | None = None  # the histogram bucket holding it


@dataclass
class RetryFit:
    max_attempts: int | None   # None: the recording cannot say
    note: str
    retries: float = 0.0
    first: float = 0.0         # first attempts (attempts - retries - hedges)
    denied: float = 0.0        # retries a budget refused

    @property
    def per_request(self) -> float:
        return self.retries / self.first if self.first > 0 else float("nan")


def _outcomes(rec: Recording, names) -> float:
    return float(sum(n.outcome_increments(names).sum() for n in rec.nodes))


def fit_deadline(rec: Recording) -> DeadlineFit:
    if _outcomes(rec, ("timeout",)) == 0:
        return DeadlineFit(None, "no request timed out in the recording: no deadline", 0.0, 0.0)
    # an error's latency is in the histogram but its outcome hides whether its client had
    # given up: scrape intervals where a node answered errors are left out (all of them
    # only when every interval has errors)
    clean = [nd.outcome_increments(("error",)) == 0 for nd in rec.nodes]
    if not any(c.any() for c in clean):
        clean = [np.ones_like(c) for c in clean]
    timeouts = ok = 0.0
    bounds, counts = None, None
    for nd, keep in zip(rec.nodes, clean, strict=True):
        if nd.buckets is None:
            continue
        if bounds is None:
            bounds, counts = nd.bounds, np.zeros(nd.bounds.size)
        elif not np.array_equal(bounds, nd.bounds):
            continue
        counts = counts + increments(nd.buckets)[keep].sum(axis=0)
        timeouts += float(nd.outcome_increments(("timeout",))[keep].sum())
        ok += float(nd.outcome_increments(("ok",))[keep].sum())
    share = timeouts / (ok + timeouts) if ok + timeouts > 0 else 0.0
    if bounds is None or counts[-1] <= 0:
        return DeadlineFit(None, "no latency_seconds_bucket histogram to place the deadline "
                           "in", timeouts, share)
    if timeouts < MIN_TIMEOUTS:
        return DeadlineFit(None, f"only {timeouts:.0f} timed-out requests, fewer than "
                           f"{MIN_TIMEOUTS}: too few to place the deadline", timeouts, share)
    finite = bounds[np.isfinite(bounds)]
    exceed = 1.0 - counts[: finite.size] / counts[-1]  # share of latencies above each bound
    if share < exceed[-1]:
        return DeadlineFit(None, f"{share:.1%} of finished requests timed out, fewer than "
                           f"took over the histogram's last bound ({finite[-1]:g} s): the "
                           "deadline is above it, not placeable", timeouts, share)
    k = int(np.argmax(exceed <= share))  # the first bound with no more than the share above
    lo_b, lo_s, b, s = ((0.0, 1.0) if k == 0 else (float(finite[k - 1]), float(exceed[k - 1]))) \
        + (float(finite[k]), float(exceed[k]))
    if share >= lo_s:  # every finished request timed out: at or below the bucket's lower bound
        d = lo_b
    elif share <= s * (1 + 1e-9) or s <= 0 or k == 0:
        # on the bound; or no tail past it, or the first bucket: linear within the bucket
        d = b if share <= s * (1 + 1e-9) else lo_b + (b - lo_b) * (lo_s - share) / (lo_s - s)
    else:  # a monotone cubic through log exceedance against log latency, inverted
        pos = exceed > 0
        curve = PchipInterpolator(np.log(finite[pos]), np.log(exceed[pos]))
        grid = np.linspace(np.log(lo_b), np.log(b), 4001)
        d = float(np.exp(grid[int(np.argmax(curve(grid) <= np.log(share)))]))
    note = (f"where the latency histogram's exceedance equals the timed-out share "
            f"{share:.4f} (requests_total timeout / (ok + timeout), {timeouts:.0f} timeouts, "
            f"scrape intervals without errors), interpolated in the bucket ({lo_b:g}, {b:g}] s")
    return DeadlineFit(float(f"{1000.0 * float(d):.4g}"), note, timeouts, share, (lo_b, b))


def fit_retries(rec: Recording) -> RetryFit:
    fleet = rec.fleet
    if "retries_total" not in fleet:
        return RetryFit(None, "no retries_total counter in the recording: retries unknown")
    retries = float(increments(fleet["retries_total"]).sum())
    denied = (float(increments(fleet["retries_denied_total"]).sum())
              if "retries_denied_total" in fleet else 0.0)
    if retries == 0 and denied == 0:
        return RetryFit(1, "retries_total stayed at 0: clients did not retry")
    hedges = float(increments(fleet["hedges_total"]).sum()) if "hedges_total" in fleet else 0.0
    if "attempts_total" in fleet:
        first = float(increments(fleet["attempts_total"]).sum()) - retries - hedges
        first_from = "attempts_total - retries_total - hedges_total"
    elif rec.client_requests is not None:
        first = float(increments(rec.client_requests.sum(axis=(1, 2))).sum())
        first_from = "client_requests_total"
    else:
        return RetryFit(None, f"{retries:.0f} retries recorded but neither attempts_total nor "
                        "client_requests_total: the attempts per request cannot be matched",
                        retries)
    failed = _outcomes(rec, FAILED)
    answered = _outcomes(rec, OUTCOMES)
    q = failed / answered if answered > 0 else 0.0
    ratio = retries / first if first > 0 else 0.0
    m = np.arange(2, MAX_ATTEMPTS + 1)
    predicted = np.array([sum(q ** k for k in range(1, int(a))) for a in m])
    best = int(m[np.argmin(np.abs(predicted - ratio))])
    note = (f"{retries:.0f} retries over {first:.0f} first attempts ({first_from}): "
            f"{ratio:.4f} a request; {best} attempts match it if failures were independent "
            f"(a share {q:.4f} of attempts failed, error + timeout)")
    if rec.client_requests is not None:
        # a request that failed used every attempt, so retries >= (m - 1) x failed
        # requests: a bound that holds however correlated failures are (an overload
        # retried into itself), tight when retried failures fail again
        final = rec.client_requests[-1].sum(axis=0) - rec.client_requests[0].sum(axis=0)
        lost = float(final[[OUTCOMES.index(o) for o in FAILED]].sum())
        if lost > 0:
            most = max(1, int(np.floor(1 + retries / lost + 1e-9)))
            if most < best:
                best = most
                note += (f"; but {lost:.0f} requests failed every attempt "
                         f"(client_requests_total), so at most 1 + retries / failed = {most}: "
                         "failures were correlated, the bound is taken")
            else:
                note += f"; within the bound 1 + retries / failed requests = {most}"
    if denied:
        note += (f"; a retry budget denied {denied:.0f} retries (retries_denied_total), so "
                 "a lower bound, and the budget is not estimated")
    return RetryFit(best, note, retries, first, denied)
