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

Replications (``adaptive=True``) share the work instead of handing it over: this
process runs tasks itself, taking them one at a time from a queue, and the helper
processes (``workers - 1`` of them) take from the same queue as soon as they are up.
A spawned helper pays its imports and numba's cached kernel (about
:data:`POOL_START_S`) before its first task, and meanwhile this process keeps
working, so a helper can only add work done, never hold the batch back: N
replications on helpers are never much slower than the same N one by one (the
helper's start-up on a core nobody else uses), and on 2 free cores long ones take
about half the time (``benchmarks/bench_replications.py``). Helpers are kept for the
next batch in this process (a notebook's next ``simulate(..., replications=N)``
finds them warm); :func:`close_helpers` ends them, and they end with this process.
Helpers are started only when the first task, run here and timed, says the work left
outlasts their start-up, and only on cores other programs leave free
(:func:`free_cores`: on 2 cores at load 7, a second process got no second core:
measured 37 % slower than one by one). Results do not depend on where a task ran.

A task is ``(function, args)``; the function and its arguments must pickle
(module-level functions, plain data). ``on_done(index, result)`` is called in
this process as each task finishes, in completion order; the returned list is
in task order, whatever order they finished in.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

__all__ = ["POOL_START_S", "close_helpers", "free_cores", "local_pool", "run_tasks"]

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
                               mp_context=mp.get_context("spawn"),
                               initializer=die_with_parent, initargs=(os.getpid(),))


def die_with_parent(parent: int) -> None:
    """Run first in every spawned worker: ask Linux to kill it when its parent dies
    (``prctl(PR_SET_PDEATHSIG, SIGKILL)``). A parent killed with SIGKILL runs no clean-up,
    and a pool's workers would otherwise wait on their task queue for ever. A parent
    that died before this ran is caught by the parent-id check."""
    import signal

    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the workers end with their queue
        return
    if os.getppid() != parent:
        os._exit(1)


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
    if n > 1 and adaptive and not processes:
        return _run_shared(tasks, done, results, workers)
    if n <= 1 and not processes:
        for i, (fn, args) in enumerate(tasks):
            done(i, fn(*args))
        return results
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor, as_completed

    n = min(max(n, 1), len(tasks))
    with ProcessPoolExecutor(max_workers=n, mp_context=mp.get_context("spawn"),
                             initializer=die_with_parent, initargs=(os.getpid(),)) as pool:
        futs = {pool.submit(fn, *args): i for i, (fn, args) in enumerate(tasks)}
        for fut in as_completed(futs):
            done(futs[fut], fut.result())
    return results


def _run_shared(tasks, done, results, workers: int | None) -> list:
    """This process and up to ``workers - 1`` helpers take the tasks from one queue."""
    import time

    global _HELPERS
    wanted = min(workers or free_cores(), len(tasks)) - 1
    helpers = _HELPERS if _HELPERS is not None and _HELPERS.usable(wanted) else None
    order = list(range(len(tasks)))
    if helpers is None:  # none warm: run one here and judge whether helpers would pay
        t = time.perf_counter()
        fn, args = tasks[0]
        done(0, fn(*args))
        order = order[1:]
        if workers is None:
            wanted = min(wanted, free_cores() - 1)
        if wanted < 1 or not order or \
                POOL_START_S >= len(order) * (time.perf_counter() - t):
            for i in order:  # they would arrive after the work is done
                fn, args = tasks[i]
                done(i, fn(*args))
            return results
        close_helpers()
        helpers = _HELPERS = _Helpers(wanted)
    try:
        helpers.share(tasks, order, done)
    except BaseException:
        close_helpers()  # a failed batch may leave tasks queued: start clean next time
        raise
    return results


_HELPERS = None


def close_helpers() -> None:
    """End the helper processes replications keep between batches (they also end with
    this process)."""
    global _HELPERS
    if _HELPERS is not None:
        _HELPERS.close()
        _HELPERS = None


def _helper_loop(queue, events, parent: int) -> None:
    """A helper: take a task, say so, run it, send the result (or the error) back."""
    import pickle

    die_with_parent(parent)
    os.environ.setdefault("NUMBA_NUM_THREADS", "1")
    pid = os.getpid()
    while True:
        item = queue.get()
        if item is None:
            return
        batch, i, fn, args = item
        events.put(("took", batch, i, pid))
        try:
            events.put(("done", batch, i, fn(*args)))
        except BaseException as e:  # noqa: BLE001 - sent back, raised in the caller
            try:
                pickle.dumps(e)
            except Exception:  # noqa: BLE001 - an error that cannot travel: its text does
                e = RuntimeError(f"task {i} failed in a helper: {type(e).__name__}: {e}")
            events.put(("failed", batch, i, e))


class _Helpers:
    """Spawned processes that take tasks from a queue this process also takes from."""

    def __init__(self, n: int):
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        # events: a SimpleQueue, written straight to its pipe, so a helper's "took" is
        # on record before it runs the task (were it to die running it)
        self.queue, self.events = ctx.Queue(), ctx.SimpleQueue()
        self.procs = [ctx.Process(target=_helper_loop, args=(self.queue, self.events, os.getpid()),
                                  daemon=True, name=f"relakit-helper-{k}") for k in range(n)]
        for p in self.procs:
            p.start()
        self.batch = 0

    def usable(self, n: int) -> bool:
        return n >= 1 and len(self.procs) == n and all(p.is_alive() for p in self.procs)

    def share(self, tasks, order, done) -> None:
        """Run ``tasks[i]`` for every i of ``order``, here and on the helpers, calling
        ``done(i, result)`` here as each one ends. A task a helper took and never
        answered (the helper died) is run here."""
        import queue as stdlib_queue
        import time

        self.batch += 1
        batch = self.batch
        for i in order:
            fn, args = tasks[i]
            self.queue.put((batch, i, fn, args))
        left = set(order)
        taken: dict[int, int] = {}  # task -> helper pid
        mine = 0

        def deliver(block: bool) -> bool:
            """Take one event from the helpers; False when there was none."""
            wait_until = time.monotonic() + (0.5 if block else 0.0)
            while self.events.empty():
                if time.monotonic() >= wait_until:
                    return False
                time.sleep(0.002)
            kind, b, i, value = self.events.get()
            if b != batch:
                return True
            if kind == "took":
                taken[i] = value
            elif kind == "failed":
                raise value
            elif i in left:
                left.discard(i)
                done(i, value)
            return True

        while left:
            while deliver(False):  # what the helpers finished, first
                pass
            if not any(p.is_alive() for p in self.procs):
                for i in sorted(left):  # every helper died: the rest here
                    fn, args = tasks[i]
                    left.discard(i)
                    done(i, fn(*args))
                break
            if mine + len(taken) < len(order):  # tasks may still be queued: take one
                try:
                    b, i, fn, args = self.queue.get(timeout=0.05)
                except stdlib_queue.Empty:
                    continue
                if b != batch:
                    continue
                mine += 1
                if i in left:
                    left.discard(i)
                    done(i, fn(*args))
                continue
            deliver(True)  # the rest are with the helpers
            dead = {p.pid for p in self.procs if not p.is_alive()}
            for i in [i for i, pid in taken.items() if pid in dead and i in left]:
                fn, args = tasks[i]  # its helper died with it
                left.discard(i)
                done(i, fn(*args))

    def close(self) -> None:
        for _ in self.procs:
            self.queue.put(None)
        for p in self.procs:
            p.join(timeout=5)
            if p.is_alive():
                p.terminate()
