"""Progressive rollout of a policy change, and overrides: their part of the run.

The keys are read by :mod:`relakit.control.rollout`; this module holds what runs them
(the cells' layout, the rollout's steps, the overrides, the result), and
:func:`relakit.experiment.run_closed_loop` runs it. A run is a
set of **cells** in lock-step, each one data plane (a kernel) with its own control
plane (agents, config server and their faults, as any closed-loop run has):
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
(:func:`relakit.experiment.replicate_rollout`) the decision's time and the outcomes
get their own intervals.

**Audit.** Each rollout step is a row of stage ``rollout`` (``start``, one
``observe`` row per condition with the canary's and the rest's numbers, the
difference and its interval, ``promote`` / ``rollback``); each time an override
starts or stops overriding what a cell's policy asked, a row of stage ``override``
(``pin`` / ``release``). The policy rows carry the cell (``zone``) and which policy
decided (``policy``: current or new); a cell's control-plane rows carry its cell.

**With the control plane's faults and agents**, each cell's control plane has them
(every cell's agents are down when ``control_plane.agent`` says; a scrape gap's
targets are fleet-wide node numbers). A new configuration (start, promote,
rollback) reaches every replica of the cell's agents
(:meth:`~relakit.control.plane.ControlPlane.install`); a write lost to the config
server is lost for the rollout too, and an override reaches an instance only at a
successful poll.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import polars as pl

from relakit.control.audit import DECISION_COLUMNS
from relakit.control.controller import Controller
from relakit.control.decider import Decision
from relakit.control.rollout import METRICS, canary_nodes, paired_batches, window_metric
from relakit.vocab import OUTCOMES, TIERS, Flags
from relakit.zones import ZonedResult, zone_offsets, zone_scenario

EPS = 1e-9
AUDIT_COLUMNS = {**DECISION_COLUMNS, "zone": pl.Int32, "policy": pl.String}


@dataclass(frozen=True)
class CellPart:
    """One cell of a rollout's layout: its scenario, label, zone (-1: none) and the
    fleet-wide number of its first node."""

    scenario: object
    label: str
    zone: int = -1
    offset: int = 0


@dataclass(frozen=True)
class Layout:
    parts: list
    canary: int | None  # the canary cell's index (None: overrides alone)


def cells(sc) -> Layout:
    """The cells a scenario with ``rollout`` and/or ``overrides`` runs as."""
    ro = sc.rollout
    if sc.fleet.zones:
        n, offsets = len(sc.fleet.zones), zone_offsets(sc)
        return Layout([CellPart(zone_scenario(sc, z), f"zone {z}", z, int(offsets[z]))
                       for z in range(n)], None if ro is None else int(ro.canary))
    if ro is not None and ro.canary_kind == "fraction":
        n = sc.fleet.nodes
        k = canary_nodes(ro.canary, n)
        split = dataclasses.replace(sc, fleet=dataclasses.replace(
            sc.fleet, zones=(k, n - k), zone_mix=(k / n, 1 - k / n)))
        return Layout([CellPart(zone_scenario(split, 0), f"canary cell (nodes 0-{k - 1})"),
                       CellPart(zone_scenario(split, 1), f"rest (nodes {k}-{n - 1})", -1, k)],
                      0)
    return Layout([CellPart(sc, "fleet")], None if ro is None else 0)  # a tier canary: one cell


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


class TierScoped:
    """A tier canary's controller as a decider: what it wants goes to the canary tier
    only (``Decision.tier_flags``); its audit, timeline and policy are the controller's."""

    def __init__(self, inner: Controller):
        self.inner = inner

    def decide(self, tsdb, t: float) -> Decision:
        return Decision(tier_flags=self.inner.decide(tsdb, t).flags)

    def decisions(self) -> pl.DataFrame:
        return self.inner.decisions()

    def timeline(self) -> pl.DataFrame:
        return self.inner.timeline()

    def __getattr__(self, name):  # policy, absent: the controller's
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)


class Rollout:
    """The rollout's and the overrides' part of a closed-loop run (see the module):
    :func:`relakit.experiment.run_closed_loop` calls :meth:`act` at :meth:`times`, and
    each cell's control plane hands its successful polls to :meth:`on_poll`. The cells
    and their control planes (``domains``, one per cell, with the shadow's last) are the
    experiment layer's; this object only reconfigures and reads them."""

    def __init__(self, sc):
        self.sc = sc
        self.ro = sc.rollout
        self.clk = sc.clocks
        self.tier = self.ro.canary if self.ro is not None and self.ro.canary_kind == "tier" \
            else None
        self.rest_name = "shadow" if self.tier is not None else "rest"
        self.controllers: list = []  # (cell, policy label, Controller), in start order
        self.policy_of: dict = {}  # cell -> (label, policy) its controller runs now
        self.pinning: dict = {}  # cell -> {override index: the tiers the policy asked}
        self.rows: list[dict] = []
        self.obs_rows: list[dict] = []
        self.outcome = {"action": None, "at_s": None, "observation": None}
        self.bounds = sc.metrics.latency_buckets_s

    def deciders(self, cell: int, policy, label: str, tier_policy=None, audit: bool = True):
        """A factory of one cell's deciders (each agent's, each cold restart's): a
        controller on ``policy`` and, for a tier canary, one on ``tier_policy`` for
        that tier; each instance enters the audit labelled by its cell and policy."""
        self.policy_of[cell] = (label, policy)

        def make() -> list:
            out = [self._controller(cell, label, policy, audit)]
            if tier_policy is not None:
                out.append(self._tier_controller(cell, tier_policy))
            return out

        return make

    def _controller(self, cell: int, label: str, policy, audit: bool = True) -> Controller:
        c = Controller(policy, self.clk)
        if audit:
            self.controllers.append((cell, label, c))
        return c

    def _tier_controller(self, cell: int, policy) -> TierScoped:
        return TierScoped(self._controller(cell, f"new (tier {self.tier})", policy))

    def attach(self, cells: list, domains: list, canary: int | None, shadow=None) -> None:
        self.cells, self.domains, self.canary, self.shadow = cells, domains, canary, shadow
        self.index = {id(c): i for i, c in enumerate(cells)}
        if shadow is not None:
            self.index[id(shadow)] = -1

    def times(self, end_s: float) -> np.ndarray:
        """The rollout's instants: its start and every observation after it."""
        if self.ro is None:
            return np.zeros(0)
        k = np.arange(0, math.floor((end_s - self.ro.start_s) / self.ro.observe_s + EPS) + 1)
        return self.ro.start_s + k * self.ro.observe_s

    def _install(self, cell: int, policy, label: str, tier_policy=None, now=None) -> None:
        """A new configuration on the cell's control plane (fresh controllers unless
        ``now`` maps its replicas' deciders to the ones that go on)."""
        self.domains[cell].plane.install(self.deciders(cell, policy, label, tier_policy), now)

    # ---- the rollout -------------------------------------------------------------------
    def act(self, t: float) -> None:
        ro = self.ro
        k = int(round((t - ro.start_s) / ro.observe_s))
        canary = self.cells[self.canary]
        if k == 0 and self.tier is not None:
            self._install(self.canary, self.sc.policy, "current", tier_policy=ro.policy,
                          now=lambda ds: [ds[0], self._tier_controller(self.canary,
                                                                       ro.policy)])
            self._row(t, "start", f"tier {self.tier}", f"the canary, tier {self.tier}, gets the "
                      f"flags of the new policy {ro.policy.name!r} ({ro.source}, fresh "
                      f"hysteresis state); the other tiers keep {self.sc.policy.name!r}'s; "
                      f"compared every {ro.observe_s:g} s with a shadow run of "
                      f"{self.sc.policy.name!r} alone on the same seed")
            return
        if k == 0:
            self._install(self.canary, ro.policy, "new")
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
            plane = self.domains[self.canary].plane
            if rollback and self.tier is not None:  # the tier's wishes go
                self._install(self.canary, self.sc.policy, "current", now=lambda ds: ds[:1])
                plane.pending = [(e, d) for e, d in plane.pending if d.tier_flags is None]
                self._row(t, "rollback", f"tier {self.tier}", f"rolled back at observation "
                          f"{k}: {ro.rollback_if.combine} of rollback_if held; tier "
                          f"{self.tier} returns to {self.sc.policy.name!r}'s flags (its "
                          "controller never stopped)")
            elif promote and self.tier is not None:  # the tier's wishes now every tier's
                self._install(self.canary, ro.policy, "new", now=lambda ds: [ds[1].inner])
                plane.pending = [(e, Decision(flags=d.tier_flags)) for e, d in plane.pending
                                 if d.tier_flags is not None]
                self._row(t, "promote", "every tier", f"promoted at observation {k}: "
                          f"{ro.promote_if.combine} of promote_if held; {ro.policy.name!r} "
                          f"now sets every tier's flags (its controller, labelled new (tier "
                          f"{self.tier}), goes on with its state)")
            elif rollback:
                self._install(self.canary, self.sc.policy, "current")
                self._row(t, "rollback", canary.label, f"rolled back at observation {k}: "
                          f"{ro.rollback_if.combine} of rollback_if held; {canary.label} "
                          f"returns to {self.sc.policy.name!r} (fresh hysteresis state)")
            else:
                rest = [c for i, c in enumerate(self.cells) if i != self.canary]
                for i in range(len(self.cells)):
                    if i != self.canary:
                        self._install(i, ro.policy, "new")
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

    def _counts(self, cell, bounds: np.ndarray):
        """(batches, tiers, outcomes) client request counts and (batches, buckets) server
        latency bucket increments of one cell between consecutive ``bounds``."""
        fleet = cell.fleet
        node_series, fleet_series = fleet.sample_series()
        samples = fleet.samples(bounds[0] - 2 * self.sc.metrics.interval_s)
        _, ft, fv = samples[-1]
        col = {(s[1], s[2]): i for i, s in enumerate(fleet_series)
               if s[0] == "client_requests_total"}
        # the in-path outcomes are series only in a run with an in-path mechanism: 0 else
        at = np.concatenate([_at(ft, fv, bounds), np.zeros((len(bounds), 1))], axis=1)
        idx = np.array([[col.get((tier, o), at.shape[1] - 1) for o in OUTCOMES]
                        for tier in TIERS])
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
    def on_poll(self, cell, t: float, asked: Flags | None, tier_asked: Flags | None) -> None:
        """At a successful poll: per flag, the tiers the cell's policy asks it for (its
        latest decision in force, ``asked``; before any, the data plane's own flags), a
        tier canary's tier taking the new policy's (``tier_asked``), then the overrides
        active for the cell on top."""
        index = self.index[id(cell)]
        pins = self.pinning.setdefault(index, {})
        label, policy = self.policy_of[index]
        state = _tier_state(asked if asked is not None else cell.fleet.flag_state())
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
            was = i in pins
            if pinning:
                state[key] = (state[key] - o.tiers) | pinned
            where = cell.label + ("" if o.tier is None else f", tier {o.tier}")
            who = (f"the {label} policy {policy.name!r}"
                   if asked is not None else "the data plane's default (no decision yet)")
            said = _asked(wanted, o.tiers)
            if pinning and (not was or pins[i] != wanted):
                pins[i] = wanted
                self._row(t, "pin", cell.label, f"override {i}: {o.flag} pinned "
                          f"{str(o.value).lower()} in {where} ({o.start_s:g}-"
                          f"{_end(o.end_s)} s) where {who} asked {said}", stage="override",
                          signal=o.flag, desired={o.flag: o.value})
            elif was and not pinning:
                del pins[i]
                why = ("the override's interval ended" if not o.active(t) else
                       f"{who} now asks the pinned value")
                self._row(t, "release", cell.label, f"override {i}: {o.flag} follows the "
                          f"policy again in {where} ({said}): {why}", stage="override",
                          signal=o.flag, desired={o.flag: said})
        have = cell.fleet.tier_flags()
        if asked is None and tier_asked is None and all(
                state[k] == frozenset(have[k]) for k in state):
            return
        cell.fleet.set_flags(cell.fleet.flag_state().updated(
            hedge_enabled=bool(state["hedge_enabled"]),
            degraded_mode=bool(state["degraded_mode"]),
            shed_tiers=tuple(x for x in TIERS if x in state["shed"])))
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

    def decisions(self, plane_rows=()) -> pl.DataFrame:
        """The audit: every controller's rows (with its cell and policy label), the
        rollout's and overrides' rows, and the cells' control planes' ``plane_rows``
        (with their ``zone`` column)."""
        parts = []
        for cell, label, ctl in self.controllers:
            d = ctl.decisions()
            if d.height:
                parts.append(d.with_columns(pl.lit(cell, pl.Int32).alias("zone"),
                                            pl.lit(label).alias("policy")))
        parts.append(pl.DataFrame(self.rows, schema=AUDIT_COLUMNS))
        parts += [r.with_columns(pl.lit(None, pl.String).alias("policy")).select(
            list(AUDIT_COLUMNS)) for r in plane_rows if r.height]
        return pl.concat(parts).sort("decided_at_s", maintain_order=True)

    def result(self, results: list, shadow=None, plane_rows=(), info=None) -> RolloutResult:
        """The run's result from its cells' results (and a tier canary's shadow run's)."""
        obs = (pl.DataFrame([{k: v for k, v in r.items() if k != "_iv"}
                             for r in self.obs_rows]) if self.obs_rows else None)
        scope = "zone" if self.sc.fleet.zones else "cell"
        return RolloutResult(scope, results, self.decisions(plane_rows),
                             info={"rollout": dict(self.outcome), **(info or {})},
                             labels=[c.label for c in self.cells], canary=self.canary,
                             observations=obs, outcome=dict(self.outcome), shadow=shadow)


ALL = frozenset(TIERS)


def _tier_state(flags: Flags) -> dict:
    """A policy's flags (``flags``' :data:`~relakit.vocab.POLICY_FLAGS`) as the tiers
    each is on for: hedge_enabled and degraded_mode for every tier or none, shed for
    the tiers it sheds."""
    f = Flags().with_policy(flags)
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


def _at(times: np.ndarray, values: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """Each series' newest sample at or before each bound (zeros before the first)."""
    i = np.searchsorted(times, bounds + EPS) - 1
    out = np.zeros((bounds.size, values.shape[1]))
    ok = i >= 0
    out[ok] = values[i[ok]]
    return out
