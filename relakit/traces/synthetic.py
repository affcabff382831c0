"""Synthetic metric traces: an anomaly of a known shape, scraped as Prometheus would.

A trace generated here is what a controller would read if a fleet's request
rate, error ratio and latency followed ``base + (peak - base) * h(t)``, with
``h`` the anomaly's shape (0 before, 1 at its height): ``step``, ``spike``
(of a given width), ``ramp``, ``diurnal`` or ``bursty`` (random on/off
periods, seeded). Counters are exact integrals of their rates, histograms
follow a lognormal latency with the given median, ``in_flight`` is Little's
law, and each target is scraped on its own phase. Because the truth is known,
these traces measure a controller: when it should have acted, and when it did.
"""

from __future__ import annotations

import math

import numpy as np
import polars as pl

SHAPES = ("step", "spike", "ramp", "diurnal", "bursty")
BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def shape_level(shape: str, t, *, at_s: float = 0.0, width_s: float = 10.0,
                end_s: float | None = None, period_s: float = 86400.0,
                on_s: float = 30.0, off_s: float = 120.0, seed: int = 0) -> np.ndarray:
    """h(t) in [0, 1] for each shape (at_s: when it starts)."""
    t = np.asarray(t, dtype=float)
    if shape == "step":
        return (t >= at_s).astype(float)
    if shape == "spike":
        return ((t >= at_s) & (t < at_s + width_s)).astype(float)
    if shape == "ramp":
        end = at_s + width_s if end_s is None else end_s
        return np.clip((t - at_s) / max(end - at_s, 1e-12), 0.0, 1.0)
    if shape == "diurnal":
        return 0.5 - 0.5 * np.cos(2 * math.pi * (t - at_s) / period_s)
    if shape == "bursty":
        rng = np.random.default_rng(seed)
        edges, cur, on = [], at_s, False
        horizon = float(np.max(t)) if t.size else 0.0
        while cur <= horizon:
            dur = rng.exponential(on_s if on else off_s)
            edges.append((cur, cur + dur, on))
            cur += dur
            on = not on
        level = np.zeros_like(t)
        for a, b, is_on in edges:
            if is_on:
                level[(t >= a) & (t < b)] = 1.0
        return level
    raise ValueError(f"unknown shape {shape!r}; shapes are {', '.join(SHAPES)}")


def synthetic_trace(shape: str, duration_s: float, *, scrape_s: float = 15.0,
                    phase_s=0.0, nodes: int = 1, rate_rps=(100.0, 100.0),
                    error_ratio=(0.0, 0.0), latency_ms=(20.0, 20.0), latency_sigma: float = 0.5,
                    buckets_s=BUCKETS_S, resolution_s: float = 0.05, seed: int = 0,
                    **shape_params) -> pl.DataFrame:
    """A long metrics table (relakit's trace schema) for an anomaly of a given shape.

    Pairs are (base, peak); rates and the in-flight gauge are per node.
    ``phase_s``: one phase, a list (one per node) or ``"random"`` (seeded).
    """
    if duration_s <= 0 or scrape_s <= 0 or nodes < 1:
        raise ValueError("duration_s and scrape_s must be > 0 and nodes >= 1")
    grid = np.arange(0.0, duration_s + resolution_s, resolution_s)
    h = shape_level(shape, grid, seed=seed, **shape_params)

    def level(pair):
        lo, hi = pair
        return lo + (hi - lo) * h

    rate, err, median_s = level(rate_rps), level(error_ratio), level(latency_ms) / 1000.0
    # exact integrals of the rates, as cumulative counters (trapezoid on the fine grid)
    def integral(y):
        return np.concatenate([[0.0], np.cumsum((y[1:] + y[:-1]) / 2 * resolution_s)])

    ok_total = integral(rate * (1 - err))
    err_total = integral(rate * err)
    bounds = np.asarray(buckets_s, dtype=float)
    z = (np.log(bounds)[None, :] - np.log(median_s)[:, None]) / (latency_sigma * math.sqrt(2))
    from scipy import special  # (here: scipy costs every importer of relakit.traces ~0.15 s)

    frac = 0.5 * (1 + special.erf(z))  # lognormal CDF at each bound
    bucket_totals = np.column_stack([integral(rate * frac[:, b]) for b in range(bounds.size)])
    mean_s = median_s * math.exp(latency_sigma**2 / 2)
    lat_sum = integral(rate * mean_s)
    if phase_s == "random":
        phases = np.random.default_rng(seed + 1).uniform(0, scrape_s, nodes)
    else:
        phases = np.broadcast_to(np.asarray(phase_s, dtype=float), (nodes,))
    les = [f"{b:g}" for b in bounds] + ["+Inf"]
    frames = []
    for node in range(nodes):
        ts = np.arange(phases[node], duration_s + 1e-9, scrape_s)

        def at(y, ts=ts):  # counters: their exact integral, interpolated between grid points
            return np.interp(ts, grid, y)

        # the gauge is read at the scrape instant itself, so a step shows at the first
        # scrape at or after it, exactly
        h_ts = shape_level(shape, ts, seed=seed, **shape_params)
        gauge = (rate_rps[0] + (rate_rps[1] - rate_rps[0]) * h_ts) * (
            (latency_ms[0] + (latency_ms[1] - latency_ms[0]) * h_ts) / 1000.0
            * math.exp(latency_sigma**2 / 2))
        series = [("requests_total", "gold", "ok", None, at(ok_total)),
                  ("requests_total", "gold", "error", None, at(err_total)),
                  ("latency_seconds_sum", None, None, None, at(lat_sum)),
                  ("latency_seconds_count", None, None, None, at(ok_total + err_total)),
                  ("in_flight", None, None, None, gauge)]
        series += [("latency_seconds_bucket", None, None, le, at(bucket_totals[:, b]))
                   for b, le in enumerate(les[:-1])]
        series.append(("latency_seconds_bucket", None, None, "+Inf", at(ok_total + err_total)))
        for name, tier, outcome, le, values in series:
            frames.append(pl.DataFrame({
                "time_s": ts, "node": np.full(ts.size, node, dtype=np.int32),
                "name": [name] * ts.size, "tier": pl.Series([tier] * ts.size, dtype=pl.String),
                "outcome": pl.Series([outcome] * ts.size, dtype=pl.String),
                "le": pl.Series([le] * ts.size, dtype=pl.String), "value": values,
            }))
    return pl.concat(frames).sort(["time_s", "node", "name"], maintain_order=True)
