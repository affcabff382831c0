"""Metastability mapped by simulation: which triggers a node or fleet recovers from, how fast.

A **trigger** is applied to a base scenario that is otherwise steady: a ``spike`` of the
arrival rate to ``size`` times the base rate for ``duration_s``, or a ``slowdown`` of every
node's service by ``size`` for ``duration_s`` (the scenario language's fault of that name),
each from ``start_s``; or a ``start`` state: the run begins with ``size`` requests at every
node (``initial: {queue: size}``; more than a node holds is refused) and ``duration_s``
pending retries (``initial.pending_retries``), and its trigger "ends" at t = 0 (``start_s``
is then ignored).

**Recovered** (the definition every number here uses): after the trigger ends, the jobs
in system (all nodes, queued and in service, abandoned copies included:
:meth:`relakit.sim.SimulationResult.jobs_in_system`) stay at or below ``level`` at every
metrics sample for ``hold_s`` seconds. The **recovery time** is the start of the first
such stretch minus the trigger's end (0 when the node never left the level); a run
recovered **within T** has a recovery time <= T (each run lasts trigger end + T +
``hold_s``, so that is always decided). A stretch that merely dips below the level
between two samples of congestion is not recovery: the hold asks for ``hold_s`` of calm.

Replications use :func:`relakit.replications.replication_seeds`; every cell of a map uses
the **same seeds** (common random numbers: each kind of randomness has its own stream, so
cell A's replication i sees the arrivals cell B's replication i sees, up to the trigger).
Cells run on :func:`relakit.runner.run_tasks` (local processes or Dask), one task per cell.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass

import numpy as np
import polars as pl

__all__ = ["TRIGGERS", "BasinMap", "Recovery", "base_scenario", "basin_map", "control_delay_s",
           "control_frontier", "ctmc_recovery_map", "first_passage_runs", "recovery_time",
           "check_runs", "with_trigger"]

TRIGGERS = ("spike", "slowdown", "start")


@dataclass(frozen=True)
class Recovery:
    """What counts as recovered (module docstring): jobs in system <= ``level`` for
    ``hold_s`` seconds, within ``within_s`` of the trigger's end."""

    level: float
    hold_s: float = 10.0
    within_s: float = 600.0

    def __post_init__(self):
        for name in ("level", "hold_s", "within_s"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not v >= 0 \
                    or not math.isfinite(v):
                raise ValueError(f"recovery: {name} must be a finite number >= 0, got {v!r}")


def base_scenario(path) -> dict:
    """A scenario file as the dict the functions here vary (checked once by loading it)."""
    from relakit.scenario import load_scenario
    from relakit.validate import load_yaml

    load_scenario(path)
    return load_yaml(path, "scenario")[0]


def check_runs(scenarios) -> None:
    """The workers of a map or of :func:`relakit.rivals.rival_runs` run with the semantic
    checks off (:func:`relakit.runner.run_once` expects a checked scenario), so every
    check a ``simulate`` would make is made here, once per scenario dict given, before they
    start: errors refuse the whole run by file and key, warnings (a run whose length is not
    a multiple of its scrape: :func:`relakit.checks.check_sampled`) are said once."""
    from relakit.checks import check_scenario, enforce
    from relakit.scenario import load_scenario

    enforce([f for sc in scenarios for f in check_scenario(load_scenario(sc))])


def with_trigger(base: dict, kind: str, size: float, duration_s: float, start_s: float,
                 run_s: float) -> dict:
    """``base`` (a scenario dict with a Poisson arrival) with a trigger and run length."""
    if kind not in TRIGGERS:
        raise ValueError(f"trigger: expected one of {', '.join(TRIGGERS)}, got {kind!r}")
    for name, v in (("size", size), ("duration_s", duration_s), ("start_s", start_s)):
        if isinstance(v, bool) or not isinstance(v, int | float) or not v >= 0:
            raise ValueError(f"trigger: {name} must be a number >= 0, got {v!r}")
    sc = copy.deepcopy(base)
    sc["duration_s"] = float(run_s)
    if kind == "start":  # size requests per node, duration_s pending retries, at t = 0
        if size != int(size) or duration_s != int(duration_s):
            raise ValueError(f"trigger: a start state's size (requests per node) and "
                             f"duration_s (pending retries) are whole numbers, got {size!r}, "
                             f"{duration_s!r}")
        sc["initial"] = {"queue": int(size), "pending_retries": int(duration_s)}
        return sc
    arrival = sc["workload"]["arrival"]
    if arrival.get("kind") != "poisson":
        raise ValueError(f"base scenario: key 'workload.arrival.kind' must be poisson for a "
                         f"trigger to be applied to it, got {arrival.get('kind')!r}")
    if duration_s > 0 and size != 1.0:
        if kind == "spike":
            rate = float(arrival["rate_rps"])
            sc["workload"]["arrival"] = {"kind": "spike", "rate_rps": rate,
                                         "peak_rps": rate * size, "start_s": start_s,
                                         "width_s": duration_s}
        else:
            if size < 1:
                raise ValueError(f"trigger: a slowdown's size is a factor >= 1, got {size!r}")
            sc["faults"] = list(sc.get("faults") or []) + [
                {"node": i, "start_s": start_s, "end_s": start_s + duration_s,
                 "slowdown": float(size)} for i in range(int(sc["fleet"]["nodes"]))]
    return sc


def recovery_time(t: np.ndarray, jobs: np.ndarray, end_s: float, level: float,
                  hold_s: float) -> float:
    """Seconds from ``end_s`` to the first sample that starts ``hold_s`` of samples all at
    or below ``level``; ``nan`` if none does within the samples."""
    keep = t >= end_s - 1e-9
    t, calm = t[keep], jobs[keep] <= level
    if not t.size:
        return math.nan
    # a stretch starting at s holds if no sample in [s, s + hold] is above: the first
    # sample above after s is later than s + hold
    nxt = np.where(~calm, t, np.inf)
    next_above = np.minimum.accumulate(nxt[::-1])[::-1]
    ok = calm & (next_above > t + hold_s) & (t + hold_s <= t[-1] + 1e-9)
    idx = np.flatnonzero(ok)
    return math.nan if not idx.size else float(t[idx[0]] - end_s)


def _run(sc_dict: dict, seeds: list[int]) -> list:
    """Each seed's run of one scenario: (time_s, jobs) per run, records off."""
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
        for s in seeds:
            out.append(run_once(sc, int(s), record_requests=False).jobs_in_system())
    return out


def _cell(sc_dict: dict, seeds: list[int], end_s: float, level: float,
          hold_s: float) -> np.ndarray:
    """One cell's task: the recovery time of each replication (nan: not recovered)."""
    return np.array([recovery_time(t, j, end_s, level, hold_s)
                     for t, j in _run(sc_dict, seeds)])


@dataclass
class BasinMap:
    """A grid of triggers and what the replications did.

    * ``cells``: one row per (size, duration_s): ``recovered`` of ``replications``,
      ``p_recover`` with its Clopper-Pearson 95 % interval ``p_low``/``p_high``
      (:func:`relakit.stats.binomial_interval`), and the recovery time over the recovered
      replications: mean with its Student t half-width (``recovery_mean_s_ci``), median
      and 90 % quantile (s; null if none recovered);
    * ``runs``: one row per cell and replication: ``recovery_s`` (null: not within T);
    * ``info``: the trigger kind, the recovery definition, seeds, wall and CPU seconds.
    """

    cells: pl.DataFrame
    runs: pl.DataFrame
    info: dict


def basin_map(base: dict, kind: str, sizes, durations_s, recovery: Recovery,
              replications: int = 10, seed: int | None = None, start_s: float = 60.0,
              workers: int | None = None, scheduler: str | None = None) -> BasinMap:
    """Run ``base`` with every trigger of the grid ``sizes`` x ``durations_s``,
    ``replications`` times each with the same seeds (module docstring)."""
    from relakit.replications import replication_seeds
    from relakit.runner import run_tasks
    from relakit.stats import binomial_interval, t_interval

    if not isinstance(recovery, Recovery):
        raise ValueError(f"recovery: expected a relakit.metastability.Recovery, got "
                         f"{type(recovery).__name__}")
    sizes = [float(s) for s in sizes]
    durations = [float(d) for d in durations_s]
    if not sizes or not durations:
        raise ValueError("sizes and durations_s: need at least one value each")
    seeds = replication_seeds(int(base.get("seed", 1) if seed is None else seed),
                              int(replications))
    grid = [(s, d) for d in durations for s in sizes]
    tasks = []
    for s, d in grid:
        end_s = 0.0 if kind == "start" else start_s + d  # (a start state ends at 0)
        run_s = end_s + recovery.within_s + recovery.hold_s
        sc = with_trigger(base, kind, s, d, start_s, run_s)
        tasks.append((_cell, (sc, seeds, end_s, recovery.level, recovery.hold_s)))
    check_runs({run[1][0]["duration_s"]: run[1][0] for run in tasks}.values())
    wall, cpu = time.perf_counter(), time.process_time()
    times = run_tasks(tasks, workers=workers, scheduler=scheduler, adaptive=True)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    rows, cells = [], []
    for (s, d), rt in zip(grid, times, strict=True):
        ok = np.isfinite(rt) & (rt <= recovery.within_s)
        ci = binomial_interval(int(ok.sum()), rt.size)
        got = rt[ok]
        cells.append({"size": s, "duration_s": d, "recovered": int(ok.sum()),
                      "replications": int(rt.size), "p_recover": ci.mean, "p_low": ci.low,
                      "p_high": ci.high,
                      "recovery_mean_s": float(got.mean()) if got.size else None,
                      "recovery_mean_s_ci": t_interval(got).half_width if got.size > 1 else None,
                      "recovery_p50_s": float(np.median(got)) if got.size else None,
                      "recovery_p90_s": float(np.quantile(got, 0.9)) if got.size else None})
        for i, v in enumerate(rt):
            rows.append({"size": s, "duration_s": d, "replication": i, "seed": seeds[i],
                         "recovery_s": float(v) if ok[i] else None})
    info = {"kind": kind, "start_s": start_s, "level": recovery.level,
            "hold_s": recovery.hold_s, "within_s": recovery.within_s,
            "replications": int(replications), "seeds": seeds, "wall_s": round(wall, 3),
            "cpu_s_this_process": round(cpu, 3), "cells": len(grid)}
    return BasinMap(pl.DataFrame(cells), pl.DataFrame(rows), info)


def control_delay_s(policy: dict, clocks: dict) -> float:
    """The control plane's mean delay from a step to its actuation through ``clocks``
    (:func:`relakit.analytic.step_delay`, the policy's first mode's ``enter_after``, the
    signal's lead taken as half a window). :func:`control_frontier` reckons its ``delay_s``
    with it, and :mod:`relakit.rivals` (its frontier) offers it under the same name."""
    from relakit.analytic import step_delay

    enter = int(policy["modes"][0].get("enter_after", 1))
    return step_delay(clocks["scrape_s"], clocks["eval_s"], clocks["poll_s"],
                      clocks.get("propagation_s", 0.0), enter,
                      lead_s=clocks["window_s"] / 2).mean


def control_frontier(base: dict, policy: dict, ladder: list[dict], sizes, duration_s: float,
                     recovery: Recovery, replications: int = 10, seed: int | None = None,
                     start_s: float = 60.0, workers: int | None = None) -> pl.DataFrame:
    """How late may the control plane be: ``base`` under ``policy`` with each ``clocks``
    of ``ladder`` (scrape, window, evaluation and poll periods; ``enter_after``, when a
    rung gives it, replaces the first mode's hysteresis count), spiked to each of
    ``sizes`` for ``duration_s``; per (clocks, size) the share that recovered with its
    Clopper-Pearson interval (:func:`basin_map`'s cells, same seeds everywhere) and the
    clock bound's mean delay (:func:`control_delay_s`, the one reckoning:
    ``enter_after`` of the policy's first mode, the signal's lead half a window) as ``delay_s``.
    Metrics are sampled at the scrape interval, as the control loop requires."""
    frames = []
    for rung in ladder:
        clocks = {k: v for k, v in rung.items() if k != "enter_after"}
        sc = copy.deepcopy(base)
        sc["policy"], sc["clocks"] = copy.deepcopy(policy), clocks
        if "enter_after" in rung:  # the hysteresis count is a rung of the ladder too
            sc["policy"]["modes"][0]["enter_after"] = int(rung["enter_after"])
        enter = int(sc["policy"]["modes"][0].get("enter_after", 1))
        sc["metrics"] = dict(sc.get("metrics") or {}, interval_s=clocks["scrape_s"])
        cells = basin_map(sc, "spike", sizes, [duration_s], recovery, replications, seed,
                          start_s, workers).cells
        delay = control_delay_s(sc["policy"], clocks)
        frames.append(cells.with_columns(pl.lit(delay).alias("delay_s"),
                                         pl.lit(clocks["scrape_s"]).alias("scrape_s"),
                                         pl.lit(clocks["window_s"]).alias("window_s"),
                                         pl.lit(enter).alias("enter_after")))
    return pl.concat(frames)


def first_passage_runs(base: dict, level: float, replications: int, seed: int | None = None,
                       workers: int | None = None, warmup_s: float = 0.0) -> pl.DataFrame:
    """Per replication of ``base`` (started empty): the first sample time at which the
    jobs in system reach ``level`` (null: not within the run, i.e. censored at its
    ``duration_s``), and the time-average jobs in system over the samples after
    ``warmup_s``."""
    from relakit.replications import replication_seeds
    from relakit.runner import run_tasks

    seeds = replication_seeds(int(base.get("seed", 1) if seed is None else seed),
                              int(replications))
    check_runs([base])
    chunks = [seeds[i::max(1, workers or 2)] for i in range(max(1, workers or 2))]
    chunks = [c for c in chunks if c]
    parts = run_tasks([(_run, (base, c)) for c in chunks], workers=workers, adaptive=True)
    rows = []
    for c, runs in zip(chunks, parts, strict=True):
        for s, (t, j) in zip(c, runs, strict=True):
            hit = np.flatnonzero(j >= level)
            after = t >= warmup_s
            rows.append({"seed": s, "first_passage_s": float(t[hit[0]]) if hit.size else None,
                         "mean_jobs": float(j[after].mean())})
    return pl.DataFrame(rows).sort("seed")


def ctmc_recovery_map(ctmc_args: dict, kind: str, sizes, durations_s, recovery: Recovery,
                      start_s: float, collapsed_level: float) -> pl.DataFrame:
    """The CTMC's answer to the map (for the one-node base the CTMC describes):
    ``p_recover`` per (size, duration_s).

    The chain starts empty, runs ``start_s`` at the base rates, then ``duration_s`` with
    the trigger's rates (arrivals x size, or service / size): :func:`_evolve`. From
    there, the share that recovers is the committor: the probability of reaching
    ``jobs <= level`` before ``jobs >= collapsed_level`` (one sparse solve). That stands for
    "recovered within T" when T is long against a recovery from the good side and short
    against an escape from collapse (both are checked: ``info``-free, the caller compares
    with :meth:`relakit.analytic.RetryCTMC.first_passage`); the hold is not modelled.

    The retries' acceptance (``retry_acceptance``, how many doomed retries have attempts
    left: relakit/analytic/retry_ctmc.py, "Attempts left") is the base node's stationary
    fixed point unless ``ctmc_args`` gives one: the committor weighs the collapse, where a
    full node drops retries and the base chain's stationary mass sits (a recovering node
    drops none, and there any value is exact enough: the share only acts on doomed
    retries); 1 would undercount the collapse's retries (its mean jobs 0.11 low on
    Metafor's node). The value used is the ``retry_acceptance`` column. Its stationary
    solve does not warn about mass at ``retry_limit``: the map's chains carry that
    truncation whatever the acceptance, and their answer is the committor, not the
    stationary law."""
    from scipy.sparse.linalg import spsolve

    from relakit.analytic import retry_ctmc, retry_generator

    if ctmc_args.get("model") == "jobs_work":
        raise ValueError("model: 'jobs_work' has instantaneous states that uniformisation "
                         "cannot evolve; give model: count or workload for the CTMC map")
    if ctmc_args.get("retry_acceptance") is None:
        import warnings

        from relakit.analytic import RetryCTMCWarning

        with warnings.catch_warnings():  # the truncation's stationary mass is not the map's
            warnings.simplefilter("ignore", RetryCTMCWarning)  # answer (the committor is)
            accept = retry_ctmc(**ctmc_args).params["retry_acceptance"]
        ctmc_args = ctmc_args | {"retry_acceptance": accept}
    base_q, jobs, _r, _d, params = retry_generator(**ctmc_args)
    p0 = np.zeros(jobs.size)
    p0[0] = 1.0
    p0 = _evolve(base_q, p0, start_s)
    low, high = jobs <= recovery.level, jobs >= collapsed_level
    inner = np.flatnonzero(~(low | high))
    qi = base_q[inner][:, inner].tocsc()
    rhs = -np.asarray(base_q[inner][:, np.flatnonzero(low)].sum(axis=1)).ravel()
    commit = low.astype(float)
    commit[inner] = spsolve(qi, rhs)
    rows = []
    if kind == "start":  # the chain started in (size, duration_s): the committor there
        if params["model"] != "count":  # (a workload state is a level, not a job count)
            raise ValueError("trigger start: the CTMC map indexes states by (jobs, retries), "
                             "the count model's; give model: count")
        rl = params["retry_limit"]
        for d in durations_s:
            for s in sizes:
                if not (0 <= s <= params["capacity"] and 0 <= d <= rl):
                    raise ValueError(f"trigger: a start state of {s} jobs and {d} pending "
                                     f"retries is outside the chain ({params['capacity']} "
                                     f"jobs, {rl} retries)")
                i = int(s) * (rl + 1) + int(d)
                rows.append({"size": float(s), "duration_s": float(d),
                             "p_recover": float(np.clip(commit[i], 0, 1)),
                             "retry_acceptance": params["retry_acceptance"]})
        return pl.DataFrame(rows)
    for s in sizes:
        args = dict(ctmc_args)
        if kind == "spike":
            args["arrival_rate"] = params["arrival_rate"] * s
        elif kind == "slowdown":
            args["service_rate"] = params["service_rate"] / s
        else:
            raise ValueError(f"trigger: expected one of {', '.join(TRIGGERS)}, got {kind!r}")
        q = retry_generator(**args)[0]
        p, prev = p0, 0.0
        for d in sorted(float(x) for x in durations_s):
            if d > prev:
                p = _evolve(q, p, d - prev)
                prev = d
            rows.append({"size": float(s), "duration_s": d,
                         "p_recover": float(np.clip(np.clip(p, 0, None) @ commit, 0, 1)),
                         "retry_acceptance": params["retry_acceptance"]})
    return pl.DataFrame(rows)


def _evolve(q, p: np.ndarray, t: float) -> np.ndarray:
    """``p exp(Q t)`` by uniformisation: with ``L`` the largest exit rate and ``P = I + Q/L``
    (a stochastic matrix), ``p exp(Qt) = sum_k Poisson(k; L t) p P^k``, summed until the
    Poisson tail left is below 1e-12. Only positive terms, and cheaper here than scipy's
    ``expm_multiply``, whose norm estimates dominated on these chains (77 s for a 4 x 4
    map against a few seconds)."""
    from scipy.sparse import identity
    from scipy.stats import poisson

    if t <= 0:
        return p
    rate = float(-q.diagonal().min())
    pt = (identity(q.shape[0], format="csr") + q / rate).T.tocsr()
    lt = rate * t
    k_max = int(poisson.isf(1e-12, lt)) + 1
    w = poisson.pmf(np.arange(k_max + 1), lt)
    out = w[0] * p
    v = p
    for k in range(1, k_max + 1):
        v = pt @ v
        out += w[k] * v
    return out
