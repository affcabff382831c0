"""The containment chain: Sentinel → Serpentine → Aegis → Atlas → Punisher → Phoenix.

Six small stages with one interface (``stage.run(ctx)``), run in a configured
order at every evaluation of the control plane, closed loop or in replay.
Like the control plane, the chain never imports the kernel: it reads a TSDB
and says which per-node controls, breaker state and repairs it wants; the
experiment layer applies them after the clocks' delay. Every action of every
stage is audited with its stage, target, signal, value, threshold and reason.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import polars as pl

from relakit.chain.aegis import Aegis
from relakit.chain.atlas import Atlas
from relakit.chain.phoenix import Phoenix
from relakit.chain.punisher import Punisher
from relakit.chain.sentinel import Sentinel
from relakit.chain.serpentine import Serpentine
from relakit.chain.state import ChainState, Context
from relakit.control.audit import DECISION_COLUMNS, empty_decisions
from relakit.control.controller import sample_age
from relakit.control.decider import Decision
from relakit.validate import Reader, load_yaml

STAGES = {"sentinel": Sentinel, "serpentine": Serpentine, "aegis": Aegis, "atlas": Atlas,
          "punisher": Punisher, "phoenix": Phoenix}
SEED_ORDER = ("sentinel", "serpentine", "aegis", "atlas", "punisher", "phoenix")
# (low, high, low open) per stage key: ratios, shares and probabilities live in [0, 1],
# so a value outside can only be a mistake (error_threshold: 5 would never isolate)
RANGES = {
    "error_threshold": (0, 1, False), "unhealthy_error_rate": (0, 1, False),
    "success_probability": (0, 1, False), "probation_weight": (0, 1, False),
    "max_isolated_fraction": (0, 1, False), "panic_below": (0, 1, False),
    "unthrottle_below": (0, 1, False), "floor": (0, 1, False), "gain": (0, 1, True),
    "max_shift": (0, 1, False), "isolate_after": (1, None, False),
    "enter_after": (1, None, False), "exit_after": (1, None, False),
    "throttle_intake": (0, None, True), "backoff_factor": (1, None, False),
    "seed": (0, 2**64 - 1, False), "wrong_threshold": (0, 1, False),
    "min_probe_volume": (1, None, False),
}
LEVEL_KEYS = {"unhealthy_share": 1, "error_rate": 1, "utilisation": 1, "p99_over_slo": None}
CLASS_KEYS = ("error_threshold", "load_threshold")
ADAPTIVE_DEFAULTS = {"baseline_window_s": 300.0, "factor": 1.5, "min_excess": 0.03}


@dataclass(frozen=True)
class Chain:
    """A chain's configuration, frozen: its stages in order and their settings.

    Running it is :meth:`run`'s job: a :class:`ChainRun` holds the run state (node
    states, actions, history) and its own reset copies of the stages, so one chain
    (e.g. a scenario's) can be run any number of times, each from the start.
    """

    name: str
    stages: tuple
    servers: tuple | None = None  # per node; None: the scenario's (or busy_servers' max)
    source: str = "<chain>"

    @property
    def order(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.stages)

    def run(self, clocks, servers=None, base_weights=None) -> ChainRun:
        """A fresh run of this chain, timed by ``clocks``."""
        return ChainRun(self, clocks, servers, base_weights)


class ChainRun:
    """The chain as a decider (:mod:`relakit.control.decider`): its run state, evaluated
    once per evaluation, closed loop, in replay or live."""

    def __init__(self, chain: Chain, clocks, servers=None, base_weights=None):
        self.chain, self.clocks = chain, clocks
        self.stages = [copy.copy(s) for s in chain.stages]
        for stage in self.stages:
            stage.reset()
        self.servers = servers if servers is not None else chain.servers
        self.base_weights = None if base_weights is None else np.asarray(base_weights,
                                                                          dtype=float)
        self.state: ChainState | None = None
        self.actions: list = []
        self.history: list = []  # (t, working nodes, stress)

    @property
    def order(self) -> tuple[str, ...]:
        return self.chain.order

    def decide(self, tsdb, t: float) -> Decision:
        """Every stage once at time t: the per-node controls wanted, and repairs done now."""
        ctx = self.evaluate(tsdb, t, signal_age_s=float(sample_age(tsdb, [t])[0]))
        return Decision(nodes=ctx.controls(), repairs=tuple(ctx.repairs))

    def evaluate(self, tsdb, t: float, signal_age_s: float = math.nan) -> Context:
        """Run every stage once at time t; return the context with its actions."""
        nodes = [tgt.node for tgt in tsdb.targets if tgt.node >= 0]
        n = (max(nodes) + 1) if nodes else 0
        if self.servers is not None:  # known nodes count even before any was scraped (live)
            n = max(n, len(self.servers))
        if self.state is None:
            self.state = ChainState.fresh(n)
        srv = np.asarray(self.servers if self.servers is not None else
                         _servers_seen(tsdb, n), dtype=float)
        ctx = Context(t=float(t), tsdb=tsdb, window_s=self.clocks.window_s, servers=srv,
                      state=self.state, signal_age_s=signal_age_s,
                      base_weights=self.base_weights)
        if self.state.nodes and all(s.weight == 1.0 for s in self.state.nodes) and not \
                self.history and ctx.base_weights is not None:
            for s, w in zip(self.state.nodes, ctx.base_weights, strict=False):
                s.weight = float(w)  # start from the configured weights
        for stage in self.stages:
            ctx.stage = stage.name
            stage.run(ctx)
        for a in ctx.actions:
            a["mode"] = self.state.stress
        self.actions.extend(ctx.actions)
        self.history.append((ctx.t, int(self.state.working().sum()), self.state.stress))
        return ctx

    def run(self, tsdb, times, progress=None) -> None:
        """Every evaluation of a trace in turn (replay); ``progress`` is told each one."""
        ages = sample_age(tsdb, times)
        for k, (t, age) in enumerate(zip(times, ages, strict=True)):
            self.evaluate(tsdb, float(t), signal_age_s=float(age))
            if progress is not None:
                progress.update(k + 1)

    def decisions(self) -> pl.DataFrame:
        if not self.actions:
            return empty_decisions()
        rows = []
        for a in self.actions:
            rows.append({**{k: None for k in DECISION_COLUMNS}, **a,
                         "effective_at_s": float(self.clocks.effective_at(a["decided_at_s"]))})
        return pl.DataFrame(rows, schema=DECISION_COLUMNS)

    def timeline(self) -> pl.DataFrame:
        """Per evaluation: time_s, the nodes working, and the fleet's stress level."""
        return pl.DataFrame({"time_s": [float(t) for t, _, _ in self.history],
                             "working_nodes": [w for _, w, _ in self.history],
                             "stress": [s for _, _, s in self.history]},
                            schema={"time_s": pl.Float64, "working_nodes": pl.Int64,
                                    "stress": pl.String})


def _servers_seen(tsdb, n: int) -> np.ndarray:
    """Servers per node when nobody said: the most ever seen busy at once (at least 1)."""
    out = np.ones(n)
    for tgt in tsdb.targets:
        if 0 <= tgt.node < n:
            idx = tgt.select("busy_servers")
            if idx.size and tgt.values.shape[0]:
                out[tgt.node] = max(1.0, float(np.nanmax(tgt.values[:, idx])))
    return out


def load_chain(source) -> Chain:
    """A chain from YAML (a path or a mapping); unknown stages or keys are errors."""
    if isinstance(source, Chain):
        return source
    data, name, _ = load_yaml(source, "chain")
    r = Reader(data, name)
    r.only({"name", "order", "servers", *STAGES})
    order = r.data.get("order", list(SEED_ORDER))
    if (not isinstance(order, list) or not all(isinstance(o, str) for o in order)
            or sorted(order) != sorted(set(order))
            or any(o not in STAGES for o in order) or "sentinel" not in order):
        r.fail(f"expected a list of distinct stages from {list(STAGES)} including sentinel "
               f"(the designed order is {list(SEED_ORDER)}), got {order!r}", "order")
    stages = [_stage(r.sub(s), STAGES[s]) for s in order]
    servers = r.data.get("servers")
    if servers is not None and (not isinstance(servers, list) or not servers or not all(
            isinstance(x, int | float) and not isinstance(x, bool) and 0 < x < 1e9
            for x in servers)):
        r.fail("expected a list of positive server counts, one per node", "servers")
    return Chain(r.data.get("name", "chain"), tuple(stages),
                 tuple(servers) if servers is not None else None, source=name)


def _stage(r: Reader, cls):
    fields = {f.name: f for f in dataclasses.fields(cls) if not f.name.startswith("_")
              and f.name != "name"}
    r.only(set(fields))
    kwargs = {}
    for key, f in fields.items():
        if key not in r.data:
            continue
        default = f.default if f.default is not dataclasses.MISSING else None
        value = r.data[key]
        if isinstance(default, bool) or isinstance(default, str):
            if not isinstance(value, type(default)):
                r.fail(f"expected {type(default).__name__}, got {value!r}", key)
            kwargs[key] = value
        elif isinstance(default, int | float) and not isinstance(default, bool):
            lo, hi, lo_open = RANGES.get(key, (0, None, False))
            kwargs[key] = r.number(key, lo=lo, hi=hi, lo_open=lo_open,
                                   integer=type(default) is int)
        elif key == "call_graph":
            if not isinstance(value, list) or not all(
                    isinstance(p, list) and len(p) == 2 and all(
                        isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in p)
                    and p[0] != p[1] for p in value):
                r.fail("expected a list of [node, depends_on] pairs of two different node "
                       f"numbers (0 or more), got {value!r}", key)
            kwargs[key] = tuple(tuple(p) for p in value)
        elif key == "levels":
            kwargs[key] = _levels(r.sub(key))
        elif key == "classes":
            kwargs[key] = _classes(r.sub(key))
        elif key == "adaptive":
            kwargs[key] = _adaptive(r.sub(key))
        elif key == "slo_p99_ms":
            kwargs[key] = r.number(key, lo=0, lo_open=True, nullable=True)
        else:
            kwargs[key] = value
    if cls is Sentinel and "attribution" in kwargs and kwargs["attribution"] not in (
            "local", "call_graph"):
        r.fail(f"{kwargs['attribution']!r} is not one of local, call_graph", "attribution")
    if cls is Atlas and kwargs.get("balance", "capacity") not in ("capacity", "spare"):
        r.fail(f"{kwargs['balance']!r} is not one of capacity, spare", "balance")
    return cls(**kwargs)


def _levels(r: Reader) -> dict:
    """Serpentine's thresholds: {elevated|critical|catastrophic: {reading: threshold}}."""
    from relakit.chain.serpentine import LEVELS

    r.only(LEVELS[1:])
    out = {}
    for level in LEVELS[1:]:
        if level not in r.data:
            continue
        lv = r.sub(level)
        lv.only(set(LEVEL_KEYS))
        out[level] = {k: lv.number(k, lo=0, hi=LEVEL_KEYS[k]) for k in LEVEL_KEYS
                      if k in lv.data}
    return out


def _adaptive(r: Reader) -> dict:
    """Aegis' adaptive thresholds: {baseline_window_s, factor, min_excess}, each defaulted.

    factor must exceed 1 (at 1 or below a node breaches at its own baseline); that the
    baseline window is at least the clocks' window is checked with the scenario."""
    r.only(set(ADAPTIVE_DEFAULTS))
    factor = r.data.get("factor", ADAPTIVE_DEFAULTS["factor"])
    if isinstance(factor, int | float) and not isinstance(factor, bool) and factor <= 1:
        r.fail(f"must be > 1, got {factor!r}: at 1 or below a node breaches at its own "
               "baseline", "factor")
    return {"baseline_window_s": r.number("baseline_window_s",
                                          ADAPTIVE_DEFAULTS["baseline_window_s"], lo=0,
                                          lo_open=True),
            "factor": r.number("factor", ADAPTIVE_DEFAULTS["factor"], lo=1, lo_open=True),
            "min_excess": r.number("min_excess", ADAPTIVE_DEFAULTS["min_excess"], lo=0, hi=1)}


def _classes(r: Reader) -> dict:
    """Aegis' node classes: {name: {nodes: [i, ...], error_threshold, load_threshold}}."""
    out = {}
    for name in r.data:
        c = r.sub(str(name)) if isinstance(name, str) else r.fail(
            f"expected class names, got {name!r}")
        c.only({"nodes", *CLASS_KEYS})
        nodes = c.data.get("nodes")
        if not isinstance(nodes, list) or not nodes or not all(
                isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in nodes):
            c.fail(f"expected a non-empty list of node numbers (0 or more), got {nodes!r}",
                   "nodes")
        spec = {"nodes": list(nodes)}
        spec.update({k: c.number(k, lo=0, hi=1 if k == "error_threshold" else None)
                     for k in CLASS_KEYS if k in c.data})
        out[name] = spec
    return out


__all__ = ["SEED_ORDER", "STAGES", "Aegis", "Atlas", "Chain", "ChainRun", "ChainState", "Context",
           "Phoenix", "Punisher", "Sentinel", "Serpentine", "load_chain"]
