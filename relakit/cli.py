"""``relakit`` on the command line. Nothing imports this module.

Bad input ends with a one-paragraph message and exit status 2, never a
traceback: the message names the file, the key and what is allowed.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import warnings
from pathlib import Path

from relakit.scenario import ScenarioError, load_scenario
from relakit.validate import SEED_MAX

MAX_WORKERS = 1024
MAX_LAB_RATE_RPS = 10_000.0  # the lab's load generator keeps at most 400 connections
MAX_LAB_PHASE_S = 86_400.0


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


def _positive(text: str) -> float:
    return _number(text, lo=0, lo_open=True)


def _time(text: str) -> float:
    return _number(text)


def _instances(text: str) -> int:
    return _number(text, lo=1, hi=64, integer=True)


def _phases(text: str) -> list[tuple[float, float]]:
    """``seconds:rate`` pairs, comma-separated: 10:50,20:200 (seconds > 0, rate >= 0)."""
    phases = []
    for i, part in enumerate(text.split(",")):
        fields = part.strip().split(":")
        if len(fields) != 2:
            raise argparse.ArgumentTypeError(
                f"phase {i + 1} {part!r}: expected seconds:rate, e.g. 10:50,20:200")
        try:
            seconds = _number(fields[0], lo=0, lo_open=True, hi=MAX_LAB_PHASE_S)
            rate = _number(fields[1], lo=0, hi=MAX_LAB_RATE_RPS)
        except argparse.ArgumentTypeError as exc:
            raise argparse.ArgumentTypeError(f"phase {i + 1} {part!r}: {exc}") from None
        phases.append((seconds, rate))
    if not any(rate > 0 for _, rate in phases):
        raise argparse.ArgumentTypeError("every phase has rate 0: nothing would be sent")
    return phases


def _formats(text: str) -> tuple[str, ...]:
    chosen = tuple(f.strip().lower() for f in text.split(","))
    bad = [f for f in chosen if f not in ("png", "svg", "pdf")]
    if bad or not chosen:
        raise argparse.ArgumentTypeError(f"{bad[0] if bad else text!r} is not one of png, svg, "
                                         "pdf")
    return chosen


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


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors as one line in relakit's form (no usage dump)."""

    def error(self, message):
        self.exit(2, f"relakit: error: {self.prog}: {message} (see {self.prog} --help)\n")


def _simulate(args) -> int:
    from relakit.experiment import simulate

    sc = load_scenario(args.scenario)
    if args.figure:  # check before anything runs, so a bad --figure writes no tables
        if args.no_requests:
            raise ScenarioError("--figure needs per-request records; drop --no-requests")
        if Path(args.figure).suffix.lower() not in (".png", ".svg", ".pdf"):
            raise ScenarioError(f"--figure {args.figure}: unsupported figure type "
                                f"{Path(args.figure).suffix!r}; use .png, .svg or .pdf")
    out = _writable_dir(args.out or Path("out") / sc.name)
    result = simulate(sc, seed=args.seed, record_requests=not args.no_requests)
    written = result.write(out)
    print(result.format_summary())
    if result.decisions is not None:
        from relakit.control import format_audit

        print("\naudit (changes):")
        print(format_audit(result.decisions))
        if "control" in result.info:
            print(f"time in each mode (s): {result.info['control']['time_in_mode_s']}")
        if "chain" in result.info:
            print(f"chain actions: {result.info['chain']['actions']}")
    for p in written:
        print(f"wrote {p}")
    if args.figure:
        print(f"wrote {_figure(sc, result, args.figure)}")
    return 0


def _figure(sc, result, path) -> Path:
    """Response-time exceedance; beside Erlang C when the scenario is an M/M/c node."""
    from relakit import plots

    if result.requests is None:
        raise ScenarioError("--figure needs per-request records; drop --no-requests")
    ok = result.requests.filter(
        (result.requests["outcome"] == "ok") & (result.requests["arrival_s"] >= sc.warmup_s))
    curves = {"simulation": plots.latency_ccdf_frame(ok["latency_ms"].to_numpy())}
    fl = sc.fleet
    if fl.nodes == 1 and fl.service.kind == "exponential" and sc.workload.arrival.constant:
        import numpy as np
        import polars as pl

        from relakit.analytic import mmc

        m = mmc(sc.workload.arrival.rates_rps[0], 1000.0 / fl.service.mean_ms, fl.servers[0])
        xs = curves["simulation"]["latency_ms"].to_numpy()
        sf = np.array([1.0 - m.response_cdf(x / 1000.0) for x in xs])
        curves[f"Erlang C (M/M/{fl.servers[0]})"] = pl.DataFrame(
            {"latency_ms": xs, "exceedance": sf})
    chart = plots.latency_ccdf(curves, title=f"{sc.name}: response time, simulation vs closed form")
    return plots.save(chart, path)


def _replay(args) -> int:
    from relakit.control import load_clocks, replay
    from relakit.io import write_parquet

    if args.policy is None and args.chain is None:
        raise ValueError("give --policy, --chain, or both")
    if args.start is not None and args.end is not None and args.start > args.end:
        raise ScenarioError(f"--start {args.start:g} is after --end {args.end:g}: the first "
                            "evaluation must come before the last")
    out = _writable_dir(args.out)
    result = replay(args.trace, args.policy, load_clocks(args.clocks), start_s=args.start,
                    end_s=args.end, chain=args.chain)
    print(result.format_audit())
    print(f"time in each mode (s): {result.time_in_mode()}")
    for name, table in (("decisions", result.decisions), ("timeline", result.timeline)):
        print(f"wrote {write_parquet(table, out / f'{name}.parquet')}")
    return 0


def _sweep(args) -> int:
    from relakit.sweep import load_sweep, manifests, run_sweep

    spec = load_sweep(args.sweep)
    out = _writable_dir(args.out or Path("out") / "sweeps" / spec.name)
    table = run_sweep(spec, out, scheduler=args.scheduler, workers=args.workers)
    m = manifests(out)
    failed = m.filter(m["status"] != "ok") if m.height else m
    print(f"{m.height} points, {failed.height} failed; results: {out / 'results.parquet'} "
          f"({table.height} rows)")
    for row in failed.iter_rows(named=True):
        print(f"  failed {row['point_id']}: {row['error']}")
    return 0 if failed.height == 0 else 1


def _figures(args) -> int:
    """The standard views of a run folder (what `relakit simulate` wrote), offline."""
    import polars as pl

    from relakit import plots
    from relakit.sim.results import SimulationResult

    run = Path(args.run)
    out = _writable_dir(args.out)
    req = run / "requests.parquet"
    if not req.is_file():
        raise ScenarioError(f"{run}: no requests.parquet here; run `relakit simulate` without "
                            "--no-requests first")
    decisions = run / "decisions.parquet"
    result = SimulationResult(requests=pl.read_parquet(req), metrics=pl.DataFrame(),
                              summary=pl.DataFrame(),
                              decisions=pl.read_parquet(decisions) if decisions.is_file()
                              else None)
    written = plots.export(plots.run_dashboard(result), out / f"{run.name}-dashboard",
                           formats=args.formats)
    for p in written:
        print(f"wrote {p}")
    return 0


def _lab(args) -> int:
    """`relakit lab up|load|record|down`: the live system on 127.0.0.1."""
    import json
    import os
    import signal
    import time

    from relakit.lab import Agent, Lab, LabSpec, run_load

    work = Path(args.dir)
    if args.action == "up":
        from relakit.checks import check_lab, enforce
        from relakit.control import load_clocks, load_policy

        _writable_dir(work, "--dir")
        clocks = {"scrape_s": args.scrape_s, "window_s": args.window_s, "eval_s": args.eval_s,
                  "poll_s": args.poll_s}
        policy = load_policy(args.policy)
        enforce(check_lab(policy, load_clocks({}, **clocks)))
        work.mkdir(parents=True, exist_ok=True)
        with Lab(LabSpec(instances=args.instances, clocks=clocks), workdir=str(work)) as lab:
            lab.save_state()
            agent = Agent(lab, policy)
            agent.start()
            print(f"lab up: config {lab.config_url}, prometheus {lab.prom_url}, instances "
                  f"{', '.join(lab.instance_urls)}; Ctrl-C or `relakit lab down --dir {work}`")
            stop = []
            signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
            try:
                while not stop:
                    time.sleep(0.5)
            except KeyboardInterrupt:
                pass
            agent.stop()
            from relakit.io import write_parquet

            write_parquet(agent.controller.decisions(), work / "decisions.parquet")
        print(f"lab down; audit in {work / 'decisions.parquet'}")
        return 0
    if not (work / "state.json").is_file():
        raise ScenarioError(f"{work}: no running lab here (no state.json); "
                            f"start one with `relakit lab up --dir {work}`")
    if args.action == "down":
        pid = json.loads((work / "state.json").read_text())["owner_pid"]
        try:
            os.kill(pid, signal.SIGTERM)
            print(f"asked the lab (pid {pid}) to stop")
        except ProcessLookupError:
            print("the lab was not running")
        return 0
    lab = Lab.attach(work)
    if args.action == "load":
        recs = run_load(lab, args.phases)
        import polars as pl

        from relakit.io import write_parquet

        table = pl.DataFrame(recs)
        print(table.group_by("tier", "outcome").len().sort("tier", "outcome"))
        print(f"wrote {write_parquet(table, work / 'requests.parquet')}")
        return 0
    _writable_dir(Path(args.out).parent)
    path = lab.record(args.out, time.time() - args.since)
    print(f"wrote {path}")
    return 0


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


def _show_warning(message, category, filename, lineno, file=None, line=None):
    """Warnings as one line each: ``relakit: warning: FILE: key 'K': what and why``."""
    from relakit.checks import RelakitWarning

    if issubclass(category, RelakitWarning):
        text = f"relakit: warning: {message}"
    else:
        text = f"relakit: warning: {category.__name__}: {message}"
    print(text.replace("\n", " "), file=sys.stderr)


def main(argv=None) -> int:
    with warnings.catch_warnings():
        from relakit.checks import RelakitWarning

        warnings.simplefilter("always", RelakitWarning)
        warnings.showwarning = _show_warning
        return _main(argv)


def _main(argv=None) -> int:
    from relakit.checks import CheckError

    parser = _Parser(prog="relakit", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("simulate", help="run a scenario end to end and write its tables")
    p.add_argument("scenario", help="scenario YAML file")
    p.add_argument("--seed", type=_seed, default=None,
                   help="override the scenario's seed (0 to 2**64 - 1)")
    p.add_argument("--out", default=None, help="output folder (default: out/<scenario name>)")
    p.add_argument("--no-requests", action="store_true",
                   help="keep no per-request records (memory stays flat)")
    p.add_argument("--figure", default=None, help="also write a latency figure (.png/.svg/.pdf)")
    p.set_defaults(func=_simulate)
    r = sub.add_parser("replay", help="run a policy open loop over a recorded metric trace")
    r.add_argument("trace", help="trace: Prometheus range-query JSON, long CSV, parquet, "
                                 "or a folder of text-exposition snapshots")
    r.add_argument("--policy", default=None, help="policy YAML")
    r.add_argument("--chain", default=None, help="containment chain YAML")
    r.add_argument("--clocks", default=None, help="clocks YAML (default: RelA's)")
    r.add_argument("--out", required=True, help="output folder")
    r.add_argument("--start", type=_time, default=None, help="first evaluation (s)")
    r.add_argument("--end", type=_time, default=None, help="last evaluation (s)")
    r.set_defaults(func=_replay)
    w = sub.add_parser("sweep", help="run a grid of scenario or notebook points")
    w.add_argument("sweep", help="sweep YAML")
    w.add_argument("--out", default=None, help="output folder (default: out/sweeps/<name>)")
    w.add_argument("--scheduler", default=None, help="Dask scheduler address (default: local)")
    w.add_argument("--workers", type=_workers, default=None,
                   help="local processes, 1 or more (default: cores)")
    w.set_defaults(func=_sweep)
    f = sub.add_parser("figures", help="export a run folder's standard views (PNG, SVG, PDF)")
    f.add_argument("run", help="a folder written by `relakit simulate`")
    f.add_argument("--out", default="figures", help="output folder (default: figures)")
    f.add_argument("--formats", type=_formats, default=("png", "svg", "pdf"),
                   help="comma-separated: png,svg,pdf")
    f.set_defaults(func=_figures)
    lb = sub.add_parser("lab", help="the live RelA lab on 127.0.0.1: up, load, record, down")
    lb.add_argument("action", choices=("up", "load", "record", "down"))
    lb.add_argument("--dir", default="out/lab", help="the lab's working folder")
    lb.add_argument("--instances", type=_instances, default=3)
    lb.add_argument("--policy", default="params/policies/rela.yaml")
    lb.add_argument("--scrape-s", type=_positive, default=1.0)
    lb.add_argument("--window-s", type=_positive, default=5.0)
    lb.add_argument("--eval-s", type=_positive, default=1.0)
    lb.add_argument("--poll-s", type=_positive, default=1.0)
    lb.add_argument("--phases", type=_phases, default=_phases("10:50,20:200,10:50"),
                    help="load: seconds:rate pairs, e.g. 10:50,20:200")
    lb.add_argument("--since", type=_positive, default=120.0, help="record: seconds back")
    lb.add_argument("--out", default="out/lab/recorded.json", help="record: output file")
    lb.set_defaults(func=_lab)
    c = sub.add_parser("check", help="check input files without running anything "
                                     "(exit 0 clean, 1 warnings, 2 errors)")
    c.add_argument("files", nargs="+", help="scenario, policy, chain, clocks, sweep or trace "
                                            "files; files given together are checked against "
                                            "each other (a policy against a trace)")
    c.set_defaults(func=_check)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, or a bad argument (already reported in one line)
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
