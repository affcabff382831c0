"""Cache names for kernels that change when any code they inline changes.

numba keys a cache entry on the source file of the compiled function alone
(its path, modification time and qualified name). The kernels inline more:
kernel.py's constants and helpers, rng.py's generator, latency_bins.py's
tables (global arrays, frozen into the machine code), vocab.py's words (their
counts size the tier, outcome and breaker arrays). Without more, an edit
there would leave a stale kernel in NUMBA_CACHE_DIR and a run would silently
use old columns, old bins or an old generator. So each kernel is compiled
under a qualified name carrying a digest of those files: an edit is a new
name and a recompile (the old entry stays on disk until ``make clean-cache``).

The same copy of the function can carry compile-time constants: globals of
its own copy of the module namespace, which numba reads as constants and
whose branches it prunes (``kernel.SIMPLE``).
"""

from __future__ import annotations

import hashlib
import types
from pathlib import Path

# the files every kernel inlines (relative to relakit/sim): vocab.py's tuples size the
# kernels' tier, outcome and breaker arrays (a new tier is one edit there)
INLINED = ("kernel.py", "rng.py", "latency_bins.py", "../vocab.py")


def digest(files: tuple = INLINED) -> str:
    """12 hex digits of a SHA-1 over ``files`` (relative to relakit/sim; :data:`INLINED`
    by default)."""
    h = hashlib.sha1()
    here = Path(__file__).parent
    for name in files:
        h.update((here / name).read_bytes())
    return h.hexdigest()[:12]


def digest_named(py, tag: str = "", **constants):
    """``py``'s code under a copy of its globals updated with ``constants``, named
    ``<name>[<tag><digest>]`` for the cache."""
    scope = dict(py.__globals__, **constants)
    body = types.FunctionType(py.__code__, scope, py.__name__, py.__defaults__)
    name = py.__name__.split("[")[0]
    body.__qualname__ = f"{name}[{tag}{digest()}]"
    body.__module__, body.__doc__ = py.__module__, py.__doc__
    return body
