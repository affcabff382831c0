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

from relakit.control.tsdb import TSDB, Target
from relakit.scenario import Scenario, load_scenario
from relakit.sim import Fleet, SimulationResult

PROGRESS_STEPS = 200  # open loop, with progress: the run is advanced in this many steps


def simulate(scenario, seed: int | None = None, record_requests: bool | None = None,
             progress=None, replications: int | None = None, workers: int | None = None,
             scheduler: str | None = None):
    """Run a scenario (a path, a dict or a :class:`Scenario`) end to end.

    With ``replications`` N > 1 (the argument, else the scenario's
    ``replications:``) it runs N independent replications with the seeds
    :func:`relakit.replications.replication_seeds` spawns from ``seed`` (default:
    the scenario's), on ``workers`` local processes (default one per core) or
    the Dask ``scheduler`` (local processes start only when the work left after
    the first replication pays for them: :mod:`relakit.runner`), and returns a
    :class:`~relakit.replications.ReplicatedResult` (means and ``_ci``
    half-widths); ``progress.update(k)`` is then told replications finished.
    Replications keep no per-request records unless ``record_requests=True``.
    One replication returns the :class:`SimulationResult` it always did (records
    on unless ``record_requests=False``).

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
    n = sc.replications if replications is None else _replications(replications)
    if sc.fleet.zones:  # one data plane per zone: relakit.zones runs it (relakit.simulate)
        raise ValueError(f"{sc.source}: key 'fleet.zones': a zoned fleet runs through "
                         "relakit.simulate (relakit.rollout.simulate)")
    if sc.rollout is not None or sc.overrides:  # cells in lock-step: relakit.rollout
        raise ValueError(f"{sc.source}: key 'rollout': a rollout or overrides run through "
                         "relakit.simulate (relakit.rollout.run_rollout)")
    if n > 1:
        enforce(check_run(sc, bool(record_requests)))
        return run_replications(sc, n, seed=seed, record_requests=bool(record_requests),
                                workers=workers, scheduler=scheduler, progress=progress)
    record_requests = True if record_requests is None else bool(record_requests)
    if sc.ci == "batch_means" and not record_requests:
        raise ValueError(f"{sc.source}: key 'ci': batch_means cuts the run's per-request "
                         "records into batches; keep them (drop --no-requests / "
                         "record_requests=False), or use replications")
    enforce(check_run(sc, record_requests))
    result = run_once(sc, seed, record_requests, progress)
    if sc.ci == "batch_means":
        from relakit.replications import batch_means_summary

        result.summary, result.info["batch_means"] = batch_means_summary(
            result.summary, result.requests, sc.warmup_s, sc.duration_s, sc.batches,
            sc.warmup_auto)
    return result


def _replications(n) -> int:
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 1:
        raise ValueError(f"replications: expected a whole number >= 1, got {n!r}")
    return int(n)


def with_run_seed(sc: Scenario, seed: int | None) -> Scenario:
    """The scenario with its chain's own seeds (Punisher's repair outcomes) derived from
    the run's seed, so replications differ in them too. The scenario's own seed (or
    none) leaves the chain as written: a single run is the run it always was."""
    if seed is None or int(seed) == sc.seed or sc.chain is None:
        return sc
    import dataclasses

    def derived(own: int) -> int:
        mixed = np.random.SeedSequence([int(own), int(seed)]).generate_state(1, np.uint64)[0]
        return int(mixed >> np.uint64(1))

    stages = tuple(dataclasses.replace(s, seed=derived(s.seed)) if hasattr(s, "seed") else s
                   for s in sc.chain.stages)
    return dataclasses.replace(sc, chain=dataclasses.replace(sc.chain, stages=stages))


def run_once(sc: Scenario, seed: int | None, record_requests: bool,
             progress=None) -> SimulationResult:
    """One run of a loaded, checked scenario with one seed (:func:`simulate`'s body)."""
    sc = with_run_seed(sc, seed)
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
    else:  # the control plane's modules: imported only by a run that has one
        from relakit.control.controller import Controller

        deciders = run_closed_loop(fleet, sc, progress)
        result = fleet.result()
        for d in deciders:
            line = d.timeline()
            result.timeline = (line if result.timeline is None else
                               result.timeline.join(line, on="time_s", how="left"))
            if isinstance(d, Controller) or getattr(d, "kind", None) == "policy":
                result.info["control"] = control_summary(d.decisions(), line, d,
                                                         sc.duration_s)
            else:
                result.info["chain"] = chain_summary(d, fleet)
        plane = fleet.control_plane
        result.decisions = pl.concat([d.decisions() for d in deciders] + [
            plane.decisions()]).sort("decided_at_s", maintain_order=True)
        result.info["control_plane"] = {**plane.summary(), "flags_applied": [
            {"time_s": t, "source": src, **f} for t, f, src in fleet.flags_applied]}
    result.info["wall_s"] = round(time.perf_counter() - wall, 4)
    return result


def deciders_of(sc: Scenario) -> list:
    """The scenario's deciders, in the order their wishes are applied: the policy's
    flags first, then the chain's per-node controls (which may set the breaker)."""
    from relakit.chain import load_chain
    from relakit.control.controller import Controller

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
    they take effect when done. The agents, the config server and the polls are
    :class:`~relakit.control.plane.ControlPlane`'s (faults, replicas, leases);
    without those keys it is one agent whose every write is accepted, as before.
    Returns the deciders (merged over replicas and restarts), with their audits;
    the control plane itself is left on ``fleet.control_plane``.
    """
    from relakit.control.plane import ControlPlane
    from relakit.control.signals import policy_reach_s

    clk = sc.clocks
    lookback = clk.lookback(policy_reach_s(sc.policy))
    plane = ControlPlane(lambda: deciders_of(sc), clk, sc.control_plane, sc.agents,
                         sc.data_plane, lookback)
    evals = clk.eval_times(0.0, sc.duration_s)
    polls = clk.poll_times(0.0, sc.duration_s)
    renews = plane.agent_times(0.0, sc.duration_s)
    instants = np.union1d(np.union1d(evals, polls), renews)
    eval_set, poll_set = set(evals.tolist()), set(polls.tolist())
    agent_set = eval_set | set(renews.tolist())
    view = FleetView(fleet, lookback_s=lookback, gaps=sc.control_plane.prometheus)
    defaults = (fleet.flags(), _node_defaults(fleet))
    applied = []  # (time, flags in force, what put them there), at each change
    for t in instants:
        fleet.advance(float(t))
        if t in agent_set:
            for decision in plane.step(float(t), t in eval_set, view.tsdb):
                if decision.repairs:
                    fleet.repair(list(decision.repairs))
        if t in poll_set:  # the data plane reads the config server's latest state
            status, flags, nodes = plane.poll(float(t))
            if status == "defaults":
                flags, nodes = defaults
            if flags is not None:
                fleet.set_flags(**flags)
            if nodes is not None:
                _apply_node_controls(fleet, nodes)
            now = fleet.flags()
            if not applied or applied[-1][1] != now or (status == "defaults") != (
                    applied[-1][2] == "defaults"):
                applied.append((float(t), now, status))
        if progress is not None:
            progress.update(float(t))
    fleet.advance(sc.duration_s)
    fleet.control_plane = plane
    fleet.flags_applied = applied
    return plane.merged_deciders()


def _node_defaults(fleet: Fleet) -> dict:
    """The node controls a fleet starts with, in the shape a chain's decision has."""
    have = fleet.node_controls()
    return {"routable": have["routable"].tolist(), "weight": have["weight"].tolist(),
            "intake_limit": [None if x < 0 else int(x) for x in have["intake_limit"]],
            "breaker": fleet.flags()["breaker"]}


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

    def __init__(self, fleet: Fleet, lookback_s: float, gaps=()):
        self.fleet = fleet
        self.lookback_s = lookback_s
        self.gaps = tuple(gaps)  # control_plane.prometheus: scrapes lost
        node_series, fleet_series = fleet.sample_series()
        empty = np.zeros(0)
        self._targets = [Target(i, empty, empty, node_series)
                         for i in range(fleet.scenario.fleet.nodes)]
        self._targets.append(Target(-1, empty, empty, fleet_series))

    def tsdb(self, t: float) -> TSDB:
        for tgt, (_, times, values) in zip(self._targets, self.fleet.samples(t - self.lookback_s),
                                           strict=True):
            lost = self._lost(tgt.node, times)
            if lost is not None:
                times, values = times[~lost], values[~lost]
            tgt.times, tgt.values = times, values
        return TSDB(self._targets)

    def _lost(self, node: int, times: np.ndarray):
        """Which of a target's samples a scrape gap lost (None: none): Prometheus holds
        nothing for a scrape that did not happen."""
        lost = None
        for g in self.gaps:
            if g.hits(node) or (g.targets is None and node < 0):
                m = (times >= g.start_s) & (times < g.end_s)
                lost = m if lost is None else lost | m
        return lost if lost is not None and lost.any() else None


def control_summary(decisions: pl.DataFrame, timeline: pl.DataFrame, controller,
                    duration_s: float) -> dict:
    """Time in each mode, and for each mode change its detection and actuation delays.

    Detection delay: from the first evaluation of the breaching run that led to
    the change, to the decision (the hysteresis' share); actuation delay: from
    the decision to the config poll that applied it.
    """
    from relakit.control.controller import time_in_mode

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


# ---- replications ------------------------------------------------------------------------------
def run_replications(sc: Scenario, n: int, seed: int | None = None,
                     record_requests: bool = False, workers: int | None = None,
                     scheduler: str | None = None, progress=None,
                     processes: bool | None = None):
    """``n`` replications of a loaded, checked scenario on the shared runner
    (:func:`relakit.runner.run_tasks`), folded into a
    :class:`~relakit.replications.ReplicatedResult`. Replication ``i`` is exactly
    ``simulate(sc, seed=seeds[i])``: its seed alone decides it."""
    from relakit.replications import replication_seeds

    base = sc.seed if seed is None else int(seed)
    return run_replicated([(sc, base, replication_seeds(base, n))], record_requests,
                          workers, scheduler, progress, processes)[0]


def run_replicated(plans: list[tuple[Scenario, int, list[int]]], record_requests: bool = False,
                   workers: int | None = None, scheduler: str | None = None,
                   progress=None, processes: bool | None = None) -> list:
    """Several scenarios' replications as one batch of tasks (so ``compare`` keeps every
    worker busy across A and B): each plan is (scenario, base seed, seeds); returns one
    :class:`~relakit.replications.ReplicatedResult` per plan. ``progress.update(k)`` is
    told how many replications have finished. Local processes start only when the
    work pays for them (``adaptive``, :mod:`relakit.runner`); ``processes=True``
    forces them (tests and benchmarks of the pool)."""
    from relakit.replications import ReplicatedResult
    from relakit.runner import run_tasks

    tasks, keys, owner = [], [], []
    for p, (sc, _base, seeds) in enumerate(plans):
        for i, s in enumerate(seeds):
            tasks.append((replicate, (sc, i, s, record_requests)))
            keys.append(f"replication-{p}-{i}-{s}")
            owner.append(p)
    wall = time.perf_counter()
    finished = 0

    def tick(_i, _part):
        nonlocal finished
        finished += 1
        if progress is not None:
            progress.update(float(finished))

    parts = run_tasks(tasks, workers=workers, scheduler=scheduler, on_done=tick, keys=keys,
                      processes=processes, adaptive=True)
    wall = time.perf_counter() - wall
    return [ReplicatedResult.from_parts([x for x, o in zip(parts, owner, strict=True) if o == p],
                                        sc, base, seeds, wall_s=wall, workers=workers,
                                        scheduler=scheduler)
            for p, (sc, base, seeds) in enumerate(plans)]


def replicate(sc: Scenario, index: int, seed: int, record_requests: bool = False) -> dict:
    """One replication, as a worker returns it: its summary rows and the small tables a
    figure needs (each with ``replication``), never the long metrics table."""
    import os
    import warnings

    from relakit.checks import RelakitWarning

    os.environ.setdefault("NUMBA_NUM_THREADS", "1")
    with warnings.catch_warnings():  # reported once, before the replications started
        warnings.simplefilter("ignore", RelakitWarning)
        result = run_once(sc, seed, record_requests)
    tag = [pl.lit(index, pl.Int32).alias("replication"), pl.lit(seed, pl.UInt64).alias("seed")]

    def tagged(table):
        return None if table is None else table.select(tag + table.columns)

    info = {k: v for k, v in result.info.items() if k != "versions"}
    return {"replication": index, "seed": seed, "summary": tagged(result.summary),
            "info": info, "versions": result.info.get("versions"),
            "series": tagged(fleet_series(result)), "timeline": tagged(result.timeline),
            "decisions": tagged(result.decisions), "requests": tagged(result.requests)}


def fleet_series(result: SimulationResult) -> pl.DataFrame:
    """What clients saw, per metrics sample, all tiers together: ``time_s`` (the
    sample's end), ``requests_rps`` and one ``<outcome>_rps`` per outcome over the
    interval before it, and ``success_ratio`` (null in an interval with no
    requests). Built from the fleet's ``client_requests_total`` counters: a few
    columns per sample, whatever the fleet's size, so N replications stay small."""
    from relakit.sim.longtable import MetricsGrid, fleet_columns
    from relakit.vocab import OUTCOMES

    grid = result._metrics
    if isinstance(grid, MetricsGrid):
        t = np.asarray(grid.fleet_t, dtype=float)
        counts = {o: np.zeros(t.size) for o in OUTCOMES}
        for col, name, _tier, outcome, _le in fleet_columns():
            if name == "client_requests_total":
                counts[outcome] = counts[outcome] + grid.fleet[:, col]
    else:  # a long table (read back from disk)
        wide = (result.metrics.filter(pl.col("name") == "client_requests_total")
                .group_by("time_s", "outcome").agg(pl.col("value").sum())
                .pivot(on="outcome", index="time_s", values="value").sort("time_s"))
        t = wide["time_s"].to_numpy()
        counts = {o: (wide[o].fill_null(0).to_numpy() if o in wide.columns
                      else np.zeros(t.size)) for o in OUTCOMES}
    dt = np.diff(np.concatenate([[0.0], t]))
    keep = dt > 0  # a sample at t = 0 closes no interval
    t, dt = t[keep], dt[keep]
    cols = {"time_s": t}
    total = np.zeros(t.size)
    for o in OUTCOMES:
        inc = np.diff(np.concatenate([[0.0], counts[o]]))[keep]
        cols[f"{o}_rps"] = inc / dt
        total += inc
    cols["requests_rps"] = total / dt
    ok_inc = cols["ok_rps"] * dt
    cols["success_ratio"] = np.where(total > 0, ok_inc / np.where(total > 0, total, 1), np.nan)
    out = pl.DataFrame(cols).select("time_s", "requests_rps", *[f"{o}_rps" for o in OUTCOMES],
                                    "success_ratio")
    return out.with_columns(pl.col("success_ratio").fill_nan(None))


def window_outcomes(result: SimulationResult, start_s: float, end_s: float) -> dict:
    """Requests arriving in [start_s, end_s): each tier's share answered ok, and the
    share dropped (shed or throttled) over all tiers — the numbers a control-plane
    outage is judged by. Needs per-request records."""
    if result.requests is None:
        raise ValueError("window_outcomes needs per-request records (record_requests=True)")
    w = result.requests.filter(pl.col("arrival_s").is_between(start_s, end_s, closed="left"))
    out = {f"{tier}_ok": float((w.filter(pl.col("tier") == tier)["outcome"] == "ok").mean())
           for tier in ("gold", "silver", "bronze")}
    out["dropped_share"] = float((w["outcome"] == "dropped").mean())
    out["requests"] = w.height
    return out
