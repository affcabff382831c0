"""The controller, run two ways with the same code: closed loop and replay.

Closed loop: the experiment layer advances the fleet to each evaluation
instant, hands the controller what Prometheus would hold by then (a
:class:`~relakit.control.tsdb.TSDB`), and applies the desired state at the next
config poll. Replay: the same signals and the same state machine run over a
recorded or synthetic metric trace, all evaluation instants at once.

Both produce the same audit table (``decisions``): one row per evaluation that
changes or holds a mode, with the decision time, when it takes effect, the
signal, its value and threshold, how old the newest sample was, the
hysteresis counters, the desired state and a reason in words.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import polars as pl

from relakit.control import policy as P
from relakit.control.clocks import Clocks, load_clocks
from relakit.control.tsdb import TSDB

DECISION_COLUMNS = {
    "decided_at_s": pl.Float64, "effective_at_s": pl.Float64, "stage": pl.String,
    "action": pl.String, "mode": pl.String, "previous_mode": pl.String, "target": pl.String,
    "signal": pl.String, "value": pl.Float64, "threshold": pl.Float64,
    "signal_age_s": pl.Float64, "breaches": pl.Int64, "clears": pl.Int64,
    "desired": pl.String, "reason": pl.String,
}


def signal_matrix(policy: P.Policy, tsdb: TSDB, times, window_s: float) -> np.ndarray:
    """Every fleet signal of the policy at every time: (T, signals), the policy's order."""
    times = np.atleast_1d(np.asarray(times, dtype=float))
    cols = [s.evaluate(tsdb, times, window_s) if not s.by_node else np.full(times.size, np.nan)
            for s in policy.signals.values()]
    return np.column_stack(cols) if cols else np.zeros((times.size, 0))


def sample_age(tsdb: TSDB, times) -> np.ndarray:
    """Seconds since the newest sample any target had at each time (inf: none yet)."""
    times = np.atleast_1d(np.asarray(times, dtype=float))
    newest = np.full(times.size, -np.inf)
    for tgt in tsdb.targets:
        i = np.searchsorted(tgt.times, times, side="right") - 1
        ok = i >= 0
        newest[ok] = np.maximum(newest[ok], tgt.times[i[ok]])
    return times - newest


class Controller:
    """Stateful controller for the closed loop: one :meth:`evaluate` per evaluation."""

    def __init__(self, policy, clocks: Clocks | None = None):
        self.policy = P.load_policy(policy)
        self.clocks = clocks or Clocks()
        self._arrays = self.policy.compiled()
        self._state = P.new_state(self.policy)
        self._buf = np.zeros(len(self.policy.conditions), np.bool_)
        self.times: list[float] = []
        self.modes: list[int] = []
        self.events: list[int] = []
        self.runs: list[np.ndarray] = []
        self.values: list[np.ndarray] = []
        self.ages: list[float] = []

    @property
    def mode(self) -> int:
        return self.modes[-1] if self.modes else P.NORMAL

    def evaluate(self, tsdb: TSDB, t: float) -> dict:
        """Decide at time t from what the TSDB holds; return the desired flag state."""
        row = signal_matrix(self.policy, tsdb, [t], self.clocks.window_s)[0]
        return self.decide(t, row, float(sample_age(tsdb, [t])[0]))

    def decide(self, t: float, row, age_s: float = float("nan")) -> dict:
        """Decide at time t from signal values computed elsewhere (e.g. by Prometheus
        itself, from the signals' PromQL), in the policy's signal order."""
        row = np.asarray(row, dtype=float)
        cs, co, ct, when, exit_when, mode_i, mode_f = self._arrays
        mode, event = P.step(self._state[0], self._state[1], float(t), row, cs, co, ct, when,
                             exit_when, mode_i, mode_f, self._buf)
        m = len(self.policy.modes)
        self.times.append(float(t))
        self.modes.append(int(mode))
        self.events.append(int(event))
        self.runs.append(self._state[0][: 2 * m].copy())
        self.values.append(row)
        self.ages.append(age_s)
        return self.policy.desired(int(mode))

    def decisions(self) -> pl.DataFrame:
        if not self.times:
            return empty_decisions()
        return audit_table(self.policy, self.clocks, np.array(self.times),
                           np.vstack(self.values), np.array(self.modes), np.array(self.events),
                           np.vstack(self.runs), np.array(self.ages))


# ---- replay ------------------------------------------------------------------------------------
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
        from relakit.chain import load_chain

        chain = load_chain(chain)
    tsdb = _checked_tsdb(trace, pol, chain, clk, start_s, end_s, times)
    lo, hi = _span(tsdb, start_s, end_s)
    times = clk.eval_times(lo, hi) if times is None else np.asarray(times, dtype=float)
    if times.size == 0:
        raise ValueError(f"no evaluation instant between {start_s} s and {end_s} s")
    lo, hi = min(lo, float(times[0])), max(hi, float(times[-1]))  # given instants may reach past
    parts, timeline = [], pl.DataFrame({"time_s": times})
    if progress is not None:
        progress.update(0, total=times.size)
    if pol is not None:
        sig = signal_matrix(pol, tsdb, times, clk.window_s)
        modes, events, runs = P.run(times, sig, *pol.compiled())
        parts.append(audit_table(pol, clk, times, sig, modes, events, runs,
                                 sample_age(tsdb, times)))
        names = ["normal"] + [m.name for m in pol.modes]
        timeline = pl.DataFrame({"time_s": times, "mode": [names[m + 1] for m in modes],
                                 **{k: sig[:, i] for i, k in enumerate(pol.signals)}})
    if chain is not None:
        from relakit.chain import load_chain

        ch = load_chain(chain)
        ch.reset()
        ages = sample_age(tsdb, times)
        for k, (t, age) in enumerate(zip(times, ages, strict=True)):
            ch.evaluate(tsdb, float(t), clk.window_s, servers, signal_age_s=float(age),
                        base_weights=weights)
            if progress is not None:
                progress.update(k + 1)
        parts.append(ch.decisions(clk))
        timeline = timeline.with_columns(
            working_nodes=pl.Series([w for _, w, _ in ch.history]),
            stress=pl.Series([s for _, _, s in ch.history]))
    if progress is not None:
        progress.update(times.size)
    decisions = pl.concat(parts).sort("decided_at_s", maintain_order=True)
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


# ---- the audit ------------------------------------------------------------------------------
def empty_decisions() -> pl.DataFrame:
    return pl.DataFrame(schema=DECISION_COLUMNS)


def audit_table(policy: P.Policy, clocks: Clocks, times, values, modes, events, runs,
                ages) -> pl.DataFrame:
    """Rows for every evaluation that changes or holds a mode, with reasons in words."""
    sig_index = {k: i for i, k in enumerate(policy.signals)}
    conds = {c.name: c for c in policy.conditions}
    names = [m.name for m in policy.modes]
    m = len(names)
    prev_modes = np.concatenate([[P.NORMAL], modes[:-1]])
    keep = np.flatnonzero((modes != P.NORMAL) | (modes != prev_modes))
    rows = []
    entered_at = {}
    for k in range(times.size):  # entry times, for dwell in the reasons
        if modes[k] != P.NORMAL and (k == 0 or modes[k] != prev_modes[k]):
            entered_at[k] = times[k]
    last_entry = -np.inf
    keep_set = set(keep.tolist())
    for k in range(times.size):
        if k in entered_at:
            last_entry = entered_at[k]
        if k not in keep_set:
            continue
        mode, prev, t = int(modes[k]), int(prev_modes[k]), float(times[k])
        ev = int(events[k])
        subject = mode if mode != P.NORMAL else prev
        md = policy.modes[subject]
        cond = _reporting_condition(md, conds, values[k], sig_index, leaving=mode == P.NORMAL)
        value = float(values[k][sig_index[cond.signal]])
        breaches, clears = int(runs[k][subject]), int(runs[k][m + subject])
        if mode == prev:
            action = "hold"
        elif mode == P.NORMAL:
            action = {P.EV_MAX_DURATION: "max_duration"}.get(ev, "exit")
        elif ev == P.EV_ESCALATE:
            action = "escalate"
        elif ev == P.EV_PREEMPT:
            action = "preempt"
        else:
            action = "enter"
        reason = _reason(action, policy, mode, prev, cond, value, breaches, clears,
                         t - last_entry, values[k], sig_index, conds)
        rows.append((t, float(clocks.effective_at(t)), "policy", action,
                     "normal" if mode == P.NORMAL else names[mode],
                     "normal" if prev == P.NORMAL else names[prev], "fleet", cond.signal,
                     value, cond.threshold, float(ages[k]), breaches, clears,
                     json.dumps(policy.desired(mode), sort_keys=True), reason))
    if not rows:
        return empty_decisions()
    return pl.DataFrame(rows, schema=DECISION_COLUMNS, orient="row")


def _reporting_condition(md: P.Mode, conds, row, sig_index, leaving: bool) -> P.Condition:
    names = md.exit_when if (leaving and md.exit_when) else md.when
    for n in names:  # the first condition that holds (or, when leaving, that cleared)
        c = conds[n]
        holds = P._compare(row[sig_index[c.signal]], c.op, c.threshold)
        if holds != (leaving and not md.exit_when):
            return c
    return conds[names[0]]


def _reason(action, policy, mode, prev, cond, value, breaches, clears, dwell, row, sig_index,
            conds) -> str:
    names = [m.name for m in policy.modes]
    what = cond.describe(value)
    if action in ("enter", "preempt"):
        md = policy.modes[mode]
        text = f"entered {md.name}: {what} for {breaches} evaluation" + ("s" if breaches > 1
                                                                          else "")
        if action == "preempt":
            text = f"entered {md.name} over {names[prev]}: {what}"
        suppressed = [m.name for m in policy.modes[mode + 1:] if _matches(m, conds, row,
                                                                          sig_index)]
        if policy.desired(mode).get("hedge_enabled") is False and any(
                policy.desired(i).get("hedge_enabled") for i in range(mode + 1, len(names))):
            text += "; hedging suppressed"
        elif suppressed:
            text += f"; {', '.join(suppressed)} suppressed"
        return text
    if action == "hold":
        md = policy.modes[mode]
        return (f"holding {md.name}: {what}; clear {clears}/{md.exit_after}, "
                f"dwell {dwell:.0f} s of at least {md.min_dwell_s:g} s")
    md = policy.modes[prev]
    if action == "max_duration":
        return (f"left {md.name} at its maximum duration of {md.max_duration_s:g} s; "
                f"cooling down {md.cooldown_s:g} s")
    if action == "escalate":
        return f"escalated {md.name} to {names[mode]} after {md.max_duration_s:g} s"
    return f"left {md.name}: {what} for {clears} evaluations, after {dwell:.0f} s"


def _matches(md: P.Mode, conds, row, sig_index) -> bool:
    hits = [P._compare(row[sig_index[conds[n].signal]], conds[n].op, conds[n].threshold)
            for n in md.when]
    return all(hits) if md.when_all else any(hits)


def format_audit(decisions: pl.DataFrame, holds: bool = False) -> str:
    """The audit as text, one line per decision (holds left out unless asked for)."""
    lines = []
    for r in decisions.iter_rows(named=True):
        if r["action"] == "hold" and not holds:
            continue
        lines.append(f"{r['decided_at_s']:9.1f} s → {r['effective_at_s']:9.1f} s  "
                     f"[{r['stage']}] {r['action']:<12} {r['reason']}  "
                     f"(signal age {r['signal_age_s']:.1f} s)")
    return "\n".join(lines) if lines else "(no decisions)"


def hold_times(times, start_s: float, end_s: float) -> tuple[float, np.ndarray]:
    """How long each evaluation's decision stands, and the time before the first.

    A mode decided at an evaluation holds until the next evaluation, the last
    one until ``end_s``; before the first evaluation the controller is in
    normal. So the lead plus the hold times is ``end_s - start_s``, the run's
    duration. (Counting one evaluation interval per evaluation instead counted
    the instants at both ends of [0, duration]: 902 s for a 900 s run.)
    """
    times = np.asarray(times, dtype=float)
    if times.size == 0:
        return float(end_s - start_s), times
    return float(times[0] - start_s), np.diff(np.append(times, float(end_s)))


def time_in_mode(timeline: pl.DataFrame, policy: P.Policy, start_s: float,
                 end_s: float) -> dict:
    """Seconds in each mode (normal first) over [start_s, end_s]; they sum to its length."""
    lead, held = hold_times(timeline["time_s"].to_numpy(), start_s, end_s)
    names = ["normal"] + [m.name for m in policy.modes]
    spent = dict(pl.DataFrame({"mode": timeline["mode"], "held": held})
                 .group_by("mode").agg(pl.col("held").sum()).iter_rows()) if held.size else {}
    spent["normal"] = spent.get("normal", 0.0) + lead
    return {name: round(float(spent.get(name, 0.0)), 6) for name in names}


def sweep_thresholds(trace, policy, clocks=None, settings=None, start_s=None,
                     end_s=None) -> pl.DataFrame:
    """Many threshold settings over one trace: signals once, the state machine per setting.

    ``settings`` maps condition names to lists of thresholds (their full grid is
    swept) or is a DataFrame with one column per condition (one row per setting).
    Returns the settings with, per mode, seconds spent in it and when it was
    first entered, and the number of mode changes (flapping).
    """
    import itertools

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
    sig = signal_matrix(pol, tsdb, times, clk.window_s)
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
