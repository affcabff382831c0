"""Kernel arrays → polars tables: ``requests``, ``metrics``, ``summary``.

All conversions are vectorised (numpy index tricks, no loop over requests or
samples). Latency quantiles in the summary come from the kernel's
log-spaced histogram (200 bins a decade, so within ±0.6 %), which exists
whether or not per-request records were kept: the summary does not change
when records are switched off.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl

from relakit.io import write_json, write_parquet
from relakit.sim import kernel as K

QUANTILES = {"p50_ms": 0.5, "p99_ms": 0.99, "p999_ms": 0.999}


def hist_quantile(counts: np.ndarray, q: float) -> float:
    """Quantile of a kernel latency histogram (ms), log-interpolated in its bin."""
    total = counts.sum()
    if total == 0:
        return float("nan")
    cum = np.cumsum(counts)
    target = q * total
    b = int(np.searchsorted(cum, target, side="left"))
    below = cum[b - 1] if b > 0 else 0
    frac = (target - below) / counts[b]
    return float(10 ** (K.HIST_LOG10_MIN + (b + frac) / K.HIST_BINS_PER_DECADE))


def versions() -> dict:
    import numba
    import numpy
    import polars

    from relakit import __version__

    return {"relakit": __version__, "numba": numba.__version__, "numpy": numpy.__version__,
            "polars": polars.__version__, "python": platform.python_version()}


@dataclass
class SimulationResult:
    """What one run produced: three tables and a small dict of run facts."""

    requests: pl.DataFrame | None
    metrics: pl.DataFrame
    summary: pl.DataFrame
    info: dict = field(default_factory=dict)
    decisions: pl.DataFrame | None = None  # the control plane's audit log, closed loop only
    timeline: pl.DataFrame | None = None  # per evaluation: time_s, mode, signal values

    @classmethod
    def from_fleet(cls, fleet) -> SimulationResult:
        out, st, sc = fleet.out, fleet.st, fleet.scenario
        n_rec = int(st.is_[K.IS_NREC])
        requests = None
        if fleet.cfg.cfg_i[K.CI_RECORD]:
            requests = requests_table(out.rec_f[:n_rec], out.rec_i[:n_rec])
        metrics = metrics_table(out, st, sc.metrics.latency_buckets_s)
        summary = summary_table(out.tier_cnt, out.tier_ext, out.hist, out.lat_sum)
        span = max(fleet.now - sc.warmup_s, 1e-12)
        busy_s = st.node_f[:, K.NF_BUSY_AREA] + st.node_i[:, K.NI_BUSY] * (
            fleet.now - st.node_f[:, K.NF_LAST_T])
        servers = np.asarray(sc.fleet.servers, dtype=float)
        counted = int(out.tier_cnt.sum())
        fc = st.fleet_c
        info = {
            "scenario": sc.name, "source": sc.source, "seed": fleet.seed,
            "duration_s": fleet.now, "warmup_s": sc.warmup_s, "nodes": sc.fleet.nodes,
            "user_requests": fleet.n_arrived, "counted_requests": counted,
            "offered_rps": counted / span,
            "goodput_rps": int(out.tier_cnt[:, K.OK].sum()) / span,
            "utilisation": float(busy_s.sum() / (servers.sum() * max(fleet.now, 1e-12))),
            "utilisation_by_node": (busy_s / (servers * max(fleet.now, 1e-12))).round(4).tolist(),
            "in_flight_at_end": fleet.users_in_flight,
            "arrived_rps": fleet.n_arrived / max(fleet.now, 1e-12),
            "offered_utilisation": round(sc.offered_utilisation, 4),
            "attempts": int(fc[K.F_ATTEMPTS]), "retries": int(fc[K.F_RETRIES]),
            "retries_denied": int(fc[K.F_RETRIES_DENIED]), "hedges": int(fc[K.F_HEDGES]),
            "hedges_won": int(fc[K.F_HEDGES_WON]),
            "cancelled": int(st.node_c[:, K.NC_CANCELLED].sum()),
            "flags_at_end": fleet.flags(),
            "latency_note": "latency quantiles are over successful (ok) requests",
            "versions": versions(),
        }
        info["steady_state"] = steady_state(info, sc)
        return cls(requests, metrics, summary, info)

    def write(self, out_dir) -> list[Path]:
        """Write the tables as parquet plus summary.json, each file atomically."""
        out_dir = Path(out_dir)
        written = []
        if self.requests is not None:
            written.append(write_parquet(self.requests, out_dir / "requests.parquet"))
        written.append(write_parquet(self.metrics, out_dir / "metrics.parquet"))
        if self.decisions is not None:
            written.append(write_parquet(self.decisions, out_dir / "decisions.parquet"))
        doc = {"info": self.info, "tiers": self.summary.to_dicts()}
        written.append(write_json(doc, out_dir / "summary.json"))
        return written

    def format_summary(self) -> str:
        """The summary as a fixed-width text table for a terminal."""
        cols = ["tier", "requests", "success_ratio", "error", "timeout", "dropped",
                "mean_ms", "p50_ms", "p99_ms", "p999_ms", "amplification"]
        rows = [cols] + [[_fmt(r[c]) for c in cols] for r in self.summary.iter_rows(named=True)]
        widths = [max(len(row[i]) for row in rows) for i in range(len(cols))]
        lines = ["  ".join(v.rjust(w) for v, w in zip(row, widths, strict=True)) for row in rows]
        i = self.info
        head = (f"scenario {i['scenario']}  seed {i['seed']}  {i['duration_s']:g} s simulated  "
                f"offered {i['offered_rps']:.1f} rps  goodput {i['goodput_rps']:.1f} rps  "
                f"utilisation {i['utilisation']:.3f}")
        tail = []
        if i.get("in_flight_at_end"):
            share = i["in_flight_at_end"] / max(i["user_requests"], 1)
            tail.append(f"{i['in_flight_at_end']} requests ({share:.1%} of arrivals) were still "
                        "in flight at the end and are not counted above")
        if i.get("steady_state") is False:
            why = (f"the offered load is {i['offered_utilisation']:.2f}x capacity with "
                   "unbounded queues" if i["offered_utilisation"] >= 1 else
                   "the backlog at the end is large")
            tail.append(f"the run did not reach a steady state: {why} (arrived "
                        f"{i['arrived_rps']:.1f} rps, counted {i['offered_rps']:.1f} rps), so "
                        "these figures depend on the run's length")
        return "\n".join([head, *lines, *tail])


def steady_state(info: dict, sc) -> bool:
    """False when the run cannot have settled: offered load at or over capacity with
    unbounded queues, or more than 5 % of arrivals still in flight at the end (the
    summary leaves those out, so its ratios and quantiles are of a biased sample)."""
    overloaded = sc.offered_utilisation >= 1.0 and sc.fleet.queue_limit is None
    backlog = info["in_flight_at_end"] > 0.05 * max(info["user_requests"], 1)
    return not (overloaded or backlog)


def _fmt(v) -> str:
    if isinstance(v, float):
        return "nan" if v != v else f"{v:.4g}" if abs(v) < 1e5 else f"{v:.0f}"
    return str(v)


def requests_table(rec_f: np.ndarray, rec_i: np.ndarray) -> pl.DataFrame:
    tiers = np.asarray(K.TIERS)
    outcomes = np.asarray(K.OUTCOMES)
    return pl.DataFrame({
        "arrival_s": rec_f[:, 0],
        "latency_ms": rec_f[:, 1],
        "tier": tiers[rec_i[:, 0]],
        "outcome": outcomes[rec_i[:, 1]],
        "node": rec_i[:, 2].astype(np.int32),
        "fanout": rec_i[:, 3].astype(np.int32),
        "attempts": rec_i[:, 4].astype(np.int32),  # copies sent: attempts plus hedges
        "degraded": rec_i[:, 5].astype(bool),
        "correct": rec_i[:, 6].astype(bool),  # false: a silent failure answered it
    })


_NODE_SERIES = {K.M_BUSY: "busy_servers", K.M_QLEN: "queue_length", K.M_IN_FLIGHT: "in_flight",
                K.M_BUSY_SECONDS: "busy_seconds_total", K.M_WRONG: "wrong_answers_total",
                K.M_CANCELLED: "cancelled_total", K.M_LAT_SUM: "latency_seconds_sum",
                K.M_LAT_COUNT: "latency_seconds_count"}
_FLEET_SERIES = {K.F_ATTEMPTS: "attempts_total", K.F_RETRIES: "retries_total",
                 K.F_RETRIES_DENIED: "retries_denied_total", K.F_HEDGES: "hedges_total",
                 K.F_HEDGES_WON: "hedges_won_total", K.F_DEGRADED: "degraded_total",
                 K.F_BREAKER: "breaker_state", K.F_HEDGE_ON: "hedge_enabled",
                 K.F_DEGRADED_ON: "degraded_mode"}
_LABELS = ("tier", "outcome", "le")


def _long(t, node, name, values, **labels) -> pl.DataFrame:
    n = len(values)
    cols = {"time_s": t, "node": node, "name": pl.Series([name] * n, dtype=pl.String)}
    for lab in _LABELS:
        v = labels.get(lab)
        cols[lab] = (pl.Series(v, dtype=pl.String) if v is not None and not isinstance(v, str)
                     else pl.Series([v] * n, dtype=pl.String))
    cols["value"] = values
    return pl.DataFrame(cols)


def node_columns(bounds_s) -> list[tuple]:
    """(column in out.metrics, name, tier, outcome, le) for every per-node series."""
    cols = [(ti * len(K.OUTCOMES) + oi, "requests_total", tier, outcome, None)
            for ti, tier in enumerate(K.TIERS) for oi, outcome in enumerate(K.OUTCOMES)]
    cols += [(col, name, None, None, None) for col, name in _NODE_SERIES.items()]
    les = [f"{b:g}" for b in bounds_s] + ["+Inf"]
    cols += [(K.M_BUCKETS + b, "latency_seconds_bucket", None, None, le)
             for b, le in enumerate(les)]
    return cols


def fleet_columns() -> list[tuple]:
    """(column in out.fleet, name, tier, outcome, le) for every fleet-wide series."""
    cols = [(ti * len(K.OUTCOMES) + oi, "client_requests_total", tier, outcome, None)
            for ti, tier in enumerate(K.TIERS) for oi, outcome in enumerate(K.OUTCOMES)]
    cols += [(K.F_SHEDDING + ti, "shedding", tier, None, None) for ti, tier in enumerate(K.TIERS)]
    cols += [(col, name, None, None, None) for col, name in _FLEET_SERIES.items()]
    return cols


def metrics_table(out, st, bounds_s) -> pl.DataFrame:
    """Long form, as Prometheus would hold it: one row per (time, node, series).

    Columns ``time_s``, ``node``, ``name``, ``tier``, ``outcome``, ``le``, ``value``;
    a label a series does not have is null. Node -1 holds the fleet-wide series
    (the clients' view: ``client_requests_total``, attempts, retries, hedges,
    flags). Each node is sampled on its own phase of the grid.
    """
    n_s = st.node_i[:, K.NI_NSAMPLE]
    s_max = int(n_s.max()) if n_s.size else 0
    m = out.metrics[:s_max]
    valid = (np.arange(s_max)[:, None] < n_s[None, :]).ravel()
    t_flat = out.sample_t[:s_max].ravel()[valid]
    node_flat = np.tile(np.arange(m.shape[1], dtype=np.int32), s_max)[valid]
    rows = m.reshape(-1, m.shape[2])[valid]
    parts = [_long(t_flat, node_flat, name, rows[:, col], tier=tier, outcome=outcome, le=le)
             for col, name, tier, outcome, le in node_columns(bounds_s)]
    n_f = int(st.is_[K.IS_NSAMPLE])
    f, ft = out.fleet[:n_f], out.fleet_t[:n_f]
    fleet_node = np.full(n_f, -1, dtype=np.int32)
    parts += [_long(ft, fleet_node, name, f[:, col], tier=tier, outcome=outcome, le=le)
              for col, name, tier, outcome, le in fleet_columns()]
    return pl.concat(parts).sort(["time_s", "node", "name"], maintain_order=True)


def summary_table(tier_cnt: np.ndarray, tier_ext: np.ndarray, hist: np.ndarray,
                  lat_sum: np.ndarray) -> pl.DataFrame:
    rows = []
    groups = [(name, [i]) for i, name in enumerate(K.TIERS)] + [("all", list(range(len(K.TIERS))))]
    for name, idx in groups:
        cnt = tier_cnt[idx].sum(axis=0)
        ext = tier_ext[idx].sum(axis=0)
        total = int(cnt.sum())
        h_ok = hist[idx, K.OK].sum(axis=0)
        ok = int(cnt[K.OK])
        row = {"tier": name, "requests": total, "ok": ok, "error": int(cnt[K.ERROR]),
               "timeout": int(cnt[K.TIMEOUT]), "dropped": int(cnt[K.DROPPED]),
               "success_ratio": ok / total if total else float("nan"),
               "mean_ms": float(lat_sum[idx, K.OK].sum() / ok) if ok else float("nan")}
        for col, q in QUANTILES.items():
            row[col] = hist_quantile(h_ok, q)
        # copies sent per user request (attempts + hedges): the load it put on the fleet
        row["amplification"] = float(ext[K.TX_ATTEMPTS] + ext[K.TX_HEDGES]) / total if total \
            else float("nan")
        row["hedges"] = int(ext[K.TX_HEDGES])
        row["degraded"] = int(ext[K.TX_DEGRADED])
        row["wrong"] = int(ext[K.TX_WRONG])  # ok to the client, but a wrong answer
        rows.append(row)
    return pl.DataFrame(rows)
