"""What a closed population's step costs: ``kernel.population_step`` for a big step up.

Run with ``python benchmarks/bench_population_step.py [--to N] [--rounds R]``. A fleet of
8 nodes x 4 servers (10 ms exponential work) with a population schedule of 10 clients
from 0 s and ``--to`` (5,000 by default) from 5 s, 1 s exponential think: the fleet is
advanced to the step, then the step alone is timed (CPU seconds of
``kernel.population_step``: the ids started, their think times drawn, their sends put
on the heap), then the run to 10 s. Rounds each build a fresh fleet (the first round
compiles; its times are dropped); printed per round with the load average, then the
median and the best. A benchmark, not a test: nothing here asserts a speed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from relakit.scenario import load_scenario  # noqa: E402
from relakit.sim import kernel as K  # noqa: E402
from relakit.sim.fleet import Fleet  # noqa: E402

STEP_S, END_S = 5.0, 10.0


def scenario(to: int) -> dict:
    return {"name": "population-step", "seed": 3, "duration_s": END_S, "warmup_s": 0.0,
            "fleet": {"nodes": 8, "servers": 4,
                      "service": {"kind": "exponential", "mean_ms": 10.0}},
            "workload": {"tiers": {"gold": 0.2, "silver": 0.3, "bronze": 0.5},
                         "clients": {"population": [[0, 10], [STEP_S, to]],
                                     "think": {"kind": "exponential", "mean_ms": 1000}}}}


def one_round(to: int) -> tuple[float, float]:
    """(CPU s of the step alone, CPU s of the run after it)."""
    fleet = Fleet(load_scenario(scenario(to)))
    step = {}
    real = K.population_step

    def timed(cfg, st, t, live):
        c0 = time.process_time()
        real(cfg, st, t, live)
        step["s"] = step.get("s", 0.0) + time.process_time() - c0

    K.population_step = timed  # Fleet.advance looks it up at each step
    try:
        fleet.advance(STEP_S)  # runs the step at STEP_S (Fleet.advance: steps at <= t)
        before = step.get("s", 0.0)
        c0 = time.process_time()
        fleet.advance(END_S)
        after = time.process_time() - c0 - (step.get("s", 0.0) - before)  # a step it ran
    finally:
        K.population_step = real
    return step["s"], after


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--to", type=int, default=5000, help="the population after the step")
    ap.add_argument("--rounds", type=int, default=7)
    a = ap.parse_args()
    steps, runs = [], []
    for r in range(a.rounds + 1):
        s, after = one_round(a.to)
        load = os.getloadavg()[0]
        print(f"round {r}{' (compiles, dropped)' if r == 0 else ''}: step {s * 1e3:8.2f} ms CPU,"
              f" run after it {after:6.3f} s CPU, load {load:.2f}")
        if r:
            steps.append(s)
            runs.append(after)
    print(f"population_step 10 -> {a.to}: median {statistics.median(steps) * 1e3:.2f} ms CPU, "
          f"best {min(steps) * 1e3:.2f} ms; the run after it: median "
          f"{statistics.median(runs):.3f} s CPU")


if __name__ == "__main__":
    main()
