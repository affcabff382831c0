"""Prometheus alerting rules as a relakit policy (``relakit import-rules``).

Each alert the user maps to one of RelA's modes becomes a signal, a condition and a
mode of its own (so a firing alert's name is the mode's name in the audit):

* **signal**: a ``promql`` signal. An alert ``X > k`` (also ``>=``, ``<``, ``<=``;
  ``k`` a constant expression) without ``for:`` becomes the signal ``max(X)``
  (``min(X)`` for ``<``, ``<=``) with the condition ``> k``: "some label set
  breaches". Any other alert expression ``E`` without ``for:`` becomes ``count(E)``
  with the condition ``> 0``: "the expression returns something", which is exactly
  when Prometheus fires it. With ``for: F`` (evaluated every ``I``) the signal is
  ``count(count_over_time((E)[F':I]) >= N)`` with ``F'`` = F rounded up to whole
  intervals and ``N = F'/I + 1``: the number of label sets present at each of the
  last N evaluations, i.e. firing; so a mode is entered when *a* label set has
  breached for its own ``for:``, as Prometheus fires, never when two label sets take
  turns. The signal is named after the alert and its labels
  (``Alert{severity="page"}``), so the audit's reason names both.
* **condition**: named after the alert.
* **mode**: named after the alert, asserting the flags of the RelA mode it maps to
  (``survival``: shed bronze, degrade, no hedging; ``performance``: hedging), modes
  mapped to survival first, then performance, each in file order; ``enter_after: 1``
  (the signal already counts the ``for:``), ``exit_after: 1``: an alert resolves at
  the first evaluation it is absent. ``keep_firing_for`` is refused, by name.
* **recording rules** are inlined, on the parsed tree (comments gone): a selector of
  a recorded series becomes the recording expression, with the rule's labels set by
  ``label_replace``; label matchers become a filter (the matched label copied to a
  marker label by ``label_replace``, kept by ``and``/``unless on(marker)``, the marker
  removed), exactly a selector's anchored match; a range ``rec[W]`` becomes the
  subquery ``(expr)[W:I]`` at the recording group's interval (the instants the
  recording has samples at); an ``offset``/``@`` read of an instant becomes
  ``last_over_time((expr)[1ms:I] offset ...)``, the sample written at that
  evaluation, which needs the shift on the group's evaluation grid (else refused).
* **evaluation clock**: the group's ``interval`` is the policy's ``eval_s``, written
  as a clocks file beside the policy (``clocks.yaml`` in ``relakit import-rules``'s
  ``--out`` folder; a policy holds no clocks). All imported alerts must share one interval.
"""

from __future__ import annotations

import math
import re
from dataclasses import replace
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
    for _g, r in flat:
        if r.kind == "alert" and r.name in mapping and r.keep_firing_s:
            raise ScenarioError(f"{name}: key '{r.key}.keep_firing_for': a policy's mode "
                                "leaves at the first evaluation its alert is gone; "
                                "keep_firing_for is not imported")
    for g, r, late in _definition_order(flat):
        node = _inline(r.node, r, recorded, name, late)
        if r.kind == "record":
            recorded[r.name] = (node, r.labels, g.interval_s)
        elif r.name in mapping:
            chosen.append((g, r, node))
    intervals = sorted({g.interval_s for g, _, _ in chosen})
    if len(intervals) > 1:
        raise ScenarioError(f"{name}: the mapped alerts' groups have different intervals "
                            f"({', '.join(f'{i:g} s' for i in intervals)}); a policy has one "
                            "evaluation clock: import them separately")
    interval = intervals[0]
    order = list(RELA_MODES)
    chosen.sort(key=lambda c: (order.index(mapping[c[1].name]), flat.index((c[0], c[1]))))
    signals, conditions, modes, used = {}, {}, [], set()
    for _g, r, expr in chosen:
        cname = r.name
        k = 2
        while cname in used:  # Prometheus allows one alert name in several rules
            cname, k = f"{r.name}_{k}", k + 1
        used.add(cname)
        sname = cname + promql.format_labels(r.labels)
        sig_expr, op, thr = _signal(expr, r.for_s, interval)
        signals[sname] = {"promql": sig_expr}
        conditions[cname] = {"signal": sname, "op": op, "threshold": thr}
        modes.append({"name": cname, "when": {"any": [cname]}, "enter_after": 1,
                      "exit_after": 1, "assert": dict(RELA_MODES[mapping[r.name]])})
    policy = {"name": f"rules-{Path(name).stem}", "signals": signals, "conditions": conditions,
              "modes": modes,
              "normal": {"hedge_enabled": False, "shed_bronze": False, "degraded_mode": False}}
    clocks = {"eval_s": interval, "eval_phase_s": 0.0}
    return policy, clocks


def _definition_order(flat: list) -> list:
    """(group, rule, late names): every recording before its readers; a late name is
    recorded by a rule after the reader in the file, so the reader sees its previous
    evaluation (Prometheus reads across groups)."""
    from relakit.control.rules import evaluation_order

    groups = {}
    for g, _r in flat:
        groups.setdefault(id(g), g)
    return evaluation_order(list(groups.values()))


_MARK = "__relakit_match"  # a marker label a matcher filter sets and removes


def _label_filter(node, label: str, op: str, value: str):
    """``node`` keeping the series whose ``label`` matches (``=``, ``=~``) or does not
    (``!=``, ``!~``) as a selector's matcher would (anchored; missing label = "")."""
    regex = re.escape(value) if op in ("=", "!=") else value
    s = promql.String
    marked = promql.Call("label_replace", (node, s(_MARK), s("1"), s(label), s(regex)))
    one = promql.Call("label_replace", (promql.Call("vector", (promql.Number(1.0),)),
                                        s(_MARK), s("1"), s(""), s("")))
    kept = promql.Binary("and" if op in ("=", "=~") else "unless", marked, one, on=(_MARK,))
    return promql.Call("label_replace", (kept, s(_MARK), s(""), s(""), s("")))


def _inline(node, rule, recorded: dict, name: str, late=frozenset()):
    """The tree with every selector of a recorded series replaced by its expression."""
    from dataclasses import fields, replace

    if isinstance(node, promql.Selector) and node.name in recorded:
        return _read_recorded(node, rule, recorded[node.name], name, node.name in late)
    if not hasattr(node, "__dataclass_fields__"):
        return node
    changes = {}
    for f in fields(node):
        v = getattr(node, f.name)
        if f.name in ("expr", "lhs", "rhs", "param") and v is not None:
            changes[f.name] = _inline(v, rule, recorded, name, late)
        elif f.name == "args":
            changes[f.name] = tuple(_inline(a, rule, recorded, name, late) for a in v)
    return replace(node, **changes)


def _read_recorded(sel, rule, rec, name: str, late: bool):
    """A selector of a recorded series as an expression over the scraped series; a
    ``late`` read (the recording is evaluated after the reader) sees the previous
    evaluation: its window ends one interval earlier."""
    expr, labels, interval = rec
    key = f"{name}: key '{rule.key}.expr'"
    node = expr
    for k, v in labels:  # the recording rule's labels, as the rule manager sets them
        node = promql.Call("label_replace", (node, promql.String(k), promql.String(v),
                                             promql.String(""), promql.String("")))
    fixed = dict(labels)
    for k, op, v in sel.matchers:
        if k == "__name__":
            if op != "=" or v != sel.name:
                raise ScenarioError(f"{key}: reads the recorded series {sel.name!r} with a "
                                    "second __name__ matcher; cannot be inlined")
            continue
        if k in fixed:  # the rule sets it: the matcher holds always or never
            if not promql.matcher_matches((k, op, v), fixed[k]):
                node = promql.Binary("unless", node, node)  # nothing, ever
            continue
        node = _label_filter(node, k, op, v)
    grid = round(interval * 1000)
    shift = interval if late and sel.at is None else 0.0
    if sel.range_s is not None:
        return promql.Subquery(node, max(sel.range_s - shift, 0.001), interval,
                               sel.offset_s + shift, sel.pos, sel.at)
    if not sel.offset_s and sel.at is None and not shift:
        return node
    sel = replace(sel, offset_s=sel.offset_s + shift)
    on_grid = round(sel.offset_s * 1000) % grid == 0 and (
        sel.at is None or isinstance(sel.at, str) or round(sel.at * 1000) % grid == 0)
    if not on_grid:
        raise ScenarioError(f"{key}: reads the recorded series {sel.name!r} with an offset "
                            f"or @ off its group's {interval:g} s evaluation grid; its samples "
                            "there are not known")
    sub = promql.Subquery(node, 0.001, interval, sel.offset_s, sel.pos, sel.at)
    return promql.Call("last_over_time", (sub,), sel.pos)


def _signal(node, for_s: float, interval: float) -> tuple[str, str, float]:
    """(signal expression, op, threshold) that is over its threshold exactly when the
    alert fires (see the module's docstring)."""
    if promql.is_scalar(node):
        raise ScenarioError(f"alert expression {promql.to_text(node)!r} is a constant: it "
                            "never changes")
    if for_s > 0:
        n = math.ceil(for_s / interval - 1e-9)
        sub = promql.Subquery(node, n * interval, interval)
        held = promql.Binary(">=", promql.Call("count_over_time", (sub,)),
                             promql.Number(float(n + 1)))
        return f"count({promql.to_text(held)})", ">", 0.0
    if (isinstance(node, promql.Binary) and node.op in _THRESHOLD_OPS and not node.bool_
            and promql.is_scalar(node.rhs)):
        k = float(np.asarray(promql.Evaluator([]).evaluate(node.rhs, [0.0]))[0])
        return f"{_THRESHOLD_OPS[node.op]}({promql.to_text(node.lhs)})", node.op, k
    return f"count({promql.to_text(node)})", ">", 0.0


def write_policy(policy: dict, clocks: dict, out, rules_path,
                 clocks_path=None) -> tuple[Path, Path]:
    """Write the policy and its clocks file (default: ``<stem>.clocks.yaml`` beside it)
    atomically; return both paths."""
    from relakit.io import atomic_write

    out = Path(out)
    clocks_path = Path(clocks_path or out.with_name(out.stem + ".clocks.yaml"))
    head = (f"# Imported from {rules_path} by `relakit import-rules`: one mode per mapped "
            f"alert.\n# Evaluate it at the rule group's interval: --clocks {clocks_path}\n")
    text = head + yaml.safe_dump(policy, sort_keys=False, width=1000)
    ctext = (f"# The evaluation clock of {out.name}: the rule group's interval.\n"
             + yaml.safe_dump(clocks, sort_keys=False))
    atomic_write(clocks_path, lambda tmp: Path(tmp).write_text(ctext))
    atomic_write(out, lambda tmp: Path(tmp).write_text(text))
    return out, clocks_path
