"""The specialisations of the event loop (relakit.sim.kernel.specialised: the plain
ones relakit.sim.plain chooses, and any set of mechanisms) change speed, never results.

A scenario runs through the fast kernel and through the general kernel (every
mechanism compiled in, configured off where the scenario does not use it):
every state and output array must be identical, bit for bit (for the plain
kernel, all but one event's scratch arrays, ``plain.SCRATCH``). Each scenario
also checks that the fast kernel really ran and that its mechanisms did
something, so the equality is not vacuous.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import numpy as np
import pytest
from conftest import make_scenario

from relakit.scenario import load_scenario
from relakit.sim import cachename
from relakit.sim import fleet as fleet_module
from relakit.sim import kernel as K
from relakit.sim import loops as M
from relakit.sim import loops as P
from relakit.sim.fleet import Fleet

general_advance = K.advance


@pytest.fixture(autouse=True)
def _numba_loops(monkeypatch):
    """numba's plain loops here, not the ones compiled ahead of time when built: these
    tests are about numba's (the built ones are compared with them in test_aot.py)."""
    monkeypatch.setenv("RELAKIT_AOT", "0")


def _mitigated():
    sc = make_scenario(rate=1400, duration=20, nodes=4, servers=4, deadline_ms=40,
                       faults=[{"node": n, "start_s": 0, "end_s": 100, "error_rate": 0.02}
                               for n in range(4)])
    sc["controls"] = {"hedge_enabled": True}
    sc["mitigations"] = {"hedge": {"delay_ms": 20, "cancel": "queued"},
                         "retries": {"max_attempts": 3, "budget_ratio": 0.2}}
    return sc, frozenset({"hedging", "retries", "deadlines", "errors"})


def _probed():
    sc = make_scenario(rate=1000, duration=20, nodes=4, servers=4,
                       faults=[{"node": 1, "start_s": 0, "end_s": 100, "wrong_rate": 0.4}])
    sc["fleet"]["probes"] = {"rate_rps": 20}
    return sc, frozenset({"errors", "probes"})


def _fleet(sc, kernel, monkeypatch):
    # runs pick the plain specialisation or the general kernel (relakit.sim.fleet); any
    # other specialisation is driven here directly, standing in for the general one
    monkeypatch.setattr(Fleet, "specialise", False)
    monkeypatch.setattr(K, "advance", kernel)
    fleet = Fleet(load_scenario(sc))
    for t in (5.0, 12.5, sc["duration_s"]):  # several calls, as a control plane makes
        fleet.advance(t)
    return fleet


@pytest.mark.parametrize("make", [_mitigated, _probed], ids=["mitigated", "probes"])
def test_specialised_equals_general(make, monkeypatch):
    sc, features = make()
    fleet = Fleet(load_scenario(sc))
    assert K.features_of(fleet.cfg, fleet.st) == features
    general_kernel = K.advance
    fast = _fleet(sc, K.specialised(features), monkeypatch)
    assert tuple(f for f in K.FEATURES if f in features) in K._SPECIALISED
    general = _fleet(sc, general_kernel, monkeypatch)
    assert fast.st.is_[K.IS_USER_SEQ] > 10_000
    for part in ("st", "out"):  # every array of the state and the outputs, bit for bit
        a, b = getattr(fast, part), getattr(general, part)
        for name in a._fields:
            np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    fleet_c = fast.st.fleet_c
    if "retries" in features:  # the mechanisms did something
        assert fleet_c[K.F_RETRIES] > 0 and fleet_c[K.F_HEDGES] > 0
        assert fast.out.tier_cnt[:, K.TIMEOUT].sum() > 0
        assert fast.out.tier_cnt[:, K.ERROR].sum() > 0
    else:
        assert fast.st.node_c[1, K.NC_PROBE_FAILURES] > 0


def test_unknown_feature_is_an_error():
    with pytest.raises(ValueError, match="unknown kernel features"):
        K.specialised(frozenset({"teleport"}))


def test_each_combination_has_its_own_name():
    a = K.specialised(frozenset())
    b = K.specialised(frozenset({"hedging", "retries"}))
    assert a is not b and a is K.specialised(frozenset())
    digest = cachename.digest()
    assert a.py_func.__qualname__ == f"advance[plain-{digest}]"
    assert b.py_func.__qualname__ == f"advance[hedging+retries-{digest}]"
    assert K.advance.py_func.__qualname__ == f"advance[{digest}]"  # the general kernel too
    assert np.all([f in K.FEATURES for f in ("hedging", "intake", "errors")])


# ---- the plain specialisations (relakit.sim.plain) ----------------------------------------------
def _p_single():
    return make_scenario(rate=700, duration=20, servers=8)


def _p_fleet():  # weights, tiers, fan-out to distinct nodes, metric phases
    sc = make_scenario(rate=900, duration=20, nodes=5, servers=4, fanout=3,
                       weights=[1, 2, 1, 1, 3], warmup=2,
                       tiers={"gold": 0.2, "silver": 0.3, "bronze": 0.5})
    sc["metrics"]["phase_s"] = [0.0, 0.1, 0.2, 0.3, 0.4]
    return sc


def _p_p2c():  # p2c routing, lognormal service, a retry budget that counts first attempts
    sc = make_scenario(rate=2000, duration=20, nodes=4, servers=4, routing="p2c",
                       service={"kind": "lognormal", "mean_ms": 10, "cv": 2})
    sc["mitigations"] = {"retries": {"max_attempts": 1, "budget_ratio": 0.1}}
    return sc


def _p_jsq():
    return make_scenario(rate=2000, duration=20, nodes=4, servers=4, routing="jsq",
                         service={"kind": "pareto", "mean_ms": 10, "alpha": 2.5})


def _p_trace():  # trace arrivals (thinning), round robin
    return make_scenario(rate=1, duration=20, nodes=4, servers=4, routing="round_robin",
                         arrival={"kind": "trace", "points": [[0, 500], [10, 3000], [20, 1000]]})


def _p_simple_fleet():  # the simple loop: fan-out 1, exponential, Poisson, random routing
    sc = make_scenario(rate=2500, duration=20, nodes=5, servers=4, warmup=2,
                       tiers={"gold": 0.2, "silver": 0.3, "bronze": 0.5})
    sc["metrics"]["phase_s"] = [0.0, 0.1, 0.2, 0.3, 0.4]
    return sc


def _p_weighted_random():  # all but simple: random routing over unequal weights
    return make_scenario(rate=2000, duration=20, nodes=3, servers=4, weights=[1, 2, 1])


def _p_scaled():  # per-node service scales: slowdown rows from t = 0, no mechanism
    sc = make_scenario(rate=2000, duration=20, nodes=3, servers=4)
    sc["fleet"]["service_scale"] = [1.0, 1.5, 0.8]
    return sc


def count_loops(monkeypatch, specialise=True) -> dict:
    """Fleets run with (``specialise``) or without the loops Fleet picks, counting the
    calls of each loop in the dict returned: plain (``run_plain``), simple, mitigated
    (``run_mitigated``), fanout (its fan-out loop), in_path (``run_in_path``),
    in_path_simple (its simple loop), general (``kernel.advance``). A simple loop counts
    only the calls it ran: one it declined (``kernel.ROWS_NOT_LEAN``, before any write;
    the settled loop then runs the stretch) counts in ``simple_declined`` or
    ``in_path_simple_declined`` instead."""
    calls = {"plain": 0, "general": 0, "simple": 0, "mitigated": 0, "fanout": 0,
             "in_path": 0, "in_path_simple": 0, "simple_declined": 0,
             "in_path_simple_declined": 0}

    def counting(kernel, name):
        def run(*args):
            status = kernel(*args)
            declined = name.endswith("simple") and status == K.ROWS_NOT_LEAN
            calls[f"{name}_declined" if declined else name] += 1
            return status
        return run

    monkeypatch.setattr(Fleet, "specialise", specialise)
    monkeypatch.setattr(fleet_module, "run_plain", counting(P.run_plain, "plain"))
    simple, settled = P.plain_loops()
    monkeypatch.setattr(P, "plain_loops", lambda: (counting(simple, "simple"), settled))
    monkeypatch.setattr(fleet_module, "run_mitigated", counting(M.run_mitigated, "mitigated"))
    one_call, fanout = M.mitigated_loops()
    monkeypatch.setattr(M, "mitigated_loops", lambda: (one_call, counting(fanout, "fanout")))
    monkeypatch.setattr(fleet_module, "run_in_path", counting(P.run_in_path, "in_path"))
    in_path_loops = P.in_path_loops

    def counted_in_path_loops(features):
        simple_ip, settled_ip = in_path_loops(features)
        return counting(simple_ip, "in_path_simple"), settled_ip

    monkeypatch.setattr(P, "in_path_loops", counted_in_path_loops)
    monkeypatch.setattr(K, "advance", counting(general_advance, "general"))
    return calls


def _run(sc, plain, records=True, steps=(5.0, 12.5, 20.0), between=None, monkeypatch=None):
    """A fleet advanced in steps through the kernels Fleet picks (plain=True: the plain
    loops, the mitigated ones, the general one, each where it applies), or the general
    kernel throughout; returns it and how many calls went to each."""
    calls = count_loops(monkeypatch, plain)
    fleet = Fleet(load_scenario(sc), record_requests=records)
    calls["plain_by_step"], calls["by_step"] = [], []
    for t in steps:
        fleet.advance(t)
        calls["plain_by_step"].append(calls["plain"])
        calls["by_step"].append({k: v for k, v in calls.items() if isinstance(v, int)})
        if between is not None:
            between(fleet, t)
    return fleet, calls


# The simple loop writes no call or user row for the requests it admits while they live
# (kernel.LEAN_CALL, LEAN_USER; lean_rows writes the live ones back): rows free at the end may
# hold an older request's values there. Per pool array: its free list, free count, and
# the generation column that must still count every reuse.
LEAN_POOLS = {"usr_i": ("usr_free", K.IS_USR_FREE_N, K.UI_GEN),
              "usr_f": ("usr_free", K.IS_USR_FREE_N, None),
              "call_i": ("call_free", K.IS_CALL_FREE_N, K.CL_GEN),
              "call_f": ("call_free", K.IS_CALL_FREE_N, None)}


def _assert_same(a, b, lean=False):
    """Every array of the state and the outputs equal, bit for bit; with ``lean`` (the
    simple loop ran: True), the call and user pools on their live rows and generations,
    or the pools ``lean`` names (the one-call mitigated loop: the user pools)."""
    lean = tuple(LEAN_POOLS) if lean is True else (lean or ())
    for part in ("st", "out"):
        x, y = getattr(a, part), getattr(b, part)
        for name in x._fields:
            if name in P.SCRATCH:
                continue
            xa, ya = getattr(x, name), getattr(y, name)
            if name in lean:
                pool, n_free, gen = LEAN_POOLS[name]
                free = getattr(a.st, pool)[: a.st.is_[n_free]]
                live = np.setdiff1d(np.arange(xa.shape[0]), free)
                assert live.size > 0  # (not vacuous: requests in flight at the end)
                np.testing.assert_array_equal(xa[live], ya[live], err_msg=name)
                if gen is not None:
                    np.testing.assert_array_equal(xa[:, gen], ya[:, gen], err_msg=name)
            else:
                np.testing.assert_array_equal(xa, ya, err_msg=name)


def test_kernels_hand_over_mid_run(monkeypatch):
    """Plain, then hedging switched on (the mitigated loop), then off again: the plain
    kernel takes over once no hedge is pending, and the run equals the general one."""
    sc = make_scenario(rate=1400, duration=30, nodes=4, servers=4)
    sc["mitigations"] = {"hedge": {"delay_ms": 15, "cancel": "queued"}}

    def flip(fleet, t):
        fleet.set_flags(fleet.flag_state().updated(hedge_enabled=(t == 10.0)))

    steps = (10.0, 20.0, 20.5, 25.0, 30.0)
    fast, used = _run(sc, True, steps=steps, between=flip, monkeypatch=monkeypatch)
    general, _ = _run(sc, False, steps=steps, between=flip, monkeypatch=monkeypatch)
    assert fast.st.fleet_c[K.F_HEDGES] > 0
    assert used["plain"] >= 3 and used["mitigated"] >= 1 and used["simple"] >= 1
    assert used["general"] == 0
    _assert_same(fast, general, lean=True)


def test_a_slow_fault_hands_over_when_it_ends(monkeypatch):
    """A fault that only slows a node is no mechanism: while a schedule change is due (its
    end) the mitigated loop runs (the change applied in Python: it crashes nothing), the
    plain one after; the run equals the general one."""
    sc = make_scenario(rate=2000, duration=30, nodes=3, servers=4,
                       faults=[{"node": 1, "start_s": 4, "end_s": 12, "slowdown": 3}])
    fast, used = _run(sc, True, steps=(10.0, 20.0, 30.0), monkeypatch=monkeypatch)
    general, _ = _run(sc, False, steps=(10.0, 20.0, 30.0), monkeypatch=monkeypatch)
    by_step = used["plain_by_step"]
    assert by_step[0] == 0 < by_step[1] < by_step[2]  # plain only once the fault is over
    assert used["mitigated"] >= 1 and used["plain"] >= 2  # (a call may come back for room)
    assert used["general"] == 0
    assert fast.st.node_f[1, K.NF_SLOWDOWN] == 1.0  # over, and applied
    _assert_same(fast, general, lean=used["simple"] > 0)


def test_slowdowns_at_start_are_what_the_loops_schedule_step_makes(monkeypatch):
    """kernel.schedule_at_start applies a slowdown-only schedule due at t = 0 in Python:
    the node and schedule state equal the compiled on_schedule's, bit for bit (scales, a
    slow fault from t = 0 on a scaled node, one starting later)."""
    sc = make_scenario(rate=1000, duration=20, nodes=3, servers=4,
                       faults=[{"node": 1, "start_s": 0, "end_s": 5, "slowdown": 3},
                               {"node": 2, "start_s": 8, "end_s": 9, "slowdown": 2}])
    sc["fleet"]["service_scale"] = [1.0, 1.5, 0.7]
    fast = started_as_the_loop_would(sc, monkeypatch)
    assert fast.st.node_f[1, K.NF_SLOWDOWN] == 1.5 * 3 and fast.st.fs[K.FS_NEXT_SCHED] == 5.0


def started_as_the_loop_would(sc, monkeypatch) -> Fleet:
    """A fleet whose start applied the schedule's change at t = 0 in Python, checked
    equal, bit for bit, to one whose start left it to the compiled ``on_schedule``."""
    fast = Fleet(load_scenario(sc))
    with monkeypatch.context() as m:
        m.setattr(K, "schedule_at_start", lambda cfg, st: None)
        looped = Fleet(load_scenario(sc))
    assert looped.st.fs[K.FS_NEXT_SCHED] == 0.0  # left to the loop's step
    cfg, st = looped.cfg, looped.st
    K.on_schedule(cfg.sched_t, cfg.fault_f, cfg.fault_i, st.fs, st.is_, st.node_i, st.node_f,
                  st.job_i, st.heap_t, st.heap_k, 0.0)
    for name in ("node_f", "node_i", "is_", "fs"):
        np.testing.assert_array_equal(getattr(fast.st, name), getattr(looped.st, name),
                                      err_msg=name)
    return fast


def test_a_schedule_with_errors_is_no_plain_stretch():
    """Errors from t = 0 are applied at start (kernel.schedule_at_start; compared with the
    loop's step in test_kernel_mitigated) and are a mechanism: not the plain loop's."""
    sc = make_scenario(rate=1000, duration=5, nodes=2, servers=4,
                       faults=[{"node": 1, "start_s": 0, "end_s": 5, "error_rate": 0.1}])
    fleet = Fleet(load_scenario(sc))
    assert fleet.st.fs[K.FS_NEXT_SCHED] == 5.0
    assert fleet.st.node_f[1, K.NF_ERR_RATE] == pytest.approx(0.1)
    assert not P.plain_ok(fleet.cfg, fleet.st)


def test_plain_ok_says_no_while_a_mechanism_or_its_leftovers_are_about():
    fleet = Fleet(load_scenario(_p_single()))
    assert P.plain_ok(fleet.cfg, fleet.st)
    mitigated = Fleet(load_scenario(_mitigated()[0]))
    assert not P.plain_ok(mitigated.cfg, mitigated.st)
    sc = make_scenario(rate=1400, duration=5, nodes=4, servers=4)
    sc["mitigations"] = {"hedge": {"delay_ms": 15}}
    sc["controls"] = {"hedge_enabled": True}
    hedged = Fleet(load_scenario(sc))
    hedged.advance(2.0)
    assert not P.plain_ok(hedged.cfg, hedged.st)
    # hedge timers still pending in their ring
    hedged.set_flags(hedged.flag_state().updated(hedge_enabled=False))
    assert not K.features_of(hedged.cfg, hedged.st)
    assert not P.plain_ok(hedged.cfg, hedged.st)


def test_plain_loops_are_specialisations_of_the_one_loop():
    """The plain loops are kernel.advance's code (the fields of Config, State and Output,
    then t_end), compiled with every mechanism off and LEFTOVERS (and, simple, SIMPLE)
    as constants, under cache names carrying them and the digest of what they inline."""
    simple, settled = K.specialised(frozenset(), simple=True), K.specialised(
        frozenset(), settled=True)
    names = list(inspect.signature(settled.py_func).parameters)
    assert names == [*K.Config._fields, *K.State._fields, *K.Output._fields, "t_end"]
    assert simple.py_func.__code__ is settled.py_func.__code__ is K.advance.py_func.__code__
    digest = cachename.digest()
    assert settled.py_func.__qualname__ == f"advance[settled-{digest}]"
    assert simple.py_func.__qualname__ == f"advance[settled+simple-{digest}]"
    for fn, is_simple in ((simple, True), (settled, False)):
        scope = fn.py_func.__globals__
        assert scope["SIMPLE"] is is_simple and scope["LEFTOVERS"] is False
        assert not any(scope[f.upper()] for f in K.FEATURES)
    assert K.advance.py_func.__globals__["LEFTOVERS"] is True
    with pytest.raises(ValueError, match=r"a settled loop runs \[.codel.* not \[.hedging.\]"):
        K.specialised(frozenset({"hedging"}), settled=True)
    with pytest.raises(ValueError, match=r"a simple loop runs \[.codel.* not \[.retries.\]"):
        K.specialised(frozenset({"retries"}), simple=True)
    # the in-path settled loop: their constants on, the plain loop's others (loops.in_path_ok)
    scope = K.specialised(frozenset({"codel"}), settled=True).py_func.__globals__
    assert scope["CODEL"] and not scope["THROTTLE"] and not scope["LEFTOVERS"]
    assert scope["ENDS_EARLY"] and scope["RESENDS"] and not scope["SIMPLE"]
    scope = K.specialised(frozenset({"throttle"}), simple=True).py_func.__globals__
    assert scope["THROTTLE"] and not scope["CODEL"] and scope["SIMPLE"]
    assert scope["ENDS_EARLY"] and not scope["RESENDS"] and not scope["LEFTOVERS"]
    assert not settled.py_func.__globals__["ENDS_EARLY"]


def test_simple_loop_compiles_without_the_helpers_it_never_calls():
    """The simple loop's pruned branches are not typed: no general service draw, thinned
    arrivals or weighted node pick is compiled into it (what its cold start saves)."""
    from numba import njit

    fleet = Fleet(load_scenario(_p_single()))
    assert P.simple_ok(fleet.cfg, fleet.st)
    fleet.advance(1.0)
    simple = K.specialised(frozenset(), simple=True)
    sig = simple.signatures[0]
    fresh = njit(error_model="numpy")(cachename.digest_named(simple.py_func, "fresh-"))
    fresh.compile(sig)
    ir = fresh.inspect_llvm(sig)
    assert "sample_node" in ir and "hist_bin" in ir  # the check can see the helpers it calls
    for helper in ("draw_service", "next_arrival", "pick_node", "window_slot"):
        assert helper not in ir


def test_cache_names_follow_every_inlined_file(tmp_path, monkeypatch):
    """An edit to any file the kernels inline changes their cache names (no stale kernel
    is loaded after it); the digest covers exactly those files."""
    before = cachename.digest()
    copy = tmp_path / "sim"
    copy.mkdir()
    for name in cachename.INLINED:
        (copy / name).write_bytes((Path(cachename.__file__).parent / name).read_bytes())
    monkeypatch.setattr(cachename, "__file__", str(copy / "cachename.py"))
    assert cachename.digest() == before
    for name in cachename.INLINED:
        original = (copy / name).read_bytes()
        (copy / name).write_bytes(original + b"\n# an edit\n")
        assert cachename.digest() != before, name
        (copy / name).write_bytes(original)


def test_the_digests_cover_every_relakit_module_the_compiled_code_imports():
    """A module the kernels take constants or helpers from, left out of the digest, would
    let a stale compiled kernel (numba's cache, the ahead-of-time build) run after an edit
    there: vocab.py was (its tuples size the tier and outcome arrays). Only the decorators
    (relakit.jit), the cache naming and the build itself give the code nothing."""
    import ast

    from relakit.sim import aot

    sim = Path(cachename.__file__).parent
    covered = {(sim / f).resolve() for f in aot.SOURCES}
    for name in aot.SOURCES:
        for node in ast.walk(ast.parse((sim / name).read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("relakit"):
                mods = [node.module] if node.module not in ("relakit", "relakit.sim") else [
                    f"{node.module}.{a.name}" for a in node.names]
                for mod in set(mods) - {"relakit.jit", "relakit.sim.cachename"}:
                    path = (sim.parent.parent / (mod.replace(".", "/") + ".py")).resolve()
                    assert path in covered, f"{name} imports {mod}, which no digest covers"
    assert {(sim / f).resolve() for f in cachename.INLINED} <= covered


def test_first_arrival_drawn_in_python_is_the_kernels_draw():
    """kernel.start draws a constant-rate run's first arrival with rng.exponential_py
    (so a plain run compiles no arrival sampler): the same double and the same words
    as the compiled sampler's."""
    from relakit.sim import rng as R

    state = R.new_state(7, K.N_STREAMS)
    py_state = state.copy()
    rate = 1234.5
    compiled = K.next_arrival(state, rate, True, np.zeros(1), np.zeros(1), 0.0)
    drawn = 0.0 + R.exponential_py(py_state, K.RNG_ARRIVALS, 1.0 / rate)
    assert drawn == compiled and drawn > 0.0
    np.testing.assert_array_equal(py_state, state)


def test_simple_loop_writes_back_the_rows_of_live_requests(monkeypatch):
    """After each simple stretch, the live requests' call and user rows are what the
    plain loop writes (lean_rows: equal to the general kernel's run on live rows), and
    simple_ok refuses a stretch whose live requests the simple loop would misread."""
    sc = make_scenario(rate=1000, duration=12, nodes=3, servers=4,
                       tiers={"gold": 0.2, "silver": 0.3, "bronze": 0.5})
    steps = (3.0, 6.0, 12.0)
    fast, used = _run(sc, True, steps=steps, monkeypatch=monkeypatch)
    general, _ = _run(sc, False, steps=steps, monkeypatch=monkeypatch)
    assert used["simple"] == used["plain"] >= 3
    _assert_same(fast, general, lean=True)
    st = fast.st
    live = np.flatnonzero(st.job_i[:, K.JI_STATE] != K.J_FREE)
    rows = (st.job_i, st.job_f, st.call_i, st.call_f, st.usr_i, st.usr_f)
    assert live.size > 0 and K.lean_rows(*rows, False) and P.simple_ok(fast.cfg, st)
    c = st.job_i[live[0], K.JI_CALL]
    st.call_i[c, K.CL_HEDGES] = 1  # as after a cancelled hedge
    assert P.plain_ok(fast.cfg, st) and not K.lean_rows(*rows, False)
    # ... the simple loop then declines (before any write), and the plain loop runs
    before = {name: getattr(st, name).copy() for name in st._fields}
    simple = K.specialised(frozenset(), simple=True)
    assert simple(*fast.cfg, *st, *fast.out, 13.0) == K.ROWS_NOT_LEAN
    for name in st._fields:
        np.testing.assert_array_equal(getattr(st, name), before[name], err_msg=name)
    assert used["simple_declined"] == 0
    # counted truthfully (count_loops): the simple loop declined, the plain loop ran (the
    # fleet keeps the run_plain it chose, counting in the first dict; the simple loop is
    # looked up at each call, counting in the one patched last)
    first, plain_before = used, used["plain"]
    used = count_loops(monkeypatch, True)
    fast.advance(13.0)
    assert (used["simple_declined"], used["simple"], used["general"]) == (1, 0, 0), used
    assert first["plain"] == plain_before + 1
    st = fast.st  # (it may have grown)
    rows = (st.job_i, st.job_f, st.call_i, st.call_f, st.usr_i, st.usr_f)
    assert fast.now == 13.0  # (the request has ended: the plain loop wrote its rows in full)
    assert st.call_i[c, K.CL_GEN] > before["call_i"][c, K.CL_GEN] and K.lean_rows(*rows, False)
    c = st.job_i[np.flatnonzero(st.job_i[:, K.JI_STATE] != K.J_FREE)[0], K.JI_CALL]
    u = st.call_i[c, K.CL_USER]
    st.usr_f[u, K.UF_T_ARRIVAL] -= 0.5  # as a request moved to another node after arriving
    assert not K.lean_rows(*rows, False)



def test_simple_loop_declines_a_fleet_with_a_node_it_may_not_route_to(monkeypatch):
    """The simple loop sends each request to exactly one node, a compile-time constant
    that simple_ok guarantees (every node routable, with positive equal weights). Called
    on a fleet with an unroutable node anyway, it declines before any write (but the
    routing summary, which every loop recounts on entry)."""
    sc = make_scenario(rate=1000, duration=6, nodes=3, servers=4)
    fleet, used = _run(sc, True, steps=(3.0,), monkeypatch=monkeypatch)
    assert used["simple"] == used["plain"] >= 1
    st = fleet.st
    st.node_i[1, K.NI_ROUTABLE] = 0  # (as an isolation would, between calls)
    assert not P.simple_ok(fleet.cfg, st) and P.plain_ok(fleet.cfg, st)
    before = {name: getattr(st, name).copy() for name in st._fields}
    simple = K.specialised(frozenset(), simple=True)
    assert simple(*fleet.cfg, *st, *fleet.out, 6.0) == K.ROWS_NOT_LEAN
    routing = {"is_": [K.IS_N_ELIGIBLE, K.IS_EQUAL_WEIGHTS], "fs": [K.FS_WRR_TOTAL],
               "node_f": [K.NF_CUM]}  # (the summary prepare_routing recounts on every entry)
    for name in st._fields:
        now, then = getattr(st, name).copy(), before[name].copy()
        if name in routing:
            now[..., routing[name]] = then[..., routing[name]] = 0
        np.testing.assert_array_equal(now, then, err_msg=name)
    live_on_1 = int(((st.job_i[:, K.JI_STATE] != K.J_FREE) & (st.job_i[:, K.JI_NODE] == 1)).sum())
    done = st.cnt[:, :, K.OK].sum(axis=1)
    fleet.advance(6.0)  # the plain loop runs it, and sends nothing more to node 1
    assert fleet.now == 6.0
    after = fleet.st.cnt[:, :, K.OK].sum(axis=1)
    assert after[1] - done[1] <= live_on_1 and after[0] - done[0] > 500

def test_kernel_arrays_may_not_share_memory():
    """The plain loops are compiled noalias: a fleet's arrays are checked disjoint where
    they are made, and after growth."""
    fleet = Fleet(load_scenario(_p_single()), record_requests=True)
    fleet.advance(5.0)  # (grows records and pools on the way)
    fleet._check_disjoint()
    fleet.st = fleet.st._replace(usr_f=fleet.st.usr_i.view(np.float64))
    with pytest.raises(RuntimeError, match="share memory"):
        fleet._check_disjoint()


def _variable_types(dispatcher) -> dict:
    """{variable: the types numba gave its assignments} of a compiled loop, read from its
    type annotation (kept in numba's cache too); an assignment from a call has the
    call's result type."""
    import re

    text = str(dispatcher.overloads[dispatcher.signatures[0]].type_annotation)
    types = {}
    for m in re.finditer(r"^\s*#\s+([A-Za-z_]\w*)(?:\.\d+)? = .*  :: (.+)$", text, re.M):
        types.setdefault(m.group(1), set()).add(m.group(2).split(" -> ")[-1].strip())
    return types


@pytest.mark.parametrize(("make", "simple"), [(_p_single, True), (_p_fleet, False)],
                         ids=["simple", "settled"])
def test_the_loops_integers_stay_integers(make, simple, monkeypatch):
    """numba types an int64 and a uint64 that meet (an operator, or a variable assigned
    both) as float64, without a word: such a mix would turn an index or a counter into a
    float (slower, and inexact past 2**53). So every variable the plain specialisations
    of the one loop name is a float in all of its assignments or in none; and the row
    indices they convert where they index (kernel.ROW) are unsigned there."""
    loop = K.specialised(frozenset(), settled=True, simple=simple)
    _run(make(), True, records=True, steps=(2.0,), monkeypatch=monkeypatch)
    rows = ("jr", "nr", "cr", "jf", "tr", "orow", "r", "hu", "up")  # kernel.ROW's, the push's
    types = assert_integers_stay_integers(loop, "simple" if simple else "settled", rows)
    assert {"j", "node", "c", "u", "jr", "nr"} <= set(types)


def assert_integers_stay_integers(loop, name, row_indices) -> dict:
    """No variable of ``loop`` typed both float and integer, and the ``row_indices`` it
    names unsigned; returns its variables' types."""
    types = _variable_types(loop)
    assert len(types) > 100 and {"t", "j", "node", "tail"} <= set(types)  # (parsed)
    mixed = {v: ts for v, ts in types.items()
             if "float64" in ts and any(t.startswith(("int", "uint", "Literal[int]")) for t in ts)}
    assert not mixed, f"{name}: variables typed both float and integer: {mixed}"
    for v in row_indices:
        if v in types:
            assert types[v] <= {"uint64"}, f"{name}: row index {v} typed {types[v]}"
    return types


def test_general_kernel_parameters_are_the_tuples_fields_in_order():
    """kernel.run unpacks Config, State and Output in field order: the loop's
    parameters must be those fields, in that order (a swap would type-check and run)."""
    names = list(inspect.signature(K.advance.py_func).parameters)
    assert names == [*K.Config._fields, *K.State._fields, *K.Output._fields, "t_end"]


@pytest.mark.parametrize(("make", "chooser"), [
    (_p_single, "plain_ok"), (lambda: _mitigated()[0], "mitigated_ok"),
    (lambda: make_scenario(rate=1000, duration=20, nodes=2, servers=4, queue_limit=20),
     "mitigated_allowed")], ids=["plain", "mitigated", "general"])
def test_the_loop_is_chosen_once_while_nothing_changes(make, chooser, monkeypatch):
    """A closed loop sets the flags it polled at every poll, mostly unchanged: the loop a
    call runs is chosen once (a pass over the pools) and kept until a flag, a control or
    a fault changes, not asked for again before every call."""
    asked = []
    original = getattr(fleet_module, chooser)
    monkeypatch.setattr(fleet_module, chooser,
                        lambda *a, **k: asked.append(1) or original(*a, **k))
    fleet = Fleet(load_scenario(make()))
    flags = fleet.flag_state()
    for t in np.arange(0.5, 20.01, 0.5):
        fleet.advance(float(t))
        fleet.set_flags(flags)  # unchanged
        fleet.set_node_controls(0, weight=1.0)  # unchanged
    assert len(asked) == 1
    # a change: chosen again (once)
    fleet.set_flags(fleet.flag_state().updated(breaker="half_open"))
    fleet.advance(20.0)
    fleet.advance(20.0)
    assert len(asked) == 2


def test_kept_choices_equal_the_general_kernel_through_flag_changes(monkeypatch):
    """Hedging, shedding and degraded mode switched on and off between calls, polled
    flags set again unchanged in between (the choice is kept then, chosen again at each
    change, and while leftovers of a leaner loop's refusal drain): every array equals the
    general kernel's run."""
    sc = make_scenario(rate=1800, duration=30, nodes=4, servers=4, fanout=2)
    sc["mitigations"] = {"hedge": {"delay_ms": 15, "cancel": "queued"},
                         "degraded": {"fanout": 1, "service_factor": 0.5}}
    plan = {4.0: {"hedge_enabled": True}, 9.0: {"shed_bronze": True, "degraded_mode": True},
            15.0: {"shed_bronze": False, "degraded_mode": False, "hedge_enabled": False},
            22.0: {"hedge_enabled": True}}

    def poll(fleet, t):
        fleet.set_flags(fleet.flag_state().updated(**plan.get(t, {})))

    steps = tuple(float(t) for t in np.arange(1.0, 30.01, 1.0))
    fast, used = _run(sc, True, steps=steps, between=poll, monkeypatch=monkeypatch)
    general, _ = _run(sc, False, steps=steps, between=poll, monkeypatch=monkeypatch)
    assert used["plain"] >= 2 and used["fanout"] >= 2 and used["general"] >= 2
    assert fast.st.fleet_c[K.F_HEDGES] > 0 and fast.st.fleet_c[K.F_DEGRADED] > 0
    _assert_same(fast, general, lean=used["simple"] > 0)


def _grow_all(self, st):
    """The pools' growth as it was: every pool and the heap doubled at every growth."""
    isv = st.is_.copy()
    jobs, users, calls = st.job_i.shape[0], st.usr_i.shape[0], st.call_i.shape[0]
    heap = st.heap_t.shape[0]
    job_i = fleet_module._grow_rows(st.job_i, 2 * jobs)
    job_i[jobs:, K.JI_SIB] = -1
    pool = fleet_module._grown_pool
    grown = st._replace(
        is_=isv, job_i=job_i, job_f=fleet_module._grow_rows(st.job_f, 2 * jobs),
        job_free=pool(st.job_free, isv[K.IS_JOB_FREE_N], jobs, 2 * jobs),
        usr_i=fleet_module._grow_rows(st.usr_i, 2 * users),
        usr_f=fleet_module._grow_rows(st.usr_f, 2 * users),
        usr_free=pool(st.usr_free, isv[K.IS_USR_FREE_N], users, 2 * users),
        call_i=fleet_module._grow_rows(st.call_i, 2 * calls),
        call_f=fleet_module._grow_rows(st.call_f, 2 * calls),
        call_free=pool(st.call_free, isv[K.IS_CALL_FREE_N], calls, 2 * calls),
        heap_t=fleet_module._grow_rows(st.heap_t, 2 * heap),
        heap_k=fleet_module._grow_rows(st.heap_k, 2 * heap),
        **fleet_module._grown_rings(st.tq_t, st.tq_k, st.tq_n))
    isv[K.IS_JOB_FREE_N] += jobs
    isv[K.IS_USR_FREE_N] += users
    isv[K.IS_CALL_FREE_N] += calls
    return grown


@pytest.mark.parametrize("servers", [16, 4], ids=["rings-short", "jobs-short"])
def test_pools_that_did_not_run_short_do_not_grow_and_the_run_is_unchanged(servers):
    """A crash with retries (the job pool's row numbers order the crash's ends, and so
    the retries' draws), in an overload (the job pool runs short) and under load with
    long deadlines (the timer rings run short first): growing only what ran short gives
    the run every pool doubling together gave, bit for bit, with smaller pools."""
    sc = make_scenario(rate=2500, duration=20, nodes=2, servers=servers, deadline_ms=2000,
                       faults=[{"node": 1, "start_s": 12, "end_s": 15, "crash": True}])
    sc["mitigations"] = {"retries": {"max_attempts": 3, "backoff_ms": 1}}
    lazy = Fleet(load_scenario(sc))
    lazy.advance(20.0)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(Fleet, "_grow_pools", _grow_all)
        eager = Fleet(load_scenario(sc))
        eager.advance(20.0)
    assert eager.st.job_i.shape[0] == lazy.st.job_i.shape[0] > 64  # (it grew)
    assert lazy.st.usr_i.shape[0] + lazy.st.call_i.shape[0] + lazy.st.tq_t.shape[1] < (
        eager.st.usr_i.shape[0] + eager.st.call_i.shape[0] + eager.st.tq_t.shape[1])
    assert lazy.st.fleet_c[K.F_RETRIES] > 0 and lazy.st.cnt[1, :, K.ERROR].sum() > 1
    for name in lazy.out._fields:
        np.testing.assert_array_equal(getattr(lazy.out, name), getattr(eager.out, name),
                                      err_msg=name)
    for name in ("job_f", "job_free", "heap_t", "node_i", "node_f", "node_c", "cnt",
                 "fleet_c", "rng", "fs"):
        np.testing.assert_array_equal(getattr(lazy.st, name), getattr(eager.st, name),
                                      err_msg=name)
    # the jobs' rows and timers, but for the calls' row numbers (a call's row is another)
    others = [c for c in range(K.N_JI) if c != K.JI_CALL]
    np.testing.assert_array_equal(lazy.st.job_i[:, others], eager.st.job_i[:, others])
    keys = [st.heap_k[: st.is_[K.IS_HEAP_N]] for st in (lazy.st, eager.st)]
    by_job = (keys[0] & K.EV_MASK) != K.EV_RETRY
    np.testing.assert_array_equal(by_job, (keys[1] & K.EV_MASK) != K.EV_RETRY)
    np.testing.assert_array_equal(keys[0][by_job], keys[1][by_job])


def _leftovers_by_scan(fleet) -> tuple[bool, bool]:
    """(for the plain loops, for the lean ones): whether a row or a heap entry holds what a
    mechanism left, found by scanning them (the check the loops' choice made before the
    kernel kept counts: relakit.sim.loops.leaves, kernel.IS_OLD)."""
    st, cfg = fleet.st, fleet.cfg
    kinds = st.heap_k[: st.is_[K.IS_HEAP_N]] & K.EV_MASK
    ji = st.job_i
    live = ji[:, K.JI_STATE] != K.J_FREE
    jl = ji[live]
    odd = ((jl[:, K.JI_STATE] != K.J_QUEUED) & (jl[:, K.JI_STATE] != K.J_SERVING)).any() or (
        jl[:, K.JI_DEGRADED].any() or (jl[:, K.JI_CALL] < 0).any())
    users = np.ones(st.usr_i.shape[0], bool)
    users[st.usr_free[: st.is_[K.IS_USR_FREE_N]]] = False
    ui = st.usr_i[users]
    lean = bool(odd or not np.isin(kinds, (K.EV_DONE, K.EV_RETRY)).all()
                or ui[:, K.UI_DEGRADED].any()
                or (ui[:, K.UI_FANOUT] != cfg.cfg_i[K.CI_FANOUT]).any())
    calls = st.call_i[jl[:, K.JI_CALL][jl[:, K.JI_CALL] >= 0]]
    plain = bool(lean or (kinds != K.EV_DONE).any() or st.tq_n[:, 1].any()
                 or jl[:, K.JI_HEDGE].any() or (jl[:, K.JI_CLIENT] != K.C_WAITING).any()
                 or (calls[:, K.CL_COPIES] != 1).any() or (calls[:, K.CL_ATTEMPTS] != 1).any())
    return plain, lean


def test_the_counts_the_loop_keeps_never_miss_a_leftover(monkeypatch):
    """The loops' choice reads counts the kernel keeps (events by kind, rows live when a
    mechanism last ran: kernel.IS_EVENTS, IS_OLD), no row. Through hedging, retries,
    degraded mode and an intake limit switched on and off: whenever it allows a leaner
    loop, a scan of the rows finds nothing that loop could not take; and once the
    mechanisms are off and their leftovers drained, it does allow it again."""
    sc = make_scenario(rate=400, duration=30, nodes=4, servers=4, fanout=2)  # (load 0.5)
    sc["mitigations"] = {"hedge": {"delay_ms": 15, "cancel": "never"}, "degraded": {"fanout": 1}}
    flips = {3.0: dict(hedge_enabled=True), 9.0: dict(hedge_enabled=False),
             12.0: dict(degraded_mode=True), 15.0: dict(degraded_mode=False)}
    fleet = Fleet(load_scenario(sc))
    allowed, refused = [], []
    for t in np.arange(0.5, 30.01, 0.5):
        fleet.advance(float(t))
        if t in flips:
            fleet.set_flags(fleet.flag_state().updated(**flips[t]))
        if t == 18.0:
            fleet.set_node_controls(1, intake_limit=2)
        if t == 21.0:
            fleet.set_node_controls(1, intake_limit=None)
        plain_scan, lean_scan = _leftovers_by_scan(fleet)
        plain, lean = P.plain_ok(fleet.cfg, fleet.st), M.mitigated_ok(fleet.cfg, fleet.st)
        assert not (plain and plain_scan), t  # never a leftover the plain loop would misread
        assert not (lean and lean_scan), t
        (allowed if plain else refused).append(t)
    assert fleet.st.fleet_c[K.F_HEDGES] > 0 and fleet.st.fleet_c[K.F_DEGRADED] > 0
    assert 3.5 in refused and 12.5 in refused and 18.5 in refused  # (the mechanisms ran)
    # plain again within a second of each switch-off (the deadline and hedge delay drain)
    assert {2.5, 10.5, 16.5, 22.5, 30.0} <= set(allowed), allowed
