"""Rule backtests: ``relakit replay TRACE --rules RULES`` next to a real Prometheus.

Run with ``python benchmarks/bench_rules.py [--sizes 4,16] [--no-prometheus]``. Builds
(once, cached under ``out/bench_rules/``) a day of real-looking scrapes at 15 s
(:mod:`rules_workload`: 4 nodes -> 1,519 series, 8.7 M samples; 16 nodes -> 34.9 M)
and 300 real-looking rules, then times the command a user runs, as a child process
under ``/usr/bin/time``: wall, CPU (user + system: the machine is shared, wall time
alone says little) and peak resident memory.

Prometheus answers the same rules over the same samples: the samples are ingested
once with ``promtool tsdb create-blocks-from openmetrics``, and the recording rules'
series once more the same way from the server's own answers (set-up, cached, not
timed, as the Parquet file relakit reads is not built in its timing). Timed: a server on
127.0.0.1 answering each of the 300 expressions as one range query over the day at
the group interval (60 s) -- wall time, the server's CPU time and peak RSS (VmHWM).
The comparison favours Prometheus a little: its answers for recording rules are
not written back, and the alerts' ``for:``/episode bookkeeping is not done (relakit
does both). A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import rules_workload as W  # noqa: E402

OUT = ROOT / "out" / "bench_rules"


def _timed(cmd: list[str], **kw) -> dict:
    """Wall, CPU and peak RSS of a child process (GNU time)."""
    fmt = "%e %U %S %M"
    res = subprocess.run(["/usr/bin/time", "-f", fmt, *cmd], capture_output=True, text=True,
                         **kw)
    if res.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{res.stderr[-3000:]}")
    wall, user, sys_, rss = res.stderr.strip().splitlines()[-1].split()
    return {"wall_s": float(wall), "cpu_s": float(user) + float(sys_),
            "peak_rss_mb": int(rss) / 1024, "stdout": res.stdout}


def workload(nodes: int) -> tuple[Path, Path]:
    OUT.mkdir(parents=True, exist_ok=True)
    trace, rules = OUT / f"trace{nodes}.parquet", OUT / "rules.yml"
    if not rules.exists():
        rules.write_text(W.make_rules()[0])
    if not trace.exists():
        W.make_trace(nodes).write_parquet(trace)
    return trace, rules


def relakit_run(trace: Path, rules: Path) -> dict:
    env = dict(os.environ, NUMBA_CACHE_DIR=str(ROOT / ".numba_cache"))
    out = OUT / f"replay-{trace.stem}"
    r = _timed([sys.executable, "-m", "relakit", "replay", str(trace), "--rules", str(rules),
                "--out", str(out)], env=env)
    import polars as pl

    alerts = pl.read_parquet(out / "alerts.parquet")
    r["alert_rows"] = alerts.height
    r["firing_episodes"] = alerts.filter(pl.col("firing_at").is_not_null()).height
    del r["stdout"]
    return r


# -- Prometheus ------------------------------------------------------------------------------
def _blocks(nodes: int, trace: Path) -> Path:
    """The trace as Prometheus blocks (ingested once; not timed)."""
    data = OUT / f"prom{nodes}" / "data"
    if (data / ".complete").exists():
        return data
    import polars as pl

    om = OUT / f"trace{nodes}.om"
    lines = W.openmetrics_lines(pl.read_parquet(trace))
    with open(om, "w") as fh:
        lines.write_csv(fh, include_header=False, quote_style="never")
        fh.write("# EOF\n")
    shutil.rmtree(data, ignore_errors=True)
    data.mkdir(parents=True)
    t0 = time.perf_counter()
    subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics",
                    "--max-block-duration=24h", str(om), str(data)], check=True,
                   capture_output=True)
    print(f"  ingested {om.stat().st_size / 1e9:.2f} GB of OpenMetrics into blocks in "
          f"{time.perf_counter() - t0:.0f} s (not part of the timing)")
    om.unlink()
    (data / ".complete").touch()
    return data


class Server:
    """A Prometheus on 127.0.0.1 over a data folder, with no scrape targets."""

    def __init__(self, data: Path):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        cfg = data.parent / "prometheus.yml"
        cfg.write_text("global:\n  scrape_interval: 15s\n")
        self.proc = subprocess.Popen(
            ["prometheus", f"--config.file={cfg}", f"--storage.tsdb.path={data}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=100y",
             "--query.max-samples=200000000"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.url = f"http://127.0.0.1:{self.port}"
        for _ in range(600):
            try:
                urllib.request.urlopen(self.url + "/-/ready", timeout=1)
                break
            except OSError:
                time.sleep(0.5)
        else:
            raise SystemExit("prometheus did not become ready")
        self.cpu0 = self.cpu()

    def cpu(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def peak_rss_mb(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def query_range(self, expr: str, start: float, end: float, step: float,
                    values: bool = False):
        """A range query at the multiples of ``step`` in [start, end] (as a rule group
        evaluates): the number of series answered, or with ``values`` the answer."""
        first = -(-start // step) * step
        q = urllib.parse.urlencode({"query": expr, "start": first, "end": end, "step": step})
        with urllib.request.urlopen(f"{self.url}/api/v1/query_range?{q}", timeout=600) as r:
            body = json.load(r)
        if body["status"] != "success":
            raise SystemExit(f"prometheus refused {expr!r}: {body}")
        return body["data"]["result"] if values else len(body["data"]["result"])

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=60)


def _recorded_blocks(nodes: int, data: Path, rules: Path, lo: float, hi: float) -> dict:
    """The recording rules' series over the day, so that alerts reading them can be
    queried: each recording expression as a range query at the group interval (60 s),
    its answer written as OpenMetrics and ingested as one more block. (``promtool tsdb
    create-blocks-from rules`` does the same but writes a block per rule and per two
    hours, hundreds of small blocks that would slow every later query.) Done once;
    its cost is printed, not timed (the timed run queries these expressions again)."""
    import yaml

    mark = data / ".recorded"
    if mark.exists():
        return json.loads(mark.read_text())
    rec = [r for g in yaml.safe_load(rules.read_text())["groups"] for r in g["rules"]
           if "record" in r]
    om = data.parent / "recorded.om"
    srv = Server(data)
    t0 = time.perf_counter()
    with open(om, "w") as fh:
        for r in rec:
            for res in srv.query_range(r["expr"], lo, hi, 60.0, values=True):
                labels = {k: v for k, v in res["metric"].items() if k != "__name__"}
                text = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
                fh.writelines(f"{r['record']}{{{text}}} {v} {t:.0f}\n"
                              for t, v in res["values"])
        fh.write("# EOF\n")
    cost = {"recording_queries_wall_s": time.perf_counter() - t0}
    srv.stop()
    subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics",
                    "--max-block-duration=24h", str(om), str(data)], check=True,
                   capture_output=True)
    om.unlink()
    mark.write_text(json.dumps(cost))
    return cost


def prometheus_run(nodes: int, trace: Path, rules: Path) -> dict:
    """Every rule's expression as one range query over the day at the group interval
    (60 s), against a server holding the samples and the recorded series."""
    import polars as pl
    import yaml

    data = _blocks(nodes, trace)
    lo, hi = pl.scan_parquet(trace).select(pl.col("time_s").min().alias("lo"),
                                           pl.col("time_s").max().alias("hi")).collect().row(0)
    cost = _recorded_blocks(nodes, data, rules, lo, hi)
    exprs = [r["expr"] for g in yaml.safe_load(rules.read_text())["groups"] for r in g["rules"]]
    srv = Server(data)
    t0 = time.perf_counter()
    series = sum(srv.query_range(e, lo, hi, 60.0) for e in exprs)
    wall = time.perf_counter() - t0
    cpu = srv.cpu() - srv.cpu0
    rss = srv.peak_rss_mb()
    srv.stop()
    return {"wall_s": wall, "cpu_s": cpu, "peak_rss_mb": rss, "result_series": series,
            "queries": len(exprs), **cost}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="4,16", help="node counts (default 4,16)")
    ap.add_argument("--no-prometheus", action="store_true", help="relakit only")
    ap.add_argument("--prometheus-sizes", default="4",
                    help="node counts Prometheus answers too (default 4: ingesting 16 "
                         "nodes' 4 GB of OpenMetrics takes many minutes)")
    args = ap.parse_args()
    prom_sizes = set() if args.no_prometheus else {
        int(x) for x in args.prometheus_sizes.split(",")}
    for nodes in (int(x) for x in args.sizes.split(",")):
        trace, rules = workload(nodes)
        import polars as pl

        shape = pl.scan_parquet(trace).select(
            pl.len().alias("samples"),
            pl.struct("node", "name", "tier", "outcome", "le", "labels").n_unique()
            .alias("series")).collect().row(0, named=True)
        print(f"{nodes} nodes: {shape['series']:,} series, {shape['samples']:,} samples, "
              "300 rules")
        res = {"relakit": relakit_run(trace, rules)}
        if nodes in prom_sizes:
            res["prometheus"] = prometheus_run(nodes, trace, rules)
        for who, r in res.items():
            extra = {k: v for k, v in r.items() if k not in ("wall_s", "cpu_s", "peak_rss_mb")}
            print(f"  {who:10s} wall {r['wall_s']:6.2f} s  cpu {r['cpu_s']:6.2f} s  "
                  f"peak RSS {r['peak_rss_mb']:7.0f} MB  {extra}")


if __name__ == "__main__":
    main()
