"""A front member as one sentence a person can paste into a write-up, built from the numbers.

"With thresholds X and clocks Y, gold success would have been A ± a instead of
B ± b (paired difference D ± d), at the cost of C": every number comes from the
search's tables (means and 95 % half-widths over the replications, the
difference paired by replication against the incumbent).
"""

from __future__ import annotations

import math
import re

#: words for the objectives in a sentence
WORDS = {"success_ratio": "success", "dropped_share": "dropped share",
         "seconds_over_slo": "seconds over the latency SLO", "mode_changes": "mode changes",
         "goodput_rps": "goodput", "p99_ms": "p99 latency", "mean_ms": "mean latency"}


def label(number: str) -> str:
    """``gold.success_ratio`` -> ``gold success``; ``dropped_share`` -> ``dropped share``."""
    tier, _, col = number.partition(".")
    if col:
        return f"{tier} {WORDS.get(col, col)}"
    return WORDS.get(number, number)


def fmt(number: str, mean: float, ci: float | None = None, diff: bool = False) -> str:
    """A value with its half-width in the number's unit (ratios as percentages; a
    difference of ratios in percentage points)."""
    col = number.rpartition(".")[2]
    ci = None if ci is None or not math.isfinite(ci) else ci
    if col.endswith("ratio") or col.endswith("share"):
        unit = " percentage points" if diff else " %"
        sign = "+" if diff else ""
        text = f"{100 * mean:{sign}.1f}{unit}"
        return text if ci is None else f"{100 * mean:{sign}.1f} ± {100 * ci:.1f}{unit}"
    unit = {"seconds_over_slo": " s", "goodput_rps": " req/s"}.get(col, "")
    unit = " ms" if col.endswith("_ms") else unit
    d = 0 if abs(mean) >= 100 or col == "mode_changes" else 1
    return f"{mean:.{d}f}{unit}" if ci is None else f"{mean:.{d}f} ± {ci:.{d}f}{unit}"


#: how a searched key reads: (pattern of the dotted key, words, unit). ``{mode}`` is the
#: mode's name at that index of the policy; a condition's threshold takes its signal's
#: unit (UNITS, by the signal name's ending). The one table the sentence and the front's
#: table read; a key it lacks is shown as the key.
SETTINGS = (
    (r"policy\.conditions\.(?P<cond>\w+)\.threshold", "{cond} threshold", None),
    (r"policy\.modes\.(?P<i>\d+)\.enter_after", "{mode} entered after", "evaluations"),
    (r"policy\.modes\.(?P<i>\d+)\.exit_after", "{mode} left after", "clear evaluations"),
    (r"policy\.modes\.(?P<i>\d+)\.min_dwell_s", "{mode} minimum dwell", "s"),
    (r"policy\.modes\.(?P<i>\d+)\.max_duration_s", "{mode} maximum duration", "s"),
    (r"policy\.modes\.(?P<i>\d+)\.cooldown_s", "{mode} cool-down", "s"),
    (r"clocks\.scrape_s", "scrape interval", "s"),
    (r"clocks\.window_s", "query window", "s"),
    (r"clocks\.eval_s", "evaluation interval", "s"),
    (r"clocks\.poll_s", "poll interval", "s"),
    (r"clocks\.propagation_s", "propagation delay", "s"),
    (r"clocks\.(?P<clock>scrape|eval|poll)_phase_s", "{clock} phase", "s"),
)
#: a signal's unit by its name's ending (a ratio's threshold is shown as a percentage)
UNITS = {"_ms": "ms", "_s": "s", "_rps": "req/s", "_ratio": "%", "_share": "%"}


def _policy_of(spec) -> dict:
    """The policy a search's trials start from, as a mapping ({} when it has none)."""
    from relakit.counterfactual.spec import raw_scenario

    try:
        policy = raw_scenario(spec.scenario, spec.base).get("policy")
    except Exception:  # noqa: BLE001 - words for a sentence; the search itself checked the file
        return {}
    return policy if isinstance(policy, dict) else {}


def describe(key: str, policy: dict | None = None) -> tuple[str, str | None]:
    """A searched key's words and unit, from SETTINGS: ``policy.modes.0.enter_after`` ->
    (``survival entered after``, ``evaluations``) for RelA's policy, whose mode 0 is
    survival; a condition's threshold takes its signal's unit. A key SETTINGS lacks is
    its own words, with no unit."""
    policy = policy or {}
    for pattern, words, unit in SETTINGS:
        m = re.fullmatch(pattern, key)
        if not m:
            continue
        groups = m.groupdict()
        if "i" in groups:
            modes = policy.get("modes") or []
            i = int(groups["i"])
            name = modes[i].get("name") if i < len(modes) and isinstance(modes[i], dict) else None
            groups["mode"] = name or f"mode {i}"
        if "cond" in groups:
            cond = (policy.get("conditions") or {}).get(groups["cond"]) or {}
            signal = str(cond.get("signal", "")) if isinstance(cond, dict) else ""
            unit = next((u for end, u in UNITS.items() if signal.endswith(end)), None)
            if signal:
                words += f" on {signal}"
        return words.format(**groups), unit
    return key, None


def setting_text(key: str, value, policy: dict | None = None) -> str:
    """``policy.conditions.overloaded.threshold``, 87.3 -> ``overloaded threshold on
    p99_ms 87.3 ms``; ``clocks.window_s``, 10 -> ``query window 10 s``."""
    words, unit = describe(key, policy)
    if unit is None and words == key:
        return f"{key} = {_number(value, None)}"
    return f"{words} {_number(value, unit)}"


def _number(value, unit: str | None) -> str:
    if unit == "%" and isinstance(value, int | float):
        return f"{100 * value:.3g} %"
    v = f"{value:.3g}" if isinstance(value, float) else str(value)
    return f"{v} {unit}" if unit else v


def sentence(result, number: str = "gold.success_ratio", trial: int | None = None) -> str:
    """The sentence for ``trial`` (default: the front member best on ``number``)."""
    if result.incumbent is None:
        raise ValueError("a sentence compares with the incumbent; this search has none")
    if trial is None:
        trial = result.best(number)["trial"]
    row = result.front.filter(result.front["trial"] == trial).row(0, named=True)
    params = {k.removeprefix("param."): v for k, v in row.items() if k.startswith("param.")}
    policy = _policy_of(result.spec)
    settings = [setting_text(k, v, policy) for k, v in params.items()]
    d = result.difference(trial, number)
    head = (f"With {', '.join(settings)} (trial {trial}), {label(number)} would have been "
            f"{fmt(number, d['value'], d['value_ci'])} instead of "
            f"{fmt(number, d['incumbent'], d['incumbent_ci'])} (paired difference "
            f"{fmt(number, d['difference'], d['difference_ci'], diff=True)}, "
            f"{result.spec.replications} replications on common random numbers)")
    costs, gains, same = [], [], []
    for o in result.spec.objectives:
        if o.number == number:
            continue
        c = result.difference(trial, o.number)
        text = (f"{label(o.number)} {fmt(o.number, c['value'], c['value_ci'])} instead of "
                f"{fmt(o.number, c['incumbent'], c['incumbent_ci'])}")
        if not c["significant"]:
            same.append(label(o.number))
        else:
            (gains if c["better"] else costs).append(text)
    tail = ""
    if gains:
        tail += f", and better too in {'; '.join(gains)}"
    if costs:
        tail += f", at the cost of {'; '.join(costs)}"
    if same:
        tail += f"; no significant difference in {', '.join(same)}"
    return head + tail + "."


def front_rows(result) -> list[list[str]]:
    """The front as table cells, the header first: each member's settings, then each
    objective's mean ± 95 % half-width and, with an incumbent, the paired difference
    from it (``better``/``worse`` where significant), then the incumbent's own row.
    The console (``relakit search``) and the notebook view print these same cells."""
    spec = result.spec
    keys = [p.key for p in spec.space]
    policy = _policy_of(spec)
    heads = [describe(k, policy) for k in keys]
    rows = [["trial", *(f"{w} ({u})" if u else w for w, u in heads),
             *(label(o.number) for o in spec.objectives)]]
    for row in result.front.sort("trial").iter_rows(named=True):
        cells = [str(row["trial"])]
        cells += [_number(row[f"param.{k}"], u).removesuffix(f" {u}" if u else "")
                  for k, (_, u) in zip(keys, heads, strict=True)]
        for o in spec.objectives:
            text = fmt(o.number, row[o.number], row[o.number + "_ci"])
            if result.incumbent is not None:
                d = result.difference(row["trial"], o.number)
                text += f" ({fmt(o.number, d['difference'], d['difference_ci'], diff=True)}"
                text += ", better)" if d["better"] else ", worse)" if d["significant"] else ")"
            cells.append(text)
        rows.append(cells)
    inc = result.info.get("incumbent")
    if inc:
        rows.append(["incumbent", *("as given" for _ in keys),
                     *(fmt(o.number, inc[o.number]["mean"], inc[o.number]["ci"])
                       for o in spec.objectives)])
    return rows
