"""Replay: the deciders run open loop over a metric trace, and threshold sweeps.

``relakit.replay`` is this module's :func:`replay` (the module has its own name, so
the package's attribute is the function whichever was imported first).

The same signals, state machine and chain stages as in the closed loop
(:mod:`relakit.experiment`), over a recorded or synthetic trace (a long
table, a file in any importer's format, or a TSDB). It sits beside the
experiment layer because, like it, it wires policy, chain and traces.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import polars as pl

from relakit.chain import ChainRun, load_chain
from relakit.control import policy as P
from relakit.control.audit import format_audit
from relakit.control.clocks import Clocks, load_clocks
from relakit.control.controller import Controller, hold_times, signal_matrix, time_in_mode
from relakit.control.tsdb import TSDB


@dataclass
class ReplayResult:
    decisions: pl.DataFrame
    timeline: pl.DataFrame  # time_s, mode, one column per signal
    policy: P.Policy | None
    clocks: Clocks
    start_s: float = 0.0  # the replayed span: time in each mode sums to end_s - start_s
    end_s: float = 0.0

    def format_audit(self) -> str:
        return format_audit(self.decisions)

    def time_in_mode(self) -> dict:
        if self.policy is None:
            return {}
        return time_in_mode(self.timeline, self.policy, self.start_s, self.end_s)


def replay(trace, policy=None, clocks=None, start_s: float | None = None,
           end_s: float | None = None, chain=None, servers=None,
           weights=None, times=None, progress=None) -> ReplayResult:
    """Run the controller (a policy, a containment chain, or both) open loop over a
    metric trace (long table, file or TSDB), at the clocks' evaluation instants or at
    the given ``times`` (e.g. a live controller's, to compare with it). The chain's
    repairs are recorded, not done: a trace cannot be mended. ``progress`` (e.g. a
    :class:`relakit.progress.Progress`) is told the evaluations done."""
    if policy is None and chain is None:
        raise ValueError("replay needs a policy, a chain, or both")
    clk = load_clocks(clocks)
    pol = P.load_policy(policy) if policy is not None else None
    if chain is not None:
        chain = load_chain(chain)
    tsdb = _checked_tsdb(trace, pol, chain, clk, start_s, end_s, times)
    lo, hi = _span(tsdb, start_s, end_s)
    times = clk.eval_times(lo, hi) if times is None else np.asarray(times, dtype=float)
    if times.size == 0:
        raise ValueError(f"no evaluation instant between {start_s} s and {end_s} s")
    lo, hi = min(lo, float(times[0])), max(hi, float(times[-1]))  # given instants may reach past
    deciders = []
    if pol is not None:
        deciders.append(Controller(pol, clk))
    if chain is not None:
        deciders.append(chain.run(clk, servers=servers, base_weights=weights))
    if progress is not None:
        progress.update(0, total=times.size)
    timeline = pl.DataFrame({"time_s": times})
    for d in deciders:  # the same deciders as the closed loop's, each over every instant
        d.run(tsdb, times, progress=progress if isinstance(d, ChainRun) else None)
        timeline = timeline.hstack(d.timeline().drop("time_s"))
    if progress is not None:
        progress.update(times.size)
    decisions = pl.concat([d.decisions() for d in deciders]).sort("decided_at_s",
                                                                  maintain_order=True)
    return ReplayResult(decisions, timeline, pol, clk, lo, hi)


def _checked_tsdb(trace, policy, chain, clocks, start_s, end_s, times) -> TSDB:
    """The trace as a TSDB, after the semantic checks against what will read it."""
    from relakit.checks import check_replay, enforce

    if isinstance(trace, TSDB):
        return trace  # already pivoted (tests, the lab): nothing left to learn from it
    frame, source = _as_frame(trace)
    tsdb = TSDB.from_long(frame) if frame.height else TSDB()
    enforce(check_replay(frame, source, policy, chain, clocks, start_s, end_s, times, tsdb))
    return tsdb


def _as_frame(trace):
    from relakit.traces import read_trace, validate_trace

    if isinstance(trace, pl.DataFrame):
        return validate_trace(trace), "<trace>"
    return read_trace(trace), str(trace)


def as_tsdb(trace) -> TSDB:
    """A TSDB from a TSDB, a long metrics frame, or a trace file (any importer's format)."""
    from relakit.traces import read_trace, validate_trace

    if isinstance(trace, TSDB):
        return trace
    if isinstance(trace, pl.DataFrame):
        return TSDB.from_long(validate_trace(trace))
    return TSDB.from_long(read_trace(trace))


def _span(tsdb: TSDB, start_s, end_s) -> tuple[float, float]:
    """The replayed span: the trace's, unless start or end is given."""
    lo, hi = tsdb.span
    return (float(lo if start_s is None else start_s), float(hi if end_s is None else end_s))


def sweep_thresholds(trace, policy, clocks=None, settings=None, start_s=None,
                     end_s=None) -> pl.DataFrame:
    """Many threshold settings over one trace: signals once, the state machine per setting.

    ``settings`` maps condition names to lists of thresholds (their full grid is
    swept) or is a DataFrame with one column per condition (one row per setting).
    Returns the settings with, per mode, seconds spent in it and when it was
    first entered, and the number of mode changes (flapping).
    """
    pol = P.load_policy(policy)
    clk = load_clocks(clocks)
    tsdb = _checked_tsdb(trace, pol, None, clk, start_s, end_s, None)
    if isinstance(settings, dict):
        names = list(settings)
        grid = pl.DataFrame(list(itertools.product(*settings.values())), schema=names,
                            orient="row")
    else:
        grid = settings
    cond_names = [c.name for c in pol.conditions]
    unknown = set(grid.columns) - set(cond_names)
    if unknown:
        raise ValueError(f"unknown condition(s) {sorted(unknown)}; the policy has {cond_names}")
    base = np.array([c.threshold for c in pol.conditions])
    thresholds = np.tile(base, (grid.height, 1))
    for col in grid.columns:
        thresholds[:, cond_names.index(col)] = grid[col].cast(pl.Float64).to_numpy()
    lo, hi = _span(tsdb, start_s, end_s)
    times = clk.eval_times(lo, hi)
    sig, _ = P.fill_missing(pol, signal_matrix(pol, tsdb, times, clk.window_s))  # on_missing
    cs, co, _, when, exit_when, mode_i, mode_f = pol.compiled()
    lead, held = hold_times(times, lo, hi)
    time_in, changes, first = P.sweep(times, sig, cs, co, thresholds, when, exit_when, mode_i,
                                      mode_f, held)
    time_in[:, -1] += lead  # normal before the first evaluation
    cols = {f"time_in_{m.name}_s": time_in[:, i] for i, m in enumerate(pol.modes)}
    cols["time_in_normal_s"] = time_in[:, -1]
    cols.update({f"first_{m.name}_s": first[:, i] for i, m in enumerate(pol.modes)})
    cols["mode_changes"] = changes
    return grid.with_columns(**{k: pl.Series(v) for k, v in cols.items()})


__all__ = ["ReplayResult", "as_tsdb", "format_audit", "replay", "sweep_thresholds"]
