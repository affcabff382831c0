"""Prometheus rule files through the command line and as relakit policies (issue 15)."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from relakit.cli import main
from relakit.control.rules import backtest_rules

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "data" / "traces" / "step-errors.csv"
RULES = ROOT / "params" / "rules" / "slo.yml"


def test_replay_rules_alone_writes_the_alerts_of_backtest_rules(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["replay", str(TRACE), "--rules", str(RULES), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    written = pl.read_parquet(out / "alerts.parquet")
    expected = backtest_rules(TRACE, RULES)
    assert written.equals(expected)
    assert written.filter(pl.col("firing_at").is_not_null()).height > 0  # the trace breaches
    for row in expected.iter_rows(named=True):
        assert row["alert"] in printed
    assert not (out / "decisions.parquet").exists()  # no policy, no chain: no decisions


def test_replay_rules_respects_start_and_end_and_runs_beside_a_policy(tmp_path, capsys):
    out = tmp_path / "out"
    policy = ROOT / "params" / "policies" / "rela.yaml"
    assert main(["replay", str(TRACE), "--rules", str(RULES), "--policy", str(policy),
                 "--start", "0", "--end", "500", "--out", str(out)]) == 0
    written = pl.read_parquet(out / "alerts.parquet")
    assert written.equals(backtest_rules(TRACE, RULES, 0.0, 500.0))
    full = backtest_rules(TRACE, RULES)
    # the slow burn goes pending at 480 s and fires at 600 s: within 500 s it only pends
    assert full.filter(pl.col("alert") == "ErrorBudgetSlowBurn")["firing_at"].to_list() == [600.0]
    assert written.filter(pl.col("alert") == "ErrorBudgetSlowBurn")["firing_at"].to_list() == [None]
    assert written["pending_at"].max() <= 500.0
    assert (out / "decisions.parquet").exists()


def test_replay_bad_rule_file_is_one_line_and_writes_nothing(tmp_path, capsys):
    bad = tmp_path / "bad.yml"
    bad.write_text("groups:\n  - name: g\n    rules:\n      - alert: A\n        expr: "
                   "topk(2, x) > 1\n")
    out = tmp_path / "out"
    assert main(["replay", str(TRACE), "--rules", str(bad), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"relakit: error: {bad}: key 'groups[0].rules[0].expr':")
    assert "\n" not in err
    assert not out.exists()


def test_replay_needs_something_to_run(tmp_path, capsys):
    assert main(["replay", str(TRACE), "--out", str(tmp_path / "o")]) == 2
    assert "--rules" in capsys.readouterr().err
