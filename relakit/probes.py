"""Silent failures caught by correctness probes: what a run shows, over replications.

A silent failure answers wrongly with success status; the error rate never
moves, so the chain's error threshold cannot see it. With ``fleet.probes``
each node gets synthetic requests whose answers are known; Aegis isolates a
node whose probe failure ratio is over ``wrong_threshold`` (with at least
``min_probe_volume`` probes in the window). This module scores a run against
ground truth the chain never sees (the scenario's wrong-answer fault):

* ``detection_delay_s``: from the fault's onset to Aegis' isolation decision;
* ``effective_delay_s``: to the config poll that took the node out of routing;
* ``wrong_before_isolation``: wrong answers the node served to users from the
  onset until then (what the failure cost before it was caught);
* ``probe_cost``: the share of the fleet's capacity the probes took (probes
  counted x mean service time / servers x run time).

:func:`detection_runs` repeats a scenario with the onset moved by a uniform
offset per replication, so the clocks' phases are independent of the onset,
as the closed form (:func:`relakit.analytic.probe_detection`) assumes.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import polars as pl

from relakit.replications import replication_seeds
from relakit.scenario import load_scenario


def silent_fault(sc):
    """The scenario's first wrong-answer fault (index, fault)."""
    for k, f in enumerate(sc.faults):
        if f.wrong_rate > 0:
            return k, f
    raise ValueError(f"{sc.source}: no fault with a wrong_rate: nothing silent to catch")


def probe_report(sc, result) -> dict:
    """One run's detection delays, wrong answers served before isolation, probe cost."""
    _, f = silent_fault(sc)
    iso = result.decisions.filter((pl.col("action") == "isolate")
                                  & (pl.col("target") == f"node {f.node}")
                                  & (pl.col("decided_at_s") >= f.start_s)).sort("decided_at_s")
    decided = float(iso["decided_at_s"][0]) if iso.height else math.nan
    effective = float(iso["effective_at_s"][0]) if iso.height else math.nan
    until = effective if iso.height else sc.duration_s
    wrong = None
    if result.requests is not None:
        wrong = int(result.requests.filter(
            (pl.col("node") == f.node) & ~pl.col("correct") & (pl.col("arrival_s") >= f.start_s)
            & (pl.col("arrival_s") < until)).height)
    per_node = result.metrics.filter(pl.col("name") == "probe_requests_total").group_by(
        "node").agg(pl.col("value").max())
    probes = per_node["value"].sum()
    # server-seconds the probes held: each node's probes at that node's mean service
    mean_s = {i: m / 1000 for i, m in enumerate(sc.fleet.node_mean_ms)}
    probe_s = sum(float(v or 0) * mean_s[int(n)] for n, v in per_node.iter_rows())
    capacity_s = sum(sc.fleet.servers) * sc.duration_s
    return {"onset_s": f.start_s, "detected": int(iso.height > 0),
            "detection_delay_s": decided - f.start_s, "effective_delay_s": effective - f.start_s,
            "wrong_before_isolation": wrong,
            "probes": int(probes or 0),
            "probe_cost": probe_s / capacity_s}


def detection_runs(scenario, replications: int = 10, onset_jitter_s: float = 10.0,
                   overrides: dict | None = None) -> pl.DataFrame:
    """One row per replication: :func:`probe_report` of the scenario, its silent fault's
    onset moved later by U(0, onset_jitter_s) drawn from the replication's seed."""
    from relakit.experiment import simulate

    base = load_scenario(scenario, overrides=overrides)
    k, f = silent_fault(base)
    rows = []
    for i, seed in enumerate(replication_seeds(base.seed, replications)):
        shift = float(np.random.default_rng(seed).uniform(0, onset_jitter_s))
        faults = list(base.faults)
        faults[k] = dataclasses.replace(f, start_s=f.start_s + shift)
        sc = dataclasses.replace(base, faults=tuple(faults))
        rows.append({"replication": i, "seed": seed, **probe_report(sc, simulate(sc, seed=seed))})
    return pl.DataFrame(rows)
