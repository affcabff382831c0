"""``relakit check FILE...``: tell each file's kind, load it, run every check on it.

Nothing is simulated or replayed. A file's kind comes from its content: a
trace by its suffix or its bytes (as ``read_trace`` tells them), a YAML file by
its top-level keys (``fleet``/``workload`` → scenario, ``signals``/``modes`` →
policy, ``order`` or a stage name → chain, ``grid``/``samples``/``notebook`` →
sweep, ``space``/``objectives`` → search, only clock keys → clocks). Files given
together are checked against each other: a policy or chain against every trace, the
clocks with them.
"""

from __future__ import annotations

import re
from pathlib import Path

from relakit import checks as C
from relakit.validate import ScenarioError, load_yaml

TRACE_SUFFIXES = (".csv", ".parquet", ".json", ".prom", ".om", ".txt")
_MESSAGE = re.compile(r"^(?P<file>.*?): key '(?P<key>[^']*)': (?P<msg>.*)$", re.S)


def as_finding(exc: Exception, path) -> C.Finding:
    """A loader's error as a finding (its message already names the file and key)."""
    text = " ".join(str(exc).split())
    m = _MESSAGE.match(text)
    if m:
        return C.Finding(C.ERROR, m["file"], m["key"], m["msg"])
    where = getattr(exc, "where", None)
    rest = text.removeprefix(f"{path}: ")
    if where:
        rest = rest.removeprefix(f"{where}: ")
    return C.Finding(C.ERROR, str(path), where or "(file)", rest)


def kind_of(data) -> str:
    """A YAML document's kind from its keys: scenario | policy | chain | clocks | sweep |
    search | rules (a Prometheus rule file) | unknown."""
    from relakit.chain import STAGES
    from relakit.control.clocks import KEYS as CLOCK_KEYS

    if not isinstance(data, dict) or not data:
        return "unknown"
    keys = set(data)
    if keys == {"groups"}:
        return "rules"
    if keys & {"fleet", "workload", "duration_s", "faults"}:
        return "scenario"
    if keys & {"space", "objectives"}:
        return "search"
    if keys & {"grid", "samples", "notebook"} or "scenario" in keys:
        return "sweep"
    if keys & {"signals", "modes", "conditions"}:
        return "policy"
    if keys & ({"order"} | set(STAGES)):
        return "chain"
    if keys & set(CLOCK_KEYS):  # the clocks loader then names any stray key
        return "clocks"
    return "unknown"


def _is_trace(path: Path) -> bool:
    if path.is_dir() or path.suffix.lower() in TRACE_SUFFIXES:
        return True
    if path.suffix.lower() in (".yaml", ".yml"):
        return False
    try:
        with open(path, "rb") as fh:
            head = fh.read(4)
    except OSError:
        return False
    return head.startswith(b"PAR1")


def check_files(paths) -> tuple[list[C.Finding], dict]:
    """Every finding for the given files, and per file given: (its kind, the findings
    its own check produced, whichever file they name: a scenario's error may be in
    the chain it links to)."""
    findings: list[C.Finding] = []
    kinds: dict = {}
    loaded: dict = {"policy": [], "chain": [], "clocks": [], "trace": [], "rules": []}
    mine: dict = {}
    for raw in paths:
        before = len(findings)
        _one(raw, findings, kinds, loaded)
        mine[raw] = findings[before:]
    cross = _cross_checks(loaded)
    for raw in paths:
        mine[raw] = _dedupe(mine[raw] + [f for f in cross if f.file == str(Path(raw))])
    findings += cross
    return _dedupe(findings), {raw: (kinds[raw], mine[raw]) for raw in paths}


def _one(raw, findings: list, kinds: dict, loaded: dict) -> None:
    """Load one file by its kind and run its own checks (cross checks come later)."""
    from relakit.chain import load_chain
    from relakit.control import load_clocks, load_policy
    from relakit.scenario import load_scenario
    from relakit.sweep import load_sweep
    from relakit.traces import read_trace

    path = Path(raw)
    if not path.exists():
        findings.append(C.Finding(C.ERROR, str(path), "(file)", "no such file or folder"))
        kinds[raw] = "missing"
        return
    kinds[raw] = "unreadable"
    try:
        if _is_trace(path):
            kinds[raw] = "trace"
            frame = read_trace(path)
            loaded["trace"].append((frame, str(path)))
            return
        data, _, _ = load_yaml(path, "relakit")
        kind = kind_of(data)
        kinds[raw] = kind
        if kind == "unknown":
            findings.append(C.Finding(
                C.ERROR, str(path), "(top level)",
                "cannot tell what this file is: expected a scenario (fleet, workload, "
                "duration_s), a policy (signals, conditions, modes), a chain (order or "
                "stage names), clocks (scrape_s, window_s, eval_s, poll_s ...), a sweep "
                "(scenario or notebook, grid), a search (scenario, space, objectives) or "
                "Prometheus rules (groups); a trace by its "
                "suffix"
                if isinstance(data, dict) and data else
                "the file is empty; expected a mapping of keys to values" if data is None else
                f"expected a mapping of keys to values, got {type(data).__name__} "
                f"{str(data)[:40]!r}"))
        elif kind == "scenario":
            sc = load_scenario(path)
            findings += C.check_run(sc, record_requests=True)
        elif kind == "sweep":
            findings += C.check_sweep(load_sweep(path))
        elif kind == "search":
            from relakit.search.spec import load_search

            load_search(path)
        elif kind == "policy":
            loaded["policy"].append(load_policy(path))
        elif kind == "chain":
            loaded["chain"].append(load_chain(path))
        elif kind == "rules":
            from relakit.control.rules import load_rules

            loaded["rules"].append((load_rules(path), str(path)))
        else:
            loaded["clocks"].append(load_clocks(path))
    except C.CheckError as exc:
        findings += exc.findings
    except (ScenarioError, ValueError, OSError) as exc:
        findings.append(as_finding(exc, path))


def _cross_checks(loaded: dict) -> list[C.Finding]:
    """Policies, chains and clocks on their own, or against each trace given with them."""
    out = []
    clocks = loaded["clocks"][0] if loaded["clocks"] else None
    policies, chains, traces = loaded["policy"], loaded["chain"], loaded["trace"]
    for groups, rules_file in loaded["rules"]:
        for frame, source in traces:
            out += C.check_rules(groups, rules_file, frame["name"].unique().to_list(),
                                 missing=C.WARNING, what=f"the trace {source}")
        if not traces:
            names = [s[1] for s in C.simulator_series(_default_buckets())]
            out += C.check_rules(groups, rules_file, names, missing=C.WARNING,
                                 what="the simulator")
    for frame, source in traces:
        if not policies and not chains and not loaded["rules"]:
            out += C.check_trace(frame, source)
        for pol in policies or [None]:
            for ch in chains or [None]:
                if pol is None and ch is None:
                    continue
                out += C.check_replay(frame, source, pol, ch, clocks)
    if not traces:
        series = C.simulator_series(_default_buckets())
        for pol in policies:
            out += C.check_policy(pol)
            out += C.check_signals(pol, series, missing=C.WARNING, what="the simulator")
        for ch in chains:
            out += C.check_chain(ch, None)
    for clk in loaded["clocks"]:
        needs = not policies or any(C._policy_needs_rates(p) for p in policies) or bool(chains)
        out += C.check_clocks(clk, needs_rates=needs)
    return out


def _default_buckets():
    from relakit.scenario import PROMETHEUS_BUCKETS_S

    return PROMETHEUS_BUCKETS_S


def _dedupe(findings):
    seen, out = set(), []
    for f in findings:
        if f not in seen:
            seen.add(f)
            out.append(f)
    return out
