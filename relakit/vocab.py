"""The words every layer shares, written once: tiers, outcomes, breaker states, stress
levels, service kinds, routings, hedge cancel policies, and the flags a control plane
sets on a data plane.

The kernel's integer codes are positions in these tuples (``relakit.sim.kernel``
derives them, never counts them by hand); the scenario reader, the policy, the
chain, ``Fleet.set_flags`` and the live lab's config server and services all
check names against the same tuples, so a new tier or state is one edit here.
Nothing here imports anything of relakit.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

TIERS = ("gold", "silver", "bronze")  # priority order: gold is never shed
# throttled: refused by the client's own adaptive throttle, never sent; rejected: refused by
# a server's own admission control (an adaptive concurrency limit, CoDel). Both in-path
# decisions (issue 33), apart from the control plane's `dropped`; appended, so the codes
# of the first four never move
OUTCOMES = ("ok", "error", "timeout", "dropped", "throttled", "rejected")
IN_PATH_OUTCOMES = ("throttled", "rejected")
# mitigations.<key> that act in the request path (their refusals: IN_PATH_OUTCOMES)
IN_PATH_KEYS = ("client_throttle", "concurrency_limit", "codel")
# which of them counts each in-path outcome (the throttle refuses before sending; a limit or
# CoDel refuses at the server)
IN_PATH_COUNTED_BY = {"throttled": ("client_throttle",), "rejected": ("concurrency_limit", "codel")}
FAILED = ("error", "timeout")  # answered, not ok: an error ratio's part, retried by default
ANSWERED = ("ok", *FAILED)  # what a node answered (dropped: refused before service)
# what a server's latency histogram observes: answers it gave (a timeout is the client's)
SERVED = ("ok", "error")
NOT_OK = tuple(o for o in OUTCOMES if o != "ok")  # what a retry may be for
SHEDDABLE = tuple(t for t in TIERS if t != "gold")  # shedding and a breaker never refuse gold
TIER_MIX = dict(zip(TIERS, (0.1, 0.3, 0.6), strict=True))  # a scenario's default share of each tier
BREAKER_STATES = ("closed", "half_open", "open")
STRESS_LEVELS = ("normal", "elevated", "critical", "catastrophic")  # Serpentine's, rising
# the booleans a policy mode asserts and the lab's config server serves (RelA's flags)
POLICY_FLAGS = ("hedge_enabled", "shed_bronze", "degraded_mode")
# the in-path mechanisms' parameters a policy's mode may set (issue 33, part 2: central
# policy, local enforcement): the client throttle's k and the concurrency limit's ceiling;
# None, the scenario's own. Numbers, not booleans: apart from POLICY_FLAGS, which the live
# lab's config server serves
LOCAL_FLAGS = ("throttle_k", "concurrency_max")
# a scenario's keys that make its run a rollout (relakit.control.rollout reads them)
ROLLOUT_KEYS = ("rollout", "overrides")
# the data plane's mechanisms a scenario names (the kernel's codes are positions here):
# service time distributions, each with the parameters a scenario gives it (in ms);
# how a copy picks its node; which hedge loser is cancelled (while queued, even in
# service, never). relakit.analytic keeps its own SERVICE_PARAMS (it stands alone);
# tests/test_vocab.py pins the two, and the kernel's tuples, equal to these.
SERVICE_PARAMS = {
    "exponential": ("mean_ms",),
    "deterministic": ("mean_ms",),
    "lognormal": ("mean_ms", "cv"),
    "pareto": ("mean_ms", "alpha"),
    "bimodal": ("fast_ms", "slow_ms", "slow_fraction"),
    # exponential with mean slow_ms with probability slow_fraction, else mean fast_ms (a
    # two-phase hyperexponential: the live lab's service with its slow path)
    "hyperexponential": ("fast_ms", "slow_ms", "slow_fraction"),
}
SERVICE_KINDS = tuple(SERVICE_PARAMS)
ROUTINGS = ("random", "round_robin", "jsq", "p2c")
CANCELS = ("queued", "started", "never")
# the in-path mechanisms' words (issue 33): a server's adaptive concurrency limit, the
# order a node's queue is served in (adaptive_lifo: newest first while CoDel finds it
# congested)
CONCURRENCY_ALGORITHMS = ("aimd", "gradient")
QUEUE_DISCIPLINES = ("fifo", "lifo", "adaptive_lifo")
# what a client does with an attempt past its deadline (mitigations.retries.on_timeout):
# abandon it, or keep listening (its late answer still answers the request)
ON_TIMEOUT = ("abandon", "keep_listening")


@dataclass(frozen=True)
class Flags:
    """The global flag state of a data plane, typed: what a policy asserts, what
    ``Fleet.set_flags`` applies, what the config server serves.

    ``shed_bronze`` is RelA's flag for the bronze tier alone; ``shed_tiers`` the
    general form. They always agree: bronze is in ``shed_tiers`` exactly when
    ``shed_bronze`` is true (given either, the other follows).
    """

    hedge_enabled: bool = False
    degraded_mode: bool = False
    shed_bronze: bool = False
    shed_tiers: tuple[str, ...] = ()
    breaker: str = "closed"
    throttle_k: float | None = None  # LOCAL_FLAGS: None, the scenario's own
    concurrency_max: float | None = None

    def __post_init__(self):
        for name in ("hedge_enabled", "degraded_mode", "shed_bronze"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"flag {name} must be true or false, got "
                                 f"{getattr(self, name)!r}")
        tiers = set(self.shed_tiers)
        unknown = tiers - set(TIERS)
        if unknown:
            raise ValueError(f"unknown tier(s) {sorted(unknown)}; tiers are {TIERS}")
        if self.breaker not in BREAKER_STATES:
            raise ValueError(f"breaker must be one of {BREAKER_STATES}, got {self.breaker!r}")
        for name in LOCAL_FLAGS:
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int | float)
                                  or not 1 <= v < float("inf")):
                raise ValueError(f"flag {name} must be a number >= 1 or null (the "
                                 f"scenario's own), got {v!r}")
        if self.shed_bronze:
            tiers.add("bronze")
        tiers.discard("gold")  # gold bypasses shedding
        object.__setattr__(self, "shed_tiers", tuple(t for t in TIERS if t in tiers))
        object.__setattr__(self, "shed_bronze", "bronze" in tiers)

    def updated(self, **changes) -> Flags:
        """These flags with some changed (None: left as is). ``shed_bronze`` alone adds or
        removes bronze from the tiers shed; with ``shed_tiers`` it is applied after them."""
        changes = {k: v for k, v in changes.items() if v is not None}
        unknown = set(changes) - set(FLAG_NAMES)
        if unknown:
            raise ValueError(f"unknown flag(s) {sorted(unknown)}; flags are {list(FLAG_NAMES)}")
        tiers = set(changes.pop("shed_tiers", self.shed_tiers))
        if "shed_bronze" in changes:
            (tiers.add if changes["shed_bronze"] else tiers.discard)("bronze")
        changes["shed_bronze"] = "bronze" in tiers
        return replace(self, **changes, shed_tiers=tuple(tiers))

    @classmethod
    def from_mapping(cls, data: dict) -> Flags:
        """From a mapping of flag names (a policy's desired state, a config server's JSON)."""
        return cls().updated(**dict(data))

    def with_policy(self, wanted: Flags) -> Flags:
        """These flags with a policy's wishes applied: ``wanted``'s :data:`POLICY_FLAGS`
        and :data:`LOCAL_FLAGS` only. A policy asserts those; the other tiers shed and the
        breaker are the data plane's own (its scenario's, or a chain's), so a policy leaves them."""
        return self.updated(**{k: getattr(wanted, k) for k in POLICY_FLAGS}).updated_local(
            wanted)

    def updated_local(self, wanted: Flags) -> Flags:
        """These flags with ``wanted``'s :data:`LOCAL_FLAGS` (None among them too: back to
        the scenario's own)."""
        return replace(self, **{k: getattr(wanted, k) for k in LOCAL_FLAGS})

    def as_dict(self, names: tuple[str, ...] | None = None) -> dict:
        """The flags by name (``names``: only those, e.g. :data:`POLICY_FLAGS` for the
        lab's config server, which serves a policy's flags)."""
        names = names or [f.name for f in fields(self)  # a local flag only when set
                          if f.name not in LOCAL_FLAGS or getattr(self, f.name) is not None]
        return {n: getattr(self, n) for n in names}


FLAG_NAMES = tuple(f.name for f in fields(Flags))

__all__ = ["ANSWERED", "BREAKER_STATES", "CANCELS", "CONCURRENCY_ALGORITHMS", "FAILED",
           "FLAG_NAMES", "Flags", "IN_PATH_COUNTED_BY", "IN_PATH_KEYS", "IN_PATH_OUTCOMES",
           "LOCAL_FLAGS", "NOT_OK",
           "ON_TIMEOUT",
           "OUTCOMES", "POLICY_FLAGS", "QUEUE_DISCIPLINES", "ROLLOUT_KEYS", "ROUTINGS",
           "SERVICE_KINDS",
           "SERVICE_PARAMS", "SHEDDABLE", "STRESS_LEVELS", "TIERS", "TIER_MIX"]
