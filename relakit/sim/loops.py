"""Which specialisation of the one event loop (:func:`relakit.sim.kernel.advance`) a
stretch may run, chosen in O(nodes) from the controls and the counts the loop keeps, and
the compiled loop to call for it (docs/design.md, "The loops"):

* **plain** (``LEFTOVERS`` off: :func:`plain_ok`), and **simple** when besides one call
  goes to one node per request (``SIMPLE``: :func:`simple_ok`);
* **lean mitigated** (:data:`MECHANISMS`, ``ONE_CALL`` for fan-out 1: :func:`mitigated_ok`);
  a fault schedule that crashes nothing is applied in Python between two calls;
* **in-path** (some of ``kernel.IN_PATH_FEATURES`` and nothing else: :func:`in_path_ok`),
  settled or simple as the plain ones: a refused copy ends unserved (``ENDS_EARLY``);
* anything else: the general loop (``kernel.run``).

Same code, same arrays, same draws: any two hand over between any two calls
(``tests/test_specialisations.py``, bit for bit but the per-event :data:`SCRATCH` and the
rows lean loops leave unwritten). The plain and lean ones are those built ahead of time
(:mod:`relakit.sim.aot`) when on disk and not switched off (``RELAKIT_AOT=0``), else numba's.
"""

from __future__ import annotations

import numpy as np

from relakit.sim import aot
from relakit.sim import kernel as K

# State arrays that are one event's scratch (its sends, timers, touched nodes): no value
# in them outlives the event, and the specialisations fill them differently
SCRATCH = ("scratch", "send", "pend_t", "pend_k")
# the mechanisms of the lean mitigated loops (kernel.FEATURES)
MECHANISMS = K.LEAN_FEATURES
# the heap events a lean mitigated stretch may meet besides completions (fixed-delay hedges
# and attempt timeouts wait in the rings; the heap holds a hedge only when adaptive)
LEAN_EVENTS = (K.EV_RETRY,)
GENERAL_EVENTS = tuple(k for k in range(K.N_EVENT_KINDS) if k not in (K.EV_DONE, *LEAN_EVENTS))
# the mechanisms that leave rows only the general loop reads: degraded copies and requests
# admitted with a partial fan-out, probes' jobs (the rest is on the heap: a copy ending
# has its completion due at once, one moving its arrival, an adaptive hedge its timer)
GENERAL_ROWS = frozenset({"degraded", "probes"})


def _pending(st: K.State) -> bool:
    """Whether a timer waits in a ring, a failover is due or the heap holds an event but
    completions (O(nodes): the counts the loop keeps, ``kernel.IS_EVENTS``)."""
    isv = st.is_
    return (bool(st.tq_n[:, 1].any()) or bool(st.node_i[:, K.NI_FAILOVER].any())
            or any(isv[K.IS_EVENTS + k] for k in range(K.EV_DONE + 1, K.N_EVENT_KINDS)))


def leaves(cfg: K.Config, st: K.State, features: frozenset | None = None) -> tuple[bool, bool]:
    """(plain, lean): whether the next stretch may leave rows the plain loops (a hedge, a
    retry, a copy given up on...), or the lean mitigated ones (:data:`GENERAL_ROWS`),
    could not take: ``Fleet`` then marks its end (``kernel.IS_OLD``). ``features`` is
    ``kernel.features_of(cfg, st)`` (found when None). O(nodes): it reads the controls
    and the counts the loop keeps (``kernel.IS_EVENTS``), no row."""
    features = K.features_of(cfg, st) if features is None else features
    return bool(features) or _pending(st), bool(features & GENERAL_ROWS)


def plain_ok(cfg: K.Config, st: K.State, features: frozenset | None = None) -> bool:
    """True when the next call may run the plain specialisations: no mechanism is on or
    may act in the stretch (no timer in the rings or event on the heap but completions,
    no failover due: :func:`leaves`), no schedule change is due, and no row is live that
    was live when a mechanism last could act (``kernel.IS_OLD``). O(nodes)."""
    return (st.is_[K.IS_OLD] == 0 and st.fs[K.FS_NEXT_SCHED] == np.inf
            and not leaves(cfg, st, features)[0])


def in_path_ok(cfg: K.Config, st: K.State, features: frozenset,
               after_in_path: bool = False) -> bool:
    """True when the next call may run the in-path settled loop: some in-path mechanism
    is on and no other (``features``), and :func:`plain_ok` holds but for them: no timer
    in the rings or event on the heap but completions, no failover or schedule change
    due, and no row live from when another mechanism could act (``kernel.IS_OLD``; rows
    the last call left are allowed when that call was this loop, ``after_in_path``: it
    chose with none older, and leaves copies only it or the general loop may end)."""
    if not features or not features <= K.IN_PATH_FEATURES:
        return False
    return ((st.is_[K.IS_OLD] == 0 or after_in_path) and st.fs[K.FS_NEXT_SCHED] == np.inf
            and not _pending(st))


def run_in_path(cfg: K.Config, st: K.State, out: K.Output, t_end: float) -> int:
    """The in-path mechanisms on (:func:`in_path_ok`), as :func:`run_plain` runs the plain
    ones; numba's (not built ahead of time: docs/design.md)."""
    return _simple_or_settled(in_path_loops(K.features_of(cfg, st)), cfg, st, out, t_end)


def _simple_or_settled(loops, cfg: K.Config, st: K.State, out: K.Output, t_end: float) -> int:
    """The simple loop when the stretch is simple (:func:`simple_ok`) and its live rows are
    lean (else it returns ``kernel.ROWS_NOT_LEAN`` having done nothing), else the settled one,
    called as ``kernel.run`` is."""
    simple, settled = loops
    if simple_ok(cfg, st):
        status = simple(*cfg, *st, *out, t_end)
        if status != K.ROWS_NOT_LEAN:
            return status
    return settled(*cfg, *st, *out, t_end)


def in_path_loops(features: frozenset):
    """(simple loop, settled loop) on ``features`` (some of ``kernel.IN_PATH_FEATURES``)."""
    return K.specialised(features, simple=True), K.specialised(features, settled=True)


def simple_ok(cfg: K.Config, st: K.State) -> bool:
    """True when a plain stretch is also *simple* (``kernel.SIMPLE``): one call per
    request, an exponential demand, a constant arrival rate, no retry budget, one node or
    random routing over equally weighted routable nodes (so each request goes to exactly
    one: the simple loop takes that as a constant). The loop checks the live requests'
    rows itself (``kernel.lean_rows``)."""
    ci, ni, weights = cfg.cfg_i, st.node_i, st.node_f[:, K.NF_WEIGHT]
    if (ci[K.CI_FANOUT] != 1 or ci[K.CI_SVC_KIND] != K.S_EXP or ci[K.CI_CONST_RATE] == 0
            or cfg.cfg_f[K.CF_BUDGET_RATIO] < np.inf  # (a retry budget counts first attempts)
            or not ni[:, K.NI_ROUTABLE].all() or weights[0] <= 0.0):
        return False
    return ni.shape[0] == 1 or (ci[K.CI_ROUTING] == K.R_RANDOM and (weights == weights[0]).all())


def mitigated_allowed(cfg: K.Config, st: K.State, features: frozenset | None = None) -> bool:
    """The mechanisms on (``features``) are some of :data:`MECHANISMS` (hedging with a
    fixed delay; errors from node rates, not from load or dependencies), no failover is
    due and some node is eligible. O(nodes); false stays false until Python changes a
    flag, a control or a fault (``Fleet`` chooses again then)."""
    if not (K.features_of(cfg, st) if features is None else features) <= MECHANISMS:
        return False
    ni, nf = st.node_i, st.node_f
    return not (cfg.cfg_f[K.CF_HEDGE_Q] != 0.0 or cfg.load_x.shape[0] > 0
                or (cfg.dep_node >= 0).any() or ni[:, K.NI_FAILOVER].any()
                or not ((ni[:, K.NI_ROUTABLE] != 0) & (nf[:, K.NF_WEIGHT] > 0.0)).any())


def mitigated_ok(cfg: K.Config, st: K.State, features: frozenset | None = None,
                 rows: bool = True) -> bool:
    """True when the next call may run the lean mitigated loops: :func:`mitigated_allowed`,
    no event on the heap but completions and retries, and no row live that was live when
    a mechanism last could leave it one only the general loop reads (a degraded copy or
    request, a probe: ``kernel.IS_OLD_GENERAL``). True for a plain stretch too: ``Fleet``
    asks ``plain_ok`` first. O(nodes). ``rows=False``: whatever rows are live."""
    isv = st.is_
    return ((isv[K.IS_OLD_GENERAL] == 0 or not rows) and mitigated_allowed(cfg, st, features)
            and not any(isv[K.IS_EVENTS + k] for k in GENERAL_EVENTS))


def run_plain(cfg: K.Config, st: K.State, out: K.Output, t_end: float) -> int:
    """The simple specialisation, else the plain one (:func:`_simple_or_settled`)."""
    return _simple_or_settled(plain_loops(), cfg, st, out, t_end)


def run_mitigated(cfg: K.Config, st: K.State, out: K.Output, t_end: float) -> int:
    """The one-call lean loop (or, for requests of several calls, the fan-out one),
    called as ``kernel.run`` is."""
    one_call, fanout = mitigated_loops()
    return (one_call if cfg.cfg_i[K.CI_FANOUT] == 1 else fanout)(*cfg, *st, *out, t_end)


def plain_loops():
    """(simple loop, plain loop): the ahead-of-time build's or numba's."""
    built = aot.load()
    if built is not None:
        return built.advance_plain_simple, built.advance_plain
    return (K.specialised(frozenset(), simple=True),
            K.specialised(frozenset(), settled=True))


def mitigated_loops():
    """(one-call loop, fan-out loop): the ahead-of-time build's or numba's."""
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
