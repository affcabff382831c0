"""Punisher: repair. Works on isolated nodes, one repair at a time each.

A repair takes ``repair_s`` and succeeds with ``success_probability`` (drawn
from the chain's own seeded generator, so runs repeat). In simulation a
successful repair clears the node's current faults; in replay it is recorded
only. A failed repair is tried again after ``retry_s``, doubled per failure.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from relakit.chain.state import ISOLATED, REPAIRED, REPAIRING, Context


@dataclass
class Punisher:
    name: str = "punisher"
    repair_s: float = 30.0
    success_probability: float = 1.0
    retry_s: float = 30.0
    seed: int = 0
    _rng: np.random.Generator = field(default=None, repr=False)

    def reset(self) -> None:
        """Before a run: the repair outcomes start again from the seed."""
        self._rng = np.random.default_rng(self.seed)

    def run(self, ctx: Context) -> None:
        if self._rng is None:
            self.reset()
        for i, s in enumerate(ctx.state.nodes):
            if s.status == ISOLATED and ctx.t >= s.next_repair_at:
                s.status, s.repair_due = REPAIRING, ctx.t + self.repair_s
                s.repair_ok = bool(self._rng.random() < self.success_probability)
                ctx.act("repair", i, "repair_s", self.repair_s, self.repair_s,
                        f"started repairing node {i}: done in {self.repair_s:g} s")
            elif s.status == REPAIRING and ctx.t >= s.repair_due:
                if s.repair_ok:
                    s.status = REPAIRED
                    ctx.repairs.append(i)
                    ctx.act("repaired", i, "repair_s", self.repair_s, self.repair_s,
                            f"repaired node {i} after {self.repair_s:g} s")
                else:
                    s.status = ISOLATED
                    wait = self.retry_s * 2 ** max(0, s.failures - 1)
                    s.next_repair_at = ctx.t + wait
                    ctx.act("repair_failed", i, "success_probability",
                            self.success_probability, 1.0,
                            f"repair of node {i} failed; next attempt in {wait:g} s")
