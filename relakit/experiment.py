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
from relakit.control.controller import sample_age, time_in_mode
from relakit.scenario import Scenario, load_scenario
from relakit.sim import Fleet, SimulationResult
from relakit.sim.longtable import fleet_columns, node_columns

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
        controller, chain = run_closed_loop(fleet, sc, progress)
        result = fleet.result()
        parts = []
        if controller is not None:
            parts.append(controller.decisions())
            result.timeline = pl.DataFrame({
                "time_s": controller.times,
                "mode": [(["normal"] + [m.name for m in controller.policy.modes])[m + 1]
                         for m in controller.modes],
                **{k: np.array([v[i] for v in controller.values])
                   for i, k in enumerate(controller.policy.signals)},
            })
            result.info["control"] = control_summary(parts[0], result.timeline, controller,
                                                     sc.duration_s)
        if chain is not None:
            parts.append(chain.decisions(sc.clocks))
            result.info["chain"] = chain_summary(chain, fleet)
            # per evaluation, as `relakit replay` writes it: the chain's panel on a dashboard
            stress = pl.DataFrame({"time_s": [float(t) for t, _, _ in chain.history],
                                   "working_nodes": [w for _, w, _ in chain.history],
                                   "stress": [s for _, _, s in chain.history]},
                                  schema={"time_s": pl.Float64, "working_nodes": pl.Int64,
                                          "stress": pl.String})
            result.timeline = (stress if result.timeline is None else
                               result.timeline.join(stress, on="time_s", how="left"))
        result.decisions = pl.concat(parts).sort("decided_at_s", maintain_order=True)
    result.info["wall_s"] = round(time.perf_counter() - wall, 4)
    return result


def run_closed_loop(fleet: Fleet, sc: Scenario, progress=None):
    """Evaluate at every eval instant; apply the latest decisions at every config poll.

    At an instant that is both, the evaluation comes first, so a decision with
    no propagation delay takes effect at a poll at the same instant. Repairs
    are work on the node, not configuration: they take effect when done.
    """
    clk = sc.clocks
    controller = Controller(sc.policy, clk) if sc.policy is not None else None
    chain = None
    if sc.chain is not None:
        from relakit.chain import load_chain

        chain = load_chain(sc.chain)
        chain.reset()
    evals = clk.eval_times(0.0, sc.duration_s)
    k = np.arange(np.ceil(-clk.poll_phase_s / clk.poll_s),
                  np.floor((sc.duration_s - clk.poll_phase_s) / clk.poll_s) + 1)
    polls = clk.poll_phase_s + k * clk.poll_s
    instants = np.union1d(evals, polls)
    eval_set, poll_set = set(evals.tolist()), set(polls.tolist())
    flags: list[tuple[float, dict]] = []
    nodes: list[tuple[float, dict]] = []
    # a window, plus the scrape before it (Prometheus extrapolates towards the edge)
    # (a promql signal's own ranges and lookback may reach further back)
    from relakit.control.signals import history_s

    reach = history_s(controller.policy.signals.values()) if controller is not None else 0.0
    view = FleetView(fleet, lookback_s=max(clk.window_s, reach) + 2 * clk.scrape_s)
    servers = np.asarray(sc.fleet.servers, dtype=float)
    for t in instants:
        fleet.advance(float(t))
        if t in eval_set:
            tsdb = view.tsdb(float(t))
            if controller is not None:
                flags.append((float(t), controller.evaluate(tsdb, float(t))))
            if chain is not None:
                ctx = chain.evaluate(tsdb, float(t), clk.window_s, servers,
                                     signal_age_s=float(sample_age(tsdb, [t])[0]),
                                     base_weights=sc.fleet.weights)
                if ctx.repairs:
                    fleet.repair(ctx.repairs)
                nodes.append((float(t), ctx.controls()))
        if t in poll_set:  # the data plane reads the config server's latest state
            latest = _latest(flags, t - clk.propagation_s)
            if latest is not None:
                fleet.set_flags(**latest)
            latest = _latest(nodes, t - clk.propagation_s)
            if latest is not None:
                _apply_node_controls(fleet, latest)
        if progress is not None:
            progress.update(float(t))
    fleet.advance(sc.duration_s)
    return controller, chain


def _latest(decided: list, cutoff: float):
    """The newest decision made at or before cutoff (decisions are in time order)."""
    for t, d in reversed(decided):
        if t <= cutoff:
            return d
    return None


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
    """What Prometheus would hold of a running fleet: views on the kernel's sample arrays.

    The targets are made once and refreshed in place (so their column lookups are
    remembered), and only the last ``lookback_s`` of samples is handed out: an
    evaluation costs the same an hour into a run as at its start.
    """

    def __init__(self, fleet: Fleet, lookback_s: float):
        self.fleet = fleet
        self.lookback_s = lookback_s
        bounds = fleet.scenario.metrics.latency_buckets_s
        ncols, fcols = node_columns(bounds), fleet_columns()
        self._node_idx = np.array([c[0] for c in ncols])
        self._fleet_idx = np.array([c[0] for c in fcols])
        empty = np.zeros(0)
        self._targets = [Target(i, empty, empty, [c[1:] for c in ncols])
                         for i in range(fleet.scenario.fleet.nodes)]
        self._targets.append(Target(-1, empty, empty, [c[1:] for c in fcols]))

    def tsdb(self, t: float) -> TSDB:
        from relakit.sim import kernel as K

        out, st = self.fleet.out, self.fleet.st
        since = t - self.lookback_s
        for tgt in self._targets:
            if tgt.node >= 0:
                n = int(st.node_i[tgt.node, K.NI_NSAMPLE])
                times = out.sample_t[:n, tgt.node]
                lo = int(np.searchsorted(times, since))
                tgt.times = times[lo:]
                tgt.values = out.metrics[lo:n, tgt.node][:, self._node_idx]
            else:
                n = int(st.is_[K.IS_NSAMPLE])
                lo = int(np.searchsorted(out.fleet_t[:n], since))
                tgt.times = out.fleet_t[lo:n]
                tgt.values = out.fleet[lo:n][:, self._fleet_idx]
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
