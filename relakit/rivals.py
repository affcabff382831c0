"""The in-path mechanisms against the control plane (issue 33): what deciding in the request
path costs, measured over replications beside its closed form.

:func:`decision_cost_sweep` runs a scenario with a server-side in-path mechanism at several
decision costs (a share of the mean service time each) and tabulates the saturated goodput
(mean and 95 % half-width over replications, common seeds at every cost) beside
``relakit.analytic.decision_capacity``: c / (s + cost) per node. Notebook 11 draws it.
"""

from __future__ import annotations

import copy

import polars as pl

__all__ = ["SERVER_MECHANISMS", "decision_cost_sweep"]

#: the in-path mechanisms whose decision costs server time (``cost_us``)
SERVER_MECHANISMS = ("concurrency_limit", "codel")


def decision_cost_sweep(scenario: dict, mechanism: str, shares, replications: int = 3,
                        workers: int = 1) -> pl.DataFrame:
    """Saturated goodput against the decision cost: one row per share of the mean service
    time (``cost_share``, ``cost_us``), with ``goodput_rps`` and ``goodput_rps_ci`` (after
    warm-up, over ``replications``) and ``closed_form_rps`` (the sum over nodes of
    servers / (mean + cost)). ``scenario``: a mapping with ``mitigations.<mechanism>``
    (one of :data:`SERVER_MECHANISMS`) and one service for every node; its load should
    saturate the fleet at every cost, or goodput is the offered load, not the capacity."""
    from relakit.analytic import decision_capacity
    from relakit.experiment import simulate
    from relakit.scenario import load_scenario

    if mechanism not in SERVER_MECHANISMS:
        raise ValueError(f"mechanism {mechanism!r}: a server-side in-path mechanism is one of "
                         f"{', '.join(SERVER_MECHANISMS)}")
    sc = load_scenario(scenario)
    if getattr(sc.mitigations, mechanism) is None:
        raise ValueError(f"the scenario has no mitigations.{mechanism} to cost")
    if sc.fleet.service_scale:
        raise ValueError("decision_cost_sweep: one service for every node "
                         "(fleet.service_scale unset)")
    mean_s = sc.fleet.service.mean_ms / 1000.0
    span = sc.duration_s - sc.warmup_s
    rows = []
    for share in shares:
        point = copy.deepcopy(scenario)
        cost_us = float(share) * mean_s * 1e6
        point["mitigations"][mechanism] = {**point["mitigations"][mechanism], "cost_us": cost_us}
        r = simulate(point, replications=replications, workers=workers,
                     record_requests=False)
        row = r.summary.filter(pl.col("tier") == "all").row(0, named=True)
        rows.append({"cost_share": float(share), "cost_us": cost_us,
                     "goodput_rps": row["ok"] / span, "goodput_rps_ci": row["ok_ci"] / span,
                     "closed_form_rps": sum(decision_capacity(int(c), mean_s, cost_us / 1e6)
                                            for c in sc.fleet.servers),
                     "replications": replications})
    return pl.DataFrame(rows)
