"""The twin as scenario YAML text, every fitted value with a comment saying where it came from.

Written by hand rather than dumped: PyYAML drops comments, and the comments are
the point (a reader must be able to check each number against the recording).
The text is loaded back with :func:`relakit.load_scenario` before it is used or
written, so a twin that does not load is never handed out.
"""

from __future__ import annotations

import numpy as np

from relakit.vocab import TIERS


def num(x: float, digits: int = 6) -> str:
    """A number as YAML reads it back: plain, at most ``digits`` significant digits."""
    x = float(x)
    if x == int(x) and abs(x) < 1e15:
        return str(int(x))
    text = f"{x:.{digits}g}"
    if "e" in text:  # YAML 1.1 needs a dot and a signed exponent to read a float
        mant, exp = text.split("e")
        mant = mant if "." in mant else mant + ".0"
        text = f"{mant}e{'+' if not exp.startswith('-') else ''}{exp.lstrip('+')}"
    return text


def twin_yaml(*, name: str, source: str, origin_s: float, recording_end_s: float,
              arrival, tiers: dict, node_ids: list[int], service, weights: np.ndarray,
              weights_source: str, faults: list, scrape_s: float, phases: list[float],
              buckets: list[float] | None, flags_note: str, seed: int = 1,
              deadline=None, retries=None, population=None, schedule=None) -> str:
    svc = service
    lines = [
        f"# Twin of {source}, calibrated by `relakit calibrate` from its metrics alone.",
        f"# Time 0 is t = {num(origin_s, 15)} s in the recording; every fitted value says "
        "what it came from.",
        f"# Flags: {flags_note}",
        "# Not estimated (relakit's defaults): hedging delay, retry backoff and budget, "
        "fan-out (1), queue limit.",
        f"name: {name}",
        f"duration_s: {num(arrival.end_s)}  # whole arrival bins within the span every "
        f"target was scraped ({num(recording_end_s)} s)",
        f"seed: {seed}",
        "workload:",
    ]
    closed = () if population is None else population.closed_tiers
    opened = TIERS if population is None else population.open_tiers
    if population is not None:
        lines.append(f"  # workload: {population.kind}, tier by tier (relakit.calibration."
                     "population: the rate against the latency)")
    if opened:
        lines += [f"  # requests per {num(arrival.bin_s)} s bin from {arrival.source}"
                  + (f", the open tiers' ({', '.join(opened)}) share of each bin" if closed
                     else "") + ", as a step curve",
                  "  arrival:",
                  "    kind: trace",
                  "    interpolation: step",
                  "    points:"]
        lines += [f"      - [{num(t)}, {num(r, 5)}]" for t, r in
                  zip(arrival.times_s, arrival.rates_rps, strict=True)]
        tier_text = ", ".join(f"{t}: {num(tiers[t], 4)}" for t in TIERS)
        lines.append(f"  tiers: {{{tier_text}}}  # shares of {arrival.tier_source}")
    if closed:
        lines += ["  clients:  # a closed population: X = N / (R + Z), fitted per tier "
                  f"on {population.latency_source}", "    population:"]
        for t in closed:
            p = population.tiers[t]
            if p.phases:  # a stepped population: [at_s, N] per phase (spec: the first at 0)
                steps = [(0.0 if i == 0 else q.start_s, max(0, round(q.population)))
                         for i, q in enumerate(p.phases)]
                lines.append(f"      {t}: [{', '.join(f'[{num(a, 4)}, {n}]' for a, n in steps)}]"
                             "  # N per phase of the rate's steps, 95 %: " + ", ".join(
                                 f"{q.population:.1f} [{q.population_ci[0]:.1f}, "
                                 f"{q.population_ci[1]:.1f}]" for q in p.phases))
                continue
            lines.append(f"      {t}: {max(1, round(p.population))}  # N {p.population:.1f}, "
                         f"95 % [{p.population_ci[0]:.1f}, {p.population_ci[1]:.1f}]")
        lines.append("    think:  # exponential: the shape cannot be told from counters")
        for t in closed:
            p = population.tiers[t]
            lines.append(f"      {t}: {{kind: exponential, mean_ms: {num(1000 * p.think_s, 4)}}}"
                         f"  # Z, 95 % [{1000 * p.think_ci[0]:.0f}, {1000 * p.think_ci[1]:.0f}]"
                         " ms")
        for t in opened:
            if t in population.tiers:
                lines.append(f"    # {t}: open ({population.tiers[t].reason})")
    if deadline is not None and deadline.deadline_ms is not None:
        lines.append(f"  deadline_ms: {num(deadline.deadline_ms, 4)}  # per attempt: "
                     f"{deadline.note}")
    elif deadline is not None:
        lines.append(f"  # deadline_ms: none written: {deadline.note}")
    lines += ["fleet:",
              f"  nodes: {len(node_ids)}  # scrape targets calibrated"
              + ("" if node_ids == list(range(len(node_ids))) else
                 f" (recorded nodes {', '.join(map(str, node_ids))}, renumbered from 0)"),
              "  servers:"]
    for i, ns in enumerate(svc.nodes):
        lines.append(f"    - {ns.servers}  # node {i}: {ns.servers_note}")
    lines.append("  weights:")
    for i, w in enumerate(weights):
        lines.append(f"    - {num(w, 4)}  # node {i}: its share of {weights_source}")
    params = ", ".join(f"{k}: {num(v, 5)}" for k, v in svc.params.items())
    lines += [
        "  # mean: " + svc.mean_note,
        f"  # kind: {svc.shape_note}",
    ]
    for s in svc.scores:
        p = ", ".join(f"{k} {num(v, 4)}" for k, v in s["params"].items() if k != "mean_ms")
        lines.append(f"  #   {s['kind']}: AIC {s['aic']:.1f}" + (f" ({p})" if p else ""))
    lines.append(f"  service: {{kind: {svc.kind}, {params}}}")
    lines.append("  service_scale:  # per node: its own mean service over the fleet's "
                 f"{num(svc.mean_ms, 4)} ms (same kind and shape)")
    for i, (ns, scale) in enumerate(zip(svc.nodes, svc.scales, strict=True)):
        own = (f"busy_seconds_total / completions (Little): {ns.busy_s:.1f} server-s / "
               f"{ns.completions:.0f}" if ns.busy_s > 0 else
               "no busy_seconds_total: the fleet's mean")
        lines.append(f"    - {num(scale, 4)}  # node {i}: {num(ns.mean_ms, 4)} ms, {own}")
    if retries is not None and retries.max_attempts is not None:
        lines += ["mitigations:",
                  f"  retries: {{max_attempts: {retries.max_attempts}}}  # {retries.note}"]
    elif retries is not None:
        lines.append(f"# mitigations.retries: none written: {retries.note}")
    if schedule:  # the recorded flags the validation replays: the twin sets them itself
        from relakit.vocab import Flags

        changes, now = [], Flags()
        for t, f in schedule.changes:  # each change written as the whole state it leaves
            now = now.updated(**f)
            if t < arrival.end_s:
                changes.append((max(0.0, float(t)), now))
        if changes:
            lines += ["controls:",
                      f"  schedule:  # the recorded flags, set at their times ({schedule.source})"]
            lines += [f"    - {{at_s: {num(t, 9)}, hedge_enabled: {str(f.hedge_enabled).lower()}, "
                      f"degraded_mode: {str(f.degraded_mode).lower()}, shed_tiers: "
                      f"[{', '.join(f.shed_tiers)}], breaker: {f.breaker}}}" for t, f in changes]
    if faults:
        lines.append("faults:  # change points in each node's error ratio (PELT, binomial "
                     "cost); rate = excess over the node's usual level")
        for f in faults:
            what = ("the node's usual error level, over the whole run" if f.whole_run else
                    f"error ratio {num(f.ratio, 4)} over {num(f.requests, 6)} requests")
            lines.append(f"  - {{node: {f.node}, start_s: {num(f.start_s, 6)}, end_s: "
                         f"{num(f.end_s, 6)}, error_rate: {num(f.error_rate, 4)}}}  # {what}")
    else:
        lines.append("faults: []  # no change point in any node's error ratio")
    lines += ["metrics:",
              f"  interval_s: {num(scrape_s)}  # the median interval between two scrapes",
              "  phase_s: [" + ", ".join(num(p, 4) for p in phases) + "]  # each target's "
              "first scrape after time 0, modulo the interval"]
    if buckets:
        lines.append("  latency_buckets_s: [" + ", ".join(num(b) for b in buckets)
                     + "]  # the recording's latency histogram bounds")
    return "\n".join(lines) + "\n"
