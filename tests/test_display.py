"""Results display themselves in a notebook: each shows a compact HTML view made of the
same cells as its console text, and a one-line repr (a calibration once printed its whole
YAML, a simulation no number at all). Checked by executing a notebook in a real kernel."""

from __future__ import annotations

import re

import nbformat
import pytest
from conftest import ROOT
from nbclient import NotebookClient

CELLS = {
    "scenario": "import relakit\n"
                "sc = relakit.load_scenario('params/scenarios/chain-cascade.yaml')\nsc",
    "simulation": "r = relakit.simulate(dict(name='v', duration_s=20, seed=4, workload=dict("
                  "arrival=dict(kind='poisson', rate_rps=300)), fleet=dict(nodes=1, servers=4,"
                  " service=dict(kind='exponential', mean_ms=10))), record_requests=False)\nr",
    "replicated": "rr = relakit.simulate(dict(name='v', duration_s=10, seed=4, workload=dict("
                  "arrival=dict(kind='poisson', rate_rps=300)), fleet=dict(nodes=1, servers=4,"
                  " service=dict(kind='exponential', mean_ms=10))), replications=3, workers=1)"
                  "\nrr",
    "calibration": "cal = relakit.calibrate('tests/bad_inputs/recordings/ok.csv')\ncal",
}


@pytest.fixture(scope="module")
def outputs():
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in CELLS.values()]
    NotebookClient(nb, kernel_name="python3", timeout=300,
                   resources={"metadata": {"path": str(ROOT)}}).execute()
    out = {}
    for name, cell in zip(CELLS, nb.cells, strict=True):
        data = cell.outputs[-1]["data"]
        out[name] = (data["text/plain"], data.get("text/html", ""))
    return out


def test_every_result_shows_html_made_of_its_console_cells(outputs):
    import relakit

    plain, html = outputs["simulation"]
    assert plain.startswith("SimulationResult(") and "\n" not in plain
    r = relakit.simulate(ROOT / "tests" / "bad_inputs" / "scenarios" / "with-policy.yaml")
    assert "<table>" in html and "success_ratio" in html and "utilisation" in html
    p99 = re.findall(r"<td style='text-align:right'>([0-9.]+)</td>", html)
    assert len(p99) > 10  # every tier's numbers, as cells
    assert r._repr_html_().count("<tr>") == r.summary.height + 1  # the header and a tier each

    plain, html = outputs["replicated"]
    assert plain.startswith("ReplicatedResult(") and " ± " in html and "3 replications" in html

    plain, html = outputs["scenario"]
    assert plain == "Scenario('chain-cascade', 300 s, 5 nodes, policy=None, chain=yes)"
    assert "Sentinel -&gt; Serpentine" in html and "capacity 4000 req/s" in html


def test_a_calibration_is_one_line_not_its_yaml(outputs):
    plain, html = outputs["calibration"]
    assert plain.startswith("Calibration(") and "\n" not in plain and len(plain) < 300
    assert "not validated yet" in plain and "caution" in html and "<strong>" in html


def test_a_search_and_a_comparison_show_their_settings_and_differences(tmp_path):
    import relakit
    from relakit.counterfactual.report import front_rows
    from relakit.display import text_rows

    res = relakit.search(ROOT / "tests" / "bad_inputs" / "searches" / "ok.yaml", tmp_path,
                         trials=2, workers=1, notice=lambda line: None)
    rows = front_rows(res)
    # readable names with units, from report.SETTINGS (the test policy's slow is on p99_ms)
    assert rows[0][:3] == ["trial", "slow threshold on p99_ms (ms)", "query window (s)"]
    assert [r[0] for r in rows[1:]] == [*map(str, sorted(res.front["trial"])), "incumbent"]
    html = res._repr_html_()
    assert "the Pareto front" in html and all(r[1] in html for r in rows[1:-1])
    assert text_rows(rows)[0].startswith("trial")

    sc = ROOT / "tests" / "bad_inputs" / "scenarios" / "with-policy.yaml"
    cmp = relakit.compare(sc, sc, replications=2, workers=1)
    html = cmp._repr_html_()
    assert "tier all" in html and "not significant" in html and html.count("<table>") == 4
