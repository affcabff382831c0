"""The arrival rate over time and the tier mix, from the request counters.

Which counter: the fleet-wide ``client_requests_total`` (one count per user
request, as a simulation exports it) when the recording has it; otherwise the
nodes' ``requests_total`` added up, less the fleet's ``retries_total`` and
``hedges_total`` when those are recorded (they are copies, not arrivals). A live
recording without those counters counts hedged copies as arrivals; the report
says which counter was used. Fan-out is not identifiable from node counters and
is taken as 1.

Counters count a request when it ends, so a backlog would shift arrivals later
(by seconds, in an overload): the change in the nodes' ``in_flight`` gauges over
a bin is added (arrived = ended + still in the node), when they are recorded and
they measure what the counter has not yet counted. They do for the nodes' own
counters. For the client counter they do only while every request in a node is
one a client still waits for: once clients give up (a ``timeout`` outcome in
``client_requests_total``), the client has counted the request at its deadline
but the abandoned job stays queued at the node, so the nodes' ``in_flight`` grows
with jobs already counted; adding its change counted them twice on the way up
and took them away on the way down (issue 14: an overload with a 500 ms deadline
fitted 3,900 req/s against a true 1,840, then 0). Retried or hedged copies in a
node are not user requests either. In those cases the client counter is used
as is: it lags arrivals by at most the client deadline.

The curve: each counter is read at common bin edges (linear interpolation of
the cumulative count between its own scrapes, so targets scraped at different
phases add up), the counts per bin divided by the bin width give a step curve,
written as ``arrival: {kind: trace, interpolation: step}``. The default bin is
ten seconds, or a thirtieth of a short recording, never less than one scrape.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from relakit.calibration.recording import CalibrationError, Recording, increments
from relakit.vocab import OUTCOMES, TIER_MIX, TIERS


@dataclass
class ArrivalFit:
    times_s: np.ndarray  # bin starts
    rates_rps: np.ndarray
    bin_s: float
    end_s: float
    source: str
    tiers: dict
    tier_source: str

    @property
    def points(self) -> list[list[float]]:
        return [[float(t), float(r)] for t, r in zip(self.times_s, self.rates_rps, strict=True)]

    def rate_at(self, t) -> np.ndarray:
        i = np.clip(np.searchsorted(self.times_s, np.asarray(t, float), side="right") - 1, 0,
                    self.times_s.size - 1)
        return self.rates_rps[i]


def monotone(c: np.ndarray) -> np.ndarray:
    """A cumulative counter with resets undone (each reset counts from zero)."""
    return np.concatenate([c[:1], c[:1] + np.cumsum(increments(c), axis=0)])


def default_bin(recording: Recording) -> float:
    span = recording.end_s
    want = min(10.0, span / 30.0)
    return float(max(1, round(want / recording.scrape_s)) * recording.scrape_s)


def fit_arrivals(rec: Recording, bin_s: float | None = None) -> ArrivalFit:
    bin_s = default_bin(rec) if bin_s is None else float(bin_s)
    if not bin_s >= rec.scrape_s:  # NaN too; a finer bin only interpolates between scrapes
        raise CalibrationError(f"{rec.source}: --bin {bin_s:g} s is shorter than the "
                               f"recording's scrape interval ({rec.scrape_s:g} s): counters say "
                               f"nothing finer than a scrape; give --bin >= {rec.scrape_s:g}")
    if rec.client_requests is not None and rec.client_requests.sum() > 0:
        source = "client_requests_total (fleet-wide, one count per user request)"
        curves = [(rec.fleet_t, monotone(rec.client_requests.sum(axis=(1, 2))))]
        by_tier = increments(rec.client_requests.sum(axis=2)).sum(axis=0)
        subtract = []
        tier_source = "client_requests_total by tier"
        gave_up = increments(rec.client_requests[:, :, OUTCOMES.index("timeout")]
                             .sum(axis=1)).sum() > 0
        copies = [k for k in ("retries_total", "hedges_total")
                  if k in rec.fleet and increments(rec.fleet[k]).sum() > 0]
        in_flight_ok = not gave_up and not copies
        if not in_flight_ok:
            source += (" as counted (clients gave up on requests" if gave_up else
                       " as counted (retried or hedged copies were in the nodes") + \
                ": the nodes' in_flight includes requests the clients already counted)"
    else:
        source = "requests_total summed over nodes"
        curves = [(n.t, monotone(n.requests.sum(axis=(1, 2)))) for n in rec.nodes]
        by_tier = sum(increments(n.requests.sum(axis=2)).sum(axis=0) for n in rec.nodes)
        subtract = [k for k in ("retries_total", "hedges_total") if k in rec.fleet]
        if subtract:
            source += " less " + " and ".join(f"fleet {k}" for k in subtract)
        tier_source = "requests_total by tier, all nodes"
        in_flight_ok = True
    end = min([float(t[-1]) for t, _ in curves] + [rec.end_s])
    n_bins = int(np.floor(end / bin_s + 1e-9))
    if n_bins < 1:
        raise CalibrationError(f"{rec.source}: the recording spans {end:g} s, shorter than one "
                               f"arrival bin ({bin_s:g} s); give a smaller bin")
    edges = np.arange(n_bins + 1) * bin_s
    total = np.zeros(n_bins)
    for t, c in curves:
        total += np.diff(np.interp(edges, t, c))
    for k in subtract:
        total -= np.diff(np.interp(edges, rec.fleet_t, monotone(rec.fleet[k])))
    gauges = [n for n in rec.nodes if n.in_flight is not None] if in_flight_ok else []
    for n in gauges:  # requests that arrived but were not yet counted (counted when done)
        ok = ~np.isnan(n.in_flight)
        total += np.diff(np.interp(edges, n.t[ok], n.in_flight[ok])) if ok.sum() > 1 else 0.0
    if gauges:
        source += " plus the change in the nodes' in_flight (counters count a request when it ends)"
    if total.sum() <= 0:
        raise CalibrationError(f"{rec.source}: the request counters never increase: no "
                               "arrivals to fit")
    rates = np.maximum(total, 0.0) / bin_s
    tiered = by_tier[:len(TIERS)]
    if tiered.sum() > 0:
        share = tiered / tiered.sum()
        tiers = {t: float(s) for t, s in zip(TIERS, share, strict=True)}
    else:
        tiers, tier_source = dict(TIER_MIX), "no tier label recorded: relakit's default mix"
    return ArrivalFit(edges[:-1], rates, bin_s, float(edges[-1]), source, tiers, tier_source)


def rounded_tiers(tiers: dict, digits: int = 4) -> dict:
    """Tier shares rounded so they still sum to exactly 1 (the largest takes the rest)."""
    out = {t: round(v, digits) for t, v in tiers.items()}
    big = max(out, key=out.get)
    out[big] = round(1.0 - sum(v for t, v in out.items() if t != big), digits)
    return out
