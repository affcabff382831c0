"""Calibration: a recording in, a closed-loop-ready twin scenario out, with its validation.

``relakit.calibrate(trace)`` reads a recording in any format the importers read
(a simulation's ``metrics.parquet``, a Prometheus range query such as the live
lab's ``recorded.json``, a long CSV, text snapshots) and estimates, from its
metrics alone:

* the arrival rate over time and the tier mix (:mod:`.arrivals`);
* per node the servers and the service time, mean and kind (:mod:`.service`);
* per node the fault windows and their error rates (:mod:`.faults`);
* the flags the recorded control plane set (:mod:`.flags`), replayed into the
  twin when asked.

The result is a :class:`Calibration`: ``.scenario`` (loaded, checked),
``.yaml`` (the same scenario as commented text), ``.validation`` (the twin
against the recording, :mod:`.validation`; run on first use, since it
simulates). ``relakit calibrate`` is the command line for it.

The package is named ``calibration``, not ``calibrate``: ``relakit.calibrate`` is the
function, and a package of that name would take its place as an attribute of
``relakit`` as soon as any of its modules was imported.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import polars as pl
import yaml

from relakit.calibration.arrivals import ArrivalFit, fit_arrivals, rounded_tiers
from relakit.calibration.client import DeadlineFit, RetryFit, fit_deadline, fit_retries
from relakit.calibration.faults import FaultWindow, fit_faults
from relakit.calibration.flags import FlagSchedule, from_decisions, from_gauges, run_twin
from relakit.calibration.population import PopulationFit, fit_population, open_share
from relakit.calibration.recording import CalibrationError, Recording, increments, read_recording
from relakit.calibration.service import ServiceFit, busy_rate, fit_service
from relakit.calibration.validation import Validation, validate
from relakit.calibration.yamlout import twin_yaml
from relakit.vocab import ANSWERED

CAPACITY_MARGIN = 1.10   # a recorded throughput this far above the fitted capacity: a caution
MIN_WINDOWS = 10         # fewer validation windows than this: a caution


@dataclass
class Calibration:
    """A fitted twin: the scenario, its YAML text, the fits behind it, and its validation."""

    yaml: str
    scenario: object                      # relakit.Scenario
    recording: Recording
    node_ids: list[int]
    arrivals: ArrivalFit
    service: ServiceFit
    faults: list[FaultWindow]
    flags: FlagSchedule | None            # recorded flags (None: the recording shows none)
    replay_flags: bool
    deadline: DeadlineFit | None = None
    retries: RetryFit | None = None
    population: PopulationFit | None = None  # open or closed, tier by tier
    window_s: float = 0.0
    replications: int = 3
    seed: int = 1
    asked_flags: bool = False             # replay_flags was asked for
    _validation: Validation | None = None
    # of the scenario as it is now: dataclasses.replace(cal, scenario=...) (a twin the
    # engineer changed) gets its own, never the calibration's stale ones
    _cautions: list[str] | None = field(default=None, init=False, repr=False)

    def __repr__(self) -> str:  # the dataclass's own repr printed the whole twin's YAML
        v = ("not validated yet (.validation runs it)" if self._validation is None else
             "trusted" if self._validation.trusted else "NOT trusted")
        return (f"Calibration({self.recording.source!r}: {len(self.node_ids)} nodes, "
                f"{self.service.kind} service of {self.service.mean_ms:.3g} ms, "
                f"{len(self.cautions)} caution(s), {v})")

    def _repr_html_(self) -> str:
        """The fit, its cautions and, once run, the validation's verdict and table (the
        view never runs the validation itself: that simulates)."""
        from relakit.display import html_view

        sc, a = self.scenario, self.arrivals
        lines = [f"from {self.recording.source}: {len(self.node_ids)} node(s), scrape "
                 f"{self.recording.scrape_s:g} s, {sc.duration_s:g} s",
                 f"arrivals: mean {a.rates_rps.mean():.4g} req/s, peak {a.rates_rps.max():.4g} "
                 f"req/s in {a.bin_s:g} s bins ({a.source})",
                 *([f"workload {self.population.note()}"] if self.population else []),
                 f"service: {self.service.kind}, mean {self.service.mean_ms:.3g} ms; servers "
                 f"{list(sc.fleet.servers)}; {len(self.faults)} fault window(s)"]
        tables, notes = [], [f"caution: {c}" for c in self.cautions]
        if self._validation is None:
            notes.append("not validated yet: .validation runs the twin against the recording")
        else:
            lines.append(self._validation.verdict)
            tables.append(("the twin against the recording", self._validation.rows()))
        return html_view(f"Calibration: {Path(self.recording.source).name}", lines, tables,
                         notes)

    @property
    def cautions(self) -> list[str]:
        """What the twin as it stands (``.scenario``) cannot reproduce, each with its number."""
        if self._cautions is None:
            self._cautions = cautions(self)
        return self._cautions

    @property
    def validation(self) -> Validation:
        """The twin (with the recorded flags, if replayed) against the recording."""
        if self._validation is None:
            schedule = self.flags if self.replay_flags else None
            recorded = _renumbered(self.recording.frame, self.node_ids)
            self._validation = validate(
                recorded, lambda s: run_twin(self.scenario, schedule, s), self.seed,
                self.scenario.duration_s, self.window_s, self.replications, self.cautions)
        return self._validation

    def run_twin(self, seed: int | None = None) -> pl.DataFrame:
        """One run of the twin (recorded flags replayed if asked): its long metrics table."""
        return run_twin(self.scenario, self.flags if self.replay_flags else None,
                        self.seed if seed is None else seed)

    def summary(self) -> dict:
        return {
            "source": self.recording.source, "origin_s": self.recording.origin_s,
            "scrape_s": self.recording.scrape_s, "nodes": self.node_ids,
            "arrival": {"bin_s": self.arrivals.bin_s, "source": self.arrivals.source,
                        "mean_rps": float(self.arrivals.rates_rps.mean()),
                        "peak_rps": float(self.arrivals.rates_rps.max())},
            "tiers": self.arrivals.tiers,
            "workload": None if self.population is None else {
                "kind": self.population.kind, "note": self.population.note(),
                "closed": {t: {"population": p.population, "population_ci": list(p.population_ci),
                               "think_s": p.think_s, "think_ci": list(p.think_ci),
                               "spread": p.spread,
                               "phases": None if p.phases is None else [
                                   {"start_s": q.start_s, "population": q.population,
                                    "population_ci": list(q.population_ci)}
                                   for q in p.phases]}
                           for t, p in self.population.tiers.items() if p.closed}},
            "service": {"kind": self.service.kind, "params": self.service.params,
                        "mean_ms": self.service.mean_ms, "scores": self.service.scores},
            "servers": [n.servers for n in self.service.nodes],
            "servers_exact": [n.servers_exact for n in self.service.nodes],
            "mean_ms_by_node": [n.mean_ms for n in self.service.nodes],
            "service_scale": list(self.scenario.fleet.scales),
            "faults": [{"node": f.node, "start_s": f.start_s, "end_s": f.end_s,
                        "error_rate": f.error_rate, "whole_run": f.whole_run}
                       for f in self.faults],
            "deadline_ms": {"estimated": None if self.deadline is None
                            else self.deadline.deadline_ms,
                            "note": None if self.deadline is None else self.deadline.note,
                            "in_twin": self.scenario.workload.deadline_ms},
            "retries": {"max_attempts": None if self.retries is None
                        else self.retries.max_attempts,
                        "note": None if self.retries is None else self.retries.note,
                        "in_twin": self.scenario.mitigations.retries.max_attempts},
            "flags": None if self.flags is None else {
                "source": self.flags.source, "changes": len(self.flags.changes),
                "replayed": self.replay_flags},
            "cautions": self.cautions,
        }


def calibrate(trace, nodes: list[int] | None = None, *, replay_flags=False,
              bin_s: float | None = None, window_s: float | None = None,
              replications: int = 3, seed: int = 1, name: str | None = None) -> Calibration:
    """Fit a twin scenario to a recording (a path in any importer's format, or a long
    metrics frame).

    ``nodes``: only these scrape targets (renumbered from 0 in the twin).
    ``replay_flags``: False; True (the recording's flag gauges); or a path to a
    decisions file (``decisions.parquet``). ``bin_s``: the arrival curve's bin
    (default: 10 s, or a thirtieth of a short recording). ``window_s``: the
    validation's evaluation window (default: five scrapes). ``replications``,
    ``seed``: the validation's twin runs.
    """
    from relakit.scenario import load_scenario
    from relakit.traces import read_trace, validate_trace

    if isinstance(trace, pl.DataFrame):
        frame, source = validate_trace(trace), "<trace>"
    else:
        frame, source = read_trace(trace), str(trace)
    rec = read_recording(frame, source, nodes)
    node_ids = [n.node for n in rec.nodes]
    if replay_flags not in (False, None, True):
        schedule = from_decisions(replay_flags, rec.origin_s)
    else:
        schedule = from_gauges(rec)
    degraded = (schedule.degraded if schedule is not None
                else (lambda t0, t1: np.zeros(np.size(t0), dtype=bool)))
    arrivals = fit_arrivals(rec, bin_s)
    edges = np.append(arrivals.times_s, arrivals.end_s)
    population = fit_population(rec, edges)
    twin_arrivals = arrivals
    if population.closed_tiers:  # the closed tiers' requests are the clients', not arrivals
        open_t = population.open_tiers
        shares = {t: arrivals.tiers[t] for t in open_t}
        total = sum(shares.values())
        twin_arrivals = replace(
            arrivals, rates_rps=arrivals.rates_rps * open_share(rec, edges, population),
            tiers={t: (shares[t] / total if t in shares and total > 0 else 0.0)
                   for t in arrivals.tiers} if open_t else arrivals.tiers)
    service = fit_service(rec.nodes, degraded, source)
    windows = []
    for i, nd in enumerate(rec.nodes):
        windows += [replace(w, node=i) for w in fit_faults(nd, arrivals.end_s)]
    shares = np.array([increments(n.requests.sum(axis=(1, 2))).sum() for n in rec.nodes])
    weights = shares / shares.sum() if shares.sum() > 0 else np.full(len(shares), 1 / len(shares))
    phases = [float(n.t[1] % rec.scrape_s if n.t[0] == 0 and n.t.size > 1 else
                    n.t[0] % rec.scrape_s) for n in rec.nodes]
    deadline, retries = fit_deadline(rec), fit_retries(rec)
    bounds = next((n.bounds for n in rec.nodes if n.bounds is not None), None)
    buckets = None if bounds is None else [float(b) for b in bounds if np.isfinite(b)]
    stem = name or "twin-" + (Path(source).stem if source != "<trace>" else "trace")
    replaying = bool(replay_flags) and schedule is not None
    flags_note = ("none recorded" if schedule is None else
                  f"{len(schedule.changes)} change(s) recorded in {schedule.source}; "
                  + ("replayed: written below as controls.schedule, which `relakit simulate` "
                     "sets as the validation did (flags.csv in the report)"
                     if replaying else "not replayed (give --replay-flags)"))
    text = twin_yaml(name=stem, source=source, origin_s=rec.origin_s,
                     recording_end_s=rec.end_s, arrival=twin_arrivals,
                     tiers=rounded_tiers(twin_arrivals.tiers), node_ids=node_ids, service=service,
                     weights=weights, weights_source="requests_total (all outcomes)",
                     faults=windows, scrape_s=rec.scrape_s, phases=phases, buckets=buckets,
                     flags_note=flags_note, seed=seed, deadline=deadline, retries=retries,
                     population=population, schedule=schedule if replaying else None)
    scenario = load_scenario(yaml.safe_load(text))
    return Calibration(text, scenario, rec, node_ids, arrivals, service, windows, schedule,
                       replaying, deadline=deadline, retries=retries, population=population,
                       window_s=window_s or 5 * rec.scrape_s, replications=replications,
                       seed=seed, asked_flags=bool(replay_flags))


def cautions(cal: Calibration) -> list[str]:
    """What the fitted model cannot reproduce, each with its number."""
    out = []
    svc, rec = cal.service, cal.recording
    for i, (nd, ns) in enumerate(zip(rec.nodes, svc.nodes, strict=True)):
        done, _ = nd.completions()
        k = max(1, int(round(cal.window_s / rec.scrape_s)))
        plain = ~degraded(cal, nd)  # degraded mode shortens work: its capacity is another
        if done.size >= k:
            ones = np.ones(k)
            served = np.convolve(done, ones, "valid") / np.convolve(nd.dt, ones, "valid")
            served = served[np.convolve(plain, ones, "valid") == k]
        fl = cal.scenario.fleet
        if done.size >= k and served.size:
            cap = fl.node_capacity_rps[i]
            if served.max() > CAPACITY_MARGIN * cap:
                out.append(f"node {i} served {served.max():.0f} req/s over a {cal.window_s:g} s "
                           f"window, above the twin's capacity there ({cap:.0f} req/s: "
                           f"{fl.servers[i]} servers x {fl.node_mean_ms[i]:.1f} ms): a load the "
                           "fitted model cannot produce")
        if busy_rate(nd) is None:
            out.append(f"node {i} has no busy_seconds_total: its servers ({ns.servers}) and "
                       "service are guesses")
        elif not ns.servers_exact:
            out.append(f"node {i}: {ns.servers} servers is a lower bound ({ns.servers_note})")
    capacity = cal.scenario.fleet.capacity_rps
    peak = float(cal.arrivals.rates_rps.max())
    if peak > capacity:
        out.append(f"the recorded load peaks at {peak:.0f} req/s, above the twin's capacity of "
                   f"{capacity:.0f} req/s: there the twin's queues grow as long as it lasts")
    if cal.asked_flags and cal.flags is None:
        out.append("--replay-flags was asked for, but the recording has no flag gauges "
                   "(hedge_enabled, degraded_mode, shedding, breaker_state): give a "
                   "decisions.parquet instead")
    if cal.flags is not None and cal.flags.changes and not cal.replay_flags:
        out.append(f"the recording's flags changed {len(cal.flags.changes)} time(s) and are "
                   "not replayed: the twin runs with the flags of t = 0")
    hedging = cal.flags is not None and any(f.get("hedge_enabled") for _, f in cal.flags.changes)
    if hedging and "client" not in cal.arrivals.source and "hedges_total" not in rec.fleet:
        out.append("hedging was on in the recording and no hedges_total counter was recorded: "
                   "hedged copies were counted as arrivals")
    windows = int(cal.scenario.duration_s // cal.window_s)
    if windows < MIN_WINDOWS:
        out.append(f"only {windows} validation windows of {cal.window_s:g} s: too short a "
                   "recording for narrow intervals")
    # the clients as the twin runs them now (the engineer may have set them by hand)
    wl, tries = cal.scenario.workload, cal.scenario.mitigations.retries
    timeouts = sum(n.outcome_increments(("timeout",)).sum() for n in rec.nodes)
    answered = sum(n.outcome_increments(ANSWERED).sum() for n in rec.nodes)
    fit = cal.deadline
    if answered and timeouts / answered > 0.01 and wl.deadline_ms is None:
        why = ("" if fit is None else
               f": the estimate could not be made ({fit.note})" if fit.deadline_ms is None else
               f", though the recording shows {fit.deadline_ms:g} ms ({fit.note})")
        out.append(f"{timeouts / answered:.1%} of answers were timeouts, and the twin has no "
                   f"client deadline{why}")
    if (fit is not None and fit.deadline_ms is not None and wl.deadline_ms is not None
            and abs(wl.deadline_ms / fit.deadline_ms - 1) > 0.10):
        out.append(f"the twin's client deadline ({wl.deadline_ms:g} ms) is not the one the "
                   f"recording shows ({fit.deadline_ms:g} ms, {fit.note})")
    rt = cal.retries
    if rt is not None and rt.max_attempts is None and tries.max_attempts == 1:
        out.append(f"retries could not be estimated and the twin's clients do not retry: "
                   f"{rt.note}")
    if rt is not None and rt.denied and tries.budget_ratio is None:
        out.append(f"a retry budget denied {rt.denied:.0f} retries in the recording; the "
                   "twin has no budget (mitigations.retries.budget_ratio is not estimated)")
    return out


def degraded(cal: Calibration, nd) -> np.ndarray:
    """Per scrape interval of a node: was degraded mode on (per the recorded flags)?"""
    if cal.flags is None:
        return np.zeros(nd.dt.size, dtype=bool)
    return cal.flags.degraded(nd.t[:-1], nd.t[1:])


def _renumbered(frame: pl.DataFrame, node_ids: list[int]) -> pl.DataFrame:
    """The recording's per-node rows of the calibrated nodes, numbered as in the twin."""
    mapping = {n: i for i, n in enumerate(node_ids)}
    return frame.filter(pl.col("node").is_in(node_ids)).with_columns(
        pl.col("node").replace_strict(mapping, return_dtype=pl.Int32))


def write_report(cal: Calibration, out_dir) -> list[Path]:
    """validation.parquet, overlay.parquet, twin_overlay.png, calibration.json, flags.csv."""
    from relakit import plots
    from relakit.io import atomic_write, write_json, write_parquet

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    v = cal.validation
    written = [write_parquet(v.table, out / "validation.parquet"),
               write_parquet(v.overlay, out / "overlay.parquet")]
    written.append(plots.save(plots.twin_overlay(v.overlay, v.window_s),
                              out / "twin_overlay.png"))
    summary = cal.summary()
    summary["validation"] = {"trusted": v.trusted, "verdict": v.verdict,
                             "window_s": v.window_s, "replications": v.replications,
                             "table": v.table.to_dicts()}
    written.append(write_json(summary, out / "calibration.json"))
    if cal.flags is not None and cal.replay_flags:
        frame = cal.flags.frame()
        written.append(atomic_write(out / "flags.csv", lambda tmp: frame.write_csv(tmp)))
    return written


__all__ = ["Calibration", "CalibrationError", "calibrate", "write_report"]
