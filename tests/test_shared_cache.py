"""A process started outside make (the README's `.venv/bin/relakit ...` commands, a Dask
worker started by hand) loads the kernels `make setup` compiled into .numba_cache instead
of compiling them again into a cache of its own (relakit.jit.use_shared_cache)."""

import json
import os
import subprocess
import sys

import pytest

from relakit import jit

ROOT = jit.SHARED_CACHE.parent


def test_an_unset_or_empty_cache_dir_points_at_the_shared_cache(tmp_path):
    for environ in ({}, {"NUMBA_CACHE_DIR": ""}):
        jit.use_shared_cache(environ, tmp_path)
        assert environ == {"NUMBA_CACHE_DIR": str(tmp_path)}


def test_the_users_cache_dir_wins(tmp_path):
    environ = {"NUMBA_CACHE_DIR": "/somewhere/else"}
    jit.use_shared_cache(environ, tmp_path)
    assert environ == {"NUMBA_CACHE_DIR": "/somewhere/else"}


def test_without_the_shared_cache_numba_keeps_its_default(tmp_path):
    environ = {}
    jit.use_shared_cache(environ, tmp_path / "never-made")
    assert environ == {}


RUN = """
import json, os
import relakit
from relakit.sim import kernel as K
relakit.simulate({'duration_s': 1, 'workload': {'arrival': {'kind': 'poisson', 'rate_rps': 700},
                  'deadline_ms': 100}, 'controls': {'hedge_enabled': True},
                  'mitigations': {'hedge': {'delay_ms': 50}},
                  'fleet': {'servers': 8, 'queue_limit': 50,  # (the general kernel's)
                            'service': {'kind': 'exponential', 'mean_ms': 10}}})
print(json.dumps({'dir': os.environ.get('NUMBA_CACHE_DIR'),
                  'hits': sum(K.advance.stats.cache_hits.values()),
                  'misses': sum(K.advance.stats.cache_misses.values())}))
"""


@pytest.mark.parametrize("first", ["", "import numba\n"], ids=["relakit first", "numba first"])
def test_a_process_outside_make_loads_the_general_kernel_make_compiled(tmp_path, first):
    """Also when numba was imported before relakit (it reads its environment then)."""
    assert (jit.SHARED_CACHE / ".warm").exists(), "run make setup first: it fills .numba_cache"
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    before = set((ROOT / "relakit").rglob("*.nbi"))  # (a checkout may hold older ones)
    out = subprocess.run([sys.executable, "-c", first + RUN], env=env, cwd=tmp_path, check=True,
                         capture_output=True, text=True, timeout=300)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {"dir": str(ROOT / ".numba_cache"), "hits": 1, "misses": 0}
    assert set((ROOT / "relakit").rglob("*.nbi")) == before  # no second cache beside sources


def test_the_makefile_fills_the_cache_relakit_points_at():
    """Two places name the directory: the Makefile (its commands) and relakit.jit (every
    other process). They must not drift apart."""
    lines = (ROOT / "Makefile").read_text().splitlines()
    assert "export NUMBA_CACHE_DIR := $(CURDIR)/" + jit.SHARED_CACHE.name in lines
