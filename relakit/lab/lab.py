"""The lab itself: its processes on 127.0.0.1 (config server, data-plane services,
Prometheus), started, recorded in ``state.json``, queried and stopped.

``state.json`` in the working folder (mode 0600, rewritten atomically after
each process starts) records every child's pid, process group, start time and
command line, and the owner's: :func:`stop_lab` stops a lab whose owner was
killed, signalling only processes that still match their record
(:mod:`relakit.lab.procs`). The config server's token travels in its
environment (``RELAKIT_LAB_TOKEN``), never on a command line.

Agents run as processes of their own (:meth:`Lab.start_agent`, ``python -m
relakit.lab.agent``): with ``--agents 2`` as threads of one process, one crash took
both down and the lease's takeover could never happen. An agent process dies with
the process that started it (``PR_SET_PDEATHSIG``: it holds no port and is
pointless without its owner) and is recorded like every other child.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from relakit.control import TSDB, load_clocks
from relakit.lab import procs
from relakit.lab.dataplane import DEFAULT_BUCKETS_S
from relakit.traces import parse_prometheus_json

STATE = "state.json"
ENDPOINTS = "endpoints.json"  # the URLs alone (0644): what a user's load tool reads
TOKEN_ENV = "RELAKIT_LAB_TOKEN"

SERIES = ("requests_total", "latency_seconds_bucket", "latency_seconds_sum",
          "latency_seconds_count", "in_flight", "busy_seconds_total",
          *("rejected_total", "concurrency_limit"))  # the last two: with a concurrency limit
# (relakit.lab.in_path), as the simulator's series


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _wait_http(url: str, timeout_s: float = 20.0) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        try:
            if httpx.get(url, timeout=1.0).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up within {timeout_s:g} s")


@dataclass
class LabSpec:
    instances: int = 3
    servers: int = 2
    mean_ms: float = 40.0
    slow_ms: float = 200.0
    slow_fraction: float = 0.02
    error_rate: float = 0.0
    error_rates: tuple = ()  # per instance, overriding error_rate
    slowdowns: tuple = ()  # per instance, 1 = healthy
    clocks: dict = field(default_factory=lambda: {"scrape_s": 1, "window_s": 5, "eval_s": 1,
                                                  "poll_s": 1})
    prometheus: str = "/usr/bin/prometheus"
    # the front door (relakit.lab.front): its port (0: a free one; `lab up` uses 8780 so a
    # user's tool finds it run after run), routing as fleet.routing, the tier's header
    front_port: int = 0
    routing: str = "random"
    tier_header: str = "X-Tier"
    keepalive_s: float = 75.0  # idle keep-alive of the front and the instances
    queue_limit: int | None = None  # waiting places per instance (fleet.queue_limit)
    deadline_ms: float | None = None  # server-side timeout per request (deadline_ms)
    buckets_s: tuple = DEFAULT_BUCKETS_S  # the latency histogram's bucket bounds
    lease_s: float = 5.0  # the config server's leader lease (agents with ha=True)
    renew_s: float = 1.5  # how often the leader renews it
    # the in-path mechanisms (issue 33), a scenario's mitigations.client_throttle and
    # .concurrency_limit as relakit.lab.in_path.lab_mitigations reads them: the
    # instances enforce the limit, the load generator and the front throttle
    mitigations: dict = field(default_factory=dict)
    # the instances' service-time generators (instance i draws from seed + i, the front's
    # routing from seed + instances): None draws a fresh one per run, kept in state.json (spec.seed)
    # so a run can be repeated; with a fixed seed every run drew the same service times
    seed: int | None = None

    def __post_init__(self):
        from relakit.lab.in_path import LAB_MITIGATIONS

        extra = sorted(set(self.mitigations) - set(LAB_MITIGATIONS))
        if extra:
            raise ValueError(f"LabSpec.mitigations: key '{extra[0]}': the lab runs only "
                             f"{', '.join(LAB_MITIGATIONS)}")

    def service_quantile_ms(self, q: float) -> float:
        """The ``q`` quantile of a healthy instance's service time (ms): the latency of a
        request that meets no queue at all. The instances draw it as a mixture of
        exponentials (:mod:`relakit.lab.dataplane`: mean ``slow_ms`` for ``slow_fraction``
        of requests, else ``mean_ms``): the simulator's hyperexponential kind, whose
        quantile :func:`relakit.analytic.service_quantile` solves."""
        from relakit.analytic import service_quantile

        return 1e3 * service_quantile("hyperexponential", q, fast_ms=self.mean_ms,
                                      slow_ms=self.slow_ms, slow_fraction=self.slow_fraction)


class Lab:
    """The live system. ``with Lab(spec) as lab:`` brings it up and always down."""

    def __init__(self, spec: LabSpec | None = None, workdir: str | None = None):
        self.spec = spec or LabSpec()
        self.clocks = load_clocks(self.spec.clocks)
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="relakit-lab-"))
        self.token = secrets.token_hex(8)
        self.procs: list[subprocess.Popen] = []
        self.records: list[dict] = []  # pid, pgid, start time, command line of each child
        self.named: dict[str, subprocess.Popen] = {}  # each child by its record's name
        self._wrote_state = False  # down() removes only a state.json this lab wrote
        self.ready = False  # every process started and answering
        self.config_url = ""
        self.prom_url = ""
        self.instance_urls: list[str] = []
        self.front_url = ""
        self.started_at = time.time()  # `lab record` records from here by default
        self.seed = self.spec.seed if self.spec.seed is not None else secrets.randbits(32) + 1

    def _spawn(self, args: list[str], name: str, env: dict | None = None) -> subprocess.Popen:
        with open(self.workdir / f"{name}.log", "w") as log:
            # a session of its own: a Ctrl-C in the owner's terminal reaches the owner only,
            # which stops the children in order; pgid == pid, recorded for `down`
            p = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                 start_new_session=True, env=env)
        self.procs.append(p)
        self.named[name] = p
        ident = procs.identity_after_exec(p.pid, args)
        if ident is not None:
            self.records.append({"name": name, **ident})
        self.save_state()  # recorded before the next one starts: a kill now loses nothing
        return p

    def up(self) -> Lab:
        if not Path(self.spec.prometheus).exists() and not shutil.which("prometheus"):
            raise RuntimeError("Prometheus is not installed: apt-get install prometheus")
        if (self.workdir / STATE).is_file() and running(self.workdir):
            raise ValueError(f"{self.workdir}: a lab is already running here; stop it with "
                             f"`relakit lab down --dir {self.workdir}`")
        py = sys.executable
        s = self.spec
        if s.front_port and not port_free(s.front_port):
            raise ValueError(f"front port {s.front_port} is in use on 127.0.0.1: give "
                             "another with --front-port (0: any free port)")
        port = free_port()
        self.config_url = f"http://127.0.0.1:{port}"
        self._spawn([py, "-m", "relakit.lab.config_server", "--port", str(port),
                     "--lease-s", str(self.spec.lease_s)], "config",
                    env={**os.environ, TOKEN_ENV: self.token})
        # ports in rising order: a recording's importer numbers instances by natural sort
        # of their names, which is then the instances' own order (node i is instance i)
        for i, p in enumerate(sorted({free_port() for _ in range(4 * s.instances)})[
                :s.instances]):
            self.instance_urls.append(f"http://127.0.0.1:{p}")
            self._spawn([py, "-m", "relakit.lab.dataplane", "--port", str(p), "--config-url",
                         self.config_url, "--poll-s", str(self.clocks.poll_s), "--servers",
                         str(s.servers), "--mean-ms", str(s.mean_ms), "--slow-ms",
                         str(s.slow_ms), "--slow-fraction", str(s.slow_fraction),
                         "--error-rate", str(s.error_rates[i] if s.error_rates else s.error_rate),
                         "--slowdown", str(s.slowdowns[i] if s.slowdowns else 1.0),
                         "--seed", str(self.seed + i),
                         "--buckets", ",".join(f"{b:g}" for b in s.buckets_s),
                         "--tier-header", s.tier_header, "--keepalive-s", str(s.keepalive_s)]
                        + ([] if s.queue_limit is None else ["--queue-limit", str(s.queue_limit)])
                        + ([] if s.deadline_ms is None else ["--deadline-ms", str(s.deadline_ms)])
                        + ([] if "concurrency_limit" not in s.mitigations else [
                            "--concurrency-limit", json.dumps(s.mitigations["concurrency_limit"])]),
                        f"instance{i}",
                        env={**os.environ, TOKEN_ENV: self.token})  # /repair needs it
        fport = s.front_port or free_port()
        self.front_url = f"http://127.0.0.1:{fport}"
        self._spawn([py, "-m", "relakit.lab.front", "--port", str(fport), "--config-url",
                     self.config_url, "--instances", ",".join(self.instance_urls),
                     "--poll-s", str(self.clocks.poll_s), "--routing", s.routing,
                     "--tier-header", s.tier_header, "--keepalive-s", str(s.keepalive_s),
                     "--seed", str(self.seed + s.instances)]
                    + ([] if "client_throttle" not in s.mitigations else [
                        "--client-throttle", json.dumps(s.mitigations["client_throttle"])]),
                    "front")  # no token: the front writes nothing anywhere
        _wait_http(f"{self.config_url}/state")
        for u in self.instance_urls:
            _wait_http(f"{u}/metrics")
        _wait_http(f"{self.front_url}/")
        pport = free_port()
        self.prom_url = f"http://127.0.0.1:{pport}"
        targets = [u.removeprefix("http://") for u in self.instance_urls]
        cfg = {"global": {"scrape_interval": f"{self.clocks.scrape_s:g}s",
                          "evaluation_interval": "15s"},
               "scrape_configs": [{"job_name": "relakit",
                                   "static_configs": [{"targets": targets}]}]}
        if "client_throttle" in s.mitigations:  # the front's client_throttled_total
            cfg["scrape_configs"].append({"job_name": "relakit-front", "static_configs": [
                {"targets": [self.front_url.removeprefix("http://")]}]})
        (self.workdir / "prometheus.yml").write_text(json.dumps(cfg))  # JSON is YAML
        self._spawn([shutil.which("prometheus") or s.prometheus,
                     f"--config.file={self.workdir / 'prometheus.yml'}",
                     f"--web.listen-address=127.0.0.1:{pport}",
                     f"--storage.tsdb.path={self.workdir / 'tsdb'}"], "prometheus")
        _wait_http(f"{self.prom_url}/-/ready", 30)
        self.ready = True
        self.save_state()
        return self

    def start_agent(self, name: str, policy=None, chain=None, ha: bool = False,
                    source: str = "samples") -> subprocess.Popen:
        """Start one agent as a process of its own (``python -m relakit.lab.agent``),
        recorded in ``state.json`` as ``name``; it attaches to this lab through
        ``state.json``, writes its log to ``<name>.log`` and, when stopped with SIGTERM,
        its audit to ``decisions-<name>.parquet``. It dies with this process.
        ``policy`` and ``chain`` are file paths."""
        if not self.ready:
            raise RuntimeError("start the lab (up) before its agents")
        args = [sys.executable, "-m", "relakit.lab.agent", "--dir", str(self.workdir),
                "--name", name, "--parent", str(os.getpid()), "--source", source]
        if policy is not None:
            args += ["--policy", str(Path(policy).resolve())]
        if chain is not None:
            args += ["--chain", str(Path(chain).resolve())]
        if ha:
            args.append("--ha")
        return self._spawn(args, name)

    def stop_agents(self, timeout_s: float = 10.0) -> list[str]:
        """SIGTERM every agent process and wait for it (SIGKILL after ``timeout_s``), so
        each writes its audit; returns the names of those that were still running."""
        alive = {n: p for n, p in self.named.items()
                 if n.startswith("agent") and p.poll() is None}
        for p in alive.values():
            p.send_signal(signal.SIGTERM)
        for p in alive.values():
            try:
                p.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        return list(alive)

    def save_state(self) -> Path:
        """Write ``state.json`` (0600, atomically): URLs, token, clocks, and the
        identity of the owner and of every child, for :func:`stop_lab`."""
        from relakit.io import write_json

        owner = procs.identity(os.getpid())
        self._wrote_state = True
        public = {"front_url": self.front_url, "config_url": self.config_url,
                  "prom_url": self.prom_url, "instance_urls": self.instance_urls,
                  "tier_header": self.spec.tier_header}
        if self.front_url:  # what a load tool needs, readable by anyone: no token in it
            write_json(public, self.workdir / ENDPOINTS, mode=0o644)
        return write_json({**public, "token": self.token,
                           "clocks": self.spec.clocks, "ready": self.ready, "owner": owner,
                           "started_at": self.started_at,
                           "spec": {"instances": self.spec.instances,
                                    "servers": self.spec.servers,
                                    "routing": self.spec.routing,
                                    "queue_limit": self.spec.queue_limit,
                                    "deadline_ms": self.spec.deadline_ms,
                                    "buckets_s": list(self.spec.buckets_s),
                                    "lease_s": self.spec.lease_s,
                                    "renew_s": self.spec.renew_s,
                                    "mitigations": self.spec.mitigations,
                                    "seed": self.seed},
                           "processes": self.records}, self.workdir / STATE, mode=0o600)

    @classmethod
    def attach(cls, workdir) -> Lab:
        """A handle on a lab another process brought up (for load, record, down)."""
        state = _read_state(workdir)
        need = ("config_url", "prom_url", "instance_urls", "token", "clocks")
        lost = [k for k in need if k not in state]
        if lost:
            raise ValueError(f"{Path(workdir) / STATE}: key '{lost[0]}' is missing: this "
                             "file was not written by `lab up` (stop the lab with "
                             "`relakit lab down`)")
        known = {k: v for k, v in (state.get("spec") or {}).items()
                 if k in ("instances", "servers", "lease_s", "renew_s", "routing",
                          "queue_limit", "deadline_ms", "buckets_s", "mitigations", "seed")}
        lab = cls(LabSpec(clocks=state["clocks"], **known), workdir=str(workdir))
        lab.config_url, lab.prom_url = state["config_url"], state["prom_url"]
        lab.instance_urls, lab.token = state["instance_urls"], state["token"]
        lab.front_url = state.get("front_url", "")
        lab.started_at = float(state.get("started_at", time.time() - 120.0))
        return lab

    def down(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()
        self.procs.clear()
        self.records.clear()
        self.named.clear()
        if self._wrote_state:
            (self.workdir / STATE).unlink(missing_ok=True)
            (self.workdir / ENDPOINTS).unlink(missing_ok=True)

    def __enter__(self) -> Lab:
        try:
            return self.up()
        except BaseException:
            self.down()
            raise

    def __exit__(self, *exc) -> None:
        self.down()

    # ---- what Prometheus holds ----------------------------------------------------------
    def instances(self) -> list[str]:
        return [u.removeprefix("http://") for u in self.instance_urls]

    def query_raw(self, range_s: float, at: float | None = None) -> dict:
        """The raw samples of relakit's series over the last range_s (instant query)."""
        sel = "{__name__=~\"" + "|".join(SERIES) + "\"}" + f"[{int(max(1, range_s))}s]"
        params = {"query": sel}
        if at is not None:
            params["time"] = f"{at:.3f}"
        r = httpx.get(f"{self.prom_url}/api/v1/query", params=params, timeout=10.0)
        return r.json()

    def tsdb(self, range_s: float, at: float | None = None) -> TSDB:
        frame = parse_prometheus_json(self.query_raw(range_s, at), "prometheus",
                                      instances=self.instances())
        return TSDB.from_long(frame)

    def promql(self, query: str, at: float) -> float:
        """A scalar PromQL result at a time (NaN when Prometheus returns nothing)."""
        r = httpx.get(f"{self.prom_url}/api/v1/query", params={"query": query,
                                                                "time": f"{at:.3f}"},
                      timeout=10.0).json()
        result = r.get("data", {}).get("result", [])
        return float(result[0]["value"][1]) if result else float("nan")

    def promql_signals(self, policy, at: float) -> list[float]:
        """Every signal of a policy evaluated by Prometheus from its PromQL rendering."""
        w = self.clocks.window_s
        return [self.promql(sig.promql(w), at) if not sig.by_node else float("nan")
                for sig in policy.signals.values()]

    def record(self, path, start_s: float, end_s: float | None = None) -> Path:
        """Save what Prometheus scraped from start_s (Unix s) in the importer's format."""
        end = end_s or time.time()
        body = self.query_raw(end - start_s + 1, at=end)
        from relakit.io import write_json

        return write_json(body, path)


def running(workdir) -> list[dict]:
    """The recorded processes of the lab in ``workdir`` that are still alive and ours."""
    state = _read_state(workdir)
    return [r for r in [state.get("owner") or {}, *state.get("processes", [])]
            if r and procs.is_same(r)]


def stop_lab(workdir, timeout_s: float = 10.0) -> dict:
    """Stop the lab in ``workdir`` whatever happened to the process that brought it up.

    The owner (``relakit lab up``) is asked first with SIGTERM, so it stops its
    children in order and writes its audit; then every recorded child still alive
    and matching its record is stopped (SIGTERM, SIGKILL after ``timeout_s``).
    Processes whose pid now belongs to something else are left alone.
    ``state.json`` is removed once none of the lab's processes is left. Returns
    {"stopped", "left_alone", "remaining": records, "recorded": count}.
    """
    state = _read_state(workdir)
    owner = [state["owner"]] if state.get("owner") else []
    children = state.get("processes", [])
    stopped, alien = procs.stop(owner, timeout_s=3 * timeout_s)
    more, alien2 = procs.stop(children, timeout_s=timeout_s)
    remaining = [r for r in owner + children if procs.is_same(r)]
    if not remaining:
        (Path(workdir) / STATE).unlink(missing_ok=True)
        (Path(workdir) / ENDPOINTS).unlink(missing_ok=True)
    return {"stopped": stopped + more, "left_alone": alien + alien2, "remaining": remaining,
            "recorded": len(owner) + len(children)}


def _read_state(workdir) -> dict:
    path = Path(workdir) / STATE
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: cannot read the lab's state: {exc}") from None
    if not isinstance(state, dict):
        raise ValueError(f"{path}: not a lab state (expected a mapping)")
    recs = state.get("processes", [])
    if not isinstance(recs, list):
        raise ValueError(f"{path}: key 'processes': expected a list of process records")
    owner = state.get("owner")
    for key, r in [("owner", owner)] * (owner is not None) + [
            (f"processes[{i}]", r) for i, r in enumerate(recs)]:
        if not (isinstance(r, dict) and isinstance(r.get("pid"), int) and r["pid"] > 0
                and isinstance(r.get("start"), int) and isinstance(r.get("cmdline"), list)):
            raise ValueError(f"{path}: key '{key}': expected {{pid, start, cmdline}} of a "
                             "process relakit started; this file was not written by `lab up`")
    return state


__all__ = ["Lab", "LabSpec", "free_port", "running", "stop_lab"]
