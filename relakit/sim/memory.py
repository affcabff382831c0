"""What a run of the data plane will allocate, estimated from its spec before anything is.

The estimate belongs to the data plane: it counts the kernel's own arrays (metrics
grid, request records, pools), so it lives beside them and is public here
(:func:`relakit.sim.run_memory`); the semantic checks (:mod:`relakit.checks`) read
it to refuse a run that cannot fit.
"""

from __future__ import annotations

from relakit.sim import kernel as K
from relakit.sim.longtable import fleet_columns, node_columns


def expected_requests(sc) -> float:
    """User requests a run is expected to hold records for: the open arrivals' mean, plus a
    closed population's bound (N / Z a second, or the fleet's capacity if less)."""
    requests = sc.workload.arrival.mean_rate(sc.duration_s) * sc.duration_s
    if sc.workload.clients is not None:
        requests += min(sc.workload.clients.max_rate(),
                        sc.fleet.capacity_rps / sc.workload.fanout) * sc.duration_s
    return requests


def run_memory(sc, record_requests: bool) -> dict:
    """What a run will allocate, estimated from the scenario before any allocation.

    The metrics grid (one row per node per ``metrics.interval_s``, and its long
    table afterwards), the per-request records when kept, and the kernel's pools.
    Estimates in bytes, a floor rather than a ceiling (the Python and numba runtime,
    about 130 MB, and transient copies come on top); the long table is about 80 bytes
    a sample."""
    n = sc.fleet.nodes
    samples = sc.duration_s / sc.metrics.interval_s + 2
    n_buckets = len(sc.metrics.latency_buckets_s) + 1
    grid = samples * (n * (K.M_BUCKETS + n_buckets + 1) + K.N_FLEET + 1) * 8
    table = samples * (n * len(node_columns(sc.metrics.latency_buckets_s))
                       + len(fleet_columns())) * 80
    requests = expected_requests(sc)
    # the kernel's record arrays, then the requests table: about 200 bytes a request in
    # all (measured: mmc-demo, 1.3 M requests, 270 MB over the run without records)
    records = requests * 1.05 * 200 if record_requests else 0.0
    jobs = 4 * sum(sc.fleet.servers) + 8 * sc.workload.fanout
    initial = getattr(sc, "initial", None)  # a start state's requests hold rows from t = 0
    if initial is not None:
        jobs = max(jobs, 2 * (sum(initial.queue) + initial.pending_retries))
    pools = jobs * (K.N_JI + K.N_JF + K.N_CL + K.N_CLF + K.N_UI + K.N_UF + 12) * 8
    if sc.workload.clients is not None:  # a heap slot (time and key) per thinking client
        pools += sc.workload.clients.total * 16
    return {"samples": samples, "grid": grid, "table": table, "records": records,
            "pools": pools, "total": grid + table + records + pools}
