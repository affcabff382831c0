"""Figures: what each chart is fed and how it is drawn (frames and Vega-Lite specs),
the `relakit figures` command, and the Makefile's `figures` target."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from relakit import plots
from relakit.cli import main
from relakit.experiment import simulate
from relakit.scenario import load_scenario
from relakit.sim.results import SimulationResult
from relakit.vocab import IN_PATH_OUTCOMES

ROOT = Path(__file__).resolve().parents[1]
LAB_STEP = ROOT / "params" / "scenarios" / "lab-step.yaml"  # 25 s, RelA's policy


def _requests(rows) -> pl.DataFrame:
    """A requests table from (arrival_s, tier, outcome, latency_ms) rows."""
    return pl.DataFrame(rows, schema=["arrival_s", "tier", "outcome", "latency_ms"],
                        orient="row")


@pytest.fixture(scope="module")
def policy_run(tmp_path_factory) -> Path:
    """A short closed-loop run (RelA's policy) written as `relakit simulate` writes it."""
    out = tmp_path_factory.mktemp("run") / "lab-step"
    assert main(["simulate", str(LAB_STEP), "--out", str(out)]) == 0
    return out


def _panels(spec: dict) -> list[dict]:
    return spec["vconcat"]


def _title(panel: dict) -> str:
    t = panel.get("title")
    return t["text"] if isinstance(t, dict) else t


def test_outcome_shares_sum_to_one_in_every_bin_after_imputation():
    # bin 0: ok and error; bin 1: only timeouts; bin 2 (gold): only dropped
    req = _requests([(1.0, "gold", "ok", 5.0), (2.0, "gold", "error", 1.0),
                     (3.0, "silver", "ok", 5.0), (12.0, "gold", "timeout", 100.0),
                     (13.0, "bronze", "timeout", 100.0), (25.0, "gold", "dropped", 0.0)])
    for by_tier in (False, True):
        df = plots.outcome_share_frame(plots.request_counts(req, 10.0), by_tier)
        keys = ["time_s", "tier"] if by_tier else ["time_s"]
        per_bin = df.group_by(keys).agg(pl.col("share").sum(), pl.col("outcome").n_unique())
        assert np.allclose(per_bin["share"].to_numpy(), 1.0)
        # zeros imputed, for every outcome but the in-path ones, which this run has not
        assert (per_bin["outcome"] == len(plots.OUTCOMES) - len(IN_PATH_OUTCOMES)).all()
    df = plots.outcome_share_frame(plots.request_counts(req, 10.0), by_tier=False)
    bin1 = {r["outcome"]: r["share"] for r in df.filter(pl.col("time_s") == 10.0).iter_rows(
        named=True)}
    assert bin1 == {"ok": 0.0, "error": 0.0, "timeout": 1.0, "dropped": 0.0}
    spec = plots.outcome_shares(req, 10.0, by_tier=False).to_dict()
    assert spec["encoding"]["y"]["stack"] == "normalize"


def test_latency_lines_have_nulls_at_empty_bins_and_break_there():
    # gold: successes in bins 0 and 2, none in bin 1 (only an error there)
    req = _requests([(1.0, "gold", "ok", 5.0), (2.0, "gold", "ok", 7.0),
                     (11.0, "gold", "error", 1.0), (21.0, "gold", "ok", 9.0)])
    df = plots.latency_frame(req, 10.0, duration_s=30.0)
    gold = df.filter(pl.col("tier") == "gold").sort("quantile", "time_s")
    assert gold.filter(pl.col("time_s") == 15.0)["latency_ms"].null_count() == 2  # p50, p99
    assert gold.filter(pl.col("time_s") != 15.0)["latency_ms"].null_count() == 0
    spec = plots.latency_over_time(req, 10.0, domain=(0.0, 30.0)).to_dict()
    mark = spec["mark"]
    assert mark["type"] == "line" and mark["invalid"].startswith("break-paths")
    values = next(iter(spec["datasets"].values()))
    assert any(v["latency_ms"] is None for v in values)  # the null reaches the chart


def test_palettes_never_give_one_colour_two_meanings():
    groups = {"outcome": set(plots.OUTCOME_COLORS.values()),
              "tier": set(plots.TIER_COLORS.values()),
              "mode": set(plots.MODE_COLORS.values()) | set(plots.MODE_EXTRA),
              "category": set(plots.CATEGORY),
              "lease": set(plots.LEASE_COLORS.values()), "outage": {plots.OUTAGE_COLOR},
              "alert": set(plots.ALERT_STATE_COLORS.values())}
    assert set(plots.VARIANT_COLORS) <= groups["category"]  # runs compared are series
    names = list(groups)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            assert not groups[a] & groups[b], (a, b, groups[a] & groups[b])
    assert len(set(plots.MODE_COLORS.values())) == len(plots.MODE_COLORS)
    # a policy's own mode names get colours outside every other palette
    cols = plots.mode_colors(["normal", "survival", "brownout", "panic"])
    assert cols["survival"] == plots.MODE_COLORS["survival"]
    assert cols["brownout"] != cols["panic"] and cols["brownout"] in plots.MODE_EXTRA


def test_mode_spans_cover_the_run_from_first_evaluation_to_its_end():
    tl = pl.DataFrame({"time_s": [0.0, 2.0, 4.0, 6.0, 8.0],
                       "mode": ["normal", "survival", "survival", "normal", "normal"]})
    spans = plots.mode_spans(tl, end_s=10.0)
    assert spans.to_dicts() == [{"mode": "normal", "start_s": 0.0, "end_s": 2.0},
                                {"mode": "survival", "start_s": 2.0, "end_s": 6.0},
                                {"mode": "normal", "start_s": 6.0, "end_s": 10.0}]
    spec = plots.mode_timeline(tl, domain=(0.0, 10.0)).to_dict()
    scale = spec["encoding"]["color"]["scale"]
    assert scale["range"] == [plots.MODE_COLORS[m] for m in scale["domain"]]


def test_dashboard_panels_share_one_time_axis_from_zero_to_the_run_end(policy_run):
    result = SimulationResult.read(policy_run)
    spec = plots.run_dashboard(result, bin_s=5.0).to_dict()
    assert spec["resolve"]["scale"]["x"] == "shared"
    panels = _panels(spec)
    titles = [_title(p) for p in panels]
    assert titles == ["Offered load", "Latency of successful requests", "Outcomes",
                      "Mode of the control plane", "Decisions"]
    domains = {t: p["encoding"]["x"]["scale"]["domain"] for t, p in zip(titles, panels,
                                                                         strict=True)}
    assert all(d == [0.0, 25.0] for d in domains.values()), domains
    for p in panels:  # axis titles are words with units, never a column name
        assert p["encoding"]["x"]["title"].endswith("(s)")
        assert "_" not in (p["encoding"]["y"].get("title") or "")


def test_offered_load_from_metrics_matches_the_requests_table(tmp_path):
    sc = load_scenario(LAB_STEP)
    full = simulate(sc)
    flat = simulate(sc, record_requests=False)
    a = plots.offered_load_frame(plots.request_counts(full.requests, 5.0), 5.0, 25.0)
    b = plots.offered_load_frame(plots.metric_counts(flat.metrics, 5.0), 5.0, 25.0)
    # the same run: arrivals per bin vs the clients' answers per bin (a few in flight)
    total_a = a.filter(pl.col("time_s") < 25.0)["rate_rps"].sum() * 5.0
    total_b = b.filter(pl.col("time_s") < 25.0)["rate_rps"].sum() * 5.0
    assert round(total_a) == full.requests.height
    assert abs(total_b - total_a) <= flat.info["in_flight_at_end"] + 1
    # the load step from 50 to 200 req/s at 5 s shows in both
    for df in (a, b):
        by_bin = df.group_by("time_s").agg(pl.col("rate_rps").sum())
        rate = dict(by_bin.iter_rows())
        assert 30 < rate[0.0] < 75 and 160 < rate[10.0] < 240, rate
    spec = plots.run_dashboard(flat).to_dict()
    titles = [_title(p) for p in _panels(spec)]
    assert "Latency of successful requests" not in titles and "Offered load" in titles
    assert "no per-request records" in spec["title"]["subtitle"]


def test_simulate_writes_a_timeline_that_read_gives_back(policy_run):
    names = {p.name for p in policy_run.iterdir()}
    assert names == {"requests.parquet", "metrics.parquet", "decisions.parquet",
                     "timeline.parquet", "summary.json"}
    r = SimulationResult.read(policy_run)
    assert r.timeline.columns[:2] == ["time_s", "mode"] and r.timeline.height == 26  # 0..25 s
    assert r.info["scenario"] == "lab-step"
    doc = json.loads((policy_run / "summary.json").read_text())
    assert r.summary.to_dicts() == doc["tiers"]
    with pytest.raises(FileNotFoundError, match="not a run folder"):
        SimulationResult.read(policy_run / "nowhere")


def test_a_chain_run_has_a_stress_timeline_and_its_panel():
    sc = load_scenario(ROOT / "params" / "scenarios" / "chain-swapped.yaml",
                       overrides={"duration_s": 100.0})
    r = simulate(sc, record_requests=False)
    assert r.timeline.columns == ["time_s", "working_nodes", "stress"]
    assert r.timeline.height == 51  # one row per evaluation: 0, 2, ..., 100 s
    assert set(r.timeline["stress"]) <= {"normal", "elevated", "critical", "catastrophic"}
    assert r.timeline["stress"][0] == "normal" and (r.timeline["stress"] != "normal").any()
    titles = [_title(p) for p in _panels(plots.run_dashboard(r).to_dict())]
    assert "Chain stress level" in titles and "Mode of the control plane" not in titles


def test_figures_checks_formats_before_writing_anything(policy_run, tmp_path, capsys):
    out = tmp_path / "figs"
    assert main(["figures", str(policy_run), "--out", str(out), "--formats", "png,jpg"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "'jpg'" in err and "png, svg, pdf" in err
    assert not out.exists()


def test_figures_writes_the_dashboard_and_latency_views(policy_run, tmp_path, capsys):
    out = tmp_path / "figs"
    assert main(["figures", str(policy_run), "--out", str(out), "--formats", "png,svg"]) == 0
    assert {p.name for p in out.iterdir()} == {
        "lab-step-dashboard.png", "lab-step-dashboard.svg", "lab-step-latency.png",
        "lab-step-latency.svg"}
    svg = (out / "lab-step-dashboard.svg").read_text()
    assert "Mode of the control plane" in svg and "Offered load" in svg
    assert main(["figures", str(tmp_path / "missing"), "--out", str(out)]) == 2


def test_make_figures_simulates_then_draws(tmp_path):
    """`make figures`' own recipe (figures-only), with a short scenario in a tmp dir."""
    run, figs = tmp_path / "run", tmp_path / "figs"
    cmd = ["make", "--no-print-directory", "-C", str(ROOT), "figures-only",
           f"FIGURES_SCENARIO={LAB_STEP}", f"FIGURES_RUN={run}", f"FIGURES_OUT={figs}",
           f"BIN={Path(sys.executable).parent}"]
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr
    assert "first: there is no run" in first.stdout and (run / "timeline.parquet").is_file()
    assert {p.name for p in figs.iterdir()} >= {"run-dashboard.png", "run-dashboard.pdf"}
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and f"drawing {run}: the run of" in again.stdout  # reused
    # Quick use's --no-requests run of the same scenario, or an edited scenario, is not
    # drawn as the figures' run: it is simulated again, and the output says why
    assert main(["simulate", str(LAB_STEP), "--no-requests", "--out", str(run)]) == 0
    third = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert "no per-request records" in third.stdout, third.stdout
    edited = tmp_path / "edited.yaml"
    edited.write_text(LAB_STEP.read_text().replace("seed: 7", "seed: 8").replace(
        "../policies/", str(LAB_STEP.parent.parent / "policies") + "/").replace(
        "../clocks/", str(LAB_STEP.parent.parent / "clocks") + "/"))
    fourth = subprocess.run([*cmd[:-4], f"FIGURES_SCENARIO={edited}", *cmd[-3:]],
                            capture_output=True, text=True, timeout=600)
    assert fourth.returncode == 0 and "made from other inputs" in fourth.stdout, fourth.stderr


def test_a_no_requests_dashboard_counts_on_the_sample_grid():
    """15 s samples drawn in 10 s bins put one or two samples' increments in a bin: the
    README's Quick use run (--no-requests) showed the ramp's offered load 1.5x too high.
    From metrics, bins are whole sample intervals, so a constant 400 req/s reads ~400."""
    sc = {"name": "grid", "duration_s": 300, "seed": 3,
          "workload": {"arrival": {"kind": "poisson", "rate_rps": 400}},
          "fleet": {"nodes": 2, "servers": 4, "service": {"kind": "exponential",
                                                          "mean_ms": 10}},
          "metrics": {"interval_s": 15}}
    flat = simulate(load_scenario(sc), record_requests=False)
    counts, source, bin_s = plots.run_counts(flat, 10.0)
    assert source == "metrics" and bin_s == 15.0
    frame = plots.offered_load_frame(counts, bin_s, 300.0)
    per_bin = frame.filter(pl.col("time_s") < 300).group_by("time_s").agg(
        pl.col("rate_rps").sum())["rate_rps"]
    assert per_bin.max() < 400 * 1.15 and per_bin.min() > 400 * 0.85, per_bin.to_list()
    # the panel says the bin it drew
    spec = plots.run_dashboard(flat).to_dict()
    assert "15 s bins" in json.dumps(spec)


def test_the_latency_panel_draws_the_range_its_data_has():
    """vega-lite's own log domain ended at the decade the p99 reached, so the line ran
    into the frame's edge; the axis now spans the data with room above it."""
    r = simulate(load_scenario(LAB_STEP))
    chart = plots.latency_over_time(r.requests, 5.0, domain=(0.0, 25.0))
    lo, hi = chart.to_dict()["encoding"]["y"]["scale"]["domain"]
    data = plots.latency_frame(r.requests, 5.0, (0.5, 0.99), 25.0)["latency_ms"].drop_nulls()
    assert lo <= data.min() and hi == pytest.approx(1.5 * data.max())  # room above the top
    assert math.log10(lo) == int(math.log10(lo)) and lo > data.min() / 10
    assert r.info["in_flight_at_end"] == 0
    assert "leaves out" not in json.dumps(plots.run_dashboard(r).to_dict())
    # an overloaded run ends with requests in flight: the load panel's last bin says so
    over = simulate(load_scenario({
        "name": "over", "duration_s": 5, "seed": 2,
        "workload": {"arrival": {"kind": "poisson", "rate_rps": 600}, "deadline_ms": 1000},
        "fleet": {"nodes": 1, "servers": 4, "service": {"kind": "exponential",
                                                        "mean_ms": 10}}}))
    left = over.info["in_flight_at_end"]
    assert left > 50
    assert f"leaves out the {left:,} requests" in json.dumps(plots.run_dashboard(over).to_dict())


def test_the_hedging_title_says_what_its_data_shows():
    """The title once said "near saturation only if the loser is cancelled" beside a
    cancelled-while-queued p99 of 4,840 ms against 272 ms without hedging."""
    h = pl.DataFrame({"load": [0.3] * 4 + [0.9] * 4,
                      "hedging": ["off", "never", "queued", "started"] * 2,
                      "p99_ms": [101.0, 20, 20, 20, 272, 26363, 4840, 22],
                      "p99_ms_ci": [0.0, 0, 0, 0, 60, 357, 341, 1]})
    assert plots.hedging_verdict(h) == ("Hedging helps at low load; at 90% load only with "
                                        "the loser cancelled even in service")
    assert plots.hedging_collapse(h).to_dict()["title"]["text"] == plots.hedging_verdict(h)
    # a difference inside the intervals is no win
    close = h.with_columns(pl.when((pl.col("hedging") == "started") & (pl.col("load") == 0.9))
                           .then(250.0).otherwise(pl.col("p99_ms")).alias("p99_ms"))
    assert plots.hedging_verdict(close).endswith("at 90% load no hedging policy does")
    assert plots.hedging_verdict(h.with_columns(pl.lit(500.0).alias("p99_ms"))).startswith(
        "Hedging does not help at low load")
