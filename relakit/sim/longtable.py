"""Kernel sample grids → the long metrics table, column by column, chunk by chunk.

The long table has one row per (time, node, series), ordered by ``time_s``, ``node``,
``name``. Its order is computed, not sorted: the grid's (time, node) *blocks* are put in
time order with one ``lexsort`` over blocks, every block lists its series in one name
order, and each column is filled from the grid by index arithmetic a chunk at a time, so
the extra memory is one chunk whatever the run's length (a frame per series, concatenated
and sorted, held several copies: docs/performance.md, "Memory"). Label columns are String,
as the trace schema's. :meth:`MetricsGrid.chunks` yields the table in pieces (written to
parquet without holding it whole); :meth:`MetricsGrid.table` is the whole frame.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import polars as pl

from relakit.sim import kernel as K
from relakit.vocab import IN_PATH_OUTCOMES

#: rows built (and written) at a time: bounds the working memory to a few MB a chunk
CHUNK_ROWS = 1 << 16
#: rows a piece of the in-memory table (:meth:`MetricsGrid.table`)
TABLE_CHUNK_ROWS = 1 << 18

_NODE_SERIES = {K.M_BUSY: "busy_servers", K.M_QLEN: "queue_length", K.M_IN_FLIGHT: "in_flight",
                K.M_BUSY_SECONDS: "busy_seconds_total", K.M_WRONG: "wrong_answers_total",
                K.M_CANCELLED: "cancelled_total", K.M_LAT_SUM: "latency_seconds_sum",
                K.M_LAT_COUNT: "latency_seconds_count", K.M_PROBES: "probe_requests_total",
                K.M_PROBE_FAILURES: "probe_failures_total"}
_FLEET_SERIES = {K.F_ATTEMPTS: "attempts_total", K.F_RETRIES: "retries_total",
                 K.F_RETRIES_DENIED: "retries_denied_total", K.F_HEDGES: "hedges_total",
                 K.F_HEDGES_WON: "hedges_won_total", K.F_DEGRADED: "degraded_total",
                 K.F_BREAKER: "breaker_state", K.F_HEDGE_ON: "hedge_enabled",
                 K.F_DEGRADED_ON: "degraded_mode"}
# the in-path mechanisms' series (issue 33), only in a run that has one (``in_path``)
_NODE_IN_PATH = {K.M_REJECTED: "rejected_total", K.M_CODEL_DROPPED: "codel_dropped_total",
                 K.M_CONC_LIMIT: "concurrency_limit"}
_FLEET_IN_PATH = {K.F_THROTTLED: "client_throttled_total"}
LABELS = ("tier", "outcome", "le")
COLUMNS = ("time_s", "node", "name", *LABELS, "value")


def le_labels(bounds_s) -> list[str]:
    """The ``le`` label of each histogram bucket, as Prometheus writes it."""
    return [f"{b:g}" for b in bounds_s] + ["+Inf"]


def _outcomes(in_path: bool, client: bool) -> list[tuple[int, str]]:
    """(code, outcome) a table lists: without an in-path mechanism the four it always
    had; with one, ``rejected`` too, and at the client ``throttled`` (a server never
    sees a throttled request)."""
    return [(oi, o) for oi, o in enumerate(K.OUTCOMES)
            if o not in IN_PATH_OUTCOMES or (in_path and (client or o != "throttled"))]


def node_columns(bounds_s, in_path: bool = False) -> list[tuple]:
    """(column in out.metrics, name, tier, outcome, le) for every per-node series
    (``in_path``: a run with an in-path mechanism, issue 33)."""
    cols = [(ti * len(K.OUTCOMES) + oi, "requests_total", tier, outcome, None)
            for ti, tier in enumerate(K.TIERS) for oi, outcome in _outcomes(in_path, False)]
    cols += [(col, name, None, None, None) for col, name in _NODE_SERIES.items()]
    if in_path:
        cols += [(col, name, None, None, None) for col, name in _NODE_IN_PATH.items()]
    cols += [(K.M_BUCKETS + b, "latency_seconds_bucket", None, None, le)
             for b, le in enumerate(le_labels(bounds_s))]
    return cols


def fleet_columns(in_path: bool = False) -> list[tuple]:
    """(column in out.fleet, name, tier, outcome, le) for every fleet-wide series."""
    cols = [(ti * len(K.OUTCOMES) + oi, "client_requests_total", tier, outcome, None)
            for ti, tier in enumerate(K.TIERS) for oi, outcome in _outcomes(in_path, True)]
    cols += [(K.F_SHEDDING + ti, "shedding", tier, None, None) for ti, tier in enumerate(K.TIERS)]
    cols += [(col, name, None, None, None) for col, name in _FLEET_SERIES.items()]
    if in_path:
        cols += [(col, name, None, None, None) for col, name in _FLEET_IN_PATH.items()]
    return cols


def _by_name(cols: list[tuple]) -> list[tuple]:
    """The series of one block in table order: by name, ties in declaration order."""
    return sorted(cols, key=lambda c: c[1])  # sorted() is stable


class _Labels:
    """Each series' labels as small integer codes into a few category strings."""

    def __init__(self, series: list[tuple]):
        self.values: dict[str, pl.Series] = {}
        self.codes: dict[str, np.ndarray] = {}
        for k, lab in enumerate(("name", *LABELS)):
            vals = [c[1 + k] for c in series]
            cats = sorted({v for v in vals if v is not None})
            code_of = {v: i for i, v in enumerate(cats)}
            code_of[None] = len(cats)  # the last category is null
            self.values[lab] = pl.Series(lab, [*cats, None], dtype=pl.String)
            self.codes[lab] = np.array([code_of[v] for v in vals], dtype=np.uint32)


@dataclass(frozen=True)
class MetricsGrid:
    """What the kernel sampled, trimmed to the samples taken (views of its arrays).

    The kernel writes each sample once and never again, so a grid taken now
    still describes the same samples after the fleet runs on.
    """

    metrics: np.ndarray    # (samples, nodes, node columns)
    sample_t: np.ndarray   # (samples, nodes); NaN where a node was not sampled
    n_samples: np.ndarray  # (nodes,) samples taken per node
    fleet: np.ndarray      # (fleet samples, fleet columns)
    fleet_t: np.ndarray    # (fleet samples,)
    bounds_s: tuple
    in_path: bool = False  # the in-path mechanisms' outcomes and series (node_columns)

    @classmethod
    def from_kernel(cls, out, st, bounds_s, in_path: bool = False) -> MetricsGrid:
        n_s = st.node_i[:, K.NI_NSAMPLE].copy()
        s_max = int(n_s.max()) if n_s.size else 0
        n_f = int(st.is_[K.IS_NSAMPLE])
        return cls(np.ascontiguousarray(out.metrics[:s_max]), out.sample_t[:s_max], n_s,
                   np.ascontiguousarray(out.fleet[:n_f]), out.fleet_t[:n_f],
                   tuple(bounds_s), in_path)

    # ---- layout ----------------------------------------------------------------------
    def _series(self) -> tuple[list[tuple], list[tuple]]:
        return (_by_name(node_columns(self.bounds_s, self.in_path)),
                _by_name(fleet_columns(self.in_path)))

    def _blocks(self):
        """Every (time, node) block in table order: time, node, sample index, fleet or not."""
        s_max, nodes = self.sample_t.shape
        taken = np.arange(s_max)[:, None] < self.n_samples[None, :]
        s_idx, node = np.nonzero(taken)  # row-major: by sample, then node
        n_f = self.fleet_t.shape[0]
        t = np.concatenate([self.sample_t[s_idx, node], self.fleet_t])
        node = np.concatenate([node, np.full(n_f, -1)]).astype(np.int32)
        s_idx = np.concatenate([s_idx, np.arange(n_f)])
        is_fleet = np.concatenate([np.zeros(s_idx.size - n_f, bool), np.ones(n_f, bool)])
        order = np.lexsort((node, t))  # by time, then node (-1, the fleet, first)
        return t[order], node[order], s_idx[order], is_fleet[order]

    @property
    def height(self) -> int:
        """Rows of the long table."""
        node_cols, fleet_cols = self._series()
        return int(self.n_samples.sum()) * len(node_cols) + self.fleet_t.shape[0] * len(
            fleet_cols)

    # ---- the table --------------------------------------------------------------------
    def chunks(self, rows: int | None = None) -> Iterator[pl.DataFrame]:
        """The long table in consecutive pieces of about ``rows`` rows (whole blocks each;
        default :data:`CHUNK_ROWS`). Always yields at least one frame (an empty one for a
        run with no samples).
        """
        rows = CHUNK_ROWS if rows is None else rows
        node_cols, fleet_cols = self._series()
        n_node = len(node_cols)
        labels = _Labels(node_cols + fleet_cols)
        src = np.array([c[0] for c in node_cols + fleet_cols], dtype=np.int64)
        t, node, s_idx, is_fleet = self._blocks()
        size = np.where(is_fleet, len(fleet_cols), n_node)
        base = np.where(is_fleet, n_node, 0)  # each block's first series in `src`
        end = np.cumsum(size)
        m_flat, f_flat = self.metrics.reshape(-1), self.fleet.reshape(-1)
        nodes, m_width = self.metrics.shape[1], self.metrics.shape[2]
        f_width = self.fleet.shape[1]
        b0 = 0
        while True:
            # whole blocks up to about `rows` rows (at least one block)
            b1 = max(int(np.searchsorted(end, (end[b0 - 1] if b0 else 0) + rows, "right")),
                     b0 + 1)
            b1 = min(b1, t.size)
            sz = size[b0:b1]
            first = np.repeat(np.cumsum(sz) - sz, sz)
            series = np.arange(first.size) - first + np.repeat(base[b0:b1], sz)
            s_row = np.repeat(s_idx[b0:b1], sz)
            node_row = np.repeat(node[b0:b1], sz)
            value = np.empty(series.size)
            fl = np.repeat(is_fleet[b0:b1], sz)
            nd = ~fl
            value[nd] = m_flat[(s_row[nd] * nodes + node_row[nd]) * m_width + src[series[nd]]]
            value[fl] = f_flat[s_row[fl] * f_width + src[series[fl]]]
            del first, s_row, fl, nd
            cols = {"time_s": pl.Series("time_s", np.repeat(t[b0:b1], sz)),
                    "node": pl.Series("node", node_row, dtype=pl.Int32)}
            for lab, cats in labels.values.items():
                cols[lab] = cats.gather(labels.codes[lab][series])
            cols["value"] = pl.Series("value", value)
            yield pl.DataFrame(cols)
            b0 = b1
            if b0 >= t.size:
                return

    def table(self) -> pl.DataFrame:
        """The whole long table (its chunks side by side, not copied into one).

        Larger pieces than :meth:`chunks` gives a writer: the table is held anyway, and
        fewer pieces keep later operations on it quick.
        """
        return pl.concat(list(self.chunks(TABLE_CHUNK_ROWS)), rechunk=False)
