"""relakit.traces: recorded Prometheus metrics -> the long metrics schema."""

from __future__ import annotations

import json
import math
import os

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from relakit.traces import (
    SCHEMA,
    TraceError,
    natural_key,
    read_csv_long,
    read_openmetrics,
    read_prometheus_json,
    read_trace,
    validate_trace,
    write_csv_long,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RANGE_JSON = os.path.join(ROOT, "data", "traces", "prometheus-range.json")
SNAPSHOTS = os.path.join(ROOT, "data", "traces", "snapshots")
T0 = 1718035200.0


def at(df, **where):
    """The values of the rows matching ``column=value`` filters (None matches null)."""
    exprs = [pl.col(c).is_null() if v is None else pl.col(c) == v for c, v in where.items()]
    return df.filter(*exprs)["value"].to_list()


def body(*series, status="success", rtype="matrix"):
    return {"status": status, "data": {"resultType": rtype, "result": list(series)}}


def series(name, values, **labels):
    return {"metric": {"__name__": name, **labels}, "values": values}


def write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text if isinstance(text, str) else json.dumps(text))
    return p


def assert_schema(df):
    """The schema's columns, and the optional dictionary-encoded labels column."""
    extra = {k: v for k, v in df.schema.items() if k not in SCHEMA}
    assert extra in ({}, {"labels": pl.Categorical}), extra
    assert pl.Schema({k: v for k, v in df.schema.items() if k in SCHEMA}) == pl.Schema(SCHEMA)
    assert df.columns[:len(SCHEMA)] == list(SCHEMA)


# -- shipped samples ----------------------------------------------------------------------------


def test_shipped_range_query():
    df = read_trace(RANGE_JSON)
    assert_schema(df)
    assert df.height == 2 * 3 * 2 * 21  # instances x tiers x outcomes x points
    times = sorted(set(df["time_s"].to_list()))
    assert times == [T0 + 15 * k for k in range(21)]
    assert df["node"].unique().sort().to_list() == [0, 1]  # "10.0.1.7" before "10.0.1.12"
    assert at(df, time_s=T0, node=0, name="requests_total", tier="gold", outcome="ok") == [1.2e6]
    assert at(df, time_s=T0 + 300, node=1, tier="bronze", outcome="ok") == [364283.0]
    # the error burst on 10.0.1.12 (node 1): 669 gold errors in 75 s, against 6 on node 0
    burst = [at(df, time_s=T0 + s, node=n, tier="gold", outcome="error")[0]
             for n in (1, 0) for s in (120, 195)]
    assert burst == [1451.0, 2120.0, 1808.0, 1814.0]
    # env and job are kept, dictionary-encoded (one label set here)
    assert df.columns == [*SCHEMA, "labels"]
    assert df["labels"].cast(pl.String).unique().to_list() == [
        'env="staging",job="relakit-api"']
    assert df.equals(df.sort(["time_s", "node", "name"], maintain_order=True))


def test_shipped_snapshots():
    df = read_trace(SNAPSHOTS)
    assert_schema(df)
    assert sorted(set(df["time_s"].to_list())) == [T0, T0 + 15, T0 + 30]  # from the file names
    assert df["node"].unique().to_list() == [0]
    assert at(df, name="in_flight") == [17.0, 23.0, 14.0]
    assert at(df, name="requests_total", tier="gold", outcome="ok") == [1.64e6, 1640573.0,
                                                                        1641193.0]
    assert not df.filter(pl.col("name").str.ends_with("_created")).height
    b = df.filter(pl.col("name") == "latency_seconds_bucket", pl.col("time_s") == T0 + 15)
    assert b["le"].to_list() == ["0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1",
                                 "2.5", "+Inf"]  # "1.0" in the file, normalised
    assert b["value"][-1] == at(df, time_s=T0 + 15, name="latency_seconds_count")[0] == 3288130.0
    assert at(df, time_s=T0 + 30, name="latency_seconds_sum") == [130636.782]
    # the instance in the file name is percent-decoded
    df2 = read_openmetrics(SNAPSHOTS, instances=["10.0.1.12:9102", "10.0.1.7:9102"])
    assert df2["node"].unique().to_list() == [1]


@pytest.mark.parametrize("src", [RANGE_JSON, SNAPSHOTS])
def test_csv_round_trip_of_samples(tmp_path, src):
    df = read_trace(src)
    out = write_csv_long(df, tmp_path / "sub" / "trace.csv")
    assert_frame_equal(read_csv_long(out), df)
    assert os.listdir(tmp_path / "sub") == ["trace.csv"]  # no temp file left behind


# -- round trips --------------------------------------------------------------------------------


def frame():
    return pl.DataFrame({
        "time_s": [0.5, 0.5, 0.5, 1.0, 1.0, 0.1 + 0.2],
        "node": pl.Series([0, 0, -1, 2, 2, 1], dtype=pl.Int32),
        "name": ["latency_seconds_bucket", "latency_seconds_bucket", "client_requests_total",
                 "in_flight", "queue_length", "busy_servers"],
        "tier": [None, None, "gold", None, None, None],
        "outcome": [None, None, "timeout", None, None, None],
        "le": ["0.005", "+Inf", None, None, None, None],
        "value": [1.0, 2.0, float("nan"), float("inf"), -float("inf"), 1e-300],
    })


def test_write_read_csv_round_trip(tmp_path):
    df = validate_trace(frame())
    path = write_csv_long(df, tmp_path / "m.csv")
    back = read_csv_long(path)
    assert_frame_equal(back, df)
    assert back["time_s"][0] == 0.1 + 0.2  # full precision
    assert math.isnan(at(back, name="client_requests_total")[0])
    assert read_trace(path).equals(df)


def test_write_csv_replaces_atomically(tmp_path):
    path = tmp_path / "m.csv"
    path.write_text("old")
    write_csv_long(frame(), path)
    assert path.read_text().startswith("time_s,node,name,tier,outcome,le,value\n")
    assert sorted(os.listdir(tmp_path)) == ["m.csv"]


def test_parquet_read_and_validated(tmp_path):
    df = validate_trace(frame())
    df.write_parquet(tmp_path / "m.parquet")
    assert_frame_equal(read_trace(tmp_path / "m.parquet"), df)
    df.drop("le").write_parquet(tmp_path / "bad.parquet")
    with pytest.raises(TraceError, match=r"bad\.parquet: missing column\(s\) le"):
        read_trace(tmp_path / "bad.parquet")


def test_validate_casts_and_sorts():
    raw = pl.DataFrame({"time_s": [2, 1], "node": [0, 1], "name": ["a", "b"],
                        "tier": pl.Series(["gold", None], dtype=pl.Categorical),
                        "outcome": [None, None], "le": [None, None], "value": [3, 4]})
    out = validate_trace(raw)
    assert_schema(out)
    assert out["time_s"].to_list() == [1.0, 2.0]
    assert out["tier"].to_list() == [None, "gold"]


def test_read_trace_sniffs_content_without_suffix(tmp_path):
    j = write(tmp_path, "q.out", body(series("up", [[1, "1"]], instance="a")))
    c = write(tmp_path, "c.out", "time_s,name,value\n1,up,1\n")
    t = write(tmp_path, "t.out", "# TYPE up gauge\nup 1 1000\n")
    expect = pl.DataFrame({"time_s": [1.0], "node": [0], "name": ["up"], "tier": [None],
                           "outcome": [None], "le": [None], "value": [1.0]})
    assert_frame_equal(read_trace(j), validate_trace(expect))
    assert_frame_equal(read_trace(c), validate_trace(expect.with_columns(node=-1)))
    assert_frame_equal(read_trace(t), validate_trace(expect.with_columns(node=-1)))
    with pytest.raises(TraceError, match=r"x\.bin: cannot tell the format"):
        read_trace(write(tmp_path, "x.bin", "\x00\x01 hello"))


# -- instance -> node ---------------------------------------------------------------------------


def test_natural_sort_key():
    names = ["node-10", "host:9110", "node-2", "host:9102", "node-1"]
    assert sorted(names, key=natural_key) == ["host:9102", "host:9110", "node-1", "node-2",
                                              "node-10"]


def test_natural_instance_mapping(tmp_path):
    doc = body(*[series("in_flight", [[10, str(i)]], instance=name)
                 for i, name in enumerate(["node-10", "node-2", "node-1"])],
               series("attempts_total", [[10, "7"]]))  # fleet level: no instance
    df = read_prometheus_json(write(tmp_path, "q.json", doc))
    got = dict(zip(df["node"].to_list(), df["value"].to_list(), strict=True))
    assert got == {-1: 7.0, 0: 2.0, 1: 1.0, 2: 0.0}  # node-1, node-2, node-10


def test_explicit_instance_mapping(tmp_path):
    doc = body(series("in_flight", [[10, "1"]], instance="b:1"),
               series("in_flight", [[10, "2"]], instance="a:1"))
    path = write(tmp_path, "q.json", doc)
    df = read_prometheus_json(path, instances=["z:1", "b:1", "a:1"])
    assert dict(zip(df["node"].to_list(), df["value"].to_list(), strict=True)) == {1: 1.0, 2: 2.0}
    with pytest.raises(TraceError, match=r"q\.json: data\.result\[1\]\.metric: instance 'a:1' "
                                         r"is not in instances=\['b:1'\]"):
        read_prometheus_json(path, instances=["b:1"])
    with pytest.raises(TraceError, match="listed twice"):
        read_prometheus_json(path, instances=["a:1", "b:1", "a:1"])


def test_node_label_used_when_no_instance(tmp_path):
    doc = body(series("in_flight", [[10, "1"]], node="3"))
    assert read_prometheus_json(write(tmp_path, "q.json", doc))["node"].to_list() == [3]
    csv = write(tmp_path, "m.csv", "time_s,node,name,value,instance\n1,4,a,1,\n1,4,b,1,h:2\n")
    assert read_csv_long(csv).select("name", "node").rows() == [("b", 0), ("a", 4)]


def test_other_labels_are_kept_and_series_stay_apart(tmp_path):
    doc = body(series("requests_total", [[10, "2"]], code="200", instance="a", tier="gold"),
               series("requests_total", [[10, "3"]], code="500", instance="a", tier="gold"))
    df = read_prometheus_json(write(tmp_path, "q.json", doc))
    rows = [(0, "gold", 'code="200"', 2.0), (0, "gold", 'code="500"', 3.0)]
    assert sorted(df.select("node", "tier", pl.col("labels").cast(pl.String), "value")
                  .rows()) == rows
    # overlapping queries: the same series twice is counted once
    df = read_prometheus_json(write(tmp_path, "q2.json", [doc, body(doc["data"]["result"][1])]))
    assert sorted(df.select("node", "tier", pl.col("labels").cast(pl.String), "value")
                  .rows()) == rows
    # through CSV and back, labels included (quoted cells: the row-by-row reader)
    write_csv_long(df, tmp_path / "m.csv")
    back = read_csv_long(tmp_path / "m.csv")
    assert back["labels"].cast(pl.String).to_list() == df["labels"].cast(pl.String).to_list()
    bad = write(tmp_path, "b.csv", 'time_s,name,value,labels\n1,a,1,"job=api"\n')
    with pytest.raises(TraceError, match=r"b\.csv: line 2, column labels: 'job=api' is not a "
                                         "label set"):
        read_csv_long(bad)
    csv = write(tmp_path, "m.csv", "time_s,name,value,code\n1,a,2,200\n1,a,3,500\n1,a,3,500\n")
    assert read_csv_long(csv)["value"].to_list() == [5.0]


# -- Prometheus JSON ----------------------------------------------------------------------------


def test_json_list_of_bodies_and_special_values(tmp_path):
    docs = [body(series("latency_seconds_bucket", [[1.5, "+Inf"], [3, "NaN"]], le="1.0")),
            body(series("queue_length", [[1.5, "-Inf"]], instance="h:1"))]
    df = read_prometheus_json(write(tmp_path, "q.json", docs))
    assert df.select("time_s", "node", "le").rows() == [(1.5, -1, "1"), (1.5, 0, None),
                                                        (3.0, -1, "1")]
    assert df["value"][0] == math.inf and df["value"][1] == -math.inf
    assert math.isnan(df["value"][2])


def test_json_skips_summary_quantiles(tmp_path):
    doc = body(series("rpc_seconds", [[1, "0.2"]], quantile="0.99"),
               series("rpc_seconds_count", [[1, "9"]]))
    assert read_prometheus_json(write(tmp_path, "q.json", doc))["name"].to_list() == [
        "rpc_seconds_count"]


@pytest.mark.parametrize("doc, message", [
    ({"status": "error", "errorType": "bad_data", "error": "parse error at char 4"},
     r"q\.json: status: is 'error' \(bad_data: parse error at char 4\); expected 'success'"),
    (body(rtype="vector"), r"q\.json: data\.resultType: is 'vector'; expected 'matrix'"),
    ({"status": "success"}, r"q\.json: top level: missing key 'data'"),
    (body({"metric": {"__name__": "up"}}),
     r"q\.json: data\.result\[0\]: missing key 'values'"),
    (body(series("up", [[1, "1"]]), series("up", [[1, "1"], [2, "1"], [3, "one"]])),
     r"q\.json: data\.result\[1\]\.values\[2\]: has value \"one\"; expected a number"),
    (body(series("up", [["x", "1"]])),
     r"q\.json: data\.result\[0\]\.values\[0\]: has timestamp \"x\"; expected finite Unix"),
    ([body(), body(series("up", [[1, "1", 3]]))],
     r"q\.json: \[1\]\.data\.result\[0\]\.values\[0\]: is \[1, \"1\", 3\]; expected a \["),
    (body({"metric": {"job": "x"}, "values": []}),
     r"q\.json: data\.result\[0\]\.metric: has no __name__"),
    (body(series("up", [], le="big")),
     r"q\.json: data\.result\[0\]\.metric\.le: le='big' is not a bucket bound"),
    (body(series("up", [], node="a")),
     r"q\.json: data\.result\[0\]\.metric\.node: is 'a'; expected an integer"),
    (body({"metric": {"__name__": "h"}, "histograms": []}),
     r"q\.json: data\.result\[0\]: holds a native histogram"),
])
def test_json_errors(tmp_path, doc, message):
    with pytest.raises(TraceError, match=message):
        read_prometheus_json(write(tmp_path, "q.json", doc))


def test_json_syntax_error_names_line(tmp_path):
    with pytest.raises(TraceError, match=r"q\.json: line 2, column 1: invalid JSON"):
        read_prometheus_json(write(tmp_path, "q.json", '{"status":\n}'))
    with pytest.raises(TraceError, match=r"nope\.json: cannot read"):
        read_trace(tmp_path / "nope.json")


# -- CSV ----------------------------------------------------------------------------------------


def test_csv_columns_in_any_order_and_extra_ignored(tmp_path):
    text = ("value,name,time_s,le,note,instance\n"
            '3,latency_seconds_bucket,1,1.0,x,"h:9110"\n'
            "4,latency_seconds_bucket,1,+Inf,y,h:9102\n")
    df = read_csv_long(write(tmp_path, "m.csv", text))
    assert df.select("node", "le", "value").rows() == [(0, "+Inf", 4.0), (1, "1", 3.0)]


def test_csv_fast_and_row_by_row_paths_agree(tmp_path):
    rows = ["time_s,node,name,tier,outcome,le,value,instance,note",
            " 2 ,,latency_seconds_bucket,,,1.0,4,h:10,a",
            "1,7,requests_total,gold,ok,,+Inf,,a",
            "1,7,requests_total,gold,ok,,+Inf,,a",  # a repeated row counts once
            "1,7,requests_total,gold,ok,,2,,b",  # differs in an ignored column: added up
            "1,,in_flight,,,,NaN,h:9,",
            "1.5,-1,attempts_total,,,,-inf,,",
            "1e3,3,queue_length,,,,1e-3,,"]
    plain = write(tmp_path, "plain.csv", "\r\n".join(rows) + "\r\n")
    # quotes send the file down the row-by-row path
    quoted = write(tmp_path, "quoted.csv", "\n".join(r.replace(",a", ',"a"') for r in rows))
    fast, slow = read_csv_long(plain), read_csv_long(quoted)
    assert_frame_equal(fast, slow)
    assert fast.select("time_s", "node", "name", "le").rows() == [
        (1.0, 0, "in_flight", None), (1.0, 7, "requests_total", None),
        (1.5, -1, "attempts_total", None), (2.0, 1, "latency_seconds_bucket", "1"),
        (1000.0, 3, "queue_length", None)]
    assert at(fast, name="requests_total") == [math.inf]
    for path in (plain, quoted):
        df = read_csv_long(path, instances=["h:10", "h:9"])
        assert df.filter(pl.col("name") == "in_flight")["node"].to_list() == [1]
        with pytest.raises(TraceError, match=r"line 2: instance 'h:10' is not in"):
            read_csv_long(path, instances=["h:9"])


@pytest.mark.parametrize("text, message", [
    ("time_s,value\n", r"m\.csv: line 1: missing column\(s\) name; expected a header"),
    ("time_s,name,value,name\n", r"m\.csv: line 1: column\(s\) name appear twice"),
    ("time_s,name,value\n1,a,1\n2,a,lots\n",
     r"m\.csv: line 3, column value: 'lots' is not a number"),
    ("time_s,name,value\n\n1,a,1\nnan,a,1\n",
     r"m\.csv: line 4, column time_s: 'nan' is not a time; expected finite seconds"),
    ("time_s,name,value,node\n1,a,1,1.5\n",
     r"m\.csv: line 2, column node: '1\.5' is not a node; expected an integer"),
    ("time_s,name,value\n1,a\n", r"m\.csv: line 2: has 2 field\(s\); expected 3"),
    ("time_s,name,value\n1,,1\n", r"m\.csv: line 2, column name: is empty"),
    ("time_s,name,value,le\n1,a,1,x\n", r"m\.csv: line 2, column le: le='x' is not a bucket"),
    ("", r"m\.csv: line 1: the file is empty"),
])
def test_csv_errors(tmp_path, text, message):
    with pytest.raises(TraceError, match=message):
        read_csv_long(write(tmp_path, "m.csv", text))


# -- text exposition ----------------------------------------------------------------------------


def test_prometheus_ms_vs_openmetrics_seconds(tmp_path):
    prom = write(tmp_path, "a.prom", "# TYPE in_flight gauge\nin_flight 3 1718035200500\n")
    om = write(tmp_path, "b.om", "# TYPE in_flight gauge\nin_flight 3 1718035200.5\n# EOF\n")
    for path in (prom, om):
        df = read_openmetrics(path)
        assert df["time_s"].to_list() == [1718035200.5]
        assert df["node"].to_list() == [-1]  # no instance anywhere
    with pytest.raises(TraceError, match=r"c\.prom: line 1: timestamp '1718035200\.5' is not "
                                         r"an integer; expected Unix milliseconds.*# EOF"):
        read_openmetrics(write(tmp_path, "c.prom", "in_flight 3 1718035200.5\n"))


def test_sample_timestamp_beats_file_name(tmp_path):
    d = tmp_path / "snaps"
    d.mkdir()
    (d / "host:9110@1000.prom").write_text("up 1\nup_other 2 5000\n")
    (d / "host:9102@1015.txt").write_text('up{instance="elsewhere:1"} 1\n')
    (d / "notes.md").write_text("ignored")
    df = read_openmetrics(d)
    assert df.select("time_s", "node", "name").rows() == [
        (5.0, 1, "up_other"), (1000.0, 1, "up"), (1015.0, 0, "up")]  # elsewhere, host:9110
    assert read_openmetrics([d / "host:9110@1000.prom"])["node"].to_list() == [0, 0]


def test_label_escaping_and_special_values(tmp_path):
    text = ('requests_total{tier="a\\"b\\\\c\\nd",outcome="x, y}"} +Inf\n'
            'queue_length{ tier = "t" , } NaN\n'
            "busy_servers -Inf\n"
            '{"odd.name", tier="q"} 2\n')
    df = read_openmetrics(write(tmp_path, "h@60.prom", text))
    rows = {r["name"]: r for r in df.iter_rows(named=True)}
    assert rows["requests_total"]["tier"] == 'a"b\\c\nd'
    assert rows["requests_total"]["outcome"] == "x, y}"
    assert rows["requests_total"]["value"] == math.inf
    assert math.isnan(rows["queue_length"]["value"]) and rows["queue_length"]["tier"] == "t"
    assert rows["busy_servers"]["value"] == -math.inf
    assert rows["odd.name"]["tier"] == "q"


def test_openmetrics_details(tmp_path):
    text = ("# HELP requests Requests.\n# TYPE requests counter\n# UNIT requests requests\n"
            '# some comment\nrequests_total{tier="gold"} 7 # {trace_id="abc"} 1 1.5\n'
            'requests_created{tier="gold"} 1.7e9\n'
            '# TYPE rpc summary\nrpc{quantile="0.5"} 0.1\nrpc_sum 4\nrpc_count 9\n# EOF\n')
    df = read_openmetrics(write(tmp_path, "h:1@100.om", text))
    assert df.select("name", "value").rows() == [("requests_total", 7.0), ("rpc_count", 9.0),
                                                 ("rpc_sum", 4.0)]


def test_openmetrics_keeps_every_label(tmp_path):
    """Issue 32: the text importer keeps job and every other label, as the JSON one
    does, so up{job="api"} selects the api target's series only (and is not added to
    db's); a rule reading it fires."""
    from relakit.control.rules import backtest_rules
    from relakit.traces import LABELS

    for k, v in enumerate([1, 1, 0, 0, 0, 1, 1]):  # scrapes at 100..190 s
        write(tmp_path, f"h:1@{100 + 15 * k}.prom",
              f'up{{job="api",env="prod"}} {v}\nup{{job="db",env="prod"}} 1\n')
    df = read_openmetrics(tmp_path)
    assert df.schema[LABELS] == pl.Categorical
    assert sorted(df[LABELS].cast(pl.String).unique().to_list()) == [
        'env="prod",job="api"', 'env="prod",job="db"']
    assert df.filter(pl.col("time_s") == 130)["value"].to_list() == [0.0, 1.0]  # not summed
    rules = write(tmp_path.parent, "up.yml", "groups:\n  - name: g\n    interval: 15s\n"
                  "    rules:\n      - alert: ApiDown\n        expr: 'up{job=\"api\"} == 0'\n"
                  "        for: 15s\n")
    alerts = backtest_rules(df, rules)  # evaluated at 105, 120, ..., 180 s
    assert alerts.select("labels", "pending_at", "firing_at", "resolved_at").rows() == [
        ('{env="prod", instance="0", job="api"}', 135.0, 150.0, 180.0)]


@pytest.mark.parametrize("text, message", [
    ("# TYPE up gauge\nup one\n", r"h@1\.prom: line 2: value 'one' of up is not a number"),
    ('up{tier="a" 1\n', r"h@1\.prom: line 1: unexpected '1' at column 13; expected ','"),
    ('up{tier="a} 1\n', r"h@1\.prom: line 1: string opened at column 9 is not closed"),
    ('up{tier="a\\tb"} 1\n', r"h@1\.prom: line 1: escape \\t at column 11"),
    ("up{tier=a} 1\n", r"h@1\.prom: line 1: value of label tier is not quoted"),
    ('up{tier="a",tier="b"} 1\n', r"h@1\.prom: line 1: label tier appears twice"),
    ("# TYPE up thing\n", r"h@1\.prom: line 1: # TYPE gives 'thing'"),
    ("\nup 1 2 3\n", r"h@1\.prom: line 2: sample up has 3 field\(s\)"),
    ("up{} 1\n# EOF\nup 2\n", r"h@1\.prom: line 2: '# EOF' before the end"),
    ("=1\n", r"h@1\.prom: line 1: '=1' does not start with a metric name"),
    ('up{le="huge"} 1\n', r"h@1\.prom: line 1: le='huge' is not a bucket bound"),
    ("up 1 x\n# EOF\n", r"h@1\.prom: line 1: timestamp 'x' is not a number; expected Unix "
                        r"seconds \(OpenMetrics\)"),
])
def test_openmetrics_errors(tmp_path, text, message):
    with pytest.raises(TraceError, match=message):
        read_openmetrics(write(tmp_path, "h@1.prom", text))


def test_openmetrics_needs_a_time(tmp_path):
    with pytest.raises(TraceError, match=r"snap\.prom: line 2: sample up has no timestamp and "
                                         r"the file name gives none; expected .*<instance>@"):
        read_openmetrics(write(tmp_path, "snap.prom", "# TYPE up gauge\nup 1\n"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(TraceError, match=r"empty: holds no \.prom, \.om or \.txt files"):
        read_trace(tmp_path / "empty")


# -- validate_trace -----------------------------------------------------------------------------


@pytest.mark.parametrize("change, message", [
    (lambda df: df.drop("tier"), r"run-7: missing column\(s\) tier; expected exactly"),
    (lambda df: df.with_columns(instance=pl.lit("a")), r"run-7: unexpected column\(s\) instance"),
    (lambda df: df.with_columns(node=pl.col("node").cast(pl.Float64)),
     r"run-7: column node: has dtype Float64; expected an integer column"),
    (lambda df: df.with_columns(name=pl.col("node")),
     r"run-7: column name: has dtype Int32; expected a string column"),
    (lambda df: df.with_columns(value=pl.when(pl.col("node") == 2).then(None)
                                .otherwise(pl.col("value"))),
     r"run-7: column value: 2 null value\(s\), first at row 4"),
    (lambda df: df.with_columns(time_s=pl.lit(float("nan"))),
     r"run-7: column time_s: value nan at row 0; expected finite seconds"),
    (lambda df: df.with_columns(node=pl.lit(-2, dtype=pl.Int32)),
     r"run-7: column node: value -2 at row 0; expected a node index >= 0, or -1"),
    (lambda df: df.with_columns(le=pl.lit("big")), r"run-7: column le: value 'big'"),
])
def test_validate_errors(change, message):
    with pytest.raises(TraceError, match=message):
        validate_trace(change(validate_trace(frame())), source="run-7")


def test_validate_rejects_non_frames():
    with pytest.raises(TraceError, match=r"<frame>: expected a polars DataFrame, got dict"):
        validate_trace({"time_s": [1]})


def test_text_tolerances(tmp_path):
    text = ("  # HELP up Is it up.\r\n"
            '  up{tier="",outcome="ok"} 1\r\n'
            'in_flight{instance=""} 2\r\n')
    df = read_openmetrics(write(tmp_path, "h:1@7.txt", text))
    assert df.select("node", "name", "tier", "outcome").rows() == [
        (0, "in_flight", None, None), (0, "up", None, "ok")]  # an empty label is no label


def test_trace_error_carries_source_and_where(tmp_path):
    path = write(tmp_path, "m.csv", "time_s,name,value\n1,a,x\n")
    with pytest.raises(TraceError) as info:
        read_trace(path)
    assert info.value.source == str(path)
    assert info.value.where == "line 2, column value"
    assert isinstance(info.value, ValueError)


def test_the_fast_reader_and_read_trace_tell_a_format_alike(tmp_path):
    """`replay`'s polars-free reader takes a file as Parquet exactly when read_trace does
    (one suffix map and one sniffer, relakit.traces._names)."""
    from relakit.traces._names import is_parquet

    frame = pl.DataFrame({"time_s": [0.0, 15.0], "node": [0, 0], "name": ["up", "up"],
                          "tier": [None, None], "outcome": [None, None], "le": [None, None],
                          "value": [1.0, 1.0]},
                         schema={"time_s": pl.Float64, "node": pl.Int32, "name": pl.String,
                                 "tier": pl.String, "outcome": pl.String, "le": pl.String,
                                 "value": pl.Float64})
    frame.write_parquet(tmp_path / "a.parquet")
    frame.write_parquet(tmp_path / "a.bin")  # no known suffix: the magic bytes tell
    frame.write_csv(tmp_path / "a.dat")      # no known suffix: the header tells
    (tmp_path / "a.prom").write_text("up 1\n")
    (tmp_path / "b.csv").write_bytes((tmp_path / "a.bin").read_bytes())  # the suffix wins
    want = {"a.parquet": True, "a.bin": True, "a.dat": False, "a.prom": False, "b.csv": False}
    assert {name: is_parquet(tmp_path / name) for name in want} == want
    assert read_trace(tmp_path / "a.bin").height == read_trace(tmp_path / "a.dat").height == 2
