"""Semantic checks: mistakes that pass the type checks but make a run say nothing.

The loaders (:mod:`relakit.validate` and each ``load_*``) check every value on
its own: its type, its range, the keys around it. What they cannot see is a
value that is fine alone and wrong in its context: a signal on a metric the
simulator does not export, a query window that never holds two scrapes, a
fleet offered more than it can serve with nowhere to drop the excess, a run
whose metrics grid would not fit in memory. Those are found here, before
anything runs, and every entry point (``simulate``, ``replay``, sweeps, the
lab and ``relakit check``) asks the same functions.

Each finding is an error (the run would be meaningless or would crash: it is
refused) or a warning (the run is possible, and probably not what was meant:
it goes on, and says so on stderr). The table of cases and their severity is
docs/checking.md; why checks are split from reading, docs/design.md.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import warnings
from dataclasses import dataclass

import numpy as np

from relakit.validate import ScenarioError, display_path
from relakit.vocab import IN_PATH_COUNTED_BY, IN_PATH_KEYS, IN_PATH_OUTCOMES, OUTCOMES, TIERS

ERROR, WARNING = "error", "warning"
# a rate needs two samples in its window; Prometheus advises a window of four scrapes
RATE_KINDS = ("rate", "ratio", "histogram_quantile")
MEMORY_WARN_SHARE = 0.5  # of the memory available now: warn above, refuse above 1


class RelakitWarning(UserWarning):
    """A semantic warning: the run goes on, but probably does not do what was meant."""


@dataclass(frozen=True)
class Finding:
    severity: str  # error | warning
    file: str
    key: str
    message: str

    @property
    def text(self) -> str:
        return f"{self.file}: key '{self.key}': {self.message}"

    def line(self) -> str:
        """The one line the command line prints: ``relakit: warning: FILE: key 'K': ...``."""
        return f"relakit: {self.severity}: {self.text}"


class CheckError(ScenarioError):
    """One or more error findings: the input is refused before anything runs."""

    def __init__(self, findings):
        self.findings = [f for f in findings if f.severity == ERROR]
        super().__init__("\n".join(f.text for f in self.findings))


# where enforce's warnings say they come from: a warning is about an input, which its
# text names first; a line of relakit's source would put the checkout's absolute path in
# every notebook that shows one. The registry keeps Python's default: once per message
# (while the warning filters stand).
_SHOWN: dict = {}


def enforce(findings) -> list[Finding]:
    """Warn (as :class:`RelakitWarning`) for each warning; raise :class:`CheckError` on errors.

    Warnings come first, so a refused run still shows everything that was found."""
    findings = list(findings)
    for f in findings:
        if f.severity == WARNING:
            warnings.warn_explicit(f.text, RelakitWarning, "relakit", 0, registry=_SHOWN)
    if any(f.severity == ERROR for f in findings):
        raise CheckError(findings)
    return findings


# ---- where a finding points ---------------------------------------------------------------
def _where(obj_source: str, parent_source: str | None, prefix: str) -> tuple[str, str]:
    """(file, key prefix): an inline policy/chain/clocks is reported in its scenario."""
    if obj_source.startswith("<") and parent_source:
        return parent_source, prefix + "."
    return obj_source, ""


# ---- series: what a signal can read --------------------------------------------------------
# (source, name, tier, outcome, le): source is "nodes" (per-target) or "client" (fleet-wide)
def simulator_series(bounds_s, in_path: bool = False) -> list[tuple]:
    """Every series the simulator exports, for histogram bounds ``bounds_s`` (``in_path``:
    a run with an in-path mechanism, which exports theirs too)."""
    from relakit.sim.longtable import fleet_columns, node_columns

    return ([("nodes", *c[1:]) for c in node_columns(bounds_s, in_path)]
            + [("client", *c[1:]) for c in fleet_columns(in_path)])


def trace_series(frame) -> list[tuple]:
    """The series of a long metrics frame that hold at least one sample (not NaN)."""
    import polars as pl

    have = frame.filter(pl.col("value").is_not_null() & ~pl.col("value").is_nan())
    keys = have.select(pl.when(pl.col("node") < 0).then(pl.lit("client"))
                       .otherwise(pl.lit("nodes")).alias("source"),
                       "name", "tier", "outcome", "le").unique()
    return [tuple(r) for r in keys.iter_rows()]


def _matches(sel_source, name, labels, series) -> list[tuple]:
    out = []
    for src, n, tier, outcome, le in series:
        if src != sel_source or n != name:
            continue
        have = {"tier": tier, "outcome": outcome, "le": le}
        if all((have[k] in v) if isinstance(v, tuple | list) else have[k] == v
               for k, v in labels.items()):
            out.append((src, n, tier, outcome, le))
    return out


def _selectors(sig):
    """(key under the signal, metric name asked for, selector) for each series a signal reads."""
    if sig.kind == "promql":
        return []  # an expression's selectors are not checked against the trace (yet)
    if sig.kind == "ratio":
        return [("num.", sig.selector.metric, sig.selector), ("den.", sig.den.metric, sig.den)]
    if sig.kind == "histogram_quantile":
        return [("", sig.selector.metric + "_bucket", sig.selector)]
    return [("", sig.selector.metric, sig.selector)]


def _unknown_name(asked, names, what, whose) -> str:
    """The message for a metric name no series has, with a guess or the names there are."""
    close = difflib.get_close_matches(asked, names, n=1, cutoff=0.75)
    hint = (f"did you mean '{close[0]}'?" if close else
            f"the series are: {', '.join(names[:12])}{', ...' if len(names) > 12 else ''}"
            if names else "there are no series at all")
    return (f"{what} has no series named '{asked}' for {whose}, so it is always 'no data' "
            f"and never holds: {hint}")


def _check_promql_names(sig, key, name, series, file, missing, what) -> list[Finding]:
    """Each metric name a PromQL signal's selectors ask for, against the series that
    exist (names only: an expression's label matchers are evaluated, not checked)."""
    from relakit.control.promql import selectors

    names = sorted({s[1] for s in series})
    return [Finding(missing, file, key, _unknown_name(sel.name, names, what,
                                                      f"signal '{name}'"))
            for sel in selectors(sig.node) if sel.name is not None and sel.name not in names]


def check_rules(groups, file: str, series_names, *, missing: str, what: str) -> list[Finding]:
    """Each metric a Prometheus rule's expression names, against the series there are and
    the names the file's own recording rules write: a misspelt name parses, and the
    alert then silently never fires."""
    from relakit.control.promql import selectors

    recorded = {r.name for g in groups for r in g.rules if r.kind == "record"}
    names = sorted(set(series_names) | recorded)
    unknown = dict.fromkeys((r, sel.name) for g in groups for r in g.rules
                            for sel in selectors(r.node)
                            if sel.name is not None and sel.name not in names)  # once each
    return [Finding(missing, file, f"{r.key}.expr",
                    _unknown_name(asked, names, what, f"{r.kind} '{r.name}'"))
            for r, asked in unknown]


def check_rule_labels(groups, file: str, store) -> list[Finding]:
    """Labels and label values a rule reads that no series of the store has (a selector
    that selects nothing, a by/on/without/ignoring list naming a label nobody has): a
    warning each, naming the rule and the label (:func:`relakit.control.rules.label_warnings`)."""
    from relakit.control.rules import label_warnings

    return [Finding(WARNING, *w) for w in label_warnings(groups, store, file)]


def _promql_reads(policy, series) -> bool:
    """Whether a promql signal of the policy names a series the trace holds."""
    from relakit.control.promql import selectors

    if policy is None:
        return False
    names = {s[1] for s in series}
    return any(sel.name in names for sig in policy.signals.values() if sig.kind == "promql"
               for sel in selectors(sig.node))


def _why_no_match(name, sel, series) -> tuple[str, str]:
    """A hint for a selector that matches nothing (wrong source, label, or a typo), and
    the key under the selector it points at."""
    same_name = [s for s in series if s[1] == name]
    if same_name and all(s[0] != sel.source for s in same_name):
        other = same_name[0][0]
        return (f"'{name}' is a {'fleet-wide (client)' if other == 'client' else 'per-node'} "
                f"series here: {'add source: client' if other == 'client' else 'drop source'}",
                "source")
    if same_name:
        for label, want in sel.labels.items():
            idx = {"tier": 2, "outcome": 3, "le": 4}[label]
            present = sorted({str(s[idx]) for s in same_name if s[0] == sel.source})
            wanted = want if isinstance(want, tuple | list) else (want,)
            if not set(wanted) & set(present):
                only = (f" ({'; '.join(map(counted_only, wanted))})" if label == "outcome"
                        and set(wanted) <= set(IN_PATH_OUTCOMES) else "")
                return (f"no '{name}' series has {label} {' or '.join(map(repr, wanted))} "
                        f"(present: {', '.join(present)}){only}", label)
        return f"no '{name}' series has all of the labels {dict(sel.labels)}", "metric"
    if name.endswith("_bucket_bucket"):
        return "give a histogram's name without '_bucket' (the signal adds it)", "metric"
    names = sorted({s[1] for s in series})
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.75)
    if close:
        return f"did you mean '{close[0].removesuffix('_bucket')}'?", "metric"
    shown = ", ".join(names[:12]) + (", ..." if len(names) > 12 else "")
    return (f"the series are: {shown}" if names else "there are no series at all"), "metric"


def counted_only(outcome: str) -> str:
    """Which mitigation counts an in-path outcome, for a hint."""
    keys = " or ".join(f"mitigations.{k}" for k in IN_PATH_COUNTED_BY[outcome])
    return f"'{outcome}' is counted only in a run with {keys}"
RELAKIT_NAMES = {"outcome": OUTCOMES, "tier": TIERS}  # the label values relakit's own series use


def _foreign_values(sel) -> list[tuple[str, str]]:
    """(label, value) pairs of ``sel`` no series of relakit's own can carry."""
    out = []
    for lab, allowed in RELAKIT_NAMES.items():
        want = sel.labels.get(lab, ())
        out += [(lab, v) for v in ((want,) if isinstance(want, str) else want)
                if v not in allowed]
    return out


def check_signals(policy, series, *, missing: str, what: str, parent: str | None = None,
                  labels: bool = True, own: bool = False) -> list[Finding]:
    """Each signal's metric and labels against the series that exist.

    ``missing`` is the severity of a signal that reads nothing (error where the
    series are known in advance, the simulator's; warning for one trace);
    ``what`` names where the series come from, for the message. A label value in a
    list that matches nothing while the others do is a warning: probably a typo. ``own``:
    the series are relakit's own (the simulator's, the lab's), whose outcomes and tiers are
    a closed set, so a value outside it is an error (a recording may carry others)."""
    file, pre = _where(policy.source, parent, "policy")
    out = []
    for name, sig in policy.signals.items():
        if sig.kind == "promql":
            out += _check_promql_names(sig, f"{pre}signals.{name}.promql", name, series,
                                       file, missing, what)
            continue
        for part, asked, sel in _selectors(sig):
            key = f"{pre}signals.{name}.{part}"
            foreign = _foreign_values(sel) if own else []
            for label, v in foreign:
                out.append(Finding(ERROR, file, key + label,
                                   f"no {label} '{v}' in {what}: its {label}s are "
                                   f"{', '.join(RELAKIT_NAMES[label])}"))
            if foreign:
                continue
            found = _matches(sel.source, asked, sel.labels if labels else {}, series)
            if not found:
                hint, sub = _why_no_match(asked, sel, series)
                shown = dataclasses.replace(sel, metric=asked).promql()
                out.append(Finding(missing, file, key + sub,
                                   f"{what} has no series {shown} for signal '{name}', so "
                                   f"it is always 'no data' and conditions on it never hold: "
                                   f"{hint}"))
                continue
            for label, want in (sel.labels if labels else {}).items():
                if not isinstance(want, tuple | list):
                    continue
                for v in want:
                    if not _matches(sel.source, asked, {**sel.labels, label: v}, series):
                        why = (counted_only(v)
                               if label == "outcome" and v in IN_PATH_OUTCOMES else "a typo?")
                        out.append(Finding(WARNING, file, key + label,
                                           f"{label} '{v}' matches no '{asked}' series in "
                                           f"{what}; {why}"))
    return out


# ---- a policy on its own --------------------------------------------------------------------
def _signal_range(sig) -> tuple[float, float] | None:
    """The values a signal can take (scale applied), or None when it is not known."""
    scale = sig.scale
    if scale <= 0:
        return None
    if sig.kind == "ratio":
        return 0.0, scale
    if sig.kind in ("rate", "histogram_quantile"):
        return 0.0, math.inf
    return None


def _never_or_always(op, thr, lo, hi) -> str | None:
    never = {">": thr >= hi, ">=": thr > hi, "<": thr <= lo, "<=": thr < lo}[op]
    always = {">": thr < lo, ">=": thr <= lo, "<": thr > hi, "<=": thr >= hi}[op]
    return "can never hold" if never else "always holds (whenever there is data)" if always \
        else None


def check_policy(policy, parent: str | None = None) -> list[Finding]:
    """Thresholds outside their signal's range; escalations that cannot happen."""
    file, pre = _where(policy.source, parent, "policy")
    out = []
    for c in policy.conditions:
        sig = policy.signals[c.signal]
        rng = _signal_range(sig)
        if rng is None:
            continue
        verdict = _never_or_always(c.op, c.threshold, *rng)
        if verdict:
            kind = {"ratio": "a ratio", "rate": "a rate",
                    "histogram_quantile": "a latency quantile"}[sig.kind]
            span = f"between {rng[0]:g} and {rng[1]:g}" if math.isfinite(rng[1]) else \
                f"{rng[0]:g} or more"
            out.append(Finding(ERROR, file, f"{pre}conditions.{c.name}.threshold",
                               f"'{c.signal} {c.op} {c.threshold:g}' {verdict}: {c.signal} is "
                               f"{kind}, {span}"))
    for i, m in enumerate(policy.modes):
        if m.escalate_to is not None and m.max_duration_s <= 0:
            out.append(Finding(WARNING, file, f"{pre}modes[{i}].escalate_to",
                               f"mode '{m.name}' never escalates to '{m.escalate_to}': "
                               "escalation happens when max_duration_s runs out, and it has "
                               "none"))
    return out


# ---- clocks -----------------------------------------------------------------------------------
def check_window(window_s: float, scrape_s: float, file: str, key: str, scrape_what: str,
                 needs_rates: bool = True) -> list[Finding]:
    """A window must hold two scrapes for a rate; Prometheus advises four."""
    if not needs_rates:
        return []
    if window_s < scrape_s:
        return [Finding(ERROR, file, key,
                        f"a {window_s:g} s window is shorter than {scrape_what} ({scrape_s:g} s): "
                        "it holds at most one sample, so every rate, ratio and quantile is "
                        "'no data' and nothing is ever decided; make it at least "
                        f"{2 * scrape_s:g} s (Prometheus advises {4 * scrape_s:g} s)")]
    if window_s < 2 * scrape_s:
        return [Finding(WARNING, file, key,
                        f"a {window_s:g} s window holds only one or two samples at {scrape_what} "
                        f"({scrape_s:g} s): rates are 'no data' at some evaluations; make it "
                        f"at least {2 * scrape_s:g} s (Prometheus advises {4 * scrape_s:g} s)")]
    return []


def check_clocks(clocks, parent: str | None = None, needs_rates: bool = True
                 ) -> list[Finding]:
    file, pre = _where(clocks.source, parent, "clocks")
    out = check_window(clocks.window_s, clocks.scrape_s, file, f"{pre}window_s",
                       "the scrape interval", needs_rates)
    if clocks.eval_s > clocks.window_s:
        out.append(Finding(WARNING, file, f"{pre}eval_s",
                           f"evaluations every {clocks.eval_s:g} s look at {clocks.window_s:g} s "
                           "windows: what happens between two windows is never seen"))
    return out


def policy_needs_rates(policy) -> bool:
    """Whether a policy reads a rate (so its window must hold two scrapes)."""
    return policy is not None and any(s.kind in RATE_KINDS for s in policy.signals.values())


# ---- a chain ------------------------------------------------------------------------------------
def check_chain(chain, nodes: int | None, parent: str | None = None, what: str = "the fleet"
                ) -> list[Finding]:
    """Nodes the chain names must exist; a load threshold above 1 never throttles."""
    from relakit.chain import Aegis, Sentinel

    file, pre = _where(chain.source, parent, "chain")
    out = []
    for st in chain.stages:
        if isinstance(st, Sentinel) and nodes is not None:
            bad = [p for p in st.call_graph if max(p) >= nodes]
            if bad:
                out.append(Finding(ERROR, file, f"{pre}sentinel.call_graph",
                                   f"{bad[0]} names node {max(bad[0])}, but {what} has "
                                   f"{nodes} node(s), numbered 0 to {nodes - 1}"))
        if isinstance(st, Aegis):
            if st.load_threshold > 1:
                out.append(Finding(WARNING, file, f"{pre}aegis.load_threshold",
                                   f"{st.load_threshold:g} is above 1: utilisation (busy "
                                   "servers over servers) never exceeds 1, so Aegis never "
                                   "throttles"))
            for cname, spec in st.classes.items():
                bad = [n for n in spec["nodes"] if nodes is not None and n >= nodes]
                if bad:
                    out.append(Finding(ERROR, file, f"{pre}aegis.classes.{cname}.nodes",
                                       f"node {bad[0]} is outside {what} ({nodes} node(s), "
                                       f"0 to {nodes - 1})"))
    if chain.servers is not None and nodes is not None and len(chain.servers) != nodes:
        out.append(Finding(ERROR, file, f"{pre}servers",
                           f"{len(chain.servers)} server counts for {what} of {nodes} "
                           "node(s): give one per node"))
    return out


def check_chain_clocks(chain, clocks, parent: str | None = None) -> list[Finding]:
    """What a chain asks of the clocks: an adaptive baseline spans at least one window
    (shorter, it would hold at most one reading, or none a scrape could fill)."""
    file, pre = _where(chain.source, parent, "chain")
    out = []
    for st in chain.stages:
        span = getattr(st, "adaptive", {}).get("baseline_window_s")
        if span is not None and span < clocks.window_s:
            out.append(Finding(ERROR, file, f"{pre}aegis.adaptive.baseline_window_s",
                               f"{span:g} s is shorter than the clocks' window_s "
                               f"({clocks.window_s:g} s; scrape interval {clocks.scrape_s:g} s):"
                               " a baseline needs at least one window of readings"))
    return out


# ---- a scenario, before it runs ------------------------------------------------------------
def _policy_checks(sc) -> list[Finding]:
    """``sc.policy`` against the fleet it decides: its own checks, the series it reads,
    the flags it sets and the counters it expects to move."""
    from relakit.sim.spec import in_path

    return (check_policy(sc.policy, sc.source)
            + check_signals(sc.policy, simulator_series(sc.metrics.latency_buckets_s,
                                                        in_path(sc)),
                            missing=ERROR, what="the simulator", parent=sc.source, own=True)
            + check_local_flags(sc) + check_unmoved(sc))


def check_scenario(sc) -> list[Finding]:
    """Everything that can be known about a scenario without running it."""
    out = []
    src = sc.source
    if sc.policy is not None:
        out += _policy_checks(sc)
    if sc.rollout is not None:  # the canary's new policy meets the same fleet
        out += [dataclasses.replace(f, key="rollout." + f.key)
                if f.file == src and f.key.startswith("policy.") else f
                for f in _policy_checks(dataclasses.replace(sc, policy=sc.rollout.policy))]
    if sc.chain is not None:
        out += check_chain(sc.chain, sc.fleet.nodes, src)
    if sc.clocks is not None and (sc.policy is not None or sc.chain is not None):
        out += check_clocks(sc.clocks, src, policy_needs_rates(sc.policy)
                            or sc.chain is not None)
        if sc.chain is not None:
            out += check_chain_clocks(sc.chain, sc.clocks, src)
    out += check_load(sc)
    out += check_arrival_shape(sc)
    out += check_throttle(sc)
    out += check_sampled(sc)
    for i, f in enumerate(sc.faults):
        if f.start_s >= sc.duration_s:
            out.append(Finding(WARNING, src, f"faults[{i}].start_s",
                               f"{f.start_s:g} s is not before the end of the run "
                               f"(duration_s {sc.duration_s:g}): this fault never happens"))
    return out


def unsampled_s(duration_s: float, interval_s: float) -> float:
    """Seconds of a run after its last metrics sample (samples at 0, interval_s, ...):
    ``duration_s`` modulo ``interval_s``, 0 when it is a multiple (to 1e-9 relative)."""
    k = math.floor(duration_s / interval_s + 1e-9)
    tail = duration_s - k * interval_s
    return 0.0 if tail <= 1e-9 * max(duration_s, 1.0) else tail


def check_sampled(sc) -> list[Finding]:
    """A run whose duration is not a multiple of its scrape interval: the metrics grid (the
    fleet's samples at 0, interval_s, ...) ends before the run, so the control plane and
    every metric-derived table never see its last seconds (a 100 s run scraped every 15 s
    was last sampled at 90 s). A warning: the request-level tables do see them. Per-target
    scrape phases (``metrics.phase_s``) offset each target's scrapes within one interval by
    design, and are not counted here."""
    d, dt = sc.duration_s, sc.metrics.interval_s
    tail = unsampled_s(d, dt)
    if not tail:
        return []
    k = math.floor(d / dt + 1e-9)
    given = (f"metrics.interval_s ({dt:g} s, clocks.scrape_s)" if sc.clocks is not None
             else f"metrics.interval_s ({dt:g} s)")
    lower = f"{k * dt:g} or " if k else ""
    return [Finding(WARNING, sc.source, "duration_s",
                    f"{d:g} s is not a multiple of {given}: its last {tail:g} s (after the "
                    f"last sample at {k * dt:g} s) are never sampled, so the control plane "
                    f"and every metric-derived table miss them; use duration_s "
                    f"{lower}{(k + 1) * dt:g} (a multiple of {dt:g}), or an interval that "
                    f"divides {d:g}")]


def check_throttle(sc) -> list[Finding]:
    """A client throttle counts an accept for every copy a node served while its client
    waited: with nothing that refuses a copy or gives up on one (a queue limit, a
    concurrency limit, CoDel, a deadline, shedding, a crash, a control plane that may
    shed or isolate), every request is accepted and it never throttles."""
    mit, fl, wl = sc.mitigations, sc.fleet, sc.workload
    if mit.client_throttle is None:
        return []
    refuses = (fl.queue_limit is not None or mit.concurrency_limit is not None
               or mit.codel is not None or wl.deadline_ms is not None
               or bool(sc.controls.shed_tiers) or any(f.crash for f in sc.faults)
               or getattr(sc, "policy", None) is not None
               or getattr(sc, "chain", None) is not None)
    return [] if refuses else [Finding(
        WARNING, sc.source, "mitigations.client_throttle",
        "nothing in this scenario refuses a request or gives up on one (no "
        "fleet.queue_limit, concurrency_limit, codel, workload.deadline_ms, shedding, "
        "crash or control plane): every request is accepted and the throttle never "
        "throttles; add one of them or drop the throttle")]


#: the in-path mechanisms' own series (issue 33) and the mitigations.<key> that move each;
#: the simulator exports them in any run with an in-path mechanism (``in_path``), and they
#: stay 0 unless one of their keys is configured (the outcomes: ``IN_PATH_COUNTED_BY``)
IN_PATH_SERIES_COUNTED_BY = {"client_throttled_total": ("client_throttle",),
                             "rejected_total": ("concurrency_limit", "codel"),
                             "codel_dropped_total": ("codel",),
                             "concurrency_limit": ("concurrency_limit",)}


def _movers(series, counted_by=IN_PATH_COUNTED_BY,
            series_counted_by=IN_PATH_SERIES_COUNTED_BY) -> tuple[str, ...] | None:
    """The mitigations.<key>s that can move a series (src, name, tier, outcome, le): by its
    outcome (``counted_by``; () when none can) or its name (``series_counted_by``); None
    when it moves without an in-path mechanism. The tables default to the simulator's."""
    if series[3] in counted_by:
        return counted_by[series[3]]
    return series_counted_by.get(series[1])


def _unmoved_reads(policy, series, configured, counted_by=IN_PATH_COUNTED_BY,
                   series_counted_by=IN_PATH_SERIES_COUNTED_BY):
    """(signal, key under it, what reads, the series read) for each signal or selector that
    reads only series no ``configured`` mechanism moves, per the counted-by tables: a
    selector's own series, or for a ``promql:`` signal every one of its selectors'
    (refused only when all of them read nothing else). The simulator's check and the lab's
    share it; each words its own finding."""
    from relakit.control.promql import selectors

    def unmoved(s):
        movers = _movers(s, counted_by, series_counted_by)
        return movers is not None and not set(movers) & configured

    for name, sig in policy.signals.items():
        if sig.kind == "promql":
            reads = [r for r in (_promql_series(sel, series) for sel in selectors(sig.node)) if r]
            if reads and all(unmoved(s) for r in reads for s in r):
                yield name, "promql", "its selectors read", [s for r in reads for s in r]
            continue
        for part, asked, sel in _selectors(sig):
            found = _matches(sel.source, asked, sel.labels, series)
            if found and all(unmoved(s) for s in found):
                sub = "outcome" if found[0][3] in counted_by else "metric"
                shown = dataclasses.replace(sel, metric=asked).promql()
                yield name, f"{part}{sub}", f"{shown} reads", found


def _promql_series(sel, series) -> list[tuple]:
    """The simulator series a PromQL selector can read: by name, and by its equality
    matchers on tier and outcome (other matchers are evaluated, not checked)."""
    eq = {k: v for k, op, v in sel.matchers if op == "=" and k in ("tier", "outcome")}
    return [s for s in series if s[1] == sel.name
            and all({"tier": s[2], "outcome": s[3]}[k] == v for k, v in eq.items())]


def check_unmoved(sc) -> list[Finding]:
    """A signal that reads only series no configured mechanism can move: the in-path
    mechanisms' outcomes and series exist in any run with one of them (``in_path``), but
    ``throttled`` stays 0 without a client throttle, ``rejected`` without a concurrency
    limit or CoDel, so ``throttle_ratio`` beside LIFO alone reads 0 all run and a
    condition on it never holds, silently. A signal counting them among others (errors,
    timeouts and ``rejected``) reads what there is, and passes; a PromQL signal is refused
    only when every selector it has reads nothing else."""
    from relakit.sim.spec import in_path

    if not in_path(sc):  # no in-path series at all: check_signals refuses them by name
        return []
    mit = sc.mitigations
    configured = {k for k in IN_PATH_KEYS if getattr(mit, k) is not None}
    have = (", ".join(f"mitigations.{k}" for k in sorted(configured)) if configured else
            f"only fleet.queue_discipline {sc.fleet.queue_discipline}, which refuses nothing")
    series = simulator_series(sc.metrics.latency_buckets_s, True)
    file, pre = _where(sc.policy.source, sc.source, "policy")
    return [_unmoved_finding(file, f"{pre}signals.{name}.{key}", name, what, found, have)
            for name, key, what, found in _unmoved_reads(sc.policy, series, configured)]


def _unmoved_finding(file, key, name, what, found, have) -> Finding:
    movers = " or ".join(f"mitigations.{k}" for k in dict.fromkeys(k for f in found
                                                                   for k in _movers(f) or ()))
    return Finding(ERROR, file, key,
                   f"signal '{name}': {what} a counter only {movers} moves, and this "
                   f"scenario has {have}: it reads 0 all run and conditions on it never "
                   "hold; add the mechanism, or drop the signal and its conditions")


def check_local_flags(sc) -> list[Finding]:
    """A policy's mode that sets an in-path mechanism's parameter (issue 33's
    ``throttle_k``, ``concurrency_max``) needs the mechanism in the scenario: else the
    flag would be silently ignored."""
    mit = sc.mitigations
    needs = {"throttle_k": ("client_throttle", mit.client_throttle),
             "concurrency_max": ("concurrency_limit", mit.concurrency_limit)}
    file, prefix = _where(sc.policy.source, sc.source, "policy")
    out = []
    modes = [("normal", sc.policy.normal)] + [(m.name, m.asserts) for m in sc.policy.modes]
    for i, (name, asserts) in enumerate(modes):
        for flag, (key, mech) in needs.items():
            if asserts.get(flag) is not None and mech is None:
                where = "normal" if i == 0 else f"modes[{i - 1}].assert"
                out.append(Finding(ERROR, file, f"{prefix}{where}.{flag}",
                                   f"mode {name} sets {flag}, but the scenario has no "
                                   f"mitigations.{key} for it to set; add one or drop "
                                   "the flag"))
    return out


#: the key that places an arrival shape's first change, by kind
ARRIVAL_CHANGE_KEY = {"step": "at_s", "spike": "start_s", "ramp": "start_s"}


def check_arrival_shape(sc) -> list[Finding]:
    """An arrival shape whose every change falls at or after the run's end: the run sees a
    constant rate while the file describes a step, spike or ramp."""
    a = sc.workload.arrival
    changes = [t for t, r0, r1 in zip(a.times_s[1:], a.rates_rps[:-1], a.rates_rps[1:],
                                      strict=True) if r0 != r1]
    if not changes or min(changes) < sc.duration_s:
        return []
    key = "workload.arrival." + ARRIVAL_CHANGE_KEY.get(a.kind, "kind")
    return [Finding(WARNING, sc.source, key,
                    f"the {a.kind}'s rate first changes at {min(changes):g} s, not before the "
                    f"end of the run (duration_s {sc.duration_s:g}): the run sees a constant "
                    f"{a.rates_rps[0]:g} req/s")]


def check_load(sc) -> list[Finding]:
    """Offered load at or over capacity with unbounded queues: no steady state."""
    fl, wl = sc.fleet, sc.workload
    rate = wl.arrival.mean_rate(sc.duration_s, sc.warmup_s)
    offered = rate * wl.fanout * sc.duration_s  # every call the run could ever queue
    util = sc.offered_utilisation
    if "overload" in sc.intended:  # the scenario's design: said once, by its peak
        peak = max(wl.arrival.rates_rps) * wl.fanout / fl.capacity_rps
        return [] if peak >= 1.0 else [Finding(
            WARNING, sc.source, "intended",
            f"declares an intended overload, but the offered load peaks at {peak:.2f}x "
            "capacity: it never happens; drop 'overload' or raise the load")]
    if fl.queue_limit is not None and fl.queue_limit * fl.nodes < offered:
        return []
    mit = sc.mitigations  # a server's own admission control bounds its queue (issue 33)
    if mit.concurrency_limit is not None or mit.codel is not None:
        return []
    fan = f" x fan-out {wl.fanout}" if wl.fanout > 1 else ""
    unset = ("is unset" if fl.queue_limit is None else
             f"({fl.queue_limit:g} a node) is more than the run's {offered:.3g} calls could "
             "fill, so it never binds")
    tail = (f"and fleet.queue_limit {unset}: queues grow without bound, the run never "
            "reaches a steady state (its memory grows with the backlog), and requests still "
            "queued at the end are not in the summary; lower the rate, add servers or set "
            "fleet.queue_limit")
    if util >= 1.0:
        at = (f"{fl.service.mean_ms:g} ms" if not fl.service_scale else
              f"{fl.service.mean_ms:g} ms x fleet.service_scale")
        return [Finding(WARNING, sc.source, "workload.arrival",
                        f"the offered load ({rate:.4g} rps{fan}) is {util:.2f}x the fleet's "
                        f"capacity ({fl.capacity_rps:.4g} rps: {sum(fl.servers)} servers at "
                        f"{at}) {tail}")]
    # a slow node (fleet.service_scale) can be overloaded in a fleet with capacity to
    # spare when routing fixes each node's share (weights). Only for scaled fleets: with
    # one service, an overloaded heavy weight is a scenario's own design (chain-throttle)
    shares = fl.node_shares(wl.fanout)
    if shares is None or not fl.service_scale:
        return []
    node_util = [rate * s / c for s, c in zip(shares, fl.node_capacity_rps, strict=True)]
    worst = int(np.argmax(node_util))
    if node_util[worst] < 1.0:
        return []
    return [Finding(WARNING, sc.source, "workload.arrival",
                    f"node {worst} is offered {node_util[worst]:.2f}x its capacity "
                    f"({rate * shares[worst]:.4g} of {rate:.4g} rps by fleet.weights, against "
                    f"{fl.node_capacity_rps[worst]:.4g} rps: {fl.servers[worst]} servers at "
                    f"{fl.node_mean_ms[worst]:g} ms) {tail}")]


def available_memory() -> int:
    """Bytes of memory available now (Linux: MemAvailable), else the physical total."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import os

    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _size(b: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if b < 1024 or unit == "PiB":
            return f"{b:.3g} {unit}"
        b /= 1024
    return f"{b:.3g} PiB"  # pragma: no cover


def check_memory(sc, record_requests: bool, available: int | None = None) -> list[Finding]:
    """Refuse a run that cannot fit in memory; warn about one that would take most of it
    (the estimate is the data plane's own: :func:`relakit.sim.run_memory`)."""
    from relakit.sim import run_memory

    est = run_memory(sc, record_requests)
    avail = available_memory() if available is None else available
    if est["total"] <= MEMORY_WARN_SHARE * avail:
        return []
    parts = [f"metrics grid and table {_size(est['grid'] + est['table'])} "
             f"({est['samples']:.3g} samples x {sc.fleet.nodes} node(s))"]
    if est["records"] > 0.1 * est["total"]:
        parts.append(f"per-request records {_size(est['records'])}")
    if est["pools"] > 0.1 * est["total"]:
        parts.append(f"request pools {_size(est['pools'])}")
    advice = ("raise metrics.interval_s (samples = duration_s / interval_s) or shorten "
              "duration_s" + ("; --no-requests drops the records" if record_requests and
                             est["records"] > 0.1 * est["total"] else ""))
    sev = ERROR if est["total"] > avail else WARNING
    verb = "needs" if sev == ERROR else "would take"
    key = "duration_s" if est["pools"] < 0.5 * est["total"] else "fleet.servers"
    return [Finding(sev, sc.source, key,
                    f"a {sc.duration_s:g} s run {verb} about {_size(est['total'])} "
                    f"({'; '.join(parts)}), and {_size(avail)} of memory is available: "
                    f"{advice}")]


def check_run(sc, record_requests: bool = True) -> list[Finding]:
    """A scenario's checks plus the memory its run needs (used by ``simulate``)."""
    return check_scenario(sc) + check_memory(sc, record_requests)


# ---- a sweep, before any point runs ---------------------------------------------------------
def _sweep_key(spec, key: str) -> str:
    if key in spec.grid:
        return f"grid.{key}"
    if key in spec.ranges:
        return f"samples.ranges.{key}"
    return f"base.{key}"


def check_sweep(spec) -> list[Finding]:
    """Every point's scenario, loaded with its overrides and checked, before any runs.

    A key that leads nowhere or a value the scenario refuses is an error naming
    the sweep's key; a warning that many points share is reported once, with the
    number of points it concerns."""
    import re

    from relakit.scenario import OverrideError, load_scenario

    if spec.kind != "function":
        return []
    points = spec.points()
    found: dict = {}
    failing = 0  # points that cannot run
    for point in points:
        overrides = {k: v for k, v in point.items() if k != "seed"}
        try:
            sc = load_scenario(display_path(spec.target), overrides=overrides)
            got = check_run(sc, spec.record_requests)
        except OverrideError as exc:
            got = [Finding(ERROR, spec.source, _sweep_key(spec, exc.key), exc.problem)]
        except CheckError as exc:
            got = exc.findings
        except ScenarioError as exc:
            text = " ".join(str(exc).split())
            m = re.match(r"^.*?: key '([^']*)': (.*)$", text)
            inner = m[1] if m else ""
            hit = [k for k in overrides if inner == k or inner.startswith(k + ".")
                   or k.startswith(inner + ".")] if inner else []
            if hit:
                got = [Finding(ERROR, spec.source, _sweep_key(spec, hit[0]),
                               f"{point[hit[0]]!r} is refused by the scenario: {text}")]
            else:
                got = [Finding(ERROR, spec.source, "scenario", text)]
        failing += any(f.severity == ERROR for f in got)
        for f in got:
            k = (f.severity, f.file, f.key)
            if k not in found:
                found[k] = [f, 0]
            found[k][1] += 1
    # a point that cannot run is recorded as failed and the rest go on (a sweep is
    # often a search of where things break); only when no point can run is it refused
    demote = 0 < failing < len(points)
    out = []
    for f, n in found.values():
        sev = WARNING if demote else f.severity
        msg = f.message
        if len(points) > 1:
            msg += f" (in {n} of {len(points)} points"
            msg += "; they will be recorded as failed)" if demote and f.severity == ERROR \
                else ")"
        out.append(Finding(sev, f.file, f.key, msg))
    return out


# ---- the live lab ------------------------------------------------------------------------------
#: what the lab's data plane exports (relakit/lab/dataplane.py), per instance
LAB_SERIES = ("requests_total", "latency_seconds_bucket", "latency_seconds_sum",
              "latency_seconds_count", "in_flight", "busy_seconds_total", "flag")


#: the in-path outcomes the lab's instances count, and the lab's mitigations that move each:
#: a throttled request never leaves its client (the load generator's or the front's)
LAB_COUNTED_BY = {"rejected": ("concurrency_limit",), "throttled": ()}


def check_lab(policy, clocks, buckets_s=None, extra_series=(), mechanisms=()) -> list[Finding]:
    """The agent's policy against the data plane's metric names (``extra_series``: those of
    the lab's in-path mechanisms, when on); the lab's clocks; its thresholds against the
    latency histogram's buckets (``buckets_s``, seconds). ``mechanisms``: the in-path
    mitigations the lab runs; a signal reading only an outcome none of them moves is
    refused (:func:`check_unmoved`, the simulator's case)."""
    series = [("nodes", n, None, None, None) for n in (*LAB_SERIES, *extra_series)]
    return (check_policy(policy)
            + check_signals(policy, series, missing=ERROR, what="the lab's data plane",
                            labels=False, own=True)
            + _lab_unmoved(policy, set(mechanisms))
            + [Finding(f.severity, "lab", "--" + f.key.replace("_", "-"), f.message)
               for f in check_clocks(clocks, needs_rates=policy_needs_rates(policy))]
            + ([] if buckets_s is None else check_bucket_edges(policy, buckets_s)))


def _lab_unmoved(policy, configured) -> list[Finding]:
    """:func:`_unmoved_reads` over the lab's ``requests_total{tier,outcome}`` with
    :data:`LAB_COUNTED_BY` (the lab has no client series: check_signals refuses those)."""
    series = [("nodes", "requests_total", t, o, None) for t in TIERS for o in OUTCOMES]
    out = []
    for name, key, what, found in _unmoved_reads(policy, series, configured,
                                                 LAB_COUNTED_BY, {}):
        want = tuple(dict.fromkeys(s[3] for s in found))
        movers = {k for v in want for k in LAB_COUNTED_BY[v]}
        why = (f"only a concurrency limit moves it, and the lab runs "
               f"{', '.join(sorted(configured)) or 'no in-path mitigation'} (--mitigations)"
               if movers else "the lab's instances never count it (a throttled request "
               "never leaves its client)")
        out.append(Finding(ERROR, policy.source, f"signals.{name}.{key}",
                           f"signal '{name}': {what} only outcome "
                           f"{' or '.join(map(repr, want))}: {why}, so it reads nothing "
                           "all run and conditions on it never hold"))
    return out


def check_bucket_edges(policy, buckets_s) -> list[Finding]:
    """A warning for each condition whose threshold on a histogram quantile sits on a
    bucket bound: the quantile is read by interpolating inside a bucket, so it crosses a
    bound as soon as a hair over the quantile's share lies past it (the live lab entered
    survival at 37 % load on RelA's 250 ms, a bucket edge, in 1 run of 8)."""
    out = []
    for c in policy.conditions:
        sig = policy.signals[c.signal]
        if sig.kind != "histogram_quantile":
            continue
        edge = next((b for b in buckets_s
                     if math.isclose(b * sig.scale, c.threshold, rel_tol=1e-9)), None)
        if edge is not None:
            out.append(Finding(
                WARNING, policy.source, f"conditions.{c.name}.threshold",
                f"{c.threshold:g} sits on the latency histogram's bucket bound {edge:g} s: "
                f"{c.signal} crosses it once a hair over {1 - sig.q:.3g} of requests lies "
                "past the bound, so noise decides; move the threshold inside a bucket or "
                "the buckets (--buckets) off it"))
    return out


# ---- a trace, before a replay ------------------------------------------------------------------
def scrape_interval(tsdb) -> float | None:
    """The median gap between a trace's scrapes (over its targets), or None (< 2 scrapes)."""
    gaps = [np.diff(t.times) for t in tsdb.targets if t.times.size >= 2]
    gaps = [g[g > 0] for g in gaps]
    gaps = np.concatenate(gaps) if gaps else np.zeros(0)
    return float(np.median(gaps)) if gaps.size else None


def check_trace(frame, source: str) -> list[Finding]:
    """A trace on its own: it must hold samples, and a histogram's cumulative buckets must
    not fall as the bound grows (histogram_quantile would answer from a broken CDF)."""
    import polars as pl

    if frame.height == 0 or frame.filter(pl.col("value").is_not_nan()).height == 0:
        return [Finding(ERROR, source, "value",
                        "the trace holds no samples (only a header, or only NaN values)")]
    series = ["node", "name", "tier", "outcome", "time_s"]
    falls = (frame.filter(pl.col("name").str.ends_with("_bucket") & pl.col("le").is_not_null())
             .with_columns(pl.col("le").cast(pl.Float64, strict=False).alias("_le"))
             .sort([*series, "_le"])
             .with_columns(pl.col("value").diff().over(series).alias("_step"))
             .filter(pl.col("_step") < -1e-9 * pl.max_horizontal(pl.col("value").abs(), 1.0)))
    # (a synthetic trace's float rounding, 1e-11 of a count, is no fall)
    if falls.height:
        f = falls.row(0, named=True)
        return [Finding(WARNING, source, f"{f['name']}{{le=\"{f['le']}\"}}",
                        f"{falls.height} cumulative bucket sample(s) fall below the bucket "
                        f"before them, e.g. node {f['node']} at {f['time_s']:g} s "
                        f"({f['_step']:g}): buckets count every request up to their bound, so "
                        "quantiles from them are wrong")]
    return []


def check_replay(frame, source: str, policy=None, chain=None, clocks=None, start_s=None,
                 end_s=None, times=None, tsdb=None) -> list[Finding]:
    """A policy and/or chain against the trace it is about to be replayed over
    (``tsdb``: the frame already pivoted, if the caller has it)."""
    from relakit.control.tsdb import TSDB

    out = check_trace(frame, source)
    if out:
        return out
    series = trace_series(frame)
    what = f"the trace {source}"
    if policy is not None:
        out += check_policy(policy)
        # names only: a labelled series appears in a trace on its first event, so a
        # missing outcome="timeout" may only mean there was none
        out += check_signals(policy, series, missing=WARNING, what=what, labels=False)
    chain_reads = False
    if chain is not None:
        chain_reads = bool(_matches("nodes", "requests_total", {}, series))
        if not chain_reads:
            out.append(Finding(WARNING, chain.source, "sentinel",
                               f"{what} has no per-node requests_total series: Sentinel reads "
                               "nothing, so the chain never acts"))
    policy_reads = policy is not None and any(
        _matches(sel.source, asked, {}, series)
        for sig in policy.signals.values() for _, asked, sel in _selectors(sig)
    ) or _promql_reads(policy, series)
    if not policy_reads and not chain_reads:
        names = sorted({s[1] for s in series})
        shown = ", ".join(names[:10]) + (", ..." if len(names) > 10 else "")
        wanted = sorted({asked for sig in (policy.signals.values() if policy else ())
                         for _, asked, _ in _selectors(sig)} | (
            {"requests_total"} if chain is not None else set()))
        out.append(Finding(ERROR, source, "name",
                           f"no samples for any signal: the controller reads "
                           f"{', '.join(wanted)}, and the trace holds only {shown}"))
        return out
    tsdb = TSDB.from_long(frame) if tsdb is None else tsdb
    if chain is not None:
        out += check_chain(chain, max(tsdb.nodes) + 1 if tsdb.nodes else 0,
                           what="the trace")
    needs_rates = policy_needs_rates(policy) or chain is not None
    gap = scrape_interval(tsdb)
    if gap is None and needs_rates:
        out.append(Finding(ERROR, source, "time_s",
                           "every series has a single sample (one scrape: a single snapshot?); "
                           "rates need two scrapes in a window: record over time, or give a "
                           "folder of snapshots"))
    elif gap is not None and clocks is not None:
        out += check_window(clocks.window_s, gap, clocks.source, "window_s",
                            f"the trace's scrape interval in {source}", needs_rates)
    lo, hi = tsdb.span
    if times is None and start_s is not None and end_s is not None and start_s > end_s:
        out.append(Finding(ERROR, source, "start_s", f"the first evaluation ({start_s:g} s) is "
                           f"after the last ({end_s:g} s)"))
    elif times is None and clocks is not None:
        a = lo if start_s is None else start_s
        b = hi if end_s is None else end_s
        if clocks.eval_times(a, b).size == 0:
            out.append(Finding(ERROR, source, "start_s",
                               f"no evaluation instant between {a:g} s and {b:g} s "
                               f"(every {clocks.eval_s:g} s from phase "
                               f"{clocks.eval_phase_s:g} s)"))
        elif (start_s is not None and start_s > hi) or (end_s is not None and end_s < lo):
            out.append(Finding(WARNING, source, "start_s" if start_s is not None and
                               start_s > hi else "end_s",
                               f"the evaluations ({a:g} s to {b:g} s) lie outside the trace, "
                               f"which covers {lo:g} s to {hi:g} s: they see no data"))
    return out


__all__ = ["ERROR", "WARNING", "CheckError", "Finding", "RelakitWarning", "available_memory",
           "check_chain", "check_clocks", "check_lab", "check_load", "check_memory",
           "check_policy", "check_replay", "check_run", "check_sampled", "check_scenario",
           "check_signals", "check_sweep", "check_trace", "enforce", "scrape_interval",
           "simulator_series", "trace_series", "unsampled_s"]
