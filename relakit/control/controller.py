"""The controller: the policy's state machine, one evaluation at a time (closed loop, lab).

Closed loop, the experiment layer advances the fleet to each evaluation
instant, hands the controller what Prometheus would hold by then (a
:class:`~relakit.control.tsdb.TSDB`), and applies the desired state at the next
config poll. Replay (:mod:`relakit.openloop`) runs the same signals and the same
state machine over a recorded or synthetic trace, all instants at once; both
write the audit of :mod:`relakit.control.audit`.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from relakit.control import policy as P
from relakit.control.audit import DECISION_COLUMNS, audit_table, empty_decisions, format_audit
from relakit.control.clocks import Clocks
from relakit.control.decider import Decision
from relakit.control.tsdb import TSDB
from relakit.vocab import Flags

__all__ = ["DECISION_COLUMNS", "Controller", "empty_decisions", "format_audit", "hold_times",
           "sample_age", "signal_matrix", "time_in_mode"]

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
    """The policy as a decider (:mod:`relakit.control.decider`): one :meth:`decide` per
    evaluation in the closed loop and the lab, or :meth:`run` over a whole trace at once
    (replay: the same state machine, vectorised)."""

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
        self.absent: list[np.ndarray] = []  # per evaluation, which signals had no value
        self._last = np.full(len(self.policy.signals), np.nan)  # on_missing: hold

    @property
    def mode(self) -> int:
        return self.modes[-1] if self.modes else P.NORMAL

    def decide(self, tsdb: TSDB, t: float) -> Decision:
        """Decide at time t from what the TSDB holds: the desired flag state."""
        return Decision(flags=self.evaluate(tsdb, t))

    def evaluate(self, tsdb: TSDB, t: float) -> Flags:
        """Decide at time t from what the TSDB holds; return the desired flag state."""
        row = signal_matrix(self.policy, tsdb, [t], self.clocks.window_s)[0]
        return self.decide_row(t, row, float(sample_age(tsdb, [t])[0]))

    def decide_row(self, t: float, row, age_s: float = float("nan")) -> Flags:
        """Decide at time t from signal values computed elsewhere (e.g. by Prometheus
        itself, from the signals' PromQL), in the policy's signal order. An absent value
        (NaN) counts as its signal's ``on_missing`` rule says."""
        filled, absent = P.fill_missing(self.policy, np.asarray(row, dtype=float), self._last)
        row = filled[0]
        self.absent.append(absent[0])
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
        return Flags.from_mapping(self.policy.desired(int(mode)))

    def run(self, tsdb: TSDB, times, progress=None) -> None:
        """Every evaluation of a trace at once (a fresh controller): the signals as one
        matrix, the state machine in one numba loop — what :meth:`decide` would give."""
        if self.times:
            raise RuntimeError("Controller.run needs a fresh controller")
        times = np.asarray(times, dtype=float)
        sig, absent = P.fill_missing(self.policy, signal_matrix(self.policy, tsdb, times,
                                                                self.clocks.window_s),
                                     self._last)
        self.absent = list(absent)
        modes, events, runs = P.run(times, sig, *self.policy.compiled())
        self.times, self.values, self.modes, self.events, self.runs = (times, sig, modes,
                                                                       events, runs)
        self.ages = sample_age(tsdb, times)

    def decisions(self, since: int = 0) -> pl.DataFrame:
        """The audit; ``since``: only the rows of evaluation ``since`` on (a row depends on
        the evaluations up to its own, so earlier calls' rows stand as they were)."""
        if len(self.times) <= since:
            return empty_decisions()
        return audit_table(self.policy, self.clocks, np.asarray(self.times),
                           np.vstack(self.values), np.asarray(self.modes),
                           np.asarray(self.events), np.vstack(self.runs),
                           np.asarray(self.ages), since=since)

    def timeline(self) -> pl.DataFrame:
        """Per evaluation: time_s, the mode, and every signal's value."""
        names = ["normal"] + [m.name for m in self.policy.modes]
        values = (np.vstack(self.values) if len(self.values) else
                  np.zeros((0, len(self.policy.signals))))
        return pl.DataFrame({"time_s": np.asarray(self.times, dtype=float),
                             "mode": [names[m + 1] for m in self.modes],
                             **{k: values[:, i] for i, k in enumerate(self.policy.signals)}})


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
