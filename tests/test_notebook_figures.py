"""The notebooks' figure builders (relakit.plots, "notebook figures") and their parameters.

The specs are checked, not the pictures: which layer draws which source with which
mark, what the legends say, what a heatmap's title admits about its filter, and that
a line's data holds nulls where a bin is empty (so it breaks there).
"""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest
from conftest import ROOT

from relakit import plots

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
RUNNER = {"out_dir", "figures_dir", "static_figures"}


def _layers(spec: dict) -> list[dict]:
    """Every single-view spec inside a (nested) layer/concat spec."""
    out = []
    for key in ("layer", "hconcat", "vconcat", "concat"):
        for sub in spec.get(key, []):
            out += _layers(sub)
    if "mark" in spec:
        out.append(spec)
    return out


def _mark(view: dict) -> str:
    m = view["mark"]
    return m if isinstance(m, str) else m["type"]


def _data(chart, view: dict) -> list[dict]:
    spec = chart.to_dict()
    return spec["datasets"][view["data"]["name"]]


def test_closed_form_and_simulation_differ_in_mark_and_legend():
    tails = pl.DataFrame({
        "utilisation": [0.5, 0.5, 0.9, 0.9], "quantile": ["p50", "p99", "p50", "p99"],
        "simulated_ms": [0.7, 4.6, 1.5, 7.0], "erlang_c_ms": [0.71, 4.62, 1.52, 7.09]})
    chart = plots.queueing_tails(tails, servers=8)
    views = _layers(chart.to_dict())
    assert sorted(_mark(v) for v in views) == ["line", "point"]
    line = next(v for v in views if _mark(v) == "line")
    points = next(v for v in views if _mark(v) == "point")
    # each source has its own legend channel, and the entries name the source
    assert line["encoding"]["strokeDash"]["scale"]["domain"] == ["closed form (Erlang C)"]
    assert points["encoding"]["shape"]["scale"]["domain"] == ["simulation"]
    assert "shape" not in line["encoding"] and "strokeDash" not in points["encoding"]
    # both coloured by quantile, the same colour for the same quantile
    assert line["encoding"]["color"]["field"] == points["encoding"]["color"]["field"] == "quantile"
    assert line["encoding"]["color"]["scale"] == points["encoding"]["color"]["scale"]
    # the line draws Erlang C and the points the simulation, not the other way round
    assert {r["ms"] for r in _data(chart, line)} == {0.71, 4.62, 1.52, 7.09}
    assert {r["ms"] for r in _data(chart, points)} == {0.7, 4.6, 1.5, 7.0}
    assert line["encoding"]["y"]["scale"]["type"] == "log"
    for v in views:
        for ch in ("x", "y"):
            assert "(" in v["encoding"][ch]["title"], v["encoding"][ch]  # a unit or scale


def test_fanout_figure_has_both_sources_in_both_panels():
    fanout = pl.DataFrame({"width": [1, 10], "closed_form": [0.99, 0.904],
                           "simulated": [0.989, 0.905], "p99_ms": [46.0, 69.5],
                           "p99_closed_form_ms": [46.05, 69.03]})
    spec = plots.fanout_figure(fanout, 0.99).to_dict()
    assert len(spec["hconcat"]) == 2
    for panel in spec["hconcat"]:
        assert sorted(_mark(v) for v in _layers(panel)) == ["line", "point"]
    labels = [v["encoding"]["strokeDash"]["scale"]["domain"][0] for v in _layers(spec)
              if "strokeDash" in v["encoding"]]
    assert labels[0] == "closed form: 0.99ⁿ"


def test_hedging_collapse_names_policies_on_a_log_axis():
    hedging = pl.DataFrame({"load": [0.3, 0.3, 0.9, 0.9], "hedging": ["off", "never"] * 2,
                            "p99_ms": [100.0, 20.0, 294.0, 26301.0]})
    chart = plots.hedging_collapse(hedging)
    views = _layers(chart.to_dict())
    line = next(v for v in views if _mark(v) == "line")
    assert line["encoding"]["y"]["scale"]["type"] == "log"
    assert line["encoding"]["color"]["scale"]["domain"] == ["no hedging",
                                                           "hedge, loser never cancelled"]
    assert any(_mark(v) == "text" for v in views)  # the values are written on the points
    with pytest.raises(pl.exceptions.InvalidOperationError):
        plots.hedging_collapse(hedging.with_columns(pl.lit("sometimes").alias("hedging")))


def _sweep() -> pl.DataFrame:
    rows = [{"overloaded": o, "window_s": w, "eval_s": e, "first_s": o + w + 10 * e}
            for o in (200, 300) for w in (30, 60) for e in (1, 2)]
    return pl.DataFrame(rows)


def test_heatmap_states_and_applies_its_filter():
    titles = {"overloaded": "threshold (ms)", "window_s": "query window (s)",
              "eval_s": "evaluation interval (s)", "first_s": "first entry (s)"}
    chart = plots.heatmap(_sweep(), "overloaded", "window_s", "first_s", "First entry",
                          where={"eval_s": 2}, titles=titles)
    spec = chart.to_dict()
    assert spec["title"]["text"] == "First entry"
    assert spec["title"]["subtitle"] == "only evaluation interval = 2 s"
    rect = next(v for v in _layers(spec) if _mark(v) == "rect")
    assert rect["encoding"]["x"]["title"] == "threshold (ms)"
    assert rect["encoding"]["y"]["title"] == "query window (s)"
    assert rect["encoding"]["color"]["title"] == "first entry (s)"
    values = sorted(r["first_s"] for r in spec["datasets"][spec["data"]["name"]])
    assert values == [250, 280, 350, 380]  # only the eval_s == 2 rows


def test_heatmap_says_when_a_cell_is_a_mean():
    chart = plots.heatmap(_sweep(), "overloaded", "window_s", "first_s")
    spec = chart.to_dict()
    assert spec["title"]["subtitle"] == "mean of 2 points per cell"
    assert spec["title"]["text"] == "first_s"
    with pytest.raises(ValueError, match="no rows"):
        plots.heatmap(_sweep(), "overloaded", "window_s", "first_s", where={"eval_s": 7})


def test_ok_share_breaks_at_empty_bins():
    shares = pl.DataFrame({"source": ["live"] * 3 + ["simulation"] * 4,
                           "t": [0.0, 1.0, 3.0, 0.0, 1.0, 2.0, 3.0],
                           "ok_share": [1.0, 0.5, 0.4, 1.0, 0.2, 0.3, 0.4]})
    chart = plots.ok_share_over_time(shares, bin_s=1.0, title="ok, all tiers")
    spec = chart.to_dict()
    rows = spec["datasets"][spec["data"]["name"]]
    live = {r["t"]: r["ok_share"] for r in rows if r["source"] == "live"}
    assert live == {0.0: 1.0, 1.0: 0.5, 2.0: None, 3.0: 0.4}  # a null, not a bridged line
    assert spec["mark"]["invalid"] == "break-paths-show-domains"
    enc = spec["encoding"]
    assert enc["color"]["scale"]["domain"] == enc["strokeDash"]["scale"]["domain"]  # one legend
    assert enc["y"]["title"] == "requests answered ok (share)"


def test_step_delay_cdf_draws_replays_as_steps():
    xs = np.linspace(0, 10, 5)
    chart = plots.step_delay_cdf(pl.DataFrame({"delay_s": xs, "cdf": xs / 10}),
                                 pl.DataFrame({"delay_s": [2.0, 5.0], "cdf": [0.5, 1.0]}),
                                 title="delay")
    views = [v for v in _layers(chart.to_dict()) if _mark(v) == "line"]
    interps = sorted(v["mark"].get("interpolate", "linear") for v in views)
    assert interps == ["linear", "step-after"]
    labels = [v["encoding"]["strokeDash"]["scale"]["domain"][0] for v in views]
    assert labels == ["closed form (sum of uniforms)", "controller replayed (2 random phases)"]


# ---- uncertainty on every picture ------------------------------------------------------------
def _fanout(simulated_ci=0.001):
    ws = [1, 10, 20]
    return pl.DataFrame({"width": ws, "closed_form": [0.99**w for w in ws],
                         "simulated": [0.9901, 0.9055, 0.8100], "simulated_ci": [simulated_ci] * 3,
                         "p99_ms": [46.1, 69.4, 76.0], "p99_ms_ci": [0.5, 0.8, 0.9],
                         "p99_closed_form_ms": [46.05, 69.03, 75.95], "replications": [5] * 3})


def test_outside_interval_flags_only_a_closed_form_the_interval_misses():
    f = pl.DataFrame({"v": [1.0, 1.0, 1.0, 1.0], "ci": [0.1, 0.1, float("nan"), None],
                      "c": [1.05, 1.2, 5.0, 5.0]})
    assert plots.outside_interval(f, "v", "ci", "c").to_list() == [False, True, False, False]


def test_fanout_draws_error_bars_and_rings_the_point_whose_interval_misses():
    chart = plots.fanout_figure(_fanout(), 0.99)
    spec = chart.to_dict()
    for panel in spec["hconcat"]:
        marks = [_mark(v) for v in _layers(panel)]
        assert "errorbar" in marks and "line" in marks and "point" in marks
        assert panel["title"]["subtitle"].startswith(
            "bars: 95 % intervals over 5 replications (Student t); widest ±")
    flags = plots.flagged(chart)
    # 0.9055 ± 0.001 misses 0.99^10 = 0.90438; 0.81 ± 0.001 misses 0.99^20 = 0.81791
    assert [(f["panel"], f["width"]) for f in flags] == [("success", 10), ("success", 20)]
    rings = [v for v in _layers(spec["hconcat"][0]) if "stroke" in v["encoding"]]
    assert len(rings) == 1
    assert rings[0]["encoding"]["stroke"]["scale"] == {"domain": [plots.FLAG_LABEL],
                                                       "range": [plots.FLAG_COLOR]}
    assert {r["width"] for r in _data(chart, rings[0])} == {10, 20}
    assert not [v for v in _layers(spec["hconcat"][1]) if "stroke" in v["encoding"]]
    # wide enough intervals: nothing flagged, no ring, no legend entry
    wide = plots.fanout_figure(_fanout(simulated_ci=0.02), 0.99)
    assert plots.flagged(wide) == []
    assert not [v for v in _layers(wide.to_dict()) if "stroke" in v["encoding"]]


def test_queueing_tails_error_bars_span_the_interval_and_flag_erlang_c_outside():
    tails = pl.DataFrame({"utilisation": [0.5, 0.95], "quantile": ["p99", "p999"],
                          "simulated_ms": [4.6, 14.5], "simulated_ms_ci": [0.05, 1.0],
                          "erlang_c_ms": [4.62, 18.1], "replications": [5, 5]})
    chart = plots.queueing_tails(tails, servers=8)
    bars = next(v for v in _layers(chart.to_dict()) if _mark(v) == "errorbar")
    spans = {r["utilisation"]: (r["ci_low"], r["ci_high"]) for r in _data(chart, bars)}
    assert spans[0.5] == pytest.approx((4.55, 4.65)) and spans[0.95] == pytest.approx((13.5, 15.5))
    assert [(f["utilisation"], f["quantile"]) for f in plots.flagged(chart)] == [(0.95, "p99.9")]


def test_a_single_run_has_no_bars_and_no_flags():
    tails = pl.DataFrame({"utilisation": [0.5], "quantile": ["p99"], "simulated_ms": [4.0],
                          "erlang_c_ms": [4.62]})
    chart = plots.queueing_tails(tails, servers=8)
    assert "errorbar" not in [_mark(v) for v in _layers(chart.to_dict())]
    assert plots.flagged(chart) == []


def test_hedging_bars_and_labels_carry_the_interval():
    hedging = pl.DataFrame({"load": [0.3, 0.9], "hedging": ["off", "off"],
                            "p99_ms": [100.0, 294.0], "p99_ms_ci": [3.0, 40.0],
                            "replications": [5, 5]})
    chart = plots.hedging_collapse(hedging)
    views = _layers(chart.to_dict())
    assert any(_mark(v) == "errorbar" for v in views)
    text = next(v for v in views if _mark(v) == "text")
    assert {r["label"] for r in _data(chart, text)} == {"100 ± 3", "294 ± 40"}


def test_step_delay_band_is_the_dkw_band_and_flags_a_shifted_closed_form():
    rng = np.random.default_rng(3)
    delays = np.sort(rng.uniform(0, 10, 400))
    replayed = pl.DataFrame({"delay_s": delays, "cdf": np.arange(1, 401) / 400})
    xs = np.linspace(0, 10, 41)
    good = plots.step_delay_cdf(pl.DataFrame({"delay_s": xs, "cdf": xs / 10}), replayed, "d")
    assert plots.flagged(good) == []  # the true CDF inside the band
    assert plots.dkw_half_width(400) == pytest.approx(np.sqrt(np.log(40) / 800))
    shifted = pl.DataFrame({"delay_s": xs, "cdf": np.clip(xs / 10 + 0.15, 0, 1)})
    bad = plots.step_delay_cdf(shifted, replayed, "d")
    assert len(plots.flagged(bad)) > 10
    assert any("stroke" in v["encoding"] for v in _layers(bad.to_dict()))


def test_ok_share_band_only_for_a_replicated_source_and_it_breaks_at_gaps():
    shares = pl.DataFrame({"source": ["sim"] * 3 + ["live"] * 2, "t": [0.0, 1.0, 3.0, 0.0, 1.0],
                           "ok_share": [1.0, 0.9, 0.5, 1.0, 0.8],
                           "ok_share_ci": [0.0, 0.05, 0.1, None, None],
                           "replications": [5] * 5})
    spec = plots.ok_share_over_time(shares).to_dict()
    areas = [v for v in _layers(spec) if _mark(v) == "area"]
    assert len(areas) == 1 and areas[0]["mark"]["invalid"] == "break-paths-show-domains"
    rows = spec["datasets"][areas[0]["data"]["name"]]
    high = {r["t"]: r["high"] for r in rows}
    assert high[2.0] is None  # the gap reaches the band: it breaks there
    assert high[0.0] == 1.0 and high[1.0] == pytest.approx(0.95) and high[3.0] == 0.6
    assert spec["title"]["subtitle"] == "bands: 95 % intervals over 5 replications (Student t)"


def _replicated_sweep() -> pl.DataFrame:
    rows = []
    for d in (10, 20, 40):
        for load in (0.3, 0.9):
            rows.append({"point_id": f"{d}-{load}", "baseline_id": f"40-{load}", "delay": d,
                         "load": load, "p99_ms": d * load, "p99_ms_ci": 1.5,
                         "p99_ms_significant": None if d == 40 else d == 10,
                         "replications": 5})
    return pl.DataFrame(rows)


def test_heatmap_marks_cells_not_significantly_different_from_the_baseline():
    chart = plots.heatmap(_replicated_sweep(), "delay", "load", "p99_ms", "p99")
    spec = chart.to_dict()
    views = _layers(spec)
    marked = next(v for v in views if "stroke" in v["encoding"])
    kinds = {(r["delay"], r["load"]): r["mark"] for r in _data(chart, marked)}
    assert kinds == {(20, 0.3): plots.NOT_SIGNIFICANT, (20, 0.9): plots.NOT_SIGNIFICANT,
                     (40, 0.3): plots.BASELINE, (40, 0.9): plots.BASELINE}
    assert marked["encoding"]["stroke"]["scale"]["domain"] == [plots.BASELINE,
                                                               plots.NOT_SIGNIFICANT]
    tag = next(v for v in views if v["encoding"].get("text", {}).get("value") == "n.s.")
    assert tag["transform"][0]["filter"]  # only on the n.s. cells
    text = next(v for v in views if v["encoding"].get("text", {}).get("field") == "label")
    labels = {(r["delay"], r["load"]): r["label"] for r in _data(chart, text)}
    assert labels[(10, 0.9)] == "9\n±2" and labels[(40, 0.3)] == "12\n±2"  # the value's decimals
    assert "95 % intervals over 5 replications" in spec["title"]["subtitle"]


def test_heatmap_does_not_mark_cells_that_average_several_points():
    t = _replicated_sweep().with_columns(pl.lit(1).alias("other"))
    t = pl.concat([t, t.with_columns(pl.lit(2).alias("other"))])
    spec = plots.heatmap(t, "delay", "load", "p99_ms").to_dict()
    assert "significance not shown" in spec["title"]["subtitle"]
    assert not [v for v in _layers(spec) if "stroke" in v["encoding"]]
    with pytest.raises(ValueError, match="no column"):
        plots.heatmap(_sweep(), "overloaded", "window_s", "first_s", significant="nope")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_notebook_accepts_the_runner_parameters(path):
    import papermill

    params = papermill.inspect_notebook(str(path))
    assert RUNNER <= set(params), f"{path.name} lacks {sorted(RUNNER - set(params))}"


MINE = ["01_fanout", "02_queueing", "03_clocks", "06_sweeps", "07_live_vs_sim"]


@pytest.mark.parametrize("name", MINE)
def test_parameters_are_typed_and_commented(name):
    """`papermill --help-notebook` documents each parameter: a type and a comment."""
    import papermill

    path = ROOT / "notebooks" / f"{name}.ipynb"
    for pname, p in papermill.inspect_notebook(str(path)).items():
        assert p["inferred_type_name"] != "None", f"{name}: {pname} has no type"
        assert p["help"].strip(), f"{name}: {pname} has no comment"
    cells = json.loads(path.read_text())["cells"]
    tagged = [c for c in cells if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(tagged) == 1, f"{name}: one cell tagged 'parameters'"


def test_the_blast_radius_figure_stands_alone():
    ci = pl.DataFrame({"scope": ["fleet", "zone"], "mean": [61234.0, 0.0],
                       "low": [58000.0, 0.0], "high": [64500.0, 0.0]})
    spec = plots.blast_radius_chart(ci, 5).to_dict()
    assert spec["title"]["text"].startswith("Blast radius")
    assert "over 5 replications" in spec["title"]["subtitle"]
    assert "whisker: 95 % interval" in spec["title"]["subtitle"]
    texts = {r["scope"]: r["text"] for d in spec["datasets"].values() for r in d}
    assert texts == {"fleet": "61,234 (95 %: 58,000 to 64,500)", "zone": "0"}
    x = next(v["encoding"]["x"] for v in _layers(spec) if _mark(v) == "bar")
    assert x["axis"]["format"] == ",.0f" and "per run" in x["title"]


def test_the_zone_series_chart_draws_a_band_when_given_intervals():
    series = pl.DataFrame({"scope": ["fleet"] * 4, "zone": ["zone 0", "zone 0", "zone 1", "zone 1"],
                           "time_s": [0.0, 1.0, 0.0, 1.0], "dropped_rps": [1.0, 2.0, 0.0, 0.5],
                           "dropped_rps_ci": [0.5, 0.5, 0.1, 0.1], "replications": [3] * 4})
    spec = plots.zone_series_chart(series, (0.0, 1.0)).to_dict()
    marks = [_mark(v) for v in _layers(spec)]
    assert "area" in marks and "line" in marks and "rect" in marks
    assert "95 % intervals over 3 replications" in json.dumps(spec)
    one = plots.zone_series_chart(series.drop("dropped_rps_ci", "replications")).to_dict()
    assert "area" not in [_mark(v) for v in _layers(one)] and "one run" in json.dumps(one)


def test_notebooks_readme_names_every_notebook_and_parameter():
    """notebooks/README.md lists each notebook in its table and each parameter (beyond the
    three runner parameters) in its Parameters section, computed from the notebooks."""
    import re

    text = (ROOT / "notebooks" / "README.md").read_text()
    section = re.search(r"^## Parameters\n(.*?)(?=^## )", text, re.S | re.M).group(1)
    named = set(re.findall(r"`(\w+)`", section))
    for nb in NOTEBOOKS:
        assert f"| `{nb.stem}` |" in text, f"{nb.name} has no row in notebooks/README.md"
        cell = next(c for c in json.loads(nb.read_text())["cells"]
                    if "parameters" in c.get("metadata", {}).get("tags", []))
        params = set(re.findall(r"^(\w+)\s*:", "".join(cell["source"]), re.M)) - RUNNER
        assert params <= named, f"{nb.name}: {sorted(params - named)} not in notebooks/README.md"


def test_shares_read_as_percentages_on_the_twin_and_the_front():
    from types import SimpleNamespace

    t = np.arange(25, 101, 25.0)
    overlay = pl.concat([pl.DataFrame({"time_s": t, "signal": [s] * t.size, "recorded": t,
                                       "twin": t, "twin_lo": t, "twin_hi": t})
                         for s in ("request_rate_rps", "error_ratio", "p99_ms")])
    spec = plots.twin_overlay(overlay, 25).to_dict()
    formats = [p["layer"][0]["encoding"]["y"]["axis"]["format"] for p in spec["vconcat"]]
    assert formats == [",.4~g", "%", ",.4~g"]
    trials = pl.DataFrame({"trial": [0, 1], "dropped_share": [0.3, 0.4],
                           "dropped_share_ci": [0.01] * 2, "seconds_over_slo": [30.0, 20.0],
                           "seconds_over_slo_ci": [1.0] * 2})
    res = SimpleNamespace(trials=trials, front=trials, info={},
                          spec=SimpleNamespace(replications=3))
    spec = plots.pareto_front(res, "dropped_share", "seconds_over_slo", "dropped (share)",
                              "seconds over the SLO (s)").to_dict()
    point = next(v for v in _layers(spec) if _mark(v) == "point")
    assert point["encoding"]["x"]["axis"]["format"] == "%"
    assert point["encoding"]["y"]["axis"]["format"] == ",.4~g"


def test_a_band_cut_at_a_bound_says_so():
    frame = pl.DataFrame({"t": [0.0, 1.0, 0.0, 1.0], "run": ["a", "a", "b", "b"],
                          "rps": [1.0, 5.0, 2.0, 3.0], "rps_ci": [2.0, 1.0, 0.5, 0.5],
                          "replications": [3] * 4})
    spec = plots.compare_series_bands(frame, "t", "rps", "run", title="x", x_title="t (s)",
                                      y_title="rps").to_dict()
    assert spec["title"]["subtitle"].endswith("(cut off at 0)")
    inside = frame.with_columns(pl.lit(0.5).alias("rps_ci"))
    spec = plots.compare_series_bands(inside, "t", "rps", "run", title="x", x_title="t (s)",
                                      y_title="rps").to_dict()
    assert "cut off" not in spec["title"]["subtitle"]


def test_ctmc_boundary_is_drawn_only_where_it_crosses_inside_the_grid():
    b = pl.DataFrame({"size": [1.0] * 3 + [2.0] * 3 + [3.0] * 3,
                      "duration_s": [10.0, 20.0, 30.0] * 3,
                      "p_recover": [0.9, 0.8, 0.7, 0.9, 0.6, 0.2, 0.4, 0.1, 0.0]})
    line = plots.ctmc_boundary(b)
    # size 1 never falls below 1/2, size 3 is below it already at 10 s: neither is drawn
    assert line["size"].to_list() == [2.0]
    assert line["duration_s"][0] == pytest.approx(20.0 + (0.6 - 0.5) / (0.6 - 0.2) * 10.0)


def test_basin_chart_layers_and_control_frontier_legend():
    cells = pl.DataFrame({"size": [1.0, 2.0, 1.0, 2.0], "duration_s": [5.0, 5.0, 20.0, 20.0],
                          "recovered": [6, 3, 6, 0], "replications": [6] * 4,
                          "p_recover": [1.0, 0.5, 1.0, 0.0], "p_low": [0.54, 0.12, 0.54, 0.0],
                          "p_high": [1.0, 0.88, 1.0, 0.46],
                          "recovery_p50_s": [1.0, 3.0, 2.0, None]})
    b = cells.select("size", "duration_s", pl.col("p_recover").alias("p_recover"))
    chart = plots.basin_chart(cells, b.with_columns(pl.Series("p_recover", [0.9, 0.8, 0.9, 0.1])),
                              size_title="spike size (x)", title="map")
    views = _layers(chart.to_dict())
    assert sorted(_mark(v) for v in views) == ["line", "rect", "text"]
    rect = next(v for v in views if _mark(v) == "rect")
    assert rect["encoding"]["color"]["scale"]["domain"] == [0, 1]
    assert rect["encoding"]["y"]["title"] == "trigger duration (s)"
    frontier = pl.DataFrame({"size": [2.5, 3.5], "delay_s": [6.0, 6.0], "scrape_s": [1, 1],
                             "window_s": [5, 5], "recovered": [6, 6], "replications": [6, 6],
                             "p_low": [0.54, 0.54], "recovery_mean_s": [0.0, 5.0],
                             "recovery_mean_s_ci": [0.0, 12.8]})
    spec = plots.control_frontier_chart(frontier, title="f").to_dict()
    for view in _layers(spec):  # colour and dash on every layer: one legend, not two
        assert view["encoding"]["color"]["field"] == view["encoding"]["strokeDash"]["field"]
    shares = frontier.with_columns(p_recover=pl.lit(1.0), p_high=pl.lit(1.0))
    spec = plots.control_frontier_chart(shares, title="f", measure="p_recover").to_dict()
    ys = {v["mark"]["type"] if isinstance(v["mark"], dict) else v["mark"]:
          v["encoding"]["y"] for v in _layers(spec)}
    assert ys["line"]["field"] == "p_recover" and ys["line"]["scale"]["domain"] == [0, 1]
    assert ys["errorbar"]["field"] == "lo" and "Clopper" in spec["title"]["subtitle"]
    assert ys["rule"]["field"] == "half"  # the level half the runs saved
    assert ys["text"]["field"] == "half"  # ... and it says so
    # two spikes at one delay: drawn apart (a dodge, told in the subtitle), tooltip exact
    views = _layers(spec)
    line = next(v for v in views if _mark(v) == "line")
    rows = _data(plots.control_frontier_chart(shares, title="f", measure="p_recover"), line)
    drawn = sorted(r["delay_drawn_s"] for r in rows)
    assert drawn[0] < 6.0 < drawn[1] and all(r["delay_s"] == 6.0 for r in rows)
    assert "drawn up to" in spec["title"]["subtitle"]
    assert any(t.get("field") == "delay_s" for t in line["encoding"]["tooltip"])
    with pytest.raises(ValueError, match="measure: expected"):
        plots.control_frontier_chart(frontier, title="f", measure="p")


def test_compare_series_pins_a_closed_form_and_a_simulation_to_their_palette_colours():
    frame = pl.DataFrame({"x": [0.0, 1.0] * 2, "y": [4.0, 3.0, 4.1, 2.9],
                          "y_ci": [0.2, 0.2, None, None], "replications": [3, 3, None, None],
                          "source": ["simulation"] * 2 + ["closed form"] * 2})
    pinned = {"simulation": plots.SIMULATION_COLOR, "closed form": plots.CLOSED_FORM_COLOR}
    spec = plots.compare_series_bands(frame, "x", "y", "source", title="t", x_title="x (s)",
                                      y_title="y (rps)", colors=pinned).to_dict()
    ranges = [v["encoding"]["color"]["scale"]["range"] for v in _layers(spec)
              if "color" in v["encoding"] and "scale" in v["encoding"]["color"]]
    assert ranges and all(r == [plots.SIMULATION_COLOR, plots.CLOSED_FORM_COLOR] for r in ranges)
    free = plots.compare_series(frame, "x", "y", "source", title="t", x_title="x", y_title="y",
                                colors={"closed form": plots.CATEGORY[0]}).to_dict()
    line = next(v for v in _layers(free) if _mark(v) == "line")
    assert line["encoding"]["color"]["scale"]["range"] == [plots.CATEGORY[1], plots.CATEGORY[0]]
    with pytest.raises(ValueError, match="no series named"):
        plots.compare_series(frame, "x", "y", "source", title="t", x_title="x", y_title="y",
                             colors={"Erlang C": "#333333"})


def test_a_shaded_phase_is_named_under_the_first_panel_title_only():
    signals = pl.DataFrame({"time_s": [0.0, 1.0, 2.0] * 2, "signal": ["busy"] * 3 + ["p99"] * 3,
                            "value": [0.5, 0.9, 0.95, 200.0, 800.0, 900.0]})
    rules = pl.DataFrame({"signal": ["busy"], "condition": ["saturated"], "threshold": [0.85]})
    timeline = pl.DataFrame({"time_s": [0.0, 1.5], "mode": ["normal", "survival"]})
    spec = plots.signals_against_thresholds(signals, rules, timeline, shade=(1.0, 2.0),
                                            domain=(0.0, 3.0), shade_label="grey: the overload"
                                            ).to_dict()
    titles = [panel.get("title") for panel in spec["vconcat"]]
    assert titles[0]["subtitle"] == "grey: the overload"
    assert all("grey: the overload" not in json.dumps(t) for t in titles[1:])
    with pytest.raises(ValueError, match="shade_label names a shade"):
        plots.signals_against_thresholds(signals, rules, timeline, shade_label="grey")
    # a threshold with no series to draw it on is refused by name, not dropped
    more = pl.concat([rules, pl.DataFrame({"signal": ["in_system"], "condition": ["queued"],
                                           "threshold": [18.0]})])
    with pytest.raises(ValueError, match=r"no series: 'queued' on 'in_system'; the signals "
                                         r"drawn are 'busy', 'p99'"):
        plots.signals_against_thresholds(signals, more, timeline)
    rules_drawn = [v for p in spec["vconcat"][:-1] for v in p["layer"]
                   if v["mark"]["type"] == "rule"]
    assert len(rules_drawn) == 1  # busy's threshold on busy's panel; p99 has none


def test_decision_cost_points_carry_bars_the_closed_form_is_a_curve_and_misses_are_ringed():
    costs = pl.DataFrame({"cost_share": [0.0, 0.5, 1.0], "goodput_rps": [399.0, 250.0, 200.5],
                          "goodput_rps_ci": [6.0, 3.0, 2.0],
                          "closed_form_rps": [400.0, 266.7, 200.0],
                          "replications": [3, 3, 3]})
    grid = np.linspace(0.0, 1.0, 21)
    closed = pl.DataFrame({"cost_share": grid, "goodput_rps": 4 / (0.01 + grid * 0.01)})
    chart = plots.decision_cost_figure(costs, closed, title="t")
    views = _layers(chart.to_dict())
    assert sorted(_mark(v) for v in views) == ["errorbar", "line", "point", "point"]
    line = next(v for v in views if _mark(v) == "line")
    assert len(_data(chart, line)) == 21  # the closed form on the caller's grid, not 3 points
    assert line["encoding"]["x"]["title"] == "decision cost (% of the mean service time)"
    assert line["encoding"]["y"]["title"] == "goodput (requests/s)"
    # only the cost whose interval misses its closed form (0.5: 250 ± 3 against 266.7) is ringed
    assert [r["cost_pct"] for r in plots.flagged(chart)] == [50.0]
    assert "95 % intervals over 3 replications" in chart.to_dict()["title"]["subtitle"]
    with pytest.raises(ValueError, match="closed has no column 'goodput_rps'"):
        plots.decision_cost_figure(costs, closed.rename({"goodput_rps": "rps"}), title="t")


def test_the_frontier_rounds_delays_as_the_prose_does():
    # 4.35 is held as 4.3499...: the prose's f"{:.1f}" writes 4.3, and so must the axis
    frontier = pl.DataFrame({"cost_share": [0.0, 0.0], "cost_us": [0.0, 0.0],
                             "delay_s": [4.35, 21.75], "scrape_s": [1.5] * 2, "eval_s": [0.2] * 2,
                             "in_path": [0.85, 0.85], "control_plane": [0.97, 0.79],
                             "difference": [-0.12, 0.06], "difference_ci": [0.02, 0.01],
                             "winner": ["in a control plane", "in the path"]})
    chart = plots.decision_frontier_chart(frontier, number_title="gold success", title="t")
    spec = chart.to_dict()  # both layers draw one frame, held by the layer chart
    drawn = sorted(r["delay_drawn_s"] for r in spec["datasets"][spec["data"]["name"]])
    assert [f"{d:g}" for d in drawn] == [f"{v:.1f}" for v in (4.35, 21.75)] == ["4.3", "21.8"]
