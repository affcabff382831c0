"""Workers of the local pool die with the process that started them, even one killed with
SIGKILL (no clean-up runs): a killed search or sweep leaves no process behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

PARENT = textwrap.dedent("""
    import os, sys, time
    from relakit.runner import local_pool
    pool = local_pool(2)
    futs = [pool.submit(time.sleep, 60) for _ in range(2)]
    while len(pool._processes) < 2:
        time.sleep(0.05)
    time.sleep(1.0)  # the initializers have run
    print(" ".join(str(p) for p in pool._processes), flush=True)
    time.sleep(60)
""")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_pool_workers_die_with_a_parent_killed_by_sigkill():
    proc = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    try:
        workers = [int(p) for p in proc.stdout.readline().split()]
        assert len(workers) == 2 and all(_alive(p) for p in workers)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        deadline = time.monotonic() + 10
        while any(_alive(p) for p in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_alive(p) for p in workers), workers
    finally:
        proc.kill()
