"""The audit says when a due change is held back, and until when (issue 35, part 4).

A mode whose entry is due (its breach run long enough) but whose cooldown holds it
off gets a ``defer`` row naming the time it will be allowed; a mode whose exit is due
but whose minimum dwell holds it says so on its ``hold`` row, with the time. The
state machine (policy.step) and the audit are checked on hand-made signal rows, so
every time is known exactly.
"""

from __future__ import annotations

import math
import re

import numpy as np
import polars as pl

from relakit.control import Controller
from relakit.control import policy as P
from relakit.control.audit import NO_CHANGE

POLICY = {
    "name": "t",
    "signals": {"p99_ms": {"kind": "histogram_quantile", "metric": "latency_seconds",
                           "q": 0.99, "scale": 1000}},
    "conditions": {"slow": {"signal": "p99_ms", "op": ">", "threshold": 300},
                   "tail": {"signal": "p99_ms", "op": ">", "threshold": 120}},
    "modes": [{"name": "survival", "when": {"any": ["slow"]}, "enter_after": 2,
               "exit_after": 2, "min_dwell_s": 5, "max_duration_s": 8, "cooldown_s": 10,
               "assert": {"shed_bronze": True}},
              {"name": "performance", "when": {"any": ["tail"]}, "enter_after": 1,
               "exit_after": 1, "assert": {"hedge_enabled": True}}],
    "normal": {"hedge_enabled": False, "shed_bronze": False, "degraded_mode": False},
}


def _run(values):
    ctl = Controller(POLICY)
    for t, v in enumerate(values):
        ctl.decide_row(float(t), [v])
    return ctl


def test_an_entry_held_by_cooldown_is_audited_with_the_time_it_is_allowed():
    # performance at 0, survival over it at 1; clear from 4: exit at 6 (dwell 5 s); a
    # breach again from 8: performance at once, survival due at 9 but cooling until 16
    p99 = [500, 500, 500, 500, 50, 50, 50, 50, 500, 500, 500, 500, 500, 500, 500, 500, 500,
           500]
    ctl = _run(p99)
    d = ctl.decisions()
    changes = d.filter(~pl.col("action").is_in(NO_CHANGE))
    assert changes.select("decided_at_s", "action", "mode").rows() == [
        (0.0, "enter", "performance"), (1.0, "preempt", "survival"), (6.0, "exit", "normal"),
        (8.0, "enter", "performance"), (16.0, "preempt", "survival")]
    defer = d.filter(pl.col("action") == "defer")
    # due from 9 s (two breaches: 8, 9), allowed at 6 + 10 = 16 s: held at 9..15
    assert defer["decided_at_s"].to_list() == [float(t) for t in range(9, 16)]
    assert set(defer["mode"]) == {"performance"}  # what stands meanwhile
    for r in defer.iter_rows(named=True):
        assert re.search(r"survival due \(p99_ms 500 > 300 for \d+ evaluations\) but held "
                         r"by its cooldown of 10 s until 16\.0 s \(left at 6\.0 s\); "
                         r"staying performance", r["reason"]), r["reason"]
    # the state machine itself reports the deferral (policy.step's EV_DEFER) at those
    # evaluations and nowhere else
    ev = np.asarray(ctl.events)
    assert np.flatnonzero(ev == P.EV_DEFER).tolist() == list(range(9, 16))


def test_a_deferral_in_normal_and_after_a_maximum_duration_says_so():
    # breach throughout: enter at 1, left at its maximum duration at 9 (8 s), cooldown to 19
    pol = {**POLICY, "modes": [POLICY["modes"][0]]}  # survival alone: normal stands
    ctl = Controller(pol)
    for t in range(22):
        ctl.decide_row(float(t), [500.0])
    d = ctl.decisions()
    assert d.filter(pl.col("action") == "max_duration")["decided_at_s"].to_list() == [9.0]
    defer = d.filter(pl.col("action") == "defer")
    assert defer["decided_at_s"].to_list() == [float(t) for t in range(10, 19)]
    assert set(defer["mode"]) == {"normal"}
    assert "after its maximum duration of 8 s, until 19.0 s (left at 9.0 s); staying " \
        "normal" in defer["reason"][0]
    assert d.filter(pl.col("action") == "enter")["decided_at_s"].to_list() == [1.0, 19.0]


def test_an_exit_held_by_the_minimum_dwell_says_until_when():
    ctl = _run([500, 500, 50, 50, 50, 50, 50, 50])  # survival at 1; clear from 2
    d = ctl.decisions()
    held = d.filter((pl.col("action") == "hold") & pl.col("reason").str.contains("exit due"))
    # clears reach 2 at 3 s; dwell reaches 5 s at 6 s, when it leaves
    assert held["decided_at_s"].to_list() == [3.0, 4.0, 5.0]
    assert all("held by its minimum dwell until 6.0 s" in r for r in held["reason"])
    assert d.filter(pl.col("action") == "exit")["decided_at_s"].to_list() == [6.0]


def test_the_live_audit_written_in_parts_equals_the_whole():
    p99 = [500, 500, 500, 500, 50, 50, 50, 50, 500, 500, 500, 500, 500, 500, 500, 500, 500]
    ctl = _run(p99)
    parts, n = [], 0
    ctl2 = Controller(POLICY)
    for t, v in enumerate(p99):  # as the agent appends: the rows since its last write
        ctl2.decide_row(float(t), [v])
        parts.append(ctl2.decisions(since=n))
        n = len(ctl2.times)
    assert pl.concat(parts).equals(ctl.decisions())
    assert not math.isnan(ctl.decisions()["value"][0])
