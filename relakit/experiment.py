"""Scenario → run → results: the one layer that wires the pieces together.

Open loop, the fleet runs with the scenario's static controls. Closed loop
(a ``policy`` in the scenario), this layer plays RelA's four clocks: it
advances the fleet to each evaluation instant, gives the controller what
Prometheus would hold by then, and applies the desired state at each config
poll. The kernel and the controller never see each other.
"""

from __future__ import annotations

import time

import numpy as np
import polars as pl

from relakit.control import TSDB, Controller, Target
from relakit.control.controller import time_in_mode
from relakit.scenario import Scenario, load_scenario
from relakit.sim import Fleet, SimulationResult
from relakit.sim.results import fleet_columns, node_columns


def simulate(scenario, seed: int | None = None, record_requests: bool = True) -> SimulationResult:
    """Run a scenario (a path, a dict or a :class:`Scenario`) end to end.

    The same scenario and seed always give identical tables. With
    ``record_requests=False`` memory stays flat however long the run.
    """
    sc: Scenario = load_scenario(scenario)
    wall = time.perf_counter()
    fleet = Fleet(sc, seed=seed, record_requests=record_requests)
    if sc.policy is None:
        fleet.advance(sc.duration_s)
        result = fleet.result()
    else:
        controller = run_closed_loop(fleet, sc)
        result = fleet.result()
        result.decisions = controller.decisions()
        result.timeline = pl.DataFrame({
            "time_s": controller.times,
            "mode": [(["normal"] + [m.name for m in controller.policy.modes])[m + 1]
                     for m in controller.modes],
            **{k: np.array([v[i] for v in controller.values])
               for i, k in enumerate(controller.policy.signals)},
        })
        result.info["control"] = control_summary(result.decisions, result.timeline,
                                                 controller)
    result.info["wall_s"] = round(time.perf_counter() - wall, 4)
    return result


def run_closed_loop(fleet: Fleet, sc: Scenario) -> Controller:
    """Evaluate at every eval instant; apply the latest decision at every config poll.

    At an instant that is both, the evaluation comes first, so a decision with
    no propagation delay takes effect at a poll at the same instant.
    """
    clk = sc.clocks
    controller = Controller(sc.policy, clk)
    evals = clk.eval_times(0.0, sc.duration_s)
    k = np.arange(np.ceil(-clk.poll_phase_s / clk.poll_s),
                  np.floor((sc.duration_s - clk.poll_phase_s) / clk.poll_s) + 1)
    polls = clk.poll_phase_s + k * clk.poll_s
    instants = np.union1d(evals, polls)
    eval_set, poll_set = set(evals.tolist()), set(polls.tolist())
    decided: list[tuple[float, dict]] = []
    applied = 0
    view = FleetView(fleet)
    for t in instants:
        fleet.advance(float(t))
        if t in eval_set:
            decided.append((float(t), controller.evaluate(view.tsdb(), float(t))))
        if t in poll_set:  # the data plane reads the config server's latest state
            while applied < len(decided) and decided[applied][0] + clk.propagation_s <= t:
                applied += 1
            if applied:
                fleet.set_flags(**decided[applied - 1][1])
    fleet.advance(sc.duration_s)
    return controller


class FleetView:
    """What Prometheus would hold of a running fleet: views on the kernel's sample arrays."""

    def __init__(self, fleet: Fleet):
        self.fleet = fleet
        bounds = fleet.scenario.metrics.latency_buckets_s
        ncols = node_columns(bounds)
        fcols = fleet_columns()
        self._node_idx = np.array([c[0] for c in ncols])
        self._node_keys = [c[1:] for c in ncols]
        self._fleet_idx = np.array([c[0] for c in fcols])
        self._fleet_keys = [c[1:] for c in fcols]

    def tsdb(self) -> TSDB:
        from relakit.sim import kernel as K

        out, st = self.fleet.out, self.fleet.st
        targets = []
        for i in range(st.node_i.shape[0]):
            n = int(st.node_i[i, K.NI_NSAMPLE])
            targets.append(Target(i, out.sample_t[:n, i], out.metrics[:n, i][:, self._node_idx],
                                  self._node_keys))
        n_f = int(st.is_[K.IS_NSAMPLE])
        targets.append(Target(-1, out.fleet_t[:n_f], out.fleet[:n_f][:, self._fleet_idx],
                              self._fleet_keys))
        return TSDB(targets)


def control_summary(decisions: pl.DataFrame, timeline: pl.DataFrame, controller) -> dict:
    """Time in each mode, and for each mode change its detection and actuation delays.

    Detection delay: from the first evaluation of the breaching run that led to
    the change, to the decision (the hysteresis' share); actuation delay: from
    the decision to the config poll that applied it.
    """
    changes = []
    for r in decisions.filter(pl.col("action") != "hold").iter_rows(named=True):
        run = max(r["breaches"], 1) if r["action"] in ("enter", "preempt") else max(
            r["clears"], 1)
        first = r["decided_at_s"] - (run - 1) * controller.clocks.eval_s
        changes.append({"mode": r["mode"], "from": r["previous_mode"], "action": r["action"],
                        "first_breach_at_s": first, "decided_at_s": r["decided_at_s"],
                        "effective_at_s": r["effective_at_s"],
                        "detection_delay_s": r["decided_at_s"] - first,
                        "actuation_delay_s": r["effective_at_s"] - r["decided_at_s"]})
    return {"time_in_mode_s": time_in_mode(timeline, controller.clocks.eval_s,
                                           controller.policy),
            "mode_changes": changes}
