"""benchmarks/bench_bounds.py edits the plain loop's source by text. Its figures say how
close any loop on today's design could come to issue 17's targets. So when the loop
changes, the edits must fail loudly, not quietly stop applying. Checked here, without
compiling: each edit list applies to today's loop, and the result is Python. Its third
experiment times the loops as they are; checked on small runs: each figure ran the loop
it names, or the script stops."""

import ast
import importlib.util
import inspect
import textwrap
from pathlib import Path

import pytest

from relakit.sim import plain

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_bounds.py"


@pytest.fixture(scope="module")
def bounds():
    spec = importlib.util.spec_from_file_location("bench_bounds", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def loop_source():
    return textwrap.dedent(inspect.getsource(plain.advance_plain.py_func))


@pytest.mark.parametrize("edits", ["MECHANISMS", "NO_HELPERS"])
def test_each_edit_applies_once_and_leaves_python(bounds, loop_source, edits):
    changed = bounds.edited(loop_source, getattr(bounds, edits))
    assert changed != loop_source
    tree = ast.parse(changed)
    assert [f.name for f in tree.body] == ["advance_plain"]


def test_no_helpers_variant_calls_none_of_the_helpers(bounds, loop_source):
    calls = {node.func.id for node in ast.walk(ast.parse(bounds.edited(
        loop_source, bounds.NO_HELPERS))) if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)}
    cut = {"lean_rows", "prepare_routing", "sample_node", "sample_fleet", "next_node_sample"}
    assert calls & cut == set()
    assert cut <= {node.func.id for node in ast.walk(ast.parse(loop_source))
                   if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)}


def test_an_edit_that_no_longer_applies_stops_with_its_fragment(bounds, loop_source):
    with pytest.raises(SystemExit, match="no longer holds exactly one 'no_such_line"):
        bounds.edited(loop_source, [("no_such_line()\n", "")])


SPLIT = {"plain fleet, simple loop", "plain fleet, plain loop", "plain fleet, mitigated loop",
         "mitigated fleet, mitigated loop", "mitigated fleet, no hedge reaches its delay"}


def test_mitigated_split_times_the_loop_each_figure_names(bounds):
    got = bounds.mitigated_split(rounds=1, requests=2e4)
    assert set(got) == SPLIT
    assert all(rate > 0 for rate in got.values())


def test_mitigated_split_stops_when_another_kernel_ran(bounds, monkeypatch):
    from relakit.sim import fleet

    # were mitigated_ok to refuse plain stretches, the general kernel would take them
    monkeypatch.setattr(fleet, "mitigated_ok", lambda cfg, st: False)
    with pytest.raises(SystemExit, match=r"ran \['general'\], not mitigated alone"):
        bounds.mitigated_split(rounds=1, requests=2e4)
