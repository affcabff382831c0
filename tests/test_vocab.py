"""One vocabulary: every layer's words and the kernel's codes come from relakit.vocab."""

from __future__ import annotations

import pytest

from relakit import vocab
from relakit.vocab import Flags


def test_the_kernel_codes_are_positions_in_the_vocabulary():
    from relakit.sim import kernel as K

    assert K.TIERS is vocab.TIERS and K.OUTCOMES is vocab.OUTCOMES
    assert [K.OK, K.ERROR, K.TIMEOUT, K.DROPPED] == [vocab.OUTCOMES.index(o) for o in (
        "ok", "error", "timeout", "dropped")]
    assert (K.BREAKER_CLOSED, K.BREAKER_HALF_OPEN, K.BREAKER_OPEN) == (0, 1, 2)
    assert vocab.BREAKER_STATES[K.BREAKER_OPEN] == "open" and vocab.TIERS[K.GOLD] == "gold"


def test_routings_cancels_and_service_kinds_are_written_once():
    from relakit.analytic.queueing import SERVICE_PARAMS as CLOSED_FORMS
    from relakit.calibration.service import N_PARAMS
    from relakit.sim import kernel as K
    from relakit.sim import spec

    # the kernel still spells its own (it is being rewritten); pinned until it imports these
    assert K.SERVICE_KINDS == vocab.SERVICE_KINDS and K.ROUTINGS == vocab.ROUTINGS
    assert K.CANCELS == vocab.CANCELS
    assert spec.SERVICE_PARAMS is vocab.SERVICE_PARAMS and spec.ROUTINGS is vocab.ROUTINGS
    assert spec.CANCELS is vocab.CANCELS
    assert CLOSED_FORMS == vocab.SERVICE_PARAMS  # the closed forms' own copy, kept equal
    # shape parameters fitted beyond the scale
    assert N_PARAMS == {"exponential": 0, "deterministic": 0, "lognormal": 1, "pareto": 1,
                        "bimodal": 2, "hyperexponential": 2}


def test_every_layer_reads_the_same_words():
    from relakit.chain.serpentine import LEVELS
    from relakit.control.policy import FLAGS
    from relakit.lab.config_server import FLAGS as SERVED
    from relakit.scenario import BREAKER_STATES, TIER_NAMES

    assert LEVELS is vocab.STRESS_LEVELS and FLAGS is vocab.POLICY_FLAGS is SERVED
    assert TIER_NAMES is vocab.TIERS and BREAKER_STATES is vocab.BREAKER_STATES
    assert set(vocab.POLICY_FLAGS) <= set(vocab.FLAG_NAMES)


def test_flags_keep_shed_bronze_and_shed_tiers_in_agreement():
    assert Flags(shed_bronze=True).shed_tiers == ("bronze",)
    assert Flags(shed_tiers=("bronze", "silver", "gold")) == Flags(
        shed_tiers=("silver",), shed_bronze=True)  # ordered, gold never shed
    f = Flags(shed_tiers=("silver", "bronze"))
    assert f.updated(shed_bronze=False).shed_tiers == ("silver",)  # bronze alone removed
    assert f.updated(shed_tiers=()).shed_bronze is False
    assert Flags.from_mapping({"hedge_enabled": True, "shed_bronze": True}).as_dict() == {
        "hedge_enabled": True, "degraded_mode": False, "shed_bronze": True,
        "shed_tiers": ("bronze",), "breaker": "closed"}
    with pytest.raises(ValueError, match="breaker must be one of"):
        Flags(breaker="ajar")
    with pytest.raises(ValueError, match="unknown flag"):
        Flags().updated(hedging=True)
    with pytest.raises(ValueError, match="true or false"):
        Flags(hedge_enabled="yes")


def test_the_fleet_takes_typed_flags_only():
    from relakit.scenario import load_scenario
    from relakit.sim import Fleet

    sc = load_scenario({"duration_s": 2,
                        "workload": {"arrival": {"kind": "poisson", "rate_rps": 10}},
                        "fleet": {"service": {"kind": "exponential", "mean_ms": 10}},
                        "controls": {"shed_tiers": ["silver"]}})
    fleet = Fleet(sc, record_requests=False)
    assert fleet.flag_state() == Flags(shed_tiers=("silver",))
    # partial: silver stays shed
    fleet.set_flags(fleet.flag_state().updated(shed_bronze=True, hedge_enabled=True))
    assert fleet.flags()["shed_tiers"] == ("silver", "bronze") and fleet.flags()["hedge_enabled"]
    fleet.set_flags(Flags(breaker="open"))  # whole: everything else back to its default
    assert fleet.flag_state() == Flags(breaker="open")
    with pytest.raises(TypeError, match="set_flags takes a relakit.vocab.Flags, got a dict"):
        fleet.set_flags({"hedge_enabled": True})
    fleet.advance(2.0)
    assert fleet.now == 2.0


def test_a_policy_sets_its_own_flags_and_leaves_the_data_planes():
    # the scenario sheds silver and a chain opened the breaker: a policy's wish (from its
    # three flags) changes hedging and bronze only
    plane = Flags(shed_tiers=("silver",), breaker="open")
    wanted = Flags.from_mapping({"hedge_enabled": True, "shed_bronze": True,
                                 "degraded_mode": False})
    assert plane.with_policy(wanted) == Flags(hedge_enabled=True, breaker="open",
                                              shed_tiers=("silver", "bronze"))
    assert plane.with_policy(Flags()) == plane  # a calm policy: nothing of the plane's goes
    assert wanted.as_dict(vocab.POLICY_FLAGS) == {"hedge_enabled": True, "shed_bronze": True,
                                                  "degraded_mode": False}


def test_a_decision_carries_typed_flags():
    from relakit.control.decider import Decision

    assert Decision(flags=Flags(hedge_enabled=True)).flags.hedge_enabled
    with pytest.raises(TypeError, match="Decision.flags must be a relakit.vocab.Flags"):
        Decision(flags={"hedge_enabled": True})
    with pytest.raises(TypeError, match="Decision.tier_flags must be"):
        Decision(tier_flags={"shed_bronze": True})


def test_no_tuple_of_tiers_or_outcomes_is_written_outside_the_vocabulary():
    """Two or more tier (or outcome) names in one tuple, list or set literal restate the
    vocabulary: name them (``TIERS``, ``FAILED``, ``ANSWERED``, ``SHEDDABLE``, ...)."""
    import ast

    from conftest import ROOT

    # the kernel spells its codes' words once, being rewritten (the lead folds it at merge)
    exempt = {"relakit/vocab.py", "relakit/sim/kernel.py"}
    found = []
    for path in sorted((ROOT / "relakit").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel in exempt:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
                words = [e.value for e in node.elts if isinstance(e, ast.Constant)]
                if any(sum(w in names for w in words) >= 2
                       for names in (vocab.TIERS, vocab.OUTCOMES)):
                    found.append(f"{rel}:{node.lineno}: {ast.unparse(node)}")
    assert not found, "\n".join(found)
