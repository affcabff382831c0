"""A notebook's prose quotes no result it does not compute.

Notebooks 01, 02, 04, 05, 06 and 09 once carried results typed into their
markdown (an M/M/8 relaxation time, 119 % of capacity, "about twice each
class's normal rate"), which went stale when the model or the parameters
changed. Their results are now written by a code cell from the data
(``display(Markdown(f"..."))``) and asserted. This test keeps it so: every
number with a unit (%, ms, s, req/s) in their markdown cells must be one of the
parameter descriptions listed here (a confidence level, a tolerance the last cell
applies, a setting of a shipped scenario). A new one fails with where it is: format
it from the data in a code cell, or, if it describes a parameter, list it here.
"""

from __future__ import annotations

import json
import re

import pytest
from conftest import ROOT

NUMBER = re.compile(r"(?<![\w.])\d[\d,]*(?:\.\d+)?\s?(?:%|ms|s|req/s)(?!\w)")

#: the numbers each notebook's markdown may state: parameter descriptions, not results
ALLOWED = {
    "01_fanout": {"95 %", "5 %"},  # the intervals' level; the single-run tolerance
    "02_queueing": {"95 %", "5 %", "10 %"},  # level; warm-up share; single-run tolerances
    "04_policy": {"95 %", "200 s"},  # level; the smaller run's length (code: duration_s)
    "05_chain": {"95 %", "120 s", "150 s", "200 s"},  # level; the shortened runs' settings
    "06_sweeps": {"95 %"},
    # level; the designed 20 % threshold and the fixed 5 % chain (their names); the
    # rollout scenarios' settings (p99 limits, canary start and interval, the override)
    "09_control_plane": {"95 %", "20 %", "5 %", "100 ms", "60 ms", "30 s", "90 s", "200 s",
                         "260 s"},
}


def _quoted(name: str) -> list[tuple[int, str]]:
    cells = json.loads((ROOT / "notebooks" / f"{name}.ipynb").read_text())["cells"]
    return [(i, m.group()) for i, c in enumerate(cells) if c["cell_type"] == "markdown"
            for m in NUMBER.finditer("".join(c["source"]))]


@pytest.mark.parametrize("name", sorted(ALLOWED))
def test_markdown_states_no_result_typed_by_hand(name):
    stray = [f"cell {i}: {n!r}" for i, n in _quoted(name) if n not in ALLOWED[name]]
    assert not stray, (f"notebooks/{name}.ipynb states {stray} in its prose: format it from "
                       "the data in a code cell and assert it (or list a parameter description "
                       "in tests/test_notebook_prose.py)")


def test_the_check_sees_a_typed_result():
    # the pattern catches what the old prose carried, and not a formula's digits
    old = "about 0.2 s of simulated time, 960,000 at ρ = 0.95 (126 s), 3,800 req/s, 119 %"
    assert [m.group() for m in NUMBER.finditer(old)] == ["0.2 s", "126 s", "3,800 req/s", "119 %"]
    assert not NUMBER.findall("((1 − 0.8)/(1 − ρ))², the p99.9 of M/M/8")
