"""The numbers a search can optimise, each computed the same way from one run.

Every objective is one number per replication (so a trial has a mean, a 95 %
half-width, and a paired difference against the incumbent, replication by
replication on the same seeds):

* ``<tier>.<number>``, tier one of gold, silver, bronze, all: a column of the
  run's summary (``gold.success_ratio``, ``all.p99_ms``, ``bronze.dropped`` ...):
  client-side, counted after the warm-up, as ``relakit simulate`` prints it;
* ``dropped_share``: requests dropped (shed) over requests, all tiers;
* ``seconds_over_slo``: seconds after the warm-up in metrics intervals whose
  fleet-wide server p99 is above the search's ``slo_ms``; the p99 of an
  interval is Prometheus' ``histogram_quantile(0.99, sum(rate(bucket)))`` over
  that interval's bucket increments summed over the nodes (what a latency SLO
  on the scraped metrics would count); an interval in which nothing finished
  counts as within the SLO;
* ``mode_changes``: the policy's mode changes (decisions other than hold);
* ``goodput_rps``: successful user requests per second after the warm-up.
"""

from __future__ import annotations

import numpy as np

from relakit.vocab import IN_PATH_OUTCOMES, OUTCOMES, TIERS

SUMMARY_NUMBERS = ("requests", *OUTCOMES, "success_ratio",
                   "mean_ms", "p50_ms", "p99_ms", "p999_ms", "amplification", "hedges",
                   "degraded", "wrong")
RUN_NUMBERS = ("dropped_share", "seconds_over_slo", "mode_changes", "goodput_rps")
GROUPS = (*TIERS, "all")


def check_objective(number: str, slo_ms) -> str | None:
    """None when ``number`` is an objective this module computes, else what is allowed."""
    if number in RUN_NUMBERS:
        if number == "seconds_over_slo" and slo_ms is None:
            return "seconds_over_slo counts seconds above slo_ms: give slo_ms in the file"
        return None
    tier, _, col = number.partition(".")
    if tier in GROUPS and col in SUMMARY_NUMBERS:
        return None
    return (f"{number!r} is not an objective; allowed: <tier>.<number> with tier one of "
            f"{', '.join(GROUPS)} and number one of {', '.join(SUMMARY_NUMBERS)}, or one "
            f"of {', '.join(RUN_NUMBERS)}")


def needs_policy(number: str) -> bool:
    return number == "mode_changes"


def objective_values(result, numbers, slo_ms=None, warmup_s: float = 0.0) -> dict:
    """{number: value} for one run (a :class:`relakit.sim.SimulationResult`)."""
    summary = {r["tier"]: r for r in result.summary.iter_rows(named=True)}
    out = {}
    for n in numbers:
        if n == "dropped_share":
            a = summary["all"]
            out[n] = a["dropped"] / a["requests"] if a["requests"] else float("nan")
        elif n == "seconds_over_slo":
            out[n] = seconds_over_slo(result, slo_ms, warmup_s)
        elif n == "mode_changes":
            out[n] = float(len(result.info.get("control", {}).get("mode_changes", [])))
        elif n == "goodput_rps":
            out[n] = float(result.info["goodput_rps"])
        else:
            tier, _, col = n.partition(".")
            # an in-path outcome is a column only where a run has the mechanism: 0 else
            v = summary[tier].get(col, 0 if col in IN_PATH_OUTCOMES else None)
            out[n] = float("nan") if v is None else float(v)
    return out


def seconds_over_slo(result, slo_ms: float, warmup_s: float = 0.0) -> float:
    """Seconds of metrics intervals (ending after ``warmup_s``) whose fleet-wide server
    p99 is above ``slo_ms`` (see the module docstring)."""
    from relakit.sim import kernel as K

    grid = result._metrics
    bounds = np.asarray(grid.bounds_s, dtype=float)
    nb = bounds.size + 1
    cum = grid.metrics[:, :, K.M_BUCKETS:K.M_BUCKETS + nb].astype(float)  # (samples, nodes, le)
    t = np.nanmax(grid.sample_t, axis=1)
    keep = np.isfinite(t)
    cum, t = cum[keep], t[keep]
    if t.size < 2:
        return 0.0
    inc = np.diff(np.nan_to_num(cum).sum(axis=1), axis=0)  # (intervals, le), cumulative in le
    dt = np.diff(t)
    total = inc[:, -1]
    target = 0.99 * total
    # Prometheus: the first bucket whose cumulative count reaches the rank, linear inside it
    b = np.argmax(inc >= target[:, None], axis=1)
    lower = np.concatenate([[0.0], bounds])[b]
    upper = np.concatenate([bounds, [np.inf]])[b]
    below = np.where(b > 0, np.take_along_axis(inc, np.maximum(b - 1, 0)[:, None], 1)[:, 0],
                     0.0)
    inside = np.take_along_axis(inc, b[:, None], 1)[:, 0] - below
    with np.errstate(invalid="ignore", divide="ignore"):
        frac = np.where(inside > 0, (target - below) / inside, 0.0)
        p99_s = np.where(np.isinf(upper), bounds[-1], lower + (upper - lower) * frac)
    over = (total > 0) & (p99_s * 1000.0 > slo_ms) & (t[1:] > warmup_s)
    return float(dt[over].sum())
