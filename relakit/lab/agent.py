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

``relakit lab up`` runs each agent as a process of its own (:func:`main`, started by
:meth:`relakit.lab.lab.Lab.start_agent`), so that killing the leader's process leaves
the follower running to take over; the class also runs as a thread beside a
:class:`Lab` (the tests and notebooks drive it so).
"""

from __future__ import annotations

import math
import os
import threading
import time

import httpx
import polars as pl

from relakit.control import Controller
from relakit.control.audit import DECISION_COLUMNS, empty_decisions
from relakit.control.decider import Decision
from relakit.control.signals import policy_reach_s
from relakit.lab.lab import Lab
from relakit.vocab import LOCAL_FLAGS, POLICY_FLAGS


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
        self.log = None  # a callable given each lease change as a line (the process's log)
        self._followed = False  # said once that it follows
        # the audit as it is made: each evaluation's new rows appended (JSON lines) here
        self.live_path = None
        self._live = {"evals": 0, "t": -math.inf, "own": 0}

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
        self._warm_up(lookback)
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
                    self._write_live()
                except Exception as exc:  # the loop goes on; the error is kept
                    msg = f"{type(exc).__name__}: {exc}"
                    if self.log is not None and (not self.errors or self.errors[-1] != msg):
                        self.log(f"error: {msg}")
                    self.errors.append(msg)
                self.stop_event.wait(max(0.0, period - (time.time() - t)))

    def _warm_up(self, lookback: float) -> None:
        """Evaluate once on copies of the deciders, writing nothing: a fresh process pays
        its lazy imports and numba's cached kernels (seconds on a loaded machine; measured
        to outlast a 3 s lease) before it campaigns, not while it holds the lease."""
        import copy

        try:
            t = time.time()
            tsdb = self.lab.tsdb(lookback, at=t)
            for d in copy.deepcopy(self.deciders):
                d.decide(tsdb, t)
        except Exception as exc:  # the loop will meet it again and keep it
            if self.log is not None:
                self.log(f"warm-up: {type(exc).__name__}: {exc}")

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
            elif r.status_code == 409 and not self._followed and self.log is not None:
                self._followed = True
                self.log(f"{self.name} follows: {r.json()['detail']}")

    def _row(self, t: float, action: str, reason: str) -> None:
        if self.log is not None:
            self.log(reason)
        self.rows.append({**{k: None for k in DECISION_COLUMNS}, "decided_at_s": t,
                          "stage": "control_plane", "action": action, "target": self.name,
                          "reason": reason})

    def _apply(self, client: httpx.Client, decision: Decision) -> None:
        auth = {"Authorization": f"Bearer {self.lab.token}"}
        for i in decision.repairs:  # work on the instance: done now, not at a poll
            client.post(f"{self.lab.instance_urls[i]}/repair", headers=auth)
        body = {}
        if decision.flags is not None:
            body["flags"] = decision.flags.as_dict(POLICY_FLAGS + LOCAL_FLAGS)  # served
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

    def _write_live(self) -> None:
        """Append the rows decided since the last call to ``live_path`` (flushed: a
        reader, or a kill, finds every decision made so far)."""
        if self.live_path is None:
            return
        parts = []
        if self.controller is not None:
            parts.append(self.controller.decisions(since=self._live["evals"]))
            self._live["evals"] = len(self.controller.times)
        if self.chain is not None:
            parts.append(self.chain.decisions().filter(pl.col("decided_at_s")
                                                       > self._live["t"]))
        if len(self.rows) > self._live["own"]:
            parts.append(pl.DataFrame(self.rows[self._live["own"]:], schema=DECISION_COLUMNS))
            self._live["own"] = len(self.rows)
        new = pl.concat(parts).sort("decided_at_s", maintain_order=True) if parts else None
        if self.times:
            self._live["t"] = self.times[-1]
        if new is not None and new.height:
            with open(self.live_path, "a") as fh:
                fh.write(new.write_ndjson())
                fh.flush()

    def decisions(self) -> pl.DataFrame:
        """Every decider's audit and the agent's own rows, in decision order."""
        own = pl.DataFrame(self.rows, schema=DECISION_COLUMNS) if self.rows else \
            empty_decisions()
        return pl.concat([d.decisions() for d in self.deciders] + [own]).sort(
            "decided_at_s", maintain_order=True)

    def stop(self) -> None:
        self.stop_event.set()
        self.join(timeout=10)


def main(argv=None) -> int:
    """One agent as a process: ``python -m relakit.lab.agent --dir WORK --name agent0
    --parent PID [--policy P] [--chain C] [--ha]``. It attaches to the lab through
    ``WORK/state.json`` (URLs, clocks, lease, token), dies with ``--parent`` and, on
    SIGTERM, stops and writes its audit to ``WORK/decisions-<name>.parquet``."""
    import argparse
    import signal
    from pathlib import Path

    from relakit.io import write_parquet
    from relakit.runner import die_with_parent

    ap = argparse.ArgumentParser(prog="python -m relakit.lab.agent")
    ap.add_argument("--dir", required=True)
    ap.add_argument("--name", required=True)
    ap.add_argument("--parent", type=int, required=True)
    ap.add_argument("--policy", default=None)
    ap.add_argument("--chain", default=None)
    ap.add_argument("--source", choices=("samples", "promql"), default="samples")
    ap.add_argument("--ha", action="store_true")
    a = ap.parse_args(argv)
    die_with_parent(a.parent)  # an agent outliving its lab would write to nothing
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())  # a Ctrl-C goes to its owner

    def log(line: str) -> None:
        print(f"{time.time():.3f} {line}", flush=True)

    agent = Agent(Lab.attach(a.dir), a.policy, source=a.source, chain=a.chain,
                  name=a.name, ha=a.ha)
    agent.log = log
    agent.live_path = Path(a.dir) / f"decisions-{a.name}.jsonl"
    agent.live_path.unlink(missing_ok=True)  # never an earlier run's rows
    log(f"{a.name} started (pid {os.getpid()}{', high availability' if a.ha else ''})")
    agent.start()
    while not stop.wait(0.5):
        if not agent.is_alive():
            break
    agent.stop()
    path = write_parquet(agent.decisions(), Path(a.dir) / f"decisions-{a.name}.parquet")
    log(f"{a.name} stopped; audit in {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
