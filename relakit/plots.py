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


def heatmap(table: pl.DataFrame, x: str, y: str, color: str, title: str | None = None, *,
            where: dict | None = None, titles: dict[str, str] | None = None) -> alt.Chart:
    """A sweep's outcome over two parameters, one cell per (x, y).

    The filter lives here, not in the caller: ``where`` (column -> value) selects the
    rows and is stated under the title, so a heatmap cannot silently show a slice.
    Cells that hold several rows show their mean, and the subtitle says so. ``titles``
    maps column names to words with units, for the axes and the colour legend.
    """
    titles = titles or {}
    where = where or {}
    for col, value in where.items():
        table = table.filter(pl.col(col) == value)
    if table.height == 0:
        raise ValueError(f"heatmap: no rows where {where}")
    agg = table.group_by(x, y).agg(pl.col(color).mean(), pl.len().alias("points"))
    notes = [f"only {_equals(titles.get(c, c), v)}" for c, v in where.items()]
    per_cell = agg["points"].max()
    if per_cell > 1:
        notes.append(f"mean of {per_cell} points per cell")
    if agg[color].is_null().any() or agg[color].is_nan().any():
        notes.append("blank: never happened")
    head = alt.TitleParams(text=title or titles.get(color, color),
                           subtitle="; ".join(notes) if notes else alt.Undefined)
    cells = alt.Chart(agg).encode(
        x=alt.X(f"{x}:O", title=titles.get(x, x), axis=alt.Axis(grid=False, labelAngle=0)),
        y=alt.Y(f"{y}:O", title=titles.get(y, y), axis=alt.Axis(grid=False),
                sort="descending"))
    rect = cells.mark_rect().encode(
        color=alt.Color(f"{color}:Q", scale=alt.Scale(scheme="viridis"),
                        title=titles.get(color, color),
                        legend=alt.Legend(orient="bottom", direction="horizontal", titleLimit=0,
                                          gradientLength=160)),
        tooltip=[alt.Tooltip(f"{x}:O", title=titles.get(x, x)),
                 alt.Tooltip(f"{y}:O", title=titles.get(y, y)),
                 alt.Tooltip(f"{color}:Q", title=titles.get(color, color), format=".3g")])
    # each cell's value written on it; light text on viridis' dark lower half
    mid = float(agg[color].fill_nan(None).mean() or 0.0)
    text = cells.mark_text(fontSize=11).encode(
        text=alt.Text(f"{color}:Q", format=".3~g"),
        color=alt.condition(alt.datum[color] < mid, alt.value("white"), alt.value("black")))
    return alt.layer(rect, text, title=head).properties(width=alt.Step(48), height=alt.Step(40))


def _equals(title: str, value) -> str:
    """'query window (s)' and 60 -> 'query window = 60 s': a filter as a reader says it."""
    import re

    m = re.fullmatch(r"(.*) \((.+)\)", title)
    shown = f"{value:g}" if isinstance(value, (int, float)) else str(value)
    return f"{m[1]} = {shown} {m[2]}" if m else f"{title} = {shown}"


def export(chart, stem, formats=("png", "svg", "pdf")) -> list[Path]:
    """Write a chart in several formats (offline); returns the files written."""
    stem = Path(stem)
    return [save(chart, stem.with_suffix(f".{fmt}")) for fmt in formats]


def notebook_renderer(static: bool = False) -> None:
    """Charts in notebooks: interactive (JupyterLab renders them offline), or static
    PNG through vl-convert, so an executed copy reads anywhere without a network."""
    alt.renderers.enable("png" if static else "default")


# ---- notebook figures -----------------------------------------------------------------------
# One builder per notebook figure, so the notebooks stay thin and every chart carries
# its titles, units and legend here, where a test can check them.

CLOSED_FORM_COLOR = "#333333"
SIMULATION_COLOR = "#1b6ca8"


def _source_layers(closed: pl.DataFrame, sim: pl.DataFrame, x: alt.X, y: alt.Y,
                   closed_label: str, sim_label: str, color: alt.Color | None,
                   sim_mark: str = "point") -> alt.LayerChart:
    """A closed form as a line and a simulation as points, each with its own legend entry.

    Two sources that share a colour must differ in mark, and the reader must be told
    which mark is which: the line's ``strokeDash`` legend names the closed form, the
    points' ``shape`` legend names the simulation.
    """
    closed = closed.with_columns(pl.lit(closed_label).alias("source"))
    sim = sim.with_columns(pl.lit(sim_label).alias("source"))
    legend = alt.Legend(labelLimit=0, symbolStrokeWidth=2)
    dash = alt.StrokeDash("source:N", title=None, legend=legend,
                          scale=alt.Scale(domain=[closed_label], range=[[1, 0]]))
    shape = alt.Shape("source:N", title=None, legend=legend,
                      scale=alt.Scale(domain=[sim_label], range=["circle"]))
    line = alt.Chart(closed).mark_line(strokeWidth=2, invalid="break-paths-show-domains").encode(
        x=x, y=y, strokeDash=dash)
    if sim_mark == "step":
        # an empirical distribution: a step line, told apart by its dash and colour
        dash = alt.StrokeDash("source:N", title=None, legend=legend,
                              scale=alt.Scale(domain=[sim_label], range=[[6, 3]]))
        marks = alt.Chart(sim).mark_line(interpolate="step-after", strokeWidth=2).encode(
            x=x, y=y, strokeDash=dash)
    else:
        marks = alt.Chart(sim).mark_point(size=70, filled=True, opacity=0.9).encode(
            x=x, y=y, shape=shape)
    if color is None:
        line = line.encode(color=alt.value(CLOSED_FORM_COLOR))
        marks = marks.encode(color=alt.value(SIMULATION_COLOR))
    else:
        line = line.encode(color=color)
        marks = marks.encode(color=color)
    return alt.layer(line, marks).resolve_scale(strokeDash="independent", shape="independent")


def fanout_figure(fanout: pl.DataFrame, per_call_success: float) -> alt.HConcatChart:
    """Notebook 01: success and p99 of an all-of-n request, closed form beside simulation.

    ``fanout`` has one row per width: ``width``, ``closed_form``, ``simulated``,
    ``p99_ms``, ``p99_closed_form_ms``.
    """
    widths = sorted(fanout["width"].to_list())
    x = alt.X("width:Q", title="calls per request, n (log scale)",
              scale=alt.Scale(type="log", domain=[widths[0], widths[-1]], nice=False),
              axis=alt.Axis(values=widths, format="d"))
    success = _source_layers(
        fanout.select("width", pl.col("closed_form").alias("success")),
        fanout.select("width", pl.col("simulated").alias("success")),
        x, alt.Y("success:Q", title="requests that succeed (share)",
                 axis=alt.Axis(format="%"), scale=alt.Scale(zero=False)),
        f"closed form: {per_call_success:g}ⁿ", "simulation", None,
    ).properties(title=f"Success when all n calls must succeed ({per_call_success:.1%} each)",
                 width=300, height=240)
    tail = _source_layers(
        fanout.select("width", pl.col("p99_closed_form_ms").alias("p99_ms")),
        fanout.select("width", "p99_ms"),
        x, alt.Y("p99_ms:Q", title="p99 response time (ms)"),
        "closed form: p99 of the slowest of n exponentials", "simulation", None,
    ).properties(title="Tail at scale: p99 of the slowest call (10 ms mean)",
                 width=300, height=240)
    return alt.hconcat(success, tail, spacing=40).resolve_scale(
        strokeDash="independent", shape="independent").resolve_legend(
        strokeDash="independent", shape="independent")


QUANTILE_LABELS = {"p50": "p50", "p99": "p99", "p999": "p99.9"}


def queueing_tails(tails: pl.DataFrame, servers: int) -> alt.LayerChart:
    """Notebook 02: M/M/c response-time quantiles against utilisation, Erlang C vs simulation.

    ``tails`` is long: ``utilisation``, ``quantile`` (p50/p99/p999), ``simulated_ms``,
    ``erlang_c_ms``.
    """
    t = tails.with_columns(pl.col("quantile").replace_strict(QUANTILE_LABELS))
    both = pl.concat([t["simulated_ms"], t["erlang_c_ms"]])
    lo, hi = both.min(), both.max()
    order = list(QUANTILE_LABELS.values())
    color = alt.Color("quantile:N", title="quantile", sort=order,
                      scale=alt.Scale(domain=order, range=["#1b6ca8", "#edae49", "#d1495b"]))
    return _source_layers(
        t.select("utilisation", "quantile", pl.col("erlang_c_ms").alias("ms")),
        t.select("utilisation", "quantile", pl.col("simulated_ms").alias("ms")),
        alt.X("utilisation:Q", title="utilisation ρ (share of capacity busy)",
              axis=alt.Axis(format="%"), scale=alt.Scale(zero=False)),
        alt.Y("ms:Q", title="response time (ms, log scale)", scale=alt.Scale(
            type="log", nice=False, domain=[0.8 * lo, 1.25 * hi])),
        "closed form (Erlang C)", "simulation", color,
    ).properties(title=f"M/M/{servers}, 1 ms mean service: response-time quantiles",
                 width=420, height=280)


HEDGE_LABELS = {"off": "no hedging", "never": "hedge, loser never cancelled",
                "queued": "hedge, loser cancelled while queued",
                "started": "hedge, loser cancelled even in service"}


def hedging_collapse(hedging: pl.DataFrame, subtitle: str | None = None) -> alt.LayerChart:
    """Notebook 02: p99 per hedging policy at low load and near saturation (log scale).

    ``hedging`` has ``load`` (offered load as a share of capacity), ``hedging`` (off or
    the cancel policy) and ``p99_ms``. A line joins each policy's two loads, so a
    policy whose p99 explodes near saturation stands out as a steep slope.
    """
    order = [k for k in HEDGE_LABELS if k in set(hedging["hedging"])]
    labels = [HEDGE_LABELS[k] for k in order]
    h = hedging.with_columns(pl.col("hedging").replace_strict(HEDGE_LABELS).alias("policy"))
    base = alt.Chart(h).encode(
        x=alt.X("load:Q", title="offered load (share of capacity)",
                axis=alt.Axis(format="%", values=sorted(set(h["load"]))),
                scale=alt.Scale(domain=[0, 1])),
        y=alt.Y("p99_ms:Q", scale=alt.Scale(type="log"), title="p99 response time (ms, log scale)"),
        color=alt.Color("policy:N", title="hedging", sort=labels,
                        scale=alt.Scale(domain=labels, range=["#333333", "#d1495b",
                                                               "#edae49", "#66a182"][:len(labels)]),
                        legend=alt.Legend(direction="vertical", labelLimit=0)),
        tooltip=["policy:N", alt.Tooltip("load:Q", format=".0%"),
                 alt.Tooltip("p99_ms:Q", format=",.0f")])
    lines = base.mark_line(point=alt.OverlayMarkDef(size=60, filled=True))
    label = alt.Text("p99_ms:Q", format=",.0f")
    low = float(h["load"].min())  # labels left of the lowest load, right of the others
    left = base.mark_text(align="right", dx=-8, fontSize=11).encode(text=label).transform_filter(
        alt.datum.load == low)
    right = base.mark_text(align="left", dx=8, fontSize=11).encode(text=label).transform_filter(
        alt.datum.load != low)
    title = alt.TitleParams("Hedging helps at low load; near saturation only if the loser is "
                            "cancelled", subtitle=subtitle or alt.Undefined)
    return alt.layer(lines, left, right).properties(title=title, width=420, height=280)


def step_delay_cdf(closed: pl.DataFrame, replayed: pl.DataFrame, title: str) -> alt.LayerChart:
    """Notebook 03: the delay from a step to its actuation, closed form beside replays.

    ``closed`` holds ``delay_s`` and ``cdf`` on a grid; ``replayed`` the sorted delays
    of the replays and their empirical CDF.
    """
    return _source_layers(
        closed, replayed,
        alt.X("delay_s:Q", title="delay from the step to actuation (s)"),
        alt.Y("cdf:Q", title="share of trials acted on by then", axis=alt.Axis(format="%")),
        "closed form (sum of uniforms)", f"controller replayed ({replayed.height} random phases)",
        None, sim_mark="step",
    ).properties(title=title, width=420, height=260)


def ok_share_over_time(shares: pl.DataFrame, bin_s: float = 1.0,
                       title: str | None = None) -> alt.Chart:
    """Notebook 07: the share of requests answered ok per time bin, one line per source.

    ``shares`` has ``source``, ``t`` (bin start, s) and ``ok_share``. Bins with no
    request become nulls, so the line breaks there instead of bridging the gap.
    """
    grid = pl.DataFrame({"t": np.arange(shares["t"].min(), shares["t"].max() + bin_s, bin_s)})
    full = pl.concat([grid.with_columns(pl.lit(s).alias("source")).join(
        shares.filter(pl.col("source") == s).select("t", "ok_share"), on="t", how="left")
        for s in sorted(shares["source"].unique())])
    sources = sorted(shares["source"].unique())
    dashes = [[1, 0], [6, 3], [2, 2]][:len(sources)]
    return alt.Chart(full, title=title or "Share of requests answered ok").mark_line(
        strokeWidth=2, invalid="break-paths-show-domains").encode(
        x=alt.X("t:Q", title=f"time since the start of the run (s, {bin_s:g} s bins)"),
        y=alt.Y("ok_share:Q", title="requests answered ok (share)", axis=alt.Axis(format="%")),
        color=alt.Color("source:N", title=None, scale=alt.Scale(
            domain=sources, range=[SIMULATION_COLOR, "#d1495b", "#66a182"][:len(sources)])),
        strokeDash=alt.StrokeDash("source:N", title=None,
                                  scale=alt.Scale(domain=sources, range=dashes)),
        tooltip=["source:N", "t:Q", alt.Tooltip("ok_share:Q", format=".1%")],
    ).properties(width=560, height=240)
