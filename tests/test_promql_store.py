"""The rule backtest's series store (issue 32, part 4): streamed from a trace file, the
same series as the TSDB route gives, and sub-expressions shared between rules."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from relakit.control import promql, rules
from relakit.control.promql_store import read_store, store_from_frame, store_from_tsdb
from relakit.control.tsdb import TSDB
from relakit.traces import TraceError, read_trace

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "data" / "traces" / "step-errors.csv"
RULES = ROOT / "params" / "rules" / "slo.yml"


def _same(a, b, any_order=False):
    if any_order:  # series tied on node and first sample keep the file's order
        a, b = sorted(a, key=lambda s: s.labels), sorted(b, key=lambda s: s.labels)
    assert [s.labels for s in a] == [s.labels for s in b]
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x.times, y.times)
        np.testing.assert_array_equal(x.values, y.values)  # NaN samples equal NaN samples


def _export(tmp_path) -> Path:
    """A Prometheus export with extra labels, a NaN sample and a series that starts late."""
    def series(metric, vals, t0=0):
        return {"metric": metric, "values": [[t0 + 15 * k, v] for k, v in enumerate(vals)]}

    doc = {"status": "success", "data": {"resultType": "matrix", "result": [
        series({"__name__": "up", "job": "api", "instance": "a:1"}, ["1", "0", "NaN", "1"]),
        series({"__name__": "up", "job": "db", "instance": "a:1"}, ["1", "1"], t0=30),
        series({"__name__": "req_total", "code": "500", "instance": "b:1"}, ["3", "5", "1"])]}}
    p = tmp_path / "export.json"
    p.write_text(json.dumps(doc))
    return p


@pytest.mark.parametrize("source", ["csv", "json"])
def test_store_equals_the_tsdb_route(tmp_path, source):
    path = TRACE if source == "csv" else _export(tmp_path)
    want = store_from_tsdb(TSDB.from_long(read_trace(path)))
    _same(read_store(path), want)
    frame = read_trace(path)
    frame.write_parquet(tmp_path / "t.parquet")
    _same(read_store(tmp_path / "t.parquet"), want)  # the streamed route
    # rows in any order, across many batches: the same series, each in time order
    shuffled = frame.sample(fraction=1.0, shuffle=True, seed=3)
    shuffled.write_parquet(tmp_path / "s.parquet", row_group_size=7)
    _same(read_store(tmp_path / "s.parquet"), want, any_order=True)
    _same(store_from_frame(shuffled), want, any_order=True)


def test_a_bad_parquet_trace_is_refused_as_read_trace_refuses_it(tmp_path):
    frame = read_trace(TRACE).with_columns(
        value=pl.when(pl.int_range(pl.len()) == 5).then(None).otherwise(pl.col("value")))
    frame.write_parquet(tmp_path / "bad.parquet")
    with pytest.raises(TraceError) as want:
        read_trace(tmp_path / "bad.parquet")
    with pytest.raises(TraceError) as got:
        read_store(tmp_path / "bad.parquet")
    assert str(got.value) == str(want.value) and "column value" in str(got.value)
    frame.drop("value").write_parquet(tmp_path / "cols.parquet")
    with pytest.raises(TraceError, match="missing column"):
        read_store(tmp_path / "cols.parquet")
    frame.with_columns(pl.col("node").cast(pl.Float64)).write_parquet(tmp_path / "f.parquet")
    with pytest.raises(TraceError, match="column node.*expected an integer"):
        read_store(tmp_path / "f.parquet")
    wide = read_trace(TRACE).with_columns(pl.col("node").cast(pl.Int64), pl.col("value")
                                          .cast(pl.Float32))  # types validate_trace casts
    wide.write_parquet(tmp_path / "w.parquet")
    _same(read_store(tmp_path / "w.parquet"), store_from_frame(wide))


def test_shared_sub_expressions_give_the_answers_computed_alone(tmp_path, monkeypatch):
    """Rules reading the same window under other thresholds, a recording rule read by
    an alert, and a failing many-to-many match: shared or not, the same table."""
    spec = tmp_path / "r.yml"
    spec.write_text("""groups:
  - name: g
    interval: 10s
    rules:
      - record: job:rate1m
        expr: sum by (tier) (rate(requests_total[1m]))
      - alert: A
        expr: sum by (tier) (rate(requests_total[1m])) > 5
        for: 30s
      - alert: B
        expr: sum by (tier) (rate(requests_total[1m])) > 50
      - alert: C
        expr: job:rate1m > 10 and sum by (tier) (rate(requests_total[1m])) > 1
      - alert: Clash
        expr: rate(requests_total[1m]) <= on (tier) sum by (tier) (rate(requests_total[1m]))
      - alert: Clash2
        expr: rate(requests_total[1m]) <= on (tier) sum by (tier) (rate(requests_total[1m]))
""")
    shared, ev = rules.evaluate_rules(TRACE, spec)
    assert not ev._uses and not ev._memo  # every shared value dropped after its last use
    monkeypatch.setattr(promql.Evaluator, "share", lambda self, roots: None)
    alone, _ = rules.evaluate_rules(TRACE, spec)
    assert shared.equals(alone)
    assert shared.filter(pl.col("error").is_not_null())["alert"].unique().sort().to_list() == [
        "Clash", "Clash2"]  # the failed evaluations are rows, shared or not
    assert shared.filter(pl.col("alert") == "A")["firing_at"].drop_nulls().len() > 0


@pytest.mark.parametrize("layout", ["periodic", "shuffled"])
def test_series_keys_wider_than_a_word_are_still_told_apart(tmp_path, monkeypatch, layout):
    """A store whose key codes do not fit 63 bits numbers series by a hash of the codes,
    each row's codes compared with its series' (forced here by many distinct labels)."""
    from relakit.control import promql_store

    frame = read_trace(TRACE)
    if layout == "shuffled":
        frame = frame.sample(fraction=1.0, shuffle=True, seed=5)
    frame.write_parquet(tmp_path / "t.parquet", row_group_size=50)
    want = read_store(tmp_path / "t.parquet")
    monkeypatch.setattr(promql_store, "WORD_BITS", 4)  # every key is "too wide"
    got = read_store(tmp_path / "t.parquet")
    _same(got, want)
    assert len(got) > 10


def test_a_trace_written_a_scrape_at_a_time_is_read_as_periods(tmp_path, monkeypatch):
    """Rows listing the same series in the same order scrape after scrape (a recording's
    usual layout) are numbered one period per batch and placed as a (periods x series)
    matrix; rows in any order are numbered row by row. The same store either way."""
    from relakit.control import promql_store

    frame = read_trace(TRACE).sort("time_s", maintain_order=True)
    seen = []
    real = promql_store._place
    monkeypatch.setattr(promql_store, "_place", lambda s, p, *a: seen.append(p) or real(s, p, *a))
    frame.write_parquet(tmp_path / "scrapes.parquet")
    periodic = read_store(tmp_path / "scrapes.parquet")
    assert seen and all(p > 1 for p in seen)
    seen.clear()
    frame.sample(fraction=1.0, shuffle=True, seed=2).write_parquet(tmp_path / "any.parquet")
    _same(read_store(tmp_path / "any.parquet"), periodic, any_order=True)
    assert seen and all(p == 0 for p in seen)


def test_integer_codes_are_read_from_arrow_buffers_with_nulls_and_offsets():
    """Dictionary indices with nulls, sliced (an offset into the buffers), of every
    integer width: as pyarrow's fill_null gives them."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from relakit.control.promql_store import _codes

    rng = np.random.default_rng(4)
    for t in (pa.int8(), pa.int16(), pa.int32(), pa.uint32(), pa.int64()):
        for _ in range(40):
            n = int(rng.integers(1, 200))
            a = pa.array([None if rng.random() < 0.3 else int(rng.integers(0, 100))
                          for _ in range(n)], type=t)
            at = int(rng.integers(0, n))
            a = a.slice(at, int(rng.integers(0, n - at + 1)))
            np.testing.assert_array_equal(_codes(a, 101), pc.fill_null(a, 101).to_numpy())


def test_key_period_with_a_hint_is_the_key_period():
    """The previous batch's period tried first gives the smallest period all the same
    (a smaller one, a broken repetition, no repetition, hints too big or small)."""
    from relakit.control.promql_store import key_period

    rng = np.random.default_rng(0)
    for _ in range(2000):
        p, n = int(rng.integers(1, 12)), int(rng.integers(1, 60))
        cols = [np.resize(rng.integers(0, 3, p), n) for _ in range(2)]
        if rng.random() < 0.3 and n > 1:
            cols[1][rng.integers(0, n)] += 1
        want = key_period(cols)
        assert all(key_period(cols, h) == want for h in range(14))
