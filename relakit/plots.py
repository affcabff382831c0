"""Altair chart builders and offline figure export.

Charts are built from small, pre-aggregated polars frames (a few hundred
rows), never from raw per-request tables, so they stay under altair's
5,000-row limit however long the run. Export goes through vl-convert, which
renders PNG/SVG/PDF in-process with no browser and no network.

One theme (registered once, on import) and one set of palettes serve every
chart the project draws, so a colour means one thing everywhere: outcomes,
tiers, control-plane modes (and the chain's stress levels) and generic series
each have their own colours, and no two share one. The frame builders
(``*_frame``) are public so tests can check what a chart is fed: lines carry
nulls at empty bins (Vega-Lite breaks a line at a null instead of bridging the
gap), stacked shares are imputed so every bin sums to 1.
"""

from __future__ import annotations

import math
from pathlib import Path

import altair as alt
import numpy as np
import polars as pl

from relakit.io import atomic_write
from relakit.vocab import IN_PATH_OUTCOMES

THEME = "relakit"
FORMATS = ("png", "svg", "pdf")

# ---- colours: ONE table, meaning -> colour ----------------------------------------------------
#: every colour a chart of relakit's draws, by what it means; the names below are views of
#: it and no builder writes a colour of its own (tests/test_plot_colours.py reads every
#: builder's spec against this table). Red is for errors only: the error outcome and a
#: closed form outside a simulation's interval (a result in error).
PALETTE = {
    # throttled (by its own client) and rejected (by a server's own admission control):
    # the in-path mechanisms' outcomes (issue 33), drawn only where a run has them
    "outcome": {"ok": "#59a14f", "error": "#e15759", "timeout": "#f28e2b", "dropped": "#bab0ac",
                "throttled": "#9c755f", "rejected": "#b07aa1"},
    "tier": {"gold": "#c9a227", "silver": "#6b7b8c", "bronze": "#8c564b"},
    # the policy's modes (RelA's) and the chain's stress levels; "normal" means the same in both
    "mode": {"normal": "#dce6f0", "performance": "#4e79a7", "survival": "#7b3294",
             "elevated": "#f1b6da", "critical": "#de77ae", "catastrophic": "#8e0152"},
    # modes a custom policy names: still none of the colours above
    "mode_extra": ("#9ecae1", "#3f007d", "#c2a5cf", "#08519c", "#6baed6"),
    # generic series (curves, runs compared, zones, decision actions): the theme's category range
    "series": ("#263c5a", "#17becf", "#bcbd22", "#76b7b2", "#000000", "#9467bd", "#637939"),
    # a closed form against a simulation; the ring on a closed form outside its interval
    "source": {"closed form": "#333333", "simulation": "#1b6ca8", "mismatch": "#ff1f1f"},
    # a simulation's quantiles (p50, p99, p99.9) and the sources a run is compared with
    "quantile": ("#1b6ca8", "#edae49", "#2a9d8f"),
    "compared": ("#1b6ca8", "#b15928", "#66a182"),
    # notebook 02's hedging policies: no hedging first (black: the reference)
    "hedging": ("#333333", "#b15928", "#edae49", "#66a182"),
    "alert": {"pending": "#fdd0a2", "firing": "#d94801"},
    "lease": {"leader": "#2c7fb8", "down": "#fdae6b"},
    "search": {"trial": "#bab0ac", "Pareto front": "#263c5a", "incumbent": "#000000"},
    "slice": {"canary": "#17becf", "rest": "#263c5a"},
    # a model's line drawn over a simulated map (the CTMC's 50 % recovery boundary)
    "boundary": {"CTMC": "#00bfff"},
    # a paired difference's verdict against a baseline (notebook 11; "not significant" is
    # neutral's), and who wins a cell of the in-path / control-plane frontier
    "verdict": {"better": "#1b7837", "worse": "#b35806"},
    "winner": {"in the path": "#01665e", "in a control plane": "#542788"},
    # what is not data: a reference (baseline, zero line), notes and their rules, shading
    "neutral": {"reference": "#000000", "note": "#555555", "grid": "#e6e6e6",
                "outage": "#e0e0e0", "shade": "#bdbdbd", "not significant": "#8c8c8c",
                "legend fill": "#d9d9d9", "veil": "#ffffff", "text dark": "#000000",
                "text light": "#ffffff"},
}
#: the colours that mean an error (every other colour of PALETTE is not red)
ERROR_COLORS = (PALETTE["outcome"]["error"], PALETTE["source"]["mismatch"])
OUTCOME_COLORS = PALETTE["outcome"]
TIER_COLORS = PALETTE["tier"]
MODE_COLORS = PALETTE["mode"]
MODE_EXTRA = PALETTE["mode_extra"]
CATEGORY = PALETTE["series"]
NEUTRAL = PALETTE["neutral"]


@alt.theme.register(THEME, enable=True)
def _theme() -> alt.theme.ThemeConfig:
    return {
        "config": {
            "view": {"continuousWidth": 420, "continuousHeight": 280, "stroke": None},
            "font": "DejaVu Sans",
            "axis": {"labelFontSize": 11, "titleFontSize": 12, "grid": True,
                     "gridColor": NEUTRAL["grid"]},
            "legend": {"labelFontSize": 11, "titleFontSize": 12, "orient": "right"},
            "title": {"fontSize": 14, "anchor": "start", "subtitleFontSize": 11,
                      "subtitleColor": NEUTRAL["note"]},
            "range": {"category": list(CATEGORY)},
        }
    }


def _scale(colors: dict, present=None) -> alt.Scale:
    """A colour scale pinned to a palette (only the entries present, in palette order)."""
    keys = [k for k in colors if present is None or k in set(present)]
    return alt.Scale(domain=keys, range=[colors[k] for k in keys])


def mode_colors(modes) -> dict:
    """Colours for these modes: the palette's, then MODE_EXTRA for names it lacks."""
    extra = iter(MODE_EXTRA * (1 + len(modes) // len(MODE_EXTRA)))
    return {m: MODE_COLORS[m] if m in MODE_COLORS else next(extra) for m in modes}


def _time_x(field: str, domain=None, title: str = "time (s)") -> alt.X:
    scale = alt.Scale(domain=list(domain), nice=False) if domain is not None else alt.Undefined
    return alt.X(f"{field}:Q", title=title, scale=scale)


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


def latency_ccdf(curves: dict[str, pl.DataFrame], title: str = "Response time",
                 subtitle: str | None = None, colors: dict | None = None) -> alt.Chart:
    """Exceedance curves on log–log axes: each named curve its own colour and dash, in
    one legend, so two curves stay apart even printed in grey. Curves named after
    tiers take the tier colours; ``colors`` pins others."""
    frames = [df.with_columns(pl.lit(name).alias("source")) for name, df in curves.items()]
    data = pl.concat(frames)
    names = list(curves)
    if colors is None:
        colors = (TIER_COLORS if set(names) <= set(TIER_COLORS) else
                  dict(zip(names, (list(CATEGORY) * 3)[:len(names)], strict=True)))
    dashes = [[1, 0], [6, 3], [2, 2], [8, 2, 2, 2], [4, 4], [1, 3]]
    return (
        alt.Chart(data, title=alt.Title(title, subtitle=subtitle or alt.Undefined))
        .mark_line(strokeWidth=2)
        .encode(
            x=alt.X("latency_ms:Q", scale=alt.Scale(type="log"), title="response time (ms)",
                    axis=alt.Axis(values=[10.0 ** k for k in range(-2, 7)], format=",~g")),
            y=alt.Y("exceedance:Q", scale=alt.Scale(type="log"),
                    title="share of requests slower (P(latency > x))"),
            color=alt.Color("source:N", title=None, sort=names,
                            scale=alt.Scale(domain=names, range=[colors[n] for n in names]),
                            legend=alt.Legend(orient="bottom-left", direction="vertical",
                                              symbolStrokeWidth=3, symbolSize=300)),
            strokeDash=alt.StrokeDash("source:N", sort=names, title=None,
                                      scale=alt.Scale(domain=names,
                                                      range=(dashes * 3)[:len(names)])),
            tooltip=[alt.Tooltip("source:N", title="curve"),
                     alt.Tooltip("latency_ms:Q", format=".2f", title="latency (ms)"),
                     alt.Tooltip("exceedance:Q", format=".2e", title="P(latency > x)")],
        )
        .interactive()
    )


def render(chart: alt.TopLevelMixin, fmt: str, scale: float = 2.0) -> bytes:
    """A chart as PNG, SVG or PDF bytes, offline."""
    import vl_convert as vlc

    spec = chart.to_json()
    if fmt == "png":
        return vlc.vegalite_to_png(spec, scale=scale)
    if fmt == "svg":
        return vlc.vegalite_to_svg(spec).encode()
    if fmt == "pdf":
        return vlc.vegalite_to_pdf(spec)
    raise ValueError(f"unsupported figure type {fmt!r}; use one of {', '.join(FORMATS)}")


def check_formats(formats) -> tuple[str, ...]:
    """The formats as a tuple, or ValueError naming the first one not allowed."""
    out = tuple(f.strip().lower().lstrip(".") for f in formats)
    for f in out:
        if f not in FORMATS:
            raise ValueError(f"unsupported figure format {f!r}; allowed: {', '.join(FORMATS)}")
    if not out:
        raise ValueError(f"no figure format given; allowed: {', '.join(FORMATS)}")
    return out


def save(chart: alt.TopLevelMixin, path, scale: float = 2.0) -> Path:
    """Write a chart as PNG, SVG or PDF (by suffix), offline and atomically."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix.lstrip(".") not in FORMATS:
        raise ValueError(f"{path}: unsupported figure type {suffix!r}; use .png, .svg or .pdf")
    data = render(chart, suffix.lstrip("."), scale)

    def write(tmp):
        Path(tmp).write_bytes(data)

    return atomic_write(path, write)


def export(chart, stem, formats=FORMATS) -> list[Path]:
    """Write a chart in several formats (offline); returns the files written.

    Every format is checked, then rendered, before the first file is written: a
    bad format or a failed render leaves nothing behind.
    """
    stem = Path(stem)
    fmts = check_formats(formats)
    data = {f: render(chart, f) for f in fmts}
    written = []
    for f in fmts:
        def write(tmp, blob=data[f]):
            Path(tmp).write_bytes(blob)

        written.append(atomic_write(stem.with_suffix(f".{f}"), write))
    return written


# ---- the standard views of a run ------------------------------------------------------------
TIERS = tuple(TIER_COLORS)
OUTCOMES = tuple(OUTCOME_COLORS)
PANEL_WIDTH = 560


def _bin_starts(duration_s: float, bin_s: float) -> np.ndarray:
    return np.arange(0.0, duration_s, bin_s)


def _span(result) -> float:
    """The run's length: its own record, else the last time any table mentions."""
    d = (result.info or {}).get("duration_s") if hasattr(result, "info") else None
    if d:
        return float(d)
    ends = [0.0]
    if result.requests is not None and result.requests.height:
        ends.append(float(result.requests["arrival_s"].max()))
    if result.metrics is not None and result.metrics.height:
        ends.append(float(result.metrics["time_s"].max()))
    return max(ends)


def request_counts(requests: pl.DataFrame, bin_s: float) -> pl.DataFrame:
    """Requests per (time bin, tier, outcome), by arrival time. Columns time_s (bin
    start), tier, outcome, n."""
    return (requests.with_columns((pl.col("arrival_s") // bin_s * bin_s).alias("time_s"))
            .group_by("time_s", "tier", "outcome").agg(pl.len().cast(pl.Int64).alias("n")))


def metric_counts(metrics: pl.DataFrame, bin_s: float) -> pl.DataFrame:
    """The same counts from the clients' counters (``client_requests_total``, node -1),
    for a run kept without per-request records: increments per sample, summed per bin.
    A request counts when its client saw the outcome, not when it arrived."""
    c = (metrics.filter((pl.col("name") == "client_requests_total") & (pl.col("node") == -1))
         .sort("time_s")
         .with_columns((pl.col("value") - pl.col("value").shift(1).over("tier", "outcome")
                        .fill_null(0.0)).alias("inc"))
         # an increment counts (previous sample, t]: a sample at exactly k*bin closes bin k-1
         .with_columns(((pl.col("time_s") - 1e-9) // bin_s * bin_s).clip(0.0).alias("time_s")))
    return c.group_by("time_s", "tier", "outcome").agg(
        pl.col("inc").sum().round(0).cast(pl.Int64).alias("n"))


def run_counts(result, bin_s: float) -> tuple[pl.DataFrame, str, float]:
    """Counts per bin from the requests table when kept, else from the metrics, and the
    bin they were counted in. A counter's increments arrive on its sample grid, so from
    metrics the bin is a whole number of sample intervals: 15 s samples in 10 s bins put
    one or two samples in a bin, and the offered-load panel showed 1.5x the load or none
    (16,000 req/s for a ramp that never passed 10,400)."""
    if result.requests is not None:
        return request_counts(result.requests, bin_s), "requests", bin_s
    if result.metrics is not None and result.metrics.height:
        bin_s = on_sample_grid(result.metrics, bin_s)
        return metric_counts(result.metrics, bin_s), "metrics", bin_s
    raise ValueError("the run has neither per-request records nor metrics to count")


def on_sample_grid(metrics: pl.DataFrame, bin_s: float) -> float:
    """The smallest whole number of the clients' sample intervals at least ``bin_s``."""
    t = np.unique(metrics.filter(pl.col("node") == -1)["time_s"].to_numpy())
    step = float(np.median(np.diff(t))) if t.size > 2 else bin_s
    return step * max(1, math.ceil(bin_s / step - 1e-9))


def offered_load_frame(counts: pl.DataFrame, bin_s: float, duration_s: float) -> pl.DataFrame:
    """Requests per second per tier in each bin; a bin with none is 0 (no arrivals is
    a measurement, not a gap). A last row at the run's end closes the step."""
    grid = pl.DataFrame({"time_s": _bin_starts(duration_s, bin_s)}).join(
        pl.DataFrame({"tier": list(TIERS)}), how="cross")
    per = counts.group_by("time_s", "tier").agg(pl.col("n").sum())
    df = (grid.join(per, on=["time_s", "tier"], how="left")
          .with_columns((pl.col("n").fill_null(0) / bin_s).alias("rate_rps")).drop("n"))
    last = df.filter(pl.col("time_s") == df["time_s"].max()).with_columns(
        pl.lit(float(duration_s)).alias("time_s"))
    return pl.concat([df, last]).sort("time_s", "tier")


def offered_load_subtitle(source: str, bin_s: float, closed: bool = False) -> str:
    """What the offered-load panel counts: arrivals (open), requests the clients sent
    (a closed population), or the clients' counters (no per-request records)."""
    if source != "requests":
        return f"from the clients' counters (requests answered per second), {bin_s:g} s bins"
    return f"{'requests sent' if closed else 'arrivals'} per second, {bin_s:g} s bins"


def offered_load(counts: pl.DataFrame, bin_s: float, duration_s: float,
                 source: str = "requests", domain=None,
                 subtitle: str | list[str] | None = None) -> alt.Chart:
    """Offered load over time, stacked by tier (the top edge is the total); ``subtitle``
    (a line or lines) replaces :func:`offered_load_subtitle`'s for an open run."""
    df = offered_load_frame(counts, bin_s, duration_s)
    sub = offered_load_subtitle(source, bin_s) if subtitle is None else subtitle
    return (alt.Chart(df, title=alt.Title("Offered load", subtitle=sub))
            .mark_area(interpolate="step-after", opacity=0.9).encode(
                x=_time_x("time_s", domain or (0, duration_s)),
                y=alt.Y("rate_rps:Q", stack="zero", title="requests per second"),
                color=alt.Color("tier:N", title="tier", scale=_scale(TIER_COLORS),
                                sort=list(TIERS)),
                order=alt.Order("tier_order:Q"),
                tooltip=[alt.Tooltip("time_s:Q", title="bin start (s)"), "tier:N",
                         alt.Tooltip("rate_rps:Q", format=",.0f", title="requests/s")])
            .transform_calculate(tier_order=f"indexof({list(TIERS)!r}, datum.tier)")
            .properties(width=PANEL_WIDTH, height=130))


def latency_frame(requests: pl.DataFrame, bin_s: float = 10.0, quantiles=(0.5, 0.99),
                  duration_s: float | None = None) -> pl.DataFrame:
    """Latency quantiles of successful requests per (bin, tier), at bin centres, with
    a null wherever a bin has no successful request (so the line breaks there)."""
    ok = requests.filter(pl.col("outcome") == "ok").with_columns(
        (pl.col("arrival_s") // bin_s * bin_s).alias("start"))
    names = [f"p{q * 100:g}" for q in quantiles]
    agg = ok.group_by("start", "tier").agg(
        [pl.col("latency_ms").quantile(q, interpolation="linear").alias(n)
         for q, n in zip(quantiles, names, strict=True)])
    if duration_s is None:
        duration_s = float(requests["arrival_s"].max()) + bin_s if requests.height else bin_s
    tiers = [t for t in TIERS if t in set(requests["tier"].unique().to_list())] or list(TIERS)
    grid = pl.DataFrame({"start": _bin_starts(duration_s, bin_s)}).join(
        pl.DataFrame({"tier": tiers}), how="cross")
    return (grid.join(agg, on=["start", "tier"], how="left")
            .unpivot(index=["start", "tier"], variable_name="quantile", value_name="latency_ms")
            .with_columns((pl.col("start") + bin_s / 2).alias("time_s"))
            .drop("start").sort("quantile", "tier", "time_s"))


def latency_over_time(requests: pl.DataFrame, bin_s: float = 10.0, quantiles=(0.5, 0.99),
                      domain=None) -> alt.Chart:
    """p50/p99 latency of successful requests per tier, in time bins; a bin with no
    successful request breaks the line instead of being bridged."""
    duration = domain[1] if domain is not None else None
    long = latency_frame(requests, bin_s, quantiles, duration)
    names = [f"p{q * 100:g}" for q in quantiles]
    # the range the data has, with room above its top: vega-lite's own log domain ended
    # at the decade the p99 reached (999 ms against a 1,000 ms deadline), so the line
    # ran into the frame's edge and read as leaving it
    ms = long["latency_ms"].drop_nulls().filter(long["latency_ms"].drop_nulls() > 0)
    y_domain = ([10.0 ** math.floor(math.log10(ms.min())), 1.5 * ms.max()]
                if ms.len() else alt.Undefined)
    dashes = [[1, 0], [5, 3], [1, 2], [8, 2, 2, 2]]
    return (alt.Chart(long, title=alt.Title(
                "Latency of successful requests",
                subtitle=f"quantiles per {bin_s:g} s bin; gaps: no successful request; tiers "
                         "sharing one queue overlap (gold widest, bronze thinnest)"))
            .mark_line(invalid="break-paths-show-domains").encode(
                x=_time_x("time_s", domain),
                y=alt.Y("latency_ms:Q", scale=alt.Scale(type="log", domain=y_domain,
                                                        nice=False),
                        title="latency (ms, log scale)"),
                color=alt.Color("tier:N", title="tier", scale=_scale(TIER_COLORS),
                                sort=list(TIERS)),
                strokeDash=alt.StrokeDash("quantile:N", title="quantile", sort=names,
                                          scale=alt.Scale(domain=names,
                                                          range=dashes[:len(names)])),
                # tiers often overlap (one queue serves all): gold widest, drawn first,
                # so each stays visible as an outline around the next
                strokeWidth=alt.StrokeWidth("tier:N", title="tier", sort=list(TIERS),
                                            scale=alt.Scale(domain=list(TIERS),
                                                            range=[5.0, 3.0, 1.4])),
                order=alt.Order("tier_order:Q"),
                detail="quantile:N",
                tooltip=[alt.Tooltip("time_s:Q", title="bin centre (s)"), "tier:N",
                         "quantile:N", alt.Tooltip("latency_ms:Q", format=".1f",
                                                   title="latency (ms)")])
            .transform_calculate(tier_order=f"indexof({list(TIERS)!r}, datum.tier)")
            .properties(width=PANEL_WIDTH, height=170))


def outcome_share_frame(counts: pl.DataFrame, by_tier: bool = True,
                        end_s: float | None = None, bin_s: float | None = None) -> pl.DataFrame:
    """Each outcome's share of the requests in its bin, every outcome present in every
    bin that has any request (0 where none), so the stacked shares sum to exactly 1.

    With ``end_s`` and ``bin_s`` a copy of the last bin at the run's end closes the
    step-after area.
    """
    keys = ["time_s", "tier"] if by_tier else ["time_s"]
    per = counts.group_by([*keys, "outcome"]).agg(pl.col("n").sum())
    present = per.group_by(keys).agg(pl.col("n").sum().alias("total")).filter(
        pl.col("total") > 0)
    seen = set(per["outcome"].to_list())  # the in-path outcomes only where a run has them
    shown = [o for o in OUTCOMES if o not in IN_PATH_OUTCOMES or o in seen]
    grid = present.join(pl.DataFrame({"outcome": shown}), how="cross")
    df = (grid.join(per, on=[*keys, "outcome"], how="left")
          .with_columns(pl.col("n").fill_null(0))
          .with_columns((pl.col("n") / pl.col("total")).alias("share"))
          .drop("total").sort(*keys, "outcome"))
    if end_s is not None and df.height:
        last = df.filter(pl.col("time_s") == df["time_s"].max())
        if float(last["time_s"][0]) < end_s:
            df = pl.concat([df, last.with_columns(pl.lit(float(end_s)).alias("time_s"))])
    return df


def outcome_shares(requests: pl.DataFrame | None, bin_s: float = 10.0, by_tier: bool = True,
                   domain=None, counts: pl.DataFrame | None = None, source: str = "requests"):
    """Share of each outcome over time (drops apart from errors), per tier or overall.

    Give the requests table, or ``counts`` (:func:`run_counts`) for a run kept
    without per-request records.
    """
    if counts is None:
        counts = request_counts(requests, bin_s)
    end = domain[1] if domain is not None else None
    data = outcome_share_frame(counts, by_tier, end, bin_s)
    sub = (f"share of requests arriving in each {bin_s:g} s bin" if source == "requests" else
           f"share of the outcomes clients saw in each {bin_s:g} s bin")
    chart = alt.Chart(data).mark_area(interpolate="step-after").encode(
        x=_time_x("time_s", domain),
        y=alt.Y("share:Q", stack="normalize", title="share of requests",
                axis=alt.Axis(format="%")),
        color=alt.Color("outcome:N", title="outcome", scale=_scale(OUTCOME_COLORS),
                        sort=list(OUTCOMES)),
        order=alt.Order("outcome_order:Q"),
        tooltip=[alt.Tooltip("time_s:Q", title="bin start (s)"), "outcome:N",
                 alt.Tooltip("n:Q", title="requests"),
                 alt.Tooltip("share:Q", format=".1%")]).transform_calculate(
        outcome_order=f"indexof({list(OUTCOMES)!r}, datum.outcome)")
    if by_tier:
        return chart.properties(width=200, height=120).facet(
            column=alt.Column("tier:N", sort=list(TIERS), title=None),
            title=alt.Title("Outcomes by tier", subtitle=sub))
    return chart.properties(title=alt.Title("Outcomes", subtitle=sub), width=PANEL_WIDTH,
                            height=130)


def mode_spans(timeline: pl.DataFrame, column: str = "mode",
               end_s: float | None = None) -> pl.DataFrame:
    """Runs of one mode as spans [start_s, end_s): a mode holds from its evaluation to
    the next one; the last holds to ``end_s`` (the run's end) when given."""
    t = timeline.select("time_s", pl.col(column).alias("mode")).sort("time_s")
    if t.height == 0:
        return pl.DataFrame(schema={"mode": pl.String, "start_s": pl.Float64,
                                    "end_s": pl.Float64})
    step = float(t["time_s"].diff().median() or 0.0) if t.height > 1 else 0.0
    last = end_s if end_s is not None else float(t["time_s"].max()) + step
    t = t.with_columns(pl.col("time_s").shift(-1).fill_null(last).alias("end_s"))
    return (t.with_columns((pl.col("mode") != pl.col("mode").shift(1)).fill_null(True)
                           .cum_sum().alias("run"))
            .group_by("run", "mode").agg(pl.col("time_s").min().alias("start_s"),
                                         pl.col("end_s").max())
            .sort("start_s").drop("run"))


def mode_timeline(timeline: pl.DataFrame, column: str = "mode", domain=None,
                  title: str | None = None) -> alt.Chart:
    """The control plane's mode (or the chain's stress level, ``column="stress"``) at
    each evaluation, as coloured spans; mode colours are their own palette."""
    end = domain[1] if domain is not None else None
    spans = mode_spans(timeline, column, end)
    present = spans["mode"].unique().to_list()
    order = [m for m in MODE_COLORS if m in present] + sorted(
        m for m in present if m not in MODE_COLORS)
    colors = mode_colors(order)
    if title is None:
        title = "Mode of the control plane" if column == "mode" else "Chain stress level"
    return (alt.Chart(spans, title=alt.Title(title, subtitle="held from one evaluation to "
                                                             "the next"))
            .mark_bar(height=16).encode(
                x=_time_x("start_s", domain), x2="end_s:Q",
                y=alt.Y("mode:N", title=None, sort=order),
                color=alt.Color("mode:N", title="mode" if column == "mode" else "stress",
                                scale=alt.Scale(domain=order, range=[colors[m] for m in order]),
                                legend=None),
                tooltip=["mode:N", alt.Tooltip("start_s:Q", title="from (s)"),
                         alt.Tooltip("end_s:Q", title="to (s)")])
            .properties(width=PANEL_WIDTH, height=24 * max(len(order), 1) + 10))


def audit_events(decisions: pl.DataFrame, holds: bool = False, domain=None) -> alt.Chart:
    """Each decision as a mark on the timeline: one row per action (the axis names it),
    coloured by the stage that decided; its reason is in the tooltip."""
    d = decisions if holds else decisions.filter(pl.col("action") != "hold")
    d = d.select("decided_at_s", "effective_at_s", "stage", "action", "target", "reason")
    actions = sorted(d["action"].unique().to_list())
    title = alt.Title("Decisions", subtitle="each change, by action (holds not shown)"
                      if not holds else "each evaluation's decision, by action")
    return (alt.Chart(d, title=title).mark_point(filled=True, size=60, opacity=0.8).encode(
                x=_time_x("decided_at_s", domain, "time decided (s)"),
                y=alt.Y("action:N", title=None, sort=actions),
                color=alt.Color("stage:N", title="decided by"),
                tooltip=[alt.Tooltip("decided_at_s:Q", title="decided (s)"),
                         alt.Tooltip("effective_at_s:Q", title="effective (s)"), "stage:N",
                         "action:N", "target:N", "reason:N"])
            .properties(width=PANEL_WIDTH, height=20 * max(len(actions), 1) + 10))


def run_dashboard(result, bin_s: float = 10.0) -> alt.VConcatChart:
    """Offered load, latency, outcomes, mode (and chain stress) and decisions of one
    run, stacked on one shared time axis from 0 to the run's end.

    Works from whatever the run kept: without per-request records the load and
    outcome panels come from the clients' counters and the latency panel is left
    out (the subtitle says so).
    """
    duration = _span(result)
    domain = (0.0, duration)
    counts, source, bin_s = run_counts(result, bin_s)
    clients = (result.info or {}).get("clients")
    sub = [offered_load_subtitle(source, bin_s, closed=bool(clients))]
    left = (result.info or {}).get("in_flight_at_end") or 0
    if left:  # counted when answered: the last bins miss those still in flight
        sub.append(f"the last bin leaves out the {left:,} requests still in flight at the end")
    if clients:  # a closed population: the load is what the clients sent, an outcome
        sub.append(f"{clients['population']} closed clients ({clients['by_tier']}): the load "
                   "they offer is an outcome of the run, not an input (it falls as latency "
                   "rises)")
    parts = [offered_load(counts, bin_s, duration, source, domain,
                          subtitle=sub[0] if len(sub) == 1 else sub)]
    if result.requests is not None:
        parts.append(latency_over_time(result.requests, bin_s, domain=domain))
    parts.append(outcome_shares(None, bin_s, by_tier=False, domain=domain, counts=counts,
                                source=source))
    tl = result.timeline
    if tl is not None and "mode" in tl.columns:
        parts.append(mode_timeline(tl, "mode", domain))
    if tl is not None and "stress" in tl.columns:
        parts.append(mode_timeline(tl, "stress", domain))
    if result.decisions is not None and result.decisions.filter(
            pl.col("action") != "hold").height:
        parts.append(audit_events(result.decisions, domain=domain))
    name = (result.info or {}).get("scenario", "run")
    note = ("" if result.requests is not None else
            "; no per-request records (--no-requests): latency per tier not drawn")
    return (alt.vconcat(*parts, spacing=18, title=alt.Title(
                f"{name}: one run, {duration:g} s", offset=12,
                subtitle=f"all panels share the time axis{note}"))
            .properties(padding={"top": 8, "left": 8, "right": 8, "bottom": 8})
            .resolve_scale(x="shared", color="independent", strokeDash="independent",
                           strokeWidth="independent")
            .resolve_legend(color="independent"))


def outcome_shares_by_run(runs: dict[str, pl.DataFrame], bin_s: float = 10.0, domain=None,
                          band: tuple[float, float] | None = None, band_label: str = "",
                          title: str = "Outcomes", subtitle: str | None = None):
    """Several runs' outcome shares side by side, one column per run, on shared axes;
    ``band`` shades an interval (e.g. a load spike) in every column."""
    cols = []
    for name, requests in runs.items():
        dom = domain or (0.0, float(requests["arrival_s"].max()))
        area = outcome_shares(requests, bin_s, by_tier=False, domain=dom).properties(
            title=alt.Title(name, fontSize=12), width=230, height=150)
        layers = [area]
        if band is not None:
            shade = pl.DataFrame({"start_s": [band[0]], "end_s": [band[1]],
                                  "label": [band_label]})
            layers.append(alt.Chart(shade).mark_rect(fill="none", stroke=NEUTRAL["reference"],
                                                     strokeDash=[4, 3], strokeWidth=1.2)
                          .encode(x="start_s:Q", x2="end_s:Q",
                                  tooltip=[alt.Tooltip("label:N", title="interval")]))
            layers.append(alt.Chart(shade).mark_text(dy=-6, baseline="bottom", fontSize=10)
                          .encode(x=alt.X("start_s:Q"), y=alt.value(0), text="label:N"))
        cols.append(alt.layer(*layers))
    sub = subtitle or f"share of requests arriving in each {bin_s:g} s bin"
    return (alt.hconcat(*cols, spacing=12, title=alt.Title(title, subtitle=sub, offset=8))
            .resolve_scale(x="shared", y="shared"))


def _series_colors(names: list[str], colors: dict[str, str] | None) -> list[str]:
    """One colour per series name: pinned ones from ``colors``, the rest the series colours
    in order (skipping those already pinned)."""
    pinned = colors or {}
    unknown = sorted(set(pinned) - set(names))
    if unknown:
        raise ValueError(f"colors: no series named {unknown} (the series are {names})")
    free = iter([c for c in list(CATEGORY) * 3 if c not in pinned.values()])
    return [pinned[n] if n in pinned else next(free) for n in names]


def compare_series(frame: pl.DataFrame, x: str, y: str, series: str, *, title: str,
                   x_title: str, y_title: str, subtitle: str | None = None, domain=None,
                   interpolate: str = "linear", rules: dict[str, float] | None = None,
                   height: int = 200, colors: dict[str, str] | None = None):
    """A few named series as lines on one chart, each its own colour and dash (so they
    stay apart in grey too); ``rules`` marks labelled instants (e.g. a fault's start).
    ``colors`` pins a series' colour by name (a closed form and a simulation take
    ``CLOSED_FORM_COLOR`` and ``SIMULATION_COLOR``); the others take the series colours.
    Nulls in ``y`` break the lines."""
    names = list(dict.fromkeys(frame[series].to_list()))
    palette = _series_colors(names, colors)
    dashes = [[1, 0], [6, 3], [2, 2], [8, 2, 2, 2], [4, 4], [1, 3]]
    base = alt.Chart(frame).mark_line(interpolate=interpolate, strokeWidth=2,
                                      invalid="break-paths-show-domains").encode(
        x=_time_x(x, domain, x_title),
        y=alt.Y(f"{y}:Q", title=y_title),
        color=alt.Color(f"{series}:N", title=None, sort=names,
                        scale=alt.Scale(domain=names, range=palette)),
        strokeDash=alt.StrokeDash(f"{series}:N", title=None, sort=names,
                                  scale=alt.Scale(domain=names,
                                                  range=(dashes * 3)[:len(names)])),
        tooltip=[f"{series}:N", alt.Tooltip(f"{x}:Q", title=x_title),
                 alt.Tooltip(f"{y}:Q", title=y_title, format=".3g")])
    layers = [base]
    if rules:
        r = pl.DataFrame({"at": list(rules.values()), "label": list(rules)})
        layers.append(alt.Chart(r).mark_rule(color=NEUTRAL["note"], strokeDash=[2, 2]).encode(
            x="at:Q", tooltip=["label:N", alt.Tooltip("at:Q", title=x_title)]))
        layers.append(alt.Chart(r).mark_text(align="left", dx=3, dy=4, baseline="top",
                                             fontSize=10, color=NEUTRAL["note"])
                      .encode(x="at:Q", y=alt.value(0), text="label:N"))
    return alt.layer(*layers, title=alt.Title(title, subtitle=subtitle or alt.Undefined)
                     ).properties(width=PANEL_WIDTH, height=height)


NOT_SIGNIFICANT = "n.s.: no significant difference from the baseline (paired 95 % interval)"
BASELINE = "baseline: the cell the others are compared with"
SIGNIFICANCE_COLORS = {BASELINE: NEUTRAL["reference"], NOT_SIGNIFICANT: NEUTRAL["not significant"]}


def heatmap(table: pl.DataFrame, x: str, y: str, color: str, title: str | None = None, *,
            where: dict | None = None, titles: dict[str, str] | None = None,
            significant: str | None = None) -> alt.LayerChart:
    """A sweep's outcome over two parameters, one cell per (x, y).

    The filter lives here, not in the caller: ``where`` (column -> value) selects the
    rows and is stated under the title, so a heatmap cannot silently show a slice.
    Cells that hold several rows show their mean, and the subtitle says so. ``titles``
    maps column names to words with units, for the axes and the colour legend.

    A replicated sweep's table (:func:`relakit.sweep.combine`) carries ``<color>_ci``:
    each cell then shows ``value ± half-width``. With a baseline it carries
    ``<color>_significant`` (or name the boolean column with ``significant``): a cell
    whose paired difference from the baseline is not significant is greyed, outlined
    in dashes and marked "n.s.", the baseline cell outlined in black, both in a
    legend. Marks need one point per cell; a cell averaging several says so instead.
    """
    titles = titles or {}
    where = where or {}
    for col, value in where.items():
        table = table.filter(pl.col(col) == value)
    if table.height == 0:
        raise ValueError(f"heatmap: no rows where {where}")
    ci = f"{color}_ci" if f"{color}_ci" in table.columns else None
    sig = significant or (f"{color}_significant" if f"{color}_significant" in table.columns
                          else None)
    if sig is not None and sig not in table.columns:
        raise ValueError(f"heatmap: no column {sig!r} to mark significance with")
    extra = [pl.col(c).first() for c in (ci, sig) if c is not None]
    if sig is not None and {"point_id", "baseline_id"} <= set(table.columns):
        extra.append((pl.col("point_id") == pl.col("baseline_id")).any().alias("is_baseline"))
    agg = table.group_by(x, y).agg(pl.col(color).mean(), pl.len().alias("points"), *extra)
    notes = [f"only {_equals(titles.get(c, c), v)}" for c, v in where.items()]
    per_cell = agg["points"].max()
    if per_cell > 1:
        notes.append(f"mean of {per_cell} points per cell")
        if ci or sig:
            notes.append("intervals and significance not shown (several points per cell)")
        ci = sig = None
    if agg[color].is_null().any() or agg[color].is_nan().any():
        notes.append("blank: never happened")
    if ci is not None:
        reps = _interval_note(table, "±")
        notes.append(reps or "±: 95 % interval")
    head = alt.TitleParams(text=title or titles.get(color, color),
                           subtitle="; ".join(notes) if notes else alt.Undefined)
    label = pl.col(color).map_elements(_fmt3, return_dtype=pl.String)
    if ci is not None:
        # the half-width to the value's own decimals: 15.1 ±0.7, 1.05 ±0.00
        label = pl.concat_str([label, pl.lit("\n±"), pl.struct(color, ci).map_elements(
            lambda r: _fmt_like(r[ci], r[color]), return_dtype=pl.String)], ignore_nulls=True)
    agg = agg.with_columns(label.alias("label"))
    cells = alt.Chart(agg).encode(
        x=alt.X(f"{x}:O", title=titles.get(x, x), axis=alt.Axis(grid=False, labelAngle=0)),
        y=alt.Y(f"{y}:O", title=titles.get(y, y), axis=alt.Axis(grid=False),
                sort="descending"))
    tips = [alt.Tooltip(f"{x}:O", title=titles.get(x, x)),
            alt.Tooltip(f"{y}:O", title=titles.get(y, y)),
            alt.Tooltip(f"{color}:Q", title=titles.get(color, color), format=".3g")]
    if ci is not None:
        tips.append(alt.Tooltip(f"{ci}:Q", title="± (95 % half-width)", format=".3g"))
    rect = cells.mark_rect().encode(
        color=alt.Color(f"{color}:Q", scale=alt.Scale(scheme="viridis"),
                        title=titles.get(color, color),
                        legend=alt.Legend(orient="bottom", direction="horizontal", titleLimit=0,
                                          gradientLength=160)),
        tooltip=tips)
    # each cell's value written on it; light text on viridis' dark lower half
    mid = float(agg[color].fill_nan(None).mean() or 0.0)
    text = cells.mark_text(fontSize=11 if ci is None else 10, lineBreak="\n").encode(
        text=alt.Text("label:N"),
        color=alt.condition(alt.datum[color] < mid, alt.value(NEUTRAL["text light"]),
                            alt.value(NEUTRAL["text dark"])))
    layers = [rect]
    if sig is not None:
        kind = (pl.when(pl.col("is_baseline") if "is_baseline" in agg.columns else pl.lit(False))
                .then(pl.lit(BASELINE))
                .when(pl.col(sig) == False).then(pl.lit(NOT_SIGNIFICANT))  # noqa: E712
                .otherwise(None))
        marked = agg.with_columns(kind.alias("mark")).filter(pl.col("mark").is_not_null())
        present = [k for k in SIGNIFICANCE_COLORS if k in set(marked["mark"])]
        if present:
            outline = alt.Stroke("mark:N", title=None, scale=_scale(SIGNIFICANCE_COLORS, present),
                                 legend=alt.Legend(orient="bottom", direction="vertical",
                                                   labelLimit=0, symbolType="square",
                                                   symbolFillColor=NEUTRAL["legend fill"]))
            mcells = cells.properties(data=marked)
            grey = mcells.mark_rect(fill=NEUTRAL["veil"], fillOpacity=0.55, strokeWidth=2.5).encode(
                stroke=outline,
                strokeDash=alt.condition(alt.datum.mark == NOT_SIGNIFICANT,
                                         alt.value([4, 3]), alt.value([1, 0])))
            # the white veil on the baseline too would hide its colour: only n.s. cells
            grey = grey.encode(fillOpacity=alt.condition(alt.datum.mark == NOT_SIGNIFICANT,
                                                         alt.value(0.55), alt.value(0.0)))
            tag = mcells.transform_filter(alt.datum.mark == NOT_SIGNIFICANT).mark_text(
                fontSize=9, dy=-14 if ci is None else -17, fontWeight="bold",
                color=PALETTE["source"]["closed form"]).encode(text=alt.value("n.s."))
            layers += [grey, tag]
            text = text.encode(color=alt.condition(
                (alt.datum[color] < mid) & (alt.datum[sig] != False),  # noqa: E712
                alt.value(NEUTRAL["text light"]), alt.value(NEUTRAL["text dark"])))
            text = text.properties(data=agg.with_columns(pl.col(sig).fill_null(True)))
    layers.insert(1, text) if len(layers) == 1 else layers.insert(2, text)
    width = 48 if ci is None else 62
    return alt.layer(*layers, title=head).properties(width=alt.Step(width),
                                                     height=alt.Step(40 if ci is None else 46))


def _fmt3(v) -> str | None:
    """Three significant digits, as the cells write their values (``.3~g``)."""
    if v is None or v != v:
        return None
    return f"{v:.3g}"


def _fmt_like(h, v) -> str | None:
    """``h`` with as many decimals as ``v`` shows at three significant digits (9 ±2,
    15.1 ±0.7, 1.05 ±0.00): a half-width finer than the value's last digit is noise."""
    if h is None or h != h or v is None or v != v:
        return None
    shown = f"{v:.3g}"
    d = len(shown.split(".")[1]) if "." in shown and "e" not in shown else 0
    return f"{h:.{d}f}"


def _equals(title: str, value) -> str:
    """'query window (s)' and 60 -> 'query window = 60 s': a filter as a reader says it."""
    import re

    m = re.fullmatch(r"(.*) \((.+)\)", title)
    shown = f"{value:g}" if isinstance(value, (int, float)) else str(value)
    return f"{m[1]} = {shown} {m[2]}" if m else f"{title} = {shown}"


def notebook_renderer(static: bool = False) -> None:
    """Charts in notebooks, with no request to any host but the Jupyter server.

    Interactive (tooltips, zoom, selections): altair's chart widget, whose JavaScript
    (vega, vega-lite and vega-embed, the versions altair emits) is bundled by
    vl-convert and shipped by the kernel (:func:`offline_widget_js`), so JupyterLab
    and Notebook 7 draw it without the CDN that altair's default renderer loads.
    Static: PNG through vl-convert, so an executed copy reads anywhere.
    Why this and not a pin or an extension: ``docs/design.md``, "Charts in notebooks"."""
    if static:
        alt.renderers.enable("png")
        return
    offline_widget_js()
    alt.renderers.enable(WIDGET_RENDERER)


WIDGET_RENDERER = "relakit-widget"


def _widget_renderer(spec: dict, **metadata):
    """altair's chart widget given the spec itself. altair's own ``jupyter`` renderer
    rebuilds the chart from the spec first (``Chart.from_dict``), 1.6 s for a run
    dashboard against 0.09-0.15 s here; the widget needs the chart object only to hand
    selections back to Python, which a displayed chart does not (an explicit
    ``alt.JupyterChart(chart)`` still does, offline too). Zoom, tooltips and selections
    run in the browser either way."""
    widget = alt.JupyterChart(None, embed_options=metadata.get("embed_options"))
    widget.spec = spec
    return widget._repr_mimebundle_()


alt.renderers.register(WIDGET_RENDERER, _widget_renderer)


def offline_widget_js() -> Path | None:
    """The chart widget's JavaScript bundle, made once per set of versions and kept.

    vl-convert bundles it in 15-17 s on this machine (every kernel would pay that at
    its first chart); the file, named by the altair, vl-convert and vega-lite versions,
    lives in the environment's ``share/relakit`` (``make setup`` makes it), else in
    ``~/.cache/relakit``. Loading it installs it as altair's offline widget code."""
    import sys

    import vl_convert as vlc
    from altair.utils._importers import vl_version_for_vl_convert

    name = f"altair-{alt.__version__}-vlc-{vlc.__version__}-{vl_version_for_vl_convert()}.js"
    places = [Path(sys.prefix) / "share" / "relakit", Path.home() / ".cache" / "relakit"]
    for path in (d / name for d in places):
        if path.is_file():
            alt.JupyterChart._esm = path.read_text()
            alt.JupyterChart._is_offline = True  # what enable_offline(True) sets
            return path
    alt.JupyterChart.enable_offline(True)
    src = alt.JupyterChart._esm
    for path in (d / name for d in places):
        try:
            return atomic_write(path, lambda tmp: Path(tmp).write_text(src))
        except OSError:  # a read-only environment: the next place
            continue
    return None  # nowhere to keep it: this process has it all the same


# ---- notebook figures -----------------------------------------------------------------------
# One builder per notebook figure, so the notebooks stay thin and every chart carries
# its titles, units and legend here, where a test can check them.

CLOSED_FORM_COLOR = PALETTE["source"]["closed form"]
SIMULATION_COLOR = PALETTE["source"]["simulation"]
# a simulated value whose 95 % interval misses the closed form: a ring in this colour
FLAG_COLOR = PALETTE["source"]["mismatch"]
FLAG_LABEL = "closed form outside 95 % interval"
FLAGS_KEY = "closed_form_outside"  # where a figure lists its flagged points (usermeta)


def outside_interval(frame: pl.DataFrame, value: str, ci: str, closed: str) -> pl.Series:
    """True where the closed form lies outside ``value ± ci`` (the 95 % interval of a
    simulated mean); False where it lies inside, or where there is no interval (one
    replication: nothing to test against). The one rule every figure and notebook
    assert uses, so a figure flags exactly what a notebook checks."""
    v, h, c = (frame[k].cast(pl.Float64).fill_nan(None) for k in (value, ci, closed))
    return ((v - c).abs() > h).fill_null(False).alias("outside")


def flagged(chart) -> list[dict]:
    """The points a figure flagged (closed form outside the simulated interval), as the
    builder recorded them in the chart's ``usermeta``: notebooks assert on this."""
    meta = chart.to_dict().get("usermeta") or {}
    return list(meta.get(FLAGS_KEY, []))


def _interval_note(frame: pl.DataFrame, what: str = "bars", widest: str | None = None,
                   fmt: str = ".3g", unit: str = "") -> str | None:
    """'bars: 95 % intervals over 5 replications', from a ``replications`` column; with
    ``widest`` (a ``_ci`` column) also the widest half-width, so a reader knows the
    size of bars too short to see beside their marks."""
    if "replications" not in frame.columns or frame.height == 0:
        return None
    n = sorted(set(int(x) for x in frame["replications"].drop_nulls()))
    if not n or n == [1]:
        return None
    count = f"{n[0]}" if len(n) == 1 else f"{n[0]}-{n[-1]}"
    note = f"{what}: 95 % intervals over {count} replications (Student t)"
    if widest is not None and widest in frame.columns:
        w = frame[widest].cast(pl.Float64).fill_nan(None).max()
        if w is not None:
            note += f"; widest ±{w:{fmt}}{unit} (bars shorter than a dot are hidden by it)"
    return note


def _source_layers(closed: pl.DataFrame, sim: pl.DataFrame, x: alt.X, y: alt.Y,
                   closed_label: str, sim_label: str, color: alt.Color | None,
                   sim_mark: str = "point", *, field: str | None = None
                   ) -> tuple[alt.LayerChart, list[dict]]:
    """A closed form as a line and a simulation as points, each with its own legend entry;
    returns the layers and the simulated points flagged.

    Two sources that share a colour must differ in mark, and the reader must be told
    which mark is which: the line's ``strokeDash`` legend names the closed form, the
    points' ``shape`` legend names the simulation. When ``sim`` has ``ci`` (the 95 %
    half-width of ``field``) each point gets its error bar; when it also has
    ``closed`` (the closed form at that point), a point whose interval misses it gets
    a red ring with its own legend entry, and is listed in the return value.
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
    bars = rings = None
    flags: list[dict] = []
    if field is not None and "ci" in sim.columns:
        low = pl.col(field) - pl.col("ci")
        if y.to_dict().get("scale", {}).get("type") == "log":  # a bar cannot reach 0
            low = pl.max_horizontal(low, pl.col(field) * 1e-3)
        iv = sim.with_columns(low.alias("ci_low"), (pl.col(field) + pl.col("ci")).alias(
            "ci_high")).filter(pl.col("ci").is_not_null() & pl.col("ci").is_not_nan())
        ybar = alt.Y("ci_low:Q", title=y.to_dict().get("title", alt.Undefined),
                     scale=y.to_dict().get("scale", alt.Undefined))
        bars = alt.Chart(iv).mark_errorbar(ticks=True, thickness=1.6).encode(
            x=x, y=ybar, y2="ci_high:Q")
        if "closed" in sim.columns:
            out = iv.filter(outside_interval(iv, field, "ci", "closed"))
            flags = out.drop("source", "ci_low", "ci_high").to_dicts()
            if out.height:
                ring = alt.Stroke("flag:N", title=None, legend=legend, scale=alt.Scale(
                    domain=[FLAG_LABEL], range=[FLAG_COLOR]))
                rings = alt.Chart(out.with_columns(pl.lit(FLAG_LABEL).alias("flag"))).mark_point(
                    size=420, filled=False, strokeWidth=2.5).encode(x=x, y=y, stroke=ring)
    if color is None:
        line = line.encode(color=alt.value(CLOSED_FORM_COLOR))
        marks = marks.encode(color=alt.value(SIMULATION_COLOR))
        bars = bars.encode(color=alt.value(SIMULATION_COLOR)) if bars is not None else None
    else:
        line = line.encode(color=color)
        marks = marks.encode(color=color)
        bars = bars.encode(color=color) if bars is not None else None
    layers = [line] + [b for b in (bars,) if b is not None] + [marks] + (
        [rings] if rings is not None else [])
    return alt.layer(*layers).resolve_scale(strokeDash="independent", shape="independent",
                                            stroke="independent"), flags


def _ci_col(frame: pl.DataFrame, name: str) -> list:
    """``name_ci`` as ``ci`` when the frame has it (nothing otherwise)."""
    return [pl.col(f"{name}_ci").alias("ci")] if f"{name}_ci" in frame.columns else []


def fanout_figure(fanout: pl.DataFrame, per_call_success: float) -> alt.HConcatChart:
    """Notebook 01: success and p99 of an all-of-n request, closed form beside simulation.

    ``fanout`` has one row per width: ``width``, ``closed_form``, ``simulated``,
    ``p99_ms``, ``p99_closed_form_ms``; with replications also ``simulated_ci``,
    ``p99_ms_ci`` (95 % half-widths) and ``replications``: error bars, and a red
    ring on a point whose interval misses its closed form (:func:`flagged` lists them,
    with ``panel``).
    """
    widths = sorted(fanout["width"].to_list())
    x = alt.X("width:Q", title="calls per request, n (log scale)",
              scale=alt.Scale(type="log", domain=[widths[0], widths[-1]], nice=False),
              axis=alt.Axis(values=widths, format="d"))
    success, f1 = _source_layers(
        fanout.select("width", pl.col("closed_form").alias("success")),
        fanout.select("width", pl.col("simulated").alias("success"),
                      pl.col("closed_form").alias("closed"), *_ci_col(fanout, "simulated")),
        x, alt.Y("success:Q", title="requests that succeed (share)",
                 axis=alt.Axis(format="%"), scale=alt.Scale(zero=False)),
        f"closed form: {per_call_success:g}ⁿ", "simulation", None, field="success")
    success = success.properties(title=alt.Title(
        f"Success when all n calls must succeed ({per_call_success:.1%} each)",
        subtitle=_interval_note(fanout, widest="simulated_ci", fmt=".2%") or alt.Undefined),
        width=300, height=240)
    tail, f2 = _source_layers(
        fanout.select("width", pl.col("p99_closed_form_ms").alias("p99_ms")),
        fanout.select("width", "p99_ms", pl.col("p99_closed_form_ms").alias("closed"),
                      *_ci_col(fanout, "p99_ms")),
        x, alt.Y("p99_ms:Q", title="p99 response time (ms)", scale=alt.Scale(zero=False)),
        "closed form: p99 of the slowest of n exponentials", "simulation", None,
        field="p99_ms")
    tail = tail.properties(title=alt.Title(
        "Tail at scale: p99 of the slowest call (10 ms mean)",
        subtitle=_interval_note(fanout, widest="p99_ms_ci", fmt=".2g", unit=" ms")
        or alt.Undefined),
        width=300, height=240)
    flags = ([{"panel": "success", **r} for r in f1] + [{"panel": "p99", **r} for r in f2])
    return alt.hconcat(success, tail, spacing=40).resolve_scale(
        strokeDash="independent", shape="independent", stroke="independent").resolve_legend(
        strokeDash="independent", shape="independent", stroke="independent").properties(
        usermeta={FLAGS_KEY: flags})


QUANTILE_LABELS = {"p50": "p50", "p99": "p99", "p999": "p99.9"}


def queueing_tails(tails: pl.DataFrame, servers: int) -> alt.LayerChart:
    """Notebook 02: M/M/c response-time quantiles against utilisation, Erlang C vs simulation.

    ``tails`` is long: ``utilisation``, ``quantile`` (p50/p99/p999), ``simulated_ms``,
    ``erlang_c_ms``; with replications ``simulated_ms_ci`` and ``replications`` too:
    error bars, and a red ring where Erlang C lies outside the interval
    (:func:`flagged` lists those rows).
    """
    t = tails.with_columns(pl.col("quantile").replace_strict(QUANTILE_LABELS))
    both = pl.concat([t["simulated_ms"], t["erlang_c_ms"]])
    if "simulated_ms_ci" in t.columns:
        both = pl.concat([both, (t["simulated_ms"] + t["simulated_ms_ci"].fill_nan(0)
                                 ).fill_null(t["simulated_ms"])])
    lo, hi = both.min(), both.max()
    order = list(QUANTILE_LABELS.values())
    color = alt.Color("quantile:N", title="quantile", sort=order,
                      scale=alt.Scale(domain=order, range=list(PALETTE["quantile"][:len(order)])))
    layers, flags = _source_layers(
        t.select("utilisation", "quantile", pl.col("erlang_c_ms").alias("ms")),
        t.select("utilisation", "quantile", pl.col("simulated_ms").alias("ms"),
                 pl.col("erlang_c_ms").alias("closed"), *_ci_col(t, "simulated_ms")),
        alt.X("utilisation:Q", title="utilisation ρ (share of capacity busy)",
              axis=alt.Axis(format="%"), scale=alt.Scale(zero=False)),
        alt.Y("ms:Q", title="response time (ms, log scale)", scale=alt.Scale(
            type="log", nice=False, domain=[0.8 * lo, 1.25 * hi])),
        "closed form (Erlang C)", "simulation", color, field="ms")
    note = _interval_note(tails, widest="simulated_ms_ci", fmt=".2g", unit=" ms")
    return layers.properties(title=alt.Title(
        f"M/M/{servers}, 1 ms mean service: response-time quantiles",
        subtitle=note or alt.Undefined), width=420, height=280, usermeta={FLAGS_KEY: flags})


HEDGE_LABELS = {"off": "no hedging", "never": "hedge, loser never cancelled",
                "queued": "hedge, loser cancelled while queued",
                "started": "hedge, loser cancelled even in service"}


def hedging_verdict(hedging: pl.DataFrame) -> str:
    """The hedging chart's title, read from its data: which hedging policies have a lower
    p99 than no hedging at the lowest and at the highest load (beyond the intervals, when
    the frame has them). A fixed title once said "only if the loser is cancelled" beside
    a cancelled-while-queued p99 of 4,840 ms against 272 ms without hedging."""
    ci = pl.col("p99_ms_ci") if "p99_ms_ci" in hedging.columns else pl.lit(0.0)
    h = hedging.with_columns(ci.fill_null(0.0).alias("_ci"))

    def winners(load) -> list[str]:
        at = h.filter(pl.col("load") == load)
        off = at.filter(pl.col("hedging") == "off")
        if off.height != 1:
            return []
        top = off["p99_ms"][0] - off["_ci"][0]
        return [HEDGE_LABELS[r["hedging"]].removeprefix("hedge, ")
                for r in at.filter(pl.col("hedging") != "off").iter_rows(named=True)
                if r["p99_ms"] + r["_ci"] < top]

    low, high = float(h["load"].min()), float(h["load"].max())
    at_low, at_high = winners(low), winners(high)
    first = "Hedging helps at low load" if at_low else "Hedging does not help at low load"
    if not at_high:
        second = f"at {high:.0%} load no hedging policy does"
    elif set(at_high) == set(at_low):
        second = f"at {high:.0%} load too"
    else:
        second = f"at {high:.0%} load only with the " + " or ".join(at_high)
    return f"{first}; {second}"


def hedging_collapse(hedging: pl.DataFrame, subtitle: str | None = None) -> alt.LayerChart:
    """Notebook 02: p99 per hedging policy at low load and near saturation (log scale).

    ``hedging`` has ``load`` (offered load as a share of capacity), ``hedging`` (off or
    the cancel policy) and ``p99_ms``. A line joins each policy's two loads, so a
    policy whose p99 explodes near saturation stands out as a steep slope.
    """
    order = [k for k in HEDGE_LABELS if k in set(hedging["hedging"])]
    labels = [HEDGE_LABELS[k] for k in order]
    h = hedging.with_columns(pl.col("hedging").replace_strict(HEDGE_LABELS).alias("policy"))
    text = pl.col("p99_ms").map_elements(lambda v: f"{v:,.0f}", return_dtype=pl.String)
    if "p99_ms_ci" in h.columns:  # the value written on the point carries its interval
        text = pl.concat_str([text, pl.lit(" ± "), pl.col("p99_ms_ci").map_elements(
            lambda v: f"{v:,.0f}", return_dtype=pl.String)], ignore_nulls=True)
    h = h.with_columns(text.alias("label"))
    base = alt.Chart(h).encode(
        x=alt.X("load:Q", title="offered load (share of capacity)",
                axis=alt.Axis(format="%", values=sorted(set(h["load"]))),
                scale=alt.Scale(domain=[0, 1])),
        y=alt.Y("p99_ms:Q", scale=alt.Scale(type="log"), title="p99 response time (ms, log scale)"),
        color=alt.Color("policy:N", title="hedging", sort=labels,
                        scale=alt.Scale(domain=labels,
                                        range=list(PALETTE["hedging"][:len(labels)])),
                        # below the plot: labels right of the points (26,134 ± 264) need the room
                        legend=alt.Legend(direction="vertical", labelLimit=0, orient="bottom")),
        tooltip=["policy:N", alt.Tooltip("load:Q", format=".0%"),
                 alt.Tooltip("p99_ms:Q", format=",.0f")])
    lines = base.mark_line(point=alt.OverlayMarkDef(size=60, filled=True))
    layers = [lines]
    if "p99_ms_ci" in h.columns:  # replications: each point's 95 % interval
        iv = h.with_columns(pl.max_horizontal(pl.col("p99_ms") - pl.col("p99_ms_ci"),
                                              pl.col("p99_ms") * 1e-3).alias("ci_low"),
                            (pl.col("p99_ms") + pl.col("p99_ms_ci")).alias("ci_high"))
        layers.append(base.properties(data=iv).mark_errorbar(ticks=True, thickness=1.6)
                      .encode(y=alt.Y("ci_low:Q", scale=alt.Scale(type="log"),
                                      title="p99 response time (ms, log scale)"),
                              y2="ci_high:Q", tooltip=alt.Undefined))
    note = _interval_note(hedging)
    if note:
        subtitle = f"{subtitle}; {note}" if subtitle else note
    label = alt.Text("label:N")
    low = float(h["load"].min())  # labels left of the lowest load, right of the others
    left = base.mark_text(align="right", dx=-8, fontSize=11).encode(text=label).transform_filter(
        alt.datum.load == low)
    right = base.mark_text(align="left", dx=8, fontSize=11).encode(text=label).transform_filter(
        alt.datum.load != low)
    title = alt.TitleParams(hedging_verdict(hedging), subtitle=subtitle or alt.Undefined)
    return alt.layer(*layers, left, right).properties(title=title, width=420, height=280)


def dkw_half_width(n: int, confidence: float = 0.95) -> float:
    """Half-width of the Dvoretzky-Kiefer-Wolfowitz band: with probability ``confidence``
    an empirical CDF of ``n`` independent draws lies within this of the true CDF
    everywhere at once (Massart's constant), so one band covers the whole curve."""
    return float(np.sqrt(np.log(2.0 / (1.0 - confidence)) / (2.0 * n)))


def step_delay_cdf(closed: pl.DataFrame, replayed: pl.DataFrame, title: str) -> alt.LayerChart:
    """Notebook 03: the delay from a step to its actuation, closed form beside replays.

    ``closed`` holds ``delay_s`` and ``cdf`` on a grid; ``replayed`` the sorted delays
    of the replays and their empirical CDF (:func:`delay_cdf_against_closed_form`)."""
    n = replayed.height
    return delay_cdf_against_closed_form(
        closed, replayed, n, title=title, x_title="delay from the step to actuation (s)",
        y_title="share of trials acted on by then", closed_label="closed form (sum of uniforms)",
        sample_label=f"controller replayed ({n} random phases)", what="replays")


def delay_cdf_against_closed_form(closed: pl.DataFrame, sample: pl.DataFrame, n: int, *,
                                  title: str, x_title: str, y_title: str, closed_label: str,
                                  sample_label: str, what: str) -> alt.LayerChart:
    """A closed form's CDF (``closed``: ``delay_s``, ``cdf`` on a grid) as a line beside
    the empirical CDF of ``n`` simulated delays (``sample``, a step line), with the
    sample's 95 % band (DKW, simultaneous over the whole curve) shaded; closed-form grid
    points outside it get a red ring (:func:`flagged` lists them). Notebooks 03 (the
    clock bound) and 09 (a silent failure's detection delay) draw it."""
    eps = dkw_half_width(n)
    # the empirical CDF at each closed-form grid point, to test the closed form against
    xs = np.sort(sample["delay_s"].to_numpy())[-n:] if n else np.array([])
    grid = closed["delay_s"].to_numpy()
    ecdf = np.searchsorted(xs, grid, side="right") / max(n, 1)
    test = closed.with_columns(pl.Series("closed", closed["cdf"]), pl.Series("ecdf", ecdf))
    outside = test.filter((pl.col("closed") - pl.col("ecdf")).abs() > eps)
    layers, _ = _source_layers(
        closed, sample, alt.X("delay_s:Q", title=x_title),
        alt.Y("cdf:Q", title=y_title, axis=alt.Axis(format="%")),
        closed_label, sample_label, None, sim_mark="step")
    band_label = f"95 % band of the {what} (DKW, ±{eps:.1%})"
    band = alt.Chart(pl.DataFrame({"delay_s": grid, "low": np.clip(ecdf - eps, 0, 1),
                                   "high": np.clip(ecdf + eps, 0, 1),
                                   "band": [band_label] * grid.size})).mark_area(
        interpolate="step-after", opacity=0.25).encode(
        x="delay_s:Q", y="low:Q", y2="high:Q",
        fill=alt.Fill("band:N", title=None, scale=alt.Scale(domain=[band_label],
                                                           range=[SIMULATION_COLOR]),
                      legend=alt.Legend(labelLimit=0)))
    parts = [band, layers]
    if outside.height:
        parts.append(alt.Chart(outside.with_columns(pl.lit(FLAG_LABEL).alias("flag")))
                     .mark_point(size=300, filled=False, strokeWidth=2.5).encode(
            x="delay_s:Q", y="cdf:Q", stroke=alt.Stroke("flag:N", title=None, scale=alt.Scale(
                domain=[FLAG_LABEL], range=[FLAG_COLOR]), legend=alt.Legend(labelLimit=0))))
    subtitle = (f"line: closed form; steps: {n} simulated {what}; shaded: their 95 % band "
                "(DKW), cut off at 0 % and 100 %")
    return alt.layer(*parts).resolve_scale(strokeDash="independent", stroke="independent"
                                           ).properties(
        title=alt.Title(title, subtitle=subtitle), width=420, height=260,
        usermeta={FLAGS_KEY: outside.select("delay_s", "closed", "ecdf").to_dicts()})


def ok_share_over_time(shares: pl.DataFrame, bin_s: float = 1.0, title: str | None = None,
                       subtitle: str | None = None) -> alt.Chart | alt.LayerChart:
    """Notebook 07: the share of requests answered ok per time bin, one line per source.

    ``shares`` has ``source``, ``t`` (bin start, s) and ``ok_share``; a source
    replicated has ``ok_share_ci`` too (95 % half-width per bin), drawn as a band in
    its colour. Bins with no request become nulls, so the line (and band) breaks there
    instead of bridging the gap.
    """
    has_ci = "ok_share_ci" in shares.columns
    cols = ["t", "ok_share"] + (["ok_share_ci"] if has_ci else [])
    grid = pl.DataFrame({"t": np.arange(shares["t"].min(), shares["t"].max() + bin_s, bin_s)})
    full = pl.concat([grid.with_columns(pl.lit(s).alias("source")).join(
        shares.filter(pl.col("source") == s).select(cols), on="t", how="left")
        for s in sorted(shares["source"].unique())])
    sources = sorted(shares["source"].unique())
    dashes = [[1, 0], [6, 3], [2, 2]][:len(sources)]
    legend = alt.Legend(symbolType="stroke", symbolStrokeWidth=2.5)
    color = alt.Color("source:N", title=None, legend=legend, scale=alt.Scale(
        domain=sources, range=list(PALETTE["compared"][:len(sources)])))
    x = alt.X("t:Q", title=f"time since the start of the run (s, {bin_s:g} s bins)")
    line = alt.Chart(full).mark_line(strokeWidth=2, invalid="break-paths-show-domains").encode(
        x=x,
        y=alt.Y("ok_share:Q", title="requests answered ok (share)", axis=alt.Axis(format="%")),
        color=color,
        strokeDash=alt.StrokeDash("source:N", title=None, legend=legend,
                                  scale=alt.Scale(domain=sources, range=dashes)),
        tooltip=["source:N", "t:Q", alt.Tooltip("ok_share:Q", format=".1%")]
        + ([alt.Tooltip("ok_share_ci:Q", format=".1%", title="± (95 %)")] if has_ci else []))
    head = title or "Share of requests answered ok"
    if not has_ci:
        return line.properties(title=alt.Title(head, subtitle=subtitle or alt.Undefined),
                               width=560, height=240)
    layers = [line]
    if has_ci:
        band = full.with_columns(
            (pl.col("ok_share") - pl.col("ok_share_ci")).clip(0, 1).alias("low"),
            (pl.col("ok_share") + pl.col("ok_share_ci")).clip(0, 1).alias("high"))
        palette = dict(zip(sources, PALETTE["compared"], strict=False))
        for src in sources:  # one layer per source, its colour as a value: no second legend
            part = band.filter((pl.col("source") == src) & pl.col("ok_share_ci").is_not_null())
            if part.height:
                layers.append(alt.Chart(band.filter(pl.col("source") == src)).mark_area(
                    opacity=0.2, invalid="break-paths-show-domains", color=palette[src]).encode(
                    x=x, y=alt.Y("low:Q", title="requests answered ok (share)"), y2="high:Q"))
        note = _interval_note(shares, "bands") or "bands: 95 % intervals"
        note += _clip_note(full["ok_share"], full["ok_share_ci"], (0.0, 1.0),
                           lambda v: f"{100 * v:.0f} %")
        if subtitle:
            note = f"{subtitle}; {note}"
    return alt.layer(*layers, title=alt.Title(head, subtitle=note)).properties(
        width=560, height=240)


# ---- Prometheus rules ------------------------------------------------------------------------
ALERT_STATE_COLORS = PALETTE["alert"]  # none a mode or series colour


def alert_episodes(alerts: pl.DataFrame, end_s: float) -> pl.DataFrame:
    """The alerts table as spans (alert, state, start_s, end_s): pending from
    ``pending_at`` to firing or resolution, firing from ``firing_at`` to resolution;
    an episode still open runs to ``end_s``."""
    rows = []
    for r in alerts.iter_rows(named=True):
        if r.get("error") is not None:
            continue  # a failed evaluation, not an alert
        who = f"{r['alert']} {r['labels']}"
        stop = r["resolved_at"] if r["resolved_at"] is not None else end_s
        fire = r["firing_at"]
        rows.append((who, "pending", r["pending_at"], fire if fire is not None else stop))
        if fire is not None:
            rows.append((who, "firing", fire, stop))
    return pl.DataFrame(rows, schema={"alert": pl.String, "state": pl.String,
                                      "start_s": pl.Float64, "end_s": pl.Float64}, orient="row")


def alert_timeline(alerts: pl.DataFrame, domain, timeline: pl.DataFrame | None = None,
                   title: str = "Prometheus alerts, backtested") -> alt.VConcatChart | alt.Chart:
    """Each alert episode (one row per alert and label set) as pending and firing spans
    over the trace's time; with ``timeline``, the mode a policy held beneath it, on the
    same time axis."""
    spans = alert_episodes(alerts, float(domain[1]))
    states = list(ALERT_STATE_COLORS)
    n = max(spans["alert"].n_unique(), 1)
    chart = (alt.Chart(spans, title=alt.Title(title, subtitle="pending: the expression holds, "
                                              "'for' not yet elapsed; firing: it has"))
             .mark_bar(height=14).encode(
                 x=_time_x("start_s", domain), x2="end_s:Q",
                 y=alt.Y("alert:N", title=None, sort=None, axis=alt.Axis(labelLimit=360)),
                 color=alt.Color("state:N", title="alert state",
                                 scale=alt.Scale(domain=states,
                                                 range=[ALERT_STATE_COLORS[s] for s in states])),
                 tooltip=["alert:N", "state:N", alt.Tooltip("start_s:Q", title="from (s)"),
                          alt.Tooltip("end_s:Q", title="to (s)")])
             .properties(width=PANEL_WIDTH, height=22 * n + 10))
    if timeline is None:
        return chart
    return alt.vconcat(chart, mode_timeline(timeline, domain=domain,
                                            title="Mode of the imported policy")
                       ).resolve_scale(color="independent")


# ---- calibration: the twin against the recording ---------------------------------------------
TWIN_SERIES = {"recorded": CATEGORY[4], "twin": CATEGORY[1]}  # black: what happened
TWIN_PANELS = {"request_rate_rps": "request rate (requests/s)",
               "error_ratio": "errors (% of answered)",
               "p99_ms": "p99 latency (ms)"}


def twin_overlay(overlay: pl.DataFrame, window_s: float) -> alt.VConcatChart:
    """The twin against the recording, one panel per signal a policy reads, stacked on one
    time axis: the recording's line, the twin's mean over replications, and the band its
    replications span. ``overlay``: ``relakit.calibrate``'s ``Validation.overlay``."""
    domain = [0.0, float(overlay["time_s"].max())]
    panels = []
    for signal, y_title in TWIN_PANELS.items():
        part = overlay.filter(pl.col("signal") == signal)
        long = part.unpivot(index="time_s", on=["recorded", "twin"], variable_name="series",
                            value_name="value")
        color = alt.Color("series:N", title=None, scale=_scale(TWIN_SERIES))
        axis = alt.Axis(format="%") if signal.endswith("ratio") else alt.Axis(format=",.4~g")
        band = alt.Chart(part).mark_area(opacity=0.25, color=TWIN_SERIES["twin"]).encode(
            x=_time_x("time_s", domain, "time since the recording's start (s)"),
            y=alt.Y("twin_lo:Q", title=y_title, scale=alt.Scale(domainMin=0), axis=axis),
            y2="twin_hi:Q")
        lines = alt.Chart(long).mark_line(strokeWidth=2, invalid="break-paths-show-domains"
                                          ).encode(
            x=_time_x("time_s", domain, "time since the recording's start (s)"),
            y=alt.Y("value:Q", title=y_title, scale=alt.Scale(domainMin=0), axis=axis),
            color=color,
            strokeDash=alt.StrokeDash("series:N", title=None,
                                      scale=alt.Scale(domain=list(TWIN_SERIES),
                                                      range=[[1, 0], [6, 3]])))
        panels.append(alt.layer(band, lines).properties(width=PANEL_WIDTH, height=150))
    return alt.vconcat(*panels, title=alt.Title(
        "Twin against the recording", subtitle=f"per {window_s:g} s evaluation window; band: "
        "the twin's replications, min to max")).resolve_scale(x="shared")


# ---- the control plane's own faults and replicas (notebook 09) ---------------------------
# the shaded window of a control-plane outage, and the lease states of agents: their own
# colours, none a series, mode, tier or outcome colour
OUTAGE_COLOR = NEUTRAL["outage"]
LEASE_COLORS = PALETTE["lease"]
VARIANT_COLORS = CATEGORY[:3]  # runs compared are series


def flag_steps_frame(runs: dict, flags=("shed_bronze", "hedge_enabled")) -> pl.DataFrame:
    """The flags in force in each run's data plane (``info.control_plane.flags_applied``,
    recorded at each change) as steps: variant, flag, time_s, on (0/1), one point at
    each change plus one at the run's end so the last step is drawn to it."""
    rows = []
    for variant, res in runs.items():
        applied = res.info["control_plane"]["flags_applied"]
        end = float(res.info["duration_s"])
        for flag in flags:
            for a in applied:
                rows.append((variant, flag, float(a["time_s"]), int(bool(a[flag]))))
            rows.append((variant, flag, end, int(bool(applied[-1][flag]))))
    return pl.DataFrame(rows, schema={"variant": pl.String, "flag": pl.String,
                                      "time_s": pl.Float64, "on": pl.Int64}, orient="row")


def tier_success_frame(runs: dict, tier: str = "gold", bin_s: float = 5.0) -> pl.DataFrame:
    """Per run and time bin (by arrival), the share of ``tier``'s requests answered ok;
    a bin with no request of that tier is null (the line breaks there)."""
    parts = []
    for variant, res in runs.items():
        grid = pl.DataFrame({"t": _bin_starts(float(res.info["duration_s"]), bin_s)})
        got = (res.requests.filter(pl.col("tier") == tier)
               .with_columns(((pl.col("arrival_s") // bin_s) * bin_s).alias("t"))
               .group_by("t").agg((pl.col("outcome") == "ok").mean().alias("ok_share")))
        parts.append(grid.join(got, on="t", how="left").with_columns(
            pl.lit(variant).alias("variant")))
    return pl.concat(parts).select("variant", "t", "ok_share").sort("variant", "t")


def _outage_layer(window, domain, label: str, title: str = "time (s)") -> alt.Chart:
    span = pl.DataFrame({"start_s": [float(window[0])], "end_s": [float(window[1])],
                         "what": [label]})
    return alt.Chart(span).mark_rect(color=OUTAGE_COLOR, opacity=0.7).encode(
        x=_time_x("start_s", domain, title), x2="end_s:Q", tooltip=["what:N"])


def tier_success_bands(replicated: dict, tier: str = "gold", bin_s: float = 5.0) -> pl.DataFrame:
    """:func:`tier_success_frame` over replications: per variant and bin, the mean share of
    ``tier`` answered ok, its 95 % half-width (``ok_share_ci``, Student t) and
    ``replications``. ``replicated``: variant label -> list of SimulationResult."""
    from relakit.replications import summarise_replications

    rows = pl.concat([tier_success_frame({v: r}, tier, bin_s).with_columns(
        pl.lit(i).alias("replication")) for v, results in replicated.items()
        for i, r in enumerate(results)])
    return summarise_replications(rows.drop_nulls("ok_share"), by=["variant", "t"]).sort(
        "variant", "t")


def fail_static_vs_safe(runs: dict, window, bin_s: float = 5.0, tier: str = "gold",
                        label: str = "control plane down",
                        replicated: dict | None = None) -> alt.VConcatChart:
    """Notebook 09: the flags each run's data plane had in force and its ``tier``'s
    success over time, stacked on one time axis, the outage ``window`` (start_s,
    end_s) shaded in every panel. ``runs``: variant label -> SimulationResult (the run
    whose flags are drawn); ``replicated``: variant label -> its replications, whose
    mean success is drawn with its 95 % band (without it: ``runs``' own, no band)."""
    domain = (0.0, max(float(r.info["duration_s"]) for r in runs.values()))
    variants = list(runs)
    color = alt.Color("variant:N", title="data plane on stale config",
                      scale=alt.Scale(domain=variants, range=list(VARIANT_COLORS[:len(
                          variants)])))
    dash = alt.StrokeDash("variant:N", title="data plane on stale config",
                          scale=alt.Scale(domain=variants, range=[[1, 0], [6, 3], [2, 2]][:len(
                              variants)]))
    steps = flag_steps_frame(runs)
    names = {"shed_bronze": "bronze shed", "hedge_enabled": "hedging on"}
    panels = []
    one = " (one run each)" if replicated else ""
    for flag in ("shed_bronze", "hedge_enabled"):
        line = alt.Chart(steps.filter(pl.col("flag") == flag)).mark_line(
            interpolate="step-after", strokeWidth=2).encode(
            x=_time_x("time_s", domain), y=alt.Y("on:Q", title=f"{names[flag]} (1 = yes)",
                                                 scale=alt.Scale(domain=[0, 1.05]),
                                                 axis=alt.Axis(values=[0, 1])),
            color=color, strokeDash=dash, tooltip=["variant:N", "time_s:Q", "on:Q"])
        panels.append(alt.layer(_outage_layer(window, domain, label), line).properties(
            width=PANEL_WIDTH, height=90,
            title=f"Flag in force in the data plane: {names[flag]}{one}"))
    x_title = f"time (s; {bin_s:g} s bins by arrival)"
    y_title = f"{tier} answered ok (share)"
    if replicated:
        ok = tier_success_bands(replicated, tier, bin_s)
        # the bins every replication has, on the full grid: a gap breaks line and band
        grid = pl.DataFrame({"t": _bin_starts(domain[1], bin_s)})
        ok = pl.concat([grid.with_columns(pl.lit(v).alias("variant")).join(
            ok.filter(pl.col("variant") == v), on=["variant", "t"], how="left")
            for v in variants]).select("variant", "t", "ok_share", "ok_share_ci", "replications")
        panel = compare_series_bands(
            ok, "t", "ok_share", "variant", title=f"{tier.capitalize()} success",
            subtitle=f"shaded grey: {label}; lines: mean over replications on common seeds",
            x_title=x_title, y_title=y_title, domain=domain, clip=(0.0, 1.0), height=200,
            clip_format=lambda v: f"{100 * v:.0f} %")
        note = panel.title.subtitle
        lines = [layer.encode(y=alt.Y("ok_share:Q", title=y_title, axis=alt.Axis(format="%")))
                 if i == 1 else layer for i, layer in enumerate(panel.layer)]
        # the band's legend is off: resolved apart, the lines' legend is this panel's own
        panels.append(alt.layer(_outage_layer(window, domain, label, x_title), *lines).properties(
            width=PANEL_WIDTH, height=200,
            title=alt.Title(f"{tier.capitalize()} success", subtitle=note)).resolve_legend(
            color="independent", strokeDash="independent"))
        return alt.vconcat(*panels)
    ok = tier_success_frame(runs, tier, bin_s)
    line = alt.Chart(ok).mark_line(strokeWidth=2, invalid="break-paths-show-domains").encode(
        x=_time_x("t", domain, x_title),
        y=alt.Y("ok_share:Q", title=y_title, axis=alt.Axis(format="%")),
        color=color, strokeDash=dash,
        tooltip=["variant:N", "t:Q", alt.Tooltip("ok_share:Q", format=".1%")])
    panels.append(alt.layer(_outage_layer(window, domain, label, x_title), line).properties(
        width=PANEL_WIDTH, height=200, title=alt.Title(
            f"{tier.capitalize()} success", subtitle=f"shaded: {label}; one run each")))
    return alt.vconcat(*panels)


def lease_spans(result) -> pl.DataFrame:
    """Per agent, spans of its lease state in a simulated run (agent, state, start_s,
    end_s): ``leader`` from each acquisition to the next one, ``down`` over the agent
    faults of the run's audit (from its ``down`` row to its ``restart`` row)."""
    end = float(result.info["duration_s"])
    acq = result.info["control_plane"]["acquisitions"]
    rows = []
    for k, (t, agent, epoch) in enumerate(acq):
        stop = acq[k + 1][0] if k + 1 < len(acq) else end
        rows.append((f"agent {agent}", "leader", float(t), float(stop), f"epoch {epoch}"))
    d = result.decisions.filter(pl.col("stage") == "control_plane")
    for r in d.filter(pl.col("action") == "down").iter_rows(named=True):
        back = d.filter((pl.col("action") == "restart") & (pl.col("target") == r["target"])
                        & (pl.col("decided_at_s") > r["decided_at_s"]))["decided_at_s"]
        rows.append((r["target"], "down", r["decided_at_s"],
                     float(back.min()) if back.len() else end, r["reason"]))
    return pl.DataFrame(rows, schema={"agent": pl.String, "state": pl.String,
                                      "start_s": pl.Float64, "end_s": pl.Float64,
                                      "note": pl.String}, orient="row")


def handover_timeline(result, title: str = "Leader handover") -> alt.VConcatChart:
    """Notebook 09: which agent held the lease, when each was down, the writes the
    config server refused (a mark on the agent that sent them), and the policy's mode
    beneath, on one time axis."""
    domain = (0.0, float(result.info["duration_s"]))
    spans = lease_spans(result)
    states = [s for s in ("leader", "down") if s in set(spans["state"])]
    bars = alt.Chart(spans).mark_bar(height=14).encode(
        x=_time_x("start_s", domain), x2="end_s:Q",
        y=alt.Y("agent:N", title=None, sort="ascending"),
        yOffset=alt.YOffset("state:N", sort=states),
        color=alt.Color("state:N", title="agent state", scale=alt.Scale(
            domain=states, range=[LEASE_COLORS[s] for s in states])),
        tooltip=["agent:N", "state:N", "start_s:Q", "end_s:Q", "note:N"])
    refused = result.decisions.filter(pl.col("action") == "write_refused").select(
        pl.col("decided_at_s"), pl.col("target").alias("agent"), "reason",
        pl.lit("write refused (stale epoch)").alias("event"))
    marks = alt.Chart(refused).mark_point(shape="cross", size=160, filled=True,
                                          color=NEUTRAL["reference"]).encode(
        x=_time_x("decided_at_s", domain), y=alt.Y("agent:N", sort="ascending"),
        shape=alt.Shape("event:N", title=None, scale=alt.Scale(range=["cross"])),
        tooltip=["decided_at_s:Q", "agent:N", "reason:N"])
    top = alt.layer(bars, marks).properties(
        width=PANEL_WIDTH, height=110, title=alt.Title(
            title, subtitle="lease held (by epoch), agent down, and refused writes"))
    policy_line = result.timeline.select("time_s", "mode")
    return alt.vconcat(top, mode_timeline(policy_line, domain=domain,
                                          title="Mode asserted by the leader")
                       ).resolve_scale(color="independent", shape="independent")


# ---- a search's Pareto front (relakit.search) ---------------------------------------------------
SEARCH_SERIES = PALETTE["search"]


def search_points(result, x: str, y: str) -> pl.DataFrame:
    """One row per complete trial and the incumbent: ``x``, ``y``, their half-widths as
    ``x_lo``/``x_hi``/``y_lo``/``y_hi``, and ``series`` (trial, Pareto front, incumbent)."""
    front = set(result.front["trial"].to_list())
    rows = [{"label": f"trial {r['trial']}",
             "series": "Pareto front" if r["trial"] in front else "trial",
             "x": r[x], "x_ci": r[f"{x}_ci"], "y": r[y], "y_ci": r[f"{y}_ci"]}
            for r in result.trials.iter_rows(named=True)]
    inc = result.info.get("incumbent")
    if inc:
        rows.append({"label": "incumbent", "series": "incumbent", "x": inc[x]["mean"],
                     "x_ci": inc[x]["ci"], "y": inc[y]["mean"], "y_ci": inc[y]["ci"]})
    frame = pl.DataFrame(rows).with_columns(pl.col("x_ci", "y_ci").fill_nan(0.0))
    return frame.with_columns(x_lo=pl.col("x") - pl.col("x_ci"),
                              x_hi=pl.col("x") + pl.col("x_ci"),
                              y_lo=pl.col("y") - pl.col("y_ci"), y_hi=pl.col("y") + pl.col("y_ci"))


def pareto_front(result, x: str, y: str, x_title: str, y_title: str,
                 title: str = "Searched policies against the incumbent") -> alt.LayerChart:
    """Every complete trial of a search on two of its objectives (means, with their 95 %
    half-widths as error bars), the Pareto front's members in their own colour and
    shape, and the incumbent (the policy that ran) marked apart. The front is over all
    the search's objectives, so a member may look dominated on these two (no line joins
    them for that reason)."""
    pts = search_points(result, x, y)
    color = alt.Color("series:N", title=None, scale=_scale(SEARCH_SERIES))
    shape = alt.Shape("series:N", title=None, scale=alt.Scale(
        domain=list(SEARCH_SERIES), range=["circle", "diamond", "cross"]))
    def axis(number):  # a share or ratio reads as a percentage, other numbers as they are
        share = number.endswith(("ratio", "share"))
        return alt.Axis(format="%" if share else ",.4~g")

    xe = alt.X("x:Q", title=x_title, scale=alt.Scale(zero=False), axis=axis(x))
    ye = alt.Y("y:Q", title=y_title, scale=alt.Scale(zero=False), axis=axis(y))
    xbars = alt.Chart(pts).mark_rule(strokeWidth=1.5).encode(
        x=alt.X("x_lo:Q", title=x_title, axis=axis(x)), x2="x_hi:Q", y="y:Q", color=color)
    ybars = alt.Chart(pts).mark_rule(strokeWidth=1.5).encode(
        x="x:Q", y=alt.Y("y_lo:Q", title=y_title, axis=axis(y)), y2="y_hi:Q", color=color)
    marks = alt.Chart(pts).mark_point(size=90, filled=True, opacity=0.9).encode(
        x=xe, y=ye, color=color, shape=shape,
        tooltip=["label:N", alt.Tooltip("x:Q", title=x_title, format=".4g"),
                 alt.Tooltip("y:Q", title=y_title, format=".4g")])
    return alt.layer(xbars, ybars, marks, title=alt.Title(
        title, subtitle=f"{result.trials.height} trials, {result.spec.replications} "
        "replications each on common random numbers; bars: 95 % intervals")
    ).properties(width=PANEL_WIDTH, height=320)


# ---- series over time with their replications' bands (notebook 05) --------------------------
def _clip_note(mean: pl.Series, ci: pl.Series, clip, fmt=lambda v: f"{v:g}") -> str:
    """' (cut off at 0)' when a band reaches past what the quantity can be and is drawn
    cut at that bound: the reader is told the interval was wider."""
    if clip is None:
        return ""
    m, h = mean.cast(pl.Float64).fill_nan(None), ci.cast(pl.Float64).fill_nan(None)
    cut = [fmt(b) for b, hit in ((clip[0], ((m - h) < clip[0]).any()),
                                 (clip[1], ((m + h) > clip[1]).any())) if hit]
    return f" (cut off at {' and '.join(cut)})" if cut else ""


def compare_series_bands(frame: pl.DataFrame, x: str, y: str, series: str, *, title: str,
                         x_title: str, y_title: str, subtitle: str | None = None,
                         domain=None, interpolate: str = "linear",
                         rules: dict[str, float] | None = None, height: int = 200,
                         clip: tuple[float, float] | None = (0.0, float("inf")),
                         clip_format=lambda v: f"{v:g}", colors: dict[str, str] | None = None):
    """:func:`compare_series` of replicated series: each line is the mean over
    replications, shaded with its 95 % interval (``<y>_ci``, as
    :func:`relakit.replications.summarise_replications` names it) in the line's
    colour. ``clip`` bounds the band to what the quantity can be (counts and rates
    are never negative). The subtitle says what the bands are (replication count
    from a ``replications`` column). A null ``<y>_ci`` (one replication) draws no
    band there; nulls in ``y`` break line and band."""
    ci = f"{y}_ci"
    if ci not in frame.columns:
        raise ValueError(f"compare_series_bands: no column {ci!r} (the half-width of {y!r})")
    note = _interval_note(frame, "bands") or "bands: 95 % intervals"
    note += _clip_note(frame[y], frame[ci], clip, clip_format)
    sub = f"{subtitle}; {note}" if subtitle else note
    chart = compare_series(frame, x, y, series, title=title, x_title=x_title,
                           y_title=y_title, subtitle=sub, domain=domain,
                           interpolate=interpolate, rules=rules, height=height, colors=colors)
    names = list(dict.fromkeys(frame[series].to_list()))
    lo, hi = clip if clip is not None else (-float("inf"), float("inf"))
    band = frame.with_columns(
        (pl.col(y) - pl.col(ci).fill_nan(None)).clip(lo, hi).alias("_low"),
        (pl.col(y) + pl.col(ci).fill_nan(None)).clip(lo, hi).alias("_high"))
    area = alt.Chart(band).mark_area(opacity=0.22, interpolate=interpolate,
                                     invalid="break-paths-show-domains").encode(
        x=_time_x(x, domain, x_title), y=alt.Y("_low:Q", title=y_title, stack=None), y2="_high:Q",
        color=alt.Color(f"{series}:N", title=None, sort=names, legend=None,
                        scale=alt.Scale(domain=names, range=_series_colors(names, colors))))
    # the band's legend off and the legends resolved apart: the lines' legend (colour and
    # dash) is the only one, so it shows the dashes that tell the series apart in grey
    # data altair hoisted to the layer chart (lines without rules share one frame) stays
    # with the lines: the band brings its own
    lines = [layer if chart.data is alt.Undefined or layer.data is not alt.Undefined
             else layer.properties(data=chart.data) for layer in chart.layer]
    return alt.LayerChart(layer=[area, *lines], title=chart.title,
                          width=chart.width, height=chart.height
                          ).resolve_legend(color="independent", strokeDash="independent")


# ---- silent failures: detection delay and thresholds that fit the node (notebook 09) --------
# drawn from what relakit.probes (a detection's closed form and its runs' delays) and
# relakit.thresholds (compare_thresholds' table) give; those two modules draw nothing
def delay_cdf_frames(detection, delays) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(closed form on a grid, simulated empirical CDF): ``delay_s`` and ``cdf`` each."""
    delays = np.sort(np.asarray(delays, dtype=float))
    top = max(float(delays.max()) if delays.size else 0.0, detection.mean + 4 * detection.sd)
    grid = np.linspace(0.0, top, 200)
    closed = pl.DataFrame({"delay_s": grid, "cdf": detection.cdf(grid)})
    sim = pl.DataFrame({"delay_s": np.concatenate([[0.0], delays]),
                        "cdf": np.arange(delays.size + 1) / max(delays.size, 1)})
    return closed, sim


def delay_cdf_figure(detection, delays, title: str):
    """The detection delay of a silent failure: the closed form's CDF as a line, the
    simulated replications' empirical CDF as a step line in its 95 % band."""
    closed, sim = delay_cdf_frames(detection, delays)
    n = sim.height - 1
    return delay_cdf_against_closed_form(
        closed, sim, n, title=title, x_title="delay from the onset to isolation (s)",
        y_title="share of runs isolated by then",
        closed_label="closed form (Erlang + scrape + evaluation)",
        sample_label=f"simulated ({n} replications, random onset)", what="replications")


def scores_frame(table: pl.DataFrame, faults: dict[int, str]) -> pl.DataFrame:
    """The compared table in long form for :func:`threshold_figure`: one row per variant
    and score (``measure``, ``value``, ``low``, ``high``: the 95 % interval, clipped to
    what the score can be; a missed fault has a null value and ``missed`` = its share
    of runs that missed it)."""
    rows = []

    def add(r, measure, col, missed=0.0, hi=np.inf):
        v, ci = r[col], r[col + "_ci"]
        ok = v == v
        ci = ci if ci == ci else 0.0
        rows.append({"variant": r["variant"], "measure": measure,
                     "value": v if ok else None,
                     "low": max(0.0, v - ci) if ok else None,  # counts, delays, shares >= 0
                     "high": min(hi, v + ci) if ok else None,
                     "missed": missed})

    for r in table.iter_rows(named=True):
        add(r, "false isolations (per run)", "false_isolations")
        for k, name in faults.items():
            add(r, f"detection delay, {name} (s)", f"fault{k}_delay_s",
                1.0 - r[f"fault{k}_detected"])
        add(r, "gold success (share ok)", "gold_success", hi=1.0)
    return pl.DataFrame(rows, schema={"variant": pl.String, "measure": pl.String,
                                      "value": pl.Float64, "low": pl.Float64,
                                      "high": pl.Float64, "missed": pl.Float64})


def threshold_figure(table: pl.DataFrame, faults: dict[int, str], title: str):
    """One panel per score: each variant's mean as a point with its 95 % interval as a bar;
    a fault a variant missed in every run is written "missed" instead of a point."""
    frame = scores_frame(table, faults)
    variants = list(dict.fromkeys(frame["variant"].to_list()))
    color = alt.Color("variant:N", title="thresholds", sort=variants,
                      scale=alt.Scale(domain=variants,
                                      range=[CATEGORY[i] for i in (0, 1, 2, 5, 6, 3, 4)]
                                      [:len(variants)]))
    panels = []
    for measure in dict.fromkeys(frame["measure"].to_list()):
        part = frame.filter(pl.col("measure") == measure)
        y = alt.Y("variant:N", title=None, sort=variants)
        # shares are read near 1; counts and delays from 0
        x = alt.X("value:Q", title=measure, scale=alt.Scale(zero="share" not in measure))
        bars = alt.Chart(part).mark_rule(strokeWidth=2).encode(
            y=y, x=alt.X("low:Q", title=measure), x2="high:Q", color=color)
        points = alt.Chart(part).mark_point(filled=True, size=80).encode(
            y=y, x=x, color=color, tooltip=["variant:N", alt.Tooltip("value:Q", format=".3g"),
                                            alt.Tooltip("low:Q", format=".3g"),
                                            alt.Tooltip("high:Q", format=".3g")])
        missed = alt.Chart(part.filter(pl.col("value").is_null())).mark_text(
            align="left", color=PALETTE["neutral"]["note"], fontSize=11).encode(
            y=y, x=alt.value(4), text=alt.value("missed in every run"))
        panels.append(alt.layer(bars, points, missed).properties(width=230, height=120))
    return alt.concat(*panels, columns=2, title=alt.Title(
        title, subtitle="mean over replications on common seeds, with 95 % intervals"))


# ---- zones and rollouts (notebook 09) ---------------------------------------------------------
# The charts of zoned and rollout runs (relakit.zones, relakit.rollout), and the frame
# behind the zones' chart.
def zone_series(runs: dict) -> pl.DataFrame:
    """Dropped requests per second in each zone over time, per scope: ``runs`` maps a
    scope to a :class:`~relakit.zones.ZonedResult`; columns scope, zone, time_s,
    dropped_rps."""
    return pl.concat([r.fleet_series().select("time_s", "dropped_rps").with_columns(
        pl.lit(scope).alias("scope"), pl.lit(f"zone {z}").alias("zone"))
        for scope, zr in runs.items() for z, r in enumerate(zr.zones)])


def zone_series_bands(replicated: dict) -> pl.DataFrame:
    """:func:`zone_series` over replications: ``replicated`` maps a scope to a list of
    ZonedResult; per scope, zone and sample, the mean ``dropped_rps``, its 95 %
    half-width (``dropped_rps_ci``) and ``replications``."""
    from relakit.replications import summarise_replications

    rows = pl.concat([zone_series({scope: zr}).with_columns(pl.lit(i).alias("replication"))
                      for scope, results in replicated.items() for i, zr in enumerate(results)])
    return summarise_replications(rows, by=["scope", "zone", "time_s"]).sort(
        "scope", "zone", "time_s")


def zone_series_chart(series: pl.DataFrame, fault=None):
    """Shed requests per zone over time, one panel per scope on a shared time axis;
    ``fault`` (start_s, end_s) shades the overload. A ``dropped_rps_ci`` column
    (:func:`zone_series_bands`) is drawn as each line's 95 % band."""
    panels = []
    domain = (0.0, float(series["time_s"].max()))
    banded = "dropped_rps_ci" in series.columns
    for scope in series["scope"].unique(maintain_order=True).to_list():
        part = series.filter(pl.col("scope") == scope)
        if banded:
            line = compare_series_bands(
                part, "time_s", "dropped_rps", "zone", title=f"policy scope: {scope}",
                x_title="time (s)", y_title="requests shed (per s)", domain=domain, height=140)
            layers = list(line.layer)
            title = line.title
        else:
            layers = [alt.Chart(part).mark_line().encode(
                x=_time_x("time_s", domain),
                y=alt.Y("dropped_rps:Q", title="requests shed (per s)"),
                color=alt.Color("zone:N", title="zone"))]
            title = alt.Title(f"policy scope: {scope}", subtitle="one run")
        if fault is not None:
            band = pl.DataFrame({"start_s": [fault[0]], "end_s": [fault[1]]})
            layers.insert(0, alt.Chart(band).mark_rect(opacity=0.5, color=NEUTRAL["outage"]).encode(
                x="start_s:Q", x2="end_s:Q"))
        panel = alt.layer(*layers, title=title).properties(width=560, height=140)
        panels.append(panel.resolve_legend(color="independent", strokeDash="independent")
                      if banded else panel)
    return alt.vconcat(*panels).resolve_scale(x="shared", y="shared")


def blast_radius_chart(table: pl.DataFrame, replications: int | None = None):
    """Mean blast radius per scope with its 95 % interval (columns scope, mean, low,
    high) as bars and whiskers, each labelled with its value; the title says what the
    number is, the subtitle what the whisker is (over ``replications`` runs)."""
    x_title = "requests per run shed, hedged or degraded outside zone 0"
    df = table.with_columns(pl.struct("mean", "low", "high").map_elements(
        lambda r: f"{r['mean']:,.0f}" + (f" (95 %: {r['low']:,.0f} to {r['high']:,.0f})"
                                         if r["high"] > r["low"] else ""),
        return_dtype=pl.String).alias("text"))
    base = alt.Chart(df).encode(y=alt.Y("scope:N", title=None, axis=alt.Axis(
        labelExpr="'policy per ' + datum.label", labelLimit=200, labelPadding=6)))
    bars = base.mark_bar(height=22).encode(
        x=alt.X("mean:Q", title=x_title, axis=alt.Axis(format=",.0f", tickCount=5)),
        color=alt.Color("scope:N", title="policy scope", legend=None))
    err = base.mark_errorbar(color=NEUTRAL["reference"], ticks=True).encode(
        x=alt.X("low:Q", title=x_title), x2="high:Q")
    text = base.mark_text(align="left", dx=6, color=NEUTRAL["note"]).encode(
        x="high:Q", text="text:N")
    over = f" over {replications} replications on common seeds" if replications else ""
    return alt.layer(bars, err, text, title=alt.Title(
        "Blast radius: requests outside the overloaded zone that control touched",
        subtitle=f"means{over}; whisker: 95 % interval of the paired difference fleet - zone "
                 "(per-zone control touched none in every replication)")
    ).properties(width=560, height=110)


def rollout_chart(result, metric: str = "success_ratio", tier: str = "all",
                  title: str = "", label: str | None = None):
    """A :class:`~relakit.rollout.RolloutResult`'s canary vs rest over time, one point
    per observation window (at its middle; the
    two slices drawn a little apart), with 95 % intervals over the window's slots;
    below, their paired difference with its interval (what the rollout decides on)
    and the zero line. Rules on both panels, which share the time axis: where the
    canary started (dashed) and the promotion or rollback (solid)."""
    o = result.observation(metric, tier).with_columns(
        ((pl.col("start_s") + pl.col("end_s")) / 2).alias("mid_s"))
    label = label or f"{metric.replace('_', ' ')} ({tier})"
    shift = 0.04 * float(result.observations["end_s"][0] - result.observations["start_s"][0])
    levels = pl.concat([
        o.select((pl.col("mid_s") + d).alias("mid_s"), pl.col(side).alias("value"),
                 pl.col(f"{side}_low").alias("low"), pl.col(f"{side}_high").alias("high"),
                 pl.lit(side).alias("slice"))
        for side, d in (("canary", -shift), ("rest", shift))])
    end = float(o["end_s"].max())
    x = alt.X("mid_s:Q", title="time (s; each point: one observation window, at its middle)",
              scale=alt.Scale(domain=[0, end]))
    colour = alt.Color("slice:N", title="slice", scale=_scale(PALETTE["slice"]))
    share = metric.endswith(("ratio", "share"))
    level_axis = alt.Axis(format=".1%" if share else ",.4~g")
    diff_axis = alt.Axis(format="+.1%" if share else "+,.4~g")
    top = alt.Chart(levels)
    upper = [top.mark_line(point=True).encode(
                 x=x, y=alt.Y("value:Q", title=label, scale=alt.Scale(zero=False), axis=level_axis),
                 color=colour),
             top.mark_errorbar().encode(x=x, y=alt.Y("low:Q", title=label, axis=level_axis),
                                        y2="high:Q",
                                        color=colour)]
    diff = alt.Chart(o)
    lower = [alt.Chart(pl.DataFrame({"y": [0.0]})).mark_rule(color=NEUTRAL["note"],
                                                             strokeDash=[2, 2])
             .encode(y=alt.Y("y:Q", title="canary - rest", axis=diff_axis)),
             diff.mark_errorbar(color=NEUTRAL["reference"]).encode(
                 x=x, y=alt.Y("low:Q", title="canary - rest", axis=diff_axis), y2="high:Q"),
             diff.mark_point(color=NEUTRAL["reference"], filled=True).encode(x=x, y="diff:Q")]
    marks = [(float(result.observations["start_s"].min()), "canary starts", [4, 3], 8)]
    if result.outcome.get("action"):
        marks.append((result.outcome["at_s"], f"{result.outcome['action']}", [], 24))
    for t, what, dash, y in marks:
        m = pl.DataFrame({"t": [t], "what": [f"{what} at {t:g} s"]})
        rule = alt.Chart(m).mark_rule(color=NEUTRAL["note"], strokeWidth=2, strokeDash=dash).encode(
            x="t:Q")
        text = alt.Chart(m).mark_text(align="left", dx=4, color=NEUTRAL["note"]).encode(
            x="t:Q", y=alt.value(y), text="what:N")
        upper += [rule, text]
        lower.append(rule)
    return alt.vconcat(alt.layer(*upper).properties(width=560, height=160, title=alt.Title(
        title, subtitle=["each point: one slice over one observation window; whiskers: 95 % "
                         "intervals over the window's scrape slots;",
                         "below: the paired difference canary - rest, what the rollout "
                         "decides on"])),
                       alt.layer(*lower).properties(width=560, height=110)
                       ).resolve_scale(x="shared")


# ---- metastability (relakit.metastability) ------------------------------------------------

def _edges(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Cell edges halfway between neighbouring grid values (half a step beyond the ends)."""
    v = np.unique(values)
    if v.size == 1:
        return {v[0]: v[0] * 0.9}, {v[0]: v[0] * 1.1}
    mid = (v[1:] + v[:-1]) / 2
    lo = np.concatenate([[v[0] - (mid[0] - v[0])], mid])
    hi = np.concatenate([mid, [v[-1] + (v[-1] - mid[-1])]])
    return dict(zip(v, lo, strict=True)), dict(zip(v, hi, strict=True))


def ctmc_boundary(boundary: pl.DataFrame, level: float = 0.5) -> pl.DataFrame:
    """Per trigger size, the duration at which the CTMC's recovery probability falls
    through ``level`` (linear between grid durations). A size whose probability is below
    ``level`` already at the shortest duration, or never falls below it, has its
    crossing off the grid: no point (drawing it at the grid's edge would invent one)."""
    rows = []
    for (size,), g in boundary.sort("duration_s").group_by(["size"], maintain_order=True):
        d, p = g["duration_s"].to_numpy(), g["p_recover"].to_numpy()
        below = np.flatnonzero(p < level)
        if not below.size or below[0] == 0:
            continue
        i = below[0]
        at = d[i - 1] + (p[i - 1] - level) / (p[i - 1] - p[i]) * (d[i] - d[i - 1])
        rows.append({"size": float(size), "duration_s": float(at)})
    return pl.DataFrame(rows, schema={"size": pl.Float64, "duration_s": pl.Float64})


def basin_chart(cells: pl.DataFrame, boundary: pl.DataFrame | None, *, size_title: str,
                title: str, subtitle: str = "") -> alt.LayerChart:
    """The recovery-probability map (:class:`relakit.metastability.BasinMap` ``cells``):
    one rectangle per trigger, coloured by the simulated share of replications that
    recovered (its Clopper-Pearson interval in the tooltip and written on the cell), and
    the CTMC's 50 % boundary (:func:`ctmc_boundary` of
    :func:`relakit.metastability.ctmc_recovery_map`) drawn over it."""
    x_lo, x_hi = _edges(cells["size"].to_numpy())
    y_lo, y_hi = _edges(cells["duration_s"].to_numpy())
    frame = cells.with_columns(
        pl.col("size").replace_strict(x_lo, return_dtype=pl.Float64).alias("x0"),
        pl.col("size").replace_strict(x_hi, return_dtype=pl.Float64).alias("x1"),
        pl.col("duration_s").replace_strict(y_lo, return_dtype=pl.Float64).alias("y0"),
        pl.col("duration_s").replace_strict(y_hi, return_dtype=pl.Float64).alias("y1"),
        pl.format("{}/{}", "recovered", "replications").alias("label"))
    x = alt.X("x0:Q", title=size_title, scale=alt.Scale(nice=False, zero=False))
    y = alt.Y("y0:Q", title="trigger duration (s)", scale=alt.Scale(nice=False, zero=False))
    rect = alt.Chart(frame).mark_rect().encode(
        x=x, x2="x1:Q", y=y, y2="y1:Q",
        color=alt.Color("p_recover:Q", scale=alt.Scale(scheme="viridis", domain=[0, 1]),
                        title="P(recovered) simulated",
                        legend=alt.Legend(orient="bottom", direction="horizontal",
                                          titleLimit=0, gradientLength=160)),
        tooltip=[alt.Tooltip("size:Q", title=size_title),
                 alt.Tooltip("duration_s:Q", title="duration (s)"),
                 alt.Tooltip("label:N", title="recovered / replications"),
                 alt.Tooltip("p_low:Q", title="95 % low (Clopper-Pearson)", format=".2f"),
                 alt.Tooltip("p_high:Q", title="95 % high", format=".2f"),
                 alt.Tooltip("recovery_p50_s:Q", title="median recovery (s)", format=".3g")])
    layers = [rect]
    if cells.height <= 100:  # the counts, where a cell is large enough to hold them
        layers.append(alt.Chart(frame).mark_text(fontSize=9).encode(
            x=alt.X("size:Q"), y=alt.Y("duration_s:Q"), text="label:N",
            color=alt.condition(alt.datum.p_recover < 0.5,
                                alt.value(PALETTE["neutral"]["text light"]),
                                alt.value(PALETTE["neutral"]["text dark"]))))
    if boundary is not None and boundary.height:
        line = ctmc_boundary(boundary).with_columns(
            pl.lit("CTMC: P(recover) = 0.5").alias("model"))
        enc = {"x": alt.X("size:Q"), "y": alt.Y("duration_s:Q"),
               "strokeDash": alt.StrokeDash("model:N", title=None,
                                            legend=alt.Legend(orient="bottom"))}
        layers.append(alt.Chart(line).mark_line(color=PALETTE["boundary"]["CTMC"],
                                                strokeWidth=3).encode(**enc))
    head = alt.TitleParams(text=title, subtitle=subtitle or alt.Undefined)
    return alt.layer(*layers, title=head).properties(width=420, height=320)


def control_frontier_chart(frontier: pl.DataFrame, *, title: str, subtitle: str = "",
                           measure: str = "recovery_time") -> alt.LayerChart:
    """The control-delay frontier (:func:`relakit.metastability.control_frontier`) against
    the control loop's mean delay, one line per spike size. ``measure="recovery_time"``:
    the mean time from the spike's end to recovery over the replications that recovered,
    with Student t 95 % bars; ``measure="p_recover"``: the share of runs that recovered,
    with Clopper-Pearson 95 % bars (the frontier is where it falls below 1/2). Each
    point's tooltip has the recovered count and its interval."""
    if measure not in ("recovery_time", "p_recover"):
        raise ValueError(f"measure: expected recovery_time or p_recover, got {measure!r}")
    share = measure == "p_recover"
    mean, lo_col, hi_col = (("p_recover", "p_low", "p_high") if share else
                            ("recovery_mean_s", None, None))
    frame = frontier.with_columns(pl.format("{}x", "size").alias("trigger"))
    # the spikes drawn at one delay are set apart a little (a dodge), so their bars do not
    # hide one another; the tooltip keeps the delay itself
    sizes = sorted(frame["size"].unique().to_list())
    span = float(frame["delay_s"].max() - frame["delay_s"].min()) or 1.0
    dodge = 0.012 * span
    offsets = {z: (i - (len(sizes) - 1) / 2) * dodge for i, z in enumerate(sizes)}
    frame = frame.with_columns(
        (pl.col("delay_s") + pl.col("size").replace_strict(offsets, return_dtype=pl.Float64))
        .alias("delay_drawn_s"))
    if share:
        frame = frame.with_columns(pl.col(lo_col).alias("lo"), pl.col(hi_col).alias("hi"))
    else:
        frame = frame.with_columns(
            (pl.col("recovery_mean_s") - pl.col("recovery_mean_s_ci")).alias("lo"),
            (pl.col("recovery_mean_s") + pl.col("recovery_mean_s_ci")).alias("hi"))
    x = alt.X("delay_drawn_s:Q", title="control-loop delay, clock-bound mean (s)")
    color = alt.Color("trigger:N", title="spike (x the base rate)")
    dash = alt.StrokeDash("trigger:N", title="spike (x the base rate)")
    base = alt.Chart(frame).encode(x=x, color=color, strokeDash=dash)  # one legend, both
    y_title = ("share of runs recovered" if share else "recovery time after the spike (s)")
    y_scale = alt.Scale(domain=[0, 1]) if share else alt.Undefined
    line = base.mark_line(point=True).encode(
        y=alt.Y(f"{mean}:Q", title=y_title, scale=y_scale),
        tooltip=[alt.Tooltip("trigger:N"), alt.Tooltip("delay_s:Q", format=".1f"),
                 alt.Tooltip("scrape_s:Q"), alt.Tooltip("window_s:Q"),
                 alt.Tooltip("recovered:Q"), alt.Tooltip("replications:Q"),
                 alt.Tooltip("p_low:Q", title="P(recovered) 95 % low", format=".2f"),
                 alt.Tooltip(f"{mean}:Q", format=".3g")])
    bars = base.mark_errorbar(ticks=True).encode(y=alt.Y("lo:Q", title=y_title, scale=y_scale),
                                                  y2="hi:Q")
    sub = subtitle or ("bars: Clopper-Pearson 95 % intervals" if share else
                       "bars: Student t 95 % intervals over the runs that recovered")
    if len(sizes) > 1:
        sub += f"; spikes at one delay drawn up to {dodge * (len(sizes) - 1) / 2:.2g} s apart"
    layers = [bars, line]
    if share:  # the frontier's level: half the runs saved
        layers.append(alt.Chart(pl.DataFrame({"half": [0.5]})).mark_rule(
            strokeDash=[4, 3], color=PALETTE["neutral"]["reference"]).encode(
            y=alt.Y("half:Q", scale=y_scale)))
        layers.append(alt.Chart(pl.DataFrame({"half": [0.5], "label": ["half the runs saved"]}))
                      .mark_text(align="right", baseline="bottom", dy=-3,
                                 color=NEUTRAL["note"])
                      .encode(x=alt.value(420), y=alt.Y("half:Q", scale=y_scale), text="label:N"))
    return alt.layer(*layers, title=alt.TitleParams(text=title, subtitle=sub)).properties(
        width=420, height=260)


# ---- in the path or in a control plane (notebook 11: relakit.rivals) ---------------------------
def rival_differences_chart(table: pl.DataFrame, titles: dict[str, str], *, title: str,
                            baseline: str, subtitle: str = "") -> alt.HConcatChart:
    """One scenario's :func:`relakit.rivals.rival_table`: a panel per number (``titles``:
    number -> words with units, in panel order), each variant's paired difference from
    ``baseline`` with its 95 % interval, the point coloured by its verdict (better, worse,
    not significant), a rule at 0. Variants keep the table's order on a shared y axis."""
    variants = list(dict.fromkeys(table["variant"].to_list()))
    verdicts = {**PALETTE["verdict"], "not significant": NEUTRAL["not significant"]}
    frame = table.with_columns((pl.col("difference") - pl.col("difference_ci")).alias("lo"),
                               (pl.col("difference") + pl.col("difference_ci")).alias("hi"))
    y = alt.Y("variant:N", sort=variants, title=None, axis=alt.Axis(labelLimit=260))
    panels = []
    for i, (number, words) in enumerate(titles.items()):
        part = frame.filter(pl.col("number") == number)
        if part.height == 0:
            raise ValueError(f"rival_differences_chart: no rows for number {number!r}")
        base = alt.Chart(part).encode(y=y if i == 0 else y.axis(labels=False, ticks=False))
        # a 150 px panel over a wide span wrote its tick labels edge to edge (-0.4-0.3-0.2):
        # every other one is dropped until 6 px separate them
        axis = alt.Axis(labelOverlap=True, labelSeparation=6)
        x = alt.X("difference:Q", title=[words, f"minus {baseline}"], axis=axis)
        bars = base.mark_errorbar(ticks=True, color=NEUTRAL["note"]).encode(
            x=alt.X("lo:Q", title=[words, f"minus {baseline}"], axis=axis), x2="hi:Q")
        points = base.mark_point(filled=True, size=70).encode(
            x=x, color=alt.Color("verdict:N", title="paired difference (95 %)",
                                 scale=_scale(verdicts, list(verdicts)),
                                 legend=alt.Legend(orient="bottom")),
            tooltip=[alt.Tooltip("variant:N"), alt.Tooltip("value:Q", format=".4g"),
                     alt.Tooltip("value_ci:Q", title="± (95 %)", format=".2g"),
                     alt.Tooltip("baseline:Q", title=baseline, format=".4g"),
                     alt.Tooltip("difference:Q", format=".4g"),
                     alt.Tooltip("difference_ci:Q", title="difference ±", format=".2g"),
                     alt.Tooltip("verdict:N")])
        zero = alt.Chart(pl.DataFrame({"zero": [0.0]})).mark_rule(
            color=NEUTRAL["reference"], strokeDash=[3, 3]).encode(x=alt.X("zero:Q", axis=axis))
        panels.append(alt.layer(zero, bars, points).properties(width=150, height=alt.Step(18)))
    sub = subtitle or (f"each variant minus {baseline}, paired by seed (common random "
                       "numbers); bars: 95 % paired t intervals")
    return alt.hconcat(*panels, spacing=8, title=alt.TitleParams(text=title, subtitle=sub)
                       ).resolve_scale(y="shared", color="shared")


def _one_decimal(v: float) -> float:
    """``v`` at one decimal as ``f"{v:.1f}"`` writes it."""
    return float(f"{v:.1f}")


def decision_cost_figure(costs: pl.DataFrame, closed: pl.DataFrame, *, title: str,
                         subtitle: str = "") -> alt.LayerChart:
    """:func:`relakit.rivals.decision_cost_sweep` beside its closed form: the simulated
    goodput at each cost swept as a point with its 95 % error bar (``goodput_rps_ci``),
    ringed red where ``closed_form_rps`` lies outside it (:func:`flagged` lists those
    rows), and the closed form as a line through ``closed`` (``cost_share``,
    ``goodput_rps``: the closed form on a grid as fine as the caller likes, so the line
    is the curve, not straight segments between the costs simulated)."""
    for name, frame, cols in (("costs", costs, ("cost_share", "goodput_rps", "closed_form_rps")),
                              ("closed", closed, ("cost_share", "goodput_rps"))):
        missing = [c for c in cols if c not in frame.columns]
        if missing:
            raise ValueError(f"decision_cost_figure: {name} has no column {missing[0]!r}")
    x_title = "decision cost (% of the mean service time)"
    x = alt.X("cost_pct:Q", title=x_title)
    y = alt.Y("goodput_rps:Q", title="goodput (requests/s)", scale=alt.Scale(zero=True))
    sim = costs.select((pl.col("cost_share") * 100).alias("cost_pct"), "goodput_rps",
                       pl.col("closed_form_rps").alias("closed"), *_ci_col(costs, "goodput_rps"))
    layers, flags = _source_layers(
        closed.select((pl.col("cost_share") * 100).alias("cost_pct"), "goodput_rps"), sim, x, y,
        "closed form c / (s + cost)", "simulation (mean of the replications)", None,
        field="goodput_rps")
    note = _interval_note(costs, widest="goodput_rps_ci", fmt=".2g", unit=" requests/s")
    sub = "; ".join(t for t in (subtitle, note) if t) or alt.Undefined
    return layers.properties(title=alt.Title(title, subtitle=sub), width=PANEL_WIDTH,
                             height=240, usermeta={FLAGS_KEY: flags})


def decision_frontier_chart(frontier: pl.DataFrame, *, number_title: str, title: str,
                            subtitle: str = "") -> alt.LayerChart:
    """:func:`relakit.rivals.decision_frontier` as a map: the decision's cost (% of the
    mean service time) across, the control plane's mean delay down, each cell coloured by
    its winner on the number compared (``number_title``, words with units), grey where
    the paired difference is not significant, and written with the difference (in path
    minus control plane) and its 95 % half-width."""
    winners = {**PALETTE["winner"], "neither": NEUTRAL["not significant"]}
    # rounded as Python's f"{v:.1f}" rounds (the value a float holds), as prose formatted
    # from the same table writes it: polars' round gives 4.4 for 4.35 (4.3499... held)
    frame = frontier.with_columns(
        (pl.col("cost_share") * 100).map_elements(_one_decimal, return_dtype=pl.Float64
                                                  ).alias("cost_pct"),
        pl.col("delay_s").map_elements(_one_decimal, return_dtype=pl.Float64
                                       ).alias("delay_drawn_s"),
        pl.struct("difference", "difference_ci").map_elements(
            lambda r: (f"{r['difference']:+.3g}\n"
                       f"±{_fmt_like(r['difference_ci'], r['difference'])}"),
            return_dtype=pl.String).alias("label"))
    cells = alt.Chart(frame).encode(
        x=alt.X("cost_pct:O", title="decision cost in the path (% of mean service time)",
                axis=alt.Axis(labelAngle=0, grid=False)),
        y=alt.Y("delay_drawn_s:O", title="control plane's mean delay (s)", sort="ascending",
                axis=alt.Axis(grid=False)))
    rect = cells.mark_rect(stroke=NEUTRAL["veil"], strokeWidth=1).encode(
        color=alt.Color("winner:N", title=f"better {number_title} (paired 95 %)",
                        scale=_scale(winners, list(winners)),
                        legend=alt.Legend(orient="bottom", titleLimit=0)),
        tooltip=[alt.Tooltip("cost_pct:O", title="cost (%)"),
                 alt.Tooltip("cost_us:Q", title="cost (µs)", format=".0f"),
                 alt.Tooltip("delay_s:Q", title="mean delay (s)", format=".1f"),
                 alt.Tooltip("scrape_s:Q"), alt.Tooltip("eval_s:Q"),
                 alt.Tooltip("in_path:Q", title="in the path", format=".4g"),
                 alt.Tooltip("control_plane:Q", title="in a control plane", format=".4g"),
                 alt.Tooltip("difference:Q", format=".3g"),
                 alt.Tooltip("difference_ci:Q", title="±", format=".2g"),
                 alt.Tooltip("winner:N")])
    text = cells.mark_text(fontSize=10, lineBreak="\n", color=NEUTRAL["text light"]).encode(
        text="label:N")
    sub = subtitle or (f"cells: {number_title} in the path minus in a control plane, mean ± "
                       "95 % paired half-width over the seeds both share")
    layers = [rect, text]
    if "own_clocks" in frame.columns and frame["own_clocks"].any():
        # the control plane's shipped clocks (factor 1): where today's configuration sits
        layers.append(cells.transform_filter(alt.datum.own_clocks).mark_rect(
            filled=False, stroke=NEUTRAL["reference"], strokeWidth=3))
        sub = [*([sub] if isinstance(sub, str) else sub),
               "black outline: the control plane's own clocks (the shipped configuration)"]
    return alt.layer(*layers, title=alt.TitleParams(text=title, subtitle=sub)).properties(
        width=alt.Step(96), height=alt.Step(50))


# ---- the lab driven by an external tool (notebook 07) ------------------------------------------
def signals_against_thresholds(signals: pl.DataFrame, thresholds: pl.DataFrame,
                               timeline: pl.DataFrame, shade=None, domain=None,
                               titles: dict | None = None,
                               shade_label: str | None = None) -> alt.VConcatChart:
    """One panel per signal (``signals``: time_s, signal, value) with the policy's
    thresholds on it as dashed rules (``thresholds``: signal, condition, threshold), the
    mode below, on one time axis; ``shade`` (start_s, end_s) greys a phase (an
    overload) on every panel, named by ``shade_label`` under the first panel's title (a
    grey band nobody names reads as data). A threshold on a signal with no series is
    refused with its name (it would have no panel to be drawn on)."""
    titles = titles or {}
    if shade_label is not None and shade is None:
        raise ValueError("signals_against_thresholds: shade_label names a shade; give shade too")
    drawn = signals["signal"].unique(maintain_order=True).to_list()
    lost = thresholds.filter(~pl.col("signal").is_in(drawn))
    if lost.height:
        raise ValueError(
            "signals_against_thresholds: thresholds on signals with no series: "
            + ", ".join(f"{c!r} on {g!r}" for g, c in lost.select("signal", "condition").rows())
            + f"; the signals drawn are {', '.join(map(repr, drawn))}: give their series "
            "or leave those thresholds out")
    signals = signals.with_columns(pl.col("value").fill_nan(None))  # a gap breaks the line
    domain = domain or (float(signals["time_s"].min()), float(signals["time_s"].max()))
    panels = []
    for name in drawn:
        one = signals.filter(pl.col("signal") == name)
        layers = []
        if shade is not None:
            layers.append(alt.Chart(pl.DataFrame({"start_s": [shade[0]], "end_s": [shade[1]]}))
                          .mark_rect(color=NEUTRAL["outage"], opacity=0.6)
                          .encode(x=_time_x("start_s", domain), x2="end_s:Q"))
        layers.append(alt.Chart(one).mark_line(color=CATEGORY[0], clip=True).encode(
            x=_time_x("time_s", domain), y=alt.Y("value:Q", title=titles.get(name, name)),
            tooltip=["time_s:Q", "value:Q"]))
        rules = thresholds.filter(pl.col("signal") == name)
        if rules.height:
            layers.append(alt.Chart(rules).mark_rule(color=NEUTRAL["reference"],
                                                     strokeDash=[5, 3]).encode(
                y="threshold:Q", tooltip=["condition:N", "threshold:Q"]))
            layers.append(alt.Chart(rules).mark_text(align="left", dx=4, dy=-6,
                                                     color=NEUTRAL["note"]).encode(
                x=alt.value(0), y="threshold:Q", text="condition:N"))
        sub = shade_label if shade_label is not None and not panels else alt.Undefined
        panels.append(alt.layer(*layers).properties(
            width=PANEL_WIDTH, height=110, title=alt.Title(titles.get(name, name), subtitle=sub)))
    panels.append(mode_timeline(timeline, domain=domain))
    return alt.vconcat(*panels).resolve_scale(x="shared")
