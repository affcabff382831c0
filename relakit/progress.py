"""One progress line on stderr for long runs, silent everywhere else.

A run that takes more than a few seconds (``relakit simulate``, ``replay``,
``sweep``, ``lab load``) shows where it is: done of total, elapsed, and the
time left once it can be estimated. The line rewrites itself (``\\r``) and
only appears when stderr is a terminal and the run has already lasted
``after_s``: a log file, a pipe, a test or a quick run gets nothing, so
what a command prints on stdout is the same with or without a terminal.
"""

from __future__ import annotations

import sys
import threading
import time


class Progress:
    """``update(done)`` as work advances; ``close()`` at the end (also as a context manager).

    ``total`` and ``done`` are in any unit (simulated seconds, points); ``unit``
    names it for the line. Time left is ``elapsed / done_here * (total - done)``,
    counted only over what this run did (a resumed sweep's earlier points do not
    make it look fast), and not shown until something has been done.
    """

    def __init__(self, label: str, total: float, unit: str = "", *, stream=None,
                 enabled: bool | None = None, after_s: float = 2.0, every_s: float = 0.5,
                 start: float = 0.0):
        self.label, self.total, self.unit = label, float(total), unit
        self.stream = sys.stderr if stream is None else stream
        if enabled is None:
            isatty = getattr(self.stream, "isatty", None)
            enabled = bool(isatty and isatty())
        self.enabled = enabled
        self.after_s, self.every_s = after_s, every_s
        self.t0 = time.perf_counter()
        self.start = float(start)  # already done before this run (resumed work)
        self.done = float(start)
        self.extra = ""
        self._last = -float("inf")
        self._shown = False
        self._lock = threading.Lock()

    def line(self, now: float | None = None) -> str:
        """The text of the line as it stands (what ``update`` writes)."""
        elapsed = (time.perf_counter() if now is None else now) - self.t0
        here = self.done - self.start
        unit = f" {self.unit}" if self.unit else ""
        text = f"{self.label}: {_num(self.done)}/{_num(self.total)}{unit}"
        if self.total > 0:
            text += f" ({100 * min(self.done / self.total, 1):.0f} %)"
        text += f", {elapsed:.0f} s elapsed"
        if self.done < self.total:
            if here > 0 and elapsed > 0:
                text += f", ~{elapsed / here * (self.total - self.done):.0f} s left"
            else:
                text += ", estimating time left"
        return text + (f", {self.extra}" if self.extra else "")

    def update(self, done: float, extra: str = "", total: float | None = None) -> None:
        """Record how far the work is (and its total, if only known now); redraw at
        most every ``every_s``, and only once ``after_s`` has passed."""
        with self._lock:
            self.done = float(done)
            if extra:
                self.extra = extra
            if total is not None:
                self.total = float(total)
            if not self.enabled:
                return
            now = time.perf_counter()
            if now - self.t0 < self.after_s or now - self._last < self.every_s:
                return
            self._last = now
            self._shown = True
            self.stream.write("\r" + self.line(now) + "   ")
            self.stream.flush()

    def close(self) -> None:
        """End the line (if one was shown), with its final state."""
        with self._lock:
            if self.enabled and self._shown:
                self.stream.write("\r" + self.line() + "   \n")
                self.stream.flush()
                self._shown = False

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Ticker:
    """Redraws a :class:`Progress` every ``every_s`` from a thread, so elapsed time and
    the estimate move while the work reports nothing (a sweep point that takes a
    minute). With ``wall=True`` the work is measured in wall seconds itself
    (``relakit lab load``: its phases last a known time) and ends complete."""

    def __init__(self, progress: Progress, wall: bool = False):
        self.progress, self.wall = progress, wall
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._tick, daemon=True)

    def _now_done(self) -> float:
        p = self.progress
        return min(time.perf_counter() - p.t0, p.total) if self.wall else p.done

    def _tick(self) -> None:
        while not self._stop.wait(self.progress.every_s):
            self.progress.update(self._now_done())

    def __enter__(self) -> Progress:
        if self.progress.enabled:
            self._thread.start()
        return self.progress

    def __exit__(self, exc_type, *exc) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        if self.wall and exc_type is None:
            self.progress.done = self.progress.total
        self.progress.close()


def _num(x: float) -> str:
    return f"{x:.0f}" if abs(x - round(x)) < 1e-9 or abs(x) >= 100 else f"{x:.1f}"
