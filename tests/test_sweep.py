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

from relakit.checks import CheckError, RelakitWarning
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
                                         "base": {"requests": 20000,
                                                  "replications": 2}}))
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
        assert row["replications"][0] == 2  # a notebook's own parameter, passed through base


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


# ---- identity by content: edits rerun, stale folders are ignored, leftovers go ------------------
def _table(out):
    return pl.read_parquet(out / "results.parquet").drop("wall_s", strict=False)


def test_editing_the_scenario_reruns_the_point_with_the_new_content(tmp_path):
    spec = _spec(tmp_path, {})  # one point: the scenario as it is
    out = tmp_path / "out"
    old = run_sweep(spec, out, workers=1, progress=_quiet)
    sc = tmp_path / "sc.yaml"
    sc.write_text(yaml.safe_dump(make_scenario(rate=150, duration=20, nodes=2, servers=2)))
    lines = []
    new = run_sweep(load_sweep(tmp_path / "sweep.yaml"), out, workers=1, progress=_quiet,
                    notice=lines.append)
    assert any("1 point(s) ran with other inputs" in line for line in lines)
    assert old.height == new.height == 1 and old["point_id"][0] == new["point_id"][0]
    old_n = old.filter(pl.col("point_id") == old["point_id"][0])["requests"][0]
    new_n = new.filter(pl.col("point_id") == new["point_id"][0])["requests"][0]
    assert new_n < 0.6 * old_n  # 150 rps now, 300 before: the old result is not served
    fresh = run_sweep(load_sweep(tmp_path / "sweep.yaml"), tmp_path / "fresh", workers=1,
                      progress=_quiet)
    assert fresh.equals(new) and _table(out).equals(new)
    # the seed comes from the point alone, not from the files' content
    assert new["seed"].to_list() == old["seed"].to_list()
    # nothing changed now: a third run reruns nothing
    stamp = (out / f"point={new['point_id'][0]}" / "manifest.json").stat().st_mtime_ns
    run_sweep(load_sweep(tmp_path / "sweep.yaml"), out, workers=1, progress=_quiet)
    assert (out / f"point={new['point_id'][0]}" / "manifest.json").stat().st_mtime_ns == stamp


def test_editing_a_referenced_policy_reruns_only_the_points_that_read_it(tmp_path):
    clocks = {"scrape_s": 1, "window_s": 5, "eval_s": 1, "poll_s": 1}
    (tmp_path / "clocks.yaml").write_text(yaml.safe_dump(clocks))
    policy = yaml.safe_load((ROOT / "params" / "policies" / "rela.yaml").read_text())
    for name in ("pa", "pb"):
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(policy))
    sc = make_scenario(rate=100, duration=20, nodes=2, servers=2)  # utilisation 0.25
    sc.update(policy="pa.yaml", clocks="clocks.yaml")
    (tmp_path / "sc.yaml").write_text(yaml.safe_dump(sc))
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump(
        {"name": "p", "scenario": "sc.yaml", "grid": {"policy": ["pa.yaml", "pb.yaml"]}}))
    out = tmp_path / "out"
    before = run_sweep(load_sweep(tmp_path / "sweep.yaml"), out, workers=1, progress=_quiet)
    assert (before["time_in_performance_s"] == 0).all()  # a p99 of ~40 ms never passes 100
    ids = {r["param.policy"]: r["point_id"] for r in before.iter_rows(named=True)}
    stamps = {k: (out / f"point={v}" / "manifest.json").stat().st_mtime_ns
              for k, v in ids.items()}
    policy["conditions"]["tail_slow"]["threshold"] = 1  # now every evaluation breaches
    (tmp_path / "pb.yaml").write_text(yaml.safe_dump(policy))
    after = run_sweep(load_sweep(tmp_path / "sweep.yaml"), out, workers=1, progress=_quiet)
    assert (out / f"point={ids['pa.yaml']}" / "manifest.json").stat().st_mtime_ns \
        == stamps["pa.yaml"]  # pa.yaml did not change: not rerun
    assert (out / f"point={ids['pb.yaml']}" / "manifest.json").stat().st_mtime_ns \
        != stamps["pb.yaml"]
    t = {r["param.policy"]: r["time_in_performance_s"] for r in after.iter_rows(named=True)}
    assert t["pa.yaml"] == 0 and t["pb.yaml"] > 10


def test_results_hold_exactly_the_current_specs_points(tmp_path):
    out = tmp_path / "out"
    run_sweep(_spec(tmp_path, {"fleet.servers": [2, 3, 4]}), out, workers=1, progress=_quiet)
    lines = []
    spec = _spec(tmp_path, {"fleet.servers": [5]})
    table = run_sweep(spec, out, workers=1, progress=_quiet, notice=lines.append)
    assert table.height == 1 and table["param.fleet.servers"].to_list() == [5]
    assert _table(out)["point_id"].to_list() == [point_id(spec.points()[0])]
    assert json.loads((out / "sweep.json").read_text())["points"] == 1
    assert manifests(out).height == 1
    assert any("ignoring 3 point folder(s) not in this spec" in line for line in lines)
    assert len(list(out.glob("point=*"))) == 4  # kept on disk, not served


def test_a_point_that_fails_after_an_edit_drops_its_old_result(tmp_path):
    out = tmp_path / "out"
    spec = _spec(tmp_path, {"fleet.nodes": [2, 3]})
    assert run_sweep(spec, out, workers=1, progress=_quiet).height == 2
    # the edit adds a fault on node 2: fine for the 3-node point, outside the 2-node fleet
    sc = make_scenario(rate=300, duration=20, nodes=2, servers=2,
                       faults=[{"node": 2, "start_s": 5, "end_s": 10, "error_rate": 0.5}])
    (tmp_path / "sc.yaml").write_text(yaml.safe_dump(sc))
    with pytest.warns(RelakitWarning, match="faults"):
        table = run_sweep(load_sweep(tmp_path / "sweep.yaml"), out, workers=1,
                          progress=_quiet)
    assert table["param.fleet.nodes"].unique().to_list() == [3]
    assert _table(out)["param.fleet.nodes"].unique().to_list() == [3]
    ids = {p["fleet.nodes"]: point_id(p) for p in spec.points()}
    m = manifests(out)
    status = dict(zip(m["point_id"].to_list(), m["status"].to_list(), strict=True))
    assert status == {ids[2]: "failed", ids[3]: "ok"}
    assert "faults" in m.filter(pl.col("point_id") == ids[2])["error"][0]
    assert not (out / f"point={ids[2]}" / "result.parquet").exists()


def test_a_sweep_none_of_whose_points_can_run_is_refused_before_any_runs(tmp_path):
    out = tmp_path / "out"
    spec = _spec(tmp_path, {})
    sc = make_scenario(rate=300, duration=20, nodes=2, servers=2)
    sc["fleet"]["servers"] = 0
    (tmp_path / "sc.yaml").write_text(yaml.safe_dump(sc))
    with pytest.raises(CheckError, match="fleet.servers"):
        run_sweep(spec, out, workers=1, progress=_quiet)
    assert not list(out.glob("point=*"))


def test_leftover_temporary_files_are_removed_on_resume(tmp_path):
    import tempfile

    out = tmp_path / "out"
    spec = _spec(tmp_path, {"fleet.servers": [2, 3]})
    first = run_sweep(spec, out, workers=1, progress=_quiet)
    folder = next(out.glob("point=*"))
    # what a write killed before its rename leaves: relakit.io.atomic_write's name pattern
    left = [tempfile.mkstemp(prefix=".result.parquet.", suffix=".tmp", dir=folder)[1],
            tempfile.mkstemp(prefix=".results.parquet.", suffix=".tmp", dir=out)[1],
            str(folder / ".notebook.tmp.ipynb")]
    (folder / ".notebook.tmp.ipynb").write_text("")
    assert all(os.path.getsize(p) == 0 for p in left)
    lines = []
    again = run_sweep(spec, out, workers=1, progress=_quiet, notice=lines.append)
    assert not [p for p in left if os.path.exists(p)]
    assert not list(out.rglob("*.tmp"))
    assert any("removed 3 leftover temporary file(s)" in line for line in lines)
    assert again.equals(first)


# ---- replications: every point N runs on common seeds, folded into means and intervals ------
def _rep_spec(tmp_path, grid, replications=3, **extra):
    return _spec(tmp_path, grid, replications=replications, **extra)


def test_replicated_points_share_their_seeds_and_fold_into_intervals(tmp_path):
    from relakit.replications import replication_seeds
    from relakit.stats import t_interval

    spec = _rep_spec(tmp_path, {"fleet.servers": [2, 3]}, replications=3, seed=7)
    out = tmp_path / "out"
    table = run_sweep(spec, out, workers=1, progress=_quiet)
    runs = pl.read_parquet(out / "replications.parquet")
    assert runs.height == 6 and table.height == 2
    seeds = replication_seeds(7, 3)
    for pid in table["point_id"]:
        mine = runs.filter(pl.col("point_id") == pid).sort("replication")
        assert mine["seed"].to_list() == seeds  # the same seeds at every point (CRN)
        assert mine["replication"].to_list() == [0, 1, 2]
        assert mine["mean_ms"].n_unique() == 3  # three different draws
        iv = t_interval(mine["mean_ms"].to_numpy())
        row = table.filter(pl.col("point_id") == pid).row(0, named=True)
        assert row["mean_ms"] == pytest.approx(iv.mean)
        assert row["mean_ms_ci"] == pytest.approx(iv.half_width) and row["mean_ms_ci"] > 0
        assert row["replications"] == 3 and "gold.success_ratio_ci" in row
        assert row["param.fleet.servers"] in (2, 3)
    # replication i of a point is exactly the single run with its seed
    one = runs.filter((pl.col("param.fleet.servers") == 2) & (pl.col("replication") == 1))
    import relakit
    from relakit.scenario import load_scenario
    alone = relakit.simulate(load_scenario(spec.target, overrides={"fleet.servers": 2}),
                             seed=seeds[1], record_requests=False)
    assert alone.summary.filter(pl.col("tier") == "all")["mean_ms"][0] == one["mean_ms"][0]
    m = manifests(out)
    assert m.height == 2 and (m["replications"] == 3).all() and (m["status"] == "ok").all()


def test_a_replicated_sweep_resumes_replication_by_replication(tmp_path):
    spec = _rep_spec(tmp_path, {"fleet.servers": [2, 3]}, replications=2)
    out = tmp_path / "out"
    first = run_sweep(spec, out, workers=1, progress=_quiet)
    manifests_ = sorted(out.glob("point=*/rep=*/manifest.json"))
    assert len(manifests_) == 4
    stamps = {p: p.stat().st_mtime_ns for p in manifests_}
    victim = manifests_[1]
    for f in victim.parent.iterdir():  # one replication lost, as if killed during it
        f.unlink()
    half = run_sweep(spec, out, workers=1, progress=lambda *a: None)
    assert half.drop("wall_s", strict=False).equals(first.drop("wall_s", strict=False))
    for p, stamp in stamps.items():
        if p != victim:
            assert p.stat().st_mtime_ns == stamp  # only the lost replication ran again
    # more replications: the first two keep their seeds and are not rerun
    more = _rep_spec(tmp_path, {"fleet.servers": [2, 3]}, replications=3)
    table = run_sweep(more, out, workers=1, progress=_quiet)
    assert (table["replications"] == 3).all()
    for p, stamp in stamps.items():
        if p != victim:
            assert p.stat().st_mtime_ns == stamp
    assert len(list(out.glob("point=*/rep=*/manifest.json"))) == 6


def test_replications_run_in_parallel_processes_with_the_same_results(tmp_path):
    spec = _rep_spec(tmp_path, {"fleet.servers": [2, 3]}, replications=2)
    one = run_sweep(spec, tmp_path / "one", workers=1, progress=_quiet)
    two = run_sweep(spec, tmp_path / "two", workers=2, progress=_quiet)
    assert one.drop("wall_s", strict=False).equals(two.drop("wall_s", strict=False))


def test_baseline_marks_differences_that_are_not_significant(tmp_path):
    # one server against two at 60 rps of 10 ms (60 % busy against 30 %): a clear
    # difference in mean response. The metrics interval changes what is sampled, not
    # what happens: on the same seeds (common across points) the difference is exactly
    # zero, and not significant.
    _rep_spec(tmp_path, {"fleet.servers": [1, 2], "metrics.interval_s": [1, 2]},
               replications=4, baseline={"fleet.servers": 2, "metrics.interval_s": 1})
    sc = make_scenario(rate=60, duration=40, nodes=1, servers=1)
    (tmp_path / "sc.yaml").write_text(yaml.safe_dump(sc))
    out = tmp_path / "out"
    table = run_sweep(load_sweep(tmp_path / "sweep.yaml"), out, workers=1, progress=_quiet)
    ids = {(r["param.fleet.servers"], r["param.metrics.interval_s"]): r["point_id"]
           for r in table.iter_rows(named=True)}
    assert set(table["baseline_id"]) == {ids[(2, 1)]}

    def sig(key, metric="mean_ms"):
        return table.filter(pl.col("point_id") == ids[key])[f"{metric}_significant"][0]

    assert sig((2, 1)) is None  # the baseline itself
    assert sig((1, 1)) is True and sig((1, 2)) is True
    assert sig((2, 2)) is False and sig((2, 2), "p99_ms") is False
    diffs = pl.read_parquet(out / "baseline.parquet")
    same = diffs.filter(pl.col("point_id") == ids[(2, 2)])
    assert (same["difference"].drop_nulls() == 0).all() and not same["significant"].any()
    row = diffs.filter((pl.col("point_id") == ids[(1, 1)]) & (pl.col("metric") == "mean_ms"))
    assert row["difference"][0] > row["difference_ci"][0] > 0  # slower on one server


@pytest.mark.parametrize("extra, key, says", [
    ({"replications": 0}, "replications", "must be >= 1"),
    ({"replications": 2.5}, "replications", "whole number"),
    ({"replications": 3, "baseline": {"fleet.servers": 5}}, "baseline.fleet.servers",
     "not on the grid"),
    ({"replications": 3, "baseline": {"fleet.nodes": 1}}, "baseline.fleet.nodes",
     "not a grid key"),
    ({"baseline": {"fleet.servers": 2}}, "baseline", "replications: 2 or more"),
    ({"replications": 3, "baseline": [2]}, "baseline", "expected a mapping"),
    ({"base": {"replications": 2}}, "base.replications", "the sweep's own `replications:` key"),
])
def test_bad_replications_and_baselines_are_refused_naming_the_key(tmp_path, extra, key, says):
    from relakit.validate import ScenarioError

    with pytest.raises(ScenarioError) as err:
        _spec(tmp_path, {"fleet.servers": [2, 3]}, **extra)
    text = str(err.value)
    assert "\n" not in text and "sweep.yaml" in text and f"key '{key}'" in text, text
    assert says in text, text


def test_a_grid_key_inside_an_inline_base_mapping_keeps_each_point_its_own(tmp_path):
    """``base: {clocks: {...}}`` with ``grid: {clocks.window_s: [...]}``: hashing a point's
    files once wrote the grid value into the base's mapping shared by every point, so
    the point ids changed under the sweep (KeyError) and points ran with another's value."""
    spec_path = tmp_path / "sweep.yaml"
    spec_path.write_text(yaml.safe_dump({
        "name": "shape", "scenario": str(ROOT / "tests" / "bad_inputs" / "scenarios" /
                                         "with-policy.yaml"),
        "base": {"clocks": {"scrape_s": 1, "window_s": 4, "eval_s": 1, "poll_s": 1}},
        "grid": {"clocks.window_s": [2, 4]}}))
    spec = load_sweep(spec_path)
    table = run_sweep(spec, tmp_path / "out", workers=1, notice=_quiet)
    assert sorted(table["param.clocks.window_s"].unique().to_list()) == [2, 4]
    assert all(c["window_s"] == 4 for c in table["param.clocks"].to_list())
    assert spec.base["clocks"]["window_s"] == 4


def test_relakit_sweep_ends_with_a_short_table_of_its_points(tmp_path, capsys, monkeypatch):
    from relakit.cli import main

    monkeypatch.chdir(ROOT / "tests" / "bad_inputs")
    assert main(["sweep", "sweeps/ok.yaml", "--out", str(tmp_path / "o"), "--workers",
                 "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    head = out.index("per point, all tiers:")
    assert out[head + 1].split() == ["fleet.servers", "success_ratio", "p99_ms", "goodput_rps",
                                     "dropped"]
    table = pl.read_parquet(tmp_path / "o" / "results.parquet").filter(pl.col("tier") == "all")
    for line in out[head + 2:head + 4]:
        servers, success, p99, *_ = line.split()
        row = table.filter(pl.col("param.fleet.servers") == int(servers)).row(0, named=True)
        assert float(p99) == pytest.approx(row["p99_ms"], abs=0.05)
        assert float(success) == pytest.approx(row["success_ratio"], abs=5e-5)
