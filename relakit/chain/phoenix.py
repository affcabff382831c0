"""Phoenix: recovery. Readmits repaired nodes through probation.

A repaired node comes back on ``probation_weight``, its weight ramping to
full over ``ramp_s``. If it fails again on probation (error rate over
``error_threshold`` with at least ``min_volume`` requests) it is isolated
again, and its next repair waits ``backoff_s`` x ``backoff_factor`` per
failure so far: a node that keeps failing is tried less and less often.
"""

from __future__ import annotations

from dataclasses import dataclass

from relakit.chain.state import HEALTHY, ISOLATED, PROBATION, REPAIRED, Context, pct


@dataclass
class Phoenix:
    name: str = "phoenix"
    probation_weight: float = 0.1
    ramp_s: float = 60.0
    error_threshold: float = 0.2
    min_volume: float = 10.0
    backoff_s: float = 30.0
    backoff_factor: float = 2.0

    def reset(self) -> None:
        """Before a run: nothing to clear (this stage keeps its state in ctx.state)."""

    def run(self, ctx: Context) -> None:
        errors = ctx.readings.get("own_error_rate", ctx.readings["error_rate"])
        for i, s in enumerate(ctx.state.nodes):
            if s.status == REPAIRED:
                s.status, s.probation_since = PROBATION, ctx.t
                s.weight = self.probation_weight * self._base(ctx, i)
                s.breaches = 0
                ctx.act("readmit", i, "weight", s.weight, 1.0,
                        f"readmitted node {i} on probation: weight {s.weight:g}, full in "
                        f"{self.ramp_s:g} s", routable=True, weight=s.weight)
            elif s.status == PROBATION:
                e, vol = errors[i], ctx.readings["volume"][i]
                since = ctx.t - s.probation_since
                if e == e and e > self.error_threshold and vol >= self.min_volume:
                    s.status, s.isolated_at, s.failures = ISOLATED, ctx.t, s.failures + 1
                    wait = self.backoff_s * self.backoff_factor ** (s.failures - 1)
                    s.next_repair_at = ctx.t + wait
                    ctx.act("isolate", i, "error_rate", e, self.error_threshold,
                            f"node {i} failed on probation: error rate {pct(e)} > "
                            f"{pct(self.error_threshold)} (threshold: fixed, probation; "
                            f"{s.baseline_words()}); isolated again, next repair in "
                            f"{wait:g} s (failure {s.failures})", routable=False)
                elif since >= self.ramp_s:
                    s.status, s.weight = HEALTHY, self._base(ctx, i)
                    ctx.act("admit", i, "probation_s", since, self.ramp_s,
                            f"node {i} passed probation after {since:.0f} s: full weight",
                            weight=1.0)
                else:
                    s.weight = self._base(ctx, i) * (self.probation_weight + (
                        1 - self.probation_weight) * since / self.ramp_s)

    @staticmethod
    def _base(ctx: Context, i: int) -> float:
        return 1.0 if ctx.base_weights is None else float(ctx.base_weights[i])
