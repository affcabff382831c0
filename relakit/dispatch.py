"""``relakit.simulate``: each scenario sent to the module that runs it, and only that one
imported.

A scenario with ``rollout`` or ``overrides`` runs as cells in lock-step
(:mod:`relakit.rollout`), one with ``fleet.zones`` as one data plane per zone
(:mod:`relakit.zones`, reached through :func:`relakit.rollout.simulate`), any other
in :func:`relakit.experiment.simulate`. Why a module of its own: the rollout and zone
layers import the control plane (policy, signals, audit: ~30 ms of a fresh process
here), and a plain run, the commonest start of a test, a sweep worker or a notebook,
needs none of it. It sits above all three, so no layer imports one above it.
"""

from __future__ import annotations

from relakit.experiment import simulate as _simulate_fleet
from relakit.scenario import load_scenario, uses_rollout


def simulate(scenario, seed: int | None = None, record_requests: bool | None = None,
             progress=None, replications: int | None = None, workers: int | None = None,
             scheduler: str | None = None):
    sc = load_scenario(scenario)
    kw = {"progress": progress, "replications": replications, "workers": workers,
          "scheduler": scheduler}
    if uses_rollout(sc) or sc.fleet.zones:
        from relakit.rollout import simulate as simulate_cells

        return simulate_cells(sc, seed, record_requests, **kw)
    return _simulate_fleet(sc, seed, record_requests, **kw)


simulate.__doc__ = _simulate_fleet.__doc__ + """
    A scenario with ``rollout`` or ``overrides`` runs in :func:`relakit.rollout.simulate`,
    one with ``fleet.zones`` in :func:`relakit.zones.simulate` (this module's docstring).
    """
