"""Serpentine: classification. The fleet's stress state, with hysteresis.

normal → elevated → critical → catastrophic, from fleet-wide readings: the
share of unhealthy nodes (over the isolation threshold, or out of the working
set), the global error rate, mean utilisation and p99 against an SLO. A level
is reached when any of its thresholds is; the state moves to a new level only
after that level (or a higher one) has held ``enter_after`` evaluations, and
down after ``exit_after`` evaluations below the current one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from relakit.chain.state import WORKING, Context, pct
from relakit.vocab import STRESS_LEVELS

LEVELS = STRESS_LEVELS  # relakit.vocab's, rising
DEFAULT_LEVELS = {
    "elevated": {"unhealthy_share": 0.1, "error_rate": 0.02, "utilisation": 0.8},
    "critical": {"unhealthy_share": 0.25, "error_rate": 0.1, "utilisation": 0.9},
    "catastrophic": {"unhealthy_share": 0.5, "error_rate": 0.3},
}


@dataclass
class Serpentine:
    name: str = "serpentine"
    levels: dict = field(default_factory=lambda: dict(DEFAULT_LEVELS))
    unhealthy_error_rate: float = 0.2
    slo_p99_ms: float | None = None
    enter_after: int = 1
    exit_after: int = 3

    def observed(self, ctx: Context) -> dict:
        st = ctx.state
        errs = ctx.readings["error_rate"]
        out = np.array([s.status not in WORKING for s in st.nodes])
        bad = out | (np.nan_to_num(errs) > self.unhealthy_error_rate)
        obs = {"unhealthy_share": float(bad.mean()), "error_rate": ctx.fleet["error_rate"],
               "utilisation": ctx.fleet["utilisation"]}
        if self.slo_p99_ms:
            obs["p99_over_slo"] = ctx.fleet["p99_ms"] / self.slo_p99_ms
        return obs

    def reset(self) -> None:
        """Before a run: nothing to clear (this stage keeps its state in ctx.state)."""

    def run(self, ctx: Context) -> None:
        st = ctx.state
        obs = self.observed(ctx)
        level, why = 0, None
        for i, name in enumerate(LEVELS[1:], start=1):
            for key, limit in self.levels.get(name, {}).items():
                v = obs.get(key, np.nan)
                if v == v and v >= limit:
                    level, why = i, (key, v, limit)
                    break
        cur = LEVELS.index(st.stress)
        cand = LEVELS.index(st.stress_candidate)
        if level == cand:
            st.stress_run += 1
        else:
            st.stress_candidate, st.stress_run = LEVELS[level], 1
        need = self.enter_after if level > cur else self.exit_after
        if level != cur and st.stress_run >= need:
            prev = st.stress
            st.stress = LEVELS[level]
            if why is None:  # calmer: report the share of unhealthy nodes
                key, limit = "unhealthy_share", self.levels.get(prev, {}).get(
                    "unhealthy_share", np.nan)
                why = (key, obs[key], limit)
            key, v, limit = why
            shown = pct(v) if key != "p99_over_slo" else f"{v:.2f}x"
            direction = "rose" if level > cur else "fell"
            ctx.act("classify", "fleet", key, v, limit,
                    f"stress {direction} from {prev} to {st.stress}: {key} {shown} "
                    f"{'>=' if level > cur else '<'} {limit:g} for {st.stress_run} evaluation"
                    f"{'s' if st.stress_run > 1 else ''}", stress=st.stress)
