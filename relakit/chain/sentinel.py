"""Sentinel: detection. Per-node readings from the scraped metrics over the window.

Error rate, load (busy servers over servers, in flight over servers), p99
latency and request volume per node, plus fleet-wide totals; where the nodes
export correctness probes (``probe_requests_total``, ``probe_failures_total``),
the share of probes failed (a wrong answer or an error) and their volume. With
``attribution: call_graph`` it also estimates each node's *own* error rate:
the part of a caller's errors its failing dependency does not explain. It
only reads; it decides nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from relakit.chain.state import Context
from relakit.control.signals import Selector, Signal
from relakit.vocab import ANSWERED, FAILED


def _per_node(kind, **kw) -> Signal:
    return Signal(kw.pop("name", kind), kind, by_node=True, **kw)


ERRORS = _per_node("ratio", selector=Selector("requests_total", {"outcome": FAILED}),
                   den=Selector("requests_total", {"outcome": ANSWERED}))
VOLUME = _per_node("rate", selector=Selector("requests_total", {"outcome": ANSWERED}))
BUSY = _per_node("rate", selector=Selector("busy_seconds_total"))
IN_FLIGHT = _per_node("gauge", selector=Selector("in_flight"), over_time="avg")
PROBE_FAILURES = _per_node("ratio", selector=Selector("probe_failures_total"),
                          den=Selector("probe_requests_total"))
PROBES = _per_node("rate", selector=Selector("probe_requests_total"))
P99 = _per_node("histogram_quantile", selector=Selector("latency_seconds"), q=0.99, scale=1000)


def _probed(tsdb) -> bool:
    """Whether any node has sent a probe yet (the probe signals cost a third of a reading:
    a fleet without probes skips them)."""
    for tgt in tsdb.targets:
        if tgt.node >= 0 and tgt.values.shape[0]:
            idx = tgt.select("probe_requests_total")
            if idx.size and np.nanmax(tgt.values[-1, idx]) > 0:
                return True
    return False


@dataclass
class Sentinel:
    name: str = "sentinel"
    attribution: str = "local"  # local | call_graph
    call_graph: tuple = ()  # (node, depends_on) pairs

    def reset(self) -> None:
        """Before a run: nothing to clear (this stage keeps its state in ctx.state)."""

    def run(self, ctx: Context) -> None:
        tsdb, t, w = ctx.tsdb, [ctx.t], ctx.window_s
        n = len(ctx.state.nodes)

        def by_node(sig):
            row = np.full(n, np.nan)
            values = sig.evaluate(tsdb, t, w)[0]
            for tgt, v in zip([x for x in tsdb.targets if x.node >= 0], np.atleast_1d(values),
                              strict=False):
                if tgt.node < n:
                    row[tgt.node] = v
            return row

        servers = ctx.servers.astype(float)
        probed = _probed(tsdb)
        errors = by_node(ERRORS)
        volume = by_node(VOLUME) * w  # requests answered in the window
        r = {"error_rate": errors, "volume": volume,
             "utilisation": by_node(BUSY) / servers,
             "in_flight_ratio": by_node(IN_FLIGHT) / servers, "p99_ms": by_node(P99),
             # correctness probes: failed (wrong or error) over sent, and how many
             "probe_failure_ratio": by_node(PROBE_FAILURES) if probed else np.full(n, np.nan),
             "probe_volume": by_node(PROBES) * w if probed else np.zeros(n)}
        r["own_error_rate"] = self._own_errors(errors) if self.attribution == "call_graph" \
            else errors
        ctx.readings = r
        total = np.nansum(volume)
        ctx.fleet = {
            "error_rate": float(np.nansum(errors * volume) / total) if total > 0 else np.nan,
            "utilisation": float(np.nanmean(r["utilisation"])) if np.isfinite(
                r["utilisation"]).any() else np.nan,
            "p99_ms": float(np.nanmax(r["p99_ms"])) if np.isfinite(r["p99_ms"]).any()
            else np.nan,
        }

    def _own_errors(self, errors: np.ndarray) -> np.ndarray:
        """Errors a node causes itself: 1 - (1 - e) / (1 - e_dependency), never below 0.

        A dependency with no traffic of its own is estimated from its callers: the
        smallest error rate among them is the part they all share.
        """
        own = errors.copy()
        callers: dict[int, list[int]] = {}
        for node, dep in self.call_graph:
            callers.setdefault(dep, []).append(node)
        for dep, who in callers.items():
            est = errors[dep]
            if not est == est:  # no traffic: infer from the callers' common errors
                shared = [errors[c] for c in who if errors[c] == errors[c]]
                est = min(shared) if shared else np.nan
                own[dep] = est
            for c in who:
                if est == est and errors[c] == errors[c]:
                    own[c] = max(0.0, 1 - (1 - errors[c]) / max(1e-12, 1 - est))
        return own
