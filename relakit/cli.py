"""``relakit`` on the command line. Nothing imports this module.

Bad input ends with a one-paragraph message and exit status 2, never a
traceback: the message names the file, the key and what is allowed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from relakit.scenario import ScenarioError, load_scenario


def _simulate(args) -> int:
    from relakit.experiment import simulate

    sc = load_scenario(args.scenario)
    if args.figure:  # check before anything runs, so a bad --figure writes no tables
        if args.no_requests:
            raise ScenarioError("--figure needs per-request records; drop --no-requests")
        if Path(args.figure).suffix.lower() not in (".png", ".svg", ".pdf"):
            raise ScenarioError(f"{args.figure}: unsupported figure type "
                                f"{Path(args.figure).suffix!r}; use .png, .svg or .pdf")
    result = simulate(sc, seed=args.seed, record_requests=not args.no_requests)
    out = Path(args.out or Path("out") / sc.name)
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
    result = replay(args.trace, args.policy, load_clocks(args.clocks), start_s=args.start,
                    end_s=args.end, chain=args.chain)
    out = Path(args.out)
    print(result.format_audit())
    print(f"time in each mode (s): {result.time_in_mode()}")
    for name, table in (("decisions", result.decisions), ("timeline", result.timeline)):
        print(f"wrote {write_parquet(table, out / f'{name}.parquet')}")
    return 0


def _sweep(args) -> int:
    from relakit.sweep import load_sweep, manifests, run_sweep

    spec = load_sweep(args.sweep)
    out = Path(args.out or Path("out") / "sweeps" / spec.name)
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
    return 0 if failed.height == 0 else 1


def _figures(args) -> int:
    """The standard views of a run folder (what `relakit simulate` wrote), offline.

    Formats are checked, and every figure rendered, before the first file is written.
    """
    from relakit import plots
    from relakit.sim.results import SimulationResult

    formats = plots.check_formats(args.formats.split(","))
    run = Path(args.run)
    if not run.is_dir():
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
    out = Path(args.out)
    from relakit.io import atomic_write

    for (name, f), blob in blobs.items():
        def write(tmp, blob=blob):
            Path(tmp).write_bytes(blob)

        print(f"wrote {atomic_write(out / f'{run.name}-{name}.{f}', write)}")
    return 0


def _ok_after_warmup(result):
    """Successful requests after the run's warm-up (the ones latency is reported for)."""
    import polars as pl

    return (pl.col("outcome") == "ok") & (pl.col("arrival_s") >= result.info.get("warmup_s", 0))


def _lab(args) -> int:
    """`relakit lab up|load|record|down`: the live system on 127.0.0.1."""
    import signal
    import time

    from relakit.lab import Agent, Lab, LabSpec, run_load, stop_lab

    work = Path(args.dir)
    if args.action == "up":
        work.mkdir(parents=True, exist_ok=True)
        clocks = {"scrape_s": args.scrape_s, "window_s": args.window_s, "eval_s": args.eval_s,
                  "poll_s": args.poll_s}
        with Lab(LabSpec(instances=args.instances, clocks=clocks), workdir=str(work)) as lab:
            lab.save_state()
            agent = Agent(lab, args.policy)
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
        # the owner first (it stops its children and writes its audit), then any
        # recorded child left behind by an owner that was killed; a pid whose start
        # time or command line no longer matches its record is someone else's
        result = stop_lab(work)
        for r in result["stopped"]:
            print(f"stopped {r.get('name', 'lab up')} (pid {r['pid']})")
        for r in result["left_alone"]:
            print(f"left pid {r['pid']} alone: it is no longer the lab's "
                  f"{r.get('name', 'lab up')} (another start time or command line)")
        if result["remaining"]:  # cannot happen short of a process ignoring SIGKILL
            print(f"still running: {', '.join(str(r['pid']) for r in result['remaining'])}; "
                  f"kept {work / 'state.json'}")
            return 1
        if not result["stopped"]:
            print("no process of the lab was running")
        print(f"lab down: none of its {result['recorded']} recorded processes is running; "
              f"removed {work / 'state.json'}")
        return 0
    lab = Lab.attach(work)
    if args.action == "load":
        phases = []
        for part in args.phases.split(","):
            seconds, rate = part.split(":")
            phases.append((float(seconds), float(rate)))
        recs = run_load(lab, phases)
        import polars as pl

        from relakit.io import write_parquet

        table = pl.DataFrame(recs)
        print(table.group_by("tier", "outcome").len().sort("tier", "outcome"))
        print(f"wrote {write_parquet(table, work / 'requests.parquet')}")
        return 0
    path = lab.record(args.out, time.time() - args.since)
    print(f"wrote {path}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="relakit", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("simulate", help="run a scenario end to end and write its tables")
    p.add_argument("scenario", help="scenario YAML file")
    p.add_argument("--seed", type=int, default=None, help="override the scenario's seed")
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
    r.add_argument("--start", type=float, default=None, help="first evaluation (s)")
    r.add_argument("--end", type=float, default=None, help="last evaluation (s)")
    r.set_defaults(func=_replay)
    w = sub.add_parser("sweep", help="run a grid of scenario or notebook points")
    w.add_argument("sweep", help="sweep YAML")
    w.add_argument("--out", default=None, help="output folder (default: out/sweeps/<name>)")
    w.add_argument("--scheduler", default=None, help="Dask scheduler address (default: local)")
    w.add_argument("--workers", type=int, default=None, help="local processes (default: cores)")
    w.set_defaults(func=_sweep)
    f = sub.add_parser("figures", help="export a run folder's standard views (PNG, SVG, PDF)")
    f.add_argument("run", help="a folder written by `relakit simulate`")
    f.add_argument("--out", default="figures", help="output folder (default: figures)")
    f.add_argument("--formats", default="png,svg,pdf", help="comma-separated: png,svg,pdf")
    f.set_defaults(func=_figures)
    lb = sub.add_parser("lab", help="the live RelA lab on 127.0.0.1: up, load, record, down")
    lb.add_argument("action", choices=("up", "load", "record", "down"))
    lb.add_argument("--dir", default="out/lab", help="the lab's working folder")
    lb.add_argument("--instances", type=int, default=3)
    lb.add_argument("--policy", default="params/policies/rela.yaml")
    lb.add_argument("--scrape-s", type=float, default=1.0)
    lb.add_argument("--window-s", type=float, default=5.0)
    lb.add_argument("--eval-s", type=float, default=1.0)
    lb.add_argument("--poll-s", type=float, default=1.0)
    lb.add_argument("--phases", default="10:50,20:200,10:50",
                    help="load: seconds:rate pairs, e.g. 10:50,20:200")
    lb.add_argument("--since", type=float, default=120.0, help="record: seconds back")
    lb.add_argument("--out", default="out/lab/recorded.json", help="record: output file")
    lb.set_defaults(func=_lab)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (ScenarioError, ValueError, OSError) as exc:
        print(f"relakit: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
