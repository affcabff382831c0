"""Thresholds that fit the node: one scenario run under several chains, scored alike.

A heterogeneous fleet (nodes whose normal error rates differ) is where a fixed
isolation threshold fails one way or the other: high enough for the noisy
nodes, it misses a subtle failure elsewhere; low enough to see that failure,
it isolates healthy nodes for being themselves. This module runs one scenario
under each chain of a mapping (fixed, per-class, adaptive thresholds, ...) for
the same replication seeds and scores every run from ground truth the chain
never sees (the scenario's faults and the repairs the chain made):

* ``false_isolations``: isolations of a node with no fault of its own in force
  (its baseline is not a fault);
* per fault ``k`` (in the scenario's order): ``fault{k}_detected`` (1 or 0) and
  ``fault{k}_delay_s``, from the fault's start to the first isolation of its
  node (nan when missed, so the mean is over the runs that saw it);
* ``gold_success``: the share of gold requests answered ok.

Replication ``i`` of every chain runs with ``replication_seeds(seed, n)[i]``, so
the chains are compared on common random numbers; :func:`compare_thresholds`
folds the runs into means and 95 % half-widths (``_ci``).
"""

from __future__ import annotations

import math

import polars as pl

from relakit.replications import replication_seeds, summarise_replications
from relakit.scenario import load_scenario

# the shipped variants for params/scenarios/chain-heterogeneous.yaml (chain files in
# params/chains, relative to the scenario's folder as a scenario's chain: is)
VARIANTS = {"fixed 20 %": "../chains/aegis.yaml", "fixed 5 %": "../chains/aegis-fixed-low.yaml",
            "class": "../chains/aegis-classes.yaml", "adaptive": "../chains/aegis-adaptive.yaml"}


def faults_in_force(sc, decisions: pl.DataFrame, node: int, t: float) -> list[int]:
    """Indices of the scenario's faults on ``node`` in force at t: started, not ended,
    and not mended by a repair the chain completed after the fault began."""
    repaired = decisions.filter((pl.col("action") == "repaired")
                                & (pl.col("target") == f"node {node}"))["decided_at_s"]
    out = []
    for k, f in enumerate(sc.faults):
        if f.node != node or not f.start_s <= t < f.end_s:
            continue
        if not any(f.start_s < r <= t for r in repaired):
            out.append(k)
    return out


def score_run(sc, result) -> dict:
    """One run's false isolations, per-fault detection and gold success (module docstring)."""
    iso = result.decisions.filter(pl.col("action") == "isolate")
    false = 0
    for t, target in iso.select("decided_at_s", "target").iter_rows():
        if not faults_in_force(sc, result.decisions, int(target.split()[1]), t):
            false += 1
    row = {"false_isolations": false}
    for k, f in enumerate(sc.faults):
        hits = iso.filter((pl.col("target") == f"node {f.node}")
                          & (pl.col("decided_at_s") >= f.start_s)
                          & (pl.col("decided_at_s") < f.end_s))["decided_at_s"]
        row[f"fault{k}_detected"] = int(hits.len() > 0)
        row[f"fault{k}_delay_s"] = float(hits.min() - f.start_s) if hits.len() else math.nan
    gold = result.summary.filter(pl.col("tier") == "gold")
    row["gold_success"] = float(gold["success_ratio"][0])
    return row


def threshold_runs(scenario, chains: dict | None = None, replications: int = 3,
                   progress=None, keep: dict | None = None) -> pl.DataFrame:
    """One row per chain and replication: the scores of :func:`score_run`. ``keep`` (a
    dict), if given, receives each run's result under (chain name, replication)."""
    from relakit.experiment import simulate

    chains = VARIANTS if chains is None else chains
    base = load_scenario(scenario)
    rows = []
    for i, seed in enumerate(replication_seeds(base.seed, replications)):
        for name, chain in chains.items():
            sc = load_scenario(scenario, overrides={"chain": chain})
            result = simulate(sc, seed=seed, record_requests=False)
            rows.append({"variant": name, "replication": i, "seed": seed,
                         **score_run(sc, result)})
            if keep is not None:
                keep[(name, i)] = result
            if progress is not None:
                progress(name, i)
    return pl.DataFrame(rows)


def compare_thresholds(scenario, chains: dict | None = None, replications: int = 3,
                       keep: dict | None = None) -> pl.DataFrame:
    """Per chain: each score's mean over replications and its 95 % half-width (``_ci``)."""
    return summarise_replications(threshold_runs(scenario, chains, replications, keep=keep),
                                  by="variant")
