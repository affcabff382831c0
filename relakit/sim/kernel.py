"""The fleet's event loop, in numba: one binary heap of timed events plus a few "next time"
scalars over preallocated arrays (users, calls, jobs; docs/design.md, "The data plane").

The loop stops at a requested time (``advance``): between two calls Python changes
controls and flags in the state arrays, which take effect at exactly that time; a full
pool returns a status *between* events and ``Fleet`` grows it and calls again. Random
numbers come from one xoshiro256** stream per kind of draw (``STREAMS``, append only;
which draws each takes: docs/design.md, "Random streams"), so runs that differ in policy
still see the same arrivals and demands. Column indices are the constants below;
:mod:`relakit.sim.fleet` builds and grows the arrays.
"""

from __future__ import annotations

import math
from collections import namedtuple

import numpy as np

from relakit.jit import njit, register_jitable
from relakit.sim.cachename import digest_named
from relakit.sim.latency_bins import (  # noqa: F401 - HIST_* re-exported
    HIST_BINS,
    HIST_BINS_PER_DECADE,
    HIST_DECADES,
    HIST_LOG10_MIN,
    hist_bin,
)
from relakit.sim.rng import exponential, exponential_py, normal, uniform, uniform_words
from relakit.vocab import (  # noqa: F401 - re-exported codes' words
    BREAKER_STATES,
    CANCELS,
    CONCURRENCY_ALGORITHMS,
    OUTCOMES,
    QUEUE_DISCIPLINES,
    ROUTINGS,
    SERVICE_KINDS,
    TIERS,
)

# ---- codes shared with the Python side -------------------------------------
# the words are relakit.vocab's; the codes are their positions, never counted by hand
OK, ERROR, TIMEOUT, DROPPED = (OUTCOMES.index(o) for o in ("ok", "error", "timeout", "dropped"))
THROTTLED, REJECTED = (OUTCOMES.index(o) for o in ("throttled", "rejected"))  # in-path (issue 33)
GOLD = TIERS.index("gold")
ALL_TIERS = (1 << len(TIERS)) - 1  # a flag on for every tier (IS_HEDGE_ON, IS_DEGRADED_ON)
N_OUTCOMES = len(OUTCOMES)

# random streams: st.rng[RNG_X] is stream "x" (see the module docstring); append only
STREAMS = ("arrivals", "service", "copy_service", "routing", "reroute", "hedge_targets",
           "errors", "retry_jitter", "half_open", "probes", "throttle", "clients")
(RNG_ARRIVALS, RNG_SERVICE, RNG_COPY_SERVICE, RNG_ROUTING, RNG_REROUTE, RNG_HEDGES, RNG_ERRORS,
 RNG_JITTER, RNG_HALF_OPEN, RNG_PROBES) = (STREAMS.index(n) for n in (
    "arrivals", "service", "copy_service", "routing", "reroute", "hedge_targets", "errors",
    "retry_jitter", "half_open", "probes"))
RNG_THROTTLE = STREAMS.index("throttle")  # the client throttle's local rejection draws
RNG_CLIENTS = STREAMS.index("clients")  # closed clients' think times (CLIENTS)
N_STREAMS = len(STREAMS)

S_EXP, S_DET, S_LOGNORMAL, S_PARETO, S_BIMODAL, S_HYPEREXP = (
    SERVICE_KINDS.index(k) for k in SERVICE_KINDS)
R_RANDOM, R_RR, R_JSQ, R_P2C = (ROUTINGS.index(r) for r in ROUTINGS)
CANCEL_QUEUED, CANCEL_STARTED, CANCEL_NEVER = (CANCELS.index(c) for c in CANCELS)
BREAKER_CLOSED, BREAKER_HALF_OPEN, BREAKER_OPEN = (BREAKER_STATES.index(b) for b in (
    "closed", "half_open", "open"))

# Mechanisms a scenario may switch on. ``advance`` is compiled once per combination in use
# (``specialised``): each name is a module constant, True in the general kernel and a
# compile-time False in a specialisation where the mechanism is off, so numba drops the
# code it guards. HEDGING, DEADLINES: a ring timer per copy (dropped at the loop head once
# stale); RETRIES: the retry decision on a failed copy; ERRORS: the draws at a completion;
# INTAKE: the admission checks per copy; BREAKER: the door check per arrival; DEGRADED:
# partial fan-out and the cheaper service; PROBES: the next probe among the rare events;
# KEEP_LISTENING: a timed-out copy still answers its call (C_LATE); THROTTLE, CONCURRENCY,
# CODEL: the in-path mechanisms (issue 33, section "in-path"); CLIENTS: closed clients.
FEATURES = ("hedging", "deadlines", "retries", "errors", "intake", "breaker", "degraded",
            "probes", "keep_listening", "throttle", "concurrency", "codel", "clients")
LEAN_FEATURES = frozenset({"hedging", "deadlines", "retries", "errors"})  # loops.mitigated_ok
# each decides at once and leaves nothing on the heap but completions (loops.in_path_ok)
IN_PATH_FEATURES = frozenset({"throttle", "concurrency", "codel"})
HEDGING = DEADLINES = RETRIES = ERRORS = INTAKE = BREAKER = DEGRADED = PROBES = True
KEEP_LISTENING = THROTTLE = CONCURRENCY = CODEL = CLIENTS = True
# The leanest stretches' constants (``specialised(..., settled=True)``, ``simple=True``):
# LEFTOVERS: the loop may meet what a mechanism left pending (ring timers, events but
#   completions, copies not a first attempt, failovers, a schedule change); False in a
#   plain stretch (``loops.plain_ok``), where a completion is the only event.
# SIMPLE: besides, one call to one node per request, exponential demand, a constant rate,
#   uniform routing, no retry budget (``loops.simple_ok``): call and user rows are written
#   only at return (LEAN_CALL, LEAN_USER) and a copy meeting an idle server starts at once.
# ONE_CALL: fan-out 1 in the lean mitigated loop: the request's end is its call's
#   (LEAN_USER; ``lean_users`` writes the live user rows at return).
LEFTOVERS = True
SIMPLE = False
ONE_CALL = False
# derived by ``specialised`` (numba prunes on one constant, not on an expression of several):
# RESENDS: copies other than first attempts may be sent; ENDS_EARLY: a copy may end
# unserved; ROW: how a row index is converted where it indexes (``unsigned`` in the settled
# loops: no negative-index fix-up; in the index, not the variable's type, since an int64
# meeting a uint64 becomes a float64 in numba; only after a -1 test).
RESENDS = True
ENDS_EARLY = True

# Index constants: each group is unpacked from 0, 1, 2, ...; the name after a group's
# last member is its count (N_*), so adding one is one edit and nothing is counted by hand
_COUNT = range(64)

# status returned by advance
DONE, GROW_POOLS, GROW_RECORDS, GROW_SAMPLES, SETTLED, *_ = _COUNT
# SETTLED: the last row a leaner loop waited for is free (IS_DRAIN): the caller chooses again

# Event kinds a timer carries. Heap key = generation << 32 | id << EV_BITS | kind (a
# stale generation means: ignore). EV_DONE: a copy's service ends (or its rejection
# or crash is due); EV_TIMEOUT: its client stops waiting; EV_HEDGE, EV_RETRY: a call's
# hedge or retry falls due; EV_MOVE: a job failed over from an isolated node arrives.
EV_DONE, EV_TIMEOUT, EV_HEDGE, EV_RETRY, EV_MOVE, EV_THINK, N_EVENT_KINDS, *_ = _COUNT
EV_BITS = 3
EV_MASK = (1 << EV_BITS) - 1
assert N_EVENT_KINDS <= 1 << EV_BITS
GEN_MASK = (1 << 31) - 1
U0, U1 = np.uint64(0), np.uint64(1)  # heap positions in the loop's pop (unsigned)
ID_MASK = (1 << (32 - EV_BITS)) - 1

# cfg_f: model scalars (float)
(CF_RATE_MAX, CF_SAMPLE_DT, CF_DEADLINE, CF_WARMUP, CF_SVC_A, CF_SVC_B, CF_SVC_C,
 CF_HEDGE_DELAY, CF_HEDGE_Q, CF_BACKOFF, CF_BACKOFF_MAX, CF_BUDGET_RATIO, CF_BUDGET_WINDOW,
 CF_DEGRADED_FACTOR, CF_HALF_OPEN_ADMIT, CF_PROBE_RATE,
 CF_THROTTLE_K, CF_THROTTLE_WIDTH, CF_THROTTLE_COST, CF_CL_MIN, CF_CL_MAX, CF_CL_BACKOFF,
 CF_CL_LATENCY, CF_CL_BUFFER, CF_JUDGE_COST, CF_CODEL_TARGET, CF_CODEL_INTERVAL,
 N_CF, *_) = _COUNT
# cfg_i: model scalars (int)
(CI_SVC_KIND, CI_ROUTING, CI_FANOUT, CI_RECORD, CI_CONST_RATE, CI_QUEUE_LIMIT, CI_CANCEL,
 CI_MAX_HEDGES, CI_MAX_ATTEMPTS, CI_JITTER, CI_RETRY_MASK, CI_DEGRADED_FANOUT,
 CI_BREAKER_MASK, CI_FAILOVER, CI_ELSEWHERE, CI_KEEP_LISTENING,
 CI_CL_ALGO, CI_CL_WINDOW, CI_CL_PERIOD, CI_CODEL, CI_DISCIPLINE,
 N_CI, *_) = _COUNT

# ---- closed clients (CLIENTS): per tier a population that sends, waits for the outcome,
# thinks (a service kind's draw) and sends again; ids run gold first. A thinking client is
# one EV_THINK event (ident: its id, generation 0); its request's user row names it
# (UI_CLIENT; -1: an open arrival). Per tier: CI_CLIENTS + tier its population,
# CI_THINK_KIND + tier its think kind, CF_THINK + 3 * tier + 0..2 the kind's parameters.
CI_CLIENTS = N_CI
CI_THINK_KIND = CI_CLIENTS + len(TIERS)
N_CI = CI_THINK_KIND + len(TIERS)
CF_THINK = N_CF
N_CF = CF_THINK + 3 * len(TIERS)
# A population schedule: st.is_[IS_CUT + tier] of the tier's highest ids are cut now; a cut
# client retires when its think ends; a step up starts the ids not alive (population_step).

# st.fs: state scalars (float)
(FS_NOW, FS_NEXT_ARRIVAL, FS_NEXT_SAMPLE, FS_NEXT_SCHED, FS_WRR_TOTAL, FS_HEDGE_DELAY,
 FS_NEXT_NODE_SAMPLE, FS_NEXT_PROBE, FS_MARK, FS_MARK_GENERAL,
 N_FS, *_) = _COUNT
# st.is_: state scalars (int)
(IS_HEAP_N, IS_JOB_FREE_N, IS_USR_FREE_N, IS_CALL_FREE_N, IS_NREC, IS_NSAMPLE, IS_RR,
 IS_SCHED_POS, IS_STAMP, IS_N_ELIGIBLE, IS_EQUAL_WEIGHTS, IS_SHED_MASK, IS_IN_FLIGHT_USERS,
 IS_HEDGE_ON, IS_DEGRADED_ON, IS_BREAKER, IS_BUDGET_BUCKET, IS_USER_SEQ,
 IS_MAX_NODE_SAMPLE, IS_THROTTLE_BUCKET, IS_THROTTLE_REQ, IS_THROTTLE_ACC,
 IS_OLD, IS_OLD_GENERAL, IS_DRAIN, IS_EVENTS,
 *_) = _COUNT
N_IS = IS_EVENTS + N_EVENT_KINDS  # IS_EVENTS + kind: its events on the heap (not EV_DONE's)
IS_CUT = N_IS  # (CLIENTS) IS_CUT + tier: its clients a population schedule cut (see below)
N_IS = IS_CUT + len(TIERS)
# What a mechanism left, for loops.py's O(nodes) choice: the heap's events by kind, and the
# rows live at the end of the last stretch that could leave something for the plain loops
# (FS_MARK, IS_OLD) or the lean ones (FS_MARK_GENERAL, IS_OLD_GENERAL), counted down by the
# loop as they free (a row made by the mark is old). IS_DRAIN 1 (2): the loop returns
# SETTLED once IS_OLD (IS_OLD_GENERAL) is 0. Timers of one fixed delay fall due in the
# order set, so they wait in FIFO rings (tq_t, tq_k; rows TQ_*; tq_n[q] = head, count).
TQ_TIMEOUT, TQ_HEDGE, N_TQ, *_ = _COUNT
TQ_HEAP = -1
BUDGET_BUCKETS = 10
# st.budget's rows: the retry budget's first attempts and retries, then the client
# throttle's window (issue 33): requests attempted and requests the backends accepted
BUDGET_THR_REQ, BUDGET_THR_ACC, N_BUDGET_ROWS = 2, 3, 4

# st.node_i columns
(NI_SERVERS, NI_BUSY, NI_QLEN, NI_QHEAD, NI_QTAIL, NI_ROUTABLE, NI_INTAKE_LIMIT, NI_CRASHED,
 NI_STAMP, NI_NSAMPLE, NI_FAILOVER,
 NI_CL_COUNT, NI_CL_WINDOWS,
 N_NI, *_) = _COUNT
# st.node_f columns
(NF_WEIGHT, NF_ERR_RATE, NF_SLOWDOWN, NF_BUSY_AREA, NF_LAST_T, NF_WRR_CUR, NF_CUM,
 NF_WRONG_RATE, NF_TOKEN_RATE, NF_TOKEN_BURST, NF_TOKENS, NF_TOKEN_T, NF_LAT_SUM,
 NF_NEXT_SAMPLE, NF_REPAIRED_AT,
 NF_CL_LIMIT, NF_CL_SUM, NF_CL_MIN_RTT, NF_CL_PERIOD_MIN, NF_CODEL_LAST_EMPTY,
 N_NF, *_) = _COUNT
# st.node_c: per-node counters beyond requests_total
(NC_WRONG, NC_CANCELLED, NC_PROBES, NC_PROBE_FAILURES, NC_REJECTED, NC_CODEL_DROPPED,
 N_NC, *_) = _COUNT

# st.job_i / job_f columns
(JI_CALL, JI_NODE, JI_NEXT, JI_PREV, JI_GEN, JI_STATE, JI_OUTCOME, JI_SIB, JI_CLIENT, JI_HEDGE,
 JI_TIER, JI_DEGRADED,
 N_JI, *_) = _COUNT
# a job ENDING has its outcome decided (rejected, or its node crashed) and its DONE event
# due now; a SERVING job's outcome is drawn when its DONE event fires
J_FREE, J_QUEUED, J_SERVING, J_ENDING, J_MOVING, *_ = _COUNT
# what the client makes of a job: still waiting on it, gave up on it (timeout), or
# no longer needs it (another copy answered); C_LATE (keep_listening only): past its
# deadline, its retry sent or due, yet still listened to (a late answer answers the call)
C_WAITING, C_TIMED_OUT, C_LOST, C_LATE, *_ = _COUNT
# JF_DEMAND: service seconds before slowdown; NO_DEMAND until drawn (a copy's, at its start)
JF_T_NODE, JF_T_START, JF_DEMAND, N_JF, *_ = _COUNT
NO_DEMAND = -1.0

# st.call_i columns
(CL_USER, CL_GEN, CL_ATTEMPTS, CL_HEDGES, CL_COPIES, CL_FIRST, CL_LAST_NODE,
 CL_TIER,
 N_CL, *_) = _COUNT
# st.call_f: the call's first-attempt service demand (seconds), drawn at arrival
CLF_DEMAND, N_CLF, *_ = _COUNT

# st.usr_i / usr_f columns
(UI_TIER, UI_REMAINING, UI_WORST, UI_CRIT, UI_FANOUT, UI_GEN, UI_ATTEMPTS, UI_HEDGES,
 UI_DEGRADED, UI_WRONG, UI_CLIENT,
 N_UI, *_) = _COUNT
# UF_DEMAND: its first call's first-attempt demand (s)
UF_T_ARRIVAL, UF_DEMAND, N_UF, *_ = _COUNT

# per-node metric columns in out.metrics[sample, node, :]
N_COUNTERS = len(TIERS) * len(OUTCOMES)  # requests_total{tier, outcome}
(M_BUSY, M_QLEN, M_IN_FLIGHT, M_BUSY_SECONDS, M_WRONG, M_CANCELLED, M_LAT_SUM,
 M_LAT_COUNT, M_PROBES, M_PROBE_FAILURES, M_REJECTED, M_CODEL_DROPPED, M_CONC_LIMIT,
 M_BUCKETS, *_) = _COUNT[N_COUNTERS:]  # then one cumulative count per bucket bound, +Inf last

# fleet-wide metric columns in out.fleet[sample, :]
# client_requests_total{tier, outcome} first, then these counters, then the gauges
(F_ATTEMPTS, F_RETRIES, F_RETRIES_DENIED, F_HEDGES, F_HEDGES_WON, F_DEGRADED, F_THROTTLED,
 N_FLEET_COUNTERS, *_) = _COUNT[N_COUNTERS:]
F_BREAKER, F_HEDGE_ON, F_DEGRADED_ON, F_SHEDDING, *_ = _COUNT[N_FLEET_COUNTERS:]
N_FLEET = F_SHEDDING + len(TIERS)  # F_SHEDDING: one gauge per tier

# per-tier user statistics beyond outcome counts: out.tier_ext[tier, :]
TX_ATTEMPTS, TX_HEDGES, TX_DEGRADED, TX_WRONG, N_TX, *_ = _COUNT

# latency histogram: log-spaced bins over [1e-3 ms, 1e7 ms]
# the client latency histogram's log-spaced bins: relakit.sim.latency_bins (HIST_*)

Config = namedtuple(
    "Config",
    "cfg_f cfg_i tier_cum rate_t rate_v sched_t fault_f fault_i load_x load_p buckets phase"
    " dep_node dep_share",
)
State = namedtuple(
    "State",
    "fs is_ rng node_i node_f node_c cnt lat_b fleet_c budget job_i job_f job_free usr_i usr_f"
    " usr_free call_i call_f call_free heap_t heap_k tq_t tq_k tq_n scratch send pend_t pend_k"
    " demand",
)
Output = namedtuple(
    "Output", "metrics sample_t fleet fleet_t rec_f rec_i hist tier_cnt tier_ext lat_sum")


# ---- the simple specialisation's lean rows ------------------------------------------
# A request the SIMPLE loop admits gets a job row only (and its call's CL_USER): its call
# and user rows stay unwritten while it lives, their values fixed (below) or its job's
# (CL_FIRST, the tiers, demands, UF_T_ARRIVAL its sending time). lean_rows checks them on
# entry and writes them for the live requests before the loop returns.
LEAN_CALL = ((CL_ATTEMPTS, 1), (CL_HEDGES, 0), (CL_COPIES, 1))
LEAN_USER = ((UI_DEGRADED, 0), (UI_WORST, OK), (UI_CRIT, -1), (UI_FANOUT, 1),
             (UI_ATTEMPTS, 0), (UI_HEDGES, 0), (UI_WRONG, 0), (UI_REMAINING, 1))
# a simple request's end: fan-out, attempts, hedges, degraded, wrong
LEAN_END = (dict(LEAN_USER)[UI_FANOUT],
            dict(LEAN_USER)[UI_ATTEMPTS] + dict(LEAN_CALL)[CL_ATTEMPTS],
            dict(LEAN_USER)[UI_HEDGES] + dict(LEAN_CALL)[CL_HEDGES],
            dict(LEAN_USER)[UI_DEGRADED], dict(LEAN_USER)[UI_WRONG])
# the simple loop's status when a live request's rows are not lean (nothing done: the
# caller runs the stretch in the plain specialisation)
ROWS_NOT_LEAN = -1


@register_jitable(error_model="numpy", no_cfunc_wrapper=True)
def lean_rows(job_i, job_f, call_i, call_f, usr_i, usr_f, write):
    """Whether every live request's call and user rows hold what the simple loop leaves
    unwritten (:data:`LEAN_CALL`, :data:`LEAN_USER`, its job's tier, demand and arrival),
    and with ``write``, those values written. Before a simple stretch (``write`` false):
    a request whose hedge was cancelled or that was moved is not lean, and the loop returns
    ROWS_NOT_LEAN. After it: the rows any other specialisation reads (a free row keeps an
    older request's values: nothing reads it). O(job pool)."""
    held = True
    for j in range(job_i.shape[0]):
        if job_i[j, JI_STATE] == J_FREE:
            continue
        c = job_i[j, JI_CALL]
        u = call_i[c, CL_USER]
        tier = job_i[j, JI_TIER]
        demand = job_f[j, JF_DEMAND]
        sent = job_f[j, JF_T_NODE]
        for col, value in LEAN_CALL:
            held &= call_i[c, col] == value
            if write:
                call_i[c, col] = value
        for col, value in LEAN_USER:
            held &= usr_i[u, col] == value
            if write:
                usr_i[u, col] = value
        held &= (call_i[c, CL_FIRST] == j and call_i[c, CL_TIER] == tier
                 and usr_i[u, UI_TIER] == tier and call_f[c, CLF_DEMAND] == demand
                 and usr_f[u, UF_DEMAND] == demand and usr_f[u, UF_T_ARRIVAL] == sent)
        if write:
            call_i[c, CL_FIRST] = j
            call_i[c, CL_TIER] = tier
            usr_i[u, UI_TIER] = tier
            call_f[c, CLF_DEMAND] = demand
            usr_f[u, UF_DEMAND] = demand
            usr_f[u, UF_T_ARRIVAL] = sent
    return held


@register_jitable(error_model="numpy", no_cfunc_wrapper=True)
def lean_users(call_i, call_f, call_free, call_free_n, usr_i, usr_f):
    """The user rows of the requests live at the ONE_CALL loop's return (every call row
    not on the free list: one call each), as the other specialisations hold them."""
    n = call_i.shape[0]
    free = np.zeros(n, np.bool_)
    for i in range(call_free_n):
        free[call_free[i]] = True
    for c in range(n):
        if free[c]:
            continue
        u = call_i[c, CL_USER]
        for col, value in LEAN_USER:
            usr_i[u, col] = value
        usr_i[u, UI_TIER] = call_i[c, CL_TIER]
        usr_f[u, UF_DEMAND] = call_f[c, CLF_DEMAND]


# ---- heap -------------------------------------------------------------------
@register_jitable(error_model="numpy", no_cfunc_wrapper=True)
def sift_up(ht, hk, i, one, t, key):
    """File (t, key) in the heap whose new slot is ``i`` (``i`` and ``one`` converted by
    the caller's ``ROW``)."""
    while i >= one:
        parent = (i - one) >> one
        if ht[parent] <= t:
            break
        ht[i] = ht[parent]
        hk[i] = hk[parent]
        i = parent
    ht[i] = t
    hk[i] = key


@njit(cache=True, error_model="numpy")
def heap_push(ht, hk, isv, t, key):
    """Push for the rare paths (rejections, crashes, failover)."""
    kind = key & EV_MASK
    if kind != EV_DONE:
        isv[IS_EVENTS + kind] += 1
    i = isv[IS_HEAP_N]
    isv[IS_HEAP_N] = i + 1
    sift_up(ht, hk, i, 1, t, key)


@register_jitable(error_model="numpy", no_cfunc_wrapper=True)
def unsigned(x):
    """A row index as numba indexes fastest (see :data:`ROW`)."""
    return np.uint64(x)


@register_jitable(error_model="numpy", no_cfunc_wrapper=True)
def as_is(x):
    return x


ROW = as_is


@njit(cache=True, error_model="numpy")
def event_key(ident, kind, gen):
    return ((gen & GEN_MASK) << 32) | (ident << EV_BITS) | kind


# ---- model pieces ------------------------------------------------------------
# Helpers the loops call and Python never does are ``register_jitable`` (compiled into
# their caller, no wrappers of their own: cheaper cold starts, docs/performance.md);
# those Python calls too (``next_arrival``, ``next_probe``) stay dispatchers.
@register_jitable(error_model="numpy", no_cfunc_wrapper=True)
def bisect_right(a, x, lo, hi):
    """``np.searchsorted(a[lo:hi], x, side="right") + lo`` for sorted a, written out
    (numba's searchsorted is slow to compile)."""
    while lo < hi:
        mid = (lo + hi) >> 1
        if a[mid] <= x:
            lo = mid + 1
        else:
            hi = mid
    return lo


@register_jitable(error_model="numpy", no_cfunc_wrapper=True)
def rate_at(t, rate_t, rate_v):
    """Piecewise-linear rate; a repeated time is a step (the later value wins)."""
    n = rate_t.shape[0]
    if t < rate_t[0]:
        return rate_v[0]
    if t >= rate_t[n - 1]:
        return rate_v[n - 1]
    i = bisect_right(rate_t, t, 0, n) - 1
    t0 = rate_t[i]
    t1 = rate_t[i + 1]
    if t1 <= t0:
        return rate_v[i + 1]
    return rate_v[i] + (rate_v[i + 1] - rate_v[i]) * (t - t0) / (t1 - t0)


@njit(cache=True, error_model="numpy")
def next_arrival(rng, rmax, const, rate_t, rate_v, t):
    """Next accepted arrival after t: Poisson at the peak rate, thinned (arrivals stream)."""
    if rmax <= 0.0:
        return np.inf
    last = rate_t.shape[0] - 1
    while True:
        t += exponential(rng, RNG_ARRIVALS, 1.0 / rmax)
        if const:
            return t
        if t >= rate_t[last] and rate_v[last] <= 0.0:
            return np.inf
        if uniform(rng, RNG_ARRIVALS) * rmax < rate_at(t, rate_t, rate_v):
            return t


@register_jitable(error_model="numpy", no_cfunc_wrapper=True)
def draw_service(rng, k, kind, a, b, c):
    """Service time in seconds from stream k; a, b, c are the kind's prepared parameters."""
    if kind == S_EXP:
        return exponential(rng, k, a)
    if kind == S_DET:
        return a
    if kind == S_LOGNORMAL:
        return math.exp(a + b * normal(rng, k))
    if kind == S_PARETO:
        return a * (1.0 - uniform(rng, k)) ** (-1.0 / b)
    # bimodal and hyperexponential: a = fast, b = slow, c = slow fraction
    if kind == S_HYPEREXP:  # which phase, then its exponential (two draws, as the lab's)
        return exponential(rng, k, b if uniform(rng, k) < c else a)
    if uniform(rng, k) < c:
        return b
    return a


@register_jitable(error_model="numpy", no_cfunc_wrapper=True)
def touch_busy(node_i, node_f, node, t):
    """Accumulate busy-server seconds up to t before the busy count changes."""
    node_f[node, NF_BUSY_AREA] += node_i[node, NI_BUSY] * (t - node_f[node, NF_LAST_T])
    node_f[node, NF_LAST_T] = t


# ---- routing -------------------------------------------------------------------
@register_jitable(error_model="numpy", no_cfunc_wrapper=True)
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


@register_jitable(error_model="numpy", no_cfunc_wrapper=True)
def _eligible(node_i, node_f, i):
    return node_i[i, NI_ROUTABLE] != 0 and node_f[i, NF_WEIGHT] > 0.0


@register_jitable(error_model="numpy", no_cfunc_wrapper=True)
def _weighted_pick(node_i, node_f, isv, fs, rng, k):
    n = node_i.shape[0]
    if isv[IS_EQUAL_WEIGHTS] != 0:
        return min(int(uniform(rng, k) * n), n - 1)
    x = uniform(rng, k) * fs[FS_WRR_TOTAL]
    i = bisect_right(node_f[:, NF_CUM], x, 0, n)
    while i < n - 1 and not _eligible(node_i, node_f, i):
        i += 1
    return min(i, n - 1)


@register_jitable(error_model="numpy", no_cfunc_wrapper=True)
def _load(node_i, node_f, i):
    return (node_i[i, NI_BUSY] + node_i[i, NI_QLEN] + 1.0) / node_f[i, NF_WEIGHT]


@register_jitable(error_model="numpy", no_cfunc_wrapper=True)
def pick_node(routing, node_i, node_f, isv, fs, rng, k, stamp, n_chosen):
    """One node by the routing policy, avoiding the n_chosen nodes marked with stamp;
    its draws come from stream k (first attempts, reroutes and hedges each have one)."""
    n = node_i.shape[0]
    if routing == R_RANDOM or routing == R_P2C:
        while True:
            a = _weighted_pick(node_i, node_f, isv, fs, rng, k)
            if node_i[a, NI_STAMP] != stamp:
                break
        if routing == R_RANDOM or isv[IS_N_ELIGIBLE] - n_chosen <= 1:
            return a
        while True:
            b = _weighted_pick(node_i, node_f, isv, fs, rng, k)
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
                if uniform(rng, k) * ties < 1.0:
                    best = i
    return best


# ---- rare paths: helpers are fine here -------------------------------------------------
@njit(cache=True, error_model="numpy")
def end_now(isv, job_i, heap_t, heap_k, j, outcome, t):
    """Decide job j's outcome now; its DONE event fires at once, through the heap."""
    job_i[j, JI_STATE] = J_ENDING
    job_i[j, JI_OUTCOME] = outcome
    heap_push(heap_t, heap_k, isv, t, event_key(j, EV_DONE, job_i[j, JI_GEN]))


@register_jitable(error_model="numpy", no_cfunc_wrapper=True)
def end_synced(isv, job_i, heap_t, heap_k, j, outcome, t, hn):
    """:func:`end_now` from the loop, whose heap count ``hn`` lives in a local (HELPER_SYNC):
    the count after."""
    isv[IS_HEAP_N] = hn
    end_now(isv, job_i, heap_t, heap_k, j, outcome, t)
    return isv[IS_HEAP_N]


@register_jitable(error_model="numpy", no_cfunc_wrapper=True)
def words(rng, k):
    """Stream k's state, for the loop's locals (the streams every event draws from)."""
    return rng[k, 0], rng[k, 1], rng[k, 2], rng[k, 3]


@register_jitable(error_model="numpy", no_cfunc_wrapper=True)
def put_words(rng, k, w0, w1, w2, w3):
    """The loop's locals back into stream k's state, on return."""
    rng[k, 0], rng[k, 1], rng[k, 2], rng[k, 3] = w0, w1, w2, w3


@register_jitable(error_model="numpy", no_cfunc_wrapper=True)
def ring_pop(head, count, cap):
    """A FIFO timer ring's (head, count) once its head is taken."""
    head += 1
    if head == cap:
        head = 0
    return head, count - 1


@register_jitable(error_model="numpy", no_cfunc_wrapper=True)
def ring_slot(head, count, cap):
    """Where a FIFO timer ring's next timer goes."""
    slot = head + count
    if slot >= cap:
        slot -= cap
    return slot


@njit(cache=True, error_model="numpy")
def crash_node(isv, node_i, node_f, job_i, heap_t, heap_k, node, t):
    """The node stops serving: everything queued or in service fails now."""
    touch_busy(node_i, node_f, node, t)
    for j in range(job_i.shape[0]):
        state = job_i[j, JI_STATE]
        if (state == J_QUEUED or state == J_SERVING) and job_i[j, JI_NODE] == node:
            job_i[j, JI_GEN] += 1  # its pending completion is void
            end_now(isv, job_i, heap_t, heap_k, j, ERROR, t)
    node_i[node, NI_BUSY] = 0
    node_i[node, NI_QLEN] = 0
    node_i[node, NI_QHEAD] = -1
    node_i[node, NI_QTAIL] = -1


@njit(cache=True, error_model="numpy")
def fail_over(isv, node_i, job_i, heap_t, heap_k, node, t):
    """Move the work queued on a node just made unroutable: each job is re-routed now."""
    j = node_i[node, NI_QHEAD]
    node_i[node, NI_QLEN] = 0
    node_i[node, NI_QHEAD] = -1
    node_i[node, NI_QTAIL] = -1
    while j >= 0:
        nxt = job_i[j, JI_NEXT]
        if job_i[j, JI_CALL] < 0:  # a correctness probe is addressed to this node: it stays
            enqueue(node_i, job_i, node, j)
        else:
            job_i[j, JI_STATE] = J_MOVING
            heap_push(heap_t, heap_k, isv, t, event_key(j, EV_MOVE, job_i[j, JI_GEN]))
        j = nxt
    node_i[node, NI_FAILOVER] = 0


@njit(cache=True, error_model="numpy")
def enqueue(node_i, job_i, node, j):
    """Job j joins the tail of node's queue (a rare path's helper; the loop inlines it)."""
    job_i[j, JI_STATE] = J_QUEUED
    job_i[j, JI_NEXT] = -1
    tail = node_i[node, NI_QTAIL]
    job_i[j, JI_PREV] = tail
    if tail >= 0:
        job_i[tail, JI_NEXT] = j
    else:
        node_i[node, NI_QHEAD] = j
    node_i[node, NI_QTAIL] = j
    node_i[node, NI_QLEN] += 1


# ---- correctness probes: per node a Poisson stream (cfg_f[CF_PROBE_RATE] a second) of
# jobs with no call (JI_CALL = -1), on their own random stream, addressed to their node
# whatever routing, intake or shedding say; load like any request, counted apart
# (probe_requests_total, probe_failures_total: an error or a wrong answer), never in
# requests_total. A crashed node fails its probes at once.
@njit(cache=True, error_model="numpy")
def next_probe(rng, rate, n_nodes, t):
    return t + exponential(rng, RNG_PROBES, 1.0 / (rate * n_nodes)) if rate > 0.0 else np.inf


@njit(cache=True, error_model="numpy")
def probe_arrives(cfg_f, cfg_i, fs, isv, rng, ni, node_c, job_i, job_f, job_free, t):
    """A probe for a node drawn at random: queued there, or failed at once if it is down.
    Returns the node if a server may start it now, else -1."""
    n = ni.shape[0]
    node = min(int(uniform(rng, RNG_PROBES) * n), n - 1)
    demand = draw_service(rng, RNG_PROBES, cfg_i[CI_SVC_KIND], cfg_f[CF_SVC_A],
                          cfg_f[CF_SVC_B], cfg_f[CF_SVC_C])
    fs[FS_NEXT_PROBE] = next_probe(rng, cfg_f[CF_PROBE_RATE], n, t)
    if ni[node, NI_CRASHED] != 0:
        node_c[node, NC_PROBES] += 1
        node_c[node, NC_PROBE_FAILURES] += 1
        return -1
    nfree = isv[IS_JOB_FREE_N] - 1
    j = job_free[nfree]
    isv[IS_JOB_FREE_N] = nfree
    job_i[j, JI_CALL] = -1
    job_i[j, JI_NODE] = node
    job_i[j, JI_SIB] = -1
    job_i[j, JI_CLIENT] = C_LOST  # nobody waits on it: no timeout, no hedge, no retry
    job_i[j, JI_HEDGE] = 0
    job_i[j, JI_TIER] = GOLD
    job_i[j, JI_DEGRADED] = 0
    job_i[j, JI_OUTCOME] = OK
    job_f[j, JF_T_NODE] = t
    job_f[j, JF_DEMAND] = demand
    enqueue(ni, job_i, node, j)
    return node


# ---- start service: ONE path for every job a server starts (the loop's "start service"
# and a probe's start_service), so a job's service time never depends on how it reached
# the server. A probe pays no in-path decision cost: no in-path mechanism judges it (it
# bypasses admission, the limit never learns from it, CoDel sees its dequeue but never
# drops it; design.md).
@register_jitable(error_model="numpy", no_cfunc_wrapper=True)
def copy_demand(rng, svc_kind, a, b, c):
    """A hedge's or a retry's demand (stream ``copy_service``); exponential written out."""
    if svc_kind == S_EXP:
        return exponential(rng, RNG_COPY_SERVICE, a)
    return draw_service(rng, RNG_COPY_SERVICE, svc_kind, a, b, c)


@register_jitable(error_model="numpy", no_cfunc_wrapper=True)
def begin_service(ni, nf, job_i, job_f, nr, jr, t, s, degraded, degraded_mask, svc_factor,
                  probes, judge_cost):
    """Job row jr starts service at node row nr at t with demand s: its state, the node's
    busy count and area; returns its service time (demand x the node's slowdown, x
    ``svc_factor`` if ``degraded`` and its tier is in the mask, + ``judge_cost`` unless
    it is a probe). Callers pass the loop's constants, which fold away once inlined."""
    job_i[jr, JI_STATE] = J_SERVING
    job_f[jr, JF_T_START] = t
    busy = ni[nr, NI_BUSY]
    nf[nr, NF_BUSY_AREA] += busy * (t - nf[nr, NF_LAST_T])
    nf[nr, NF_LAST_T] = t
    ni[nr, NI_BUSY] = busy + 1
    s *= nf[nr, NF_SLOWDOWN]
    if degraded and (degraded_mask >> job_i[jr, JI_TIER]) & 1:
        s *= svc_factor  # the cheaper path, at a loss of quality
        job_i[jr, JI_DEGRADED] = 1
    if judge_cost > 0.0 and not (probes and job_i[jr, JI_CALL] < 0):
        s += judge_cost  # ---- in-path: the server's decisions cost service time
    return s


@njit(cache=True, error_model="numpy")
def start_service(cfg_f, cfg_i, isv, rng, ni, nf, job_i, job_f, heap_t, heap_k, node, t,
                  degraded_mask, svc_factor):
    """Start queued jobs where servers are free (for a probe; each through begin_service,
    as the loop's "start service")."""
    judge_cost = cfg_f[CF_JUDGE_COST] if cfg_i[CI_CL_ALGO] != CL_NONE or \
        cfg_i[CI_CODEL] != 0 or cfg_i[CI_DISCIPLINE] != D_FIFO else 0.0
    while ni[node, NI_QLEN] > 0 and ni[node, NI_BUSY] < ni[node, NI_SERVERS]:
        j = ni[node, NI_QHEAD]
        nxt = job_i[j, JI_NEXT]
        ni[node, NI_QHEAD] = nxt
        if nxt >= 0:
            job_i[nxt, JI_PREV] = -1
        else:
            ni[node, NI_QTAIL] = -1
        ni[node, NI_QLEN] -= 1
        if cfg_i[CI_CODEL] != 0:  # CoDel sees this dequeue too (a probe's: never dropped)
            codel_dequeued(ni, nf, node, t, cfg_f[CF_CODEL_TARGET], cfg_f[CF_CODEL_INTERVAL])
        s = job_f[j, JF_DEMAND]
        if s < 0.0:  # a hedge's or a retry's, as the loop draws it (a probe brings its own)
            s = copy_demand(rng, cfg_i[CI_SVC_KIND], cfg_f[CF_SVC_A], cfg_f[CF_SVC_B],
                            cfg_f[CF_SVC_C])
            job_f[j, JF_DEMAND] = s
        s = begin_service(ni, nf, job_i, job_f, node, j, t, s, True, degraded_mask,
                          svc_factor, True, judge_cost)
        heap_push(heap_t, heap_k, isv, t + s, event_key(j, EV_DONE, job_i[j, JI_GEN]))


@register_jitable(error_model="numpy", no_cfunc_wrapper=True)
def fault_state(fault_f, fault_i, nf, t):
    """Per node (error rate, slowdown, wrong-answer rate, crashed) from the faults active
    at t. A fault that began before the node's last repair is cleared (a repair mends what
    is broken now, not what breaks later); a baseline row (``fault_i[f, 2]``) is how the
    node is, which no repair clears. Compiled into the kernel; plain Python for
    :func:`schedule_step`."""
    n = nf.shape[0]
    err, slow, wrong = np.zeros(n), np.ones(n), np.zeros(n)
    crashed = np.zeros(n, np.int64)
    for f in range(fault_f.shape[0]):
        node = fault_i[f, 0]
        if fault_f[f, 0] <= t < fault_f[f, 1] and (fault_f[f, 0] > nf[node, NF_REPAIRED_AT]
                                                   or fault_i[f, 2] != 0):
            err[node] = 1.0 - (1.0 - err[node]) * (1.0 - fault_f[f, 2])
            slow[node] *= fault_f[f, 3]
            wrong[node] = 1.0 - (1.0 - wrong[node]) * (1.0 - fault_f[f, 4])
            if fault_i[f, 1] != 0:
                crashed[node] = 1
    return err, slow, wrong, crashed


@njit(cache=True, error_model="numpy")
def apply_faults(fault_f, fault_i, isv, ni, nf, job_i, heap_t, heap_k, t):
    """Set every node's fault state from the faults active at t (:func:`fault_state`)."""
    err, slow, wrong, crashed_now = fault_state(fault_f, fault_i, nf, t)
    for i in range(ni.shape[0]):
        nf[i, NF_ERR_RATE] = err[i]
        nf[i, NF_SLOWDOWN] = slow[i]
        nf[i, NF_WRONG_RATE] = wrong[i]
        if crashed_now[i] != 0 and ni[i, NI_CRASHED] == 0:
            crash_node(isv, ni, nf, job_i, heap_t, heap_k, i, t)
        ni[i, NI_CRASHED] = crashed_now[i]


@njit(cache=True, error_model="numpy")
def on_schedule(sched_t, fault_f, fault_i, fs, isv, ni, nf, job_i, heap_t, heap_k, t):
    """A fault starts or ends: recompute, and arm the next schedule time."""
    apply_faults(fault_f, fault_i, isv, ni, nf, job_i, heap_t, heap_k, t)
    pos = isv[IS_SCHED_POS] + 1
    isv[IS_SCHED_POS] = pos
    fs[FS_NEXT_SCHED] = sched_t[pos] if pos < sched_t.shape[0] else np.inf


@register_jitable(error_model="numpy", no_cfunc_wrapper=True)
def sample_node(m, sample_t, cnt, ni, nf, node_c, lat_b, isv, phase, dt, i, t):
    """What a scrape of node i at time t would return, as one row of out.metrics (m)."""
    s = ni[i, NI_NSAMPLE]
    sample_t[s, i] = t
    c = 0
    for tier in range(len(TIERS)):
        for o in range(len(OUTCOMES)):
            m[s, i, c] = cnt[i, tier, o]
            c += 1
    # (touch_busy written out: one function fewer to compile)
    nf[i, NF_BUSY_AREA] += ni[i, NI_BUSY] * (t - nf[i, NF_LAST_T])
    nf[i, NF_LAST_T] = t
    m[s, i, M_BUSY] = ni[i, NI_BUSY]
    m[s, i, M_QLEN] = ni[i, NI_QLEN]
    m[s, i, M_IN_FLIGHT] = ni[i, NI_BUSY] + ni[i, NI_QLEN]
    m[s, i, M_BUSY_SECONDS] = nf[i, NF_BUSY_AREA]
    m[s, i, M_WRONG] = node_c[i, NC_WRONG]
    m[s, i, M_CANCELLED] = node_c[i, NC_CANCELLED]
    m[s, i, M_PROBES] = node_c[i, NC_PROBES]
    m[s, i, M_PROBE_FAILURES] = node_c[i, NC_PROBE_FAILURES]
    m[s, i, M_REJECTED] = node_c[i, NC_REJECTED]
    m[s, i, M_CODEL_DROPPED] = node_c[i, NC_CODEL_DROPPED]
    m[s, i, M_CONC_LIMIT] = nf[i, NF_CL_LIMIT]
    m[s, i, M_LAT_SUM] = nf[i, NF_LAT_SUM]
    total = 0
    for b in range(lat_b.shape[1]):
        total += lat_b[i, b]
        m[s, i, M_BUCKETS + b] = total
    m[s, i, M_LAT_COUNT] = total
    ni[i, NI_NSAMPLE] = s + 1
    if s + 1 > isv[IS_MAX_NODE_SAMPLE]:
        isv[IS_MAX_NODE_SAMPLE] = s + 1
    nf[i, NF_NEXT_SAMPLE] = phase[i] + (s + 1) * dt


@register_jitable(error_model="numpy", no_cfunc_wrapper=True)
def next_node_sample(nf, fs):
    """The earliest next node sample, into fs (``start`` does the same in numpy); a compare,
    not ``min`` (one builtin fewer to compile per set of flags)."""
    best = np.inf
    for i in range(nf.shape[0]):
        x = nf[i, NF_NEXT_SAMPLE]
        if x < best:
            best = x
    fs[FS_NEXT_NODE_SAMPLE] = best


@register_jitable(error_model="numpy", no_cfunc_wrapper=True)
def sample_fleet(f, fleet_t, fleet_c, isv, fs, hist, dt, q, t):
    """Fleet-wide counters and flags (the front's view, a row of out.fleet: f), and the
    adaptive hedge delay (q: the hedge delay quantile, 0 for a fixed delay)."""
    s = isv[IS_NSAMPLE]
    fleet_t[s] = t
    for c in range(N_FLEET_COUNTERS):
        f[s, c] = fleet_c[c]
    f[s, F_BREAKER] = isv[IS_BREAKER]
    f[s, F_HEDGE_ON] = 1 if isv[IS_HEDGE_ON] != 0 else 0  # on for some tier
    f[s, F_DEGRADED_ON] = 1 if isv[IS_DEGRADED_ON] != 0 else 0
    for tier in range(len(TIERS)):
        f[s, F_SHEDDING + tier] = (isv[IS_SHED_MASK] >> tier) & 1
    isv[IS_NSAMPLE] = s + 1
    fs[FS_NEXT_SAMPLE] = (s + 1) * dt
    if q > 0.0:  # hedge after this quantile of the latency seen so far
        # plain loops, not .sum(axis=0): axis reductions are slow to compile
        total = 0
        for tier in range(hist.shape[0]):
            for b in range(hist.shape[2]):
                total += hist[tier, OK, b]
        if total >= 100:
            target = q * total
            cum = 0
            for b in range(hist.shape[2]):
                for tier in range(hist.shape[0]):
                    cum += hist[tier, OK, b]
                if cum >= target:
                    fs[FS_HEDGE_DELAY] = 10 ** (HIST_LOG10_MIN + (b + 1.0)
                                               / HIST_BINS_PER_DECADE) / 1000.0
                    break


@register_jitable(error_model="numpy", no_cfunc_wrapper=True)
def window_slot(bud, isv, row, at, width, t):
    """A sliding window's bucket for time t: BUDGET_BUCKETS buckets of ``width`` seconds in
    rows ``row``, ``row + 1`` of ``bud``, the current bucket's number at ``isv[at]``; the
    buckets it leaves behind are zeroed. The retry budget (rows 0, 1: first attempts and
    retries; IS_BUDGET_BUCKET) allows a retry while retries stay below budget_ratio times
    first attempts; the client throttle's (BUDGET_THR_REQ, BUDGET_THR_ACC;
    IS_THROTTLE_BUCKET) totals, IS_THROTTLE_REQ and IS_THROTTLE_ACC, lose them too."""
    b = int(t / width)
    cur = isv[at]
    if b > cur:
        for k in range(cur + 1, min(b, cur + BUDGET_BUCKETS) + 1):
            s = k % BUDGET_BUCKETS
            if at == IS_THROTTLE_BUCKET:
                isv[IS_THROTTLE_REQ] -= bud[row, s]
                isv[IS_THROTTLE_ACC] -= bud[row + 1, s]
            bud[row, s] = 0
            bud[row + 1, s] = 0
        isv[at] = b
    return b % BUDGET_BUCKETS


# ---- in-path mechanisms (issue 33): decisions in the request path from local state, at
# once: the client's adaptive throttle, a server's adaptive concurrency limit, CoDel and the
# queue's discipline (THROTTLE, CONCURRENCY, CODEL; off, the loop's calls fold away).
CL_NONE, CL_AIMD, CL_GRADIENT = -1, *(CONCURRENCY_ALGORITHMS.index(a) for a in ("aimd",
                                                                               "gradient"))
D_FIFO, D_LIFO, D_ADAPTIVE_LIFO = (QUEUE_DISCIPLINES.index(d) for d in QUEUE_DISCIPLINES)
CODEL_DROPS_MAX = 8  # CoDel drops one event may make (heap room): the rest wait a dequeue
NODE_THROTTLED = -2  # (the send section's mark for a copy its client throttled)


@register_jitable(error_model="numpy", no_cfunc_wrapper=True)
def throttle_judge(bud, isv, rng, k, slot):
    """Client-side adaptive throttling (SRE book): over the window, reject this request
    locally with probability max(0, (requests - k accepts) / (requests + 1)); the
    request is counted either way (``slot``: the window's bucket now). A draw (stream
    ``throttle``) only when p > 0."""
    req = isv[IS_THROTTLE_REQ]
    p = (req - k * isv[IS_THROTTLE_ACC]) / (req + 1.0)
    bud[BUDGET_THR_REQ, slot] += 1
    isv[IS_THROTTLE_REQ] = req + 1
    return p > 0.0 and uniform(rng, RNG_THROTTLE) < p


@register_jitable(error_model="numpy", no_cfunc_wrapper=True)
def gradient_limit(cfg_f, cfg_i, ni, nf, node):
    """A node's concurrency limit at the end of a window of samples, gradient controller
    (Envoy's manner): limit x g + sqrt(limit x g), g = min_rtt (1 + buffer) / the
    window's mean rtt, clamped to [0.5, 2]; min_rtt the least window mean of this and
    the last period of windows. (AIMD and the clamp to [min, max] are written out in the
    loop: a helper taking arrays at every completion was slower, docs/performance.md.)"""
    n = ni[node, NI_CL_COUNT]
    sample = nf[node, NF_CL_SUM] / n
    ni[node, NI_CL_COUNT] = 0
    nf[node, NF_CL_SUM] = 0.0
    if sample < nf[node, NF_CL_PERIOD_MIN]:
        nf[node, NF_CL_PERIOD_MIN] = sample
    if sample < nf[node, NF_CL_MIN_RTT]:
        nf[node, NF_CL_MIN_RTT] = sample
    w = ni[node, NI_CL_WINDOWS] + 1
    if w >= cfg_i[CI_CL_PERIOD]:  # a new period: forget minima older than the last
        nf[node, NF_CL_MIN_RTT] = nf[node, NF_CL_PERIOD_MIN]
        nf[node, NF_CL_PERIOD_MIN] = np.inf
        w = 0
    ni[node, NI_CL_WINDOWS] = w
    g = nf[node, NF_CL_MIN_RTT] * (1.0 + cfg_f[CF_CL_BUFFER]) / sample if sample > 0.0 else 2.0
    g = min(max(g, 0.5), 2.0)
    limit = nf[node, NF_CL_LIMIT] * g
    return limit + math.sqrt(limit)


@register_jitable(error_model="numpy", no_cfunc_wrapper=True)
def congested(cfg_f, nf, nr, t):
    """CoDel's signal at a node: its queue has not been empty for a whole interval.

    CoDel as RPC servers run it (Maurer, "Fail at Scale", 2015), written out in the loop's
    "start service": a copy dequeued after waiting more than ``target`` while the node is
    congested, or more than ``interval`` otherwise, is dropped (``rejected``). Unlike TCP's
    sqrt(count) control law it bounds the standing delay whatever the load (design.md)."""
    return t - nf[nr, NF_CODEL_LAST_EMPTY] > cfg_f[CF_CODEL_INTERVAL]


@register_jitable(error_model="numpy", no_cfunc_wrapper=True)
def codel_dequeued(ni, nf, nr, t, target, interval):
    """CoDel sees a dequeue at node row nr: returns the wait it allows the job (``target``
    while congested, else ``interval``) and notes the queue empty if it now is. Every dequeue,
    a probe's too (RFC 8289 updates on each): a probe that waited in the queue is evidence of
    its standing delay like any request; CoDel only never drops one (design.md)."""
    allowed = target if t - nf[nr, NF_CODEL_LAST_EMPTY] > interval else interval
    if ni[nr, NI_QLEN] == 0:
        nf[nr, NF_CODEL_LAST_EMPTY] = t
    return allowed


@register_jitable(error_model="numpy", no_cfunc_wrapper=True)
def newest_first(cfg_f, nf, nr, discipline, t):
    """Whether the node serves its newest copy next: always (lifo), or while CoDel
    finds its queue congested (adaptive_lifo)."""
    return discipline == D_LIFO or congested(cfg_f, nf, nr, t)


@register_jitable(error_model="numpy", no_cfunc_wrapper=True)
def dequeue_newest(ni, job_i, nr):
    """The copy at the queue's tail, unlinked (LIFO)."""
    j = ni[nr, NI_QTAIL]
    prv = job_i[j, JI_PREV]
    ni[nr, NI_QTAIL] = prv
    if prv >= 0:
        job_i[prv, JI_NEXT] = -1
    else:
        ni[nr, NI_QHEAD] = -1
    ni[nr, NI_QLEN] -= 1
    return j


@register_jitable(error_model="numpy", no_cfunc_wrapper=True)
def client_tier(cfg_i, client):
    """A closed client's tier (its id's place among the tiers' populations, gold first)
    and the tier's first id."""
    tier = 0
    base = 0
    while client >= base + cfg_i[CI_CLIENTS + tier] and tier < len(TIERS) - 1:
        base += cfg_i[CI_CLIENTS + tier]
        tier += 1
    return tier, base


@register_jitable(error_model="numpy", no_cfunc_wrapper=True)
def think_time(cfg_i, cfg_f, rng, tier):
    """A think time of the tier's clients (seconds), from the clients stream."""
    p = CF_THINK + 3 * tier
    return draw_service(rng, RNG_CLIENTS, cfg_i[CI_THINK_KIND + tier], cfg_f[p], cfg_f[p + 1],
                        cfg_f[p + 2])


@register_jitable(error_model="numpy", no_cfunc_wrapper=True)
def client_cut(cfg_i, isv, client):
    """Whether a closed client's id is among those a population step cut (IS_CUT)."""
    tier, base = client_tier(cfg_i, client)
    return client - base >= cfg_i[CI_CLIENTS + tier] - isv[IS_CUT + tier]


@njit(cache=True, error_model="numpy")
def client_think_starts(cfg_i, cfg_f, rng, counts):
    """First think times for ``counts[tier]`` clients of each tier, gold first, drawn by
    :func:`think_time` from the clients stream as the loop draws the later ones."""
    times = np.empty(counts.sum())
    client = 0
    for tier in range(len(TIERS)):
        for _ in range(counts[tier]):
            times[client] = think_time(cfg_i, cfg_f, rng, tier)
            client += 1
    return times


def client_ids(cfg, st):
    """Per tier, the client ids not cut (IS_CUT), in order: the tier's population now."""
    pops = cfg.cfg_i[CI_CLIENTS:CI_CLIENTS + len(TIERS)]
    base = np.concatenate([[0], np.cumsum(pops)[:-1]])
    live = pops - st.is_[IS_CUT:IS_CUT + len(TIERS)]
    return [base[k] + np.arange(live[k], dtype=np.int64) for k in range(len(TIERS))]


def start_thinking(cfg, st, ids, t):
    """The closed clients ``ids`` (per tier, gold first) begin thinking at time ``t``, their
    first sends all put on the heap at once: merged, sorted, with what it holds (a sorted
    array is a heap; a push per client was a Python call each). O((heap + clients) log)."""
    counts = np.array([x.size for x in ids], np.int64)
    total = int(counts.sum())
    if total == 0:
        return
    times = t + client_think_starts(cfg.cfg_i, cfg.cfg_f, st.rng, counts)
    n = int(st.is_[IS_HEAP_N])  # (the events it holds: kept, in time order)
    if st.heap_t.shape[0] < n + total:
        raise RuntimeError("start_thinking: the heap must hold every client")
    t_all = np.concatenate([st.heap_t[:n], times])
    k_all = np.concatenate([st.heap_k[:n], (np.concatenate(ids) << EV_BITS) | EV_THINK])
    order = np.argsort(t_all, kind="stable")
    st.heap_t[:n + total] = t_all[order]
    st.heap_k[:n + total] = k_all[order]
    st.is_[IS_HEAP_N] = n + total
    st.is_[IS_EVENTS + EV_THINK] += total  # (the loops count their heap events by kind)


def client_starts(cfg, st):
    """Every closed client begins thinking at t = 0 (those a population schedule has at
    0: IS_CUT), by :func:`start_thinking`. Once per run, O(clients)."""
    start_thinking(cfg, st, client_ids(cfg, st), 0.0)


def population_step(cfg, st, t, live):
    """A population schedule's step at time ``t``: each tier's population is ``live[tier]``
    from now. Ids above it are cut (IS_CUT: each retires when its think ends); ids within it
    neither thinking nor waiting on a request start thinking at ``t`` (:func:`start_thinking`)."""
    pops = cfg.cfg_i[CI_CLIENTS:CI_CLIENTS + len(TIERS)]
    st.is_[IS_CUT:IS_CUT + len(TIERS)] = pops - np.asarray(live, np.int64)
    n = int(st.is_[IS_HEAP_N])
    keys = st.heap_k[:n]
    alive = np.zeros(int(pops.sum()), bool)
    alive[(keys[(keys & EV_MASK) == EV_THINK] >> EV_BITS) & ID_MASK] = True
    in_flight = np.ones(st.usr_i.shape[0], bool)
    in_flight[st.usr_free[:st.is_[IS_USR_FREE_N]]] = False
    waiting = st.usr_i[in_flight, UI_CLIENT]
    alive[waiting[waiting >= 0]] = True
    start_thinking(cfg, st, [ids[~alive[ids]] for ids in client_ids(cfg, st)], t)


def schedule_step(cfg, st):
    """The fault-schedule change due now, applied as the loop's :func:`on_schedule` would,
    for a schedule with no crashing row, in Python: the stretch around it may then run in
    a lean loop, and nothing is compiled for it (``on_schedule`` for Python: ~3 s)."""
    nf = st.node_f
    if cfg.fault_i[:, 1].any():
        raise ValueError("schedule_step: a crashing fault is the general kernel's")
    err, slow, wrong, _ = fault_state(cfg.fault_f, cfg.fault_i, nf, st.fs[FS_NEXT_SCHED])
    nf[:, NF_ERR_RATE] = err
    nf[:, NF_SLOWDOWN] = slow
    nf[:, NF_WRONG_RATE] = wrong
    st.node_i[:, NI_CRASHED] = 0
    pos = st.is_[IS_SCHED_POS] + 1  # on_schedule's step to the next change
    st.is_[IS_SCHED_POS] = pos
    st.fs[FS_NEXT_SCHED] = cfg.sched_t[pos] if pos < cfg.sched_t.shape[0] else np.inf


def schedule_at_start(cfg, st):
    """A schedule change due at t = 0 with no crashing row, applied before the first kernel
    call (:func:`schedule_step`): a scaled or faulty fleet then starts in a lean loop."""
    if st.fs[FS_NEXT_SCHED] <= 0.0 and not cfg.fault_i[:, 1].any():
        schedule_step(cfg, st)


def start(cfg, st):
    """Draw the first arrival and arm the fault schedule (once, at t = 0), in Python over
    arrays-only kernels."""
    const = cfg.cfg_i[CI_CONST_RATE] != 0
    rmax = cfg.cfg_f[CF_RATE_MAX]
    if const and rmax > 0.0:  # next_arrival's own draw, in Python: nothing to compile
        st.fs[FS_NEXT_ARRIVAL] = 0.0 + exponential_py(st.rng, RNG_ARRIVALS, 1.0 / rmax)
    else:
        st.fs[FS_NEXT_ARRIVAL] = next_arrival(st.rng, rmax, const, cfg.rate_t, cfg.rate_v, 0.0)
    st.fs[FS_NEXT_SCHED] = cfg.sched_t[0] if cfg.sched_t.shape[0] > 0 else np.inf
    schedule_at_start(cfg, st)
    rate = cfg.cfg_f[CF_PROBE_RATE]  # no probes: no draw, next_probe not compiled
    st.fs[FS_NEXT_PROBE] = next_probe(st.rng, rate, st.node_i.shape[0], 0.0) if rate > 0.0 \
        else np.inf
    st.node_f[:, NF_NEXT_SAMPLE] = cfg.phase
    client_starts(cfg, st)
    # next_node_sample's minimum, in numpy (no dispatcher of its own to compile)
    st.fs[FS_NEXT_NODE_SAMPLE] = st.node_f[:, NF_NEXT_SAMPLE].min(initial=np.inf)


# ---- the loop ---------------------------------------------------------------------
def advance(cfg_f, cfg_i, tier_cum, rate_t, rate_v, sched_t, fault_f, fault_i, load_x, load_p,
            buckets, phase, dep_node, dep_share,
            fs, is_, rng, node_i, node_f, node_c, cnt, lat_b, fleet_c, budget, job_i, job_f,
            job_free, usr_i, usr_f, usr_free, call_i, call_f, call_free, heap_t, heap_k, tq_t,
            tq_k, tq_n, scratch, send, pend_t, pend_k, demand,
            metrics, sample_t, fleet, fleet_t, rec_f, rec_i, hist, tier_cnt, tier_ext, lat_sum,
            t_end):
    """Process every event with time <= t_end, or stop early asking for room.

    Each event does its own part, then the sections every event shares: settle the call a
    copy answered (retry, cancel the other copies, finish), record the user request that
    ended, send the copies the event asked for, start service where servers are free, file
    the heap timers it set. So every mechanism is written once. The hot path is written out
    rather than in helpers that take arrays (numba's reference counting of each array handed
    over cost a third of the run); rare paths are helpers. The scalars every event touches
    live in locals, written back where a helper reads them (HELPER_SYNC) and on return.
    What each section costs: docs/performance.md.

    Its parameters are the fields of :class:`Config`, :class:`State` and :class:`Output` in
    order, then ``t_end`` (:func:`run` unpacks them), in every specialisation.
    """
    isv = is_
    bounds = buckets
    touched = scratch
    tq_cap = tq_t.shape[1]

    if SIMPLE and not lean_rows(job_i, job_f, call_i, call_f, usr_i, usr_f, False):
        return ROWS_NOT_LEAN  # (before any write)
    n_nodes = node_i.shape[0]
    heap_cap = heap_t.shape[0]
    n_jobs = job_i.shape[0]
    # flags and controls, as Python left them (they change only between calls)
    for i in range(n_nodes):
        if LEFTOVERS and node_i[i, NI_FAILOVER] != 0:
            if heap_cap - isv[IS_HEAP_N] < n_jobs:
                return GROW_POOLS
            fail_over(isv, node_i, job_i, heap_t, heap_k, i, fs[FS_NOW])
    prepare_routing(node_i, node_f, isv, fs)
    n_elig = isv[IS_N_ELIGIBLE]
    if SIMPLE and n_elig != n_nodes:
        return ROWS_NOT_LEAN  # (never, given simple_ok: below, each request has one node)
    shed_mask = isv[IS_SHED_MASK]
    hedge_mask = isv[IS_HEDGE_ON]  # the tiers hedged (bit per tier; all: ALL_TIERS)
    degraded_mask = isv[IS_DEGRADED_ON]  # the tiers served degraded
    degraded_on = degraded_mask != 0
    breaker = isv[IS_BREAKER]
    fanout = 1 if SIMPLE or ONE_CALL else cfg_i[CI_FANOUT]
    k_deg = cfg_i[CI_DEGRADED_FANOUT]
    record = cfg_i[CI_RECORD] != 0
    warmup = cfg_f[CF_WARMUP]
    qlim = cfg_i[CI_QUEUE_LIMIT]
    svc_kind = cfg_i[CI_SVC_KIND]
    svc_a = cfg_f[CF_SVC_A]
    svc_b = cfg_f[CF_SVC_B]
    svc_c = cfg_f[CF_SVC_C]
    svc_factor = cfg_f[CF_DEGRADED_FACTOR] if degraded_on else 1.0
    routing = cfg_i[CI_ROUTING]
    const_rate = cfg_i[CI_CONST_RATE] != 0
    rmax = cfg_f[CF_RATE_MAX]
    mean_gap = 1.0 / rmax if rmax > 0.0 else np.inf
    deadline = cfg_f[CF_DEADLINE]
    max_attempts = cfg_i[CI_MAX_ATTEMPTS]
    max_hedges = cfg_i[CI_MAX_HEDGES]
    cancel = cfg_i[CI_CANCEL]
    retry_mask = cfg_i[CI_RETRY_MASK]
    keep_listening = KEEP_LISTENING and cfg_i[CI_KEEP_LISTENING] != 0
    # fixed-delay hedges fall due in order (a ring); adaptive ones may not (the heap)
    hedge_queue = TQ_HEDGE if cfg_f[CF_HEDGE_Q] == 0.0 else TQ_HEAP
    budget_ratio = cfg_f[CF_BUDGET_RATIO]
    budgeted = budget_ratio < np.inf
    budget_width = cfg_f[CF_BUDGET_WINDOW] / BUDGET_BUCKETS
    elsewhere = cfg_i[CI_ELSEWHERE] != 0
    breaker_mask = cfg_i[CI_BREAKER_MASK]
    has_load_errors = load_x.shape[0] > 0
    has_clients = False  # (CLIENTS) a row a loop without clients wrote holds no client
    for i in range(len(TIERS)):
        if CLIENTS and cfg_i[CI_CLIENTS + i] > 0:
            has_clients = True
    has_deps = False
    for i in range(dep_node.shape[0]):
        if dep_node[i] >= 0:
            has_deps = True
    n_bounds = bounds.shape[0]
    record_cap = rec_f.shape[0]
    samp_cap = sample_t.shape[0]
    fleet_cap = fleet_t.shape[0]
    room = fanout + max_hedges + 4  # jobs and calls one event may need
    heap_room = 4 * fanout + 16  # timers, starts and immediate ends one event may push
    uniform_random = routing == R_RANDOM and isv[IS_EQUAL_WEIGHTS] != 0
    t_arr = fs[FS_NEXT_ARRIVAL]
    status = DONE
    # the two streams every arrival draws from live in locals until the loop ends
    a0, a1, a2, a3 = words(rng, RNG_ARRIVALS)
    v0, v1, v2, v3 = words(rng, RNG_SERVICE)
    # the scalars every event touches live in locals (registers):
    # in isv numba reloads them after every store to another int64 array (it may alias).
    # Written back before a helper that reads them (HELPER_SYNC below) and on return.
    hn = isv[IS_HEAP_N]
    job_free_n = isv[IS_JOB_FREE_N]
    usr_free_n = isv[IS_USR_FREE_N]
    call_free_n = isv[IS_CALL_FREE_N]
    n_rec = isv[IS_NREC]
    user_seq = isv[IS_USER_SEQ]
    in_flight = isv[IS_IN_FLIGHT_USERS]
    stamp = isv[IS_STAMP]
    n_old, n_old_g = isv[IS_OLD], isv[IS_OLD_GENERAL]  # (rows live at the marks: IS_OLD)
    drain = isv[IS_DRAIN] if LEFTOVERS else 0
    mark, mark_g = fs[FS_MARK], fs[FS_MARK_GENERAL]
    to_h, to_n = tq_n[TQ_TIMEOUT, 0], tq_n[TQ_TIMEOUT, 1]  # the rings' (head, count)
    he_h, he_n = tq_n[TQ_HEDGE, 0], tq_n[TQ_HEDGE, 1]
    budget_bucket = isv[IS_BUDGET_BUCKET]
    now = fs[FS_NOW]
    hedge_delay = fs[FS_HEDGE_DELAY]  # changes only at a fleet sample (adaptive hedging)
    # the next rare event's times (fault schedule, samples, probe), reloaded after one
    t_fleet = fs[FS_NEXT_SAMPLE]
    t_node = fs[FS_NEXT_NODE_SAMPLE]
    t_sched = fs[FS_NEXT_SCHED] if LEFTOVERS else np.inf  # (none due: loops.plain_ok)
    t_probe = fs[FS_NEXT_PROBE] if PROBES else np.inf
    t_rare = min(min(t_fleet, t_probe), min(t_node, t_sched))
    # the error draws' and the routing draws' streams in locals too (e*, r*)
    e0, e1, e2, e3 = words(rng, RNG_ERRORS)
    r0, r1, r2, r3 = words(rng, RNG_ROUTING)
    # admission checks beyond a crashed node: only if some control asks for them (they
    # change between calls only; a crash may come from the fault schedule at any time)
    checks = qlim >= 0 or shed_mask != 0
    for i in range(n_nodes):
        if node_i[i, NI_INTAKE_LIMIT] >= 0 or node_f[i, NF_TOKEN_RATE] < np.inf:
            checks = True
    # ---- in-path (issue 33): the mechanisms' settings (helpers above, "in-path" below)
    throttle_on = THROTTLE and cfg_f[CF_THROTTLE_K] > 0.0
    throttle_k = cfg_f[CF_THROTTLE_K]
    throttle_width = cfg_f[CF_THROTTLE_WIDTH]
    thr_slot = 0  # the window's current bucket, valid before thr_next (rolled on first use)
    thr_next = -1.0
    client_cost_ms = cfg_f[CF_THROTTLE_COST] * 1000.0  # a client decision's latency
    cl_on = CONCURRENCY and cfg_i[CI_CL_ALGO] != CL_NONE
    cl_algo, cl_window = cfg_i[CI_CL_ALGO], cfg_i[CI_CL_WINDOW]
    cl_min, cl_max, cl_backoff = cfg_f[CF_CL_MIN], cfg_f[CF_CL_MAX], cfg_f[CF_CL_BACKOFF]
    cl_latency = cfg_f[CF_CL_LATENCY]
    codel_target, codel_interval = cfg_f[CF_CODEL_TARGET], cfg_f[CF_CODEL_INTERVAL]
    codel_on = CODEL and cfg_i[CI_CODEL] != 0
    discipline = cfg_i[CI_DISCIPLINE]
    # a server decision's service time (s); 0 (folded) with no server-side mechanism
    serve_cost = cfg_f[CF_JUDGE_COST] if CONCURRENCY or CODEL else 0.0
    if CODEL:
        heap_room += CODEL_DROPS_MAX
    while True:
        # ---- loop head: drop the rings' stale heads (most timeouts and fixed-delay hedges
        # fall due after their copy or call is over), one row read each
        while (DEADLINES or LEFTOVERS) and to_n > 0:
            key = tq_k[TQ_TIMEOUT, to_h]
            j = (key >> EV_BITS) & ID_MASK
            if (job_i[j, JI_GEN] & GEN_MASK) == key >> 32 and job_i[j, JI_CLIENT] == C_WAITING:
                break
            to_h, to_n = ring_pop(to_h, to_n, tq_cap)
        while (HEDGING or LEFTOVERS) and he_n > 0:
            key = tq_k[TQ_HEDGE, he_h]
            if (call_i[(key >> EV_BITS) & ID_MASK, CL_GEN] & GEN_MASK) == key >> 32:
                break
            he_h, he_n = ring_pop(he_h, he_n, tq_cap)
        t_heap = heap_t[0] if hn > 0 else np.inf
        src = TQ_HEAP  # where the earliest timer waits: the heap or a FIFO ring
        if (DEADLINES or LEFTOVERS) and to_n > 0 and tq_t[TQ_TIMEOUT, to_h] < t_heap:
            t_heap = tq_t[TQ_TIMEOUT, to_h]
            src = TQ_TIMEOUT
        if (HEDGING or LEFTOVERS) and he_n > 0 and tq_t[TQ_HEDGE, he_h] < t_heap:
            t_heap = tq_t[TQ_HEDGE, he_h]
            src = TQ_HEDGE
        t = min(t_arr, t_heap)
        if t_rare <= t and t_rare <= t_end:  # ---- fault schedule, metrics sample or probe
            if PROBES and t_probe == t_rare:
                if job_free_n < 1 or heap_cap - hn < 2:
                    status = GROW_POOLS
                    break
                now = t_probe
                isv[IS_JOB_FREE_N] = job_free_n  # HELPER_SYNC: the helpers use isv's
                isv[IS_HEAP_N] = hn
                node = probe_arrives(cfg_f, cfg_i, fs, isv, rng, node_i, node_c, job_i, job_f,
                                     job_free, t_probe)
                if node >= 0:
                    start_service(cfg_f, cfg_i, isv, rng, node_i, node_f, job_i, job_f, heap_t,
                                  heap_k, node, t_probe, degraded_mask, svc_factor)
                job_free_n = isv[IS_JOB_FREE_N]
                hn = isv[IS_HEAP_N]
            elif LEFTOVERS and t_sched == t_rare:
                if heap_cap - hn < n_jobs:  # a crash may end every job at once
                    status = GROW_POOLS
                    break
                isv[IS_HEAP_N] = hn  # HELPER_SYNC
                on_schedule(sched_t, fault_f, fault_i, fs, isv, node_i, node_f, job_i, heap_t,
                            heap_k, t_sched)
                hn = isv[IS_HEAP_N]
            elif t_node == t_rare:
                if isv[IS_MAX_NODE_SAMPLE] >= samp_cap:
                    status = GROW_SAMPLES
                    break
                now = t_node
                for i in range(n_nodes):
                    if node_f[i, NF_NEXT_SAMPLE] == t_node:
                        sample_node(metrics, sample_t, cnt, node_i, node_f, node_c,
                                    lat_b, isv, phase, cfg_f[CF_SAMPLE_DT], i, t_node)
                next_node_sample(node_f, fs)
            else:
                if isv[IS_NSAMPLE] >= fleet_cap:
                    status = GROW_SAMPLES
                    break
                now = t_fleet
                sample_fleet(fleet, fleet_t, fleet_c, isv, fs, hist,
                             cfg_f[CF_SAMPLE_DT], cfg_f[CF_HEDGE_Q], t_fleet)
                hedge_delay = fs[FS_HEDGE_DELAY]
            t_fleet = fs[FS_NEXT_SAMPLE]
            t_node = fs[FS_NEXT_NODE_SAMPLE]
            t_sched = fs[FS_NEXT_SCHED] if LEFTOVERS else np.inf
            t_probe = fs[FS_NEXT_PROBE] if PROBES else np.inf
            t_rare = min(min(t_fleet, t_probe), min(t_node, t_sched))
            continue
        if t > t_end:
            now = max(now, t_end)
            break
        if drain != 0 and (n_old if drain == 1 else n_old_g) == 0:
            status = SETTLED  # (IS_DRAIN) a leaner loop may take it from here
            break
        # room for the worst case of one event, checked before touching anything
        if (job_free_n < room or usr_free_n < 2 or call_free_n < room
                or heap_cap - hn < heap_room or tq_cap - to_n < room
                or tq_cap - he_n < room):
            status = GROW_POOLS
            break
        if record and record_cap - n_rec < 2:
            status = GROW_RECORDS
            break
        now = t
        n_touched = 0  # nodes whose queue may now start service
        n_send = 0  # copies to send: (call, node, is_hedge, existing job or -1)
        res_c = -1  # the call a copy answered, or gave up on
        res_job = -1
        res_outcome = OK
        res_node = -1
        res_hedge = 0
        res_correct = 1
        res_degraded = 0
        res_late = False  # (keep_listening) the copy is past its deadline, still listened to
        fin_u = -1  # user request whose client sees its outcome now
        fin_outcome = OK
        fin_j = -1  # (SIMPLE) its copy, whose row stands in for the user's and call's
        if ONE_CALL:  # its call's values, which stand in for its user row's (LEAN_USER)
            end_tier = end_attempts = end_hedges = end_crit = end_wrong = end_degraded = 0
            end_demand = 0.0
        new_tier = 0  # (SIMPLE) the tier of the request arriving now
        direct = -1  # (SIMPLE) its copy, when it starts at once (see send)
        n_pend = 0  # timers to push once the event is done
        thinker = -1  # (CLIENTS) the closed client sending now

        if t_heap <= t_arr and src == TQ_TIMEOUT:  # ---- a timer from a FIFO ring
            key = tq_k[TQ_TIMEOUT, to_h]
            to_h, to_n = ring_pop(to_h, to_n, tq_cap)
        elif t_heap <= t_arr and src == TQ_HEDGE:
            key = tq_k[TQ_HEDGE, he_h]
            he_h, he_n = ring_pop(he_h, he_n, tq_cap)
        elif t_heap <= t_arr:  # ---- a timed event from the heap
            key = heap_k[0]
            if LEFTOVERS and (key & EV_MASK) != EV_DONE:  # (IS_EVENTS)
                isv[IS_EVENTS + (key & EV_MASK)] -= 1
            # pop the heap's top: sift the last entry down from the root
            hn -= 1
            if hn > 0:
                # unsigned positions: numba adds no negative-index fix-up to each access
                un = np.uint64(hn)
                last_t = heap_t[un]
                last_k = heap_k[un]
                i = U0
                while True:
                    c = i + i + U1
                    if c >= un:
                        break
                    tc = heap_t[c]
                    if c + U1 < un:  # the smaller child, branch-free (which one is a
                        t2 = heap_t[c + U1]  # coin toss: a branch mispredicts half the time)
                        c += np.uint64(t2 < tc)
                        tc = min(t2, tc)
                    if tc >= last_t:
                        break
                    heap_t[i] = tc
                    heap_k[i] = heap_k[c]
                    i = c
                heap_t[i] = last_t
                heap_k[i] = last_k
        if t_heap <= t_arr:  # ---- a timed event
            gen = key >> 32
            ident = (key >> EV_BITS) & ID_MASK
            kind = key & EV_MASK
            if not LEFTOVERS or kind == EV_DONE:  # a copy ends at its node: served, rejected
                # or crashed (a plain stretch's only event: LEFTOVERS)
                j = ident
                jr = ROW(j)
                if (job_i[jr, JI_GEN] & GEN_MASK) != gen:
                    continue  # stale: the job was cancelled or voided
                node = job_i[jr, JI_NODE]
                outcome = job_i[jr, JI_OUTCOME]
                correct = 1
                probe = PROBES and job_i[jr, JI_CALL] < 0  # a correctness probe: its own dice
                if not ENDS_EARLY or job_i[jr, JI_STATE] == J_SERVING:
                    nr = ROW(node)  # (a serving copy has one)
                    busy = node_i[nr, NI_BUSY]
                    node_f[nr, NF_BUSY_AREA] += busy * (t - node_f[nr, NF_LAST_T])
                    node_f[nr, NF_LAST_T] = t
                    node_i[nr, NI_BUSY] = busy - 1
                    touched[0] = node
                    n_touched = 1
                    outcome = OK
                    err = node_f[node, NF_ERR_RATE] if ERRORS else 0.0
                    dep = dep_node[node] if ERRORS and has_deps else -1
                    if dep >= 0:  # its downstream dependency fails its share of calls
                        dep_err = 1.0 if node_i[dep, NI_CRASHED] != 0 else node_f[dep, NF_ERR_RATE]
                        err = 1.0 - (1.0 - err) * (1.0 - dep_share[node] * dep_err)
                    if ERRORS and has_load_errors:  # errors growing with load (in flight/server)
                        load = (busy + node_i[node, NI_QLEN]) / node_i[node, NI_SERVERS]
                        p = np.interp(load, load_x, load_p)
                        err = 1.0 - (1.0 - err) * (1.0 - p)
                    if err > 0.0:
                        if probe:
                            x = uniform(rng, RNG_PROBES)
                        else:
                            x, e0, e1, e2, e3 = uniform_words(e0, e1, e2, e3)
                        if x < err:
                            outcome = ERROR
                    wrong = node_f[node, NF_WRONG_RATE] if ERRORS else 0.0
                    if outcome == OK and wrong > 0.0:
                        if probe:
                            x = uniform(rng, RNG_PROBES)
                        else:
                            x, e0, e1, e2, e3 = uniform_words(e0, e1, e2, e3)
                        if x < wrong:
                            correct = 0  # a silent failure: success, wrong answer
                            if not probe:
                                node_c[node, NC_WRONG] += 1
                    # the server's latency histogram (Prometheus buckets, seconds)
                    lat = t - job_f[jr, JF_T_NODE]
                    b = 0  # bounds below the latency (they increase), branch-free
                    for ib in range(n_bounds):
                        b += lat > bounds[ib]
                    if not probe:
                        lat_b[nr, ROW(b)] += 1
                        node_f[nr, NF_LAT_SUM] += lat
                    if CONCURRENCY and cl_on and not probe:  # ---- in-path: the limit learns
                        cl_limit = node_f[nr, NF_CL_LIMIT]
                        if cl_algo == CL_GRADIENT:  # a window's samples, then the gradient
                            node_f[nr, NF_CL_SUM] += lat
                            node_i[nr, NI_CL_COUNT] += 1
                            if node_i[nr, NI_CL_COUNT] >= cl_window:
                                cl_limit = gradient_limit(cfg_f, cfg_i, node_i, node_f, node)
                        elif lat > cl_latency or job_i[j, JI_CLIENT] == C_TIMED_OUT:
                            cl_limit *= cl_backoff  # AIMD: a failure
                        else:
                            cl_limit += 1.0 / cl_limit
                        node_f[nr, NF_CL_LIMIT] = min(max(cl_limit, cl_min), cl_max)
                    if THROTTLE and throttle_on and not probe and job_i[j, JI_CLIENT] == C_WAITING:
                        if t >= thr_next:  # ---- in-path: an accept; the window moves on
                            thr_slot = window_slot(budget, isv, BUDGET_THR_REQ, IS_THROTTLE_BUCKET,
                                                   throttle_width, t)
                            thr_next = (isv[IS_THROTTLE_BUCKET] + 1) * throttle_width
                        budget[BUDGET_THR_ACC, thr_slot] += 1
                        isv[IS_THROTTLE_ACC] += 1
                client = job_i[j, JI_CLIENT] if LEFTOVERS or DEADLINES else C_WAITING
                if probe:
                    node_c[node, NC_PROBES] += 1
                    if outcome != OK or correct == 0:
                        node_c[node, NC_PROBE_FAILURES] += 1
                elif node >= 0:  # the server's own count
                    seen = TIMEOUT if (outcome == OK and (client == C_TIMED_OUT or (
                        KEEP_LISTENING and client == C_LATE))) else outcome
                    cnt[ROW(node), ROW(job_i[jr, JI_TIER]), seen] += 1
                if KEEP_LISTENING and client == C_LATE:  # its client still listens
                    res_late = True
                    client = C_WAITING
                if client == C_WAITING:
                    res_c = job_i[jr, JI_CALL]
                    res_outcome = outcome
                    res_node = node
                    res_hedge = job_i[j, JI_HEDGE] if HEDGING or LEFTOVERS else 0
                    res_correct = correct
                    res_degraded = job_i[j, JI_DEGRADED] if DEGRADED or LEFTOVERS else 0
                    res_job = j
                job_i[jr, JI_STATE] = J_FREE  # free the job; its timers are now stale
                job_i[jr, JI_GEN] += 1
                job_free[ROW(job_free_n)] = j
                job_free_n += 1
                if LEFTOVERS and n_old > 0:  # (IS_OLD)
                    n_old -= job_f[jr, JF_T_NODE] <= mark
                    n_old_g -= job_f[jr, JF_T_NODE] <= mark_g
            elif kind == EV_TIMEOUT:  # the client stops waiting for a copy
                j = ident
                if (job_i[j, JI_GEN] & GEN_MASK) != gen or job_i[j, JI_CLIENT] != C_WAITING:
                    continue
                job_i[j, JI_CLIENT] = C_TIMED_OUT  # the server goes on working on it
                if KEEP_LISTENING and keep_listening:  # and its client goes on listening
                    job_i[j, JI_CLIENT] = C_LATE
                    res_late = True
                res_c = job_i[j, JI_CALL]
                res_outcome = TIMEOUT
                res_node = job_i[j, JI_NODE]
                res_job = j
            elif kind == EV_MOVE:  # a job failed over from an isolated node
                j = ident
                if (job_i[j, JI_GEN] & GEN_MASK) != gen or job_i[j, JI_STATE] != J_MOVING:
                    continue
                stamp += 1
                send[0, 0] = job_i[j, JI_CALL]
                send[0, 1] = -1 if n_elig == 0 else pick_node(routing, node_i, node_f, isv, fs,
                                                              rng, RNG_REROUTE, stamp, 0)
                send[0, 2] = job_i[j, JI_HEDGE]
                send[0, 3] = j
                n_send = 1
            elif CLIENTS and kind == EV_THINK:  # a closed client ends its think: it sends (the
                if client_cut(cfg_i, isv, ident):  # arrival section below), or retires if
                    continue  # a population step cut it
                thinker = ident
            else:  # a hedge or retry timer of a call
                c = ident
                if (call_i[c, CL_GEN] & GEN_MASK) != gen:
                    continue  # the call has been answered since
                if kind == EV_HEDGE and (not (hedge_mask >> call_i[c, CL_TIER]) & 1
                                        or call_i[c, CL_COPIES] == 0
                                        or call_i[c, CL_HEDGES] >= max_hedges):
                    continue
                # a node other than those already holding this call's copies
                stamp += 1
                n_avoid = 0
                if kind == EV_HEDGE:
                    j2 = call_i[c, CL_FIRST]
                    while j2 >= 0:
                        node_i[job_i[j2, JI_NODE], NI_STAMP] = stamp
                        n_avoid += 1
                        j2 = job_i[j2, JI_SIB]
                    if n_avoid >= n_elig:
                        continue  # nowhere else to hedge to
                elif n_elig > 1 and call_i[c, CL_LAST_NODE] >= 0:
                    node_i[call_i[c, CL_LAST_NODE], NI_STAMP] = stamp
                    n_avoid = 1
                if n_elig == 0:
                    send_node = -1
                else:
                    stream = RNG_HEDGES if kind == EV_HEDGE else RNG_REROUTE
                    send_node = pick_node(routing, node_i, node_f, isv, fs, rng, stream, stamp,
                                          n_avoid)
                send[0, 0] = c
                send[0, 1] = send_node
                send[0, 2] = 1 if kind == EV_HEDGE else 0
                send[0, 3] = -1
                n_send = 1
        if t_heap > t_arr or (CLIENTS and thinker >= 0):  # ---- a user request arrives (or
            usr_free_n -= 1  # a closed client sends: CLIENTS)
            u = usr_free[ROW(usr_free_n)]
            user_seq += 1
            in_flight += 1
            if CLIENTS and thinker >= 0:  # its tier is the client's; no arrival draw
                tier = client_tier(cfg_i, thinker)[0]
            else:
                x, a0, a1, a2, a3 = uniform_words(a0, a1, a2, a3)
                # branch-free (which tier is a coin toss); tier_cum is cumulative
                tier = (x >= tier_cum[0]) + (x >= tier_cum[1])
            if CLIENTS:
                usr_i[u, UI_CLIENT] = thinker
            # every call's first-attempt demand, for the scenario's full fan-out whatever
            # happens to the request next: the service stream stays in step across policies
            for i in range(fanout):
                if SIMPLE or svc_kind == S_EXP:
                    x, v0, v1, v2, v3 = uniform_words(v0, v1, v2, v3)
                    demand[i] = -svc_a * math.log(1.0 - x)
                else:  # through the array: the helper draws from it
                    rng[RNG_SERVICE, 0], rng[RNG_SERVICE, 1] = v0, v1
                    rng[RNG_SERVICE, 2], rng[RNG_SERVICE, 3] = v2, v3
                    demand[i] = draw_service(rng, RNG_SERVICE, svc_kind, svc_a, svc_b, svc_c)
                    v0, v1 = rng[RNG_SERVICE, 0], rng[RNG_SERVICE, 1]
                    v2, v3 = rng[RNG_SERVICE, 2], rng[RNG_SERVICE, 3]
            k = fanout
            new_tier = tier
            if ONE_CALL:  # the arrival time only; the rest is its call's (LEAN_USER)
                usr_f[u, UF_T_ARRIVAL] = t
            elif not SIMPLE:  # (the simple loop's own requests: see lean_rows)
                usr_f[u, UF_DEMAND] = demand[0]
                usr_i[u, UI_DEGRADED] = 0
                if DEGRADED and (degraded_mask >> tier) & 1 and 0 < k_deg < k:
                    k = k_deg  # partial fan-out: a cheaper, poorer answer
                    usr_i[u, UI_DEGRADED] = 1
                usr_i[u, UI_TIER] = tier
                usr_i[u, UI_WORST] = OK
                usr_i[u, UI_CRIT] = -1
                usr_i[u, UI_FANOUT] = k
                usr_i[u, UI_ATTEMPTS] = 0
                usr_i[u, UI_HEDGES] = 0
                usr_i[u, UI_WRONG] = 0
                usr_f[u, UF_T_ARRIVAL] = t
            # the simple loop's requests each go to one node (simple_ok): a constant, so that
            # the no-node branch and the outcome fold away
            k = 1 if SIMPLE or ONE_CALL else min(k, n_elig)
            if BREAKER and breaker != BREAKER_CLOSED and (breaker_mask >> tier) & 1 and (
                    breaker == BREAKER_OPEN
                    or uniform(rng, RNG_HALF_OPEN) >= cfg_f[CF_HALF_OPEN_ADMIT]):
                fin_u = u  # the global breaker rejects it at the door
                fin_outcome = DROPPED
            elif k <= 0:
                fin_u = u  # no routable node
                fin_outcome = ERROR
            else:
                if not (SIMPLE or ONE_CALL):
                    usr_i[u, UI_REMAINING] = k
                if n_nodes == 1:
                    send[0, 1] = 0  # a single node: no draw
                elif SIMPLE or (k == 1 and uniform_random):
                    x, r0, r1, r2, r3 = uniform_words(r0, r1, r2, r3)
                    send[0, 1] = min(int(x * n_nodes), n_nodes - 1)
                else:
                    stamp += 1
                    rng[RNG_ROUTING, 0], rng[RNG_ROUTING, 1] = r0, r1  # HELPER_SYNC
                    rng[RNG_ROUTING, 2], rng[RNG_ROUTING, 3] = r2, r3
                    for i in range(k):  # k distinct nodes
                        node = pick_node(routing, node_i, node_f, isv, fs, rng, RNG_ROUTING,
                                         stamp, i)
                        node_i[node, NI_STAMP] = stamp
                        send[i, 1] = node
                    r0, r1, r2, r3 = rng[RNG_ROUTING, 0], rng[RNG_ROUTING, 1], rng[
                        RNG_ROUTING, 2], rng[RNG_ROUTING, 3]
                for i in range(k):
                    call_free_n -= 1
                    c = call_free[ROW(call_free_n)]
                    call_i[ROW(c), CL_USER] = u
                    send[i, 0] = c
                    if not SIMPLE:  # (LEAN_CALL)
                        call_i[c, CL_ATTEMPTS] = 0
                        call_i[c, CL_HEDGES] = 0
                        call_i[c, CL_COPIES] = 0
                        call_i[c, CL_FIRST] = -1
                        call_i[c, CL_TIER] = tier
                        call_f[c, CLF_DEMAND] = demand[i]
                    if RESENDS:  # (else first attempts only)
                        send[i, 2] = 0
                        send[i, 3] = -1
                n_send = k
            if CLIENTS and thinker >= 0:
                pass  # the open arrivals' next time stands
            elif SIMPLE or const_rate:
                x, a0, a1, a2, a3 = uniform_words(a0, a1, a2, a3)
                t_arr = t - mean_gap * math.log(1.0 - x)
            else:  # through the array: the helper draws from it
                rng[RNG_ARRIVALS, 0], rng[RNG_ARRIVALS, 1] = a0, a1
                rng[RNG_ARRIVALS, 2], rng[RNG_ARRIVALS, 3] = a2, a3
                t_arr = next_arrival(rng, rmax, const_rate, rate_t, rate_v, t)
                a0, a1, a2, a3 = rng[RNG_ARRIVALS, 0], rng[RNG_ARRIVALS, 1], rng[
                    RNG_ARRIVALS, 2], rng[RNG_ARRIVALS, 3]

        # ---- settle the call: a copy answered it, or the client gave up on one
        if SIMPLE and res_c >= 0:  # its only copy; the job's row says it all (LEAN_CALL)
            c = res_c
            cr = ROW(c)
            call_i[cr, CL_GEN] += 1
            call_free[ROW(call_free_n)] = c
            call_free_n += 1
            fin_u = call_i[cr, CL_USER]
            fin_j = res_job  # (its row is intact until the send section reuses it)
            if ENDS_EARLY:  # (in-path) served, or refused: throttled or rejected
                fin_outcome = res_outcome
        elif res_c >= 0:
            c = res_c
            # keep_listening: a copy past its deadline leaves the count of copies awaited
            # (a retry may follow) but stays in the call's list, listened to, until it ends
            late_end = KEEP_LISTENING and res_late and res_outcome != TIMEOUT
            prev = -1  # the copy no longer counts among its call's copies: unlink it
            j2 = call_i[c, CL_FIRST]
            if KEEP_LISTENING and res_late and not late_end:
                j2 = res_job  # (listened to: not unlinked)
            while j2 != res_job:
                prev = j2
                j2 = job_i[j2, JI_SIB]
            if KEEP_LISTENING and res_late and not late_end:
                pass
            elif prev < 0:
                call_i[c, CL_FIRST] = job_i[res_job, JI_SIB]
            else:
                job_i[prev, JI_SIB] = job_i[res_job, JI_SIB]
            copies = call_i[c, CL_COPIES] - (0 if late_end else 1)
            call_i[c, CL_COPIES] = copies
            done = -1
            if res_outcome == OK:
                done = OK
            elif copies == 0 and not late_end:  # nothing else outstanding: retry, or fail
                done = res_outcome
                attempts = call_i[c, CL_ATTEMPTS]
                if RETRIES and (retry_mask >> res_outcome) & 1 and attempts < max_attempts:
                    allowed = True
                    if budgeted:
                        isv[IS_BUDGET_BUCKET] = budget_bucket  # HELPER_SYNC
                        slot = window_slot(budget, isv, 0, IS_BUDGET_BUCKET, budget_width, t)
                        budget_bucket = isv[IS_BUDGET_BUCKET]
                        allowed = budget[1].sum() + 1 <= budget_ratio * budget[0].sum()
                        if allowed:
                            budget[1, slot] += 1
                    if allowed:
                        done = -1
                        fleet_c[F_RETRIES] += 1
                        backoff = min(cfg_f[CF_BACKOFF] * 2.0 ** (attempts - 1),
                                      cfg_f[CF_BACKOFF_MAX])
                        if cfg_i[CI_JITTER] != 0:
                            backoff *= uniform(rng, RNG_JITTER)  # full jitter
                        call_i[c, CL_LAST_NODE] = res_node
                        pend_t[n_pend] = t + backoff
                        pend_k[n_pend] = event_key(c, EV_RETRY, call_i[c, CL_GEN])
                        n_pend += 1
                    else:
                        fleet_c[F_RETRIES_DENIED] += 1
            if done >= 0:  # the call is over: settle its other copies, then its user
                if done == OK and res_hedge != 0:
                    fleet_c[F_HEDGES_WON] += 1
                # its other copies: hedges, late copies (a retry follows its copy's end)
                j2 = call_i[c, CL_FIRST] if HEDGING or LEFTOVERS or KEEP_LISTENING else -1
                while j2 >= 0:
                    nxt = job_i[j2, JI_SIB]
                    job_i[j2, JI_SIB] = -1
                    if KEEP_LISTENING and job_i[j2, JI_CLIENT] == C_LATE:
                        job_i[j2, JI_CLIENT] = C_TIMED_OUT  # nobody listens now; never
                        j2 = nxt  # cancelled (as an abandoned copy is not)
                        continue
                    job_i[j2, JI_CLIENT] = C_LOST
                    state = job_i[j2, JI_STATE]
                    node = job_i[j2, JI_NODE]
                    if (state == J_QUEUED and cancel != CANCEL_NEVER) or (
                            state == J_SERVING and cancel == CANCEL_STARTED):
                        if state == J_QUEUED:  # unlink from the node's queue
                            qp = job_i[j2, JI_PREV]
                            qn = job_i[j2, JI_NEXT]
                            if qp >= 0:
                                job_i[qp, JI_NEXT] = qn
                            else:
                                node_i[node, NI_QHEAD] = qn
                            if qn >= 0:
                                job_i[qn, JI_PREV] = qp
                            else:
                                node_i[node, NI_QTAIL] = qp
                            node_i[node, NI_QLEN] -= 1
                        else:  # stop it mid-service: the server frees up now
                            busy = node_i[node, NI_BUSY]
                            node_f[node, NF_BUSY_AREA] += busy * (t - node_f[node, NF_LAST_T])
                            node_f[node, NF_LAST_T] = t
                            node_i[node, NI_BUSY] = busy - 1
                            touched[n_touched] = node
                            n_touched += 1
                        node_c[node, NC_CANCELLED] += 1
                        job_i[j2, JI_STATE] = J_FREE
                        job_i[j2, JI_GEN] += 1
                        job_free[job_free_n] = j2
                        job_free_n += 1
                        if n_old > 0:  # (IS_OLD)
                            n_old -= job_f[j2, JF_T_NODE] <= mark
                            n_old_g -= job_f[j2, JF_T_NODE] <= mark_g
                    j2 = nxt
                if ONE_CALL:  # its request ends with it: the user row's values are its
                    fin_u = call_i[c, CL_USER]  # call's (LEAN_USER)
                    fin_outcome = done
                    end_tier = call_i[c, CL_TIER]
                    end_attempts = call_i[c, CL_ATTEMPTS]
                    end_hedges = call_i[c, CL_HEDGES]
                    end_demand = call_f[c, CLF_DEMAND]
                    end_crit = res_node
                    end_wrong = 1 if res_correct == 0 else 0
                    end_degraded = 1 if res_degraded != 0 else 0
                    call_i[c, CL_GEN] += 1  # its timers are now stale
                    call_free[call_free_n] = c
                    call_free_n += 1
                else:  # folded into its user row; the request ends with its last call
                    u = call_i[c, CL_USER]
                    usr_i[u, UI_ATTEMPTS] += call_i[c, CL_ATTEMPTS]
                    usr_i[u, UI_HEDGES] += call_i[c, CL_HEDGES]
                    if res_correct == 0:
                        usr_i[u, UI_WRONG] = 1
                    if res_degraded != 0:
                        usr_i[u, UI_DEGRADED] = 1
                    worst = usr_i[u, UI_WORST]
                    if done > worst:
                        usr_i[u, UI_WORST] = done
                        usr_i[u, UI_CRIT] = res_node
                    elif done == worst and done == OK:
                        usr_i[u, UI_CRIT] = res_node  # the slowest call decides latency
                    call_i[c, CL_GEN] += 1  # its timers are now stale
                    call_free[call_free_n] = c
                    call_free_n += 1
                    remaining = usr_i[u, UI_REMAINING] - 1
                    usr_i[u, UI_REMAINING] = remaining
                    if remaining == 0:
                        fin_u = u
                        fin_outcome = usr_i[u, UI_WORST]

        # ---- record the user request: its client sees its outcome
        if fin_u >= 0:
            u = fin_u
            in_flight -= 1
            if SIMPLE and fin_j >= 0:  # its job's row and LEAN_USER, LEAN_CALL say it all
                jf = ROW(fin_j)
                t0 = job_f[jf, JF_T_NODE]  # (sent at its arrival)
                tier = job_i[jf, JI_TIER]
                demand_s = job_f[jf, JF_DEMAND]
                crit = job_i[jf, JI_NODE]
                fanout_u = LEAN_END[0]
                attempts = LEAN_END[1]
                hedges = LEAN_END[2]
                degraded = LEAN_END[3]
                wrong_u = LEAN_END[4]
            elif ONE_CALL:  # its call's, read at its end (LEAN_USER)
                t0 = usr_f[u, UF_T_ARRIVAL]
                tier = end_tier
                demand_s = end_demand
                crit = end_crit
                fanout_u = 1
                attempts = end_attempts
                hedges = end_hedges
                degraded = end_degraded
                wrong_u = end_wrong
            else:
                t0 = usr_f[u, UF_T_ARRIVAL]
                tier = usr_i[u, UI_TIER]
                demand_s = usr_f[u, UF_DEMAND]
                crit = usr_i[u, UI_CRIT]
                fanout_u = usr_i[u, UI_FANOUT]
                attempts = usr_i[u, UI_ATTEMPTS]
                hedges = usr_i[u, UI_HEDGES]
                degraded = usr_i[u, UI_DEGRADED]
                wrong_u = usr_i[u, UI_WRONG]
            latency_ms = (t - t0) * 1000.0
            if THROTTLE and throttle_on:  # ---- in-path: each copy's client decision took time
                latency_ms += client_cost_ms * (attempts + hedges)
            tr, orow = ROW(tier), ROW(fin_outcome)
            fleet_c[ROW(tier * N_OUTCOMES + fin_outcome)] += 1
            if degraded != 0:
                fleet_c[F_DEGRADED] += 1
            if record:
                r = ROW(n_rec)
                rec_f[r, 0] = t0
                rec_f[r, 1] = latency_ms
                rec_f[r, 2] = demand_s * 1000.0
                rec_i[r, 0] = tier
                rec_i[r, 1] = fin_outcome
                rec_i[r, 2] = crit
                rec_i[r, 3] = fanout_u
                rec_i[r, 4] = attempts + hedges
                rec_i[r, 5] = degraded
                rec_i[r, 6] = 1 - wrong_u
                n_rec += 1
            if t0 >= warmup:
                tier_cnt[tr, orow] += 1
                tier_ext[tr, TX_ATTEMPTS] += attempts
                tier_ext[tr, TX_HEDGES] += hedges
                tier_ext[tr, TX_DEGRADED] += degraded
                if fin_outcome == OK:
                    tier_ext[tr, TX_WRONG] += wrong_u
                if fin_outcome == OK or fin_outcome == ERROR:
                    hist[tr, orow, ROW(hist_bin(latency_ms))] += 1
                    lat_sum[tr, orow] += latency_ms
            usr_i[ROW(u), UI_GEN] += 1
            usr_free[ROW(usr_free_n)] = u
            usr_free_n += 1
            if LEFTOVERS and n_old > 0:  # (IS_OLD)
                n_old -= usr_f[ROW(u), UF_T_ARRIVAL] <= mark
                n_old_g -= usr_f[ROW(u), UF_T_ARRIVAL] <= mark_g
            # ---- (CLIENTS) a closed client's request ended: it thinks, then sends again
            if CLIENTS and has_clients and usr_i[u, UI_CLIENT] >= 0:
                client = usr_i[u, UI_CLIENT]
                pend_t[n_pend] = t + think_time(cfg_i, cfg_f, rng, client_tier(cfg_i, client)[0])
                pend_k[n_pend] = event_key(client, EV_THINK, 0)
                n_pend += 1

        # ---- send copies (first attempts, retries, hedges, failovers)
        for i in range(n_send):
            c = send[i, 0]
            node = send[i, 1]
            hedge = send[i, 2] if RESENDS else 0
            j = send[i, 3] if RESENDS else -1
            fresh = j < 0  # a new copy (a moved one was judged when first sent)
            if SIMPLE:  # a first attempt; the call's row stays unwritten (LEAN_CALL)
                job_free_n -= 1
                j = job_free[ROW(job_free_n)]
                jr = ROW(j)
                job_i[jr, JI_CALL] = c
                job_i[jr, JI_GEN] += 1
                job_i[jr, JI_CLIENT] = C_WAITING
                job_i[jr, JI_HEDGE] = 0
                job_i[jr, JI_TIER] = new_tier
                job_i[jr, JI_SIB] = -1
                fleet_c[F_ATTEMPTS] += 1
                job_f[jr, JF_DEMAND] = demand[i]
            elif j < 0:  # a new copy of call c
                job_free_n -= 1
                j = job_free[job_free_n]
                job_i[j, JI_CALL] = c
                job_i[j, JI_GEN] += 1
                job_i[j, JI_CLIENT] = C_WAITING
                job_i[j, JI_HEDGE] = hedge
                job_i[j, JI_TIER] = call_i[c, CL_TIER]
                job_i[j, JI_SIB] = call_i[c, CL_FIRST]
                call_i[c, CL_FIRST] = j
                call_i[c, CL_COPIES] += 1
                fleet_c[F_ATTEMPTS] += 1
                if hedge != 0:
                    call_i[c, CL_HEDGES] += 1
                    fleet_c[F_HEDGES] += 1
                else:
                    call_i[c, CL_ATTEMPTS] += 1
                    if budgeted and call_i[c, CL_ATTEMPTS] == 1:
                        # window_slot's bucket; the helper only when the window moves on
                        b = int(t / budget_width)
                        if b > budget_bucket:
                            isv[IS_BUDGET_BUCKET] = budget_bucket  # HELPER_SYNC
                            window_slot(budget, isv, 0, IS_BUDGET_BUCKET, budget_width, t)
                            budget_bucket = isv[IS_BUDGET_BUCKET]
                        budget[0, b % BUDGET_BUCKETS] += 1
                # the first attempt serves the demand drawn at arrival; a hedge or a
                # retry is another piece of work, with a demand of its own, drawn when
                # (if) it starts: a copy cancelled in the queue costs no draw
                if hedge == 0 and call_i[c, CL_ATTEMPTS] == 1:
                    job_f[j, JF_DEMAND] = call_f[c, CLF_DEMAND]
                else:
                    job_f[j, JF_DEMAND] = NO_DEMAND
                # its timers: a ring's tail at once (a ring holds one kind; "file timers" files
                # the heap's, in order)
                if DEADLINES and deadline < np.inf:
                    slot = ring_slot(to_h, to_n, tq_cap)
                    tq_t[TQ_TIMEOUT, slot] = t + deadline
                    tq_k[TQ_TIMEOUT, slot] = event_key(j, EV_TIMEOUT, job_i[j, JI_GEN])
                    to_n += 1
                if (HEDGING and (hedge_mask >> call_i[c, CL_TIER]) & 1
                        and call_i[c, CL_HEDGES] < max_hedges and n_elig > 1):
                    if hedge_queue == TQ_HEDGE:
                        slot = ring_slot(he_h, he_n, tq_cap)
                        tq_t[TQ_HEDGE, slot] = t + hedge_delay
                        tq_k[TQ_HEDGE, slot] = event_key(c, EV_HEDGE, call_i[c, CL_GEN])
                        he_n += 1
                    else:
                        pend_t[n_pend] = t + hedge_delay
                        pend_k[n_pend] = event_key(c, EV_HEDGE, call_i[c, CL_GEN])
                        n_pend += 1
            if THROTTLE and throttle_on and fresh:  # ---- in-path: the client's adaptive
                if t >= thr_next:  # throttle (the window moves on)
                    thr_slot = window_slot(budget, isv, BUDGET_THR_REQ, IS_THROTTLE_BUCKET,
                                           throttle_width, t)
                    thr_next = (isv[IS_THROTTLE_BUCKET] + 1) * throttle_width
                if throttle_judge(budget, isv, rng, throttle_k, thr_slot):
                    node = NODE_THROTTLED  # its client rejects it (below)
            jr = ROW(j)  # (a row by now)
            job_i[jr, JI_NODE] = node
            job_i[jr, JI_DEGRADED] = 0
            job_f[jr, JF_T_NODE] = t
            if THROTTLE and node == NODE_THROTTLED:  # ---- in-path: never sent to a node
                job_i[j, JI_NODE] = -1
                fleet_c[F_THROTTLED] += 1
                hn = end_synced(isv, job_i, heap_t, heap_k, j, THROTTLED, t, hn)
                continue
            if RESENDS and node < 0:  # (a first attempt has one)
                job_i[j, JI_STATE] = J_ENDING
                hn = end_synced(isv, job_i, heap_t, heap_k, j, ERROR, t, hn)
                continue
            # admission: refused (crashed), shed, throttled, queue full, or queued
            tier = job_i[jr, JI_TIER]
            tries = 0
            ex_stamp = -1
            nr = ROW(node)
            qlen = node_i[nr, NI_QLEN]
            rejected = -1
            while INTAKE:
                busy = node_i[node, NI_BUSY]
                qlen = node_i[node, NI_QLEN]
                rejected = -1
                throttled = False
                if node_i[node, NI_CRASHED] != 0:
                    rejected = ERROR
                elif not checks:  # no shedding, intake limit, token bucket or queue limit
                    break
                elif tier != GOLD and (shed_mask >> tier) & 1:
                    rejected = DROPPED
                else:
                    limit = node_i[node, NI_INTAKE_LIMIT]
                    if limit >= 0 and busy + qlen >= limit:
                        throttled = True
                    elif node_f[node, NF_TOKEN_RATE] < np.inf:  # token-bucket intake
                        tokens = min(node_f[node, NF_TOKEN_BURST], node_f[node, NF_TOKENS]
                                     + (t - node_f[node, NF_TOKEN_T]) * node_f[node, NF_TOKEN_RATE])
                        node_f[node, NF_TOKEN_T] = t
                        if tokens >= 1.0:
                            node_f[node, NF_TOKENS] = tokens - 1.0
                        else:
                            node_f[node, NF_TOKENS] = tokens
                            throttled = True
                    if throttled:
                        rejected = DROPPED
                    elif qlim >= 0 and busy >= node_i[node, NI_SERVERS] and qlen >= qlim:
                        rejected = ERROR
                if not (throttled and elsewhere) or tries + 1 >= n_elig:
                    break
                tries += 1  # excess goes elsewhere: another node, not tried yet
                if ex_stamp < 0:
                    stamp += 1
                    ex_stamp = stamp
                node_i[node, NI_STAMP] = ex_stamp
                node = pick_node(routing, node_i, node_f, isv, fs, rng, RNG_REROUTE, ex_stamp,
                                 tries)
                job_i[j, JI_NODE] = node
            if rejected >= 0:
                hn = end_synced(isv, job_i, heap_t, heap_k, j, rejected, t, hn)
                continue
            if INTAKE:
                nr = ROW(node)  # (excess may have gone elsewhere)
            if CONCURRENCY and cl_on and (node_i[nr, NI_BUSY] + node_i[nr, NI_QLEN] + 1
                                          > node_f[nr, NF_CL_LIMIT]):
                node_c[nr, NC_REJECTED] += 1  # ---- in-path: over the node's own limit
                hn = end_synced(isv, job_i, heap_t, heap_k, j, REJECTED, t, hn)
                continue
            job_i[jr, JI_NEXT] = -1
            tail = node_i[nr, NI_QTAIL]
            job_i[jr, JI_PREV] = tail
            if SIMPLE and tail < 0 and node_i[nr, NI_BUSY] < node_i[nr, NI_SERVERS]:
                direct = j  # no queue and a server idle: it starts below, never linked (its
                # row then holds what it would after a link and a dequeue)
            else:  # link it at the queue's tail (FIFO)
                job_i[jr, JI_STATE] = J_QUEUED
                if tail >= 0:
                    job_i[ROW(tail), JI_NEXT] = j
                else:
                    node_i[nr, NI_QHEAD] = j
                node_i[nr, NI_QTAIL] = j
                node_i[nr, NI_QLEN] = qlen + 1
            touched[ROW(n_touched)] = node
            n_touched += 1

        # ---- start service where servers are free
        drops_left = CODEL_DROPS_MAX  # (in-path: CoDel's drops this event)
        for i in range(n_touched):
            node = touched[i]
            nr = ROW(node)
            while True:
                if SIMPLE and direct >= 0:  # the copy just sent (see send)
                    j = direct
                    direct = -1
                elif (CODEL and discipline != D_FIFO and node_i[nr, NI_QLEN] > 0
                      and node_i[nr, NI_BUSY] < node_i[nr, NI_SERVERS]
                      and newest_first(cfg_f, node_f, nr, discipline, t)):
                    j = dequeue_newest(node_i, job_i, nr)  # ---- in-path: newest first
                elif (node_i[nr, NI_QLEN] > 0
                      and node_i[nr, NI_BUSY] < node_i[nr, NI_SERVERS]):
                    j = node_i[nr, NI_QHEAD]  # dequeue
                    nxt = job_i[ROW(j), JI_NEXT]
                    node_i[nr, NI_QHEAD] = nxt
                    if nxt >= 0:
                        job_i[ROW(nxt), JI_PREV] = -1
                    else:
                        node_i[nr, NI_QTAIL] = -1
                    node_i[nr, NI_QLEN] -= 1
                else:
                    break
                jr = ROW(j)
                if CODEL and codel_on and drops_left > 0:
                    # ---- in-path: CoDel sees every dequeue (codel_dequeued); drops requests
                    waited = codel_dequeued(node_i, node_f, nr, t, codel_target, codel_interval)
                    if job_i[jr, JI_CALL] < 0 or t - job_f[jr, JF_T_NODE] <= waited:
                        waited = -1.0  # (served: a probe is never dropped)
                else:
                    waited = -1.0
                if CODEL and waited >= 0.0:  # ---- in-path: CoDel drops it (a rejection)
                    drops_left -= 1
                    node_c[nr, NC_REJECTED] += 1
                    node_c[nr, NC_CODEL_DROPPED] += 1
                    hn = end_synced(isv, job_i, heap_t, heap_k, j, REJECTED, t, hn)
                    continue
                s = job_f[jr, JF_DEMAND]
                if RESENDS and s < 0.0:  # a hedge's or a retry's: its own stream
                    s = copy_demand(rng, svc_kind, svc_a, svc_b, svc_c)
                    job_f[jr, JF_DEMAND] = s
                s = begin_service(node_i, node_f, job_i, job_f, nr, jr, t, s, DEGRADED,
                                  degraded_mask, svc_factor, PROBES, serve_cost)
                if not RESENDS:  # (settled) the event set no other timer: onto the heap
                    # now (sifted up at unsigned positions), not through pend and the filing
                    sift_up(heap_t, heap_k, ROW(hn), ROW(1), t + s,
                            event_key(j, EV_DONE, job_i[jr, JI_GEN]))
                    hn += 1
                else:
                    pend_t[n_pend] = t + s
                    pend_k[n_pend] = event_key(j, EV_DONE, job_i[jr, JI_GEN])
                    n_pend += 1

        # ---- file timers: the heap timers this event set, in the order set (sift up)
        for i in range(n_pend):
            sift_up(heap_t, heap_k, ROW(hn), ROW(1), pend_t[i], pend_k[i])
            hn += 1
            if LEFTOVERS and (pend_k[i] & EV_MASK) != EV_DONE:  # (IS_EVENTS)
                isv[IS_EVENTS + (pend_k[i] & EV_MASK)] += 1
    if SIMPLE:
        lean_rows(job_i, job_f, call_i, call_f, usr_i, usr_f, True)  # (written back)
    if ONE_CALL:
        lean_users(call_i, call_f, call_free, call_free_n, usr_i, usr_f)
    isv[IS_HEAP_N] = hn
    isv[IS_JOB_FREE_N] = job_free_n
    isv[IS_USR_FREE_N] = usr_free_n
    isv[IS_CALL_FREE_N] = call_free_n
    isv[IS_NREC] = n_rec
    isv[IS_USER_SEQ] = user_seq
    isv[IS_IN_FLIGHT_USERS] = in_flight
    isv[IS_STAMP] = stamp
    isv[IS_OLD], isv[IS_OLD_GENERAL] = n_old, n_old_g
    isv[IS_BUDGET_BUCKET] = budget_bucket
    tq_n[TQ_TIMEOUT, 0], tq_n[TQ_TIMEOUT, 1] = to_h, to_n
    tq_n[TQ_HEDGE, 0], tq_n[TQ_HEDGE, 1] = he_h, he_n
    fs[FS_NOW] = now
    put_words(rng, RNG_ERRORS, e0, e1, e2, e3)
    put_words(rng, RNG_ROUTING, r0, r1, r2, r3)
    fs[FS_NEXT_ARRIVAL] = t_arr
    put_words(rng, RNG_ARRIVALS, a0, a1, a2, a3)
    put_words(rng, RNG_SERVICE, v0, v1, v2, v3)
    return status


# cached under a name carrying a digest of the files it inlines (relakit.sim.cachename)
_ADVANCE_PY = advance  # (specialised copies its code: no numba needed until one is called)
advance = njit(cache=True, error_model="numpy")(digest_named(advance))


def run(cfg: Config, st: State, out: Output, t_end: float) -> int:
    """:func:`advance` on a fleet's arrays, the fields of Config, State and Output in order
    (``advance`` looked up at each call: tests swap in a specialisation)."""
    return advance(*cfg, *st, *out, t_end)


# ---- specialisations ----------------------------------------------------------------
_SPECIALISED: dict = {}


def specialised(features: frozenset, settled: bool = False, simple: bool = False,
                lean: bool = False, one_call: bool = False):
    """``advance`` compiled with every mechanism not in ``features`` switched off; with
    ``settled``, for a stretch nothing a mechanism left is pending in (:data:`LEFTOVERS`
    False), and with ``simple`` too, for a simple one (:data:`SIMPLE`).

    The same code object under a copy of this module's globals with the constants set
    (numba reads globals as compile-time constants and prunes what they guard), named
    ``advance[<features>-<digest>]`` (:mod:`relakit.sim.cachename`): numba's cache key
    does not hash the globals, so the name keeps two combinations apart on disk."""
    unknown = set(features) - set(FEATURES)
    if unknown:
        raise ValueError(f"unknown kernel features {sorted(unknown)}; known: {FEATURES}")
    if (settled or simple) and not set(features) <= IN_PATH_FEATURES:
        raise ValueError(f"a {'simple' if simple else 'settled'} loop runs "
                         f"{sorted(IN_PATH_FEATURES)} only, not {sorted(features)}")
    if (lean or one_call) and not set(features) <= LEAN_FEATURES:
        raise ValueError(f"a lean loop runs {sorted(LEAN_FEATURES)} only, not {sorted(features)}")
    lean = lean or one_call
    names = tuple(f for f in FEATURES if f in features)
    key = (*names, *(["settled"] if settled or simple else []), *(["simple"] if simple else []),
           *(["lean"] if lean else []), *(["one_call"] if one_call else []))
    fn = _SPECIALISED.get(key)
    if fn is None:
        body = digest_named(_ADVANCE_PY, f"{'+'.join(key) or 'plain'}-",
                            LEFTOVERS=not (settled or simple), SIMPLE=simple,
                            ONE_CALL=one_call,
                            ROW=unsigned if settled or simple else as_is,
                            # (codel: its drops and the completions "start service" sets reach
                            # the heap in the general loop's order, through pend)
                            RESENDS=not (settled or simple) or bool(
                                {"hedging", "retries", "codel"} & set(names)),
                            ENDS_EARLY=not (settled or simple) or bool(
                                ({"intake"} | IN_PATH_FEATURES) & set(names)),
                            **{f.upper(): f in names for f in FEATURES})
        # noalias (relakit.jit): the settled and lean loops gain from it, the general one
        # did not (docs/performance.md)
        fn = _SPECIALISED[key] = njit(cache=True, error_model="numpy",
                                      noalias=settled or simple or lean)(body)
    return fn


def features_of(cfg, st) -> frozenset:
    """The mechanisms the next ``advance`` call may meet, from the model and the state
    Python left (flags and controls change only between calls; faults with an error rate
    count from the start, crashing ones as intake). A slowdown is no mechanism: every loop
    reads it."""
    cfg_f, cfg_i, isv, ni, nf = cfg.cfg_f, cfg.cfg_i, st.is_, st.node_i, st.node_f
    faults = cfg.fault_f.shape[0] > 0
    fault_errors = faults and bool((cfg.fault_f[:, 2] > 0).any() or (cfg.fault_f[:, 4] > 0).any())
    on = set()
    if isv[IS_HEDGE_ON] != 0 and cfg_i[CI_MAX_HEDGES] > 0:
        on.add("hedging")
    if cfg_f[CF_DEADLINE] < np.inf:
        on.add("deadlines")
    if cfg_i[CI_MAX_ATTEMPTS] > 1:
        on.add("retries")
    if (fault_errors or cfg.load_x.shape[0] > 0 or (cfg.dep_node >= 0).any()
            or (nf[:, NF_ERR_RATE] > 0).any() or (nf[:, NF_WRONG_RATE] > 0).any()):
        on.add("errors")
    if ((faults and cfg.fault_i[:, 1].any()) or ni[:, NI_CRASHED].any()
            or isv[IS_SHED_MASK] != 0 or (ni[:, NI_INTAKE_LIMIT] >= 0).any()
            or np.isfinite(nf[:, NF_TOKEN_RATE]).any() or cfg_i[CI_QUEUE_LIMIT] >= 0):
        on.add("intake")
    if isv[IS_BREAKER] != BREAKER_CLOSED:
        on.add("breaker")
    if isv[IS_DEGRADED_ON] != 0:
        on.add("degraded")
    if cfg_f[CF_PROBE_RATE] > 0.0:
        on.add("probes")
    if cfg_i[CI_KEEP_LISTENING] != 0:
        on.add("keep_listening")
    if cfg_f[CF_THROTTLE_K] > 0.0:  # in-path (issue 33)
        on.add("throttle")
    if cfg_i[CI_CL_ALGO] != CL_NONE:
        on.add("concurrency")
    if cfg_i[CI_CODEL] != 0 or cfg_i[CI_DISCIPLINE] != D_FIFO:
        on.add("codel")
    if cfg_i[CI_CLIENTS:CI_CLIENTS + len(TIERS)].any():
        on.add("clients")
    return frozenset(on)
