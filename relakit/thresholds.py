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

import numpy as np
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


def scores_frame(table: pl.DataFrame, faults: dict[int, str]) -> pl.DataFrame:
    """The compared table in long form for :func:`threshold_figure`: one row per variant
    and score (``measure``, ``value``, ``low``, ``high``: the 95 % interval, clipped to
    what the score can be; a missed fault has a null value and ``missed`` = its share
    of runs that missed it)."""
    rows = []

    def add(r, measure, col, missed=0.0, hi=np.inf):
        v, ci = r[col], r[col + "_ci"]
        ok = v == v
        ci = ci if ci == ci else 0.0
        rows.append({"variant": r["variant"], "measure": measure,
                     "value": v if ok else None,
                     "low": max(0.0, v - ci) if ok else None,  # counts, delays, shares >= 0
                     "high": min(hi, v + ci) if ok else None,
                     "missed": missed})

    for r in table.iter_rows(named=True):
        add(r, "false isolations (per run)", "false_isolations")
        for k, name in faults.items():
            add(r, f"detection delay, {name} (s)", f"fault{k}_delay_s",
                1.0 - r[f"fault{k}_detected"])
        add(r, "gold success (share ok)", "gold_success", hi=1.0)
    return pl.DataFrame(rows, schema={"variant": pl.String, "measure": pl.String,
                                      "value": pl.Float64, "low": pl.Float64,
                                      "high": pl.Float64, "missed": pl.Float64})


def threshold_figure(table: pl.DataFrame, faults: dict[int, str], title: str):
    """One panel per score: each variant's mean as a point with its 95 % interval as a bar;
    a fault a variant missed in every run is written "missed" instead of a point."""
    import altair as alt

    from relakit.plots import CATEGORY

    frame = scores_frame(table, faults)
    variants = list(dict.fromkeys(frame["variant"].to_list()))
    color = alt.Color("variant:N", title="thresholds", sort=variants,
                      scale=alt.Scale(domain=variants,
                                      range=[CATEGORY[i] for i in (0, 1, 2, 5, 6, 3, 4)]
                                      [:len(variants)]))
    panels = []
    for measure in dict.fromkeys(frame["measure"].to_list()):
        part = frame.filter(pl.col("measure") == measure)
        y = alt.Y("variant:N", title=None, sort=variants)
        # shares are read near 1; counts and delays from 0
        x = alt.X("value:Q", title=measure, scale=alt.Scale(zero="share" not in measure))
        bars = alt.Chart(part).mark_rule(strokeWidth=2).encode(
            y=y, x=alt.X("low:Q", title=measure), x2="high:Q", color=color)
        points = alt.Chart(part).mark_point(filled=True, size=80).encode(
            y=y, x=x, color=color, tooltip=["variant:N", alt.Tooltip("value:Q", format=".3g"),
                                            alt.Tooltip("low:Q", format=".3g"),
                                            alt.Tooltip("high:Q", format=".3g")])
        missed = alt.Chart(part.filter(pl.col("value").is_null())).mark_text(
            align="left", color="#555555", fontSize=11).encode(
            y=y, x=alt.value(4), text=alt.value("missed in every run"))
        panels.append(alt.layer(bars, points, missed).properties(width=230, height=120))
    return alt.concat(*panels, columns=2, title=alt.Title(
        title, subtitle="mean over replications on common seeds, with 95 % intervals"))
