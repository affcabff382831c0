"""Replay speed: the controller over a day of metrics, once and for 1,000 thresholds.

Run with ``python benchmarks/bench_replay.py [--quick]``. A 24-hour synthetic
trace (10 targets scraped every 15 s on random phases, a diurnal load with
latency and error bursts) is replayed at a 2 s evaluation interval under RelA's
policy: once with the full audit, then as a sweep of 1,000 threshold settings
(signals computed once, the hysteresis state machine per setting, in numba).
A benchmark, not a test: nothing here asserts a speed.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import polars as pl

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from relakit.control import TSDB, Clocks  # noqa: E402
from relakit.control.controller import signal_matrix  # noqa: E402
from relakit.control.policy import load_policy  # noqa: E402
from relakit.openloop import replay, sweep_thresholds  # noqa: E402
from relakit.traces.synthetic import synthetic_trace  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="two hours instead of a day")
    args = ap.parse_args()
    duration = 7200.0 if args.quick else 86400.0
    t0 = time.perf_counter()
    trace = synthetic_trace("bursty", duration, nodes=10, phase_s="random", on_s=120,
                            off_s=1800, rate_rps=(200, 260), error_ratio=(0.002, 0.08),
                            latency_ms=(30, 180), resolution_s=0.5, seed=4)
    tsdb = TSDB.from_long(trace)
    t_build = time.perf_counter() - t0
    policy = load_policy(ROOT / "params" / "policies" / "rela.yaml")
    clocks = Clocks()
    replay(tsdb, policy, clocks, end_s=600.0)  # compile once
    t0 = time.perf_counter()
    rep = replay(tsdb, policy, clocks)
    t_replay = time.perf_counter() - t0
    n_eval = rep.timeline.height
    times = clocks.eval_times(*tsdb.span)
    t0 = time.perf_counter()
    signal_matrix(policy, tsdb, times, clocks.window_s)
    t_signals = time.perf_counter() - t0
    settings = {"overloaded": np.linspace(150, 400, 10).tolist(),
                "failing": np.linspace(0.01, 0.1, 10).tolist(),
                "tail_slow": np.linspace(60, 150, 10).tolist()}
    t0 = time.perf_counter()
    swept = sweep_thresholds(tsdb, policy, clocks, settings)
    t_sweep = time.perf_counter() - t0
    figures = {
        "trace_hours": duration / 3600, "trace_rows": trace.height,
        "evaluations": n_eval, "trace_build_s": t_build,
        "replay_s": t_replay, "replay_evaluations_per_s": n_eval / t_replay,
        "decisions_rows": rep.decisions.height,
        "signals_once_s": t_signals,
        "sweep_settings": swept.height, "sweep_s": t_sweep,
        "sweep_settings_per_s": swept.height / t_sweep,
        "sweep_mode_changes_range": (int(swept["mode_changes"].min()),
                                     int(swept["mode_changes"].max())),
    }
    width = max(len(k) for k in figures)
    for k, v in figures.items():
        shown = f"{v:,.3f}" if isinstance(v, float) else str(v)
        print(f"{k.ljust(width)}  {shown}")
    pl.Config.set_tbl_rows(5)


if __name__ == "__main__":
    main()
