"""Aegis: containment, and only that. Isolate, throttle, break; never repair.

* isolate a node whose error rate is over ``error_threshold`` (20 %) for
  ``isolate_after`` evaluations: it leaves the working set;
* throttle a node whose load is over ``load_threshold`` (95 %): its intake is
  capped at ``throttle_intake`` x servers, it keeps working; lifted below
  ``unthrottle_below``;
* open the global circuit breakers while the stress state is catastrophic,
  half-open them when it eases, close them when it is normal.

Thresholds can differ per node class (heterogeneous fleets). The guards real
systems use are each off by default, so the unguarded design's behaviour can be
reproduced: ``min_volume`` (requests in the window before a node is judged),
``max_isolated_fraction`` (a cap), and ``panic_below`` (when the working
fraction falls below it, stop isolating and readmit everything: panic mode).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from relakit.chain.state import HEALTHY, ISOLATED, SUSPECT, WORKING, Context, pct
from relakit.vocab import STRESS_LEVELS


@dataclass
class Aegis:
    name: str = "aegis"
    error_threshold: float = 0.2
    load_threshold: float = 0.95
    isolate_after: int = 1
    throttle_intake: float = 1.5
    unthrottle_below: float = 0.7
    classes: dict = field(default_factory=dict)  # name -> {nodes, error_threshold, ...}
    min_volume: float = 0.0
    max_isolated_fraction: float = 1.0
    panic_below: float = 0.0
    breakers: bool = True  # open the global breakers when catastrophic

    def threshold(self, node: int, key: str) -> float:
        for cls in self.classes.values():
            if node in cls.get("nodes", ()) and key in cls:
                return cls[key]
        return getattr(self, key)

    def reset(self) -> None:
        """Before a run: nothing to clear (this stage keeps its state in ctx.state)."""

    def run(self, ctx: Context) -> None:
        st = ctx.state
        r = ctx.readings
        n = len(st.nodes)
        errors = r.get("own_error_rate", r["error_rate"])
        working = st.working()
        # panic mode: too few nodes left: stop isolating and readmit everything
        if self.panic_below > 0:
            frac = working.mean()
            if not st.panic and frac < self.panic_below:
                st.panic = True
                for i, s in enumerate(st.nodes):
                    if s.status not in WORKING:
                        s.status, s.breaches = HEALTHY, 0
                        s.weight = 1.0 if ctx.base_weights is None else float(
                            ctx.base_weights[i])
                        ctx.act("readmit", i, "working_fraction", frac, self.panic_below,
                                f"panic: only {pct(frac)} of nodes working < "
                                f"{pct(self.panic_below)}; readmitted node {i} unrepaired",
                                routable=True)
                ctx.act("panic", "fleet", "working_fraction", frac, self.panic_below,
                        f"entered panic mode: {pct(frac)} of nodes working < "
                        f"{pct(self.panic_below)}; isolation suspended")
            elif st.panic and frac >= self.panic_below and not (
                    np.nan_to_num(errors) > self.error_threshold).any():
                st.panic = False
                ctx.act("panic_end", "fleet", "working_fraction", frac, self.panic_below,
                        "left panic mode: no node over its error threshold; isolation resumes")
        for i, s in enumerate(st.nodes):
            if s.status not in (HEALTHY, SUSPECT):
                continue  # Phoenix judges nodes on probation; others are out
            e, vol = errors[i], r["volume"][i]
            limit = self.threshold(i, "error_threshold")
            if e == e and e > limit and vol >= self.min_volume:
                s.breaches += 1
                if s.breaches < self.isolate_after:
                    s.status = SUSPECT
                    continue
                if st.panic:
                    ctx.act("hold", i, "error_rate", e, limit,
                            f"did not isolate node {i}: error rate {pct(e)} > {pct(limit)}, "
                            "but panic mode suspends isolation")
                    continue
                out = n - int(st.working().sum())
                if (out + 1) / n > self.max_isolated_fraction:
                    ctx.act("hold", i, "error_rate", e, limit,
                            f"did not isolate node {i}: error rate {pct(e)} > {pct(limit)}, "
                            f"but {out} of {n} are out and the cap is "
                            f"{pct(self.max_isolated_fraction)}")
                    continue
                s.status, s.isolated_at, s.failures = ISOLATED, ctx.t, s.failures + 1
                ctx.act("isolate", i, "error_rate", e, limit,
                        f"isolated node {i}: error rate {pct(e)} > {pct(limit)} over "
                        f"{ctx.window_s:g} s, {vol:.0f} requests", routable=False)
            else:
                if e == e and e > limit and vol < self.min_volume:
                    ctx.act("hold", i, "volume", vol, self.min_volume,
                            f"did not judge node {i}: {vol:.0f} requests < "
                            f"{self.min_volume:g} in the window (error rate {pct(e)})")
                s.breaches = 0
                if s.status == SUSPECT:
                    s.status = HEALTHY
            self._throttle(ctx, i, s)
        self._breaker(ctx)

    def _throttle(self, ctx: Context, i: int, s) -> None:
        if s.status not in WORKING:
            return
        load = ctx.readings["utilisation"][i]
        limit = self.threshold(i, "load_threshold")
        if not s.throttled and load == load and load > limit:
            s.throttled = True
            s.intake_limit = max(1, int(round(self.throttle_intake * ctx.servers[i])))
            ctx.act("throttle", i, "utilisation", load, limit,
                    f"throttled node {i}: load {pct(load)} > {pct(limit)}; intake capped at "
                    f"{s.intake_limit} in flight", intake_limit=s.intake_limit)
        elif s.throttled and load == load and load < self.unthrottle_below:
            s.throttled, s.intake_limit = False, None
            ctx.act("unthrottle", i, "utilisation", load, self.unthrottle_below,
                    f"lifted node {i}'s throttle: load {pct(load)} < "
                    f"{pct(self.unthrottle_below)}", intake_limit=None)

    def _breaker(self, ctx: Context) -> None:
        st = ctx.state
        if not self.breakers:
            return
        want = {"catastrophic": "open", "critical": "half_open"}.get(st.stress, "closed")
        if want == "half_open" and st.breaker == "closed":
            want = "closed"  # critical alone does not open breakers; it only eases them
        if want != st.breaker:
            prev, st.breaker = st.breaker, want
            ctx.act("breaker", "fleet", "stress", float(STRESS_LEVELS.index(st.stress)),
                    float(STRESS_LEVELS.index("catastrophic")),
                    f"breakers {prev} → {want}: fleet stress is {st.stress}",
                    breaker=want)
