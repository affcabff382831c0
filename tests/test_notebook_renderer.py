"""The notebooks' charts: one renderer, chosen in relakit.plots, that needs no network.

What a browser draws is tests/test_browser.py's; here, what the kernel sends: a widget
whose JavaScript imports nothing from any host, given the chart's own spec."""

from __future__ import annotations

import re

import altair as alt
import pytest

from relakit import plots


@pytest.fixture
def renderer():
    before = alt.renderers.active
    yield
    alt.renderers.enable(before)


def _chart():
    return (alt.Chart(alt.Data(values=[{"x": 1, "y": 2}, {"x": 2, "y": 3}]))
            .mark_point().encode(x="x:Q", y="y:Q", tooltip=["x:Q"]).interactive())


def test_interactive_charts_are_widgets_whose_javascript_loads_from_no_host(renderer):
    plots.notebook_renderer(False)
    assert alt.renderers.active == plots.WIDGET_RENDERER
    bundle, _ = _chart()._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    js = alt.JupyterChart._esm
    # altair's own widget code imports vega-embed from a CDN; the bundle carries it
    assert len(js) > 100_000 and "_vl_selections" in js and "vega-embed" in js
    assert not re.search(r"""(import|from)\s*\(?\s*["']https?://""", js), "a remote import"
    path = plots.offline_widget_js()
    assert path is not None and path.read_text() == js
    assert alt.__version__ in path.name  # a new altair makes a new bundle


def test_the_widget_gets_the_charts_own_spec(renderer):
    plots.notebook_renderer(False)
    widgets = []
    original = alt.JupyterChart._repr_mimebundle_

    def keep(self, *a, **k):
        widgets.append(self)
        return original(self, *a, **k)

    alt.JupyterChart._repr_mimebundle_ = keep
    try:
        chart = _chart()
        chart._repr_mimebundle_()
    finally:
        alt.JupyterChart._repr_mimebundle_ = original
    (widget,) = widgets
    assert widget.spec == chart.to_dict(context={"pre_transform": False})
    assert widget.spec["params"]  # zoom/pan (.interactive()) travels with the spec


def test_static_charts_are_png(renderer):
    plots.notebook_renderer(True)
    assert "image/png" in _chart()._repr_mimebundle_()[0]
