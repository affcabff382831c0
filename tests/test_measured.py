"""relakit.measured (replications measured from whole runs), the intervals it and the
notebooks use (prediction, binomial, quantile) and the banded series figure."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from conftest import ROOT
from scipy import stats as st

import relakit
from relakit import plots
from relakit.measured import (
    chain_measure,
    measure_runs,
    mode_entered_at,
    ok_share_per_bin,
    paired,
    paired_ratio,
    pm,
    step_measure,
    success_after,
    tier_latencies,
    tier_outcomes,
    tier_table,
    window_rates,
)
from relakit.replications import replication_seeds
from relakit.sim.results import SimulationResult
from relakit.stats import binomial_interval, prediction_interval, quantile_interval

SCEN = ROOT / "params" / "scenarios"
SHORT_SWAP = {"duration_s": 110}  # chain-swapped up to past node 2's fault at 90 s


# ---- intervals -----------------------------------------------------------------------------
def test_prediction_interval_by_hand_and_covers_one_more_draw():
    x = np.array([1.0, 2.0, 4.0, 7.0])
    iv = prediction_interval(x)
    half = st.t.ppf(0.975, 3) * x.std(ddof=1) * np.sqrt(1 + 1 / 4)
    assert iv.mean == pytest.approx(3.5) and iv.half_width == pytest.approx(half)
    assert np.isnan(prediction_interval([2.0]).half_width)
    # coverage: one new normal draw falls inside about 95 % of the time (not the 60 % a
    # confidence interval for the mean would give with n = 5)
    rng = np.random.default_rng(5)
    hits = sum(prediction_interval(rng.normal(size=5)).contains(rng.normal()) for _ in range(4000))
    assert 0.935 < hits / 4000 < 0.965


def test_binomial_interval_is_clopper_pearson():
    iv = binomial_interval(0, 12)
    assert iv.mean == 0.0 and iv.low == 0.0 and iv.high == pytest.approx(1 - 0.025 ** (1 / 12))
    iv = binomial_interval(12, 12)
    assert iv.high == 1.0 and iv.low == pytest.approx(0.025 ** (1 / 12))
    iv = binomial_interval(3, 10)
    assert iv.low == pytest.approx(st.beta.ppf(0.025, 3, 8))
    assert iv.high == pytest.approx(st.beta.ppf(0.975, 4, 7))
    for bad in ((5, 4), (-1, 4), (1, 0), (1.5, 4)):
        with pytest.raises(ValueError, match="successes and trials"):
            binomial_interval(*bad)


def test_quantile_interval_covers_the_true_quantile():
    rng = np.random.default_rng(2)
    truth = np.log(10.0)  # the 0.9 quantile of an exponential of mean 1
    hits = sum(quantile_interval(rng.exponential(size=200), 0.9).contains(truth)
               for _ in range(2000))
    assert 0.94 <= hits / 2000 <= 0.985  # exact order statistics: at least 95 %, a bit over
    iv = quantile_interval(np.arange(10.0), 0.9)  # too few values for a high end
    assert iv.low == 6.0 and np.isnan(iv.high) and np.isnan(iv.half_width)
    with pytest.raises(ValueError, match="q: must lie strictly between 0 and 1"):
        quantile_interval([1.0, 2.0], 1.0)


# ---- measure_runs -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def swapped_orders():
    """chain-swapped in its two orders, two replications each, on the same seeds."""
    measure = chain_measure(60, failing=[1, 2], bin_s=2.0)
    swapped = measure_runs(SCEN / "chain-swapped.yaml", measure, 2, overrides=SHORT_SWAP,
                           keep_first=True)
    designed = measure_runs(SCEN / "chain-swapped.yaml", measure, 2,
                            overrides={**SHORT_SWAP, "chain": "../chains/aegis.yaml",
                                       "chain.aegis.isolate_after": 3})
    return designed, swapped


def test_replication_i_is_simulate_on_its_seed(swapped_orders):
    _, swapped = swapped_orders
    sc = relakit.load_scenario(SCEN / "chain-swapped.yaml", overrides=SHORT_SWAP)
    seeds = replication_seeds(sc.seed, 2)
    assert swapped.seeds == seeds
    again = relakit.simulate(sc, seed=seeds[1])
    row = swapped.runs.filter(pl.col("replication") == 1).row(0, named=True)
    assert row["success_after"] == success_after(again, 60)
    assert row["errors"] == again.requests.filter(pl.col("outcome") == "error").height
    assert isinstance(swapped.first, SimulationResult)  # replication 0 kept whole
    assert swapped.first.info["seed"] == seeds[0]


def test_chain_measure_rows_and_tables(swapped_orders):
    designed, swapped = swapped_orders
    assert swapped.runs.height == 2 and list(swapped.runs["replication"]) == [0, 1]
    for o in swapped.values("order"):
        assert o.index("atlas") < o.index("aegis")
    for o in designed.values("order"):
        assert o.index("aegis") < o.index("atlas")
    assert all(x == ["node 1", "node 2"] for x in swapped.values("isolated"))
    # Atlas first reweights one evaluation (2 s) later, pair by pair
    for c in ("node 1 reweighted at (s)", "node 2 reweighted at (s)"):
        later = zip(designed.values(c), swapped.values(c), strict=True)
        assert [b - a for a, b in later] == [2.0, 2.0]
    sent = swapped.tables["sent_rps"]
    assert set(sent["replication"]) == {0, 1}
    # every 2 s bin of the run is there, empty ones as 0, so means over replications see it
    assert sent.filter(pl.col("replication") == 0).height == 55
    assert (sent["rps"] >= 0).all()
    err = swapped.tables["errors_so_far"].filter(pl.col("replication") == 0)
    assert (err["errors"].diff().drop_nulls() >= 0).all()
    assert err["errors"][-1] == swapped.values("errors")[0]
    summary = swapped.summary()
    assert summary["replications"][0] == 2 and "success_after_ci" in summary.columns


def test_paired_and_paired_ratio_pair_by_replication(swapped_orders):
    designed, swapped = swapped_orders
    d = paired(designed, swapped, "errors")
    diffs = np.array(swapped.values("errors"), float) - np.array(designed.values("errors"), float)
    assert d.interval.mean == pytest.approx(diffs.mean())
    r = paired_ratio(designed, swapped, "sent_to_failing")
    ratios = (np.array(swapped.values("sent_to_failing"), float)
              / np.array(designed.values("sent_to_failing"), float) - 1)
    assert r.mean == pytest.approx(ratios.mean()) and r.mean > 0  # Atlas first sends more
    other = measure_runs(SCEN / "lab-step.yaml", lambda r: {"errors": 0}, 2, seed=99,
                         record_requests=False)
    with pytest.raises(ValueError, match="different seeds"):
        paired(designed, other, "errors")
    with pytest.raises(KeyError, match="no measure 'nope'"):
        swapped.values("nope")


def test_measure_runs_rejects_bad_replications_and_record_less_measures():
    with pytest.raises(ValueError, match="replications: must be an integer >= 1"):
        measure_runs(SCEN / "chain-swapped.yaml", chain_measure(60), 0)
    with pytest.raises(ValueError, match="per-request records"):
        measure_runs(SCEN / "chain-swapped.yaml", chain_measure(60), 1,
                     overrides={"duration_s": 65}, record_requests=False)


def test_pm_formats_mean_and_half_width():
    from relakit.stats import t_interval

    assert pm(t_interval([1.0, 2.0, 3.0]), ".2f") == "2.00 ± 2.48"
    assert pm(t_interval([1.0]), ".1f") == "1.0"


# ---- the step measures (notebook 07) ------------------------------------------------------------
def test_step_measures_on_a_hand_made_record():
    req = pl.DataFrame({"start_s": [100.0, 105.5, 106.0, 107.9, 111.0, 112.0],
                        "tier": ["gold", "gold", "bronze", "bronze", "gold", "bronze"],
                        "outcome": ["ok", "ok", "timeout", "dropped", "ok", "dropped"]})
    w = window_rates(req, 5.0, 8.0, "start_s", 100.0)  # 105.5, 106, 107.9
    assert w == {"requests_per_s": 1.0, "ok": pytest.approx(1 / 3),
                 "timeout": pytest.approx(1 / 3)}
    tiers = tier_outcomes(req, 10.0, 12.0, "start_s", 100.0)
    t = {r["tier"]: r for r in tiers.iter_rows(named=True)}
    assert t["gold"]["ok"] == 1.0 and t["bronze"]["dropped"] == 1.0
    bins = ok_share_per_bin(req, 5.0, "start_s", 100.0)
    assert bins["t"].to_list() == [0.0, 5.0, 10.0]
    assert bins["ok_share"].to_list() == [1.0, pytest.approx(1 / 3), 0.5]
    dec = pl.DataFrame({"decided_at_s": [101.0, 103.0, 104.0],
                        "action": ["hold", "enter", "preempt"],
                        "mode": ["survival", "performance", "survival"]})
    assert mode_entered_at(dec, "survival", 100.0) == 4.0  # a hold is no entry
    assert np.isnan(mode_entered_at(dec, "alarm"))


def test_tier_numbers_give_nan_for_a_tier_with_no_request():
    """tier_outcomes and tier_latencies are one aggregation (tier_table): every tier in
    relakit.vocab's order; a tier with no request has requests 0 and NaN shares and
    quantiles (0 would read as "none answered ok")."""
    from relakit.vocab import OUTCOMES, TIERS

    req = pl.DataFrame({"t_s": [1.0, 2.0, 3.0, 4.0, 5.0, 0.5],
                        "tier": ["gold", "gold", "silver", "silver", "silver", "bronze"],
                        "outcome": ["ok", "error", "ok", "ok", "rejected", "ok"],
                        "latency_ms": [10.0, 99.0, 30.0, 50.0, 1.0, 7.0]})
    lat = tier_latencies(req, 1.0, "t_s")  # the bronze request started before 1 s
    assert list(lat) == [*TIERS, "all"]
    assert lat["gold"] == {"requests": 2, **{o: 0.0 for o in OUTCOMES}, "ok": 0.5,
                           "error": 0.5, "p50_ms": 10.0, "p99_ms": 10.0}
    assert lat["silver"]["rejected"] == pytest.approx(1 / 3)
    assert lat["silver"]["p50_ms"] == 40.0 and lat["silver"]["p99_ms"] == pytest.approx(49.8)
    assert lat["all"]["requests"] == 5 and lat["all"]["ok"] == pytest.approx(3 / 5)
    assert lat["all"]["p50_ms"] == 30.0  # the ok latencies 10, 30, 50
    assert lat["bronze"]["requests"] == 0
    assert all(np.isnan(v) for k, v in lat["bronze"].items() if k != "requests")
    out = tier_outcomes(req, 1.0, 5.0, "t_s")
    assert out["tier"].to_list() == list(TIERS)
    assert out.row(2) == ("bronze", pytest.approx(np.nan, nan_ok=True),
                          pytest.approx(np.nan, nan_ok=True))
    assert out.row(0) == ("gold", 0.5, 0.0)
    # with no latency column the shares alone; with no row at all every tier is NaN
    assert "p50_ms" not in tier_table(req.drop("latency_ms")).columns
    empty = tier_table(req.clear())
    assert empty["requests"].to_list() == [0] * 4 and empty["ok"].is_nan().all()


def test_step_measure_on_the_lab_scenario():
    runs = measure_runs(SCEN / "lab-step.yaml", step_measure(5.0), 2)
    assert set(runs.tables["ok_share"]["replication"]) == {0, 1}
    for x in runs.values("survival_after_step_s"):
        assert 0 < x < 10
    assert min(runs.values("gold_ok")) > 0.9 and min(runs.values("bronze_dropped")) > 0.9


# ---- the banded series figure -------------------------------------------------------------------
def test_compare_series_bands_draws_lines_and_unstacked_bands():
    t = np.arange(0.0, 20.0, 2.0)
    frame = pl.concat([pl.DataFrame({"chain": c, "time_s": t, "working": np.full(t.size, v),
                                     "working_ci": np.where(t == 10.0, 1.0, 0.0),
                                     "replications": 3})
                       for c, v in (("seed", 0.0), ("guarded", 2.0))])
    chart = plots.compare_series_bands(frame, "time_s", "working", "chain", title="t",
                                       x_title="time (s)", y_title="working nodes",
                                       interpolate="step-after")
    spec = chart.to_dict()
    marks = [layer["mark"]["type"] for layer in spec["layer"]]
    assert marks == ["area", "line"]
    area, line = spec["layer"]
    assert area["encoding"]["y"].get("stack", "absent") is None  # bands overlap, not stack
    # every layer can find its data (altair hoists shared data to the top otherwise)
    assert "data" in line or "data" in spec
    rows = spec["datasets"][area["data"]["name"]]
    low = {(r["chain"], r["time_s"]): r["_low"] for r in rows}
    assert low[("seed", 10.0)] == 0.0  # clipped at 0: no negative working nodes
    assert low[("guarded", 10.0)] == 1.0
    assert "95 % intervals over 3 replications" in spec["title"]["subtitle"]
    with pytest.raises(ValueError, match="working_ci"):
        plots.compare_series_bands(frame.drop("working_ci"), "time_s", "working", "chain",
                                   title="t", x_title="x", y_title="y")
