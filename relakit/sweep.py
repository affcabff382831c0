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

``replications: N`` (N > 1, function sweeps) runs every point N times, each run a
task of its own in ``point=<id>/rep=<i>/`` (its own manifest, resumed one by one;
raising N keeps the runs done). The seeds are ``replication_seeds(seed, N)`` with
the sweep's ``seed``, the same at every point: common random numbers, so two
points differ by their parameters and not by their luck, and a paired interval
against a ``baseline:`` point is narrow. ``results.parquet`` then holds each
number's mean, ``<name>_ci`` (95 % Student t half-width) and ``replications``;
``replications.parquet`` the runs; with a baseline, ``<name>_significant`` and
``baseline.parquet`` (paired differences, :func:`relakit.stats.paired_difference`).
"""

from __future__ import annotations

import contextlib
import copy
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
    replications: int = 1  # runs per point; > 1: common seeds across points (CRN)
    baseline: dict = field(default_factory=dict)  # grid values every point is compared with

    def seeds(self, point: dict) -> list[int]:
        """The seeds of a point's runs. One run: the point's own seed (``seed`` in the
        point, else :func:`point_seed`), as before replications existed. ``N`` > 1:
        ``replication_seeds(base, N)`` with ``base`` the point's ``seed`` if it sets
        one, else the sweep's ``seed`` - the *same* seeds at every point (common random
        numbers), so a difference between two points is the parameters', not the
        seeds', and paired intervals against the baseline are narrow."""
        from relakit.replications import replication_seeds

        if self.replications <= 1:
            return [int(point["seed"]) if "seed" in point else point_seed(point)]
        base = int(point["seed"]) if "seed" in point else int(self.seed)
        return replication_seeds(base, self.replications)

    def baseline_of(self, point: dict) -> dict | None:
        """The point a point is compared with: itself with the baseline's grid values
        (None without a baseline)."""
        return {**point, **self.baseline} if self.baseline else None

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

    file_hash = _file_hash or hash_file
    files = {"target": file_hash(spec.target)}
    if spec.kind == "function":
        for key, path in referenced_files(spec.target, point).items():
            files[key] = file_hash(path) if path else None
    text = json.dumps({"relakit": __version__, "kind": spec.kind, "point": point,
                       "record_requests": spec.record_requests, "files": files},
                      sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def scenario_inputs(path, overrides: dict | None = None) -> str:
    """The digest of everything a run of the scenario file reads (its content and the
    policy, chain, clocks and arrival-trace files it names, comments included): a run
    folder stamped with it (``inputs`` in summary.json) is known to be that
    scenario's, so ``relakit figures --scenario`` redraws it or runs it again."""
    from relakit import __version__

    files = {"target": hash_file(path)}
    for key, ref in referenced_files(path, overrides or {}).items():
        files[key] = hash_file(ref) if ref else None
    text = json.dumps({"relakit": __version__, "overrides": overrides or {}, "files": files},
                      sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def hash_file(path) -> str | None:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None  # the point will fail and say why; its identity still differs


def referenced_files(scenario, point: dict) -> dict:
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
        cur[keys[-1]] = copy.deepcopy(value)  # a mapping value is the point's own: a later
        # dotted key reaching into it (clocks.window_s after clocks) must not write into it
    elif isinstance(cur, list) and keys[-1].isdigit() and int(keys[-1]) < len(cur):
        cur[int(keys[-1])] = value


def load_sweep(source) -> SweepSpec:
    data, name, base_dir = load_yaml(source, "sweep")
    r = Reader(data, name)
    r.only({"name", "scenario", "notebook", "grid", "samples", "seed", "base",
            "record_requests", "replications", "baseline"})
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
    reps = r.number("replications", 1, lo=1, hi=MAX_REPLICATIONS, integer=True)
    for where, keys in (("grid", grid), ("base", base)):
        if "replications" in keys and kind == "function":
            r.fail("a point's runs are counted by the sweep's own `replications:` key, "
                   "not by a scenario override", f"{where}.replications")
    if reps > 1 and kind == "notebook":
        r.fail("replications apply to function sweeps; a notebook takes its own "
               "`replications` parameter (set it in base)", "replications")
    if kind == "notebook":  # papermill would run a misspelt parameter as a new variable
        known = notebook_parameters(target)
        for where, keys in (("grid", grid), ("base", base), ("samples.ranges", ranges)):
            for k in keys:
                if k not in known:
                    r.fail(f"{display_path(target)} has no parameter {k!r}; its parameters: "
                           + ", ".join(known), f"{where}.{k}")
    baseline = _baseline(r, grid, n, reps)
    return SweepSpec(r.data.get("name", Path(name).stem), kind, str(target), grid, n,
                     {k: tuple(v) for k, v in ranges.items()},
                     r.number("seed", 0, lo=0, hi=2**64 - 1, integer=True), base,
                     bool(r.data.get("record_requests", False)), source=name,
                     replications=reps, baseline=baseline)


MAX_REPLICATIONS = 10_000


def notebook_parameters(path) -> dict:
    """``{name: default}`` of a notebook's cell tagged ``parameters`` (papermill's), read
    without running it: the assignments ``name = literal`` (a default that is no
    literal, e.g. ``Path(...)``, is None). A notebook without such a cell has none."""
    import ast

    nb = json.loads(Path(path).read_text())
    out: dict = {}
    for cell in nb.get("cells", []):
        if cell.get("cell_type") != "code" or "parameters" not in cell.get(
                "metadata", {}).get("tags", []):
            continue
        source = "".join(cell.get("source", []))
        for node in ast.parse(source).body:
            targets = (node.targets if isinstance(node, ast.Assign) else
                       [node.target] if isinstance(node, ast.AnnAssign) else [])
            for t in targets:
                if isinstance(t, ast.Name):
                    try:
                        out[t.id] = ast.literal_eval(node.value) if node.value else None
                    except ValueError:
                        out[t.id] = None
    return out


def _baseline(r: Reader, grid: dict, samples: int, reps: int) -> dict:
    """``baseline:`` as {grid key: value}: each value must be one of its key's grid
    values. A full point (every grid key) is one reference cell; a subset compares each
    point with the point that differs only in those keys (e.g. each row of a heatmap
    with its own first column)."""
    if "baseline" not in r.data:
        return {}
    b = r.data["baseline"]
    if not isinstance(b, dict) or not b:
        r.fail("expected a mapping of grid keys to one of their grid values", "baseline")
    if reps < 2:
        r.fail("a difference from the baseline needs an interval: set replications: 2 "
               "or more", "baseline")
    if samples:
        r.fail("random samples have no baseline point on the grid; drop samples or "
               "baseline", "baseline")
    for k, v in b.items():
        if k not in grid:
            r.fail(f"{k!r} is not a grid key; grid keys: {', '.join(grid) or 'none'}",
                   f"baseline.{k}")
        if isinstance(v, bool | dict | list) or v not in grid[k]:
            r.fail(f"{v!r} is not on the grid; {k} takes {grid[k]}", f"baseline.{k}")
    # the grid's own value (250, not 250.0), so the baseline point has the grid point's id
    return {k: grid[k][grid[k].index(v)] for k, v in b.items()}


# ---- one point ---------------------------------------------------------------------------------
def run_point(spec: SweepSpec, point: dict, out_dir: str, inputs: str | None = None,
              replication: int | None = None) -> dict:
    """Run one point (or, with ``replication`` i, its i-th replication) and write its
    files; returns its manifest. Never raises.

    A replication is a task of its own, in ``point=<id>/rep=<i>/``, with its own
    manifest: a sweep killed halfway through a point resumes at the replications
    it had not finished. ``inputs`` is the digest the caller computed before the
    run (:func:`point_inputs`, or :func:`replication_inputs`): if a file changes
    meanwhile, the next resume reruns the point."""
    os.environ.setdefault("NUMBA_NUM_THREADS", "1")
    pid = point_id(point)
    folder = Path(out_dir) / f"point={pid}"
    seed = spec.seeds(point)[replication or 0]
    if replication is None:
        inputs = inputs or point_inputs(spec, point)
    else:
        folder = folder / f"rep={replication}"
        inputs = inputs or replication_inputs(point_inputs(spec, point), seed)
    _clear(folder)  # a rerun: nothing of the old inputs' results may survive
    manifest = {"point_id": pid, "point": point, "seed": seed,
                "inputs": inputs, "kind": spec.kind, "status": "ok", "error": None}
    if replication is not None:
        manifest["replication"] = replication
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


def replication_inputs(inputs: str, seed: int) -> str:
    """A replication's digest: its point's inputs and its own seed (not the count of
    replications: raising ``replications`` from 5 to 10 keeps the first five, whose
    seeds do not change, and runs five more)."""
    return hashlib.sha256(f"{inputs}:{int(seed)}".encode()).hexdigest()[:16]


def _function_point(spec, point, folder, manifest):
    import warnings

    from relakit.checks import RelakitWarning
    from relakit.experiment import require_one_fleet, simulate
    from relakit.scenario import load_scenario

    overrides = {k: v for k, v in point.items() if k != "seed"}
    sc = load_scenario(spec.target, overrides=overrides)
    require_one_fleet(sc, "a sweep point")
    seed = manifest["seed"]
    with warnings.catch_warnings():  # the sweep reported them once, before it started
        warnings.simplefilter("ignore", RelakitWarning)
        # one run: the sweep's own `replications` decides how many (a task each)
        result = simulate(sc, seed=seed, record_requests=spec.record_requests,
                          replications=1)
    row = result.summary.filter(pl.col("tier") == "all").row(0, named=True)
    flat = {f"param.{k}": v for k, v in point.items()}
    by_tier = {f"{r['tier']}.success_ratio": r["success_ratio"]
               for r in result.summary.iter_rows(named=True)}
    ctl = result.info.get("control", {})
    extra = {f"time_in_{k}_s": v for k, v in ctl.get("time_in_mode_s", {}).items()}
    extra["mode_changes"] = len(ctl.get("mode_changes", []))
    chain = result.info.get("chain", {})
    extra["isolations"] = int(chain.get("actions", {}).get("aegis.isolate", 0))
    rep = {"replication": manifest["replication"]} if "replication" in manifest else {}
    table = pl.DataFrame([{"point_id": manifest["point_id"], **rep, "seed": seed, **flat, **row,
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
    # one task per run: (point, replication index or None, the run's digest)
    runs, reps = [], spec.replications > 1
    for p in points:
        pid = point_id(p)
        if reps:
            runs += [(p, i, replication_inputs(digest[pid], s))
                     for i, s in enumerate(spec.seeds(p))]
        else:
            runs.append((p, None, digest[pid]))
    todo, changed = [], set()
    for p, i, d in runs:
        folder = out / f"point={point_id(p)}" / ("" if i is None else f"rep={i}")
        state = _manifest_inputs(folder / "manifest.json")
        if state != d:
            todo.append((p, i, d))
            if state is not None:
                changed.add(point_id(p))
    if changed:
        say(f"{len(changed)} point(s) ran with other inputs (an edited file, another "
            "relakit version); running them again")
    stale = sorted(f.name for f in out.glob("point=*")
                   if f.is_dir() and f.name.removeprefix("point=") not in digest)
    if stale:
        say(f"ignoring {len(stale)} point folder(s) not in this spec (kept on disk, not "
            "in results.parquet)")
    record = {"name": spec.name, "kind": spec.kind, "target": spec.target,
              "points": len(points), "inputs": digest, "ignored_folders": stale,
              "replications": spec.replications}
    if reps:
        record["runs"] = {pid: [] for pid in digest}
        for p, _i, d in runs:
            record["runs"][point_id(p)].append(d)
        record["seeds"] = {point_id(p): spec.seeds(p) for p in points}
    if spec.baseline:
        record["baseline"] = spec.baseline
        record["baseline_of"] = {point_id(p): point_id(spec.baseline_of(p)) for p in points}
    write_json(record, out / "sweep.json")
    line = None
    unit = "runs" if reps else "points"
    if progress is None:  # a line on stderr when it is a terminal (relakit.progress)
        line = Progress("sweep", len(runs), unit, start=len(runs) - len(todo))
        progress = _line_reporter(line)
    report = progress
    done, failed, t0 = len(runs) - len(todo), 0, time.perf_counter()
    report(done, failed, len(runs), t0)
    with Ticker(line) if line is not None else contextlib.nullcontext():
        def finished(_i, m):
            nonlocal done, failed
            done, failed = done + 1, failed + (m["status"] != "ok")
            report(done, failed, len(runs), t0)

        # every replication of every point is its own task: they run in parallel
        run_tasks([(run_point, (spec, p, str(out), d, i)) for p, i, d in todo],
                  workers=workers, scheduler=scheduler, on_done=finished,
                  keys=[f"point-{point_id(p)}-{d}" if i is None else
                        f"point-{point_id(p)}-rep-{i}-{d}" for p, i, d in todo])
    return combine(out)


def _cached_hash(cache: dict, path) -> str | None:
    key = str(Path(path).resolve())
    if key not in cache:
        cache[key] = hash_file(path)
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


def _record(out: Path) -> dict | None:
    """sweep.json of the spec last run into the folder, or None for a folder written
    before sweeps recorded their inputs."""
    try:
        return json.loads((out / "sweep.json").read_text())
    except (OSError, ValueError):
        return None


def _read_manifest(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _current(out: Path) -> list[tuple[str, list[tuple[Path, dict]]]]:
    """(point id, [(folder, manifest) of each of its runs]) of the current spec's
    points whose every run finished with its current inputs (one run per point, or
    its replications in order)."""
    rec = _record(out)
    members = rec.get("inputs") if rec else None
    per_run = (rec or {}).get("runs")  # replicated: each replication's digest
    found = []
    if per_run is not None:
        for pid, digests in sorted(per_run.items()):
            runs = []
            for i, d in enumerate(digests):
                folder = out / f"point={pid}" / f"rep={i}"
                m = _read_manifest(folder / "manifest.json")
                if m is None or m.get("inputs") != d:
                    break
                runs.append((folder, m))
            else:
                found.append((pid, runs))
        return found
    for f in sorted(out.glob("point=*/manifest.json")):
        pid = f.parent.name.removeprefix("point=")
        if members is not None and pid not in members:
            continue
        m = _read_manifest(f)
        if m is None or (members is not None and m.get("inputs") != members[pid]):
            continue
        found.append((pid, [(f.parent, m)]))
    return found


def combine(out_dir) -> pl.DataFrame:
    """The current spec's results as one table, also written as ``results.parquet``:
    exactly the spec's points, even in a folder holding others (only points done
    with their current inputs).

    With replications, a point counts once all its replications are done and ok:
    ``replications.parquet`` holds one row per point and replication (``replication``,
    ``seed``), and ``results.parquet`` one row per point with every number's mean
    under its own name, its 95 % half-width as ``<name>_ci`` and ``replications``
    (:func:`relakit.replications.summarise_replications`; the per-tier numbers are
    the ``<tier>.<name>`` columns). With a baseline, ``baseline_id`` names the point
    each was paired with and ``<name>_significant`` says whether the paired
    difference's interval excludes 0 (null for the baseline itself, or where a
    number is missing); ``baseline.parquet`` holds the differences themselves."""
    out = Path(out_dir)
    rec = _record(out) or {}
    runs = [(pid, done) for pid, done in _current(out)
            if all(m.get("status") == "ok" and (f / "result.parquet").is_file()
                   for f, m in done)]
    files = [str(f / "result.parquet") for _, done in runs for f, _m in done]
    if not files:
        table = pl.DataFrame(schema={"point_id": pl.String})
        if "runs" in rec:
            write_parquet(pl.DataFrame(schema={"point_id": pl.String,
                                               "replication": pl.Int64}),
                          out / "replications.parquet")
    else:
        table = pl.scan_parquet(files, hive_partitioning=False).collect()
        if "runs" in rec:
            table = table.sort("point_id", "replication")
            write_parquet(table, out / "replications.parquet")
            table = _fold_replications(table, rec.get("baseline_of"), out)
        else:
            table = table.sort("point_id")
    write_parquet(table, out / "results.parquet")
    return table


def _fold_replications(runs: pl.DataFrame, baseline_of: dict | None, out: Path):
    """One row per point from its replications' rows (see :func:`combine`)."""
    from relakit.replications import summarise_replications

    params = [c for c in runs.columns if c.startswith("param.")]
    keys = runs.group_by("point_id", maintain_order=True).agg(
        [pl.col(c).first() for c in params])
    numbers = runs.drop(params)
    folded = summarise_replications(numbers, by="point_id")
    table = keys.join(folded, on="point_id", how="left").sort("point_id")
    if not baseline_of:
        return table
    diffs = _baseline_differences(numbers, baseline_of)
    write_parquet(diffs, out / "baseline.parquet")
    flags = (diffs.pivot(on="metric", index="point_id", values="significant")
             if diffs.height else pl.DataFrame(schema={"point_id": pl.String}))
    flags = flags.rename({c: f"{c}_significant" for c in flags.columns if c != "point_id"})
    ids = pl.DataFrame({"point_id": list(baseline_of), "baseline_id": list(baseline_of.values())})
    return table.join(ids, on="point_id", how="left").join(flags, on="point_id", how="left")


def _baseline_differences(runs: pl.DataFrame, baseline_of: dict) -> pl.DataFrame:
    """Per point (other than its baseline) and number: the paired difference point -
    baseline over replications that share their seeds (common random numbers), its
    95 % half-width, the variance ratio of pairing, and ``significant`` (the interval
    excludes 0). A number either side lacks (nan) gives a null verdict."""
    from relakit.stats import paired_difference

    skip = {"point_id", "replication", "seed"}
    metrics = [c for c, t in runs.schema.items() if c not in skip and t.is_numeric()]
    by_point = {pid: g.sort("replication") for (pid,), g in runs.group_by("point_id")}
    rows = []
    for pid, bid in sorted(baseline_of.items()):
        if pid == bid or pid not in by_point or bid not in by_point:
            continue
        a, b = by_point[pid], by_point[bid]
        if a["seed"].to_list() != b["seed"].to_list():
            continue  # not paired (a point with its own seed): no paired verdict
        for c in metrics:
            xa, xb = a[c].cast(pl.Float64).to_numpy(), b[c].cast(pl.Float64).to_numpy()
            row = {"point_id": pid, "baseline_id": bid, "metric": c,
                   "value": float(np.mean(xa)), "baseline": float(np.mean(xb)),
                   "difference": None, "difference_ci": None, "variance_ratio": None,
                   "significant": None}
            if np.all(np.isfinite(xa)) and np.all(np.isfinite(xb)):
                d = paired_difference(xa, xb)
                row.update(difference=d.interval.mean, difference_ci=d.interval.half_width,
                           variance_ratio=d.variance_ratio,
                           significant=not d.interval.contains(0.0))
            rows.append(row)
    schema = {"point_id": pl.String, "baseline_id": pl.String, "metric": pl.String,
              "value": pl.Float64, "baseline": pl.Float64, "difference": pl.Float64,
              "difference_ci": pl.Float64, "variance_ratio": pl.Float64,
              "significant": pl.Boolean}
    return pl.DataFrame(rows, schema=schema, orient="row") if rows else pl.DataFrame(
        schema=schema)


def manifests(out_dir) -> pl.DataFrame:
    """One row per point of the current spec that has finished (ok or failed); a
    replicated point has finished when all its replications have, and failed when
    any did (the first failure's error; ``replications`` counts them, ``wall_s``
    adds up their times)."""
    rows = []
    for pid, done in _current(Path(out_dir)):
        bad = [m for _, m in done if m["status"] != "ok"]
        walls = [m.get("wall_s") for _, m in done]
        rows.append({"point_id": pid, "status": "failed" if bad else "ok",
                     "error": bad[0]["error"] if bad else None,
                     "wall_s": sum(w for w in walls if w is not None)
                     if any(w is not None for w in walls) else None,
                     "replications": len(done)})
    return pl.DataFrame(rows)


def _line_reporter(line: Progress):
    """The default report: the sweep's progress line (points done, failed, time left;
    no estimate until a point of this run has finished)."""
    def report(done, failed, total, t0):
        line.update(done, f"{failed} failed")
    return report


__all__ = ["SweepSpec", "combine", "load_sweep", "manifests", "point_id", "point_inputs",
           "point_seed", "remove_leftovers", "replication_inputs", "run_point", "run_sweep"]


#: what `relakit sweep` shows per point (tier "all"), when the results have them
SHORT_NUMBERS = ("success_ratio", "p99_ms", "goodput_rps", "dropped")


def short_rows(table: pl.DataFrame) -> list[list[str]]:
    """A sweep's results as a short table, the header first: per point (tier ``all``) its
    parameters and a few headline numbers, ``mean ± half-width`` where the points were
    replicated; empty for a notebook sweep's own tables."""
    if "success_ratio" not in table.columns or table.height == 0:
        return []
    # a replicated sweep's results are already one row a point (all tiers)
    rows_all = table.filter(pl.col("tier") == "all") if "tier" in table.columns else table
    params = [c for c in rows_all.columns if c.startswith("param.") and
              rows_all[c].dtype != pl.Struct and rows_all[c].n_unique() > 1]
    numbers = [c for c in SHORT_NUMBERS if c in rows_all.columns]
    out = [[c.removeprefix("param.") for c in params] + numbers]
    for r in rows_all.sort(params).iter_rows(named=True):
        cells = [f"{r[c]:.4g}" if isinstance(r[c], float) else str(r[c]) for c in params]
        for c in numbers:
            v, ci = r[c], r.get(f"{c}_ci")
            d = 4 if c == "success_ratio" else 0 if isinstance(v, int) else 1
            cells.append("-" if v is None or v != v else
                         f"{v:.{d}f}" + (f" ± {ci:.{d}f}" if ci is not None and ci == ci
                                         else ""))
        out.append(cells)
    return out if params or numbers else []
