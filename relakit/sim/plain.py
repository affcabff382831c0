"""Plain stretches: when the event loop may run its leanest specialisations.

Most runs (every closed-form check, every sweep of routing, fan-out, tiers or
load, and a policy run between its interventions) switch on no mitigation: no
hedging, retries, deadlines, errors, intake limits, breaker, degraded mode or
probes. For them the one event loop, :func:`relakit.sim.kernel.advance`, runs
compiled with every mechanism off and with nothing a mechanism left pending
(``kernel.specialised(frozenset(), settled=True)``: the constant ``LEFTOVERS``
False), and for a *simple* stretch (:func:`simple_ok`) with ``SIMPLE`` True too
(one node per request, the request's call and user rows written only at return).
Both are the same code as every other specialisation: numba prunes the branches
the constants decide. They read and write the same state and output arrays and
draw the same numbers from the same streams, so any two specialisations hand over
between any two calls (``tests/test_kernel_specialised.py`` asserts every array
equal to the general loop's, bit for bit, but the per-event scratch ones,
``SCRATCH``, and, after the simple loop, the free rows of the call and user pools:
``kernel.LEAN_CALL``).

What the plain specialisations buy over the general loop is measured in
docs/performance.md (rows indexed unsigned, completions pushed
straight onto the heap, noalias, the lean rows, the direct start).

:func:`plain_ok` says when they apply: the model and the flags use no
mechanism (``kernel.features_of`` is empty), and nothing a mechanism left
behind is pending (timers in the rings, heap events other than completions, a
failover to do, a live copy that is a hedge, a retry, degraded, ending or
moving, or given up on by its client).
"""

from __future__ import annotations

import numpy as np

from relakit.sim import aot
from relakit.sim import kernel as K

# State arrays that are one event's scratch (its sends, timers, touched nodes): no value
# in them outlives the event, and the specialisations fill them differently
SCRATCH = ("scratch", "send", "pend_t", "pend_k")
# the event kinds a plain stretch may hold pending: completions only (kernel.EV_*)
PLAIN_EVENTS = (K.EV_DONE,)  # (plain_ok compares with each)
# a live copy's states in a plain stretch: waiting in a queue or in service
PLAIN_JOB_STATES = (K.J_QUEUED, K.J_SERVING)


def plain_ok(cfg: K.Config, st: K.State) -> bool:
    """True when the next call may run the plain specialisations instead of the general
    loop: no mechanism is on, and none left work pending (see the module docstring).
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


def simple_ok(cfg: K.Config, st: K.State) -> bool:
    """True when the stretch is also *simple* (``kernel.SIMPLE``): one call per request, an
    exponential demand, a constant arrival rate, no retry budget, one node or random
    routing over equally weighted routable nodes (what ``prepare_routing`` will find).
    So every node is eligible and each request goes to exactly one: the simple loop
    takes that as a constant (and checks it on entry). It checks the live requests'
    rows itself (``kernel.lean_rows``)."""
    ci, ni, weights = cfg.cfg_i, st.node_i, st.node_f[:, K.NF_WEIGHT]
    if (ci[K.CI_FANOUT] != 1 or ci[K.CI_SVC_KIND] != K.S_EXP or ci[K.CI_CONST_RATE] == 0
            or cfg.cfg_f[K.CF_BUDGET_RATIO] < np.inf  # (a retry budget counts first attempts)
            or not ni[:, K.NI_ROUTABLE].all() or weights[0] <= 0.0):
        return False
    return ni.shape[0] == 1 or (ci[K.CI_ROUTING] == K.R_RANDOM and (weights == weights[0]).all())


def run_plain(cfg: K.Config, st: K.State, out: K.Output, t_end: float) -> int:
    """The simple specialisation (:func:`simple_ok`, unless it finds live rows it would
    misread: ``kernel.ROWS_NOT_LEAN``), else the plain one, called as ``kernel.run`` is:
    ``(cfg, st, out, t_end)``."""
    simple, settled = loops()
    if simple_ok(cfg, st):
        status = simple(*cfg, *st, *out, t_end)
        if status != K.ROWS_NOT_LEAN:
            return status
    return settled(*cfg, *st, *out, t_end)


def loops():
    """(simple loop, plain loop) to call: the ones compiled ahead of time for these
    sources (:mod:`relakit.sim.aot`, built by ``make setup``) when on disk and not
    switched off (``RELAKIT_AOT=0``), which spares a process numba altogether; else
    numba's (``kernel.specialised``)."""
    built = aot.load()
    if built is not None:
        return built.advance_plain_simple, built.advance_plain
    return (K.specialised(frozenset(), simple=True),
            K.specialised(frozenset(), settled=True))
