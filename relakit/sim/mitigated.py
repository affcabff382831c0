"""The lean mitigated loops: hedging, deadlines, retries and node errors.

The mitigations users study most (hedging after a fixed delay, per-attempt deadlines,
retries with backoff and a retry budget, node error and wrong-answer rates) ran only in
the general :func:`relakit.sim.kernel.advance`, whose own cost with nothing on is ~1.6x
the plain loop's: it carries every mechanism's branches, fan-out, admission, probes,
failover and degraded paths at every event, takes the Config, State and Output tuples,
and indexes its rows signed. :func:`advance_mitigated` is that loop for the stretches
that need only those four mechanisms, written as :mod:`relakit.sim.plain` is: the arrays
themselves as arguments, unsigned row indices, ``noalias``, and no code for what such a
stretch cannot meet. It is compiled twice (:data:`ONE_CALL`): for requests of one call,
the common case, with the fan-out folded away and the user row left to the call's
(:data:`LEAN_USER`), and for requests fanned out to several calls
(:func:`advance_mitigated_fanout`).

It reads and writes the same state and output arrays as the general kernel, in the same
way, and draws the same numbers from the same streams, so the two hand over between any
two calls; ``tests/test_kernel_mitigated.py`` runs scenarios through both and asserts
every array equal, bit for bit (but the per-event scratch ones, ``plain.SCRATCH``, and
the user rows the one-call loop leaves unwritten for requests that ended in it:
:data:`LEAN_USER`).

:func:`mitigated_ok` says when it applies; :func:`relakit.sim.fleet.Fleet.advance`
asks it after ``plain.plain_ok``. A fault schedule that crashes nothing (error,
wrong-answer and slowdown rows) is allowed: ``Fleet.advance`` runs this loop to just
before a change, applies the change in Python (``kernel.schedule_step``) and goes on.
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
from relakit.sim.rng import exponential, uniform, uniform_words

# the mechanisms this loop runs (kernel.FEATURES); a stretch with none of them is the
# plain loop's, one with any other the general kernel's
MECHANISMS = frozenset({"hedging", "deadlines", "retries", "errors"})
# the timed events it may find on the heap: completions and retries (fixed-delay hedges
# and attempt timeouts wait in the rings; the heap holds a hedge only when adaptive)
HEAP_EVENTS = (K.EV_DONE, K.EV_RETRY)
N_OUTCOMES = len(K.OUTCOMES)
# A compile-time constant (see _compiled): True in advance_mitigated, the loop for requests
# of one call (the bench's, and most scenarios'), where the fan-out's loops fold away and
# the user row stays unwritten (LEAN_USER); False in advance_mitigated_fanout
ONE_CALL = True
# A request the one-call loop admits gets an arrival time in its user row, nothing more,
# while it lives: one call per request, so the rest of the row (these columns and values, and
# UI_TIER, UF_DEMAND: its call's tier and first-attempt demand) is what the general
# kernel writes at arrival and folds the call into at its end. lean_users writes the
# live requests' rows before the loop returns, so either kernel may take over; a request
# that ends here is counted from its call's row (the rows of ended requests keep an older
# request's values: nothing reads a free row). Measured: +1.9 % (A/B, paired median of 7
# rounds, the bench's mitigated fleet), for ~15 loads and stores fewer per request.
LEAN_USER = ((K.UI_REMAINING, 1), (K.UI_WORST, K.OK), (K.UI_CRIT, -1), (K.UI_FANOUT, 1),
             (K.UI_ATTEMPTS, 0), (K.UI_HEDGES, 0), (K.UI_DEGRADED, 0), (K.UI_WRONG, 0))

# advance_mitigated's parameters, in order (run_mitigated picks them out by name): the
# plain loop's configuration and outputs; its state with the rings' keys, the heap timers
# an event sets (pend_*) and, for the fan-out loop, the copies to send
CFG_ARGS = ("cfg_f", "cfg_i", "tier_cum", "rate_t", "rate_v", "buckets", "phase")
STATE_ARGS = ("fs", "is_", "rng", "node_i", "node_f", "node_c", "cnt", "lat_b", "fleet_c",
              "budget", "job_i", "job_f", "job_free", "usr_i", "usr_f", "usr_free", "call_i",
              "call_f", "call_free", "heap_t", "heap_k", "tq_t", "tq_k", "tq_n", "scratch",
              "send", "pend_t", "pend_k", "demand")
OUT_ARGS = ("metrics", "sample_t", "fleet", "fleet_t", "rec_f", "rec_i", "hist", "tier_cnt",
            "tier_ext", "lat_sum")


def mitigated_allowed(cfg: K.Config, st: K.State) -> bool:
    """The part of :func:`mitigated_ok` that reads no row of the pools: the mechanisms
    on, the model and the node controls (O(nodes)). False stays false until Python
    changes a flag, a control or a fault (``Fleet`` chooses again then)."""
    if not K.features_of(cfg, st) <= MECHANISMS:  # (none: a stretch plain_ok refused for
        return False  # what a mechanism left pending, hedges or timers, is this loop's too)
    ni, nf = st.node_i, st.node_f
    return not (cfg.cfg_f[K.CF_HEDGE_Q] != 0.0 or cfg.load_x.shape[0] > 0
                or (cfg.dep_node >= 0).any() or ni[:, K.NI_FAILOVER].any()
                or not ((ni[:, K.NI_ROUTABLE] != 0) & (nf[:, K.NF_WEIGHT] > 0.0)).any())


def mitigated_ok(cfg: K.Config, st: K.State) -> bool:
    """True when the next call may run :func:`advance_mitigated` (or its fan-out twin):
    the mechanisms on are some of :data:`MECHANISMS` (hedging with a fixed delay; errors
    from node rates, not from load or dependencies), some node is eligible, and nothing
    the general kernel alone handles is pending (a failover, a probe, a degraded copy or
    request, a copy being moved or ending, an adaptive hedge on the heap). True for a
    plain stretch too: ``Fleet`` asks ``plain_ok`` first. A change of the fault
    schedule in the stretch is the caller's to split off (``Fleet.advance``). Costs a
    pass over the heap and the job pool, as ``plain_ok``."""
    if not mitigated_allowed(cfg, st):
        return False
    kinds = st.heap_k[: st.is_[K.IS_HEAP_N]] & K.EV_MASK
    if not np.isin(kinds, HEAP_EVENTS).all():
        return False
    ji = st.job_i
    state = ji[:, K.JI_STATE]
    live = state != K.J_FREE
    if (live & (state != K.J_QUEUED) & (state != K.J_SERVING)).any():
        return False
    jl = ji[live]
    if jl[:, K.JI_DEGRADED].any() or (jl[:, K.JI_CALL] < 0).any():
        return False
    # a request admitted in degraded mode (partial fan-out) may outlive it with no copy
    # served degraded yet: its row says so, and only the general kernel reads it
    users = np.ones(st.usr_i.shape[0], bool)
    users[st.usr_free[: st.is_[K.IS_USR_FREE_N]]] = False
    ui = st.usr_i[users]
    return not (ui[:, K.UI_DEGRADED].any() or (ui[:, K.UI_FANOUT] != cfg.cfg_i[K.CI_FANOUT]).any())


@register_jitable(error_model="numpy", no_cfunc_wrapper=True)
def lean_users(call_i, call_f, call_free, call_free_n, usr_i, usr_f):
    """The user rows of the requests live at return, as the general kernel holds them
    (:data:`LEAN_USER`; tier and demand from the request's call). A request is live
    while its call is (one call each), whether a copy of it is out or its retry waits:
    every call row not on the free list. O(call pool), a few us for 50 nodes."""
    n = call_i.shape[0]
    free = np.zeros(n, np.bool_)
    for i in range(call_free_n):
        free[call_free[i]] = True
    for c in range(n):
        if free[c]:
            continue
        u = call_i[c, K.CL_USER]
        for col, value in LEAN_USER:
            usr_i[u, col] = value
        usr_i[u, K.UI_TIER] = call_i[c, K.CL_TIER]
        usr_f[u, K.UF_DEMAND] = call_f[c, K.CLF_DEMAND]


def run_mitigated(cfg: K.Config, st: K.State, out: K.Output, t_end: float) -> int:
    """:func:`advance_mitigated` (or, for requests of several calls,
    :func:`advance_mitigated_fanout`) called as the general kernel is:
    ``(cfg, st, out, t_end)``."""
    args = (*[getattr(cfg, a) for a in CFG_ARGS], *[getattr(st, a) for a in STATE_ARGS],
            *[getattr(out, a) for a in OUT_ARGS], t_end)
    one_call, fanout = loops()
    return (one_call if cfg.cfg_i[K.CI_FANOUT] == 1 else fanout)(*args)


def loops():
    """(one-call loop, fan-out loop) to call: the ones compiled ahead of time for these
    sources (:mod:`relakit.sim.aot`, built by ``make setup``) when on disk and not
    switched off (``RELAKIT_AOT=0``), which spares a process numba altogether; else
    numba's."""
    built = aot.load()
    if built is None:
        return advance_mitigated, advance_mitigated_fanout
    return built.advance_mitigated, built.advance_mitigated_fanout


def advance_mitigated(cfg_f, cfg_i, tier_cum, rate_t, rate_v, bounds, phase,
                      fs, isv, rng, node_i, node_f, node_c, cnt, lat_b, fleet_c,
                      budget, job_i, job_f, job_free, usr_i, usr_f, usr_free, call_i,
                      call_f, call_free, heap_t, heap_k, tq_t, tq_k, tq_n, touched,
                      send, pend_t, pend_k, demand,
                      metrics, sample_t, fleet, fleet_t, rec_f, rec_i, hist, tier_cnt,
                      tier_ext, lat_sum, t_end):
    """:func:`relakit.sim.kernel.advance` for a stretch :func:`mitigated_ok` accepts, on
    the arrays themselves (``CFG_ARGS``, ``STATE_ARGS``, ``OUT_ARGS``, then ``t_end``).

    The general kernel's order of work, kept exactly (events, draws, timers filed):
    the loop head drops the rings' stale heads and takes the earliest of arrival,
    heap top, ring heads and the next sample; an event (a completion with its error
    draw, an attempt timeout, a hedge, a retry, or an arrival) sets at most one call to
    settle and the copies to send (one, or an arrival's one per call); then the call is
    settled (retry with backoff and
    budget, or finished and its other copies cancelled as configured), the user
    request that ended is counted, the copies are sent (their timers straight onto the
    rings' tails, a FIFO link, or a start at once when it meets no queue and an idle
    server), service starts where servers are free, and the heap timers the event set
    are filed in the order set. Rows are indexed unsigned, as in the plain loop: with
    a signed index numba adds a negative-index fix-up to every access.
    """
    n_nodes = node_i.shape[0]
    heap_cap = heap_t.shape[0]
    tq_cap = tq_t.shape[1]
    prepare_routing(node_i, node_f, isv, fs)
    n_elig = isv[K.IS_N_ELIGIBLE]
    hedge_mask = isv[K.IS_HEDGE_ON]
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
    deadline = cfg_f[K.CF_DEADLINE]
    deadlines = deadline < np.inf
    max_attempts = cfg_i[K.CI_MAX_ATTEMPTS]
    max_hedges = cfg_i[K.CI_MAX_HEDGES]
    cancel = cfg_i[K.CI_CANCEL]
    retry_mask = cfg_i[K.CI_RETRY_MASK]
    backoff0 = cfg_f[K.CF_BACKOFF]
    backoff_max = cfg_f[K.CF_BACKOFF_MAX]
    jitter = cfg_i[K.CI_JITTER] != 0
    budget_ratio = cfg_f[K.CF_BUDGET_RATIO]
    budgeted = budget_ratio < np.inf
    budget_width = cfg_f[K.CF_BUDGET_WINDOW] / K.BUDGET_BUCKETS
    n_bounds = bounds.shape[0]
    sample_dt = cfg_f[K.CF_SAMPLE_DT]
    hedge_q = cfg_f[K.CF_HEDGE_Q]
    record_cap = rec_f.shape[0]
    samp_cap = sample_t.shape[0]
    fleet_cap = fleet_t.shape[0]
    fanout = 1 if ONE_CALL else cfg_i[K.CI_FANOUT]
    # the general kernel's room checks, kept exactly: pools grow at the same event
    room = fanout + max_hedges + 4
    heap_room = 4 * fanout + 16
    uniform_random = routing == K.R_RANDOM and isv[K.IS_EQUAL_WEIGHTS] != 0
    hedge_delay = fs[K.FS_HEDGE_DELAY]

    # scalars in locals (registers), written back on return (see relakit.sim.plain)
    hn = isv[K.IS_HEAP_N]
    job_free_n = isv[K.IS_JOB_FREE_N]
    usr_free_n = isv[K.IS_USR_FREE_N]
    call_free_n = isv[K.IS_CALL_FREE_N]
    n_rec = isv[K.IS_NREC]
    user_seq = isv[K.IS_USER_SEQ]
    in_flight = isv[K.IS_IN_FLIGHT_USERS]
    stamp = isv[K.IS_STAMP]
    budget_bucket = isv[K.IS_BUDGET_BUCKET]
    to_h, to_n = tq_n[K.TQ_TIMEOUT, 0], tq_n[K.TQ_TIMEOUT, 1]  # the rings' (head, count)
    he_h, he_n = tq_n[K.TQ_HEDGE, 0], tq_n[K.TQ_HEDGE, 1]
    now = fs[K.FS_NOW]
    t_arr = fs[K.FS_NEXT_ARRIVAL]
    t_rare = min(fs[K.FS_NEXT_SAMPLE], fs[K.FS_NEXT_NODE_SAMPLE])
    status = K.DONE
    a0, a1, a2, a3 = rng[K.RNG_ARRIVALS, 0], rng[K.RNG_ARRIVALS, 1], rng[K.RNG_ARRIVALS, 2], rng[
        K.RNG_ARRIVALS, 3]
    v0, v1, v2, v3 = rng[K.RNG_SERVICE, 0], rng[K.RNG_SERVICE, 1], rng[K.RNG_SERVICE, 2], rng[
        K.RNG_SERVICE, 3]
    e0, e1, e2, e3 = rng[K.RNG_ERRORS, 0], rng[K.RNG_ERRORS, 1], rng[K.RNG_ERRORS, 2], rng[
        K.RNG_ERRORS, 3]
    r0, r1, r2, r3 = rng[K.RNG_ROUTING, 0], rng[K.RNG_ROUTING, 1], rng[K.RNG_ROUTING, 2], rng[
        K.RNG_ROUTING, 3]
    while True:
        # ---- loop head: drop the rings' stale heads (one row read each: most timeouts
        # and hedge timers fall due after their copy or call is over), then the earliest
        # of arrival, heap top, ring heads and next sample. Cost: a dozen loads, compares
        while to_n > 0:
            key = tq_k[K.TQ_TIMEOUT, to_h]
            j = np.uint64((key >> K.EV_BITS) & K.ID_MASK)
            if (job_i[j, K.JI_GEN] & K.GEN_MASK) == key >> 32 and (
                    job_i[j, K.JI_CLIENT] == K.C_WAITING):
                break
            to_h += 1
            if to_h == tq_cap:
                to_h = 0
            to_n -= 1
        while he_n > 0:
            key = tq_k[K.TQ_HEDGE, he_h]
            if (call_i[np.uint64((key >> K.EV_BITS) & K.ID_MASK), K.CL_GEN]
                    & K.GEN_MASK) == key >> 32:
                break
            he_h += 1
            if he_h == tq_cap:
                he_h = 0
            he_n -= 1
        t_heap = heap_t[0] if hn > 0 else np.inf
        src = K.TQ_HEAP  # where the earliest timer waits: the heap or a FIFO ring
        if to_n > 0 and tq_t[K.TQ_TIMEOUT, to_h] < t_heap:
            t_heap = tq_t[K.TQ_TIMEOUT, to_h]
            src = K.TQ_TIMEOUT
        if he_n > 0 and tq_t[K.TQ_HEDGE, he_h] < t_heap:
            t_heap = tq_t[K.TQ_HEDGE, he_h]
            src = K.TQ_HEDGE
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
                hedge_delay = fs[K.FS_HEDGE_DELAY]
            t_rare = min(fs[K.FS_NEXT_SAMPLE], fs[K.FS_NEXT_NODE_SAMPLE])
            continue
        if t > t_end:
            now = t_end if t_end > now else now
            break
        if (job_free_n < room or usr_free_n < 2 or call_free_n < room
                or heap_cap - hn < heap_room or tq_cap - to_n < room
                or tq_cap - he_n < room):
            status = K.GROW_POOLS
            break
        if record and record_cap - n_rec < 2:
            status = K.GROW_RECORDS
            break
        now = t
        n_touched = 0  # nodes whose queue may now start service
        n_pend = 0  # heap timers to file once the event is done
        n_send = 0  # copies to send: of call send_c to send_node (fan-out: send[i])
        send_c = K.U0
        send_node = K.U0
        send_hedge = 0
        res = False  # a copy answered its call (res_c), or the client gave up on it
        res_c = K.U0
        res_job = K.U0
        res_outcome = K.OK
        res_node = 0
        res_hedge = 0
        res_correct = 1
        fin = False  # the user request (fin_u) whose client sees its outcome now
        fin_u = K.U0
        fin_outcome = K.OK
        fin_tier = K.U0
        fin_attempts = 0
        fin_hedges = 0
        fin_demand = 0.0
        fin_crit = 0
        fin_wrong = 0

        if t_heap <= t_arr and src == K.TQ_TIMEOUT:  # ---- the client stops waiting for a copy
            key = tq_k[K.TQ_TIMEOUT, to_h]
            to_h += 1
            if to_h == tq_cap:
                to_h = 0
            to_n -= 1
            j = np.uint64((key >> K.EV_BITS) & K.ID_MASK)  # (live: the loop head checked)
            job_i[j, K.JI_CLIENT] = K.C_TIMED_OUT  # the server goes on working on it
            res = True
            res_c = np.uint64(job_i[j, K.JI_CALL])
            res_outcome = K.TIMEOUT
            res_node = job_i[j, K.JI_NODE]
            res_job = j
        elif t_heap <= t_arr and src == K.TQ_HEDGE:  # ---- a hedge falls due
            key = tq_k[K.TQ_HEDGE, he_h]
            he_h += 1
            if he_h == tq_cap:
                he_h = 0
            he_n -= 1
            c = np.uint64((key >> K.EV_BITS) & K.ID_MASK)  # (live: the loop head checked)
            if (not (hedge_mask >> call_i[c, K.CL_TIER]) & 1 or call_i[c, K.CL_COPIES] == 0
                    or call_i[c, K.CL_HEDGES] >= max_hedges):
                continue
            stamp += 1  # to a node other than those holding this call's copies
            n_avoid = 0
            j2 = call_i[c, K.CL_FIRST]
            while j2 >= 0:
                node_i[np.uint64(job_i[np.uint64(j2), K.JI_NODE]), K.NI_STAMP] = stamp
                n_avoid += 1
                j2 = job_i[np.uint64(j2), K.JI_SIB]
            if n_avoid >= n_elig:
                continue  # nowhere else to hedge to
            n_send = 1
            send_c = c
            send_node = np.uint64(pick_node(routing, node_i, node_f, isv, fs, rng, K.RNG_HEDGES,
                                            stamp, n_avoid))
            send_hedge = 1
            if not ONE_CALL:
                send[0, 0] = np.int64(send_c)
                send[0, 1] = np.int64(send_node)
        elif t_heap <= t_arr:  # ---- a timer from the heap: a completion or a retry
            key = heap_k[0]
            hn -= 1
            if hn > 0:  # pop: sift the last entry down from the root, branch-free child
                un = np.uint64(hn)
                last_t = heap_t[un]
                last_k = heap_k[un]
                hp = K.U0
                while True:
                    c = hp + hp + K.U1
                    if c >= un:
                        break
                    tc = heap_t[c]
                    if c + K.U1 < un:
                        t2 = heap_t[c + K.U1]
                        c += np.uint64(t2 < tc)
                        tc = min(t2, tc)
                    if tc >= last_t:
                        break
                    heap_t[hp] = tc
                    heap_k[hp] = heap_k[c]
                    hp = c
                heap_t[hp] = last_t
                heap_k[hp] = last_k
            ident = np.uint64((key >> K.EV_BITS) & K.ID_MASK)
            if key & K.EV_MASK == K.EV_DONE:  # ---- a copy's service ends
                j = ident
                if (job_i[j, K.JI_GEN] & K.GEN_MASK) != key >> 32:
                    continue  # stale: the copy was cancelled
                node = np.uint64(job_i[j, K.JI_NODE])
                busy = node_i[node, K.NI_BUSY]
                node_f[node, K.NF_BUSY_AREA] += busy * (t - node_f[node, K.NF_LAST_T])
                node_f[node, K.NF_LAST_T] = t
                node_i[node, K.NI_BUSY] = busy - 1
                touched[0] = np.int64(node)
                n_touched = 1
                outcome = K.OK  # the node's error and wrong-answer draws
                correct = 1
                err = node_f[node, K.NF_ERR_RATE]
                if err > 0.0:
                    x, e0, e1, e2, e3 = uniform_words(e0, e1, e2, e3)
                    if x < err:
                        outcome = K.ERROR
                wrong = node_f[node, K.NF_WRONG_RATE]
                if outcome == K.OK and wrong > 0.0:
                    x, e0, e1, e2, e3 = uniform_words(e0, e1, e2, e3)
                    if x < wrong:
                        correct = 0  # a silent failure: success, wrong answer
                        node_c[node, K.NC_WRONG] += 1
                lat = t - job_f[j, K.JF_T_NODE]  # the server's histogram (Prometheus buckets)
                b = 0
                for ib in range(n_bounds):
                    b += lat > bounds[ib]
                lat_b[node, np.uint64(b)] += 1
                node_f[node, K.NF_LAT_SUM] += lat
                client = job_i[j, K.JI_CLIENT]
                seen = K.TIMEOUT if (client == K.C_TIMED_OUT and outcome == K.OK) else outcome
                cnt[node, np.uint64(job_i[j, K.JI_TIER]), np.uint64(seen)] += 1
                if client == K.C_WAITING:
                    res = True
                    res_c = np.uint64(job_i[j, K.JI_CALL])
                    res_outcome = outcome
                    res_node = np.int64(node)
                    res_hedge = job_i[j, K.JI_HEDGE]
                    res_correct = correct
                    res_job = j
                job_i[j, K.JI_STATE] = K.J_FREE  # free the job; its timers are now stale
                job_i[j, K.JI_GEN] += 1
                job_free[np.uint64(job_free_n)] = np.int64(j)
                job_free_n += 1
            else:  # ---- a retry falls due, after its backoff
                c = ident
                if (call_i[c, K.CL_GEN] & K.GEN_MASK) != key >> 32:
                    continue  # (never: a call waiting on a retry has no copy to end it)
                stamp += 1  # to a node other than the last one tried, when there is one
                n_avoid = 0
                if n_elig > 1 and call_i[c, K.CL_LAST_NODE] >= 0:
                    node_i[np.uint64(call_i[c, K.CL_LAST_NODE]), K.NI_STAMP] = stamp
                    n_avoid = 1
                n_send = 1
                send_c = c
                send_node = np.uint64(pick_node(routing, node_i, node_f, isv, fs, rng,
                                                K.RNG_REROUTE, stamp, n_avoid))
                if not ONE_CALL:
                    send[0, 0] = np.int64(send_c)
                    send[0, 1] = np.int64(send_node)
        else:  # ---- a user request arrives: tier, demand, node, call; next arrival.
            # Cost: 3 uniforms and 2 logs, ~20 stores (user and call rows)
            usr_free_n -= 1
            u = np.uint64(usr_free[np.uint64(usr_free_n)])
            user_seq += 1
            in_flight += 1
            x, a0, a1, a2, a3 = uniform_words(a0, a1, a2, a3)
            tier = (x >= tier_cum[0]) + (x >= tier_cum[1])  # as the general kernel's
            # every call's first-attempt demand, for the full fan-out (one in the one-call
            # loop): the service stream stays in step with the general kernel's
            for i in range(fanout):
                if svc_kind == K.S_EXP:
                    x, v0, v1, v2, v3 = uniform_words(v0, v1, v2, v3)
                    demand[i] = -svc_a * math.log(1.0 - x)
                else:  # through the array: the helper draws from it
                    rng[K.RNG_SERVICE, 0], rng[K.RNG_SERVICE, 1] = v0, v1
                    rng[K.RNG_SERVICE, 2], rng[K.RNG_SERVICE, 3] = v2, v3
                    demand[i] = draw_service(rng, K.RNG_SERVICE, svc_kind, svc_a, svc_b, svc_c)
                    v0, v1 = rng[K.RNG_SERVICE, 0], rng[K.RNG_SERVICE, 1]
                    v2, v3 = rng[K.RNG_SERVICE, 2], rng[K.RNG_SERVICE, 3]
            k = 1 if ONE_CALL else min(fanout, n_elig)  # (mitigated_ok: some node eligible)
            if ONE_CALL:  # its user row: the arrival time only; the rest is its call's
                usr_f[u, K.UF_T_ARRIVAL] = t  # (LEAN_USER)
            else:
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
                usr_i[u, K.UI_REMAINING] = k
            # k distinct nodes (one-call loop: send_node; fan-out: send[i, 1])
            if n_nodes == 1:
                node = K.U0  # a single node: no draw
                if not ONE_CALL:
                    send[0, 1] = 0
            elif k == 1 and uniform_random:
                x, r0, r1, r2, r3 = uniform_words(r0, r1, r2, r3)
                node = np.uint64(min(int(x * n_nodes), n_nodes - 1))
                if not ONE_CALL:
                    send[0, 1] = np.int64(node)
            else:
                stamp += 1
                rng[K.RNG_ROUTING, 0], rng[K.RNG_ROUTING, 1] = r0, r1  # (the helper draws)
                rng[K.RNG_ROUTING, 2], rng[K.RNG_ROUTING, 3] = r2, r3
                for i in range(k):
                    node = np.uint64(pick_node(routing, node_i, node_f, isv, fs, rng,
                                               K.RNG_ROUTING, stamp, i))
                    node_i[node, K.NI_STAMP] = stamp
                    if not ONE_CALL:
                        send[i, 1] = np.int64(node)
                r0, r1, r2, r3 = rng[K.RNG_ROUTING, 0], rng[K.RNG_ROUTING, 1], rng[
                    K.RNG_ROUTING, 2], rng[K.RNG_ROUTING, 3]
            send_node = node
            for i in range(k):  # a call for each
                call_free_n -= 1
                c = np.uint64(call_free[np.uint64(call_free_n)])
                call_i[c, K.CL_USER] = np.int64(u)
                call_i[c, K.CL_ATTEMPTS] = 0
                call_i[c, K.CL_HEDGES] = 0
                call_i[c, K.CL_COPIES] = 0
                call_i[c, K.CL_FIRST] = -1
                call_i[c, K.CL_TIER] = tier
                call_f[c, K.CLF_DEMAND] = demand[i]
                send_c = c
                if not ONE_CALL:
                    send[i, 0] = np.int64(c)
            n_send = k
            if const_rate:
                x, a0, a1, a2, a3 = uniform_words(a0, a1, a2, a3)
                t_arr = t - mean_gap * math.log(1.0 - x)
            else:  # through the array: the helper draws from it (thinning)
                rng[K.RNG_ARRIVALS, 0], rng[K.RNG_ARRIVALS, 1] = a0, a1
                rng[K.RNG_ARRIVALS, 2], rng[K.RNG_ARRIVALS, 3] = a2, a3
                t_arr = next_arrival(rng, rmax, const_rate, rate_t, rate_v, t)
                a0, a1, a2, a3 = rng[K.RNG_ARRIVALS, 0], rng[K.RNG_ARRIVALS, 1], rng[
                    K.RNG_ARRIVALS, 2], rng[K.RNG_ARRIVALS, 3]

        # ---- settle: a copy answered its call, or the client gave up on one. Unlink
        # the copy; on success (or nothing else outstanding and no retry) the call is
        # over: cancel its other copies as configured, fold it into its user. Cost:
        # ~15 loads and stores over the job, call and user rows; a retry's backoff
        if res:
            c = res_c
            prev = -1  # the copy no longer counts among its call's copies
            j2 = call_i[c, K.CL_FIRST]
            while j2 != np.int64(res_job):
                prev = j2
                j2 = job_i[np.uint64(j2), K.JI_SIB]
            if prev < 0:
                call_i[c, K.CL_FIRST] = job_i[res_job, K.JI_SIB]
            else:
                job_i[np.uint64(prev), K.JI_SIB] = job_i[res_job, K.JI_SIB]
            copies = call_i[c, K.CL_COPIES] - 1
            call_i[c, K.CL_COPIES] = copies
            done = -1
            if res_outcome == K.OK:
                done = K.OK
            elif copies == 0:  # nothing else outstanding: retry, or the call fails
                done = res_outcome
                attempts = call_i[c, K.CL_ATTEMPTS]
                if (retry_mask >> res_outcome) & 1 and attempts < max_attempts:
                    allowed = True
                    if budgeted:
                        isv[K.IS_BUDGET_BUCKET] = budget_bucket  # (the helper reads it)
                        slot = budget_slot(budget, isv, budget_width, t)
                        budget_bucket = isv[K.IS_BUDGET_BUCKET]
                        spent = 0
                        earned = 0
                        for bb in range(K.BUDGET_BUCKETS):
                            spent += budget[1, bb]
                            earned += budget[0, bb]
                        allowed = spent + 1 <= budget_ratio * earned
                        if allowed:
                            budget[1, slot] += 1
                    if allowed:
                        done = -1
                        fleet_c[K.F_RETRIES] += 1
                        backoff = min(backoff0 * 2.0 ** (attempts - 1), backoff_max)
                        if jitter:
                            backoff *= uniform(rng, K.RNG_JITTER)  # full jitter
                        call_i[c, K.CL_LAST_NODE] = res_node
                        pend_t[n_pend] = t + backoff
                        pend_k[n_pend] = (((call_i[c, K.CL_GEN] & K.GEN_MASK) << 32)
                                          | (np.int64(c) << K.EV_BITS) | K.EV_RETRY)
                        n_pend += 1
                    else:
                        fleet_c[K.F_RETRIES_DENIED] += 1
            if done >= 0:  # the call is over: settle its other copies, then its user
                if done == K.OK and res_hedge != 0:
                    fleet_c[K.F_HEDGES_WON] += 1
                j2 = call_i[c, K.CL_FIRST]
                while j2 >= 0:
                    jj = np.uint64(j2)
                    nxt = job_i[jj, K.JI_SIB]
                    job_i[jj, K.JI_SIB] = -1
                    job_i[jj, K.JI_CLIENT] = K.C_LOST
                    state = job_i[jj, K.JI_STATE]
                    node = np.uint64(job_i[jj, K.JI_NODE])
                    if (state == K.J_QUEUED and cancel != K.CANCEL_NEVER) or (
                            state == K.J_SERVING and cancel == K.CANCEL_STARTED):
                        if state == K.J_QUEUED:  # unlink from the node's queue
                            qp = job_i[jj, K.JI_PREV]
                            qn = job_i[jj, K.JI_NEXT]
                            if qp >= 0:
                                job_i[np.uint64(qp), K.JI_NEXT] = qn
                            else:
                                node_i[node, K.NI_QHEAD] = qn
                            if qn >= 0:
                                job_i[np.uint64(qn), K.JI_PREV] = qp
                            else:
                                node_i[node, K.NI_QTAIL] = qp
                            node_i[node, K.NI_QLEN] -= 1
                        else:  # stop it mid-service: the server frees up now
                            busy = node_i[node, K.NI_BUSY]
                            node_f[node, K.NF_BUSY_AREA] += busy * (t - node_f[node, K.NF_LAST_T])
                            node_f[node, K.NF_LAST_T] = t
                            node_i[node, K.NI_BUSY] = busy - 1
                            touched[n_touched] = np.int64(node)
                            n_touched += 1
                        node_c[node, K.NC_CANCELLED] += 1
                        job_i[jj, K.JI_STATE] = K.J_FREE
                        job_i[jj, K.JI_GEN] += 1
                        job_free[np.uint64(job_free_n)] = j2
                        job_free_n += 1
                    j2 = nxt
                if ONE_CALL:  # its user request ends with it: what the general kernel
                    # folds into the user row (LEAN_USER) is the call's, read from its row
                    fin = True
                    fin_u = np.uint64(call_i[c, K.CL_USER])
                    fin_outcome = done
                    fin_tier = np.uint64(call_i[c, K.CL_TIER])
                    fin_attempts = call_i[c, K.CL_ATTEMPTS]
                    fin_hedges = call_i[c, K.CL_HEDGES]
                    fin_demand = call_f[c, K.CLF_DEMAND]
                    fin_crit = res_node
                    fin_wrong = 1 - res_correct
                else:  # folded into its user row; the request ends with its last call
                    u = np.uint64(call_i[c, K.CL_USER])
                    usr_i[u, K.UI_ATTEMPTS] += call_i[c, K.CL_ATTEMPTS]
                    usr_i[u, K.UI_HEDGES] += call_i[c, K.CL_HEDGES]
                    if res_correct == 0:
                        usr_i[u, K.UI_WRONG] = 1
                    worst = usr_i[u, K.UI_WORST]
                    if done > worst:
                        usr_i[u, K.UI_WORST] = done
                        usr_i[u, K.UI_CRIT] = res_node
                    elif done == worst and done == K.OK:
                        usr_i[u, K.UI_CRIT] = res_node  # the slowest call decides latency
                    remaining = usr_i[u, K.UI_REMAINING] - 1
                    usr_i[u, K.UI_REMAINING] = remaining
                    if remaining == 0:
                        fin = True
                        fin_u = u
                        fin_outcome = usr_i[u, K.UI_WORST]
                        fin_tier = np.uint64(usr_i[u, K.UI_TIER])
                        fin_attempts = usr_i[u, K.UI_ATTEMPTS]
                        fin_hedges = usr_i[u, K.UI_HEDGES]
                        fin_demand = usr_f[u, K.UF_DEMAND]
                        fin_crit = usr_i[u, K.UI_CRIT]
                        fin_wrong = usr_i[u, K.UI_WRONG]
                call_i[c, K.CL_GEN] += 1  # its timers are now stale
                call_free[np.uint64(call_free_n)] = np.int64(c)
                call_free_n += 1

        # ---- the client sees a user request's outcome: counters, record row, histogram.
        # Cost: one histogram bin from the latency's bits, ~10 stores, 10 more with records
        if fin:
            u = fin_u
            in_flight -= 1
            t0 = usr_f[u, K.UF_T_ARRIVAL]
            latency_ms = (t - t0) * 1000.0
            fin_o = np.uint64(fin_outcome)
            fleet_c[fin_tier * np.uint64(N_OUTCOMES) + fin_o] += 1
            if record:
                r = np.uint64(n_rec)
                rec_f[r, 0] = t0
                rec_f[r, 1] = latency_ms
                rec_f[r, 2] = fin_demand * 1000.0
                rec_i[r, 0] = np.int64(fin_tier)
                rec_i[r, 1] = fin_outcome
                rec_i[r, 2] = fin_crit  # (the node of the call that decided its latency)
                rec_i[r, 3] = fanout  # (the user row's UI_FANOUT)
                rec_i[r, 4] = fin_attempts + fin_hedges
                rec_i[r, 5] = 0  # (UI_DEGRADED: never in this loop)
                rec_i[r, 6] = 1 - fin_wrong
                n_rec += 1
            if t0 >= warmup:
                tier_cnt[fin_tier, fin_o] += 1
                tier_ext[fin_tier, K.TX_ATTEMPTS] += fin_attempts
                tier_ext[fin_tier, K.TX_HEDGES] += fin_hedges
                if fin_outcome == K.OK:
                    tier_ext[fin_tier, K.TX_WRONG] += fin_wrong
                if fin_outcome == K.OK or fin_outcome == K.ERROR:
                    hist[fin_tier, fin_o, np.uint64(hist_bin(latency_ms))] += 1
                    lat_sum[fin_tier, fin_o] += latency_ms
            usr_i[u, K.UI_GEN] += 1
            usr_free[np.uint64(usr_free_n)] = np.int64(u)
            usr_free_n += 1

        # ---- send a copy (a first attempt, a retry or a hedge): a job from the pool, its
        # timers onto the rings' tails, a FIFO link or a start at once. Cost: ~20 stores
        for i_send in range(n_send):
            if ONE_CALL:
                c = send_c
                node = send_node
            else:
                c = np.uint64(send[i_send, 0])
                node = np.uint64(send[i_send, 1])
            job_free_n -= 1
            j = np.uint64(job_free[np.uint64(job_free_n)])
            job_i[j, K.JI_CALL] = np.int64(c)
            job_i[j, K.JI_GEN] += 1
            job_i[j, K.JI_CLIENT] = K.C_WAITING
            job_i[j, K.JI_HEDGE] = send_hedge
            send_tier = call_i[c, K.CL_TIER]
            job_i[j, K.JI_TIER] = send_tier
            job_i[j, K.JI_SIB] = call_i[c, K.CL_FIRST]
            call_i[c, K.CL_FIRST] = np.int64(j)
            call_i[c, K.CL_COPIES] += 1
            fleet_c[K.F_ATTEMPTS] += 1
            if send_hedge != 0:
                hedges = call_i[c, K.CL_HEDGES] + 1
                call_i[c, K.CL_HEDGES] = hedges
                fleet_c[K.F_HEDGES] += 1
                job_f[j, K.JF_DEMAND] = K.NO_DEMAND  # drawn at its start, if it starts
            else:
                hedges = call_i[c, K.CL_HEDGES]
                attempts = call_i[c, K.CL_ATTEMPTS] + 1
                call_i[c, K.CL_ATTEMPTS] = attempts
                if budgeted and attempts == 1:  # the budget's bucket; the helper only when
                    b = int(t / budget_width)  # the window moves on
                    if b > budget_bucket:
                        isv[K.IS_BUDGET_BUCKET] = budget_bucket
                        budget_slot(budget, isv, budget_width, t)
                        budget_bucket = isv[K.IS_BUDGET_BUCKET]
                    budget[0, b % K.BUDGET_BUCKETS] += 1
                # the first attempt serves the demand drawn at arrival; a retry draws its own
                job_f[j, K.JF_DEMAND] = call_f[c, K.CLF_DEMAND] if attempts == 1 else K.NO_DEMAND
            gen_j = job_i[j, K.JI_GEN] & K.GEN_MASK
            if deadlines:
                slot = to_h + to_n
                if slot >= tq_cap:
                    slot -= tq_cap
                tq_t[K.TQ_TIMEOUT, slot] = t + deadline
                tq_k[K.TQ_TIMEOUT, slot] = (gen_j << 32) | (np.int64(j) << K.EV_BITS) | K.EV_TIMEOUT
                to_n += 1
            if (hedge_mask >> send_tier) & 1 and hedges < max_hedges and n_elig > 1:
                slot = he_h + he_n
                if slot >= tq_cap:
                    slot -= tq_cap
                tq_t[K.TQ_HEDGE, slot] = t + hedge_delay
                tq_k[K.TQ_HEDGE, slot] = (((call_i[c, K.CL_GEN] & K.GEN_MASK) << 32)
                                          | (np.int64(c) << K.EV_BITS) | K.EV_HEDGE)
                he_n += 1
            job_i[j, K.JI_NODE] = np.int64(node)
            job_i[j, K.JI_DEGRADED] = 0
            job_f[j, K.JF_T_NODE] = t
            job_i[j, K.JI_NEXT] = -1
            tail = node_i[node, K.NI_QTAIL]
            job_i[j, K.JI_PREV] = tail
            if tail < 0 and node_i[node, K.NI_BUSY] < node_i[node, K.NI_SERVERS]:
                # no queue and a server idle: it starts below, never linked (its row then
                # holds what a link and a dequeue would leave); touched names the copy
                touched[n_touched] = ~np.int64(j)
            else:  # link it at the queue's tail (FIFO)
                job_i[j, K.JI_STATE] = K.J_QUEUED
                if tail >= 0:
                    job_i[np.uint64(tail), K.JI_NEXT] = np.int64(j)
                else:
                    node_i[node, K.NI_QHEAD] = np.int64(j)
                node_i[node, K.NI_QTAIL] = np.int64(j)
                node_i[node, K.NI_QLEN] += 1
                touched[n_touched] = np.int64(node)
            n_touched += 1

        # ---- start service where servers are free (a copy sent to an idle server with
        # no queue at once: a touched entry ~j); each start sets its completion.
        # Cost: a dequeue, busy-seconds, a copy's demand drawn if it has none
        for i in range(n_touched):
            entry = touched[i]
            direct = entry < 0
            j = np.uint64(~entry) if direct else K.U0
            node = np.uint64(job_i[j, K.JI_NODE]) if direct else np.uint64(entry)
            while True:
                if direct:
                    direct = False
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
                s = job_f[j, K.JF_DEMAND]
                if s < 0.0:  # a hedge's or a retry's: its own stream
                    if svc_kind == K.S_EXP:
                        s = exponential(rng, K.RNG_COPY_SERVICE, svc_a)
                    else:
                        s = draw_service(rng, K.RNG_COPY_SERVICE, svc_kind, svc_a, svc_b, svc_c)
                    job_f[j, K.JF_DEMAND] = s
                pend_t[n_pend] = t + s * node_f[node, K.NF_SLOWDOWN]
                pend_k[n_pend] = (((job_i[j, K.JI_GEN] & K.GEN_MASK) << 32)
                                  | (np.int64(j) << K.EV_BITS) | K.EV_DONE)
                n_pend += 1

        # ---- file the heap timers this event set, in the order set (sift up)
        for i in range(n_pend):
            tp = pend_t[i]
            hi = np.uint64(hn)
            hn += 1
            while hi > K.U0:
                parent = (hi - K.U1) >> K.U1
                if heap_t[parent] <= tp:
                    break
                heap_t[hi] = heap_t[parent]
                heap_k[hi] = heap_k[parent]
                hi = parent
            heap_t[hi] = tp
            heap_k[hi] = pend_k[i]

    if ONE_CALL:
        lean_users(call_i, call_f, call_free, call_free_n, usr_i, usr_f)
    isv[K.IS_HEAP_N] = hn
    isv[K.IS_JOB_FREE_N] = job_free_n
    isv[K.IS_USR_FREE_N] = usr_free_n
    isv[K.IS_CALL_FREE_N] = call_free_n
    isv[K.IS_NREC] = n_rec
    isv[K.IS_USER_SEQ] = user_seq
    isv[K.IS_IN_FLIGHT_USERS] = in_flight
    isv[K.IS_STAMP] = stamp
    isv[K.IS_BUDGET_BUCKET] = budget_bucket
    tq_n[K.TQ_TIMEOUT, 0], tq_n[K.TQ_TIMEOUT, 1] = to_h, to_n
    tq_n[K.TQ_HEDGE, 0], tq_n[K.TQ_HEDGE, 1] = he_h, he_n
    fs[K.FS_NOW] = now
    fs[K.FS_NEXT_ARRIVAL] = t_arr
    rng[K.RNG_ARRIVALS, 0], rng[K.RNG_ARRIVALS, 1] = a0, a1
    rng[K.RNG_ARRIVALS, 2], rng[K.RNG_ARRIVALS, 3] = a2, a3
    rng[K.RNG_SERVICE, 0], rng[K.RNG_SERVICE, 1] = v0, v1
    rng[K.RNG_SERVICE, 2], rng[K.RNG_SERVICE, 3] = v2, v3
    rng[K.RNG_ERRORS, 0], rng[K.RNG_ERRORS, 1] = e0, e1
    rng[K.RNG_ERRORS, 2], rng[K.RNG_ERRORS, 3] = e2, e3
    rng[K.RNG_ROUTING, 0], rng[K.RNG_ROUTING, 1] = r0, r1
    rng[K.RNG_ROUTING, 2], rng[K.RNG_ROUTING, 3] = r2, r3
    return status


def _compiled(py, one_call: bool):
    """``py`` compiled with :data:`ONE_CALL` set to ``one_call`` (a compile-time constant:
    numba prunes the branches it decides), cached under a name carrying it and a digest
    of the files it inlines (:mod:`relakit.sim.cachename`); ``noalias`` as the plain
    loops (the fleet checks its arrays are disjoint: ``Fleet._check_disjoint``; +2.6 %
    here, A/B)."""
    body = digest_named(py, "" if one_call else "fanout-", ONE_CALL=one_call)
    return njit(cache=True, error_model="numpy", noalias=True)(body)


advance_mitigated_fanout = _compiled(advance_mitigated, one_call=False)
advance_mitigated = _compiled(advance_mitigated, one_call=True)
