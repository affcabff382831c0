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

from relakit.chain import load_chain
from relakit.control import TSDB, Controller, Target
from relakit.control.controller import time_in_mode
from relakit.control.decider import Decision, latest_in_force
from relakit.control.signals import policy_reach_s
from relakit.scenario import Scenario, load_scenario
from relakit.sim import Fleet, SimulationResult

PROGRESS_STEPS = 200  # open loop, with progress: the run is advanced in this many steps


def simulate(scenario, seed: int | None = None, record_requests: bool = True,
             progress=None) -> SimulationResult:
    """Run a scenario (a path, a dict or a :class:`Scenario`) end to end.

    The same scenario and seed always give identical tables. With
    ``record_requests=False`` memory stays flat however long the run.
    ``progress`` (e.g. a :class:`relakit.progress.Progress`) is told the
    simulated time reached, ``progress.update(t)``, as the run goes; the fleet
    is then advanced in steps, which gives bit-identical tables.
    The semantic checks (:mod:`relakit.checks`) run first: errors raise before anything is
    allocated, warnings are :class:`~relakit.checks.RelakitWarning`.
    """
    from relakit.checks import check_run, enforce

    sc: Scenario = load_scenario(scenario)
    enforce(check_run(sc, record_requests))
    wall = time.perf_counter()
    fleet = Fleet(sc, seed=seed, record_requests=record_requests)
    if sc.policy is None and sc.chain is None:
        steps = [sc.duration_s] if progress is None else np.linspace(
            0.0, sc.duration_s, PROGRESS_STEPS + 1)[1:]
        for t in steps:
            fleet.advance(float(t))
            if progress is not None:
                progress.update(float(t))
        result = fleet.result()
    else:
        deciders = run_closed_loop(fleet, sc, progress)
        result = fleet.result()
        for d in deciders:
            line = d.timeline()
            result.timeline = (line if result.timeline is None else
                               result.timeline.join(line, on="time_s", how="left"))
            if isinstance(d, Controller):
                result.info["control"] = control_summary(d.decisions(), line, d,
                                                         sc.duration_s)
            else:
                result.info["chain"] = chain_summary(d, fleet)
        result.decisions = pl.concat([d.decisions() for d in deciders]).sort(
            "decided_at_s", maintain_order=True)
    result.info["wall_s"] = round(time.perf_counter() - wall, 4)
    return result


def deciders_of(sc: Scenario) -> list:
    """The scenario's deciders, in the order their wishes are applied: the policy's
    flags first, then the chain's per-node controls (which may set the breaker)."""
    out = []
    if sc.policy is not None:
        out.append(Controller(sc.policy, sc.clocks))
    if sc.chain is not None:
        out.append(load_chain(sc.chain).run(sc.clocks, servers=sc.fleet.servers,
                                            base_weights=sc.fleet.weights))
    return out


def run_closed_loop(fleet: Fleet, sc: Scenario, progress=None) -> list:
    """Evaluate at every eval instant; apply what is in force at every config poll.

    Every decider decides from what was scraped by then; a decision is in force
    from ``Clocks.effective_at`` on, so at an instant that is both an evaluation
    and a poll, the evaluation comes first and a decision with no propagation
    delay takes effect at once. Repairs are work on the node, not configuration:
    they take effect when done. Returns the deciders, with their audits.
    """
    clk = sc.clocks
    deciders = deciders_of(sc)
    evals = clk.eval_times(0.0, sc.duration_s)
    polls = clk.poll_times(0.0, sc.duration_s)
    instants = np.union1d(evals, polls)
    eval_set, poll_set = set(evals.tolist()), set(polls.tolist())
    pending: list[tuple[float, Decision]] = []  # (effective at, decision), in decision order
    view = FleetView(fleet, lookback_s=clk.lookback(policy_reach_s(sc.policy)))
    for t in instants:
        fleet.advance(float(t))
        if t in eval_set:
            tsdb = view.tsdb(float(t))
            effective = float(clk.effective_at(float(t)))
            for d in deciders:
                decision = d.decide(tsdb, float(t))
                if decision.repairs:
                    fleet.repair(list(decision.repairs))
                pending.append((effective, decision))
        if t in poll_set:  # the data plane reads the config server's latest state
            flags = latest_in_force(pending, float(t), "flags")
            if flags is not None:
                fleet.set_flags(**flags)
            nodes = latest_in_force(pending, float(t), "nodes")
            if nodes is not None:
                _apply_node_controls(fleet, nodes)
        if progress is not None:
            progress.update(float(t))
    fleet.advance(sc.duration_s)
    return deciders


def _apply_node_controls(fleet: Fleet, want: dict) -> None:
    have = fleet.node_controls()
    for i, routable in enumerate(want["routable"]):
        if bool(routable) != bool(have["routable"][i]):
            fleet.set_node_controls(i, routable=bool(routable))
        if abs(want["weight"][i] - have["weight"][i]) > 1e-12:
            fleet.set_node_controls(i, weight=float(want["weight"][i]))
        limit = want["intake_limit"][i]
        if (-1 if limit is None else limit) != have["intake_limit"][i]:
            fleet.set_node_controls(i, intake_limit=limit)
    if want["breaker"] != fleet.flags()["breaker"]:
        fleet.set_flags(breaker=want["breaker"])


def chain_summary(chain, fleet: Fleet) -> dict:
    """Counts of the chain's actions per stage and action, and each node's end state."""
    counts: dict = {}
    for a in chain.actions:
        key = f"{a['stage']}.{a['action']}"
        counts[key] = counts.get(key, 0) + 1
    working = [w for _, w, _ in chain.history]
    return {"order": list(chain.order), "actions": counts,
            "min_working_nodes": min(working) if working else None,
            "working_nodes": [[t, w] for t, w, _ in chain.history],
            "node_status_at_end": [s.status for s in chain.state.nodes],
            "stress_at_end": chain.state.stress,
            "faulty_at_end": np.flatnonzero(fleet.faulty()).tolist()}


class FleetView:
    """What Prometheus would hold of a running fleet: its samples (``Fleet.samples``) as
    a TSDB of the last ``lookback_s``.

    The targets are made once and refreshed in place (so their column lookups are
    remembered), and only the last ``lookback_s`` of samples is handed out: an
    evaluation costs the same an hour into a run as at its start.
    """

    def __init__(self, fleet: Fleet, lookback_s: float):
        self.fleet = fleet
        self.lookback_s = lookback_s
        node_series, fleet_series = fleet.sample_series()
        empty = np.zeros(0)
        self._targets = [Target(i, empty, empty, node_series)
                         for i in range(fleet.scenario.fleet.nodes)]
        self._targets.append(Target(-1, empty, empty, fleet_series))

    def tsdb(self, t: float) -> TSDB:
        for tgt, (_, times, values) in zip(self._targets, self.fleet.samples(t - self.lookback_s),
                                           strict=True):
            tgt.times, tgt.values = times, values
        return TSDB(self._targets)


def control_summary(decisions: pl.DataFrame, timeline: pl.DataFrame, controller,
                    duration_s: float) -> dict:
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
    return {"time_in_mode_s": time_in_mode(timeline, controller.policy, 0.0, duration_s),
            "mode_changes": changes}
