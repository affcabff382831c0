"""Every colour relakit's figures draw comes from plots.PALETTE, one meaning per colour.

Read from the charts' specs (altair ``to_dict()``) of the figure builders in
relakit/plots.py, built on small frames: each colour a spec carries is one of
the table's; a tier, mode or outcome is drawn in its own colour wherever it
appears; red is drawn only for an error (the error outcome, a closed form outside
its interval). And plots.py writes no colour outside the table, so a new builder
cannot bring its own.
"""

from __future__ import annotations

import colorsys
import re

import numpy as np
import polars as pl
import pytest
from conftest import ROOT

from relakit import plots

NAMED = {"black", "white", "gray", "grey", "red", "green", "blue", "orange", "purple",
         "steelblue", "none"}


def _flat(value):
    if isinstance(value, dict):
        for v in value.values():
            yield from _flat(v)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from _flat(v)
    else:
        yield value


def _table_colours() -> set[str]:
    return {c.lower() for c in _flat(plots.PALETTE) if isinstance(c, str)}


def _is_red(colour: str) -> bool:
    r, g, b = (int(colour[i:i + 2], 16) / 255 for i in (1, 3, 5))
    h, _, s = colorsys.rgb_to_hls(r, g, b)
    return s > 0.45 and max(r, g, b) > 0.45 and (h < 12 / 360 or h > 348 / 360)


def _colours(spec, path=()):
    """(path, colour) for every colour literal a spec holds (scale ranges included)."""
    if isinstance(spec, dict):
        for k, v in spec.items():
            yield from _colours(v, (*path, k))
    elif isinstance(spec, list):
        for i, v in enumerate(spec):
            yield from _colours(v, (*path, i))
    elif isinstance(spec, str) and re.fullmatch(r"#[0-9a-fA-F]{6}", spec):
        yield path, spec.lower()


def _encodings(spec):
    """Every colour-like encoding (color, fill, stroke) with a field and a scale."""
    if isinstance(spec, dict):
        enc = spec.get("encoding", {})
        for ch in ("color", "fill", "stroke"):
            e = enc.get(ch)
            if isinstance(e, dict) and "field" in e and isinstance(e.get("scale"), dict):
                yield e
        for v in spec.values():
            yield from _encodings(v)
    elif isinstance(spec, list):
        for v in spec:
            yield from _encodings(v)


def test_the_table_has_red_for_errors_only_and_plots_py_writes_no_colour_of_its_own():
    reds = {c for c in _table_colours() if c.startswith("#") and _is_red(c)}
    assert reds == {c.lower() for c in plots.ERROR_COLORS}, reds
    assert plots.PALETTE["outcome"]["error"] in plots.ERROR_COLORS
    # no two modes, tiers or outcomes share a colour, and survival is one colour
    for group in ("outcome", "tier", "mode"):
        assert len(set(plots.PALETTE[group].values())) == len(plots.PALETTE[group])
    source = (ROOT / "relakit" / "plots.py").read_text()
    start = source.index("PALETTE = {")
    end = source.index("\n}\n", start)
    outside = source[:start] + source[end:]
    assert not re.findall(r"#[0-9a-fA-F]{6}\b", outside), "a colour written outside PALETTE"
    named = re.findall(r"""(?:color|fill|stroke)\s*=\s*["']([a-z]+)["']""", outside)
    named += re.findall(r"""alt\.value\(["']([a-z]+)["']\)""", outside)
    assert not [n for n in named if n in NAMED and n != "none"], named


def _figures(tmp_path):
    """The figures built here, by name: each builder on a small frame."""
    rng = np.random.default_rng(1)
    n = 600
    t = np.sort(rng.uniform(0, 60, n))
    req = pl.DataFrame({
        "arrival_s": t, "finish_s": t + 0.05,
        "latency_ms": rng.exponential(20, n),
        "tier": rng.choice(["gold", "silver", "bronze"], n),
        "outcome": rng.choice(["ok", "error", "timeout", "dropped"], n, p=[.7, .1, .1, .1]),
        "node": rng.integers(0, 3, n)})
    timeline = pl.DataFrame({"time_s": [0.0, 10.0, 30.0], "mode": ["normal", "performance",
                                                                    "survival"]})
    tails = pl.DataFrame({
        "utilisation": [0.5, 0.5, 0.5, 0.9, 0.9, 0.9], "quantile": ["p50", "p99", "p999"] * 2,
        "simulated_ms": [0.7, 4.6, 7.0, 1.5, 7.0, 10.0], "simulated_ms_ci": [0.1] * 6,
        "erlang_c_ms": [0.71, 4.62, 9.0, 1.52, 7.09, 10.1]})
    shares = pl.DataFrame({"source": ["live"] * 3 + ["simulation"] * 3,
                           "t": [0.0, 1.0, 2.0] * 2, "ok_share": [0.9, 0.8, 0.7, 0.91, 0.82, 0.71],
                           "ok_share_ci": [None, None, None, 0.02, 0.02, 0.02]})
    alerts = pl.DataFrame({"alert": ["Overloaded"], "labels": [""], "pending_at": [5.0],
                           "firing_at": [10.0], "resolved_at": [30.0]})
    figures = {
        "latency_ccdf (tiers)": plots.latency_ccdf(
            {tier: plots.latency_ccdf_frame(req.filter(pl.col("tier") == tier)["latency_ms"]
                                            .to_numpy()) for tier in ("gold", "bronze")}),
        "outcome_shares": plots.outcome_shares(req, 10.0),
        "latency_over_time": plots.latency_over_time(req, 10.0, domain=(0.0, 60.0)),
        "mode_timeline": plots.mode_timeline(timeline, domain=(0.0, 60.0)),
        "queueing_tails": plots.queueing_tails(tails, servers=8),
        "ok_share_over_time": plots.ok_share_over_time(shares),
        "alert_timeline": plots.alert_timeline(alerts, (0.0, 60.0), timeline),
        "signals_against_thresholds": plots.signals_against_thresholds(
            pl.DataFrame({"time_s": [0.0, 1.0, 2.0] * 2, "signal": ["busy"] * 3 + ["p99"] * 3,
                          "value": [0.5, 0.9, 0.95, 200.0, 800.0, 900.0]}),
            pl.DataFrame({"signal": ["busy"], "condition": ["saturated"], "threshold": [0.85]}),
            timeline, shade=(1.0, 2.0), domain=(0.0, 60.0)),
        # a closed form outside one interval: the red ring is drawn and checked too
        "decision_cost_figure": plots.decision_cost_figure(
            pl.DataFrame({"cost_share": [0.0, 1.0], "goodput_rps": [399.0, 190.0],
                          "goodput_rps_ci": [5.0, 2.0], "closed_form_rps": [400.0, 200.0],
                          "replications": [3, 3]}),
            pl.DataFrame({"cost_share": [0.0, 0.5, 1.0], "goodput_rps": [400.0, 266.7, 200.0]}),
            title="t"),
    }
    from relakit.experiment import simulate

    run = simulate(ROOT / "tests" / "bad_inputs" / "scenarios" / "with-policy.yaml")
    figures["run_dashboard"] = plots.run_dashboard(run, bin_s=1.0)
    return figures


@pytest.fixture(scope="module")
def figures(tmp_path_factory):
    return _figures(tmp_path_factory.mktemp("figs"))


def test_every_figure_draws_only_the_tables_colours_and_red_only_for_errors(figures):
    table = _table_colours()
    errors = {c.lower() for c in plots.ERROR_COLORS}
    for name, chart in figures.items():
        spec = chart.to_dict()
        spec.pop("config", None)  # the theme: checked as the table's by the first test
        for path, colour in _colours(spec):
            if "datasets" in path:
                continue
            assert colour in table, (name, path, colour)
        # red: only as the colour of an error entry of a scale
        for enc in _encodings(spec):
            dom, rng = enc["scale"].get("domain"), enc["scale"].get("range")
            if not isinstance(dom, list) or not isinstance(rng, list):
                continue
            for entry, colour in zip(dom, rng, strict=False):
                if isinstance(colour, str) and colour.lower() in errors:
                    assert entry in ("error", plots.FLAG_LABEL), (name, entry, colour)


@pytest.mark.parametrize(("field", "group"), [("tier", "tier"), ("outcome", "outcome"),
                                               ("mode", "mode"), ("source", "tier")])
def test_a_tier_mode_or_outcome_has_its_colour_in_every_figure(figures, field, group):
    table = plots.PALETTE[group]
    seen = 0
    for name, chart in figures.items():
        for enc in _encodings(chart.to_dict()):
            dom, rng = enc["scale"].get("domain"), enc["scale"].get("range")
            if enc["field"] != field or not isinstance(dom, list) or not isinstance(rng, list):
                continue
            for entry, colour in zip(dom, rng, strict=True):
                if entry in table:
                    assert colour == table[entry], (name, field, entry, colour)
                    seen += 1
    assert seen, f"no figure here colours by {field}: the test checks nothing"
