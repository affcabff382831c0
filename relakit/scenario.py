"""Scenario files: YAML in, one validated, immutable model object out.

A scenario is read by exactly one function, :func:`load_scenario`, in the
way Ciw builds a network: every key is checked once, here, with an error that
names the file, the key and what is allowed, so nothing downstream has to
wonder whether a value is sane. Defaults live here too, so a two-line YAML is
a complete scenario.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from relakit.control.faults import (
    Agents,
    ControlPlaneFaults,
    DataPlaneStale,
    read_control_plane,
)
from relakit.sim.spec import (  # noqa: F401 - the data plane's names, as scenarios know them
    ARRIVAL_PARAMS,
    BREAKER_STATES,
    CANCELS,
    MAX_NODES,
    MAX_SERVERS,
    PROMETHEUS_BUCKETS_S,
    RETRYABLE,
    ROUTINGS,
    SERVICE_PARAMS,
    TIER_NAMES,
    Arrival,
    Breaker,
    Controls,
    Degraded,
    Fault,
    FleetSpec,
    Hedge,
    Initial,
    Metrics,
    Mitigations,
    Retries,
    Service,
    Workload,
    read_data_plane,
    resolve_path,
)
from relakit.validate import Reader, ScenarioError, load_yaml
from relakit.vocab import ROLLOUT_KEYS


@dataclass(frozen=True)
class Scenario:
    name: str
    duration_s: float
    seed: int
    workload: Workload
    fleet: FleetSpec
    faults: tuple[Fault, ...] = ()
    warmup_s: float = 0.0
    controls: Controls = Controls()
    mitigations: Mitigations = Mitigations()
    metrics: Metrics = Metrics()
    initial: Initial = Initial()  # the state the run starts from (empty: idle)
    policy: object = None  # relakit.control.Policy: closes the loop on the flags
    clocks: object = None  # relakit.control.Clocks
    chain: object = None  # relakit.chain.Chain: closes the loop on the nodes
    control_plane: ControlPlaneFaults = ControlPlaneFaults()  # the control plane's faults
    data_plane: DataPlaneStale = DataPlaneStale()  # what instances do when polls fail
    agents: Agents = Agents()  # replicas electing a leader through a lease
    rollout: object = None  # relakit.control.rollout.Rollout: a policy change on a canary
    overrides: tuple = ()  # relakit.control.rollout.Override: flags pinned whatever asked
    source: str = "<dict>"
    # how the answer's uncertainty is stated (see :func:`_experiment`)
    replications: int = 1
    ci: str = "replications"
    batches: int = 20  # relakit.stats.DEFAULT_BATCHES (a test keeps them equal)
    warmup_auto: bool = False  # `warmup_s: auto`: the kernel counts from 0, MSER-5 cuts
    # conditions the checks would warn about, declared as the scenario's design
    intended: tuple[str, ...] = ()

    @property
    def metrics_interval_s(self) -> float:
        return self.metrics.interval_s

    def __repr__(self) -> str:  # the dataclass's own repr prints every nested field
        return (f"Scenario({self.name!r}, {self.duration_s:g} s, {self.fleet.nodes} nodes, "
                f"policy={getattr(self.policy, 'name', None)!r}, "
                f"chain={'yes' if self.chain is not None else None})")

    def facts(self) -> list[str]:
        """What the scenario is, in a few lines (its notebook view)."""
        fl, wl = self.fleet, self.workload
        a = wl.arrival
        rates = (f"{a.rates_rps[0]:g}" if a.constant else
                 f"{min(a.rates_rps):g}-{max(a.rates_rps):g}")
        c = wl.clients
        closed = "" if c is None else (
            f"{'up to ' if c.steps else ''}{c.total} closed clients ("
            + ", ".join(f"{t} {c.population[t]} thinking {c.think[t].kind} "
                        f"{c.think[t].mean_ms:g} ms" for t in c.tiers)
            + "; what they offer is an outcome of the run)")
        sent = (f"{a.kind} arrivals, {rates} req/s" + (f" and {closed}" if closed else "")
                if wl.open else closed)
        lines = [f"{self.duration_s:g} s, seed {self.seed}, from {self.source}",
                 f"workload: {sent}, fan-out {wl.fanout}, tiers "
                 + ", ".join(
                     f"{t} {p:.0%}" for t, p in wl.tiers.items())
                 + (f", deadline {wl.deadline_ms:g} ms" if wl.deadline_ms else ""),
                 f"fleet: {fl.nodes} nodes" + (f" in zones of {list(fl.zones)}" if fl.zones
                                               else "") + f", {sum(fl.servers)} servers, "
                 f"{fl.service.kind} "
                 f"service of {fl.service.mean_ms:g} ms, {fl.routing} routing, capacity "
                 f"{fl.capacity_rps:.4g} req/s"
                 # a closed population's offered load is an outcome of the run, not a fact
                 + (f"; open arrivals' mean load {self.offered_utilisation:.2f}x capacity"
                    if wl.open else "")]
        if self.policy is not None:
            lines.append(f"policy {self.policy.name!r}: modes " + ", ".join(
                m.name for m in self.policy.modes))
        if self.clocks is not None and (self.policy is not None or self.chain is not None):
            c = self.clocks
            lines.append(f"clocks: scrape {c.scrape_s:g} s, window {c.window_s:g} s, "
                         f"evaluation {c.eval_s:g} s, poll {c.poll_s:g} s")
        if self.chain is not None:
            lines.append(f"chain {self.chain.name!r}: " + " -> ".join(
                type(st).__name__ for st in self.chain.stages))
        if self.faults:
            lines.append(f"{len(self.faults)} fault(s) on node(s) " + ", ".join(
                sorted({str(f.node) for f in self.faults})))
        if not self.initial.empty:
            lines.append(f"starts with {sum(self.initial.queue)} request(s) at the nodes "
                         f"({list(self.initial.queue)}) and {self.initial.pending_retries} "
                         "retry(ies) pending")
        r = self.mitigations.retries
        if r.max_attempts > 1:
            lines.append(f"retries: up to {r.max_attempts} attempts on "
                         f"{', '.join(r.retry_on)}; a timed-out attempt: {r.on_timeout}")
        if self.replications > 1:
            lines.append(f"{self.replications} replications")
        return lines

    def _repr_html_(self) -> str:
        from relakit.display import html_view

        return html_view(f"Scenario: {self.name}", self.facts())

    @property
    def offered_utilisation(self) -> float:
        """Mean offered load (after warm-up) over fleet capacity, fan-out included: the
        open arrivals' (a closed population's is an outcome of the run, not an input)."""
        rate = self.workload.arrival.mean_rate(self.duration_s, self.warmup_s)
        return rate * self.workload.fanout / self.fleet.capacity_rps


def uses_rollout(sc) -> bool:
    """True when a scenario runs as cells in lock-step (relakit.rollout): it has a
    ``rollout`` or ``overrides``. relakit.experiment lays its cells out by it."""
    return getattr(sc, "rollout", None) is not None or bool(getattr(sc, "overrides", ()))


def load_scenario(source, *, overrides: dict | None = None) -> Scenario:
    """Read, validate and complete a scenario from a YAML path or a dict.

    Errors are :class:`ScenarioError` naming the file, the dotted key and what
    is allowed. ``overrides`` (dotted keys → values) are applied before checks.
    """
    if isinstance(source, Scenario):
        return source
    data, name, base_dir = load_yaml(_deepcopy(source) if isinstance(source, dict) else source,
                                     "scenario")
    if name == "<scenario>":
        name = "<dict>"
    if not isinstance(data, dict):
        Reader(data, name)  # reports "expected a mapping"
    apply_overrides(data, overrides, name, base_dir)
    return _build(Reader(data, name), base_dir)


REFERENCED = ("policy", "chain", "clocks")  # keys whose value may name a file of its own


def inline_reference(data: dict, head: str, name: str, base_dir: Path) -> None:
    """Read the file a scenario's ``head`` (policy, chain, clocks) names into its place."""
    if isinstance(data.get(head), str):
        path = resolve_path(Reader(data, name), data[head], base_dir, head)
        data[head], _, _ = load_yaml(path, head)


def apply_overrides(data: dict, overrides: dict | None, name: str, base_dir: Path) -> None:
    """Set a scenario mapping's dotted keys in place (:func:`set_dotted`); a key reaching
    into a referenced policy, chain or clocks file reads that file in first."""
    for dotted, value in (overrides or {}).items():
        head = dotted.split(".", 1)[0]
        if "." in dotted and head in REFERENCED:
            inline_reference(data, head, name, base_dir)
        set_dotted(data, dotted, value, name)


def _build(r: Reader, base_dir: Path) -> Scenario:
    """The data plane's spec (:mod:`relakit.sim.spec`) composed with policy, chain, clocks,
    and the experiment's keys (replications, ci, batches, ``warmup_s: auto``)."""
    other = _other_kind(r.data)
    if other:
        r.fail(other, "(top level)")
    r.only({"name", "duration_s", "seed", "warmup_s", "workload", "fleet", "faults", "metrics",
            "controls", "mitigations", "policy", "clocks", "chain", "control_plane",
            "data_plane", "agents", "initial", *ROLLOUT_KEYS, *EXPERIMENT_KEYS})
    design = _experiment(r)
    if design["warmup_auto"]:  # the data plane counts from 0; the cut is made on the series
        r = Reader({k: v for k, v in r.data.items() if k != "warmup_s"}, r.source)
    kw = read_data_plane(r, base_dir, control=lambda: _control(r, base_dir))
    kw.update(read_control_plane(r, kw["duration_s"], kw["clocks"], kw["fleet"].nodes))
    sc = Scenario(**kw, **design)
    if sc.policy is not None and sc.policy.scope == "zone" and not sc.fleet.zones:
        r.fail("policy scope 'zone' runs one controller per zone; give fleet.zones "
               "(nodes per zone) or use scope: fleet", "policy.scope")
    if sc.fleet.zones:
        check_zoned(sc, r)
    if sc.controls.schedule and (sc.policy is not None or sc.chain is not None
                                 or sc.fleet.zones
                                 or any(r.data.get(k) is not None for k in ROLLOUT_KEYS)):
        r.fail("sets flags at fixed times, with no control plane: a policy, a chain, zones "
               "or a rollout would set them too; drop one (a twin's recorded flags under a "
               "policy: controls.schedule: null)", "controls.schedule")
    rollout = r.data.get("rollout")
    canary = rollout.get("canary") if isinstance(rollout, dict) else None
    if sc.workload.clients is not None and isinstance(canary, dict) and "fraction" in canary:
        r.fail("a closed client population cannot be split into cells, and a rollout's "
               "fraction canary is a cell; give the load as workload.arrival, or use a tier "
               "canary", "workload.clients")  # (at load, not by the cells mid-run)
    if any(r.data.get(k) is not None for k in ROLLOUT_KEYS):
        import dataclasses

        from relakit.control.rollout import read_rollout  # only a rollout's scenario loads it

        sc = dataclasses.replace(sc, **read_rollout(
            r, lambda rr, value, key: resolve_path(rr, value, base_dir, key), sc))
    return sc


#: the keys that tell the other files relakit reads (as relakit.checkfiles tells them), and
#: what to do with such a file instead
OTHER_KINDS = (
    ("a policy", {"signals", "conditions", "modes"}, "a scenario names it (policy: PATH)"),
    ("a search", {"space", "objectives"}, "run it with `relakit search`"),
    ("a sweep", {"grid", "samples", "notebook"}, "run it with `relakit sweep`"),
    ("a chain", {"order", "sentinel", "serpentine", "aegis", "atlas", "punisher", "phoenix"},
     "a scenario names it (chain: PATH)"),
    ("Prometheus rules", {"groups"}, "replay them with `relakit replay TRACE --rules`, or "
     "turn them into a policy with `relakit import-rules`"),
    ("clocks", {"scrape_s", "window_s", "eval_s", "poll_s"},
     "a scenario names them (clocks: PATH)"))


def _other_kind(data) -> str | None:
    """What a mapping with no scenario key is instead (a policy given to ``simulate``), and
    what to do with it."""
    if not isinstance(data, dict) or set(data) & {"fleet", "workload", "duration_s"}:
        return None
    return next((f"this is {kind}, not a scenario (fleet, workload, duration_s): {advice}"
                 for kind, keys, advice in OTHER_KINDS if set(data) & keys), None)


EXPERIMENT_KEYS = ("replications", "ci", "batches", "intended")
#: what a scenario may declare as intended, so that `relakit check` does not warn of it:
#: overload (offered load at or over capacity with queues that never bind)
INTENDED = ("overload",)
CI_METHODS = ("replications", "batch_means")
MAX_REPLICATIONS = 10_000


def _experiment(r: Reader) -> dict:
    """How the answer's uncertainty is stated: ``replications: N`` independent runs
    (Student t over their numbers), or ``ci: batch_means`` over one run's own series
    (``batches`` of them; ``warmup_s: auto`` lets MSER-5 pick the warm-up from that
    series, so it only makes sense there)."""
    reps = r.number("replications", 1, lo=1, hi=MAX_REPLICATIONS, integer=True)
    ci = r.choice("ci", CI_METHODS, "replications")
    if "batches" in r.data and ci != "batch_means":
        r.fail("counts the batches of `ci: batch_means`; set ci: batch_means or drop "
               "batches", "batches")
    batches = r.number("batches", 20, lo=2, hi=1000, integer=True)
    auto = isinstance(r.data.get("warmup_s"), str)
    if auto and r.data["warmup_s"] != "auto":
        r.fail(f"expected seconds (a number >= 0) or 'auto', got {r.data['warmup_s']!r}",
               "warmup_s")
    if auto and ci != "batch_means":
        r.fail("'auto' picks the warm-up (MSER-5) from the batch series of "
               "`ci: batch_means`; give seconds, or set ci: batch_means", "warmup_s")
    if ci == "batch_means" and reps != 1:
        r.fail(f"{reps} replications with ci: batch_means: batch means are the interval "
               "of one run; use replications: 1, or ci: replications", "replications")
    intended = r.data.get("intended", [])
    if not isinstance(intended, list) or any(i not in INTENDED for i in intended):
        r.fail(f"expected a list from {', '.join(INTENDED)} (conditions the scenario means "
               f"to create), got {intended!r}", "intended")
    return {"replications": reps, "ci": ci, "batches": batches, "warmup_auto": auto,
            "intended": tuple(intended)}


def _control(r: Reader, base_dir: Path):
    """`policy:` and/or `chain:` (paths or inline) close the loop; `clocks:` times it."""
    if r.data.get("policy") is None and r.data.get("chain") is None:
        if r.data.get("clocks") is not None:
            r.fail("clocks time a control loop; give a policy or a chain too", "clocks")
        return None, None, None  # an open loop: the control plane's modules stay unloaded
    from relakit.chain import load_chain
    from relakit.control import load_clocks, load_policy

    def load(key, loader):
        spec = r.data.get(key)
        if spec is None:
            return None
        if isinstance(spec, str):
            return loader(resolve_path(r, spec, base_dir, key))
        if isinstance(spec, dict):
            return loader(spec)
        r.fail(f"expected a path to a {key} YAML or a mapping, got {spec!r}", key)

    try:
        policy = load("policy", load_policy)
        chain = load("chain", load_chain)
        clocks = load("clocks", load_clocks) if r.data.get("clocks") is not None else load_clocks()
    except ScenarioError as exc:
        if str(exc).startswith(r.source):
            raise
        raise ScenarioError(f"{r.source}: in its policy, chain or clocks: {exc}") from None
    return policy, clocks, chain


def _deepcopy(d):
    """A scenario given as a dict, copied as YAML would read it back (mappings and lists
    copied, a tuple becoming a list, values shared), so that overrides never write into
    the caller's dict. Without a YAML round trip: a plain run then never imports yaml."""
    if isinstance(d, dict):
        return {k: _deepcopy(v) for k, v in d.items()}
    if isinstance(d, list | tuple):
        return [_deepcopy(v) for v in d]
    return d


class OverrideError(ScenarioError):
    """A dotted override key that does not lead anywhere in the scenario.

    ``key`` is the dotted key as given and ``problem`` says where it went wrong, so
    a sweep can name its own file and key (``grid.policy.modes.9.exit_after``)."""

    def __init__(self, source: str, key: str, problem: str):
        super().__init__(f"{source}: override key '{key}': {problem}")
        self.key, self.problem = key, problem


def set_dotted(data: dict, dotted: str, value, source: str = "<scenario>"):
    """Set a dotted key; a number indexes a list (``policy.modes.0.exit_after``).

    The value is stored as a copy: an override that is a mapping (``clocks: {...}``)
    is otherwise the caller's own dict, and a later dotted key reaching into it
    (``clocks.window_s``) would write into the caller's overrides, so that checking a
    search's space left its last value in the search's ``base``.

    A key that runs into a number or a string, or an index past a list's end, is an
    :class:`OverrideError` naming the part that does not fit."""
    if not isinstance(dotted, str) or not dotted or "" in dotted.split("."):
        raise OverrideError(source, str(dotted), "expected a dotted key such as "
                                                 "'fleet.servers' or 'policy.modes.0.exit_after'")
    keys = dotted.split(".")
    cur, walked = data, []
    for i, k in enumerate(keys):
        last = i == len(keys) - 1
        where = ".".join(walked) or "the top level"
        if isinstance(cur, list):
            if not k.lstrip("-").isdigit() or not 0 <= int(k) < len(cur):
                raise OverrideError(source, dotted, f"{where} is a list of {len(cur)}; "
                                    f"'{k}' must be an index from 0 to {len(cur) - 1}")
            k = int(k)
        elif not isinstance(cur, dict):
            raise OverrideError(source, dotted, f"{where} is {_what(cur)}, not a mapping or "
                                f"a list, so it has no '{k}'")
        if last:
            cur[k] = _deepcopy(value)
        else:
            if isinstance(cur, dict) and k not in cur:
                cur[k] = {}
            cur = cur[k]
        walked.append(str(k))


def _what(value) -> str:
    return f"the value {value!r}" if not isinstance(value, str) else f"the string {value!r}"


def check_zoned(sc, r) -> None:
    """What a zoned scenario must also satisfy (one-line errors through Reader ``r``)."""
    zones = sc.fleet.zones
    if any(m <= 0 for m in sc.fleet.zone_mix):
        r.fail(f"every zone needs a positive share of the arrivals, got "
               f"{list(sc.fleet.zone_mix)}", "fleet.zone_mix")
    if sc.workload.fanout > min(zones):
        r.fail(f"fan-out {sc.workload.fanout} needs that many nodes in every zone; the "
               f"smallest zone has {min(zones)}", "workload.fanout")
    zone_of = np.repeat(np.arange(len(zones)), zones)
    weights = np.asarray(sc.fleet.weights, dtype=float)
    dead = [z for z in range(len(zones)) if not (weights[zone_of == z] > 0).any()]
    if dead:
        r.fail(f"every node of zone {dead[0]} has weight 0: its share of the arrivals "
               f"({sc.fleet.zone_mix[dead[0]]:g}) would find no node and fail; give one of "
               "them a positive weight or drop the zone", "fleet.weights")
    for node, dep, _ in sc.fleet.dependencies:
        if zone_of[node] != zone_of[dep]:
            r.fail(f"node {node} depends on node {dep} in another zone; requests stay in "
                   "their zone", "fleet.dependencies")
    if sc.chain is not None and sc.policy is not None and sc.policy.scope == "zone":
        r.fail("a chain judges the whole fleet (its node classes, its cap on isolated "
               "nodes): with fleet.zones it runs with policy scope fleet, not zone", "chain")
