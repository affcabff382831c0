"""A front member as one sentence a person can paste into a write-up, built from the numbers.

"With thresholds X and clocks Y, gold success would have been A ± a instead of
B ± b (paired difference D ± d), at the cost of C": every number comes from the
search's tables (means and 95 % half-widths over the replications, the
difference paired by replication against the incumbent).
"""

from __future__ import annotations

import math

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


def _setting(key: str, value) -> str:
    short = key.removeprefix("policy.").removeprefix("clocks.")
    v = f"{value:.3g}" if isinstance(value, float) else str(value)
    return f"{short} = {v}"


def sentence(result, number: str = "gold.success_ratio", trial: int | None = None) -> str:
    """The sentence for ``trial`` (default: the front member best on ``number``)."""
    if result.incumbent is None:
        raise ValueError("a sentence compares with the incumbent; this search has none")
    if trial is None:
        trial = result.best(number)["trial"]
    row = result.front.filter(result.front["trial"] == trial).row(0, named=True)
    params = {k.removeprefix("param."): v for k, v in row.items() if k.startswith("param.")}
    policy = [_setting(k, v) for k, v in params.items() if k.startswith("policy.")]
    clocks = [_setting(k, v) for k, v in params.items() if k.startswith("clocks.")]
    other = [_setting(k, v) for k, v in params.items()
             if not k.startswith(("policy.", "clocks."))]
    parts = []
    if policy:
        parts.append(f"thresholds {', '.join(policy)}")
    if clocks:
        parts.append(f"clocks {', '.join(clocks)}")
    if other:
        parts.append(", ".join(other))
    d = result.difference(trial, number)
    head = (f"With {' and '.join(parts)} (trial {trial}), {label(number)} would have been "
            f"{fmt(number, d['value'], d['value_ci'])} instead of "
            f"{fmt(number, d['incumbent'], d['incumbent_ci'])} (paired difference "
            f"{fmt(number, d['difference'], d['difference_ci'], diff=True)}, "
            f"{result.spec.replications} replications on common random numbers)")
    costs, free = [], []
    for o in result.spec.objectives:
        if o.number == number:
            continue
        c = result.difference(trial, o.number)
        worse = c["significant"] and not c["better"]
        text = (f"{label(o.number)} {fmt(o.number, c['value'], c['value_ci'])} instead of "
                f"{fmt(o.number, c['incumbent'], c['incumbent_ci'])}")
        (costs if worse else free).append(text if worse else label(o.number))
    if costs:
        tail = f", at the cost of {'; '.join(costs)}"
    elif free:
        tail = f", at no significant cost in {', '.join(free)}"
    else:
        tail = ""
    return head + tail + "."


def front_rows(result) -> list[list[str]]:
    """The front as table cells, the header first: each member's settings, then each
    objective's mean ± 95 % half-width and, with an incumbent, the paired difference
    from it (``better``/``worse`` where significant), then the incumbent's own row.
    The console (``relakit search``) and the notebook view print these same cells."""
    spec = result.spec
    keys = [p.key for p in spec.space]
    rows = [["trial", *(k.removeprefix("policy.") for k in keys),
             *(label(o.number) for o in spec.objectives)]]
    for row in result.front.sort("trial").iter_rows(named=True):
        cells = [str(row["trial"])]
        cells += [_setting(k, row[f"param.{k}"]).split(" = ", 1)[1] for k in keys]
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
