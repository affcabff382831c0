"""Atlas: redistribution. Routing weights over the working set.

With ``balance: capacity`` (the default) each working node keeps its configured
weight, so the work of removed nodes spreads over the others in proportion to
what they were built for. With ``balance: spare`` each working node gets its
configured weight scaled by its spare capacity,
``base x servers x max(floor, 1 - utilisation)``, normalised so the working
set keeps its configured total: displaced work flows to where there is room,
and a node configured with no traffic (a backend) gets none. Each move goes
only ``gain`` of the way to its target and stays within ``max_shift`` of the
configured weight: chasing spare capacity at full speed overloads the node
it chases, and its neighbours in turn.
Nodes Aegis has flagged (suspect) or removed get nothing new from Atlas:
that is why it runs after Aegis. Put it first and it spreads work over the
state of the last evaluation, onto nodes Aegis is about to isolate. Weights
on probation are Phoenix' business and are left alone. Level-triggered; only
changes beyond ``tolerance`` are audited.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from relakit.chain.state import HEALTHY, SUSPECT, Context, pct


@dataclass
class Atlas:
    name: str = "atlas"
    floor: float = 0.05
    tolerance: float = 0.25
    suspect_weight: float = 0.0
    gain: float = 0.5
    max_shift: float = 0.5
    balance: str = "capacity"  # capacity | spare

    def reset(self) -> None:
        """Before a run: nothing to clear (this stage keeps its state in ctx.state)."""

    def run(self, ctx: Context) -> None:
        st = ctx.state
        util = np.nan_to_num(ctx.readings["utilisation"], nan=0.0)
        base = ctx.base_weights if ctx.base_weights is not None else np.ones(len(st.nodes))
        mine = [i for i, s in enumerate(st.nodes) if s.status in (HEALTHY, SUSPECT)]
        if not mine or base[mine].sum() <= 0:
            return
        if self.balance == "spare":
            spare = np.array([base[i] * ctx.servers[i] * max(self.floor, 1 - util[i])
                              for i in mine])
            targets = spare * base[mine].sum() / max(spare.sum(), 1e-12)
        else:
            targets = base[mine]
        for i, target in zip(mine, targets, strict=True):
            s = st.nodes[i]
            old = s.weight
            w = old + self.gain * (target - old) if self.balance == "spare" else target
            w = min(max(w, base[i] * (1 - self.max_shift)), base[i] * (1 + self.max_shift))
            if s.status == SUSPECT:
                w = self.suspect_weight
            s.weight = float(w)
            if abs(w - old) > self.tolerance * max(old, 1e-9):
                why = (f"node {i} is suspect: no new work until Aegis decides" if
                       s.status == SUSPECT else
                       f"spare capacity {pct(max(self.floor, 1 - util[i]))} of "
                       f"{ctx.servers[i]:g} servers" if self.balance == "spare" else
                       "back in the working set at its configured weight")
                ctx.act("reweight", i, "utilisation", util[i], 1 - self.floor,
                        f"{'raised' if w > old else 'lowered'} node {i}'s weight "
                        f"{old:.2f} → {w:.2f}: {why}", weight=round(float(w), 4))
