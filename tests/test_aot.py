"""The plain specialisations of the event loop and the mitigated loops compiled ahead
of time (relakit.sim.aot): built by ``make setup``, the same results as numba's bit for
bit, such a run without numba, never stale."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from test_kernel_mitigated import _m_fanout, _m_fleet, _m_schedule, _m_started
from test_kernel_specialised import (
    _p_fleet,
    _p_jsq,
    _p_p2c,
    _p_scaled,
    _p_simple_fleet,
    _p_single,
    _p_trace,
)

from relakit.scenario import load_scenario
from relakit.sim import aot
from relakit.sim import kernel as K
from relakit.sim import loops as M
from relakit.sim import loops as P
from relakit.sim.fleet import Fleet

ROOT = Path(__file__).resolve().parents[1]
LOOPS = P.plain_loops  # (the tests below wrap it)
MITIGATED_LOOPS = M.mitigated_loops


def test_make_setup_built_the_loops_for_these_sources():
    path = aot.built_path()
    assert path is not None, (f"no {aot.module_name()} in {aot.BUILD_DIR}: run `make setup` "
                              "(it compiles the plain loops ahead of time)")
    module = aot.load()
    assert module is not None and Path(module.__file__) == path
    simple, general = P.plain_loops()
    assert simple == module.advance_plain_simple and general == module.advance_plain
    assert M.mitigated_loops() == (module.advance_mitigated, module.advance_mitigated_fanout)


def _spy(monkeypatch, name, loops):
    """``relakit.sim.loops.<name>`` replaced by ``loops`` noting what it returns, in the
    list returned."""
    used = []

    def spying():
        pair = loops()
        used.append(pair)
        return pair

    monkeypatch.setattr(P, name, spying)
    return used


def _fleet(sc, use_aot: bool, monkeypatch, records=True, steps=(5.0, 12.5, 20.0)):
    monkeypatch.setenv("RELAKIT_AOT", "1" if use_aot else "0")
    used = _spy(monkeypatch, "plain_loops", LOOPS)
    fleet = Fleet(load_scenario(sc), record_requests=records)
    for t in steps:
        fleet.advance(t)
    return fleet, used


@pytest.mark.parametrize("records", [True, False], ids=["records", "no-records"])
@pytest.mark.parametrize("make", [_p_single, _p_simple_fleet, _p_fleet, _p_p2c, _p_jsq, _p_trace,
                                  _p_scaled],
                         ids=["mm8", "simple-fleet-tiers", "weighted-fanout-tiers",
                              "p2c-lognormal", "jsq-pareto", "trace-round-robin",
                              "service-scale"])
def test_built_loops_equal_numbas_bit_for_bit(make, records, monkeypatch):
    sc = make()
    module = aot.load()
    built, used_built = _fleet(sc, True, monkeypatch, records)
    jitted, used_jit = _fleet(sc, False, monkeypatch, records)
    assert used_built and all(s == module.advance_plain_simple for s, _ in used_built)
    simple = K.specialised(frozenset(), simple=True)
    assert used_jit and all(s.py_func is simple.py_func for s, _ in used_jit)
    assert built.n_arrived > 10_000
    for part in ("st", "out"):
        x, y = getattr(built, part), getattr(jitted, part)
        for name in x._fields:
            if name in P.SCRATCH:
                continue
            np.testing.assert_array_equal(getattr(x, name), getattr(y, name), err_msg=name)


PLAIN_RUN = """
import sys, relakit
r = relakit.simulate({'duration_s': 2,
                      'workload': {'arrival': {'kind': 'poisson', 'rate_rps': 700}},
                      'fleet': {'nodes': 3, 'servers': 8,
                                'service': {'kind': 'exponential', 'mean_ms': 10}}})
print(r.info['user_requests'], 'numba' in sys.modules, 'scipy' in sys.modules)
"""


@pytest.mark.parametrize("flag", ["1", "0"])
def test_a_plain_run_imports_no_numba_with_the_built_loops(flag):
    env = dict(os.environ, RELAKIT_AOT=flag)
    out = subprocess.run([sys.executable, "-c", PLAIN_RUN], env=env, cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout.split()
    assert int(out[0]) > 1000
    if flag == "1":  # neither numba nor the scipy.linalg it imports at its set-up
        assert out[1:] == ["False", "False"]
    else:  # switched off: numba's loops, so numba (the switch is real)
        assert out[1] == "True"


OPEN_LOOP_MODULES = ("yaml", "relakit.chain", "relakit.control.policy", "relakit.control.signals",
                     "relakit.control.audit", "relakit.control.rollout", "relakit.rollout",
                     "relakit.zones", "relakit.stats")


def test_a_plain_run_loads_neither_the_control_plane_nor_yaml():
    """A dict scenario with no policy, chain, rollout or zones: its modules stay unloaded
    (~60 ms of every fresh process here), and a policy's scenario still loads them."""
    probe = PLAIN_RUN.replace("print(r.info['user_requests'], 'numba' in sys.modules, "
                              "'scipy' in sys.modules)",
                              f"print(r.info['user_requests'], *[m in sys.modules for m in "
                              f"{OPEN_LOOP_MODULES!r}])")
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout.split()
    assert int(out[0]) > 1000 and out[1:] == ["False"] * len(OPEN_LOOP_MODULES), out
    closed = probe.replace("'duration_s': 2,",
                           "'duration_s': 2, 'policy': 'params/policies/rela.yaml',")
    out = subprocess.run([sys.executable, "-c", closed], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout.split()
    loaded = dict(zip(OPEN_LOOP_MODULES, out[1:], strict=True))
    assert loaded["relakit.control.policy"] == "True" and loaded["yaml"] == "True", loaded


def test_the_switch_takes_yes_or_no_and_nothing_else(monkeypatch):
    for value, on in (("0", False), ("off", False), ("No", False), ("1", True), (" true", True)):
        monkeypatch.setenv("RELAKIT_AOT", value)
        assert aot.enabled() is on
    monkeypatch.setenv("RELAKIT_AOT", "nope")
    with pytest.raises(ValueError, match=r"RELAKIT_AOT='nope': must be 1 or 0"):
        P.plain_loops()


def test_a_build_for_other_sources_is_never_loaded(monkeypatch):
    assert aot.load() is not None
    monkeypatch.setattr(aot, "digest", lambda: "0123456789ab")
    assert aot.built_path() is None and aot.load() is None
    assert P.plain_loops() == (K.specialised(frozenset(), simple=True),
                         K.specialised(frozenset(), settled=True))
    assert M.mitigated_loops() == (M.advance_mitigated(), M.advance_mitigated_fanout())


def test_a_failed_build_leaves_nothing_and_a_good_one_replaces_the_old(monkeypatch, tmp_path):
    """The file handling of :func:`aot.build` with pycc's compile replaced (a real
    compile takes ~25 s; the equality test above checks a real build)."""
    with warnings.catch_warnings():  # pycc's pending deprecation: relakit.sim.aot
        warnings.simplefilter("ignore")
        from numba.pycc import CC

    monkeypatch.setattr(aot, "BUILD_DIR", tmp_path)
    monkeypatch.setattr(aot, "digest", lambda: "fedcba987654")
    old = tmp_path / "plain_0123456789ab.so"
    old.write_bytes(b"an older build")

    def failing(self):
        (Path(self.output_dir) / f"{self.name}.so").write_bytes(b"half")
        raise RuntimeError("the linker failed")

    exports = {"twice": (SimpleNamespace(py_func=lambda x: 2 * x), "int64(int64)")}
    monkeypatch.setattr(CC, "compile", failing)
    with pytest.raises(RuntimeError, match="linker"):
        aot.build(exports)
    assert sorted(p.name for p in tmp_path.iterdir()) == [old.name]  # no half file, no temp dir

    def compiling(self):
        (Path(self.output_dir) / f"{self.name}.so").write_bytes(b"a build")

    monkeypatch.setattr(CC, "compile", compiling)
    path = aot.build(exports)
    assert path == tmp_path / "loops_fedcba987654.so" and path.read_bytes() == b"a build"
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]  # the old one deleted
    assert aot.build(exports) == path  # built: a no-op


@pytest.mark.parametrize("make", [_m_fleet, _m_started, _m_schedule, _m_fanout],
                         ids=["fleet-tiers-budget", "cancel-started-2-hedges-wrong",
                              "schedule-jsq", "fanout-3-tiers-budget"])
def test_built_mitigated_loop_equals_numbas_bit_for_bit(make, monkeypatch):
    sc = make()
    module = aot.load()
    used = _spy(monkeypatch, "mitigated_loops", MITIGATED_LOOPS)
    runs = {}
    for flag in ("1", "0"):
        monkeypatch.setenv("RELAKIT_AOT", flag)
        fleet = Fleet(load_scenario(sc))
        for t in (5.0, 12.5, 20.0):
            fleet.advance(t)
        runs[flag] = fleet
    assert used[0] == (module.advance_mitigated, module.advance_mitigated_fanout)
    assert used[-1] == (M.advance_mitigated(), M.advance_mitigated_fanout())
    assert runs["1"].n_arrived > 5_000
    for part in ("st", "out"):
        x, y = getattr(runs["1"], part), getattr(runs["0"], part)
        for name in x._fields:
            if name in P.SCRATCH:
                continue
            np.testing.assert_array_equal(getattr(x, name), getattr(y, name), err_msg=name)


def test_a_mitigated_run_imports_no_numba_with_the_built_loops():
    """Hedging, deadlines, retries with a budget and error faults that start and end
    mid-run (applied in Python): no numba, no scipy, with the build."""
    run = PLAIN_RUN.replace("'duration_s': 2,", """'duration_s': 2,
        'controls': {'hedge_enabled': True},
        'mitigations': {'hedge': {'delay_ms': 20},
                        'retries': {'max_attempts': 3, 'budget_ratio': 0.1}},
        'faults': [{'node': 1, 'start_s': 0.5, 'end_s': 1.5, 'error_rate': 0.2}],""").replace(
        "'rate_rps': 700}}", "'rate_rps': 700}, 'deadline_ms': 50}")
    assert run != PLAIN_RUN
    out = subprocess.run([sys.executable, "-c", run], env=dict(os.environ, RELAKIT_AOT="1"),
                         cwd=ROOT, check=True, capture_output=True, text=True).stdout.split()
    assert int(out[0]) > 1000 and out[1:] == ["False", "False"], out
