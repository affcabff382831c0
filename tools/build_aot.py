"""Compile the plain and lean mitigated specialisations of the event loop ahead of
time (``make setup`` runs it after warming the kernel cache; relakit.sim.aot says why
and how). A no-op when the build for the current sources is on disk; ``--force``
rebuilds.

The loops' argument types are numba's own, from a small plain and a small mitigated
run through numba's loops (loaded from the warm cache): every scenario gives them the
same types."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from warm_kernel_cache import MITIGATED, PLAIN  # (tools/: the warm cache's scenarios)

import relakit
from relakit.sim import aot, loops
from relakit.sim import kernel as K


def signature(loop, scenario):
    """A loop's full signature, as numba types it in a run of ``scenario``."""
    os.environ["RELAKIT_AOT"] = "0"  # (this process only: numba's loops, to type them)
    relakit.simulate(scenario, record_requests=False)
    return loop.overloads[loop.signatures[0]].signature


def main() -> None:
    t = time.perf_counter()
    force = "--force" in sys.argv[1:]
    if aot.built_path() is not None and not force:
        return
    simple = K.specialised(frozenset(), simple=True)  # (relakit.sim.loops.plain_loops)
    settled = K.specialised(frozenset(), settled=True)
    plain_sig = signature(simple, PLAIN)
    one_call, fanout = loops.advance_mitigated(), loops.advance_mitigated_fanout()
    mitigated_sig = signature(one_call, MITIGATED)
    path = aot.build({"advance_plain_simple": (simple, plain_sig),
                      "advance_plain": (settled, plain_sig),
                      "advance_mitigated": (one_call, mitigated_sig),
                      "advance_mitigated_fanout": (fanout, mitigated_sig)},
                     force=force)
    if path is not None:
        root = Path(aot.__file__).parents[2]
        print(f"plain and mitigated loops compiled ahead of time: {path.relative_to(root)} "
              f"({time.perf_counter() - t:.1f} s)")


if __name__ == "__main__":
    main()
