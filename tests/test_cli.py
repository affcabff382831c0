"""Tests for the ``relakit simulate`` command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
import yaml

from relakit.cli import main

TIERS = ("gold", "silver", "bronze")
OUTPUTS = {"requests.parquet", "metrics.parquet", "summary.json"}

# One M/M/4 node at 75 %: 300 rps into 4 servers of 10 ms, 20 s with 2 s of warm-up.
SCENARIO = {
    "name": "cli-small",
    "duration_s": 20,
    "warmup_s": 2,
    "seed": 5,
    "workload": {"arrival": {"kind": "poisson", "rate_rps": 300}},
    "fleet": {"nodes": 1, "servers": 4, "service": {"kind": "exponential", "mean_ms": 10}},
}


@pytest.fixture
def scenario(tmp_path) -> Path:
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(SCENARIO, sort_keys=False))
    return path


@pytest.fixture
def bad_scenario(tmp_path) -> Path:
    data = dict(SCENARIO, fleet=dict(SCENARIO["fleet"], routing="fastest"))
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def run(*argv) -> int:
    return main(["simulate", *map(str, argv)])


def test_simulate_writes_tables_and_prints_summary(scenario, tmp_path, capsys):
    out = tmp_path / "out"
    assert run(scenario, "--out", out) == 0
    stdout = capsys.readouterr().out
    for tier in (*TIERS, "all"):
        assert tier in stdout
    assert "scenario cli-small" in stdout
    assert "seed 5" in stdout
    assert {p.name for p in out.iterdir()} == OUTPUTS  # no temporary files left behind
    for name in OUTPUTS:
        assert f"wrote {out / name}" in stdout

    doc = json.loads((out / "summary.json").read_text())
    assert doc["info"]["scenario"] == "cli-small"
    assert doc["info"]["seed"] == 5
    assert doc["info"]["source"] == str(scenario)

    requests = pl.read_parquet(out / "requests.parquet")
    assert set(requests.columns) >= {"arrival_s", "latency_ms", "tier", "outcome"}
    counted = requests.filter(pl.col("arrival_s") >= SCENARIO["warmup_s"])
    assert counted.height < requests.height  # the warm-up was really excluded below
    by_tier = dict(counted.group_by("tier").len().iter_rows())
    rows = {row["tier"]: row for row in doc["tiers"]}
    assert set(rows) == {*TIERS, "all"}
    for tier in TIERS:
        assert rows[tier]["requests"] == by_tier[tier], tier
    assert rows["all"]["requests"] == counted.height
    assert doc["info"]["counted_requests"] == counted.height
    # ~300 rps for 18 counted seconds
    assert 4500 < counted.height < 6300

    metrics = pl.read_parquet(out / "metrics.parquet")
    assert metrics.height > 0
    assert {"time_s", "node", "name", "value"} <= set(metrics.columns)


def test_seed_option_changes_the_output(scenario, tmp_path, capsys):
    assert run(scenario, "--out", tmp_path / "s5") == 0
    assert run(scenario, "--out", tmp_path / "s5-again", "--seed", "5") == 0
    assert run(scenario, "--out", tmp_path / "s6", "--seed", "6") == 0
    capsys.readouterr()
    tables = {k: pl.read_parquet(tmp_path / k / "requests.parquet")
              for k in ("s5", "s5-again", "s6")}
    assert tables["s5"].equals(tables["s5-again"])
    assert not tables["s5"].equals(tables["s6"])
    assert json.loads((tmp_path / "s6" / "summary.json").read_text())["info"]["seed"] == 6


def test_no_requests_writes_no_request_table(scenario, tmp_path, capsys):
    assert run(scenario, "--out", tmp_path / "full") == 0
    assert run(scenario, "--out", tmp_path / "flat", "--no-requests") == 0
    capsys.readouterr()
    flat = tmp_path / "flat"
    assert {p.name for p in flat.iterdir()} == {"metrics.parquet", "summary.json"}
    full_doc = json.loads((tmp_path / "full" / "summary.json").read_text())
    flat_doc = json.loads((flat / "summary.json").read_text())
    assert flat_doc["tiers"] == full_doc["tiers"]


def test_figure_option_writes_a_png_into_out(scenario, tmp_path, capsys):
    fig = tmp_path / "out" / "latency.png"
    assert run(scenario, "--out", tmp_path / "out", "--figure", "png") == 0
    assert f"wrote {fig}" in capsys.readouterr().out
    data = fig.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    assert len(data) > 1000
    assert {p.name for p in (tmp_path / "out").iterdir()} == OUTPUTS | {"latency.png"}


def test_figure_draws_simulation_and_closed_form_in_the_palette_source_colours(
        scenario, tmp_path, capsys):
    from relakit.plots import CATEGORY, CLOSED_FORM_COLOR, SIMULATION_COLOR

    assert run(scenario, "--out", tmp_path / "out", "--figure", "svg") == 0
    capsys.readouterr()
    svg = (tmp_path / "out" / "latency.svg").read_text().lower()
    # an M/M/4 node: the simulation beside Erlang C, each in its PALETTE["source"] colour
    assert "erlang c (m/m/4)" in svg and "vs closed form" in svg
    assert f'stroke="{SIMULATION_COLOR}"' in svg and f'stroke="{CLOSED_FORM_COLOR}"' in svg
    assert not any(f'stroke="{c}"' in svg for c in CATEGORY[:2])  # not the generic series


def test_figure_given_a_file_name_warns_and_still_writes_it(scenario, tmp_path, capsys):
    fig = tmp_path / "figs" / "mine.svg"  # the spelling before --out held every output
    assert run(scenario, "--out", tmp_path / "out", "--figure", fig) == 0
    captured = capsys.readouterr()
    assert f"wrote {fig}" in captured.out and fig.read_bytes().startswith(b"<svg")
    assert "relakit: warning: --figure" in captured.err and "deprecated" in captured.err


def test_bad_scenario_in_process_exits_2_and_writes_nothing(bad_scenario, tmp_path, capsys):
    out = tmp_path / "out"
    assert run(bad_scenario, "--out", out) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("relakit: error: ")
    assert str(bad_scenario) in captured.err
    assert "fleet.routing" in captured.err
    assert not out.exists() or not any(out.iterdir())


def test_missing_scenario_exits_2(tmp_path, capsys):
    out = tmp_path / "out"
    assert run(tmp_path / "nope.yaml", "--out", out) == 2
    err = capsys.readouterr().err
    assert err.startswith("relakit: error: ")
    assert "nope.yaml" in err
    assert not out.exists()


@pytest.mark.parametrize("figure_args", [
    ["--no-requests", "--figure", "fig.png"],  # a figure needs the request records
    ["--figure", "fig.gif"],  # not a figure type the writer knows
])
def test_failing_figure_leaves_no_partial_output(scenario, tmp_path, capsys, figure_args):
    out = tmp_path / "out"
    args = [a if not a.startswith("fig.") else str(tmp_path / a) for a in figure_args]
    assert run(scenario, "--out", out, *args) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("relakit: error: ")
    assert "Traceback" not in captured.err
    assert not out.exists() or not any(out.iterdir())
    assert not list(tmp_path.glob("fig.*"))


def test_console_script_bad_scenario(bad_scenario, tmp_path):
    exe = Path(sys.executable).parent / "relakit"
    assert exe.exists(), exe
    out = tmp_path / "out"
    proc = subprocess.run(
        [str(exe), "simulate", str(bad_scenario), "--out", str(out)],
        capture_output=True, text=True, timeout=60, env=dict(os.environ),
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    line = lines[0]
    assert line.startswith("relakit: error: ")
    assert str(bad_scenario) in line
    assert "fleet.routing" in line
    assert "round_robin" in line
    assert proc.stdout == ""
    assert not out.exists()


def test_usage_error_exits_2(capsys):
    assert main(["simulate"]) == 2  # returned, not raised: in-process callers get the code
    err = capsys.readouterr().err
    assert "scenario" in err and err.startswith("relakit: error:") and err.count("\n") == 1


@pytest.mark.parametrize("name, folder", [("../x", "x"), ("a/b c", "a-b-c"), ("..", "run"),
                                          ("~/.ssh", "ssh")])
def test_a_scenario_name_becomes_one_folder_inside_out(name, folder, tmp_path, monkeypatch):
    """``name: ../x`` once wrote the run beside out/, not in it."""
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "sc.yaml"
    path.write_text(yaml.safe_dump({**SCENARIO, "name": name, "duration_s": 2, "warmup_s": 0}))
    assert main(["simulate", str(path), "--no-requests"]) == 0
    made = [p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("summary.json")]
    assert made == [f"out/{folder}/summary.json"]
