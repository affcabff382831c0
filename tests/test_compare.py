"""relakit.compare and `relakit compare`: A, B and the paired difference, CRN or not."""

from __future__ import annotations

import json

import polars as pl
import pytest
import yaml
from conftest import make_scenario

import relakit
from relakit.cli import main
from relakit.comparison import COLUMNS
from relakit.replications import replication_seeds


def _hedged(delay_ms: float) -> dict:
    """Four nodes of two servers at 50 % load (about 60 % with the hedges), hedging
    after ``delay_ms``."""
    sc = make_scenario(rate=400.0, duration=30.0, nodes=4, servers=2, warmup=2.0, seed=5)
    sc["mitigations"] = {"hedge": {"delay_ms": delay_ms, "cancel": "queued"}}
    sc["controls"] = {"hedge_enabled": True}
    return sc


@pytest.fixture(scope="module")
def paired():
    return relakit.compare(_hedged(20.0), _hedged(40.0), replications=6, workers=1)


def test_the_table_has_every_tier_and_number_with_clear_columns(paired):
    t = paired.table
    assert tuple(t.columns) == COLUMNS
    assert t["tier"].unique(maintain_order=True).to_list() == ["gold", "silver", "bronze", "all"]
    r = paired.row("all", "mean_ms")
    assert r["pairs"] == 6
    assert r["difference"] == pytest.approx(r["b"] - r["a"])
    assert r["difference_low"] < r["difference"] < r["difference_high"]
    assert r["a_ci"] > 0 and r["b_ci"] > 0 and r["difference_ci"] > 0
    a_runs = paired.a.runs.filter(pl.col("tier") == "all")["mean_ms"]
    assert r["a"] == pytest.approx(a_runs.mean())
    assert paired.a.seeds == paired.b.seeds == replication_seeds(5, 6)
    text = paired.format()
    assert "±" in text and "common random numbers" in text


def test_independent_seeds_come_from_another_part_of_the_spawn():
    c = relakit.compare(_hedged(20.0), _hedged(40.0), replications=3, workers=1, crn=False)
    both = replication_seeds(5, 6)
    assert c.a.seeds == both[:3] and c.b.seeds == both[3:]
    assert not set(c.a.seeds) & set(c.b.seeds)


# NOT SILENT: on branch `reps` the kernel still draws everything from one stream, and
# this test measured a ratio of 0.95 (CRN 0.162 ms, independent 0.155 ms). It must pass
# once the stream split (issue 13 part 3, another branch) is merged; strict=True makes
# it fail loudly then (XPASS) until this mark is removed.
def test_common_random_numbers_narrow_the_paired_interval_threefold():
    """The issue's CRN proof: two hedge delays on one scenario; the paired interval of
    the mean response with common random numbers is >= 3x narrower than with
    independent seeds. This needs the kernel's random streams split by purpose
    (arrivals, service, hedge targets...): with one shared stream a hedge that fires
    in one run and not the other shifts every later draw, and the pairs decorrelate."""
    a, b = _hedged(20.0), _hedged(40.0)
    crn = relakit.compare(a, b, replications=10, workers=2, crn=True)
    ind = relakit.compare(a, b, replications=10, workers=2, crn=False)
    w_crn = crn.row("all", "mean_ms")["difference_ci"]
    w_ind = ind.row("all", "mean_ms")["difference_ci"]
    print(f"paired half-width: CRN {w_crn:.4f} ms, independent {w_ind:.4f} ms, "
          f"ratio {w_ind / w_crn:.2f}; variance ratio with CRN "
          f"{crn.row('all', 'mean_ms')['variance_ratio']:.2f}")
    assert w_ind / w_crn >= 3.0


def test_the_command_line_prints_intervals_and_writes_both_files(tmp_path, capsys):
    pa, pb = tmp_path / "a.yaml", tmp_path / "b.yaml"
    pa.write_text(yaml.safe_dump(_hedged(20.0)))
    pb.write_text(yaml.safe_dump(_hedged(40.0)))
    code = main(["compare", str(pa), str(pb), "--replications", "3", "--workers", "1",
                 "--out", str(tmp_path / "cmp")])
    out = capsys.readouterr().out
    assert code == 0
    assert "±" in out and "B - A" in out
    table = pl.read_parquet(tmp_path / "cmp" / "compare.parquet")
    assert tuple(table.columns) == COLUMNS and table.height > 0
    doc = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert doc["info"]["replications"] == 3 and doc["info"]["crn"] is True
    assert len(doc["rows"]) == table.height


def test_a_comparison_of_one_replication_is_refused():
    with pytest.raises(ValueError, match="at least 2"):
        relakit.compare(_hedged(20.0), _hedged(40.0), replications=1)
