"""The plain kernel: a small event loop for stretches that use none of the mechanisms.

Most runs (every closed-form check, every sweep of routing, fan-out, tiers or
load, and a policy run between its interventions) switch on no mitigation: no
hedging, retries, deadlines, errors, intake limits, breaker, degraded mode or
probes. For them :func:`advance_plain` replaces the general
:func:`relakit.sim.kernel.advance`: it reads and writes the *same* state and
output arrays in the same way and draws the same numbers from the same
streams, so the two kernels are interchangeable between any two calls
(``tests/test_kernel_specialised.py`` runs scenarios through both, and one that
switches hedging on and off mid-run, and asserts every array equal, bit for
bit, but the per-event scratch ones, ``SCRATCH``, and, after the simple loop,
the free rows of the call and user pools: see ``LEAN_CALL``). What it leaves out is
everything a plain stretch cannot meet: the timer rings, hedge, retry, timeout
and move events, admission checks, error draws, the settling of sibling
copies, breaker and degraded paths, probes and the fault schedule.

Why a loop of its own rather than the general one with those branches
compiled out (``kernel.specialised``, which runs no longer use), measured on
the 2-core machine under load 4-6 (CPU seconds, so the neighbours count less):

* compile: the specialisation still typed and lowered the whole 660-line loop
  and took its Config, State and Output tuples (~60 arrays: a trivial function
  taking them compiles in ~0.9 s against ~0.1 s for two arrays, and a call
  costs ~20 us against ~0.4 us). This loop takes the arrays themselves
  (``CFG_ARGS``, ``STATE_ARGS``, ``OUT_ARGS``), as do the samplers it calls, and
  a cold start (import, compile, run of a 1 s M/M/8) fell from 34.4-34.6 to
  10.9-12.0 CPU s (wall 60-69 s to 17-22 s under that load);
* speed: best of 5, records off, plain M/M/8 6.3 -> 7.0 M requests per CPU
  second, 50 M/M/8 nodes 4.5 -> 4.7 (about +10 %); the branches the
  specialisation removed were well predicted. Since then (docs/performance.md has
  the A/B figures): the client histogram's bin from the float's bits instead of
  a log10 (relakit.sim.latency_bins, +18 %), the heap pop without a coin-toss
  branch (50 nodes +10-20 %), the simple specialisation below (+3-7 %), its
  requests' call and user rows written only at return (``LEAN_CALL``: +18 %
  with the next), the loops compiled ``noalias`` (``_compiled``), row indices held
  unsigned with a direct start for a copy that meets no queue (+7 %: see
  :func:`advance_plain`), and one node per simple request as a constant (+12-15 %).
  Unpredictable branches cost, and memory operations in bulk: removing a group
  of counter stores changed nothing measurable, the ~25 loads and stores of a
  request's call and user rows +11 %. The scalars an event touches (pool and
  heap counts, clock, streams) live in locals and are written back on return.

:func:`plain_ok` says when the loop applies: the model and the flags use no
mechanism (``kernel.features_of`` is empty), and nothing a mechanism left
behind is pending (timers in the rings, heap events other than completions, a
failover to do, a live copy that is a hedge, a retry, degraded, ending or
moving, or given up on by its client).
"""

from __future__ import annotations

import math

import numpy as np

from relakit.jit import njit, register_jitable
from relakit.sim import aot
from relakit.sim import kernel as K
from relakit.sim.cachename import digest_named
from relakit.sim.kernel import (
    budget_slot,
    draw_service,
    hist_bin,
    next_arrival,
    next_node_sample,
    pick_node,
    prepare_routing,
    sample_fleet,
    sample_node,
)
from relakit.sim.rng import uniform_words

N_OUTCOMES = len(K.OUTCOMES)
# A compile-time constant (see _compiled): True in advance_plain_simple, the loop for simple
# stretches (simple_ok: fan-out 1, exponential demand, constant rate, uniform routing, no
# retry budget), where the branches for the other cases fold away. That loop is 3-7 %
# faster (A/B, plain M/M/8) and compiles without draw_service, next_arrival, pick_node and
# budget_slot.
SIMPLE = False
# State arrays that are one event's scratch (its sends, timers, touched nodes): no value
# in them outlives the event, and the two kernels fill them differently
SCRATCH = ("scratch", "send", "pend_t", "pend_k")
# A request the simple loop admits gets a job row only (and its call's CL_USER): its call
# and user rows stay unwritten while it lives (measured: +9-11 %, A/B; the rows' ~25 loads
# and stores were a tenth of a request's cost). What they would hold is fixed or in the
# job's row: these columns and values, then CL_FIRST (the job), CL_TIER, UI_TIER (the
# job's tier), CLF_DEMAND, UF_DEMAND (its demand) and UF_T_ARRIVAL (its sending time).
# lean_rows writes them for the live requests before the loop returns, and checks on
# entry that the live requests it did not admit hold the same.
LEAN_CALL = ((K.CL_ATTEMPTS, 1), (K.CL_HEDGES, 0), (K.CL_COPIES, 1))
LEAN_USER = ((K.UI_DEGRADED, 0), (K.UI_WORST, K.OK), (K.UI_CRIT, -1), (K.UI_FANOUT, 1),
             (K.UI_ATTEMPTS, 0), (K.UI_HEDGES, 0), (K.UI_WRONG, 0), (K.UI_REMAINING, 1))
# what a simple request's rows say when it ends (the user row's values plus its call's,
# as the plain loop settles them): fan-out, attempts, hedges, degraded, wrong
LEAN_END = (dict(LEAN_USER)[K.UI_FANOUT],
            dict(LEAN_USER)[K.UI_ATTEMPTS] + dict(LEAN_CALL)[K.CL_ATTEMPTS],
            dict(LEAN_USER)[K.UI_HEDGES] + dict(LEAN_CALL)[K.CL_HEDGES],
            dict(LEAN_USER)[K.UI_DEGRADED], dict(LEAN_USER)[K.UI_WRONG])
# an unsigned row index that names no row (the simple loop's rows are unsigned: see
# advance_plain)
NO_ROW = np.uint64(2**64 - 1)
# the simple loop's status when the stretch is not simple after all: lean_rows finds a
# live request's rows otherwise, or (never, given simple_ok) a node is not eligible.
# Nothing done: the plain loop runs the stretch
ROWS_NOT_LEAN = -1
# the event kinds a plain stretch may hold pending: completions only (kernel.EV_*)
PLAIN_EVENTS = (K.EV_DONE,)  # (plain_ok compares with each)
# a live copy's states in a plain stretch: waiting in a queue or in service
PLAIN_JOB_STATES = (K.J_QUEUED, K.J_SERVING)


def plain_ok(cfg: K.Config, st: K.State) -> bool:
    """True when the next call may run :func:`advance_plain` instead of the general
    kernel: no mechanism is on, and none left work pending (see the module docstring).
    Costs a pass over the heap and the job pool (~0.1 ms for 50 nodes), once per choice of
    loop (``Fleet._choose``)."""
    if K.features_of(cfg, st) or st.fs[K.FS_NEXT_SCHED] < np.inf:  # (a schedule change due)
        return False
    if st.tq_n[:, 1].any() or st.node_i[:, K.NI_FAILOVER].any():
        return False
    kinds = st.heap_k[: st.is_[K.IS_HEAP_N]] & K.EV_MASK
    if (kinds != PLAIN_EVENTS[0]).any():
        return False
    ji = st.job_i
    state = ji[:, K.JI_STATE]
    live = state != K.J_FREE
    queued_or_serving = (state == PLAIN_JOB_STATES[0]) | (state == PLAIN_JOB_STATES[1])
    if (live & ~queued_or_serving).any():
        return False
    jl = ji[live]
    if (jl[:, K.JI_HEDGE].any() or jl[:, K.JI_DEGRADED].any() or (jl[:, K.JI_CALL] < 0).any()
            or (jl[:, K.JI_CLIENT] != K.C_WAITING).any()):
        return False
    calls = st.call_i[jl[:, K.JI_CALL]]  # one copy per call, its first attempt
    return bool((calls[:, K.CL_COPIES] == 1).all() and (calls[:, K.CL_ATTEMPTS] == 1).all())


# advance_plain's parameters, in order: the arrays it reads or writes, by their field
# names in kernel.Config, kernel.State and kernel.Output (run_plain picks them out)
CFG_ARGS = ("cfg_f", "cfg_i", "tier_cum", "rate_t", "rate_v", "buckets", "phase")
STATE_ARGS = ("fs", "is_", "rng", "node_i", "node_f", "node_c", "cnt", "lat_b", "fleet_c",
              "budget", "job_i", "job_f", "job_free", "usr_i", "usr_f", "usr_free", "call_i",
              "call_f", "call_free", "heap_t", "heap_k", "tq_t", "tq_n", "scratch", "send",
              "demand")
OUT_ARGS = ("metrics", "sample_t", "fleet", "fleet_t", "rec_f", "rec_i", "hist", "tier_cnt",
            "tier_ext", "lat_sum")


def simple_ok(cfg: K.Config, st: K.State) -> bool:
    """True when the stretch is also *simple* (:data:`SIMPLE`): one call per request, an
    exponential demand, a constant arrival rate, no retry budget, one node or random
    routing over equally weighted routable nodes (what ``prepare_routing`` will find).
    So every node is eligible and each request goes to exactly one: the simple loop
    takes that as a constant (and checks it on entry). It checks the live requests'
    rows itself (:func:`lean_rows`)."""
    ci, ni, weights = cfg.cfg_i, st.node_i, st.node_f[:, K.NF_WEIGHT]
    if (ci[K.CI_FANOUT] != 1 or ci[K.CI_SVC_KIND] != K.S_EXP or ci[K.CI_CONST_RATE] == 0
            or cfg.cfg_f[K.CF_BUDGET_RATIO] < np.inf  # (a retry budget counts first attempts)
            or not ni[:, K.NI_ROUTABLE].all() or weights[0] <= 0.0):
        return False
    return ni.shape[0] == 1 or (ci[K.CI_ROUTING] == K.R_RANDOM and (weights == weights[0]).all())


@register_jitable(error_model="numpy", no_cfunc_wrapper=True)
def lean_rows(job_i, job_f, call_i, call_f, usr_i, usr_f, write):
    """Whether every live request's call and user rows hold what the simple loop leaves
    unwritten (:data:`LEAN_CALL`, :data:`LEAN_USER`; tier, demand and arrival from its
    job's row), and with ``write``, those values written.

    Before a simple stretch (``write`` false): only then may the loop read a request's
    job row alone and rewrite its rows unchanged. Not so for a request whose hedge was
    cancelled (CL_HEDGES 1) or that was moved to another node (sent after it arrived):
    the loop returns ROWS_NOT_LEAN at once and the plain loop takes the stretch. After
    it (``write`` true): the rows the plain loop and the general kernel would hold, so
    that either may take over; the rows of requests that ended in the loop keep an older
    request's values (only their generation counts on): nothing reads a free row.
    O(job pool), a few us for 50 nodes; one function for both, so one compile (~0.2 s)."""
    held = True
    for j in range(job_i.shape[0]):
        if job_i[j, K.JI_STATE] == K.J_FREE:
            continue
        c = job_i[j, K.JI_CALL]
        u = call_i[c, K.CL_USER]
        tier = job_i[j, K.JI_TIER]
        demand = job_f[j, K.JF_DEMAND]
        sent = job_f[j, K.JF_T_NODE]
        for col, value in LEAN_CALL:
            held &= call_i[c, col] == value
            if write:
                call_i[c, col] = value
        for col, value in LEAN_USER:
            held &= usr_i[u, col] == value
            if write:
                usr_i[u, col] = value
        held &= (call_i[c, K.CL_FIRST] == j and call_i[c, K.CL_TIER] == tier
                 and usr_i[u, K.UI_TIER] == tier and call_f[c, K.CLF_DEMAND] == demand
                 and usr_f[u, K.UF_DEMAND] == demand and usr_f[u, K.UF_T_ARRIVAL] == sent)
        if write:
            call_i[c, K.CL_FIRST] = j
            call_i[c, K.CL_TIER] = tier
            usr_i[u, K.UI_TIER] = tier
            call_f[c, K.CLF_DEMAND] = demand
            usr_f[u, K.UF_DEMAND] = demand
            usr_f[u, K.UF_T_ARRIVAL] = sent
    return held


def run_plain(cfg: K.Config, st: K.State, out: K.Output, t_end: float) -> int:
    """:func:`advance_plain` (or its simple specialisation, :func:`simple_ok`, unless it
    finds live rows it would misread: ROWS_NOT_LEAN) called as the general kernel is:
    ``(cfg, st, out, t_end)``."""
    args = (*[getattr(cfg, a) for a in CFG_ARGS], *[getattr(st, a) for a in STATE_ARGS],
            *[getattr(out, a) for a in OUT_ARGS], t_end)
    simple, general = loops()
    if simple_ok(cfg, st):
        status = simple(*args)
        if status != ROWS_NOT_LEAN:
            return status
    return general(*args)


def loops():
    """(simple loop, plain loop) to call: the ones compiled ahead of time for these
    sources (:mod:`relakit.sim.aot`, built by ``make setup``) when on disk and not
    switched off (``RELAKIT_AOT=0``), which spares a process numba altogether; else
    numba's (:func:`advance_plain_simple`, :func:`advance_plain`)."""
    built = aot.load()
    if built is not None:
        return built.advance_plain_simple, built.advance_plain
    return advance_plain_simple, advance_plain


def advance_plain(cfg_f, cfg_i, tier_cum, rate_t, rate_v, bounds, phase,
                  fs, isv, rng, node_i, node_f, node_c, cnt, lat_b, fleet_c,
                  budget, job_i, job_f, job_free, usr_i, usr_f, usr_free, call_i,
                  call_f, call_free, heap_t, heap_k, tq_t, tq_n, touched, send,
                  demand,
                  metrics, sample_t, fleet, fleet_t, rec_f, rec_i, hist, tier_cnt,
                  tier_ext, lat_sum, t_end):
    """:func:`relakit.sim.kernel.advance` for a plain stretch (:func:`plain_ok`), on the
    arrays themselves (``CFG_ARGS``, ``STATE_ARGS``, ``OUT_ARGS``, then ``t_end``): a
    kernel taking the Config, State and Output tuples compiles seconds longer.

    Sections, and what each costs per user request (one node, fan-out 1):
    the loop head (earliest of arrival, heap top and next sample: a few loads);
    an arrival (3 uniforms and 2 logs: tier, demand, next gap; pool pops);
    sending (a job from the pool, a FIFO link); starting service (a heap push,
    O(log n)); a completion (a heap pop, O(log n); the node's bucket search);
    the user's end (1 log10 for the latency histogram; a record row if kept).
    Metric samples are rare (one per node per interval).

    Rows are indexed unsigned (``np.uint64``: the copy's ``j``, its ``node``, call ``c``,
    user ``u``, tier and outcome, the pools' and heap's positions). With a signed index
    numba adds a negative-index fix-up (a sign test and an add of the array's length)
    to every array it indexes, once per array and index. Values that may be -1
    (``fin_u``, ``fin_j``, queue links) stay signed and become unsigned where they
    index; an int64 and a uint64 that meet become a float64 in numba, without a word,
    which ``test_kernel_specialised`` checks for. And in the simple loop a copy that
    finds no queue and an idle server starts at once (``direct``), never linked into the
    queue and dequeued. Measured together (A/B, paired medians of 7 rounds): M/M/8
    +6.7 %, the 50-node fleet +7.4 % (the direct start alone +2 %); the simple loop's
    instructions per M/M/8 request 719 -> 625 (callgrind; the C heap's 347).
    """
    if SIMPLE and not lean_rows(job_i, job_f, call_i, call_f, usr_i, usr_f, False):
        return ROWS_NOT_LEAN  # (before any write)
    n_nodes = node_i.shape[0]
    heap_cap = heap_t.shape[0]
    prepare_routing(node_i, node_f, isv, fs)
    n_elig = isv[K.IS_N_ELIGIBLE]
    if SIMPLE and n_elig != n_nodes:
        return ROWS_NOT_LEAN  # (never, given simple_ok: below, each request has one node)
    fanout = 1 if SIMPLE else cfg_i[K.CI_FANOUT]
    record = cfg_i[K.CI_RECORD] != 0
    warmup = cfg_f[K.CF_WARMUP]
    svc_kind = cfg_i[K.CI_SVC_KIND]
    svc_a = cfg_f[K.CF_SVC_A]
    svc_b = cfg_f[K.CF_SVC_B]
    svc_c = cfg_f[K.CF_SVC_C]
    routing = cfg_i[K.CI_ROUTING]
    const_rate = cfg_i[K.CI_CONST_RATE] != 0
    rmax = cfg_f[K.CF_RATE_MAX]
    mean_gap = 1.0 / rmax if rmax > 0.0 else np.inf
    budget_ratio = cfg_f[K.CF_BUDGET_RATIO]
    budgeted = budget_ratio < np.inf  # first attempts counted even with retries off
    budget_width = cfg_f[K.CF_BUDGET_WINDOW] / K.BUDGET_BUCKETS
    n_bounds = bounds.shape[0]
    sample_dt = cfg_f[K.CF_SAMPLE_DT]
    hedge_q = cfg_f[K.CF_HEDGE_Q]
    record_cap = rec_f.shape[0]
    samp_cap = sample_t.shape[0]
    fleet_cap = fleet_t.shape[0]
    # the general kernel's room checks, kept exactly: pools grow at the same event
    room = fanout + cfg_i[K.CI_MAX_HEDGES] + 4
    heap_room = 4 * fanout + 16
    tq_cap = tq_t.shape[1]
    rings_short = tq_cap - tq_n[0, 1] < room or tq_cap - tq_n[1, 1] < room
    uniform_random = routing == K.R_RANDOM and isv[K.IS_EQUAL_WEIGHTS] != 0

    # scalars in locals (registers), written back on return: see the module docstring
    heap_n = isv[K.IS_HEAP_N]
    job_free_n = isv[K.IS_JOB_FREE_N]
    usr_free_n = isv[K.IS_USR_FREE_N]
    call_free_n = isv[K.IS_CALL_FREE_N]
    n_rec = isv[K.IS_NREC]
    user_seq = isv[K.IS_USER_SEQ]
    in_flight = isv[K.IS_IN_FLIGHT_USERS]
    stamp = isv[K.IS_STAMP]
    now = fs[K.FS_NOW]
    t_arr = fs[K.FS_NEXT_ARRIVAL]
    t_rare = min(fs[K.FS_NEXT_SAMPLE], fs[K.FS_NEXT_NODE_SAMPLE])
    status = K.DONE
    a0, a1, a2, a3 = rng[K.RNG_ARRIVALS, 0], rng[K.RNG_ARRIVALS, 1], rng[K.RNG_ARRIVALS, 2], rng[
        K.RNG_ARRIVALS, 3]
    v0, v1, v2, v3 = rng[K.RNG_SERVICE, 0], rng[K.RNG_SERVICE, 1], rng[K.RNG_SERVICE, 2], rng[
        K.RNG_SERVICE, 3]
    while True:
        # ---- loop head: the earliest of the next arrival, completion and sample; the
        # room checks (as the general kernel's, so pools grow at the same event). Cost:
        # a dozen loads and compares; the arrival-or-completion branch is a coin toss.
        t_heap = heap_t[0] if heap_n > 0 else np.inf
        t = min(t_arr, t_heap)
        if t_rare <= t and t_rare <= t_end:  # ---- a metrics sample: once per node per interval
            t_node = fs[K.FS_NEXT_NODE_SAMPLE]
            if t_node == t_rare:
                if isv[K.IS_MAX_NODE_SAMPLE] >= samp_cap:
                    status = K.GROW_SAMPLES
                    break
                now = t_node
                for i in range(n_nodes):
                    if node_f[i, K.NF_NEXT_SAMPLE] == t_node:
                        sample_node(metrics, sample_t, cnt, node_i, node_f, node_c, lat_b,
                                    isv, phase, sample_dt, i, t_node)
                next_node_sample(node_f, fs)
            else:
                if isv[K.IS_NSAMPLE] >= fleet_cap:
                    status = K.GROW_SAMPLES
                    break
                now = fs[K.FS_NEXT_SAMPLE]
                sample_fleet(fleet, fleet_t, fleet_c, isv, fs, hist, sample_dt, hedge_q, now)
            t_rare = min(fs[K.FS_NEXT_SAMPLE], fs[K.FS_NEXT_NODE_SAMPLE])
            continue
        if t > t_end:
            now = t_end if t_end > now else now  # (max(now, t_end): one overload less to compile)
            break
        if (job_free_n < room or usr_free_n < 2 or call_free_n < room
                or heap_cap - heap_n < heap_room or rings_short):
            status = K.GROW_POOLS
            break
        if record and record_cap - n_rec < 2:
            status = K.GROW_RECORDS
            break
        now = t
        n_touched = 0  # nodes whose queue may now start service
        n_send = 0  # new first attempts to send: send[i] = (call, node, 0, -1)
        fin_u = -1  # the user request that ends now, and how
        fin_outcome = K.OK
        fin_j = -1  # (simple loop) its copy, whose row stands in for the user's and call's
        new_tier = 0  # (simple loop) the tier of the request arriving now
        direct = NO_ROW  # (simple loop) its copy, when it starts at once (see send)

        if t_heap <= t_arr:  # ---- a completion: heap pop, O(log in-service copies)
            key = heap_k[0]
            heap_n -= 1
            if heap_n > 0:
                # unsigned positions: numba adds no negative-index fix-up to each access
                un = np.uint64(heap_n)
                last_t = heap_t[un]
                last_k = heap_k[un]
                i = K.U0
                while True:
                    c = i + i + K.U1
                    if c >= un:
                        break
                    tc = heap_t[c]
                    if c + K.U1 < un:  # the smaller child without a jump: which one is a coin
                        t2 = heap_t[c + K.U1]  # toss, a branch mispredicted half the time
                        c += np.uint64(t2 < tc)
                        tc = min(t2, tc)
                    if tc >= last_t:
                        break
                    heap_t[i] = tc
                    heap_k[i] = heap_k[c]
                    i = c
                heap_t[i] = last_t
                heap_k[i] = last_k
            j = np.uint64((key >> 3) & K.ID_MASK)  # (rows unsigned: see the docstring)
            if (job_i[j, K.JI_GEN] & K.GEN_MASK) != key >> 32:
                continue  # stale: left by the general kernel (a cancelled copy)
            node = np.uint64(job_i[j, K.JI_NODE])
            busy = node_i[node, K.NI_BUSY]
            node_f[node, K.NF_BUSY_AREA] += busy * (t - node_f[node, K.NF_LAST_T])
            node_f[node, K.NF_LAST_T] = t
            node_i[node, K.NI_BUSY] = busy - 1
            touched[0] = node
            n_touched = 1
            lat = t - job_f[j, K.JF_T_NODE]  # the server's histogram (Prometheus buckets)
            b = 0  # bounds below the latency (they increase): no data-dependent exit
            for ib in range(n_bounds):
                b += lat > bounds[ib]
            lat_b[node, np.uint64(b)] += 1
            node_f[node, K.NF_LAT_SUM] += lat
            cnt[node, np.uint64(job_i[j, K.JI_TIER]), K.OK] += 1
            c = np.uint64(job_i[j, K.JI_CALL])
            job_i[j, K.JI_STATE] = K.J_FREE  # free the job
            job_i[j, K.JI_GEN] += 1
            job_free[np.uint64(job_free_n)] = j
            job_free_n += 1
            # (then the node's bucket search, a few compares; busy-seconds, counters)
            # ---- its call is answered (its only copy): unlink the copy, settle the user;
            # ~15 loads and stores over the job, call and user rows. The simple loop
            # writes neither row for its own requests (LEAN_USER, LEAN_CALL): the job's row
            # says it all, and lean_rows writes the rows of requests still live at return
            if SIMPLE:
                call_i[c, K.CL_GEN] += 1
                call_free[np.uint64(call_free_n)] = c
                call_free_n += 1
                fin_u = call_i[c, K.CL_USER]
                fin_j = np.int64(j)  # (its row is intact until the send section reuses it)
            else:
                prev = -1
                j2 = call_i[c, K.CL_FIRST]
                while j2 != np.int64(j):
                    prev = j2
                    j2 = job_i[j2, K.JI_SIB]
                if prev < 0:
                    call_i[c, K.CL_FIRST] = job_i[j, K.JI_SIB]
                else:
                    job_i[prev, K.JI_SIB] = job_i[j, K.JI_SIB]
                call_i[c, K.CL_COPIES] -= 1
                u = np.uint64(call_i[c, K.CL_USER])
                usr_i[u, K.UI_ATTEMPTS] += call_i[c, K.CL_ATTEMPTS]
                usr_i[u, K.UI_HEDGES] += call_i[c, K.CL_HEDGES]
                if usr_i[u, K.UI_WORST] == K.OK:
                    usr_i[u, K.UI_CRIT] = np.int64(node)  # the slowest call decides latency
                call_i[c, K.CL_GEN] += 1
                call_free[np.uint64(call_free_n)] = c
                call_free_n += 1
                remaining = usr_i[u, K.UI_REMAINING] - 1
                usr_i[u, K.UI_REMAINING] = remaining
                if remaining == 0:
                    fin_u = np.int64(u)
                    fin_outcome = usr_i[u, K.UI_WORST]
        else:  # ---- a user request arrives: tier, demands, nodes, calls; next arrival.
            # Cost: 3 uniforms and 2 logs (tier, demand, gap), ~20 stores (user, calls)
            usr_free_n -= 1
            u = np.uint64(usr_free[np.uint64(usr_free_n)])
            user_seq += 1
            in_flight += 1
            x, a0, a1, a2, a3 = uniform_words(a0, a1, a2, a3)
            tier = (x >= tier_cum[0]) + (x >= tier_cum[1])  # as the general kernel's, branch-free
            for i in range(fanout):  # the full fan-out's first-attempt demands
                if SIMPLE or svc_kind == K.S_EXP:
                    x, v0, v1, v2, v3 = uniform_words(v0, v1, v2, v3)
                    demand[i] = -svc_a * math.log(1.0 - x)
                else:  # through the array: the helper draws from it
                    rng[K.RNG_SERVICE, 0], rng[K.RNG_SERVICE, 1] = v0, v1
                    rng[K.RNG_SERVICE, 2], rng[K.RNG_SERVICE, 3] = v2, v3
                    demand[i] = draw_service(rng, K.RNG_SERVICE, svc_kind, svc_a, svc_b, svc_c)
                    v0, v1 = rng[K.RNG_SERVICE, 0], rng[K.RNG_SERVICE, 1]
                    v2, v3 = rng[K.RNG_SERVICE, 2], rng[K.RNG_SERVICE, 3]
            # the simple loop's requests each go to one node (simple_ok): a constant, so that
            # the no-node branch and the outcome fold away (+13-16 %, A/B)
            k = 1 if SIMPLE else min(fanout, n_elig)
            new_tier = tier
            if not SIMPLE or k <= 0:  # (the simple loop's own requests: see lean_rows)
                usr_f[u, K.UF_DEMAND] = demand[0]
                usr_i[u, K.UI_DEGRADED] = 0
                usr_i[u, K.UI_TIER] = tier
                usr_i[u, K.UI_WORST] = K.OK
                usr_i[u, K.UI_CRIT] = -1
                usr_i[u, K.UI_FANOUT] = fanout
                usr_i[u, K.UI_ATTEMPTS] = 0
                usr_i[u, K.UI_HEDGES] = 0
                usr_i[u, K.UI_WRONG] = 0
                usr_f[u, K.UF_T_ARRIVAL] = t
            if k <= 0:
                fin_u = np.int64(u)  # no routable node
                fin_outcome = K.ERROR
            else:
                if not SIMPLE:
                    usr_i[u, K.UI_REMAINING] = k
                if n_nodes == 1:
                    send[0, 1] = 0  # a single node: no draw
                elif SIMPLE or (k == 1 and uniform_random):
                    # uniform(rng, RNG_ROUTING) through the words: the draw the loop already
                    # compiles for arrivals, not a second one (~0.4 s of a cold start)
                    x, r0, r1, r2, r3 = uniform_words(rng[K.RNG_ROUTING, 0], rng[K.RNG_ROUTING, 1],
                                                      rng[K.RNG_ROUTING, 2], rng[K.RNG_ROUTING, 3])
                    rng[K.RNG_ROUTING, 0], rng[K.RNG_ROUTING, 1] = r0, r1
                    rng[K.RNG_ROUTING, 2], rng[K.RNG_ROUTING, 3] = r2, r3
                    send[0, 1] = min(int(x * n_nodes), n_nodes - 1)
                else:
                    stamp += 1
                    for i in range(k):  # k distinct nodes
                        node = np.uint64(pick_node(routing, node_i, node_f, isv, fs, rng,
                                                   K.RNG_ROUTING, stamp, i))
                        node_i[node, K.NI_STAMP] = stamp
                        send[i, 1] = node
                for i in range(k):
                    call_free_n -= 1
                    c = np.uint64(call_free[np.uint64(call_free_n)])
                    call_i[c, K.CL_USER] = u
                    send[i, 0] = c
                    if not SIMPLE:
                        call_i[c, K.CL_ATTEMPTS] = 0
                        call_i[c, K.CL_HEDGES] = 0
                        call_i[c, K.CL_COPIES] = 0
                        call_i[c, K.CL_FIRST] = -1
                        call_i[c, K.CL_TIER] = tier
                        call_f[c, K.CLF_DEMAND] = demand[i]
                n_send = k
            if SIMPLE or const_rate:
                x, a0, a1, a2, a3 = uniform_words(a0, a1, a2, a3)
                t_arr = t - mean_gap * math.log(1.0 - x)
            else:  # through the array: the helper draws from it (thinning)
                rng[K.RNG_ARRIVALS, 0], rng[K.RNG_ARRIVALS, 1] = a0, a1
                rng[K.RNG_ARRIVALS, 2], rng[K.RNG_ARRIVALS, 3] = a2, a3
                t_arr = next_arrival(rng, rmax, const_rate, rate_t, rate_v, t)
                a0, a1, a2, a3 = rng[K.RNG_ARRIVALS, 0], rng[K.RNG_ARRIVALS, 1], rng[
                    K.RNG_ARRIVALS, 2], rng[K.RNG_ARRIVALS, 3]

        # ---- the user request ends: client counters, record row, histogram. Cost: one
        # log10 (the histogram bin), ~10 stores, 10 more with records on
        if fin_u >= 0:
            u = np.uint64(fin_u)
            in_flight -= 1
            if SIMPLE and fin_j >= 0:  # its job's row and LEAN_USER, LEAN_CALL say it all
                jf = np.uint64(fin_j)
                t0 = job_f[jf, K.JF_T_NODE]  # (sent at its arrival)
                tier = np.uint64(job_i[jf, K.JI_TIER])
                demand_s = job_f[jf, K.JF_DEMAND]
                crit = job_i[jf, K.JI_NODE]
                fanout_u = LEAN_END[0]  # (its call's one attempt, no hedge: LEAN_END)
                attempts = LEAN_END[1]
                hedges = LEAN_END[2]
                degraded = LEAN_END[3]
                wrong = LEAN_END[4]
            else:
                t0 = usr_f[u, K.UF_T_ARRIVAL]
                tier = np.uint64(usr_i[u, K.UI_TIER])
                demand_s = usr_f[u, K.UF_DEMAND]
                crit = usr_i[u, K.UI_CRIT]
                fanout_u = usr_i[u, K.UI_FANOUT]
                attempts = usr_i[u, K.UI_ATTEMPTS]
                hedges = usr_i[u, K.UI_HEDGES]
                degraded = usr_i[u, K.UI_DEGRADED]
                wrong = usr_i[u, K.UI_WRONG]
            latency_ms = (t - t0) * 1000.0
            outcome = np.uint64(fin_outcome)
            fleet_c[tier * np.uint64(N_OUTCOMES) + outcome] += 1  # client_requests_total
            if degraded != 0:
                fleet_c[K.F_DEGRADED] += 1
            if record:
                r = np.uint64(n_rec)
                rec_f[r, 0] = t0
                rec_f[r, 1] = latency_ms
                rec_f[r, 2] = demand_s * 1000.0
                rec_i[r, 0] = np.int64(tier)
                rec_i[r, 1] = fin_outcome
                rec_i[r, 2] = crit
                rec_i[r, 3] = fanout_u
                rec_i[r, 4] = attempts + hedges
                rec_i[r, 5] = degraded
                rec_i[r, 6] = 1 - wrong
                n_rec += 1
            if t0 >= warmup:
                tier_cnt[tier, outcome] += 1
                tier_ext[tier, K.TX_ATTEMPTS] += attempts
                tier_ext[tier, K.TX_HEDGES] += hedges
                tier_ext[tier, K.TX_DEGRADED] += degraded
                if fin_outcome == K.OK:
                    tier_ext[tier, K.TX_WRONG] += wrong
                if fin_outcome == K.OK or fin_outcome == K.ERROR:  # (all a plain run has)
                    hist[tier, outcome, np.uint64(hist_bin(latency_ms))] += 1
                    lat_sum[tier, outcome] += latency_ms
            usr_i[u, K.UI_GEN] += 1
            usr_free[np.uint64(usr_free_n)] = u
            usr_free_n += 1

        # ---- send: each new call's first attempt joins its node's queue. Cost: a job
        # from the pool, ~18 stores (job row, call row, FIFO link)
        for i in range(n_send):
            c = np.uint64(send[i, 0])
            node = np.uint64(send[i, 1])
            job_free_n -= 1
            j = np.uint64(job_free[np.uint64(job_free_n)])
            job_i[j, K.JI_CALL] = np.int64(c)
            job_i[j, K.JI_GEN] += 1
            job_i[j, K.JI_CLIENT] = K.C_WAITING
            job_i[j, K.JI_HEDGE] = 0
            fleet_c[K.F_ATTEMPTS] += 1
            if SIMPLE:  # the call's row stays unwritten (LEAN_CALL)
                job_i[j, K.JI_TIER] = new_tier
                job_i[j, K.JI_SIB] = -1
                job_f[j, K.JF_DEMAND] = demand[i]
            else:
                job_i[j, K.JI_TIER] = call_i[c, K.CL_TIER]
                job_i[j, K.JI_SIB] = call_i[c, K.CL_FIRST]
                call_i[c, K.CL_FIRST] = j
                call_i[c, K.CL_COPIES] += 1
                call_i[c, K.CL_ATTEMPTS] += 1
                if budgeted and call_i[c, K.CL_ATTEMPTS] == 1:
                    budget[0, budget_slot(budget, isv, budget_width, t)] += 1
                job_f[j, K.JF_DEMAND] = call_f[c, K.CLF_DEMAND]
            job_i[j, K.JI_NODE] = np.int64(node)
            job_i[j, K.JI_DEGRADED] = 0
            job_f[j, K.JF_T_NODE] = t
            job_i[j, K.JI_NEXT] = -1
            tail = node_i[node, K.NI_QTAIL]
            job_i[j, K.JI_PREV] = tail
            if SIMPLE and tail < 0 and node_i[node, K.NI_BUSY] < node_i[node, K.NI_SERVERS]:
                direct = j  # no queue and a server idle: it starts below, never linked (its
                # row then holds what it would after a link and a dequeue)
            else:  # link it at the queue's tail (FIFO)
                job_i[j, K.JI_STATE] = K.J_QUEUED
                if tail >= 0:
                    job_i[np.uint64(tail), K.JI_NEXT] = np.int64(j)
                else:
                    node_i[node, K.NI_QHEAD] = np.int64(j)
                node_i[node, K.NI_QTAIL] = np.int64(j)
                node_i[node, K.NI_QLEN] += 1
            touched[np.uint64(n_touched)] = np.int64(node)
            n_touched += 1

        # ---- start service where servers are free; each start pushes its completion.
        # Cost: a dequeue, busy-seconds, a heap push, O(log in-service copies)
        for i in range(n_touched):
            node = np.uint64(touched[i])
            while True:
                if SIMPLE and direct != NO_ROW:  # the copy just sent (see send)
                    j = direct
                    direct = NO_ROW
                elif (node_i[node, K.NI_QLEN] > 0
                      and node_i[node, K.NI_BUSY] < node_i[node, K.NI_SERVERS]):
                    j = np.uint64(node_i[node, K.NI_QHEAD])  # dequeue
                    nxt = job_i[j, K.JI_NEXT]
                    node_i[node, K.NI_QHEAD] = nxt
                    if nxt >= 0:
                        job_i[np.uint64(nxt), K.JI_PREV] = -1
                    else:
                        node_i[node, K.NI_QTAIL] = -1
                    node_i[node, K.NI_QLEN] -= 1
                else:
                    break
                job_i[j, K.JI_STATE] = K.J_SERVING
                job_f[j, K.JF_T_START] = t
                busy = node_i[node, K.NI_BUSY]
                node_f[node, K.NF_BUSY_AREA] += busy * (t - node_f[node, K.NF_LAST_T])
                node_f[node, K.NF_LAST_T] = t
                node_i[node, K.NI_BUSY] = busy + 1
                tp = t + job_f[j, K.JF_DEMAND] * node_f[node, K.NF_SLOWDOWN]
                kp = ((job_i[j, K.JI_GEN] & K.GEN_MASK) << 32) | (np.int64(j) << 3) | K.EV_DONE
                hi = np.uint64(heap_n)  # heap push (sift up)
                heap_n += 1
                while hi > K.U0:
                    parent = (hi - K.U1) >> K.U1
                    if heap_t[parent] <= tp:
                        break
                    heap_t[hi] = heap_t[parent]
                    heap_k[hi] = heap_k[parent]
                    hi = parent
                heap_t[hi] = tp
                heap_k[hi] = kp

    if SIMPLE:
        lean_rows(job_i, job_f, call_i, call_f, usr_i, usr_f, True)  # (written back)
    isv[K.IS_HEAP_N] = heap_n
    isv[K.IS_JOB_FREE_N] = job_free_n
    isv[K.IS_USR_FREE_N] = usr_free_n
    isv[K.IS_CALL_FREE_N] = call_free_n
    isv[K.IS_NREC] = n_rec
    isv[K.IS_USER_SEQ] = user_seq
    isv[K.IS_IN_FLIGHT_USERS] = in_flight
    isv[K.IS_STAMP] = stamp
    fs[K.FS_NOW] = now
    fs[K.FS_NEXT_ARRIVAL] = t_arr
    rng[K.RNG_ARRIVALS, 0], rng[K.RNG_ARRIVALS, 1] = a0, a1
    rng[K.RNG_ARRIVALS, 2], rng[K.RNG_ARRIVALS, 3] = a2, a3
    rng[K.RNG_SERVICE, 0], rng[K.RNG_SERVICE, 1] = v0, v1
    rng[K.RNG_SERVICE, 2], rng[K.RNG_SERVICE, 3] = v2, v3
    return status


def _compiled(py, simple: bool):
    """``py`` compiled with :data:`SIMPLE` set to ``simple``, cached under a name carrying
    it and a digest of the files it inlines (:mod:`relakit.sim.cachename`). SIMPLE is
    read as a compile-time constant: numba prunes the branches it decides, and never
    types the helpers only they call.

    ``noalias`` (:func:`relakit.jit.njit`): numba's ``noalias`` flag marks every array
    parameter's data ``noalias`` for LLVM, which may then keep a loaded value in a
    register across stores to other arrays (by default a store to ``job_i`` could
    change ``node_i``, so it is loaded again). True of the loops' arguments: the fleet
    allocates every state, output and configuration array on its own and checks it
    (``Fleet._check_disjoint``). Measured (A/B, interleaved, process time): plain M/M/8
    +4 %, 50 nodes +2 %; the general kernel gained nothing (-5 %, and 1.00 in a
    second A/B of 7 rounds), so it keeps the default."""
    return njit(cache=True, error_model="numpy", noalias=True)(_body(py, simple))


def _body(py, simple: bool):
    """``py``'s code with SIMPLE = ``simple``, named for the cache."""
    return digest_named(py, "simple-" if simple else "", SIMPLE=simple)


advance_plain_simple = _compiled(advance_plain, simple=True)
advance_plain = _compiled(advance_plain, simple=False)
