"""Per node, the windows in which it failed more than usual: change points in its error ratio.

Per scrape interval a node answered ``n`` requests (ok, error, timeout) of which
``e`` were errors. PELT (Killick, Fearnhead & Eckley 2012) splits the intervals
into segments of constant error probability with the binomial cost
``-2 log L = -2 [e log p + (n - e) log(1 - p)]`` at ``p = e / n`` and a
penalty of ``3 log T`` per change (BIC's ``2 log T`` with a margin, since real
error counts are burstier than binomial). The minimum over candidate starts is
one numpy expression per interval (cumulative sums), and pruning keeps the
candidates few.

The node's usual level ``p0`` is the error ratio of its quietest quarter: the
request-weighted lower quartile over segments (a fault may last most of a
recording, as in ``data/traces/step-errors.csv``; a quarter of healthy traffic is
enough to see the usual level). A segment is a fault window
when it is above ``p0`` by at least ``MIN_RATE`` (one percentage point) and by
four binomial standard deviations; its rate is the excess ``(p - p0) / (1 - p0)``
(the kernel combines independent error sources the same way), measured inside
the window, away from its two edge intervals. An edge is placed within its
interval by how far the edge intervals' ratios went towards the window's, so
a start lands between scrapes. A usual level above zero (with at least five
errors) becomes a fault over the whole run.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.special import xlogy

from relakit.calibration.recording import NodeData
from relakit.vocab import ANSWERED

MIN_RATE = 0.01
Z_MIN = 4.0


@dataclass
class FaultWindow:
    node: int
    start_s: float
    end_s: float
    error_rate: float
    ratio: float        # the error ratio measured in the window
    requests: float     # requests answered in it
    whole_run: bool = False


def binomial_cost(e: np.ndarray, n: np.ndarray) -> np.ndarray:
    """-2 x the binomial log-likelihood at its maximum, for segment totals e of n."""
    with np.errstate(divide="ignore", invalid="ignore"):
        p = np.where(n > 0, e / np.where(n > 0, n, 1), 0.0)
        return -2.0 * (xlogy(e, p) + xlogy(n - e, 1.0 - p))


def pelt(e: np.ndarray, n: np.ndarray, penalty: float | None = None) -> list[tuple[int, int]]:
    """Segments ``[a, b)`` of intervals with a constant error probability (PELT)."""
    t_n = e.size
    if t_n == 0:
        return []
    beta = 3.0 * np.log(max(t_n, 2)) if penalty is None else penalty
    ce = np.concatenate([[0.0], np.cumsum(e)])
    cn = np.concatenate([[0.0], np.cumsum(n)])
    f = np.empty(t_n + 1)
    f[0] = -beta
    last = np.zeros(t_n + 1, dtype=np.int64)
    cand = np.array([0])
    for t in range(1, t_n + 1):
        cost = binomial_cost(ce[t] - ce[cand], cn[t] - cn[cand])
        total = f[cand] + cost + beta
        k = int(np.argmin(total))
        f[t], last[t] = total[k], cand[k]
        cand = np.append(cand[f[cand] + cost <= f[t]], t)
    cuts, t = [], t_n
    while t > 0:
        cuts.append((int(last[t]), t))
        t = int(last[t])
    return cuts[::-1]


def error_counts(nd: NodeData) -> tuple[np.ndarray, np.ndarray]:
    """Per interval: errors, and requests answered (ok + error + timeout)."""
    e = nd.outcome_increments(("error",))
    n = nd.outcome_increments(ANSWERED)
    return e, np.maximum(n, e)


def fit_faults(nd: NodeData, end_s: float) -> list[FaultWindow]:
    e, n = error_counts(nd)
    if n.sum() <= 0:
        return []
    segs = pelt(e, n)
    seg_e = np.array([e[a:b].sum() for a, b in segs])
    seg_n = np.array([n[a:b].sum() for a, b in segs])
    seg_p = np.where(seg_n > 0, seg_e / np.maximum(seg_n, 1), 0.0)
    order = np.argsort(seg_p)
    quarter = np.searchsorted(np.cumsum(seg_n[order]), seg_n.sum() / 4)
    p0 = float(seg_p[order][min(quarter, order.size - 1)])
    out = []
    ratio = np.where(n > 0, e / np.maximum(n, 1), np.nan)
    dt = np.diff(nd.t)
    flagged = []
    for (a, b), sn, sp in zip(segs, seg_n, seg_p, strict=True):
        sd = np.sqrt(max(p0, 0.5 / max(sn, 1)) * (1 - p0) / max(sn, 1))
        if sn <= 0 or sp - p0 < MIN_RATE or (sp - p0) < Z_MIN * sd:
            continue
        # an edge interval the fault covered only partly is a segment of its own: merge it
        if flagged and flagged[-1][1] == a and (b - a == 1 or flagged[-1][1] - flagged[-1][0]
                                                == 1):
            flagged[-1] = (flagged[-1][0], b)
        else:
            flagged.append((a, b))
    for a, b in flagged:
        sn = float(n[a:b].sum())
        inner = slice(a + 1, b - 1) if b - a >= 3 else slice(a, b)
        ie, i_n = e[inner].sum(), n[inner].sum()
        pf = ie / i_n if i_n > 0 else float(e[a:b].sum()) / max(sn, 1.0)
        start, end = float(nd.t[a]), float(nd.t[b])
        if b - a >= 3 and pf > p0:
            def frac(k, pf=pf):
                if k < 0 or k >= ratio.size or np.isnan(ratio[k]):
                    return 0.0
                return float(np.clip((ratio[k] - p0) / (pf - p0), 0.0, 1.0))

            start = float(nd.t[a + 1] - frac(a) * dt[a] - (frac(a - 1) * dt[a - 1] if a else 0))
            end = float(nd.t[b - 1] + frac(b - 1) * dt[b - 1]
                        + (frac(b) * dt[b] if b < dt.size else 0.0))
        rate = (pf - p0) / (1 - p0)
        out.append(FaultWindow(nd.node, max(start, 0.0), min(end, end_s), float(rate),
                               float(pf), float(sn)))
    if p0 > 0 and e.sum() >= 5:
        base_n = float(seg_n[seg_p <= p0].sum())
        out.insert(0, FaultWindow(nd.node, 0.0, end_s, p0, p0, base_n, whole_run=True))
    return [w for w in out if w.end_s > w.start_s]


__all__ = ["FaultWindow", "binomial_cost", "error_counts", "fit_faults", "pelt"]
