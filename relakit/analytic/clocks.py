"""How long a control loop takes to act on a step change: the clock bound.

For a step that makes a condition true at time s, with clocks whose phases
are independent of s (and of each other), the delay from s to the config
poll that applies the decision is

    D = lead + U_scrape                 the first scrape once the signal shows it
      + U_eval + (n - 1) * eval_s       the next evaluation, then n in a row
      + propagation_s + U_poll          then the next config poll

with U_scrape ~ U(0, scrape_s), U_eval ~ U(0, eval_s), U_poll ~ U(0, poll_s)
independent and ``n`` the policy's ``enter_after``. ``lead`` is how long the
signal needs after the step: 0 for a gauge read as its last value (exact);
about ``fraction * window_s`` for a windowed ratio or rate that must reach
``fraction`` of the step's height (exact to within one scrape interval,
since the sampled span of the window varies between window - scrape and
window). The sum of independent uniforms has an exact piecewise-polynomial
CDF, used here for the quantiles.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import combinations

import numpy as np


@dataclass(frozen=True)
class DelayDistribution:
    """Detection-plus-actuation delay of a step: a constant plus a sum of uniforms."""

    constant: float
    widths: tuple[float, ...]

    @property
    def min(self) -> float:
        return self.constant

    @property
    def max(self) -> float:
        return self.constant + sum(self.widths)

    @property
    def mean(self) -> float:
        return self.constant + sum(self.widths) / 2

    def cdf(self, x):
        """Exact CDF: sum over subsets J of (-1)^|J| (y - sum_J a)_+^n / (n! prod a)."""
        y = np.asarray(x, dtype=float) - self.constant
        widths = [w for w in self.widths if w > 0]
        n = len(widths)
        if n == 0:
            return np.where(y >= 0, 1.0, 0.0)
        total = np.zeros_like(y, dtype=float)
        for r in range(n + 1):
            for subset in combinations(widths, r):
                total += (-1) ** r * np.maximum(y - sum(subset), 0.0) ** n
        out = total / (math.factorial(n) * math.prod(widths))
        return np.clip(np.where(y >= sum(widths), 1.0, out), 0.0, 1.0)

    def quantile(self, q: float) -> float:
        if not 0 <= q <= 1:
            raise ValueError(f"q must be in [0, 1], got {q}")
        if q == 0 or self.max == self.min:
            return self.min
        if q == 1:
            return self.max
        from scipy import optimize  # here, not at import: scipy.optimize costs ~0.5 s to load
        return float(optimize.brentq(lambda x: float(self.cdf(x)) - q, self.min, self.max,
                                     xtol=1e-9))


def step_delay(scrape_s: float, eval_s: float, poll_s: float, propagation_s: float = 0.0,
               enter_after: int = 1, lead_s: float = 0.0) -> DelayDistribution:
    """The delay from a step to its actuation, for the given clocks and hysteresis."""
    for name, v in (("scrape_s", scrape_s), ("eval_s", eval_s), ("poll_s", poll_s)):
        if not v > 0:
            raise ValueError(f"{name} must be > 0, got {v}")
    if enter_after < 1 or lead_s < 0 or propagation_s < 0:
        raise ValueError("enter_after must be >= 1; lead_s and propagation_s >= 0")
    constant = lead_s + (enter_after - 1) * eval_s + propagation_s
    return DelayDistribution(constant, (scrape_s, eval_s, poll_s))


def min_detectable_spike(window_s: float, scrape_s: float, fraction: float) -> float:
    """Spikes narrower than this never trip a windowed ratio or rate threshold.

    A spike of width w and height h adds at most h * w / span to a windowed
    ratio, and the sampled span of a window is at least ``window_s - scrape_s``;
    to reach ``fraction * h`` the spike needs ``w >= fraction * (window - scrape)``,
    whatever the phases and however many evaluations the policy would wait.
    """
    if not 0 < fraction <= 1 or not window_s > scrape_s > 0:
        raise ValueError("need 0 < fraction <= 1 and window_s > scrape_s > 0")
    return fraction * (window_s - scrape_s)
