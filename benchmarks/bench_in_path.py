"""What the in-path mechanisms cost (issue 33): the 50-node M/M/8 fleet at utilisation
0.9, each mechanism on alone, beside the plain run.

Run with ``python benchmarks/bench_in_path.py [--requests N] [--rounds R] [--only LABEL...]
[--lognormal-cv CV]``.
Variants, rounds interleaved so every variant sees the same machine load:

* ``plain``: no mechanism (the plain specialisations, as runs take them);
* ``general, plain``: the same fleet through the general kernel (``Fleet.specialise =
  False``): the loop a run with an in-path mechanism took before the in-path settled
  loop (``loops.in_path_ok``, 3487556);
* ``client_throttle``, ``concurrency aimd``, ``concurrency gradient``, ``codel``,
  ``codel + adaptive_lifo``: each alone, as runs take them (the in-path settled loop
  since 3487556, its simple variant on this simple fleet since issue 33's lean loops),
  the same in the in-path settled loop (``settled:`` rows: ``loops.simple_ok`` said
  no), and through ``kernel.specialised`` on exactly the mechanisms on (``spec:`` rows:
  the general loop's LEFTOVERS kept).

At utilisation 0.9 no mechanism refuses much: the figures are the cost of deciding,
not of what the decisions save. Rates are user requests per CPU second of a whole
``relakit.simulate``, records off; the best and the median of the rounds. Variants
whose keys this checkout does not know are left out (so the script runs on a commit
before issue 33, for the "before" figure). A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_kernel import mm8  # noqa: E402

import relakit  # noqa: E402
from relakit.sim import kernel as K  # noqa: E402
from relakit.sim import loops  # noqa: E402
from relakit.sim.fleet import Fleet  # noqa: E402

MECHANISMS = {
    "client_throttle": {"mitigations": {"client_throttle": {"k": 2.0, "window_s": 60}}},
    "concurrency aimd": {"mitigations": {"concurrency_limit": {
        "algorithm": "aimd", "initial": 20, "max": 64, "latency_ms": 100}}},
    "concurrency gradient": {"mitigations": {"concurrency_limit": {
        "algorithm": "gradient", "initial": 20, "max": 64}}},
    "codel": {"mitigations": {"codel": {"target_ms": 5, "interval_ms": 100}}},
    "codel + adaptive_lifo": {"mitigations": {"codel": {"target_ms": 5, "interval_ms": 100}},
                              "fleet": {"queue_discipline": "adaptive_lifo"}},
}


def scenario(name: str, requests: float, cv: float | None = None) -> dict:
    """The fleet with ``name``'s mechanism on; with ``cv``, lognormal demand of that
    coefficient of variation (not simple: the plain and in-path settled loops run it)."""
    sc = mm8(50, requests)
    if cv is not None:
        sc["fleet"]["service"] = {"kind": "lognormal", "mean_ms": 10, "cv": cv}
    for key, extra in MECHANISMS.get(name, {}).items():
        sc[key] = {**sc.get(key, {}), **extra}
    return sc


def known(name: str) -> bool:
    try:
        relakit.load_scenario(scenario(name, 1e3))
    except Exception:  # noqa: BLE001 - a key this checkout does not know
        return False
    return True


def rate(sc: dict, mode: str) -> float:
    """``mode``: "as run" (Fleet's choice), "general", "settled" (the in-path settled
    loop, never its simple variant) or "spec" (specialised on the mechanisms on)."""
    saved_run, saved_spec, saved_simple_ok = K.run, Fleet.specialise, loops.simple_ok
    if mode == "general":
        Fleet.specialise = False
    if mode == "settled":  # (run_in_path asks simple_ok; no plain stretch in these runs)
        loops.simple_ok = lambda cfg, st: False
    try:
        if mode == "spec":
            fl = Fleet(relakit.load_scenario(sc), record_requests=False)
            feats = K.features_of(fl.cfg, fl.st)
            fn = K.specialised(feats)
            K.run = lambda cfg, st, out, t_end: fn(*cfg, *st, *out, t_end)
            Fleet.specialise = False
        t = time.process_time()
        r = relakit.simulate(sc, record_requests=False)
        return r.info["user_requests"] / (time.process_time() - t)
    finally:
        K.run, Fleet.specialise, loops.simple_ok = saved_run, saved_spec, saved_simple_ok


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=float, default=1e6, help="user requests a run (1e6)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of every variant (3)")
    ap.add_argument("--lognormal-cv", type=float, default=None,
                    help="lognormal demand of this cv instead of exponential (not simple)")
    ap.add_argument("--only", nargs="*", default=None,
                    help="variants by label, as printed (default all)")
    a = ap.parse_args()
    runs = [("plain", "plain", "as run"), ("general, plain", "plain", "general")]
    for name in MECHANISMS:
        if known(name):
            runs += [(name, name, "as run"), (f"settled: {name}", name, "settled"),
                     (f"spec: {name}", name, "spec")]
    if a.only:
        runs = [r for r in runs if r[0] in a.only]
    for _, name, mode in runs:  # compile (or load) every loop first
        rate(scenario(name, 1e4, a.lognormal_cv), mode)
    rates: dict[str, list[float]] = {}
    for r in range(a.rounds):
        row = []
        for label, name, mode in runs:
            v = rate(scenario(name, a.requests, a.lognormal_cv), mode) / 1e6
            rates.setdefault(label, []).append(v)
            row.append(f"{label} {v:.2f}")
        print(f"round {r + 1} (load {os.getloadavg()[0]:.2f}): " + ", ".join(row), flush=True)
    print("\nM user requests per CPU second (best, median; ratio of medians to plain):")
    base = statistics.median(rates["plain"]) if "plain" in rates else None
    for label, vs in rates.items():
        ratio = f"{statistics.median(vs) / base:5.2f}x" if base else ""
        print(f"  {label.ljust(30)} {max(vs):6.3f} {statistics.median(vs):6.3f} {ratio}")


if __name__ == "__main__":
    main()
