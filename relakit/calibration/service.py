"""Per node: how many servers, how long a request holds one, and the shape of that time.

Servers. With a ``busy_servers`` gauge: its largest value over the recording
(exact once the node was ever seen saturated; the note says whether a queue
stood behind it at that scrape). Without it, from ``busy_seconds_total``: an
interval whose ``in_flight`` gauge, at both ends, exceeds every busy rate seen
had a queue throughout, so its busy rate (busy seconds per second) is the number
of servers; the median over such intervals, rounded. With no saturated interval
the largest busy rate, rounded up, is a lower bound and says so.

Mean service time (Little's law on the servers): busy seconds over completions,
over the intervals the flags left alone (degraded mode shortens work).

Shape. The latency histogram of lightly loaded intervals (utilisation at most
0.5; at least 100 of them, else exponential is assumed) is close to the
service-time distribution; for
each service kind relakit can simulate, with the mean fixed to Little's, the
shape parameter is chosen by maximum likelihood over the bucket counts (a grid,
vectorised), and the kind with the smallest AIC (2 x parameters - 2 x
log-likelihood) wins; among kinds within 2 of the best, the one with fewer
parameters. Latency also holds the little queueing left at low load, which
leans the choice towards more variable kinds; the report shows every kind's
score.

Per node. The twin has one service kind and shape (``fleet.service``, at the pooled
mean: all busy seconds over all completions) and one multiplier per node
(``fleet.service_scale``: the node's own Little mean over the pooled one), which is
what the simulator can run without drawing node-dependent randoms. Each kind's
shape parameter is scale-free (a CV, a tail index, a slow share and a slow/fast
ratio), so the shape is fitted to every node's low-load histogram at once, each at
its own mean (log-likelihoods summed over nodes): pooling the histograms instead
would read nodes of different speeds as one more variable service.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy.special import ndtr

from relakit.calibration.recording import CalibrationError, NodeData, increments
from relakit.vocab import SERVICE_PARAMS

LOW_LOAD = 0.5          # utilisation under which latency is taken as service time
MIN_OBSERVATIONS = 100  # latencies at low load needed to choose a kind
LOGNORMAL_CV = np.geomspace(0.05, 5.0, 240)
PARETO_ALPHA = np.geomspace(1.05, 30.0, 240)
BIMODAL_P = np.geomspace(0.002, 0.5, 48)
BIMODAL_RATIO = np.geomspace(1.5, 60.0, 48)
HYPEREXP_P, HYPEREXP_RATIO = BIMODAL_P, BIMODAL_RATIO  # slow share, slow mean / fast mean
# the shape parameters fitted per kind: a kind's parameters beyond its scale
N_PARAMS = {kind: len(params) - 1 for kind, params in SERVICE_PARAMS.items()}


@dataclass
class NodeService:
    node: int
    servers: int
    servers_note: str
    servers_exact: bool
    mean_ms: float | None
    completions: float
    busy_s: float
    utilisation_max: float

    @property
    def capacity_rps(self) -> float:
        return self.servers / (self.mean_ms / 1000.0) if self.mean_ms else float("nan")


@dataclass
class ServiceFit:
    kind: str
    params: dict
    mean_ms: float
    mean_note: str
    nodes: list[NodeService]
    scores: list[dict] = field(default_factory=list)  # kind, params, loglik, aic
    shape_note: str = ""

    @property
    def scales(self) -> list[float]:
        """Each node's mean over the pooled mean: the twin's ``fleet.service_scale``."""
        return [ns.mean_ms / self.mean_ms for ns in self.nodes]


def busy_rate(nd: NodeData) -> np.ndarray | None:
    return None if nd.busy_seconds is None else increments(nd.busy_seconds) / nd.dt


def fit_servers(nd: NodeData) -> tuple[int, str, bool]:
    """(servers, where it came from, whether it is exact rather than a lower bound)."""
    if nd.busy is not None and np.isfinite(nd.busy).any():
        c = int(round(np.nanmax(nd.busy)))
        n = int(np.sum(~np.isnan(nd.busy)))
        full = nd.busy >= c
        if nd.queue is not None:
            q, seen = int(np.sum(full & (nd.queue > 0))), "a queue"
        elif nd.in_flight is not None:
            q, seen = int(np.sum(full & (nd.in_flight > nd.busy))), "more in flight"
        else:
            return c, (f"max of busy_servers over {n} scrapes; no queue_length nor in_flight "
                       "gauge to tell whether all were busy, so a lower bound"), False
        if q:
            return c, (f"max of busy_servers over {n} scrapes; all {c} busy with {seen} at "
                       f"{q} of them"), True
        return c, (f"max of busy_servers over {n} scrapes; never seen with {seen}, so a "
                   "lower bound"), False
    u = busy_rate(nd)
    if u is not None and u.size and np.nanmax(u) > 0:
        top = int(np.ceil(np.nanmax(u) - 1e-9))
        if nd.in_flight is not None:
            sat = (nd.in_flight[:-1] > top) & (nd.in_flight[1:] > top)
            if sat.sum():
                c = max(1, int(round(float(np.median(u[sat])))))
                return c, (f"median busy seconds per second (busy_seconds_total) over "
                           f"{int(sat.sum())} intervals with a queue throughout (in_flight > "
                           f"{top} at both ends)"), True
        return max(1, top), ("largest busy seconds per second (busy_seconds_total), rounded "
                             "up; never seen saturated, so a lower bound"), False
    return 1, "no busy_servers gauge nor busy_seconds_total: one server assumed", False


#: how far busy_seconds_total may exceed what the node's other series allow (gauges are
#: sampled, buckets are bounds): beyond it the counters contradict each other
IMPLAUSIBLE = 1.5


def check_busy_seconds(nd: NodeData, source: str) -> None:
    """Refuse a busy_seconds_total the node's own series contradict. A busy server holds a
    request in flight, so busy seconds cannot exceed the in-flight gauge's area; and a
    request's service is part of its latency, so the mean service time (busy seconds per
    completion) cannot exceed the latency histogram's bound on the mean. A counter
    scaled by 1000 (milliseconds as seconds) once gave a twin of 2,000 servers a node."""
    if nd.busy_seconds is None:
        return
    busy = float(increments(nd.busy_seconds).sum())
    if nd.in_flight is not None:
        ok = ~np.isnan(nd.in_flight)
        area = float(np.trapezoid(nd.in_flight[ok], nd.t[ok])) if ok.sum() > 1 else float("nan")
        if area > 0 and busy > IMPLAUSIBLE * area + nd.t[-1] - nd.t[0]:
            raise CalibrationError(
                f"{source}: node {nd.node}'s busy_seconds_total rises by {busy:.4g} s, but its "
                f"in_flight gauge holds only {area:.4g} request-seconds: a busy server holds a "
                "request in flight, so the counter's unit or scale is wrong")
    if nd.buckets is not None and nd.bounds is not None and nd.bounds.size > 1:
        per = np.diff(np.concatenate([[0.0], increments(nd.buckets).sum(axis=0)]))
        done = per.sum()
        if done > 0 and per[-1] == 0:  # nothing beyond the last finite bound
            bound_ms = 1000.0 * float((per[:-1] * nd.bounds[:-1]).sum()) / done
            mean_ms = 1000.0 * busy / done
            if mean_ms > IMPLAUSIBLE * bound_ms:
                raise CalibrationError(
                    f"{source}: node {nd.node}'s busy_seconds_total gives {mean_ms:.4g} ms of "
                    f"service per request, above its latency histogram's bound on the mean "
                    f"latency ({bound_ms:.4g} ms): service is part of latency, so the "
                    "counter's unit or scale is wrong")


def fit_service(nodes: list[NodeData], degraded, source: str = "<trace>") -> ServiceFit:
    """``degraded(t0, t1)``: per interval, whether degraded mode was on in it (masked out)."""
    per_node, busy_all, done_all, hists, bounds = [], 0.0, 0.0, [], None
    no_busy = []
    for nd in nodes:
        check_busy_seconds(nd, source)
        c, note, exact = fit_servers(nd)
        done, _ = nd.completions()
        keep = ~degraded(nd.t[:-1], nd.t[1:])
        u = busy_rate(nd)
        if u is not None:
            busy = increments(nd.busy_seconds)
            b, n = float(busy[keep].sum()), float(done[keep].sum())
            mean = 1000.0 * b / n if n > 0 else None
            busy_all, done_all = busy_all + b, done_all + n
            util = u / c
        else:
            no_busy.append(nd.node)
            b, n, mean, util = 0.0, float(done[keep].sum()), None, None
        per_node.append(NodeService(nd.node, c, note, exact, mean, n, b,
                                    float(np.nanmax(util)) if util is not None else float("nan")))
        if nd.buckets is not None:
            inc = increments(nd.buckets)
            quiet = keep & (util <= LOW_LOAD) if util is not None else keep
            counts = np.diff(np.concatenate([np.zeros((inc.shape[0], 1)), inc], axis=1), axis=1)
            counts = np.maximum(counts[quiet].sum(axis=0), 0)
            if bounds is None:
                bounds = nd.bounds
            if np.array_equal(bounds, nd.bounds):
                hists.append((len(per_node) - 1, counts))
    if done_all > 0 and busy_all > 0:
        mean_ms = 1000.0 * busy_all / done_all
        mean_note = (f"busy_seconds_total / completions over all nodes (Little): "
                     f"{busy_all:.1f} server-s / {done_all:.0f}")
    else:
        mean_ms, mean_note = _mean_from_latency(nodes, source)
    for ns in per_node:
        if ns.mean_ms is None:
            ns.mean_ms = mean_ms
    fit = ServiceFit("exponential", {"mean_ms": mean_ms}, mean_ms, mean_note, per_node)
    if no_busy:
        fit.mean_note += f" (nodes {','.join(map(str, no_busy))} have no busy_seconds_total)"
    n_obs = int(sum(h.sum() for _, h in hists))
    if n_obs < MIN_OBSERVATIONS:
        fit.shape_note = (f"{n_obs} latencies at low load, fewer than {MIN_OBSERVATIONS}: "
                          "exponential assumed")
        return fit
    counts = np.stack([h for _, h in hists])
    means_s = np.array([per_node[i].mean_ms for i, _ in hists]) / 1000.0
    fit.scores = score_kinds(bounds, counts, means_s, ref_s=mean_ms / 1000.0)
    best = min(s["aic"] for s in fit.scores)
    near = [s for s in fit.scores if s["aic"] <= best + 2.0]
    pick = min(near, key=lambda s: (N_PARAMS[s["kind"]], s["aic"]))
    fit.kind, fit.params = pick["kind"], pick["params"]
    fit.shape_note = (f"{pick['kind']}: least AIC (within 2, fewest parameters) over "
                      f"{n_obs} latencies at low load in {bounds.size} buckets, one shape for "
                      f"all {len(hists)} nodes, each at its own mean")
    return fit


def _mean_from_latency(nodes, source: str) -> tuple[float, str]:
    s = n = 0.0
    for nd in nodes:
        if nd.buckets is not None:
            inc = increments(nd.buckets)
            per = np.diff(np.concatenate([np.zeros((inc.shape[0], 1)), inc], axis=1), axis=1)
            counts = per.sum(axis=0)
            mids = np.concatenate([[nd.bounds[0] / 2], (nd.bounds[:-2] + nd.bounds[1:-1]) / 2,
                                   [nd.bounds[-2]]])
            s += float((counts * mids).sum())
            n += float(counts.sum())
    if n == 0:
        raise CalibrationError(f"{source}: no busy_seconds_total and no "
                               "latency_seconds_bucket series: the service time cannot be "
                               "estimated (calibration needs one of them)")
    return 1000.0 * s / n, ("mean latency from the histogram's bucket midpoints (no "
                            "busy_seconds_total: an upper bound, queueing included)")


# ---- the service kinds' CDFs at the bucket bounds, for a grid of shapes ------------------------
def _cdfs(kind: str, x: np.ndarray, m: float):
    """(params per grid row, CDF matrix (G, len(x)))."""
    x = x[None, :]
    if kind == "exponential":
        return [{"mean_ms": m * 1e3}], 1.0 - np.exp(-x / m)
    if kind == "deterministic":
        return [{"mean_ms": m * 1e3}], (x >= m).astype(float)
    if kind == "lognormal":
        cv = LOGNORMAL_CV[:, None]
        s2 = np.log1p(cv ** 2)
        mu = np.log(m) - s2 / 2
        return ([{"mean_ms": m * 1e3, "cv": float(c)} for c in LOGNORMAL_CV],
                ndtr((np.log(x) - mu) / np.sqrt(s2)))
    if kind == "pareto":
        a = PARETO_ALPHA[:, None]
        xm = m * (a - 1) / a
        with np.errstate(divide="ignore"):
            f = np.where(x < xm, 0.0, 1.0 - (xm / x) ** a)
        return [{"mean_ms": m * 1e3, "alpha": float(v)} for v in PARETO_ALPHA], f
    hyper = kind == "hyperexponential"
    p, r = np.meshgrid(HYPEREXP_P if hyper else BIMODAL_P,
                       HYPEREXP_RATIO if hyper else BIMODAL_RATIO, indexing="ij")
    p, r = p.ravel()[:, None], r.ravel()[:, None]
    fast = m / ((1 - p) + p * r)  # the mixture's mean is m
    slow = r * fast
    if hyper:  # two exponential phases
        f = (1 - p) * (1.0 - np.exp(-x / fast)) + p * (1.0 - np.exp(-x / slow))
    else:  # two point masses
        f = (1 - p) * (x >= fast) + p * (x >= slow)
    params = [{"fast_ms": float(a * 1e3), "slow_ms": float(b * 1e3), "slow_fraction": float(c)}
              for a, b, c in zip(fast.ravel(), slow.ravel(), p.ravel(), strict=True)]
    return params, f


def score_kinds(bounds: np.ndarray, counts: np.ndarray, mean_s, ref_s: float | None = None
                ) -> list[dict]:
    """Each kind's best shape (maximum multinomial likelihood over the buckets) and AIC.

    ``counts`` is one histogram, or one per node (rows) with ``mean_s`` one mean per
    node: the shape is shared, the log-likelihoods add up. The parameters are given at
    ``ref_s`` (default: the single mean)."""
    finite = bounds[np.isfinite(bounds)]
    counts = np.atleast_2d(np.asarray(counts, dtype=float))
    means = np.broadcast_to(np.asarray(mean_s, dtype=float), (counts.shape[0],))
    ref = float(means[0]) if ref_s is None else float(ref_s)
    out = []
    for kind in N_PARAMS:
        params, _ = _cdfs(kind, finite, ref)
        ll = 0.0
        for m, c in zip(means, counts, strict=True):
            _, cdf = _cdfs(kind, finite, float(m))
            full = np.concatenate([np.zeros((cdf.shape[0], 1)), cdf,
                                   np.ones((cdf.shape[0], 1))], axis=1)
            prob = np.maximum(np.diff(full, axis=1), 1e-12)
            ll = ll + (np.log(prob) * c[None, :]).sum(axis=1)
        i = int(np.argmax(ll))
        out.append({"kind": kind, "params": _rounded(params[i]), "loglik": float(ll[i]),
                    "aic": 2 * N_PARAMS[kind] - 2 * float(ll[i])})
    return out


def _rounded(p: dict) -> dict:
    return {k: float(f"{v:.4g}") for k, v in p.items()}
