"""``relakit check FILE...``: tell each file's kind, load it, run every check on it.

Nothing is simulated or replayed. A file's kind comes from its content: a
trace by its suffix or its bytes (as ``read_trace`` tells them), a YAML file by
its top-level keys (``fleet``/``workload`` → scenario, ``signals``/``modes`` →
policy, ``order`` or a stage name → chain, ``grid``/``samples``/``notebook`` →
sweep, ``space``/``objectives`` → search, only clock keys → clocks, the parameters of
a notebook beside it → papermill parameters). Tables that are not metrics traces are
told by their columns: an audit (``decisions.parquet``), a requests table, a rate
trace (``time_s, rate_rps``). Markdown is documentation, with nothing to check. Files
given together are checked against each other: a policy or chain against every trace,
the clocks with them.
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
    search | rules (a Prometheus rule file) | alert mapping (alert: mode, for
    ``import-rules --mapping``) | unknown."""
    from relakit.chain import STAGES
    from relakit.control.clocks import KEYS as CLOCK_KEYS
    from relakit.control.import_rules import RELA_MODES

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
    if all(isinstance(v, str) for v in data.values()) and set(data.values()) <= set(
            RELA_MODES):
        return "alert mapping"
    return "unknown"


#: what a lab run summary holds (tests/test_lab_front.py writes it, notebook 07 reads it)
LAB_RUN_KEYS = ("t0_s", "step_s", "high_end_s", "end_s", "capacity_rps", "clocks", "wrk",
                "signals")


def _is_lab_run(path: Path) -> bool:
    import json

    if path.suffix.lower() != ".json" or path.stat().st_size > 10_000_000:
        return False
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and "wrk" in data and "status" not in data


def _check_lab_run(path: Path) -> list[C.Finding]:
    """Every key of a lab run summary there, the times numbers in order."""
    import json

    data = json.loads(path.read_text())
    lost = [k for k in LAB_RUN_KEYS if k not in data]
    if lost:
        return [C.Finding(C.ERROR, str(path), lost[0], f"missing; a lab run summary holds "
                                                       f"{', '.join(LAB_RUN_KEYS)}")]
    times = [data[k] for k in ("t0_s", "step_s", "high_end_s", "end_s")]
    if not all(isinstance(t, int | float) for t in times) or times != sorted(times):
        return [C.Finding(C.ERROR, str(path), "step_s", "expected t0_s <= step_s <= "
                                                        "high_end_s <= end_s, in seconds")]
    return []


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
    if path.suffix.lower() in (".md", ".markdown"):
        kinds[raw] = "documentation"
        return
    try:
        table = _table_kind(path)
        if table is not None:
            kinds[raw] = table
            findings.extend(_check_table(table, path))
            return
        if _is_lab_run(path):  # before traces: a JSON file too
            kinds[raw] = "lab run"
            findings.extend(_check_lab_run(path))
            return
        if _is_trace(path):
            kinds[raw] = "trace"
            frame = read_trace(path)
            loaded["trace"].append((frame, str(path)))
            return
        data, _, _ = load_yaml(path, "relakit")
        kind = kind_of(data)
        notebook = _notebook_for(path, data) if kind == "unknown" else None
        if notebook is not None:
            kind = "papermill parameters"
        kinds[raw] = kind
        if notebook is not None:
            findings.extend(_check_parameters(path, data, notebook))
        elif kind == "unknown":
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
            from relakit.counterfactual.spec import load_search

            load_search(path)
        elif kind == "policy":
            loaded["policy"].append(load_policy(path))
        elif kind == "chain":
            loaded["chain"].append(load_chain(path))
        elif kind == "alert mapping":
            from relakit.control.import_rules import read_mapping

            read_mapping(path)
        elif kind == "rules":
            from relakit.control.rules import load_rules

            loaded["rules"].append((load_rules(path), str(path)))
        else:
            loaded["clocks"].append(load_clocks(path))
    except C.CheckError as exc:
        findings += exc.findings
    except (ScenarioError, ValueError, OSError) as exc:
        findings.append(as_finding(exc, path))


#: columns that tell a table's kind (a metrics trace has time_s, name, value)
TABLE_KINDS = {"audit": {"decided_at_s", "stage", "action"},
               "requests": {"start_s", "latency_ms", "outcome"}}


def _table_kind(path: Path) -> str | None:
    """audit | requests | rate trace, from a CSV's header or a parquet file's schema;
    None for anything else (a metrics trace, or not a table)."""
    import csv

    import polars as pl

    suffix = path.suffix.lower()
    if suffix == ".parquet":
        try:
            cols = set(pl.read_parquet_schema(path))
        except (OSError, pl.exceptions.PolarsError):
            return None  # the trace reader says what is wrong with it
    elif suffix == ".csv":
        with open(path, newline="", encoding="utf-8-sig") as fh:
            cols = {h.strip() for h in next(csv.reader(fh), [])}
    else:
        return None
    if cols == {"time_s", "rate_rps"}:
        return "rate trace"
    return next((kind for kind, need in TABLE_KINDS.items() if need <= cols), None)


def _check_table(kind: str, path: Path) -> list[C.Finding]:
    import polars as pl

    from relakit.vocab import OUTCOMES, TIERS

    if kind == "rate trace":
        from relakit.sim.spec import read_rate_trace

        read_rate_trace(path)  # a mistake is a ScenarioError naming the row
        return []
    frame = pl.read_parquet(path) if path.suffix.lower() == ".parquet" else pl.read_csv(path)
    if kind == "audit":
        from relakit.control.audit import DECISION_COLUMNS

        missing = [c for c in DECISION_COLUMNS if c not in frame.columns]
        if missing:
            return [C.Finding(C.ERROR, str(path), "(columns)",
                              f"an audit without {', '.join(missing)}; expected the columns "
                              f"{', '.join(DECISION_COLUMNS)}")]
        early = frame.filter(pl.col("effective_at_s") < pl.col("decided_at_s"))
        if early.height:
            return [C.Finding(C.ERROR, str(path), "effective_at_s",
                              f"{early.height} decision(s) take effect before they are made, "
                              f"e.g. at {early['effective_at_s'][0]:g} s, decided at "
                              f"{early['decided_at_s'][0]:g} s")]
        return []
    out = []
    for col, known in (("tier", TIERS), ("outcome", OUTCOMES)):
        if col in frame.columns:
            other = sorted(set(frame[col].drop_nulls().unique().to_list()) - set(known))
            if other:
                out.append(C.Finding(C.ERROR, str(path), col,
                                     f"{', '.join(map(repr, other))}: not a {col} relakit "
                                     f"knows ({', '.join(known)})"))
    bad = frame.filter(~pl.col("latency_ms").is_finite() | (pl.col("latency_ms") < 0))
    if bad.height:
        out.append(C.Finding(C.ERROR, str(path), "latency_ms",
                             f"{bad.height} latency(ies) negative or not finite"))
    return out


def _notebook_for(path: Path, data) -> Path | None:
    """The notebook a YAML of papermill parameters is for, in a ``notebooks`` folder above
    the file: the one the file's name starts with (``04_policy-quick.yaml`` →
    ``04_policy.ipynb``), else the first whose parameters hold every key."""
    from relakit.sweep import notebook_parameters

    if not isinstance(data, dict) or not data:
        return None
    for up in path.resolve().parents:
        books = sorted((up / "notebooks").glob("*.ipynb"))
        if books:
            break
    else:
        return None
    named = [b for b in books if path.stem.startswith(b.stem)]
    if named:  # checked against it, so a misspelt key is named
        return named[0]
    return next((b for b in books if set(data) <= set(notebook_parameters(b))), None)


def _check_parameters(path: Path, data: dict, notebook: Path) -> list[C.Finding]:
    """Every key a parameter of the notebook, each value of its default's kind."""
    from relakit.sweep import notebook_parameters
    from relakit.validate import display_path

    known = notebook_parameters(notebook)
    out = []
    for k, v in data.items():
        if k not in known:
            out.append(C.Finding(C.ERROR, str(path), str(k),
                                 f"{display_path(notebook)} has no such parameter; its "
                                 f"parameters: {', '.join(known)}"))
            continue
        want = known[k]
        if want is not None and not isinstance(v, type(want)) and not (
                isinstance(want, float) and isinstance(v, int) and not isinstance(v, bool)):
            out.append(C.Finding(C.ERROR, str(path), str(k),
                                 f"{v!r} is not a {type(want).__name__} like the notebook's "
                                 f"default ({want!r})"))
    return out


def _cross_checks(loaded: dict) -> list[C.Finding]:
    """Policies, chains and clocks on their own, or against each trace given with them."""
    out = []
    clocks = loaded["clocks"][0] if loaded["clocks"] else None
    from relakit.control.promql_store import store_from_frame

    policies, chains, traces = loaded["policy"], loaded["chain"], loaded["trace"]
    for groups, rules_file in loaded["rules"]:
        for frame, source in traces:
            out += C.check_rules(groups, rules_file, frame["name"].unique().to_list(),
                                 missing=C.WARNING, what=f"the trace {source}")
            out += C.check_rule_labels(groups, rules_file, store_from_frame(frame, source))
        if not traces:
            names = [s[1] for s in C.simulator_series(_default_buckets(), in_path=True)]
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
        # every series the simulator can export: a policy alone may be meant for a fleet
        # with in-path mechanisms (their outcomes and series, issue 33)
        series = C.simulator_series(_default_buckets(), in_path=True)
        for pol in policies:
            out += C.check_policy(pol)
            out += C.check_signals(pol, series, missing=C.WARNING, what="the simulator",
                                   own=True)
        for ch in chains:
            out += C.check_chain(ch, None)
    for clk in loaded["clocks"]:
        needs = not policies or any(C.policy_needs_rates(p) for p in policies) or bool(chains)
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
