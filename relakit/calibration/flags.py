"""The flags the recorded control plane set, and the twin run with them replayed.

Two sources, in the twin's time (the recording's origin removed):

* a decisions file (``decisions.parquet`` as ``relakit simulate``, ``replay`` and
  the lab's agent write it): each row's ``desired`` flags are in force from its
  ``effective_at_s``, the newest row winning, as the closed loop applies them;
  rows without flags (the chain's per-node controls) are not replayed;
* the flag gauges of a recording (a simulation's fleet-wide ``hedge_enabled``,
  ``degraded_mode``, ``shedding{tier}``, ``breaker_state``): a change seen
  between two scrapes is placed half-way between them (it happened at some poll
  in that interval; the midpoint is off by at most half a scrape).

The replay is a schedule, not a decider: the twin is advanced to each change and
the flags set there (``Fleet.set_flags``, the seam the closed loop uses), so a
twin run with recorded flags needs neither a policy nor the experiment layer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from relakit.calibration.recording import CalibrationError, Recording
from relakit.vocab import BREAKER_STATES, FLAG_NAMES, TIERS, Flags


@dataclass
class FlagSchedule:
    """``changes``: (time_s, flags mapping), in time order; ``source``: where from."""

    changes: list[tuple[float, dict]]
    source: str

    def degraded(self, t0: np.ndarray, t1: np.ndarray) -> np.ndarray:
        """Per interval [t0, t1]: was degraded mode on at any time in it?"""
        t0, t1 = np.asarray(t0, float), np.asarray(t1, float)
        out = np.zeros(t0.size, dtype=bool)
        times = [t for t, _ in self.changes]
        states = [bool(f.get("degraded_mode", False)) for _, f in self.changes]
        for k, (t, on) in enumerate(zip(times, states, strict=True)):
            if not on:
                continue
            until = times[k + 1] if k + 1 < len(times) else np.inf
            out |= (t0 < until) & (t1 > t)
        return out

    def frame(self) -> pl.DataFrame:
        rows = [{"time_s": t, **Flags().updated(**f).as_dict()} for t, f in self.changes]
        for r in rows:
            r["shed_tiers"] = ",".join(r["shed_tiers"])
        return pl.DataFrame(rows) if rows else pl.DataFrame({"time_s": []})


def none_schedule() -> FlagSchedule:
    return FlagSchedule([], "none")


def from_decisions(path, origin_s: float) -> FlagSchedule:
    p = Path(path)
    try:
        d = pl.read_parquet(p)
    except FileNotFoundError:
        raise CalibrationError(f"{p}: no such file; expected a decisions.parquet") from None
    except Exception as exc:  # polars raises several kinds for a damaged file
        raise CalibrationError(f"{p}: cannot read as Parquet ({str(exc).splitlines()[0]}); "
                               "expected a decisions.parquet") from None
    missing = [c for c in ("effective_at_s", "desired") if c not in d.columns]
    if missing:
        raise CalibrationError(f"{p}: missing column(s) {', '.join(missing)}; expected a "
                               "decisions table (decided_at_s, effective_at_s, desired, ...)")
    changes = []
    for i, row in enumerate(d.select("effective_at_s", "desired").iter_rows()):
        eff, desired = row
        try:
            want = json.loads(desired) if isinstance(desired, str) else desired
        except ValueError:
            raise CalibrationError(f"{p}: row {i}: column desired: not JSON: "
                                   f"{desired!r}") from None
        if not isinstance(want, dict):
            continue
        flags = {k: v for k, v in want.items() if k in FLAG_NAMES}
        if not flags or eff is None:
            continue
        changes.append((float(eff) - origin_s, flags))
    changes.sort(key=lambda c: c[0])  # stable: decision order kept within one instant
    return FlagSchedule(_only_changes(changes), f"{p} ({len(changes)} rows with flags)")


def from_gauges(rec: Recording) -> FlagSchedule | None:
    """The flags the recording's fleet gauges show, or None when it has none."""
    names = [k for k in ("hedge_enabled", "degraded_mode", "breaker_state") if k in rec.fleet]
    shed = [t for t in TIERS if ("shedding", t) in rec.fleet]
    if not names and not shed or rec.fleet_t is None:
        return None
    t = rec.fleet_t
    changes = []
    for k in range(t.size):
        f = {}
        if "hedge_enabled" in rec.fleet:
            f["hedge_enabled"] = bool(rec.fleet["hedge_enabled"][k] > 0.5)
        if "degraded_mode" in rec.fleet:
            f["degraded_mode"] = bool(rec.fleet["degraded_mode"][k] > 0.5)
        if "breaker_state" in rec.fleet and np.isfinite(rec.fleet["breaker_state"][k]):
            f["breaker"] = BREAKER_STATES[int(round(rec.fleet["breaker_state"][k]))]
        if shed:
            f["shed_tiers"] = tuple(x for x in shed if rec.fleet[("shedding", x)][k] > 0.5)
        at = 0.0 if k == 0 else float((t[k - 1] + t[k]) / 2)
        changes.append((at, f))
    return FlagSchedule(_only_changes(changes),
                        "the fleet's flag gauges (" + ", ".join(names + [f"shedding{{{x}}}"
                                                                        for x in shed]) + ")")


def _only_changes(changes: list[tuple[float, dict]]) -> list[tuple[float, dict]]:
    """Drop entries that repeat the flags already in force (the audit's holds)."""
    out, now = [], Flags()
    for t, f in changes:
        new = now.updated(**f)
        if new != now:
            out.append((t, f))
        now = new
    return out


def run_twin(scenario, schedule: FlagSchedule | None, seed: int) -> pl.DataFrame:
    """The twin's long metrics table: the scenario run with the recorded flags set at
    their times (open loop when ``schedule`` is None or empty)."""
    from relakit.experiment import run_scheduled
    from relakit.sim import Fleet

    fleet = Fleet(scenario, seed=seed, record_requests=False)
    run_scheduled(fleet, schedule.changes if schedule else [], scenario.duration_s)
    return fleet.result().metrics
