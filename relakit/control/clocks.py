"""The four clocks that bound how soon a control loop can act.

RelA's lesson: a decision is only as fresh as the slowest of the Prometheus
scrape cadence, the query window, the controller's evaluation interval and the
application's config poll interval (plus any propagation delay). Each clock
has a period and a phase; a decision made at ``t`` takes effect at the first
config poll at or after ``t + propagation_s``.

These rules are written here once (evaluation and poll grids, when a decision
takes effect, how far back an evaluation reads) and every loop (closed loop,
replay, the live lab's agent) uses them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from relakit.validate import Reader, load_yaml

KEYS = ("scrape_s", "scrape_phase_s", "window_s", "eval_s", "eval_phase_s", "poll_s",
        "poll_phase_s", "propagation_s")


@dataclass(frozen=True)
class Clocks:
    scrape_s: float = 15.0
    scrape_phase_s: float = 0.0
    window_s: float = 60.0
    eval_s: float = 2.0
    eval_phase_s: float = 0.0
    poll_s: float = 2.0
    poll_phase_s: float = 0.0
    propagation_s: float = 0.0
    source: str = field(default="<clocks>", compare=False, repr=False)  # for messages

    def eval_times(self, start_s: float, end_s: float) -> np.ndarray:
        """Evaluation instants in [start, end]."""
        k0 = np.ceil((start_s - self.eval_phase_s) / self.eval_s - 1e-9)
        k1 = np.floor((end_s - self.eval_phase_s) / self.eval_s + 1e-9)
        return self.eval_phase_s + np.arange(k0, k1 + 1) * self.eval_s

    def poll_times(self, start_s: float, end_s: float) -> np.ndarray:
        """Config poll instants in [start, end]: when a data plane reads the desired state."""
        k = np.arange(np.ceil((start_s - self.poll_phase_s) / self.poll_s),
                      np.floor((end_s - self.poll_phase_s) / self.poll_s) + 1)
        return self.poll_phase_s + k * self.poll_s

    @property
    def lookback_s(self) -> float:
        """How far back an evaluation reads: its window, plus the scrape before it
        (Prometheus extrapolates a rate towards the window's edge)."""
        return self.lookback()

    def lookback(self, reach_s: float = 0.0) -> float:
        """:attr:`lookback_s` for signals that may read further back than the window
        (a PromQL signal's own range, or Prometheus' 5 min lookback: ``reach_s``)."""
        return max(self.window_s, reach_s) + 2 * self.scrape_s

    def effective_at(self, decided_s):
        """The config poll that first carries a decision made at ``decided_s``."""
        t = np.asarray(decided_s, dtype=float) + self.propagation_s
        k = np.ceil((t - self.poll_phase_s) / self.poll_s - 1e-9)
        return self.poll_phase_s + k * self.poll_s


def load_clocks(source=None, **overrides) -> Clocks:
    """Clocks from YAML (a path, a mapping or None for RelA's defaults), validated."""
    if isinstance(source, Clocks):
        return source
    data, name, _ = load_yaml(source if source is not None else {}, "clocks")
    Reader(data, name)  # an empty file or a list is reported here, with the file's name
    data = {**data, **overrides}
    r = Reader(data, name, "clocks" if name == "<clocks>" else "")
    r.only(KEYS)
    periods = {k: r.number(k, getattr(Clocks, k), lo=0, lo_open=True)
               for k in ("scrape_s", "window_s", "eval_s", "poll_s")}
    phases = {k: r.number(k, 0.0, lo=0) for k in ("scrape_phase_s", "eval_phase_s",
                                                    "poll_phase_s")}
    for k, period in (("scrape_phase_s", "scrape_s"), ("eval_phase_s", "eval_s"),
                      ("poll_phase_s", "poll_s")):
        if phases[k] >= periods[period]:
            r.fail(f"{phases[k]} must be shorter than {period} ({periods[period]})", k)
    return Clocks(**periods, **phases, propagation_s=r.number("propagation_s", 0.0, lo=0),
                  source=name)
