"""The stepping interface to the fleet kernel.

:class:`Fleet` owns the kernel's arrays and is the only thing that calls it.
It turns a validated :class:`~relakit.scenario.Scenario` into flat arrays once
(so the kernel compiles once, whatever the scenario), grows pools and buffers
when the kernel asks, and exposes the seam a control plane needs: advance to
a time, change per-node controls or global flags, advance again. A change
takes effect in the kernel at exactly the time it is made.
"""

from __future__ import annotations

import math

import numpy as np

from relakit.scenario import TIER_NAMES, Scenario
from relakit.sim import kernel as K
from relakit.sim.rng import new_state


def _service_params(service) -> tuple[int, float, float, float]:
    """Kind code and the kernel's three parameters, in seconds."""
    p = service.params
    kind = K.SERVICE_KINDS.index(service.kind)
    if service.kind in ("exponential", "deterministic"):
        return kind, p["mean_ms"] / 1000.0, 0.0, 0.0
    if service.kind == "lognormal":
        sigma2 = math.log1p(p["cv"] ** 2)
        return kind, math.log(p["mean_ms"] / 1000.0) - sigma2 / 2, math.sqrt(sigma2), 0.0
    if service.kind == "pareto":
        alpha = p["alpha"]
        return kind, p["mean_ms"] / 1000.0 * (alpha - 1) / alpha, alpha, 0.0
    return kind, p["fast_ms"] / 1000.0, p["slow_ms"] / 1000.0, p["slow_fraction"]


def build_config(sc: Scenario, record_requests: bool) -> K.Config:
    wl, fl = sc.workload, sc.fleet
    cfg_f = np.zeros(K.N_CF)
    cfg_i = np.zeros(K.N_CI, np.int64)
    rate_t = np.asarray(wl.arrival.times_s, dtype=np.float64)
    rate_v = np.asarray(wl.arrival.rates_rps, dtype=np.float64)
    cfg_f[K.CF_RATE_MAX] = rate_v.max()
    cfg_f[K.CF_SAMPLE_DT] = sc.metrics_interval_s
    cfg_f[K.CF_DEADLINE] = np.inf if wl.deadline_ms is None else wl.deadline_ms / 1000.0
    cfg_f[K.CF_WARMUP] = sc.warmup_s
    kind, a, b, c = _service_params(fl.service)
    cfg_i[K.CI_SVC_KIND] = kind
    cfg_f[K.CF_SVC_A], cfg_f[K.CF_SVC_B], cfg_f[K.CF_SVC_C] = a, b, c
    cfg_i[K.CI_ROUTING] = K.ROUTINGS.index(fl.routing)
    cfg_i[K.CI_FANOUT] = wl.fanout
    cfg_i[K.CI_RECORD] = int(record_requests)
    cfg_i[K.CI_CONST_RATE] = int(wl.arrival.constant)
    cfg_i[K.CI_QUEUE_LIMIT] = -1 if fl.queue_limit is None else fl.queue_limit
    tier_cum = np.cumsum([wl.tiers[t] for t in TIER_NAMES])
    tier_cum[-1] = 1.0
    faults = sc.faults
    fault_f = np.array([[f.start_s, f.end_s, f.error_rate, f.slowdown] for f in faults],
                       dtype=np.float64).reshape(len(faults), 4)
    fault_i = np.array([[f.node, int(f.crash)] for f in faults], dtype=np.int64).reshape(
        len(faults), 2)
    sched_t = np.unique(fault_f[:, :2]) if faults else np.zeros(0)
    return K.Config(cfg_f, cfg_i, tier_cum, rate_t, rate_v, sched_t.astype(np.float64),
                    fault_f, fault_i)


_UNSET = object()


def _grow_rows(a: np.ndarray, rows: int, fill=0) -> np.ndarray:
    b = np.full((rows,) + a.shape[1:], fill, dtype=a.dtype)
    b[: a.shape[0]] = a
    return b


class Fleet:
    """A fleet in mid-run: ``advance(t)``, change controls, ``advance`` again."""

    def __init__(self, scenario: Scenario, seed: int | None = None, record_requests: bool = True):
        self.scenario = scenario
        self.seed = scenario.seed if seed is None else int(seed)
        self.cfg = build_config(scenario, record_requests)
        n = scenario.fleet.nodes
        fanout = scenario.workload.fanout
        jobs = max(64, 4 * sum(scenario.fleet.servers) + 4 * fanout)
        users = max(64, jobs)
        node_i = np.zeros((n, K.N_NI), np.int64)
        node_i[:, K.NI_SERVERS] = scenario.fleet.servers
        node_i[:, K.NI_QHEAD] = -1
        node_i[:, K.NI_QTAIL] = -1
        node_i[:, K.NI_ROUTABLE] = 1
        node_i[:, K.NI_INTAKE_LIMIT] = -1
        node_i[:, K.NI_STAMP] = -1
        node_f = np.zeros((n, K.N_NF))
        node_f[:, K.NF_WEIGHT] = scenario.fleet.weights
        node_f[:, K.NF_SLOWDOWN] = 1.0
        self.st = K.State(
            fs=np.zeros(K.N_FS), is_=np.zeros(K.N_IS, np.int64), rng=new_state(self.seed),
            node_i=node_i, node_f=node_f,
            cnt=np.zeros((n, len(K.TIERS), len(K.OUTCOMES)), np.int64),
            job_i=np.zeros((jobs, K.N_JI), np.int64), job_f=np.zeros((jobs, K.N_JF)),
            job_free=np.arange(jobs - 1, -1, -1, dtype=np.int64),
            usr_i=np.zeros((users, K.N_UI), np.int64), usr_f=np.zeros((users, K.N_UF)),
            usr_free=np.arange(users - 1, -1, -1, dtype=np.int64),
            heap_t=np.zeros(jobs + users), heap_k=np.zeros(jobs + users, np.int64),
            scratch=np.zeros(n, np.int64),
        )
        self.st.is_[K.IS_JOB_FREE_N] = jobs
        self.st.is_[K.IS_USR_FREE_N] = users
        samples = int(scenario.duration_s / scenario.metrics_interval_s) + 2
        expected = scenario.workload.arrival.mean_rate(scenario.duration_s) * scenario.duration_s
        records = int(expected * 1.05) + 1024 if record_requests else 0
        self.out = K.Output(
            metrics=np.zeros((samples, n, K.N_METRICS)), sample_t=np.zeros(samples),
            rec_f=np.zeros((records, 2)), rec_i=np.zeros((records, 4), np.int32),
            hist=np.zeros((len(K.TIERS), 2, K.HIST_BINS), np.int64),
            tier_cnt=np.zeros((len(K.TIERS), len(K.OUTCOMES)), np.int64),
            lat_sum=np.zeros((len(K.TIERS), 2)),
        )
        K.start(self.cfg, self.st)

    # ---- time -------------------------------------------------------------------
    @property
    def now(self) -> float:
        return float(self.st.fs[K.FS_NOW])

    def advance(self, t_s: float) -> Fleet:
        """Run every event up to and including time ``t_s`` (seconds)."""
        if t_s < self.now:
            raise ValueError(f"cannot advance to {t_s} s: the fleet is already at {self.now} s")
        while True:
            status = K.advance(self.cfg, self.st, self.out, float(t_s))
            if status == K.DONE:
                return self
            self._grow(status)

    def _grow(self, status: int) -> None:
        st, out = self.st, self.out
        if status == K.GROW_RECORDS:
            rows = 2 * out.rec_f.shape[0] + 1024
            self.out = out._replace(rec_f=_grow_rows(out.rec_f, rows),
                                    rec_i=_grow_rows(out.rec_i, rows))
        elif status == K.GROW_SAMPLES:
            rows = 2 * out.sample_t.shape[0] + 16
            self.out = out._replace(metrics=_grow_rows(out.metrics, rows),
                                    sample_t=_grow_rows(out.sample_t, rows))
        elif status == K.GROW_POOLS:
            self.st = self._grow_pools(st)
        else:  # pragma: no cover - a kernel status this wrapper does not know
            raise RuntimeError(f"unknown kernel status {status}")

    @staticmethod
    def _grow_pools(st: K.State) -> K.State:
        isv = st.is_.copy()
        jobs, users, heap = st.job_i.shape[0], st.usr_i.shape[0], st.heap_t.shape[0]
        nj, nu, nh = 2 * jobs, 2 * users, 2 * heap
        job_free = np.concatenate([np.arange(nj - 1, jobs - 1, -1), st.job_free[: isv[
            K.IS_JOB_FREE_N]]]).astype(np.int64)
        usr_free = np.concatenate([np.arange(nu - 1, users - 1, -1), st.usr_free[: isv[
            K.IS_USR_FREE_N]]]).astype(np.int64)
        isv[K.IS_JOB_FREE_N] += nj - jobs
        isv[K.IS_USR_FREE_N] += nu - users
        return st._replace(
            is_=isv,
            job_i=_grow_rows(st.job_i, nj), job_f=_grow_rows(st.job_f, nj),
            job_free=_grow_rows(job_free, nj),
            usr_i=_grow_rows(st.usr_i, nu), usr_f=_grow_rows(st.usr_f, nu),
            usr_free=_grow_rows(usr_free, nu),
            heap_t=_grow_rows(st.heap_t, nh), heap_k=_grow_rows(st.heap_k, nh),
        )

    # ---- controls ---------------------------------------------------------------------
    def set_node_controls(self, node, *, routable: bool | None = None,
                          weight: float | None = None, intake_limit=_UNSET) -> None:
        """Per-node controls from now on. ``intake_limit=None`` removes the cap."""
        n = self.scenario.fleet.nodes
        nodes = np.atleast_1d(node)
        if nodes.size and (nodes.min() < 0 or nodes.max() >= n):
            raise ValueError(f"node must be in 0..{n - 1}, got {node!r}")
        if routable is not None:
            self.st.node_i[nodes, K.NI_ROUTABLE] = int(bool(routable))
        if weight is not None:
            if not weight >= 0:
                raise ValueError(f"weight must be >= 0, got {weight!r}")
            self.st.node_f[nodes, K.NF_WEIGHT] = weight
        if intake_limit is not _UNSET:
            if intake_limit is not None and intake_limit < 0:
                raise ValueError(f"intake_limit must be >= 0 or None, got {intake_limit!r}")
            self.st.node_i[nodes, K.NI_INTAKE_LIMIT] = -1 if intake_limit is None else intake_limit

    def set_flags(self, *, shed_tiers=None) -> None:
        """Global flags from now on. ``shed_tiers``: tiers dropped at admission (gold never)."""
        if shed_tiers is not None:
            unknown = set(shed_tiers) - set(TIER_NAMES)
            if unknown:
                raise ValueError(f"unknown tier(s) {sorted(unknown)}; tiers are {TIER_NAMES}")
            mask = 0
            for t in shed_tiers:
                if t != "gold":
                    mask |= 1 << TIER_NAMES.index(t)
            self.st.is_[K.IS_SHED_MASK] = mask

    def node_controls(self) -> dict:
        ni, nf = self.st.node_i, self.st.node_f
        return {
            "routable": ni[:, K.NI_ROUTABLE].astype(bool).copy(),
            "weight": nf[:, K.NF_WEIGHT].copy(),
            "intake_limit": np.where(ni[:, K.NI_INTAKE_LIMIT] < 0, -1, ni[:, K.NI_INTAKE_LIMIT]),
        }

    # ---- read-outs -------------------------------------------------------------------
    @property
    def users_in_flight(self) -> int:
        return int(self.st.is_[K.IS_IN_FLIGHT_USERS])

    @property
    def n_arrived(self) -> int:
        return int(self.st.is_[K.IS_USER_SEQ])

    def result(self):
        from relakit.sim.results import SimulationResult

        return SimulationResult.from_fleet(self)
