"""The agent: relakit's deciders against the live system — evaluate, assert, audit.

The same deciders as the closed loop and replay (:mod:`relakit.control.decider`):
the policy's controller and/or the containment chain, each evaluated at every
tick of the clocks' evaluation interval on what Prometheus holds (the last
``Clocks.lookback_s``). What they want goes where the live system takes it: the
policy's flags and the chain's per-instance ``routable`` to the config server
(the services and the load generator poll it), the chain's repairs to the
instance itself (``POST /repair``). The chain's weights, intake limits and
breaker have no live counterpart yet: they are audited, not applied.

High availability (``ha=True``, ``relakit lab up --agents N``): each agent is one
of several replicas that elect a leader through the config server's lease
(:mod:`relakit.lab.config_server`). The leader renews every ``LabSpec.renew_s``
and stops leading by itself once ``lease_s`` have passed without a successful
renewal; a follower tries to acquire the lease at every tick and, once it holds
it, evaluates in the same tick. Writes carry the epoch; a refused one (409: the
lease moved on) is audited and the agent finds itself deposed at its next
renewal. :meth:`Agent.pause` freezes the agent between its decision and its
write (a process stopped mid-loop), to show that fencing, not the old leader's
good behaviour, keeps its late write out.
"""

from __future__ import annotations

import math
import threading
import time

import httpx
import polars as pl

from relakit.control import Controller
from relakit.control.audit import DECISION_COLUMNS, empty_decisions
from relakit.control.decider import Decision
from relakit.control.signals import policy_reach_s
from relakit.lab.lab import Lab
from relakit.vocab import POLICY_FLAGS


class Agent(threading.Thread):
    """relakit's deciders against the live system: evaluate, assert, audit.

    ``policy`` and/or ``chain`` (paths, mappings or loaded objects). ``source="samples"``
    (default) fetches the raw samples of the window and computes the signals exactly
    as replay does; ``source="promql"`` asks Prometheus to evaluate each of the
    policy's signals from its PromQL rendering instead (the chain always reads samples).
    """

    def __init__(self, lab: Lab, policy=None, source: str = "samples", chain=None,
                 name: str = "agent 0", ha: bool = False):
        super().__init__(daemon=True, name=name)
        if source not in ("samples", "promql"):
            raise ValueError(f"source must be samples or promql, got {source!r}")
        if policy is None and chain is None:
            raise ValueError("the agent needs a policy, a chain, or both")
        self.lab = lab
        self.source = source
        self.controller = Controller(policy, lab.clocks) if policy is not None else None
        self.chain = None
        if chain is not None:
            from relakit.chain import load_chain

            spec = lab.spec
            self.chain = load_chain(chain).run(lab.clocks,
                                               servers=(spec.servers,) * spec.instances)
        self.deciders = [d for d in (self.controller, self.chain) if d is not None]
        self.times: list[float] = []  # the evaluation instants, to replay at
        self.stop_event = threading.Event()
        self.errors: list[str] = []
        self.ha = ha
        self.leading = not ha  # one agent leads by configuration
        self.epoch: int | None = None
        self.renewed_at = -math.inf
        self.rows: list[dict] = []  # the agent's own audit: lease changes, refused writes
        self.writes: list[tuple[float, int | None, int]] = []  # (time, epoch, HTTP status)
        self._pause = threading.Event()
        self.paused_at: float | None = None  # when a pause took hold (before a write)

    def pause(self) -> None:
        """Freeze before the next write (as SIGSTOP would between decide and write)."""
        self._pause.set()

    def resume(self) -> None:
        self._pause.clear()

    def run(self) -> None:
        clk = self.lab.clocks
        lookback = clk.lookback(policy_reach_s(self.controller.policy if self.controller
                                               else None))
        period = min(clk.eval_s, self.lab.spec.renew_s) if self.ha else clk.eval_s
        with httpx.Client(timeout=2.0) as client:
            while not self.stop_event.is_set():
                t = time.time()
                try:
                    if self.ha:
                        self._lease(client, t)
                    if not self.leading or (self.times and t - self.times[-1] < clk.eval_s
                                            - 0.5 * period):
                        self.stop_event.wait(max(0.0, period - (time.time() - t)))
                        continue
                    self.times.append(t)
                    if self.source == "promql" and self.controller is not None:
                        row = self.lab.promql_signals(self.controller.policy, t)
                        decisions = [Decision(flags=self.controller.decide_row(t, row))]
                        if self.chain is not None:
                            decisions.append(self.chain.decide(
                                self.lab.tsdb(lookback, at=t), t))
                    else:  # the deciders' protocol, as in the closed loop and replay
                        tsdb = self.lab.tsdb(lookback, at=t)
                        decisions = [d.decide(tsdb, t) for d in self.deciders]
                    self._frozen()
                    for decision in decisions:
                        self._apply(client, decision)
                except Exception as exc:  # the loop goes on; the error is kept
                    self.errors.append(f"{type(exc).__name__}: {exc}")
                self.stop_event.wait(max(0.0, period - (time.time() - t)))

    def _frozen(self) -> None:
        """Block here while paused: after deciding, before writing."""
        if self._pause.is_set():
            self.paused_at = time.time()
            while self._pause.is_set() and not self.stop_event.is_set():
                time.sleep(0.02)

    def _lease(self, client: httpx.Client, t: float) -> None:
        """Renew (leader) or try to acquire (follower) the config server's lease."""
        spec, auth = self.lab.spec, {"Authorization": f"Bearer {self.lab.token}"}
        if self.leading and t >= self.renewed_at + spec.lease_s:
            self.leading = False
            self._row(t, "lease_expired", f"{self.name} stops leading: no successful lease "
                      f"renewal for {spec.lease_s:g} s (epoch {self.epoch})")
        if self.leading and t >= self.renewed_at + spec.renew_s - 0.05:
            r = client.post(f"{self.lab.config_url}/lease/renew", headers=auth,
                            json={"holder": self.name, "epoch": self.epoch})
            if r.status_code == 200:
                self.renewed_at = t
            elif r.status_code == 409:
                self.leading = False
                self._row(t, "deposed", f"{self.name} deposed: {r.json()['detail']}")
        if not self.leading:
            r = client.post(f"{self.lab.config_url}/lease/acquire", headers=auth,
                            json={"holder": self.name})
            if r.status_code == 200:
                self.leading, self.epoch, self.renewed_at = True, r.json()["epoch"], t
                self._row(t, "acquire", f"{self.name} acquired the lease: epoch {self.epoch}")

    def _row(self, t: float, action: str, reason: str) -> None:
        self.rows.append({**{k: None for k in DECISION_COLUMNS}, "decided_at_s": t,
                          "stage": "control_plane", "action": action, "target": self.name,
                          "reason": reason})

    def _apply(self, client: httpx.Client, decision: Decision) -> None:
        auth = {"Authorization": f"Bearer {self.lab.token}"}
        for i in decision.repairs:  # work on the instance: done now, not at a poll
            client.post(f"{self.lab.instance_urls[i]}/repair", headers=auth)
        body = {}
        if decision.flags is not None:
            body["flags"] = decision.flags.as_dict(POLICY_FLAGS)  # what the server serves
        if decision.nodes is not None:  # level-triggered; the server records changes only
            body["instances"] = {str(i): {"routable": bool(r)}
                                 for i, r in enumerate(decision.nodes["routable"])
                                 if i < len(self.lab.instance_urls)}
        if body:
            t = time.time()
            r = client.put(f"{self.lab.config_url}/state", headers=auth,
                           json={**body, "reason": "relakit agent", "holder": self.name,
                                 "epoch": self.epoch if self.ha else None})
            self.writes.append((t, self.epoch, r.status_code))
            if r.status_code == 409:
                self._row(t, "write_refused", f"{self.name}'s write refused (409): "
                          f"{r.json()['detail']}")

    def decisions(self) -> pl.DataFrame:
        """Every decider's audit and the agent's own rows, in decision order."""
        own = pl.DataFrame(self.rows, schema=DECISION_COLUMNS) if self.rows else \
            empty_decisions()
        return pl.concat([d.decisions() for d in self.deciders] + [own]).sort(
            "decided_at_s", maintain_order=True)

    def stop(self) -> None:
        self.stop_event.set()
        self.join(timeout=10)
