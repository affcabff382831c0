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

* ``scope: fleet`` (and a chain without a policy) — one control plane reads all
  zones' node series (one TSDB, nodes numbered fleet-wide) and asserts the same
  flags in every zone: RelA's global control, whose shedding reaches zones that
  were fine. A chain's node controls go to the zone holding the node (Atlas's
  weights then shift work between nodes of one zone only: requests never leave it).
* ``scope: zone`` — one control plane per zone reads its zone's nodes only and
  asserts its zone's flags: a sharded control plane.

Each zone is a *cell* of :func:`relakit.experiment.run_closed_loop`, so a zoned
fleet has the control plane's faults and agents (``control_plane``, ``agents``,
``data_plane``) like any run; this module holds the zones' parts (their
scenarios, seeds and result), the experiment layer runs them.

What this does not model (and a single kernel with per-zone flag arrays would): a
copy crossing zones, and fleet-wide mitigation state (the retry budget and the
breaker are per zone), and a chain per zone (``scope: zone`` with a chain is
refused: a chain's node classes and its cap on isolated nodes are the fleet's).
The decisions table carries a ``zone`` column (null: the fleet-wide control plane).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import polars as pl

from relakit.sim import SimulationResult
from relakit.vocab import OUTCOMES


def zone_offsets(sc) -> np.ndarray:
    """First node of each zone, and the node count after the last."""
    return np.concatenate([[0], np.cumsum(sc.fleet.zones)]).astype(int)


def zone_seed(seed: int, zone: int) -> int:
    """The zone's kernel seed: the run's seed and the zone index, mixed."""
    return int(np.random.SeedSequence([int(seed), int(zone)]).generate_state(1, np.uint64)[0]
               >> np.uint64(1))


def zone_scenario(sc, zone: int):
    """The data plane of one zone: its nodes, its share of the arrivals, its faults."""
    if sc.workload.clients is not None:
        from relakit.validate import ScenarioError

        raise ScenarioError(
            f"{sc.source}: key 'workload.clients': a closed client population cannot be "
            "split into cells (zones, or a rollout's fraction canary); give the cells' load "
            "as workload.arrival, or use a tier canary")
    lo, hi = (int(x) for x in zone_offsets(sc)[zone:zone + 2])
    f = sc.fleet
    share = f.zone_mix[zone]
    arrival = dataclasses.replace(sc.workload.arrival,
                                  rates_rps=tuple(x * share for x in sc.workload.arrival.rates_rps))
    fleet = dataclasses.replace(
        f, nodes=hi - lo, servers=f.servers[lo:hi], weights=f.weights[lo:hi], zones=(),
        service_scale=f.service_scale[lo:hi],
        baseline_error_rates=f.baseline_error_rates[lo:hi],
        zone_mix=(), dependencies=tuple((a - lo, b - lo, s) for a, b, s in f.dependencies
                                        if lo <= a < hi))
    faults = tuple(dataclasses.replace(x, node=x.node - lo) for x in sc.faults
                   if lo <= x.node < hi)
    metrics = sc.metrics
    if metrics.phase_s:
        metrics = dataclasses.replace(metrics, phase_s=metrics.phase_s[lo:hi])
    initial = sc.initial
    if not initial.empty:  # its nodes' queues; the pending retries by the zone's share
        m = initial.pending_retries
        base = [int(m * x) for x in f.zone_mix]
        extra = m - sum(base)  # (the rounding's rest to the first zones)
        initial = dataclasses.replace(initial, queue=initial.queue[lo:hi],
                                      pending_retries=base[zone] + (zone < extra))
    return dataclasses.replace(sc, name=f"{sc.name}[zone {zone}]", fleet=fleet, faults=faults,
                               metrics=metrics, initial=initial,
                               workload=dataclasses.replace(sc.workload, arrival=arrival))


def with_scope(sc, scope: str):
    """The scenario with its policy's scope set (global vs per-zone control, same seeds)."""
    return dataclasses.replace(sc, policy=dataclasses.replace(sc.policy, scope=scope))


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
        zones = self.by_zone()  # (the in-path outcomes only where the runs have them)
        counts = ["requests", *(o for o in OUTCOMES if o in zones.columns), "hedges",
                  "degraded", "wrong"]
        t = zones.group_by("tier", maintain_order=True).agg(pl.col(counts).sum())
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
