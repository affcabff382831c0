"""The in-path mechanisms in the live lab (issue 33, part 4): the client's adaptive
throttle and a server's adaptive concurrency limit, as the simulator runs them.

Both are switched on by the keys the simulator reads, ``mitigations.client_throttle``
and ``mitigations.concurrency_limit`` of a scenario (:func:`lab_mitigations` checks
them with the simulator's own reader, so a bad value gets the same one-line error);
a mitigation the lab cannot run (``codel``, ``hedge``, ...) is refused by name.

- :class:`ClientThrottle` (the load generator's, and the front's for an outside load
  tool): SRE client-side throttling over a sliding window cut into
  :data:`WINDOW_BUCKETS` buckets as the kernel's (``throttle_slot``); a request is
  counted when attempted, an accept when a server answered it (200 or 500) in time;
  a rejected request never leaves the client (outcome ``throttled``).
- :class:`ConcurrencyLimit` (each data-plane instance's): requests admitted and not
  finished (in service or waiting) may not exceed the limit; one over it is refused at
  once (outcome ``rejected``, HTTP 429). The limit learns from each finished request's
  time in the instance: AIMD (+1/limit, x backoff on a deadline missed or a time over
  ``latency_ms``) or the gradient controller (a window's mean against the least
  window mean of the last period), clamped to [min, max] — the kernel's
  ``gradient_limit`` and its AIMD lines, in Python.

``cost_us`` is what deciding costs, as in the simulator: the throttle's is latency at
the client before each request it judges, the limit's service time added to each
request the instance serves. A policy's local flags (``throttle_k``,
``concurrency_max``, relakit.vocab.LOCAL_FLAGS) reach both through the config server.
"""

from __future__ import annotations

import asyncio
import math
import random

from relakit.validate import ScenarioError

LAB_MITIGATIONS = ("client_throttle", "concurrency_limit")  # what the lab runs
WINDOW_BUCKETS = 10  # the throttle window's buckets: the kernel's BUDGET_BUCKETS
# what a live run of the lab's concurrency limit is held to beside its simulated twin, one
# source for tests/test_lab_in_path.py (every live run) and notebook 07 (the recorded one).
# A live request adds its HTTP round trips through Python on loopback, on 2 cores shared
# with Prometheus and the generator (p50 166 ms live against 140 simulated at load 10,
# measured); the p99 of ~70 gold successes is nearly their maximum, so it is held to the
# prediction interval of one simulated run, widened by that
TWIN_OK_SHARE_SPARE = 0.03  # live success share beyond one simulated run's 95 % prediction interval
TWIN_P50_RATIO = (0.8, 1.5)  # live / simulated mean, p50
TWIN_P99_RATIO = (0.6, 1.6)  # live / simulated one-run 95 % prediction interval's ends, p99


def lab_mitigations(source, where: str = "") -> dict:
    """The in-path mitigations of a scenario (a YAML path or a mapping), as the lab runs
    them: ``{"client_throttle": {...}, "concurrency_limit": {...}}`` with every default
    filled in (the simulator's reader checks them). Any other mitigation given is refused
    with its key: the lab would silently run without it."""
    from dataclasses import asdict

    from relakit.scenario import load_scenario
    from relakit.validate import load_yaml

    data, name, _ = load_yaml(source, "scenario")
    name = where or name
    mit = (data or {}).get("mitigations") if isinstance(data, dict) else None
    for key in (mit or {}) if isinstance(mit, dict) else ():
        if key not in LAB_MITIGATIONS and mit[key] is not None:
            raise ScenarioError(f"{name}: key 'mitigations.{key}': the live lab runs only "
                                f"{' and '.join(LAB_MITIGATIONS)}; remove it (the lab would "
                                "run without it)")
    sc = load_scenario(source)
    out = {}
    for key in LAB_MITIGATIONS:
        mech = getattr(sc.mitigations, key)
        if mech is not None:
            out[key] = asdict(mech)
    return out


class ClientThrottle:
    """SRE client-side adaptive throttling: reject locally with probability
    max(0, (requests - k accepts) / (requests + 1)) over the last ``window_s``."""

    def __init__(self, k: float, window_s: float, cost_us: float = 0.0, seed: int = 0,
                 buckets: int = WINDOW_BUCKETS):
        self.k, self.cost_s = float(k), cost_us / 1e6
        self.width = window_s / buckets
        self.n = buckets
        self.req = [0] * buckets
        self.acc = [0] * buckets
        self.requests = self.accepts = 0  # the window's totals
        self.bucket = 0
        self.rng = random.Random(seed)
        self.throttled = 0  # every request it refused (client_throttled_total)

    def _slot(self, t: float) -> int:
        b = int(t / self.width)
        if b > self.bucket:  # the buckets the window leaves behind are forgotten
            for i in range(self.bucket + 1, min(b, self.bucket + self.n) + 1):
                s = i % self.n
                self.requests -= self.req[s]
                self.accepts -= self.acc[s]
                self.req[s] = self.acc[s] = 0
            self.bucket = b
        return b % self.n

    def judge(self, t: float, k: float | None = None) -> bool:
        """Count a request at time t (s, any origin); True: throttle it (``k``: a
        policy's ``throttle_k``, None the scenario's own)."""
        k = self.k if k is None else k
        slot = self._slot(t)
        p = (self.requests - k * self.accepts) / (self.requests + 1.0)
        self.req[slot] += 1
        self.requests += 1
        if p > 0.0 and self.rng.random() < p:
            self.throttled += 1
            return True
        return False

    def accepted(self, t: float) -> None:
        """A server answered a request the throttle let through."""
        slot = self._slot(t)
        self.acc[slot] += 1
        self.accepts += 1


class ConcurrencyLimit:
    """One instance's adaptive limit on requests admitted and not finished."""

    def __init__(self, algorithm: str = "aimd", initial: float = 20.0, min: float = 1.0,
                 max: float = 1000.0, backoff: float = 0.9, latency_ms: float | None = None,
                 window: int = 100, period: int = 10, buffer: float = 0.25,
                 cost_us: float = 0.0):
        self.algorithm = algorithm
        self.limit = float(initial)
        self.lo, self.hi, self.ceiling = float(min), float(max), float(max)
        self.backoff = backoff
        self.latency_s = math.inf if latency_ms is None else latency_ms / 1000.0
        self.window, self.period, self.buffer = int(window), int(period), buffer
        self.cost_s = cost_us / 1e6
        self.sum, self.count, self.windows = 0.0, 0, 0
        self.min_rtt = self.period_min = math.inf
        self.rejected = 0  # rejected_total

    def admits(self, held: int) -> bool:
        """Whether one more request may come in while ``held`` are admitted; a refusal
        is counted."""
        if held + 1 > self.limit:
            self.rejected += 1
            return False
        return True

    def set_ceiling(self, ceiling: float | None) -> None:
        """A policy's ``concurrency_max`` (None: the scenario's max): a lowered ceiling
        clamps the limit at once."""
        self.ceiling = max(self.hi if ceiling is None else float(ceiling), self.lo)
        self.limit = min(self.limit, self.ceiling)

    def learn(self, seconds: float, timed_out: bool) -> None:
        """A finished request's time in the instance (queue and service)."""
        limit = self.limit
        if self.algorithm == "gradient":
            self.sum += seconds
            self.count += 1
            if self.count < self.window:
                return
            limit = self._gradient()
        elif seconds > self.latency_s or timed_out:
            limit *= self.backoff
        else:
            limit += 1.0 / limit
        self.limit = min(max(limit, self.lo), self.ceiling)

    def _gradient(self) -> float:
        sample = self.sum / self.count
        self.sum, self.count = 0.0, 0
        self.period_min = min(self.period_min, sample)
        self.min_rtt = min(self.min_rtt, sample)
        self.windows += 1
        if self.windows >= self.period:  # a new period: minima older than the last go
            self.min_rtt, self.period_min, self.windows = self.period_min, math.inf, 0
        g = self.min_rtt * (1.0 + self.buffer) / sample if sample > 0.0 else 2.0
        limit = self.limit * min(max(g, 0.5), 2.0)
        return limit + math.sqrt(limit)


__all__ = ["LAB_MITIGATIONS", "TWIN_OK_SHARE_SPARE", "TWIN_P50_RATIO", "TWIN_P99_RATIO",
           "WINDOW_BUCKETS", "ClientThrottle", "ConcurrencyLimit", "lab_mitigations"]


async def first_answer(tasks: set, answered) -> asyncio.Future:
    """Of one call's hedged copies (``tasks``), the first whose result ``answered``
    accepts, else the last to finish: the simulator ends a call on its first ok copy or
    when no copy is left, so a copy refused at once (throttled, rejected, a full queue)
    or failed ends nothing while another is outstanding. The task is returned (its
    ``result()`` raises what it raised); the others are left to the caller."""
    pending = set(tasks)
    while True:
        done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            if not task.cancelled() and task.exception() is None and answered(task.result()):
                return task
        if not pending:
            return next(iter(done))
