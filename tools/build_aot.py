"""Compile the plain loops ahead of time (``make setup`` runs it after warming the
kernel cache; relakit.sim.aot says why and how). A no-op when the build for the
current sources is on disk; ``--force`` rebuilds.

The loops' argument types are numba's own, from a small plain run through numba's
loops (loaded from the warm cache): every scenario gives them the same types."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from warm_kernel_cache import PLAIN  # (tools/: the warm cache's plain scenario)

import relakit
from relakit.sim import aot, plain


def signature():
    """The plain loops' full signature, as numba types them."""
    os.environ["RELAKIT_AOT"] = "0"  # (this process only: numba's loops, to type them)
    relakit.simulate(PLAIN, record_requests=False)
    loop = plain.advance_plain_simple
    return loop.overloads[loop.signatures[0]].signature


def main() -> None:
    t = time.perf_counter()
    force = "--force" in sys.argv[1:]
    if aot.built_path() is not None and not force:
        return
    path = aot.build({"advance_plain_simple": plain.advance_plain_simple,
                      "advance_plain": plain.advance_plain}, signature(), force=force)
    if path is not None:
        root = Path(aot.__file__).parents[2]
        print(f"plain loops compiled ahead of time: {path.relative_to(root)} "
              f"({time.perf_counter() - t:.1f} s)")


if __name__ == "__main__":
    main()
