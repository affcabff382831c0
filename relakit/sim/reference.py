"""A plain Python event-heap model of an M/M/c fleet: slow, short, obviously right.

It exists to check the numba kernel and to put its speed in context. Given
:func:`kernel_streams` (the kernel's random streams of a seed, as
:class:`~relakit.sim.rng.XoshiroPy`) it draws the same numbers from the same
streams in the same order as the kernel: on arrival the tier (arrivals
stream), the service demand (service stream), the node (routing stream) and
the next arrival (arrivals stream); a queued request keeps its demand until
it starts. So for Poisson arrivals, exponential service, random routing over
equal nodes and no faults the two must agree request for request. Given one
``random.Random`` (every draw from it) it is the fair pure-Python baseline for
the benchmark.
"""

from __future__ import annotations

import heapq
import math
from collections import deque

from relakit.sim.kernel import STREAMS
from relakit.sim.rng import XoshiroPy


def kernel_streams(seed: int) -> dict[str, XoshiroPy]:
    """The kernel's random streams for ``seed``, by name (``relakit.sim.kernel.STREAMS``)."""
    return {name: XoshiroPy(seed, stream=i) for i, name in enumerate(STREAMS)}


def mmc_reference(rate_rps: float, mean_ms: float, servers: int, duration_s: float, rng,
                  nodes: int = 1, tiers=(0.1, 0.3, 0.6), record: bool = True):
    """Simulate; return (arrival_s, latency_ms, service_ms) of completed requests in
    completion order, or just their count when ``record`` is false.

    ``rng``: :func:`kernel_streams` (a mapping of stream name to generator), or one
    generator with ``random()`` that every draw uses."""
    mean_s = mean_ms / 1000.0
    gap = 1.0 / rate_rps
    cum0, cum1 = tiers[0], tiers[0] + tiers[1]
    if isinstance(rng, dict):
        rand, rand_svc, rand_route = (rng[n].random for n in ("arrivals", "service", "routing"))
    else:
        rand = rand_svc = rand_route = rng.random
    log = math.log
    busy = [0] * nodes
    queues = [deque() for _ in range(nodes)]
    heap: list = []
    seq = 0
    done_arrival, done_latency, done_demand = [], [], []
    completed = 0
    t_arr = -gap * log(1.0 - rand())
    while True:
        t_dep = heap[0][0] if heap else math.inf
        t = min(t_arr, t_dep)
        if t > duration_s:
            break
        if t_dep <= t_arr:
            _, _, node, arrived, demand = heapq.heappop(heap)
            busy[node] -= 1
            q = queues[node]
            if q:
                busy[node] += 1
                seq += 1
                a, d = q.popleft()
                heapq.heappush(heap, (t + d, seq, node, a, d))
            completed += 1
            if record:
                done_arrival.append(arrived)
                done_latency.append((t - arrived) * 1000.0)
                done_demand.append(demand * 1000.0)
            continue
        x = rand()
        _tier = 0 if x < cum0 else (1 if x < cum1 else 2)
        demand = -mean_s * log(1.0 - rand_svc())  # drawn on arrival, kept until it starts
        node = 0 if nodes == 1 else min(int(rand_route() * nodes), nodes - 1)
        t_arr = t - gap * log(1.0 - rand())
        if busy[node] < servers:
            busy[node] += 1
            seq += 1
            heapq.heappush(heap, (t + demand, seq, node, t, demand))
        else:
            queues[node].append((t, demand))
    if record:
        return done_arrival, done_latency, done_demand
    return completed


def retry_node_reference(rate_rps: float, mean_ms: float, servers: int, queue_limit: int | None,
                         deadline_s: float, max_attempts: int, backoff_s: float,
                         backoff_max_s: float, jitter: bool, duration_s: float, seed: int,
                         on_timeout: str = "abandon", initial_queue: int = 0,
                         pending_retries: int = 0, tiers=(1.0, 0.0, 0.0)):
    """One node, FCFS, Poisson arrivals and exponential demand, a per-attempt deadline,
    retries on timeout (``retry_on: [timeout]``) and a start state, written from the
    scenario language's definitions, not from the kernel's code. Returns each user
    request that ended by ``duration_s``, in the order they ended: (arrival_s,
    latency_ms, outcome, attempts).

    It draws what the kernel draws, stream by stream (:func:`kernel_streams`): at an
    arrival its tier and first-attempt demand, then the next gap; a retry's demand when
    it starts (``copy_service``), a full-jitter factor at each retry decision
    (``retry_jitter``); a start state's demands (``copy_service``, in node order, then
    nothing for the pending retries) and the pending retries' jitter, before anything
    else. Semantics: an attempt past its deadline is abandoned (the server still serves
    it) or, with ``keep_listening``, still listened to while its request lives; the
    request fails (timeout) at the deadline of its last attempt, answers at the first OK
    of any copy listened to; a copy of an answered request still queued is dropped from
    the queue (``hedge.cancel: queued``), except abandoned and late ones; an attempt
    meeting a full queue fails at once (error, not retried)."""
    st = kernel_streams(seed)
    rand, rand_svc, rand_copy = st["arrivals"].random, st["service"].random, \
        st["copy_service"].random
    rand_jit = st["retry_jitter"].random
    mean_s = mean_ms / 1000.0
    gap = 1.0 / rate_rps
    log = math.log
    cum0, cum1 = tiers[0], tiers[0] + tiers[1]
    heap: list = []  # (time, order: 0 heap events first at a tie, seq, kind, ident)
    seq = [0]

    def push(t, order, kind, ident):
        seq[0] += 1
        heapq.heappush(heap, (t, order, seq[0], kind, ident))

    jobs: dict = {}  # id -> dict(call, state: queued/serving/done, client, demand)
    calls: dict = {}  # id -> dict(arrival, attempts, copies: [job ids listened to],
    #   waiting: copies within their deadline, alive)
    queue: list = []
    busy = [0]
    out = []
    nid = [0]

    def new_id():
        nid[0] += 1
        return nid[0]

    def backoff(attempts):
        b = min(backoff_s * 2.0 ** (attempts - 1), backoff_max_s)
        return b * rand_jit() if jitter else b

    def start_next(t):
        while queue and busy[0] < servers:
            j = queue.pop(0)
            job = jobs[j]
            if job["demand"] is None:
                job["demand"] = -mean_s * log(1.0 - rand_copy())
            job["state"] = "serving"
            busy[0] += 1
            push(t + job["demand"], 0, "done", j)

    def end_call(c, t, outcome):
        call = calls[c]
        call["alive"] = False
        for j2 in call["copies"]:
            job = jobs[j2]
            if job["client"] == "late":
                job["client"] = "abandoned"
            elif job["client"] == "waiting":
                job["client"] = "lost"
                if job["state"] == "queued":
                    queue.remove(j2)
                    job["state"] = "done"
        out.append((call["arrival"], (t - call["arrival"]) * 1000.0, outcome, call["attempts"]))

    def send(c, t, demand):
        call = calls[c]
        call["attempts"] += 1
        j = new_id()
        jobs[j] = {"call": c, "state": "queued", "client": "waiting", "demand": demand}
        push(t + deadline_s, 1, "timeout", j)
        if queue_limit is not None and busy[0] >= servers and len(queue) >= queue_limit:
            jobs[j]["state"] = "done"  # refused: the call fails (an error is not retried)
            end_call(c, t, "error")
            return
        call["copies"].append(j)
        call["waiting"] += 1
        queue.append(j)

    def new_call(t, tier):
        c = new_id()
        calls[c] = {"arrival": t, "attempts": 0, "copies": [], "waiting": 0, "alive": True,
                    "tier": tier}
        return c

    for r in range(initial_queue):
        c = new_call(0.0, r)
        send(c, 0.0, -mean_s * log(1.0 - rand_copy()))
    for _ in range(pending_retries):
        c = new_call(0.0, 0)
        calls[c]["attempts"] = 1
        push(backoff(1), 0, "retry", c)
    start_next(0.0)
    t_arr = -gap * log(1.0 - rand())
    while True:
        t_ev = heap[0][0] if heap else math.inf
        t = min(t_arr, t_ev)
        if t > duration_s:
            break
        if t_ev <= t_arr:
            _, _, _, kind, ident = heapq.heappop(heap)
            if kind == "done":
                job = jobs[ident]
                job["state"] = "done"
                busy[0] -= 1
                call = calls[job["call"]]
                if call["alive"] and job["client"] in ("waiting", "late"):
                    end_call(job["call"], t, "ok")
                start_next(t)
            elif kind == "timeout":
                job = jobs[ident]
                call = calls[job["call"]]
                if job["client"] != "waiting" or job["state"] == "done" or not call["alive"]:
                    continue
                call["waiting"] -= 1
                if on_timeout == "keep_listening":
                    job["client"] = "late"
                else:
                    job["client"] = "abandoned"
                    call["copies"].remove(ident)
                if call["waiting"] == 0:
                    if call["attempts"] < max_attempts:
                        push(t + backoff(call["attempts"]), 0, "retry", job["call"])
                    else:
                        end_call(job["call"], t, "timeout")
            else:  # a retry falls due
                if calls[ident]["alive"]:
                    send(ident, t, None)
                    start_next(t)
            continue
        x = rand()
        _tier = 0 if x < cum0 else (1 if x < cum1 else 2)
        demand = -mean_s * log(1.0 - rand_svc())
        t_arr = t - gap * log(1.0 - rand())
        c = new_call(t, _tier)
        send(c, t, demand)
        start_next(t)
    return out


def ctmc_ablation_drain(timeout_s: float, doom: str, delay: str, count: str, seed: int,
                        cap_s: float, arrival_rps: float = 9.5, service_rps: float = 10.0,
                        capacity: int = 101, max_attempts: int = 5,
                        acceptance: float = 1.0) -> float:
    """Seconds for a full node to drain (<= 1 job, no retry pending; nan: not by ``cap_s``)
    in a small model of one FCFS exponential server with per-attempt deadlines and retries
    at the deadline, with each of :func:`relakit.analytic.retry_ctmc`'s approximations
    switched on or off: ``doom`` ``exact`` (an attempt times out iff its own sojourn,
    services drawn as they come, passes the deadline) or ``prob`` (the CTMC's coin of
    probability ``doom_probability(n found)``, independent of the services that then
    drain the queue); ``delay`` ``det`` (a retry at the deadline) or ``exp`` (after an
    exponential delay of that mean); ``count`` ``exact`` (at most ``max_attempts``) or
    ``share`` (a doomed retry retries again with the CTMC's share for a retry
    ``acceptance``). Started with ``capacity`` first attempts sent at 0 and no retry
    pending: the kernel's ``initial: {queue: capacity}``, the CTMC's state (capacity, 0).
    ``exact det exact`` is the kernel's node (``benchmarks/ctmc_drain_ablation.py``
    compares their drains)."""
    return _ablation_node(timeout_s, doom, delay, count, seed, cap_s, arrival_rps,
                          service_rps, capacity, max_attempts, acceptance, start=capacity,
                          stop_level=None, warmup_s=None)[0]


def ctmc_ablation_fill(timeout_s: float, doom: str, delay: str, count: str, seed: int,
                       until_s: float, level: int | None = None, start: int = 0,
                       warmup_s: float | None = None, arrival_rps: float = 9.5,
                       service_rps: float = 10.0, capacity: int = 101, max_attempts: int = 5,
                       acceptance: float = 1.0) -> tuple[float, float]:
    """The model of :func:`ctmc_ablation_drain` (same switches) started with ``start``
    first attempts sent at 0 (0: empty): ``(first time at least level jobs are in the
    node, nan if not by until_s; the time-average jobs over [warmup_s, until_s])``. With
    ``level`` the run stops at it (and the mean is nan); with ``warmup_s`` it runs to
    ``until_s`` (``benchmarks/ctmc_vs_simulation.py``: which approximation moves the
    CTMC's first passage from empty and its stationary mean jobs)."""
    if (level is None) == (warmup_s is None):
        raise ValueError("level, warmup_s: give exactly one (a first passage or a mean)")
    return _ablation_node(timeout_s, doom, delay, count, seed, until_s, arrival_rps,
                          service_rps, capacity, max_attempts, acceptance, start=start,
                          stop_level=level, warmup_s=warmup_s)


def _ablation_node(timeout_s, doom, delay, count, seed, cap_s, arrival_rps, service_rps,
                   capacity, max_attempts, acceptance, start, stop_level, warmup_s):
    """The ablation model's one loop: ``(stop time or nan, mean jobs over [warmup_s,
    cap_s] or nan)``; it stops at the drain (<= 1 job, no retry pending) when neither
    ``stop_level`` nor ``warmup_s`` is given, at ``stop_level`` jobs when that is."""
    import random

    import numpy as np

    from relakit.analytic.retry_ctmc import doom_probability, retry_allowed_share

    for name, v, allowed in (("doom", doom, ("exact", "prob")), ("delay", delay, ("det", "exp")),
                             ("count", count, ("exact", "share"))):
        if v not in allowed:
            raise ValueError(f"{name}: expected one of {', '.join(allowed)}, got {v!r}")
    rng = random.Random(seed)
    p_doom = doom_probability(np.arange(capacity + 1), 1, service_rps, timeout_s, 256)
    again = retry_allowed_share(p_doom, max_attempts - 1, acceptance)
    drain = stop_level is None and warmup_s is None
    w0 = math.inf if warmup_s is None else warmup_s
    area = 0.0  # integral of the jobs over [w0, cap_s]

    def overlap(a, b):
        return max(0.0, min(b, cap_s) - max(a, w0))

    deps, last = [], 0.0  # departure times of the jobs in the node (FCFS: increasing)
    for _ in range(start):
        last += rng.expovariate(service_rps)
        deps.append(last)
        area += overlap(0.0, last)
    retries: list = []  # (time due, attempt number)
    if doom == "exact":  # the start's attempts that will time out retry at the deadline
        retries = [(timeout_s if delay == "det" else rng.expovariate(1 / timeout_s), 2)
                   for d in deps if d > timeout_s]
        heapq.heapify(retries)
    gone = 0
    t_arr = rng.expovariate(arrival_rps)
    while True:
        t = min(t_arr, retries[0][0] if retries else math.inf)
        if t > cap_s:
            return math.nan, (area / (cap_s - w0) if warmup_s is not None else math.nan)
        while gone < len(deps) and deps[gone] <= t:
            gone += 1
        n = len(deps) - gone
        if drain and n <= 1 and not retries:  # drained at the departure that left <= 1 job
            return (deps[gone - 1] if gone > 0 else t), math.nan
        if retries and retries[0][0] <= t_arr:
            attempt = heapq.heappop(retries)[1]
        else:
            attempt = 1
            t_arr = t + rng.expovariate(arrival_rps)
        if n >= capacity:
            continue  # dropped (not retried)
        d = max(t, deps[-1] if n else t) + rng.expovariate(service_rps)
        deps.append(d)
        area += overlap(t, d)
        if stop_level is not None and n + 1 >= stop_level:
            return t, math.nan
        doomed = (d - t > timeout_s) if doom == "exact" else rng.random() < p_doom[n]
        if not doomed:
            continue
        retry = attempt < max_attempts if count == "exact" else (
            attempt == 1 or rng.random() < again[n])
        if retry:
            wait = timeout_s if delay == "det" else rng.expovariate(1 / timeout_s)
            heapq.heappush(retries, (t + wait, attempt + 1))
        if gone > 10_000:
            deps, gone = deps[gone:], 0
