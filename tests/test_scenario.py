"""Tests for relakit.scenario (load_scenario and its checks) and experiment.simulate."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import yaml

from relakit.experiment import simulate
from relakit.scenario import ScenarioError, load_scenario

DEMO = Path(__file__).resolve().parents[1] / "params" / "scenarios" / "mmc-demo.yaml"

MINIMAL = {
    "duration_s": 10,
    "workload": {"arrival": {"kind": "poisson", "rate_rps": 5}},
    "fleet": {"servers": 2, "service": {"kind": "exponential", "mean_ms": 10}},
}

# Two nodes, so fan-out and fault-node checks have something to be out of range of.
BASE = {
    "name": "base",
    "duration_s": 10,
    "workload": {"arrival": {"kind": "poisson", "rate_rps": 50}},
    "fleet": {"nodes": 2, "servers": 2, "service": {"kind": "exponential", "mean_ms": 10}},
}


def write_yaml(path: Path, data) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def with_changes(**changes) -> dict:
    """A copy of BASE with changes; ``a__b=v`` sets ``data[a][b] = v``."""
    data = copy.deepcopy(BASE)
    for dotted, value in changes.items():
        keys = dotted.split("__")
        cur = data
        for k in keys[:-1]:
            cur = cur.setdefault(k, {})
        cur[keys[-1]] = value
    return data


# ---------------------------------------------------------------------------- loading, defaults


def test_demo_scenario_loads():
    sc = load_scenario(DEMO)
    assert sc.name == "mmc-demo"
    assert sc.duration_s == 1800.0
    assert sc.warmup_s == 10.0
    assert sc.fleet.nodes == 1
    assert sc.fleet.servers == (8,)
    assert sc.fleet.service.kind == "exponential"
    assert sc.fleet.service.mean_ms == 10.0
    assert sc.workload.arrival.kind == "poisson"
    assert sc.workload.arrival.rate_at(123.0) == 720.0
    assert sc.workload.deadline_ms is None
    assert sc.fleet.queue_limit is None
    assert sc.faults == ()
    assert sc.source == str(DEMO)
    assert sc.offered_utilisation == pytest.approx(0.9)


def test_minimal_dict_gets_defaults():
    sc = load_scenario(MINIMAL)
    assert sc.fleet.nodes == 1
    assert sc.fleet.servers == (2,)
    assert sc.fleet.routing == "random"
    assert sc.fleet.weights == (1.0,)
    assert sc.fleet.queue_limit is None
    assert sc.workload.tiers == {"gold": 0.1, "silver": 0.3, "bronze": 0.6}
    assert sc.seed == 1
    assert sc.workload.fanout == 1
    assert sc.workload.deadline_ms is None
    assert sc.warmup_s == 0.0
    assert sc.metrics_interval_s == 1.0
    assert sc.faults == ()
    assert sc.name == "scenario"
    assert sc.source == "<dict>"


def test_loading_a_dict_does_not_mutate_it():
    data = copy.deepcopy(MINIMAL)
    load_scenario(data, overrides={"fleet.servers": 7})
    assert data == MINIMAL


def test_the_clocks_scrape_phase_is_the_data_planes_unless_metrics_gives_one():
    """clocks.scrape_phase_s is when every node is scraped (it was read, checked and then
    dropped: the nodes were scraped at 0); metrics.phase_s, given, is the run's own."""
    rela = str(DEMO.parents[1] / "policies" / "rela.yaml")
    clocks = {"scrape_s": 5, "window_s": 20, "eval_s": 5, "poll_s": 5, "scrape_phase_s": 2.5}
    closed = {**BASE, "duration_s": 30, "policy": rela, "clocks": clocks}
    assert load_scenario(closed).metrics.phase_s == (2.5, 2.5)
    own = {**closed, "metrics": {"phase_s": [1.0, 0.5]}}
    assert load_scenario(own).metrics.phase_s == (1.0, 0.5)
    assert load_scenario({**BASE, "duration_s": 30}).metrics.phase_s == (0.0, 0.0)


def test_scalar_servers_repeat_per_node_and_list_is_kept():
    assert load_scenario(BASE).fleet.servers == (2, 2)
    sc = load_scenario(with_changes(fleet__servers=[1, 3]))
    assert sc.fleet.servers == (1, 3)
    assert sc.fleet.capacity_rps == pytest.approx(400.0)


# ---------------------------------------------------------------------------- bad inputs

BAD = {
    "unknown top-level key": (
        dict(BASE, durations_s=5),
        ["(top level)", "durations_s", "duration_s", "workload"],
    ),
    "unknown nested key": (
        with_changes(fleet__service={"kind": "exponential", "mean": 10}),
        ["fleet.service", "'mean'", "mean_ms"],
    ),
    "wrong service kind": (
        with_changes(fleet__service={"kind": "expo", "mean_ms": 10}),
        ["fleet.service.kind", "'expo'", "exponential", "pareto", "bimodal"],
    ),
    "string for a number": (
        with_changes(fleet__servers="four"),
        ["fleet.servers", "expected a number", "'four'"],
    ),
    "string duration": (
        with_changes(duration_s="10s"),
        ["'duration_s'", "expected a number"],
    ),
    "fractional servers": (
        with_changes(fleet__servers=1.5),
        ["fleet.servers", "whole number"],
    ),
    "negative rate": (
        with_changes(workload__arrival={"kind": "poisson", "rate_rps": -5}),
        ["workload.arrival.rate_rps", "-5", ">= 0"],
    ),
    "tiers not summing to 1": (
        with_changes(workload__tiers={"gold": 0.5, "silver": 0.3, "bronze": 0.3}),
        ["workload.tiers", "sum to 1", "1.1"],
    ),
    "unknown tier": (
        with_changes(workload__tiers={"platinum": 1.0}),
        ["workload.tiers", "platinum", "gold", "silver", "bronze"],
    ),
    "fanout above nodes": (
        with_changes(workload__fanout=3),
        ["workload.fanout", "3", "the fleet has 2"],
    ),
    "fault node out of range": (
        with_changes(faults=[{"node": 2, "start_s": 1, "end_s": 2}]),
        ["faults[0].node", "<= 1"],
    ),
    "fault end before start": (
        with_changes(faults=[{"node": 0, "start_s": 1, "end_s": 2},
                             {"node": 1, "start_s": 5, "end_s": 3}]),
        ["faults[1].end_s", "start_s"],
    ),
    "fault end equal to start": (
        with_changes(faults=[{"node": 0, "start_s": 4, "end_s": 4}]),
        ["faults[0].end_s", "start_s"],
    ),
    "fault unknown key": (
        with_changes(faults=[{"node": 0, "start_s": 1, "end_s": 2, "kill": True}]),
        ["faults[0]", "kill", "crash"],
    ),
    "fault crash not a bool": (
        with_changes(faults=[{"node": 0, "start_s": 1, "end_s": 2, "crash": "yes please"}]),
        ["faults[0].crash", "true or false"],
    ),
    "pareto alpha equal to 1": (
        with_changes(fleet__service={"kind": "pareto", "mean_ms": 10, "alpha": 1}),
        ["fleet.service.alpha", "> 1"],
    ),
    "pareto alpha below 1": (
        with_changes(fleet__service={"kind": "pareto", "mean_ms": 10, "alpha": 0.5}),
        ["fleet.service.alpha", "> 1"],
    ),
    "servers list of wrong length": (
        with_changes(fleet__servers=[1, 2, 3]),
        ["fleet.servers", "one entry per node (2)", "got 3"],
    ),
    "wrong routing": (
        with_changes(fleet__routing="least_loaded"),
        ["fleet.routing", "'least_loaded'", "random", "round_robin", "jsq", "p2c"],
    ),
    "wrong arrival kind": (
        with_changes(workload__arrival={"kind": "bursty", "rate_rps": 5}),
        ["workload.arrival.kind", "poisson", "step", "spike", "ramp", "diurnal", "trace"],
    ),
    "missing service": (
        with_changes(fleet={"nodes": 2, "servers": 2}),
        ["fleet.service", "is required", "exponential"],
    ),
    "missing duration": (
        {k: v for k, v in BASE.items() if k != "duration_s"},
        ["'duration_s'", "is required"],
    ),
    "warmup not shorter than duration": (
        with_changes(warmup_s=10),
        ["'warmup_s'", "duration_s"],
    ),
    "ramp end before start": (
        with_changes(workload__arrival={"kind": "ramp", "from_rps": 1, "to_rps": 2,
                                        "start_s": 5, "end_s": 5}),
        ["workload.arrival.end_s", "start_s"],
    ),
    "zero rate everywhere": (
        with_changes(workload__arrival={"kind": "poisson", "rate_rps": 0}),
        ["workload.arrival", "zero everywhere"],
    ),
    "trace with both path and points": (
        with_changes(workload__arrival={"kind": "trace", "path": "x.csv",
                                        "points": [[0, 1]]}),
        ["workload.arrival", "exactly one of", "path", "points"],
    ),
    "trace points decreasing in time": (
        with_changes(workload__arrival={"kind": "trace",
                                        "points": [[0, 1], [10, 2], [5, 3]]}),
        ["workload.arrival.points", "row 3", "must increase"],
    ),
    "trace point not a pair": (
        with_changes(workload__arrival={"kind": "trace", "points": [[0, 1], [10]]}),
        ["workload.arrival.points", "row 2"],
    ),
    "trace path not found": (
        with_changes(workload__arrival={"kind": "trace", "path": "no-such-trace.csv"}),
        ["workload.arrival.path", "no-such-trace.csv", "not found"],
    ),
    "top level not a mapping": (
        [1, 2, 3],
        ["(top level)", "expected a mapping", "list"],
    ),
}


@pytest.mark.parametrize("data, expected", BAD.values(), ids=BAD.keys())
def test_bad_scenario_file_is_rejected_with_file_key_and_allowed(tmp_path, data, expected):
    path = write_yaml(tmp_path / "bad-scenario.yaml", data)
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    msg = str(info.value)
    assert msg.startswith(str(path)), msg
    for part in expected:
        assert part in msg, (part, msg)


def test_bad_dict_names_dict_as_source():
    with pytest.raises(ScenarioError, match=r"^<dict>: key 'fleet\.routing'.*p2c"):
        load_scenario(with_changes(fleet__routing="fastest"))


def test_scenario_error_is_a_value_error():
    assert issubclass(ScenarioError, ValueError)


def test_invalid_yaml_syntax(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("duration_s: [1, 2\nfleet: {servers: 2\n")
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    assert str(info.value).startswith(f"{path}: not valid YAML")


@pytest.mark.parametrize(("text", "where"), [
    ("duration_s: [1, 2\nfleet: {servers: 2\n", "at line 2, column 6:"),
    ("é: b: c\n", "at line 1, column 5:"),  # columns count characters, not bytes
    ("a: 1\n# c\n\tb: 2\n", "at line 3, column 1:"),
])
def test_yaml_errors_name_line_and_column(tmp_path, text, where):
    """Whichever parser PyYAML uses (libyaml where it has it), a syntax error names the
    line and the column; a key given twice names both lines."""
    path = tmp_path / "broken.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    assert str(info.value).startswith(f"{path}: not valid YAML {where}"), str(info.value)


def test_yaml_key_given_twice_names_both_lines(tmp_path):
    path = tmp_path / "twice.yaml"
    path.write_text("duration_s: 10\nfleet:\n  servers: 2\nduration_s: 20\n")
    with pytest.raises(ScenarioError, match=r"key 'duration_s': given twice \(lines 1 and 4\)"):
        load_scenario(path)


def test_missing_file(tmp_path):
    path = tmp_path / "nowhere.yaml"
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    assert str(path) in str(info.value)
    assert "no such scenario file" in str(info.value)


def test_directory_is_not_a_scenario_file(tmp_path):
    with pytest.raises(ScenarioError, match="no such scenario file"):
        load_scenario(tmp_path)


def _trace_scenario(tmp_path: Path, csv_text: str, **arrival) -> Path:
    (tmp_path / "trace.csv").write_text(csv_text)
    data = with_changes(workload__arrival={"kind": "trace", "path": "trace.csv", **arrival})
    return write_yaml(tmp_path / "traced.yaml", data)


def test_trace_csv_bad_row_names_csv_and_row(tmp_path):
    path = _trace_scenario(tmp_path, "time_s,rate_rps\n0,10\n5,abc\n10,20\n")
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    msg = str(info.value)
    assert "trace.csv" in msg
    assert str(tmp_path) in msg
    assert "row 2" in msg
    assert "abc" in msg


def test_trace_csv_negative_rate_names_row(tmp_path):
    path = _trace_scenario(tmp_path, "time_s,rate_rps\n0,10\n5,20\n10,-1\n")
    with pytest.raises(ScenarioError, match=r"trace\.csv: row 3: .*>= 0"):
        load_scenario(path)


def test_trace_csv_decreasing_times(tmp_path):
    path = _trace_scenario(tmp_path, "time_s,rate_rps\n0,10\n8,20\n4,30\n")
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    msg = str(info.value)
    assert "trace.csv" in msg
    assert "row 3" in msg
    assert "must increase" in msg


def test_trace_csv_wrong_header(tmp_path):
    path = _trace_scenario(tmp_path, "t,rps\n0,10\n")
    with pytest.raises(ScenarioError, match=r"trace\.csv: .*time_s, rate_rps"):
        load_scenario(path)


def test_trace_csv_empty(tmp_path):
    path = _trace_scenario(tmp_path, "time_s,rate_rps\n")
    with pytest.raises(ScenarioError, match=r"trace\.csv"):
        load_scenario(path)


# ---------------------------------------------------------------------------- arrival kinds


def _arrival(spec: dict, duration_s: float = 100.0):
    data = with_changes(workload__arrival=spec, duration_s=duration_s)
    return load_scenario(data).workload.arrival


def test_poisson_rate_is_constant():
    a = _arrival({"kind": "poisson", "rate_rps": 5})
    assert a.kind == "poisson"
    assert a.constant
    assert a.rate_at(0.0) == 5.0
    assert a.rate_at(50.0) == 5.0
    assert a.rate_at(1e6) == 5.0


def test_step_rate():
    a = _arrival({"kind": "step", "rate_rps": 10, "to_rps": 40, "at_s": 30})
    assert not a.constant
    assert a.rate_at(0.0) == 10.0
    assert a.rate_at(29.999) == pytest.approx(10.0)
    assert a.rate_at(30.0) == 40.0
    assert a.rate_at(60.0) == 40.0
    assert a.mean_rate(100.0) == pytest.approx(0.3 * 10 + 0.7 * 40, rel=1e-3)


def test_spike_rate():
    a = _arrival({"kind": "spike", "rate_rps": 10, "peak_rps": 100, "start_s": 20,
                  "width_s": 5})
    assert a.rate_at(0.0) == 10.0
    assert a.rate_at(19.9) == pytest.approx(10.0)
    assert a.rate_at(20.0) == 100.0
    assert a.rate_at(22.5) == pytest.approx(100.0)
    assert a.rate_at(24.9) == pytest.approx(100.0)
    assert a.rate_at(25.0) == 10.0
    assert a.rate_at(80.0) == 10.0


def test_ramp_rate():
    a = _arrival({"kind": "ramp", "from_rps": 10, "to_rps": 30, "start_s": 20, "end_s": 60})
    assert a.rate_at(0.0) == 10.0
    assert a.rate_at(20.0) == pytest.approx(10.0)
    assert a.rate_at(40.0) == pytest.approx(20.0)  # midpoint = average of the ends
    assert a.rate_at(30.0) == pytest.approx(15.0)
    assert a.rate_at(60.0) == pytest.approx(30.0)
    assert a.rate_at(90.0) == pytest.approx(30.0)


def test_diurnal_rate():
    a = _arrival({"kind": "diurnal", "mean_rps": 50, "amplitude": 0.5, "period_s": 100},
                 duration_s=100.0)
    assert a.rate_at(0.0) == pytest.approx(50.0)
    assert a.rate_at(25.0) == pytest.approx(75.0, abs=0.1)
    assert a.rate_at(50.0) == pytest.approx(50.0, abs=0.1)
    assert a.rate_at(75.0) == pytest.approx(25.0, abs=0.1)
    assert a.mean_rate(100.0) == pytest.approx(50.0, rel=1e-3)


def test_diurnal_phase_shifts_the_wave():
    a = _arrival({"kind": "diurnal", "mean_rps": 50, "amplitude": 0.5, "period_s": 100,
                  "phase_s": 25}, duration_s=100.0)
    assert a.rate_at(25.0) == pytest.approx(50.0, abs=0.1)
    assert a.rate_at(50.0) == pytest.approx(75.0, abs=0.1)


def test_diurnal_default_amplitude():
    a = _arrival({"kind": "diurnal", "mean_rps": 40, "period_s": 100}, duration_s=100.0)
    assert a.rate_at(25.0) == pytest.approx(60.0, abs=0.1)


def test_trace_points_linear():
    a = _arrival({"kind": "trace", "points": [[0, 10], [10, 30], [20, 5]]})
    assert a.rate_at(0.0) == 10.0
    assert a.rate_at(5.0) == pytest.approx(20.0)
    assert a.rate_at(15.0) == pytest.approx(17.5)
    assert a.rate_at(25.0) == 5.0
    np.testing.assert_allclose(a.rate_at(np.array([5.0, 10.0, 15.0])), [20.0, 30.0, 17.5])


def test_trace_points_step_interpolation():
    a = _arrival({"kind": "trace", "interpolation": "step",
                  "points": [[0, 10], [10, 30], [20, 5]]})
    assert a.rate_at(5.0) == 10.0
    assert a.rate_at(10.0) == 30.0
    assert a.rate_at(15.0) == 30.0
    assert a.rate_at(20.0) == 5.0


def test_trace_csv_path_relative_to_scenario_file(tmp_path, monkeypatch):
    monkeypatch.chdir(Path(__file__).parent)  # not tmp_path: the path is the YAML's folder
    path = _trace_scenario(tmp_path, "time_s,rate_rps\n0,100\n10,200\n20,50\n")
    a = load_scenario(path).workload.arrival
    assert a.kind == "trace"
    assert a.rate_at(0.0) == 100.0
    assert a.rate_at(5.0) == pytest.approx(150.0)
    assert a.rate_at(10.0) == pytest.approx(200.0)
    assert a.rate_at(15.0) == pytest.approx(125.0)
    assert a.rate_at(40.0) == 50.0


def test_trace_csv_step_interpolation(tmp_path):
    path = _trace_scenario(tmp_path, "time_s,rate_rps\n0,100\n10,200\n",
                           interpolation="step")
    a = load_scenario(path).workload.arrival
    assert a.rate_at(9.0) == 100.0
    assert a.rate_at(10.0) == 200.0


# ---------------------------------------------------------------------------- overrides


def test_override_changes_servers():
    sc = load_scenario(DEMO, overrides={"fleet.servers": 4})
    assert sc.fleet.servers == (4,)
    assert sc.offered_utilisation == pytest.approx(1.8)
    assert load_scenario(DEMO).fleet.servers == (8,)


def test_overrides_are_validated():
    with pytest.raises(ScenarioError, match=r"fleet\.routing.*random"):
        load_scenario(DEMO, overrides={"fleet.routing": "nope"})


def test_override_creates_missing_nested_keys():
    sc = load_scenario(MINIMAL, overrides={"workload.deadline_ms": 250, "seed": 9})
    assert sc.workload.deadline_ms == 250.0
    assert sc.seed == 9


# ---------------------------------------------------------------------------- simulate

SMALL = {
    "name": "small",
    "duration_s": 5,
    "warmup_s": 1,
    "workload": {"arrival": {"kind": "poisson", "rate_rps": 200}},
    "fleet": {"nodes": 2, "servers": 2, "service": {"kind": "exponential", "mean_ms": 10}},
}


@pytest.fixture(scope="module")
def small_runs():
    return {
        "a": simulate(SMALL, seed=3),
        "b": simulate(SMALL, seed=3),
        "c": simulate(SMALL, seed=4),
        "flat": simulate(SMALL, seed=3, record_requests=False),
    }


def test_same_seed_gives_identical_tables(small_runs):
    a, b = small_runs["a"], small_runs["b"]
    assert a.requests.height > 500
    assert a.requests.equals(b.requests)
    assert a.metrics.equals(b.metrics)
    assert a.summary.equals(b.summary)


def test_different_seed_gives_different_requests(small_runs):
    assert not small_runs["a"].requests.equals(small_runs["c"].requests)
    assert small_runs["c"].info["seed"] == 4


def test_no_records_keeps_the_summary(small_runs):
    a, flat = small_runs["a"], small_runs["flat"]
    assert flat.requests is None
    assert flat.summary.equals(a.summary)
    assert flat.metrics.equals(a.metrics)


def test_scenario_seed_is_the_default(small_runs):
    r = simulate(dict(SMALL, seed=3))
    assert r.info["seed"] == 3
    assert r.requests.equals(small_runs["a"].requests)


def test_summary_counts_match_requests_after_warmup(small_runs):
    a = small_runs["a"]
    req = a.requests.filter(a.requests["arrival_s"] >= SMALL["warmup_s"])
    counts = dict(req.group_by("tier").len().iter_rows())
    rows = {r["tier"]: r for r in a.summary.iter_rows(named=True)}
    for tier in ("gold", "silver", "bronze"):
        assert rows[tier]["requests"] == counts[tier]
    assert rows["all"]["requests"] == req.height
