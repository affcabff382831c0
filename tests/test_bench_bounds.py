"""benchmarks/bench_bounds.py times the mitigated loop's slowdown split in two; checked
on small runs: each figure ran the loop it names, or the script stops."""

import importlib.util
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_bounds.py"


@pytest.fixture(scope="module")
def bounds():
    spec = importlib.util.spec_from_file_location("bench_bounds", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SPLIT = {"plain fleet, simple loop", "plain fleet, plain loop", "plain fleet, mitigated loop",
         "mitigated fleet, mitigated loop", "mitigated fleet, no hedge reaches its delay"}


def test_mitigated_split_times_the_loop_each_figure_names(bounds):
    got = bounds.mitigated_split(rounds=1, requests=2e4)
    assert set(got) == SPLIT
    assert all(rate > 0 for rate in got.values())


def test_mitigated_split_stops_when_another_kernel_ran(bounds, monkeypatch):
    from relakit.sim import fleet

    # were mitigated_ok to refuse plain stretches, the general kernel would take them
    monkeypatch.setattr(fleet, "mitigated_ok", lambda *a, **k: False)
    with pytest.raises(SystemExit, match=r"ran \['general'\], not mitigated alone"):
        bounds.mitigated_split(rounds=1, requests=2e4)
