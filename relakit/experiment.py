"""Scenario → run → results: the one layer that wires the pieces together.

A run is a layout of **cells**, each one data plane (a :class:`~relakit.sim.Fleet`):
the whole fleet, the zones of ``fleet.zones`` (:mod:`relakit.zones`), a rollout's
canary and rest (:mod:`relakit.rollout`). Open loop, the cells run with the
scenario's static controls. Closed loop (a ``policy`` and/or a ``chain``), each
**domain** — the cells one control plane reads and writes, with its agents, config
server and their faults — plays RelA's four clocks: :func:`run_closed_loop` advances
every cell to each instant, gives the deciders what Prometheus would hold by then,
and applies the desired state at each config poll. The kernel and the deciders never
see each other. :func:`simulate` (``relakit.simulate``) is the one entry point.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import polars as pl

from relakit.control.tsdb import TSDB, Target
from relakit.scenario import Scenario, load_scenario, uses_rollout
from relakit.sim import Fleet, SimulationResult
from relakit.vocab import TIERS

PROGRESS_STEPS = 200  # open loop, with progress: the run is advanced in this many steps


def simulate(scenario, seed: int | None = None, record_requests: bool | None = None,
             progress=None, replications: int | None = None, workers: int | None = None,
             scheduler: str | None = None):
    """Run a scenario (a path, a dict or a :class:`Scenario`) end to end, whatever its
    layout: the whole fleet as one data plane, a zoned fleet (``fleet.zones``: a
    :class:`~relakit.zones.ZonedResult`) or a rollout and/or overrides (a
    :class:`~relakit.rollout.RolloutResult`); every layout runs through
    :func:`run_closed_loop`. This is ``relakit.simulate``.

    With ``replications`` N > 1 (the argument, else the scenario's
    ``replications:``) it runs N independent replications with the seeds
    :func:`relakit.replications.replication_seeds` spawns from ``seed`` (default:
    the scenario's), on ``workers`` local processes (default one per core) or
    the Dask ``scheduler`` (local processes start only when the work left after
    the first replication pays for them: :mod:`relakit.runner`), and returns a
    :class:`~relakit.replications.ReplicatedResult` (means and ``_ci``
    half-widths); ``progress.update(k)`` is then told replications finished.
    Replications keep no per-request records unless ``record_requests=True``.
    One replication returns the result it always did (records on unless
    ``record_requests=False``). A zoned fleet or a rollout runs one replication at
    a time (:func:`replicate_zoned`, :func:`replicate_rollout`).

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
    n = sc.replications if replications is None else replication_count(replications)
    cells = _cells_layout(sc)
    if n > 1 and cells:
        raise ValueError(f"{sc.source}: key 'replications': a {cells} runs one replication "
                         "at a time; use relakit.experiment."
                         + ("replicate_zoned" if cells == "zoned fleet" else "replicate_rollout"))
    if n > 1:
        enforce(check_run(sc, bool(record_requests)))
        return run_replications(sc, n, seed=seed, record_requests=bool(record_requests),
                                workers=workers, scheduler=scheduler, progress=progress)
    record_requests = True if record_requests is None else bool(record_requests)
    if sc.ci == "batch_means" and cells:
        raise ValueError(f"{sc.source}: key 'ci': batch_means cuts one fleet's records into "
                         f"batches; a {cells} has one per cell: drop ci or the {cells}")
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


def _cells_layout(sc: Scenario) -> str:
    """What a scenario runs as besides one fleet: 'rollout', 'zoned fleet' or ''."""
    if uses_rollout(sc):
        return "rollout"
    return "zoned fleet" if sc.fleet.zones else ""


def require_one_fleet(sc: Scenario, who: str) -> None:
    """Refuse, naming the key, a scenario that runs as several cells (zones, a rollout)
    where ``who`` reads one fleet's result (its latency quantiles, its one controller)."""
    layout = _cells_layout(sc)
    if layout:
        key = "fleet.zones" if layout == "zoned fleet" else (
            "rollout" if sc.rollout is not None else "overrides")
        raise ValueError(f"{sc.source}: key '{key}': {who} reads one fleet's result; a "
                         f"{layout} has one per cell: run it with relakit.simulate")


def replication_count(n) -> int:
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


def run_once(sc: Scenario, seed: int | None = None, record_requests: bool = False,
             progress=None):
    """One run of a loaded, checked scenario with one seed (:func:`simulate`'s body), in
    the layout its keys ask for: a :class:`SimulationResult` for one fleet, a
    :class:`~relakit.zones.ZonedResult` for ``fleet.zones``, a
    :class:`~relakit.rollout.RolloutResult` for ``rollout`` / ``overrides``."""
    wall = time.perf_counter()
    layout = _cells_layout(sc)
    if layout == "rollout":
        result = _run_rollout(sc, seed, record_requests, progress)
    elif layout:
        result = _run_zoned(sc, seed, record_requests, progress)
    else:
        sc = with_run_seed(sc, seed)
        cell = Cell("fleet", Fleet(sc, seed=seed, record_requests=record_requests))
        if not has_deciders(sc) and sc.controls.schedule:
            run_scheduled(cell.fleet, sc.controls.schedule, sc.duration_s)
            result = cell.fleet.result()
        elif not has_deciders(sc):
            run_open_loop([cell], sc.duration_s, progress)
            result = cell.fleet.result()
        else:
            domain = Domain([cell], lambda: deciders_of(sc), sc, lookback_of(sc))
            run_closed_loop([domain], sc.clocks, sc.duration_s, progress=progress)
            result = cell.fleet.result()
            timeline, result.decisions, info = domain.outcome(sc.duration_s)
            result.timeline = (timeline if result.timeline is None else
                               result.timeline.join(timeline, on="time_s", how="left"))
            result.info.update(info)
    result.info["wall_s"] = round(time.perf_counter() - wall, 4)
    return result


def has_deciders(sc: Scenario) -> bool:
    return sc.policy is not None or sc.chain is not None


def lookback_of(sc: Scenario, *policies) -> float:
    """How far back the control plane must read: its clocks' lookback for the reach of
    the scenario's policy (and of any other ``policies`` it may run, a rollout's)."""
    from relakit.control.signals import policy_reach_s

    return sc.clocks.lookback(max(policy_reach_s(p) for p in (sc.policy, *policies)))


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


# ---- the layouts: zones and rollouts as cells ------------------------------------------------
def _run_zoned(sc: Scenario, seed: int | None, record_requests: bool, progress=None):
    """A zoned fleet: one cell per zone on the zone's seed; one control plane over every
    zone (``scope: fleet``, or a chain alone) or one per zone (``scope: zone``)."""
    from relakit.zones import ZonedResult, zone_offsets, zone_scenario, zone_seed

    seed = sc.seed if seed is None else int(seed)
    offsets = zone_offsets(sc)
    parts = [zone_scenario(sc, z) for z in range(len(sc.fleet.zones))]
    cells = [Cell(f"zone {z}", Fleet(p, seed=zone_seed(seed, z), record_requests=record_requests),
                  z, int(offsets[z])) for z, p in enumerate(parts)]
    if not has_deciders(sc):
        run_open_loop(cells, sc.duration_s, progress)
        return ZonedResult("fleet", [c.fleet.result() for c in cells], None)
    if sc.policy is not None and sc.policy.scope == "zone":
        parts = [with_run_seed(p, zone_seed(seed, z)) for z, p in enumerate(parts)]
        domains = [Domain([c], lambda p=p: deciders_of(p), p, lookback_of(p))
                   for c, p in zip(cells, parts, strict=True)]
    else:
        whole = with_run_seed(sc, seed)
        domains = [Domain(cells, lambda: deciders_of(whole), whole, lookback_of(whole))]
    run_closed_loop(domains, sc.clocks, sc.duration_s, progress=progress)
    results, audits, info = [], [], {}
    for d in domains:
        timeline, decisions, part_info = d.outcome(sc.duration_s)
        zone = d.cells[0].zone if len(domains) > 1 else None
        audits.append(decisions.with_columns(pl.lit(zone, pl.Int32).alias("zone")))
        for c in d.cells:
            res = c.fleet.result()
            res.timeline, res.decisions = timeline, decisions
            if len(domains) > 1:
                res.info.update(part_info)
            results.append(res)
        if len(domains) == 1:
            info = part_info
    scope = "zone" if len(domains) > 1 else "fleet"
    decisions = pl.concat(audits).sort("decided_at_s", maintain_order=True)
    return ZonedResult(scope, results, decisions, info=info)


def _run_rollout(sc: Scenario, seed: int | None, record_requests: bool, progress=None):
    """A rollout and/or overrides: its cells (:func:`relakit.rollout.cells`), each with
    its own control plane, which :class:`relakit.rollout.Rollout` reconfigures as the
    rollout goes and whose polls it filters through the overrides."""
    from relakit.rollout import Rollout
    from relakit.rollout import cells as rollout_cells
    from relakit.zones import zone_seed

    seed = sc.seed if seed is None else int(seed)
    layout = rollout_cells(sc)
    ro = Rollout(sc)
    lookback = lookback_of(sc, *(() if sc.rollout is None else (sc.rollout.policy,)))
    one = len(layout.parts) == 1
    cells, domains = [], []
    for i, part in enumerate(layout.parts):
        cell = Cell(part.label, Fleet(part.scenario, seed=seed if one else zone_seed(seed, i),
                                      record_requests=record_requests), part.zone, part.offset)
        cells.append(cell)
        domains.append(Domain([cell], ro.deciders(i, sc.policy, "current"), sc, lookback,
                              on_poll=ro.on_poll))
    shadow = None
    if ro.tier is not None:  # a tier canary's baseline: the same seed, the current policy
        shadow = Cell("shadow (the current policy alone)",
                      Fleet(sc, seed=seed, record_requests=False))
        domains.append(Domain([shadow], ro.deciders(-1, sc.policy, "current", audit=False),
                              sc, lookback, on_poll=ro.on_poll))
    ro.attach(cells, domains, layout.canary, shadow)
    run_closed_loop(domains, sc.clocks, sc.duration_s, actor=ro, progress=progress)
    plane_rows = [d.plane.decisions().with_columns(pl.lit(i, pl.Int32).alias("zone"))
                  for i, d in enumerate(domains[:len(cells)])]
    return ro.result([c.fleet.result() for c in cells],
                     None if shadow is None else shadow.fleet.result(), plane_rows,
                     {"control_plane": [d.plane.summary() for d in domains]})


# ---- the closed loop -------------------------------------------------------------------------
@dataclass
class Cell:
    """One data plane (one kernel) of a run's layout: the whole fleet, a zone, a
    rollout's canary or rest, a tier canary's shadow. ``zone``: its zone (-1: none);
    ``offset``: the fleet-wide number of its first node, by which the control plane's
    faults and a control plane over several cells name its nodes."""

    label: str
    fleet: Fleet
    zone: int = -1
    offset: int = 0


class Domain:
    """The cells one control plane (:class:`~relakit.control.plane.ControlPlane`: its
    agents, deciders, config server and faults) reads and writes. Its deciders see one
    TSDB over its cells (their nodes numbered from the first cell's first, the client
    series summed); flags go to every cell, node controls and repairs to the cell that
    holds the node. ``on_poll(cell, t, flags, tier_flags)``, if given, applies a
    successful poll's flags instead (a rollout's overrides and tier canary)."""

    def __init__(self, cells: list[Cell], make_deciders, sc: Scenario, lookback_s: float,
                 on_poll=None):
        from relakit.control.plane import ControlPlane

        self.cells, self.on_poll = cells, on_poll
        self.plane = ControlPlane(make_deciders, sc.clocks, sc.control_plane, sc.agents,
                                  sc.data_plane, lookback_s)
        gaps = sc.control_plane.prometheus
        self.views = [FleetView(c.fleet, lookback_s, gaps, c.offset) for c in cells]
        self.starts = np.cumsum([0] + [c.fleet.scenario.fleet.nodes for c in cells])
        self.defaults = [(c.fleet.flag_state(), node_defaults(c.fleet)) for c in cells]
        self.applied: list = []  # (time, flags in force, what put them there), at each change

    def tsdb(self, t: float) -> TSDB:
        if len(self.views) == 1:
            return self.views[0].tsdb(t)
        return merged_tsdb([v.tsdb(t) for v in self.views], self.starts[:-1])

    def step(self, t: float, is_eval: bool) -> None:
        """The agents' turn at ``t``; repairs are work on the node, done at once."""
        for decision in self.plane.step(t, is_eval, self.tsdb):
            if decision.repairs:
                for c, lo, hi in self._spans():
                    mine = [n - lo for n in decision.repairs if lo <= n < hi]
                    if mine:
                        c.fleet.repair(mine)

    def poll(self, t: float) -> None:
        """The data plane reads the config server's latest state."""
        status, flags, nodes = self.plane.poll(t)
        for i, (c, lo, hi) in enumerate(self._spans()):
            if status == "ok" and self.on_poll is not None:
                self.on_poll(c, t, flags, self.plane.in_force(t, "tier_flags"))
                continue
            f, n = self.defaults[i] if status == "defaults" else (
                None if flags is None else c.fleet.flag_state().with_policy(flags),
                None if nodes is None else _node_slice(nodes, lo, hi))
            if f is not None:
                c.fleet.set_flags(f)
            if n is not None:
                apply_node_controls(c.fleet, n)
        now = self.cells[0].fleet.flags()
        last = self.applied[-1] if self.applied else None
        if last is None or last[1] != now or (status == "defaults") != (last[2] == "defaults"):
            self.applied.append((t, now, status))

    def _spans(self):
        return [(c, int(self.starts[i]), int(self.starts[i + 1]))
                for i, c in enumerate(self.cells)]

    def outcome(self, duration_s: float) -> tuple[pl.DataFrame, pl.DataFrame, dict]:
        """(timeline, audit, info) of a finished run: the deciders merged over replicas
        and restarts, the control plane's own rows, and the summaries ``info`` carries
        (``control``, ``chain``, ``control_plane``)."""
        from relakit.control.controller import Controller

        deciders = self.plane.merged_deciders()
        timeline, info = None, {}
        for d in deciders:
            line = d.timeline()
            timeline = line if timeline is None else timeline.join(line, on="time_s", how="left")
            if isinstance(d, Controller) or getattr(d, "kind", None) == "policy":
                info["control"] = control_summary(d.decisions(), line, d, duration_s)
            else:
                info["chain"] = chain_summary(d, np.concatenate(
                    [c.fleet.faulty() for c in self.cells]))
        decisions = pl.concat([d.decisions() for d in deciders] + [
            self.plane.decisions()]).sort("decided_at_s", maintain_order=True)
        info["control_plane"] = {**self.plane.summary(), "flags_applied": [
            {"time_s": t, "source": src, **f} for t, f, src in self.applied]}
        return timeline, decisions, info


def run_scheduled(fleet: Fleet, schedule, duration_s: float) -> None:
    """One fleet with ``controls.schedule``'s flags (or a recording's, for
    ``relakit.calibration.flags.run_twin``) set at their times: no control plane."""
    for t, flags in schedule:
        if t >= duration_s:
            break
        fleet.advance(max(float(t), fleet.now))
        fleet.set_flags(fleet.flag_state().updated(**dict(flags)))
    fleet.advance(duration_s)


def run_open_loop(cells: list[Cell], duration_s: float, progress=None) -> None:
    """Every cell with its static controls to the end (in steps when ``progress`` is
    told the time reached)."""
    steps = [duration_s] if progress is None else np.linspace(
        0.0, duration_s, PROGRESS_STEPS + 1)[1:]
    for t in steps:
        for c in cells:
            c.fleet.advance(float(t))
        if progress is not None:
            progress.update(float(t))


def run_closed_loop(domains: list[Domain], clocks, duration_s: float, actor=None,
                    progress=None) -> None:
    """Every cell of every domain in lock-step; evaluate at every eval instant, apply
    what is in force at every config poll.

    Every decider decides from what was scraped by then; a decision is in force
    from ``Clocks.effective_at`` on, so at an instant that is both an evaluation
    and a poll, the evaluation comes first and a decision with no propagation
    delay takes effect at once. The agents, the config server and the polls are
    each domain's :class:`~relakit.control.plane.ControlPlane`'s (faults, replicas,
    leases); without those keys it is one agent whose every write is accepted.
    ``actor`` (a rollout) acts at its own instants (``actor.times(end_s)``), after
    the cells have advanced and before anyone evaluates.
    """
    clk = clocks
    evals = clk.eval_times(0.0, duration_s)
    polls = clk.poll_times(0.0, duration_s)
    renews = domains[0].plane.agent_times(0.0, duration_s)  # one spec for every domain
    acts = np.zeros(0) if actor is None else actor.times(duration_s)
    instants = np.union1d(np.union1d(np.union1d(evals, polls), renews), acts)
    eval_set, poll_set = set(evals.tolist()), set(polls.tolist())
    agent_set, act_set = eval_set | set(renews.tolist()), set(acts.tolist())
    cells = [c for d in domains for c in d.cells]
    for t in instants.tolist():
        for c in cells:
            c.fleet.advance(t)
        if t in act_set:
            actor.act(t)
        if t in agent_set:
            for d in domains:
                d.step(t, t in eval_set)
        if t in poll_set:
            for d in domains:
                d.poll(t)
        if progress is not None:
            progress.update(t)
    for c in cells:
        c.fleet.advance(duration_s)


def node_defaults(fleet: Fleet) -> dict:
    """The node controls a fleet starts with, in the shape a chain's decision has."""
    have = fleet.node_controls()
    return {"routable": have["routable"].tolist(), "weight": have["weight"].tolist(),
            "intake_limit": [None if x < 0 else int(x) for x in have["intake_limit"]],
            "breaker": fleet.flags()["breaker"]}


def _node_slice(nodes: dict, lo: int, hi: int) -> dict:
    """A chain's node controls (over a domain's nodes) for the cell holding lo..hi-1."""
    return {k: (v if k == "breaker" else v[lo:hi]) for k, v in nodes.items()}


def apply_node_controls(fleet: Fleet, want: dict) -> None:
    """Set the node controls (and breaker) a chain's decision wants where they differ."""
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
        fleet.set_flags(fleet.flag_state().updated(breaker=want["breaker"]))


def chain_summary(chain, faulty: np.ndarray) -> dict:
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
            "faulty_at_end": np.flatnonzero(faulty).tolist()}


class FleetView:
    """What Prometheus would hold of a running fleet: its samples (``Fleet.samples``) as
    a TSDB of the last ``lookback_s``.

    The targets are made once and refreshed in place (so their column lookups are
    remembered), and only the last ``lookback_s`` of samples is handed out: an
    evaluation costs the same an hour into a run as at its start. ``offset``: the
    fleet-wide number of the fleet's first node (a zone's, a rollout cell's), by which
    the scrape ``gaps`` name their targets.
    """

    def __init__(self, fleet: Fleet, lookback_s: float, gaps=(), offset: int = 0):
        self.fleet = fleet
        self.lookback_s = lookback_s
        self.offset = offset
        self.gaps = tuple(gaps)  # control_plane.prometheus: scrapes lost
        node_series, fleet_series = fleet.sample_series()
        empty = np.zeros(0)
        self._targets = [Target(i, empty, empty, node_series)
                         for i in range(fleet.scenario.fleet.nodes)]
        self._targets.append(Target(-1, empty, empty, fleet_series))

    def tsdb(self, t: float) -> TSDB:
        prev = None
        for tgt, (_, times, values) in zip(self._targets, self.fleet.samples(t - self.lookback_s),
                                           strict=True):
            lost = self._lost(tgt.node, times)
            if lost is not None:
                times, values = times[~lost], values[~lost]
            if prev is not None and prev.size == times.size and np.array_equal(prev, times):
                times = prev  # scraped together: one array (a signal reads them as one block)
            tgt.times, tgt.values, prev = times, values, times
        return TSDB(self._targets)

    def _lost(self, node: int, times: np.ndarray):
        """Which of a target's samples a scrape gap lost (None: none): Prometheus holds
        nothing for a scrape that did not happen."""
        lost = None
        for g in self.gaps:
            if g.targets is None or (node >= 0 and g.hits(self.offset + node)):
                m = (times >= g.start_s) & (times < g.end_s)
                lost = m if lost is None else lost | m
        return lost if lost is not None and lost.any() else None


def merged_tsdb(tsdbs: list[TSDB], starts) -> TSDB:
    """One TSDB over several cells: node targets renumbered from each cell's first node
    (``starts``); the client-side (fleet, node -1) targets summed sample by sample over
    their common times (counters add up; a flag gauge then counts the cells with the
    flag on)."""
    targets, client = [], []
    for start, tsdb in zip(starts, tsdbs, strict=True):
        for tgt in tsdb.targets:
            if tgt.node >= 0:
                targets.append(Target(int(start) + tgt.node, tgt.times, tgt.values,
                                      tgt.columns))
            else:
                client.append(tgt)
    k = min(c.times.size for c in client)
    values = sum(c.values[c.values.shape[0] - k:] for c in client)
    targets.append(Target(-1, client[0].times[client[0].times.size - k:], values,
                          client[0].columns))
    return TSDB(targets)


def control_summary(decisions: pl.DataFrame, timeline: pl.DataFrame, controller,
                    duration_s: float) -> dict:
    """Time in each mode, and for each mode change its detection and actuation delays.

    Detection delay: from the first evaluation of the breaching run that led to
    the change, to the decision (the hysteresis' share); actuation delay: from
    the decision to the config poll that applied it.
    """
    from relakit.control.controller import time_in_mode

    changes = []
    from relakit.control.audit import NO_CHANGE

    for r in decisions.filter(~pl.col("action").is_in(NO_CHANGE)).iter_rows(named=True):
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
def replicate_zoned(sc: Scenario, n: int, seed: int | None = None, inside=(0,),
                    keep: list | None = None) -> pl.DataFrame:
    """``n`` runs of a zoned scenario on :func:`relakit.replications.replication_seeds`:
    one row per replication with :meth:`~relakit.zones.ZonedResult.blast_radius`'s
    numbers. Two scopes run on the same seeds are paired (common random numbers).
    ``keep``, a list, receives each run's ZonedResult in replication order (for figures
    drawn over the same runs, instead of running them again)."""
    from relakit.replications import replication_seeds

    base = sc.seed if seed is None else int(seed)
    rows = []
    for i, s in enumerate(replication_seeds(base, n)):
        result = run_once(sc, int(s))
        rows.append({"replication": i, "seed": int(s), **result.blast_radius(inside)})
        if keep is not None:
            keep.append(result)
    return pl.DataFrame(rows)


def replicate_rollout(sc: Scenario, n: int, seed: int | None = None,
                      metric: str = "success_ratio", tier: str = "all") -> pl.DataFrame:
    """``n`` runs of a rollout on :func:`relakit.replications.replication_seeds`: per
    replication the rollout's outcome (action, at_s, observation) and, at the
    observation that decided (the last one if none did), ``metric`` of ``tier``:
    canary, rest, and the paired difference with its interval over the window's slots.
    Two scenarios run on the same seeds are paired (common random numbers)."""
    from relakit.replications import replication_seeds

    base = sc.seed if seed is None else int(seed)
    rows = []
    for i, s in enumerate(replication_seeds(base, n)):
        res = run_once(sc, int(s))
        o = res.observation(metric, tier)
        k = res.outcome["observation"] or int(o["observation"].max())
        at = o.filter(pl.col("observation") == k).row(0, named=True)
        rows.append({"replication": i, "seed": int(s), **res.outcome,
                     **{c: at[c] for c in ("canary", "rest", "diff", "low", "high")}})
    return pl.DataFrame(rows, schema={"replication": pl.Int64, "seed": pl.UInt64,
                                      "action": pl.String, "at_s": pl.Float64,
                                      "observation": pl.Int64, "canary": pl.Float64,
                                      "rest": pl.Float64, "diff": pl.Float64,
                                      "low": pl.Float64, "high": pl.Float64})



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
    for sc, _base, _seeds in plans:
        require_one_fleet(sc, "a replicated run")
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
            "series": tagged(result.fleet_series()), "timeline": tagged(result.timeline),
            "decisions": tagged(result.decisions), "requests": tagged(result.requests)}


def window_outcomes(result: SimulationResult, start_s: float, end_s: float) -> dict:
    """Requests arriving in [start_s, end_s): each tier's share answered ok, and the
    share dropped (shed or throttled) over all tiers — the numbers a control-plane
    outage is judged by. Needs per-request records."""
    if result.requests is None:
        raise ValueError("window_outcomes needs per-request records (record_requests=True)")
    w = result.requests.filter(pl.col("arrival_s").is_between(start_s, end_s, closed="left"))
    out = {f"{tier}_ok": float((w.filter(pl.col("tier") == tier)["outcome"] == "ok").mean())
           for tier in TIERS}
    out["dropped_share"] = float((w["outcome"] == "dropped").mean())
    out["requests"] = w.height
    return out
