"""The agent: relakit's deciders against the live system — evaluate, assert, audit.

The same deciders as the closed loop and replay (:mod:`relakit.control.decider`):
the policy's controller and/or the containment chain, each evaluated at every
tick of the clocks' evaluation interval on what Prometheus holds (the last
``Clocks.lookback_s``). What they want goes where the live system takes it: the
policy's flags and the chain's per-instance ``routable`` to the config server
(the services and the load generator poll it), the chain's repairs to the
instance itself (``POST /repair``). The chain's weights, intake limits and
breaker have no live counterpart yet: they are audited, not applied.
"""

from __future__ import annotations

import threading
import time

import httpx
import polars as pl

from relakit.control import Controller
from relakit.control.decider import Decision
from relakit.control.signals import policy_reach_s
from relakit.lab.lab import Lab


class Agent(threading.Thread):
    """relakit's deciders against the live system: evaluate, assert, audit.

    ``policy`` and/or ``chain`` (paths, mappings or loaded objects). ``source="samples"``
    (default) fetches the raw samples of the window and computes the signals exactly
    as replay does; ``source="promql"`` asks Prometheus to evaluate each of the
    policy's signals from its PromQL rendering instead (the chain always reads samples).
    """

    def __init__(self, lab: Lab, policy=None, source: str = "samples", chain=None):
        super().__init__(daemon=True)
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

    def run(self) -> None:
        clk = self.lab.clocks
        lookback = clk.lookback(policy_reach_s(self.controller.policy if self.controller
                                               else None))
        with httpx.Client(timeout=2.0) as client:
            while not self.stop_event.is_set():
                t = time.time()
                try:
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
                    for decision in decisions:
                        self._apply(client, decision)
                except Exception as exc:  # the loop goes on; the error is kept
                    self.errors.append(f"{type(exc).__name__}: {exc}")
                self.stop_event.wait(max(0.0, clk.eval_s - (time.time() - t)))

    def _apply(self, client: httpx.Client, decision: Decision) -> None:
        auth = {"Authorization": f"Bearer {self.lab.token}"}
        for i in decision.repairs:  # work on the instance: done now, not at a poll
            client.post(f"{self.lab.instance_urls[i]}/repair")
        body = {}
        if decision.flags is not None:
            body["flags"] = decision.flags
        if decision.nodes is not None:  # level-triggered; the server records changes only
            body["instances"] = {str(i): {"routable": bool(r)}
                                 for i, r in enumerate(decision.nodes["routable"])
                                 if i < len(self.lab.instance_urls)}
        if body:
            client.put(f"{self.lab.config_url}/state",
                       json={**body, "reason": "relakit agent"}, headers=auth)

    def decisions(self) -> pl.DataFrame:
        """Every decider's audit, in decision order."""
        return pl.concat([d.decisions() for d in self.deciders]).sort(
            "decided_at_s", maintain_order=True)

    def stop(self) -> None:
        self.stop_event.set()
        self.join(timeout=10)
