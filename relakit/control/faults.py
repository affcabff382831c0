"""The control plane's own failures, and its topology: what a scenario says about them.

Three scenario keys, read here once with one-line errors (file, dotted key, what is
allowed), all optional and all needing a control loop (a policy or a chain):

* ``control_plane:`` faults of the control plane itself, each a mapping or a list
  of mappings with ``start_s`` < ``end_s`` <= the run's duration:

  - ``agent: {start_s, end_s, restart: warm|cold, replica: 0}`` — the agent is down:
    no evaluation, no write, no lease renewal. ``warm``: it was frozen (SIGSTOP, a
    long pause) and resumes where it stopped: it first sends the write of the
    evaluation it made before freezing, with the lease epoch it held, then goes on
    with its hysteresis state intact. ``cold``: it restarts from scratch (fresh
    hysteresis state, nothing held, a follower until it acquires the lease);
  - ``config_server: {start_s, end_s}`` — unreachable: the agents' writes and lease
    calls fail, and so do the data plane's polls;
  - ``prometheus: {start_s, end_s, targets: [node, ...]}`` — scrapes in the
    interval are lost, for the listed nodes or (no ``targets``) for every target,
    the fleet-wide client series included.

* ``data_plane: {on_stale: keep|defaults, stale_after_s}`` — what an instance does
  when its polls fail: ``keep`` the last flags it read (fail-static) or, once
  ``stale_after_s`` have passed without a successful poll, go back to its
  defaults, the scenario's ``controls`` (fail-safe). ``stale_after_s`` must be at
  least one poll interval: a shorter limit would call a healthy config server stale
  between two of its own polls.

* ``agents: {replicas, lease_s, renew_s}`` — that many agents elect a leader through
  a lease held on the config server; only the leader evaluates and writes, and its
  writes carry the lease epoch, so a deposed leader's write is refused.
"""

from __future__ import annotations

from dataclasses import dataclass

from relakit.validate import Reader

RESTARTS = ("warm", "cold")
ON_STALE = ("keep", "defaults")
KEYS = ("control_plane", "data_plane", "agents")


@dataclass(frozen=True)
class AgentDown:
    start_s: float
    end_s: float
    restart: str = "warm"
    replica: int = 0

    def describe(self) -> str:
        return f"down {self.start_s:g}–{self.end_s:g} s, restart {self.restart}"


@dataclass(frozen=True)
class ServerDown:
    start_s: float
    end_s: float

    def covers(self, t: float) -> bool:
        return self.start_s <= t < self.end_s


@dataclass(frozen=True)
class ScrapeGap:
    start_s: float
    end_s: float
    targets: tuple[int, ...] | None = None  # None: every target, the client's too

    def hits(self, node: int) -> bool:
        return self.targets is None or node in self.targets

    def describe(self) -> str:
        who = "all targets" if self.targets is None else "nodes " + ", ".join(
            map(str, self.targets))
        return f"scrape gap {self.start_s:g}–{self.end_s:g} s on {who}"


@dataclass(frozen=True)
class ControlPlaneFaults:
    agent: tuple[AgentDown, ...] = ()
    config_server: tuple[ServerDown, ...] = ()
    prometheus: tuple[ScrapeGap, ...] = ()

    def server_down(self, t: float) -> ServerDown | None:
        for s in self.config_server:
            if s.covers(t):
                return s
        return None


@dataclass(frozen=True)
class DataPlaneStale:
    on_stale: str = "keep"
    stale_after_s: float | None = None  # only with on_stale: defaults


@dataclass(frozen=True)
class Agents:
    replicas: int = 1
    lease_s: float | None = None  # None: one agent, leader by configuration, no lease
    renew_s: float | None = None

    @property
    def leased(self) -> bool:
        return self.lease_s is not None


def read_control_plane(r: Reader, duration_s: float, clocks, nodes: int) -> dict:
    """``control_plane``, ``data_plane`` and ``agents`` of a scenario, as keyword arguments
    of :class:`~relakit.scenario.Scenario`. ``clocks`` is None without a control loop."""
    given = [k for k in KEYS if r.data.get(k) is not None]
    if given and clocks is None:
        r.fail("faults and replicas of the control plane need a control loop; give a "
               "policy or a chain too", given[0])
    faults = _faults(r.sub("control_plane"), duration_s, nodes)
    agents = _agents(r.sub("agents"), clocks, duration_s)
    listed = isinstance(r.data.get("control_plane", {}).get("agent"), list)
    for i, a in enumerate(faults.agent):
        if a.replica >= agents.replicas:
            r.sub("control_plane").fail(
                f"replica {a.replica} does not exist: agents.replicas is {agents.replicas} "
                f"(replicas are 0..{agents.replicas - 1})",
                f"agent[{i}].replica" if listed else "agent.replica")
    return {"control_plane": faults, "data_plane": _data_plane(r.sub("data_plane"), clocks),
            "agents": agents}


def _intervals(r: Reader, key: str, duration_s: float, extra: tuple, read) -> tuple:
    spec = r.data.get(key)
    if spec is None:
        return ()
    items = spec if isinstance(spec, list) else [spec]
    out = []
    for i, item in enumerate(items):
        sub = Reader(item, r.source, f"{r.path}.{key}" + (f"[{i}]" if isinstance(spec, list)
                                                           else ""))
        sub.only(("start_s", "end_s") + extra)
        start = sub.number("start_s", lo=0)
        end = sub.number("end_s", lo=0)
        if end <= start:
            sub.fail(f"{end:g} must be after start_s ({start:g}): an interval "
                     "[start_s, end_s) with end_s > start_s", "end_s")
        if end > duration_s:
            sub.fail(f"{end:g} is past the run's end (duration_s {duration_s:g}); an "
                     "interval must end within the run", "end_s")
        out.append(read(sub, start, end))
    return tuple(out)


def _faults(r: Reader, duration_s: float, nodes: int) -> ControlPlaneFaults:
    r.only(("agent", "config_server", "prometheus"))

    def agent(sub, start, end):
        return AgentDown(start, end, sub.choice("restart", RESTARTS, "warm"),
                         sub.number("replica", 0, lo=0, integer=True))

    def gap(sub, start, end):
        targets = sub.data.get("targets")
        if targets is None:
            return ScrapeGap(start, end)
        if (not isinstance(targets, list) or not targets or any(
                isinstance(x, bool) or not isinstance(x, int) or not 0 <= x < nodes
                for x in targets)):
            sub.fail(f"expected a non-empty list of node indices 0..{nodes - 1}, got "
                     f"{targets!r} (leave targets out for every target)", "targets")
        return ScrapeGap(start, end, tuple(sorted(set(targets))))

    return ControlPlaneFaults(
        agent=_intervals(r, "agent", duration_s, ("restart", "replica"), agent),
        config_server=_intervals(r, "config_server", duration_s, (),
                                 lambda sub, s, e: ServerDown(s, e)),
        prometheus=_intervals(r, "prometheus", duration_s, ("targets",), gap))


def _data_plane(r: Reader, clocks) -> DataPlaneStale:
    r.only(("on_stale", "stale_after_s"))
    on_stale = r.choice("on_stale", ON_STALE, "keep")
    if on_stale == "keep":
        if "stale_after_s" in r.data:
            r.fail("only with on_stale: defaults (keep never goes stale)", "stale_after_s")
        return DataPlaneStale("keep")
    stale = r.number("stale_after_s", lo=0, lo_open=True)
    if clocks is not None and stale < clocks.poll_s:
        r.fail(f"{stale:g} is shorter than the poll interval (clocks.poll_s {clocks.poll_s:g})"
               f": a healthy config server would be stale between two polls; allowed: "
               f">= {clocks.poll_s:g}", "stale_after_s")
    return DataPlaneStale("defaults", stale)


#: agent steps (replicas x lease renewals) a run may take: each is a Python step between
#: kernel calls, ~0.2 ms here (a 20 s run with 2 agents renewing every 1 ms: 4e4 steps,
#: +8.5 s), so 1e6 is minutes of agents and no longer a simulation of a fleet
MAX_AGENT_STEPS = 1e6


def _agents(r: Reader, clocks, duration_s: float) -> Agents:
    r.only(("replicas", "lease_s", "renew_s"))
    if not r.data:
        return Agents()
    replicas = r.number("replicas", 1, lo=1, integer=True)
    lease = r.number("lease_s", lo=0, lo_open=True)
    renew = r.number("renew_s", lo=0, lo_open=True)
    if lease <= renew:
        r.fail(f"{lease:g} must be longer than renew_s ({renew:g}): a leader renews its "
               "lease before it expires", "lease_s")
    steps = replicas * duration_s / renew
    if steps > MAX_AGENT_STEPS:
        key = "replicas" if replicas > duration_s / renew else "renew_s"
        r.fail(f"{replicas} agent(s) renewing every {renew:g} s over {duration_s:g} s take "
               f"{steps:.3g} agent steps (about {steps * 2e-4 / 60:.3g} min of Python), "
               f"above {MAX_AGENT_STEPS:g}; renew less often than every "
               f"{replicas * duration_s / MAX_AGENT_STEPS:.3g} s or run fewer replicas", key)
    return Agents(replicas, lease, renew)
