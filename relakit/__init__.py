"""relakit: a research workbench for reliability control loops.

The flat ``__all__`` below is the documented API; the subpackages
(``relakit.analytic``, ``relakit.control``, ``relakit.chain``, ``relakit.traces``,
``relakit.plots``, ``relakit.lab``) hold the rest.
"""

__version__ = "0.1.0"

from relakit.control.controller import replay  # noqa: E402
from relakit.experiment import simulate  # noqa: E402
from relakit.scenario import Scenario, ScenarioError, load_scenario  # noqa: E402
from relakit.sim import Fleet, SimulationResult  # noqa: E402
from relakit.sweep import load_sweep, run_sweep  # noqa: E402

__all__ = [
    "Fleet",
    "Scenario",
    "ScenarioError",
    "SimulationResult",
    "load_scenario",
    "load_sweep",
    "replay",
    "run_sweep",
    "simulate",
]
