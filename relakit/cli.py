"""The ``relakit`` command (also ``python -m relakit``); nothing else imports it.

Bad input ends with a one-paragraph message and exit status 2, never a
traceback: the message names the file, the key and what is allowed. A run
longer than a few seconds shows a progress line on stderr when stderr is a
terminal (``relakit.progress``); stdout is the same either way.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import warnings
from pathlib import Path

from relakit.io import folder_name
from relakit.progress import Progress
from relakit.validate import SEED_MAX, ScenarioError
from relakit.vocab import ROUTINGS, TIERS

MAX_WORKERS = 1024


def load_scenario(path):
    """:func:`relakit.scenario.load_scenario`, imported when a command reads a scenario
    (it brings the simulator's modules: ~0.04 s of every start that needs none, such as
    ``replay --rules``)."""
    from relakit.scenario import load_scenario as load

    return load(path)


# ---- command-line values, checked with the same ranges as the YAML ------------------------
def _number(text: str, *, lo=None, hi=None, lo_open=False, integer=False):
    """A number from the command line, with the YAML reader's rules and wording."""
    try:
        value = int(text, 10) if integer else float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected {'a whole number' if integer else 'a number'}, got {text!r}") from None
    if not integer and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    if lo is not None and (value < lo or (lo_open and value == lo)):
        raise argparse.ArgumentTypeError(
            f"{text} is out of range: must be {'>' if lo_open else '>='} {lo}")
    if hi is not None and value > hi:
        raise argparse.ArgumentTypeError(f"{text} is out of range: must be <= {hi}")
    return value


def _seed(text: str) -> int:
    """As the scenario's ``seed``: a whole number from 0 to 2**64 - 1."""
    return _number(text, lo=0, hi=SEED_MAX, integer=True)


def _workers(text: str) -> int:
    return _number(text, lo=1, hi=MAX_WORKERS, integer=True)


def _replications(text: str) -> int:
    return _number(text, lo=1, hi=10_000, integer=True)


def _positive(text: str) -> float:
    return _number(text, lo=0, lo_open=True)


def _time(text: str) -> float:
    return _number(text)


def _instances(text: str) -> int:
    return _number(text, lo=1, hi=64, integer=True)


def _port(text: str) -> int:
    return _number(text, lo=0, hi=65_535, integer=True)


def _queue_limit(text: str) -> int:
    return _number(text, lo=0, hi=1_000_000, integer=True)


def _buckets(text: str) -> tuple[float, ...]:
    """Latency bucket bounds in seconds, comma-separated, positive and rising."""
    bounds = tuple(_positive(b.strip()) for b in text.split(","))
    if any(b <= a for a, b in zip(bounds, bounds[1:], strict=False)):
        raise argparse.ArgumentTypeError(f"{text!r}: bounds must rise, e.g. 0.05,0.1,0.2,0.5")
    return bounds


def _phases(text: str) -> list[tuple[float, float]]:
    """``seconds:rate`` pairs, comma-separated: 10:50,20:200 (seconds > 0, rate >= 0)."""
    from relakit.lab.load import MAX_PHASE_S, MAX_RATE_RPS

    phases = []
    for i, part in enumerate(text.split(",")):
        fields = part.strip().split(":")
        if len(fields) != 2:
            raise argparse.ArgumentTypeError(
                f"phase {i + 1} {part!r}: expected seconds:rate, e.g. 10:50,20:200")
        try:
            seconds = _number(fields[0], lo=0, lo_open=True, hi=MAX_PHASE_S)
            rate = _number(fields[1], lo=0, hi=MAX_RATE_RPS)
        except argparse.ArgumentTypeError as exc:
            raise argparse.ArgumentTypeError(f"phase {i + 1} {part!r}: {exc}") from None
        phases.append((seconds, rate))
    if not any(rate > 0 for _, rate in phases):
        raise argparse.ArgumentTypeError("every phase has rate 0: nothing would be sent")
    return phases


def _formats(text: str) -> tuple[str, ...]:
    """``png,svg``: the figure formats, checked by :func:`relakit.plots.check_formats`."""
    from relakit import plots  # only `relakit figures` has --formats, and draws anyway

    try:
        return plots.check_formats(text.split(","))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _writable_dir(path, option: str = "--out") -> Path:
    """Check an output folder can be made and written, before any work is done."""
    path = Path(path)
    probe = path
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise ScenarioError(f"{option} {path}: {probe} is a file, not a folder")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ScenarioError(f"{option} {path}: cannot write in {probe} (permission denied)")
    return path


#: the one output convention: ``--out DIR`` is the folder a command writes into (made when
#: missing, checked before any work); the files inside have fixed names, each written whole
#: (temporary name, then rename: relakit.io) and printed as ``wrote PATH``
OUT_HELP = "folder to write into: "
#: the release that stops accepting ``--out FILE`` (the spelling before the convention)
OUT_FILE_UNTIL = "0.2"


def _out_file(out, name: str, suffixes: tuple[str, ...], option: str = "--out") -> Path:
    """Where a command's one product goes: ``<out>/<name>``. ``--out FILE`` with the
    product's suffix, as calibrate, import-rules and lab record were spelled before every
    ``--out`` named a folder, still writes FILE, with a warning, until OUT_FILE_UNTIL."""
    from relakit.checks import RelakitWarning

    out = Path(out)
    if out.suffix.lower() in suffixes:
        parent = out.parent if str(out.parent) else Path(".")
        warnings.warn(f"{option} {out}: naming the file is deprecated and ends with relakit "
                      f"{OUT_FILE_UNTIL}: {option} is the folder to write into (the file is "
                      f"then {name}); use {option} {parent}", RelakitWarning, stacklevel=2)
        _writable_dir(parent, option)
        return out
    return _writable_dir(out, option) / name


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors as one line in relakit's form (no usage dump)."""

    def error(self, message):
        self.exit(2, f"relakit: error: {self.prog}: {message} (see {self.prog} --help)\n")

DESCRIPTION = """\
relakit is a research workbench for reliability control loops: what happens to
a fleet near saturation when hedging, shedding, isolation, throttling, circuit
breaking, repair and readmission are decided by a control plane that only sees
sampled metrics. It simulates the fleet (numba), checks it against closed forms,
and runs RelA's policy and the containment chain in closed loop, in replay over
a recorded trace, or against a live lab on 127.0.0.1."""

EPILOG = """\
examples:
  relakit simulate params/scenarios/rela-ramp.yaml --no-requests
  relakit simulate params/scenarios/mmc-demo.yaml --replications 8
  relakit compare A.yaml B.yaml --replications 10 --out out/compare
  relakit replay data/traces/step-errors.csv --policy params/policies/rela.yaml --out out/replay
  relakit replay data/traces/step-errors.csv --rules params/rules/slo.yml --out out/rules
  relakit sweep params/sweeps/rela-thresholds.yaml
  relakit search params/searches/metastable-policy.yaml --trials 12 --out out/search
  relakit calibrate out/calibrate-roundtrip/metrics.parquet --out out/twin --report
  relakit <command> --help    options of one command, with their defaults"""


class _Help(argparse.RawDescriptionHelpFormatter):
    """Keeps the texts' line breaks and ends every option's help with its default."""

    def _get_help_string(self, action):
        text = action.help or ""
        if (not action.option_strings or action.default is argparse.SUPPRESS
                or "(default" in text):
            return text
        if action.required:
            return f"{text} (required)"
        if isinstance(action, argparse._StoreTrueAction):
            return f"{text} (default: off)"
        return f"{text} (default: %(default)s)"


def _version() -> str:
    """The installed distribution's version (package metadata), not a copy of it."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("relakit")
    except PackageNotFoundError:  # pragma: no cover - running from an uninstalled tree
        return "unknown (not installed)"


class _VersionAction(argparse.Action):
    """``--version``: the version looked up when asked for (package metadata costs
    ~0.02 s CPU, which every other command would pay while the parser is built)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS,
                 help="show program's version number and exit"):  # noqa: A002 (argparse's name)
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"relakit {_version()}")
        parser.exit()


def _seconds(spent: dict) -> str:
    """{name: seconds} as one line with one decimal, and the total."""
    parts = [f"{k} {v:.1f} s" for k, v in spent.items()]
    return ", ".join(parts) + f" ({sum(spent.values()):.1f} s in all)"


def _simulate(args) -> int:
    from relakit.experiment import simulate
    from relakit.sweep import scenario_inputs

    sc = load_scenario(args.scenario)
    # --seed alone reruns one run (one replication, from the seeds a replicated run
    # lists); with --replications it is the seed the replications' seeds are spawned from
    n = args.replications or (1 if args.seed is not None else sc.replications)
    if args.figure:  # check before anything runs, so a bad --figure writes no tables
        if n > 1:
            raise ScenarioError("--figure draws one run; rerun one replication with --seed "
                                "SEED (the seeds are in summary.json) and --figure")
        if args.no_requests:
            raise ScenarioError("--figure needs per-request records; drop --no-requests")
    out = _writable_dir(args.out or Path("out") / folder_name(sc.name))
    figure = _figure_path(args.figure, out) if args.figure else None
    if n > 1:
        with Progress(f"simulate {sc.name}", n, "replications") as progress:
            result = simulate(sc, seed=args.seed, record_requests=False if args.no_requests
                              else None, progress=progress, replications=n,
                              workers=args.workers, scheduler=args.scheduler)
        result.info["inputs"] = scenario_inputs(args.scenario)
        written = result.write(out)
        print(result.format_summary())
        print("seeds: " + " ".join(map(str, result.seeds)))
        for p in written:
            print(f"wrote {p}")
        return 0
    with Progress(f"simulate {sc.name}", sc.duration_s, "s simulated") as progress:
        result = simulate(sc, seed=args.seed, record_requests=not args.no_requests,
                          progress=progress, replications=1)
    result.info["inputs"] = scenario_inputs(args.scenario)  # which scenario made this folder
    written = result.write(out)
    print(result.format_summary())
    if "batch_means" in result.info:
        from relakit.replications import BATCH_NUMBERS, format_table

        bm = result.info["batch_means"]
        print(f"\nbatch means ({bm['batches']} batches of {bm['batch_s']:g} s, warm-up "
              f"{bm['warmup']}: {bm['warmup_deleted_s']:g} s deleted): mean ± 95 % "
              "half-width")
        print(format_table(result.summary, ["tier", *BATCH_NUMBERS, "lag1"]))
    if result.decisions is not None:
        from relakit.control import format_audit

        print("\naudit (changes):")
        print(format_audit(result.decisions))
        if "control" in result.info:
            print(f"time in each mode: {_seconds(result.info['control']['time_in_mode_s'])}")
        if "chain" in result.info:
            actions = result.info["chain"]["actions"]
            print("chain actions: " + (", ".join(f"{k} {n}" for k, n in actions.items())
                                       or "none"))
    for p in written:
        print(f"wrote {p}")
    if figure is not None:
        print(f"wrote {_figure(sc, result, figure)}")
    return 0


def _compare(args) -> int:
    from relakit.comparison import DEFAULT_REPLICATIONS, compare

    out = _writable_dir(args.out) if args.out else None
    a, b = load_scenario(args.a), load_scenario(args.b)
    n = args.replications or max(a.replications, b.replications)
    n = DEFAULT_REPLICATIONS if n == 1 and args.replications is None else n
    with Progress("compare", 2 * n, "replications") as progress:
        result = compare(a, b, replications=n, crn=not args.independent, seed=args.seed,
                         workers=args.workers, scheduler=args.scheduler, progress=progress)
    print(result.format(args.tier))
    if out is not None:
        for p in result.write(out):
            print(f"wrote {p}")
    return 0


def _figure_path(figure: str, out: Path) -> Path:
    """``--figure png|svg|pdf``: ``<out>/latency.<format>``; a file name (``fig.png``, the
    spelling before --out held every output) still works, with a warning, for one release."""
    if figure.lower() in ("png", "svg", "pdf"):
        return out / f"latency.{figure.lower()}"
    if Path(figure).suffix.lower() in (".png", ".svg", ".pdf"):
        return _out_file(figure, "latency" + Path(figure).suffix.lower(),
                         (".png", ".svg", ".pdf"), "--figure")
    raise ScenarioError(f"--figure {figure}: expected png, svg or pdf (the figure is written "
                        "into --out as latency.<format>)")


def _figure(sc, result, path) -> Path:
    """Response-time exceedance; beside Erlang C when the scenario is an M/M/c node."""
    from relakit import plots

    if result.requests is None:
        raise ScenarioError("--figure needs per-request records; drop --no-requests")
    ok = result.requests.filter(
        (result.requests["outcome"] == "ok") & (result.requests["arrival_s"] >= sc.warmup_s))
    curves = {"simulation": plots.latency_ccdf_frame(ok["latency_ms"].to_numpy())}
    fl, wl = sc.fleet, sc.workload
    plain = fl.nodes == 1 and fl.service.kind == "exponential"
    clients = wl.clients
    thinks = set() if clients is None else {(clients.think[t].kind, clients.think[t].mean_ms)
                                            for t in clients.tiers}
    if plain and wl.open and clients is None and wl.arrival.constant:
        import numpy as np
        import polars as pl

        from relakit.analytic import mmc

        m = mmc(wl.arrival.rates_rps[0], 1000.0 / fl.node_mean_ms[0], fl.servers[0])
        xs = curves["simulation"]["latency_ms"].to_numpy()
        sf = np.array([1.0 - m.response_cdf(x / 1000.0) for x in xs])
        curves[f"Erlang C (M/M/{fl.servers[0]})"] = pl.DataFrame(
            {"latency_ms": xs, "exceedance": sf})
    elif (plain and not wl.open and len(thinks) == 1 and next(iter(thinks))[0] == "exponential"
          and not clients.steps):  # (a population schedule has no one steady state)
        import polars as pl

        from relakit.analytic import finite_source

        m = finite_source(clients.total, next(iter(thinks))[1] / 1000.0,
                          1000.0 / fl.node_mean_ms[0], fl.servers[0])
        xs = curves["simulation"]["latency_ms"].to_numpy()
        curves[f"M/M/{fl.servers[0]}//{clients.total}"] = pl.DataFrame(
            {"latency_ms": xs, "exceedance": m.response_sf(xs / 1000.0)})
    # the closed form and the simulation in their palette colours (PALETTE["source"]), as in
    # every other figure that sets one beside the other
    colors = {name: plots.CLOSED_FORM_COLOR for name in curves}
    colors["simulation"] = plots.SIMULATION_COLOR
    title = (f"{sc.name}: response time, simulation vs closed form" if len(curves) > 1 else
             f"{sc.name}: response time (simulation; no closed form for this scenario)")
    chart = plots.latency_ccdf(curves, title=title, colors=colors)
    return plots.save(chart, path)


def _replay(args) -> int:
    if args.policy is None and args.chain is None and args.rules is None:
        raise ValueError("give --policy, --chain, --rules, or any of them together")
    if args.start is not None and args.end is not None and args.start > args.end:
        raise ScenarioError(f"--start {args.start:g} is after --end {args.end:g}: the first "
                            "evaluation must come before the last")
    groups = None
    if args.rules is not None:
        from relakit.control.rules import load_rules

        groups = load_rules(args.rules)  # a bad rule file fails before anything is written
    out = _writable_dir(args.out)
    if groups is not None:
        _replay_rules(args, groups, out)
    if args.policy is None and args.chain is None:
        return 0
    from relakit.control import load_clocks
    from relakit.io import write_parquet
    from relakit.openloop import replay

    with Progress("replay", 1.0, "evaluations") as progress:
        result = replay(args.trace, args.policy, load_clocks(args.clocks), start_s=args.start,
                        end_s=args.end, chain=args.chain, progress=progress)
    print(result.format_audit())
    if result.policy is not None:
        print(f"time in each mode: {_seconds(result.time_in_mode())}")
    for name, table in (("decisions", result.decisions), ("timeline", result.timeline)):
        print(f"wrote {write_parquet(table, out / f'{name}.parquet')}")
    return 0


def _replay_rules(args, groups, out: Path):
    """Backtest a Prometheus rule file over the trace: print the alerts, write
    alerts.parquet (relakit.control.rules.backtest_rules' table)."""
    from relakit.checks import check_rule_labels, check_rules, enforce
    from relakit.control.promql_store import read_store
    from relakit.control.rules import backtest_rules
    from relakit.io import write_parquet

    store = read_store(args.trace)  # streamed: no per-sample objects, no dense matrix
    names = sorted({s.label("__name__") for s in store})
    enforce(check_rules(groups, str(args.rules), names, missing="warning",
                        what=f"the trace {args.trace}")
            + check_rule_labels(groups, str(args.rules), store))
    # a pyarrow table, written by pyarrow: the replay never loads polars (~0.13 s)
    alerts = backtest_rules(store, groups, args.start, args.end, arrow=True)
    print(_alerts_table(alerts))
    print(f"wrote {write_parquet(alerts, out / 'alerts.parquet')}")


def _alerts_table(alerts) -> str:
    """The alert episodes (a pyarrow table) as a plain text table (times in seconds;
    '-' never/still)."""
    if alerts.num_rows == 0:
        return "alerts: none (no rule's expression returned anything)"

    def cell(v):
        return "-" if v is None else f"{v:g}"

    rows = [["alert", "labels", "pending_at_s", "firing_at_s", "resolved_at_s"]]
    rows += [[r["alert"], r["labels"] if r.get("error") is None else f"error: {r['error']}",
              cell(r["pending_at"]), cell(r["firing_at"]),
              cell(r["resolved_at"])] for r in alerts.to_pylist()]
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    return "\n".join("  ".join(v.ljust(w) if i < 2 else v.rjust(w)
                               for i, (v, w) in enumerate(zip(r, widths, strict=True)))
                      for r in rows)


def _import_rules(args) -> int:
    from relakit.control.import_rules import import_rules, read_mapping, write_policy
    from relakit.control.policy import load_policy
    from relakit.control.rules import load_rules

    target = _out_file(args.out, "policy.yaml", (".yaml", ".yml"))
    mapping = read_mapping(args.mapping, args.map or ())
    policy, clocks = import_rules(args.rules, mapping)
    load_policy(policy)  # what is written loads: checked before anything is on disk
    # in the --out folder: policy.yaml and clocks.yaml, as search's front/trial-N/ has them
    # (the deprecated --out FILE keeps FILE's stem.clocks.yaml beside it)
    in_folder = target.parent == Path(args.out)
    out, clocks_path = write_policy(policy, clocks, target, args.rules,
                                    target.with_name("clocks.yaml") if in_folder else None)
    for mode in policy["modes"]:
        cond = policy["conditions"][mode["name"]]
        print(f"{mode['name']}: {cond['signal']} {cond['op']} {cond['threshold']:g} for "
              f"{mode['enter_after']} evaluations -> {_flag_text(mode['assert'])}")
    skipped = sorted({r.name for g in load_rules(args.rules) for r in g.rules
                      if r.kind == "alert"} - set(mapping))
    if skipped:
        print(f"not imported (no mode given): {', '.join(skipped)}")
    print(f"wrote {out}\nwrote {clocks_path}")
    return 0


def _flag_text(flags: dict) -> str:
    return ", ".join(f"{k}={'on' if v else 'off'}" for k, v in flags.items())


def _sweep(args) -> int:
    from relakit.display import text_rows
    from relakit.sweep import load_sweep, manifests, run_sweep, short_rows

    spec = load_sweep(args.sweep)
    out = _writable_dir(args.out or Path("out") / "sweeps" / folder_name(spec.name))
    table = run_sweep(spec, out, scheduler=args.scheduler, workers=args.workers)
    m = manifests(out)
    failed = m.filter(m["status"] != "ok") if m.height else m
    print(f"{m.height} points, {failed.height} failed; results: {out / 'results.parquet'} "
          f"({table.height} rows)")
    import json

    ignored = json.loads((out / "sweep.json").read_text()).get("ignored_folders", [])
    if ignored:  # folders of earlier specs: kept, never mixed into this spec's results
        print(f"ignored {len(ignored)} point folder(s) of other specs in {out}")
    for row in failed.iter_rows(named=True):
        print(f"  failed {row['point_id']}: {row['error']}")
    rows = short_rows(table)
    if len(rows) > 1:
        print("per point, all tiers" + (" (mean ± 95 % half-width over replications)"
                                        if spec.replications > 1 else "") + ":")
        for line in text_rows(rows):
            print("  " + line)
    return 0 if failed.height == 0 else 1


def _search(args) -> int:
    """`relakit search SEARCH.yaml`: run or resume a search; print its front vs the incumbent."""
    from relakit.counterfactual import load_search, search
    from relakit.counterfactual.report import front_rows
    from relakit.display import text_rows

    spec = load_search(args.search)
    out = _writable_dir(args.out or Path("out") / "searches" / folder_name(spec.name))
    res = search(spec, out, trials=args.trials, workers=args.workers, scheduler=args.scheduler)
    print(f"{res.trials.height} trials complete, {res.front.height} on the Pareto front; "
          f"{out / 'trials.parquet'}, {out / 'front.parquet'}, {out / 'front'}/")
    print("the front: settings, then each objective's mean ± 95 % half-width" + (
        " (in brackets: the paired difference from the incumbent, same seeds)"
        if res.incumbent is not None else ""))
    for line in text_rows(front_rows(res)):
        print("  " + line)
    return 0


def _figures(args) -> int:
    """The standard views of a run folder (what `relakit simulate` wrote), offline.

    Formats are checked, and every figure rendered, before the first file is written.
    """
    from relakit import plots
    from relakit.sim.results import SimulationResult

    formats = plots.check_formats(args.formats)
    run = Path(args.run)
    if args.scenario is not None:
        _fresh_run(run, args.scenario)
    elif not run.is_dir():
        raise ScenarioError(f"{run}: no such run folder; write one with "
                            f"`relakit simulate SCENARIO --out {run}`")
    result = SimulationResult.read(run)
    charts = {"dashboard": plots.run_dashboard(result)}
    if result.requests is not None:
        ok = result.requests.filter(_ok_after_warmup(result))
        curves = {t: plots.latency_ccdf_frame(ok.filter(ok["tier"] == t)["latency_ms"]
                                              .to_numpy()) for t in plots.TIERS}
        charts["latency"] = plots.latency_ccdf(
            {t: c for t, c in curves.items() if c.height},
            title=f"{result.info.get('scenario', run.name)}: response time by tier",
            subtitle="successful requests after warm-up")
    else:
        print("note: no requests.parquet (run kept with --no-requests): the dashboard's load "
              "and outcome panels come from the clients' counters; no latency panel or "
              "latency figure", file=sys.stderr)
    blobs = {(name, f): plots.render(chart, f) for name, chart in charts.items()
             for f in formats}
    out = _writable_dir(args.out)
    from relakit.io import atomic_write

    for (name, f), blob in blobs.items():
        def write(tmp, blob=blob):
            Path(tmp).write_bytes(blob)

        print(f"wrote {atomic_write(out / f'{run.name}-{name}.{f}', write)}")
    return 0


def _fresh_run(run: Path, scenario: str) -> None:
    """Make ``run`` the scenario's own run with per-request records: keep it when its
    summary.json carries the scenario's inputs digest and it has requests.parquet, else
    simulate the scenario into it (what `make figures` relies on: a run left by an
    edited scenario, or by Quick use's --no-requests, is never drawn as this one)."""
    import json

    from relakit.sweep import scenario_inputs

    want = scenario_inputs(scenario)
    try:
        had = json.loads((run / "summary.json").read_text()).get("info", {}).get("inputs")
    except (OSError, ValueError):
        had = None
    why = ("there is no run" if not (run / "summary.json").is_file() else
           "it was made from other inputs" if had != want else
           "it has no per-request records (--no-requests)"
           if not (run / "requests.parquet").is_file() else None)
    if why is None:
        print(f"drawing {run}: the run of {scenario} as it is now")
        return
    print(f"simulating {scenario} into {run} first: {why}")
    code = _simulate(argparse.Namespace(scenario=scenario, seed=None, replications=None,
                                        figure=None, no_requests=False, out=str(run),
                                        workers=None, scheduler=None))
    if code:
        raise ScenarioError(f"{scenario}: its simulation failed; nothing drawn")


def _ok_after_warmup(result):
    """Successful requests after the run's warm-up (the ones latency is reported for)."""
    import polars as pl

    return (pl.col("outcome") == "ok") & (pl.col("arrival_s") >= result.info.get("warmup_s", 0))


def _lab(args) -> int:
    """`relakit lab up|load|record|down`: the live system on 127.0.0.1 (relakit.lab.lifecycle)."""
    from relakit.lab import lifecycle

    work = Path(args.dir)
    if args.action == "up":
        _writable_dir(work, "--dir")
        return lifecycle.up(
            work, policy=None if args.no_policy else args.policy, chain=args.chain,
            instances=args.instances, agents=args.agents, lease_s=args.lease_s,
            renew_s=args.renew_s, clocks={"scrape_s": args.scrape_s, "window_s": args.window_s,
                                          "eval_s": args.eval_s, "poll_s": args.poll_s},
            front={"front_port": args.front_port, "routing": args.routing,
                   "tier_header": args.tier_header, "keepalive_s": args.keepalive_s,
                   "queue_limit": args.queue_limit, "deadline_ms": args.deadline_ms,
                   "buckets_s": args.buckets}, mitigations=args.mitigations)
    if args.action == "down":
        return lifecycle.down(work)
    if args.action == "load":
        return lifecycle.load(work, args.phases, args.seed)
    if (work / "state.json").is_file():  # no lab is said first (by lifecycle), then --out
        out = _out_file(args.out or work, "recorded.json", (".json",))
    else:
        out = work / "recorded.json"  # never written: record says there is no lab
    return lifecycle.record(work, out, args.since)


def _check(args) -> int:
    """`relakit check FILE...`: every check, nothing run; 0 clean, 1 warnings, 2 errors."""
    from relakit.checkfiles import check_files

    findings, kinds = check_files(args.files)
    for f in findings:
        print(f.line(), file=sys.stderr)
    for path, (kind, mine) in kinds.items():
        errors = sum(f.severity == "error" for f in mine)
        state = (f"{errors} error(s)" if errors else f"{len(mine)} warning(s)" if mine
                 else "ok")
        print(f"{path}: {kind}: {state}")
    if any(f.severity == "error" for f in findings):
        return 2
    return 1 if findings else 0


def _node_list(text: str) -> list[int]:
    """``0,2,3``: scrape targets by their node number in the recording."""
    try:
        nodes = [int(x, 10) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected node numbers separated by commas, e.g. "
                                         f"0,2, got {text!r}") from None
    if any(n < 0 for n in nodes) or len(set(nodes)) != len(nodes):
        raise argparse.ArgumentTypeError(f"{text!r}: node numbers are >= 0, each given once")
    return nodes


def _calibrate(args) -> int:
    """`relakit calibrate TRACE --out DIR`: fit a twin (DIR/twin.yaml); --report validates
    it, into the same folder."""
    from relakit.calibration import calibrate, write_report
    from relakit.checks import RelakitWarning
    from relakit.io import atomic_write

    out = _out_file(args.out, "twin.yaml", (".yaml", ".yml"))
    report = None
    if isinstance(args.report, str):  # --report DIR: the spelling before one --out folder
        warnings.warn(f"--report {args.report}: a folder for the report is deprecated and "
                      f"ends with relakit {OUT_FILE_UNTIL}: --report writes it into --out",
                      RelakitWarning, stacklevel=2)
        report = _writable_dir(args.report, "--report")
    elif args.report:
        report = out.parent
    cal = calibrate(args.trace, args.nodes, replay_flags=args.replay_flags, bin_s=args.bin,
                    window_s=args.window, replications=args.replications, seed=args.seed)
    print(f"wrote {atomic_write(out, lambda tmp: Path(tmp).write_text(cal.yaml))}")
    for line in cal.cautions:
        print(f"caution: {line}")
    if report is None:
        return 0
    written = write_report(cal, report)
    print(cal.validation.format_table())
    print(cal.validation.verdict)
    for path in written:
        print(f"wrote {path}")
    return 0 if cal.validation.trusted else 1


def _show_warning(message, category, filename, lineno, file=None, line=None):
    """Warnings as one line each: ``relakit: warning: FILE: key 'K': what and why``."""
    from relakit.checks import RelakitWarning

    if issubclass(category, RelakitWarning):
        text = f"relakit: warning: {message}"
    else:
        text = f"relakit: warning: {category.__name__}: {message}"
    print(text.replace("\n", " "), file=sys.stderr)


def main(argv=None) -> int:
    """The command line; returns the exit status (0 ok, 1 warnings or failures, 2 bad
    input, 3 a bug)."""
    with warnings.catch_warnings():
        from relakit.checks import RelakitWarning

        warnings.simplefilter("always", RelakitWarning)
        warnings.showwarning = _show_warning
        return _main(argv)


def build_parser() -> argparse.ArgumentParser:
    """The whole command line; every option's help ends with its default."""
    parser = _Parser(prog="relakit", description=DESCRIPTION, epilog=EPILOG,
                                     formatter_class=_Help)
    parser.add_argument("--version", action=_VersionAction)
    sub = parser.add_subparsers(dest="command", required=True, metavar="command")

    def command(name, help_text, description, wrap=True):
        import textwrap

        if wrap:
            description = textwrap.fill(description, 79, break_on_hyphens=False)
        return sub.add_parser(name, help=help_text, formatter_class=_Help,
                              description=description)

    p = command("simulate", "run a scenario end to end and write its tables",
                "Simulate a scenario (with its policy and chain, if it has them), print the "
                "per-tier summary, the mode changes and the chain's actions, and write "
                "requests.parquet, metrics.parquet, summary.json and, when a policy or chain "
                "ran, decisions.parquet and timeline.parquet.")
    p.add_argument("scenario", help="scenario YAML file")
    p.add_argument("--seed", type=_seed, default=None,
                   help="random seed, 0 to 2**64 - 1; alone, it runs one run with it (e.g. "
                        "one replication again, its seed from the replicated run's "
                        "summary.json); with --replications, the seed their seeds are "
                        "spawned from (default: the scenario's `seed`)")
    p.add_argument("--replications", type=_replications, default=None,
                   help="independent replications, 1 or more: the summary shows each "
                        "number's mean ± 95 %% half-width (default: the scenario's "
                        "`replications`, 1)")
    p.add_argument("--workers", type=_workers, default=None,
                   help="local processes for replications, 1 or more (default: one per "
                        "core)")
    p.add_argument("--scheduler", default=None,
                   help="Dask scheduler address for replications, e.g. "
                        "tcp://127.0.0.1:8786 (default: local processes)")
    p.add_argument("--out", metavar="DIR", default=None,
                   help=OUT_HELP + "requests.parquet, metrics.parquet, summary.json, and "
                        "decisions.parquet and timeline.parquet when a policy or chain ran "
                        "(default: out/<scenario name>)")
    p.add_argument("--no-requests", action="store_true",
                   help="keep no per-request records, so memory stays flat")
    p.add_argument("--figure", default=None, metavar="FORMAT",
                   help="also draw the response-time figure, png, svg or pdf, into --out "
                        "as latency.<format> (default: none)")
    p.set_defaults(func=_simulate)
    cm = command("compare", "run two scenarios on common random numbers and compare them",
                 "Run scenarios A and B the same number of replications, replication i of "
                 "both on the same seed (common random numbers), and print per summary "
                 "number A, B and the paired difference B - A as mean ± 95 % half-width, "
                 "with the variance ratio: how many times fewer replications the pairing "
                 "needed than independent seeds. --out writes compare.parquet (every tier "
                 "and number) and compare.json.")
    cm.add_argument("a", help="scenario A (YAML)")
    cm.add_argument("b", help="scenario B (YAML)")
    cm.add_argument("--replications", type=_replications, default=None,
                    help="replications of each, 2 or more (default: the scenarios' "
                         "`replications`, or 10 when both say 1)")
    cm.add_argument("--out", metavar="DIR", default=None,
                    help=OUT_HELP + "compare.parquet and compare.json (default: none, "
                         "print only)")
    cm.add_argument("--independent", action="store_true",
                    help="give B independent seeds instead of A's (the baseline CRN is "
                         "measured against)")
    cm.add_argument("--seed", type=_seed, default=None,
                    help="the seed both sides' seeds are spawned from (default: A's `seed`)")
    cm.add_argument("--tier", choices=(*TIERS, "all"), default="all",
                    help="the tier printed (the files hold every tier)")
    cm.add_argument("--workers", type=_workers, default=None,
                    help="local processes, 1 or more (default: one per core)")
    cm.add_argument("--scheduler", default=None,
                    help="Dask scheduler address, e.g. tcp://127.0.0.1:8786 "
                         "(default: local processes)")
    cm.set_defaults(func=_compare)
    r = command("replay", "run a policy, chain or rule file open loop over a recorded "
                "metric trace",
                "Run the controller (a policy, a containment chain, or both) over a metric "
                "trace at the clocks' evaluation instants; print the audit and the time in "
                "each mode, and write decisions.parquet and timeline.parquet. With --rules, "
                "also backtest a Prometheus rule file as Prometheus would evaluate it; "
                "print its alerts and write alerts.parquet.")
    r.add_argument("trace", help="trace: Prometheus range-query JSON, long CSV, parquet, "
                                 "or a folder of text-exposition snapshots")
    r.add_argument("--policy", default=None, help="policy YAML (default: none; give "
                                                  "--policy, --chain, --rules or several)")
    r.add_argument("--chain", default=None, help="containment chain YAML (default: none)")
    r.add_argument("--rules", default=None,
                   help="Prometheus rule file (groups of alert/record rules) to backtest "
                        "(default: none)")
    r.add_argument("--clocks", default=None, help="clocks YAML (default: RelA's clocks)")
    r.add_argument("--out", metavar="DIR", required=True,
                   help=OUT_HELP + "decisions.parquet and timeline.parquet; alerts.parquet "
                        "with --rules")
    r.add_argument("--start", type=_time, default=None,
                   help="first evaluation, seconds (default: the trace's first sample)")
    r.add_argument("--end", type=_time, default=None,
                   help="last evaluation, seconds (default: the trace's last sample)")
    r.set_defaults(func=_replay)
    ir = command("import-rules", "turn Prometheus alerting rules into a relakit policy",
                 "Write a policy with one mode per mapped alert (its signal the alert's "
                 "expression as PromQL, `for:` as consecutive breaching evaluations, recording "
                 "rules inlined) and, beside it, a clocks file with the rule group's interval "
                 "as the evaluation clock. --map ALERT=MODE (or a mapping file) says which of "
                 "RelA's modes, survival or performance, a firing alert asserts.")
    ir.add_argument("rules", help="Prometheus rule file")
    ir.add_argument("--out", metavar="DIR", required=True,
                    help=OUT_HELP + "policy.yaml and its evaluation clock, clocks.yaml")
    ir.add_argument("--map", action="append", metavar="ALERT=MODE",
                    help="an alert and the mode it asserts (survival or performance); "
                         "repeat for each alert (default: none)")
    ir.add_argument("--mapping", default=None,
                    help="YAML file of alert: mode pairs (default: none; --map wins)")
    ir.set_defaults(func=_import_rules)
    w = command("sweep", "run a grid of scenario or notebook points",
                "Run every point of a sweep file that is not done yet (a resumed sweep "
                "skips finished points), each into its own folder, and combine them into "
                "results.parquet.")
    w.add_argument("sweep", help="sweep YAML")
    w.add_argument("--out", metavar="DIR", default=None,
                   help=OUT_HELP + "a folder per point, results.parquet, sweep.json "
                        "(default: out/sweeps/<name>)")
    w.add_argument("--scheduler", default=None,
                   help="Dask scheduler address, e.g. tcp://127.0.0.1:8786 "
                        "(default: local processes)")
    w.add_argument("--workers", type=_workers, default=None,
                   help="local processes, 1 or more (default: one per core)")
    w.set_defaults(func=_sweep)
    se = command("search", "search policy thresholds and clocks for the best trade-off",
                 "Run (or resume) an Optuna search over the dotted scenario keys of a search "
                 "file: each trial runs the same replication seeds as the incumbent (common "
                 "random numbers), its objectives are means with 95 % half-widths, and each "
                 "member of the Pareto front is compared with the incumbent pair by pair. "
                 "Writes trials.parquet, front.parquet, front/trial-N/ (policy, clocks, "
                 "overrides YAML), incumbent.parquet, search.json and the study's journal "
                 "(study.journal: a killed search resumes without repeating finished trials).")
    se.add_argument("search", help="search YAML")
    se.add_argument("--trials", type=_workers, default=None,
                    help="complete trials to reach, 1 or more (default: the file's `trials`)")
    se.add_argument("--workers", type=_workers, default=None,
                    help="local processes, 1 or more (default: one per core)")
    se.add_argument("--scheduler", default=None,
                    help="Dask scheduler address, e.g. tcp://127.0.0.1:8786 "
                         "(default: local processes)")
    se.add_argument("--out", metavar="DIR", default=None,
                    help=OUT_HELP + "trials.parquet, front.parquet, front/, "
                         "incumbent.parquet, search.json, study.journal "
                         "(default: out/searches/<name>)")
    se.set_defaults(func=_search)
    f = command("figures", "export a run folder's standard views (PNG, SVG, PDF)",
                "Draw the dashboard of a folder written by `relakit simulate` (without "
                "--no-requests) and export it offline.")
    f.add_argument("run", help="a folder written by `relakit simulate`")
    f.add_argument("--scenario", default=None,
                   help="the scenario RUN must be the run of: simulated into RUN first when "
                        "RUN is missing, was made from other inputs (content of the scenario "
                        "and the files it names) or has no per-request records")
    f.add_argument("--out", metavar="DIR", default="figures",
                   help=OUT_HELP + "<run>-dashboard.<format> and <run>-latency.<format>")
    f.add_argument("--formats", type=_formats, default="png,svg,pdf",
                   help="comma-separated, from png, svg and pdf")
    f.set_defaults(func=_figures)
    lb = command("lab", "the live RelA lab on 127.0.0.1: up, load, record, down",
                 "RelA itself, on 127.0.0.1 only (Prometheus: Debian's package). Each "
                 "action has its own options: `relakit lab up --help`.")
    actions = lb.add_subparsers(dest="action", required=True, metavar="action",
                                help="what to do (each has its own --help)")

    def action(name, help_text):
        ap = actions.add_parser(name, help=help_text, description=help_text[0].upper()
                                + help_text[1:] + ".", formatter_class=_Help)
        ap.add_argument("--dir", default="out/lab", help="the lab's working folder")
        ap.set_defaults(func=_lab)
        return ap

    up = action("up", "start the config server, the data-plane instances, Prometheus and "
                      "the agent; runs until Ctrl-C or `relakit lab down`")
    up.add_argument("--instances", type=_instances, default=3, help="data-plane instances")
    up.add_argument("--policy", default="params/policies/rela-lab.yaml",
                    help="the agent's policy YAML (the default is RelA's, fitted to the "
                         "lab's service: docs/lab.md)")
    up.add_argument("--no-policy", action="store_true", help="no policy (then give --chain)")
    up.add_argument("--chain", default=None,
                    help="a containment chain YAML the agent runs too (it isolates and "
                         "readmits instances through the config server)")
    up.add_argument("--agents", type=_instances, default=1,
                    help="agent replicas; more than one elect a leader through a lease on "
                         "the config server (writes fenced by its epoch)")
    up.add_argument("--lease-s", type=_positive, default=5.0,
                    help="the leader's lease, seconds (with --agents > 1)")
    up.add_argument("--renew-s", type=_positive, default=1.5,
                    help="how often the leader renews its lease, seconds")
    up.add_argument("--scrape-s", type=_positive, default=1.0,
                    help="Prometheus scrape interval, seconds")
    up.add_argument("--window-s", type=_positive, default=5.0,
                    help="the signals' query window, seconds")
    up.add_argument("--eval-s", type=_positive, default=1.0,
                    help="the agent's evaluation interval, seconds")
    up.add_argument("--poll-s", type=_positive, default=1.0,
                    help="the instances' and load generator's config poll interval, seconds")
    up.add_argument("--front-port", type=_port, default=8780,
                    help="the front door's port on 127.0.0.1 (0: any free port)")
    up.add_argument("--routing", choices=ROUTINGS, default="random",
                    help="how the front picks an instance (as fleet.routing)")
    up.add_argument("--tier-header", default="X-Tier",
                    help="the request header that names the tier (or ?tier=)")
    up.add_argument("--keepalive-s", type=_positive, default=75.0,
                    help="idle keep-alive of the front and the instances, seconds")
    up.add_argument("--queue-limit", type=_queue_limit, default=None,
                    help="waiting places per instance (fleet.queue_limit; default none)")
    up.add_argument("--deadline-ms", type=_positive, default=None,
                    help="server-side timeout per request, ms (workload.deadline_ms)")
    up.add_argument("--buckets", type=_buckets, default=None,
                    help="latency histogram bucket bounds, seconds, comma-separated, rising")
    up.add_argument("--mitigations", metavar="SCENARIO", default=None,
                    help="a scenario YAML: the lab runs its mitigations.client_throttle "
                         "(load generator, front) and .concurrency_limit (instances); any "
                         "other mitigation in it is refused (docs/lab.md)")
    ld = action("load", "send open-loop load to the running lab, phase by phase")
    ld.add_argument("--phases", type=_phases, default="10:50,20:200,10:50",
                    help="seconds:rate pairs (rate in requests/s), run in order")
    ld.add_argument("--seed", type=int, default=None,
                    help="arrivals, tiers, targets and throttle draws (default: a fresh "
                         "one, printed, so a load can be repeated)")
    rec = action("record", "save what Prometheus scraped, for `relakit replay`")
    rec.add_argument("--since", type=_positive, default=None,
                     help="how far back to record, seconds (default: the whole run)")
    rec.add_argument("--out", metavar="DIR", default=None,
                     help=OUT_HELP + "recorded.json (default: the lab's --dir)")
    action("down", "stop the lab, whatever happened to the process that started it")

    c = command("check", "check input files without running anything (exit 0 clean, "
                "1 warnings, 2 errors)",
                "Run every semantic check on the given files without simulating: "
                "scenarios, policies, chains, clocks, sweeps and traces, each recognised "
                "by its content; files given together are checked against each other "
                "(a policy against a trace).")
    c.add_argument("files", nargs="+", help="the files to check")
    c.set_defaults(func=_check)
    cb = command("calibrate", "fit a twin scenario to a recorded trace, and validate it",
                 "Estimate, from a recording's metrics alone, the arrival rate over time, the "
                 "tier mix, each node's servers and service time, and each node's fault "
                 "windows; write them as a scenario YAML whose every fitted value says where "
                 "it came from. With --report, run the twin against the recording on the "
                 "request rate, error ratio and p99 per evaluation window and say whether it "
                 "can be trusted (exit 1 when not).")
    cb.add_argument("trace", help="trace: Prometheus range-query JSON, long CSV, parquet (a "
                                  "simulation's metrics.parquet), or a folder of snapshots")
    cb.add_argument("--out", metavar="DIR", required=True,
                    help=OUT_HELP + "twin.yaml; with --report also validation.parquet, "
                         "overlay.parquet, twin_overlay.png, calibration.json, flags.csv")
    cb.add_argument("--nodes", type=_node_list, default=None,
                    help="only these scrape targets, e.g. 0,2 (default: all)")
    cb.add_argument("--report", nargs="?", const=True, default=False, metavar="DIR",
                    help="also validate the twin against the recording and write the "
                         "report into --out (default: off; a DIR after it is the "
                         f"deprecated spelling, until relakit {OUT_FILE_UNTIL})")
    cb.add_argument("--replay-flags", nargs="?", const=True, default=False,
                    metavar="DECISIONS",
                    help="replay the recorded flags into the twin: from the trace's flag "
                         "gauges, or from a decisions.parquet given here (default: off)")
    cb.add_argument("--bin", type=_positive, default=None,
                    help="arrival curve bin, seconds (default: 10 s, or a thirtieth of a "
                         "short recording, at least one scrape)")
    cb.add_argument("--window", type=_positive, default=None,
                    help="validation window, seconds (default: five scrape intervals)")
    cb.add_argument("--replications", type=_workers, default=3,
                    help="twin runs in the validation")
    cb.add_argument("--seed", type=_seed, default=1, help="seed of the twin and its runs")
    cb.set_defaults(func=_calibrate)
    return parser


def _main(argv=None) -> int:
    from relakit.checks import CheckError

    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, or a bad argument (reported in one line)
        return exc.code if isinstance(exc.code, int) else 2
    try:
        return args.func(args)
    except CheckError as exc:
        for f in exc.findings:
            print(f.line(), file=sys.stderr)
        return 2
    except (ScenarioError, ValueError, OSError) as exc:
        print(f"relakit: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("relakit: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a bug, not an input mistake: still one line, no traceback
        if os.environ.get("RELAKIT_DEBUG"):
            raise
        print(f"relakit: internal error: {type(exc).__name__}: {_one_line(exc)} (a bug in "
              "relakit; RELAKIT_DEBUG=1 shows the traceback)", file=sys.stderr)
        return 3


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.filename is not None:
        return f"{exc.filename}: {exc.strerror or exc}"
    return " ".join(str(exc).split("\n")).strip() or type(exc).__name__


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
