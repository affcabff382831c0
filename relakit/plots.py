"""Altair chart builders and offline figure export.

Charts are built from small, pre-aggregated polars frames (a few hundred
rows), never from raw per-request tables, so they stay under altair's
5,000-row limit however long the run. Export goes through vl-convert, which
renders PNG/SVG/PDF in-process with no browser and no network.
"""

from __future__ import annotations

from pathlib import Path

import altair as alt
import numpy as np
import polars as pl

from relakit.io import atomic_write

THEME = "relakit"


@alt.theme.register(THEME, enable=True)
def _theme() -> alt.theme.ThemeConfig:
    return {
        "config": {
            "view": {"continuousWidth": 420, "continuousHeight": 280, "stroke": None},
            "font": "DejaVu Sans",
            "axis": {"labelFontSize": 11, "titleFontSize": 12, "grid": True,
                     "gridColor": "#e6e6e6"},
            "legend": {"labelFontSize": 11, "titleFontSize": 12, "orient": "bottom"},
            "title": {"fontSize": 14, "anchor": "start"},
            "range": {"category": ["#1b6ca8", "#d1495b", "#edae49", "#66a182", "#7b5ea7"]},
        }
    }


def latency_ccdf_frame(latency_ms: np.ndarray, points: int = 200) -> pl.DataFrame:
    """P(latency > x) on log-spaced x: a few hundred rows whatever the sample size."""
    lat = np.sort(np.asarray(latency_ms, dtype=float))
    lat = lat[lat > 0]
    if lat.size == 0:
        return pl.DataFrame({"latency_ms": [], "exceedance": []})
    lo = max(lat[int(0.001 * (lat.size - 1))], lat[-1] * 1e-4)  # skip the empty far-left decades
    xs = np.geomspace(lo, lat[-1], points)
    sf = 1.0 - np.searchsorted(lat, xs, side="right") / lat.size
    keep = sf > 0
    return pl.DataFrame({"latency_ms": xs[keep], "exceedance": sf[keep]})


def latency_ccdf(curves: dict[str, pl.DataFrame], title: str = "Response time") -> alt.Chart:
    """Exceedance curves on log–log axes, one colour per named curve."""
    frames = [df.with_columns(pl.lit(name).alias("source")) for name, df in curves.items()]
    data = pl.concat(frames)
    return (
        alt.Chart(data, title=title)
        .mark_line(strokeWidth=2)
        .encode(
            x=alt.X("latency_ms:Q", scale=alt.Scale(type="log"), title="latency (ms)"),
            y=alt.Y("exceedance:Q", scale=alt.Scale(type="log"), title="P(latency > x)"),
            color=alt.Color("source:N", title=None,
                            legend=alt.Legend(orient="bottom-left", direction="vertical")),
            strokeDash=alt.StrokeDash("source:N", legend=None),
            tooltip=["source:N", alt.Tooltip("latency_ms:Q", format=".2f"),
                     alt.Tooltip("exceedance:Q", format=".2e")],
        )
        .interactive()
    )


def save(chart: alt.TopLevelMixin, path, scale: float = 2.0) -> Path:
    """Write a chart as PNG, SVG or PDF (by suffix), offline and atomically."""
    import vl_convert as vlc

    path = Path(path)
    spec = chart.to_json()
    suffix = path.suffix.lower()
    if suffix == ".png":
        data = vlc.vegalite_to_png(spec, scale=scale)
    elif suffix == ".svg":
        data = vlc.vegalite_to_svg(spec).encode()
    elif suffix == ".pdf":
        data = vlc.vegalite_to_pdf(spec)
    else:
        raise ValueError(f"{path}: unsupported figure type {suffix!r}; use .png, .svg or .pdf")

    def write(tmp):
        Path(tmp).write_bytes(data)

    return atomic_write(path, write)


# ---- the standard views of a run ------------------------------------------------------------
OUTCOME_COLORS = {"ok": "#66a182", "error": "#d1495b", "timeout": "#edae49", "dropped": "#8d8d8d"}
TIER_COLORS = {"gold": "#c9a227", "silver": "#7f8c8d", "bronze": "#a0522d"}


def latency_over_time(requests: pl.DataFrame, bin_s: float = 10.0,
                      quantiles=(0.5, 0.99)) -> alt.Chart:
    """p50/p99 latency of successful requests per tier, in time bins."""
    ok = requests.filter(pl.col("outcome") == "ok").with_columns(
        (pl.col("arrival_s") // bin_s * bin_s).alias("time_s"))
    agg = ok.group_by("time_s", "tier").agg(
        [pl.col("latency_ms").quantile(q).alias(f"p{int(q * 1000) / 10:g}") for q in quantiles])
    long = agg.unpivot(index=["time_s", "tier"], variable_name="quantile",
                       value_name="latency_ms").sort("time_s")
    return (alt.Chart(long, title="Latency of successful requests")
            .mark_line().encode(
                x=alt.X("time_s:Q", title="time (s)"),
                y=alt.Y("latency_ms:Q", scale=alt.Scale(type="log"), title="latency (ms)"),
                color=alt.Color("tier:N", scale=alt.Scale(domain=list(TIER_COLORS),
                                                          range=list(TIER_COLORS.values()))),
                strokeDash=alt.StrokeDash("quantile:N"),
                tooltip=["time_s:Q", "tier:N", "quantile:N",
                         alt.Tooltip("latency_ms:Q", format=".1f")])
            .properties(height=200).interactive(bind_y=False))


def outcome_shares(requests: pl.DataFrame, bin_s: float = 10.0, by_tier: bool = True):
    """Share of each outcome over time (drops apart from errors), per tier."""
    keys = ["time_s", "tier"] if by_tier else ["time_s"]
    binned = requests.with_columns((pl.col("arrival_s") // bin_s * bin_s).alias("time_s"))
    counts = binned.group_by([*keys, "outcome"]).len().with_columns(
        (pl.col("len") / pl.col("len").sum().over(keys)).alias("share")).sort("time_s")
    chart = alt.Chart(counts).mark_area().encode(
        x=alt.X("time_s:Q", title="time (s)"),
        y=alt.Y("share:Q", stack="normalize", title="share", axis=alt.Axis(format="%")),
        color=alt.Color("outcome:N", scale=alt.Scale(domain=list(OUTCOME_COLORS),
                                                     range=list(OUTCOME_COLORS.values()))),
        tooltip=["time_s:Q", "outcome:N", alt.Tooltip("share:Q", format=".1%")])
    if by_tier:
        return chart.properties(width=200, height=120).facet(
            column=alt.Column("tier:N", sort=list(TIER_COLORS)), title="Outcomes by tier")
    return chart.properties(title="Outcomes", height=150)


def mode_timeline(timeline: pl.DataFrame) -> alt.Chart:
    """The control plane's mode at each evaluation, as coloured spans."""
    t = timeline.select("time_s", "mode").with_columns(
        pl.col("time_s").shift(-1).fill_null(pl.col("time_s").max()).alias("end_s"))
    spans = t.with_columns((pl.col("mode") != pl.col("mode").shift(1)).fill_null(True)
                           .cum_sum().alias("run")).group_by("run", "mode").agg(
        pl.col("time_s").min().alias("start_s"), pl.col("end_s").max()).sort("start_s")
    return (alt.Chart(spans, title="Mode").mark_bar(height=18).encode(
        x=alt.X("start_s:Q", title="time (s)"), x2="end_s:Q",
        y=alt.Y("mode:N", title=None),
        color=alt.Color("mode:N", legend=None),
        tooltip=["mode:N", "start_s:Q", "end_s:Q"]).properties(height=90))


def audit_events(decisions: pl.DataFrame, holds: bool = False) -> alt.Chart:
    """Each decision as a tick on the timeline, its reason in the tooltip."""
    d = decisions if holds else decisions.filter(pl.col("action") != "hold")
    d = d.select("decided_at_s", "effective_at_s", "stage", "action", "target", "reason")
    return (alt.Chart(d, title="Decisions").mark_tick(thickness=2, size=14).encode(
        x=alt.X("decided_at_s:Q", title="time (s)"),
        y=alt.Y("stage:N", title=None),
        color=alt.Color("action:N"),
        tooltip=["decided_at_s:Q", "effective_at_s:Q", "stage:N", "action:N", "target:N",
                 "reason:N"]).properties(height=120))


def run_dashboard(result, bin_s: float = 10.0) -> alt.VConcatChart:
    """Latency, outcomes, mode timeline and decisions of one run, on one time axis."""
    parts = [latency_over_time(result.requests, bin_s),
             outcome_shares(result.requests, bin_s, by_tier=False)]
    if result.timeline is not None and "mode" in result.timeline.columns:
        parts.append(mode_timeline(result.timeline))
    if result.decisions is not None and result.decisions.height:
        parts.append(audit_events(result.decisions))
    return alt.vconcat(*parts).resolve_scale(color="independent")


def heatmap(table: pl.DataFrame, x: str, y: str, color: str, title: str | None = None):
    """A sweep's outcome over two parameters (one cell per point, means over repeats)."""
    agg = table.group_by(x, y).agg(pl.col(color).mean())
    return (alt.Chart(agg, title=title or color).mark_rect().encode(
        x=alt.X(f"{x}:O", title=x, axis=alt.Axis(grid=False)),
        y=alt.Y(f"{y}:O", title=y, axis=alt.Axis(grid=False)),
        color=alt.Color(f"{color}:Q", scale=alt.Scale(scheme="viridis")),
        tooltip=[f"{x}:O", f"{y}:O", alt.Tooltip(f"{color}:Q", format=".3g")]))


def export(chart, stem, formats=("png", "svg", "pdf")) -> list[Path]:
    """Write a chart in several formats (offline); returns the files written."""
    stem = Path(stem)
    return [save(chart, stem.with_suffix(f".{fmt}")) for fmt in formats]


def notebook_renderer(static: bool = False) -> None:
    """Charts in notebooks: interactive (JupyterLab renders them offline), or static
    PNG through vl-convert, so an executed copy reads anywhere without a network."""
    alt.renderers.enable("png" if static else "default")
