"""Sweeps: a grid (and random samples) of parameters, run as functions or notebooks.

A sweep file names a scenario or a notebook, the grid of dotted keys to vary
and, optionally, random samples over ranges. Each point is one task:

* a *function* point simulates the scenario with the point's overrides and
  keeps its summary row (thousands of points are fine);
* a *notebook* point executes the notebook through papermill with the point
  as parameters; the executed copy is kept beside the point's results, so the
  notebook is the run's log.

Each point writes its result files to ``<out>/point=<id>/`` under temporary
names and renames them, its ``manifest.json`` last. A point is done (or
recorded as failed, with its error) when its manifest exists *and* names the
same inputs digest as the point now has: a hash of the point's parameters, the
relakit version and the content of every file it runs (the scenario or
notebook, and the policy, chain, clocks and arrival-trace files the scenario
references). So an interrupted sweep picks up where it stopped, and an edited
file reruns exactly the points that read it. ``results.parquet`` and
:func:`manifests` hold only the current spec's points (``sweep.json`` lists
them); folders of other specs are left on disk, ignored and counted. Leftover
temporary files of killed writes are removed when a sweep starts. The seed of a
point comes from its parameters alone, so local and distributed runs of the
same sweep give the same results. Local runs use one process per core;
``scheduler=ADDRESS`` runs the same tasks on a Dask cluster (both through
:mod:`relakit.runner`, which replications share).
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import shutil
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl

from relakit.io import write_json, write_parquet
from relakit.progress import Progress, Ticker
from relakit.runner import run_tasks
from relakit.validate import Reader, display_path, load_yaml

# scenario keys whose string value names another file the point reads
_REFERENCES = (("policy",), ("chain",), ("clocks",), ("workload", "arrival", "path"))


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
    """From the point's values alone: editing a file reruns a point with the same seed."""
    return int(point_id(point), 16) % (2**31)


def point_inputs(spec: SweepSpec, point: dict, _file_hash=None) -> str:
    """The digest of everything a point runs: the relakit version, the point's values
    and the content of every file it reads (the scenario or notebook; the policy,
    chain, clocks and arrival-trace files the scenario names after the point's
    overrides). Comments count too: an edit anywhere in a file reruns its points."""
    from relakit import __version__

    file_hash = _file_hash or _hash_file
    files = {"target": file_hash(spec.target)}
    if spec.kind == "function":
        for key, path in _referenced_files(spec.target, point).items():
            files[key] = file_hash(path) if path else None
    text = json.dumps({"relakit": __version__, "kind": spec.kind, "point": point,
                       "record_requests": spec.record_requests, "files": files},
                      sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _hash_file(path) -> str | None:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None  # the point will fail and say why; its identity still differs


def _referenced_files(scenario, point: dict) -> dict:
    """{dotted key: resolved path or None} for every file the scenario refers to,
    after the point's overrides (a grid may switch policy files). Resolved as
    :func:`relakit.scenario.load_scenario` does: beside the scenario, then cwd."""
    import yaml

    path = Path(scenario)
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return {}
    if not isinstance(data, dict):
        return {}
    for dotted, value in point.items():
        _set_if_possible(data, dotted.split("."), value)
    out = {}
    for keys in _REFERENCES:
        cur = data
        for k in keys:
            cur = cur.get(k) if isinstance(cur, dict) else None
        if isinstance(cur, str):
            found = [p for p in (path.resolve().parent / cur, Path.cwd() / cur) if p.is_file()]
            out[".".join(keys)] = found[0] if found else None
    return out


def _set_if_possible(data, keys: list[str], value) -> None:
    """Apply one override to the raw mapping; a key that reaches into a referenced
    file (a string) or a list index that does not exist leaves the data as it is
    (the file is still hashed; a bad key fails when the point runs)."""
    cur = data
    for k in keys[:-1]:
        if isinstance(cur, dict):
            cur = cur.setdefault(k, {})
        elif isinstance(cur, list) and k.isdigit() and int(k) < len(cur):
            cur = cur[int(k)]
        else:
            return
    if isinstance(cur, dict):
        cur[keys[-1]] = value
    elif isinstance(cur, list) and keys[-1].isdigit() and int(keys[-1]) < len(cur):
        cur[int(keys[-1])] = value


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
def run_point(spec: SweepSpec, point: dict, out_dir: str, inputs: str | None = None) -> dict:
    """Run one point and write its files; returns its manifest. Never raises.

    ``inputs`` is the point's digest (:func:`point_inputs`), computed by the caller
    before the run: if a file changes meanwhile, the next resume reruns the point."""
    os.environ.setdefault("NUMBA_NUM_THREADS", "1")
    pid = point_id(point)
    inputs = inputs or point_inputs(spec, point)
    folder = Path(out_dir) / f"point={pid}"
    _clear(folder)  # a rerun: nothing of the old inputs' results may survive
    manifest = {"point_id": pid, "point": point, "seed": point_seed(point),
                "inputs": inputs, "kind": spec.kind, "status": "ok", "error": None}
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


def _clear(folder: Path) -> None:
    """Empty a point's folder before it runs, manifest first, so a kill halfway leaves
    a folder without a manifest (not done) rather than old results under a new name."""
    if not folder.is_dir():
        return
    (folder / "manifest.json").unlink(missing_ok=True)
    for p in folder.iterdir():
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()


# ---- the whole sweep -----------------------------------------------------------------------------
def run_sweep(spec, out_dir, *, scheduler: str | None = None, workers: int | None = None,
              progress=None, notice=None) -> pl.DataFrame:
    """Run every point not done with its current inputs; return the combined results
    of the spec's points (done points only). ``notice`` receives one line per thing
    worth saying (temporary files removed, points rerun, folders ignored); by
    default it prints to stderr."""
    from relakit.checks import check_sweep, enforce

    spec = spec if isinstance(spec, SweepSpec) else load_sweep(spec)
    enforce(check_sweep(spec))  # every point's scenario, before any point runs
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    say = notice or (lambda line: print(f"sweep: {line}", file=sys.stderr, flush=True))
    removed = remove_leftovers(out)
    if removed:
        say(f"removed {removed} leftover temporary file(s) of interrupted writes")
    points = spec.points()
    hashes: dict = {}
    digest = {point_id(p): point_inputs(spec, p, lambda f: _cached_hash(hashes, f))
              for p in points}
    todo, changed = [], 0
    for p in points:
        state = _manifest_inputs(out / f"point={point_id(p)}" / "manifest.json")
        if state != digest[point_id(p)]:
            todo.append(p)
            changed += state is not None
    if changed:
        say(f"{changed} point(s) ran with other inputs (an edited file, another relakit "
            "version); running them again")
    stale = sorted(f.name for f in out.glob("point=*")
                   if f.is_dir() and f.name.removeprefix("point=") not in digest)
    if stale:
        say(f"ignoring {len(stale)} point folder(s) not in this spec (kept on disk, not "
            "in results.parquet)")
    write_json({"name": spec.name, "kind": spec.kind, "target": spec.target,
                "points": len(points), "inputs": digest, "ignored_folders": stale},
               out / "sweep.json")
    line = None
    if progress is None:  # a line on stderr when it is a terminal (relakit.progress)
        line = Progress("sweep", len(points), "points", start=len(points) - len(todo))
        progress = _line_reporter(line)
    report = progress
    done, failed, t0 = len(points) - len(todo), 0, time.perf_counter()
    report(done, failed, len(points), t0)
    with Ticker(line) if line is not None else contextlib.nullcontext():
        def finished(_i, m):
            nonlocal done, failed
            done, failed = done + 1, failed + (m["status"] != "ok")
            report(done, failed, len(points), t0)

        run_tasks([(run_point, (spec, p, str(out), digest[point_id(p)])) for p in todo],
                  workers=workers, scheduler=scheduler, on_done=finished,
                  keys=[f"point-{point_id(p)}-{digest[point_id(p)]}" for p in todo])
    return combine(out)


def _cached_hash(cache: dict, path) -> str | None:
    key = str(Path(path).resolve())
    if key not in cache:
        cache[key] = _hash_file(path)
    return cache[key]


def _manifest_inputs(path: Path) -> str | None:
    """The inputs digest a point's manifest records ('' for an older manifest without
    one, so it reruns), or None when the point has not finished."""
    try:
        return json.loads(path.read_text()).get("inputs", "")
    except FileNotFoundError:
        return None
    except (OSError, ValueError, AttributeError):
        return ""  # unreadable: run it again


def remove_leftovers(out_dir) -> int:
    """Delete the temporary files of writes that were killed before their rename
    (:func:`relakit.io.atomic_write` names them ``.NAME.XXXX.tmp``; papermill's
    copy is ``.notebook.tmp.ipynb``). Call only when no sweep writes to the folder."""
    n = 0
    for p in Path(out_dir).rglob(".*"):
        if p.is_file() and (p.name.endswith(".tmp") or p.name == ".notebook.tmp.ipynb"):
            p.unlink()
            n += 1
    return n


def _members(out: Path) -> dict | None:
    """{point_id: inputs digest} of the spec last run into the folder (sweep.json), or
    None for a folder written before sweeps recorded their inputs."""
    try:
        return json.loads((out / "sweep.json").read_text()).get("inputs")
    except (OSError, ValueError):
        return None


def _current(out: Path) -> list[tuple[Path, dict]]:
    """(folder, manifest) of the current spec's finished points with current inputs."""
    members = _members(out)
    found = []
    for f in sorted(out.glob("point=*/manifest.json")):
        pid = f.parent.name.removeprefix("point=")
        if members is not None and pid not in members:
            continue
        try:
            m = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if members is not None and m.get("inputs") != members[pid]:
            continue
        found.append((f.parent, m))
    return found


def combine(out_dir) -> pl.DataFrame:
    """The current spec's results as one table (lazy scan of the per-point parquet
    files of points done with their current inputs), also written as
    ``results.parquet``: exactly the spec's points, even in a folder holding others."""
    out = Path(out_dir)
    files = [folder / "result.parquet" for folder, m in _current(out)
             if m.get("status") == "ok" and (folder / "result.parquet").is_file()]
    if not files:
        table = pl.DataFrame(schema={"point_id": pl.String})
    else:
        table = pl.scan_parquet([str(f) for f in files], hive_partitioning=False).collect()
        table = table.sort("point_id")
    write_parquet(table, out / "results.parquet")
    return table


def manifests(out_dir) -> pl.DataFrame:
    """One row per point of the current spec that has finished (ok or failed)."""
    rows = [{"point_id": m["point_id"], "status": m["status"], "error": m["error"],
             "wall_s": m.get("wall_s")} for _, m in _current(Path(out_dir))]
    return pl.DataFrame(rows)


def _line_reporter(line: Progress):
    """The default report: the sweep's progress line (points done, failed, time left;
    no estimate until a point of this run has finished)."""
    def report(done, failed, total, t0):
        line.update(done, f"{failed} failed")
    return report


__all__ = ["SweepSpec", "combine", "load_sweep", "manifests", "point_id", "point_inputs",
           "point_seed", "remove_leftovers", "run_point", "run_sweep"]
