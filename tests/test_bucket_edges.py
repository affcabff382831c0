"""A policy threshold on a latency bucket bound is warned about before the lab starts
(issue 35, part 4): a quantile read from buckets crosses a bound as soon as a hair over
its share of requests lies past it, so noise decides the condition."""

from __future__ import annotations

from conftest import ROOT

from relakit.checks import WARNING, check_bucket_edges, check_lab
from relakit.control import load_clocks, load_policy
from relakit.lab.dataplane import DEFAULT_BUCKETS_S

POLICIES = ROOT / "params" / "policies"
SIM_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


def test_a_threshold_on_a_bound_is_warned_about_with_its_key():
    rela = load_policy(POLICIES / "rela.yaml")
    found = check_bucket_edges(rela, SIM_BUCKETS)  # 250 ms and 100 ms: both bounds
    assert [f.key for f in found] == ["conditions.overloaded.threshold",
                                      "conditions.tail_slow.threshold"]
    assert all(f.severity == WARNING and f.file.endswith("rela.yaml") for f in found)
    assert "250 sits on the latency histogram's bucket bound 0.25 s" in found[0].message
    # the lab's default bounds have no 0.25 s: only the 100 ms one is left
    assert [f.key for f in check_bucket_edges(rela, DEFAULT_BUCKETS_S)] == [
        "conditions.tail_slow.threshold"]


def test_the_labs_shipped_policy_sits_on_no_bound_of_the_labs_buckets():
    lab = load_policy(POLICIES / "rela-lab.yaml")
    clocks = load_clocks({"scrape_s": 1, "window_s": 5, "eval_s": 1, "poll_s": 1})
    assert check_lab(lab, clocks, buckets_s=DEFAULT_BUCKETS_S) == []
    assert check_bucket_edges(lab, (0.5, 0.7, 1.0))[0].key == "conditions.tail_slow.threshold"
