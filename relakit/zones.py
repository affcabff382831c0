"""Zones and sharded controllers: `fleet.zones` and a policy's `scope: fleet|zone`.

A zone is a group of nodes (``fleet.zones: [4, 4, 4]``: nodes 0-3, 4-7, 8-11) that
its requests never leave: each arrival belongs to one zone (``fleet.zone_mix``, by
default each zone's share of the nodes) and every copy of it (first attempt, retry,
hedge, failover) is routed inside that zone. Splitting a Poisson stream by
independent shares gives independent Poisson streams, so a zoned fleet *is* one
data plane per zone, each with its own arrivals at ``rate x share``; relakit runs it
that way, one kernel per zone on a seed derived from the run's seed and the zone
index, in lock-step under the control plane. The kernel is untouched: every flag
(hedging, degraded mode, shedding, breaker) is per zone because each zone has its
own flag state, and a fleet without zones runs exactly as before.

* ``scope: fleet`` — one controller reads all zones' node series (one TSDB, nodes
  numbered fleet-wide) and asserts the same flags in every zone: RelA's global
  control, whose shedding reaches zones that were fine.
* ``scope: zone`` — one controller per zone reads its zone's nodes only and asserts
  its zone's flags: a sharded control plane.

What this does not model (and a single kernel with per-zone flag arrays would): a
copy crossing zones, and fleet-wide mitigation state (the retry budget and the
breaker are per zone). The decisions table carries a ``zone`` column (null: the
fleet-wide controller).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import polars as pl

from relakit.control import TSDB, Controller, Target
from relakit.control.decider import latest_in_force
from relakit.control.signals import policy_reach_s
from relakit.sim import Fleet, SimulationResult


def zone_offsets(sc) -> np.ndarray:
    """First node of each zone, and the node count after the last."""
    return np.concatenate([[0], np.cumsum(sc.fleet.zones)]).astype(int)


def zone_seed(seed: int, zone: int) -> int:
    """The zone's kernel seed: the run's seed and the zone index, mixed."""
    return int(np.random.SeedSequence([int(seed), int(zone)]).generate_state(1, np.uint64)[0]
               >> np.uint64(1))


def zone_scenario(sc, zone: int):
    """The data plane of one zone: its nodes, its share of the arrivals, its faults."""
    lo, hi = (int(x) for x in zone_offsets(sc)[zone:zone + 2])
    f = sc.fleet
    share = f.zone_mix[zone]
    arrival = dataclasses.replace(sc.workload.arrival,
                                  rates_rps=tuple(x * share for x in sc.workload.arrival.rates_rps))
    fleet = dataclasses.replace(
        f, nodes=hi - lo, servers=f.servers[lo:hi], weights=f.weights[lo:hi], zones=(),
        zone_mix=(), dependencies=tuple((a - lo, b - lo, s) for a, b, s in f.dependencies
                                        if lo <= a < hi))
    faults = tuple(dataclasses.replace(x, node=x.node - lo) for x in sc.faults
                   if lo <= x.node < hi)
    metrics = sc.metrics
    if metrics.phase_s:
        metrics = dataclasses.replace(metrics, phase_s=metrics.phase_s[lo:hi])
    return dataclasses.replace(sc, name=f"{sc.name}[zone {zone}]", fleet=fleet, faults=faults,
                               metrics=metrics,
                               workload=dataclasses.replace(sc.workload, arrival=arrival))


def with_scope(sc, scope: str):
    """The scenario with its policy's scope set (global vs per-zone control, same seeds)."""
    return dataclasses.replace(sc, policy=dataclasses.replace(sc.policy, scope=scope))


def simulate(scenario, seed: int | None = None, record_requests: bool | None = None, **kw):
    """:func:`relakit.simulate`: a zoned scenario runs here (one replication, a
    :class:`ZonedResult`); any other goes to :func:`relakit.experiment.simulate`."""
    from relakit.experiment import simulate as simulate_fleet
    from relakit.scenario import load_scenario

    sc = load_scenario(scenario)
    if not sc.fleet.zones:
        return simulate_fleet(sc, seed, record_requests, **kw)
    n = kw.get("replications") or sc.replications
    if n > 1:
        raise ValueError(f"{sc.source}: key 'replications': a zoned fleet runs one "
                         "replication at a time; use relakit.zones.replicate_zoned")
    return run_zoned(sc, seed, record_requests=record_requests is not False)


@dataclass
class ZonedResult:
    """One zoned run: each zone's result (nodes numbered within the zone) and the audit."""

    scope: str
    zones: list[SimulationResult]
    decisions: pl.DataFrame | None  # None: no policy
    info: dict = dataclasses.field(default_factory=dict)

    def write(self, out_dir) -> list:
        """Each zone's tables under ``zone<i>/``, plus by_zone.parquet and the audit
        (decisions.parquet, with its zone column), each file atomically."""
        from pathlib import Path

        from relakit.io import write_parquet

        out = Path(out_dir)
        written = [p for z, r in enumerate(self.zones) for p in r.write(out / f"zone{z}")]
        written.append(write_parquet(self.by_zone(), out / "by_zone.parquet"))
        if self.decisions is not None:
            written.append(write_parquet(self.decisions, out / "decisions.parquet"))
        return written

    def format_summary(self) -> str:
        """Each zone's summary, one block per zone (the CLI prints it)."""
        return "\n\n".join(f"zone {z} (scope {self.scope}):\n{r.format_summary()}"
                             for z, r in enumerate(self.zones))

    @property
    def requests(self) -> pl.DataFrame | None:
        """Every zone's per-request records with a ``zone`` column (node ids within
        the zone), or None when they were not kept."""
        if self.zones[0].requests is None:
            return None
        return pl.concat([r.requests.with_columns(pl.lit(z, pl.Int32).alias("zone"))
                          for z, r in enumerate(self.zones)])

    @property
    def summary(self) -> pl.DataFrame:
        """Per tier, the counts summed over zones and the success ratio (latency
        quantiles do not add up over zones: read them per zone, :meth:`by_zone`)."""
        counts = ["requests", "ok", "error", "timeout", "dropped", "hedges", "degraded", "wrong"]
        t = self.by_zone().group_by("tier", maintain_order=True).agg(pl.col(counts).sum())
        return t.with_columns((pl.col("ok") / pl.col("requests")).alias("success_ratio"))

    def by_zone(self) -> pl.DataFrame:
        """Each zone's summary rows (tier gold..bronze and all), with a ``zone`` column."""
        return pl.concat([r.summary.with_columns(pl.lit(z, pl.Int32).alias("zone"))
                          for z, r in enumerate(self.zones)])

    def blast_radius(self, inside) -> dict:
        """What control did to requests outside the ``inside`` zones (shed = dropped,
        hedged, degraded: requests touched by a mitigation they did not need), and gold
        success inside and outside."""
        t = self.by_zone()
        ins = pl.col("zone").is_in(list(inside))
        out_all = t.filter(~ins & (pl.col("tier") == "all"))
        gold = t.filter(pl.col("tier") == "gold")

        def ratio(rows):
            n = int(rows["requests"].sum())
            return int(rows["ok"].sum()) / n if n else float("nan")

        shed, hedged, degraded = (int(out_all[c].sum()) for c in ("dropped", "hedges",
                                                                   "degraded"))
        return {"outside_requests": int(out_all["requests"].sum()), "outside_shed": shed,
                "outside_hedged": hedged, "outside_degraded": degraded,
                "blast_radius": shed + hedged + degraded,
                "gold_success_inside": ratio(gold.filter(ins)),
                "gold_success_outside": ratio(gold.filter(~ins))}


def run_zoned(sc, seed: int | None = None, record_requests: bool = False) -> ZonedResult:
    """One run of a zoned scenario (policy scope fleet or zone)."""
    from relakit.experiment import run_once

    seed = sc.seed if seed is None else int(seed)
    n = len(sc.fleet.zones)
    parts = [zone_scenario(sc, z) for z in range(n)]
    if sc.policy is not None and sc.policy.scope == "zone":
        results = [run_once(p, zone_seed(seed, z), record_requests) for z, p in enumerate(parts)]
        decisions = pl.concat([r.decisions.with_columns(pl.lit(z, pl.Int32).alias("zone"))
                               for z, r in enumerate(results)]).sort("decided_at_s",
                                                                     maintain_order=True)
        return ZonedResult("zone", results, decisions)
    fleets = [Fleet(p, seed=zone_seed(seed, z), record_requests=record_requests)
              for z, p in enumerate(parts)]
    if sc.policy is None:
        for f in fleets:
            f.advance(sc.duration_s)
        return ZonedResult("fleet", [f.result() for f in fleets], None)
    controller = _fleet_scope_loop(fleets, sc)
    results = []
    for f in fleets:
        res = f.result()
        res.timeline = controller.timeline()
        res.decisions = controller.decisions()
        results.append(res)
    decisions = controller.decisions().with_columns(pl.lit(None, pl.Int32).alias("zone"))
    return ZonedResult("fleet", results, decisions)


def _fleet_scope_loop(fleets: list[Fleet], sc) -> Controller:
    """:func:`relakit.experiment.run_closed_loop` over several zones in lock-step: one
    controller reads them all and its flags go to every zone at each config poll."""
    from relakit.experiment import FleetView

    clk = sc.clocks
    controller = Controller(sc.policy, clk)
    evals = clk.eval_times(0.0, sc.duration_s)
    polls = clk.poll_times(0.0, sc.duration_s)
    eval_set, poll_set = set(evals.tolist()), set(polls.tolist())
    lookback = clk.lookback(policy_reach_s(sc.policy))
    views = [FleetView(f, lookback_s=lookback) for f in fleets]
    offsets = zone_offsets(sc)
    pending = []
    for t in np.union1d(evals, polls):
        for f in fleets:
            f.advance(float(t))
        if t in eval_set:
            decision = controller.decide(merged_tsdb(views, offsets, float(t)), float(t))
            pending.append((float(clk.effective_at(float(t))), decision))
        if t in poll_set:
            flags = latest_in_force(pending, float(t), "flags")
            if flags is not None:
                for f in fleets:
                    f.set_flags(**flags)
    for f in fleets:
        f.advance(sc.duration_s)
    return controller


def merged_tsdb(views, offsets, t: float) -> TSDB:
    """One TSDB over all zones: node targets renumbered fleet-wide; the client-side
    (fleet, node -1) targets summed sample by sample over their common times (counters
    add up; a flag gauge then counts the zones with the flag on)."""
    targets, client = [], []
    for z, view in enumerate(views):
        for tgt in view.tsdb(t).targets:
            if tgt.node >= 0:
                targets.append(Target(int(offsets[z]) + tgt.node, tgt.times, tgt.values,
                                      tgt.columns))
            else:
                client.append(tgt)
    k = min(c.times.size for c in client)
    values = sum(c.values[c.values.shape[0] - k:] for c in client)
    targets.append(Target(-1, client[0].times[client[0].times.size - k:], values,
                          client[0].columns))
    return TSDB(targets)


def replicate_zoned(sc, n: int, seed: int | None = None, inside=(0,)) -> pl.DataFrame:
    """``n`` replications (seeds from :func:`relakit.replications.replication_seeds`):
    one row per replication with :meth:`ZonedResult.blast_radius`'s numbers. Two
    scopes run on the same seeds are paired (common random numbers)."""
    from relakit.replications import replication_seeds

    base = sc.seed if seed is None else int(seed)
    rows = []
    for i, s in enumerate(replication_seeds(base, n)):
        rows.append({"replication": i, "seed": int(s),
                     **run_zoned(sc, int(s)).blast_radius(inside)})
    return pl.DataFrame(rows)


def zone_series(runs: dict) -> pl.DataFrame:
    """Dropped requests per second in each zone over time, per scope: ``runs`` maps a
    scope to a :class:`ZonedResult`; columns scope, zone, time_s, dropped_rps."""
    from relakit.experiment import fleet_series

    return pl.concat([fleet_series(r).select("time_s", "dropped_rps").with_columns(
        pl.lit(scope).alias("scope"), pl.lit(f"zone {z}").alias("zone"))
        for scope, zr in runs.items() for z, r in enumerate(zr.zones)])


def zone_series_chart(series: pl.DataFrame, fault=None):
    """Shed requests per zone over time, one panel per scope on a shared time axis;
    ``fault`` (start_s, end_s) shades the overload."""
    import altair as alt

    panels = []
    for scope in series["scope"].unique(maintain_order=True).to_list():
        line = alt.Chart(series.filter(pl.col("scope") == scope),
                         title=f"policy scope: {scope}").mark_line().encode(
            x=alt.X("time_s:Q", title="time (s)"),
            y=alt.Y("dropped_rps:Q", title="requests shed (per s)"),
            color=alt.Color("zone:N", title="zone"))
        layers = [line]
        if fault is not None:
            band = pl.DataFrame({"start_s": [fault[0]], "end_s": [fault[1]]})
            layers.insert(0, alt.Chart(band).mark_rect(opacity=0.12, color="gray").encode(
                x="start_s:Q", x2="end_s:Q"))
        panels.append(alt.layer(*layers).properties(width=560, height=140))
    return alt.vconcat(*panels).resolve_scale(x="shared", y="shared", color="shared")


def blast_radius_chart(table: pl.DataFrame):
    """Mean blast radius per scope with its 95 % interval (columns scope, mean, low,
    high) as bars and error bars."""
    import altair as alt

    df = table
    base = alt.Chart(df).encode(y=alt.Y("scope:N", title="policy scope"))
    bars = base.mark_bar().encode(
        x=alt.X("mean:Q", title="requests shed, hedged or degraded outside zone 0"),
        color=alt.Color("scope:N", title="policy scope", legend=None))
    err = base.mark_errorbar(color="black").encode(
        x=alt.X("low:Q", title="requests shed, hedged or degraded outside zone 0"),
        x2="high:Q")
    return alt.layer(bars, err).properties(width=560, height=90)
