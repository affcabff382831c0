"""Correctness probes: how long a silent failure goes unseen, and what probing costs.

A prober sends each node ``r`` synthetic requests a second (Poisson) whose
answers are known. From time 0 the node answers a share ``w`` of everything
wrongly (with success status), probes included. The chain reads, at each
evaluation, the probe failure ratio over its window as Prometheus would: the
counters' increase between the first and last scrape inside the window, a
span of ``S = window_s - scrape_s`` (the window's length is a whole number of
scrapes, so exactly ``window_s / scrape_s`` samples fall in it). It isolates
when the ratio exceeds ``k`` with at least ``m`` probes in the span.

Counting argument: the span holds ``N ~ Poisson(r S)`` probes, and the ratio
exceeds ``k`` once more than ``k N`` of them failed, i.e. at the ``n``-th
failure after the onset, ``n = floor(k N) + 1``. Failures arrive as a Poisson
process of rate ``r w``, so (while ``n`` failures fit in one span, i.e.
``k < w`` with room) the time to the ``n``-th is Erlang(n, r w). The reading
then waits for the next scrape and the evaluation after it, each uniform
over its interval when the clocks' phases are independent of the onset:

    D = Erlang(n, r w) + U(0, scrape_s) + U(0, eval_s) + (isolate_after - 1) * eval_s

mixed over ``N`` (given ``N >= m``). The approximation is treating ``N`` as
fixed during the crossing (it moves by a probe or two) and the next scrape as
independent of the failure times. The fluid limit (``r -> inf``) is the
clock bound's lead ``k S / w`` (:func:`relakit.analytic.step_delay`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ._validate import as_positive


def _stats():
    """scipy.stats, imported on first use (~0.5 s): `import relakit.analytic` stays light."""
    from scipy import stats

    return stats


@dataclass(frozen=True)
class ProbeDetection:
    """The detection delay of a silent failure by correctness probes (module docstring)."""

    rate_rps: float  # probes a second, per node
    wrong_rate: float
    threshold: float
    window_s: float
    scrape_s: float
    eval_s: float
    min_volume: float = 1.0
    isolate_after: int = 1

    @property
    def span_s(self) -> float:
        """The sampled span of a window: window - scrape."""
        return self.window_s - self.scrape_s

    def _mixture(self) -> tuple[np.ndarray, np.ndarray]:
        """(n, weight): failures needed, and their probability over N >= m (normalised)."""
        mean_n = self.rate_rps * self.span_s
        hi = int(mean_n + 12 * math.sqrt(mean_n) + 20)
        counts = np.arange(max(int(math.ceil(self.min_volume)), 1), hi + 1)
        weights = _stats().poisson.pmf(counts, mean_n)
        if weights.sum() < 1e-9:
            raise ValueError(f"a window's span ({self.span_s:g} s) holds about {mean_n:.3g} "
                             f"probes, never the minimum volume {self.min_volume:g}")
        n = np.floor(self.threshold * counts + 1e-12).astype(int) + 1
        return n, weights / weights.sum()

    @property
    def detectable(self) -> bool:
        """Probes see the failure at all: more wrong than the threshold, and volume."""
        return self.wrong_rate > self.threshold and (
            _stats().poisson.sf(math.ceil(self.min_volume) - 1, self.rate_rps * self.span_s) > 0.5)

    @property
    def constant_s(self) -> float:
        return (self.isolate_after - 1) * self.eval_s

    @property
    def mean(self) -> float:
        n, p = self._mixture()
        lead = float(np.sum(p * n)) / (self.rate_rps * self.wrong_rate)
        return lead + self.scrape_s / 2 + self.eval_s / 2 + self.constant_s

    @property
    def sd(self) -> float:
        n, p = self._mixture()
        lam = self.rate_rps * self.wrong_rate
        var_lead = float(np.sum(p * (n / lam**2 + (n / lam) ** 2))) - (
            float(np.sum(p * n)) / lam) ** 2
        return math.sqrt(var_lead + self.scrape_s**2 / 12 + self.eval_s**2 / 12)

    @property
    def fluid_lead_s(self) -> float:
        """The lead with infinitely many probes: k S / w (the clock bound's lead)."""
        return self.threshold * self.span_s / self.wrong_rate

    def cdf(self, x) -> np.ndarray:
        """P(D <= x), by numerical convolution of the Erlang mixture with the uniforms."""
        x = np.atleast_1d(np.asarray(x, dtype=float)) - self.constant_s
        n, p = self._mixture()
        lam = self.rate_rps * self.wrong_rate
        top = float(np.max(x)) if x.size else 0.0
        grid = np.linspace(0.0, max(top, 1e-9), 4001)
        dx = grid[1] - grid[0]
        lead = sum(w * _stats().gamma.pdf(grid, a=k, scale=1 / lam) for k, w in zip(n, p,
                                                                                 strict=True))
        dens = lead
        for width in (self.scrape_s, self.eval_s):
            box = np.ones(max(1, int(round(width / dx)))) / max(1, int(round(width / dx)))
            dens = np.convolve(dens, box)[: grid.size]
        cum = np.cumsum(dens) * dx
        return np.interp(x, grid, np.clip(cum, 0, 1), left=0.0)


def probe_detection(rate_rps: float, wrong_rate: float, threshold: float, window_s: float,
                    scrape_s: float, eval_s: float, min_volume: float = 1.0,
                    isolate_after: int = 1) -> ProbeDetection:
    """The detection delay (from the onset to Aegis' decision) at probe rate r, wrong-answer
    rate w and threshold k, for the given clocks and minimum probe volume."""
    for name, v in (("rate_rps", rate_rps), ("scrape_s", scrape_s), ("eval_s", eval_s)):
        as_positive(name, v)
    if not 0 < wrong_rate <= 1 or not 0 <= threshold < 1:
        raise ValueError(f"need 0 < wrong_rate <= 1 and 0 <= threshold < 1, got {wrong_rate}, "
                         f"{threshold}")
    if not window_s > scrape_s:
        raise ValueError(f"window_s ({window_s}) must exceed scrape_s ({scrape_s})")
    if wrong_rate <= threshold:
        raise ValueError(f"a wrong-answer rate of {wrong_rate:g} never exceeds the threshold "
                         f"{threshold:g}: probes cannot see it")
    if min_volume < 1 or isolate_after < 1:
        raise ValueError("min_volume and isolate_after must be >= 1")
    out = ProbeDetection(rate_rps, wrong_rate, threshold, window_s, scrape_s, eval_s,
                         min_volume, isolate_after)
    out._mixture()  # raises when a window can never hold the minimum volume
    return out


def probe_cost(rate_rps: float, mean_service_s: float, servers: int) -> float:
    """The share of a node's capacity its probes take: r x mean service / servers."""
    for name, v in (("rate_rps", rate_rps), ("mean_service_s", mean_service_s),
                    ("servers", servers)):
        as_positive(name, v)
    return rate_rps * mean_service_s / servers


def wrong_before_isolation(request_rate_rps: float, wrong_rate: float,
                           delay_s: float) -> float:
    """Wrong answers a node serves before isolation takes effect: its request rate x w x
    the delay from the onset (detection plus actuation)."""
    return request_rate_rps * wrong_rate * delay_s
