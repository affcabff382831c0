"""Run independent tasks one by one, on local processes, or on a Dask cluster.

The one executor that sweeps (:mod:`relakit.sweep`: one task per point) and
replications (:mod:`relakit.experiment`: one task per replication) share, so
both read ``workers`` and ``scheduler`` the same way:

* ``scheduler="tcp://HOST:PORT"``: the tasks are submitted to that Dask
  scheduler (``distributed`` is imported only then);
* otherwise ``workers`` local processes (default: one per core, at most one
  per task); with one worker, or one task, the tasks run in this process, one
  by one, with nothing to start.

Local processes are *spawned*, not forked: forking a process whose polars or
numba thread pools are running can deadlock the child. A spawned worker pays
its imports once (numba loads the cached kernel), then runs tasks back to back.

Starting a local pool is not free (a spawned worker imports relakit and loads
numba's cached kernel: about 2.5 s here), and a replication of ``mmc-demo``
(1.3 M requests) takes 0.2-0.3 s. So with ``adaptive=True`` (replications)
the first task runs in this process and is timed; the pool is started for the
rest only if its start-up is at most a tenth of the work left
(:data:`POOL_START_S` against ``(tasks left) x (first task's time)``), so the
pool can never make the batch more than about 10 % slower than running it one
by one for its start-up alone. With ``workers`` not given, it also counts the
cores other programs leave free (``os.getloadavg``, one-minute load, this
process's own run included): on a shared machine loaded past its cores, a second
worker does not get a second core (measured: 8 long replications of mmc-demo at
load 7 on 2 cores, a pool of 2 was 37 % slower than one by one), so the rest
then runs here. Results do not depend on where a task ran.

A task is ``(function, args)``; the function and its arguments must pickle
(module-level functions, plain data). ``on_done(index, result)`` is called in
this process as each task finishes, in completion order; the returned list is
in task order, whatever order they finished in.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

__all__ = ["POOL_START_S", "free_cores", "local_pool", "run_tasks"]

#: what starting a spawned worker costs (Python, imports, numba's cached kernel), seconds;
#: measured 2.2-2.7 s on the project's 2-core machine (benchmarks/bench_replications.py)
POOL_START_S = 2.5


def free_cores() -> int:
    """Cores not busy with other programs' work: cores minus the one-minute load, plus
    one for this process's own run (at least 1; all cores where the load is unknown)."""
    cores = os.cpu_count() or 1
    try:
        load = os.getloadavg()[0]
    except (OSError, AttributeError):
        return cores
    return max(1, min(cores, int(cores - load + 1 + 0.5)))


def local_pool(workers: int):
    """A pool of ``workers`` spawned processes that several :func:`run_tasks` calls can
    share (``executor=``), so a caller running batch after batch (a search asks its
    trials in batches) pays the workers' start-up once. Use it as a context manager."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    return ProcessPoolExecutor(max_workers=max(1, int(workers)),
                               mp_context=mp.get_context("spawn"))


def run_tasks(tasks: Sequence[tuple[Callable, tuple]], *, workers: int | None = None,
              scheduler: str | None = None, keys: Sequence[str] | None = None,
              on_done: Callable[[int, object], None] | None = None,
              processes: bool | None = None, adaptive: bool = False,
              executor=None) -> list:
    """Run every ``fn(*args)`` of ``tasks``; return their results in task order.

    ``keys`` names the tasks on a Dask cluster (unique per task; default: Dask's
    own). ``processes=True`` uses a local pool even for one worker (benchmarks
    measure what the pool costs); by default one worker runs in this process.
    ``executor`` (e.g. :func:`local_pool`) runs them on a pool the caller keeps.
    """
    tasks = list(tasks)
    results: list = [None] * len(tasks)

    def done(i, value):
        results[i] = value
        if on_done is not None:
            on_done(i, value)

    if not tasks:
        return results
    if executor is not None:
        from concurrent.futures import as_completed

        futs = {executor.submit(fn, *args): i for i, (fn, args) in enumerate(tasks)}
        for fut in as_completed(futs):
            done(futs[fut], fut.result())
        return results
    if scheduler:
        from distributed import Client, as_completed

        with Client(scheduler) as client:
            futures = [client.submit(fn, *args, pure=False,
                                     **({"key": keys[i]} if keys is not None else {}))
                       for i, (fn, args) in enumerate(tasks)]
            index = {f.key: i for i, f in enumerate(futures)}
            for fut in as_completed(futures):
                done(index[fut.key], fut.result())
        return results
    n = min(workers or (os.cpu_count() or 1), len(tasks))
    first = 0
    if n > 1 and adaptive and not processes:
        import time

        t = time.perf_counter()
        fn, args = tasks[0]
        done(0, fn(*args))
        first = 1
        if POOL_START_S > 0.1 * (len(tasks) - 1) * (time.perf_counter() - t):
            n = 1  # the pool would cost more than a tenth of what is left
        elif workers is None:
            n = min(n, free_cores())
    if n <= 1 and not processes:
        for i in range(first, len(tasks)):
            fn, args = tasks[i]
            done(i, fn(*args))
        return results
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor, as_completed

    n = min(max(n, 1), len(tasks) - first)
    with ProcessPoolExecutor(max_workers=n, mp_context=mp.get_context("spawn")) as pool:
        futs = {pool.submit(fn, *args): i for i, (fn, args) in enumerate(tasks) if i >= first}
        for fut in as_completed(futs):
            done(futs[fut], fut.result())
    return results
