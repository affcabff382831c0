"""The lean mitigated specialisations of the event loop: hedging, deadlines, retries
and node errors.

The mitigations users study most (hedging after a fixed delay, per-attempt deadlines,
retries with backoff and a retry budget, node error and wrong-answer rates) run in
:func:`relakit.sim.kernel.advance` compiled with those four mechanisms on and no other
(``kernel.specialised(kernel.LEAN_FEATURES, lean=True)``: ``noalias``, as the plain
ones), and for requests of one call, the common case, with ``kernel.ONE_CALL`` too: the
fan-out's loops fold away and the user row is left to the call's while the request
lives (``kernel.LEAN_USER``, written back by ``kernel.lean_users`` at return). They are
the same code as every other specialisation, so any two hand over between any two calls;
``tests/test_kernel_mitigated.py`` runs scenarios through them and through the general
loop and asserts every array equal, bit for bit (but the per-event scratch ones,
``plain.SCRATCH``, and the user rows the one-call loop leaves unwritten for requests
that ended in it).

:func:`mitigated_ok` says when they apply; :func:`relakit.sim.fleet.Fleet.advance`
asks it after ``plain.plain_ok``. A fault schedule that crashes nothing (error,
wrong-answer and slowdown rows) is allowed: ``Fleet.advance`` runs the loop to just
before a change, applies the change in Python (``kernel.schedule_step``) and goes on.
"""

from __future__ import annotations

import numpy as np

from relakit.sim import aot
from relakit.sim import kernel as K

# the mechanisms these loops run (kernel.FEATURES); a stretch with none of them is the
# plain loop's, one with any other the general loop's
MECHANISMS = K.LEAN_FEATURES
# the timed events it may find on the heap: completions and retries (fixed-delay hedges
# and attempt timeouts wait in the rings; the heap holds a hedge only when adaptive)
HEAP_EVENTS = (K.EV_DONE, K.EV_RETRY)


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


def run_mitigated(cfg: K.Config, st: K.State, out: K.Output, t_end: float) -> int:
    """:func:`advance_mitigated` (or, for requests of several calls,
    :func:`advance_mitigated_fanout`) called as the general kernel is:
    ``(cfg, st, out, t_end)``."""
    one_call, fanout = loops()
    return (one_call if cfg.cfg_i[K.CI_FANOUT] == 1 else fanout)(*cfg, *st, *out, t_end)


def loops():
    """(one-call loop, fan-out loop) to call: the ones compiled ahead of time for these
    sources (:mod:`relakit.sim.aot`, built by ``make setup``) when on disk and not
    switched off (``RELAKIT_AOT=0``), which spares a process numba altogether; else
    numba's."""
    built = aot.load()
    if built is None:
        return advance_mitigated(), advance_mitigated_fanout()
    return built.advance_mitigated, built.advance_mitigated_fanout


def advance_mitigated():
    """The one-call lean specialisation, numba's (compiled or loaded on first use)."""
    return K.specialised(MECHANISMS, one_call=True)


def advance_mitigated_fanout():
    """The lean specialisation for requests of several calls, numba's."""
    return K.specialised(MECHANISMS, lean=True)
