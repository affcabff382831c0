"""Replications measured from whole runs: the numbers a summary table does not carry.

``relakit.simulate(sc, replications=N)`` keeps of each replication its summary
rows and a fleet series, and drops the run. Some questions need more of a run:
which nodes the containment chain isolated, the success of requests that
arrived after a fault, how many requests were routed to given nodes, when the
controller first entered a mode. :func:`measure_runs` runs replication ``i``
on the seed ``simulate(..., replications=N)`` gives it
(``replication_seeds(seed, N)[i]``), hands the whole result to a ``measure``
function, keeps only what that returns and drops the run, so N replications
cost N small rows, not N sets of per-request records.

Two variants of one scenario measured from the same base seed (the
scenario's, by default) run replication for replication on the same seeds:
common random numbers. :func:`paired` and :func:`paired_ratio` then give the
paired interval of their difference (:func:`relakit.stats.paired_difference`)
or of their per-pair relative difference ``b / a - 1``; both refuse pairs that
do not share their seeds.

The chain measures (:func:`chain_measure`: :func:`success_after`,
:func:`isolated_nodes`, :func:`requests_to`) are what notebook 05 asks of a
run, and :func:`step_measure` (:func:`tier_outcomes`, :func:`window_rates`,
:func:`ok_share_per_bin`, :func:`mode_entered_at`) what notebook 07 asks of a
load step, applied alike to the live record and to each simulated
replication; defined once here so a test pins them. :func:`tier_latencies` (with
:func:`tier_outcomes`, one aggregation: :func:`tier_table`) and
:func:`twin_measure` are what a live run with an in-path mechanism and its simulated
twin are compared on (tests/test_lab_in_path.py, notebook 07).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import polars as pl

from relakit.replications import replication_seeds, summarise_replications
from relakit.stats import Interval, PairedDifference, paired_difference, t_interval

__all__ = ["MeasuredRuns", "chain_measure", "isolated_nodes", "measure_runs", "mode_entered_at",
           "ok_share_per_bin", "paired", "paired_ratio", "pm", "requests_to", "step_measure",
           "success_after", "tier_latencies", "tier_outcomes", "tier_table", "twin_measure",
           "window_rates"]


def pm(iv: Interval, fmt: str = ".3f") -> str:
    """``mean ± half-width`` of an interval, both in ``fmt`` (just the mean when the
    half-width is unknown, i.e. one replication)."""
    if iv.half_width == iv.half_width:
        return f"{iv.mean:{fmt}} ± {iv.half_width:{fmt}}"
    return f"{iv.mean:{fmt}}"


@dataclass
class MeasuredRuns:
    """What :func:`measure_runs` kept.

    * ``runs``: one row per replication: ``replication``, ``seed`` and every
      scalar (or list) the measure returned;
    * ``tables``: each table the measure returned, stacked over replications
      with a ``replication`` column first (e.g. a series over time, for a band);
    * ``first``: replication 0's whole result when asked (``keep_first``), for a
      figure of one run beside the intervals; else None.
    """

    runs: pl.DataFrame
    tables: dict[str, pl.DataFrame] = field(default_factory=dict)
    first: object = None

    @property
    def seeds(self) -> list[int]:
        return self.runs["seed"].to_list()

    def values(self, name: str) -> list:
        """The measure ``name`` of every replication, in replication order."""
        if name not in self.runs.columns:
            raise KeyError(f"no measure {name!r}; measured: "
                           f"{[c for c in self.runs.columns if c not in ('replication', 'seed')]}")
        return self.runs[name].to_list()

    def interval(self, name: str, confidence: float = 0.95) -> Interval:
        """Mean of a numeric measure over the replications and its Student t interval."""
        return t_interval(np.asarray(self.values(name), dtype=float), confidence)

    def summary(self) -> pl.DataFrame:
        """Every numeric measure's mean and ``_ci`` half-width, one row
        (:func:`relakit.replications.summarise_replications`)."""
        return summarise_replications(self.runs.with_columns(pl.lit("all").alias("runs")),
                                      by="runs").drop("runs")


def measure_runs(scenario, measure, replications: int = 3, overrides: dict | None = None,
                 seed: int | None = None, record_requests: bool = True,
                 keep_first: bool = False) -> MeasuredRuns:
    """Run ``scenario`` (a path, dict or Scenario; ``overrides`` as
    :func:`relakit.load_scenario` takes them) ``replications`` times and keep
    ``measure(result)`` of each run.

    ``measure`` returns a dict: ``polars.DataFrame`` values go to ``tables``,
    the rest to one row of ``runs``. Seeds: ``replication_seeds(seed, n)``, with
    ``seed`` the scenario's unless given, as ``simulate(..., replications=n)``
    would run them; so two variants measured with the same ``seed`` are paired
    on common random numbers. Runs one after another in this process (the
    measure need not be picklable).
    """
    from relakit.experiment import simulate
    from relakit.scenario import load_scenario

    n = int(replications)
    if n < 1 or n != replications:
        raise ValueError(f"replications: must be an integer >= 1, got {replications!r}")
    sc = load_scenario(scenario, overrides=overrides)
    base = sc.seed if seed is None else int(seed)
    rows, tables, first = [], {}, None
    for i, s in enumerate(replication_seeds(base, n)):
        result = simulate(sc, seed=s, record_requests=record_requests)
        measured = measure(result)
        row = {"replication": i, "seed": s}
        for k, v in measured.items():
            if isinstance(v, pl.DataFrame):
                tables.setdefault(k, []).append(
                    v.select(pl.lit(i, pl.Int32).alias("replication"), *v.columns))
            else:
                row[k] = v
        rows.append(row)
        if keep_first and i == 0:
            first = result
    return MeasuredRuns(pl.DataFrame(rows), {k: pl.concat(v, how="diagonal_relaxed")
                                             for k, v in tables.items()}, first)


def _pairs(a: MeasuredRuns, b: MeasuredRuns, name: str) -> tuple[np.ndarray, np.ndarray]:
    if a.seeds != b.seeds:
        raise ValueError(f"{name}: the two variants ran on different seeds, so they do not "
                         "pair; measure both from the same base seed")
    return np.asarray(a.values(name), dtype=float), np.asarray(b.values(name), dtype=float)


def paired(a: MeasuredRuns, b: MeasuredRuns, name: str,
           confidence: float = 0.95) -> PairedDifference:
    """Paired interval of ``b - a`` for the measure ``name``, pair by replication."""
    xa, xb = _pairs(a, b, name)
    return paired_difference(xb, xa, confidence)


def paired_ratio(a: MeasuredRuns, b: MeasuredRuns, name: str,
                 confidence: float = 0.95) -> Interval:
    """Interval of the per-pair relative difference ``b / a - 1`` of the measure ``name``
    ("B sends 8 % more than A"): a t interval over the replications' ratios, each
    ratio taken within one pair of common random numbers."""
    xa, xb = _pairs(a, b, name)
    if np.any(xa == 0):
        raise ValueError(f"{name}: a replication of A measured 0, so b / a is undefined")
    return t_interval(xb / xa - 1.0, confidence)


# ---- what notebook 05 asks of a chain's run ---------------------------------------------------
def success_after(result, start_s: float) -> float:
    """Share of the requests arriving at or after ``start_s`` answered ok (needs
    per-request records; nan if none arrived)."""
    if result.requests is None:
        raise ValueError("success_after needs per-request records (record_requests=True)")
    share = result.requests.filter(pl.col("arrival_s") >= start_s)["outcome"].eq("ok").mean()
    return float("nan") if share is None else float(share)  # nan: no request arrived then


def isolated_nodes(result) -> list[str]:
    """The nodes the chain isolated at least once in the run, sorted (``node 3``)."""
    return sorted(set(result.decisions.filter(pl.col("action") == "isolate")["target"]))


def requests_to(result, nodes, start_s: float = 0.0) -> int:
    """Requests arriving at or after ``start_s`` that were routed to one of ``nodes``."""
    if result.requests is None:
        raise ValueError("requests_to needs per-request records (record_requests=True)")
    return int(result.requests.filter(pl.col("node").is_in(list(nodes))
                                      & (pl.col("arrival_s") >= start_s)).height)


def _per_bin(requests: pl.DataFrame, bin_s: float, until_s: float) -> pl.DataFrame:
    """Requests per ``bin_s`` bin from 0 to ``until_s`` (``time_s``: bin start, ``n``),
    bins with none counted 0, so a mean over replications sees every bin."""
    bins = pl.DataFrame({"time_s": np.arange(0.0, until_s, bin_s)})
    counts = (requests.with_columns((pl.col("arrival_s") // bin_s * bin_s).alias("time_s"))
              .group_by("time_s").len("n"))
    return bins.join(counts, on="time_s", how="left").with_columns(pl.col("n").fill_null(0))


def chain_measure(start_s: float, failing=(), bin_s: float | None = None):
    """The measure notebook 05 takes of a containment chain's run (for
    :func:`measure_runs`; needs per-request records).

    Scalars: ``order`` (the chain's stages, ``sentinel → ...``), ``isolated``
    (:func:`isolated_nodes`), ``success_after`` (from
    ``start_s``), ``min_working_nodes`` (the chain's fewest working nodes),
    ``errors`` (requests answered with an error, whole run), ``wrong_share``
    (share of requests arriving from ``start_s`` answered wrongly with success
    status); with ``failing`` nodes: ``sent_to_failing`` (:func:`requests_to`
    from ``start_s``) and ``node {k} reweighted at (s)``, the first time Atlas
    reweighted each (nan if never). Tables: ``working`` (``time_s``,
    ``working``: working nodes after each evaluation); with ``bin_s``:
    ``sent_rps`` (requests per second routed to the failing nodes per bin) and
    ``errors_so_far`` (cumulative errors at each bin's end).
    """
    failing = [int(k) for k in failing]

    def measure(result) -> dict:
        req = result.requests
        if req is None:
            raise ValueError("chain_measure needs per-request records (record_requests=True)")
        chain = result.info["chain"]
        after = req.filter(pl.col("arrival_s") >= start_s)
        out = {"order": " → ".join(chain["order"]), "isolated": isolated_nodes(result),
               "success_after": success_after(result, start_s),
               "min_working_nodes": chain["min_working_nodes"],
               "errors": int(req.filter(pl.col("outcome") == "error").height),
               "wrong_share": float(1.0 - after["correct"].mean()),
               "working": pl.DataFrame(chain["working_nodes"], schema=["time_s", "working"],
                                       orient="row")}
        if failing:
            out["sent_to_failing"] = requests_to(result, failing, start_s)
            rw = result.decisions.filter(pl.col("action") == "reweight")
            for k in failing:
                t = rw.filter(pl.col("target") == f"node {k}")["decided_at_s"].min()
                out[f"node {k} reweighted at (s)"] = float("nan") if t is None else float(t)
        if bin_s:
            until = float(result.info.get("duration_s", req["arrival_s"].max()))
            sent = _per_bin(req.filter(pl.col("node").is_in(failing)), bin_s, until)
            out["sent_rps"] = sent.select("time_s", (pl.col("n") / bin_s).alias("rps"))
            err = _per_bin(req.filter(pl.col("outcome") == "error"), bin_s, until)
            out["errors_so_far"] = err.select("time_s", pl.col("n").cum_sum().alias("errors"))
        return out

    return measure


# ---- what notebook 07 asks of a run, live or simulated -----------------------------------------
def _since(requests: pl.DataFrame, time_col: str, origin: float) -> pl.DataFrame:
    return requests.with_columns((pl.col(time_col) - origin).alias("t"))


def tier_table(requests: pl.DataFrame, with_all: bool = True) -> pl.DataFrame:
    """Per tier (every tier of relakit.vocab.TIERS, in its order, then ``all`` unless
    ``with_all`` is False), one row: ``requests``, the share of each outcome
    (relakit.vocab.OUTCOMES) and, when the requests have ``latency_ms``, ``p50_ms`` and
    ``p99_ms`` of the ok requests' latency (linear quantiles). A tier with no request
    has ``requests`` 0 and NaN for every share and quantile, as a quantile with no ok
    request is NaN: a share of 0 would read as "none answered ok", and a missing row
    would give replications different measures. One polars aggregation, shared by
    :func:`tier_outcomes` and :func:`tier_latencies`."""
    from relakit.vocab import OUTCOMES, TIERS

    numbers = [(pl.col("outcome") == o).mean().alias(o) for o in OUTCOMES]
    if "latency_ms" in requests.columns:
        ok = pl.col("latency_ms").filter(pl.col("outcome") == "ok")
        numbers += [ok.quantile(0.5, "linear").alias("p50_ms"),
                    ok.quantile(0.99, "linear").alias("p99_ms")]
    per = requests.group_by("tier").agg(pl.len().alias("requests"), *numbers)
    if with_all:
        per = pl.concat([per, requests.select(pl.lit("all").alias("tier"),
                                              pl.len().alias("requests"), *numbers)])
    names = [*TIERS, "all"] if with_all else list(TIERS)
    out = (pl.DataFrame({"tier": names, "_order": range(len(names))})
           .join(per.with_columns(pl.col("tier").cast(pl.String)), on="tier", how="left")
           .sort("_order").drop("_order"))
    return out.with_columns(pl.col("requests").fill_null(0).cast(pl.Int64),
                            pl.exclude("tier", "requests").cast(pl.Float64).fill_null(np.nan))


def tier_outcomes(requests: pl.DataFrame, start_s: float, end_s: float,
                  time_col: str = "arrival_s", origin: float = 0.0) -> pl.DataFrame:
    """Per tier (every tier, in relakit.vocab's order), of the requests starting in
    ``[start_s, end_s]`` (seconds after ``origin``; ``time_col`` is ``arrival_s`` in a
    simulation, ``start_s`` in the lab's record): the share answered ``ok`` and the
    share ``dropped``; NaN for a tier with none (:func:`tier_table`)."""
    w = _since(requests, time_col, origin).filter(pl.col("t").is_between(start_s, end_s))
    return tier_table(w, with_all=False).select("tier", "ok", "dropped")


def window_rates(requests: pl.DataFrame, start_s: float, end_s: float,
                 time_col: str = "arrival_s", origin: float = 0.0) -> dict:
    """Of the requests starting in ``[start_s, end_s)``: ``requests_per_s`` and the
    shares answered ``ok`` and timed out (``timeout``)."""
    w = _since(requests, time_col, origin).filter(
        pl.col("t").is_between(start_s, end_s, closed="left"))
    return {"requests_per_s": w.height / (end_s - start_s),
            "ok": float((w["outcome"] == "ok").mean()),
            "timeout": float((w["outcome"] == "timeout").mean())}


def ok_share_per_bin(requests: pl.DataFrame, bin_s: float = 1.0, time_col: str = "arrival_s",
                     origin: float = 0.0) -> pl.DataFrame:
    """Share of requests answered ok per ``bin_s`` bin of their start (``t``: bin start)."""
    return (_since(requests, time_col, origin).with_columns(pl.col("t") // bin_s * bin_s)
            .group_by("t").agg((pl.col("outcome") == "ok").mean().alias("ok_share")).sort("t"))


def mode_entered_at(decisions: pl.DataFrame, mode: str, origin: float = 0.0) -> float:
    """When the controller first entered ``mode`` (decision time minus ``origin``;
    nan if it never did)."""
    from relakit.control.audit import NO_CHANGE

    d = decisions.filter(~pl.col("action").is_in(NO_CHANGE) & (pl.col("mode") == mode))
    return float(d["decided_at_s"].min() - origin) if d.height else float("nan")


def step_measure(step_s: float, survival_window=(5.0, 15.0), gap_s: float = 3.0,
                 bin_s: float = 1.0):
    """The measure notebook 07 takes of a simulated load step at ``step_s`` (for
    :func:`measure_runs`; the live record gets the same functions): ``survival_after_step_s``
    (:func:`mode_entered_at` minus ``step_s``), per tier ``<tier>_ok`` and
    ``<tier>_dropped`` from ``step_s + survival_window`` (:func:`tier_outcomes`),
    ``gap_requests_per_s``, ``gap_ok``, ``gap_timeout`` over the ``gap_s`` after the
    step (:func:`window_rates`), and the table ``ok_share`` (:func:`ok_share_per_bin`)."""

    def measure(result) -> dict:
        req = result.requests
        if req is None:
            raise ValueError("step_measure needs per-request records (record_requests=True)")
        out = {"survival_after_step_s": mode_entered_at(result.decisions, "survival") - step_s}
        tiers = tier_outcomes(req, step_s + survival_window[0], step_s + survival_window[1])
        for row in tiers.iter_rows(named=True):
            out[f"{row['tier']}_ok"], out[f"{row['tier']}_dropped"] = row["ok"], row["dropped"]
        gap = window_rates(req, step_s, step_s + gap_s)
        out.update({f"gap_{k}": v for k, v in gap.items()})
        out["ok_share"] = ok_share_per_bin(req, bin_s)
        return out

    return measure


def tier_latencies(requests: pl.DataFrame, start_s: float = 0.0, time_col: str = "arrival_s",
                   origin: float = 0.0) -> dict:
    """Per tier and ``all``, of the requests starting at ``start_s`` or later (seconds after
    ``origin``; ``time_col`` as :func:`tier_outcomes`): ``requests``, the share of each
    outcome (relakit.vocab.OUTCOMES: ``ok``, ``rejected``, ...), and ``p50_ms``, ``p99_ms``
    of the ok requests' latency (linear quantiles) — :func:`tier_table`'s rows as
    ``{tier: {number: value}}``; a tier with no request has NaN shares, not 0."""
    w = _since(requests, time_col, origin).filter(pl.col("t") >= start_s)
    return {row.pop("tier"): row for row in tier_table(w).iter_rows(named=True)}


def twin_measure(start_s: float):
    """The measure a live run's simulated twin takes (for :func:`measure_runs`; the live
    record gets :func:`tier_latencies` itself): ``<tier>_<number>`` for every number
    :func:`tier_latencies` gives, from ``start_s`` (the warm-up's end) on."""

    def measure(result) -> dict:
        if result.requests is None:
            raise ValueError("twin_measure needs per-request records (record_requests=True)")
        return {f"{tier}_{k}": v for tier, row in
                tier_latencies(result.requests, start_s).items() for k, v in row.items()}

    return measure
