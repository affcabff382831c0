"""Progressive rollout of a policy change, and overrides: what a scenario says about them.

Two scenario keys, read here once with one-line errors (file, dotted key, what is
allowed); the run itself is :mod:`relakit.rollout`'s.

* ``rollout: {policy, canary, start_s, observe_s, promote_if, rollback_if}`` — the
  ``policy`` (a file path, resolved like the scenario's own ``policy:``, or an inline
  mapping; its signals, conditions and modes are used, its ``scope`` is not: every
  cell has its own controller) runs on the canary slice from ``start_s`` (default
  0) while the scenario's policy keeps running on the rest. Every ``observe_s``
  the canary's outcomes over the last ``observe_s`` are compared with the rest's,
  and the change is rolled back (the canary returns to the current policy),
  promoted (the new policy then runs everywhere) or observed further. ``canary`` is
  one of:

  - ``{zone: Z}`` — zone Z of ``fleet.zones`` (its controller runs the new policy);
  - ``{fraction: F}`` — a canary *cell*: the first ``round(F x nodes)`` nodes and the
    same share of the arrivals, run like a zone (requests stay in their cell), so the
    canary's nodes are as loaded as the rest's. It models a cell-based deployment,
    not a per-request cohort on shared nodes;
  - ``{tier: T}`` — tier T's requests get the new policy's flags (hedging, degraded
    mode, and shedding of T itself) while the other tiers keep the current policy's,
    on a fleet without zones. Tiers differ by design, so "the rest" is no baseline:
    the canary is compared with a **shadow run** of the same scenario and seed under
    the current policy alone (common random numbers: the same arrivals, tiers and
    first demands), tier by tier.

* ``promote_if`` / ``rollback_if``: ``{all: [COND, ...]}`` or ``{any: [COND, ...]}``,
  each COND ``{metric, tier, op, margin}``: it holds when the whole 95 % interval of
  (canary - rest) for ``metric`` of ``tier`` lies above (``op: ">"``) or below
  (``op: "<"``) ``margin``. A difference whose interval contains the margin is not
  evidence either way. Metrics (:data:`METRICS`): ``success_ratio`` (answered ok over
  requests), ``shed_share`` (dropped), ``error_share`` (error or timeout), per tier
  or ``all``, from what clients saw; ``p99_ms``, the servers' p99 latency over all
  tiers (``tier: all`` only). When both fire, rollback wins. For a tier canary, "rest"
  is the shadow run: a condition on tier T judges the canary tier, one on another
  tier the change's effect on it.

* ``overrides: [{flag, value, zone, tier, start_s, end_s}, ...]`` — pin ``flag``
  (hedge_enabled, degraded_mode, shed_bronze) to ``value`` in ``zone`` (default: every
  zone or the whole fleet) for ``tier`` (default: every tier; shed_bronze is bronze's
  flag, so only ``tier: bronze``) from ``start_s`` to ``end_s`` (default: the whole
  run), whatever the policy asks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from relakit.stats import t_interval
from relakit.validate import Reader
from relakit.vocab import POLICY_FLAGS, TIERS

METRICS = ("success_ratio", "shed_share", "error_share", "p99_ms")
OPS = (">", "<")
CANARY_KINDS = ("zone", "fraction", "tier")


@dataclass(frozen=True)
class Condition:
    metric: str
    tier: str = "all"
    op: str = ">"
    margin: float = 0.0

    @property
    def label(self) -> str:
        return f"{self.metric}[{self.tier}]"

    def holds(self, iv) -> bool:
        """True when the interval of canary - rest lies wholly on ``op``'s side of the
        margin (a nan interval, too few batches, is never evidence)."""
        if iv is None or not math.isfinite(iv.low) or not math.isfinite(iv.high):
            return False
        return iv.low > self.margin if self.op == ">" else iv.high < self.margin

    def describe(self) -> str:
        return f"{self.label} canary - rest {self.op} {self.margin:g}"


@dataclass(frozen=True)
class Rule:
    combine: str  # "all" | "any"
    conditions: tuple[Condition, ...]

    def holds(self, intervals: dict) -> bool:
        got = [c.holds(intervals.get((c.metric, c.tier))) for c in self.conditions]
        return bool(got) and (all(got) if self.combine == "all" else any(got))


@dataclass(frozen=True)
class Rollout:
    policy: object  # relakit.control.Policy: the new policy
    canary_kind: str  # "zone" | "fraction" | "tier"
    canary: float | str  # the zone index, the fraction, or the tier
    observe_s: float
    start_s: float = 0.0
    promote_if: Rule | None = None
    rollback_if: Rule | None = None
    source: str = ""  # where the new policy came from (a path or "inline")

    @property
    def conditions(self) -> tuple[Condition, ...]:
        return tuple(c for rule in (self.rollback_if, self.promote_if) if rule is not None
                     for c in rule.conditions)


@dataclass(frozen=True)
class Override:
    flag: str
    value: bool
    zone: int | None = None  # None: every zone (or the whole fleet)
    start_s: float = 0.0
    end_s: float = math.inf
    tier: str | None = None  # None: every tier

    def active(self, t: float) -> bool:
        return self.start_s <= t < self.end_s

    @property
    def tiers(self) -> frozenset:
        """The tiers the pin covers (shed_bronze: bronze, whatever is said)."""
        if self.flag == "shed_bronze":
            return frozenset({"bronze"})
        return frozenset(TIERS) if self.tier is None else frozenset({self.tier})


def read_rollout(r: Reader, resolve, sc) -> dict:
    """``rollout`` and ``overrides`` of scenario ``sc`` (already built): a dict of
    Scenario fields. Nothing given: an empty dict, so such a scenario is unchanged.
    ``resolve(reader, value, key)`` finds a file the way the scenario's own keys do."""
    out = {}
    if r.data.get("rollout") is not None:
        out["rollout"] = _rollout(r.sub("rollout"), resolve, sc)
    if r.data.get("overrides") is not None:
        out["overrides"] = _overrides(r, sc)
    if out:
        _combinations(r, sc, out)
    return out


def _combinations(r: Reader, sc, out: dict) -> None:
    key = "rollout" if "rollout" in out else "overrides"
    if sc.policy is None:
        r.fail("changes what a policy asks for; give the scenario a policy", key)
    if sc.chain is not None:
        r.fail(f"a chain with {key} is not supported (a rollout or overrides change a "
               "policy's flags; the chain's node controls have no canary)", "chain")
    if sc.fleet.zones and sc.policy.scope != "zone":
        r.fail("a rollout or overrides on a zoned fleet run one controller per zone; set "
               "the policy's scope: zone", key)
    if sc.replications != 1:
        r.fail("a rollout decides inside one run; use replications: 1 and "
               "relakit.experiment.replicate_rollout for intervals across runs", "replications")


def _rollout(r: Reader, resolve, sc) -> Rollout:
    from relakit.control import load_policy
    from relakit.validate import ScenarioError

    r.only({"policy", "canary", "start_s", "observe_s", "promote_if", "rollback_if"})
    spec = r.data.get("policy")
    try:
        if isinstance(spec, str):
            path = resolve(r, spec, "policy")
            policy, source = load_policy(path), str(path)
        elif isinstance(spec, dict):
            policy, source = load_policy(spec), "inline"
        else:
            r.fail(f"expected a path to a policy YAML or a mapping, got {spec!r}", "policy")
    except ScenarioError as exc:
        if str(exc).startswith(r.source):
            raise
        raise ScenarioError(f"{r.source}: key '{r.path}.policy': in its policy: {exc}"
                            ) from None
    kind, value = _canary(r, sc)
    duration, interval = sc.duration_s, sc.metrics.interval_s
    start = r.number("start_s", 0.0, lo=0.0)
    if start >= duration:
        r.fail(f"{start:g} must be before the end of the run ({duration:g} s)", "start_s")
    observe = r.number("observe_s", lo=0.0, lo_open=True)
    for key, v in (("start_s", start), ("observe_s", observe)):
        if abs(v / interval - round(v / interval)) > 1e-9:
            r.fail(f"{v:g} must be a multiple of metrics.interval_s ({interval:g} s): "
                   "observations are cut at metrics samples", key)
    if round(observe / interval) < 3:
        r.fail(f"{observe:g} s holds {round(observe / interval)} metrics interval(s) of "
               f"{interval:g} s; an interval over them needs at least 3", "observe_s")
    if start + observe > duration:
        r.fail(f"start_s + observe_s ({start + observe:g} s) is past the end of the run "
               f"({duration:g} s): nothing would be observed", "observe_s")
    promote = _rule(r, "promote_if")
    rollback = _rule(r, "rollback_if")
    if promote is None and rollback is None:
        r.fail("give promote_if, rollback_if or both; without them nothing is decided",
               "promote_if")
    return Rollout(policy, kind, value, observe, start, promote, rollback, source)


def _canary(r: Reader, sc) -> tuple[str, float]:
    c = r.sub("canary")
    c.only(CANARY_KINDS)
    given = [k for k in CANARY_KINDS if k in c.data]
    if len(given) != 1:
        r.fail(f"expected exactly one of {', '.join(CANARY_KINDS)}, got "
               f"{sorted(c.data) or 'none'}", "canary")
    kind = given[0]
    zones = sc.fleet.zones
    if kind == "tier":
        tier = c.choice("tier", TIERS)
        if zones:
            c.fail("a tier canary runs on a fleet without zones (one data plane and its "
                   "shadow); use zone on a zoned fleet", "tier")
        return kind, tier
    if kind == "zone":
        if not zones:
            c.fail("a zone canary needs fleet.zones; use fraction for a fleet without "
                   "zones", "zone")
        return kind, c.number("zone", lo=0, hi=len(zones) - 1, integer=True)
    if zones:
        c.fail("a fraction canary on a zoned fleet: use zone (a zone is the cell)",
               "fraction")
    f = c.number("fraction", lo=0.0, lo_open=True, hi=1.0)
    n, k = sc.fleet.nodes, canary_nodes(f, sc.fleet.nodes)
    fanout = sc.workload.fanout
    if not (fanout <= k <= n - fanout):
        c.fail(f"{f:g} of {n} nodes makes a canary cell of {k} and a rest of {n - k}; "
               f"each needs at least fan-out {fanout} node(s)", "fraction")
    return kind, f


def canary_nodes(fraction: float, nodes: int) -> int:
    """The canary cell's size: round(fraction x nodes), at least one."""
    return max(1, int(round(fraction * nodes)))


def _rule(r: Reader, key: str) -> Rule | None:
    if r.data.get(key) is None:
        return None
    s = r.sub(key)
    s.only({"all", "any"})
    if len(s.data) != 1:
        r.fail("expected one of all: [CONDITION, ...] or any: [CONDITION, ...]", key)
    combine = next(iter(s.data))
    items = s.data[combine]
    if not isinstance(items, list) or not items:
        s.fail("expected a non-empty list of conditions {metric, tier, op, margin}", combine)
    conds = []
    for i, item in enumerate(items):
        c = Reader(item, r.source, f"{s.path}.{combine}[{i}]")
        c.only({"metric", "tier", "op", "margin"})
        metric = c.choice("metric", METRICS)
        tier = c.choice("tier", (*TIERS, "all"), "all")
        if metric == "p99_ms" and tier != "all":
            c.fail("p99_ms is the servers' latency over all tiers; use tier: all", "tier")
        op = c.choice("op", OPS)
        margin = c.number("margin", 0.0)
        if metric != "p99_ms" and abs(margin) >= 1:
            c.fail(f"{margin:g}: {metric} is a share in [0, 1], so a difference of two "
                   "is in (-1, 1)", "margin")
        conds.append(Condition(metric, tier, op, margin))
    return Rule(combine, tuple(conds))


def _overrides(r: Reader, sc) -> tuple[Override, ...]:
    raw = r.data["overrides"]
    if not isinstance(raw, list) or not raw:
        r.fail("expected a list of {flag, value, zone, tier, start_s, end_s}", "overrides")
    out = []
    for i, item in enumerate(raw):
        o = Reader(item, r.source, f"overrides[{i}]")
        o.only({"flag", "value", "zone", "tier", "start_s", "end_s"})
        flag = o.choice("flag", POLICY_FLAGS)
        value = o.data.get("value")
        if not isinstance(value, bool):
            o.fail(f"expected true or false, got {value!r}", "value")
        tier = None
        if "tier" in o.data:
            tier = o.choice("tier", TIERS)
            if flag == "shed_bronze" and tier != "bronze":
                o.fail(f"shed_bronze is bronze's flag; {tier} is never shed by it (use tier: "
                       "bronze or drop tier)", "tier")
        zone = None
        if "zone" in o.data:
            if not sc.fleet.zones:
                o.fail("this fleet has no zones (fleet.zones); drop zone to pin the flag "
                       "fleet-wide", "zone")
            zone = o.number("zone", lo=0, hi=len(sc.fleet.zones) - 1, integer=True)
        start = o.number("start_s", 0.0, lo=0.0)
        end = o.number("end_s", sc.duration_s, lo=0.0)
        if not start < end <= sc.duration_s:
            o.fail(f"expected start_s < end_s <= duration_s ({sc.duration_s:g}), got "
                   f"{start:g} and {end:g}", "end_s")
        out.append(Override(flag, value, zone, start, end, tier))
    return tuple(out)


# ---- the observation's numbers ------------------------------------------------------------
def window_metric(metric: str, counts: np.ndarray, buckets: np.ndarray | None,
                  bounds_s) -> np.ndarray:
    """Per batch, ``metric`` from counts (batches, 4 outcomes: ok, error, timeout,
    dropped) or, for p99_ms, from latency bucket increments (batches, buckets); nan
    where a batch has nothing to measure."""
    if metric == "p99_ms":
        return np.array([bucket_quantile(0.99, b, bounds_s) * 1000.0 for b in buckets])
    total = counts.sum(axis=1)
    num = {"success_ratio": counts[:, 0], "shed_share": counts[:, 3],
           "error_share": counts[:, 1] + counts[:, 2]}[metric]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, num / np.where(total > 0, total, 1), np.nan)


def bucket_quantile(q: float, increments: np.ndarray, bounds_s) -> float:
    """Prometheus' ``histogram_quantile`` over one set of non-cumulative bucket counts
    (the last is +Inf): linear inside the bucket, the last finite bound if in +Inf."""
    cum = np.cumsum(increments)
    total = cum[-1] if cum.size else 0
    if total <= 0:
        return math.nan
    rank = q * total
    b = int(np.searchsorted(cum, rank))
    bounds = list(bounds_s)
    if b >= len(bounds):
        return float(bounds[-1])
    lo = 0.0 if b == 0 else bounds[b - 1]
    below = 0.0 if b == 0 else cum[b - 1]
    inside = cum[b] - below
    return float(lo + (bounds[b] - lo) * ((rank - below) / inside if inside > 0 else 1.0))


def paired_batches(canary: np.ndarray, rest: np.ndarray):
    """The t interval of (canary - rest) over the batches both measured (paired by time
    slot: both sides saw the same moment's load), or None with fewer than two."""
    d = np.asarray(canary, dtype=float) - np.asarray(rest, dtype=float)
    d = d[np.isfinite(d)]
    return t_interval(d) if d.size >= 2 else None
