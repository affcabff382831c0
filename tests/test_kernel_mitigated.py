"""The lean mitigated loop (relakit.sim.mitigated) changes speed, never results.

Each scenario runs through the kernels ``Fleet.advance`` picks (plain, mitigated,
general) and through the general kernel alone, in several calls: every state and
output array must be identical, bit for bit, but one event's scratch arrays
(``plain.SCRATCH``) and the user rows the mitigated loop leaves unwritten for
requests that ended in it (``kernel.LEAN_USER``: compared on the live rows and the
generation column). Each also checks that the mitigated loop really ran, and that the
mechanisms it stands in for did something, so the equality is not vacuous.
"""

from __future__ import annotations

import pytest
from conftest import make_scenario
from test_kernel_specialised import _assert_same as assert_same
from test_kernel_specialised import _run, assert_integers_stay_integers, started_as_the_loop_would

from relakit.scenario import load_scenario
from relakit.sim import kernel as K
from relakit.sim import loops as M
from relakit.sim.fleet import Fleet


@pytest.fixture(autouse=True)
def _numba_loops(monkeypatch):
    monkeypatch.setenv("RELAKIT_AOT", "0")  # numba's plain loops (see test_kernel_specialised)


def _errors(nodes, rate=0.02):
    return [{"node": n, "start_s": 0, "end_s": 100, "error_rate": rate} for n in range(nodes)]


def _m_fleet():  # the bench's set: hedge after ~p95 cancelling queued losers, a budget
    sc = make_scenario(rate=1300, duration=20, nodes=4, servers=4, deadline_ms=60, warmup=2,
                       faults=_errors(4), tiers={"gold": 0.2, "silver": 0.3, "bronze": 0.5})
    sc["metrics"]["phase_s"] = [0.0, 0.1, 0.2, 0.3]
    sc["controls"] = {"hedge_enabled": True}
    sc["mitigations"] = {"hedge": {"delay_ms": 25, "cancel": "queued"},
                         "retries": {"max_attempts": 3, "budget_ratio": 0.2}}
    return sc


def _m_started():  # cancel started copies, two hedges, wrong answers, lognormal demand
    sc = make_scenario(rate=1500, duration=20, nodes=5, servers=4, deadline_ms=40,
                       service={"kind": "lognormal", "mean_ms": 10, "cv": 1.5},
                       faults=[{"node": 1, "start_s": 0, "end_s": 100, "wrong_rate": 0.1,
                                "error_rate": 0.05}])
    sc["controls"] = {"hedge_enabled": True}
    sc["mitigations"] = {"hedge": {"delay_ms": 15, "cancel": "started", "max_hedges": 2},
                         "retries": {"max_attempts": 2}}
    return sc


def _m_never():  # losers never cancelled, retries with jitter and no budget, p2c, Pareto
    sc = make_scenario(rate=1200, duration=20, nodes=4, servers=4, deadline_ms=50,
                       routing="p2c", service={"kind": "pareto", "mean_ms": 10, "alpha": 2.5},
                       faults=_errors(4, 0.03))
    sc["controls"] = {"hedge_enabled": True}
    sc["mitigations"] = {"hedge": {"delay_ms": 30, "cancel": "never"},
                         "retries": {"max_attempts": 4, "jitter": True, "backoff_ms": 5}}
    return sc


def _m_schedule():  # faults that start and end mid-run (one at a call's end), JSQ routing
    sc = make_scenario(rate=1200, duration=20, nodes=4, servers=4, deadline_ms=60,
                       routing="jsq",
                       faults=[{"node": 1, "start_s": 3, "end_s": 9, "error_rate": 0.3,
                                "wrong_rate": 0.1},
                               {"node": 2, "start_s": 0, "end_s": 12.5, "slowdown": 2.0},
                               {"node": 0, "start_s": 5, "end_s": 15, "error_rate": 0.05}])
    sc["controls"] = {"hedge_enabled": True}
    sc["mitigations"] = {"hedge": {"delay_ms": 20},
                         "retries": {"max_attempts": 3, "budget_ratio": 0.3}}
    return sc


def _m_trace():  # deadlines and retries only: trace arrivals (thinning), round robin,
    # baseline error rates (schedule rows no repair clears)
    sc = make_scenario(rate=1, duration=20, nodes=4, servers=4, deadline_ms=40,
                       routing="round_robin",
                       arrival={"kind": "trace", "points": [[0, 500], [10, 1800], [20, 800]]})
    sc["fleet"]["baseline_error_rate"] = [0.0, 0.05, 0.0, 0.1]
    sc["mitigations"] = {"retries": {"max_attempts": 3}}
    return sc


def _m_single():  # one node: hedging on but nowhere to hedge to; weighted tiers
    sc = make_scenario(rate=700, duration=20, servers=8, deadline_ms=30, faults=_errors(1),
                       tiers={"gold": 0.5, "silver": 0.0, "bronze": 0.5})
    sc["controls"] = {"hedge_enabled": True}
    sc["mitigations"] = {"hedge": {"delay_ms": 20}, "retries": {"max_attempts": 2}}
    return sc


def _m_weighted():  # random routing over unequal weights, one node never chosen
    sc = make_scenario(rate=1000, duration=20, nodes=4, servers=4, deadline_ms=60,
                       weights=[1, 2, 0, 1], faults=_errors(4))
    sc["controls"] = {"hedge_enabled": True}
    sc["mitigations"] = {"hedge": {"delay_ms": 20}}
    return sc


def _m_fanout():  # three calls to distinct nodes: the fan-out loop, tiers, a budget
    sc = make_scenario(rate=450, duration=20, nodes=6, servers=4, fanout=3, deadline_ms=60,
                       faults=_errors(6), tiers={"gold": 0.2, "silver": 0.3, "bronze": 0.5})
    sc["controls"] = {"hedge_enabled": True}
    sc["mitigations"] = {"hedge": {"delay_ms": 25, "cancel": "queued"},
                         "retries": {"max_attempts": 3, "budget_ratio": 0.2}}
    return sc


def _m_fanout_p2c():  # fan-out 2 with p2c and unequal weights, cancel started, wrong
    # answers and a schedule change mid-run, lognormal demand
    sc = make_scenario(rate=600, duration=20, nodes=5, servers=4, fanout=2, deadline_ms=50,
                       routing="p2c", weights=[1, 2, 1, 1, 2],
                       service={"kind": "lognormal", "mean_ms": 10, "cv": 1.5},
                       faults=[{"node": 1, "start_s": 4, "end_s": 11, "error_rate": 0.2,
                                "wrong_rate": 0.1}])
    sc["controls"] = {"hedge_enabled": True}
    sc["mitigations"] = {"hedge": {"delay_ms": 20, "cancel": "started"},
                         "retries": {"max_attempts": 2}}
    return sc


def _m_fanout_wide():  # a fan-out wider than the eligible nodes (k = 3 of 4, one weighted 0)
    sc = make_scenario(rate=400, duration=20, nodes=4, servers=4, fanout=4, deadline_ms=60,
                       weights=[1, 1, 0, 1], faults=_errors(4))
    sc["controls"] = {"hedge_enabled": True}
    sc["mitigations"] = {"hedge": {"delay_ms": 20, "cancel": "never"}}
    return sc


def _assert_same(a, b, simple=False, one_call=True):
    """Every array equal, bit for bit, but the scratch ones and, with ``one_call``, the
    user rows of requests that ended in the one-call mitigated loop (free rows:
    LEAN_USER); with ``simple`` (the simple plain loop ran too), the call rows likewise
    (kernel.LEAN_CALL)."""
    assert_same(a, b, lean=True if simple else (("usr_i", "usr_f") if one_call else ()))


def test_mitigated_scenarios_meet_what_they_are_for(monkeypatch):
    """The scenarios above exercise the paths they name (so their equality means it)."""
    started, _ = _run(_m_started(), True, monkeypatch=monkeypatch)
    assert started.st.node_c[:, K.NC_CANCELLED].sum() > 0  # started copies stopped
    assert started.st.node_c[1, K.NC_WRONG] > 0
    never, _ = _run(_m_never(), True, monkeypatch=monkeypatch)
    assert never.st.node_c[:, K.NC_CANCELLED].sum() == 0
    fleet, _ = _run(_m_fleet(), True, monkeypatch=monkeypatch)
    assert fleet.st.fleet_c[K.F_RETRIES_DENIED] > 0  # the budget said no
    assert fleet.st.node_c[:, K.NC_CANCELLED].sum() > 0  # queued losers cancelled
    sched, _ = _run(_m_schedule(), True, monkeypatch=monkeypatch)
    assert sched.st.is_[K.IS_SCHED_POS] == len(sched.cfg.sched_t)  # every change applied
    assert sched.st.node_f[2, K.NF_SLOWDOWN] == 1.0 and sched.st.node_f[1, K.NF_ERR_RATE] == 0


def test_kernels_hand_over_mid_run(monkeypatch):
    """Plain, mitigated and general stretches in one run: hedging switched on (mitigated),
    a node capped (general: an intake limit), the cap lifted (mitigated once the general
    kernel's leftovers allow), hedging off (plain once the last hedge drained), a node
    isolated without failover, and on again; the run equals the general one."""
    sc = make_scenario(rate=1000, duration=40, nodes=4, servers=4)  # plain while hedging is off
    sc["mitigations"] = {"hedge": {"delay_ms": 15, "cancel": "queued"}}

    def flip(fleet, t):
        if t == 5.0:
            fleet.set_flags(fleet.flag_state().updated(hedge_enabled=True))
        elif t == 10.0:
            fleet.set_node_controls(1, intake_limit=3)
        elif t == 15.0:
            fleet.set_node_controls(1, intake_limit=None)
        elif t == 25.0:
            fleet.set_flags(fleet.flag_state().updated(hedge_enabled=False))
        elif t == 30.0:
            fleet.set_flags(fleet.flag_state().updated(hedge_enabled=True))
            fleet.set_node_controls(2, routable=False)

    steps = (5.0, 10.0, 15.0, 15.5, 20.0, 25.0, 25.5, 30.0, 35.0, 40.0)
    fast, used = _run(sc, True, steps=steps, between=flip, monkeypatch=monkeypatch)
    general, _ = _run(sc, False, steps=steps, between=flip, monkeypatch=monkeypatch)
    by_step = [(c["plain"], c["mitigated"], c["general"]) for c in used["by_step"]]
    assert by_step[0] == (by_step[0][0], 0, 0) and by_step[0][0] >= 1  # plain to 5 s
    assert by_step[1][1] >= 1 and by_step[1][2] == 0  # hedging: mitigated
    assert by_step[2][2] >= 1  # a node capped: general
    assert all(g == by_step[2][2] for _, _, g in by_step[3:])  # never again: the drain of
    # hedges after hedging is switched off is the mitigated loop's, then plain
    assert by_step[7][0] > by_step[6][0] and by_step[-1][1] > by_step[7][1], str(by_step)
    assert fast.st.fleet_c[K.F_HEDGES] > 0
    _assert_same(fast, general, simple=True)


def test_requests_admitted_in_degraded_mode_are_the_general_kernels_to_finish(monkeypatch):
    """Degraded mode (partial fan-out) is the general kernel's; a request it admitted may
    outlive it, its user row saying so with no copy served degraded yet: the general
    kernel finishes it, the fan-out loop runs after."""
    sc = _m_fanout()
    sc["mitigations"]["degraded"] = {"fanout": 2}
    refused = []

    def flip(fleet, t):
        if t == 5.0:
            fleet.set_flags(fleet.flag_state().updated(degraded_mode=True))
        elif t == 10.0:
            fleet.set_flags(fleet.flag_state().updated(degraded_mode=False))
            refused.append(not M.mitigated_ok(fleet.cfg, fleet.st))

    steps = (5.0, 10.0, 10.2, 15.0, 20.0)
    fast, used = _run(sc, True, steps=steps, between=flip, monkeypatch=monkeypatch)
    general, _ = _run(sc, False, steps=steps, between=flip, monkeypatch=monkeypatch)
    assert refused == [True, True]  # (both runs: degraded requests in flight when it ended)
    by_step = [(c["mitigated"], c["general"]) for c in used["by_step"]]
    assert by_step[2][1] > by_step[1][1] and by_step[-1][0] > by_step[2][0]
    assert fast.st.fleet_c[K.F_DEGRADED] > 0
    _assert_same(fast, general)


def test_a_repair_between_calls_hands_over(monkeypatch):
    """A repair (Python, between calls) clears a fault that began before it; the schedule's
    later changes, applied by the mitigated loop's Python step, honour it as the general
    kernel's on_schedule does."""
    sc = make_scenario(rate=1200, duration=20, nodes=3, servers=4, deadline_ms=60,
                       faults=[{"node": 0, "start_s": 2, "end_s": 14, "error_rate": 0.4},
                               {"node": 0, "start_s": 9, "end_s": 16, "slowdown": 1.5}])
    sc["mitigations"] = {"retries": {"max_attempts": 3}}

    def mend(fleet, t):
        if t == 6.0:
            fleet.repair(0)

    steps = (6.0, 12.0, 20.0)
    fast, used = _run(sc, True, steps=steps, between=mend, monkeypatch=monkeypatch)
    general, _ = _run(sc, False, steps=steps, between=mend, monkeypatch=monkeypatch)
    assert used["mitigated"] >= 3 and used["general"] == 0
    _assert_same(fast, general)


def test_pools_grow_before_a_schedule_change_as_the_general_kernel_grows_them(monkeypatch):
    """The general kernel asks for heap room for every job before it applies a schedule
    change (a crash may end them all); the change applied in Python asks for the same, so
    the pools grow at the same point and every array stays equal (checked by mutation:
    without it the job rows differ)."""

    squeezed = []

    def squeeze(fleet, t):  # a heap with less room than the job pool before the change at 3 s
        if t == 2.999:
            st = fleet.st
            hn = st.is_[K.IS_HEAP_N]
            cap = hn + st.job_i.shape[0] - min(50, hn // 2)  # (one doubling is enough)
            fleet.st = st._replace(heap_t=st.heap_t[:cap].copy(), heap_k=st.heap_k[:cap].copy())
            squeezed.append(cap)

    steps = (2.999, 3.5)  # (compared just after the change: a later growth would catch up)
    fast, used = _run(_m_schedule(), True, steps=steps, between=squeeze, monkeypatch=monkeypatch)
    general, _ = _run(_m_schedule(), False, steps=steps, between=squeeze,
                      monkeypatch=monkeypatch)
    assert used["general"] == 0 and used["mitigated"] >= 2
    assert fast.st.heap_t.shape[0] > squeezed[0]  # (it grew)
    _assert_same(fast, general)


def test_mitigated_ok_says_no_to_what_only_the_general_kernel_runs():
    ok = Fleet(load_scenario(_m_fleet()))
    assert M.mitigated_ok(ok.cfg, ok.st)
    plain = Fleet(load_scenario(make_scenario(rate=100, duration=5)))
    assert M.mitigated_ok(plain.cfg, plain.st)  # (it could: Fleet asks plain_ok first)
    sc = _m_fleet()
    sc["mitigations"]["hedge"] = {"delay_quantile": 0.95}
    assert not M.mitigated_ok(*_cfg_st(sc))  # an adaptive hedge delay
    sc = _m_fleet()
    sc["faults"] = [{"node": 0, "start_s": 3, "end_s": 5, "crash": True}]
    assert not M.mitigated_ok(*_cfg_st(sc))  # a crash (intake)
    sc = _m_fleet()
    sc["fleet"]["queue_limit"] = 10
    assert not M.mitigated_ok(*_cfg_st(sc))  # a queue limit (intake)
    fleet = Fleet(load_scenario(_m_fleet()))
    fleet.set_node_controls([0, 1, 2, 3], routable=False)
    assert not M.mitigated_ok(fleet.cfg, fleet.st)  # no node to send to
    fleet = Fleet(load_scenario(_m_fleet()))
    fleet.set_flags(fleet.flag_state().updated(shed_bronze=True))
    assert not M.mitigated_ok(fleet.cfg, fleet.st)
    fleet = Fleet(load_scenario(_m_fleet()))
    fleet.set_flags(fleet.flag_state().updated(degraded_mode=True))
    assert not M.mitigated_ok(fleet.cfg, fleet.st)


def _cfg_st(sc):
    fleet = Fleet(load_scenario(sc))
    return fleet.cfg, fleet.st


def test_a_schedule_without_crashes_due_at_start_is_applied_in_python(monkeypatch):
    """kernel.schedule_at_start applies a crash-free change due at t = 0 (errors, wrong
    answers, slowdowns, baselines) before the first call: the node and schedule state
    equal the compiled on_schedule's, bit for bit; a crashing schedule is left to the
    loop."""
    sc = _m_schedule()
    sc["fleet"]["baseline_error_rate"] = 0.01
    sc["fleet"]["service_scale"] = [1.0, 1.5, 0.7, 1.0]
    sc["faults"].append({"node": 3, "start_s": 0, "end_s": 4, "wrong_rate": 0.2})
    fast = started_as_the_loop_would(sc, monkeypatch)
    assert fast.st.node_f[2, K.NF_SLOWDOWN] == 0.7 * 2 and fast.st.fs[K.FS_NEXT_SCHED] == 3.0
    assert fast.st.node_f[3, K.NF_WRONG_RATE] == pytest.approx(0.2)
    assert fast.st.node_f[0, K.NF_ERR_RATE] == pytest.approx(0.01)  # (the baseline)
    sc["faults"].append({"node": 0, "start_s": 0, "end_s": 2, "crash": True})
    crashing = Fleet(load_scenario(sc))
    assert crashing.st.fs[K.FS_NEXT_SCHED] == 0.0  # the general kernel's
    with pytest.raises(ValueError, match="crashing fault"):
        K.schedule_step(crashing.cfg, crashing.st)


@pytest.mark.parametrize(("make", "name"), [(_m_fleet, "advance_mitigated"),
                                           (_m_fanout, "advance_mitigated_fanout")])
def test_the_loops_integers_stay_integers(make, name, monkeypatch):
    """As for the plain specialisations (test_kernel_specialised): no variable of the lean
    specialisations is typed both float and integer (an int64 meeting a uint64 becomes a
    float64 in numba, without a word)."""
    loop = getattr(M, name)()
    _run(make(), True, steps=(2.0,), monkeypatch=monkeypatch)
    types = assert_integers_stay_integers(loop, name, ())
    assert {"j", "node", "c", "u", "fin_u"} <= set(types)  # (parsed)


def test_the_lean_loops_are_specialisations_of_the_one_loop():
    """The mitigated loops are kernel.advance's code under the lean constants: the four
    mechanisms on and no other, ONE_CALL for requests of one call, each cached under a
    name carrying them and the digest of what it inlines."""
    from relakit.sim import cachename

    one_call, fanout = M.advance_mitigated(), M.advance_mitigated_fanout()
    assert one_call.py_func.__code__ is K._ADVANCE_PY.__code__
    assert fanout.py_func.__code__ is K._ADVANCE_PY.__code__
    digest = cachename.digest()
    mechanisms = "hedging+deadlines+retries+errors"
    assert one_call.py_func.__qualname__ == f"advance[{mechanisms}+lean+one_call-{digest}]"
    assert fanout.py_func.__qualname__ == f"advance[{mechanisms}+lean-{digest}]"
    for loop, one in ((one_call, True), (fanout, False)):
        g = loop.py_func.__globals__
        assert g["ONE_CALL"] is one and g["LEFTOVERS"] is True
        assert {f for f in K.FEATURES if g[f.upper()]} == set(M.MECHANISMS)
