"""The long metrics table built from the kernel's arrays (relakit.sim.longtable) holds
exactly what the old builder (one frame per series, concatenated, then sorted) held:
same rows, same order, same values and dtypes. The old builder is kept here, verbatim,
as the slow reference. Memory figures live in benchmarks/bench_memory.py, not here."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from conftest import make_scenario

from relakit import Fleet, load_scenario
from relakit.sim import kernel as K
from relakit.sim import longtable
from relakit.sim.longtable import MetricsGrid, fleet_columns, node_columns
from relakit.traces import SCHEMA

_LABELS = ("tier", "outcome", "le")


def _long(t, node, name, values, **labels) -> pl.DataFrame:
    n = len(values)
    cols = {"time_s": t, "node": node, "name": pl.Series([name] * n, dtype=pl.String)}
    for lab in _LABELS:
        v = labels.get(lab)
        cols[lab] = (pl.Series(v, dtype=pl.String) if v is not None and not isinstance(v, str)
                     else pl.Series([v] * n, dtype=pl.String))
    cols["value"] = values
    return pl.DataFrame(cols)


def reference_metrics_table(out, st, bounds_s) -> pl.DataFrame:
    """The builder before relakit.sim.longtable (results.metrics_table), unchanged."""
    n_s = st.node_i[:, K.NI_NSAMPLE]
    s_max = int(n_s.max()) if n_s.size else 0
    m = out.metrics[:s_max]
    valid = (np.arange(s_max)[:, None] < n_s[None, :]).ravel()
    t_flat = out.sample_t[:s_max].ravel()[valid]
    node_flat = np.tile(np.arange(m.shape[1], dtype=np.int32), s_max)[valid]
    rows = m.reshape(-1, m.shape[2])[valid]
    parts = [_long(t_flat, node_flat, name, rows[:, col], tier=tier, outcome=outcome, le=le)
             for col, name, tier, outcome, le in node_columns(bounds_s)]
    n_f = int(st.is_[K.IS_NSAMPLE])
    f, ft = out.fleet[:n_f], out.fleet_t[:n_f]
    fleet_node = np.full(n_f, -1, dtype=np.int32)
    parts += [_long(ft, fleet_node, name, f[:, col], tier=tier, outcome=outcome, le=le)
              for col, name, tier, outcome, le in fleet_columns()]
    return pl.concat(parts).sort(["time_s", "node", "name"], maintain_order=True)


def _busy_fleet(duration=40.0, until=None) -> Fleet:
    """Four nodes scraped at their own phases, three tiers, faults, retries and hedges,
    custom histogram buckets: every label and both kinds of block are exercised."""
    sc = make_scenario(rate=1500, duration=duration, nodes=4, servers=[2, 3, 2, 4],
                       tiers={"gold": 0.2, "silver": 0.3, "bronze": 0.5}, deadline_ms=40,
                       faults=[{"node": 1, "start_s": 5, "end_s": 20, "error_rate": 0.3},
                               {"node": 2, "start_s": 10, "end_s": 25, "slowdown": 4}],
                       queue_limit=3)
    sc["metrics"] = {"interval_s": 0.7, "phase_s": "random",
                     "latency_buckets_s": [0.002, 0.005, 0.01, 0.025, 0.1]}
    sc["mitigations"] = {"retries": {"max_attempts": 2},
                         "hedge": {"delay_ms": 20, "cancel": "queued"}}
    sc["controls"] = {"hedge_enabled": True}
    fleet = Fleet(load_scenario(sc), record_requests=False)
    fleet.advance(duration / 2)
    # from now on bronze is dropped at the door
    fleet.set_flags(fleet.flag_state().updated(shed_tiers=["bronze"]))
    fleet.advance(duration if until is None else until)
    return fleet


@pytest.fixture(scope="module")
def busy():
    fleet = _busy_fleet(until=90.0)  # past duration_s: the sample grid had to grow
    ref = reference_metrics_table(fleet.out, fleet.st, fleet.scenario.metrics.latency_buckets_s)
    return fleet, ref


def test_new_table_equals_the_reference_row_for_row(busy):
    fleet, ref = busy
    new = fleet.result().metrics
    assert new.schema == pl.Schema(SCHEMA)
    assert new.height == ref.height > 10_000
    assert new.equals(ref)  # same rows, same order, same values (nulls included)
    # the scenario really has what the comparison claims to cover
    assert set(new["node"].unique()) == {-1, 0, 1, 2, 3}
    assert set(new["tier"].drop_nulls().unique()) == {"gold", "silver", "bronze"}
    assert set(new["le"].drop_nulls().unique()) == {"0.002", "0.005", "0.01", "0.025", "0.1",
                                                    "+Inf"}
    assert new.filter(pl.col("name") == "retries_total")["value"].max() > 0
    assert new.filter(pl.col("name") == "hedges_total")["value"].max() > 0
    outcomes = new.filter(pl.col("name").is_in(["requests_total", "client_requests_total"])
                          & (pl.col("value") > 0))
    assert set(outcomes["outcome"].unique()) == {"ok", "error", "timeout", "dropped"}
    assert new.filter((pl.col("name") == "shedding") & (pl.col("tier") == "bronze"))[
        "value"].max() == 1
    # nodes scraped at different phases: their samples interleave in time
    first = new.filter(pl.col("node") >= 0).group_by("node").agg(pl.col("time_s").min())
    assert first["time_s"].n_unique() == 4


@pytest.mark.parametrize("rows", [1, 37, 1000, 1 << 30])
def test_chunks_of_any_size_make_the_same_table(busy, rows):
    fleet, ref = busy
    grid = MetricsGrid.from_kernel(fleet.out, fleet.st, fleet.scenario.metrics.latency_buckets_s)
    chunks = list(grid.chunks(rows))
    assert grid.height == ref.height
    assert sum(c.height for c in chunks) == ref.height
    if rows < ref.height:
        assert len(chunks) > 1
    assert pl.concat(chunks).equals(ref)


def test_streamed_parquet_reads_back_as_the_table(busy, tmp_path, monkeypatch):
    fleet, ref = busy
    monkeypatch.setattr(longtable, "CHUNK_ROWS", 1000)  # many chunks, many row groups
    lazy = fleet.result()
    lazy.write(tmp_path / "streamed")  # never built: written chunk by chunk
    assert "_metrics" in vars(lazy) and isinstance(vars(lazy)["_metrics"], MetricsGrid)
    built = fleet.result()
    assert built.metrics.equals(ref)
    built.write(tmp_path / "built")  # built first: written by polars in one go
    a = pl.read_parquet(tmp_path / "streamed" / "metrics.parquet")
    b = pl.read_parquet(tmp_path / "built" / "metrics.parquet")
    assert a.schema == pl.Schema(SCHEMA)
    assert a.equals(ref) and b.equals(ref)



def test_a_fleet_that_has_not_run_gives_the_reference_table(tmp_path):
    sc = make_scenario(rate=100, duration=10, nodes=2)
    fleet = Fleet(load_scenario(sc), record_requests=False)
    ref = reference_metrics_table(fleet.out, fleet.st, fleet.scenario.metrics.latency_buckets_s)
    fleet.result().write(tmp_path)  # streamed, however few rows
    for new in (fleet.result().metrics, pl.read_parquet(tmp_path / "metrics.parquet")):
        assert new.schema == pl.Schema(SCHEMA)
        assert new.equals(ref)


def test_the_table_is_a_snapshot_when_the_fleet_runs_on(busy):
    fleet = _busy_fleet(duration=20.0)
    early = fleet.result()  # not built yet
    ref = reference_metrics_table(fleet.out, fleet.st, fleet.scenario.metrics.latency_buckets_s)
    fleet.advance(60.0)  # more samples, and a grown grid
    assert early.metrics.equals(ref)
    assert fleet.result().metrics.height > ref.height
