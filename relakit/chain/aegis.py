"""Aegis: containment, and only that. Isolate, throttle, break; never repair.

* isolate a node whose error rate is over ``error_threshold`` (20 %) for
  ``isolate_after`` evaluations: it leaves the working set;
* throttle a node whose load is over ``load_threshold`` (95 %): its intake is
  capped at ``throttle_intake`` x servers, it keeps working; lifted below
  ``unthrottle_below``;
* open the global circuit breakers while the stress state is catastrophic,
  half-open them when it eases, close them when it is normal.

Thresholds can differ per node class (``classes``), or adapt to each node's
own trailing baseline (``adaptive: {baseline_window_s, factor, min_excess}``,
:mod:`relakit.chain.baseline`): a node is isolated when its error rate is over
``factor`` x its baseline and at least ``min_excess`` above it. Until a node
has a baseline its class or fixed threshold judges it. Every isolation's reason
names the kind of threshold that tripped (fixed, class NAME, adaptive) and the
node's baseline, whichever kind judged it.

Silent failures (wrong answers with success status) are invisible in the
error rate; correctness probes (``fleet.probes`` in the scenario) see them.
A node whose probe failure ratio is over ``wrong_threshold`` with at least
``min_probe_volume`` probes in the window is isolated on that signal. The guards real
systems use are each off by default, so the unguarded design's behaviour can be
reproduced: ``min_volume`` (requests in the window before a node is judged),
``max_isolated_fraction`` (a cap), and ``panic_below`` (when the working
fraction falls below it, stop isolating and readmit everything: panic mode).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from relakit.chain.baseline import Baseline
from relakit.chain.state import HEALTHY, ISOLATED, SUSPECT, WORKING, Context, pct
from relakit.vocab import STRESS_LEVELS

DEFAULT_BASELINE_WINDOW_S = 300.0  # the baseline a reason names when adaptive is off


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
    # {baseline_window_s, factor, min_excess}; empty: fixed (or class) thresholds only
    adaptive: dict = field(default_factory=dict)
    # correctness probes (a fleet's probes: key): isolate when more than this share of a
    # node's probes fail (wrong answer or error), judged on at least min_probe_volume
    wrong_threshold: float = 0.1
    min_probe_volume: float = 10.0
    _baselines: dict = field(default_factory=dict, repr=False)

    def threshold(self, node: int, key: str) -> float:
        for cls in self.classes.values():
            if node in cls.get("nodes", ()) and key in cls:
                return cls[key]
        return getattr(self, key)

    def reset(self) -> None:
        """Before a run: the nodes' baselines start empty (the rest is in ctx.state)."""
        self._baselines = {}

    def baseline(self, node: int, hold_s: float) -> Baseline:
        """Node's trailing baseline (kept whatever the thresholds, so every reason names it)."""
        if node not in self._baselines:
            self._baselines[node] = Baseline(
                self.adaptive.get("baseline_window_s", DEFAULT_BASELINE_WINDOW_S), hold_s)
        return self._baselines[node]

    def error_limit(self, node: int, hold_s: float) -> tuple[float, str]:
        """The error-rate threshold judging the node now, and its kind and baseline in words.

        Adaptive: max(factor x baseline, baseline + min_excess) once the node has a
        baseline; before, and without ``adaptive``, its class's or the fixed threshold.
        """
        base = self.baseline(node, hold_s)
        b = base.value
        seen = (f"baseline {pct(b)} over {base.span_s:.0f} s" if b == b
                else "no baseline yet")
        if self.adaptive and b == b:
            f, m = self.adaptive["factor"], self.adaptive["min_excess"]
            return max(f * b, b + m), (f"threshold: adaptive, max({f:g} x baseline, baseline + "
                                       f"{pct(m)}); {seen}")
        for name, cls in self.classes.items():
            if node in cls.get("nodes", ()) and "error_threshold" in cls:
                return cls["error_threshold"], f"threshold: class {name}; {seen}"
        return self.error_threshold, f"threshold: fixed; {seen}"

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
            base = self.baseline(i, ctx.window_s)
            if s.status not in (HEALTHY, SUSPECT):
                base.freeze()  # a node out or on probation teaches its baseline nothing
                continue  # Phoenix judges nodes on probation; others are out
            s.baseline, s.baseline_span_s = base.value, base.span_s
            e, vol = errors[i], r["volume"][i]
            limit, why = self.error_limit(i, ctx.window_s)
            if e == e and e > limit:
                base.freeze()  # never learn a breach as normal
            elif s.status == HEALTHY:
                base.observe(ctx.t, e, vol)
            trip = None  # (signal, value, threshold, what it is in words, evidence)
            if e == e and e > limit and vol >= self.min_volume:
                trip = ("error_rate", e, limit, "error rate", f"{vol:.0f} requests ({why})")
            else:
                trip = self._probe_trip(ctx, i, s)
            if trip is not None:
                signal, value, limit, what, evidence = trip
                s.breaches += 1
                if s.breaches < self.isolate_after:
                    s.status = SUSPECT
                    continue
                if st.panic:
                    ctx.act("hold", i, signal, value, limit,
                            f"did not isolate node {i}: {what} {pct(value)} > {pct(limit)} "
                            f"({evidence}), but panic mode suspends isolation")
                    continue
                out = n - int(st.working().sum())
                if (out + 1) / n > self.max_isolated_fraction:
                    ctx.act("hold", i, signal, value, limit,
                            f"did not isolate node {i}: {what} {pct(value)} > {pct(limit)} "
                            f"({evidence}), but {out} of {n} are out and the cap is "
                            f"{pct(self.max_isolated_fraction)}")
                    continue
                s.status, s.isolated_at, s.failures = ISOLATED, ctx.t, s.failures + 1
                ctx.act("isolate", i, signal, value, limit,
                        f"isolated node {i}: {what} {pct(value)} > {pct(limit)} over "
                        f"{ctx.window_s:g} s, {evidence}", routable=False)
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

    def _probe_trip(self, ctx: Context, i: int, s):
        """Node i's correctness probes: over ``wrong_threshold`` failed with at least
        ``min_probe_volume`` probes in the window (no probes, no judgement)."""
        q = ctx.readings.get("probe_failure_ratio")
        if q is None or not q[i] == q[i] or not q[i] > self.wrong_threshold:
            return None
        probes = ctx.readings["probe_volume"][i]
        if probes < self.min_probe_volume:
            ctx.act("hold", i, "probe_volume", probes, self.min_probe_volume,
                    f"did not judge node {i} on probes: {probes:.0f} probes < "
                    f"{self.min_probe_volume:g} in the window (probe failures {pct(q[i])})")
            return None
        return ("probe_failure_ratio", q[i], self.wrong_threshold, "probe failure ratio",
                f"{probes:.0f} probes (threshold: fixed, probes; {s.baseline_words()})")

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
