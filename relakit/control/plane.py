"""The modelled control plane: agents (one or replicas with a lease), the config server
and the data plane's polls, with the faults of :mod:`relakit.control.faults`.

The closed loop (:mod:`relakit.experiment`) owns the fleet and the clocks; at each
instant it asks this model what happens: which agents evaluate (and with what
TSDB), which writes the config server accepts, and what an instance reads at its
poll. The model never touches the fleet, so it can be tested alone.

Rules, each written once here:

* **Lease and epoch.** With ``agents.lease_s`` the config server holds one lease
  (holder, epoch, expiry). An agent acquires it when it is free or expired (the
  epoch goes up by one), renews it every ``renew_s`` (epoch unchanged) and stops
  leading by itself once ``lease_s`` have passed since its last successful
  renewal. Followers look at the lease at every evaluation and renewal tick and,
  when they acquire it at an evaluation tick, evaluate at once: a dead leader is
  replaced within ``lease_s`` + one evaluation interval. Followers are cold
  standbys: they do not evaluate, so a new leader starts with fresh hysteresis.
* **Fenced writes.** A write carries its writer's epoch; the config server refuses
  one whose epoch is not the lease's current epoch (HTTP 409 live). Without
  ``agents`` there is one agent, leader by configuration, and no lease.
* **A frozen agent** (``restart: warm``) resumes between its last decision and its
  write: it first sends its last evaluation's state with the epoch it held — the
  write a lease alone cannot stop, and the fencing epoch does.
* **A new configuration** (a rollout starting, promoted or rolled back:
  :meth:`ControlPlane.install`) reaches every replica: each gets the new deciders
  (a new generation, like a cold restart's), and a later cold restart builds the
  new configuration, not the first.
* **Polls.** An instance reads, at each poll, the newest accepted state in force
  (``Clocks.effective_at``). A failed poll keeps the flags (``on_stale: keep``) or,
  once ``stale_after_s`` have passed since the last successful poll, puts the
  data plane's defaults back (``on_stale: defaults``).

Every action a fault causes is an audit row (stage ``control_plane``): skipped
evaluations, failed and refused writes, lease changes, stale polls, absent signals.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import polars as pl

from relakit.control.audit import DECISION_COLUMNS, empty_decisions
from relakit.control.decider import latest_in_force
from relakit.control.faults import Agents, ControlPlaneFaults, DataPlaneStale

EPS = 1e-9


class ConfigServer:
    """The config server as the agents see it: reachable or not, a lease, fenced writes."""

    def __init__(self, faults: ControlPlaneFaults, lease_s: float | None):
        self.faults, self.lease_s = faults, lease_s
        self.holder: int | None = None
        self.epoch = 0
        self.expires_at = -math.inf
        self.acquisitions: list[tuple[float, int, int]] = []  # (t, holder, epoch)
        self.writes: list[tuple[float, int, int | None, str]] = []  # (t, agent, epoch, status)

    def reachable(self, t: float) -> bool:
        return self.faults.server_down(t) is None

    def acquire(self, agent: int, t: float) -> str:
        """'ok' (the caller now holds the lease at :attr:`epoch`), 'held' or 'unreachable'."""
        if not self.reachable(t):
            return "unreachable"
        if self.holder is not None and self.holder != agent and t < self.expires_at - EPS:
            return "held"
        if self.holder != agent or t >= self.expires_at - EPS:
            self.epoch += 1  # a new term, even for the same agent after expiry
            self.acquisitions.append((t, agent, self.epoch))
        self.holder, self.expires_at = agent, t + self.lease_s
        return "ok"

    def renew(self, agent: int, epoch: int, t: float) -> str:
        """'ok', 'refused' (the lease is another's, or a later term) or 'unreachable'."""
        if not self.reachable(t):
            return "unreachable"
        if self.holder != agent or self.epoch != epoch:
            return "refused"
        self.expires_at = t + self.lease_s
        return "ok"

    def write(self, agent: int, epoch: int | None, t: float) -> str:
        """'accepted', 'refused' (a stale epoch: 409) or 'unreachable'."""
        status = ("unreachable" if not self.reachable(t) else
                  "refused" if self.lease_s is not None and epoch != self.epoch else "accepted")
        self.writes.append((t, agent, epoch, status))
        return status


class AgentReplica:
    """One agent process: its deciders (a fresh set per cold restart), its view of the
    lease, and the state of its last evaluation (what a warm resume re-sends)."""

    def __init__(self, index: int, make_deciders, downs):
        self.index = index
        self.make_deciders = make_deciders  # what a cold restart builds
        self.generations = [make_deciders()]
        self.downs = tuple(d for d in downs if d.replica == index)
        self.leading = False
        self.epoch: int | None = None
        self.renewed_at = -math.inf
        self.last: list | None = None  # the last evaluation's decisions
        self.down = None  # the AgentDown in progress
        self.skipped = 0

    @property
    def deciders(self) -> list:
        return self.generations[-1]

    def down_at(self, t: float):
        for d in self.downs:
            if d.start_s <= t < d.end_s:
                return d
        return None


class ControlPlane:
    """Agents, config server and the data plane's polls of one closed-loop run."""

    def __init__(self, make_deciders, clocks, faults: ControlPlaneFaults,
                 agents: Agents, data_plane: DataPlaneStale, lookback_s: float):
        self.clocks, self.faults, self.agents_spec = clocks, faults, agents
        self.data_plane, self.lookback_s = data_plane, lookback_s
        self.server = ConfigServer(faults, agents.lease_s)
        self.agents = [AgentReplica(i, make_deciders, faults.agent)
                       for i in range(agents.replicas)]
        if not agents.leased:
            self.agents[0].leading = True  # leader by configuration
        self.pending: list = []  # (effective at, Decision) of accepted writes
        self.kinds: set = set()  # what any accepted decision wanted (flags, nodes, ...)
        self.rows: list[dict] = []
        self.last_poll_ok = 0.0  # the data plane starts with its defaults, fresh
        self.stale_state: str | None = None  # None | "stale" | "defaults"
        self.leaders: list[tuple[float, int, int | None]] = []  # (t, agent, epoch) changes

    def install(self, make_deciders, now=None) -> None:
        """A new configuration on every replica: from now on its deciders are ``now(its
        current deciders)`` (by default a fresh ``make_deciders()``: fresh hysteresis
        state), and a cold restart builds ``make_deciders()``. Decisions already accepted
        stay in force until newer ones replace them."""
        for a in self.agents:
            a.make_deciders = make_deciders
            a.generations.append(make_deciders() if now is None else now(a.deciders))

    def in_force(self, t: float, kind: str):
        """The newest accepted ``kind`` (flags, nodes, tier_flags) in force at ``t``
        (a kind no decision ever wanted, a policy's nodes, is not searched for)."""
        return latest_in_force(self.pending, t, kind) if kind in self.kinds else None

    # ---- instants ----------------------------------------------------------------------
    def agent_times(self, start_s: float, end_s: float):
        """Instants the agents act at besides evaluations: lease renewals (every
        ``renew_s``) and the ends of agent outages (a process resumes when it resumes,
        not at its next evaluation)."""
        ends = [d.end_s for d in self.faults.agent if start_s <= d.end_s <= end_s]
        if not self.agents_spec.leased:
            return np.unique(np.asarray(ends, dtype=float))
        r = self.agents_spec.renew_s
        ticks = np.arange(math.ceil(start_s / r - EPS), math.floor(end_s / r + EPS) + 1) * r
        return np.union1d(ticks, np.asarray(ends, dtype=float))

    # ---- one instant -------------------------------------------------------------------
    def step(self, t: float, is_eval: bool, tsdb_at) -> list:
        """What the agents do at t (an evaluation and/or a renewal tick). ``tsdb_at(t)``
        gives what Prometheus holds (asked only if someone evaluates). Returns the
        accepted writes' decisions (with their repairs, which the caller performs)."""
        accepted = []
        for agent in self.agents:
            accepted.extend(self._agent_step(agent, t, is_eval, tsdb_at))
        return accepted

    def _agent_step(self, a: AgentReplica, t: float, is_eval: bool, tsdb_at) -> list:
        name = f"agent {a.index}"
        leased = self.agents_spec.leased
        down = a.down_at(t)
        if down is not None:
            if a.down is None:
                a.down, a.skipped = down, 0
                self._row(t, "down", name, f"{name} {down.describe()}: no evaluation, no "
                          "write" + (", no lease renewal" if leased else ""))
            if is_eval and a.leading:
                a.skipped += 1
                self._row(t, "skip", name, f"{name} down: evaluation skipped, no write "
                          f"({down.describe()})")
            return []
        out = []
        if a.down is not None:  # back
            d, a.down = a.down, None
            if d.restart == "cold":  # its audit so far is kept; its state is not
                a.generations.append(a.make_deciders())
                a.last, a.epoch, a.renewed_at = None, None, -math.inf
                a.leading = not leased
                self._row(t, "restart", name, f"{name} restarted cold after {a.skipped} "
                          "skipped evaluation(s): fresh hysteresis state"
                          + (", a follower until it acquires the lease" if leased else ""))
            else:
                self._row(t, "restart", name, f"{name} resumed warm after {a.skipped} "
                          "skipped evaluation(s): hysteresis state kept"
                          + ("" if a.last is None else "; it first sends its last state"
                             + (f" with epoch {a.epoch}" if leased else " again")))
                if a.last is not None:
                    out.extend(self._write(a, t, a.last, resent=True))
        if leased:
            self._lease(a, t, is_eval)
        if is_eval and a.leading:
            tsdb = tsdb_at(t)
            decisions = [d.decide(tsdb, t) for d in a.deciders]
            self._absent_signals(a, t)
            a.last = decisions
            out.extend(self._write(a, t, decisions))
        return out

    def _lease(self, a: AgentReplica, t: float, is_eval: bool) -> None:
        spec, name = self.agents_spec, f"agent {a.index}"
        if a.leading and t >= a.renewed_at + spec.lease_s - EPS:
            a.leading = False
            self._row(t, "lease_expired", name, f"{name} stops leading: no successful lease "
                      f"renewal for {spec.lease_s:g} s (epoch {a.epoch})")
        if a.leading and t >= a.renewed_at + spec.renew_s - EPS:
            status = self.server.renew(a.index, a.epoch, t)
            if status == "ok":
                a.renewed_at = t
            elif status == "refused":
                a.leading = False
                self._row(t, "deposed", name, f"{name} deposed: renewal of epoch {a.epoch} "
                          f"refused, the lease is agent {self.server.holder}'s at epoch "
                          f"{self.server.epoch}")
            else:
                self._row(t, "renew_failed", name, f"config server unreachable: {name}'s "
                          f"lease renewal failed (epoch {a.epoch}, leading until "
                          f"{a.renewed_at + spec.lease_s:g} s by its own clock)")
        if not a.leading:
            before = (self.server.holder, self.server.expires_at)
            status = self.server.acquire(a.index, t)
            if status == "ok":
                a.leading, a.epoch, a.renewed_at = True, self.server.epoch, t
                prev = "" if before[0] is None else (
                    f"; agent {before[0]}'s lease expired at {before[1]:g} s"
                    if before[0] != a.index else "; its own lease had expired")
                self._row(t, "acquire", name, f"{name} acquired the lease: epoch "
                          f"{a.epoch}{prev}")
                self.leaders.append((t, a.index, a.epoch))

    def _write(self, a: AgentReplica, t: float, decisions: list, resent: bool = False) -> list:
        name = f"agent {a.index}"
        status = self.server.write(a.index, a.epoch, t)
        what = "held write" if resent else "write"
        if status == "accepted":
            eff = float(self.clocks.effective_at(t))
            out = []
            for dec in decisions:
                if resent:  # the state again, not the repairs: those were done then
                    dec = dataclasses.replace(dec, repairs=())
                self.pending.append((eff, dec))
                self.kinds.update(k for k in ("flags", "nodes", "tier_flags")
                                  if getattr(dec, k) is not None)
                out.append(dec)
            if resent:
                self._row(t, "write", name, f"{name}'s held write accepted"
                          + (f" (epoch {a.epoch})" if a.epoch is not None else ""),
                          effective=eff)
            return out
        if status == "refused":
            self._row(t, "write_refused", name, f"{name}'s {what} refused (409): epoch "
                      f"{a.epoch} is stale, the lease is agent {self.server.holder}'s at "
                      f"epoch {self.server.epoch}")
        else:
            self._row(t, "write_failed", name, f"config server unreachable: {name}'s {what} "
                      "failed")
        return []

    def _absent_signals(self, a: AgentReplica, t: float) -> None:
        """Name every policy signal that was absent at this evaluation because of a
        scrape gap (absence with no gap in the window is the data's, not a fault)."""
        gaps = [g for g in self.faults.prometheus
                if g.start_s <= t and g.end_s > t - self.lookback_s]
        if not gaps:
            return
        for d in a.deciders:
            policy = getattr(d, "policy", None)
            if policy is None or not getattr(d, "absent", None):
                continue
            for j, sig in enumerate(policy.signals):
                if d.absent[-1][j]:
                    rule = policy.missing_rule(sig)
                    effect = {"clear": "counts as not breaching",
                              "hold": "its last value is held",
                              "breach": "counts as breaching"}[rule]
                    self._row(t, "signal_absent", sig, f"signal {sig} absent ("
                              f"{'; '.join(g.describe() for g in gaps)}): on_missing "
                              f"{rule}, {effect}", signal=sig)

    # ---- the data plane's poll ---------------------------------------------------------
    def poll(self, t: float):
        """What an instance reads at its poll at t: ("ok", flags, nodes) with the newest
        accepted state in force (None where there is none yet), ("keep", None, None) or
        ("defaults", None, None) — the latter once, when the staleness limit is reached."""
        if self.server.reachable(t):
            if self.stale_state is not None:
                self._row(t, "poll_ok", "data plane", "config server reachable again after "
                          f"{t - self.last_poll_ok:g} s without a poll: the latest state "
                          "applied", effective=t)
                self.stale_state = None
            self.last_poll_ok = t
            return ("ok", self.in_force(t, "flags"), self.in_force(t, "nodes"))
        dp = self.data_plane
        if self.stale_state is None:
            self.stale_state = "stale"
            keep = ("the instances keep their flags (on_stale keep, fail-static)"
                    if dp.on_stale == "keep" else
                    f"the instances keep their flags for now; defaults after "
                    f"{dp.stale_after_s:g} s without a poll (on_stale defaults, fail-safe)")
            self._row(t, "poll_failed", "data plane",
                      f"config server unreachable: poll failed; {keep}")
        if (dp.on_stale == "defaults" and self.stale_state == "stale"
                and t - self.last_poll_ok >= dp.stale_after_s - EPS):
            self.stale_state = "defaults"
            self._row(t, "defaults", "data plane", f"no successful poll for "
                      f"{t - self.last_poll_ok:g} s (stale_after_s {dp.stale_after_s:g}): "
                      "flags and node controls back to the data plane's defaults",
                      effective=t)
            return ("defaults", None, None)
        return ("keep", None, None)

    # ---- audit -------------------------------------------------------------------------
    def _row(self, t, action, target, reason, signal=None, effective=None):
        self.rows.append({**{k: None for k in DECISION_COLUMNS}, "decided_at_s": float(t),
                          "effective_at_s": None if effective is None else float(effective),
                          "stage": "control_plane",
                          "action": action, "target": target, "signal": signal,
                          "reason": reason})

    def decisions(self) -> pl.DataFrame:
        """The control plane's own audit rows (stage ``control_plane``)."""
        if not self.rows:
            return empty_decisions()
        return pl.DataFrame(self.rows, schema=DECISION_COLUMNS)

    def merged_deciders(self) -> list:
        """Per kind of decider (policy, chain), one object over every agent's and every
        restart's instances: the audit and timeline of the whole run."""
        out = []
        for k in range(len(self.agents[0].deciders)):
            parts = list({id(gen[k]): gen[k] for a in self.agents for gen in a.generations
                          if k < len(gen)}.values())  # an instance carried over counts once
            out.append(parts[0] if len(parts) == 1 else Merged(parts))
        return out

    def summary(self) -> dict:
        writes = self.server.writes
        count = {s: sum(1 for w in writes if w[3] == s)
                 for s in ("accepted", "refused", "unreachable")}
        acq = self.server.acquisitions

        def term(t):  # the lease's epoch at t (the newest acquisition at or before it)
            past = [e for ta, _, e in acq if ta <= t + EPS]
            return past[-1] if past else None

        # accepted writes whose epoch was not the lease's at the time: must stay 0
        count["accepted_stale"] = sum(1 for t, _, e, st in writes
                                      if st == "accepted" and acq and e != term(t))
        return {"writes": count, "leaders": [list(x) for x in self.leaders],
                "acquisitions": [list(x) for x in self.server.acquisitions],
                "audit_actions": dict(pl.DataFrame({"a": [r["action"] for r in self.rows]})
                                      .group_by("a").len().iter_rows()) if self.rows else {}}


class Merged:
    """Several instances of one kind of decider (replicas, cold restarts) read as one: the
    audit and timeline concatenated in time order; the newest instance's configuration."""

    def __init__(self, parts: list):
        self.parts = parts
        self.kind = "policy" if hasattr(parts[0], "policy") else "chain"

    def __getattr__(self, name):  # policy, clocks, order, state: the newest that ran
        if name == "parts":
            raise AttributeError(name)
        ran = [p for p in self.parts if _ran(p)]
        return getattr((ran or self.parts)[-1], name)

    @property
    def actions(self) -> list:
        return sorted((a for p in self.parts for a in getattr(p, "actions", [])),
                      key=lambda a: a["decided_at_s"])

    @property
    def history(self) -> list:
        return sorted((h for p in self.parts for h in getattr(p, "history", [])),
                      key=lambda h: h[0])

    def decisions(self) -> pl.DataFrame:
        return pl.concat([p.decisions() for p in self.parts]).sort("decided_at_s",
                                                                    maintain_order=True)

    def timeline(self) -> pl.DataFrame:
        return pl.concat([p.timeline() for p in self.parts]).sort("time_s",
                                                                   maintain_order=True)


def _ran(p) -> bool:
    return bool(getattr(p, "times", None)) or bool(getattr(p, "history", None))
