"""The data plane's specification: what a :class:`~relakit.sim.Fleet` runs, and its readers.

Workload, fleet, faults, static controls, mitigations and metrics are frozen
dataclasses read here, each key checked once with an error that names the file,
the key and what is allowed. A scenario (:mod:`relakit.scenario`) composes this
specification with a control plane (policy, chain, clocks); the data plane
itself never sees those, so ``relakit.sim`` imports nothing of control or chain.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from relakit.validate import SEED_MAX, Reader, ScenarioError, display_path
from relakit.vocab import (  # noqa: F401 - re-exported
    BREAKER_STATES,
    CANCELS,
    CONCURRENCY_ALGORITHMS,
    FAILED,
    IN_PATH_KEYS,
    NOT_OK,
    ON_TIMEOUT,
    QUEUE_DISCIPLINES,
    ROUTINGS,
    SERVICE_PARAMS,
    SHEDDABLE,
    TIER_MIX,
    TIERS,
    Flags,
)

TIER_NAMES = TIERS  # the name scenarios have always used
ARRIVAL_PARAMS = {
    "poisson": ("rate_rps",),
    "step": ("rate_rps", "to_rps", "at_s"),
    "spike": ("rate_rps", "peak_rps", "start_s", "width_s"),
    "ramp": ("from_rps", "to_rps", "start_s", "end_s"),
    "diurnal": ("mean_rps", "amplitude", "period_s", "phase_s"),
    "trace": ("path", "points", "interpolation"),
}
RETRYABLE = NOT_OK
MAX_NODES = 100_000  # the kernel keeps per-node arrays; past this the metrics grid alone is huge
MAX_SERVERS = 1_000_000  # per node
# Prometheus client libraries' default histogram buckets, in seconds
PROMETHEUS_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass(frozen=True)
class Arrival:
    """The user-request arrival rate over time, as a piecewise-linear table."""

    kind: str
    times_s: tuple[float, ...]
    rates_rps: tuple[float, ...]

    @property
    def constant(self) -> bool:
        return len(set(self.rates_rps)) == 1

    def rate_at(self, t_s):
        """Rate at time(s) t; a repeated time in the table is a step (later value wins)."""
        t = np.atleast_1d(np.asarray(t_s, dtype=float))
        times = np.asarray(self.times_s)
        rates = np.asarray(self.rates_rps)
        i = np.clip(np.searchsorted(times, t, side="right") - 1, 0, len(times) - 1)
        j = np.minimum(i + 1, len(times) - 1)
        dt = times[j] - times[i]
        frac = np.where(dt > 0, (t - times[i]) / np.where(dt > 0, dt, 1.0), 1.0)
        frac = np.clip(frac, 0.0, 1.0)
        out = np.where(t < times[0], rates[0], rates[i] + (rates[j] - rates[i]) * frac)
        return out if np.ndim(t_s) else float(out[0])

    def mean_rate(self, duration_s: float, warmup_s: float = 0.0) -> float:
        if self.constant:  # most scenarios; the grid below costs ~4 ms a call
            return float(self.rates_rps[0])
        t = np.linspace(warmup_s, duration_s, 20001)
        return float(np.mean(self.rate_at(t)))


@dataclass(frozen=True)
class Service:
    kind: str
    params: dict

    @property
    def mean_ms(self) -> float:
        if self.kind in ("bimodal", "hyperexponential"):
            p = self.params["slow_fraction"]
            return (1 - p) * self.params["fast_ms"] + p * self.params["slow_ms"]
        return self.params["mean_ms"]


@dataclass(frozen=True)
class Fault:
    node: int
    start_s: float
    end_s: float
    error_rate: float = 0.0
    slowdown: float = 1.0
    crash: bool = False
    wrong_rate: float = 0.0  # silent failure: answers wrong, reports success


@dataclass(frozen=True)
class Controls:
    """The control state at t = 0; a control plane changes it later."""

    hedge_enabled: bool = False
    shed_tiers: tuple[str, ...] = ()
    degraded_mode: bool = False
    breaker: str = "closed"
    isolation: str = "finish"  # work queued on a node made unroutable: finish | failover
    throttle_excess: str = "reject"  # over a node's intake limit: reject | elsewhere
    # flags set at given times without a control plane (a recorded one, replayed):
    # ((at_s, ((flag, value), ...)), ...) in time order
    schedule: tuple = ()

    @property
    def shed_bronze(self) -> bool:
        return "bronze" in self.shed_tiers

    @property
    def flags(self) -> Flags:
        """The flags at t = 0, typed as every layer passes them."""
        return Flags(hedge_enabled=self.hedge_enabled, degraded_mode=self.degraded_mode,
                     shed_tiers=self.shed_tiers, breaker=self.breaker)


@dataclass(frozen=True)
class Hedge:
    delay_ms: float = 20.0
    delay_quantile: float | None = None  # adaptive: this quantile of observed latency
    cancel: str = "queued"
    max_hedges: int = 1


@dataclass(frozen=True)
class Retries:
    max_attempts: int = 1
    backoff_ms: float = 10.0
    backoff_max_ms: float = 1000.0
    jitter: bool = True  # full jitter: uniform in [0, backoff]
    budget_ratio: float | None = None  # retries / first attempts over the window; None: none
    budget_window_s: float = 10.0
    retry_on: tuple[str, ...] = FAILED
    # abandon: an attempt past its deadline is given up on (the server still serves it);
    # keep_listening: its late answer still answers the request until the request ends
    on_timeout: str = "abandon"


@dataclass(frozen=True)
class Initial:
    """The state a run starts from (``initial:``): per node, requests already there at
    t = 0 (each a one-call request whose first attempt was sent at 0: the first
    ``servers`` in service, the rest queued), and requests whose first attempt failed
    just before 0, their retry due after one backoff. Empty: the run starts idle."""

    queue: tuple[int, ...] = ()  # per node; () : none
    pending_retries: int = 0

    @property
    def empty(self) -> bool:
        return not any(self.queue) and self.pending_retries == 0


@dataclass(frozen=True)
class Degraded:
    service_factor: float = 0.5
    fanout: int | None = None  # partial fan-out while degraded


@dataclass(frozen=True)
class Breaker:
    reject_tiers: tuple[str, ...] = SHEDDABLE
    half_open_admit: float = 0.1


# ---- the in-path mechanisms (issue 33): each decides per request from local state, at
# once, in the data plane; ``cost_us`` is what deciding costs (a server's: service time
# added to each request it serves; the client's: latency added to each copy it judges)
@dataclass(frozen=True)
class ClientThrottle:
    """Client-side adaptive throttling (SRE book): reject locally with probability
    max(0, (requests - k accepts) / (requests + 1)) over a sliding window."""

    k: float = 2.0
    window_s: float = 120.0
    cost_us: float = 0.0


@dataclass(frozen=True)
class ConcurrencyLimit:
    """A server's adaptive limit on the copies in flight at a node (queued or served)."""

    algorithm: str = "aimd"
    initial: float = 20.0
    min: float = 1.0
    max: float = 1000.0
    backoff: float = 0.9  # aimd: the limit's factor on a timeout or a slow answer
    latency_ms: float | None = None  # aimd: slower than this (at the server) is a failure
    window: int = 100  # gradient: samples a window's mean rtt is taken over
    period: int = 10  # gradient: windows a minimum rtt is kept for
    buffer: float = 0.25  # gradient: the minimum rtt's tolerance (Envoy's buffer)
    cost_us: float = 0.0


@dataclass(frozen=True)
class CoDel:
    """Queue-delay-based shedding at each node (Nichols and Jacobson)."""

    target_ms: float = 5.0
    interval_ms: float = 100.0
    cost_us: float = 0.0


@dataclass(frozen=True)
class Mitigations:
    hedge: Hedge = Hedge()
    retries: Retries = Retries()
    degraded: Degraded = Degraded()
    breaker: Breaker = Breaker()
    client_throttle: ClientThrottle | None = None
    concurrency_limit: ConcurrencyLimit | None = None
    codel: CoDel | None = None


@dataclass(frozen=True)
class Metrics:
    interval_s: float = 1.0
    phase_s: tuple[float, ...] = ()  # per node; empty: all at 0
    latency_buckets_s: tuple[float, ...] = PROMETHEUS_BUCKETS_S


@dataclass(frozen=True)
class Clients:
    """A closed client population per tier (``workload.clients``): each client sends a
    request, waits for its outcome, thinks for a time of its tier's think distribution
    (the service kinds), and sends again. The rate it offers is an outcome of the run,
    not an input: it falls as latency rises."""

    population: dict  # tier -> clients (int), every tier present (with steps: its largest N)
    think: dict  # tier -> Service, every tier present
    # a population schedule: ((at_s, {tier: N}), ...), the first at 0; None: constant
    steps: tuple | None = None

    @property
    def total(self) -> int:
        return sum(self.population.values())

    @property
    def tiers(self) -> tuple[str, ...]:
        """The tiers with clients, in vocab order."""
        return tuple(t for t in TIERS if self.population[t] > 0)

    def max_rate(self) -> float:
        """Requests a second if every answer were instant: the sum over tiers of N / Z
        (the interactive law's bound X <= N / Z)."""
        return sum(n / (self.think[t].mean_ms / 1000.0) for t, n in self.population.items()
                   if n > 0)


# an open workload's arrival when only clients are given: nothing arrives
NO_ARRIVAL = Arrival("none", (0.0,), (0.0,))


@dataclass(frozen=True)
class Workload:
    arrival: Arrival
    tiers: dict
    fanout: int = 1
    deadline_ms: float | None = None
    clients: Clients | None = None  # a closed population, instead of or beside arrival

    @property
    def open(self) -> bool:
        """Whether an open (Poisson) arrival stream is part of the workload."""
        return self.arrival.kind != "none"


@dataclass(frozen=True)
class FleetSpec:
    nodes: int
    servers: tuple[int, ...]
    service: Service
    queue_limit: int | None = None
    routing: str = "random"
    weights: tuple[float, ...] = ()
    # error probability against load (in flight per server): ((load, p), ...), linear between
    load_errors: tuple[tuple[float, float], ...] = ()
    # (node, depends_on, share): that share of node's work calls depends_on, and fails with it
    dependencies: tuple[tuple[int, int, float], ...] = ()
    # per node: the error probability of normal operation (no fault; a repair keeps it)
    baseline_error_rates: tuple[float, ...] = ()
    # correctness probes a second, per node (fleet.probes.rate_rps; 0: none)
    probe_rate_rps: float = 0.0
    # nodes per zone, in node order (empty: one zone); each zone's share of the arrivals
    zones: tuple[int, ...] = ()
    zone_mix: tuple[float, ...] = ()
    # per node, a multiplier on fleet.service's demand (empty: 1 everywhere); see _scale
    service_scale: tuple[float, ...] = ()
    # the order a node serves its queue: fifo | lifo | adaptive_lifo (with mitigations.codel)
    queue_discipline: str = "fifo"

    @property
    def scales(self) -> tuple[float, ...]:
        """Each node's multiplier on the service demand (1.0 where the fleet is uniform)."""
        return self.service_scale or (1.0,) * self.nodes

    @property
    def node_mean_ms(self) -> tuple[float, ...]:
        """Each node's mean service time: fleet.service's mean times the node's scale."""
        return tuple(self.service.mean_ms * s for s in self.scales)

    @property
    def node_capacity_rps(self) -> tuple[float, ...]:
        """Requests per second each node serves at 100 % utilisation."""
        return tuple(c / (m / 1000.0) for c, m in zip(self.servers, self.node_mean_ms,
                                                      strict=True))

    @property
    def capacity_rps(self) -> float:
        """Requests per second the fleet serves at 100 % utilisation."""
        return sum(self.node_capacity_rps)

    def node_shares(self, fanout: int = 1) -> tuple[float, ...] | None:
        """Each node's share of the copies when routing fixes it (random or round robin
        by weight, one copy a request); None where it depends on the state (jsq, p2c)
        or on fan-out (distinct nodes per request)."""
        if self.routing not in ("random", "round_robin") or fanout != 1:
            return None
        total = sum(self.weights)
        return tuple(w / total for w in self.weights)


def in_path(sc) -> bool:
    """Whether a data plane runs an in-path mechanism (issue 33): its tables then carry
    the ``throttled`` and ``rejected`` outcomes and the mechanisms' series; without one
    they are what they were before (every shipped scenario's tables bit for bit)."""
    mit = sc.mitigations
    return (any(getattr(mit, k) is not None for k in IN_PATH_KEYS)
            or sc.fleet.queue_discipline != "fifo")


class DataPlane(Protocol):
    """What the fleet reads of a scenario: the data plane's part, nothing of its control."""

    name: str
    duration_s: float
    seed: int
    workload: Workload
    fleet: FleetSpec
    faults: tuple[Fault, ...]
    warmup_s: float
    controls: Controls
    mitigations: Mitigations
    metrics: Metrics
    initial: Initial


def read_data_plane(r: Reader, base_dir: Path, control=None) -> dict:
    """The data plane's fields of a scenario mapping, as keyword arguments.

    ``control`` (optional) is called after the faults are read and must return
    (policy, clocks, chain): with a control loop the scrape interval and phase
    default to the clocks'. Keys are read in one fixed order, so a file with two
    mistakes always reports the same one first.
    """
    duration = r.number("duration_s", lo=0, lo_open=True)
    warmup = r.number("warmup_s", 0.0, lo=0)
    if warmup >= duration:
        r.fail(f"{warmup} must be shorter than duration_s ({duration})", "warmup_s")
    fleet = _fleet(r.sub("fleet"))
    workload = _workload(r.sub("workload"), duration, fleet.nodes, base_dir)
    if workload.clients is not None and fleet.zones:
        r.fail("a closed client population in a zoned fleet is not modelled (each zone runs "
               "its own kernel on its share of the open arrivals); drop fleet.zones or give "
               "workload.arrival", "workload.clients")
    faults = _faults(r, fleet.nodes)
    policy, clocks, chain = control() if control is not None else (None, None, None)
    name = r.data.get("name", "scenario")
    if not isinstance(name, str) or not name:
        r.fail(f"expected a non-empty string, got {name!r}", "name")
    seed = r.number("seed", 1, lo=0, hi=SEED_MAX, integer=True)
    controls = _controls(r.sub("controls"), duration)
    mitigations = _mitigations(r.sub("mitigations"), fleet.nodes, workload.fanout)
    _check_on_timeout(r.sub("mitigations").sub("retries"), mitigations.retries, workload)
    if fleet.queue_discipline == "adaptive_lifo" and mitigations.codel is None:
        r.sub("fleet").fail("adaptive_lifo serves newest first while CoDel finds the queue "
                            "congested: give mitigations.codel too, or use fifo or lifo",
                            "queue_discipline")
    return dict(
        name=name, duration_s=duration, seed=seed, workload=workload,
        fleet=fleet, faults=faults, warmup_s=warmup, controls=controls,
        mitigations=mitigations,
        initial=_initial(r.sub("initial"), fleet, workload, mitigations.retries),
        metrics=_metrics(r.sub("metrics"), fleet.nodes, r.number("seed", 1, lo=0, integer=True),
                         clocks),
        policy=policy, clocks=clocks, chain=chain, source=r.source,
    )


def _flag(r: Reader, key, default=False) -> bool:
    value = r.data.get(key, default)
    if not isinstance(value, bool):
        r.fail(f"expected true or false, got {value!r}", key)
    return value


def _tiers(r: Reader, key, default=()) -> tuple[str, ...]:
    value = r.data.get(key, list(default))
    if not isinstance(value, list) or any(v not in TIER_NAMES for v in value):
        r.fail(f"expected a list of tiers from {', '.join(TIER_NAMES)}, got {value!r}", key)
    return tuple(t for t in TIER_NAMES if t in value)


SCHEDULE_FLAGS = ("hedge_enabled", "degraded_mode", "shed_tiers", "breaker")


def _schedule(r: Reader, duration: float) -> tuple:
    """`controls.schedule: [{at_s, hedge_enabled, degraded_mode, shed_tiers, breaker}, ...]`:
    the flags set at each time (the others left as they are), in time order, with no
    control plane: what a recorded one did, replayed (relakit calibrate writes it)."""
    raw = r.data.get("schedule")
    if raw is None:
        return ()
    if not isinstance(raw, list) or not raw:
        r.fail("expected a list of {at_s, and some of " + ", ".join(SCHEDULE_FLAGS) + "}",
               "schedule")
    out, last = [], 0.0
    for i, item in enumerate(raw):
        s = Reader(item, r.source, f"{r.path}.schedule[{i}]")
        s.only({"at_s", *SCHEDULE_FLAGS})
        at = s.number("at_s", lo=0.0, hi=duration)
        if at < last:
            s.fail(f"{at:g} is before the previous change ({last:g}): times must not "
                   "decrease", "at_s")
        last = at
        flags = {}
        for k in ("hedge_enabled", "degraded_mode"):
            if k in s.data:
                flags[k] = _flag(s, k)
        if "shed_tiers" in s.data:
            tiers = _tiers(s, "shed_tiers")
            if "gold" in tiers:
                s.fail("gold bypasses shedding and cannot be shed; allowed: silver, bronze",
                       "shed_tiers")
            flags["shed_tiers"] = tiers
        if "breaker" in s.data:
            flags["breaker"] = s.choice("breaker", BREAKER_STATES)
        if not flags:
            s.fail("sets no flag: give some of " + ", ".join(SCHEDULE_FLAGS))
        out.append((at, tuple(flags.items())))  # (pairs: the dataclass stays hashable)
    return tuple(out)


def _controls(r: Reader, duration: float = math.inf) -> Controls:
    r.only({"hedge_enabled", "shed_bronze", "shed_tiers", "degraded_mode", "breaker",
            "isolation", "throttle_excess", "schedule"})
    shed = set(_tiers(r, "shed_tiers"))
    if _flag(r, "shed_bronze"):
        shed.add("bronze")
    if "gold" in shed:
        r.fail("gold bypasses shedding and cannot be shed; allowed: silver, bronze", "shed_tiers")
    return Controls(
        hedge_enabled=_flag(r, "hedge_enabled"),
        shed_tiers=tuple(t for t in TIER_NAMES if t in shed),
        degraded_mode=_flag(r, "degraded_mode"),
        breaker=r.choice("breaker", BREAKER_STATES, "closed"),
        isolation=r.choice("isolation", ("finish", "failover"), "finish"),
        throttle_excess=r.choice("throttle_excess", ("reject", "elsewhere"), "reject"),
        schedule=_schedule(r, duration),
    )


def _mitigations(r: Reader, nodes: int, fanout: int) -> Mitigations:
    r.only({"hedge", "retries", "degraded", "breaker", *IN_PATH_KEYS})
    h = r.sub("hedge")
    h.only({"delay_ms", "delay_quantile", "cancel", "max_hedges"})
    hedge = Hedge(
        delay_ms=h.number("delay_ms", 20.0, lo=0),
        delay_quantile=h.number("delay_quantile", None, lo=0, hi=1, lo_open=True,
                                nullable=True),
        cancel=h.choice("cancel", CANCELS, "queued"),
        max_hedges=h.number("max_hedges", 1, lo=1, hi=3, integer=True),
    )
    t = r.sub("retries")
    t.only({"max_attempts", "backoff_ms", "backoff_max_ms", "jitter", "budget_ratio",
            "budget_window_s", "retry_on", "on_timeout"})
    retry_on = t.data.get("retry_on", list(FAILED))
    if not isinstance(retry_on, list) or any(v not in RETRYABLE for v in retry_on):
        t.fail(f"expected a list from {', '.join(RETRYABLE)}, got {retry_on!r}", "retry_on")
    retries = Retries(
        on_timeout=t.choice("on_timeout", ON_TIMEOUT, "abandon"),
        max_attempts=t.number("max_attempts", 1, lo=1, hi=100, integer=True),
        backoff_ms=t.number("backoff_ms", 10.0, lo=0),
        backoff_max_ms=t.number("backoff_max_ms", 1000.0, lo=0),
        jitter=_flag(t, "jitter", True),
        budget_ratio=t.number("budget_ratio", None, lo=0, nullable=True),
        budget_window_s=t.number("budget_window_s", 10.0, lo=0, lo_open=True),
        retry_on=tuple(v for v in RETRYABLE if v in retry_on),
    )
    d = r.sub("degraded")
    d.only({"service_factor", "fanout"})
    degraded = Degraded(
        service_factor=d.number("service_factor", 0.5, lo=0, hi=1, lo_open=True),
        fanout=d.number("fanout", None, lo=1, hi=nodes, integer=True, nullable=True),
    )
    if degraded.fanout is not None and degraded.fanout > fanout:
        d.fail(f"{degraded.fanout} sub-requests while degraded is more than the workload's "
               f"fan-out ({fanout}): degraded mode would ask more, not fewer; give at most "
               f"{fanout}", "fanout")
    b = r.sub("breaker")
    b.only({"reject_tiers", "half_open_admit"})
    breaker = Breaker(reject_tiers=_tiers(b, "reject_tiers", SHEDDABLE),
                      half_open_admit=b.number("half_open_admit", 0.1, lo=0, hi=1))
    return Mitigations(hedge=hedge, retries=retries, degraded=degraded, breaker=breaker,
                       **_in_path(r))


def _in_path(r: Reader) -> dict:
    """``mitigations.client_throttle``, ``.concurrency_limit``, ``.codel`` (issue 33):
    absent (or null) is off; given, each key is checked alone and against the others."""
    out = {}
    if r.data.get("client_throttle") is not None:
        t = r.sub("client_throttle")
        t.only({"k", "window_s", "cost_us"})
        out["client_throttle"] = ClientThrottle(
            k=t.number("k", 2.0, lo=1, hi=1e6),
            window_s=t.number("window_s", 120.0, lo=0, lo_open=True),
            cost_us=t.number("cost_us", 0.0, lo=0, hi=1e9))
    if r.data.get("concurrency_limit") is not None:
        c = r.sub("concurrency_limit")
        algo = c.choice("algorithm", CONCURRENCY_ALGORITHMS, "aimd")
        own = {"aimd": {"backoff", "latency_ms"},
               "gradient": {"window", "period", "buffer"}}[algo]
        c.only({"algorithm", "initial", "min", "max", "cost_us", *own})
        lo = c.number("min", 1.0, lo=1, hi=1e9)
        hi = c.number("max", 1000.0, lo=1, hi=1e9)
        if hi < lo:
            c.fail(f"{hi:g} is below min ({lo:g}): the limit would have no room", "max")
        initial = c.number("initial", min(max(20.0, lo), hi), lo=0, lo_open=True)
        if not lo <= initial <= hi:
            c.fail(f"{initial:g} must be within min and max ({lo:g} .. {hi:g})", "initial")
        out["concurrency_limit"] = ConcurrencyLimit(
            algorithm=algo, initial=initial, min=lo, max=hi,
            backoff=c.number("backoff", 0.9, lo=0, hi=1, lo_open=True),
            latency_ms=c.number("latency_ms", None, lo=0, lo_open=True, nullable=True),
            window=c.number("window", 100, lo=1, hi=10**9, integer=True),
            period=c.number("period", 10, lo=1, hi=10**9, integer=True),
            buffer=c.number("buffer", 0.25, lo=0, hi=10),
            cost_us=c.number("cost_us", 0.0, lo=0, hi=1e9))
        if algo == "aimd" and c.data.get("backoff") == 1:
            c.fail("1 never decreases the limit: give a factor below 1 (e.g. 0.9)", "backoff")
    if r.data.get("codel") is not None:
        d = r.sub("codel")
        d.only({"target_ms", "interval_ms", "cost_us"})
        target = d.number("target_ms", 5.0, lo=0, lo_open=True)
        interval = d.number("interval_ms", 100.0, lo=0, lo_open=True)
        if target >= interval:
            d.fail(f"{target:g} ms is not below interval_ms ({interval:g} ms): CoDel drops "
                   "once the delay stays above target for an interval (5 and 100 by "
                   "default)", "target_ms")
        out["codel"] = CoDel(target_ms=target, interval_ms=interval,
                             cost_us=d.number("cost_us", 0.0, lo=0, hi=1e9))
    return out


def _check_on_timeout(r: Reader, retries: Retries, workload: Workload) -> None:
    """keep_listening changes a run only where an attempt can time out and be retried:
    refused by name elsewhere rather than silently meaning abandon."""
    if retries.on_timeout != "keep_listening":
        return
    if workload.deadline_ms is None:
        r.fail("keep_listening listens past an attempt's deadline; give "
               "workload.deadline_ms, or use on_timeout: abandon", "on_timeout")
    if retries.max_attempts < 2 or "timeout" not in retries.retry_on:
        r.fail("keep_listening listens to a timed-out attempt while its retry runs; give "
               "retries.max_attempts >= 2 and 'timeout' in retries.retry_on, or use "
               "on_timeout: abandon", "on_timeout")


def _initial(r: Reader, fleet: FleetSpec, workload: Workload, retries: Retries) -> Initial:
    """``initial: {queue: N | [N per node], pending_retries: M}``; every request must fit
    (servers + queue_limit per node) and a pending retry needs retries to happen."""
    r.only({"queue", "pending_retries"})
    if not r.data:
        return Initial()
    queue = _per_node(r, "queue", fleet.nodes, 0, lo=0, hi=10**7, integer=True)
    pending = r.number("pending_retries", 0, lo=0, hi=10**7, integer=True)
    if (any(queue) or pending) and workload.fanout != 1:
        r.fail(f"initial requests are one call each; the workload's fan-out is "
               f"{workload.fanout} (use fanout: 1)")
    if fleet.queue_limit is not None:
        for i, (n, c) in enumerate(zip(queue, fleet.servers, strict=True)):
            if n > c + fleet.queue_limit:
                r.fail(f"{n} requests at node {i} do not fit its {c} server(s) and "
                       f"fleet.queue_limit {fleet.queue_limit}; allowed: at most "
                       f"{c + fleet.queue_limit}", "queue")
    if pending and (retries.max_attempts < 2 or not retries.retry_on):
        r.fail(f"{pending} pending retries need retries: give "
               "mitigations.retries.max_attempts >= 2, or pending_retries: 0",
               "pending_retries")
    return Initial(queue=queue, pending_retries=pending)


def _metrics(r: Reader, nodes: int, seed: int, clocks=None) -> Metrics:
    r.only({"interval_s", "phase_s", "latency_buckets_s"})
    default_interval = 1.0 if clocks is None else clocks.scrape_s
    interval = r.number("interval_s", default_interval, lo=0, lo_open=True)
    if clocks is not None and interval != clocks.scrape_s:
        r.fail(f"{interval} differs from clocks.scrape_s ({clocks.scrape_s}): with a control "
               "loop the scrape interval is the clocks'", "interval_s")
    if r.data.get("phase_s") == "random":  # each target scraped at its own offset, reproducibly
        phases = tuple(np.random.default_rng(seed).uniform(0, interval, nodes).tolist())
    else:  # by default the clocks' (their scrape phase was once read, checked and dropped)
        phases = _per_node(r, "phase_s", nodes, 0.0 if clocks is None else clocks.scrape_phase_s,
                           lo=0, hi=interval)
    buckets = r.data.get("latency_buckets_s", list(PROMETHEUS_BUCKETS_S))
    if (not isinstance(buckets, list) or not buckets
            or any(isinstance(b, bool) or not isinstance(b, int | float) or b <= 0
                   for b in buckets)
            or any(b2 <= b1 for b1, b2 in zip(buckets, buckets[1:], strict=False))):
        r.fail("expected an increasing list of positive bucket bounds in seconds "
               "(+Inf is implied)", "latency_buckets_s")
    return Metrics(interval_s=interval, phase_s=phases,
                   latency_buckets_s=tuple(float(b) for b in buckets))


def _items(r: Reader, key: str, values: list, **rules) -> tuple:
    """Each number of a list checked like a key of its own: ``fleet.servers[1]``."""
    return tuple(Reader({f"{key}[{i}]": v}, r.source, r.path).number(f"{key}[{i}]", **rules)
                 for i, v in enumerate(values))


def _per_node(r: Reader, key: str, nodes: int, default, **rules) -> tuple:
    """``key``: one number for every node, or a list of one per node, each checked by
    ``rules`` (:meth:`Reader.number`'s)."""
    raw = r.data.get(key, default)
    if isinstance(raw, list):
        if len(raw) != nodes:
            r.fail(f"a list must have one entry per node ({nodes}), got {len(raw)}", key)
        return _items(r, key, raw, **rules)
    return (r.number(key, default, **rules),) * nodes


def _fleet(r: Reader) -> FleetSpec:
    r.only({"nodes", "servers", "service", "queue_limit", "routing", "weights", "load_errors",
            "dependencies", "baseline_error_rate", "probes", "zones", "zone_mix",
            "service_scale", "queue_discipline"})
    nodes = r.number("nodes", 1, lo=1, hi=MAX_NODES, integer=True)
    servers = _per_node(r, "servers", nodes, 1, lo=1, hi=MAX_SERVERS, integer=True)
    weights = r.data.get("weights")
    if weights is None:
        weights = (1.0,) * nodes
    elif not isinstance(weights, list) or len(weights) != nodes:
        r.fail(f"expected a list of {nodes} non-negative numbers (one per node)", "weights")
    else:
        weights = _items(r, "weights", weights, lo=0)
        if sum(weights) <= 0:
            r.fail("at least one weight must be positive", "weights")
    return FleetSpec(
        nodes=nodes, servers=servers, service=_service(r.sub("service")),
        queue_limit=r.number("queue_limit", None, lo=0, hi=2**62, integer=True, nullable=True),
        routing=r.choice("routing", ROUTINGS, "random"), weights=weights,
        load_errors=_load_errors(r), dependencies=_dependencies(r, nodes),
        baseline_error_rates=_baseline(r, nodes), probe_rate_rps=_probes(r.sub("probes")),
        **_zones(r, nodes), service_scale=_scale(r, nodes),
        queue_discipline=r.choice("queue_discipline", QUEUE_DISCIPLINES, "fifo"),
    )


def _scale(r: Reader, nodes: int) -> tuple[float, ...]:
    """`service_scale: [s0, s1, ...]`: one positive multiplier per node on fleet.service's
    demand, so node i's mean is s_i x the service's mean with the same kind and shape.

    Why a multiplier and not a service per node: the demands of a request's whole fan-out
    are drawn at arrival, before routing, from one stream (common random numbers across
    policies need that); the node scales the drawn demand when it starts serving it, as a
    fault's slowdown does, so nothing node-dependent is drawn. Empty (the default): all 1.
    """
    raw = r.data.get("service_scale")
    if raw is None:
        return ()
    if not isinstance(raw, list) or len(raw) != nodes:
        got = f"{len(raw)} entries" if isinstance(raw, list) else repr(raw)
        r.fail(f"expected a list of {nodes} positive multipliers (one per node, on "
               f"fleet.service's demand), got {got}", "service_scale")
    scale = _items(r, "service_scale", raw, lo=0, lo_open=True)
    return () if all(x == 1.0 for x in scale) else tuple(float(x) for x in scale)


def _zones(r: Reader, nodes: int) -> dict:
    """`zones: [4, 4, 4]`: nodes per zone, in node order (zone 0 holds nodes 0-3, ...);
    `zone_mix`: each zone's share of the arrivals (default: its share of the nodes).
    Requests stay in their zone (see relakit.zones), so dependencies must too."""
    raw = r.data.get("zones")
    if raw is None:
        if "zone_mix" in r.data:
            r.fail("shares the arrivals between zones; give fleet.zones too", "zone_mix")
        return {}
    if not isinstance(raw, list) or len(raw) < 2:
        r.fail("expected a list of at least two node counts (nodes per zone, in node order)",
               "zones")
    zones = _items(r, "zones", raw, lo=1, integer=True)
    if sum(zones) != nodes:
        r.fail(f"nodes per zone {list(zones)} sum to {sum(zones)}; they must sum to "
               f"fleet.nodes ({nodes})", "zones")
    mix = r.data.get("zone_mix")
    if mix is None:
        mix = tuple(z / nodes for z in zones)
    elif not isinstance(mix, list) or len(mix) != len(zones):
        r.fail(f"expected a list of {len(zones)} shares (one per zone)", "zone_mix")
    else:
        mix = _items(r, "zone_mix", mix, lo=0)
        if abs(sum(mix) - 1.0) > 1e-9:
            r.fail(f"shares must sum to 1, got {sum(mix):g}", "zone_mix")
    return {"zones": tuple(int(z) for z in zones), "zone_mix": tuple(float(m) for m in mix)}


def _probes(r: Reader) -> float:
    """`probes: {rate_rps}`: synthetic requests with known answers, per node a second.

    They queue and occupy servers like requests (their cost is load) and are counted
    apart, as probe_requests_total and probe_failures_total per node.
    """
    r.only({"rate_rps"})
    rate = r.data.get("rate_rps", 0.0)
    if isinstance(rate, int | float) and not isinstance(rate, bool) and rate < 0:
        r.fail(f"must be >= 0 (probes a second per node; 0: no probes), got {rate!r}",
               "rate_rps")
    return r.number("rate_rps", 0.0, lo=0)


def _baseline(r: Reader, nodes: int) -> tuple[float, ...]:
    """`baseline_error_rate`: one probability for every node, or a list of one per node.

    It is how a node is (a legacy backend, a flaky dependency the clients retry), not a
    fault: it holds from t = 0 to the end and no repair removes it.
    """
    return _per_node(r, "baseline_error_rate", nodes, 0.0, lo=0, hi=1)


def _dependencies(r: Reader, nodes: int) -> tuple[tuple[int, int, float], ...]:
    raw = r.data.get("dependencies") or []
    if not isinstance(raw, list):
        r.fail("expected a list of {node, depends_on, share}", "dependencies")
    out, seen = [], set()
    for i, item in enumerate(raw):
        d = Reader(item, r.source, f"{r.path}.dependencies[{i}]")
        d.only({"node", "depends_on", "share"})
        node = d.number("node", lo=0, hi=nodes - 1, integer=True)
        dep = d.number("depends_on", lo=0, hi=nodes - 1, integer=True)
        if dep == node or node in seen:
            d.fail("a node depends on one other node (not itself), listed once", "depends_on")
        seen.add(node)
        out.append((node, dep, d.number("share", 1.0, lo=0, hi=1)))
    return tuple(out)


def _load_errors(r: Reader) -> tuple[tuple[float, float], ...]:
    """`load_errors: {points: [[load, p], ...]}`, load = requests in flight per server."""
    if r.data.get("load_errors") is None:
        return ()
    le = r.sub("load_errors")
    le.only({"points"})
    pts = le.data.get("points")
    if not isinstance(pts, list) or not pts:
        le.fail("expected a non-empty list of [load, error_probability] pairs", "points")
    out = []
    for i, item in enumerate(pts):
        ok = isinstance(item, list) and len(item) == 2 and all(
            isinstance(v, int | float) and not isinstance(v, bool) for v in item)
        if not ok or item[0] < 0 or not 0 <= item[1] <= 1 or (out and item[0] <= out[-1][0]):
            le.fail(f"point {i}: expected [load >= 0, 0 <= p <= 1] with increasing load, "
                    f"got {item!r}", "points")
        out.append((float(item[0]), float(item[1])))
    return tuple(out)


# each service parameter's range (lo, lo_open, hi), in SERVICE_PARAMS' order of reading
SERVICE_RANGES = {"mean_ms": (0, True, None), "fast_ms": (0, True, None),
                  "slow_ms": (0, True, None), "slow_fraction": (0, False, 1),
                  "cv": (0, True, None), "alpha": (1, True, None)}


def _service(r: Reader) -> Service:
    if not r.data:
        r.fail(f"is required: a mapping with 'kind' (one of {', '.join(SERVICE_PARAMS)})")
    kind = r.choice("kind", tuple(SERVICE_PARAMS))
    r.only({"kind", *SERVICE_PARAMS[kind]})
    p = {}
    for key in SERVICE_PARAMS[kind]:
        lo, lo_open, hi = SERVICE_RANGES[key]
        if kind == "hyperexponential" and key == "slow_fraction":  # both phases a share
            lo_open, hi = True, None
        p[key] = r.number(key, lo=lo, lo_open=lo_open, hi=hi)
        if kind == "hyperexponential" and key == "slow_ms" and p["slow_ms"] < p["fast_ms"]:
            r.fail(f"{p['slow_ms']:g} is below fast_ms {p['fast_ms']:g}: the slow phase's "
                   "mean must be >= the fast one's", "slow_ms")
    if kind == "hyperexponential" and p["slow_fraction"] >= 1:
        r.fail(f"{p['slow_fraction']!r} is out of range: must be < 1 (a share of "
               "requests in the slow phase, strictly between 0 and 1)", "slow_fraction")
    return Service(kind, p)


def _workload(r: Reader, duration: float, nodes: int, base_dir: Path) -> Workload:
    r.only({"arrival", "tiers", "fanout", "deadline_ms", "clients"})
    tiers_r = r.sub("tiers", dict(TIER_MIX))
    tiers_r.only(set(TIER_NAMES))
    tiers = {t: tiers_r.number(t, 0.0, lo=0, hi=1) for t in TIER_NAMES}
    if abs(sum(tiers.values()) - 1.0) > 1e-6:
        tiers_r.fail(f"tier fractions must sum to 1, got {sum(tiers.values()):g}")
    fanout = r.number("fanout", 1, lo=1, integer=True)
    if fanout > nodes:
        r.fail(f"{fanout} sub-requests need {fanout} distinct nodes; the fleet has {nodes}",
               "fanout")
    if "arrival" not in r.data and "clients" not in r.data:
        r.fail("give 'arrival' (an open stream), 'clients' (a closed population: "
               "{population, think}) or both", "arrival")
    clients = _clients(r.sub("clients"), tiers, duration) if "clients" in r.data else None
    if ("tiers" in r.data and "arrival" not in r.data and clients is not None
            and isinstance(r.data["clients"].get("population"), dict)):
        r.fail("splits the open arrivals and a population given as one number; here there "
               "are neither (clients.population is per tier), so it would be ignored: drop it",
               "tiers")
    return Workload(
        arrival=(_arrival(r.sub("arrival"), duration, base_dir) if "arrival" in r.data
                 else NO_ARRIVAL), tiers=tiers, fanout=fanout,
        deadline_ms=r.number("deadline_ms", None, lo=0, lo_open=True, nullable=True),
        clients=clients,
    )


MAX_CLIENTS = 10_000_000  # a thinking client holds a heap slot: past this, memory, not a model


def _split(n: int, mix: dict) -> dict:
    """A whole number of clients split over the tiers by the mix, largest remainder first."""
    exact = {t: n * mix[t] for t in TIERS}
    pop = {t: int(math.floor(exact[t])) for t in TIERS}
    rest = sorted(TIERS, key=lambda t: (-(exact[t] - pop[t]), TIERS.index(t)))
    for t in rest[: n - sum(pop.values())]:
        pop[t] += 1
    return pop


def _steps(r: Reader, key: str, raw, duration: float) -> tuple:
    """`[[at_s, N], ...]`: a population schedule, as `workload.arrival`'s trace points
    with step interpolation: N clients from at_s (the first at 0) to the next step."""
    what = ("a population schedule is a list of [at_s, N] steps, the first at 0, times "
            "increasing and below duration_s (e.g. [[0, 40], [30, 113], [80, 40]])")
    if not raw:
        r.fail(f"{what}; got an empty list", key)
    out = []
    for i, step in enumerate(raw):
        if (not isinstance(step, list) or len(step) != 2
                or any(isinstance(v, bool) or not isinstance(v, int | float) for v in step)):
            r.fail(f"step {i}: expected [at_s, N], two numbers, got {step!r}; {what}", key)
        at, n = step
        if not math.isfinite(at) or (out and at <= out[-1][0]) or at >= duration:
            r.fail(f"step {i}: at_s {at!r} must be finite, after the step before and below "
                   f"duration_s {duration:g}; {what}", key)
        if isinstance(n, float) and not n.is_integer() or not 0 <= n <= MAX_CLIENTS:
            r.fail(f"step {i}: N {n!r} must be a whole number of clients from 0 to "
                   f"{MAX_CLIENTS}; {what}", key)
        out.append((float(at), int(n)))
    if out[0][0] != 0:
        r.fail(f"the first step is at {out[0][0]:g} s: it must be at 0 (write [0, 0] for no "
               f"clients at first); {what}", key)
    return tuple(out)


def _at(steps: tuple, t: float) -> int:
    return next(n for at, n in reversed(steps) if at <= t)


def _clients(r: Reader, mix: dict, duration: float = math.inf) -> Clients:
    """`clients: {population, think}`: a closed population. `population` is a whole number
    (split over the tiers by workload.tiers, largest remainder first) or one per tier
    (`{gold: 10, bronze: 30}`, tiers left out have none); either may be a schedule of
    `[[at_s, N], ...]` steps instead of a number (:func:`_steps`); `think` is a service
    kind (`{kind: exponential, mean_ms: 1000}`) for every tier, or one per tier with
    clients."""
    r.only({"population", "think"})
    raw = r.data.get("population")
    steps = None
    if isinstance(raw, dict):
        p = r.sub("population")
        p.only(set(TIERS))
        per = {t: _steps(p, t, p.data[t], duration) for t in TIERS
               if isinstance(p.data.get(t), list)}
        pop = {t: max(n for _, n in per[t]) if t in per else
               p.number(t, 0, lo=0, hi=MAX_CLIENTS, integer=True) for t in TIERS}
        if per:
            times = sorted({at for st in per.values() for at, _ in st})
            steps = tuple((at, {t: _at(per[t], at) if t in per else pop[t] for t in TIERS})
                          for at in times)
    elif isinstance(raw, list):
        total = _steps(r, "population", raw, duration)
        steps = tuple((at, _split(n, mix)) for at, n in total)
        pop = {t: max(s[t] for _, s in steps) for t in TIERS}
    elif isinstance(raw, int) and not isinstance(raw, bool):
        n = r.number("population", lo=1, hi=MAX_CLIENTS, integer=True)
        pop = _split(n, mix)
    else:
        r.fail(f"expected a whole number of clients (split by workload.tiers), one per "
               f"tier ({{{', '.join(f'{t}: N' for t in TIERS)}}}), or a schedule of "
               f"[[at_s, N], ...] steps in place of a number, got {raw!r}", "population")
    if sum(pop.values()) < 1:
        r.fail("no clients: give at least one", "population")
    think_raw = r.data.get("think")
    if not isinstance(think_raw, dict) or not think_raw:
        r.fail(f"is required: a service kind for the think time ({{kind, mean_ms}}; kinds: "
               f"{', '.join(SERVICE_PARAMS)}), or one per tier", "think")
    if "kind" in think_raw:
        one = _service(r.sub("think"))
        think = {t: one for t in TIERS}
    else:
        t_r = r.sub("think")
        t_r.only(set(TIERS))
        think = {}
        for t in TIERS:
            if t in t_r.data and pop[t] == 0:
                t_r.fail(f"a think time for {t}, which has no clients: drop think.{t} or "
                         f"give {t} a population", t)
            if t in t_r.data:
                think[t] = _service(t_r.sub(t))
            elif pop[t] > 0:
                t_r.fail(f"{pop[t]} {t} clients need a think time: give think.{t} "
                         "(or one think for every tier)")
        default = next(iter(think.values()))
        think = {t: think.get(t, default) for t in TIERS}
    return Clients(population=pop, think=think, steps=steps)


def _arrival(r: Reader, duration: float, base_dir: Path) -> Arrival:
    kind = r.choice("kind", tuple(ARRIVAL_PARAMS))
    r.only({"kind", *ARRIVAL_PARAMS[kind]})

    def rate(key, default=None):
        return r.number(key, default, lo=0)

    if kind == "poisson":
        pts = [(0.0, rate("rate_rps"))]
    elif kind == "step":
        at = r.number("at_s", lo=0)
        pts = [(0.0, rate("rate_rps")), (at, rate("rate_rps")), (at, rate("to_rps"))]
    elif kind == "spike":
        base, peak = rate("rate_rps"), rate("peak_rps")
        t0, w = r.number("start_s", lo=0), r.number("width_s", lo=0, lo_open=True)
        pts = [(0.0, base), (t0, base), (t0, peak), (t0 + w, peak), (t0 + w, base)]
    elif kind == "ramp":
        t0, t1 = r.number("start_s", lo=0), r.number("end_s", lo=0)
        if t1 <= t0:
            r.fail(f"{t1} must be after start_s ({t0})", "end_s")
        pts = [(0.0, rate("from_rps")), (t0, rate("from_rps")), (t1, rate("to_rps"))]
    elif kind == "diurnal":
        mean, amp = rate("mean_rps"), r.number("amplitude", 0.5, lo=0, hi=1)
        period = r.number("period_s", 86400.0, lo=0, lo_open=True)
        phase = r.number("phase_s", 0.0)
        steps = 96 * duration / period + 2  # 96 straight pieces a period
        if steps > 1e6:
            r.fail(f"{period:g} s is too short for a {duration:g} s run: the rate table would "
                   f"have {steps:.3g} pieces (at most 1e6: period_s >= duration_s / 1e4)",
                   "period_s")
        t = np.linspace(0.0, duration, max(2, int(steps)))
        v = mean * (1 + amp * np.sin(2 * np.pi * (t - phase) / period))
        pts = list(zip(t.tolist(), v.tolist(), strict=True))
    else:
        pts = _trace_points(r, base_dir)
    times = tuple(float(t) for t, _ in pts)
    rates = tuple(float(v) for _, v in pts)
    if max(rates) <= 0:
        r.fail("the arrival rate is zero everywhere: nothing would arrive")
    return Arrival(kind, times, rates)


def read_rate_trace(path) -> Arrival:
    """A rate-trace CSV (``time_s, rate_rps``) on its own, as a scenario's ``workload.arrival:
    {kind: trace, path: ...}`` reads it (``relakit check`` on the file)."""
    r = Reader({"kind": "trace", "path": str(path)}, str(path), "workload.arrival")
    pts = _trace_points(r, Path("."))
    return Arrival("trace", tuple(t for t, _ in pts), tuple(v for _, v in pts))


def _trace_points(r: Reader, base_dir: Path):
    """A rate table from `points: [[t, rate], ...]` or a CSV with time_s, rate_rps."""
    interp = r.choice("interpolation", ("linear", "step"), "linear")
    if ("path" in r.data) == ("points" in r.data):
        r.fail("give exactly one of 'path' (a CSV with columns time_s, rate_rps) or 'points'")
    if "points" in r.data:
        raw, where = r.data["points"], f"{r.source}: key '{r.path}.points'"
        if not isinstance(raw, list):
            r.fail("expected a list of [time_s, rate_rps] pairs", "points")
    else:
        path = resolve_path(r, r.data["path"], base_dir)
        where = str(path)
        with open(path, newline="") as fh:
            rows = list(csv.DictReader(fh))
        if not rows or not {"time_s", "rate_rps"} <= set(rows[0]):
            raise ScenarioError(f"{where}: expected a CSV header with columns time_s, rate_rps")
        raw = [(row["time_s"], row["rate_rps"]) for row in rows]
    pts = []
    for i, item in enumerate(raw):
        try:
            t, v = (float(x) for x in item)
        except (TypeError, ValueError):
            raise ScenarioError(f"{where}: row {i + 1}: expected [time_s, rate_rps] numbers, "
                                f"got {item!r}") from None
        if v < 0 or not math.isfinite(v) or not math.isfinite(t):
            raise ScenarioError(f"{where}: row {i + 1}: rate must be finite and >= 0, got {v}")
        if pts and t <= pts[-1][0]:
            raise ScenarioError(f"{where}: row {i + 1}: times must increase ({t} after "
                                f"{pts[-1][0]})")
        if interp == "step" and pts:
            pts.append((t, pts[-1][1]))
        pts.append((t, v))
    if not pts:
        raise ScenarioError(f"{where}: the trace has no rows")
    return pts


def resolve_path(r: Reader, value, base_dir: Path, key: str = "path") -> Path:
    """A file a scenario names at ``key``: beside the scenario, else from the working
    directory; a missing one fails naming the key and both places looked in."""
    if not isinstance(value, str):
        r.fail(f"expected a file path, got {value!r}", key)
    tried = [base_dir / value, Path.cwd() / value]
    for p in tried:
        if p.is_file():
            return Path(display_path(p))
    r.fail(f"file not found (looked in {', '.join(display_path(p) for p in tried)})", key)


def _faults(r: Reader, nodes: int) -> tuple[Fault, ...]:
    raw = r.data.get("faults") or []
    if not isinstance(raw, list):
        r.fail("expected a list of faults", "faults")
    out = []
    for i, item in enumerate(raw):
        f = Reader(item, r.source, f"faults[{i}]")
        f.only({"node", "start_s", "end_s", "error_rate", "slowdown", "crash", "wrong_rate"})
        start = f.number("start_s", lo=0)
        end = f.number("end_s", lo=0)
        if end <= start:
            f.fail(f"{end} must be after start_s ({start})", "end_s")
        crash = _flag(f, "crash")
        out.append(Fault(
            node=f.number("node", lo=0, hi=nodes - 1, integer=True), start_s=start, end_s=end,
            error_rate=f.number("error_rate", 0.0, lo=0, hi=1),
            slowdown=f.number("slowdown", 1.0, lo=0, lo_open=True), crash=crash,
            wrong_rate=f.number("wrong_rate", 0.0, lo=0, hi=1),
        ))
    return tuple(out)
