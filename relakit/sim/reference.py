"""A plain Python event-heap model of an M/M/c fleet: slow, short, obviously right.

It exists to check the numba kernel and to put its speed in context. Given a
:class:`~relakit.sim.rng.XoshiroPy` it draws the same random numbers in the
same order as the kernel (tier, node, next arrival, service at start), so for
Poisson arrivals, exponential service, random routing over equal nodes and
no faults the two must agree request for request. Given ``random.Random`` it
is the fair pure-Python baseline for the benchmark.
"""

from __future__ import annotations

import heapq
import math
from collections import deque


def mmc_reference(rate_rps: float, mean_ms: float, servers: int, duration_s: float, rng,
                  nodes: int = 1, tiers=(0.1, 0.3, 0.6), record: bool = True):
    """Simulate; return (arrival_s, latency_ms) of completed requests in completion order,
    or just their count when ``record`` is false."""
    mean_s = mean_ms / 1000.0
    gap = 1.0 / rate_rps
    cum0, cum1 = tiers[0], tiers[0] + tiers[1]
    rand = rng.random
    log = math.log
    busy = [0] * nodes
    queues = [deque() for _ in range(nodes)]
    heap: list = []
    seq = 0
    done_arrival, done_latency = [], []
    completed = 0
    t_arr = -gap * log(1.0 - rand())
    while True:
        t_dep = heap[0][0] if heap else math.inf
        t = min(t_arr, t_dep)
        if t > duration_s:
            break
        if t_dep <= t_arr:
            _, _, node, arrived = heapq.heappop(heap)
            busy[node] -= 1
            q = queues[node]
            if q:
                busy[node] += 1
                seq += 1
                heapq.heappush(heap, (t - mean_s * log(1.0 - rand()), seq, node, q.popleft()))
            completed += 1
            if record:
                done_arrival.append(arrived)
                done_latency.append((t - arrived) * 1000.0)
            continue
        x = rand()
        _tier = 0 if x < cum0 else (1 if x < cum1 else 2)
        node = 0 if nodes == 1 else min(int(rand() * nodes), nodes - 1)
        t_arr = t - gap * log(1.0 - rand())
        if busy[node] < servers:
            busy[node] += 1
            seq += 1
            heapq.heappush(heap, (t - mean_s * log(1.0 - rand()), seq, node, t))
        else:
            queues[node].append(t)
    if record:
        return done_arrival, done_latency
    return completed
