"""Bounds on issue 17's two unmet targets: how fast could any loop on today's design be?

Run with ``python benchmarks/bench_bounds.py [--rounds N]`` (about 3 minutes). Not part
of ``make bench``: each figure compiles a loop variant from nothing. A benchmark, not a
test: nothing here asserts a speed.

Both experiments run variants of ``relakit.sim.plain.advance_plain`` made by text edits
on its source. The variants measure *cost*, not semantics: their outputs are not
relakit's. If the loop's source has moved on, an edit no longer applies and the script
stops, naming the fragment it looked for.

1. **The mitigated slowdown (target <= 1.5).** The best a loop for the common
   mitigation set could do on today's state layout (a user, a call and a job row per
   request, generations, timers in rings): the plain loop, which keeps those rows, with
   stand-ins for the per-request work of the mitigations the general kernel measures
   (``bench_kernel.mitigated``): an attempt-timeout and a hedge timer per copy pushed
   onto the two rings and dropped at the loop head once stale, an error draw per
   completion, a retry-budget count per first attempt. No hedge copy is sent, no retry
   or timeout happens, no sibling is settled: a real loop does more. The bound is the
   simple loop's rate (what ``make bench`` divides by) over this one's, on the 50-node
   fleet, same process.
2. **The cold start (target <= 5 s).** In fresh processes with an empty numba cache:
   the imports and numba's first compile (a one-line function), then the simple loop
   compiled and run on a 1 s M/M/8 scenario as it is, and again with its helpers' calls
   cut (``lean_rows``, ``prepare_routing``, the two samplers, ``next_node_sample``).
   The bound is imports plus the loop without helpers: what numba needs for the loop's
   own ~250 lines, whatever the helpers cost.
3. **Where the lean mitigated loop's time goes** (``relakit.sim.mitigated``, built in
   the tenth session). Its slowdown split in two: its *structure* (the fleet without
   mitigations run through it, plain stretches refused to the plain loop, against the
   simple loop) and the *mechanisms* (the mitigated fleet against that). Also the
   mitigated fleet with a hedge delay no request reaches (timers pushed and dropped,
   no hedge sent), and the plain fleet through the plain loop that is not simple. No
   variant: the loops as they are, same process.
"""

from __future__ import annotations

import argparse
import inspect
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def edited(src: str, edits) -> str:
    """``src`` with each (old, new) applied; each old must occur exactly once."""
    for old, new in edits:
        if src.count(old) != 1:
            raise SystemExit(f"bench_bounds: advance_plain's source no longer holds exactly one "
                             f"{old.strip().splitlines()[0]!r}; update the edit")
        src = src.replace(old, new)
    return src


# ---- 1. the mitigated slowdown ---------------------------------------------------------
MECHANISMS = [  # stand-ins for the per-request work of the common mitigation set
    ("tq_t, tq_n, touched", "tq_t, tq_k, tq_n, touched"),
    ("    status = K.DONE\n", """    status = K.DONE
    to_h, to_n = tq_n[0, 0], tq_n[0, 1]
    he_h, he_n = tq_n[1, 0], tq_n[1, 1]
    e0, e1, e2 = rng[K.RNG_ERRORS, 0], rng[K.RNG_ERRORS, 1], rng[K.RNG_ERRORS, 2]
    e3 = rng[K.RNG_ERRORS, 3]
    n_err = 0
"""),
    ("""        t_heap = heap_t[0] if heap_n > 0 else np.inf
        t = min(t_arr, t_heap)
""", """        while to_n > 0:  # the rings' stale heads dropped, as the general kernel does
            key = tq_k[0, to_h]
            jk = (key >> 3) & K.ID_MASK
            if ((job_i[jk, K.JI_GEN] & K.GEN_MASK) == key >> 32
                    and job_i[jk, K.JI_CLIENT] == K.C_WAITING and tq_t[0, to_h] > now):
                break
            to_h += 1
            if to_h == tq_cap:
                to_h = 0
            to_n -= 1
        while he_n > 0:
            key = tq_k[1, he_h]
            if ((call_i[(key >> 3) & K.ID_MASK, K.CL_GEN] & K.GEN_MASK) == key >> 32
                    and tq_t[1, he_h] > now):
                break
            he_h += 1
            if he_h == tq_cap:
                he_h = 0
            he_n -= 1
        t_heap = heap_t[0] if heap_n > 0 else np.inf  # (a live head falls due unfired:
        t = min(t_arr, t_heap)  # the next pass drops it)
"""),
    ("""            j = np.uint64((key >> 3) & K.ID_MASK)  # (rows unsigned: see the docstring)
""", """            j = np.uint64((key >> 3) & K.ID_MASK)  # (rows unsigned: see the docstring)
            x, e0, e1, e2, e3 = uniform_words(e0, e1, e2, e3)  # an error draw
            if x < 0.01:
                n_err += 1
"""),
    ("""            fleet_c[K.F_ATTEMPTS] += 1
""", """            fleet_c[K.F_ATTEMPTS] += 1
            slot = to_h + to_n  # an attempt timeout (100 ms) and a hedge timer (50 ms)
            if slot >= tq_cap:
                slot -= tq_cap
            tq_t[0, slot] = t + 0.1
            tq_k[0, slot] = ((job_i[j, K.JI_GEN] & K.GEN_MASK) << 32) | (np.int64(j) << 3) | 1
            to_n += 1
            slot = he_h + he_n
            if slot >= tq_cap:
                slot -= tq_cap
            tq_t[1, slot] = t + 0.05
            tq_k[1, slot] = ((call_i[c, K.CL_GEN] & K.GEN_MASK) << 32) | (np.int64(c) << 3) | 2
            he_n += 1
            bb = int(t / budget_width)  # the retry budget's count of first attempts
            budget[0, bb % K.BUDGET_BUCKETS] += 1
"""),
    ("or heap_cap - heap_n < heap_room or rings_short)",
     "or heap_cap - heap_n < heap_room or tq_cap - to_n < room or tq_cap - he_n < room)"),
    ("    isv[K.IS_HEAP_N] = heap_n\n", """    isv[K.IS_HEAP_N] = heap_n
    tq_n[0, 0], tq_n[0, 1] = to_h, 0  # (the rings left empty for the next run)
    tq_n[1, 0], tq_n[1, 1] = he_h, 0
    fleet_c[K.F_RETRIES_DENIED] += n_err
"""),
]


def lean_loop_bound(rounds: int, requests: float) -> dict:
    import bench_kernel as b

    import relakit
    from relakit.jit import materialize, njit
    from relakit.sim import plain as P
    from relakit.sim.cachename import digest_named

    materialize()
    src = textwrap.dedent(inspect.getsource(P.advance_plain.py_func))
    ns = dict(P.advance_plain.py_func.__globals__)
    exec(compile(edited(src, MECHANISMS), "<bench_bounds>", "exec"), ns)
    stand_in = njit(cache=False, error_model="numpy", noalias=True)(
        digest_named(ns["advance_plain"], "bound-", SIMPLE=False))
    state_args = P.STATE_ARGS
    with_tq_k = tuple(x for s in state_args for x in ((s, "tq_k") if s == "tq_t" else (s,)))
    loops = {"simple": None, "plain": (P.advance_plain, state_args),
             "plain + mitigations' work": (stand_in, with_tq_k)}

    def rate(name: str, n: float) -> float:
        saved = P.loops, P.simple_ok, P.STATE_ARGS
        if loops[name] is not None:  # the plain loop (or its variant) for every stretch
            loop, P.STATE_ARGS = loops[name]
            P.loops = lambda: (loop, loop)
            P.simple_ok = lambda cfg, st: False
        try:
            t = time.process_time()
            r = relakit.simulate(b.mm8(50, n), record_requests=False)
            return r.info["user_requests"] / (time.process_time() - t) / 1e6
        finally:
            P.loops, P.simple_ok, P.STATE_ARGS = saved

    for name in loops:  # compile
        rate(name, 1e5)
    got = {name: [] for name in loops}
    for _ in range(rounds):
        for name in loops:
            got[name].append(rate(name, requests))
    return {name: statistics.median(v) for name, v in got.items()}


# ---- 2. the cold start ---------------------------------------------------------------
NO_HELPERS = [  # the simple loop's helper calls cut
    ("    if SIMPLE and not lean_rows(job_i, job_f, call_i, call_f, usr_i, usr_f, False):",
     "    if SIMPLE and job_i.shape[0] < 0:"),
    ("    prepare_routing(node_i, node_f, isv, fs)\n", ""),
    ("    n_elig = isv[K.IS_N_ELIGIBLE]\n", "    n_elig = n_nodes\n"),
    ("""                        sample_node(metrics, sample_t, cnt, node_i, node_f, node_c, lat_b,
                                    isv, phase, sample_dt, i, t_node)""",
     "                        pass"),
    ("                next_node_sample(node_f, fs)\n",
     "                fs[K.FS_NEXT_NODE_SAMPLE] = np.inf\n"),
    ("                sample_fleet(fleet, fleet_t, fleet_c, isv, fs, hist, sample_dt, hedge_q, "
     "now)\n",
     "                fs[K.FS_NEXT_SAMPLE] = np.inf\n"),
    ("        lean_rows(job_i, job_f, call_i, call_f, usr_i, usr_f, True)  # (written back)",
     "        pass"),
]

COLD = {'duration_s': 1, 'workload': {'arrival': {'kind': 'poisson', 'rate_rps': 700}},
        'fleet': {'servers': 8, 'service': {'kind': 'exponential', 'mean_ms': 10}}}


def cold_child(variant: str) -> None:
    """In a fresh process: imports (numpy's included: nothing above imports it) and numba's
    first compile, then the simple loop (as it is, or without its helpers) compiled and
    run; prints both times (wall seconds)."""
    t0 = time.perf_counter()
    import numba

    import relakit
    from relakit.jit import materialize, njit
    from relakit.sim import plain as P
    from relakit.sim.cachename import digest_named

    materialize()
    numba.njit(lambda x: x + 1)(1)
    t1 = time.perf_counter()
    src = textwrap.dedent(inspect.getsource(P.advance_plain.py_func))
    if variant == "no-helpers":
        src = edited(src, NO_HELPERS)
    ns = dict(P.advance_plain.py_func.__globals__)
    exec(compile(src, "<bench_bounds>", "exec"), ns)
    loop = njit(cache=False, error_model="numpy", noalias=True)(
        digest_named(ns["advance_plain"], "bound-", SIMPLE=True))
    # the variant for both slots: were it to decline the stretch (ROWS_NOT_LEAN), the run
    # fails loudly instead of compiling the plain loop too and timing both
    P.loops = lambda: (loop, loop)
    relakit.simulate(COLD)
    print(t1 - t0, time.perf_counter() - t1)


def cold_start_bound(rounds: int) -> dict:
    got = {"imports": [], "loop": [], "loop without helpers": []}
    for _ in range(rounds):
        for variant, name in (("as-is", "loop"), ("no-helpers", "loop without helpers")):
            with tempfile.TemporaryDirectory() as cache:
                env = dict(os.environ, NUMBA_CACHE_DIR=cache, RELAKIT_AOT="0")
                out = subprocess.run([sys.executable, __file__, "--child", variant], env=env,
                                     check=True, capture_output=True, text=True, cwd=ROOT)
            imports, loop = map(float, out.stdout.split()[-2:])
            got["imports"].append(imports)
            got[name].append(loop)
    return {name: statistics.median(v) for name, v in got.items()}


# ---- 3. where the mitigated loop's time goes ---------------------------------------------
def mitigated_split(rounds: int, requests: float) -> dict:
    import copy

    import bench_kernel as b

    import relakit
    from relakit.sim import fleet as F
    from relakit.sim import plain as P

    never = copy.deepcopy(b.mitigated(50, requests))
    never["mitigations"]["hedge"]["delay_ms"] = 1e6  # pushed and dropped, never sent
    runs = {  # name: (scenario, the loop plain stretches get: simple, plain or mitigated)
        "plain fleet, simple loop": (b.mm8(50, requests), "simple"),
        "plain fleet, plain loop": (b.mm8(50, requests), "plain"),
        "plain fleet, mitigated loop": (b.mm8(50, requests), "mitigated"),
        "mitigated fleet, mitigated loop": (b.mitigated(50, requests), "simple"),
        "mitigated fleet, no hedge reaches its delay": (never, "simple"),
    }

    def rate(sc: dict, loop: str) -> float:
        saved = F.plain_ok, P.simple_ok, F.Fleet._kernel
        used = set()  # the kernels Fleet picked: this figure is the loop's, or none

        def counted(fleet, t_s):
            picked = saved[2](fleet, t_s)
            used.add({F.run_plain: "plain", F.run_mitigated: "mitigated"}.get(picked[0],
                                                                            "general"))
            return picked

        F.Fleet._kernel = counted
        if loop != "simple":
            P.simple_ok = lambda cfg, st: False
        if loop == "mitigated":  # Fleet then asks mitigated_ok, which takes plain stretches
            F.plain_ok = lambda cfg, st: False
        try:
            t = time.process_time()
            r = relakit.simulate(sc, record_requests=False)
            dt = time.process_time() - t
        finally:
            F.plain_ok, P.simple_ok, F.Fleet._kernel = saved
        want = "mitigated" if loop == "mitigated" or "mitigations" in sc else "plain"
        if used != {want}:
            raise SystemExit(f"bench_bounds: {sc['name']} ({loop} loop) ran {sorted(used)}, "
                             f"not {want} alone; update mitigated_split")
        return r.info["user_requests"] / dt / 1e6

    for sc, loop in runs.values():  # compile, or load from the cache
        rate({**sc, "duration_s": 0.5}, loop)
    got = {name: [] for name in runs}
    for _ in range(rounds):
        for name, (sc, loop) in runs.items():
            got[name].append(rate(sc, loop))
    return {name: statistics.median(v) for name, v in got.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=float, default=3e6)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rounds < 1 or args.requests < 1e4:
        ap.error(f"--rounds must be at least 1 (got {args.rounds}) and --requests at least "
                 f"1e4 (got {args.requests:g})")
    if args.child:
        cold_child(args.child)
        return
    print(f"load average {os.getloadavg()[0]:.2f}; medians of {args.rounds} rounds")
    r = lean_loop_bound(args.rounds, args.requests)
    for name, v in r.items():
        print(f"  50 nodes, {name}: {v:.2f} M requests per CPU s")
    bound = r["simple"] / r["plain + mitigations' work"]
    print(f"  best mitigated slowdown on today's state layout >= {bound:.2f} (target <= 1.5)")
    m = mitigated_split(args.rounds, args.requests)
    for name, v in m.items():
        print(f"  {name}: {v:.2f} M requests per CPU s")
    simple, floor = m["plain fleet, simple loop"], m["plain fleet, mitigated loop"]
    full = m["mitigated fleet, mitigated loop"]
    print(f"  mitigated slowdown {simple / full:.2f} = structure {simple / floor:.2f} "
          f"x mechanisms {floor / full:.2f} (target <= 1.5)")
    c = cold_start_bound(args.rounds)
    for name, v in c.items():
        print(f"  cold start, {name}: {v:.2f} s")
    print(f"  cold start with helpers free >= {c['imports'] + c['loop without helpers']:.2f} s "
          f"(as is: {c['imports'] + c['loop']:.2f} s; target <= 5)")


if __name__ == "__main__":
    main()
