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
    views = _layers(chart.to_dict())
    interps = sorted(v["mark"].get("interpolate", "linear") for v in views)
    assert interps == ["linear", "step-after"]
    labels = [v["encoding"]["strokeDash"]["scale"]["domain"][0] for v in views]
    assert labels == ["closed form (sum of uniforms)", "controller replayed (2 random phases)"]


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
