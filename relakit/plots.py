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
