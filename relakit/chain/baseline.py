"""Each node's own error-rate baseline, for Aegis' adaptive thresholds.

A fixed threshold fits a fleet of alike nodes; a node with a legitimately
higher error rate is then either isolated for being itself or the threshold is
raised until subtle failures elsewhere go unseen. An adaptive threshold judges
each node against its own recent past: a node breaches when its error ratio
exceeds ``factor`` x its baseline *and* the excess is at least ``min_excess``
(the factor alone would make a node with a near-zero baseline trip on noise).

The baseline must not learn a fault as normal. Two rules see to it:

* a reading enters the baseline only after it has stood for one window
  (``window_s``) without the node breaching: a step fault's first readings
  mix fault and normal traffic and do not breach yet; they are held back, and
  dropped when the breach comes (frozen while breaching);
* only readings of a healthy node count (not suspect, not on probation, not
  isolated), and the baseline spans the newest ``baseline_window_s`` of such
  readings, not of wall time: a node out for repair keeps the baseline it had.

What it cannot do: a fault that grows more slowly than the baseline window
is learned as normal (the price of adapting at all).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass
class Baseline:
    """One node's trailing baseline: a volume-weighted mean of committed readings."""

    window_s: float  # how long the newest healthy readings span
    hold_s: float  # how long a reading waits before it counts (the readings' window)
    pending: deque = field(default_factory=deque)  # (t, ratio, volume), not yet committed
    kept: deque = field(default_factory=deque)  # (t, ratio, volume), committed
    _errors: float = 0.0  # sum of ratio x volume over kept (running, so value is O(1))
    _volume: float = 0.0

    def observe(self, t: float, ratio: float, volume: float) -> None:
        """A healthy, non-breaching reading at t (ignored without traffic)."""
        if ratio == ratio and volume > 0:
            self.pending.append((t, ratio, volume))
        while self.pending and self.pending[0][0] <= t - self.hold_s:
            item = self.pending.popleft()
            self.kept.append(item)
            self._errors += item[1] * item[2]
            self._volume += item[2]
        while self.kept and self.kept[0][0] < self.kept[-1][0] - self.window_s:
            _, r, v = self.kept.popleft()
            self._errors -= r * v
            self._volume -= v
        if not self.kept:
            self._errors = self._volume = 0.0

    def freeze(self) -> None:
        """The node breaches (or is out): what has not been committed is not normal."""
        self.pending.clear()

    @property
    def value(self) -> float:
        """The baseline error ratio; nan until a reading has been committed."""
        return self._errors / self._volume if self.kept and self._volume > 0 else float("nan")

    @property
    def span_s(self) -> float:
        return self.kept[-1][0] - self.kept[0][0] if self.kept else 0.0
