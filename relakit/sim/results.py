"""Kernel arrays → polars tables: ``requests``, ``metrics``, ``summary``.

All conversions are vectorised (numpy index tricks, no loop over requests or
samples). Latency quantiles in the summary come from the kernel's
log-spaced histogram (200 bins a decade, so within ±0.6 %), which exists
whether or not per-request records were kept: the summary does not change
when records are switched off.
"""

from __future__ import annotations

import platform
from pathlib import Path

import numpy as np
import polars as pl

from relakit.display import html_view, text_rows
from relakit.io import write_json, write_parquet, write_parquet_chunks
from relakit.sim import kernel as K
from relakit.sim.longtable import MetricsGrid, fleet_columns
from relakit.vocab import IN_PATH_OUTCOMES, NOT_OK, OUTCOMES

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
    from importlib.metadata import version

    import numpy
    import polars

    from relakit import __version__

    # numba's version from its metadata: a plain run may never import numba (relakit.jit)
    return {"relakit": __version__, "numba": version("numba"), "numpy": numpy.__version__,
            "polars": polars.__version__, "python": platform.python_version()}


class SimulationResult:
    """What one run produced: three tables and a small dict of run facts.

    ``metrics`` may be given as a :class:`~relakit.sim.longtable.MetricsGrid`
    (what a run hands over): the long table is then built on first use, and
    :meth:`write` streams it to parquet in chunks without ever holding it
    whole, so a long run with records off writes its results in flat memory.
    """

    def __init__(self, requests: pl.DataFrame | None, metrics: pl.DataFrame | MetricsGrid,
                 summary: pl.DataFrame, info: dict | None = None,
                 decisions: pl.DataFrame | None = None, timeline: pl.DataFrame | None = None):
        self.requests = requests
        self.metrics = metrics
        self.summary = summary
        self.info = {} if info is None else info
        self.decisions = decisions  # the control plane's audit log, closed loop only
        self.timeline = timeline  # per evaluation: time_s, mode, signal values

    @property
    def metrics(self) -> pl.DataFrame:
        """The long metrics table (``relakit.traces.SCHEMA``), built on first use."""
        if isinstance(self._metrics, MetricsGrid):
            self._metrics = self._metrics.table()
        return self._metrics

    @metrics.setter
    def metrics(self, value: pl.DataFrame | MetricsGrid) -> None:
        self._metrics = value

    def __repr__(self) -> str:
        return (f"SimulationResult(scenario={self.info.get('scenario')!r}, "
                f"requests={None if self.requests is None else self.requests.height}, "
                f"summary={self.summary.height} tiers)")

    def fleet_series(self) -> pl.DataFrame:
        """What clients saw, per metrics sample, all tiers together: ``time_s`` (the
        sample's end), ``requests_rps`` and one ``<outcome>_rps`` per outcome over the
        interval before it, and ``success_ratio`` (null in an interval with no
        requests). Built from the fleet's ``client_requests_total`` counters: a few
        columns per sample, whatever the fleet's size, so N replications stay small."""

        grid = self._metrics
        if isinstance(grid, MetricsGrid):
            t = np.asarray(grid.fleet_t, dtype=float)
            outcomes = [o for o in OUTCOMES if grid.in_path or o not in IN_PATH_OUTCOMES]
            counts = {o: np.zeros(t.size) for o in outcomes}
            for col, name, _tier, outcome, _le in fleet_columns(grid.in_path):
                if name == "client_requests_total":
                    counts[outcome] = counts[outcome] + grid.fleet[:, col]
        else:  # a long table (read back from disk)
            wide = (self.metrics.filter(pl.col("name") == "client_requests_total")
                    .group_by("time_s", "outcome").agg(pl.col("value").sum())
                    .pivot(on="outcome", index="time_s", values="value").sort("time_s"))
            t = wide["time_s"].to_numpy()
            in_path = any(o in wide.columns for o in IN_PATH_OUTCOMES)
            outcomes = [o for o in OUTCOMES if in_path or o not in IN_PATH_OUTCOMES]
            counts = {o: (wide[o].fill_null(0).to_numpy() if o in wide.columns
                          else np.zeros(t.size)) for o in outcomes}
        dt = np.diff(np.concatenate([[0.0], t]))
        keep = dt > 0  # a sample at t = 0 closes no interval
        t, dt = t[keep], dt[keep]
        cols = {"time_s": t}
        total = np.zeros(t.size)
        for o in outcomes:
            inc = np.diff(np.concatenate([[0.0], counts[o]]))[keep]
            cols[f"{o}_rps"] = inc / dt
            total += inc
        cols["requests_rps"] = total / dt
        ok_inc = cols["ok_rps"] * dt
        cols["success_ratio"] = np.where(total > 0, ok_inc / np.where(total > 0, total, 1), np.nan)
        out = pl.DataFrame(cols).select("time_s", "requests_rps",
                                        *[f"{o}_rps" for o in outcomes], "success_ratio")
        return out.with_columns(pl.col("success_ratio").fill_nan(None))

    def jobs_in_system(self) -> tuple[np.ndarray, np.ndarray]:
        """Jobs at all nodes together (queued and in service, abandoned copies included), at
        each metrics sample: ``(time_s, jobs)``, straight from the kernel's samples (what a
        metastability study reads per run: :mod:`relakit.metastability`). Nodes are
        sampled on one grid; a run read back from disk sums the long table instead."""
        grid = self._metrics
        if isinstance(grid, MetricsGrid):
            n = int(grid.n_samples.min()) if grid.n_samples.size else 0
            t = np.asarray(grid.sample_t[:n, 0], dtype=float)
            return t, grid.metrics[:n, :, K.M_IN_FLIGHT].sum(axis=1).astype(float)
        wide = (self.metrics.filter(pl.col("name") == "in_flight").group_by("time_s")
                .agg(pl.col("value").sum()).sort("time_s"))
        return wide["time_s"].to_numpy(), wide["value"].to_numpy().astype(float)

    @classmethod
    def from_fleet(cls, fleet) -> SimulationResult:
        out, st, sc = fleet.out, fleet.st, fleet.scenario
        n_rec = int(st.is_[K.IS_NREC])
        requests = None
        if fleet.cfg.cfg_i[K.CI_RECORD]:
            requests = requests_table(out.rec_f[:n_rec], out.rec_i[:n_rec])
        metrics = MetricsGrid.from_kernel(out, st, sc.metrics.latency_buckets_s, fleet.in_path)
        summary = summary_table(out.tier_cnt, out.tier_ext, out.hist, out.lat_sum,
                                fleet.in_path)
        span = max(fleet.now - sc.warmup_s, 1e-12)
        busy_s = st.node_f[:, K.NF_BUSY_AREA] + st.node_i[:, K.NI_BUSY] * (
            fleet.now - st.node_f[:, K.NF_LAST_T])
        servers = np.asarray(sc.fleet.servers, dtype=float)
        counted = int(out.tier_cnt.sum())
        fc = st.fleet_c
        info = {
            "scenario": sc.name, "source": sc.source, "seed": fleet.seed,
            "duration_s": fleet.now, "warmup_s": sc.warmup_s, "nodes": sc.fleet.nodes,
            "fanout": sc.workload.fanout,
            "user_requests": fleet.n_arrived, "counted_requests": counted,
            "offered_rps": counted / span,
            "goodput_rps": int(out.tier_cnt[:, K.OK].sum()) / span,
            "utilisation": float(busy_s.sum() / (servers.sum() * max(fleet.now, 1e-12))),
            "utilisation_by_node": (busy_s / (servers * max(fleet.now, 1e-12))).round(4).tolist(),
            "in_flight_at_end": fleet.users_in_flight,
            "arrived_rps": fleet.n_arrived / max(fleet.now, 1e-12),
            "offered_utilisation": round(sc.offered_utilisation, 4),
            # a closed population (workload.clients): its offered rate is an outcome
            "clients": closed_clients_info(sc.workload.clients),
            "attempts": int(fc[K.F_ATTEMPTS]), "retries": int(fc[K.F_RETRIES]),
            "retries_denied": int(fc[K.F_RETRIES_DENIED]), "hedges": int(fc[K.F_HEDGES]),
            "hedges_won": int(fc[K.F_HEDGES_WON]),
            **({"throttled": int(fc[K.F_THROTTLED]),
                "rejected": int(st.node_c[:, K.NC_REJECTED].sum()),
                "codel_dropped": int(st.node_c[:, K.NC_CODEL_DROPPED].sum())}
               if fleet.in_path else {}),
            "cancelled": int(st.node_c[:, K.NC_CANCELLED].sum()),
            "flags_at_end": fleet.flags(),
            # a fault can answer wrongly (with success status): the summary shows `wrong`
            "wrong_possible": any(f.wrong_rate > 0 for f in sc.faults),
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
        if isinstance(self._metrics, MetricsGrid):  # never built: stream it, chunk by chunk
            written.append(write_parquet_chunks(self._metrics.chunks(),
                                                out_dir / "metrics.parquet"))
        else:
            written.append(write_parquet(self.metrics, out_dir / "metrics.parquet"))
        if self.decisions is not None:
            written.append(write_parquet(self.decisions, out_dir / "decisions.parquet"))
        if self.timeline is not None:
            written.append(write_parquet(self.timeline, out_dir / "timeline.parquet"))
        # a table this run has not (records off, no control plane) must not survive from
        # an earlier run in the folder: read back, it would pass for this run's
        for name, table in (("requests", self.requests), ("decisions", self.decisions),
                            ("timeline", self.timeline)):
            if table is None:
                (out_dir / f"{name}.parquet").unlink(missing_ok=True)
        doc = {"info": self.info, "tiers": self.summary.to_dicts()}
        written.append(write_json(doc, out_dir / "summary.json"))
        return written

    @classmethod
    def read(cls, folder) -> SimulationResult:
        """A run folder written by :meth:`write` (``relakit simulate``), read back.

        ``summary.json`` and ``metrics.parquet`` must be there; ``requests``,
        ``decisions`` and ``timeline`` are None when the run did not keep them.
        """
        import json

        folder = Path(folder)
        summary_path, metrics_path = folder / "summary.json", folder / "metrics.parquet"
        for p in (summary_path, metrics_path):
            if not p.is_file():
                raise FileNotFoundError(f"{folder}: not a run folder (no {p.name}); write one "
                                        "with `relakit simulate SCENARIO --out FOLDER`")
        doc = json.loads(summary_path.read_text())

        def opt(name):
            p = folder / f"{name}.parquet"
            return pl.read_parquet(p) if p.is_file() else None

        return cls(requests=opt("requests"), metrics=pl.read_parquet(metrics_path),
                   summary=pl.DataFrame(doc.get("tiers", [])), info=doc.get("info", {}),
                   decisions=opt("decisions"), timeline=opt("timeline"))

    def format_summary(self, wrong: bool | None = None) -> str:
        """The summary as a fixed-width text table for a terminal.

        The ``wrong`` column (ok to the client, but a wrong answer) is shown
        whenever a fault can answer wrongly or a wrong answer was counted
        (``wrong=None``), so a silent failure is not silent on the console.
        Every column has one number format: counts as integers, the success
        ratio with 4 decimals, amplification with 3, and the latency columns
        all with the decimals that give their smallest value 3 digits.
        """
        head, rows, tail = self._summary_parts(wrong)
        return "\n".join([head, *text_rows(rows), *tail])

    def _repr_html_(self) -> str:
        head, rows, tail = self._summary_parts(None)
        spent = (self.info.get("control") or {}).get("time_in_mode_s")
        modes = ("time in each mode: " + ", ".join(f"{m} {s:.0f} s" for m, s in spent.items())
                 if spent else None)
        return html_view(f"SimulationResult: {self.info.get('scenario')}", [head, modes],
                         [("per tier (latency in ms, from the run's histogram)", rows)], tail)

    def _summary_parts(self, wrong: bool | None) -> tuple[str, list[list[str]], list[str]]:
        """(headline, table rows with the header first, notes): the console's text and
        the notebook's HTML are made of the same cells."""
        if wrong is None:
            wrong = bool(self.info.get("wrong_possible")) or (
                "wrong" in self.summary.columns and int(self.summary["wrong"].sum()) > 0)
        cols = ["tier", "requests", "success_ratio",
                *(o for o in NOT_OK if o in self.summary.columns),
                *(["wrong"] if wrong else []), "mean_ms", "p50_ms", "p99_ms", "p999_ms",
                "amplification"]
        ms = [c for c in cols if c.endswith("_ms")]
        ms_dec = _decimals(np.concatenate([self.summary[c].to_numpy() for c in ms]))
        decimals = {"success_ratio": 4, "amplification": 3, **dict.fromkeys(ms, ms_dec)}
        rows = [cols] + [[_fmt(r[c], decimals.get(c)) for c in cols]
                         for r in self.summary.iter_rows(named=True)]
        i = self.info
        head = (f"scenario {i['scenario']}  seed {i['seed']}  {i['duration_s']:g} s simulated  "
                f"offered {i['offered_rps']:.1f} rps  goodput {i['goodput_rps']:.1f} rps  "
                f"utilisation {i['utilisation']:.3f}")
        tail = []
        if i.get("in_flight_at_end"):
            share = i["in_flight_at_end"] / max(i["user_requests"], 1)
            tail.append(f"{i['in_flight_at_end']} requests ({share:.1%} of arrivals) were still "
                        "in flight at the end and are not counted above")
        if i.get("clients"):
            c = i["clients"]
            tail.append(f"{c['population']} closed clients ({c['by_tier']}) sent "
                        f"{i['offered_rps']:.1f} rps: in a closed population the offered load "
                        "is an outcome of the run, not an input (it falls as latency rises; "
                        f"at most {c['max_rps']:.4g} rps were every answer instant)")
        if i.get("steady_state") is False:
            why = (f"the offered load is {i['offered_utilisation']:.2f}x capacity with "
                   "unbounded queues" if i["offered_utilisation"] >= 1 else
                   "the backlog at the end is large")
            tail.append(f"the run did not reach a steady state: {why} (arrived "
                        f"{i['arrived_rps']:.1f} rps, counted {i['offered_rps']:.1f} rps), so "
                        "these figures depend on the run's length")
        return head, rows, tail

def closed_clients_info(clients) -> dict | None:
    """A closed population's facts for the summary (None: no workload.clients)."""
    if clients is None:
        return None
    up_to = "up to " if clients.steps else ""  # a population schedule: its largest N
    return {"population": f"up to {clients.total}" if up_to else clients.total,
            "by_tier": ", ".join(f"{t} {up_to}{clients.population[t]}" for t in clients.tiers),
            "think_ms": {t: clients.think[t].mean_ms for t in clients.tiers},
            "max_rps": round(clients.max_rate(), 6)}


def steady_state(info: dict, sc) -> bool:
    """False when the run cannot have settled: offered load at or over capacity with
    unbounded queues, or more than 5 % of arrivals still in flight at the end (the
    summary leaves those out, so its ratios and quantiles are of a biased sample)."""
    mit = sc.mitigations  # a concurrency limit or CoDel bounds the queue too (issue 33)
    overloaded = (sc.offered_utilisation >= 1.0 and sc.fleet.queue_limit is None
                  and mit.concurrency_limit is None and mit.codel is None)
    backlog = info["in_flight_at_end"] > 0.05 * max(info["user_requests"], 1)
    return not (overloaded or backlog)


def _decimals(values: np.ndarray, digits: int = 3, most: int = 3) -> int:
    """Decimals that show the smallest nonzero |value| with ``digits`` significant digits."""
    v = np.abs(values[np.isfinite(values) & (values != 0)])
    if v.size == 0:
        return 1
    return int(np.clip(digits - 1 - np.floor(np.log10(v.min())), 0, most))


def _fmt(v, decimals: int | None = None) -> str:
    """One cell: integers as they are, floats with the column's decimals, no data as '-'."""
    if isinstance(v, float):
        if v != v:
            return "-"
        return f"{v:.{decimals}f}" if decimals is not None else f"{v:g}"
    return str(v)


def _words(name: str, words: tuple, codes: np.ndarray) -> pl.Series:
    """A String column from codes (positions in ``words``), gathered by polars: a numpy
    string array took ~0.1 s per 200k rows to convert, this ~2 ms (same column)."""
    return pl.Series(name, list(words), dtype=pl.String).gather(codes)


def requests_table(rec_f: np.ndarray, rec_i: np.ndarray) -> pl.DataFrame:
    return pl.DataFrame({
        "arrival_s": rec_f[:, 0],
        "latency_ms": rec_f[:, 1],
        "tier": _words("tier", K.TIERS, rec_i[:, 0]),
        "outcome": _words("outcome", K.OUTCOMES, rec_i[:, 1]),
        "node": rec_i[:, 2].astype(np.int32),
        "fanout": rec_i[:, 3].astype(np.int32),
        "attempts": rec_i[:, 4].astype(np.int32),  # copies sent: attempts plus hedges
        "degraded": rec_i[:, 5].astype(bool),
        "correct": rec_i[:, 6].astype(bool),  # false: a silent failure answered it
        # its first call's first-attempt service demand (ms), before any node slowdown or
        # degraded factor: drawn at arrival, the same whatever the policy (common random
        # numbers), and drawn even for a request rejected at the door
        "service_ms": rec_f[:, 2],
    })


def summary_table(tier_cnt: np.ndarray, tier_ext: np.ndarray, hist: np.ndarray,
                  lat_sum: np.ndarray, in_path: bool = False) -> pl.DataFrame:
    """Per tier and all: counts by outcome (``throttled`` and ``rejected`` in a run with
    an in-path mechanism, ``in_path``), success, latency quantiles, amplification."""
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
               **({o: int(cnt[K.OUTCOMES.index(o)]) for o in IN_PATH_OUTCOMES}
                  if in_path else {}),
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
