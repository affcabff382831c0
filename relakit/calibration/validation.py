"""Is the twin good enough to trust? It is run against the recording on what a policy reads.

The signals are RelA's: the request rate, the error ratio (errors and timeouts
over answered requests) and the p99 latency, each fleet-wide over one
evaluation window, computed by the control plane's own signal code
(:mod:`relakit.control.signals`, Prometheus semantics) over the recording and
over each twin replication alike. Windows do not overlap (one evaluation per
window), so their errors are close to independent.

Per window the relative error is ``|twin - recorded| / max(|recorded|, floor)``;
the floors (1 req/s, one percentage point of error ratio, 1 ms) keep a near-zero
recorded value from turning a negligible difference into a huge ratio. Per
signal the table gives the median and the 90th percentile of that error over
the windows, as the mean over replications with a 95 % Student t half-width
(:func:`relakit.replications.summarise_replications`, replication seeds from
:func:`relakit.replications.replication_seeds`).

The verdict: trusted when every signal's median relative error AND its 90th
percentile, each at the upper end of its replication interval, are within their
tolerances (:data:`TOLERANCE` for the median: 10 % on the rate, 25 % on the
error ratio, 30 % on p99 — a p99 over one short window is itself noisy, and a
policy's thresholds are coarser than that; :data:`TOLERANCE_P90`, twice those,
for the 90th percentile: 20 %, 50 %, 60 %). The median alone is not enough: an
incident is a few windows of a recording, and a twin can match the quiet
majority while its load in the incident's windows is wrong by a factor (issue
14), which is exactly where a policy acts. Otherwise the verdict lists each
signal and statistic that misses and the calibration's cautions (a load above
the fitted capacity, nodes whose service differs from the fleet's, flags not
replayed, ...), which are the usual reasons.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import polars as pl

from relakit.control.signals import parse_signal
from relakit.control.tsdb import TSDB
from relakit.replications import replication_seeds, summarise_replications
from relakit.validate import Reader
from relakit.vocab import ANSWERED, FAILED, SERVED

SIGNALS = {
    "request_rate_rps": {"kind": "rate", "metric": "requests_total"},
    "error_ratio": {"kind": "ratio",
                    "num": {"metric": "requests_total", "outcome": list(FAILED)},
                    "den": {"metric": "requests_total", "outcome": list(ANSWERED)}},
    "p99_ms": {"kind": "histogram_quantile", "metric": "latency_seconds", "q": 0.99,
               "scale": 1000},
}
UNITS = {"request_rate_rps": "requests/s", "error_ratio": "share of answered requests",
         "p99_ms": "ms"}
TOLERANCE = {"request_rate_rps": 0.10, "error_ratio": 0.25, "p99_ms": 0.30}
TOLERANCE_P90 = {k: 2.0 * v for k, v in TOLERANCE.items()}  # the tail windows
FLOOR = {"request_rate_rps": 1.0, "error_ratio": 0.01, "p99_ms": 1.0}


@dataclass
class Validation:
    table: pl.DataFrame      # per signal: median/p90 relative error, _ci, tolerances, within
    overlay: pl.DataFrame    # time_s, signal, recorded, twin, twin_lo, twin_hi
    window_s: float
    replications: int
    trusted: bool
    reasons: list[str] = field(default_factory=list)
    cautions: list[str] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        if self.trusted:
            head = (f"twin trusted: every signal within tolerance over {self.replications} "
                    f"replication(s), {self.window_s:g} s windows")
            return head + ("" if not self.cautions else "; cautions: " + "; ".join(
                self.cautions))
        return "twin NOT good enough to trust: " + "; ".join(self.reasons + self.cautions)

    def format_table(self) -> str:
        widths = [max(len(r[i]) for r in self.rows()) for i in range(len(self.rows()[0]))]
        return "\n".join("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True))
                         for r in self.rows())

    def rows(self) -> list[list[str]]:
        """Per signal, the twin's errors against the recording (cells, the header first)."""
        rows = [["signal", "median rel. error", "p90 rel. error", "tolerance (median, p90)",
                 "within"]]
        for r in self.table.iter_rows(named=True):
            rows.append([r["signal"], _pm(r["median_rel_error"], r["median_rel_error_ci"]),
                         _pm(r["p90_rel_error"], r["p90_rel_error_ci"]),
                         f"{r['tolerance']:.0%}, {r['p90_tolerance']:.0%}",
                         "yes" if r["within"] else "NO"])
        return rows


def _pm(x: float, ci: float) -> str:
    return f"{x:.1%}" + ("" if not np.isfinite(ci) else f" ± {ci:.1%}")


def signals():
    return {k: parse_signal(Reader(v, "<calibrate>", f"signals.{k}"), k)
            for k, v in SIGNALS.items()}


def evaluate(frame: pl.DataFrame, times: np.ndarray, window_s: float) -> dict:
    """The signals at ``times``. A recording with no error or timeout series at all had
    none (a client library creates a labelled series at its first increment), so its
    error ratio is 0 wherever requests were counted, not "no data"."""
    nodes = frame.filter(pl.col("node") >= 0)
    tsdb = TSDB.from_long(nodes)
    out = {k: s.evaluate(tsdb, times, window_s) for k, s in signals().items()}
    failed = nodes.filter((pl.col("name") == "requests_total")
                          & pl.col("outcome").is_in(list(FAILED)))
    if failed.height == 0:
        out["error_ratio"] = np.where(np.isfinite(out["request_rate_rps"]), 0.0, np.nan)
    return out


def relative_errors(twin: np.ndarray, rec: np.ndarray, floor: float) -> np.ndarray:
    ok = np.isfinite(twin) & np.isfinite(rec)
    return np.abs(twin[ok] - rec[ok]) / np.maximum(np.abs(rec[ok]), floor)


def validate(recorded: pl.DataFrame, run, seed: int, duration_s: float, window_s: float,
             replications: int = 3, cautions: list[str] | None = None) -> Validation:
    """``recorded``: the recording's long table in twin time and twin node numbers;
    ``run(seed)``: the twin's long table for one replication."""
    times = np.arange(window_s, duration_s + 1e-9, window_s)
    if times.size < 2:
        raise ValueError(f"the recording spans {duration_s:g} s: fewer than two {window_s:g} s "
                         "validation windows; give a shorter --window")
    rec = evaluate(recorded, times, window_s)
    runs, twins = [], {k: [] for k in SIGNALS}
    for i, s in enumerate(replication_seeds(seed, replications)):
        twin = evaluate(run(s), times, window_s)
        for k in SIGNALS:
            twins[k].append(twin[k])
            err = relative_errors(twin[k], rec[k], FLOOR[k])
            runs.append({"replication": i, "seed": s, "signal": k,
                         "median_rel_error": float(np.median(err)) if err.size else np.nan,
                         "p90_rel_error": float(np.quantile(err, 0.9)) if err.size else np.nan,
                         "windows": float(err.size)})
    table = summarise_replications(pl.DataFrame(runs), by="signal")
    table = table.with_columns(
        tolerance=pl.col("signal").replace_strict(TOLERANCE, return_dtype=pl.Float64),
        p90_tolerance=pl.col("signal").replace_strict(TOLERANCE_P90, return_dtype=pl.Float64),
    ).with_columns(
        median_within=(pl.col("median_rel_error") + pl.col("median_rel_error_ci").fill_nan(0.0))
        <= pl.col("tolerance"),
        p90_within=(pl.col("p90_rel_error") + pl.col("p90_rel_error_ci").fill_nan(0.0))
        <= pl.col("p90_tolerance"),
    ).with_columns(within=pl.col("median_within") & pl.col("p90_within"))
    parts = []
    for k in SIGNALS:
        stack = np.vstack(twins[k])
        with np.errstate(all="ignore"):
            parts.append(pl.DataFrame({
                "time_s": times, "signal": [k] * times.size, "recorded": rec[k],
                "twin": _nan_reduce(np.nanmean, stack), "twin_lo": _nan_reduce(np.nanmin, stack),
                "twin_hi": _nan_reduce(np.nanmax, stack)}).fill_nan(None))
    overlay = pl.concat(parts)
    reasons = []
    for r in table.iter_rows(named=True):
        for stat, words, tol in (("median", "median", "tolerance"),
                                 ("p90", "90th-percentile", "p90_tolerance")):
            if not r[f"{stat}_within"]:
                reasons.append(f"{r['signal']}: {words} relative error "
                               f"{_pm(r[f'{stat}_rel_error'], r[f'{stat}_rel_error_ci'])} over "
                               f"the {window_s:g} s windows, not within its {r[tol]:.0%} "
                               "tolerance")
    return Validation(table, overlay, window_s, replications, not reasons, reasons,
                      list(cautions or []))


def _nan_reduce(fn, stack: np.ndarray) -> np.ndarray:
    out = np.full(stack.shape[1], np.nan)
    ok = np.isfinite(stack).any(axis=0)
    out[ok] = fn(stack[:, ok], axis=0)
    return out


def tier_quantiles(frame: pl.DataFrame, windows, qs=(0.5, 0.99)) -> pl.DataFrame:
    """Per window ``(start_s, end_s)`` and tier, latency quantiles (ms) as Prometheus'
    ``histogram_quantile`` reads the nodes' ``latency_seconds_bucket{tier}`` (their
    increase over the window, summed over the nodes): a recording's per-phase, per-tier
    view (the live lab's histogram carries the tier). Times are the frame's own."""
    from relakit.control.tsdb import bucket_quantile

    b = frame.filter((pl.col("name") == "latency_seconds_bucket") & (pl.col("node") >= 0)
                     & pl.col("tier").is_not_null())
    bounds = np.unique(b["le"].cast(pl.Float64).to_numpy())
    rows = []
    for w, (t0, t1) in enumerate(windows):
        for tier in sorted(set(b["tier"].to_list())):
            cum = np.zeros(bounds.size)
            for (_node, le), s in b.filter(pl.col("tier") == tier).group_by(["node", "le"]):
                s = s.sort("time_s")
                v = np.interp([t0, t1], s["time_s"].to_numpy(), s["value"].to_numpy())
                cum[np.searchsorted(bounds, float(le))] += max(v[1] - v[0], 0.0)
            rows += [{"window": w, "tier": tier, "q": q, "requests": float(cum[-1]),
                      "latency_ms": 1000 * float(bucket_quantile(q, bounds, cum[None, :])[0])}
                     for q in qs]
    return pl.DataFrame(rows)


def record_quantiles(requests: pl.DataFrame, windows, bounds_s, qs=(0.5, 0.99)) -> pl.DataFrame:
    """:func:`tier_quantiles` for a simulation's request records (``arrival_s``,
    ``latency_ms``, ``tier``; answered requests, ``ok`` or ``error``, as the servers'
    histogram counts them): each latency put in the same buckets and read the same way,
    and in the window where it *ended* (``arrival_s`` + ``latency_ms``), as a server
    observes its histogram at completion, so that a twin and its recording are compared
    like with like (by arrival, an overload's longest waits fell in the window before
    the one the live histogram counts them in)."""
    from relakit.control.tsdb import bucket_quantile

    bounds = np.asarray(bounds_s, dtype=float)
    bounds = np.append(bounds[np.isfinite(bounds)], np.inf)  # (+Inf: every request)
    answered = requests.filter(pl.col("outcome").is_in(SERVED)).with_columns(
        end_s=pl.col("arrival_s") + pl.col("latency_ms") / 1000.0)
    rows = []
    for w, (t0, t1) in enumerate(windows):
        inside = answered.filter(pl.col("end_s").is_between(t0, t1, closed="left"))
        for tier in sorted(set(inside["tier"].to_list())):
            lat = inside.filter(pl.col("tier") == tier)["latency_ms"].to_numpy() / 1000.0
            cum = np.searchsorted(np.sort(lat), bounds, side="right").astype(float)
            rows += [{"window": w, "tier": tier, "q": q, "requests": float(lat.size),
                      "latency_ms": 1000 * float(bucket_quantile(q, bounds, cum[None, :])[0])}
                     for q in qs]
    return pl.DataFrame(rows)
