"""relakit: a research workbench for reliability control loops.

The flat ``__all__`` below is the documented API.
"""

__version__ = "0.1.0"

from relakit.experiment import simulate  # noqa: E402
from relakit.scenario import Scenario, ScenarioError, load_scenario  # noqa: E402
from relakit.sim import Fleet, SimulationResult  # noqa: E402

__all__ = [
    "Fleet",
    "Scenario",
    "ScenarioError",
    "SimulationResult",
    "load_scenario",
    "simulate",
]
