"""Every specialisation of the one event loop that Fleet may choose equals the general
loop, bit for bit; the general loop equals the pure-Python reference where it covers.

One parametrised test. Each case runs twice: through the loops ``Fleet`` picks
(``relakit.sim.loops``: simple, plain, the lean mitigated one-call and fan-out ones,
the in-path settled and simple ones, the general one) and through the general loop alone
(``Fleet.specialise`` off):

* a shipped scenario (``params/scenarios``, those ``benchmarks/reference_runs.py``
  hashes) through ``relakit.simulate``: every table it returns must hash the same
  (``reference_runs.tables``: column names, dtypes, every value's bytes);
* a synthetic fleet aimed at one loop's paths (routings, demand laws, fan-out, tiers,
  cancel policies, schedules), in several calls as a control plane makes them, with
  and without per-request records: every state and output array must be equal, but
  one event's scratch arrays (``loops.SCRATCH``) and the rows the lean loops leave
  unwritten for requests that ended in them (``kernel.LEAN_CALL``, ``LEAN_USER``).

Each case also checks which loops ran and that the mechanisms did something, so the
equality is not vacuous; :func:`test_the_shipped_scenarios_run_every_loop_but_the_fanout_one`
checks which loops the shipped set runs.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import warnings
from pathlib import Path

import numpy as np
import pytest
from conftest import make_scenario
from test_kernel_mitigated import (
    _m_fanout,
    _m_fanout_p2c,
    _m_fanout_wide,
    _m_fleet,
    _m_never,
    _m_schedule,
    _m_single,
    _m_started,
    _m_trace,
    _m_weighted,
)
from test_kernel_specialised import (
    _assert_same,
    _p_fleet,
    _p_jsq,
    _p_p2c,
    _p_scaled,
    _p_simple_fleet,
    _p_single,
    _p_trace,
    _p_weighted_random,
    _run,
    count_loops,
)

import relakit
from relakit.sim import kernel as K
from relakit.sim.reference import kernel_streams, mmc_reference

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("reference_runs",
                                               ROOT / "benchmarks" / "reference_runs.py")
reference_runs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(reference_runs)
SHIPPED = sorted(json.loads(reference_runs.STORE.read_text())["runs"])
LOOPS = ("simple", "plain", "mitigated", "fanout", "in_path", "in_path_simple", "general")

# synthetic cases: (factory, the loop it is for). "simple" and "plain": the plain loops run
# it all (in the simple one exactly for "simple"); "one-call", "fanout": the lean loop
SYNTHETIC = {
    "mm8": (_p_single, "simple"), "simple-fleet-tiers": (_p_simple_fleet, "simple"),
    "service-scale": (_p_scaled, "simple"), "weighted-fanout-tiers": (_p_fleet, "plain"),
    "p2c-lognormal": (_p_p2c, "plain"), "jsq-pareto": (_p_jsq, "plain"),
    "trace-round-robin": (_p_trace, "plain"), "weighted-random": (_p_weighted_random, "plain"),
    "m-fleet-tiers-budget": (_m_fleet, "one-call"),
    "m-cancel-started-2-hedges-wrong": (_m_started, "one-call"),
    "m-cancel-never-jitter-p2c": (_m_never, "one-call"),
    "m-schedule-jsq": (_m_schedule, "one-call"), "m-trace-round-robin": (_m_trace, "one-call"),
    "m-single-node": (_m_single, "one-call"), "m-weighted-random": (_m_weighted, "one-call"),
    "m-fanout-3-tiers-budget": (_m_fanout, "fanout"),
    "m-fanout-2-p2c-started-schedule": (_m_fanout_p2c, "fanout"),
    "m-fanout-wider-than-nodes": (_m_fanout_wide, "fanout"),
}


def _ip(mitigations: dict, rate: float = 3600.0, service=None, **fleet):
    """The in-path loops' cases (``loops.in_path_ok``): four nodes of 8 servers at 10 ms
    (capacity 3200/s), overloaded so that each mechanism refuses, with tiers, several
    calls and records as the others; in the simple in-path loop unless the routing or
    the demand law (``service``) is not simple (``loops.simple_ok``)."""
    def make():
        sc = make_scenario(rate=rate, duration=20, nodes=4, servers=8, warmup=2,
                           service=service,
                           tiers={"gold": 0.2, "silver": 0.3, "bronze": 0.5})
        sc["mitigations"] = mitigations
        sc["fleet"].update(fleet)
        return sc
    return make


SYNTHETIC.update({  # "in-path-simple": the simple in-path loop; "in-path": the settled one
    "ip-throttle": (_ip({"client_throttle": {"k": 1.5, "window_s": 2, "cost_us": 100}}),
                    "in-path-simple"),
    "ip-aimd": (_ip({"concurrency_limit": {"algorithm": "aimd", "initial": 10, "max": 40,
                                           "latency_ms": 30, "cost_us": 50}}),
                "in-path-simple"),
    "ip-gradient": (_ip({"concurrency_limit": {"algorithm": "gradient", "initial": 10,
                                               "max": 40, "window": 20}}), "in-path-simple"),
    "ip-gradient-jsq": (_ip({"concurrency_limit": {"algorithm": "gradient", "initial": 10,
                                                   "max": 40, "window": 20}},
                            routing="jsq"), "in-path"),
    "ip-codel-fifo": (_ip({"codel": {"target_ms": 5, "interval_ms": 50}}, rate=4800.0),
                      "in-path-simple"),
    "ip-codel-adaptive-lifo": (_ip({"codel": {"target_ms": 5, "interval_ms": 50,
                                              "cost_us": 50}},
                                  queue_discipline="adaptive_lifo"), "in-path-simple"),
    "ip-all-three-lifo": (_ip({"client_throttle": {"k": 2, "window_s": 2},
                               "concurrency_limit": {"algorithm": "aimd", "latency_ms": 30},
                               "codel": {"target_ms": 5, "interval_ms": 100}},
                              queue_discipline="lifo"), "in-path-simple"),
    "ip-all-three-adaptive-lognormal": (_ip(
        {"client_throttle": {"k": 2, "window_s": 2, "cost_us": 100},
         "concurrency_limit": {"algorithm": "aimd", "latency_ms": 30, "cost_us": 50},
         "codel": {"target_ms": 5, "interval_ms": 100}},
        service={"kind": "lognormal", "mean_ms": 10, "cv": 1.5},
        queue_discipline="adaptive_lifo"), "in-path"),
})
CASES = ([f"shipped:{s}" for s in SHIPPED]
         + [f"{n}:{r}" for n in SYNTHETIC for r in ("records", "no-records")])


@pytest.fixture(autouse=True)
def _numba_loops(monkeypatch):
    """numba's loops (the ones built ahead of time are compared with them in test_aot)."""
    monkeypatch.setenv("RELAKIT_AOT", "0")


@functools.cache
def _shipped(stem: str) -> tuple[dict, dict, dict]:
    """(tables' hashes through the chosen loops, through the general loop alone, calls
    of each loop in the first run) for a shipped scenario, once a process."""
    runs = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RELAKIT_AOT", "0")
        for specialise in (True, False):
            calls = count_loops(mp, specialise)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                result = relakit.simulate(reference_runs.SCENARIOS / f"{stem}.yaml", workers=1)
            runs.append((reference_runs.tables(result, stem), calls))
    (fast, used), (general, used_general) = runs
    assert sum(used_general[k] for k in LOOPS if k != "general") == 0
    return fast, general, used


@pytest.mark.parametrize("case", CASES)
def test_every_specialisation_equals_the_general_loop(case, monkeypatch):
    name, how = case.split(":")
    if name == "shipped":
        fast, general, used = _shipped(how)
        assert fast and set(fast) == set(general)
        assert [t for t in fast if fast[t] != general[t]] == []
        assert sum(used.values()) > 0
        return
    make, loop = SYNTHETIC[name]
    sc, records = make(), how == "records"
    fast, used = _run(sc, True, records, monkeypatch=monkeypatch)
    general, used_general = _run(sc, False, records, monkeypatch=monkeypatch)
    assert used["general"] == 0 and used_general["plain"] == used_general["mitigated"] == 0
    if loop.startswith("in-path"):  # the settled or simple loop, in-path mechanisms on
        assert used["in_path"] >= 3 and used["plain"] == used["mitigated"] == 0
        assert used["in_path_simple"] == (used["in_path"] if loop == "in-path-simple" else 0)
        refused = fast.st.fleet_c[K.F_THROTTLED] + fast.st.node_c[:, K.NC_REJECTED].sum()
        assert fast.n_arrived > 10_000 and refused > 100, refused
        assert fast.st.cnt[:, :, K.OK].sum() > 10_000
        _assert_same(fast, general, lean=loop == "in-path-simple")
    elif loop in ("simple", "plain"):
        assert used["plain"] >= 3 and used["mitigated"] == 0
        assert used["simple"] == (used["plain"] if loop == "simple" else 0)
        assert fast.n_arrived > 10_000
        assert fast.out.sample_t.shape == general.out.sample_t.shape
        _assert_same(fast, general, lean=loop == "simple")
    else:
        assert used["plain"] == 0 and used["mitigated"] >= 3
        assert used["fanout"] == (used["mitigated"] if loop == "fanout" else 0)
        assert fast.n_arrived > 5_000
        fc = fast.st.fleet_c
        if sc.get("controls", {}).get("hedge_enabled") and sc["fleet"]["nodes"] > 1:
            assert fc[K.F_HEDGES] > 100 and fc[K.F_HEDGES_WON] > 0
        if "retries" in sc.get("mitigations", {}):
            assert fc[K.F_RETRIES] > 0
        assert fast.st.cnt[:, :, K.ERROR].sum() > 0 and fast.st.cnt[:, :, K.TIMEOUT].sum() > 0
        _assert_same(fast, general, lean=("usr_i", "usr_f") if loop == "one-call" else ())
    if records:  # the records are the user requests, one row each
        assert fast.st.is_[K.IS_NREC] > 0.99 * fast.n_arrived - fast.users_in_flight


def test_the_shipped_scenarios_run_every_loop_but_the_fanout_one():
    """So the shipped cases above hold every loop Fleet may choose to the general one; no
    shipped scenario fans out under mitigations alone, so the lean fan-out loop is held
    to it by the synthetic ``m-fanout-*`` cases (which assert that it ran)."""
    ran = {k for stem in SHIPPED for k, n in _shipped(stem)[2].items() if n > 0}
    assert set(LOOPS) - {"fanout", "in_path", "in_path_simple"} <= ran, sorted(ran)
    assert {loop for _, loop in SYNTHETIC.values()} >= {"simple", "plain", "one-call", "fanout",
                                                         "in-path", "in-path-simple"}


@pytest.mark.parametrize("specialise", [True, False], ids=["chosen-loops", "general-loop"])
@pytest.mark.parametrize("nodes", [1, 4])
def test_the_loops_match_the_python_reference_request_for_request(nodes, specialise,
                                                                   monkeypatch):
    """Poisson arrivals, exponential service, random routing over equal nodes: the
    reference (relakit/sim/reference.py) draws the same numbers in the same order."""
    calls = count_loops(monkeypatch, specialise)
    sc = make_scenario(rate=650.0 * nodes, duration=60, nodes=nodes, servers=8, seed=11)
    req = relakit.simulate(sc).requests
    assert calls["general"] == 0 if specialise else calls["general"] > 0
    arrival, latency, demand = mmc_reference(650.0 * nodes, 10.0, 8, 60, kernel_streams(11),
                                             nodes=nodes)
    assert req.height == len(arrival) > 30000 * nodes
    np.testing.assert_allclose(req["arrival_s"].to_numpy(), arrival, rtol=1e-12)
    np.testing.assert_allclose(req["latency_ms"].to_numpy(), latency, rtol=1e-9)
    np.testing.assert_allclose(req["service_ms"].to_numpy(), demand, rtol=1e-12)


def _toggle_concurrency(fleet, t):
    """Between steps: the concurrency limit off at 5 s (CoDel alone, then nothing) and on
    again at 12.5 s, so in-path stretches hand over to other in-path feature sets and to
    the leaner loops with the copies they refused still ending."""
    fleet.cfg.cfg_i[K.CI_CL_ALGO] = K.CL_NONE if t == 5.0 else K.CL_AIMD
    if t == 5.0 and "codel-off" in fleet.scenario.name:
        fleet.cfg.cfg_i[K.CI_CODEL] = 0
        fleet.cfg.cfg_i[K.CI_DISCIPLINE] = K.D_FIFO
    fleet._rechoose()


@pytest.mark.parametrize("codel_off", [False, True], ids=["codel-stays", "codel-off"])
def test_in_path_loops_hand_over_bit_for_bit(codel_off, monkeypatch):
    sc = _ip({"concurrency_limit": {"algorithm": "aimd", "initial": 10, "max": 40,
                                    "latency_ms": 30},
              "codel": {"target_ms": 5, "interval_ms": 50}}, queue_discipline="adaptive_lifo")()
    sc["name"] = "codel-off" if codel_off else "codel-stays"
    fast, used = _run(sc, True, True, between=_toggle_concurrency, monkeypatch=monkeypatch)
    general, _ = _run(sc, False, True, between=_toggle_concurrency, monkeypatch=monkeypatch)
    assert used["general"] == 0 and used["in_path"] >= 2
    if codel_off:
        assert used["plain"] + used["mitigated"] > 0  # nothing on: a leaner loop ran
    assert fast.st.node_c[:, K.NC_REJECTED].sum() > 100
    # (the rows the leaner loops leave unwritten: kernel.LEAN_CALL, LEAN_USER)
    _assert_same(fast, general, lean=True if used["simple"] or used["in_path_simple"] else
                 ("usr_i", "usr_f") if used["mitigated"] else ())


def test_a_refused_copy_live_when_the_simple_in_path_loop_returns(monkeypatch):
    """The records buffer grown a row at a time, so the loops return (GROW_RECORDS) after
    every request's end: a copy CoDel dropped in that event (at the node a completion
    freed) is live, its end due, when the simple in-path loop returns and enters again
    (its rows as ``kernel.lean_rows`` writes and checks them). The run equals the general
    loop's, grown the same way, bit for bit."""
    from relakit.sim import loops as P
    from relakit.sim.fleet import Fleet

    def grow(self, status):
        if status != K.GROW_RECORDS:
            return grow_as_is(self, status)
        out = self.out
        self.out = out._replace(rec_f=np.concatenate([out.rec_f, np.zeros((1, 3))]),
                                rec_i=np.concatenate([out.rec_i, np.zeros((1, 7), np.int32)]))
        self._check_disjoint()

    def few_records(self):  # (Fleet's records buffer, four rows at the start)
        self.out = self.out._replace(rec_f=self.out.rec_f[:4].copy(),
                                     rec_i=self.out.rec_i[:4].copy())

    grow_as_is, init_as_is = Fleet._grow, Fleet.__init__

    def init(self, *args, **kwargs):
        init_as_is(self, *args, **kwargs)
        few_records(self)

    monkeypatch.setattr(Fleet, "_grow", grow)
    monkeypatch.setattr(Fleet, "__init__", init)
    sc = _ip({"codel": {"target_ms": 5, "interval_ms": 50}}, rate=4800.0,
             queue_discipline="adaptive_lifo")()
    sc["duration_s"], sc["warmup_s"] = 4, 0
    ending = []  # live refused copies at each return of the simple in-path loop
    loops_as_is = P.in_path_loops

    def watched(features):
        simple, settled = loops_as_is(features)

        def run(*args):
            status = simple(*args)
            job_i = args[len(K.Config._fields) + K.State._fields.index("job_i")]
            ending.append(int((job_i[:, K.JI_STATE] == K.J_ENDING).sum()))
            return status
        return run, settled

    monkeypatch.setattr(P, "in_path_loops", watched)
    fast, used = _run(sc, True, True, steps=(1.0, 2.5, 4.0), monkeypatch=monkeypatch)
    general, _ = _run(sc, False, True, steps=(1.0, 2.5, 4.0), monkeypatch=monkeypatch)
    assert used["general"] == 0 and used["in_path_simple"] == used["in_path"] > 1000
    assert sum(1 for n in ending if n > 0) > 10, ending[:50]
    assert fast.st.node_c[:, K.NC_CODEL_DROPPED].sum() > 100
    _assert_same(fast, general, lean=True)


@pytest.mark.parametrize("records", [True, False], ids=["records", "no-records"])
def test_a_population_schedule_runs_the_general_loop_chosen_and_forced_alike(records,
                                                                            monkeypatch):
    """Closed clients are the general loop's (CLIENTS folds away elsewhere); with a
    population schedule the steps are applied between calls (Fleet.advance splits at each):
    the loop Fleet chooses and the general loop forced, advanced in steps some of which fall
    on the schedule's (7.5, 15.25) and some not, leave every array equal, and the plain and
    lean loops never run."""
    def make():
        sc = make_scenario(duration=30, nodes=2, servers=2, warmup=1)
        del sc["workload"]["arrival"]
        sc["workload"]["clients"] = {
            "population": {"gold": [[0, 20], [7.5, 120], [15.25, 10]], "bronze": 60},
            "think": {"kind": "exponential", "mean_ms": 200}}
        sc["workload"]["deadline_ms"] = 300
        sc["mitigations"] = {"retries": {"max_attempts": 2, "backoff_ms": 5}}
        return sc
    steps = (3.0, 7.5, 11.0, 15.25, 22.0, 30.0)
    fast, used = _run(make(), True, records, steps=steps, monkeypatch=monkeypatch)
    general, used_general = _run(make(), False, records, steps=steps, monkeypatch=monkeypatch)
    assert used["general"] >= len(steps) and used_general["general"] >= len(steps)
    assert sum(used[k] for k in LOOPS if k != "general") == 0
    assert fast.st.cnt[:, :, K.OK].sum() > 5_000 and fast.st.cnt[:, :, K.TIMEOUT].sum() > 0
    assert fast.st.is_[K.IS_CUT + K.TIERS.index("gold")] == 110  # ids 10-119 cut at the end
    _assert_same(fast, general)
