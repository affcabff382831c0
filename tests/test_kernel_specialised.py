"""The specialised kernels (relakit.sim.kernel.specialised) change speed, never results.

A scenario runs through the kernel compiled for the mechanisms it uses and
through the general kernel (every mechanism compiled in, configured off where
the scenario does not use it): every table and counter must be identical.
Each scenario also checks that its mechanisms did something, so the equality
is not vacuous, and that the specialisation picked is the one named.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import make_scenario

from relakit.scenario import load_scenario
from relakit.sim import kernel as K
from relakit.sim.fleet import Fleet


def _plain():
    return make_scenario(rate=700, duration=20, servers=8), frozenset()


def _mitigated():
    sc = make_scenario(rate=1400, duration=20, nodes=4, servers=4, deadline_ms=40,
                       faults=[{"node": n, "start_s": 0, "end_s": 100, "error_rate": 0.02}
                               for n in range(4)])
    sc["controls"] = {"hedge_enabled": True}
    sc["mitigations"] = {"hedge": {"delay_ms": 20, "cancel": "queued"},
                         "retries": {"max_attempts": 3, "budget_ratio": 0.2}}
    return sc, frozenset({"hedging", "retries", "deadlines", "errors"})


def _probed():
    sc = make_scenario(rate=1000, duration=20, nodes=4, servers=4,
                       faults=[{"node": 1, "start_s": 0, "end_s": 100, "wrong_rate": 0.4}])
    sc["fleet"]["probes"] = {"rate_rps": 20}
    return sc, frozenset({"errors", "probes"})


def _fleet(sc, kernel, monkeypatch):
    # runs pick the plain specialisation or the general kernel (relakit.sim.fleet); any
    # other specialisation is driven here directly, standing in for the general one
    monkeypatch.setattr(Fleet, "specialise", False)
    monkeypatch.setattr(K, "advance", kernel)
    fleet = Fleet(load_scenario(sc))
    for t in (5.0, 12.5, sc["duration_s"]):  # several calls, as a control plane makes
        fleet.advance(t)
    return fleet


@pytest.mark.parametrize("make", [_plain, _mitigated, _probed],
                         ids=["plain", "mitigated", "probes"])
def test_specialised_equals_general(make, monkeypatch):
    sc, features = make()
    fleet = Fleet(load_scenario(sc))
    assert K.features_of(fleet.cfg, fleet.st) == features
    general_kernel = K.advance
    fast = _fleet(sc, K.specialised(features), monkeypatch)
    assert tuple(f for f in K.FEATURES if f in features) in K._SPECIALISED
    general = _fleet(sc, general_kernel, monkeypatch)
    assert fast.st.is_[K.IS_USER_SEQ] > 10_000
    for part in ("st", "out"):  # every array of the state and the outputs, bit for bit
        a, b = getattr(fast, part), getattr(general, part)
        for name in a._fields:
            np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    fleet_c = fast.st.fleet_c
    if "retries" in features:  # the mechanisms did something
        assert fleet_c[K.F_RETRIES] > 0 and fleet_c[K.F_HEDGES] > 0
        assert fast.out.tier_cnt[:, K.TIMEOUT].sum() > 0
        assert fast.out.tier_cnt[:, K.ERROR].sum() > 0
    elif "probes" in features:
        assert fast.st.node_c[1, K.NC_PROBE_FAILURES] > 0
    else:
        assert fleet_c[K.F_ATTEMPTS] == fast.st.is_[K.IS_USER_SEQ]  # one copy per request


def test_unknown_feature_is_an_error():
    with pytest.raises(ValueError, match="unknown kernel features"):
        K.specialised(frozenset({"teleport"}))


def test_each_combination_has_its_own_name():
    a = K.specialised(frozenset())
    b = K.specialised(frozenset({"hedging", "retries"}))
    assert a is not b and a is K.specialised(frozenset())
    assert a.py_func.__qualname__ == "advance[plain]"
    assert b.py_func.__qualname__ == "advance[hedging+retries]"
    assert np.all([f in K.FEATURES for f in ("hedging", "intake", "errors")])
