"""A day of real-looking scrapes and 300 real-looking rules, for the rules benchmark.

Why generated, not recorded: the benchmark must run offline, at two sizes, and be
answered by a real Prometheus over the very same samples. The series are the kinds a
service fleet exposes (HTTP counters and latency histograms by job/method/handler/code,
node_exporter CPU, memory, filesystem and disk, process and Go runtime metrics, gRPC,
relakit's own tier/outcome series, a blackbox probe); the day has a diurnal load, an
error incident, a latency incident, a node that is down for ten minutes (its series
vanish, ``up`` reads 0 from the prober's side) and a restart that resets counters.
The rules are the kinds real rule files contain: rate/increase over counters,
histogram_quantile, error ratios, ``and``/``or``/``unless``, ``on``/``ignoring``
with ``group_left``, ``absent``, ``by``/``without`` aggregations, ``for:``.
"""

from __future__ import annotations

import numpy as np
import polars as pl

T0 = 1_699_920_000.0  # a midnight (UTC): Prometheus' blocks start at whole hours
STEP_S = 15.0
LES = ("0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1", "2.5", "+Inf")
JOBS_HTTP = {"api": ("/v1/orders", "/v1/users", "/v1/search"),
             "web": ("/", "/login", "/static")}
TIERS = ("gold", "silver", "bronze")


def _series(nodes: int) -> list[dict]:
    """Every series: name, node, tier/outcome/le columns, other labels, and its kind."""
    out = []

    def add(name, node, kind, tier=None, outcome=None, le=None, **labels):
        out.append(dict(name=name, node=node, kind=kind, tier=tier, outcome=outcome, le=le,
                        labels=labels))

    for n in range(nodes):
        for job, handlers in JOBS_HTTP.items():
            for method in ("GET", "POST"):
                for h in handlers:
                    for code in ("200", "404", "500", "503"):
                        add("http_requests_total", n, f"http:{code}", job=job, method=method,
                            handler=h, code=code)
                    for le in LES:
                        add("http_request_duration_seconds_bucket", n, f"bucket:{le}", le=le,
                            job=job, method=method, handler=h)
                    add("http_request_duration_seconds_sum", n, "hsum", job=job,
                        method=method, handler=h)
                    add("http_request_duration_seconds_count", n, "hcount", job=job,
                        method=method, handler=h)
            for h in handlers:
                add("http_requests_in_flight", n, "gauge:20", job=job, handler=h)
        for tier in TIERS:
            for outcome in ("ok", "error", "timeout"):
                add("requests_total", n, f"tier:{outcome}", tier=tier, outcome=outcome)
            for le in LES:
                add("latency_seconds_bucket", n, f"bucket:{le}", tier=tier, le=le)
            add("latency_seconds_count", n, "hcount", tier=tier)
            add("queue_depth", n, "gauge:5", tier=tier)
        add("in_flight", n, "gauge:40")
        for cpu in range(4):
            for mode in ("idle", "user", "system", "iowait", "irq", "softirq", "nice", "steal"):
                add("node_cpu_seconds_total", n, f"cpu:{mode}", job="node", cpu=str(cpu),
                    mode=mode)
        add("node_memory_MemAvailable_bytes", n, "mem", job="node")
        add("node_memory_MemTotal_bytes", n, "const:16e9", job="node")
        for w in ("1", "5", "15"):
            add(f"node_load{w}", n, "gauge:2", job="node")
        for mp, dev in (("/", "vda1"), ("/var", "vdb1"), ("/data", "vdc1")):
            add("node_filesystem_avail_bytes", n, "disk", job="node", mountpoint=mp,
                device=dev, fstype="ext4")
            add("node_filesystem_size_bytes", n, "const:1e11", job="node", mountpoint=mp,
                device=dev, fstype="ext4")
        for dev in ("vda", "vdb", "vdc"):
            add("node_disk_io_time_seconds_total", n, "counter:0.2", job="node", device=dev)
            add("node_disk_read_bytes_total", n, "counter:4e5", job="node", device=dev)
            add("node_disk_written_bytes_total", n, "counter:9e5", job="node", device=dev)
        for dev in ("eth0", "eth1"):
            add("node_network_receive_bytes_total", n, "counter:2e6", job="node", device=dev)
            add("node_network_transmit_bytes_total", n, "counter:1e6", job="node", device=dev)
            add("node_network_receive_errs_total", n, "counter:0.01", job="node", device=dev)
        add("node_uname_info", n, "const:1", job="node", nodename=f"host-{n:02d}",
            release="6.1.0-13-amd64")
        for job in ("api", "web", "node"):
            add("up", n, "up", job=job)
            add("process_cpu_seconds_total", n, "counter:0.3", job=job)
            add("process_resident_memory_bytes", n, "gauge:3e8", job=job)
            add("process_open_fds", n, "gauge:200", job=job)
            add("process_max_fds", n, "const:1024", job=job)
            add("process_start_time_seconds", n, "start", job=job)
            add("go_goroutines", n, "gauge:300", job=job)
            for q in ("0", "0.25", "0.5", "0.75", "1"):
                add("go_gc_duration_seconds", n, f"gc:{q}", job=job, quantile=q)
        for svc in ("orders.Orders", "users.Users"):
            for m in ("Get", "List", "Create"):
                for code in ("OK", "NotFound", "Unavailable", "Internal"):
                    add("grpc_server_handled_total", n, f"grpc:{code}", job="api",
                        grpc_service=svc, grpc_method=m, grpc_code=code)
        for ns, pod in (("shop", "orders-0"), ("shop", "users-0"), ("infra", "ingress-0"),
                        ("infra", "dns-0")):
            for c in ("main", "sidecar"):
                add("kube_pod_container_status_restarts_total", n, "restarts", namespace=ns,
                    pod=f"{pod}-{n}", container=c)
        for cache in ("sessions", "catalog", "pricing", "tokens"):
            add("cache_hits_total", n, "counter:50", job="api", cache=cache)
            add("cache_misses_total", n, "counter:5", job="api", cache=cache)
    for target in ("https://shop.example", "https://api.example", "https://status.example"):
        add("probe_success", -1, "probe", job="blackbox", target=target)
    return out


def _lognorm_cdf(x, mu, sigma):
    from scipy.special import erf

    if not np.isfinite(x):
        return np.ones_like(mu)
    return 0.5 * (1.0 + erf((np.log(x) - mu) / (sigma * np.sqrt(2.0))))


def _values(s: dict, t: np.ndarray, rng: np.random.Generator, shape: dict) -> np.ndarray:
    """One series' values at the scrape times ``t`` (seconds from T0)."""
    kind, load, dt = s["kind"], shape["load"], STEP_S
    noise = rng.gamma(20.0, 1 / 20.0, t.size)
    head, _, arg = kind.partition(":")

    def counter(rate):
        inc = np.floor(rate * dt * load * noise * 100.0) / 100.0
        v = np.cumsum(inc)
        if s["node"] == 1:  # node 1 restarts at 13:00: its counters start again
            v = np.where(t >= 13 * 3600, v - v[t < 13 * 3600][-1], v)
        return np.round(v, 2)

    if head == "http":
        base = {"200": 6.0, "404": 0.3, "500": 0.02, "503": 0.01}[arg]
        if arg in ("500", "503"):
            base = base * np.where(shape["errors"], 60.0, 1.0)
        return counter(base)
    if head == "tier":
        base = {"ok": 30.0, "error": 0.1, "timeout": 0.05}[arg]
        if arg != "ok":
            base = base * np.where(shape["errors"], 40.0, 1.0)
        return counter(base)
    if head == "grpc":
        return counter({"OK": 3.0, "NotFound": 0.2, "Unavailable": 0.01, "Internal": 0.005}[arg])
    if head == "bucket":
        le = float(arg.replace("+Inf", "inf"))
        mu = np.log(0.08) + np.where(shape["slow"], 1.6, 0.0)
        frac = _lognorm_cdf(le, mu, 0.9)
        inc = np.floor(6.3 * dt * load * shape["hnoise"] * frac)
        return np.cumsum(inc)
    if head == "hcount":
        return np.cumsum(np.floor(6.3 * dt * load * shape["hnoise"]))
    if head == "hsum":
        mean = 0.08 * np.exp(0.405) * np.where(shape["slow"], np.exp(1.6), 1.0)
        return np.round(np.cumsum(np.floor(6.3 * dt * load * shape["hnoise"]) * mean), 3)
    if head == "counter":
        return counter(float(arg))
    if head == "cpu":
        share = {"idle": 0.55, "user": 0.25, "system": 0.1, "iowait": 0.04}.get(arg, 0.015)
        if arg == "idle":
            share = 1.0 - 0.45 * load / 1.6
        return counter(share)
    if head == "gauge":
        return np.round(float(arg) * load * noise, 3)
    if head == "const":
        return np.full(t.size, float(arg))
    if head == "mem":
        return np.round(16e9 * (0.6 - 0.3 * (load - 0.4)) * noise ** 0.1, 0)
    if head == "disk":
        return np.round(1e11 * (0.5 - 0.45 * t / 86400.0) - 1e6 * noise, 0)
    if head == "up":
        return np.ones(t.size)
    if head == "start":
        start = T0 - 86400 * 3 if s["node"] != 1 else T0 + 13 * 3600
        return np.where(t >= 13 * 3600, start, T0 - 86400 * 3)
    if head == "gc":
        return np.round(float(arg) * 0.002 * noise, 6)
    if head == "restarts":
        return np.floor(t / 21600.0) if s["labels"]["container"] == "sidecar" else \
            np.zeros(t.size)
    if head == "probe":
        return np.where(shape["errors"] & (t % 300 < 60), 0.0, 1.0)
    raise AssertionError(kind)


def make_trace(nodes: int = 4, hours: float = 24.0, seed: int = 1) -> pl.DataFrame:
    """The long trace (relakit's schema with the ``labels`` column), times from T0."""
    from relakit.traces import label_text

    rng = np.random.default_rng(seed)
    t = np.arange(0.0, hours * 3600.0, STEP_S)
    hour = t / 3600.0
    shape = {"load": 1.0 + 0.6 * np.sin(2 * np.pi * (hour - 9) / 24.0),
             "errors": (hour >= 6) & (hour < 6.5) | (hour >= 17.2) & (hour < 17.4),
             "slow": (hour >= 10) & (hour < 10.75),
             "hnoise": rng.gamma(20.0, 1 / 20.0, t.size)}
    down = (hour >= 15) & (hour < 15 + 10 / 60)  # node 2 unreachable for ten minutes
    parts = []
    for s in _series(nodes):
        v = _values(s, t, rng, shape)
        keep = ~down if s["node"] == 2 else np.ones(t.size, dtype=bool)
        if s["name"] == "up" and s["node"] == 2:
            keep, v = np.ones(t.size, dtype=bool), np.where(down, 0.0, v)  # the scraper's view
        parts.append((s, t[keep], v[keep]))
    n = sum(p[1].size for p in parts)
    cols = {"time_s": np.empty(n), "value": np.empty(n), "sid": np.empty(n, dtype=np.int32)}
    i = 0
    for k, (_, tt, vv) in enumerate(parts):
        cols["time_s"][i:i + tt.size] = T0 + tt
        cols["value"][i:i + tt.size] = vv
        cols["sid"][i:i + tt.size] = k
        i += tt.size
    meta = pl.DataFrame({
        "sid": np.arange(len(parts), dtype=np.int32),
        "node": [p[0]["node"] for p in parts],
        "name": [p[0]["name"] for p in parts],
        "tier": [p[0]["tier"] for p in parts],
        "outcome": [p[0]["outcome"] for p in parts],
        "le": [p[0]["le"] for p in parts],
        "labels": [label_text(p[0]["labels"]) for p in parts]},
        schema_overrides={"node": pl.Int32, "tier": pl.String, "outcome": pl.String,
                          "le": pl.String, "labels": pl.String})
    df = pl.DataFrame(cols).join(meta, on="sid", how="left")
    return df.select("time_s", "node", "name", "tier", "outcome", "le", "value",
                     pl.col("labels").cast(pl.Categorical)).sort("time_s", "node", "name",
                                                                 maintain_order=True)


def openmetrics_lines(df: pl.DataFrame) -> pl.DataFrame:
    """One OpenMetrics sample line per row (``name{labels} value seconds``), as
    ``promtool tsdb create-blocks-from openmetrics`` reads them; ``instance`` is the
    node number (``client`` for -1), as relakit labels a trace's series."""
    inst = pl.when(pl.col("node") >= 0).then(pl.col("node").cast(pl.String)) \
        .otherwise(pl.lit("client"))
    pairs = [pl.format('instance="{}"', inst)]
    for c in ("tier", "outcome", "le"):
        pairs.append(pl.when(pl.col(c).is_not_null()).then(pl.format(c + '="{}"', pl.col(c))))
    pairs.append(pl.col("labels").cast(pl.String))
    label_set = pl.concat_str(pairs, separator=",", ignore_nulls=True)
    return df.select(pl.format("{}{{{}}} {} {}", pl.col("name"), label_set, pl.col("value"),
                               pl.col("time_s").cast(pl.Int64)).alias("line"))


# -- rules ---------------------------------------------------------------------------------
def make_rules() -> tuple[str, list[tuple[str, str, str]]]:
    """(rule file YAML, [(kind, name, expression)]): 300 rules in three groups."""
    rec, alerts = [], []
    R = rec.append

    for job in JOBS_HTTP:
        for w in ("1m", "5m", "30m", "1h"):
            R((f"job:http_requests:rate{w}",
               f'sum by (job) (rate(http_requests_total{{job="{job}"}}[{w}]))'))
            R((f"job:http_errors:ratio_rate{w}",
               f'sum by (job) (rate(http_requests_total{{job="{job}",code=~"5.."}}[{w}])) / '
               f'sum by (job) (rate(http_requests_total{{job="{job}"}}[{w}]))'))
        for q in ("0.5", "0.9", "0.99"):
            for w in ("5m", "30m"):
                R((f"job:http_request_duration_seconds:p{q[2:] or '100'}_{w}",
                   f"histogram_quantile({q}, sum by (job, le) (rate("
                   f'http_request_duration_seconds_bucket{{job="{job}"}}[{w}])))'))
        for h in JOBS_HTTP[job]:
            R(("job_handler:http_requests:rate5m",
               f'sum by (job, handler) (rate(http_requests_total{{job="{job}",'
               f'handler="{h}"}}[5m]))'))
            R(("job_handler:http_request_duration_seconds:p99_5m",
               f"histogram_quantile(0.99, sum by (job, handler, le) (rate("
               f'http_request_duration_seconds_bucket{{job="{job}",handler="{h}"}}[5m])))'))
            R(("job_handler:http_request_duration_seconds:mean5m",
               f'sum by (job, handler) (rate(http_request_duration_seconds_sum{{handler="{h}"}}'
               f'[5m])) / sum by (job, handler) (rate(http_request_duration_seconds_count'
               f'{{handler="{h}"}}[5m]))'))
    for w in ("1m", "5m", "15m"):
        R((f"instance:node_cpu_utilisation:rate{w}",
           f'1 - avg without (cpu, mode) (rate(node_cpu_seconds_total{{mode="idle"}}[{w}]))'))
        R((f"instance_mode:node_cpu_seconds:rate{w}",
           f"sum without (cpu) (rate(node_cpu_seconds_total[{w}]))"))
        R((f"tier:requests:rate{w}", f"sum by (tier) (rate(requests_total[{w}]))"))
        R((f"tier:request_errors:ratio_rate{w}",
           f'sum by (tier) (rate(requests_total{{outcome!="ok"}}[{w}])) / '
           f"sum by (tier) (rate(requests_total[{w}]))"))
        R((f"tier:latency_seconds:p99_{w}",
           f"histogram_quantile(0.99, sum by (tier, le) (rate(latency_seconds_bucket[{w}])))"))
        R((f"instance:node_network_receive_bytes:rate{w}",
           f'sum without (device) (rate(node_network_receive_bytes_total{{device!="lo"}}'
           f"[{w}]))"))
        R((f"instance:node_disk_io_time_seconds:rate{w}",
           f"sum without (device) (rate(node_disk_io_time_seconds_total[{w}]))"))
        R((f"job:process_cpu_seconds:rate{w}",
           f"sum by (job) (rate(process_cpu_seconds_total[{w}]))"))
        R((f"grpc_service:grpc_server_handled:rate{w}",
           f"sum by (grpc_service, grpc_code) (rate(grpc_server_handled_total[{w}]))"))
        R((f"cache:cache_hit:ratio_rate{w}",
           f"sum by (cache) (rate(cache_hits_total[{w}])) / (sum by (cache) "
           f"(rate(cache_hits_total[{w}])) + sum by (cache) (rate(cache_misses_total[{w}])))"))
    R(("instance:node_memory_utilisation:ratio",
       "1 - node_memory_MemAvailable_bytes / node_memory_MemTotal_bytes"))
    R(("instance:node_filesystem_avail:ratio",
       "node_filesystem_avail_bytes / node_filesystem_size_bytes"))
    R(("instance:node_load1_per_cpu:ratio",
       'node_load1 / on (instance) group_left count by (instance) '
       '(node_cpu_seconds_total{mode="idle"})'))
    R(("nodename:http_requests:rate5m",
       "sum by (instance, job) (rate(http_requests_total[5m])) * on (instance) "
       "group_left (nodename) node_uname_info"))
    R(("code:http_requests:ratio_rate5m",
       'sum without (method, handler, instance) (rate(http_requests_total[5m])) / ignoring '
       '(code) group_left sum without (method, handler, instance, code) '
       '(rate(http_requests_total[5m]))'))
    R(("handler:http_requests:topk5m",
       "topk(3, sum by (handler) (rate(http_requests_total[5m])))"))
    R(("job:up:count", "count by (job) (up == 1)"))
    R(("job:up:avg_over_time1h", "avg by (job) (avg_over_time(up[1h]))"))
    R(("namespace:kube_pod_container_restarts:increase1h",
       "sum by (namespace) (increase(kube_pod_container_status_restarts_total[1h]))"))
    R(("job:go_goroutines:max", "max by (job) (go_goroutines)"))
    R(("job:process_open_fds:ratio", "process_open_fds / process_max_fds"))
    R(("instance:node_uptime_seconds", 'time() - process_start_time_seconds{job="node"}'))
    R(("probe:probe_success:avg_over_time10m", "avg_over_time(probe_success[10m])"))
    R(("tier:queue_depth:avg_over_time5m", "avg by (tier) (avg_over_time(queue_depth[5m]))"))
    R(("instance:in_flight:quantile_over_time30m", "quantile_over_time(0.9, in_flight[30m])"))

    A = alerts.append
    for job in ("api", "web", "node"):
        A((f"{job.title()}TargetDown", f'up{{job="{job}"}} == 0', "1m", "critical"))
        A((f"{job.title()}TargetMissing", f'absent(up{{job="{job}"}})', "5m", "critical"))
        A((f"{job.title()}TooFewTargets", f'count(up{{job="{job}"}} == 1) < 4', "5m", "warning"))
        A((f"{job.title()}ProcessRestarted",
           f'changes(process_start_time_seconds{{job="{job}"}}[1h]) > 0', "0s", "info"))
        A((f"{job.title()}HighCPU", f'rate(process_cpu_seconds_total{{job="{job}"}}[5m]) > 0.8',
           "10m", "warning"))
        A((f"{job.title()}FdsNearLimit",
           f'process_open_fds{{job="{job}"}} / process_max_fds{{job="{job}"}} > 0.7', "5m",
           "warning"))
        A((f"{job.title()}Goroutines", f'avg_over_time(go_goroutines{{job="{job}"}}[10m]) > 600',
           "15m", "warning"))
        A((f"{job.title()}GcSlow", f'go_gc_duration_seconds{{job="{job}",quantile="1"}} > 0.0025',
           "5m", "info"))
    for job in JOBS_HTTP:
        for thr, w, f in (("0.01", "1m", "2m"), ("0.02", "5m", "5m"), ("0.05", "5m", "1m"),
                          ("0.01", "30m", "15m"), ("0.005", "1h", "30m")):
            A((f"{job.title()}ErrorBudgetBurn",
               f'job:http_errors:ratio_rate{w}{{job="{job}"}} > {thr}', f, "critical"))
        for q, thr in (("99", "0.5"), ("9", "0.3"), ("5", "0.15")):
            A((f"{job.title()}LatencyHigh",
               f'job:http_request_duration_seconds:p{q}_5m{{job="{job}"}} > {thr}', "5m",
               "warning"))
        for h in JOBS_HTTP[job]:
            for w in ("5m", "1h"):
                A((f"{job.title()}HandlerErrors",
                   f'sum by (job, handler) (rate(http_requests_total{{job="{job}",'
                   f'handler="{h}",code=~"5.."}}[{w}])) / sum by (job, handler) (rate('
                   f'http_requests_total{{job="{job}",handler="{h}"}}[{w}])) > 0.05 and sum by '
                   f'(job, handler) (rate(http_requests_total{{job="{job}",handler="{h}"}}[{w}])) '
                   f"> 1", "5m", "warning"))
            A((f"{job.title()}HandlerSlow",
               f'job_handler:http_request_duration_seconds:p99_5m{{handler="{h}"}} > 0.4 '
               f'unless job_handler:http_requests:rate5m{{handler="{h}"}} < 0.5', "10m",
               "warning"))
            A((f"{job.title()}HandlerNoTraffic",
               f'sum by (handler) (rate(http_requests_total{{handler="{h}"}}[15m])) == 0 or '
               f'absent(http_requests_total{{handler="{h}"}})', "15m", "warning"))
            A((f"{job.title()}Handler5xxBurst",
               f'increase(http_requests_total{{job="{job}",handler="{h}",code="500"}}[10m]) > 20',
               "0s", "info"))
            A((f"{job.title()}HandlerInFlight",
               f'max_over_time(http_requests_in_flight{{handler="{h}"}}[5m]) > 35', "5m", "info"))
    for tier in TIERS:
        for w, thr, f in (("1m", "0.05", "2m"), ("5m", "0.02", "5m"), ("15m", "0.01", "15m")):
            A((f"{tier.title()}ErrorRatio",
               f'tier:request_errors:ratio_rate{w}{{tier="{tier}"}} > {thr}', f, "critical"))
            A((f"{tier.title()}LatencyP99", f'tier:latency_seconds:p99_{w}{{tier="{tier}"}} > 0.5',
               f, "warning"))
        A((f"{tier.title()}QueueBuilding",
           f'avg_over_time(queue_depth{{tier="{tier}"}}[10m]) > 6 and '
           f'deriv(queue_depth{{tier="{tier}"}}[10m]) > 0', "5m", "warning"))
        A((f"{tier.title()}Timeouts",
           f'sum(increase(requests_total{{tier="{tier}",outcome="timeout"}}[15m])) > 500', "0s",
           "warning"))
        A((f"{tier.title()}NoRequests",
           f'sum(rate(requests_total{{tier="{tier}"}}[5m])) < 1 or '
           f'absent(requests_total{{tier="{tier}"}})', "5m", "critical"))
    for w, thr in (("1m", "0.95"), ("5m", "0.9"), ("15m", "0.85")):
        A(("NodeCPUSaturated", f"instance:node_cpu_utilisation:rate{w} > {thr}", "10m", "warning"))
        A(("NodeDiskBusy", f"instance:node_disk_io_time_seconds:rate{w} > 0.9", "10m", "info"))
    for mp in ("/", "/var", "/data"):
        A(("NodeFilesystemAlmostFull",
           f'node_filesystem_avail_bytes{{mountpoint="{mp}",fstype!=""}} / '
           f'node_filesystem_size_bytes{{mountpoint="{mp}",fstype!=""}} < 0.1', "30m",
           "critical"))
        A(("NodeFilesystemFillingUp",
           f'node_filesystem_avail_bytes{{mountpoint="{mp}"}} / node_filesystem_size_bytes'
           f'{{mountpoint="{mp}"}} < 0.4 and predict_linear(node_filesystem_avail_bytes'
           f'{{mountpoint="{mp}"}}[6h], 4 * 3600) < 0', "1h", "warning"))
    for thr in ("0.8", "0.9"):
        A(("NodeMemoryHigh", f"instance:node_memory_utilisation:ratio > {thr}", "15m", "warning"))
    A(("NodeMemoryShrinking", "deriv(node_memory_MemAvailable_bytes[30m]) < -5e5", "30m", "info"))
    A(("NodeLoadHigh", "instance:node_load1_per_cpu:ratio > 0.8", "15m", "warning"))
    A(("NodeLoadQuantile", "quantile_over_time(0.9, node_load5[30m]) > 3", "10m", "info"))
    A(("NodeNetworkErrors", "rate(node_network_receive_errs_total[5m]) > 0.02", "10m", "info"))
    A(("NodeCountersReset", "resets(node_disk_read_bytes_total[30m]) > 0", "0s", "info"))
    A(("NodeRebooted", 'instance:node_uptime_seconds < 600', "0s", "info"))
    A(("NodeHostRequests",
       "nodename:http_requests:rate5m > on (job) group_left avg by (job) "
       "(nodename:http_requests:rate5m) * 2", "15m", "warning"))
    A(("ProbeFailing", "probe:probe_success:avg_over_time10m < 0.9", "5m", "critical"))
    A(("ProbeDown", 'probe_success{job="blackbox"} == 0', "2m", "critical"))
    A(("ProbeMissing", "absent_over_time(probe_success[5m])", "5m", "critical"))
    A(("PodRestarting", "namespace:kube_pod_container_restarts:increase1h > 2", "0s", "warning"))
    A(("PodRestartLoop", "increase(kube_pod_container_status_restarts_total[2h]) > 0", "30m",
       "info"))
    A(("CacheHitRatioLow", "cache:cache_hit:ratio_rate5m < 0.85", "15m", "warning"))
    A(("CacheHitRatioLow1m", "cache:cache_hit:ratio_rate1m < 0.8", "5m", "info"))
    A(("GrpcErrors", 'sum without (grpc_code) (grpc_service:grpc_server_handled:rate5m'
       '{grpc_code=~"Unavailable|Internal"}) / sum without (grpc_code) '
       '(grpc_service:grpc_server_handled:rate5m) > 0.01', "5m", "warning"))
    A(("GrpcErrorsFast", 'sum without (grpc_code) (grpc_service:grpc_server_handled:rate1m'
       '{grpc_code="Unavailable"}) > 0.5', "1m", "critical"))
    A(("HttpCodeShare", 'code:http_requests:ratio_rate5m{code="404"} > 0.1', "10m", "info"))
    A(("HandlerTopTraffic", "handler:http_requests:topk5m > 100", "10m", "info"))
    A(("TargetsFlapping", "job:up:avg_over_time1h < 0.99 and job:up:count > 0", "0s", "info"))
    A(("ApiUnavailableOrSlow",
       'job:http_errors:ratio_rate5m{job="api"} > 0.05 or '
       'job:http_request_duration_seconds:p99_5m{job="api"} > 1', "5m", "critical"))
    A(("InFlightHigh", "instance:in_flight:quantile_over_time30m > 60", "5m", "info"))
    A(("QueueDeepAll", "tier:queue_depth:avg_over_time5m > 7", "5m", "info"))
    A(("GoroutinesTop", "topk(1, job:go_goroutines:max) > 550", "5m", "info"))
    A(("ProcessMemoryHigh", "process_resident_memory_bytes > 4.4e8", "15m", "warning"))
    A(("ProcessMemoryGrowing",
       "predict_linear(process_resident_memory_bytes[1h], 3600) > 5e8", "30m", "warning"))
    A(("NetworkTransmitLow", "sum without (device) (rate(node_network_transmit_bytes_total[15m]))"
       " < 5e5", "15m", "info"))
    A(("DiskWritesHigh", "sum without (device) (rate(node_disk_written_bytes_total[5m])) > 3.5e6",
       "15m", "info"))
    A(("FdsRatio", "job:process_open_fds:ratio > 0.35", "15m", "info"))
    # a second look at the same windows with other thresholds, as layered alerts do
    for job in JOBS_HTTP:
        for w in ("5m", "30m", "1h"):
            A((f"{job.title()}TrafficDrop",
               f'job:http_requests:rate{w}{{job="{job}"}} < 0.5 * job:http_requests:rate{w}'
               f'{{job="{job}"}} offset 1h', "15m", "warning"))
            A((f"{job.title()}TrafficHigh",
               f'sum by (job) (rate(http_requests_total{{job="{job}"}}[{w}])) > 200', "10m",
               "info"))
    while len(rec) + len(alerts) < 300:  # per-code error rates fill the file to 300 rules
        i = len(rec) + len(alerts)
        job, code = ("api", "web")[i % 2], ("500", "503", "404")[(i // 2) % 3]
        w = ("1m", "5m", "10m", "30m")[(i // 6) % 4]
        A((f"{job.title()}Code{code}Rate",
           f'sum by (job, code) (rate(http_requests_total{{job="{job}",code="{code}"}}[{w}])) '
           f"> {1 + i % 7}", "5m", "info"))
    rec, alerts = rec[:300], alerts[:300 - len(rec)]
    lines = ["groups:", "  - name: recording", "    interval: 1m", "    rules:"]
    for name, expr in rec:
        lines += [f"      - record: {name}", f"        expr: {_yaml_str(expr)}"]
    for g, part in (("alerts-services", alerts[: len(alerts) // 2]),
                    ("alerts-nodes", alerts[len(alerts) // 2:])):
        lines += [f"  - name: {g}", "    interval: 1m", "    rules:"]
        for name, expr, for_, sev in part:
            lines += [f"      - alert: {name}", f"        expr: {_yaml_str(expr)}",
                      f"        for: {for_}", "        labels:", f"          severity: {sev}"]
    listed = [("record", n, e) for n, e in rec] + [("alert", n, e) for n, e, _, _ in alerts]
    return "\n".join(lines) + "\n", listed


def _yaml_str(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"
