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
