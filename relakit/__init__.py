"""relakit: a research workbench for reliability control loops.

The flat ``__all__`` below is the documented API; the subpackages
(``relakit.analytic``, ``relakit.control``, ``relakit.chain``, ``relakit.traces``,
``relakit.plots``, ``relakit.lab``) hold the rest.
"""

from importlib.metadata import PackageNotFoundError, version

try:  # one source of truth: pyproject.toml, through the installed package's metadata
    __version__ = version("relakit")
except PackageNotFoundError:  # pragma: no cover - imported from a tree never installed
    __version__ = "unknown"

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
