"""Replications: the seeds of independent runs, and their summaries folded into intervals.

One seeded run is one draw; a number worth quoting is a mean over independent
replications with its Student t half-width. This module is the one place that
says how replication seeds are made and how per-replication summary tables
become one table of means and ``<name>_ci`` half-widths, so ``simulate``,
``compare``, sweeps and figures agree. It imports neither numba nor the kernel.

Seeds: replication ``i`` of a scenario with seed ``s`` runs with
``replication_seeds(s, n)[i]``, from ``numpy.random.SeedSequence(s).spawn(n)``;
a spawned child depends only on ``s`` and ``i``, so the first ``k`` seeds do
not change when ``n`` grows, and any replication can be rerun alone with
``relakit simulate --seed SEED``. With ``n == 1`` the scenario's own seed is
used unchanged, so a single run is the run it always was.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from relakit.stats import t_interval
from relakit.vocab import NOT_OK

__all__ = ["CI_SUFFIX", "ReplicatedResult", "format_table", "replication_seeds",
           "summarise_replications"]

CI_SUFFIX = "_ci"  # column of a number's 95 % half-width: `p99_ms` -> `p99_ms_ci`


def replication_seeds(seed: int, n: int) -> list[int]:
    """Seeds of replications ``0 .. n-1`` (see the module docstring): 63-bit integers."""
    n = int(n)
    if n < 1:
        raise ValueError(f"replications: must be an integer >= 1, got {n}")
    if n == 1:
        return [int(seed)]
    children = np.random.SeedSequence(int(seed)).spawn(n)
    return [int(c.generate_state(1, np.uint64)[0] >> np.uint64(1)) for c in children]


def summarise_replications(runs: pl.DataFrame, by: str | list[str] = "tier",
                           confidence: float = 0.95) -> pl.DataFrame:
    """Per group, every numeric column's mean over replications and its ``_ci`` half-width.

    ``runs`` has one row per replication and group (a ``replication`` column,
    optional ``seed``, the ``by`` keys, the numbers). The result keeps the ``by``
    keys, gives each number its mean under its own name and its Student t
    half-width as ``<name>_ci`` (``nan`` with one replication, or where a
    replication has no value, e.g. a quantile of a tier that served nothing),
    and ``replications``: how many rows the group had. Rows keep the first-seen
    order of the groups.
    """
    keys = [by] if isinstance(by, str) else list(by)
    skip = set(keys) | {"replication", "seed"}
    numbers = [c for c, t in runs.schema.items() if c not in skip and t.is_numeric()]
    out = []
    for group in runs.select(keys).unique(maintain_order=True).iter_rows(named=True):
        sel = runs
        for k, v in group.items():
            sel = sel.filter(pl.col(k) == v)
        row = dict(group)
        for c in numbers:
            x = sel[c].cast(pl.Float64).to_numpy()
            if x.size and np.all(np.isfinite(x)):
                iv = t_interval(x, confidence)
                row[c], row[c + CI_SUFFIX] = iv.mean, iv.half_width
            else:
                finite = x[np.isfinite(x)]
                row[c] = float(finite.mean()) if finite.size else float("nan")
                row[c + CI_SUFFIX] = float("nan")
        row["replications"] = sel.height
        out.append(row)
    return pl.DataFrame(out)


# ---- what simulate(..., replications=N) returns --------------------------------------------
#: the summary's columns on the console, as :meth:`SimulationResult.format_summary` has them
CONSOLE_COLUMNS = ("requests", "success_ratio", *NOT_OK, "mean_ms",
                   "p50_ms", "p99_ms", "p999_ms", "amplification")
#: decimals per column on the console; latency columns get the same decimals
_DECIMALS = {"requests": 0, "error": 0, "timeout": 0, "dropped": 0, "throttled": 0, "rejected": 0,
             "wrong": 0,
             "success_ratio": 4, "amplification": 3, "requests_rps": 1, "goodput_rps": 1,
             "batches": 0, "warmup_deleted_s": 1, "lag1": 2}


class ReplicatedResult:
    """N independent replications of one scenario, folded into means and intervals.

    * ``summary``: per tier, every summary number's mean over the replications
      under its own name, its 95 % Student t half-width as ``<name>_ci``, and
      ``replications`` (:func:`summarise_replications`);
    * ``runs``: the per-replication summaries, one row per replication and tier,
      with ``replication`` (0 .. N-1) and ``seed``: ``simulate(scenario,
      seed=seed)`` reruns that row alone;
    * ``seeds``: the replication seeds, in order;
    * ``series``: per replication and metrics sample, what clients saw (all tiers):
      ``time_s``, ``requests_rps``, ``<outcome>_rps``, ``success_ratio``
      (:meth:`relakit.sim.SimulationResult.fleet_series`), for bands over time;
    * ``timeline`` and ``decisions``: closed loop only, every replication's
      controller timeline and audit, with ``replication``; else None;
    * ``requests``: per-request records of every replication, only when asked
      (``record_requests=True``); else None, so N runs cost N summaries, not N runs;
    * ``info``: the scenario, the base seed, the seeds, wall time, and per
      replication its run facts (``runs``: the single run's ``info`` each).

    The long metrics table of each replication is not kept: rerun one
    replication alone (its seed) for that.
    """

    def __init__(self, summary: pl.DataFrame, runs: pl.DataFrame, seeds: list[int],
                 info: dict, series: pl.DataFrame | None = None,
                 timeline: pl.DataFrame | None = None, decisions: pl.DataFrame | None = None,
                 requests: pl.DataFrame | None = None):
        self.summary, self.runs, self.seeds, self.info = summary, runs, list(seeds), info
        self.series, self.timeline, self.decisions = series, timeline, decisions
        self.requests = requests

    def __repr__(self) -> str:
        return (f"ReplicatedResult(scenario={self.info.get('scenario')!r}, "
                f"replications={len(self.seeds)}, summary={self.summary.height} tiers)")

    @classmethod
    def from_parts(cls, parts: list[dict], sc, seed: int, seeds: list[int], wall_s: float,
                   workers=None, scheduler=None) -> ReplicatedResult:
        """Fold the workers' parts (:func:`relakit.experiment.replicate`), in order."""
        parts = sorted(parts, key=lambda p: p["replication"])

        def stacked(name):
            frames = [p[name] for p in parts if p.get(name) is not None]
            return pl.concat(frames, how="diagonal_relaxed") if frames else None

        runs = stacked("summary")
        summary = summarise_replications(runs, by="tier")
        per_run = [p["info"] for p in parts]
        info = {"scenario": sc.name, "source": sc.source, "seed": int(seed),
                "replications": len(seeds), "seeds": [int(s) for s in seeds],
                "duration_s": sc.duration_s, "warmup_s": sc.warmup_s,
                "confidence": 0.95, "ci": "replications (Student t over replication means)",
                "wall_s": round(wall_s, 4), "workers": workers, "scheduler": scheduler,
                "rerun": "relakit simulate SCENARIO --seed SEED reruns one replication "
                         "alone (SEED from `seeds`)",
                "means": _info_means(per_run), "runs": per_run,
                "versions": parts[0].get("versions") if parts else None}
        return cls(summary, runs, seeds, info, series=stacked("series"),
                   timeline=stacked("timeline"), decisions=stacked("decisions"),
                   requests=stacked("requests"))

    def format_summary(self) -> str:
        """The summary as a text table, each cell ``mean ± half-width`` (``70.9 ± 1.2``)."""
        head, note = self._head_note()
        return "\n".join([head, format_table(self.summary, ["tier", *CONSOLE_COLUMNS]), note])

    def _repr_html_(self) -> str:
        from relakit.display import html_view

        head, note = self._head_note()
        return html_view(f"ReplicatedResult: {self.info['scenario']}", [head],
                         [("per tier (latency in ms)",
                           table_rows(self.summary, ["tier", *CONSOLE_COLUMNS]))], [note])

    def _head_note(self) -> tuple[str, str]:
        i = self.info
        m = i.get("means", {})

        def head_number(key, fmt):
            if key not in m:
                return "-"
            mean, ci = m[key]
            return f"{mean:{fmt}} ± {ci:{fmt}}" if ci == ci else f"{mean:{fmt}}"

        head = (f"scenario {i['scenario']}  {i['replications']} replications (seeds spawned "
                f"from {i['seed']})  {i['duration_s']:g} s simulated each  "
                f"goodput {head_number('goodput_rps', '.1f')} rps  "
                f"utilisation {head_number('utilisation', '.3f')}")
        note = ("cells: mean ± 95 % half-width (Student t) over replications; rerun one "
                "with --seed (seeds in summary.json)")
        return head, note

    def write(self, out_dir) -> list[Path]:
        """summary.json (info and tiers with ``_ci``), runs.parquet, series.parquet and,
        when present, timeline.parquet, decisions.parquet and requests.parquet; each
        file written atomically."""
        from relakit.io import write_json, write_parquet

        out = Path(out_dir)
        written = [write_parquet(self.runs, out / "runs.parquet")]
        for name in ("series", "timeline", "decisions", "requests"):
            table = getattr(self, name)
            if table is not None:
                written.append(write_parquet(table, out / f"{name}.parquet"))
            else:  # an earlier run's table in the folder must not pass for this one's
                (out / f"{name}.parquet").unlink(missing_ok=True)
        written.append(write_json({"info": self.info, "tiers": self.summary.to_dicts()},
                                  out / "summary.json"))
        return written


def _info_means(per_run: list[dict]) -> dict:
    """{name: [mean, half-width]} of every number the single runs' ``info`` has."""
    out = {}
    for key in ("offered_rps", "goodput_rps", "utilisation", "arrived_rps", "in_flight_at_end",
                "attempts", "retries", "hedges", "hedges_won", "cancelled"):
        x = np.array([r.get(key, np.nan) for r in per_run], dtype=float)
        if x.size and np.all(np.isfinite(x)):
            iv = t_interval(x)
            out[key] = [iv.mean, iv.half_width]
    return out


def format_table(table: pl.DataFrame, columns) -> str:
    """A fixed-width text table; a number with a ``<name>_ci`` column prints as
    ``mean ± half-width`` (both with the column's decimals), without one as itself."""
    from relakit.display import text_rows

    return "\n".join(text_rows(table_rows(table, columns)))


def table_rows(table: pl.DataFrame, columns) -> list[list[str]]:
    """:func:`format_table`'s cells, the header first (a notebook's HTML view uses them)."""
    cols = [c for c in columns if c in table.columns]
    ms = [c for c in cols if c.endswith("_ms")]
    lat = np.concatenate([table[c].cast(pl.Float64).to_numpy() for c in ms]) if ms else \
        np.zeros(0)
    v = np.abs(lat[np.isfinite(lat) & (lat != 0)])
    ms_dec = int(np.clip(2 - np.floor(np.log10(v.min())), 0, 3)) if v.size else 1

    def cell(row, c):
        x = row[c]
        if isinstance(x, str) or x is None:
            return "-" if x is None else x
        d = ms_dec if c.endswith("_ms") else _DECIMALS.get(c, 3)
        if x != x:
            return "-"
        ci = row.get(c + CI_SUFFIX)
        text = f"{x:.{d}f}"
        if ci is not None and ci == ci:
            text += f" ± {ci:.{d}f}"
        return text

    return [cols] + [[cell(r, c) for c in cols] for r in table.iter_rows(named=True)]


# ---- ci: batch_means: intervals from one run's own series ----------------------------------
#: the numbers batch means give an interval for (the rest get a nan ``_ci``, see below)
BATCH_NUMBERS = ("requests_rps", "goodput_rps", "success_ratio", "mean_ms", "amplification")


def batch_means_summary(summary: pl.DataFrame, requests: pl.DataFrame, start_s: float,
                        end_s: float, batches: int, auto_warmup: bool,
                        confidence: float = 0.95) -> tuple[pl.DataFrame, dict]:
    """One run's summary with batch-means intervals (``ci: batch_means``).

    The series is the run's per-request records (completed requests, by arrival),
    from ``start_s`` (the scenario's warm-up) to ``end_s``. With ``auto_warmup``
    (``warmup_s: auto``: the kernel counted from 0) MSER-5
    (:func:`relakit.stats.mser5`) picks the cut on the response times of all ok
    requests in arrival order, and that time is cut from every tier and number.
    The rest is split into ``batches`` equal spans of time; per span and tier:
    ``requests_rps`` and ``goodput_rps`` (requests, ok requests per second),
    ``success_ratio``, ``mean_ms`` (of ok requests) and ``amplification`` (copies
    sent per request). Each of these numbers becomes the mean of its batch values
    with the Student t half-width over them (``batches - 1`` degrees of freedom),
    so a number and its interval describe the same window.

    The other numbers keep the kernel's values (over the scenario's counted
    window: from 0 with ``auto``) and get ``nan`` intervals: quantiles, because a
    mean of batch quantiles is a biased estimate of the run's quantile and the
    kernel's fine histogram is run-wide only; counts, because a total over one run
    has no steady-state mean (its rate, ``requests_rps``, has). Added per tier:
    ``batches``, ``warmup_deleted_s`` and ``lag1``, the largest lag-1
    autocorrelation of the row's batch values: well above 0.2 says the batches are
    too short for the run's correlation time and the interval under-covers.
    """
    from relakit.stats import mser5

    req = requests.filter((pl.col("arrival_s") >= start_s) & (pl.col("arrival_s") < end_s))
    cut_s = 0.0
    if auto_warmup:
        ok = req.filter(pl.col("outcome") == "ok").sort("arrival_s", maintain_order=True)
        if ok.height >= 10:
            cut = mser5(ok["latency_ms"].to_numpy())
            cut_s = float(ok["arrival_s"][cut] - start_s) if cut else 0.0
    t0 = start_s + cut_s
    span = (end_s - t0) / batches
    req = req.filter(pl.col("arrival_s") >= t0).with_columns(
        ((pl.col("arrival_s") - t0) / span).floor().cast(pl.Int32).clip(0, batches - 1)
        .alias("batch"))
    rows, detail = [], {}
    for row in summary.iter_rows(named=True):
        tier = row["tier"]
        sel = req if tier == "all" else req.filter(pl.col("tier") == tier)
        per = sel.group_by("batch").agg(
            pl.len().alias("n"), (pl.col("outcome") == "ok").sum().alias("ok"),
            pl.col("latency_ms").filter(pl.col("outcome") == "ok").sum().alias("lat"),
            pl.col("attempts").sum().alias("copies"))
        full = pl.DataFrame({"batch": np.arange(batches, dtype=np.int32)}).join(
            per, on="batch", how="left").fill_null(0).sort("batch")
        n = full["n"].to_numpy().astype(float)
        okc = full["ok"].to_numpy().astype(float)
        with np.errstate(invalid="ignore", divide="ignore"):
            values = {"requests_rps": n / span, "goodput_rps": okc / span,
                      "success_ratio": okc / n,
                      "mean_ms": full["lat"].to_numpy() / okc,
                      "amplification": full["copies"].to_numpy() / n}
        out = dict(row)
        for c in list(row):
            if c != "tier" and isinstance(row[c], int | float) and not isinstance(row[c], bool):
                out[c + CI_SUFFIX] = float("nan")
        lags = {}
        for c, x in values.items():
            if np.all(np.isfinite(x)):
                iv = t_interval(x, confidence)
                out[c], out[c + CI_SUFFIX] = iv.mean, iv.half_width
                dev = x - x.mean()
                denom = float(dev @ dev)
                lags[c] = float(dev[:-1] @ dev[1:] / denom) if denom > 0 else float("nan")
            else:  # a batch with no request (or no ok request) of this tier
                out[c], out[c + CI_SUFFIX] = float("nan"), float("nan")
        finite = [v for v in lags.values() if v == v]
        out.update(batches=batches, warmup_deleted_s=cut_s,
                   lag1=max(finite) if finite else float("nan"))
        rows.append(out)
        detail[tier] = lags
    info = {"method": "batch means over time spans of the run's per-request records",
            "batches": batches, "batch_s": span, "warmup": "MSER-5" if auto_warmup else
            "scenario warmup_s", "warmup_deleted_s": cut_s, "from_s": t0, "to_s": end_s,
            "lag1": detail, "confidence": confidence,
            "numbers": list(BATCH_NUMBERS)}
    return pl.DataFrame(rows), info
