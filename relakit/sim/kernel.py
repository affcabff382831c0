"""The fleet's event loop, in numba.

One mechanism, SimPy-style: a binary heap of timed events plus three
"next time" scalars (next arrival, next metrics sample, next fault-schedule
change). Everything a request is lives in preallocated arrays (a pool of
user requests, a pool of sub-requests called *jobs*, FIFO queues as linked
lists through the job pool), so the loop never touches a Python object.

The loop stops at a requested time (``advance``), which is the seam a control
plane uses: between two calls, Python may change per-node controls and global
flags in the state arrays; they take effect at exactly that time. When a pool
or an output buffer is full the loop returns a status *between* events; the
Python wrapper grows the arrays and calls again, so the run is unchanged.

Arrays are grouped in three named tuples: ``cfg`` (read-only model), ``st``
(mutable state) and ``out`` (outputs). Field names and column indices are the
constants below; :mod:`relakit.sim.fleet` builds and grows them.
"""

from __future__ import annotations

import math
from collections import namedtuple

import numpy as np
from numba import njit

from relakit.sim.rng import exponential, normal, uniform

# ---- codes shared with the Python side -------------------------------------
TIERS = ("gold", "silver", "bronze")
OUTCOMES = ("ok", "error", "timeout", "dropped")
OK, ERROR, TIMEOUT, DROPPED = 0, 1, 2, 3
GOLD = 0

SERVICE_KINDS = ("exponential", "deterministic", "lognormal", "pareto", "bimodal")
S_EXP, S_DET, S_LOGNORMAL, S_PARETO, S_BIMODAL = 0, 1, 2, 3, 4

ROUTINGS = ("random", "round_robin", "jsq", "p2c")
R_RANDOM, R_RR, R_JSQ, R_P2C = 0, 1, 2, 3

# status returned by advance
DONE, GROW_POOLS, GROW_RECORDS, GROW_SAMPLES = 0, 1, 2, 3

# heap key = generation << 32 | id << 2 | kind (a stale generation means: ignore)
EV_DONE, EV_DEADLINE = 0, 1

# cfg_f: model scalars (float)
CF_RATE_MAX, CF_SAMPLE_DT, CF_DEADLINE, CF_WARMUP = 0, 1, 2, 3
CF_SVC_A, CF_SVC_B, CF_SVC_C = 4, 5, 6
N_CF = 7
# cfg_i: model scalars (int)
CI_SVC_KIND, CI_ROUTING, CI_FANOUT, CI_RECORD, CI_CONST_RATE, CI_QUEUE_LIMIT = 0, 1, 2, 3, 4, 5
N_CI = 6

# st.fs: state scalars (float)
FS_NOW, FS_NEXT_ARRIVAL, FS_NEXT_SAMPLE, FS_NEXT_SCHED, FS_WRR_TOTAL = 0, 1, 2, 3, 4
N_FS = 5
# st.is_: state scalars (int)
IS_HEAP_N, IS_JOB_FREE_N, IS_USR_FREE_N, IS_NREC, IS_NSAMPLE = 0, 1, 2, 3, 4
IS_RR, IS_SCHED_POS, IS_USER_SEQ, IS_N_ELIGIBLE, IS_EQUAL_WEIGHTS = 5, 6, 7, 8, 9
IS_SHED_MASK, IS_IN_FLIGHT_USERS = 10, 11
N_IS = 12

# st.node_i columns
NI_SERVERS, NI_BUSY, NI_QLEN, NI_QHEAD, NI_QTAIL, NI_ROUTABLE = 0, 1, 2, 3, 4, 5
NI_INTAKE_LIMIT, NI_CRASHED, NI_STAMP = 6, 7, 8
N_NI = 9
# st.node_f columns
NF_WEIGHT, NF_ERR_RATE, NF_SLOWDOWN, NF_BUSY_AREA, NF_LAST_T, NF_WRR_CUR, NF_CUM = (
    0, 1, 2, 3, 4, 5, 6)
N_NF = 7

# st.job_i / job_f columns
JI_USER, JI_NODE, JI_NEXT, JI_PREV, JI_GEN, JI_STATE, JI_OUTCOME = 0, 1, 2, 3, 4, 5, 6
N_JI = 7
# a job ENDING has its outcome decided (rejected, or its node crashed) and its DONE
# event due now; a SERVING job's outcome is drawn when its DONE event fires
J_FREE, J_QUEUED, J_SERVING, J_ENDING = 0, 1, 2, 3
JF_T_NODE, JF_T_START = 0, 1
N_JF = 2

# st.usr_i / usr_f columns
UI_TIER, UI_REMAINING, UI_WORST, UI_CRIT, UI_FANOUT, UI_GEN, UI_FINAL = 0, 1, 2, 3, 4, 5, 6
N_UI = 7
UF_T_ARRIVAL = 0
N_UF = 1

# per-node metric columns in out.metrics[sample, node, :]
N_COUNTERS = len(TIERS) * len(OUTCOMES)  # requests_total{tier, outcome}
M_BUSY, M_QLEN, M_IN_FLIGHT, M_BUSY_SECONDS = (
    N_COUNTERS, N_COUNTERS + 1, N_COUNTERS + 2, N_COUNTERS + 3)
N_METRICS = N_COUNTERS + 4

# latency histogram: log-spaced bins over [1e-3 ms, 1e7 ms]
HIST_LOG10_MIN, HIST_BINS_PER_DECADE, HIST_DECADES = -3.0, 200, 10
HIST_BINS = HIST_BINS_PER_DECADE * HIST_DECADES

Config = namedtuple("Config", "cfg_f cfg_i tier_cum rate_t rate_v sched_t fault_f fault_i")
State = namedtuple(
    "State",
    "fs is_ rng node_i node_f cnt job_i job_f job_free usr_i usr_f usr_free heap_t heap_k"
    " scratch",
)
Output = namedtuple("Output", "metrics sample_t rec_f rec_i hist tier_cnt lat_sum")


GEN_MASK = (1 << 31) - 1


# ---- heap -------------------------------------------------------------------
@njit(cache=True, error_model="numpy")
def heap_push(ht, hk, isv, t, key):
    """Push for the rarer events (deadlines, rejections, crashes); the loop has its own."""
    i = isv[IS_HEAP_N]
    isv[IS_HEAP_N] = i + 1
    while i > 0:
        parent = (i - 1) >> 1
        if ht[parent] <= t:
            break
        ht[i] = ht[parent]
        hk[i] = hk[parent]
        i = parent
    ht[i] = t
    hk[i] = key


@njit(cache=True, error_model="numpy")
def event_key(ident, kind, gen):
    return ((gen & GEN_MASK) << 32) | (ident << 2) | kind


# ---- model pieces ------------------------------------------------------------
@njit(cache=True, error_model="numpy")
def rate_at(t, rate_t, rate_v):
    """Piecewise-linear rate; a repeated time is a step (the later value wins)."""
    n = rate_t.shape[0]
    if t < rate_t[0]:
        return rate_v[0]
    if t >= rate_t[n - 1]:
        return rate_v[n - 1]
    i = np.searchsorted(rate_t, t, side="right") - 1
    t0 = rate_t[i]
    t1 = rate_t[i + 1]
    if t1 <= t0:
        return rate_v[i + 1]
    return rate_v[i] + (rate_v[i + 1] - rate_v[i]) * (t - t0) / (t1 - t0)


@njit(cache=True, error_model="numpy")
def next_arrival(rng, rmax, const, rate_t, rate_v, t):
    """Next accepted arrival after t: Poisson at the peak rate, thinned."""
    if rmax <= 0.0:
        return np.inf
    last = rate_t.shape[0] - 1
    while True:
        t += exponential(rng, 1.0 / rmax)
        if const:
            return t
        if t >= rate_t[last] and rate_v[last] <= 0.0:
            return np.inf
        if uniform(rng) * rmax < rate_at(t, rate_t, rate_v):
            return t


@njit(cache=True, error_model="numpy")
def draw_service(rng, kind, a, b, c):
    """Service time in seconds; a, b, c are the kind's prepared parameters."""
    if kind == S_EXP:
        return exponential(rng, a)
    if kind == S_DET:
        return a
    if kind == S_LOGNORMAL:
        return math.exp(a + b * normal(rng))
    if kind == S_PARETO:
        return a * (1.0 - uniform(rng)) ** (-1.0 / b)
    # bimodal: a = fast, b = slow, c = slow fraction
    if uniform(rng) < c:
        return b
    return a


@njit(cache=True, error_model="numpy")
def hist_bin(latency_ms):
    if latency_ms <= 0.0:
        return 0
    x = (math.log10(latency_ms) - HIST_LOG10_MIN) * HIST_BINS_PER_DECADE
    if x < 0.0:
        return 0
    if x >= HIST_BINS:
        return HIST_BINS - 1
    return int(x)


@njit(cache=True, error_model="numpy")
def touch_busy(node_i, node_f, node, t):
    """Accumulate busy-server seconds up to t before the busy count changes."""
    node_f[node, NF_BUSY_AREA] += node_i[node, NI_BUSY] * (t - node_f[node, NF_LAST_T])
    node_f[node, NF_LAST_T] = t


# ---- routing -------------------------------------------------------------------
@njit(cache=True, error_model="numpy")
def prepare_routing(node_i, node_f, isv, fs):
    """Recompute the eligible set after Python changed controls (once per advance)."""
    n = node_i.shape[0]
    total = 0.0
    count = 0
    first_w = -1.0
    equal = 1
    for i in range(n):
        w = node_f[i, NF_WEIGHT] if node_i[i, NI_ROUTABLE] != 0 else 0.0
        if w > 0.0:
            count += 1
            if first_w < 0.0:
                first_w = w
            elif w != first_w:
                equal = 0
        total += w
        node_f[i, NF_CUM] = total
    isv[IS_N_ELIGIBLE] = count
    isv[IS_EQUAL_WEIGHTS] = equal if count == n else 0
    fs[FS_WRR_TOTAL] = total


@njit(cache=True, error_model="numpy")
def _eligible(node_i, node_f, i):
    return node_i[i, NI_ROUTABLE] != 0 and node_f[i, NF_WEIGHT] > 0.0


@njit(cache=True, error_model="numpy")
def _weighted_pick(node_i, node_f, isv, fs, rng):
    n = node_i.shape[0]
    if isv[IS_EQUAL_WEIGHTS] != 0:
        return min(int(uniform(rng) * n), n - 1)
    x = uniform(rng) * fs[FS_WRR_TOTAL]
    i = np.searchsorted(node_f[:, NF_CUM], x, side="right")
    while i < n - 1 and not _eligible(node_i, node_f, i):
        i += 1
    return min(i, n - 1)


@njit(cache=True, error_model="numpy")
def _load(node_i, node_f, i):
    return (node_i[i, NI_BUSY] + node_i[i, NI_QLEN] + 1.0) / node_f[i, NF_WEIGHT]


@njit(cache=True, error_model="numpy")
def pick_node(routing, node_i, node_f, isv, fs, rng, stamp, n_chosen):
    """One node for a sub-request, not yet chosen for this user request (stamp)."""
    n = node_i.shape[0]
    if routing == R_RANDOM or routing == R_P2C:
        while True:
            a = _weighted_pick(node_i, node_f, isv, fs, rng)
            if node_i[a, NI_STAMP] != stamp:
                break
        if routing == R_RANDOM or isv[IS_N_ELIGIBLE] - n_chosen <= 1:
            return a
        while True:
            b = _weighted_pick(node_i, node_f, isv, fs, rng)
            if b != a and node_i[b, NI_STAMP] != stamp:
                break
        return a if _load(node_i, node_f, a) <= _load(node_i, node_f, b) else b
    if routing == R_RR:
        if isv[IS_EQUAL_WEIGHTS] != 0:
            while True:
                i = isv[IS_RR]
                isv[IS_RR] = (i + 1) % n
                if node_i[i, NI_STAMP] != stamp:
                    return i
        # smooth weighted round robin (nginx's), skipping nodes already chosen
        best = -1
        for i in range(n):
            if _eligible(node_i, node_f, i):
                node_f[i, NF_WRR_CUR] += node_f[i, NF_WEIGHT]
                if node_i[i, NI_STAMP] != stamp and (
                        best < 0 or node_f[i, NF_WRR_CUR] > node_f[best, NF_WRR_CUR]):
                    best = i
        node_f[best, NF_WRR_CUR] -= fs[FS_WRR_TOTAL]
        return best
    # join the shortest queue (in flight per unit weight), random tie-break
    best = -1
    best_load = np.inf
    ties = 0
    for i in range(n):
        if _eligible(node_i, node_f, i) and node_i[i, NI_STAMP] != stamp:
            ld = _load(node_i, node_f, i)
            if ld < best_load:
                best_load = ld
                best = i
                ties = 1
            elif ld == best_load:
                ties += 1
                if uniform(rng) * ties < 1.0:
                    best = i
    return best


# ---- small helpers of the loop (arrays in, no Python objects) ----------------------------
@njit(cache=True, error_model="numpy")
def alloc_job(isv, job_i, job_free, u, node, t, job_f):
    n = isv[IS_JOB_FREE_N] - 1
    j = job_free[n]
    isv[IS_JOB_FREE_N] = n
    job_i[j, JI_USER] = u
    job_i[j, JI_NODE] = node
    job_i[j, JI_GEN] += 1
    job_f[j, JF_T_NODE] = t
    return j


@njit(cache=True, error_model="numpy")
def end_now(isv, job_i, heap_t, heap_k, j, outcome, t):
    """Decide job j's outcome now; its DONE event fires at once, through the heap."""
    job_i[j, JI_STATE] = J_ENDING
    job_i[j, JI_OUTCOME] = outcome
    heap_push(heap_t, heap_k, isv, t, event_key(j, EV_DONE, job_i[j, JI_GEN]))


# ---- rare events: whole tuples are fine here ----------------------------------------------
@njit(cache=True, error_model="numpy")
def crash_node(st, node, t):
    """The node stops serving: everything queued or in service fails now."""
    job_i = st.job_i
    touch_busy(st.node_i, st.node_f, node, t)
    for j in range(job_i.shape[0]):
        state = job_i[j, JI_STATE]
        if (state == J_QUEUED or state == J_SERVING) and job_i[j, JI_NODE] == node:
            job_i[j, JI_GEN] += 1  # its pending completion is void
            end_now(st.is_, job_i, st.heap_t, st.heap_k, j, ERROR, t)
    st.node_i[node, NI_BUSY] = 0
    st.node_i[node, NI_QLEN] = 0
    st.node_i[node, NI_QHEAD] = -1
    st.node_i[node, NI_QTAIL] = -1


@njit(cache=True, error_model="numpy")
def on_schedule(cfg, st, t):
    """Recompute every node's fault state from the faults active at t."""
    ni = st.node_i
    nf = st.node_f
    n = ni.shape[0]
    crashed_now = np.zeros(n, np.int64)
    err = np.zeros(n)
    slow = np.ones(n)
    ff = cfg.fault_f
    fi = cfg.fault_i
    for f in range(ff.shape[0]):
        if ff[f, 0] <= t < ff[f, 1]:
            node = fi[f, 0]
            err[node] = 1.0 - (1.0 - err[node]) * (1.0 - ff[f, 2])
            slow[node] *= ff[f, 3]
            if fi[f, 1] != 0:
                crashed_now[node] = 1
    for i in range(n):
        nf[i, NF_ERR_RATE] = err[i]
        nf[i, NF_SLOWDOWN] = slow[i]
        if crashed_now[i] != 0 and ni[i, NI_CRASHED] == 0:
            crash_node(st, i, t)
        ni[i, NI_CRASHED] = crashed_now[i]
    pos = st.is_[IS_SCHED_POS] + 1
    st.is_[IS_SCHED_POS] = pos
    st.fs[FS_NEXT_SCHED] = cfg.sched_t[pos] if pos < cfg.sched_t.shape[0] else np.inf


@njit(cache=True, error_model="numpy")
def on_sample(cfg, st, out, t):
    s = st.is_[IS_NSAMPLE]
    out.sample_t[s] = t
    m = out.metrics
    ni = st.node_i
    for i in range(ni.shape[0]):
        c = 0
        for tier in range(len(TIERS)):
            for o in range(len(OUTCOMES)):
                m[s, i, c] = st.cnt[i, tier, o]
                c += 1
        touch_busy(ni, st.node_f, i, t)
        m[s, i, M_BUSY] = ni[i, NI_BUSY]
        m[s, i, M_QLEN] = ni[i, NI_QLEN]
        m[s, i, M_IN_FLIGHT] = ni[i, NI_BUSY] + ni[i, NI_QLEN]
        m[s, i, M_BUSY_SECONDS] = st.node_f[i, NF_BUSY_AREA]
    st.is_[IS_NSAMPLE] = s + 1
    st.fs[FS_NEXT_SAMPLE] = (s + 1) * cfg.cfg_f[CF_SAMPLE_DT]


@njit(cache=True, error_model="numpy")
def start(cfg, st):
    """Draw the first arrival and arm the fault schedule (once, at t = 0)."""
    const = cfg.cfg_i[CI_CONST_RATE] != 0
    st.fs[FS_NEXT_ARRIVAL] = next_arrival(st.rng, cfg.cfg_f[CF_RATE_MAX], const, cfg.rate_t,
                                          cfg.rate_v, 0.0)
    st.fs[FS_NEXT_SCHED] = cfg.sched_t[0] if cfg.sched_t.shape[0] > 0 else np.inf


# ---- the loop ---------------------------------------------------------------------
@njit(cache=True, error_model="numpy")
def advance(cfg, st, out, t_end):
    """Process every event with time <= t_end, or stop early asking for room.

    Each event does its own part, then shares one tail: record a user request
    that ended, release its slot, start service on the nodes it touched. So
    every mechanism is written once. The hot path (heap, queues, admission,
    accounting) is written out here rather than in helpers: numba pays an
    atomic reference count for every array handed to a helper, which cost more
    than the event itself (a third of the run time, measured with perf).
    Helpers remain for the rare paths: routing beyond uniform random, thinned
    arrivals, rejections, crashes, samples.
    """
    cfg_f = cfg.cfg_f
    cfg_i = cfg.cfg_i
    tier_cum = cfg.tier_cum
    rate_t = cfg.rate_t
    rate_v = cfg.rate_v
    fs = st.fs
    isv = st.is_
    rng = st.rng
    node_i = st.node_i
    node_f = st.node_f
    cnt = st.cnt
    job_i = st.job_i
    job_f = st.job_f
    job_free = st.job_free
    usr_i = st.usr_i
    usr_f = st.usr_f
    usr_free = st.usr_free
    heap_t = st.heap_t
    heap_k = st.heap_k
    touched = st.scratch
    rec_f = out.rec_f
    rec_i = out.rec_i
    hist = out.hist
    tier_cnt = out.tier_cnt
    lat_sum = out.lat_sum

    prepare_routing(node_i, node_f, isv, fs)
    n_nodes = node_i.shape[0]
    fanout = cfg_i[CI_FANOUT]
    record = cfg_i[CI_RECORD] != 0
    warmup = cfg_f[CF_WARMUP]
    qlim = cfg_i[CI_QUEUE_LIMIT]
    svc_kind = cfg_i[CI_SVC_KIND]
    svc_a = cfg_f[CF_SVC_A]
    svc_b = cfg_f[CF_SVC_B]
    svc_c = cfg_f[CF_SVC_C]
    routing = cfg_i[CI_ROUTING]
    const_rate = cfg_i[CI_CONST_RATE] != 0
    rmax = cfg_f[CF_RATE_MAX]
    mean_gap = 1.0 / rmax if rmax > 0.0 else np.inf
    deadline = cfg_f[CF_DEADLINE]
    shed_mask = isv[IS_SHED_MASK]
    n_rec_cap = rec_f.shape[0]
    n_samp_cap = out.sample_t.shape[0]
    heap_cap = heap_t.shape[0]
    n_jobs = job_i.shape[0]
    uniform_random = routing == R_RANDOM and isv[IS_EQUAL_WEIGHTS] != 0
    t_arr = fs[FS_NEXT_ARRIVAL]
    t_samp = fs[FS_NEXT_SAMPLE]
    t_sched = fs[FS_NEXT_SCHED]
    t_rare = min(t_samp, t_sched)
    status = DONE
    while True:
        hn = isv[IS_HEAP_N]
        t_heap = heap_t[0] if hn > 0 else np.inf
        t = min(t_arr, t_heap)
        if t_rare <= t and t_rare <= t_end:  # ---- fault schedule or metrics sample
            if t_sched <= t_samp:
                if heap_cap - hn < n_jobs:  # a crash may end every job at once
                    status = GROW_POOLS
                    break
                on_schedule(cfg, st, t_sched)
            else:
                if isv[IS_NSAMPLE] >= n_samp_cap:
                    status = GROW_SAMPLES
                    break
                fs[FS_NOW] = t_samp
                on_sample(cfg, st, out, t_samp)
            t_samp = fs[FS_NEXT_SAMPLE]
            t_sched = fs[FS_NEXT_SCHED]
            t_rare = min(t_samp, t_sched)
            continue
        if t > t_end:
            fs[FS_NOW] = max(fs[FS_NOW], t_end)
            break
        # room for the worst case of one event, checked before touching anything
        if (isv[IS_JOB_FREE_N] < fanout + 1 or isv[IS_USR_FREE_N] < 2
                or heap_cap - hn < fanout + 2):
            status = GROW_POOLS
            break
        if record and n_rec_cap - isv[IS_NREC] < 2:
            status = GROW_RECORDS
            break
        fs[FS_NOW] = t
        n_touched = 0  # nodes whose queue may now start service
        fin_u = -1  # user request whose client sees its outcome now
        fin_outcome = OK
        release_u = -1  # user request whose last sub-request ended

        if t_heap <= t_arr:  # ---- a timed event
            key = heap_k[0]
            # pop the heap's top: sift the last entry down from the root
            hn -= 1
            isv[IS_HEAP_N] = hn
            if hn > 0:
                last_t = heap_t[hn]
                last_k = heap_k[hn]
                i = 0
                while True:
                    c = 2 * i + 1
                    if c >= hn:
                        break
                    if c + 1 < hn and heap_t[c + 1] < heap_t[c]:
                        c += 1
                    if heap_t[c] >= last_t:
                        break
                    heap_t[i] = heap_t[c]
                    heap_k[i] = heap_k[c]
                    i = c
                heap_t[i] = last_t
                heap_k[i] = last_k
            gen = key >> 32
            ident = (key >> 2) & ((1 << 30) - 1)
            if (key & 3) == EV_DONE:  # a sub-request ends: served, rejected or crashed
                j = ident
                if (job_i[j, JI_GEN] & GEN_MASK) != gen:
                    continue  # stale: its job was voided
                node = job_i[j, JI_NODE]
                u = job_i[j, JI_USER]
                outcome = job_i[j, JI_OUTCOME]
                if job_i[j, JI_STATE] == J_SERVING:
                    node_f[node, NF_BUSY_AREA] += node_i[node, NI_BUSY] * (
                        t - node_f[node, NF_LAST_T])
                    node_f[node, NF_LAST_T] = t
                    node_i[node, NI_BUSY] -= 1
                    touched[0] = node
                    n_touched = 1
                    outcome = OK
                    err = node_f[node, NF_ERR_RATE]
                    if err > 0.0 and uniform(rng) < err:
                        outcome = ERROR
                # free the job; a later heap entry for it is stale by generation
                job_i[j, JI_STATE] = J_FREE
                job_i[j, JI_GEN] += 1
                nf_ = isv[IS_JOB_FREE_N]
                job_free[nf_] = j
                isv[IS_JOB_FREE_N] = nf_ + 1
                late = usr_i[u, UI_FINAL] != 0  # its client already gave up
                if node >= 0:  # the server's own count
                    seen = TIMEOUT if (late and outcome == OK) else outcome
                    cnt[node, usr_i[u, UI_TIER], seen] += 1
                worst = usr_i[u, UI_WORST]
                if outcome > worst:
                    usr_i[u, UI_WORST] = outcome
                    usr_i[u, UI_CRIT] = node
                elif outcome == worst and outcome == OK:
                    usr_i[u, UI_CRIT] = node  # the slowest sub-request decides latency
                remaining = usr_i[u, UI_REMAINING] - 1
                usr_i[u, UI_REMAINING] = remaining
                if remaining == 0:
                    release_u = u
                    if not late:
                        fin_u = u
                        fin_outcome = usr_i[u, UI_WORST]
            else:  # a deadline: the client gives up
                u = ident
                if (usr_i[u, UI_GEN] & GEN_MASK) == gen and usr_i[u, UI_FINAL] == 0:
                    fin_u = u
                    fin_outcome = TIMEOUT
        else:  # ---- a user request arrives
            nfree = isv[IS_USR_FREE_N] - 1
            u = usr_free[nfree]
            isv[IS_USR_FREE_N] = nfree
            seq = isv[IS_USER_SEQ] + 1
            isv[IS_USER_SEQ] = seq
            isv[IS_IN_FLIGHT_USERS] += 1
            x = uniform(rng)
            tier = 0 if x < tier_cum[0] else (1 if x < tier_cum[1] else 2)
            k = min(fanout, isv[IS_N_ELIGIBLE])
            usr_i[u, UI_TIER] = tier
            usr_i[u, UI_WORST] = OK
            usr_i[u, UI_CRIT] = -1
            usr_i[u, UI_FINAL] = 0
            usr_i[u, UI_FANOUT] = fanout
            usr_i[u, UI_REMAINING] = max(k, 1)
            usr_f[u, UF_T_ARRIVAL] = t
            if deadline < np.inf:
                heap_push(heap_t, heap_k, isv, t + deadline,
                          event_key(u, EV_DEADLINE, usr_i[u, UI_GEN]))
            if k <= 0:  # nowhere to send it
                j = alloc_job(isv, job_i, job_free, u, -1, t, job_f)
                end_now(isv, job_i, heap_t, heap_k, j, ERROR, t)
            elif n_nodes == 1:
                touched[0] = 0  # a single node: no draw
            elif k == 1 and uniform_random:
                touched[0] = min(int(uniform(rng) * n_nodes), n_nodes - 1)
            else:
                for i in range(k):  # choose all k first, then admit them
                    node = pick_node(routing, node_i, node_f, isv, fs, rng, seq, i)
                    node_i[node, NI_STAMP] = seq
                    touched[i] = node
            if k > 0:
                n_touched = k
            for i in range(n_touched):
                node = touched[i]
                nj = isv[IS_JOB_FREE_N] - 1
                j = job_free[nj]
                isv[IS_JOB_FREE_N] = nj
                job_i[j, JI_USER] = u
                job_i[j, JI_NODE] = node
                job_i[j, JI_GEN] += 1
                job_f[j, JF_T_NODE] = t
                # admission: crashed (refused), shed, throttled, queue full, or queued
                busy = node_i[node, NI_BUSY]
                qlen = node_i[node, NI_QLEN]
                limit = node_i[node, NI_INTAKE_LIMIT]
                rejected = -1
                if node_i[node, NI_CRASHED] != 0:
                    rejected = ERROR
                elif tier != GOLD and (shed_mask >> tier) & 1:
                    rejected = DROPPED
                elif limit >= 0 and busy + qlen >= limit:
                    rejected = DROPPED
                elif qlim >= 0 and busy >= node_i[node, NI_SERVERS] and qlen >= qlim:
                    rejected = ERROR
                if rejected >= 0:
                    end_now(isv, job_i, heap_t, heap_k, j, rejected, t)
                    continue
                job_i[j, JI_STATE] = J_QUEUED
                job_i[j, JI_NEXT] = -1
                tail = node_i[node, NI_QTAIL]
                job_i[j, JI_PREV] = tail
                if tail >= 0:
                    job_i[tail, JI_NEXT] = j
                else:
                    node_i[node, NI_QHEAD] = j
                node_i[node, NI_QTAIL] = j
                node_i[node, NI_QLEN] = qlen + 1
            if const_rate:
                t_arr = t + exponential(rng, mean_gap)
            else:
                t_arr = next_arrival(rng, rmax, const_rate, rate_t, rate_v, t)

        # ---- the shared tail
        if fin_u >= 0:  # the client sees its outcome: records and statistics
            usr_i[fin_u, UI_FINAL] = 1
            isv[IS_IN_FLIGHT_USERS] -= 1
            t0 = usr_f[fin_u, UF_T_ARRIVAL]
            latency_ms = (t - t0) * 1000.0
            tier = usr_i[fin_u, UI_TIER]
            if record:
                r = isv[IS_NREC]
                rec_f[r, 0] = t0
                rec_f[r, 1] = latency_ms
                rec_i[r, 0] = tier
                rec_i[r, 1] = fin_outcome
                rec_i[r, 2] = usr_i[fin_u, UI_CRIT]
                rec_i[r, 3] = usr_i[fin_u, UI_FANOUT]
                isv[IS_NREC] = r + 1
            if t0 >= warmup:
                tier_cnt[tier, fin_outcome] += 1
                if fin_outcome == OK or fin_outcome == ERROR:
                    hist[tier, fin_outcome, hist_bin(latency_ms)] += 1
                    lat_sum[tier, fin_outcome] += latency_ms
        if release_u >= 0:
            usr_i[release_u, UI_GEN] += 1  # its deadline event, if any, is now stale
            n = isv[IS_USR_FREE_N]
            usr_free[n] = release_u
            isv[IS_USR_FREE_N] = n + 1
        for i in range(n_touched):  # start service where servers are free
            node = touched[i]
            while node_i[node, NI_QLEN] > 0 and node_i[node, NI_BUSY] < node_i[node, NI_SERVERS]:
                j = node_i[node, NI_QHEAD]  # dequeue
                nxt = job_i[j, JI_NEXT]
                node_i[node, NI_QHEAD] = nxt
                if nxt >= 0:
                    job_i[nxt, JI_PREV] = -1
                else:
                    node_i[node, NI_QTAIL] = -1
                node_i[node, NI_QLEN] -= 1
                job_i[j, JI_STATE] = J_SERVING
                job_f[j, JF_T_START] = t
                node_f[node, NF_BUSY_AREA] += node_i[node, NI_BUSY] * (t - node_f[node, NF_LAST_T])
                node_f[node, NF_LAST_T] = t
                node_i[node, NI_BUSY] += 1
                if svc_kind == S_EXP:
                    s = exponential(rng, svc_a)
                else:
                    s = draw_service(rng, svc_kind, svc_a, svc_b, svc_c)
                t_done = t + s * node_f[node, NF_SLOWDOWN]
                key = event_key(j, EV_DONE, job_i[j, JI_GEN])
                # push onto the heap: sift up from the end
                hi = isv[IS_HEAP_N]
                isv[IS_HEAP_N] = hi + 1
                while hi > 0:
                    parent = (hi - 1) >> 1
                    if heap_t[parent] <= t_done:
                        break
                    heap_t[hi] = heap_t[parent]
                    heap_k[hi] = heap_k[parent]
                    hi = parent
                heap_t[hi] = t_done
                heap_k[hi] = key
    fs[FS_NEXT_ARRIVAL] = t_arr
    return status
