"""The audit: one table schema for every decider, and the policy's rows and reasons.

Every evaluation that changes or holds a mode (the policy), and every action of
a chain stage, is a row of ``DECISION_COLUMNS``: when it was decided, when it
takes effect (the clocks' rule), the signal, its value and threshold, how old
the newest sample was, the hysteresis counters, the desired state and a reason
in words. It lives apart from the controller so the chain can write the same
table without importing the controller (which would close a cycle).
"""

from __future__ import annotations

import json

import numpy as np
import polars as pl

from relakit.control import policy as P
from relakit.control.clocks import Clocks

DECISION_COLUMNS = {
    "decided_at_s": pl.Float64, "effective_at_s": pl.Float64, "stage": pl.String,
    "action": pl.String, "mode": pl.String, "previous_mode": pl.String, "target": pl.String,
    "signal": pl.String, "value": pl.Float64, "threshold": pl.Float64,
    "signal_age_s": pl.Float64, "breaches": pl.Int64, "clears": pl.Int64,
    "desired": pl.String, "reason": pl.String,
}



def empty_decisions() -> pl.DataFrame:
    return pl.DataFrame(schema=DECISION_COLUMNS)


#: audit actions that change no mode: a mode held, an entry deferred by its cooldown
NO_CHANGE = ("hold", "defer")


def audit_table(policy: P.Policy, clocks: Clocks, times, values, modes, events, runs,
                ages, since: int = 0) -> pl.DataFrame:
    """Rows for every evaluation that changes or holds a mode, or whose due entry into a
    mode its cooldown held off, with reasons in words; from evaluation ``since`` on
    (the rows before it are what an earlier call returned)."""
    sig_index = {k: i for i, k in enumerate(policy.signals)}
    conds = {c.name: c for c in policy.conditions}
    names = [m.name for m in policy.modes]
    m = len(names)
    modes, events = np.asarray(modes), np.asarray(events)
    prev_modes = np.concatenate([[P.NORMAL], modes[:-1]])
    changed = modes != prev_modes
    keep = np.flatnonzero((modes != P.NORMAL) | changed | (events == P.EV_DEFER))
    keep = keep[keep >= since]
    rows = []
    entries = np.flatnonzero((modes != P.NORMAL) & changed)  # entry times: dwell in reasons
    # when each mode was last left (policy.step's state_f): an exit, a maximum duration
    # or an escalation starts its cooldown; a preemption does not
    left = np.flatnonzero(changed & (prev_modes != P.NORMAL) & (events != P.EV_PREEMPT))
    for k in keep.tolist():
        mode, prev, t = int(modes[k]), int(prev_modes[k]), float(times[k])
        e = np.searchsorted(entries, k, side="right") - 1
        last_entry = float(times[entries[e]]) if e >= 0 else -np.inf
        ev = int(events[k])
        if ev == P.EV_DEFER:
            held, exit_at, by_max = _deferred(policy, runs[k], times, prev_modes, events,
                                              left[left <= k], t)
            md = policy.modes[held]
            cond = _reporting_condition(md, conds, values[k], sig_index, leaving=False)
            value = float(values[k][sig_index[cond.signal]])
            breaches, clears = int(runs[k][held]), int(runs[k][m + held])
            why = (f"after its maximum duration of {md.max_duration_s:g} s, "
                   if by_max else "")
            reason = (f"{md.name} due ({cond.describe(value)} for {breaches} evaluations) "
                      f"but held by its cooldown of {md.cooldown_s:g} s {why}until "
                      f"{exit_at + md.cooldown_s:.1f} s (left at {exit_at:.1f} s); "
                      f"{'staying ' + ('normal' if mode == P.NORMAL else names[mode])}")
            rows.append((t, float(clocks.effective_at(t)), "policy", "defer",
                         "normal" if mode == P.NORMAL else names[mode],
                         "normal" if prev == P.NORMAL else names[prev], "fleet", cond.signal,
                         value, cond.threshold, float(ages[k]), breaches, clears,
                         json.dumps(policy.desired(mode), sort_keys=True), reason))
            continue
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
        if action == "hold" and clears >= md.exit_after and t - last_entry < md.min_dwell_s:
            reason += (f"; exit due, held by its minimum dwell until "
                       f"{last_entry + md.min_dwell_s:.1f} s")
        rows.append((t, float(clocks.effective_at(t)), "policy", action,
                     "normal" if mode == P.NORMAL else names[mode],
                     "normal" if prev == P.NORMAL else names[prev], "fleet", cond.signal,
                     value, cond.threshold, float(ages[k]), breaches, clears,
                     json.dumps(policy.desired(mode), sort_keys=True), reason))
    if not rows:
        return empty_decisions()
    return pl.DataFrame(rows, schema=DECISION_COLUMNS, orient="row")


def _deferred(policy: P.Policy, run, times, prev_modes, events, left, t):
    """The mode whose due entry its cooldown held off at ``t`` (the first in priority
    order, as policy.step looks), when it was last left, and whether by its maximum
    duration. ``left``: the evaluations at which a mode was left, up to ``t``'s."""
    for i, md in enumerate(policy.modes):
        if run[i] < md.enter_after:
            continue
        mine = left[prev_modes[left] == i]
        if mine.size and t - float(times[mine[-1]]) < md.cooldown_s:
            j = mine[-1]
            return i, float(times[j]), int(events[j]) in (P.EV_MAX_DURATION, P.EV_ESCALATE)
    raise AssertionError(f"no mode was held by its cooldown at {t}")  # step said one was


def _reporting_condition(md: P.Mode, conds, row, sig_index, leaving: bool) -> P.Condition:
    names = md.exit_when if (leaving and md.exit_when) else md.when
    for n in names:  # the first condition that holds (or, when leaving, that cleared)
        c = conds[n]
        holds = P.compare_value(row[sig_index[c.signal]], c.op, c.threshold)
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
    hits = [P.compare_value(row[sig_index[conds[n].signal]], conds[n].op, conds[n].threshold)
            for n in md.when]
    return all(hits) if md.when_all else any(hits)


def format_audit(decisions: pl.DataFrame, holds: bool = False) -> str:
    """The audit as text, one line per decision (holds, and the evaluations a down agent
    skipped, left out unless asked for: its ``down`` and ``restart`` rows say when)."""
    lines = []
    for r in decisions.iter_rows(named=True):
        if r["action"] in ("hold", "skip") and not holds:  # a deferral is shown
            continue
        eff, age = r["effective_at_s"], r["signal_age_s"]  # null: never takes effect
        lines.append(f"{r['decided_at_s']:9.1f} s → "
                     + (f"{eff:9.1f} s  " if eff is not None and eff == eff else " " * 13)
                     + f"[{r['stage']}] {r['action']:<12} {r['reason']}"
                     + (f"  (signal age {age:.1f} s)" if age is not None else ""))
    return "\n".join(lines) if lines else "(no decisions)"
