"""A recording as the estimators read it: per scrape target, counters as increments.

Every estimator of :mod:`relakit.calibration` works on the same few arrays, built
here once from the long metrics table (:data:`relakit.traces.SCHEMA`), whatever
importer produced it: per node its scrape times, its request counters by tier
and outcome, its busy and in-flight gauges, its busy-seconds counter and its
latency histogram; per fleet (node -1) the client counters and the flag gauges.

Why counters are *filled* here: a Prometheus client library creates a labelled
series at its first increment, so a recording holds no sample of
``requests_total{outcome="error"}`` before the first error. A counter missing
before its first sample is therefore taken as 0 (and a gap inside is carried
forward); a counter that drops is a reset and counts from zero, as
Prometheus' ``increase`` does.

Time origin: a simulation's counters start at 0 at t = 0, and its first scrape
comes within a scrape interval or two; a live recording starts at some Unix
second with counters already running. So the origin is 0 when the first sample
is within two scrape intervals of 0 (then a zero sample at t = 0 is prepended to
every counter), else the latest first-sample time over the targets (from there
on every target has data). The twin's time is the recording's minus the origin.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import polars as pl

from relakit.control.tsdb import TSDB, Target
from relakit.vocab import ANSWERED, OUTCOMES, TIERS


class CalibrationError(ValueError):
    """A recording the calibration cannot use: names the file and what is missing."""


def fill_counter(v: np.ndarray) -> np.ndarray:
    """A counter with leading gaps as 0 and inner gaps carried forward."""
    v = np.asarray(v, dtype=float).copy()
    ok = ~np.isnan(v)
    if not ok.any():
        return np.zeros_like(v)
    idx = np.where(ok, np.arange(v.size), -1)
    np.maximum.accumulate(idx, out=idx)
    out = np.where(idx >= 0, v[np.maximum(idx, 0)], 0.0)
    return out


def increments(c: np.ndarray) -> np.ndarray:
    """Per-interval increase of a cumulative counter (axis 0), resets counted from zero."""
    d = np.diff(c, axis=0)
    return np.where(d < 0, c[1:], d)


def fill_gauge(v: np.ndarray) -> np.ndarray:
    """A gauge with gaps carried forward (leading gaps stay NaN)."""
    v = np.asarray(v, dtype=float)
    ok = ~np.isnan(v)
    idx = np.where(ok, np.arange(v.size), -1)
    np.maximum.accumulate(idx, out=idx)
    return np.where(idx >= 0, v[np.maximum(idx, 0)], np.nan)


@dataclass
class NodeData:
    """One scrape target's series, on its own scrape times (twin time: origin removed)."""

    node: int
    t: np.ndarray                        # (S,) scrape times
    requests: np.ndarray                 # (S, tiers + untiered, outcomes) cumulative, filled
    busy: np.ndarray | None = None       # busy_servers gauge
    queue: np.ndarray | None = None      # queue_length gauge
    in_flight: np.ndarray | None = None  # in_flight gauge
    busy_seconds: np.ndarray | None = None  # busy_seconds_total, filled
    bounds: np.ndarray | None = None     # latency bucket upper bounds (s), +Inf last
    buckets: np.ndarray | None = None    # (S, B) cumulative bucket counts, filled
    lat_count: np.ndarray | None = None  # latency_seconds_count, filled
    lat_sum: np.ndarray | None = None    # latency_seconds_sum, filled
    tier_lat_count: np.ndarray | None = None  # (S, tiers) latency_seconds_count{tier}, filled
    tier_lat_sum: np.ndarray | None = None    # (S, tiers) latency_seconds_sum{tier}, filled

    @property
    def dt(self) -> np.ndarray:
        return np.diff(self.t)

    def outcome_increments(self, outcomes) -> np.ndarray:
        """Per interval, requests with any of these outcomes (all tiers)."""
        cols = [OUTCOMES.index(o) for o in outcomes]
        return increments(self.requests[:, :, cols].sum(axis=(1, 2)))

    def completions(self) -> tuple[np.ndarray, str]:
        """Per interval, requests the node finished serving, and which series said so."""
        if self.lat_count is not None:
            return increments(self.lat_count), "latency_seconds_count"
        if self.buckets is not None:
            return increments(self.buckets[:, -1]), 'latency_seconds_bucket{le="+Inf"}'
        return (self.outcome_increments(ANSWERED),
                'requests_total{outcome=~"ok|error|timeout"}')


@dataclass
class Recording:
    """What the estimators read: the nodes, the fleet series, the clocks of the recording."""

    source: str
    origin_s: float
    scrape_s: float
    nodes: list[NodeData]
    fleet_t: np.ndarray | None = None       # node -1 sample times
    fleet: dict = field(default_factory=dict)  # name (or (name, tier)) -> filled values
    client_requests: np.ndarray | None = None  # (S, tiers + untiered, outcomes) cumulative
    frame: pl.DataFrame | None = None           # the long table, twin time

    @property
    def end_s(self) -> float:
        return float(min(n.t[-1] for n in self.nodes))

    def node(self, i: int) -> NodeData:
        return next(n for n in self.nodes if n.node == i)


def _column(tgt: Target, name: str, **labels) -> np.ndarray | None:
    idx = tgt.select(name, **labels)
    if idx.size == 0:
        return None
    return tgt.values[:, idx].sum(axis=1) if idx.size > 1 else tgt.values[:, idx[0]]


def _requests(tgt: Target, name: str) -> np.ndarray | None:
    """(S, tiers + 1, outcomes) cumulative request counters, each filled; None if absent.

    The extra tier slot holds series without a ``tier`` label; a series without an
    ``outcome`` label counts as ``ok`` (a plain request counter)."""
    if tgt.select(name).size == 0:
        return None
    out = np.zeros((tgt.times.size, len(TIERS) + 1, len(OUTCOMES)))
    for i, (n, tier, outcome, _le) in enumerate(tgt.columns):
        if n != name:
            continue
        ti = TIERS.index(tier) if tier in TIERS else len(TIERS) if tier is None else None
        oi = OUTCOMES.index(outcome) if outcome in OUTCOMES else 0 if outcome is None \
            else None
        if ti is None or oi is None:
            continue
        out[:, ti, oi] += fill_counter(tgt.values[:, i])
    return out


#: a Unix time in seconds this large is past the year 5000: the clock is in milliseconds
MAX_TIME_S = 1e11
#: a counter rising faster than this per second is no recording of requests or seconds
MAX_COUNTER_RATE = 1e9
COUNTER_SUFFIXES = ("_total", "_count", "_sum", "_bucket")


def check_plausible(frame: pl.DataFrame, source: str) -> None:
    """Refuse a recording no estimate can be trusted from, before anything is fitted.

    Each mistake here once gave a twin without a word: timestamps in milliseconds (a
    16-hour twin of a minute), counters that are infinite or negative, or rise beyond
    any service (a
    fit of 1e300 req/s sized its pools until the machine ran out of memory), and
    request labels relakit does not know (a renamed ``outcome="failed"`` made every
    error vanish). Two values at one timestamp are refused by the importers
    (:func:`relakit.traces.read_trace`)."""
    t_max = frame["time_s"].max()
    if t_max is not None and t_max > MAX_TIME_S:
        raise CalibrationError(f"{source}: timestamps reach {t_max:.4g}, past the year 5000 "
                               "as Unix seconds: they look like milliseconds; give seconds")
    keys = ["node", "name", "tier", "outcome", "le", "time_s"]
    counters = frame.filter(pl.any_horizontal(pl.col("name").str.ends_with(end)
                                              for end in COUNTER_SUFFIXES))
    bad = counters.filter(pl.col("value").is_infinite() | (pl.col("value") < 0))
    if bad.height:
        b = bad.sort(keys).row(0, named=True)
        raise CalibrationError(f"{source}: key '{_series(b)}': {bad.height} counter "
                               f"sample(s) are infinite or negative, e.g. node {b['node']}'s "
                               f"{b['value']:g} at {b['time_s']:g} s; a counter is a finite "
                               "count from 0")
    rates = (counters.drop_nulls("value").filter(pl.col("value").is_not_nan())
             .sort(keys)
             .with_columns((pl.col("value").diff() / pl.col("time_s").diff())
                           .over(keys[:-1]).alias("rate")))
    fast = rates.filter(pl.col("rate") > MAX_COUNTER_RATE)
    if fast.height:
        f = fast.sort("rate", descending=True).row(0, named=True)
        raise CalibrationError(f"{source}: key '{_series(f)}': node {f['node']}'s counter rises "
                               f"by {f['rate']:.3g} per second near {f['time_s']:g} s, beyond "
                               f"any service (> {MAX_COUNTER_RATE:g}/s): check its unit or "
                               "scale")
    for name in ("requests_total", "client_requests_total"):
        rows = frame.filter(pl.col("name") == name)
        for label, known in (("tier", TIERS), ("outcome", OUTCOMES)):
            other = sorted(set(rows[label].drop_nulls().unique().to_list()) - set(known))
            if other:
                raise CalibrationError(
                    f"{source}: key '{name}.{label}': " + ", ".join(repr(v) for v in other)
                    + f" is not {'an' if label[0] in 'aeiou' else 'a'} {label} relakit knows ("
                    + ", ".join(known)
                    + "); its requests would be left out: rename the label values")


def _series(row: dict) -> str:
    labels = ",".join(f'{k}="{row[k]}"' for k in ("tier", "outcome", "le") if row.get(k))
    return f"{row['name']}{{{labels}}}"


def _le(value: str) -> float:
    return float("inf") if value in ("+Inf", "Inf", "inf") else float(value)


def read_recording(frame: pl.DataFrame, source: str, nodes: list[int] | None = None) -> Recording:
    """The estimators' view of a long metrics table (see the module docstring).

    ``nodes`` keeps only those scrape targets; a node not in the recording is a
    :class:`CalibrationError` naming the nodes it has.
    """
    if frame.height == 0:
        raise CalibrationError(f"{source}: the recording has no samples")
    check_plausible(frame, source)
    tsdb = TSDB.from_long(frame)
    have = tsdb.nodes
    if nodes is not None:
        missing = [n for n in nodes if n not in have]
        if missing:
            raise CalibrationError(f"{source}: --nodes {','.join(map(str, missing))}: not in "
                                   f"the recording; it has nodes "
                                   f"{','.join(map(str, have)) or '(none)'}")
        keep = set(nodes)
    else:
        keep = set(have)
    targets = [t for t in tsdb.targets if t.node in keep and t.times.size]
    if not targets:
        raise CalibrationError(f"{source}: no scrape target with samples (no per-node series)")
    no_counter = [t.node for t in targets if t.select("requests_total").size == 0]
    if no_counter:
        raise CalibrationError(f"{source}: no requests_total counter for node(s) "
                               f"{','.join(map(str, no_counter))}; calibration needs the "
                               "request counters (requests_total{tier,outcome}) of every node")
    steps = np.concatenate([np.diff(t.times) for t in targets if t.times.size > 1] or
                           [np.zeros(0)])
    if steps.size == 0:
        raise CalibrationError(f"{source}: every node has a single scrape; calibration needs "
                               "at least two per node")
    scrape = float(np.median(steps))
    first = min(float(t.times[0]) for t in targets)
    from_zero = first <= 2 * scrape
    origin = 0.0 if from_zero else max(float(t.times[0]) for t in targets)
    out = []
    for tgt in sorted(targets, key=lambda t: t.node):
        t = tgt.times - origin
        keep_rows = t >= -1e-9
        sub = Target(tgt.node, t[keep_rows], tgt.values[keep_rows], tgt.columns)
        out.append(_node(sub, from_zero))
    rec = Recording(source, origin, scrape, out)
    fleet = tsdb.target(-1)
    if fleet is not None and fleet.times.size:
        t = fleet.times - origin
        rows = t >= -1e-9
        ft = Target(-1, t[rows], fleet.values[rows], fleet.columns)
        if from_zero and ft.times[0] > 0:
            ft = _with_zero(ft)
        rec.fleet_t = ft.times
        rec.client_requests = _requests(ft, "client_requests_total")
        for name in ("hedge_enabled", "degraded_mode", "breaker_state", "retries_total",
                     "hedges_total", "attempts_total", "retries_denied_total"):
            v = _column(ft, name)
            if v is not None:
                rec.fleet[name] = (fill_counter(v) if name.endswith("_total")
                                   else fill_gauge(v))
        for tier in TIERS:
            v = _column(ft, "shedding", tier=tier)
            if v is not None:
                rec.fleet[("shedding", tier)] = fill_gauge(v)
    rec.frame = frame.with_columns(pl.col("time_s") - origin).filter(
        pl.col("time_s") >= -1e-9)
    return rec


def _with_zero(tgt: Target) -> Target:
    """A sample at t = 0 before the first: counters zero (a run starting from nothing)."""
    zero = np.where([c[0].endswith(("_total", "_count", "_sum", "_bucket")) for c in
                     tgt.columns], 0.0, np.nan)
    return Target(tgt.node, np.concatenate([[0.0], tgt.times]),
                  np.vstack([zero[None, :], tgt.values]), tgt.columns)


def _node(tgt: Target, from_zero: bool) -> NodeData:
    if from_zero and tgt.times[0] > 0:
        tgt = _with_zero(tgt)
    nd = NodeData(tgt.node, tgt.times, _requests(tgt, "requests_total"))
    for attr, name in (("busy", "busy_servers"), ("queue", "queue_length"),
                       ("in_flight", "in_flight")):
        v = _column(tgt, name)
        if v is not None:
            setattr(nd, attr, fill_gauge(v))
    for attr, name in (("busy_seconds", "busy_seconds_total"),
                       ("lat_count", "latency_seconds_count"),
                       ("lat_sum", "latency_seconds_sum")):
        v = _column(tgt, name)
        if v is not None:
            setattr(nd, attr, fill_counter(v))
    for attr, name in (("tier_lat_count", "latency_seconds_count"),
                       ("tier_lat_sum", "latency_seconds_sum")):
        cols = [_column(tgt, name, tier=t) for t in TIERS]
        if any(c is not None for c in cols):  # the series carry the tier: each filled
            setattr(nd, attr, np.column_stack([np.zeros(tgt.times.size) if c is None
                                               else fill_counter(c) for c in cols]))
    idx = tgt.select("latency_seconds_bucket")
    if idx.size:
        les = np.array([_le(tgt.columns[i][3]) for i in idx])
        bounds = np.unique(les)
        cum = np.zeros((tgt.times.size, bounds.size))
        for i, le in zip(idx, les, strict=True):
            cum[:, np.searchsorted(bounds, le)] += fill_counter(tgt.values[:, i])
        nd.bounds, nd.buckets = bounds, cum
    return nd
