"""Sweeps: a grid (and random samples) of parameters, run as functions or notebooks.

A sweep file names a scenario or a notebook, the grid of dotted keys to vary
and, optionally, random samples over ranges. Each point is one task:

* a *function* point simulates the scenario with the point's overrides and
  keeps its summary row (thousands of points are fine);
* a *notebook* point executes the notebook through papermill with the point
  as parameters; the executed copy is kept beside the point's results, so the
  notebook is the run's log.

Each point writes its result files to ``<out>/point=<id>/`` under temporary
names and renames them, its ``manifest.json`` last: a point with a manifest is
done (or recorded as failed, with its error) and is skipped on resume, so an
interrupted sweep picks up where it stopped and nothing half-written is left.
The seed of a point comes from the point itself, so local and distributed runs
of the same sweep give the same results. Local runs use one process per core;
``scheduler=ADDRESS`` runs the same tasks on a Dask cluster.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl

from relakit.io import write_json, write_parquet
from relakit.validate import Reader, display_path, load_yaml


@dataclass(frozen=True)
class SweepSpec:
    name: str
    kind: str  # function | notebook
    target: str  # scenario path (function) or notebook path
    grid: dict
    samples: int = 0
    ranges: dict = field(default_factory=dict)
    seed: int = 0
    base: dict = field(default_factory=dict)  # fixed overrides or parameters
    record_requests: bool = False
    source: str = "<sweep>"

    def points(self) -> list[dict]:
        """Every point: the grid's product, then the random samples (seeded)."""
        keys = list(self.grid)
        pts = [dict(zip(keys, combo, strict=True))
               for combo in itertools.product(*self.grid.values())] if keys else []
        rng = np.random.default_rng(self.seed)
        for _ in range(self.samples):
            pts.append({k: float(rng.uniform(lo, hi)) for k, (lo, hi) in self.ranges.items()})
        return [{**self.base, **p} for p in pts] or [dict(self.base)]


def point_id(point: dict) -> str:
    """A stable id from the point's values (also its task key and its seed)."""
    text = json.dumps(point, sort_keys=True, default=str)
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def point_seed(point: dict) -> int:
    return int(point_id(point), 16) % (2**31)


def load_sweep(source) -> SweepSpec:
    data, name, base_dir = load_yaml(source, "sweep")
    r = Reader(data, name)
    r.only({"name", "scenario", "notebook", "grid", "samples", "seed", "base",
            "record_requests"})
    if ("scenario" in r.data) == ("notebook" in r.data):
        r.fail("give exactly one of 'scenario' (a function sweep) or 'notebook'")
    kind = "function" if "scenario" in r.data else "notebook"
    target = Path(r.data["scenario" if kind == "function" else "notebook"])
    if not target.is_absolute():
        target = base_dir / target if (base_dir / target).exists() else Path.cwd() / target
    if not target.exists():
        r.fail(f"file not found: {display_path(target)}",
               "scenario" if kind == "function" else "notebook")
    grid = r.data.get("grid") or {}
    if not isinstance(grid, dict) or any(not isinstance(v, list) or not v
                                         for v in grid.values()):
        r.fail("expected a mapping of dotted keys to non-empty lists of values", "grid")
    s = r.sub("samples", {"n": 0})
    s.only({"n", "ranges"})
    ranges = s.data.get("ranges") or {}
    if not isinstance(ranges, dict) or any(
            not isinstance(v, list) or len(v) != 2 or not all(
                isinstance(x, int | float) for x in v) or v[0] > v[1]
            for v in ranges.values()):
        s.fail("expected {dotted.key: [low, high]}", "ranges")
    n = s.number("n", 0, lo=0, integer=True)
    if n and not ranges:
        s.fail("random samples need ranges", "ranges")
    base = r.data.get("base") or {}
    if not isinstance(base, dict):
        r.fail("expected a mapping of fixed overrides", "base")
    return SweepSpec(r.data.get("name", Path(name).stem), kind, str(target), grid, n,
                     {k: tuple(v) for k, v in ranges.items()},
                     r.number("seed", 0, lo=0, hi=2**64 - 1, integer=True), base,
                     bool(r.data.get("record_requests", False)), source=name)


# ---- one point ---------------------------------------------------------------------------------
def run_point(spec: SweepSpec, point: dict, out_dir: str) -> dict:
    """Run one point and write its files; returns its manifest. Never raises."""
    os.environ.setdefault("NUMBA_NUM_THREADS", "1")
    pid = point_id(point)
    folder = Path(out_dir) / f"point={pid}"
    manifest = {"point_id": pid, "point": point, "seed": point_seed(point),
                "kind": spec.kind, "status": "ok", "error": None}
    t0 = time.perf_counter()
    try:
        if spec.kind == "function":
            _function_point(spec, point, folder, manifest)
        else:
            _notebook_point(spec, point, folder, manifest)
    except Exception as exc:  # a failing point is recorded; the sweep goes on
        manifest["status"] = "failed"
        manifest["error"] = f"{type(exc).__name__}: {exc}"
        manifest["traceback"] = traceback.format_exc(limit=8)
    manifest["wall_s"] = round(time.perf_counter() - t0, 3)
    write_json(manifest, folder / "manifest.json")
    return manifest


def _function_point(spec, point, folder, manifest):
    import warnings

    from relakit.checks import RelakitWarning
    from relakit.experiment import simulate
    from relakit.scenario import load_scenario

    overrides = {k: v for k, v in point.items() if k != "seed"}
    sc = load_scenario(spec.target, overrides=overrides)
    seed = int(point["seed"]) if "seed" in point else point_seed(point)
    with warnings.catch_warnings():  # the sweep reported them once, before it started
        warnings.simplefilter("ignore", RelakitWarning)
        result = simulate(sc, seed=seed, record_requests=spec.record_requests)
    row = result.summary.filter(pl.col("tier") == "all").row(0, named=True)
    flat = {f"param.{k}": v for k, v in point.items()}
    by_tier = {f"{r['tier']}.success_ratio": r["success_ratio"]
               for r in result.summary.iter_rows(named=True)}
    ctl = result.info.get("control", {})
    extra = {f"time_in_{k}_s": v for k, v in ctl.get("time_in_mode_s", {}).items()}
    extra["mode_changes"] = len(ctl.get("mode_changes", []))
    chain = result.info.get("chain", {})
    extra["isolations"] = int(chain.get("actions", {}).get("aegis.isolate", 0))
    table = pl.DataFrame([{"point_id": manifest["point_id"], "seed": seed, **flat, **row,
                           **by_tier, **extra,
                           "goodput_rps": result.info["goodput_rps"]}])
    write_parquet(table, folder / "result.parquet")
    if result.decisions is not None:
        write_parquet(result.decisions, folder / "decisions.parquet")
    manifest["files"] = ["result.parquet"]


def _notebook_point(spec, point, folder, manifest):
    import papermill as pm

    folder.mkdir(parents=True, exist_ok=True)
    params = {**point, "out_dir": str(folder), "seed": point.get("seed", point_seed(point))}
    executed = folder / "notebook.ipynb"
    tmp = folder / ".notebook.tmp.ipynb"
    try:
        pm.execute_notebook(spec.target, str(tmp), parameters=params, kernel_name="python3",
                            cwd=str(Path(spec.target).resolve().parent), progress_bar=False)
    finally:  # a failed notebook is kept: it is the error log
        if tmp.exists():
            os.replace(tmp, executed)
    manifest["files"] = ["notebook.ipynb"] + sorted(
        p.name for p in folder.glob("*.parquet"))


# ---- the whole sweep -----------------------------------------------------------------------------
def run_sweep(spec, out_dir, *, scheduler: str | None = None, workers: int | None = None,
              progress=None) -> pl.DataFrame:
    """Run every point not done yet; return the combined results (done points only)."""
    from relakit.checks import check_sweep, enforce

    spec = spec if isinstance(spec, SweepSpec) else load_sweep(spec)
    enforce(check_sweep(spec))  # every point's scenario, before any point runs
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    points = spec.points()
    todo = [p for p in points if not (out / f"point={point_id(p)}" / "manifest.json").exists()]
    write_json({"name": spec.name, "kind": spec.kind, "target": spec.target,
                "points": len(points)}, out / "sweep.json")
    report = progress or _print_progress
    done, failed, t0 = len(points) - len(todo), 0, time.perf_counter()
    report(done, failed, len(points), t0)
    if scheduler:
        from distributed import Client, as_completed

        with Client(scheduler) as client:
            futures = [client.submit(run_point, spec, p, str(out), key=f"point-{point_id(p)}",
                                     pure=False) for p in todo]
            for fut in as_completed(futures):
                m = fut.result()
                done, failed = done + 1, failed + (m["status"] != "ok")
                report(done, failed, len(points), t0)
    elif todo:
        from concurrent.futures import ProcessPoolExecutor, as_completed

        n = workers or min(len(todo), os.cpu_count() or 1)
        if n <= 1 or len(todo) == 1:
            for p in todo:
                m = run_point(spec, p, str(out))
                done, failed = done + 1, failed + (m["status"] != "ok")
                report(done, failed, len(points), t0)
        else:
            import multiprocessing as mp

            # spawn, not fork: forking a process whose polars/numba thread pools are
            # running can deadlock the child
            with ProcessPoolExecutor(max_workers=n, mp_context=mp.get_context("spawn")) as pool:
                futs = [pool.submit(run_point, spec, p, str(out)) for p in todo]
                for fut in as_completed(futs):
                    m = fut.result()
                    done, failed = done + 1, failed + (m["status"] != "ok")
                    report(done, failed, len(points), t0)
    return combine(out)


def combine(out_dir) -> pl.DataFrame:
    """All points' results as one table (lazy scan of the per-point parquet files),
    also written as ``results.parquet``."""
    out = Path(out_dir)
    files = sorted(out.glob("point=*/result.parquet"))
    if not files:
        return pl.DataFrame()
    table = pl.scan_parquet([str(f) for f in files], hive_partitioning=False).collect()
    table = table.sort("point_id")
    write_parquet(table, out / "results.parquet")
    return table


def manifests(out_dir) -> pl.DataFrame:
    rows = []
    for f in sorted(Path(out_dir).glob("point=*/manifest.json")):
        m = json.loads(f.read_text())
        rows.append({"point_id": m["point_id"], "status": m["status"], "error": m["error"],
                     "wall_s": m.get("wall_s")})
    return pl.DataFrame(rows)


def _print_progress(done, failed, total, t0):
    elapsed = time.perf_counter() - t0
    rate = done / elapsed if elapsed > 0 and done else 0
    left = (total - done) / rate if rate else float("nan")
    print(f"\rsweep: {done}/{total} done, {failed} failed, {elapsed:.0f} s elapsed, "
          f"~{left:.0f} s left   ", end="" if done < total else "\n", file=sys.stderr,
          flush=True)


__all__ = ["SweepSpec", "combine", "load_sweep", "manifests",
           "point_id", "point_seed", "run_point", "run_sweep"]
