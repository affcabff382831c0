"""The data plane: a numba fleet kernel and the thin Python around it.

Nothing here imports the control plane or the chain: the data plane never
decides, it only applies controls it is given and counts what happens.
"""

from relakit.sim.fleet import Fleet
from relakit.sim.memory import run_memory
from relakit.sim.results import SimulationResult

__all__ = ["Fleet", "SimulationResult", "run_memory"]
