"""What the chain knows and does at one evaluation: node states, readings, actions.

Every stage has one interface, ``stage.run(ctx)``: it reads what earlier
stages left in the :class:`Context` (Sentinel's readings, Serpentine's stress
state, node statuses) and records actions through :meth:`Context.act`, each
with its target, signal, value, threshold and a reason in words. The order of
the stages is configuration, so a stage sees exactly what the stages before it
decided in this evaluation, and nothing the later ones will.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import numpy as np

# a node's status, as the chain sees it
HEALTHY = "healthy"  # judged, fine
SUSPECT = "suspect"  # over a threshold, not yet for long enough
ISOLATED = "isolated"  # removed from the working set, waiting for repair
REPAIRING = "repairing"  # a repair is under way
REPAIRED = "repaired"  # mended, waiting for readmission
PROBATION = "probation"  # readmitted on a small, growing weight
WORKING = (HEALTHY, SUSPECT, PROBATION)  # routable


@dataclass
class NodeState:
    status: str = HEALTHY
    breaches: int = 0  # consecutive evaluations over the isolation threshold
    isolated_at: float = math.nan
    repair_due: float = math.nan
    repair_ok: bool = False
    next_repair_at: float = -math.inf
    failures: int = 0  # isolations so far (for Phoenix' growing back-off)
    probation_since: float = math.nan
    throttled: bool = False
    weight: float = 1.0
    intake_limit: int | None = None
    baseline: float = math.nan  # its own trailing error rate (Aegis keeps it), for reasons
    baseline_span_s: float = 0.0

    def baseline_words(self) -> str:
        """The node's baseline as every isolation reason names it."""
        return (f"baseline {pct(self.baseline)} over {self.baseline_span_s:.0f} s"
                if self.baseline == self.baseline else "no baseline yet")


@dataclass
class ChainState:
    """The chain's memory across evaluations."""

    nodes: list[NodeState]
    stress: str = "normal"
    stress_run: int = 0  # evaluations the candidate stress level has held
    stress_candidate: str = "normal"
    breaker: str = "closed"
    panic: bool = False

    @classmethod
    def fresh(cls, n: int) -> ChainState:
        return cls([NodeState() for _ in range(n)])

    def working(self) -> np.ndarray:
        return np.array([s.status in WORKING for s in self.nodes])


@dataclass
class Context:
    """One evaluation: the time, the metrics, the state, and the actions taken."""

    t: float
    tsdb: object  # relakit.control.TSDB
    window_s: float
    servers: np.ndarray
    state: ChainState
    base_weights: np.ndarray | None = None  # the routing weights the fleet was given
    signal_age_s: float = math.nan
    readings: dict = field(default_factory=dict)  # Sentinel's per-node arrays
    fleet: dict = field(default_factory=dict)  # Sentinel's fleet-wide values
    actions: list = field(default_factory=list)
    repairs: list = field(default_factory=list)  # nodes mended now (simulation acts on them)
    stage: str = ""

    def act(self, action: str, target, signal: str, value: float, threshold: float,
            reason: str, **desired) -> None:
        self.actions.append({
            "decided_at_s": self.t, "stage": self.stage, "action": action,
            "target": target if isinstance(target, str) else f"node {target}",
            "signal": signal, "value": float(value), "threshold": float(threshold),
            "signal_age_s": self.signal_age_s, "desired": json.dumps(desired, sort_keys=True),
            "reason": reason,
        })

    def controls(self) -> dict:
        """The per-node controls and the breaker the chain wants now (level-triggered)."""
        st = self.state
        return {
            "routable": np.array([s.status in WORKING for s in st.nodes]),
            "weight": np.array([s.weight for s in st.nodes]),
            "intake_limit": [s.intake_limit for s in st.nodes],
            "breaker": st.breaker,
        }


def pct(x: float) -> str:
    return "no data" if x != x else f"{100 * x:.1f} %"
