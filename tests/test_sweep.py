"""Sweeps: local and on a real Dask cluster give the same table; failures are
recorded and the rest goes on; an interrupted sweep resumes; notebook points run
through papermill and keep their executed copy."""

from __future__ import annotations

import json
import os
import re

import polars as pl
import pytest
import yaml
from conftest import ROOT, make_scenario

from relakit.sweep import load_sweep, manifests, point_id, run_sweep


def _spec(tmp_path, grid, **extra):
    sc = tmp_path / "sc.yaml"
    sc.write_text(yaml.safe_dump(make_scenario(rate=300, duration=20, nodes=2, servers=2)))
    spec = {"name": "t", "scenario": str(sc), "grid": grid, **extra}
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(spec))
    return load_sweep(path)


def _quiet(*_):
    pass


def test_grid_and_samples_expand_with_stable_ids(tmp_path):
    spec = _spec(tmp_path, {"fleet.servers": [2, 3], "workload.fanout": [1, 2]},
                 samples={"n": 3, "ranges": {"workload.arrival.rate_rps": [100, 200]}},
                 seed=4)
    pts = spec.points()
    assert len(pts) == 4 + 3
    assert len({point_id(p) for p in pts}) == 7
    again = _spec(tmp_path, {"fleet.servers": [2, 3], "workload.fanout": [1, 2]},
                  samples={"n": 3, "ranges": {"workload.arrival.rate_rps": [100, 200]}},
                  seed=4).points()
    assert [point_id(p) for p in pts] == [point_id(p) for p in again]


def test_a_failing_point_is_recorded_and_the_rest_goes_on(tmp_path):
    spec = _spec(tmp_path, {"fleet.servers": [2, -1, 3]})
    table = run_sweep(spec, tmp_path / "out", workers=1, progress=_quiet)
    m = manifests(tmp_path / "out")
    assert m.height == 3 and (m["status"] == "failed").sum() == 1
    bad = m.filter(pl.col("status") == "failed")["error"][0]
    assert "fleet.servers" in bad and "must be >= 1" in bad
    assert table.height == 2 and set(table["param.fleet.servers"]) == {2, 3}
    assert not list((tmp_path / "out").rglob("*.tmp"))  # nothing half-written


def test_an_interrupted_sweep_resumes_without_redoing_points(tmp_path):
    spec = _spec(tmp_path, {"fleet.servers": [2, 3, 4]})
    out = tmp_path / "out"
    first = run_sweep(spec, out, workers=1, progress=_quiet)
    stamps = {p: p.stat().st_mtime_ns for p in out.glob("point=*/manifest.json")}
    victim = sorted(stamps)[0]
    for f in victim.parent.iterdir():  # as if the sweep had died before this point
        f.unlink()
    victim.parent.rmdir()
    second = run_sweep(spec, out, workers=1, progress=_quiet)
    for p, stamp in stamps.items():
        if p != victim:
            assert p.stat().st_mtime_ns == stamp  # not redone
    assert victim.exists()
    assert first.drop("wall_s", strict=False).equals(second.drop("wall_s", strict=False))


def test_local_processes_and_a_real_dask_cluster_give_the_same_results(tmp_path):
    distributed = pytest.importorskip("distributed")
    spec = _spec(tmp_path, {"fleet.servers": [2, 3], "workload.arrival.rate_rps": [200, 400]})
    local = run_sweep(spec, tmp_path / "local", workers=2, progress=_quiet)
    os.environ.setdefault("NUMBA_CACHE_DIR", str(ROOT / ".numba_cache"))
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  host="127.0.0.1", dashboard_address=None) as cluster:
        assert cluster.scheduler_address.startswith("tcp://127.0.0.1:")
        remote = run_sweep(spec, tmp_path / "dask", scheduler=cluster.scheduler_address,
                           progress=_quiet)
    assert local.height == 4
    assert local.equals(remote)


def test_a_notebook_sweep_keeps_each_executed_notebook(tmp_path):
    nb = ROOT / "notebooks" / "01_fanout.ipynb"
    spec_path = tmp_path / "nb.yaml"
    spec_path.write_text(yaml.safe_dump({"name": "nb", "notebook": str(nb),
                                         "grid": {"per_call_success": [0.99, 0.999]},
                                         "base": {"requests": 20000}}))
    run_sweep(load_sweep(spec_path), tmp_path / "out", workers=1, progress=_quiet)
    m = manifests(tmp_path / "out")
    assert (m["status"] == "ok").all() and m.height == 2
    for folder in (tmp_path / "out").glob("point=*"):
        assert (folder / "notebook.ipynb").exists()
        result = pl.read_parquet(folder / "fanout.parquet")
        manifest = json.loads((folder / "manifest.json").read_text())
        p = manifest["point"]["per_call_success"]
        row = result.filter(pl.col("width") == 20)
        assert row["closed_form"][0] == pytest.approx(p**20)


def test_shipped_sweep_and_notebook_parameter_files_are_valid():
    for path in (ROOT / "params" / "sweeps").glob("*.yaml"):
        spec = load_sweep(path)
        assert spec.points() and spec.kind in ("function", "notebook")
    params = yaml.safe_load((ROOT / "params" / "notebooks" / "04_policy-quick.yaml").read_text())
    nb = json.loads((ROOT / "notebooks" / "04_policy.ipynb").read_text())
    tagged = [c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(tagged) == 1
    source = "".join(tagged[0]["source"])  # parameters may carry a type: `name: float = 1.0`
    assert all(re.search(rf"^{k}\s*(:[^=\n]*)?=", source, re.M) for k in params), params
