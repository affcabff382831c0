"""The one protocol every decider follows: the policy's controller and the chain alike.

A decider reads what Prometheus would hold (a TSDB) at an evaluation instant and
says what it wants: ``decide(tsdb, t)`` returns a :class:`Decision`. It keeps its
own audit (``decisions()``, rows of :data:`relakit.control.audit.DECISION_COLUMNS`)
and its own per-evaluation timeline (``timeline()``, keyed by ``time_s``). The
closed loop (:mod:`relakit.experiment`), replay (:mod:`relakit.openloop`) and the live
lab's agent each loop over a list of deciders with the clock rules of
:class:`~relakit.control.clocks.Clocks`; none of them knows which kind it holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import polars as pl

from relakit.vocab import Flags


@dataclass(frozen=True)
class Decision:
    """What one decider wants after one evaluation.

    ``flags``: the global flag state desired (a policy's, a :class:`~relakit.vocab.Flags`,
    of which the data plane takes the policy flags: ``Flags.with_policy``);
    ``nodes``: per-node controls desired (a chain's: ``routable``, ``weight``,
    ``intake_limit`` per node, and ``breaker``); ``repairs``: nodes to mend now —
    work on the node, not configuration, so it is done at once, not at a config poll;
    ``tier_flags``: flags for one tier only (a rollout's tier canary: the new policy's
    wishes, which the data plane applies to the canary tier's requests).
    """

    flags: Flags | None = None
    nodes: dict | None = None
    repairs: tuple[int, ...] = ()
    tier_flags: Flags | None = None

    def __post_init__(self):
        for name in ("flags", "tier_flags"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, Flags):
                raise TypeError(f"Decision.{name} must be a relakit.vocab.Flags or None, "
                                f"got a {type(value).__name__}: {value!r}")


class Decider(Protocol):
    def decide(self, tsdb, t: float) -> Decision: ...

    def decisions(self) -> pl.DataFrame: ...

    def timeline(self) -> pl.DataFrame: ...


def latest_in_force(pending: list, t: float, kind: str):
    """The newest wanted ``kind`` (flags, nodes or tier_flags) among (effective_at, Decision) pairs,
    in decision order, that is in force at the poll ``t`` (``effective_at <= t``)."""
    for eff, d in reversed(pending):
        value = getattr(d, kind)
        if value is not None and eff <= t:
            return value
    return None
