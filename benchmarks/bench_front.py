"""What the lab's front door (relakit.lab.front) costs: throughput, added latency, CPU.

Run with ``python benchmarks/bench_front.py [--secs S] [--conns 20,60,110]``. Brings a
lab up (``LabSpec()``: 3 instances x 2 servers, 40 ms with a 2 % slow path of 200 ms; no
agent, so nothing is shed) and, per connection count, drives it with Debian's ``wrk``
and ``tools/wrk-think.lua`` (closed clients thinking 500 ms, the gold tier) twice:

* ``front``: one wrk through the front;
* ``direct``: one wrk per instance, the connections split evenly, straight to the
  instances (what the clients would see with no front).

Added latency is the front's p50 (p99) minus the direct runs' (mean over the
instances' wrk). The front's CPU per request is its process's user+system time
(/proc) over the requests it answered; ``idle`` is its CPU with no requests (the
config server polled once a second). Then the same (``fast`` rows) on a lab whose
instances answer at once (mean 0.2 ms, 16 servers each), where what is left of the
latency is the front's, and ``saturate``: wrk with no think time, 64 connections,
through the front to those instances: the most the front carries. A benchmark, not a test; the load
average is printed with each row (the machine is shared).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from relakit.lab import Lab, LabSpec  # noqa: E402

LINE = re.compile(r"relakit: requests (\d+) status (\S*) p50_ms ([\d.]+) p99_ms ([\d.]+) "
                  r"errors (\d+) timeouts (\d+)")


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wrk(url: str, conns: int, secs: int, think: bool = True) -> subprocess.Popen:
    args = ["wrk", "-t1", f"-c{conns}", f"-d{secs}s", "--timeout", "10s", "-s",
            "tools/wrk-think.lua",
            "-H", "X-Tier: gold", url, "--", "500" if think else "0"]
    return subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def result(p: subprocess.Popen) -> dict:
    out = p.communicate(timeout=120)[0]
    m = LINE.search(out)
    if not m:
        raise RuntimeError(out)
    return {"requests": int(m.group(1)), "status": m.group(2), "p50": float(m.group(3)),
            "p99": float(m.group(4)), "errors": int(m.group(5))}


def load() -> str:
    return os.getloadavg().__repr__()


def pair(lab: Lab, c: int, secs: int, label: str) -> None:
    """wrk through the front, then straight to the instances, at ``c`` connections."""
    pid = lab.named["front"].pid
    t, c0 = time.perf_counter(), cpu_s(pid)
    f = result(wrk(f"{lab.front_url}/work", c, secs))
    wall, cpu = time.perf_counter() - t, cpu_s(pid) - c0
    ps = [wrk(f"{u}/work", max(1, c // len(lab.instance_urls)), secs)
          for u in lab.instance_urls]
    d = [result(p) for p in ps]
    d50 = sum(x["p50"] for x in d) / len(d)
    d99 = sum(x["p99"] for x in d) / len(d)
    drps = sum(x["requests"] for x in d) / secs
    print(f"{label} c={c:4d} front {f['requests'] / wall:6.1f} req/s p50 {f['p50']:6.1f} "
          f"p99 {f['p99']:7.1f} ms errors {f['errors']} [{f['status']}] | direct "
          f"{drps:6.1f} req/s p50 {d50:6.1f} p99 {d99:7.1f} | added p50 "
          f"{f['p50'] - d50:+6.1f} p99 {f['p99'] - d99:+7.1f} ms | front CPU "
          f"{1000 * cpu / max(1, f['requests']):.3f} ms/req | load {load()}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--secs", type=int, default=15)
    ap.add_argument("--conns", default="20,60,110")
    a = ap.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed (make system)")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True).stdout.strip()
    print(f"commit {commit}; front p50/p99 minus direct p50/p99 (mean over instances); "
          "front CPU ms per request")
    conns = [int(x) for x in a.conns.split(",")]
    with Lab(LabSpec()) as lab:  # the lab's service: what the tests drive
        time.sleep(2.0)
        pid = lab.named["front"].pid
        t, c0 = time.perf_counter(), cpu_s(pid)
        time.sleep(10.0)  # no requests: what polling the config server costs
        print(f"idle: front CPU {1000 * (cpu_s(pid) - c0) / (time.perf_counter() - t):.1f} "
              f"ms/s | load {load()}", flush=True)
        for c in conns:
            pair(lab, c, a.secs, "lab ")
    # instances that answer at once: what is left of the latency is the front's
    with Lab(LabSpec(mean_ms=0.2, slow_fraction=0.0, servers=16)) as lab:
        time.sleep(2.0)
        for c in conns:
            pair(lab, c, a.secs, "fast")
        pid = lab.named["front"].pid
        t, c0 = time.perf_counter(), cpu_s(pid)
        f = result(wrk(f"{lab.front_url}/work", 64, a.secs, think=False))
        wall, cpu = time.perf_counter() - t, cpu_s(pid) - c0
        print(f"fast saturate c=64 no think: front {f['requests'] / wall:6.1f} req/s p50 "
              f"{f['p50']:.1f} p99 {f['p99']:.1f} ms errors {f['errors']} [{f['status']}] "
              f"| front CPU {1000 * cpu / max(1, f['requests']):.3f} ms/req "
              f"({cpu / wall:.2f} cores) | load {load()}", flush=True)


if __name__ == "__main__":
    main()
