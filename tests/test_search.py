"""relakit.search: a search beats the shipped policy with a paired interval, and a killed
search resumes without running a finished trial again."""

from __future__ import annotations

import polars as pl
import pytest
import yaml
from conftest import ROOT

import relakit
import relakit.counterfactual.run as search_run
from relakit.counterfactual import load_search, sentence
from relakit.validate import ScenarioError

METASTABLE = ROOT / "params" / "scenarios" / "metastable.yaml"
TINY = ROOT / "tests" / "bad_inputs" / "scenarios" / "with-policy.yaml"


def _write(tmp_path, spec: dict):
    path = tmp_path / "search.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def test_a_search_over_five_keys_beats_the_shipped_policy_on_the_metastable_spike(tmp_path):
    """The metastable spike, shortened, closed loop with RelA's shipped policy (the
    incumbent); five policy and clock keys searched. The best front member's gold
    success is above the incumbent's with a paired interval (CRN) excluding zero."""
    spec = _write(tmp_path, {
        "name": "meta", "scenario": str(METASTABLE),
        "base": {"duration_s": 80, "workload.arrival.start_s": 15,
                 "policy": str(ROOT / "params" / "policies" / "rela.yaml"),
                 "clocks": {"scrape_s": 1, "window_s": 5, "eval_s": 1, "poll_s": 1}},
        "space": {"policy.conditions.overloaded.threshold": {"low": 40, "high": 400,
                                                             "log": True},
                  "policy.modes.0.enter_after": {"low": 1, "high": 5, "step": 1},
                  "policy.modes.0.exit_after": {"low": 1, "high": 10, "step": 1},
                  "policy.modes.0.min_dwell_s": {"low": 5, "high": 60, "step": 5},
                  "clocks.window_s": {"choices": [3, 5, 10]}},
        "objectives": [{"number": "gold.success_ratio", "direction": "max"},
                       {"number": "dropped_share", "direction": "min"}],
        "replications": 3, "seed": 2, "trials": 6})
    res = relakit.search(spec, tmp_path / "out", workers=1, notice=lambda line: None)
    assert res.trials.height == 6 and len(load_search(spec).space) == 5
    best = res.best("gold.success_ratio")
    d = res.difference(best["trial"], "gold.success_ratio")
    inc = res.info["incumbent"]["gold.success_ratio"]["mean"]
    assert d["value"] > inc and d["difference_low"] > 0, d
    assert d["better"] and d["significant"]
    # the front's files: the member's policy is the shipped policy with its values in place
    pol = yaml.safe_load((tmp_path / "out" / "front" / f"trial-{best['trial']}" /
                          "policy.yaml").read_text())
    want = best["param.policy.conditions.overloaded.threshold"]
    assert pol["conditions"]["overloaded"]["threshold"] == pytest.approx(want)
    assert pol["modes"][0]["enter_after"] == best["param.policy.modes.0.enter_after"]
    clk = yaml.safe_load((tmp_path / "out" / "front" / f"trial-{best['trial']}" /
                          "clocks.yaml").read_text())
    assert clk["window_s"] == best["param.clocks.window_s"]
    # the tables on disk are the ones returned; the sentence carries the numbers
    on_disk = pl.read_parquet(tmp_path / "out" / "incumbent.parquet")
    row = on_disk.filter((pl.col("trial") == best["trial"])
                         & (pl.col("number") == "gold.success_ratio")).row(0, named=True)
    assert row["difference"] == pytest.approx(d["difference"])
    text = sentence(res)
    assert f"{100 * d['value']:.1f}" in text and f"{100 * inc:.1f}" in text


def _tiny_spec(tmp_path, **extra):
    return _write(tmp_path, {
        "name": "tiny", "scenario": str(TINY),
        "space": {"policy.conditions.slow.threshold": {"low": 20, "high": 400, "log": True},
                  "policy.modes.0.enter_after": {"low": 1, "high": 4, "step": 1},
                  "clocks.window_s": {"choices": [2, 3, 4]}},
        "objectives": [{"number": "all.success_ratio", "direction": "max"},
                       {"number": "mode_changes", "direction": "min"}],
        "replications": 2, "seed": 5, "trials": 4, **extra})


def test_a_killed_search_resumes_without_repeating_finished_trials(tmp_path, monkeypatch):
    spec = _tiny_spec(tmp_path)
    out = tmp_path / "out"
    calls = []
    real = search_run.run_replication

    def counted(*args):
        calls.append(args)
        if fail_at and len(calls) == fail_at:
            raise KeyboardInterrupt  # killed halfway through the second batch
        return real(*args)

    monkeypatch.setattr(search_run, "run_replication", counted)
    fail_at = 0
    first = relakit.search(spec, out, workers=1, batch=2, stop_after=1, notice=print)
    assert first.trials.height == 2
    assert len(calls) == 2 + 2 * 2  # the incumbent's 2 replications, then 2 trials x 2
    done = first.trials.sort("trial")
    fail_at = len(calls) + 3  # the next batch dies in its second trial
    with pytest.raises(KeyboardInterrupt):
        relakit.search(spec, out, workers=1, batch=2, notice=print)
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend
    from optuna.trial import TrialState

    storage = JournalStorage(JournalFileBackend(str(out / "study.journal")))
    study = optuna.load_study(study_name="tiny", storage=storage)
    running = study.get_trials(states=(TrialState.RUNNING,))
    assert len(running) == 2 and _complete(study) == 2
    calls.clear()
    fail_at = 0
    said = []
    res = relakit.search(spec, out, workers=1, batch=2, notice=said.append)
    # only the two interrupted trials ran (no finished trial, no incumbent again)
    assert len(calls) == 2 * 2, len(calls)
    assert any("running them again" in s for s in said)
    assert res.trials.height == 4
    again = res.trials.filter(pl.col("trial").is_in(done["trial"].to_list())).sort("trial")
    assert again.equals(done)  # finished trials untouched, values and all
    reruns = res.trials.filter(pl.col("rerun_of").is_not_null())
    assert sorted(reruns["rerun_of"].to_list()) == sorted(t.number for t in running)
    by_number = {t.number: t.params for t in running}
    for r in reruns.iter_rows(named=True):
        params = by_number[r["rerun_of"]]
        assert r["param.policy.modes.0.enter_after"] == params["policy.modes.0.enter_after"]
    study = optuna.load_study(study_name="tiny", storage=storage)
    states = [t.state for t in study.get_trials()]
    assert states.count(TrialState.COMPLETE) == 4 and states.count(TrialState.FAIL) == 2
    # asked again for as many trials: nothing runs
    calls.clear()
    relakit.search(spec, out, workers=1, notice=print)
    assert calls == []


def _complete(study):
    from optuna.trial import TrialState

    return len(study.get_trials(states=(TrialState.COMPLETE,)))


def test_a_resumed_search_with_another_question_is_refused(tmp_path):
    out = tmp_path / "out"
    relakit.search(_tiny_spec(tmp_path, trials=1), out, workers=1, batch=1,
                   notice=lambda line: None)
    with pytest.raises(ScenarioError, match="another space, objectives, replications"):
        relakit.search(_tiny_spec(tmp_path, trials=1, replications=3), out, workers=1,
                       notice=lambda line: None)


def test_seconds_over_slo_counts_intervals_above_the_threshold():
    """Every interval with completions is above a 0.001 ms SLO and none above an hour;
    the metastable fleet is within 100 ms before its spike (0-15 s) and stays failed
    after it (the story its scenario file tells), so 100 ms is breached from about
    15 s to the end; a higher SLO never counts more seconds than a lower one."""
    from relakit.counterfactual.objectives import seconds_over_slo
    from relakit.experiment import run_once
    from relakit.scenario import load_scenario

    sc = load_scenario(METASTABLE, overrides={"duration_s": 60, "workload.arrival.start_s": 15})
    r = run_once(sc, 3, record_requests=False)
    assert seconds_over_slo(r, 0.001) == pytest.approx(60.0, abs=1.0)
    assert seconds_over_slo(r, 3.6e6) == 0.0
    over = [seconds_over_slo(r, slo) for slo in (20.0, 60.0, 100.0, 250.0)]
    assert over == sorted(over, reverse=True)
    assert 40.0 <= over[2] <= 46.0, over


def test_a_local_pool_and_a_dask_cluster_give_the_same_trials(tmp_path):
    """Where a trial's runs ran does not change the search: in this process, on a pool
    of 2 kept for the search, or on a Dask cluster, the same trials and values."""
    import os

    distributed = pytest.importorskip("distributed")
    os.environ.setdefault("NUMBA_CACHE_DIR", str(ROOT / ".numba_cache"))
    spec = _tiny_spec(tmp_path, trials=3)
    here = relakit.search(spec, tmp_path / "here", workers=1, batch=2,
                          notice=lambda line: None).trials.drop("wall_s")
    pool = relakit.search(spec, tmp_path / "pool", workers=2, batch=2,
                          notice=lambda line: None).trials.drop("wall_s")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  host="127.0.0.1", dashboard_address=None) as cluster:
        remote = relakit.search(spec, tmp_path / "dask", scheduler=cluster.scheduler_address,
                                batch=2, notice=lambda line: None).trials.drop("wall_s")
    assert here.height == 3
    assert pool.equals(here) and remote.equals(here)


def test_checking_the_space_leaves_an_inline_base_as_written():
    """The shipped search fixes 5 s windows in an inline ``clocks`` mapping and searches
    ``clocks.window_s`` over [3, 5, 10]: checking each choice once wrote it into the
    base's mapping, and the incumbent then ran with the last one (10 s)."""
    spec = load_search(ROOT / "params" / "searches" / "metastable-policy.yaml")
    assert spec.base["clocks"] == {"scrape_s": 1, "window_s": 5, "eval_s": 1, "poll_s": 1}
    sc = relakit.load_scenario(spec.scenario, overrides={**spec.base, **spec.incumbent})
    assert sc.clocks.window_s == 5


def test_an_edit_to_a_file_the_scenario_names_changes_the_search(tmp_path):
    """The journal is keyed by the content of every file a trial reads: an edited policy
    file the scenario references is another question, refused on resume."""
    scen = tmp_path / "scenario.yaml"
    scen.write_text(TINY.read_text().replace("../policies/ok.yaml", "policy.yaml"))
    policy = tmp_path / "policy.yaml"
    original = (TINY.parent.parent / "policies" / "ok.yaml").read_text()
    policy.write_text(original)
    spec = _write(tmp_path, {
        "name": "s", "scenario": str(scen),
        "space": {"policy.conditions.slow.threshold": {"low": 50, "high": 400}},
        "objectives": [{"number": "gold.success_ratio", "direction": "max"}],
        "replications": 2})
    before = load_search(spec).digest()
    assert load_search(spec).digest() == before
    policy.write_text(original.replace("threshold: 0.05", "threshold: 0.06"))
    assert load_search(spec).digest() != before


def test_a_second_search_on_a_running_journal_is_refused(tmp_path):
    """Two searches appending to one journal would mix their trials: while one holds the
    journal's lock, another is refused naming the journal and the holder."""
    spec = _write(tmp_path, {
        "name": "s", "scenario": str(TINY),
        "space": {"policy.conditions.slow.threshold": {"low": 50, "high": 400}},
        "objectives": [{"number": "gold.success_ratio", "direction": "max"}],
        "replications": 2, "trials": 1})
    out = tmp_path / "out"
    out.mkdir()
    with search_run._journal_lock(out):
        with pytest.raises(ScenarioError, match=r"study\.journal: another search \(pid \d+\)"):
            relakit.search(spec, out, workers=1, notice=lambda line: None)
    assert not (out / "study.journal").exists()  # the refused search wrote nothing


def test_a_searched_key_reads_as_words_with_its_unit():
    from relakit.counterfactual.report import SETTINGS, setting_text

    policy = yaml.safe_load((ROOT / "params" / "policies" / "rela.yaml").read_text())
    assert setting_text("policy.conditions.overloaded.threshold", 87.31, policy) == \
        "overloaded threshold on p99_ms 87.3 ms"
    assert setting_text("policy.conditions.failing.threshold", 0.05, policy) == \
        "failing threshold on error_ratio 5 %"
    assert setting_text("policy.modes.0.enter_after", 2, policy) == \
        "survival entered after 2 evaluations"
    assert setting_text("policy.modes.1.min_dwell_s", 10, policy) == \
        "performance minimum dwell 10 s"
    assert setting_text("clocks.eval_s", 5, policy) == "evaluation interval 5 s"
    # a key the table lacks is shown as given, not renamed by a guess
    assert setting_text("fleet.servers", 4, policy) == "fleet.servers = 4"
    # every clock a scenario has its words (the clocks reader's keys)
    from relakit.control import Clocks
    clock_keys = {f"clocks.{f}" for f in Clocks.__dataclass_fields__} - {"clocks.source"}
    import re
    assert all(any(re.fullmatch(p, k) for p, _, _ in SETTINGS) for k in clock_keys), clock_keys


def test_the_sentence_tells_gains_costs_and_no_difference_apart():
    """Objectives significantly better are gains, significantly worse costs, the rest
    'no significant difference' (a gain was once called 'no significant cost')."""
    from types import SimpleNamespace

    from relakit.counterfactual.spec import Objective

    diffs = {"gold.success_ratio": (0.9, 0.6, True, True),
             "dropped_share": (0.02, 0.05, True, True),      # lower is better: a gain
             "seconds_over_slo": (30.0, 10.0, True, False),  # a cost
             "mode_changes": (2.0, 2.2, False, False)}       # no significant difference

    def difference(trial, number):
        v, i, sig, better = diffs[number]
        return {"value": v, "value_ci": 0.01, "incumbent": i, "incumbent_ci": 0.01,
                "difference": v - i, "difference_ci": 0.01, "significant": sig,
                "better": better}

    spec = SimpleNamespace(scenario=str(ROOT / "params" / "scenarios" / "metastable.yaml"),
                           base={"policy": str(ROOT / "params" / "policies" / "rela.yaml")},
                           replications=3,
                           objectives=[Objective(n, "max") for n in diffs])
    front = pl.DataFrame({"trial": [4], "param.policy.conditions.overloaded.threshold": [120.0],
                          "param.clocks.window_s": [10]})
    res = SimpleNamespace(incumbent=pl.DataFrame(), spec=spec, front=front,
                          difference=difference)
    text = sentence(res, "gold.success_ratio", trial=4)
    assert text.startswith(
        "With overloaded threshold on p99_ms 120 ms, query window 10 s (trial 4)")
    assert "better too in dropped share 2.0 ± 1.0 % instead of 5.0 ± 1.0 %" in text
    assert ("at the cost of seconds over the latency SLO 30.0 ± 0.0 s instead of 10.0 ± 0.0 s"
            in text)
    assert text.endswith("no significant difference in mode changes.")
    assert "no significant cost" not in text
