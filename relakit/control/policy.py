"""A priority policy with hysteresis: named conditions over signals, modes in order.

RelA's rules, made explicit and configurable:

* modes are listed in priority order and the **first match wins**, so survival
  (shed bronze, no hedging) excludes tail optimisation (hedging);
* a mode is entered after ``enter_after`` consecutive breaching evaluations
  (and not during its ``cooldown_s`` after it last left), left after
  ``exit_after`` consecutive clear ones once it has lasted ``min_dwell_s``;
  ``exit_when`` replaces "the trigger stopped" by an explicit condition;
  after ``max_duration_s`` it is left anyway, or escalated to ``escalate_to``;
* a higher-priority mode preempts a lower one at once; a lower one never
  preempts a higher one;
* control is level-triggered: the mode's desired state (``assert``) is
  asserted at every evaluation; outside every mode, ``normal`` is.

The state machine is one numba function, :func:`step`, used both one
evaluation at a time (closed loop) and over a whole trace at once, for many
threshold settings (replay, sweeps), so both paths decide identically.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from relakit.control.signals import parse_signal
from relakit.jit import njit
from relakit.validate import Reader, load_yaml
from relakit.vocab import POLICY_FLAGS

OPS = (">", ">=", "<", "<=")
# What a signal with no value (no samples in its window: a scrape gap, a silent target)
# counts as. ``clear`` is what Prometheus and RelA do: a comparison with an absent
# operand returns nothing, so nothing breaches (and a mode's clear count grows);
# ``hold`` keeps the signal's last present value; ``breach`` counts it as breaching
# every condition on it (fail towards the modes).
MISSING = ("clear", "hold", "breach")

# fleet: one controller for the whole fleet; zone: one per zone of fleet.zones, each
# reading its zone's nodes and setting its zone's flags (relakit.zones)
SCOPES = ("fleet", "zone")
FLAGS = POLICY_FLAGS  # relakit.vocab's: the flags a mode asserts
# Index constants, as relakit.sim.kernel writes them: each group is unpacked from 0, 1,
# 2, ...; the name after a group's last member is its count, nothing counted by hand
_COUNT = range(64)
# events of one evaluation (what step returns beside the mode; EVENT_NAMES[event])
# EV_DEFER: a mode's entry was due (its breach run long enough) but its cooldown held it
# off; the mode decided is the one that stands (normal, or the lower mode held)
(EV_NONE, EV_HOLD, EV_ENTER, EV_EXIT, EV_MAX_DURATION, EV_PREEMPT, EV_ESCALATE, EV_DEFER,
 N_EVENTS, *_) = _COUNT
EVENT_NAMES = ("none", "hold", "enter", "exit", "max_duration", "preempt", "escalate",
               "defer")
assert len(EVENT_NAMES) == N_EVENTS
# columns of Policy.compiled()'s mode_i (per mode: integers) and mode_f (seconds)
MI_WHEN_ALL, MI_HAS_EXIT, MI_EXIT_ALL, MI_ENTER_AFTER, MI_EXIT_AFTER, MI_ESCALATE, N_MI, *_ = (
    _COUNT)
MF_MIN_DWELL, MF_MAX_DURATION, MF_COOLDOWN, N_MF, *_ = _COUNT
# a condition's operator: its position in OPS
OP_GT, OP_GE, OP_LT, OP_LE = (OPS.index(o) for o in (">", ">=", "<", "<="))
NORMAL = -1


@dataclass(frozen=True)
class Condition:
    name: str
    signal: str
    op: str
    threshold: float

    def describe(self, value: float) -> str:
        holds = compare_value(value, self.op, self.threshold)
        shown = self.op if holds else {">": "<=", ">=": "<", "<": ">=", "<=": ">"}[self.op]
        return f"{self.signal} {_fmt(value)} {shown} {_fmt(self.threshold)}"


@dataclass(frozen=True)
class Mode:
    name: str
    when: tuple[str, ...]
    when_all: bool = False
    exit_when: tuple[str, ...] = ()
    exit_all: bool = True
    enter_after: int = 1
    exit_after: int = 1
    min_dwell_s: float = 0.0
    max_duration_s: float = 0.0  # 0: none
    cooldown_s: float = 0.0
    escalate_to: str | None = None
    asserts: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Policy:
    name: str
    signals: dict  # name -> Signal
    conditions: tuple[Condition, ...]
    modes: tuple[Mode, ...]
    normal: dict
    source: str = "<policy>"
    scope: str = "fleet"
    # per signal, what an absent value (no samples in the window) counts as: see MISSING
    on_missing: dict = field(default_factory=dict)

    def missing_rule(self, signal: str) -> str:
        return self.on_missing.get(signal, "clear")

    def desired(self, mode: int) -> dict:
        """The full flag state a mode asserts (normal's values where it is silent)."""
        state = dict(self.normal)
        if mode >= 0:
            state.update(self.modes[mode].asserts)
        return state

    def with_thresholds(self, **thresholds) -> Policy:
        """A copy with some conditions' thresholds changed (for sweeps)."""
        unknown = set(thresholds) - {c.name for c in self.conditions}
        if unknown:
            raise ValueError(f"unknown condition(s) {sorted(unknown)}")
        return replace(self, conditions=tuple(
            replace(c, threshold=float(thresholds.get(c.name, c.threshold)))
            for c in self.conditions))

    # ---- arrays for the state machine -----------------------------------------------
    def compiled(self):
        names = [c.name for c in self.conditions]
        sig_names = list(self.signals)
        m, c = len(self.modes), len(self.conditions)
        when = np.zeros((m, c), np.int64)
        exit_when = np.zeros((m, c), np.int64)
        mode_i = np.zeros((m, N_MI), np.int64)  # columns MI_*
        mode_f = np.zeros((m, N_MF))  # columns MF_*
        for i, md in enumerate(self.modes):
            for w in md.when:
                when[i, names.index(w)] = 1
            for w in md.exit_when:
                exit_when[i, names.index(w)] = 1
            esc = -1 if md.escalate_to is None else [x.name for x in self.modes].index(
                md.escalate_to)
            mode_i[i, MI_WHEN_ALL], mode_i[i, MI_HAS_EXIT] = md.when_all, bool(md.exit_when)
            mode_i[i, MI_EXIT_ALL], mode_i[i, MI_ESCALATE] = md.exit_all, esc
            mode_i[i, MI_ENTER_AFTER], mode_i[i, MI_EXIT_AFTER] = md.enter_after, md.exit_after
            mode_f[i, MF_MIN_DWELL] = md.min_dwell_s
            mode_f[i, MF_MAX_DURATION] = md.max_duration_s
            mode_f[i, MF_COOLDOWN] = md.cooldown_s
        cond_sig = np.array([sig_names.index(x.signal) for x in self.conditions], np.int64)
        cond_op = np.array([OPS.index(x.op) for x in self.conditions], np.int64)
        cond_thr = np.array([x.threshold for x in self.conditions], np.float64)
        return cond_sig, cond_op, cond_thr, when, exit_when, mode_i, mode_f


def new_state(policy: Policy):
    """Hysteresis state: per mode breach run, clear run, last exit time; current mode."""
    m = len(policy.modes)
    state_i = np.zeros(2 * m + 1, np.int64)
    state_i[2 * m] = NORMAL
    state_f = np.full(m + 1, -np.inf)  # last exit per mode, then entered_at
    return state_i, state_f


# ---- the state machine -------------------------------------------------------------
@njit(cache=True)
def _holds(value, op, threshold):
    if value != value:  # no data: nothing breaches
        return False
    if op == OP_GT:
        return value > threshold
    if op == OP_GE:
        return value >= threshold
    if op == OP_LT:
        return value < threshold
    return value <= threshold  # OP_LE


@njit(cache=True)
def _match(flags, mask, need_all):
    any_ = False
    all_ = True
    used = False
    for c in range(mask.shape[0]):
        if mask[c]:
            used = True
            if flags[c]:
                any_ = True
            else:
                all_ = False
    if not used:
        return False
    return all_ if need_all else any_


@njit(cache=True)
def step(state_i, state_f, t, sig_row, cond_sig, cond_op, cond_thr, when, exit_when, mode_i,
         mode_f, breach_buf):
    """One evaluation at time t: update the counters, pick the mode. Returns (mode, event).

    The state (``new_state``): ``state_i[k]`` is mode k's breach run and
    ``state_i[m + k]`` its clear run (evaluations in a row), ``state_i[2m]`` the
    current mode; ``state_f[k]`` is when mode k was last left, ``state_f[m]`` when
    the current mode was entered."""
    m = when.shape[0]
    clear_run, current, entered_at = m, 2 * m, m  # offsets into the state (above)
    for c in range(cond_sig.shape[0]):
        breach_buf[c] = _holds(sig_row[cond_sig[c]], cond_op[c], cond_thr[c])
    for k in range(m):
        matched = _match(breach_buf, when[k], mode_i[k, MI_WHEN_ALL] != 0)
        state_i[k] = state_i[k] + 1 if matched else 0
        if mode_i[k, MI_HAS_EXIT] != 0:
            clear = _match(breach_buf, exit_when[k], mode_i[k, MI_EXIT_ALL] != 0)
        else:
            clear = not matched
        state_i[clear_run + k] = state_i[clear_run + k] + 1 if clear else 0
    cur = state_i[current]
    stay = False
    event = EV_NONE
    if cur >= 0:
        dwell = t - state_f[entered_at]
        if mode_f[cur, MF_MAX_DURATION] > 0.0 and dwell >= mode_f[cur, MF_MAX_DURATION]:
            state_f[cur] = t
            esc = mode_i[cur, MI_ESCALATE]
            if esc >= 0:
                state_i[current] = esc
                state_f[entered_at] = t
                return esc, EV_ESCALATE
            state_i[current] = NORMAL
            cur = NORMAL
            event = EV_MAX_DURATION
        elif (state_i[clear_run + cur] >= mode_i[cur, MI_EXIT_AFTER]
              and dwell >= mode_f[cur, MF_MIN_DWELL]):
            state_f[cur] = t
            state_i[current] = NORMAL
            cur = NORMAL
            event = EV_EXIT  # recovered
        else:
            stay = True
    deferred = False  # a mode above the one that stands was due and held by its cooldown
    for k in range(m):  # priority order: the first match wins
        if stay and k == cur:
            return cur, EV_DEFER if deferred else EV_HOLD
        if state_i[k] >= mode_i[k, MI_ENTER_AFTER]:
            if t - state_f[k] >= mode_f[k, MF_COOLDOWN]:
                prev = state_i[current]
                state_i[current] = k
                state_f[entered_at] = t
                return k, EV_PREEMPT if (stay and prev >= 0) else EV_ENTER
            deferred = True
    return NORMAL, EV_DEFER if (deferred and event == EV_NONE) else event


@njit(cache=True)
def run(times, signals, cond_sig, cond_op, cond_thr, when, exit_when, mode_i, mode_f):
    """The state machine over a whole trace: the mode and event at each evaluation."""
    m = when.shape[0]
    state_i = np.zeros(2 * m + 1, np.int64)
    state_i[2 * m] = NORMAL  # the current mode (step's state layout)
    state_f = np.full(m + 1, -np.inf)
    buf = np.zeros(cond_sig.shape[0], np.bool_)
    modes = np.empty(times.shape[0], np.int64)
    events = np.empty(times.shape[0], np.int64)
    runs = np.empty((times.shape[0], 2 * m), np.int64)
    for i in range(times.shape[0]):
        modes[i], events[i] = step(state_i, state_f, times[i], signals[i], cond_sig, cond_op,
                                   cond_thr, when, exit_when, mode_i, mode_f, buf)
        runs[i] = state_i[: 2 * m]
    return modes, events, runs


@njit(cache=True)
def sweep(times, signals, cond_sig, cond_op, thresholds, when, exit_when, mode_i, mode_f,
          held):
    """Many threshold settings (rows of ``thresholds``) over one trace, no records kept.

    ``held[i]`` is how long the mode decided at ``times[i]`` stands (until the
    next evaluation; see ``controller.hold_times``). Returns per setting:
    seconds in each mode (then normal), mode changes, and the first entry time
    of each mode (NaN if never).
    """
    n = thresholds.shape[0]
    m = when.shape[0]
    time_in = np.zeros((n, m + 1))
    changes = np.zeros(n, np.int64)
    first = np.full((n, m), np.nan)
    buf = np.zeros(cond_sig.shape[0], np.bool_)
    for s in range(n):
        state_i = np.zeros(2 * m + 1, np.int64)
        state_i[2 * m] = NORMAL
        state_f = np.full(m + 1, -np.inf)
        prev = NORMAL
        for i in range(times.shape[0]):
            mode, _ = step(state_i, state_f, times[i], signals[i], cond_sig, cond_op,
                           thresholds[s], when, exit_when, mode_i, mode_f, buf)
            time_in[s, mode if mode >= 0 else m] += held[i]
            if mode != prev:
                changes[s] += 1
                if mode >= 0 and first[s, mode] != first[s, mode]:
                    first[s, mode] = times[i]
                prev = mode
    return time_in, changes, first


def compare_value(value, op, threshold) -> bool:
    """Whether ``value op threshold`` holds (no value never does): the audit's reading of
    what the kernel's ``_holds`` decided."""
    if value != value:
        return False
    return {">": value > threshold, ">=": value >= threshold, "<": value < threshold,
            "<=": value <= threshold}[op]


def _fmt(x: float) -> str:
    if x != x:
        return "no data"
    return f"{x:.3g}" if abs(x) < 1000 else f"{x:.0f}"


# ---- YAML ----------------------------------------------------------------------------------
def load_policy(source) -> Policy:
    """A policy from YAML (path or mapping), every key checked."""
    if isinstance(source, Policy):
        return source
    data, name, _ = load_yaml(source, "policy")
    r = Reader(data, name)
    r.only({"name", "signals", "conditions", "modes", "normal", "on_missing", "scope"})
    sig_r = r.sub("signals")
    if not sig_r.data:
        r.fail("at least one signal is required", "signals")
    default_missing = r.choice("on_missing", MISSING, "clear")
    on_missing, signals = {}, {}
    for k in sig_r.data:
        one = sig_r.sub(k)
        on_missing[k] = one.choice("on_missing", MISSING, default_missing)
        spec = {key: v for key, v in one.data.items() if key != "on_missing"}
        signals[k] = parse_signal(Reader(spec, one.source, one.path), k)
    cond_r = r.sub("conditions")
    conditions = []
    for k in cond_r.data:
        c = cond_r.sub(k)
        c.only({"signal", "op", "threshold"})
        sig = c.choice("signal", tuple(signals))
        if signals[sig].by_node:
            c.fail(f"signal {sig!r} is per node; a mode's condition needs a fleet signal",
                   "signal")
        conditions.append(Condition(k, sig, c.choice("op", OPS, ">"), c.number("threshold")))
    names = [c.name for c in conditions]
    raw_modes = r.data.get("modes")
    if not isinstance(raw_modes, list) or not raw_modes:
        r.fail("expected a list of modes, highest priority first", "modes")
    mode_names = []
    for i, item in enumerate(raw_modes):
        mname = item.get("name") if isinstance(item, dict) else None
        if not isinstance(mname, str) or mname in mode_names or mname == "normal":
            Reader(item if isinstance(item, dict) else {}, name, f"modes[{i}]").fail(
                "each mode needs a unique name other than 'normal'", "name")
        mode_names.append(mname)
    modes = tuple(_mode(Reader(item, name, f"modes[{i}]"), names, mode_names)
                  for i, item in enumerate(raw_modes))
    _escalation_cycles(modes, name)
    _breach_directions(conditions, on_missing, name)
    normal = _asserts(r.sub("normal", {f: False for f in FLAGS}))
    normal = {f: normal.get(f, False) for f in FLAGS}
    return Policy(r.data.get("name", "policy"), signals, tuple(conditions), modes, normal,
                  source=name, on_missing={k: v for k, v in on_missing.items() if v != "clear"},
                  scope=r.choice("scope", SCOPES, "fleet"))


def _breach_directions(conditions, on_missing: dict, source: str) -> None:
    """``on_missing: breach`` stands an absent value in by +inf or -inf, so every condition
    on that signal must point the same way (all ``>``/``>=`` or all ``<``/``<=``)."""
    for sig, rule in on_missing.items():
        ops = {c.op[0] for c in conditions if c.signal == sig}
        if rule == "breach" and len(ops) > 1:
            Reader({}, source, f"signals.{sig}").fail(
                "breach needs every condition on this signal to point one way (all > or "
                "all <): an absent value cannot breach both; use hold or clear",
                "on_missing")


def breach_value(policy: Policy, signal: str) -> float:
    """The value that breaches every condition on ``signal`` (``on_missing: breach``)."""
    ops = {c.op[0] for c in policy.conditions if c.signal == signal}
    return -np.inf if ops == {"<"} else np.inf


def fill_missing(policy: Policy, sig: np.ndarray, last: np.ndarray | None = None):
    """Apply each signal's ``on_missing`` rule to a (T, signals) matrix of values, rows in
    time order; ``last`` (per signal, NaN: none) is the last present value before the
    first row (``hold``), updated in place. Returns (filled matrix, absent mask)."""
    sig = np.array(sig, dtype=float, ndmin=2)
    absent = np.isnan(sig)
    names = list(policy.signals)
    if last is None:
        last = np.full(len(names), np.nan)
    for j, name in enumerate(names):
        rule = policy.missing_rule(name)
        col = sig[:, j]
        if rule == "breach":
            col[absent[:, j]] = breach_value(policy, name)
        elif rule == "hold":
            for i in range(col.size):  # rows are evaluations: a few per call
                if absent[i, j]:
                    col[i] = last[j]
                else:
                    last[j] = col[i]
        if rule != "hold":
            present = ~absent[:, j]
            if present.any():
                last[j] = col[np.flatnonzero(present)[-1]]
    return sig, absent


def _escalation_cycles(modes, source: str) -> None:
    """``escalate_to`` chains must end: a cycle of modes with maximum durations never
    returns to normal, it only hands the fleet round the loop (the issue saw 25 hops)."""
    index = {m.name: i for i, m in enumerate(modes)}
    for i, start in enumerate(modes):
        seen, cur = [start.name], start
        while cur.escalate_to is not None and cur.max_duration_s > 0:
            nxt = modes[index[cur.escalate_to]]
            if nxt.name in seen:
                loop = seen[seen.index(nxt.name):] + [nxt.name]
                Reader({}, source, f"modes[{i}]").fail(
                    f"escalation never ends: {' -> '.join(loop)} is a cycle (each mode "
                    "escalates to the next when its max_duration_s runs out); end the chain "
                    "with a mode that has no escalate_to", "escalate_to")
            seen.append(nxt.name)
            cur = nxt


def _names(r: Reader, key: str, allowed, required: bool):
    spec = r.data.get(key)
    if spec is None and not required:
        return (), True
    if isinstance(spec, dict) and len(spec) == 1 and next(iter(spec)) in ("any", "all"):
        mode, items = next(iter(spec.items()))
    else:
        r.fail("expected {any: [conditions]} or {all: [conditions]}", key)
    if not isinstance(items, list) or not items or any(x not in allowed for x in items):
        r.fail(f"expected a non-empty list from the conditions {sorted(allowed)}, got {items!r}",
               key)
    return tuple(items), mode == "all"


def _asserts(r: Reader) -> dict:
    r.only(FLAGS)
    out = {}
    for f in FLAGS:
        if f in r.data:
            if not isinstance(r.data[f], bool):
                r.fail(f"expected true or false, got {r.data[f]!r}", f)
            out[f] = r.data[f]
    return out


def _mode(r: Reader, conditions, mode_names) -> Mode:
    r.only({"name", "when", "exit_when", "enter_after", "exit_after", "min_dwell_s",
            "max_duration_s", "cooldown_s", "escalate_to", "assert"})
    when, when_all = _names(r, "when", conditions, True)
    exit_when, exit_all = _names(r, "exit_when", conditions, False)
    esc = r.data.get("escalate_to")
    if esc is not None and (esc not in mode_names or esc == r.data["name"]):
        r.fail(f"expected another mode's name from {mode_names}, got {esc!r}", "escalate_to")
    return Mode(
        name=r.data["name"], when=when, when_all=when_all, exit_when=exit_when,
        exit_all=exit_all, enter_after=r.number("enter_after", 1, lo=1, integer=True),
        exit_after=r.number("exit_after", 1, lo=1, integer=True),
        min_dwell_s=r.number("min_dwell_s", 0.0, lo=0),
        max_duration_s=r.number("max_duration_s", 0.0, lo=0),
        cooldown_s=r.number("cooldown_s", 0.0, lo=0), escalate_to=esc,
        asserts=_asserts(r.sub("assert")),
    )
