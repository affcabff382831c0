"""The stepping interface to the fleet kernel: :class:`Fleet` owns the kernel's arrays, is
the only thing that calls it, grows them when it asks, and is the seam a control plane
uses (advance to a time, change controls or flags, advance again; a change takes effect at
exactly the time it is made).
"""

from __future__ import annotations

import math

import numpy as np
from numpy.lib.array_utils import byte_bounds

from relakit.sim import kernel as K
from relakit.sim.longtable import fleet_columns, node_columns
from relakit.sim.loops import (
    in_path_ok,
    leaves,
    mitigated_allowed,
    mitigated_ok,
    plain_ok,
    run_in_path,
    run_mitigated,
    run_plain,
)
from relakit.sim.memory import expected_requests
from relakit.sim.rng import exponential_py, new_state, uniform_py
from relakit.sim.spec import DataPlane, in_path
from relakit.vocab import BREAKER_STATES, TIERS, Flags

_UNSET = object()
# the global flags' slots in the state scalars (Fleet.set_flags): a change there may
# switch a mechanism on or off, so the next call chooses its loop again
_FLAG_SLOTS = (K.IS_HEDGE_ON, K.IS_DEGRADED_ON, K.IS_SHED_MASK, K.IS_BREAKER)


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


def _tier_mask(tiers) -> int:
    return sum(1 << TIERS.index(t) for t in tiers)


def build_config(sc: DataPlane, record_requests: bool) -> K.Config:
    wl, fl, mit = sc.workload, sc.fleet, sc.mitigations
    cfg_f = np.zeros(K.N_CF)
    cfg_i = np.zeros(K.N_CI, np.int64)
    rate_t = np.asarray(wl.arrival.times_s, dtype=np.float64)
    rate_v = np.asarray(wl.arrival.rates_rps, dtype=np.float64)
    cfg_f[K.CF_RATE_MAX] = rate_v.max()
    cfg_f[K.CF_SAMPLE_DT] = sc.metrics.interval_s
    cfg_f[K.CF_DEADLINE] = np.inf if wl.deadline_ms is None else wl.deadline_ms / 1000.0
    cfg_f[K.CF_WARMUP] = sc.warmup_s
    kind, a, b, c = _service_params(fl.service)
    cfg_i[K.CI_SVC_KIND] = kind
    cfg_f[K.CF_SVC_A], cfg_f[K.CF_SVC_B], cfg_f[K.CF_SVC_C] = a, b, c
    cfg_f[K.CF_HEDGE_DELAY] = mit.hedge.delay_ms / 1000.0
    cfg_f[K.CF_HEDGE_Q] = mit.hedge.delay_quantile or 0.0
    cfg_f[K.CF_BACKOFF] = mit.retries.backoff_ms / 1000.0
    cfg_f[K.CF_BACKOFF_MAX] = mit.retries.backoff_max_ms / 1000.0
    ratio = mit.retries.budget_ratio
    cfg_f[K.CF_BUDGET_RATIO] = np.inf if ratio is None else ratio
    cfg_f[K.CF_BUDGET_WINDOW] = mit.retries.budget_window_s
    cfg_f[K.CF_DEGRADED_FACTOR] = mit.degraded.service_factor
    cfg_f[K.CF_HALF_OPEN_ADMIT] = mit.breaker.half_open_admit
    cfg_f[K.CF_PROBE_RATE] = fl.probe_rate_rps
    cfg_i[K.CI_ROUTING] = K.ROUTINGS.index(fl.routing)
    cfg_i[K.CI_FANOUT] = wl.fanout
    cfg_i[K.CI_RECORD] = int(record_requests)
    cfg_i[K.CI_CONST_RATE] = int(wl.arrival.constant)
    cfg_i[K.CI_QUEUE_LIMIT] = -1 if fl.queue_limit is None else fl.queue_limit
    cfg_i[K.CI_CANCEL] = K.CANCELS.index(mit.hedge.cancel)
    cfg_i[K.CI_MAX_HEDGES] = mit.hedge.max_hedges
    cfg_i[K.CI_MAX_ATTEMPTS] = mit.retries.max_attempts
    cfg_i[K.CI_JITTER] = int(mit.retries.jitter)
    cfg_i[K.CI_RETRY_MASK] = sum(1 << K.OUTCOMES.index(o) for o in mit.retries.retry_on)
    cfg_i[K.CI_KEEP_LISTENING] = int(mit.retries.on_timeout == "keep_listening")
    cfg_i[K.CI_DEGRADED_FANOUT] = mit.degraded.fanout or 0
    cfg_i[K.CI_BREAKER_MASK] = _tier_mask(mit.breaker.reject_tiers)
    cfg_i[K.CI_FAILOVER] = int(sc.controls.isolation == "failover")
    cfg_i[K.CI_ELSEWHERE] = int(sc.controls.throttle_excess == "elsewhere")
    _in_path_config(cfg_f, cfg_i, sc)
    tier_cum = np.cumsum([wl.tiers[t] for t in TIERS])
    tier_cum[-1] = 1.0
    if wl.clients is not None:  # closed clients: population and think per tier (CLIENTS)
        for k, t in enumerate(TIERS):
            cfg_i[K.CI_CLIENTS + k] = wl.clients.population[t]
            tkind, ta, tb, tc = _service_params(wl.clients.think[t])
            cfg_i[K.CI_THINK_KIND + k] = tkind
            cfg_f[K.CF_THINK + 3 * k: K.CF_THINK + 3 * k + 3] = ta, tb, tc
    faults = sc.faults
    # a node's baseline error rate and service scale are fault rows from 0 that never end
    # and no repair clears (fault_i[:, 2] = 1): the scale multiplies the demand drawn, so
    # nothing new is drawn (CRN), and a fault's slowdown multiplies it
    rates = fl.baseline_error_rates or (0.0,) * fl.nodes
    base = [(i, b, s) for i, (b, s) in enumerate(zip(rates, fl.scales, strict=True))
            if b > 0 or s != 1.0]
    fault_f = np.array([[f.start_s, f.end_s, f.error_rate, f.slowdown, f.wrong_rate]
                        for f in faults] + [[0.0, np.inf, b, s, 0.0] for _, b, s in base],
                       dtype=np.float64).reshape(len(faults) + len(base), 5)
    fault_i = np.array([[f.node, int(f.crash), 0] for f in faults]
                       + [[i, 0, 1] for i, _, _ in base], dtype=np.int64).reshape(
        len(faults) + len(base), 3)
    sched_t = np.unique(fault_f[:, :2]) if fault_f.shape[0] else np.zeros(0)
    load = np.asarray(fl.load_errors, dtype=np.float64).reshape(-1, 2)
    phase = np.asarray(sc.metrics.phase_s or (0.0,) * fl.nodes, dtype=np.float64)
    dep_node = np.full(fl.nodes, -1, dtype=np.int64)
    dep_share = np.zeros(fl.nodes)
    for node, dep, share in fl.dependencies:
        dep_node[node], dep_share[node] = dep, share
    return K.Config(cfg_f, cfg_i, tier_cum, rate_t, rate_v, sched_t.astype(np.float64),
                    fault_f, fault_i, np.ascontiguousarray(load[:, 0]),
                    np.ascontiguousarray(load[:, 1]),
                    np.asarray(sc.metrics.latency_buckets_s, dtype=np.float64), phase,
                    dep_node, dep_share)


def _in_path_config(cfg_f, cfg_i, sc: DataPlane) -> None:
    """The in-path mechanisms' model scalars (issue 33); off, the kernel's defaults."""
    mit = sc.mitigations
    ct, cl, cd = mit.client_throttle, mit.concurrency_limit, mit.codel
    cfg_f[K.CF_THROTTLE_K] = ct.k if ct else 0.0  # 0: off
    cfg_f[K.CF_THROTTLE_WIDTH] = (ct.window_s if ct else 1.0) / K.BUDGET_BUCKETS
    cfg_f[K.CF_THROTTLE_COST] = ct.cost_us / 1e6 if ct else 0.0
    cfg_i[K.CI_CL_ALGO] = K.CONCURRENCY_ALGORITHMS.index(cl.algorithm) if cl else K.CL_NONE
    if cl:
        cfg_f[K.CF_CL_MIN], cfg_f[K.CF_CL_MAX] = cl.min, cl.max
        cfg_f[K.CF_CL_BACKOFF] = cl.backoff
        cfg_f[K.CF_CL_LATENCY] = np.inf if cl.latency_ms is None else cl.latency_ms / 1000.0
        cfg_f[K.CF_CL_BUFFER] = cl.buffer
        cfg_i[K.CI_CL_WINDOW], cfg_i[K.CI_CL_PERIOD] = cl.window, cl.period
    cfg_i[K.CI_CODEL] = int(cd is not None)
    if cd:
        cfg_f[K.CF_CODEL_TARGET] = cd.target_ms / 1000.0
        cfg_f[K.CF_CODEL_INTERVAL] = cd.interval_ms / 1000.0
    # a server's decisions, each a cost of service time on every request it serves
    cfg_f[K.CF_JUDGE_COST] = ((cl.cost_us if cl else 0.0) + (cd.cost_us if cd else 0.0)) / 1e6
    cfg_i[K.CI_DISCIPLINE] = K.QUEUE_DISCIPLINES.index(sc.fleet.queue_discipline)


# ---- initial state (scenario key ``initial``) ---------------------------------------
def _heap_push_py(st: K.State, t: float, key: int) -> None:
    """The kernel's own heap push, called from Python (a start state is seeded once): it
    also counts the event by kind, as the loop's choice reads (``IS_EVENTS``)."""
    K.heap_push(st.heap_t, st.heap_k, st.is_, float(t), np.int64(key))


def _event_key_py(ident: int, kind: int, gen: int) -> int:
    return int(K.event_key(np.int64(ident), np.int64(kind), np.int64(gen)))


def seed_initial(cfg: K.Config, st: K.State, queue, pending: int) -> None:
    """Write a start state into a fleet's arrays at t = 0, before the first kernel call:
    ``queue[i]`` one-call requests at node i sent at 0 (the first ``servers`` in service,
    the rest queued, each with its deadline), and ``pending`` whose first attempt failed
    just before 0, each retry due after one backoff. The rows are what the loop's sections
    write, so every specialisation may take over; demands come from ``copy_service``,
    tiers from the mix in proportion (no draw), so arrivals and demands stay in step with
    the same run started idle."""
    cfg_f, cfg_i, isv = cfg.cfg_f, cfg.cfg_i, st.is_
    ji, jf, ci, cf, ui, uf = st.job_i, st.job_f, st.call_i, st.call_f, st.usr_i, st.usr_f
    ni, nf = st.node_i, st.node_f
    total = sum(queue) + pending
    kind, a, b, c = (int(cfg_i[K.CI_SVC_KIND]), float(cfg_f[K.CF_SVC_A]),
                     float(cfg_f[K.CF_SVC_B]), float(cfg_f[K.CF_SVC_C]))
    deadline = float(cfg_f[K.CF_DEADLINE])
    tq_h, tq_c = (int(x) for x in st.tq_n[K.TQ_TIMEOUT])
    cap = st.tq_t.shape[1]
    rows = [(node, True) for node, n in enumerate(queue) for _ in range(n)]
    rows += [(-1, False)] * pending
    for r, (node, sent) in enumerate(rows):
        tier = int(np.searchsorted(cfg.tier_cum, (r + 0.5) / total, side="right"))
        tier = min(tier, len(K.TIERS) - 1)
        if kind == K.S_EXP:
            demand = exponential_py(st.rng, K.RNG_COPY_SERVICE, a) if sent else 0.0
        else:
            demand = float(K.draw_service(st.rng, K.RNG_COPY_SERVICE, kind, a, b, c)) \
                if sent else 0.0
        isv[K.IS_USR_FREE_N] -= 1
        u = int(st.usr_free[isv[K.IS_USR_FREE_N]])
        isv[K.IS_USER_SEQ] += 1
        isv[K.IS_IN_FLIGHT_USERS] += 1
        for col, value in K.LEAN_USER:
            ui[u, col] = value
        ui[u, K.UI_TIER] = tier
        uf[u, K.UF_DEMAND] = demand
        uf[u, K.UF_T_ARRIVAL] = 0.0
        isv[K.IS_CALL_FREE_N] -= 1
        call = int(st.call_free[isv[K.IS_CALL_FREE_N]])
        ci[call, K.CL_USER] = u
        ci[call, K.CL_ATTEMPTS] = 1
        ci[call, K.CL_HEDGES] = 0
        ci[call, K.CL_COPIES] = 1 if sent else 0
        ci[call, K.CL_FIRST] = -1
        ci[call, K.CL_TIER] = tier
        ci[call, K.CL_LAST_NODE] = -1
        cf[call, K.CLF_DEMAND] = demand
        st.fleet_c[K.F_ATTEMPTS] += 1
        if not sent:  # its retry, after the backoff of a first attempt (full jitter)
            backoff = min(float(cfg_f[K.CF_BACKOFF]), float(cfg_f[K.CF_BACKOFF_MAX]))
            if cfg_i[K.CI_JITTER] != 0:
                backoff *= uniform_py(st.rng, K.RNG_JITTER)
            st.fleet_c[K.F_RETRIES] += 1
            _heap_push_py(st, backoff, _event_key_py(call, K.EV_RETRY, ci[call, K.CL_GEN]))
            continue
        isv[K.IS_JOB_FREE_N] -= 1
        j = int(st.job_free[isv[K.IS_JOB_FREE_N]])
        ci[call, K.CL_FIRST] = j
        ji[j, K.JI_CALL] = call
        ji[j, K.JI_GEN] += 1
        ji[j, K.JI_CLIENT] = K.C_WAITING
        ji[j, K.JI_HEDGE] = 0
        ji[j, K.JI_TIER] = tier
        ji[j, K.JI_SIB] = -1
        ji[j, K.JI_NODE] = node
        ji[j, K.JI_DEGRADED] = 0
        jf[j, K.JF_T_NODE] = 0.0
        jf[j, K.JF_DEMAND] = demand
        if deadline < np.inf:
            slot = (tq_h + tq_c) % cap
            st.tq_t[K.TQ_TIMEOUT, slot] = deadline
            st.tq_k[K.TQ_TIMEOUT, slot] = _event_key_py(j, K.EV_TIMEOUT, ji[j, K.JI_GEN])
            tq_c += 1
        if ni[node, K.NI_BUSY] < ni[node, K.NI_SERVERS]:  # into service at once
            ji[j, K.JI_STATE] = K.J_SERVING
            jf[j, K.JF_T_START] = 0.0
            ni[node, K.NI_BUSY] += 1
            _heap_push_py(st, demand * nf[node, K.NF_SLOWDOWN],
                          _event_key_py(j, K.EV_DONE, ji[j, K.JI_GEN]))
        else:  # at the queue's tail
            K.enqueue(ni, ji, node, j)
    st.tq_n[K.TQ_TIMEOUT, 1] = tq_c


def _grow_rows(a: np.ndarray, rows: int, fill=0) -> np.ndarray:
    """``a`` with ``rows`` rows: its own, then rows of ``fill``. Each byte written once
    (``numpy.full`` then a copy wrote the old rows twice)."""
    b = np.empty((rows,) + a.shape[1:], dtype=a.dtype)
    n = a.shape[0]
    b[:n] = a
    b[n:] = fill
    return b


def _grown_pool(ids_free: np.ndarray, n_free: int, old: int, new: int) -> np.ndarray:
    """A free-list stack for a pool grown from old to new slots (new slots on top)."""
    free = np.concatenate([ids_free[:n_free], np.arange(new - 1, old - 1, -1)])
    return _grow_rows(free.astype(np.int64), new)


def _grown_rings(tq_t, tq_k, tq_n) -> dict:
    """Timer rings twice as long, each unrolled so its head is at slot 0."""
    cap = tq_t.shape[1]
    new_t, new_k = np.zeros((K.N_TQ, 2 * cap)), np.zeros((K.N_TQ, 2 * cap), np.int64)
    new_n = tq_n.copy()
    for q in range(K.N_TQ):
        head, count = tq_n[q]
        order = (head + np.arange(count)) % cap
        new_t[q, :count] = tq_t[q, order]
        new_k[q, :count] = tq_k[q, order]
        new_n[q, 0] = 0
    return {"tq_t": new_t, "tq_k": new_k, "tq_n": new_n}


class Fleet:
    """A fleet in mid-run: ``advance(t)``, change controls, ``advance`` again."""

    specialise = True  # False: the general kernel, every mechanism compiled in (tests)

    def __init__(self, scenario: DataPlane, seed: int | None = None, record_requests: bool = True):
        self.scenario = scenario
        self.seed = scenario.seed if seed is None else int(seed)
        self.cfg = build_config(scenario, record_requests)
        self.in_path = in_path(scenario)  # an in-path mechanism: its outcomes and series
        n = scenario.fleet.nodes
        fanout = scenario.workload.fanout
        clients = scenario.workload.clients
        n_clients = 0 if clients is None else clients.total
        initial = getattr(scenario, "initial", None)
        seeded = 0 if initial is None else sum(initial.queue) + initial.pending_retries
        jobs = max(64, 4 * sum(scenario.fleet.servers) + 8 * fanout, 2 * seeded)
        users = max(64, jobs)
        heap = 2 * jobs + users + n_clients  # every closed client thinking: a heap event each
        n_buckets = len(scenario.metrics.latency_buckets_s) + 1
        node_i = np.zeros((n, K.N_NI), np.int64)
        node_i[:, K.NI_SERVERS] = scenario.fleet.servers
        node_i[:, K.NI_QHEAD] = -1
        node_i[:, K.NI_QTAIL] = -1
        node_i[:, K.NI_ROUTABLE] = 1
        node_i[:, K.NI_INTAKE_LIMIT] = -1
        node_i[:, K.NI_STAMP] = -1
        node_f = np.zeros((n, K.N_NF))
        node_f[:, K.NF_WEIGHT] = scenario.fleet.weights
        # the node's service scale; the baseline rows set it from t = 0 (build_config)
        node_f[:, K.NF_SLOWDOWN] = scenario.fleet.scales
        node_f[:, K.NF_TOKEN_RATE] = np.inf
        node_f[:, K.NF_REPAIRED_AT] = -np.inf
        cl = scenario.mitigations.concurrency_limit  # in-path: each node's limit at t = 0
        node_f[:, K.NF_CL_LIMIT] = cl.initial if cl else 0.0
        node_f[:, K.NF_CL_MIN_RTT] = np.inf
        node_f[:, K.NF_CL_PERIOD_MIN] = np.inf
        job_i = np.zeros((jobs, K.N_JI), np.int64)
        job_i[:, K.JI_SIB] = -1
        usr_i = np.zeros((users, K.N_UI), np.int64)
        usr_i[:, K.UI_CLIENT] = -1  # no closed client (every loop then holds the same rows)
        self.st = K.State(
            fs=np.zeros(K.N_FS), is_=np.zeros(K.N_IS, np.int64),
            rng=new_state(self.seed, K.N_STREAMS),  # one row per random stream
            node_i=node_i, node_f=node_f, node_c=np.zeros((n, K.N_NC), np.int64),
            cnt=np.zeros((n, len(K.TIERS), len(K.OUTCOMES)), np.int64),
            lat_b=np.zeros((n, n_buckets), np.int64),
            fleet_c=np.zeros(K.N_FLEET_COUNTERS, np.int64),
            budget=np.zeros((K.N_BUDGET_ROWS, K.BUDGET_BUCKETS), np.int64),
            job_i=job_i, job_f=np.zeros((jobs, K.N_JF)),
            job_free=np.arange(jobs - 1, -1, -1, dtype=np.int64),
            usr_i=usr_i, usr_f=np.zeros((users, K.N_UF)),
            usr_free=np.arange(users - 1, -1, -1, dtype=np.int64),
            call_i=np.zeros((jobs, K.N_CL), np.int64), call_f=np.zeros((jobs, K.N_CLF)),
            call_free=np.arange(jobs - 1, -1, -1, dtype=np.int64),
            heap_t=np.zeros(heap), heap_k=np.zeros(heap, np.int64),
            tq_t=np.zeros((K.N_TQ, heap)), tq_k=np.zeros((K.N_TQ, heap), np.int64),
            tq_n=np.zeros((K.N_TQ, 2), np.int64),  # (head, count) per ring
            scratch=np.zeros(n + 3 * fanout + 8, np.int64),
            send=np.zeros((fanout + 2, 4), np.int64),
            pend_t=np.zeros(n + 4 * fanout + 16), pend_k=np.zeros(n + 4 * fanout + 16, np.int64),
            demand=np.zeros(fanout),  # one arrival's first-attempt demands, call by call
        )
        # the user and call pools' and the rings' sizes had they doubled with the job
        # pool at every growth, as they once did (_grow_pools)
        self._sizes = (users, jobs, heap)
        isv = self.st.is_
        isv[K.IS_JOB_FREE_N] = jobs
        isv[K.IS_USR_FREE_N] = users
        isv[K.IS_CALL_FREE_N] = jobs
        self.st.fs[K.FS_HEDGE_DELAY] = self.cfg.cfg_f[K.CF_HEDGE_DELAY]
        samples = int(scenario.duration_s / scenario.metrics.interval_s) + 2
        records = int(expected_requests(scenario) * 1.05) + 1024 if record_requests else 0
        self.out = K.Output(
            metrics=np.zeros((samples, n, K.M_BUCKETS + n_buckets)),
            sample_t=np.full((samples, n), np.nan),
            fleet=np.zeros((samples, K.N_FLEET)), fleet_t=np.zeros(samples),
            rec_f=np.zeros((records, 3)), rec_i=np.zeros((records, 7), np.int32),
            hist=np.zeros((len(K.TIERS), 2, K.HIST_BINS), np.int64),
            tier_cnt=np.zeros((len(K.TIERS), len(K.OUTCOMES)), np.int64),
            tier_ext=np.zeros((len(K.TIERS), K.N_TX), np.int64),
            lat_sum=np.zeros((len(K.TIERS), 2)),
        )
        self._choice = None  # the loop the next call runs (_kernel), None: choose again
        self._after_in_path = False  # the last call ran the in-path loop (loops.in_path_ok)
        self._owed = (False, False)  # marks a call cut short for room left to the next (_mark)
        self.st.fs[K.FS_MARK] = self.st.fs[K.FS_MARK_GENERAL] = -np.inf  # (no row is old)
        self.set_flags(scenario.controls.flags)
        # a population schedule (workload.clients): the tiers' N at 0 now, the rest in advance
        self._steps = [(at, [n[t] for t in K.TIERS]) for at, n in
                       (clients.steps if clients is not None and clients.steps else ())]
        if self._steps:
            self.st.is_[K.IS_CUT:K.IS_CUT + len(K.TIERS)] = (
                self.cfg.cfg_i[K.CI_CLIENTS:K.CI_CLIENTS + len(K.TIERS)] - self._steps.pop(0)[1])
        K.start(self.cfg, self.st)
        if seeded:
            seed_initial(self.cfg, self.st, initial.queue, initial.pending_retries)
        self._check_disjoint()

    # ---- time -------------------------------------------------------------------
    @property
    def now(self) -> float:
        return float(self.st.fs[K.FS_NOW])

    def advance(self, t_s: float) -> Fleet:
        """Run every event up to and including time ``t_s`` (seconds)."""
        if t_s < self.now:
            raise ValueError(f"cannot advance to {t_s} s: the fleet is already at {self.now} s")
        while self._steps and self._steps[0][0] <= t_s:  # a population step, in Python
            at, live = self._steps.pop(0)
            self._advance(at)
            while (self.st.heap_t.shape[0] - self.st.is_[K.IS_HEAP_N]
                   < self.cfg.cfg_i[K.CI_CLIENTS:K.CI_CLIENTS + len(K.TIERS)].sum()):
                self._grow(K.GROW_POOLS)
            K.population_step(self.cfg, self.st, at, live)
            self._rechoose()
        return self._advance(t_s)

    def _advance(self, t_s: float) -> Fleet:
        while True:
            kernel, t_stop, change = self._kernel(float(t_s))
            left = self._leaves()
            self.st.is_[K.IS_DRAIN] = self._drain(kernel, left)
            status = kernel(self.cfg, self.st, self.out, t_stop)
            self._after_in_path = kernel is run_in_path
            self._mark(left, status, t_stop)
            if status == K.SETTLED:
                self._choice = None
            elif status != K.DONE:
                self._grow(status)
            elif change:  # the fault-schedule change due next, in Python (see _kernel),
                # after the room the general kernel asks for first (a crash may end every
                # job at once), so that pools grow where they would have
                while self.st.heap_t.shape[0] - self.st.is_[K.IS_HEAP_N] < self.st.job_i.shape[0]:
                    self._grow(K.GROW_POOLS)
                K.schedule_step(self.cfg, self.st)
                self._rechoose()
            elif t_stop >= t_s:
                return self

    def _leaves(self) -> tuple[bool, bool]:
        """What the next call may leave for the plain and the lean loops (``loops.leaves``),
        or what a call cut short by growth (:meth:`_mark`) might have: O(nodes)."""
        plain, general = leaves(self.cfg, self.st)
        return plain or self._owed[0], general or self._owed[1]

    def _drain(self, kernel, left: tuple[bool, bool]) -> int:
        """``kernel.IS_DRAIN`` for the next call: 1 (2) when the plain (lean mitigated)
        loop would take it but for rows still live from when a mechanism ran (IS_OLD,
        IS_OLD_GENERAL), so that the call stops (``kernel.SETTLED``) once they are free
        and the leaner loop takes the rest of the stretch."""
        isv = self.st.is_
        if not self.specialise or kernel is run_plain:
            return 0
        if not left[0] and isv[K.IS_OLD] > 0:
            return 1
        return 2 if (kernel is K.run and isv[K.IS_OLD_GENERAL] > 0 and not left[1]
                     and mitigated_ok(self.cfg, self.st, rows=False)) else 0

    def _mark(self, left: tuple[bool, bool], status: int, t_stop: float) -> None:
        """After a call that may have left something (``left``, :meth:`_leaves`): every row
        live now was made by ``t_stop`` (the loop ran every event up to it) and counts as
        old (``kernel.IS_OLD``) until the loop frees it. A call cut short for room marks
        nothing: its stretch goes on in the next call, which owes its marks."""
        if status != K.DONE:
            self._owed = left
            return
        self._owed = (False, False)
        st = self.st
        isv = st.is_
        live = (st.job_i.shape[0] - isv[K.IS_JOB_FREE_N]) + (st.usr_i.shape[0]
                                                              - isv[K.IS_USR_FREE_N])
        for leaves_it, mark, old in zip(left, (K.FS_MARK, K.FS_MARK_GENERAL),
                                        (K.IS_OLD, K.IS_OLD_GENERAL), strict=True):
            if leaves_it:
                st.fs[mark] = t_stop
                isv[old] = live

    def _kernel(self, t_s: float):
        """(kernel, time to run it to, whether a fault-schedule change is then due) for the
        next stretch (:meth:`_choose`). A schedule change in a lean mitigated stretch (its
        faults crash nothing) splits it: the loop runs to the double before the change (the
        general kernel takes a change before any event at its time), Python applies it
        (``K.schedule_step``) and the next stretch is chosen after it."""
        if not self.specialise:
            return K.run, t_s, False
        kernel = self._choice
        if kernel is None:
            kernel, keep = self._choose()
            self._choice = kernel if keep else None
        if kernel is run_mitigated:
            t_sched = float(self.st.fs[K.FS_NEXT_SCHED])
            if t_sched > t_s:
                return run_mitigated, t_s, False
            self._choice = None  # the change may switch a mechanism on or off
            return run_mitigated, float(np.nextafter(t_sched, -np.inf)), True
        return kernel, t_s, False

    def _choose(self):
        """(kernel, whether to keep it): the leanest loop the state allows (``relakit.sim.loops``:
        O(nodes)), kept until :meth:`_rechoose` (Python changed a flag, a control or a fault)
        unless a leaner one was refused only for rows still live, which drain by themselves.
        Choosing before every call cost rela-ramp 12.3 s of 70.1 s (docs/performance.md)."""
        cfg, st = self.cfg, self.st
        features = K.features_of(cfg, st)
        if plain_ok(cfg, st, features):
            return run_plain, True
        if in_path_ok(cfg, st, features, self._after_in_path):
            return run_in_path, True
        settled = st.fs[K.FS_NEXT_SCHED] == np.inf
        if mitigated_ok(cfg, st, features):  # (a schedule change ends its stretch: _kernel)
            return run_mitigated, bool(features) or not settled
        # the general kernel ends a failover itself, and the schedule in its loop
        return K.run, (bool(features) and not mitigated_allowed(cfg, st, features)
                          and not st.node_i[:, K.NI_FAILOVER].any())

    def _rechoose(self) -> None:
        """Python changed what the loops may meet: the next call chooses again."""
        self._choice = None

    def _grow(self, status: int) -> None:
        st, out = self.st, self.out
        if status == K.GROW_RECORDS:
            rows = 2 * out.rec_f.shape[0] + 1024
            self.out = out._replace(rec_f=_grow_rows(out.rec_f, rows),
                                    rec_i=_grow_rows(out.rec_i, rows))
        elif status == K.GROW_SAMPLES:
            rows = 2 * out.fleet_t.shape[0] + 16
            self.out = out._replace(metrics=_grow_rows(out.metrics, rows),
                                    sample_t=_grow_rows(out.sample_t, rows, np.nan),
                                    fleet=_grow_rows(out.fleet, rows),
                                    fleet_t=_grow_rows(out.fleet_t, rows))
        elif status == K.GROW_POOLS:
            self.st = self._grow_pools(st)
        else:  # pragma: no cover - a kernel status this wrapper does not know
            raise RuntimeError(f"unknown kernel status {status}")
        self._check_disjoint()

    def _check_disjoint(self) -> None:
        """Raise unless the kernel's arrays are pairwise disjoint in memory: the lean loops
        are compiled with ``noalias``, so shared memory would give wrong numbers silently.
        Checked where arrays are made, not per kernel call."""
        spans = sorted(byte_bounds(a) for part in (self.cfg, self.st, self.out)
                       for a in part if isinstance(a, np.ndarray) and a.size)
        reach = 0
        for low, high in spans:
            if low < reach:
                raise RuntimeError("relakit: kernel arrays share memory (a fleet builds each "
                                   "on its own; the plain loops rely on it)")
            reach = max(reach, high)

    def _grow_pools(self, st: K.State) -> K.State:
        """Double what ran short; the user and call pools and the timer rings only when
        they did. The job pool and the heap grow where they always grew (all doubled when
        any pool was short): a crash ends its node's jobs in row order, so where new job
        rows are numbered from decides the run. The other pools' rows decide nothing
        (doubled, never past the size they would have had: ``self._sizes``). Growing
        everything cost rela-ramp 4.0 s of 44.7 s (docs/performance.md)."""
        isv, ci = st.is_, self.cfg.cfg_i
        room = ci[K.CI_FANOUT] + ci[K.CI_MAX_HEDGES] + 4  # (the loops' room checks)
        users, calls, ring = st.usr_i.shape[0], st.call_i.shape[0], st.tq_t.shape[1]
        v_users, v_calls, v_ring = self._sizes
        ring_n = int(st.tq_n[:, 1].max())
        short = (isv[K.IS_USR_FREE_N] < 2, isv[K.IS_CALL_FREE_N] < room, ring - ring_n < room)
        v_short = (isv[K.IS_USR_FREE_N] + v_users - users < 2,
                   isv[K.IS_CALL_FREE_N] + v_calls - calls < room, v_ring - ring_n < room)
        # the kernel stopped for a pool: as before (all doubled) unless one of these three
        # alone may have stopped it (if the heap too, the next call stops again at once)
        before = any(v_short) or isv[K.IS_JOB_FREE_N] < room or not any(short)
        isv = isv.copy()
        grown = {"is_": isv}
        if before:
            jobs, heap = st.job_i.shape[0], st.heap_t.shape[0]
            job_i = _grow_rows(st.job_i, 2 * jobs)
            job_i[jobs:, K.JI_SIB] = -1
            grown.update(job_i=job_i, job_f=_grow_rows(st.job_f, 2 * jobs),
                         job_free=_grown_pool(st.job_free, isv[K.IS_JOB_FREE_N], jobs, 2 * jobs),
                         heap_t=_grow_rows(st.heap_t, 2 * heap),
                         heap_k=_grow_rows(st.heap_k, 2 * heap))
            isv[K.IS_JOB_FREE_N] += jobs
            self._sizes = (2 * v_users, 2 * v_calls, 2 * v_ring)
        for ran_short, pool, free_n, n in ((short[0], "usr", K.IS_USR_FREE_N, users),
                                           (short[1], "call", K.IS_CALL_FREE_N, calls)):
            if ran_short:  # a pool's int and float rows and its free list, doubled
                grown.update({f"{pool}_i": _grow_rows(getattr(st, f"{pool}_i"), 2 * n),
                              f"{pool}_f": _grow_rows(getattr(st, f"{pool}_f"), 2 * n),
                              f"{pool}_free": _grown_pool(getattr(st, f"{pool}_free"),
                                                          isv[free_n], n, 2 * n)})
                isv[free_n] += n
                if pool == "usr":
                    grown["usr_i"][n:, K.UI_CLIENT] = -1  # (as at the start)
        if short[2]:
            grown.update(_grown_rings(st.tq_t, st.tq_k, st.tq_n))
        return st._replace(**grown)

    # ---- controls ---------------------------------------------------------------------
    def set_node_controls(self, node, *, routable: bool | None = None,
                          weight: float | None = None, intake_limit=_UNSET,
                          intake_rate=_UNSET, intake_burst: float | None = None) -> None:
        """Per-node controls from now on.

        ``routable=False`` isolates: nothing new is routed there; its queued work
        finishes there or fails over (the scenario's ``controls.isolation``).
        ``intake_limit`` caps requests in the node (queued + in service);
        ``intake_rate`` (req/s, with ``intake_burst``) is a token bucket. Either
        throttles: excess is rejected or goes elsewhere (``controls.throttle_excess``).
        ``None`` removes a cap.
        """
        nodes = self._nodes(node)
        ni, nf = self.st.node_i, self.st.node_f
        before = self._controls_key()
        if routable is not None:
            was = ni[nodes, K.NI_ROUTABLE].copy()
            ni[nodes, K.NI_ROUTABLE] = int(bool(routable))
            if not routable and self.cfg.cfg_i[K.CI_FAILOVER]:
                ni[nodes[was != 0], K.NI_FAILOVER] = 1
        if weight is not None:
            if not weight >= 0:
                raise ValueError(f"weight must be >= 0, got {weight!r}")
            nf[nodes, K.NF_WEIGHT] = weight
        if intake_limit is not _UNSET:
            if intake_limit is not None and intake_limit < 0:
                raise ValueError(f"intake_limit must be >= 0 or None, got {intake_limit!r}")
            ni[nodes, K.NI_INTAKE_LIMIT] = -1 if intake_limit is None else intake_limit
        if intake_rate is not _UNSET:
            if intake_rate is not None and not intake_rate > 0:
                raise ValueError(f"intake_rate must be > 0 or None, got {intake_rate!r}")
            rate = np.inf if intake_rate is None else float(intake_rate)
            burst = float(intake_burst) if intake_burst is not None else max(1.0, rate / 10)
            nf[nodes, K.NF_TOKEN_RATE] = rate
            nf[nodes, K.NF_TOKEN_BURST] = burst
            nf[nodes, K.NF_TOKENS] = burst
            nf[nodes, K.NF_TOKEN_T] = self.now
        if self._controls_key() != before:
            self._rechoose()

    def _nodes(self, node) -> np.ndarray:
        n = self.scenario.fleet.nodes
        nodes = np.atleast_1d(node)
        if nodes.size and (nodes.min() < 0 or nodes.max() >= n):
            raise ValueError(f"node must be in 0..{n - 1}, got {node!r}")
        return nodes

    def _controls_key(self) -> bytes:
        """The node controls the choice of loop reads (O(nodes))."""
        ni, nf = self.st.node_i, self.st.node_f
        return (ni[:, [K.NI_ROUTABLE, K.NI_INTAKE_LIMIT, K.NI_FAILOVER]].tobytes()
                + nf[:, [K.NF_WEIGHT, K.NF_TOKEN_RATE]].tobytes())

    def repair(self, node) -> None:
        """Mend the node now: the faults it has at this moment are cleared (a crashed node
        comes back, empty); faults scheduled to start later still happen."""
        nodes = self._nodes(node)
        self.st.node_f[nodes, K.NF_REPAIRED_AT] = self.now
        cfg, st = self.cfg, self.st
        K.apply_faults(cfg.fault_f, cfg.fault_i, st.is_, st.node_i, st.node_f, st.job_i,
                       st.heap_t, st.heap_k, self.now)
        self._rechoose()

    def faulty(self) -> np.ndarray:
        """Ground truth, for tests and notebooks (a control plane never sees it). A node's
        baseline error rate (``fleet.baseline_error_rate``) and its service scale
        (``fleet.service_scale``) are how it is, not faults."""
        nf, ni = self.st.node_f, self.st.node_i
        base = np.asarray(self.scenario.fleet.baseline_error_rates or (0.0,) * len(nf))
        scale = np.asarray(self.scenario.fleet.scales)
        return (nf[:, K.NF_ERR_RATE] > base + 1e-12) | (nf[:, K.NF_WRONG_RATE] > 0) | (
            nf[:, K.NF_SLOWDOWN] != scale) | (ni[:, K.NI_CRASHED] != 0)

    def set_flags(self, flags: Flags) -> None:
        """Global flags from now on (RelA's flags, generalised): a whole
        :class:`~relakit.vocab.Flags` (to change some, ``flag_state().updated(...)``).

        ``shed_tiers``: tiers dropped at admission (gold never is); ``shed_bronze``
        is RelA's flag for the bronze tier alone. ``breaker``: closed, half_open or
        open (rejecting the scenario's ``mitigations.breaker.reject_tiers``).
        """
        if not isinstance(flags, Flags):
            raise TypeError(f"Fleet.set_flags takes a relakit.vocab.Flags, got a "
                            f"{type(flags).__name__}: {flags!r}")
        new = flags
        isv = self.st.is_
        before = isv[list(_FLAG_SLOTS)].copy()
        isv[K.IS_HEDGE_ON] = K.ALL_TIERS if new.hedge_enabled else 0
        isv[K.IS_DEGRADED_ON] = K.ALL_TIERS if new.degraded_mode else 0
        isv[K.IS_SHED_MASK] = _tier_mask(new.shed_tiers)
        isv[K.IS_BREAKER] = BREAKER_STATES.index(new.breaker)
        self._set_local(new)
        if (isv[list(_FLAG_SLOTS)] != before).any():
            self._rechoose()

    def _set_local(self, flags: Flags) -> None:
        """The in-path mechanisms' parameters a policy sets (issue 33, part 2:
        ``throttle_k``, ``concurrency_max``; None: the scenario's own). A lowered ceiling
        holds at once: each node's limit is clamped to it."""
        mit = self.scenario.mitigations
        for name, mech in (("throttle_k", mit.client_throttle),
                           ("concurrency_max", mit.concurrency_limit)):
            if getattr(flags, name) is not None and mech is None:
                key = "client_throttle" if name == "throttle_k" else "concurrency_limit"
                raise ValueError(f"flag {name} sets mitigations.{key}, which this scenario "
                                 "does not have")
        cf = self.cfg.cfg_f
        ct, cl = mit.client_throttle, mit.concurrency_limit
        if ct is not None:
            cf[K.CF_THROTTLE_K] = ct.k if flags.throttle_k is None else flags.throttle_k
        if cl is not None:
            ceiling = cl.max if flags.concurrency_max is None else flags.concurrency_max
            cf[K.CF_CL_MAX] = max(ceiling, cl.min)
            nf = self.st.node_f
            nf[:, K.NF_CL_LIMIT] = np.minimum(nf[:, K.NF_CL_LIMIT], cf[K.CF_CL_MAX])
        self._local = (flags.throttle_k, flags.concurrency_max)

    def set_tier_flags(self, hedge_tiers=None, degraded_tiers=None) -> None:
        """Hedging and degraded mode for some tiers only, from now on (None: left as is);
        a tier canary's data plane. :meth:`set_flags` sets them for every tier again.
        The kernel reads one bit per tier where a tier's request is hedged or served
        degraded, so a flag on for every tier runs exactly as the global flag did."""
        isv = self.st.is_
        if hedge_tiers is not None:
            isv[K.IS_HEDGE_ON] = _tier_mask(hedge_tiers)
        if degraded_tiers is not None:
            isv[K.IS_DEGRADED_ON] = _tier_mask(degraded_tiers)
        self._rechoose()

    def tier_flags(self) -> dict:
        """Per flag, the tiers it is on for now: hedge_enabled, degraded_mode, shed."""
        isv = self.st.is_
        return {name: tuple(t for i, t in enumerate(TIERS) if int(isv[col]) >> i & 1)
                for name, col in (("hedge_enabled", K.IS_HEDGE_ON),
                                  ("degraded_mode", K.IS_DEGRADED_ON),
                                  ("shed", K.IS_SHED_MASK))}

    def flag_state(self) -> Flags:
        """The flags in force now, typed."""
        isv = self.st.is_
        mask = int(isv[K.IS_SHED_MASK])
        return Flags(hedge_enabled=bool(isv[K.IS_HEDGE_ON]),
                     degraded_mode=bool(isv[K.IS_DEGRADED_ON]),
                     shed_tiers=tuple(t for i, t in enumerate(TIERS) if mask >> i & 1),
                     breaker=BREAKER_STATES[int(isv[K.IS_BREAKER])],
                     throttle_k=self._local[0], concurrency_max=self._local[1])

    def flags(self) -> dict:
        """The flags in force now, as a mapping (:meth:`flag_state` typed)."""
        return self.flag_state().as_dict()

    # ---- what a scraper sees ------------------------------------------------------
    def sample_series(self) -> tuple[list[tuple], list[tuple]]:
        """The series of each node's samples and of the fleet's, in :meth:`samples`'
        column order: (name, tier, outcome, le) each."""
        self._sample_columns()
        return self._series

    def samples(self, since: float) -> list[tuple[int, np.ndarray, np.ndarray]]:
        """What the scrape targets hold from ``since`` on (plain arrays, no kernel codes):
        per node (0, 1, ...) and then the fleet-wide client (-1), the sample times and a
        (samples, series) value matrix in :meth:`sample_series`' order. The times are
        views, valid until the next :meth:`advance`."""
        node_idx, fleet_idx = self._sample_columns()
        out, st = self.out, self.st
        found = []
        for node in range(self.scenario.fleet.nodes):
            n = int(st.node_i[node, K.NI_NSAMPLE])
            times = out.sample_t[:n, node]
            lo = int(np.searchsorted(times, since))
            found.append((node, times[lo:], out.metrics[lo:n, node][:, node_idx]))
        n = int(st.is_[K.IS_NSAMPLE])
        lo = int(np.searchsorted(out.fleet_t[:n], since))
        found.append((-1, out.fleet_t[lo:n], out.fleet[lo:n][:, fleet_idx]))
        return found

    def _sample_columns(self):
        if getattr(self, "_sample_idx", None) is None:
            ncols = node_columns(self.scenario.metrics.latency_buckets_s, self.in_path)
            fcols = fleet_columns(self.in_path)
            self._sample_idx = (np.array([c[0] for c in ncols]),
                                np.array([c[0] for c in fcols]))
            self._series = ([c[1:] for c in ncols], [c[1:] for c in fcols])
        return self._sample_idx

    def node_controls(self) -> dict:
        ni, nf = self.st.node_i, self.st.node_f
        return {
            "routable": ni[:, K.NI_ROUTABLE].astype(bool).copy(),
            "weight": nf[:, K.NF_WEIGHT].copy(),
            "intake_limit": ni[:, K.NI_INTAKE_LIMIT].copy(),  # -1: no cap
            "intake_rate": nf[:, K.NF_TOKEN_RATE].copy(),
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
