"""Scenario → run → results: the one layer that wires the pieces together.

Today a run is open loop (the scenario's static controls); the control plane
will be attached here, driving :class:`~relakit.sim.Fleet` through its
stepping interface, without the kernel or the controller knowing each other.
"""

from __future__ import annotations

import time

from relakit.scenario import Scenario, load_scenario
from relakit.sim import Fleet, SimulationResult


def simulate(scenario, seed: int | None = None, record_requests: bool = True) -> SimulationResult:
    """Run a scenario (a path, a dict or a :class:`Scenario`) end to end.

    The same scenario and seed always give identical tables. With
    ``record_requests=False`` memory stays flat however long the run.
    """
    sc: Scenario = load_scenario(scenario)
    wall = time.perf_counter()
    fleet = Fleet(sc, seed=seed, record_requests=record_requests)
    fleet.advance(sc.duration_s)
    result = fleet.result()
    result.info["wall_s"] = round(time.perf_counter() - wall, 4)
    return result
