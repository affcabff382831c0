"""The in-path mechanisms against the control plane (issue 33): what deciding in the request
path costs, measured over replications beside its closed form.

:func:`decision_cost_sweep` runs a scenario with a server-side in-path mechanism at several
decision costs (a share of the mean service time each) and tabulates the saturated goodput
(mean and 95 % half-width over replications, common seeds at every cost) beside
``relakit.analytic.decision_capacity``: c / (s + cost) per node.

The comparison itself: :func:`rival_variants` puts on one fleet the control plane alone
(:data:`CONTROL`), each local mechanism alone and each with the control plane;
:func:`rival_runs` runs them on the same seeds (common random numbers) and judges each run
(:func:`run_numbers`: gold success, goodput, p99, time to recover, work wasted);
:func:`rival_table` pairs every variant with the control plane alone
(:func:`relakit.comparison.comparison_table`) on all but time to recover, which is censored
and read by :func:`recovery_summary` (share recovered, Kaplan-Meier median). The control
plane beside a local mechanism runs a policy that sees its refusals
(``params/policies/rela-in-path.yaml``, or ``rela-in-path-server.yaml`` beside a
server-side one; ``rival_variants(..., in_path_policy=..., server_policy=...)``).
:func:`decision_frontier` sweeps the decision's cost against the control plane's clocks
and names the winner of each cell. Notebook 11 draws them.
"""

from __future__ import annotations

import copy

import polars as pl

from relakit.control.clocks import KEYS as CLOCK_KEYS
from relakit.metastability import (  # the one reckoning, public here too
    control_delay_s,
    warn_unsampled,
)
from relakit.vocab import ANSWERED, SERVED

__all__ = ["CONTROL", "LOCAL_MECHANISMS", "NUMBERS", "NUMBER_TITLES", "SERVER_MECHANISMS",
           "control_delay_s", "counts_span", "decision_cost_sweep", "decision_frontier",
           "km_median", "recovery_summary", "rival_runs", "rival_table", "rival_variants",
           "run_numbers", "sampled", "scaled_clocks", "wasted_copies", "with_control",
           "with_local"]

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


# ---- the comparison, answered (issue 33, part 3) --------------------------------------------
#: the local mechanisms set beside the control plane (:func:`with_local`)
LOCAL_MECHANISMS = ("client_throttle", "concurrency_limit aimd", "concurrency_limit gradient",
                    "codel + adaptive_lifo")
#: the control plane on its own: every other variant is paired against it
CONTROL = "RelA alone"
#: what each run is judged on by a paired t interval, and which way is better (+1: higher,
#: -1: lower). Time to recover is not among them: a run that never recovers has only a lower
#: bound (censored), which a mean would bias; :func:`recovery_summary` reads it
NUMBERS = {"gold_success": 1, "goodput_rps": 1, "p99_ms": -1, "wasted_share": -1}
#: the numbers in words, with units
NUMBER_TITLES = {"gold_success": "gold success (share)", "goodput_rps": "goodput (rps)",
                 "p99_ms": "p99 of ok requests (ms)", "wasted_share": "work wasted (share)"}


def with_local(scenario: dict, mechanism: str, cost_us: float = 0.0) -> dict:
    """A copy of ``scenario`` with one of :data:`LOCAL_MECHANISMS` on, its parameters
    scaled to the fleet: the SRE book's throttle (k = 2 over a 10 s window); AIMD from as
    many in flight as a node has servers, backing off on a timeout or a latency over ten
    mean service times; the gradient controller from the same start; RPC CoDel (5 ms
    target, 100 ms interval) with adaptive LIFO. ``cost_us``: the decision's cost (server
    time for the server-side ones, client latency for the throttle)."""
    from relakit.scenario import load_scenario

    if mechanism not in LOCAL_MECHANISMS:
        raise ValueError(f"mechanism {mechanism!r}: expected one of {', '.join(LOCAL_MECHANISMS)}")
    if isinstance(cost_us, bool) or not isinstance(cost_us, int | float) or not cost_us >= 0:
        raise ValueError(f"cost_us: a number of microseconds >= 0, got {cost_us!r}")
    sc = load_scenario(scenario)
    servers = int(max(sc.fleet.servers))
    out = copy.deepcopy(scenario)
    mit = out.setdefault("mitigations", {}) or {}
    out["mitigations"] = mit
    cost = {"cost_us": float(cost_us)}
    if mechanism == "client_throttle":
        mit["client_throttle"] = {"k": 2.0, "window_s": 10.0, **cost}
    elif mechanism == "concurrency_limit aimd":
        mit["concurrency_limit"] = {"algorithm": "aimd", "initial": servers,
                                    "latency_ms": 10.0 * sc.fleet.service.mean_ms, **cost}
    elif mechanism == "concurrency_limit gradient":
        mit["concurrency_limit"] = {"algorithm": "gradient", "initial": servers, **cost}
    else:
        mit["codel"] = {"target_ms": 5.0, "interval_ms": 100.0, **cost}
        out["fleet"] = {**out["fleet"], "queue_discipline": "adaptive_lifo"}
    return out


def with_control(scenario: dict, policy, clocks) -> dict:
    """A copy of ``scenario`` under ``policy`` (a path or mapping) through ``clocks`` (a
    mapping of relakit's clocks keys), its metrics sampled at the scrape interval (as a
    control loop requires)."""
    out = sampled(scenario, clocks["scrape_s"])
    out["policy"], out["clocks"] = copy.deepcopy(policy), dict(clocks)
    return out


def sampled(scenario: dict, interval_s: float) -> dict:
    """A copy of ``scenario`` with its metrics sampled every ``interval_s``: every variant
    of one comparison on one grid, so times read off the series compare."""
    out = copy.deepcopy(scenario)
    out["metrics"] = {**(out.get("metrics") or {}), "interval_s": float(interval_s)}
    return out


def rival_variants(base: dict, policy, clocks, mechanisms=LOCAL_MECHANISMS,
                   in_path_policy=None, server_policy=None) -> dict[str, dict]:
    """The rivals on one fleet: :data:`CONTROL` (``base`` under ``policy`` through
    ``clocks``), each of ``mechanisms`` alone (``<m> alone``: no control plane, the
    fleet's flags as ``base`` sets them) and with the control plane (``<m> + RelA``),
    every one's metrics sampled at the clocks' scrape interval. ``in_path_policy``: the
    policy the ``+ RelA`` variants run (default ``policy``): one whose signals see the
    in-path mechanisms' refusals (``params/policies/rela-in-path.yaml``), as an operator
    running both would ship; ``policy`` itself is for the fleet without them.
    ``server_policy``: the policy of the ``+ RelA`` variants whose mechanism is at the
    servers (all but ``client_throttle``; default ``in_path_policy``): one without a signal
    on the clients' throttle, which no server-side mechanism moves and the checks refuse
    (``params/policies/rela-in-path-server.yaml``). ``base`` must have neither a policy
    nor clocks of its own (so no variant has one it was not given)."""
    for key in ("policy", "clocks"):
        if base.get(key) is not None:
            raise ValueError(f"base scenario: key {key!r} must be unset (the variants add it)")
    hybrid = policy if in_path_policy is None else in_path_policy
    server = hybrid if server_policy is None else server_policy
    out = {CONTROL: with_control(base, policy, clocks)}
    for m in mechanisms:
        out[f"{m} alone"] = sampled(with_local(base, m), clocks["scrape_s"])
        out[f"{m} + RelA"] = with_control(with_local(base, m),
                                          hybrid if m == "client_throttle" else server, clocks)
    return out


def counts_span(result) -> tuple[dict[int, float], float]:
    """When :func:`wasted_copies` reads each side: per node, the time of its last sample
    at or before the last time the clients and every node were all sampled; and the
    clients' read time, at or before every node's (a copy is served no later than its
    request is answered, so the servers are never read earlier than the clients). On
    relakit's default grid (no scrape phases) all are one time."""
    m = result.metrics
    common = float(m.group_by("node").agg(pl.col("time_s").max())["time_s"].min())
    reads = (m.filter(pl.col("time_s") <= common).group_by("node")
             .agg(pl.col("time_s").max()))
    nodes = {int(n): float(t) for n, t in reads.select("node", "time_s").iter_rows() if n >= 0}
    clients = m.filter((pl.col("node") < 0) & (pl.col("time_s") <= min(nodes.values())))
    return nodes, float(clients["time_s"].max())


def wasted_copies(result) -> tuple[float, float]:
    """(copies served, copies that answered no client), both read over one span
    (:func:`counts_span`). Copies served: the servers' own ``requests_total`` (ok, error,
    timeout: a copy finished after its client gave up counts as timeout) at each node's
    read time. Copies that answered a client: with the run's per-request records, the
    ``fanout`` of every request that ended ok or error by the clients' read time (degraded
    requests have fewer); without records, the requests the clients counted as ended ok or
    error (``client_requests_total``) by then, which needs the run's ``workload.fanout``
    1 (above 1 without records is refused)."""
    fanout = result.info.get("fanout", 1)
    if result.info.get("warmup_s", 0.0):
        raise ValueError("wasted_copies: a scenario with warmup_s 0 (work is counted from "
                         "the run's start)")
    nodes, t_client = counts_span(result)
    m = result.metrics
    at = pl.DataFrame({"node": list(nodes), "time_s": list(nodes.values())},
                      schema={"node": m.schema["node"], "time_s": m.schema["time_s"]})
    served = float(m.filter((pl.col("name") == "requests_total")
                            & pl.col("outcome").is_in(ANSWERED))
                   .join(at, on=["node", "time_s"])["value"].sum())
    ended = pl.col("outcome").is_in(SERVED)  # ok or error: a copy answered its client
    if result.requests is not None:
        r = result.requests
        answered = float(r.filter(ended & (pl.col("arrival_s") + pl.col("latency_ms") / 1000.0
                                           <= t_client))["fanout"].sum())
    elif fanout == 1:
        answered = float(m.filter((pl.col("node") < 0) & (pl.col("time_s") == t_client)
                                  & (pl.col("name") == "client_requests_total") & ended)
                         ["value"].sum())
    else:
        raise ValueError(f"wasted_copies: work wasted at fan-out {fanout} counts each request's "
                         "copies from its records: run with record_requests=True")
    return served, served - answered


def run_numbers(result, end_s: float, level: float = 0.02, hold_s: float = 10.0) -> dict:
    """One run judged on :data:`NUMBERS`:

    * ``gold_success``: gold's ok share, after warm-up;
    * ``goodput_rps``: ok requests per second after warm-up;
    * ``p99_ms``: the 99th percentile of ok requests' latency (ms);
    * ``recovery_s``: seconds from ``end_s`` (the trigger's end) until the share of
      requests that did not end ok stays at or below ``level`` for ``hold_s``
      (:func:`relakit.metastability.recovery_time` on :meth:`fleet_series`); a run that
      never does is censored: ``recovered`` 0 and ``recovery_s`` the time left in it (a
      lower bound; :func:`recovery_summary` reads them as censored times, never a mean);
    * ``wasted_share``: copies the servers served that answered no client (served after
      their client gave up, after another copy had answered, or a failed attempt retried)
      over all copies served, both read over one span (:func:`wasted_copies`: at the run's
      fan-out above 1 it needs its records);
    * ``followed_s``: how long the run was watched after ``end_s`` (a censored run's
      ``recovery_s``);
    * ``shed_share``: the share of requests shed (``dropped``: the control plane's
      ``shed_bronze``), after warm-up;
    * ``mode_entries``: how often the control plane entered a mode (its audit's ``enter``
      and ``preempt`` rows; 0 without one): whether it acted at all.
    """
    from relakit.metastability import recovery_time

    info = result.info
    served, wasted = wasted_copies(result)  # first: it refuses a run with a warm-up
    summary = result.summary
    every = summary.filter(pl.col("tier") == "all").row(0, named=True)
    gold = summary.filter(pl.col("tier") == "gold").row(0, named=True)
    series = result.fleet_series()
    t = series["time_s"].to_numpy()
    failing = 1.0 - series["success_ratio"].fill_null(1.0).to_numpy()
    rec = recovery_time(t, failing, end_s, level, hold_s)
    entries = (0 if result.decisions is None else
               result.decisions.filter(pl.col("action").is_in(["enter", "preempt"])).height)
    return {"gold_success": gold["success_ratio"],
            "goodput_rps": every["ok"] / (info["duration_s"] - info["warmup_s"]),
            "p99_ms": every["p99_ms"],
            "recovery_s": float(t[-1] - end_s) if rec != rec else rec,
            "recovered": float(rec == rec),
            "followed_s": float(t[-1] - end_s),  # how long after end_s the run was watched
            "wasted_share": wasted / served if served else 0.0,
            "shed_share": every["dropped"] / every["requests"] if every["requests"] else 0.0,
            "mode_entries": float(entries)}


def recovery_summary(runs: pl.DataFrame, by: str = "variant", within_s: float | None = None,
                     confidence: float = 0.95) -> pl.DataFrame:
    """Time to recover read as what it is, a censored time (a run that never recovered
    has only a lower bound): per ``by`` group of :func:`rival_runs` rows, ``recovered``
    of ``runs``; ``km_median_s``, the Kaplan-Meier median (null while fewer than half
    recovered: the median is then beyond the run); and the share recovered within
    ``within_s`` (default: the shortest time any run of the table was watched after its
    trigger, ``followed_s`` of :func:`run_numbers`, so every run is observed that long)
    with its Clopper-Pearson interval (``share_low``, ``share_high``)."""
    from relakit.stats import binomial_interval

    if within_s is not None:
        horizon = float(within_s)
        watched = runs["followed_s"].min() if "followed_s" in runs.columns else None
        if watched is not None and horizon > watched:
            raise ValueError(f"within_s: {horizon:g} s is longer than the shortest follow-up "
                             f"({watched:g} s): a run not watched that long would count as "
                             "not recovered")
    elif "followed_s" in runs.columns:  # every run watched at least this long
        horizon = float(runs["followed_s"].min())
    else:  # a censored run was watched for its recovery_s; an observed one at least that long
        censored = runs.filter(pl.col("recovered") == 0)["recovery_s"]
        horizon = float(censored.min() if censored.len() else runs["recovery_s"].max())
    rows = []
    for key in runs[by].unique(maintain_order=True).to_list():
        g = runs.filter(pl.col(by) == key)
        t, done = g["recovery_s"].to_numpy(), g["recovered"].to_numpy() > 0.5
        k = int((done & (t <= horizon)).sum())
        iv = binomial_interval(k, g.height, confidence)
        rows.append({by: key, "runs": g.height, "recovered": int(done.sum()),
                     "km_median_s": km_median(t, done), "within_s": horizon,
                     "share_within": iv.mean, "share_low": iv.low, "share_high": iv.high})
    return pl.DataFrame(rows, schema_overrides={"km_median_s": pl.Float64})


def km_median(times, events) -> float | None:
    """The Kaplan-Meier median of right-censored times (``events`` true: observed, false:
    censored at that time): the first event time at which the survival estimate falls to
    0.5 or below; None when it never does (fewer than half observed to end)."""
    import numpy as np

    t, e = np.asarray(times, dtype=float), np.asarray(events, dtype=bool)
    if t.shape != e.shape or t.size == 0:
        raise ValueError("km_median: times and events, one of each per run, at least one run")
    surv = 1.0
    for u in np.unique(t[e]):
        at_risk = int((t >= u).sum())
        surv *= 1.0 - int(((t == u) & e).sum()) / at_risk
        if surv <= 0.5:
            return float(u)
    return None


def _variant_runs(sc_dict: dict, seeds: list[int], end_s: float, level: float,
                  hold_s: float) -> list[dict]:
    """One variant's task: :func:`run_numbers` of each seed's run."""
    import os
    import warnings

    from relakit.checks import RelakitWarning
    from relakit.experiment import run_once
    from relakit.scenario import load_scenario

    os.environ.setdefault("NUMBA_NUM_THREADS", "1")
    sc = load_scenario(sc_dict)
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RelakitWarning)
        for i, s in enumerate(seeds):
            r = run_once(sc, int(s), record_requests=sc.workload.fanout > 1)
            out.append({"replication": i, "seed": int(s),
                        **run_numbers(r, end_s, level, hold_s)})
    return out


def rival_runs(variants: dict[str, dict], end_s: float, replications: int = 3,
               seed: int | None = None, level: float = 0.02, hold_s: float = 10.0,
               workers: int | None = None) -> pl.DataFrame:
    """Every variant (name -> scenario dict) run ``replications`` times on the same seeds
    (common random numbers; :func:`relakit.replications.replication_seeds` of ``seed``,
    default the first variant's), judged by :func:`run_numbers`: one row per variant and
    replication, with ``tier`` "all" (the pairing key of
    :func:`relakit.comparison.comparison_table`)."""
    from relakit.replications import replication_seeds
    from relakit.runner import run_tasks

    if not variants:
        raise ValueError("variants: need at least one")
    first = next(iter(variants.values()))
    seeds = replication_seeds(int(first.get("seed", 1) if seed is None else seed),
                              int(replications))
    names = list(variants)
    warn_unsampled(variants.values())
    parts = run_tasks([(_variant_runs, (variants[n], seeds, end_s, level, hold_s))
                       for n in names], workers=workers, adaptive=True)
    rows = [{"variant": n, "tier": "all", **r} for n, part in zip(names, parts, strict=True)
            for r in part]
    return pl.DataFrame(rows)


def rival_table(runs: pl.DataFrame, baseline: str = CONTROL) -> pl.DataFrame:
    """Every variant of :func:`rival_runs` against ``baseline``, per number of
    :data:`NUMBERS`: the baseline's and the variant's means and 95 % half-widths, the
    paired difference (variant - baseline, by replication:
    :func:`relakit.comparison.comparison_table`) with its half-width, ``significant``
    (the interval excludes 0) and ``verdict``: ``better``, ``worse`` (significant, in
    the number's good or bad direction) or ``not significant``."""
    from relakit.comparison import comparison_table

    if baseline not in set(runs["variant"]):
        raise ValueError(f"baseline {baseline!r}: not a variant of these runs")
    base = runs.filter(pl.col("variant") == baseline).drop("variant")
    frames = []
    for name in runs["variant"].unique(maintain_order=True).to_list():
        if name == baseline:
            continue
        t = comparison_table(base, runs.filter(pl.col("variant") == name).drop("variant"))
        frames.append(t.filter(pl.col("number").is_in(list(NUMBERS)))
                      .with_columns(pl.lit(name).alias("variant")))
    good = pl.col("number").replace_strict(NUMBERS, return_dtype=pl.Int64)
    verdict = (pl.when(pl.col("significant").fill_null(False).not_())
               .then(pl.lit("not significant"))
               .when(pl.col("difference") * good > 0).then(pl.lit("better"))
               .otherwise(pl.lit("worse")))
    return (pl.concat(frames).with_columns(verdict.alias("verdict"))
            .rename({"a": "baseline", "a_ci": "baseline_ci", "b": "value", "b_ci": "value_ci"})
            .select("variant", "number", "baseline", "baseline_ci", "value", "value_ci",
                    "difference", "difference_ci", "significant", "verdict", "pairs"))


def scaled_clocks(clocks: dict, factor: float) -> dict:
    """``clocks`` with every duration (each period, phase and delay of
    ``relakit.control.clocks.KEYS``) multiplied by ``factor``: the same control plane,
    faster or slower (a phase left unscaled could outgrow its period)."""
    if isinstance(factor, bool) or not isinstance(factor, int | float) or not factor > 0:
        raise ValueError(f"clock factor: a number > 0, got {factor!r}")
    return {k: float(v) * factor if k in CLOCK_KEYS and isinstance(v, int | float) else v
            for k, v in clocks.items()}


def decision_frontier(base: dict, policy: dict, clocks: dict, mechanism: str, cost_shares,
                      clock_factors, end_s: float, number: str = "gold_success",
                      replications: int = 3, seed: int | None = None, level: float = 0.02,
                      hold_s: float = 10.0, workers: int | None = None) -> pl.DataFrame:
    """Where each wins: ``mechanism`` deciding in the path at each decision cost (a share
    of the mean service time, :data:`SERVER_MECHANISMS`' ``cost_us``) against ``policy``
    deciding in a control plane through ``clocks`` scaled by each of ``clock_factors``
    (:func:`scaled_clocks`), on ``base`` with the same seeds. One row per (cost, clocks):
    both sides' ``number`` (one of :data:`NUMBERS`) with half-widths, the paired
    difference in path - control plane (:func:`relakit.stats.paired_difference`),
    ``significant`` and ``winner``: ``in the path``, ``in a control plane`` (significant,
    better on ``number``) or ``neither``; ``delay_s``: :func:`control_delay_s`. The
    clocks as given (factor 1) are always among the rows, ``own_clocks`` true: where the
    shipped configuration sits on the frontier."""
    from relakit.scenario import load_scenario
    from relakit.stats import paired_difference, t_interval

    if number not in NUMBERS:
        raise ValueError(f"number {number!r}: one of {', '.join(NUMBERS)}")
    if mechanism not in LOCAL_MECHANISMS or mechanism == "client_throttle":
        raise ValueError(f"mechanism {mechanism!r}: a server-side one of "
                         f"{', '.join(m for m in LOCAL_MECHANISMS if m != 'client_throttle')}")
    mean_us = load_scenario(base).fleet.service.mean_ms * 1000.0
    shares = [float(s) for s in cost_shares]
    # the control plane's own clocks (factor 1) always a row: where today's configuration sits
    factors = sorted({float(f) for f in clock_factors} | {1.0})
    variants = {f"path {s}": sampled(with_local(base, mechanism, s * mean_us),
                                     clocks["scrape_s"]) for s in shares}
    ladder = {f: scaled_clocks(clocks, f) for f in factors}
    variants |= {f"control {f}": with_control(base, policy, ladder[f]) for f in factors}
    runs = rival_runs(variants, end_s, replications, seed, level, hold_s, workers)

    def values(name):
        return runs.filter(pl.col("variant") == name).sort("replication")[number].to_numpy()

    rows = []
    for s in shares:
        a = values(f"path {s}")
        for f in factors:
            b = values(f"control {f}")
            d = paired_difference(a, b)
            ia, ib = t_interval(a), t_interval(b)
            iv = d.interval
            win = ("neither" if not d.significant else
                   "in the path" if iv.mean * NUMBERS[number] > 0 else "in a control plane")
            rows.append({"cost_share": s, "cost_us": s * mean_us, "clock_factor": f,
                         "delay_s": control_delay_s(policy, ladder[f]),
                         "scrape_s": ladder[f]["scrape_s"], "eval_s": ladder[f]["eval_s"],
                         "in_path": ia.mean, "in_path_ci": ia.half_width,
                         "control_plane": ib.mean, "control_plane_ci": ib.half_width,
                         "difference": iv.mean, "difference_ci": iv.half_width,
                         "significant": bool(d.significant), "winner": win,
                         "own_clocks": f == 1.0, "replications": int(a.size)})
    return pl.DataFrame(rows)
