"""relakit: a research workbench for reliability control loops.

The flat ``__all__`` below is the documented API; the subpackages
(``relakit.analytic``, ``relakit.control``, ``relakit.chain``, ``relakit.traces``,
``relakit.plots``, ``relakit.lab``) hold the rest.

The names are imported when first asked for (PEP 562), not with the package:
``import relakit.analytic`` (numpy and scipy only) must not pay for numba and
the kernel, and each layer loads only what it uses.
"""

from importlib import import_module

_LAZY = {  # public name -> the module that defines it
    "Fleet": "relakit.sim",
    "Scenario": "relakit.scenario",
    "calibrate": "relakit.calibration",
    "ScenarioError": "relakit.scenario",
    "SimulationResult": "relakit.sim",
    "compare": "relakit.comparison",
    "load_scenario": "relakit.scenario",
    "load_sweep": "relakit.sweep",
    "replay": "relakit.openloop",
    "run_sweep": "relakit.sweep",
    "search": "relakit.counterfactual",
    "simulate": "relakit.experiment",  # any layout: it imports the zones' and the
    # rollout's parts, and the control plane, only for a run that has them
}


def _version() -> str:
    """One source of truth, pyproject.toml, through the installed package's metadata
    (read when first asked for: importlib.metadata costs ~70 ms at import)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("relakit")
    except PackageNotFoundError:  # pragma: no cover - imported from a tree never installed
        return "unknown"


def __getattr__(name: str):
    if name == "__version__":
        globals()["__version__"] = value = _version()
        return value
    if name not in _LAZY:
        raise AttributeError(f"module 'relakit' has no attribute {name!r}")
    value = getattr(import_module(_LAZY[name]), name)
    globals()[name] = value  # once: later look-ups do not come back here
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


__all__ = sorted(_LAZY)
