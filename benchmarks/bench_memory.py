"""Peak memory of ``relakit simulate --no-requests`` against run length.

Run with ``make bench`` (or ``python benchmarks/bench_memory.py [--quick]``).
The scenario is ``params/scenarios/mmc-demo.yaml`` (M/M/8 at 720 req/s)
with ``duration_s = N / 720`` for N = 1 M, 10 M and 50 M user requests, run
twice each:

* ``default``: the scenario's metrics interval (1 s), so the metrics table
  grows with the run (rows = series x duration / interval);
* ``scaled``: ``metrics.interval_s`` = 1 s x N / 1 M, so the table holds the
  same number of rows at every length and only the kernel's own footprint is
  left to grow.

Each run is a fresh ``relakit simulate`` process (after one small warm-up run
fills numba's cache, so no figure includes compiling); its peak resident set
comes from ``os.wait4`` (the kernel's ``ru_maxrss`` for that child alone),
the whole process: interpreter, imports, kernel, tables and the parquet
write. MB here are MiB (``ru_maxrss`` is in KiB on Linux). The figure moves by
tens of MB between sessions on a shared machine: compare rows of one run.
A benchmark, not a test: nothing here asserts a size.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
RATE_RPS = 720.0
BASE_INTERVAL_S = 1.0


def scenario(requests: int, scaled: bool) -> dict:
    sc = yaml.safe_load((ROOT / "params/scenarios/mmc-demo.yaml").read_text())
    sc["name"] = f"mem-{requests}"
    sc["duration_s"] = requests / RATE_RPS
    interval = BASE_INTERVAL_S * (requests / 1e6 if scaled else 1.0)
    sc["metrics"] = {"interval_s": interval}
    return sc


def peak_rss_mb(sc: dict, tmp: Path) -> tuple[float, float, int]:
    """(peak RSS in MB, wall seconds, metrics.parquet bytes) of one fresh simulate process."""
    path = tmp / f"{sc['name']}-{sc['metrics']['interval_s']:g}.yaml"
    path.write_text(yaml.safe_dump(sc))
    out = tmp / path.stem
    cmd = [sys.executable, "-m", "relakit.cli", "simulate", str(path), "--no-requests",
           "--out", str(out)]
    wall = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - wall
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n"
                         f"{proc.stderr.read().decode()}")
    size = (out / "metrics.parquet").stat().st_size
    return usage.ru_maxrss / 1024, wall, size  # Linux: ru_maxrss is in KiB


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1 M and 10 M requests only")
    args = ap.parse_args()
    sizes = [1_000_000, 10_000_000] if args.quick else [1_000_000, 10_000_000, 50_000_000]
    with tempfile.TemporaryDirectory(prefix="relakit-bench-mem-") as d:
        tmp = Path(d)
        peak_rss_mb(scenario(10_000, scaled=False), tmp)  # warm numba's cache
        rows = []
        for n in sizes:
            for scaled in (False, True):
                sc = scenario(n, scaled)
                rss, wall, size = peak_rss_mb(sc, tmp)
                rows.append((n, sc["duration_s"], sc["metrics"]["interval_s"], rss, wall, size))
                print(f"  {n / 1e6:g} M requests, interval {sc['metrics']['interval_s']:g} s: "
                      f"{rss:.0f} MB", file=sys.stderr, flush=True)
    print("peak RSS of `relakit simulate --no-requests` (mmc-demo, 720 req/s)")
    head = ("requests", "duration_s", "interval_s", "peak_rss_MB", "wall_s", "metrics.parquet_MB")
    table = [head] + [(f"{n / 1e6:g} M", f"{dur:.0f}", f"{iv:g}", f"{rss:.0f}", f"{w:.1f}",
                       f"{size / 1e6:.1f}") for n, dur, iv, rss, w, size in rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(head))]
    for r in table:
        print("  ".join(v.rjust(w) for v, w in zip(r, widths, strict=True)))
    base = next(rss for n, _, iv, rss, _, _ in rows if n == sizes[0])
    for n, _, iv, rss, _, _ in rows:
        if n == sizes[-1]:
            print(f"{n / 1e6:g} M at interval {iv:g} s: {rss / base:.2f}x the "
                  f"{sizes[0] / 1e6:g} M figure")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
