"""relakit.stats: unit checks against scipy and hand computations, then coverage.

The coverage tests are the proof that the intervals mean what they say: over
many independent M/M/c experiments, the nominal 95 % interval for the mean
response time must contain Erlang C's value in 93-97 % of them. Each also
runs a broken method on the same data (z instead of t with five
replications; the i.i.d. formula on autocorrelated observations; batches much
shorter than the correlation time) and checks that it fails, so the window
is known to discriminate.
"""

from __future__ import annotations

import ast
import time

import numpy as np
import pytest
from conftest import ROOT, make_scenario
from scipy import stats as st
from scipy.signal import lfilter

import relakit
from relakit.analytic import mmc
from relakit.stats import batch_means, mser5, paired_difference, t_interval


def test_stats_is_a_layer_on_numpy_and_scipy_only():
    # others (the replication runner, compare, figures) call it; it calls none of them
    tree = ast.parse((ROOT / "relakit" / "stats.py").read_text())
    mods = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    mods |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert {m.split(".")[0] for m in mods} <= {"__future__", "dataclasses", "numpy", "scipy"}


# ---- t_interval ----------------------------------------------------------------


def test_t_interval_matches_scipy():
    x = np.random.default_rng(3).normal(10.0, 2.0, 7)
    iv = t_interval(x, confidence=0.9)
    lo, hi = st.t.interval(0.9, len(x) - 1, loc=x.mean(), scale=st.sem(x))
    assert (iv.low, iv.high) == pytest.approx((lo, hi), rel=1e-12)
    assert iv.mean == pytest.approx(x.mean())
    assert iv.half_width == pytest.approx((hi - lo) / 2)
    assert iv.n == 7 and iv.confidence == 0.9
    # by hand: t_{0.975, 3} = 3.182446...
    iv = t_interval([1.0, 2.0, 3.0, 4.0])
    assert iv.half_width == pytest.approx(3.182446305 * np.std([1, 2, 3, 4], ddof=1) / 2, rel=1e-9)


def test_t_interval_edge_cases():
    one = t_interval([5.0])
    assert one.mean == 5.0 and one.n == 1
    assert np.isnan(one.half_width) and np.isnan(one.low) and np.isnan(one.high)
    assert not one.contains(5.0)  # an unknown width contains nothing
    flat = t_interval([2.0, 2.0, 2.0])
    assert flat.half_width == 0.0 and flat.contains(2.0)
    for bad, msg in [([], "empty"), ([1.0, np.nan], "nan"), ([[1.0, 2.0]], "1-D")]:
        with pytest.raises(ValueError, match=msg):
            t_interval(bad)
    with pytest.raises(ValueError, match="confidence"):
        t_interval([1.0, 2.0], confidence=95)


# ---- mser5 -----------------------------------------------------------------------


def _mser5_by_hand(x):
    """The definition, one candidate at a time (what the vectorised version must equal)."""
    m = len(x) // 5
    z = x[: 5 * m].reshape(m, 5).mean(axis=1)
    stats_ = [np.sum((z[d:] - z[d:].mean()) ** 2) / (m - d) ** 2 for d in range((m + 1) // 2)]
    return 5 * int(np.argmin(stats_))


def test_mser5_equals_its_definition():
    rng = np.random.default_rng(5)
    for n in (10, 11, 99, 1003, 5000):
        x = rng.exponential(1.0, n) + 3.0 * np.exp(-np.arange(n) / (n / 8))
        assert mser5(x) == _mser5_by_hand(x)
    assert mser5([1.0, 2.0, 3.0]) == 0  # fewer than two batches of 5: nothing to choose


def test_mser5_finds_a_step_exactly():
    x = np.concatenate([np.full(1000, 10.0), np.random.default_rng(1).normal(0.0, 0.1, 9000)])
    assert mser5(x) == 1000


def test_mser5_finds_a_decaying_transient():
    # A planted initial bias 4 exp(-i / 300) on stationary AR(1) noise (phi = 0.5, unit
    # variance), 40 000 observations. The bias falls below a tenth of the noise sd by
    # i = 300 ln 40 ~ 1100. Tolerance: every cut lies in [400, 2500], and over 20 series
    # the truncated mean is off by less than a third of the untruncated bias (0.03).
    n, phi = 40000, 0.5
    bias = 4.0 * np.exp(-np.arange(n) / 300.0)
    cuts, kept, whole = [], [], []
    for seed in range(20):
        rng = np.random.default_rng(seed)
        e = rng.normal(0.0, np.sqrt(1 - phi**2), n)
        noise = lfilter([1.0], [1.0, -phi], e, zi=[phi * rng.normal()])[0]  # starts stationary
        x = 5.0 + bias + noise
        cut = mser5(x)
        cuts.append(cut)
        kept.append(x[cut:].mean() - 5.0)
        whole.append(x.mean() - 5.0)
    cuts = np.array(cuts)
    assert np.all((cuts >= 400) & (cuts <= 2500)), cuts
    assert np.mean(whole) == pytest.approx(4.0 * 300 / n, abs=0.01)  # the bias is there
    assert abs(np.mean(kept)) < 0.01


# ---- batch_means -----------------------------------------------------------------


def test_batch_means_by_hand():
    x = np.arange(107, dtype=float)
    r = batch_means(x, batches=10, warmup=3)
    # 104 left after 3 deleted; 10 batches of 10 use 100; the other 4 go from the front
    assert (r.warmup, r.batches, r.batch_size) == (7, 10, 10)
    means = x[7:].reshape(10, 10).mean(axis=1)
    ref = t_interval(means)
    assert r.interval == ref
    dev = means - means.mean()
    assert r.lag1 == pytest.approx(np.sum(dev[:-1] * dev[1:]) / np.sum(dev**2))


def test_batch_means_auto_uses_mser5():
    x = np.concatenate([np.full(500, 50.0), np.random.default_rng(2).normal(1.0, 1.0, 20000)])
    r = batch_means(x, batches=20, warmup="auto")
    assert r.warmup == 500 and r.batch_size == 1000
    assert r.interval.contains(1.0)
    kept = batch_means(x, batches=20).interval  # the transient left in: biased, and wide
    assert kept.mean > 2.0 and kept.half_width > 10 * r.interval.half_width


def test_batch_means_rejects_bad_arguments():
    x = np.ones(100)
    with pytest.raises(ValueError, match="batches"):
        batch_means(x, batches=1)
    with pytest.raises(ValueError, match="batches"):
        batch_means(x, batches=2.5)
    with pytest.raises(ValueError, match="warmup"):
        batch_means(x, warmup="mser")
    with pytest.raises(ValueError, match="warmup"):
        batch_means(x, warmup=-1)
    with pytest.raises(ValueError, match="too few"):
        batch_means(x, batches=20, warmup=90)


# ---- paired_difference -------------------------------------------------------------


def test_paired_difference_by_hand():
    rng = np.random.default_rng(4)
    common = rng.normal(100.0, 10.0, 12)
    a = common + rng.normal(0.0, 1.0, 12)
    b = common - 2.0 + rng.normal(0.0, 1.0, 12)
    p = paired_difference(a, b)
    assert p.interval == t_interval(a - b)
    assert (p.mean_a, p.mean_b) == pytest.approx((a.mean(), b.mean()))
    ratio = (np.var(a, ddof=1) + np.var(b, ddof=1)) / np.var(a - b, ddof=1)
    assert p.variance_ratio == pytest.approx(ratio)
    assert p.variance_ratio > 20  # a shared component of sd 10 against noise of sd 1.4
    # the paired t test's p-value agrees with the interval excluding zero
    assert st.ttest_rel(a, b).pvalue < 0.05 and p.interval.low > 0


def test_paired_difference_edges():
    assert np.isnan(paired_difference([1.0], [2.0]).variance_ratio)
    assert paired_difference([1.0, 2.0, 3.0], [0.0, 1.0, 2.0]).variance_ratio == float("inf")
    with pytest.raises(ValueError, match="equal lengths"):
        paired_difference([1.0, 2.0], [1.0])


def test_paired_difference_columns_say_whether_zero_is_inside():
    far = paired_difference([5.0, 6.0, 7.0, 6.5], [1.0, 1.5, 2.5, 2.0]).columns()
    assert far["significant"] is True and far["difference_low"] > 0
    assert far["difference"] == pytest.approx(4.375)
    near = paired_difference([1.0, 2.0, 3.0, 1.0], [2.0, 1.0, 2.0, 2.5]).columns()
    assert near["significant"] is False and near["difference_low"] < 0 < near["difference_high"]
    assert paired_difference([1.0], [2.0]).columns()["significant"] is None  # one pair


def test_an_interval_that_excludes_zero_never_reads_as_one_that_does_not():
    """Notebook 11 printed a paired difference of 0.0004 +- 0.0002 as '+0.000 +- 0.000'
    and counted it better: the digits follow the half-width's first significant one."""
    from relakit.stats import interval_text

    d = paired_difference([0.9450, 0.9460, 0.9440, 0.9447, 0.9462],
                          [0.9446, 0.9455, 0.9437, 0.9444, 0.9457])
    assert d.significant and d.interval.half_width < 0.0005
    text = interval_text(d.interval.mean, d.interval.half_width, 3, signed=True)
    mean, half = (float(x) for x in text.split(" ± "))
    assert text.startswith("+0.000") and mean - half > 0, text  # its low end above 0, as shown
    assert interval_text(-0.276, 0.02, 3, signed=True) == "-0.276 ± 0.020"  # 3 enough: kept
    # rounded to the half-width's digit it would touch 0: one more digit
    assert interval_text(-0.0024, 0.0018, 3, signed=True) == "-0.0024 ± 0.0018"
    assert interval_text(0.0015, 0.0016, 3) == "0.002 ± 0.002"  # includes 0, and reads so
    assert interval_text(0.0, 0.0, 3, signed=True) == "+0.000 ± 0.000"  # a true zero stays
    assert interval_text(4017.2, 45.1, 0) == "4017 ± 45"
    assert interval_text(0.5, float("nan")) == "0.500"  # one run: no half-width
    assert interval_text(0.00096, 0.0) == "0.0010 ± 0.0000"  # a constant difference: the mean's


# ---- coverage against Erlang C -------------------------------------------------------
#
# The point: M/M/8 at rho = 0.8 (mmc-demo's shape) with 1 ms mean service (6400 req/s),
# Erlang C mean response 1.2860 ms. Each run starts empty; requests are those answered "ok" and
# arriving in the measured window; the run goes on 50 ms past the window so every one
# of them has finished (P(R > 50 ms) ~ e^-40).

SERVERS, RHO, MU = 8, 0.8, 1000.0
LAM = RHO * SERVERS * MU
TAIL_S = 0.05


def _exact_ms() -> float:
    return mmc(LAM, MU, SERVERS).mean_response * 1e3


def _seeds(seed: int, n: int) -> list[int]:
    """n independent replication seeds, as the replication runner derives them."""
    return [int(s.generate_state(1, np.uint64)[0] >> np.uint64(1))
            for s in np.random.SeedSequence(seed).spawn(n)]


def _responses_ms(scenario: dict, seed: int, start_s: float, end_s: float) -> np.ndarray:
    """Response times (ms) of the ok requests arriving in [start_s, end_s), by arrival."""
    req = relakit.simulate(scenario, seed=seed).requests
    req = req.filter((req["outcome"] == "ok") & (req["arrival_s"] >= start_s)
                     & (req["arrival_s"] < end_s)).sort("arrival_s")
    return req["latency_ms"].to_numpy()


def _mmc_scenario(end_s: float) -> dict:
    return make_scenario(rate=LAM, duration=end_s + TAIL_S, servers=SERVERS,
                         service={"kind": "exponential", "mean_ms": 1e3 / MU},
                         interval=end_s + TAIL_S)


# 400 intervals, each from 5 replications of 0.2 s warm-up (1280 requests, 18
# relaxation times 1/(c mu (1 - sqrt(rho))^2) = 11 ms) and 2 s measured (12 800
# requests): 2000 runs. The run means are right-skewed (skewness ~0.5), so misses
# fall mostly below; with shorter runs (M/M/4, 6400 requests) coverage sank to 0.93.
# Measured at this seed: t 0.953, z 0.885 (52-78 s wall; ~30 s since the requests tables'
# word columns are gathered in polars).
REP_SEED, REP_K, REP_INTERVALS, WARM_S, RUN_S = 1301, 5, 400, 0.2, 2.0


def test_replication_t_interval_covers_erlang_c():
    exact = _exact_ms()
    sc = _mmc_scenario(WARM_S + RUN_S)
    wall = time.perf_counter()
    means = np.array([_responses_ms(sc, s, WARM_S, WARM_S + RUN_S).mean()
                      for s in _seeds(REP_SEED, REP_K * REP_INTERVALS)])
    wall = time.perf_counter() - wall
    groups = means.reshape(REP_INTERVALS, REP_K)
    ivs = [t_interval(g) for g in groups]
    cover = np.mean([iv.contains(exact) for iv in ivs])
    # the broken method on the same replications: normal quantile at n = 5
    z_half = st.norm.ppf(0.975) * groups.std(axis=1, ddof=1) / np.sqrt(REP_K)
    cover_z = np.mean(np.abs(groups.mean(axis=1) - exact) <= z_half)
    print(f"replications: coverage t {cover:.3f}, z {cover_z:.3f}, "
          f"mean half-width {np.mean([iv.half_width for iv in ivs]):.4f} ms, wall {wall:.1f} s")
    assert 0.93 <= cover <= 0.97
    assert cover_z < 0.92  # P(|T_4| < 1.96) = 0.878
    # the warm-up did its job: the grand mean is within 0.5 % of Erlang C
    assert means.mean() == pytest.approx(exact, rel=0.005)


# 400 single runs of 200 000 requests (31 s), each starting empty, MSER-5 warm-up,
# 20 batches of 10 000 requests. Exploration on other seeds found 10, 20 and 30
# batches alike (lag1 of the batch means ~ -1/b, i.e. uncorrelated); what decides
# coverage is run length. Coverage of 20 batches at 50k / 100k / 150k / 200k requests:
# 0.905 / 0.92 / 0.94 / 0.97 (seed 779); 100k gave 0.95 and 0.935 on two other seeds.
# The misses of short runs fall mostly below Erlang C: a run whose congestion
# episodes were mild has both a low mean and a small spread between its batches.
# Measured at this seed: 0.940; naive i.i.d. 0.352; 2000 batches 0.870, lag1 0.30
# (90-160 s wall while building the requests tables' word columns took most of it; ~31 s
# since results.requests_table gathers them in polars).
BM_SEED, BM_RUNS, BM_REQUESTS, BM_BATCHES = 1302, 400, 200_000, 20


def test_batch_means_cover_erlang_c_within_single_runs():
    exact = _exact_ms()
    run_s = BM_REQUESTS / LAM
    sc = _mmc_scenario(run_s)
    wall = time.perf_counter()
    series = [_responses_ms(sc, s, 0.0, run_s) for s in _seeds(BM_SEED, BM_RUNS)]
    wall = time.perf_counter() - wall
    res = [batch_means(x, batches=BM_BATCHES, warmup="auto") for x in series]
    cover = np.mean([r.interval.contains(exact) for r in res])
    lag1 = np.mean([r.lag1 for r in res])
    cuts = np.array([r.warmup for r in res])
    # broken 1: the i.i.d. formula on the autocorrelated observations themselves
    pairs = list(zip(series, res, strict=True))
    naive = np.mean([t_interval(x[r.warmup:]).contains(exact) for x, r in pairs])
    # broken 2: batches of ~100 requests, shorter than the correlation time; lag1 says so
    short = [batch_means(x, batches=2000, warmup=r.warmup) for x, r in pairs]
    cover_short = np.mean([r.interval.contains(exact) for r in short])
    lag1_short = np.mean([r.lag1 for r in short])
    print(f"batch means: coverage {cover:.3f} (lag1 {lag1:.3f}, median cut {np.median(cuts):.0f}), "
          f"naive i.i.d. {naive:.3f}, 2000 batches {cover_short:.3f} (lag1 {lag1_short:.3f}), "
          f"wall {wall:.1f} s")
    assert 0.93 <= cover <= 0.97
    assert abs(lag1) < 0.1  # batches long enough: their means are nearly uncorrelated
    assert naive < 0.6
    assert cover_short < 0.9 and lag1_short > 0.2


def test_chance_misses_against_the_binomial_by_hand():
    """The misses a family of correct 95 % intervals shows by chance, counted term by term
    (math.comb), against chance_misses; the figures notebooks 01 and 02 quote."""
    from math import comb

    from relakit.stats import chance_misses

    def tail(k, a, p=0.05):  # P(more than a of k miss)
        return sum(comb(k, j) * p ** j * (1 - p) ** (k - j) for j in range(a + 1, k + 1))

    for k in (1, 2, 4, 12, 15, 40):
        m = chance_misses(k)
        assert m.p_any == pytest.approx(tail(k, 0), abs=1e-12)
        assert m.p_more == pytest.approx(tail(k, m.allowed), abs=1e-12)
        assert m.p_more <= 0.05 + 1e-12  # no more misses than allowed: rare
        assert m.allowed == 0 or tail(k, m.allowed - 1) > 0.05 + 1e-12  # and the fewest such
    assert (chance_misses(12).allowed, round(100 * chance_misses(12).p_any)) == (2, 46)
    assert (chance_misses(15).allowed, round(100 * chance_misses(15).p_more)) == (2, 4)
    for bad in (0, 2.5, -3):
        with pytest.raises(ValueError, match="intervals"):
            chance_misses(bad)
    with pytest.raises(ValueError, match="level"):
        chance_misses(12, level=1.0)
