"""relakit.jit: numba's decorators applied only once numba is needed (why:
relakit.jit's docstring). Each test runs in a fresh process, where nothing has
been compiled or loaded yet."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(code: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, text=True,
                         capture_output=True, env=dict(os.environ))
    return out.stdout.split()


def test_importing_the_kernels_imports_no_numba_until_one_is_used():
    out = _run("""
import sys
from relakit.sim import kernel, loops
from relakit.control import policy
before = 'numba' in sys.modules
key = kernel.event_key(5, kernel.EV_DONE, 7)  # a stand-in called: numba now
from relakit import jit
after = jit.njit(cache=False)(lambda x: x + 1)  # once loaded: numba's dispatcher at once
print(before, type(kernel.event_key).__name__, 'numba' in sys.modules,
      key == (7 << 32 | 5 << kernel.EV_BITS | kernel.EV_DONE), type(after).__name__, after(1))
""")
    assert out == ["False", "CPUDispatcher", "True", "True", "CPUDispatcher", "2"]


def test_a_stand_in_kept_from_before_compiles_into_a_caller():
    out = _run("""
from relakit.sim import kernel
key = kernel.event_key  # kept before numba is loaded: a stand-in
import numba

@numba.njit
def caller(i):
    return key(i, 1, 2)

print(type(key).__name__, caller(3) == kernel.event_key(3, 1, 2),
      type(kernel.event_key).__name__)
""")
    assert out == ["Deferred", "True", "CPUDispatcher"]


def test_attributes_of_a_stand_in_are_the_dispatchers():
    out = _run("""
from relakit.sim import kernel
simple = kernel.specialised(frozenset(), simple=True)
print(type(simple).__name__, simple.py_func.__globals__['SIMPLE'],
      simple.py_func is kernel.specialised(frozenset(), simple=True).py_func)
""")
    assert out == ["Deferred", "True", "True"]
