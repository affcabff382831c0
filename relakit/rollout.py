"""Progressive rollout of a policy change, and overrides: the run.

The keys are read by :mod:`relakit.control.rollout`; this module runs them. A run is a
set of **cells** in lock-step, each one data plane (a kernel) with its own controller:
the zones of ``fleet.zones`` (as :mod:`relakit.zones` builds them), or, for a
``canary: {fraction: F}``, a canary cell of ``round(F x nodes)`` nodes with the same
share of the arrivals and a rest cell of the others (requests stay in their cell,
so the canary's nodes are loaded like the rest's). A fleet without zones and without
a fraction canary (overrides alone, or a tier canary) is one cell, on the run's own
seed. A ``canary: {tier: T}`` runs a second controller on that cell, whose flags
apply to tier T's requests only (``Fleet.set_tier_flags``), and a **shadow run**: the
same scenario and seed under the current policy alone, in lock-step, which is the
tier canary's "rest" (tier by tier; common random numbers make the pairing tight).

At every instant, in this order:

1. the rollout acts: at ``start_s`` the canary cell's controller is replaced by a
   fresh one running the new policy; at each observation (``start_s + k x
   observe_s``) the canary's outcomes over the last ``observe_s`` are compared with
   the rest's (pooled over the rest's cells) and the change is rolled back (the
   canary gets a fresh controller on the current policy), promoted (every other cell
   gets a fresh controller on the new policy) or observed further;
2. every cell's controller evaluates its own cell's signals;
3. at a config poll each cell applies its controller's latest decision in force,
   with the overrides active for it on top (an override is configuration too: it is
   in force from the first poll at or after its ``start_s``).

**The comparison** is paired by time slot: the window is cut at the metrics samples
(``metrics.interval_s``), and in each slot the canary's number minus the rest's is one
batch; the interval is Student's t over the batches. Both sides see the same
moment's load and faults, so a fleet-wide surge cancels in the difference. It
assumes slot-to-slot differences are roughly independent (slots of several seconds
and requests of milliseconds); a controller that changes mode inside the window
makes them less so, and the interval then under-covers. This is what a real rollout
controller could compute inside one run; across replications
(:func:`replicate`) the decision's time and the outcomes get their own intervals.

**Audit.** Each rollout step is a row of stage ``rollout`` (``start``, one
``observe`` row per condition with the canary's and the rest's numbers, the
difference and its interval, ``promote`` / ``rollback``); each time an override
starts or stops overriding what a cell's policy asked, a row of stage ``override``
(``pin`` / ``release``). The policy rows carry the cell (``zone``) and which policy
decided (``policy``: current or new).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import polars as pl

from relakit.control import Controller
from relakit.control.audit import DECISION_COLUMNS
from relakit.control.decider import latest_in_force
from relakit.control.rollout import METRICS, canary_nodes, paired_batches, window_metric
from relakit.control.signals import policy_reach_s
from relakit.sim import Fleet
from relakit.vocab import OUTCOMES, POLICY_FLAGS, TIERS, Flags
from relakit.zones import ZonedResult, zone_scenario, zone_seed

EPS = 1e-9
AUDIT_COLUMNS = {**DECISION_COLUMNS, "zone": pl.Int32, "policy": pl.String}


def cells(sc) -> tuple[list, list[str], int | None, list[int]]:
    """(cell scenarios, their labels, the canary cell or None, each cell's zone or -1)."""
    ro = sc.rollout
    if sc.fleet.zones:
        n = len(sc.fleet.zones)
        canary = None if ro is None else int(ro.canary)
        return ([zone_scenario(sc, z) for z in range(n)],
                [f"zone {z}" for z in range(n)], canary, list(range(n)))
    if ro is not None and ro.canary_kind == "fraction":
        n = sc.fleet.nodes
        k = canary_nodes(ro.canary, n)
        split = dataclasses.replace(sc, fleet=dataclasses.replace(
            sc.fleet, zones=(k, n - k), zone_mix=(k / n, 1 - k / n)))
        return ([zone_scenario(split, z) for z in (0, 1)],
                [f"canary cell (nodes 0-{k - 1})", f"rest (nodes {k}-{n - 1})"], 0, [-1, -1])
    return [sc], ["fleet"], None if ro is None else 0, [-1]  # a tier canary: the one cell


@dataclass
class RolloutResult(ZonedResult):
    """A rollout's run: each cell's result (as :class:`~relakit.zones.ZonedResult`'s
    zones), the audit, every observation's numbers and the rollout's outcome."""

    labels: list = dataclasses.field(default_factory=list)
    canary: int | None = None
    observations: pl.DataFrame | None = None
    outcome: dict = dataclasses.field(default_factory=dict)
    shadow: object = None  # a tier canary's shadow run (SimulationResult), else None

    def write(self, out_dir) -> list:
        from pathlib import Path

        from relakit.io import write_parquet

        written = super().write(out_dir)
        if self.shadow is not None:  # a tier canary's baseline run
            written += self.shadow.write(Path(out_dir) / "shadow")
        if self.observations is not None:
            written.append(write_parquet(self.observations,
                                         Path(out_dir) / "observations.parquet"))
        return written

    def format_summary(self) -> str:
        blocks = [f"{label}:\n{r.format_summary()}" for label, r in zip(
            self.labels, self.zones, strict=True)]
        o = self.outcome
        if o:
            blocks.append(f"rollout: {o['action'] or 'still observing at the end'}"
                          + (f" at {o['at_s']:g} s (observation {o['observation']})"
                             if o["action"] else ""))
        return "\n\n".join(blocks)

    def observation(self, metric: str, tier: str = "all") -> pl.DataFrame:
        """One metric's rows of :attr:`observations`, by observation."""
        return self.observations.filter((pl.col("metric") == metric)
                                        & (pl.col("tier") == tier)).sort("observation")


class _Cell:
    def __init__(self, index, sc, seed, record, lookback, label, zone):
        from relakit.experiment import FleetView

        self.index, self.label, self.zone = index, label, zone
        self.fleet = Fleet(sc, seed=seed, record_requests=record)
        self.view = FleetView(self.fleet, lookback_s=lookback)
        self.pending: list = []
        self.controller = None
        self.policy_label = "current"
        self.tier_controller = None  # a tier canary's: the new policy, for that tier only
        self.tier_pending: list = []
        self.pinning: dict = {}  # override index -> the tiers the policy asked, while pinned


class RolloutRun:
    """One run of a scenario with ``rollout`` and/or ``overrides`` (see the module)."""

    def __init__(self, sc, seed: int | None = None, record_requests: bool = False):
        self.sc = sc
        self.seed = sc.seed if seed is None else int(seed)
        self.ro = sc.rollout
        self.clk = sc.clocks
        parts, labels, self.canary, zones = cells(sc)
        reach = policy_reach_s(sc.policy)
        if self.ro is not None:
            reach = max(reach, policy_reach_s(self.ro.policy))
        lookback = self.clk.lookback(reach)
        one = len(parts) == 1
        self.cells = [_Cell(i, p, self.seed if one else zone_seed(self.seed, i),
                            record_requests, lookback, labels[i], zones[i])
                      for i, p in enumerate(parts)]
        self.controllers: list = []  # (cell, policy label, Controller), in start order
        for c in self.cells:
            self._install(c, sc.policy, "current")
        self.tier = self.ro.canary if self.ro is not None and self.ro.canary_kind == "tier" \
            else None
        self.shadow = None  # a tier canary's baseline: the same seed, the current policy
        if self.tier is not None:
            self.shadow = _Cell(-1, sc, self.seed, False, lookback,
                                "shadow (the current policy alone)", -1)
            self.shadow.controller = Controller(sc.policy, self.clk)
        self.rest_name = "shadow" if self.tier is not None else "rest"
        self.rows: list[dict] = []
        self.obs_rows: list[dict] = []
        self.outcome = {"action": None, "at_s": None, "observation": None}
        self.bounds = sc.metrics.latency_buckets_s

    # ---- the loop ----------------------------------------------------------------------
    def run(self) -> RolloutResult:
        sc, clk = self.sc, self.clk
        evals = clk.eval_times(0.0, sc.duration_s)
        polls = clk.poll_times(0.0, sc.duration_s)
        rollout_t = np.zeros(0)
        if self.ro is not None:
            k = np.arange(0, math.floor((sc.duration_s - self.ro.start_s) / self.ro.observe_s
                                        + EPS) + 1)
            rollout_t = self.ro.start_s + k * self.ro.observe_s
        instants = np.union1d(np.union1d(evals, polls), rollout_t)
        eval_set, poll_set = set(evals.tolist()), set(polls.tolist())
        rollout_set = set(rollout_t.tolist())
        every = self.cells + ([self.shadow] if self.shadow is not None else [])
        for t in instants:
            t = float(t)
            for c in every:
                c.fleet.advance(t)
            if t in rollout_set:
                self._rollout_step(t)
            if t in eval_set:
                eff = float(clk.effective_at(t))
                for c in every:
                    tsdb = c.view.tsdb(t)
                    c.pending.append((eff, c.controller.decide(tsdb, t)))
                    if c.tier_controller is not None:
                        c.tier_pending.append((eff, c.tier_controller.decide(tsdb, t)))
            if t in poll_set:
                for c in every:
                    self._apply(c, t)
        for c in every:
            c.fleet.advance(sc.duration_s)
        return self._result()

    def _install(self, cell: _Cell, policy, label: str) -> None:
        cell.controller = Controller(policy, self.clk)
        cell.policy_label = label
        self.controllers.append((cell.index, label, cell.controller))

    # ---- the rollout -------------------------------------------------------------------
    def _rollout_step(self, t: float) -> None:
        ro = self.ro
        k = int(round((t - ro.start_s) / ro.observe_s))
        canary = self.cells[self.canary]
        if k == 0 and self.tier is not None:
            canary.tier_controller = Controller(ro.policy, self.clk)
            canary.tier_pending = []
            self.controllers.append((canary.index, f"new (tier {self.tier})",
                                     canary.tier_controller))
            self._row(t, "start", f"tier {self.tier}", f"the canary, tier {self.tier}, gets the "
                      f"flags of the new policy {ro.policy.name!r} ({ro.source}, fresh "
                      f"hysteresis state); the other tiers keep {self.sc.policy.name!r}'s; "
                      f"compared every {ro.observe_s:g} s with a shadow run of "
                      f"{self.sc.policy.name!r} alone on the same seed")
            return
        if k == 0:
            self._install(canary, ro.policy, "new")
            self._row(t, "start", canary.label, f"the canary, {canary.label}, runs the new policy "
                      f"{ro.policy.name!r} ({ro.source}) with fresh hysteresis state; the "
                      f"rest keep {self.sc.policy.name!r}; observed every {ro.observe_s:g} s")
            return
        numbers = self._observe(t)
        ended = self.outcome["action"] is not None
        for row in numbers:
            self.obs_rows.append({"observation": k, "start_s": t - ro.observe_s,
                                  "end_s": t, **row, "phase": "after" if ended else "observe"})
        if ended:
            return  # the record goes on (for the figure); nothing more is decided
        iv = {(r["metric"], r["tier"]): r["_iv"] for r in numbers}
        by = {(r["metric"], r["tier"]): r for r in numbers}
        rollback = ro.rollback_if is not None and ro.rollback_if.holds(iv)
        promote = not rollback and ro.promote_if is not None and ro.promote_if.holds(iv)
        verdict = "rollback" if rollback else "promote" if promote else "observe further"
        for rule_name, rule in (("rollback_if", ro.rollback_if), ("promote_if", ro.promote_if)):
            if rule is None:
                continue
            for cond in rule.conditions:
                r = by[(cond.metric, cond.tier)]
                self._row(t, "observe", canary.label, (
                    f"observation {k} ({t - ro.observe_s:g}-{t:g} s), {rule_name} "
                    f"{rule.combine}: {cond.describe()}: canary {r['canary']:.4g}, "
                    f"{self.rest_name} {r['rest']:.4g}, difference {_iv_text(r['_iv'])} "
                    f"over {r['batches']} "
                    f"paired slots: {'holds' if cond.holds(r['_iv']) else 'not shown'}; "
                    f"{verdict}"), signal=cond.label, value=r["diff"], threshold=cond.margin)
        if rollback or promote:
            self.outcome = {"action": verdict, "at_s": t, "observation": k}
            if rollback and self.tier is not None:
                canary.tier_controller, canary.tier_pending = None, []
                self._row(t, "rollback", f"tier {self.tier}", f"rolled back at observation "
                          f"{k}: {ro.rollback_if.combine} of rollback_if held; tier "
                          f"{self.tier} returns to {self.sc.policy.name!r}'s flags (its "
                          "controller never stopped)")
            elif promote and self.tier is not None:
                canary.controller, canary.pending = canary.tier_controller, canary.tier_pending
                canary.tier_controller, canary.tier_pending = None, []
                canary.policy_label = "new"
                self._row(t, "promote", "every tier", f"promoted at observation {k}: "
                          f"{ro.promote_if.combine} of promote_if held; {ro.policy.name!r} "
                          f"now sets every tier's flags (its controller, labelled new (tier "
                          f"{self.tier}), goes on with its state)")
            elif rollback:
                self._install(canary, self.sc.policy, "current")
                self._row(t, "rollback", canary.label, f"rolled back at observation {k}: "
                          f"{ro.rollback_if.combine} of rollback_if held; {canary.label} "
                          f"returns to {self.sc.policy.name!r} (fresh hysteresis state)")
            else:
                rest = [c for c in self.cells if c.index != self.canary]
                for c in rest:
                    self._install(c, ro.policy, "new")
                self._row(t, "promote", ", ".join(c.label for c in rest), (
                    f"promoted at observation {k}: {ro.promote_if.combine} of promote_if "
                    f"held; {ro.policy.name!r} now runs everywhere (the rest's controllers "
                    "start with fresh hysteresis state)"))
            for row in numbers:
                self.obs_rows[-len(numbers) + numbers.index(row)]["phase"] = verdict

    def _observe(self, t: float) -> list[dict]:
        """Every metric and tier over [t - observe_s, t]: canary, rest, and the paired
        interval of canary - rest over the metrics slots."""
        ro = self.ro
        step = self.sc.metrics.interval_s
        nb = int(round(ro.observe_s / step))
        bounds = t - ro.observe_s + np.arange(nb + 1) * step
        per = [self._counts(c, bounds) for c in self.cells]
        can = per[self.canary]
        rest_cells = ([self._counts(self.shadow, bounds)] if self.shadow is not None else
                      [p for i, p in enumerate(per) if i != self.canary])
        rest = tuple(sum(p[j] for p in rest_cells) for j in range(2))
        out = []
        for metric in METRICS:
            for tier in ((*TIERS, "all") if metric != "p99_ms" else ("all",)):
                ti = None if tier == "all" else TIERS.index(tier)
                cb = can[0].sum(axis=1) if ti is None else can[0][:, ti]
                rb = rest[0].sum(axis=1) if ti is None else rest[0][:, ti]
                a = window_metric(metric, cb, can[1], self.bounds)
                b = window_metric(metric, rb, rest[1], self.bounds)
                whole_a = window_metric(metric, cb.sum(axis=0)[None], can[1].sum(axis=0)[None],
                                        self.bounds)[0]
                whole_b = window_metric(metric, rb.sum(axis=0)[None],
                                        rest[1].sum(axis=0)[None], self.bounds)[0]
                iv = paired_batches(a, b)
                ia, ib = _slot_interval(a), _slot_interval(b)
                out.append({"metric": metric, "tier": tier, "canary": float(whole_a),
                            "rest": float(whole_b), "canary_low": ia[0], "canary_high": ia[1],
                            "rest_low": ib[0], "rest_high": ib[1],
                            "diff": math.nan if iv is None else iv.mean,
                            "low": math.nan if iv is None else iv.low,
                            "high": math.nan if iv is None else iv.high,
                            "batches": 0 if iv is None else iv.n, "_iv": iv})
        return out

    def _counts(self, cell: _Cell, bounds: np.ndarray):
        """(batches, tiers, outcomes) client request counts and (batches, buckets) server
        latency bucket increments of one cell between consecutive ``bounds``."""
        fleet = cell.fleet
        node_series, fleet_series = fleet.sample_series()
        samples = fleet.samples(bounds[0] - 2 * self.sc.metrics.interval_s)
        _, ft, fv = samples[-1]
        col = {(s[1], s[2]): i for i, s in enumerate(fleet_series)
               if s[0] == "client_requests_total"}
        idx = np.array([[col[(tier, o)] for o in OUTCOMES] for tier in TIERS])
        at = _at(ft, fv, bounds)  # (bounds, series)
        counts = np.diff(at[:, idx], axis=0)  # (batches, tiers, outcomes)
        bcols = np.array([i for i, s in enumerate(node_series)
                          if s[0] == "latency_seconds_bucket"])
        buckets = 0
        for _node, times, values in samples[:-1]:
            buckets = buckets + _at(times, values[:, bcols], bounds)
        cum = np.diff(buckets, axis=0)  # per batch; cumulative in le, as Prometheus'
        # (the +Inf bucket is the count): each bucket's own share by differencing in le
        inc = np.diff(np.concatenate([np.zeros((cum.shape[0], 1)), cum], axis=1), axis=1)
        return counts, inc

    # ---- the data plane's poll, with overrides --------------------------------------------
    def _apply(self, cell: _Cell, t: float) -> None:
        """At a poll: per flag, the tiers the cell's policy asks it for (its latest decision
        in force; before any, the data plane's own flags), a tier canary's tier taking
        the new policy's, then the overrides active for the cell on top."""
        asked = latest_in_force(cell.pending, t, "flags")
        now = cell.fleet.flags()
        state = _tier_state(asked if asked is not None else
                            {k: now[k] for k in POLICY_FLAGS})
        tier_asked = (latest_in_force(cell.tier_pending, t, "flags")
                      if cell.tier_controller is not None else None)
        if tier_asked is not None:
            mine, theirs = frozenset({self.tier}), _tier_state(tier_asked)
            state = {k: (v - mine) | (theirs[k] & mine) for k, v in state.items()}
        policy_state = dict(state)
        for i, o in enumerate(self.sc.overrides):
            if o.zone is not None and o.zone != cell.zone:
                continue
            key = "shed" if o.flag == "shed_bronze" else o.flag
            wanted = policy_state[key] & o.tiers  # what the policy asked for the pin's tiers
            pinned = o.tiers if o.value else frozenset()
            pinning = o.active(t) and wanted != pinned
            was = i in cell.pinning
            if pinning:
                state[key] = (state[key] - o.tiers) | pinned
            where = cell.label + ("" if o.tier is None else f", tier {o.tier}")
            who = (f"the {cell.policy_label} policy {cell.controller.policy.name!r}"
                   if asked is not None else "the data plane's default (no decision yet)")
            said = _asked(wanted, o.tiers)
            if pinning and (not was or cell.pinning[i] != wanted):
                cell.pinning[i] = wanted
                self._row(t, "pin", cell.label, f"override {i}: {o.flag} pinned "
                          f"{str(o.value).lower()} in {where} ({o.start_s:g}-"
                          f"{_end(o.end_s)} s) where {who} asked {said}", stage="override",
                          signal=o.flag, desired={o.flag: o.value})
            elif was and not pinning:
                del cell.pinning[i]
                why = ("the override's interval ended" if not o.active(t) else
                       f"{who} now asks the pinned value")
                self._row(t, "release", cell.label, f"override {i}: {o.flag} follows the "
                          f"policy again in {where} ({said}): {why}", stage="override",
                          signal=o.flag, desired={o.flag: said})
        have = cell.fleet.tier_flags()
        if asked is None and tier_asked is None and all(
                state[k] == frozenset(have[k]) for k in state):
            return
        cell.fleet.set_flags(hedge_enabled=bool(state["hedge_enabled"]),
                             degraded_mode=bool(state["degraded_mode"]),
                             shed_tiers=tuple(x for x in TIERS if x in state["shed"]))
        if any(v and v != ALL for k, v in state.items() if k != "shed"):
            cell.fleet.set_tier_flags(hedge_tiers=sorted(state["hedge_enabled"]),
                                      degraded_tiers=sorted(state["degraded_mode"]))

    # ---- audit and result --------------------------------------------------------------
    def _row(self, t, action, target, reason, stage="rollout", signal=None, value=None,
             threshold=None, effective=None, desired=None):
        import json

        self.rows.append({**{k: None for k in AUDIT_COLUMNS}, "decided_at_s": float(t),
                          "effective_at_s": float(t if effective is None else effective),
                          "stage": stage, "action": action, "target": target,
                          "signal": signal, "value": value, "threshold": threshold,
                          "desired": None if desired is None else json.dumps(desired),
                          "reason": reason})

    def decisions(self) -> pl.DataFrame:
        parts = []
        for cell, label, ctl in self.controllers:
            d = ctl.decisions()
            if d.height:
                parts.append(d.with_columns(pl.lit(cell, pl.Int32).alias("zone"),
                                            pl.lit(label).alias("policy")))
        parts.append(pl.DataFrame(self.rows, schema=AUDIT_COLUMNS))
        return pl.concat(parts).sort("decided_at_s", maintain_order=True)

    def _result(self) -> RolloutResult:
        results = [c.fleet.result() for c in self.cells]
        obs = (pl.DataFrame([{k: v for k, v in r.items() if k != "_iv"}
                             for r in self.obs_rows]) if self.obs_rows else None)
        scope = "zone" if self.sc.fleet.zones else "cell"
        return RolloutResult(scope, results, self.decisions(),
                             info={"rollout": dict(self.outcome)},
                             labels=[c.label for c in self.cells], canary=self.canary,
                             observations=obs, outcome=dict(self.outcome),
                             shadow=None if self.shadow is None else self.shadow.fleet.result())


ALL = frozenset(TIERS)


def _tier_state(flags: dict) -> dict:
    """A policy's flags as the tiers each is on for: hedge_enabled and degraded_mode
    for every tier or none, shed for the tiers it sheds."""
    f = Flags().updated(**{k: v for k, v in flags.items()
                           if k in ("hedge_enabled", "degraded_mode", "shed_bronze",
                                    "shed_tiers")})
    return {"hedge_enabled": ALL if f.hedge_enabled else frozenset(),
            "degraded_mode": ALL if f.degraded_mode else frozenset(),
            "shed": frozenset(f.shed_tiers)}


def _asked(wanted: frozenset, tiers: frozenset) -> str:
    if wanted == tiers:
        return "true"
    if not wanted:
        return "false"
    return "true for " + ", ".join(t for t in TIERS if t in wanted) + " only"


def _end(x: float) -> str:
    return "end" if math.isinf(x) else f"{x:g}"


def _iv_text(iv) -> str:
    if iv is None:
        return "n/a (fewer than 2 slots measured)"
    return f"{iv.mean:+.4g} [{iv.low:+.4g}, {iv.high:+.4g}]"


def _slot_interval(x: np.ndarray) -> tuple[float, float]:
    """One side's 95 % interval over its slots (for figures: the decision uses the
    paired difference, whose interval is narrower when both sides move together)."""
    from relakit.stats import t_interval

    x = x[np.isfinite(x)]
    if x.size < 2:
        return math.nan, math.nan
    iv = t_interval(x)
    return iv.low, iv.high


def rollout_chart(result: RolloutResult, metric: str = "success_ratio", tier: str = "all",
                  title: str = "", label: str | None = None):
    """Canary vs rest over time, one point per observation window (at its middle; the
    two slices drawn a little apart), with 95 % intervals over the window's slots;
    below, their paired difference with its interval (what the rollout decides on)
    and the zero line. Rules on both panels, which share the time axis: where the
    canary started (dashed) and the promotion or rollback (solid)."""
    import altair as alt

    o = result.observation(metric, tier).with_columns(
        ((pl.col("start_s") + pl.col("end_s")) / 2).alias("mid_s"))
    label = label or f"{metric.replace('_', ' ')} ({tier})"
    shift = 0.04 * float(result.observations["end_s"][0] - result.observations["start_s"][0])
    levels = pl.concat([
        o.select((pl.col("mid_s") + d).alias("mid_s"), pl.col(side).alias("value"),
                 pl.col(f"{side}_low").alias("low"), pl.col(f"{side}_high").alias("high"),
                 pl.lit(side).alias("slice"))
        for side, d in (("canary", -shift), ("rest", shift))])
    end = float(o["end_s"].max())
    x = alt.X("mid_s:Q", title="time (s; each point: one observation window, at its middle)",
              scale=alt.Scale(domain=[0, end]))
    colour = alt.Color("slice:N", title="slice", scale=alt.Scale(
        domain=["canary", "rest"], range=["#d62728", "#1f77b4"]))
    top = alt.Chart(levels)
    upper = [top.mark_line(point=True).encode(
                 x=x, y=alt.Y("value:Q", title=label, scale=alt.Scale(zero=False)),
                 color=colour),
             top.mark_errorbar().encode(x=x, y=alt.Y("low:Q", title=label), y2="high:Q",
                                        color=colour)]
    diff = alt.Chart(o)
    lower = [alt.Chart(pl.DataFrame({"y": [0.0]})).mark_rule(color="gray", strokeDash=[2, 2])
             .encode(y="y:Q"),
             diff.mark_errorbar(color="black").encode(
                 x=x, y=alt.Y("low:Q", title="canary - rest, 95 % interval"), y2="high:Q"),
             diff.mark_point(color="black", filled=True).encode(x=x, y="diff:Q")]
    marks = [(float(result.observations["start_s"].min()), "canary starts", [4, 3], 8)]
    if result.outcome.get("action"):
        marks.append((result.outcome["at_s"], f"{result.outcome['action']}", [], 24))
    for t, what, dash, y in marks:
        m = pl.DataFrame({"t": [t], "what": [f"{what} at {t:g} s"]})
        rule = alt.Chart(m).mark_rule(color="#2ca02c", strokeWidth=2, strokeDash=dash).encode(
            x="t:Q")
        text = alt.Chart(m).mark_text(align="left", dx=4, color="#2ca02c").encode(
            x="t:Q", y=alt.value(y), text="what:N")
        upper += [rule, text]
        lower.append(rule)
    return alt.vconcat(alt.layer(*upper).properties(width=560, height=160, title=title),
                       alt.layer(*lower).properties(width=560, height=110)
                       ).resolve_scale(x="shared")


def _at(times: np.ndarray, values: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """Each series' newest sample at or before each bound (zeros before the first)."""
    i = np.searchsorted(times, bounds + EPS) - 1
    out = np.zeros((bounds.size, values.shape[1]))
    ok = i >= 0
    out[ok] = values[i[ok]]
    return out


def simulate(scenario, seed: int | None = None, record_requests: bool | None = None, **kw):
    """:func:`relakit.simulate`: a scenario with ``rollout`` or ``overrides`` runs here
    (one run, a :class:`RolloutResult`); any other goes on to
    :func:`relakit.zones.simulate` (zoned fleets), which sends the rest to
    :func:`relakit.experiment.simulate`."""
    from relakit.scenario import load_scenario, uses_rollout
    from relakit.zones import simulate as simulate_zoned

    sc = load_scenario(scenario)
    if not uses_rollout(sc):
        return simulate_zoned(sc, seed, record_requests, **kw)
    if (kw.get("replications") or 1) > 1:
        raise ValueError(f"{sc.source}: key 'rollout': a rollout decides inside one run; "
                         "use relakit.rollout.replicate for replications")
    return run_rollout(sc, seed, record_requests=record_requests is not False)


def run_rollout(sc, seed: int | None = None, record_requests: bool = False) -> RolloutResult:
    """One run of a scenario with ``rollout`` and/or ``overrides``."""
    return RolloutRun(sc, seed, record_requests).run()


def replicate(sc, n: int, seed: int | None = None, metric: str = "success_ratio",
              tier: str = "all") -> pl.DataFrame:
    """``n`` runs on :func:`relakit.replications.replication_seeds`: per replication the
    rollout's outcome (action, at_s, observation) and, at the observation that decided
    (the last one if none did), ``metric`` of ``tier``: canary, rest, and the paired
    difference with its interval over the window's slots. Two scenarios run on the
    same seeds are paired (common random numbers)."""
    from relakit.replications import replication_seeds

    base = sc.seed if seed is None else int(seed)
    rows = []
    for i, s in enumerate(replication_seeds(base, n)):
        res = run_rollout(sc, int(s))
        o = res.observation(metric, tier)
        k = res.outcome["observation"] or int(o["observation"].max())
        at = o.filter(pl.col("observation") == k).row(0, named=True)
        rows.append({"replication": i, "seed": int(s), **res.outcome,
                     **{c: at[c] for c in ("canary", "rest", "diff", "low", "high")}})
    return pl.DataFrame(rows, schema={"replication": pl.Int64, "seed": pl.UInt64,
                                      "action": pl.String, "at_s": pl.Float64,
                                      "observation": pl.Int64, "canary": pl.Float64,
                                      "rest": pl.Float64, "diff": pl.Float64,
                                      "low": pl.Float64, "high": pl.Float64})
