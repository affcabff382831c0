"""Shared test helpers: small scenarios built from a few keyword arguments."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("NUMBA_CACHE_DIR", str(ROOT / ".numba_cache"))


def make_scenario(*, rate=100.0, duration=100.0, nodes=1, servers=1, service=None, seed=1,
                  warmup=0.0, fanout=1, deadline_ms=None, routing="random", faults=(),
                  tiers=None, arrival=None, queue_limit=None, weights=None, interval=1.0):
    """A scenario dict with the few knobs tests turn; everything else defaulted."""
    fleet = {"nodes": nodes, "servers": servers, "routing": routing,
             "service": service or {"kind": "exponential", "mean_ms": 10}}
    if queue_limit is not None:
        fleet["queue_limit"] = queue_limit
    if weights is not None:
        fleet["weights"] = list(weights)
    workload = {"arrival": arrival or {"kind": "poisson", "rate_rps": rate}, "fanout": fanout,
                "deadline_ms": deadline_ms}
    if tiers is not None:
        workload["tiers"] = tiers
    return {"name": "test", "duration_s": duration, "seed": seed, "warmup_s": warmup,
            "workload": workload, "fleet": fleet, "faults": list(faults),
            "metrics": {"interval_s": interval}}


@pytest.fixture
def scenario():
    return make_scenario


#: test files that assert a real-time bound (a live lab's clocks, a browser's drawing):
#: `make test` runs them alone, after the others have run on two workers
WALLCLOCK_FILES = ("test_lab.py", "test_lab_chain.py", "test_lab_crash.py", "test_lab_ha.py",
                   "test_lab_takeover.py", "test_lab_front.py", "test_lab_twin.py",
                   "test_browser.py")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name in WALLCLOCK_FILES:
            item.add_marker(pytest.mark.wallclock)


def wait_until(predicate, timeout_s: float, what: str):
    """``predicate()``'s first truthy value, polled every 50 ms (the live lab's tests wait
    on real processes); an AssertionError naming ``what`` after ``timeout_s``."""
    import time

    deadline = time.time() + timeout_s
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")


def relakit_cli(*args, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    """``python -m relakit.cli ARGS`` from the repository, its output captured."""
    return subprocess.run([sys.executable, "-m", "relakit.cli", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout, **kw)


def stop_lab(up: subprocess.Popen, work: Path) -> None:
    """A test's teardown of the ``lab up`` it started, passed or failed: the process killed
    if it still runs, then ``lab down`` if its state is left (never a lab left behind)."""
    if up.poll() is None:
        up.kill()
        up.wait()
    if (Path(work) / "state.json").exists():
        relakit_cli("lab", "down", "--dir", str(work))
