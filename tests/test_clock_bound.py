"""The clock bound against the controller itself: replay over many random phases."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from relakit.analytic import min_detectable_spike, step_delay
from relakit.control import TSDB, Clocks
from relakit.openloop import replay
from relakit.traces.synthetic import synthetic_trace


def _gauge_policy(enter_after):
    return {
        "signals": {"in_flight": {"kind": "gauge", "metric": "in_flight", "over_time": "last",
                                  "across": "max"}},
        "conditions": {"busy": {"signal": "in_flight", "threshold": 5}},
        "modes": [{"name": "alarm", "when": {"any": ["busy"]}, "enter_after": enter_after,
                   "assert": {"shed_bronze": True}}],
    }


def _ratio_policy(threshold):
    return {
        "signals": {"error_ratio": {"kind": "ratio",
                                    "num": {"metric": "requests_total", "outcome": "error"},
                                    "den": {"metric": "requests_total"}}},
        "conditions": {"failing": {"signal": "error_ratio", "threshold": threshold}},
        "modes": [{"name": "alarm", "when": {"any": ["failing"]}, "enter_after": 1,
                   "assert": {"shed_bronze": True}}],
    }


def test_step_delay_matches_replay_over_random_phases():
    scrape, eval_s, poll, prop, n = 15.0, 2.0, 5.0, 1.0, 3
    rng = np.random.default_rng(7)
    step_at = 200.0
    delays = []
    for _ in range(250):
        trace = synthetic_trace("step", 300, at_s=step_at, scrape_s=scrape,
                                phase_s=float(rng.uniform(0, scrape)), rate_rps=(100, 100),
                                latency_ms=(10, 100))
        clocks = Clocks(scrape_s=scrape, window_s=30, eval_s=eval_s,
                        eval_phase_s=float(rng.uniform(0, eval_s)), poll_s=poll,
                        poll_phase_s=float(rng.uniform(0, poll)), propagation_s=prop)
        d = replay(TSDB.from_long(trace), _gauge_policy(n), clocks).decisions
        enter = d.filter(pl.col("action") == "enter")
        delays.append(enter["effective_at_s"][0] - step_at)
    delays = np.array(delays)
    dist = step_delay(scrape, eval_s, poll, prop, enter_after=n)
    assert delays.min() >= dist.min - 1e-9 and delays.max() <= dist.max + 1e-9
    assert delays.mean() == pytest.approx(dist.mean, abs=0.6)  # se of the mean ≈ 0.3 s
    for q in (0.1, 0.5, 0.9):
        assert np.quantile(delays, q) == pytest.approx(dist.quantile(q), abs=1.5)
    # and its distribution is not a constant: the phases matter
    assert delays.std() > 3


def test_a_spike_narrower_than_the_window_can_see_goes_undetected():
    window, scrape, threshold, height = 60.0, 15.0, 0.1, 0.5
    narrowest = min_detectable_spike(window, scrape, threshold / height)
    assert narrowest == pytest.approx(9.0)
    rng = np.random.default_rng(3)
    for width, seen in ((0.8 * narrowest, False), (4 * narrowest, True)):
        for _ in range(25):
            trace = synthetic_trace("spike", 300, at_s=150.0 + rng.uniform(0, 15), width_s=width,
                                    scrape_s=scrape, phase_s=float(rng.uniform(0, scrape)),
                                    error_ratio=(0.0, height))
            clocks = Clocks(scrape_s=scrape, window_s=window,
                            eval_phase_s=float(rng.uniform(0, 2)))
            d = replay(TSDB.from_long(trace), _ratio_policy(threshold), clocks).decisions
            assert (d.filter(pl.col("action") == "enter").height > 0) == seen
