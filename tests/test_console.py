"""What the command line says about itself and what it prints: version, help with
defaults, the progress line (quiet off a terminal), the summary's ``wrong``
column and number formats, and time in each mode summing to the run's length."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
import time
from importlib.metadata import version

import numpy as np
import polars as pl
import pytest
import yaml
from conftest import ROOT, make_scenario

from relakit.cli import build_parser, main
from relakit.progress import Progress, Ticker

RELA = ROOT / "params" / "policies" / "rela.yaml"


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


# ---- the command explains itself ------------------------------------------------------------
def test_version_is_the_installed_packages(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"relakit {version('relakit')}"


def test_python_dash_m_relakit_is_the_command():
    run = subprocess.run([sys.executable, "-m", "relakit", "--help"], capture_output=True,
                         text=True, cwd=ROOT, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "research workbench for reliability control loops" in run.stdout
    assert "Nothing imports" not in run.stdout
    for command in ("simulate", "replay", "sweep", "figures", "lab"):
        assert command in run.stdout
    run = subprocess.run([sys.executable, "-m", "relakit", "--version"], capture_output=True,
                         text=True, cwd=ROOT, timeout=120)
    assert run.returncode == 0 and run.stdout.strip() == f"relakit {version('relakit')}"


def _subcommands():
    parser = build_parser()
    sub = next(a for a in parser._actions if hasattr(a, "choices") and isinstance(a.choices,
                                                                                    dict))
    return sub.choices


def test_the_usual_subcommands_are_there():
    assert {"simulate", "replay", "sweep", "figures", "lab"} <= set(_subcommands())


def _lab_actions():
    lab = _subcommands()["lab"]
    return next(a for a in lab._actions if hasattr(a, "choices") and isinstance(
        a.choices, dict)).choices


def test_each_lab_action_has_its_own_options():
    """`relakit lab up --help` lists up's options only (they were one list for all four)."""
    acts = _lab_actions()
    assert set(acts) == {"up", "load", "record", "down"}
    flags = {n: {f for a in p._actions for f in a.option_strings} for n, p in acts.items()}
    assert "--phases" in flags["load"] and "--phases" not in flags["up"]
    assert "--instances" in flags["up"] and "--instances" not in flags["down"]
    assert all("--dir" in f for f in flags.values())


@pytest.mark.parametrize("name", sorted(_subcommands()) + [f"lab {a}" for a in
                                                          sorted(_lab_actions())])
def test_every_option_has_help_and_states_its_default(name):
    sp = (_subcommands()[name] if " " not in name else _lab_actions()[name.split()[1]])
    text = sp.format_help()
    options = [a for a in sp._actions if a.option_strings and a.dest != "help"]
    positionals = [a for a in sp._actions if not a.option_strings]
    assert options or positionals
    assert all(a.help for a in positionals), name
    if not options:
        return
    # the rendered help, cut into one entry per option (an entry may wrap over lines)
    entries = re.split(r"\n  (?=-)", text.split("options:", 1)[1])
    for action in options:
        flag = max(action.option_strings, key=len)
        entry = next((e for e in entries if e.startswith(flag)), None)
        assert entry is not None, f"{name} {flag}: not in the help"
        words = " ".join(entry.split())
        assert "(default:" in words or "(required)" in words, f"{name} {flag}: {words}"
        said = words.split(" ", 1 if action.nargs == 0 else 2)[-1]  # after flag and metavar
        said = re.sub(r"\((default: .*|required)\)$", "", said).strip()
        assert len(said) >= 8, f"{name} {flag}: no help text ({words!r})"
    assert sp.description, name


# ---- the progress line ---------------------------------------------------------------------
def test_progress_is_quiet_when_stderr_is_not_a_terminal():
    stream = io.StringIO()  # not a terminal, like a pipe, a log file or a test
    p = Progress("simulate", 10, "s", stream=stream, after_s=0, every_s=0)
    for k in range(11):
        p.update(k)
    p.close()
    with Ticker(Progress("load", 0.2, "s", stream=stream, after_s=0, every_s=0.01), wall=True):
        time.sleep(0.1)
    assert stream.getvalue() == ""


def test_progress_on_a_terminal_estimates_only_once_something_is_done():
    stream = _Terminal()
    p = Progress("sweep", 20, "points", stream=stream, after_s=0, every_s=0, start=5)
    p.update(5, "0 failed")
    first = stream.getvalue()
    assert "\r" in first and "5/20 points" in first and "estimating time left" in first
    assert "nan" not in first
    # 5 points done by this run in 10 s: 10 left take ~20 s (resumed points do not count)
    p.done, p.t0 = 10, 0.0
    assert "~20 s left" in p.line(now=10.0)
    p.start = 0
    assert "~10 s left" in p.line(now=10.0)  # without the resumed 5: 10 in 10 s, 10 left
    p.close()
    assert stream.getvalue().endswith("\n")


def test_progress_waits_a_few_seconds_before_showing_anything():
    stream = _Terminal()
    p = Progress("simulate", 10, "s", stream=stream)  # default: after 2 s
    p.update(5)
    p.close()
    assert stream.getvalue() == ""


def test_wall_clock_ticker_draws_while_the_work_is_silent_and_ends_complete():
    stream = _Terminal()
    with Ticker(Progress("lab load", 0.3, "s of load", stream=stream, after_s=0,
                         every_s=0.02), wall=True):
        time.sleep(0.2)
    lines = [x for x in stream.getvalue().split("\r") if x.strip()]
    assert len(lines) >= 2
    assert "(100 %)" in lines[-1] and lines[-1].endswith("\n")


def test_simulate_prints_no_progress_off_a_terminal_and_stepping_changes_nothing(tmp_path,
                                                                                   capsys):
    import relakit

    sc = make_scenario(rate=300, duration=20, servers=4)
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(sc))
    assert main(["simulate", str(path), "--out", str(tmp_path / "o")]) == 0
    assert capsys.readouterr().err == ""
    one = relakit.simulate(sc)

    class Seen:
        def __init__(self):
            self.t = []

        def update(self, t, *a, **k):
            self.t.append(t)

    seen = Seen()
    stepped = relakit.simulate(sc, progress=seen)
    assert len(seen.t) > 10 and seen.t[-1] == 20.0
    assert stepped.summary.equals(one.summary)
    assert stepped.requests.equals(one.requests)


# ---- the summary table ----------------------------------------------------------------------
def _table(stdout: str) -> tuple[list[str], dict[str, list[str]]]:
    lines = stdout.splitlines()
    i = next(k for k, x in enumerate(lines) if x.startswith("tier "))
    header = lines[i].split()
    rows = {}
    for x in lines[i + 1:]:
        cells = x.split()
        if not cells or cells[0] not in ("gold", "silver", "bronze", "all"):
            break
        rows[cells[0]] = cells
    return header, rows


def test_the_console_shows_wrong_answers_when_a_fault_can_answer_wrongly(tmp_path, capsys):
    # chain-silent, shortened: node 2 answers 30 % wrongly from t = 60 s with success status
    text = (ROOT / "params" / "scenarios" / "chain-silent.yaml").read_text()
    text = text.replace("duration_s: 240", "duration_s: 90").replace(
        "../chains/aegis.yaml", str(ROOT / "params" / "chains" / "aegis.yaml"))
    path = tmp_path / "silent.yaml"
    path.write_text(text)
    assert main(["simulate", str(path), "--no-requests", "--out", str(tmp_path / "o")]) == 0
    header, rows = _table(capsys.readouterr().out)
    assert "wrong" in header
    doc = json.loads((tmp_path / "o" / "summary.json").read_text())
    counted = {r["tier"]: r["wrong"] for r in doc["tiers"]}
    assert counted["all"] > 0  # the silent failure really answered wrongly
    col = header.index("wrong")
    for tier, cells in rows.items():
        assert int(cells[col]) == counted[tier], tier
    assert float(rows["all"][header.index("success_ratio")]) == 1.0  # what the chain sees


def test_no_wrong_column_when_nothing_can_answer_wrongly(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(make_scenario(rate=300, duration=10, servers=4)))
    assert main(["simulate", str(path), "--no-requests", "--out", str(tmp_path / "o")]) == 0
    header, rows = _table(capsys.readouterr().out)
    assert "wrong" not in header and set(rows) == {"gold", "silver", "bronze", "all"}


def test_each_column_of_the_summary_has_one_number_format():
    import relakit

    # errors, a slow path and a deadline: ratios below 1, latencies from ms to seconds
    sc = make_scenario(rate=350, duration=30, servers=4, deadline_ms=200,
                       service={"kind": "bimodal", "fast_ms": 2, "slow_ms": 400,
                                "slow_fraction": 0.02},
                       faults=[{"node": 0, "start_s": 5, "end_s": 20, "error_rate": 0.03}])
    text = relakit.simulate(sc, record_requests=False).format_summary()
    header, rows = _table(text)
    for c, name in enumerate(header[1:], start=1):
        cells = [r[c] for r in rows.values()]
        decimals = {len(x.split(".")[1]) if "." in x else 0 for x in cells if x != "-"}
        assert len(decimals) == 1, (name, cells)
    assert header.index("success_ratio") and all(
        len(r[header.index("success_ratio")].split(".")[1]) == 4 for r in rows.values())
    assert float(rows["all"][header.index("success_ratio")]) < 1  # the faults were seen


# ---- time in each mode ----------------------------------------------------------------------
def _ramp(duration, **clocks):
    sc = yaml.safe_load((ROOT / "params" / "scenarios" / "rela-ramp.yaml").read_text())
    sc["duration_s"] = duration
    sc["fleet"]["nodes"] = 3
    sc["workload"]["arrival"] = {"kind": "ramp", "from_rps": 800, "to_rps": 3200,
                                 "start_s": 20, "end_s": duration}
    sc["policy"] = str(RELA)
    sc["clocks"] = {"scrape_s": 5, "window_s": 20, "eval_s": 2, "poll_s": 2, **clocks}
    return sc


@pytest.mark.parametrize("duration, clocks", [(120, {}), (121, {"eval_phase_s": 0.7})])
def test_time_in_each_mode_sums_to_the_duration_closed_loop(duration, clocks):
    import relakit

    r = relakit.simulate(_ramp(duration, **clocks), record_requests=False)
    spent = r.info["control"]["time_in_mode_s"]
    assert sum(spent.values()) == pytest.approx(duration, abs=1e-6)
    assert set(spent) == {"normal", "survival", "performance"}
    assert spent["normal"] < duration  # the ramp past saturation left normal


def test_time_in_each_mode_sums_to_the_replayed_span():
    from relakit.control import Clocks
    from relakit.openloop import replay, sweep_thresholds

    trace = ROOT / "data" / "traces" / "step-errors.csv"
    whole = replay(trace, RELA, Clocks())
    lo, hi = float(pl.read_csv(trace)["time_s"].min()), float(pl.read_csv(trace)["time_s"].max())
    spent = whole.time_in_mode()
    assert sum(spent.values()) == pytest.approx(hi - lo, abs=1e-6)
    assert spent["survival"] > 0
    part = replay(trace, RELA, Clocks(), start_s=101.0, end_s=400.0).time_in_mode()
    assert sum(part.values()) == pytest.approx(299.0, abs=1e-6)
    swept = sweep_thresholds(trace, RELA, Clocks(), {"overloaded": [300.0, 1e9]})
    totals = swept.select(pl.sum_horizontal(pl.col("^time_in_.*_s$")))[:, 0].to_numpy()
    assert np.allclose(totals, hi - lo)
    same = swept.filter(pl.col("overloaded") == 300.0)
    pol = relakit_policy_with(overloaded=300.0)
    assert same["time_in_survival_s"][0] == pytest.approx(
        replay(trace, pol, Clocks()).time_in_mode()["survival"])


def relakit_policy_with(**thresholds):
    from relakit.control import load_policy

    return load_policy(RELA).with_thresholds(**thresholds)


def test_simulate_prints_time_in_each_mode_that_adds_up(tmp_path, capsys):
    path = tmp_path / "ramp.yaml"
    path.write_text(yaml.safe_dump(_ramp(120)))
    assert main(["simulate", str(path), "--no-requests", "--out", str(tmp_path / "o")]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines()
                if x.startswith("time in each mode:"))
    parts = re.findall(r"(\w+) (\d+\.\d) s", line)
    assert {name for name, _ in parts} >= {"normal", "survival", "performance"}
    assert line.endswith("(120.0 s in all)")


def test_lab_load_prints_its_outcomes_as_a_table_by_tier():
    from relakit.lab.lifecycle import outcome_counts

    recs = pl.DataFrame({"tier": ["gold", "bronze", "bronze", "silver", "bronze"],
                         "outcome": ["ok", "dropped", "ok", "timeout", "dropped"]})
    lines = outcome_counts(recs).splitlines()
    header = lines[0].split()
    assert header == ["tier", "ok", "error", "timeout", "dropped", "requests"]
    rows = {x.split()[0]: [int(v) for v in x.split()[1:]] for x in lines[1:]}
    assert rows == {"gold": [1, 0, 0, 0, 1], "silver": [0, 0, 1, 0, 1],
                    "bronze": [1, 0, 0, 2, 3]}
