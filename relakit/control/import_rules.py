"""Prometheus alerting rules as a relakit policy (``relakit import-rules``).

Each alert the user maps to one of RelA's modes becomes a signal, a condition and a
mode of its own (so a firing alert's name is the mode's name in the audit):

* **signal**: a ``promql`` signal. An alert ``X > k`` (also ``>=``, ``<``, ``<=``;
  ``k`` a constant expression) becomes the signal ``max(X)`` (``min(X)`` for ``<``,
  ``<=``) with the condition ``> k``: "some label set breaches". Any other alert
  expression (a filter such as ``(a > x) + 0 * (b > y)``) becomes ``count(EXPR)``
  with the condition ``> 0``: "the expression returns something", which is exactly
  when Prometheus holds the alert pending or firing. The signal is named after the
  alert and its labels (``Alert{severity="page"}``), so the audit's reason names both.
* **condition**: named after the alert.
* **mode**: named after the alert, asserting the flags of the RelA mode it maps to
  (``survival``: shed bronze, degrade, no hedging; ``performance``: hedging), modes
  mapped to survival first, then performance, each in file order. ``for:`` becomes
  ``enter_after = ceil(for / interval) + 1``: Prometheus marks an alert pending at the
  first breaching evaluation and fires it at the first evaluation ``for`` later, i.e.
  at the (ceil(for/interval) + 1)-th consecutive breach, which is what the policy
  counts. ``exit_after: 1``: an alert resolves at the first evaluation it is absent.
* **recording rules** are inlined: a selector of a recorded series becomes the
  recording expression in parentheses (a recorded series read with matchers, a
  range or ``offset`` cannot be inlined and is refused).
* **evaluation clock**: the group's ``interval`` is the policy's ``eval_s``, written
  as a clocks file beside the policy (``POLICY.clocks.yaml``; a policy holds no
  clocks). All imported alerts must share one interval.

What differs from Prometheus: a rule's ``for`` counts per label set; the policy counts
evaluations at which *some* label set breaches, so two instances taking turns keep a
mode's run going where neither alert would fire. For an alert that returns one
series (every fleet-wide SLO alert) the two agree instant for instant.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import yaml

from relakit.control import promql
from relakit.control.rules import load_rules
from relakit.validate import ScenarioError, load_yaml

# RelA's modes (params/policies/rela.yaml): the flags a firing alert asserts
RELA_MODES = {
    "survival": {"shed_bronze": True, "hedge_enabled": False, "degraded_mode": True},
    "performance": {"hedge_enabled": True},
}
_THRESHOLD_OPS = {">": "max", ">=": "max", "<": "min", "<=": "min"}


def read_mapping(path=None, pairs=()) -> dict:
    """alert -> mode from a YAML mapping file and ``alert=mode`` pairs (pairs win)."""
    mapping: dict = {}
    if path is not None:
        data, p, _ = load_yaml(path, "mapping")  # also: binary files, keys given twice
        if not isinstance(data, dict) or not data:
            raise ScenarioError(f"{p}: key '(top level)': expected a mapping of alert names "
                                f"to modes ({', '.join(RELA_MODES)})")
        for k, v in data.items():
            if v not in RELA_MODES:
                raise ScenarioError(f"{p}: key '{k}': {v!r} is not a mode; allowed: "
                                    f"{', '.join(RELA_MODES)}")
            mapping[str(k)] = v
    given: dict = {}
    for pair in pairs:
        alert, sep, mode = pair.partition("=")
        if not sep or not alert or mode not in RELA_MODES:
            raise ScenarioError(f"--map {pair!r}: expected ALERT=MODE with MODE one of "
                                f"{', '.join(RELA_MODES)}")
        if given.get(alert, mode) != mode:  # the last would win without a word
            raise ScenarioError(f"--map {pair!r}: {alert} is already mapped to "
                                f"{given[alert]} by an earlier --map; give each alert once")
        given[alert] = mapping[alert] = mode
    return mapping


def import_rules(rules, mapping: dict, source: str = "<rules>") -> tuple[dict, dict]:
    """(policy mapping, clocks mapping) for the mapped alerts of a rule file."""
    groups = load_rules(rules)
    name = str(rules) if not isinstance(rules, dict) else source
    flat = [(g, r) for g in groups for r in g.rules]
    alerts = {r.name for _, r in flat if r.kind == "alert"}
    unknown = sorted(set(mapping) - alerts)
    if unknown:
        raise ScenarioError(f"{name}: the mapping names alert(s) {unknown} the rule file does "
                            f"not have; its alerts: {sorted(alerts)}")
    if not mapping:
        raise ScenarioError(f"{name}: no alert is mapped to a mode: give --map ALERT=MODE "
                            f"or a mapping file (alerts: {sorted(alerts)})")
    recorded: dict = {}
    chosen = []
    for g, r in flat:
        expr = _inline(r, recorded, name)
        if r.kind == "record":
            recorded[r.name] = expr
        elif r.name in mapping:
            chosen.append((g, r, expr))
    intervals = sorted({g.interval_s for g, _, _ in chosen})
    if len(intervals) > 1:
        raise ScenarioError(f"{name}: the mapped alerts' groups have different intervals "
                            f"({', '.join(f'{i:g} s' for i in intervals)}); a policy has one "
                            "evaluation clock: import them separately")
    interval = intervals[0]
    order = list(RELA_MODES)
    chosen.sort(key=lambda c: order.index(mapping[c[1].name]))  # stable: file order kept
    signals, conditions, modes, used = {}, {}, [], set()
    for _g, r, expr in chosen:
        cname = r.name
        k = 2
        while cname in used:  # Prometheus allows one alert name in several rules
            cname, k = f"{r.name}_{k}", k + 1
        used.add(cname)
        sname = cname + promql.format_labels(r.labels)
        sig_expr, op, thr = _signal(expr)
        signals[sname] = {"promql": sig_expr}
        conditions[cname] = {"signal": sname, "op": op, "threshold": thr}
        modes.append({"name": cname, "when": {"any": [cname]},
                      "enter_after": math.ceil(r.for_s / interval - 1e-9) + 1,
                      "exit_after": 1, "assert": dict(RELA_MODES[mapping[r.name]])})
    policy = {"name": f"rules-{Path(name).stem}", "signals": signals, "conditions": conditions,
              "modes": modes,
              "normal": {"hedge_enabled": False, "shed_bronze": False, "degraded_mode": False}}
    clocks = {"eval_s": interval, "eval_phase_s": 0.0}
    return policy, clocks


def _inline(rule, recorded: dict, name: str) -> str:
    """The rule's expression with every recorded series replaced by its expression."""
    expr = rule.expr
    for sel in promql.selectors(rule.node):
        if sel.name not in recorded:
            continue
        if len(sel.matchers) > 1 or sel.range_s is not None or sel.offset_s:
            raise ScenarioError(f"{name}: key '{rule.key}.expr': reads the recorded series "
                                f"{sel.name!r} with matchers, a range or offset; only a plain "
                                f"{sel.name} can be inlined")
    for rec, rec_expr in recorded.items():
        expr = re.sub(rf"(?<![\w:]){re.escape(rec)}(?![\w:])(\s*\{{\s*\}})?",
                      lambda _m, e=rec_expr: f"({e})", expr)
    promql.parse(expr)  # still an expression
    return " ".join(expr.split())


def _signal(expr: str) -> tuple[str, str, float]:
    """(signal expression, op, threshold): ``X > k`` keeps its threshold, else presence."""
    node = promql.parse(expr)
    if (isinstance(node, promql.Binary) and node.op in _THRESHOLD_OPS and not node.bool_
            and promql._is_scalar(node.rhs) and not promql._is_scalar(node.lhs)):
        lhs = expr[:node.pos].strip()
        try:
            same = promql.parse(lhs) == node.lhs
        except promql.PromQLError:
            same = False
        if same:
            k = float(np.asarray(promql.Evaluator([]).evaluate(node.rhs, [0.0]))[0])
            return f"{_THRESHOLD_OPS[node.op]}({lhs})", node.op, k
    if promql._is_scalar(node):
        raise ScenarioError(f"alert expression {expr!r} is a constant: it never changes")
    return f"count({expr})", ">", 0.0


def write_policy(policy: dict, clocks: dict, out, rules_path) -> tuple[Path, Path]:
    """Write the policy and its clocks file (beside it) atomically; return both paths."""
    from relakit.io import atomic_write

    out = Path(out)
    clocks_path = out.with_name(out.stem + ".clocks.yaml")
    head = (f"# Imported from {rules_path} by `relakit import-rules`: one mode per mapped "
            f"alert.\n# Evaluate it at the rule group's interval: --clocks {clocks_path}\n")
    text = head + yaml.safe_dump(policy, sort_keys=False, width=1000)
    ctext = (f"# The evaluation clock of {out.name}: the rule group's interval.\n"
             + yaml.safe_dump(clocks, sort_keys=False))
    atomic_write(clocks_path, lambda tmp: Path(tmp).write_text(ctext))
    atomic_write(out, lambda tmp: Path(tmp).write_text(text))
    return out, clocks_path
