"""A CTMC of one node with client timeouts and retries: the long horizons simulation cannot reach.

A metastable retry storm can last 10^9 s or more; no simulation waits that long, but a
Markov chain over (jobs at the node, retries pending) gives the stationary share of time
spent congested, expected first-passage times and the relaxation time by sparse linear
algebra in seconds (:func:`retry_ctmc`).

**Semantics (relakit's data plane, ``on_timeout="abandon"``).** One node, ``servers``
exponential servers at ``service_rate`` each, FCFS, ``queue_limit`` waiting places (so at
most ``K = servers + queue_limit`` jobs). Requests arrive as a Poisson stream. An attempt
that finds ``K`` jobs is dropped and *not* retried: its request ends (``retry_on:
[timeout]``, the worked example's; relakit's default ``[error, timeout]`` would retry it,
which the chain does not model). The client's deadline runs per attempt from when it is
sent; when it passes, the client gives up on the attempt but **the server goes on working
on it** (the job stays in the queue and is served: wasted work), and, if the request has
attempts left (``max_attempts`` counts all attempts: "4 retries" is ``max_attempts=5``), a
retry is sent after the backoff. This is what ``relakit/sim/kernel.py`` does (EV_TIMEOUT
marks the job timed out and leaves it queued; the retry timer is ``min(backoff *
2^(a-1), max)``, uniform in [0, that] with jitter).

**Why the state is only (n, r).** Because abandoned jobs stay and the queue is FCFS with
exponential service, whether an attempt times out is decided when it arrives: its sojourn is
the service of the jobs ahead of it plus its own, whatever arrives later. So each attempt is
"doomed" with probability ``P(S_n > T)`` for the ``n`` jobs it finds, where ``T`` is the
timeout as an Erlang clock of ``phases`` stages (mean ``timeout_s``; deterministic as
``phases`` grows, the convergence measured in docs/performance.md). A doomed attempt that
may retry puts a token into the pool of pending retries at once; the token comes back as a
retry after an exponential delay of mean ``timeout_s`` + the mean backoff (the one
approximation of timing: the real delay is that constant). The pool is truncated at
``retry_limit``: a token that would exceed it is lost, and the stationary mass on the
boundary is reported (and warned about when not negligible).

**Attempts left.** The attempt number of a retry is not in the state: a doomed retry is
allowed another attempt with the share of a request's accepted, doomed retries that are
not its last, as if each of its attempts had gone on to the next with probability
``x = a p`` (:func:`_retry_allowed`): ``p`` the current doom probability, ``a`` the
probability that a retry is accepted, not dropped by a full queue. A dropped attempt ends
its request, so at a full node the pool holds mostly early retries: with ``a`` left out
(``a = 1``) the chain undercounts the retries of a collapse and its mean jobs fell 0.11
short of the simulation's at any phases (docs/performance.md, "Metastability"). ``a`` is
the stationary chain's own, a fixed point (:func:`retry_ctmc`, a few stationary solves):
right for the regime the stationary mass sits in (Metafor's node: ``a`` = 0.5228, the
value ``lambda (a + ... + a^5) = mu`` gives a full node); in a transient through states the
stationary mass does not visit (a build-up from empty, where nothing is dropped and
``a = 1``) it is an approximation, measured there (first passage moved by <= 1.3 %). In a
full collapse (``p = 1``) it gives each request its attempts up to the first dropped one
and at most ``max_attempts``, as the simulation does.

**The doom coin, and the workload model (``model="workload"``, one server).** The
count model decides each attempt's fate by a coin of probability ``P(S_n > T)``,
independent of the services that then drain the queue; consecutive attempts really share
those services, so their fates are strongly correlated. At a timeout near the full
queue's work (10 s against 101 jobs at 10/s) the coin keeps a full node full ~10^5 s where
the node drains in minutes (docs/performance.md, "Metastability"). The workload model
carries the node's work instead of its count: ``phases`` levels per mean service time
(level rate ``phases * service_rate``), a job's exponential service a Geometric number of
levels (mean ``phases``, so its time is exactly exponential), the deadline
``round(timeout_s * service_rate * phases)`` levels. An attempt that finds ``w`` levels
and brings ``S`` is doomed iff ``w + S`` passes the deadline: decided by the work ahead
of it, which then drains level by level, with no coin. With ``phases=1`` (the default) a
level is a job, so the count is exact (the queue limit too) and the deadline counts
service completions: an attempt is doomed iff it finds at least ``mu * T`` jobs. Finer
levels sharpen the work but lose the count: the queue limit and the job count are then
read off the work (``w`` levels hold 1 + Binomial(w - 1, 1/phases) jobs; a state's
``jobs`` is E[min(jobs, capacity) | w] and an attempt is dropped with P(jobs >= capacity
| w)), a soft limit whose bias grows with ``phases`` (measured in docs/performance.md;
``model="jobs_work"`` keeps the count). Retries return as in the count model
(exponential delay, attempt share).

**The jobs-and-work model (``model="jobs_work"``, one server).** Keeps the count beside
the work: states (jobs ``n``, work ``w`` in levels, retries ``r``). Levels and deadline
as in the workload model; an attempt is dropped iff ``n`` = capacity (a hard limit,
exact), else it adds ``S`` levels and is doomed iff ``w + S`` passes the deadline. On a
level completion the count falls with probability ``(n - 1)/(w - 1)`` (1 when ``w`` =
1): under the product-geometric law the ``n`` job ends are the last level and ``n - 1``
positions uniform among the first ``w - 1`` (P(s_1..s_n) ~ p^n (1 - p)^(w - n) is
uniform over compositions). Exact in the work, so in every attempt's fate; an
approximation in the count (the history reveals sizes), exact with no deadline (the
count is then M/M/1/K at any ``phases``, tested). ``phases=1`` is the workload model
exactly. The Geometric jump is taken level by level through instantaneous states
(``(n, w, r, kind)``, kind 1 when a doomed end puts a retry token back; their rows are
probabilities minus the identity), ~4 entries a row where the jump itself needs ~27
``phases`` per kind of attempt; ``w`` is cut per ``n`` at n + NegBin(n, 1/phases)'s 1 -
1e-12 quantile (the stationary mass on the cut is ``params["window_mass"]``). Three times
the tangible states, 3-D structured: a sparse LU fills in past reach (no answer in 300 s
on 459k states), so past 60,000 states each solve is GMRES with an incomplete-LU
preconditioner (:func:`_sparse_solve`: relative residual 1e-10 for hitting times; 1e-6
accepted for the stationary solve, whose pinned system spans the collapse's mass and the
empty node's and stalls near 1e-7). The stationary solve costs the most (~400 s CPU at 2
phases on the shrunk node against 6 s for a first passage), so with ``retry_acceptance``
given it is done when first asked. No spectral gap (the matrix is not a generator).
Measured in docs/performance.md ("The jobs-and-work model"): the first passage falls with
phases by shrinking steps, inside the simulation's interval on the worked and the shrunk
node; the exponential retry delay is what is left (the ablation's exact-doom,
exponential-delay node is 0.8 s early on the shrunk node, 109.0 against 109.6 s worked).

``on_timeout="keep_listening"`` (the kernel has it: a late answer still answers the
request, and the copies still queued for it are withdrawn) is not expressible in (n, r)
and is refused by name. With one FCFS server an attempt's retries queue behind it, so its
late answer always comes first and withdraws them: a retry then costs a queue place but
never service, and the jobs an attempt finds are no longer the work ahead of it (some of
them will be withdrawn before they start). Its sojourn, and so its fate, depends on how
many retries each request ahead has queued: a state per request, not a count.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field

import numpy as np

from ._validate import as_int, as_nonnegative, as_positive, as_probability

__all__ = ["RetryCTMC", "RetryCTMCWarning", "doom_probability", "retry_ctmc", "retry_generator"]

ON_TIMEOUT = ("abandon",)
MODELS = ("count", "workload", "jobs_work")
DEFAULT_PHASES = {"count": 16, "workload": 1, "jobs_work": 1}
WINDOW_TAIL = 1e-12  # jobs_work: levels past n + NegBin(n, q)'s quantile 1 - this are lumped
SOLVE_RTOL = 1e-10  # jobs_work: GMRES relative residual of each sparse solve
STATIONARY_TOL = 1e-6  # jobs_work: the stationary solve's accepted relative residual (its
# pinned system spans the collapse's mass and the empty node's ~1e-20: GMRES stalls ~1e-7)
DIRECT_MAX = 60_000  # jobs_work: states up to which a sparse LU is cheaper than ILU-GMRES
BOUNDARY_WARN = 1e-6  # stationary mass on the truncation boundary worth a warning
ACCEPT_TOL = 1e-3  # the retries' acceptance fixed point: |g(a) - a| below this
ACCEPT_ITER = 12  # solves before giving up on it


class RetryCTMCWarning(UserWarning):
    """The truncation of pending retries holds more than a negligible stationary mass."""


def doom_probability(jobs_found, servers: int, service_rate: float, timeout_s: float,
                     phases: int) -> np.ndarray:
    """P(an attempt that finds ``n`` jobs is still unanswered when its Erlang-``phases``
    timeout of mean ``timeout_s`` fires), for each ``n`` in ``jobs_found``.

    Its sojourn is ``max(n - servers + 1, 0)`` stages at rate ``servers * service_rate``
    (the jobs ahead leaving) and then its own service at ``service_rate``; the timeout wins
    the race of the two phase-type clocks (a small dynamic programme over stages left)."""
    n = np.asarray(jobs_found, dtype=np.int64)
    c, mu, k = servers, service_rate, phases
    beta = k / timeout_s
    ahead = np.maximum(n - c + 1, 0)
    m_max = int(ahead.max(initial=0))
    # w[m, j]: P(timeout first | m queue stages + own service left, j timeout stages left)
    w = np.empty((m_max + 1, k + 1))
    w[:, 0] = 1.0
    w[0, 1:] = (beta / (mu + beta)) ** np.arange(1, k + 1)
    a, b = c * mu / (c * mu + beta), beta / (c * mu + beta)
    for m in range(1, m_max + 1):
        for j in range(1, k + 1):
            w[m, j] = a * w[m - 1, j] + b * w[m, j - 1]
    return w[ahead, k]


def _retry_allowed(x: np.ndarray, levels: int) -> np.ndarray:
    """Share of a request's accepted, doomed retries that may still retry, over ``levels``
    retry levels (attempts 2 .. ``levels`` + 1), when each attempt of the request goes on
    to a next one with probability ``x``: levels weigh 1, x, x^2, ... and all but the last
    may retry, so sum_{i<levels-1} x^i / sum_{i<levels} x^i; 1 level can never retry.
    ``x`` is the doom probability times the retries' acceptance (:func:`retry_generator`)."""
    if levels <= 1:
        return np.zeros_like(x)
    powers = x[:, None] ** np.arange(levels)[None, :]
    return powers[:, :-1].sum(axis=1) / powers.sum(axis=1)


def retry_allowed_share(p, levels: int, acceptance: float = 1.0) -> np.ndarray:
    """The CTMC's share of doomed retries allowed one more attempt, per doom probability
    ``p`` (array), for ``levels = max_attempts - 1`` retry levels and a retry
    ``acceptance`` probability (see :func:`_retry_allowed`): public for
    ``benchmarks/ctmc_drain_ablation.py``, which switches it off and on."""
    return _retry_allowed(np.asarray(p, dtype=float) * as_probability("acceptance", acceptance),
                          levels)


@dataclass
class RetryCTMC:
    """The chain and its answers. States are ``(jobs, retries)``, flattened as
    ``jobs * (retry_limit + 1) + retries``; ``jobs`` and ``retries`` hold each state's
    coordinates. Times are in seconds."""

    params: dict
    generator: object  # scipy.sparse.csr_matrix, rows sum to zero
    jobs: np.ndarray
    retries: np.ndarray
    _pi: np.ndarray | None  # the stationary distribution (None: not solved yet, _lazy does)
    _boundary: float | None  # stationary mass with retries == retry_limit
    doom: np.ndarray = field(repr=False)  # doom probability per jobs (workload level) found
    levels: np.ndarray = field(repr=False, default=None)  # each state's jobs or work level
    _order: np.ndarray = field(repr=False, default=None)  # elimination order (small band)
    _rank: np.ndarray = field(repr=False, default=None)  # its inverse permutation
    _band_cache: tuple | None = field(repr=False, default=None)
    tangible: np.ndarray | None = field(repr=False, default=None)  # jobs_work: not adding
    _lazy: object = field(repr=False, default=None)  # () -> (stationary, boundary mass)

    @property
    def stationary(self) -> np.ndarray:
        """The stationary distribution over the states (0 on jobs_work's instantaneous
        ones); solved on first use when the chain was built without it (jobs_work with a
        given ``retry_acceptance``, whose stationary solve costs the most)."""
        if self._pi is None:
            self._pi, self._boundary = self._lazy()
        return self._pi

    @property
    def boundary_mass(self) -> float:
        """Stationary mass with retries == retry_limit (the truncation)."""
        if self._boundary is None:
            self.stationary  # noqa: B018 (solves it)
        return self._boundary

    @property
    def states(self) -> int:
        return int(self.jobs.size)

    @property
    def mean_jobs(self) -> float:
        """Mean jobs at the node (queued and in service, abandoned ones included)."""
        return float(self.stationary @ self.jobs)

    @property
    def mean_retries_pending(self) -> float:
        return float(self.stationary @ self.retries)

    def share(self, states) -> float:
        """Stationary probability of a set of states (see :meth:`mask`)."""
        return float(self.stationary[self.mask(states)].sum())

    def mask(self, states) -> np.ndarray:
        """A set of states as a boolean mask: a callable ``f(jobs, retries) -> bool array``,
        a boolean mask, or an array of state indices."""
        if callable(states):
            out = np.asarray(states(self.jobs, self.retries), dtype=bool)
        else:
            arr = np.asarray(states)
            if arr.dtype == bool:
                out = arr
            elif not np.issubdtype(arr.dtype, np.integer):
                raise ValueError(f"states: expected a callable, a boolean mask or integer "
                                 f"state indices, got {arr.dtype} values")
            else:
                out = np.zeros(self.states, dtype=bool)
                out[arr.astype(np.int64)] = True
        if out.shape != (self.states,):
            raise ValueError(f"states: expected a mask of {self.states} states, got shape "
                             f"{out.shape}")
        if not out.any():
            raise ValueError("states: the set is empty")
        return out

    def state(self, jobs: int, retries: int = 0) -> int:
        """The index of state (jobs, retries); in the workload model, of the lowest level
        that maps to at least ``jobs`` jobs (exact with one level per job)."""
        k, r = self.params["capacity"], self.params["retry_limit"]
        if not (0 <= jobs <= k and 0 <= retries <= r):
            raise ValueError(f"state: jobs must be in [0, {k}] and retries in [0, {r}], got "
                             f"({jobs}, {retries})")
        if self.params["model"] == "jobs_work":  # the tangible state with the most work
            # likely for the jobs (NegBin's mode), the window's edge at most
            q = 1.0 / self.params["phases"]
            mode = jobs + (int((jobs - 1) * (1 - q) / q) if jobs > 1 else 0)
            hit = np.flatnonzero(self.tangible & (self.jobs == jobs) & (self.retries == retries)
                                 & (self.levels <= mode))
            return int(hit[np.argmax(self.levels[hit])])
        if self.params["model"] == "workload":
            per_level = self.jobs[:: r + 1]
            jobs = min(int(np.searchsorted(per_level, jobs - 1e-9)), per_level.size - 1)
        return int(jobs * (r + 1) + retries)

    def initial(self, jobs: int, retries: int = 0) -> np.ndarray:
        """A start with ``jobs`` jobs queued and ``retries`` pending, as a distribution
        over the states (for :meth:`first_passage`): one state in the count model; in the
        workload model the work of ``jobs`` exponential jobs, ``jobs`` + NegBin(``jobs``,
        ``q``) levels (past the top level lumped onto it)."""
        one = np.zeros(self.states)
        one[self.state(jobs, retries)] = 1.0  # also checks the range
        if self.params["model"] == "count" or jobs == 0:
            return one
        if self.params["model"] == "jobs_work":  # n + NegBin(n, q) levels, lumped on the edge
            from scipy.stats import nbinom

            at = np.flatnonzero(self.tangible & (self.jobs == jobs) & (self.retries == retries))
            w = self.levels[at]
            p = nbinom.pmf(w - jobs, jobs, 1.0 / self.params["phases"])
            p[np.argmax(w)] += max(1.0 - p.sum(), 0.0)
            one[:] = 0.0
            one[at] = p
            return one
        from scipy.stats import nbinom

        r, top = self.params["retry_limit"], self.params["levels"] - 1
        q = 1.0 / self.params["phases"] if math.isfinite(self.params["timeout_s"]) else 1.0
        w = np.arange(top + 1)
        p = nbinom.pmf(w - jobs, jobs, q) if q < 1 else (w == jobs).astype(float)
        p[-1] += max(1.0 - p.sum(), 0.0)
        one[:] = 0.0
        one[w * (r + 1) + retries] = p
        return one

    def hitting_times(self, to_set) -> np.ndarray:
        """Expected time (s) from every state to first enter ``to_set`` (0 inside it).

        Solved by GTH elimination (:func:`_gth_hitting`), not a generic sparse LU: times of
        10^15 s against rates of 10/s put LU's cancellation of near-equal diagonal terms far
        past double precision (it returned negative times here); GTH only adds positive
        numbers, so each time keeps its relative precision however large it is."""
        target = self.mask(to_set)
        if self.tangible is not None:  # jobs_work: a sparse solve (_sparse_solve)
            inner = np.flatnonzero(~target)
            sub = np.argsort(self._rank[inner], kind="stable")
            h = np.zeros(self.states)
            h[inner] = _sparse_solve(-self.generator[inner][:, inner],
                                     self.tangible[inner].astype(float), sub, "hitting_times")
            return h
        band, bw = self._band
        return _gth_hitting(band.copy(), bw, target[self._order])[self._rank]

    @property
    def _band(self):
        if self._band_cache is None:
            self._band_cache = _as_band(self.generator, self._order)
        return self._band_cache

    def first_passage(self, from_set, to_set) -> float:
        """Expected time (s) to reach ``to_set`` starting in ``from_set``, the start drawn
        from the stationary distribution restricted to ``from_set`` (one state: that state),
        or from ``from_set`` itself when it is a distribution (:meth:`initial`)."""
        h = self.hitting_times(to_set)
        if isinstance(from_set, np.ndarray) and from_set.dtype.kind == "f":
            if from_set.shape != (self.states,) or abs(from_set.sum() - 1.0) > 1e-9 or (
                    from_set < 0).any():
                raise ValueError(f"from_set: a start distribution must be {self.states} "
                                 "non-negative weights summing to 1")
            return float(h @ from_set)
        start = self.mask(from_set)
        if start.sum() == 1:  # one state: no stationary weights needed
            return float(h[start][0])
        weights = self.stationary[start]
        if weights.sum() <= 0:
            weights = np.ones(weights.size)
        return float(h[start] @ weights / weights.sum())

    def spectral_gap(self) -> float:
        """The smallest ``-Re`` of the generator's nonzero eigenvalues (1/s): scipy's
        ``eigs`` on ``P (Q + eps I)^-1 P`` with ``P = I - 1 pi^T``. The projection removes
        the zero eigenvalue (right vector 1, left vector pi) that would otherwise dwarf the
        others by 1/eps and cost them their precision; the tiny shift ``eps`` only keeps
        the sparse LU regular. Eight eigenvalues nearest zero: the smallest ``|Re|`` need
        not be the nearest."""
        from scipy.sparse import identity
        from scipy.sparse.linalg import LinearOperator, eigs, splu

        if self.tangible is not None:
            raise ValueError("model: 'jobs_work' has instantaneous states (an attempt adding "
                             "its levels), so its matrix is not a generator with a spectral "
                             "gap; use model='count' or 'workload' for the mixing time")
        size = self.states
        scale = float(np.abs(self.generator.diagonal()).max())
        if size <= 10:
            ev = np.sort(np.abs(np.linalg.eigvals(self.generator.toarray()).real))
            return float(ev[1])
        eps = 1e-12 * scale
        lu = splu((self.generator + eps * identity(size, format="csr")).tocsc())
        pi = self.stationary

        def apply(v):
            v = np.asarray(v).ravel()
            x = lu.solve(v - np.sum(pi * v))
            return x - np.sum(pi * x)

        op = LinearOperator((size, size), matvec=apply, dtype=float)
        mu = eigs(op, k=min(8, size - 2), which="LM", return_eigenvectors=False)
        lam = 1.0 / mu - eps
        return float(np.min(np.abs(lam.real)))

    def mixing_time(self) -> float:
        """The relaxation time ``1 / spectral_gap`` (s): the time scale on which the chain
        forgets its start (the slowest transient decays as ``exp(-t gap)``)."""
        gap = self.spectral_gap()
        return math.inf if gap <= 0 else 1.0 / gap


def retry_generator(arrival_rate: float, service_rate: float, servers: int, queue_limit: int,
                    timeout_s: float, max_attempts: int, phases: int | None = None,
                    on_timeout: str = "abandon", backoff_s: float = 0.0,
                    backoff_max_s: float = 1.0, jitter: bool = True,
                    retry_limit: int | None = None, model: str = "count",
                    retry_acceptance: float = 1.0):
    """The generator alone, unsolved (same arguments as :func:`retry_ctmc`): ``(Q, jobs,
    retries, doom, params)``. Two calls that differ only in rates share one state space,
    which is what a transient (a spike, a slowdown) evolves over. With
    ``model="workload"`` a state's ``jobs`` is the count its workload maps to
    (:func:`_workload_parts`) and ``doom`` is per workload level. ``retry_acceptance``:
    the probability that a request's earlier retries were accepted (not dropped by a full
    queue), which sets the share of doomed retries with attempts left (module docstring,
    "Attempts left"); 1 (the default) is right where the queue never fills, as in a
    build-up from empty; :func:`retry_ctmc` solves it for the stationary regime."""
    from scipy.sparse import coo_matrix

    if model not in MODELS:
        raise ValueError(f"model: expected one of {', '.join(MODELS)}, got {model!r}")
    if phases is None:
        phases = DEFAULT_PHASES[model]
    lam = as_positive("arrival_rate", arrival_rate)
    mu = as_positive("service_rate", service_rate)
    c = as_int("servers", servers, 1)
    ql = as_int("queue_limit", queue_limit, 0)
    tau = as_positive("timeout_s", timeout_s, allow_inf=True)
    m_att = as_int("max_attempts", max_attempts, 1)
    k_ph = as_int("phases", phases, 1)
    accept = as_probability("retry_acceptance", retry_acceptance)
    if on_timeout not in ON_TIMEOUT:
        raise ValueError(f"on_timeout: expected one of {', '.join(ON_TIMEOUT)}, got "
                         f"{on_timeout!r} (keep_listening is not expressible in (jobs, "
                         "retries): a late answer withdraws its request's queued retries, so "
                         "the jobs an attempt finds are not its wait; simulate it: "
                         "mitigations.retries.on_timeout)")
    b0 = as_nonnegative("backoff_s", backoff_s)
    bmax = as_nonnegative("backoff_max_s", backoff_max_s)
    if not isinstance(jitter, bool):
        raise ValueError(f"jitter: expected true or false, got {jitter!r}")
    cap = c + ql
    if model in ("workload", "jobs_work") and c != 1:
        raise ValueError(f"model: {model!r} is one FCFS server (servers: 1), got servers "
                         f"{c}; use model='count'")
    rl = cap if retry_limit is None else as_int("retry_limit", retry_limit, 0)
    if math.isinf(tau) or m_att == 1:
        rl = 0  # nothing is ever retried: no pool to truncate

    levels = np.arange(1, max(m_att, 2))  # retry a follows attempt a (a < max_attempts)
    backoffs = np.minimum(b0 * 2.0 ** (levels - 1), bmax) * (0.5 if jitter else 1.0)
    mean_backoff = float(backoffs.mean()) if m_att > 1 else 0.0
    theta = 0.0 if math.isinf(tau) else 1.0 / (tau + mean_backoff)
    params = {"arrival_rate": lam, "service_rate": mu, "servers": c, "queue_limit": ql,
              "capacity": cap, "timeout_s": tau, "max_attempts": m_att, "phases": k_ph,
              "on_timeout": on_timeout, "backoff_s": b0, "backoff_max_s": bmax,
              "jitter": jitter, "retry_limit": rl, "retry_return_rate": theta,
              "model": model, "retry_acceptance": accept}
    never = math.isinf(tau) or m_att == 1  # nothing is ever retried
    if model == "jobs_work":
        return _jobs_work_generator(params, never)
    if model == "workload":
        q_levels = 1.0 if math.isinf(tau) else 1.0 / k_ph
        deadline = 0 if math.isinf(tau) else max(int(round(tau * mu * k_ph)), 1)
        top, drop, jobs_of, doom = _workload_parts(cap, q_levels, deadline, never)
        if not doom.any():  # the deadline is past any work the node can hold
            rl = params["retry_limit"] = 0  # (kept, the pool would be unreachable)
        params |= {"levels": top + 1, "level_rate": mu / q_levels, "deadline_levels": deadline}
        n_lv, move = top + 1, _workload_moves(drop, doom, q_levels, deadline, never)
    else:
        n_lv = cap + 1
        n = np.arange(cap + 1)
        doom = np.zeros(cap + 1) if never else doom_probability(n, c, mu, tau, k_ph)
    if n_lv * (rl + 1) > 2_000_000:
        raise ValueError(f"retry_limit: {n_lv} x {rl + 1} states is past 2,000,000; "
                         "lower retry_limit, queue_limit or phases")
    first_retry = doom * (1.0 if m_att > 1 else 0.0)  # a first attempt may retry if M > 1
    again = doom * _retry_allowed(doom * accept, m_att - 1)  # a retry may retry again

    lv = np.repeat(np.arange(n_lv), rl + 1)
    rets = np.tile(np.arange(rl + 1), n_lv)
    idx = np.arange(lv.size)
    rows, cols, vals = [], [], []

    def add(mask, dj, dr, rate):
        src = idx[mask]
        rr = np.minimum(rets[mask] + dr, rl)  # a token past the limit is lost
        dst = np.minimum(lv[mask] + dj, n_lv - 1) * (rl + 1) + rr
        keep = (rate > 0) & (dst != src)
        rows.append(src[keep])
        cols.append(dst[keep])
        vals.append(np.broadcast_to(rate, src.shape)[keep])

    orbit = rets * theta
    if model == "workload":
        move(add, lv, rets, lam, orbit, again, mu / q_levels)
        jobs = jobs_of[lv]
    else:
        jobs = lv
        room = jobs < cap
        d1, d2 = first_retry[jobs], again[jobs]
        add(room, 1, 1, lam * d1[room])  # a fresh attempt, doomed, will retry
        add(room, 1, 0, lam * (1 - d1[room]))  # answered in time, or doomed: no retry left
        add(room & (rets > 0), 1, 0, (orbit * d2)[room & (rets > 0)])  # retry doomed again
        add(room & (rets > 0), 1, -1, (orbit * (1 - d2))[room & (rets > 0)])
        add(~room & (rets > 0), 0, -1, orbit[~room & (rets > 0)])  # a retry dropped
        add(jobs > 0, -1, 0, (np.minimum(jobs, c) * mu)[jobs > 0])  # a service completion

    r_, c_, v_ = (np.concatenate(x) for x in (rows, cols, vals))
    size = lv.size
    off = coo_matrix((v_, (r_, c_)), shape=(size, size)).tocsr()
    out_rate = np.asarray(off.sum(axis=1)).ravel()
    from scipy.sparse import diags

    q = (off - diags(out_rate)).tocsr()
    return q, jobs, rets, doom, params


def _workload_parts(cap: int, q: float, deadline: int, never: bool):
    """The workload model's levels (module docstring, "The workload model"): a job's
    exponential service is a Geometric(``q``) number of levels >= 1, so ``n`` jobs hold
    ``n`` + NegBin(``n``, ``q``) levels and, the other way, ``w >= 1`` levels hold
    1 + Binomial(``w - 1``, ``q``) jobs (each level ends a job with probability ``q``,
    the last one surely). Returns the top level (where an arrival is surely dropped,
    to 1e-12), the drop probability P(jobs >= cap | w), the jobs each level maps to,
    E[min(jobs, cap) | w], and the doom per level found, P(w + S > deadline) =
    (1 - q)^(deadline - w)."""
    from scipy.stats import binom

    if q >= 1.0:  # one level per job: the level is the job count, exactly
        top = cap  # (a level past it is unreachable: it would hold the stationary mass)
        w = np.arange(top + 1)
        drop, jobs = (w >= cap).astype(float), np.minimum(w, cap).astype(float)
    else:
        top = cap
        while binom.sf(cap - 2, top - 1, q) < 1.0 - 1e-12:
            top += max(1, top // 50)
        w = np.arange(top + 1)
        drop = np.where(w >= 1, binom.sf(cap - 2, np.maximum(w - 1, 0), q), 0.0)
        n = np.arange(1, cap)
        pmf = binom.pmf(n[None, :] - 1, np.maximum(w - 1, 0)[:, None], q)
        jobs = np.where(w >= 1, pmf @ n + cap * (1.0 - pmf.sum(axis=1)), 0.0)
    doom = (np.zeros(top + 1) if never
            else np.where(w < deadline, (1.0 - q) ** np.maximum(deadline - w, 0), 1.0))
    return top, drop, jobs, doom


def _workload_moves(drop, doom, q, deadline, never):
    """The workload model's transitions, as a closure over its level tables: an accepted
    attempt adds its S ~ Geometric(``q``) levels (jumps past the top level lumped onto it,
    the geometric tail past 1e-12 folded into the last jump) and is doomed iff it finds
    ``w`` with ``w + S > deadline``, a retry token is taken out of the pool as it returns,
    and the work drains one level at a time at the level rate."""
    top = drop.size - 1
    jmax = 1 if q >= 1.0 else min(top, int(math.ceil(math.log(1e-12) / math.log(1.0 - q))))
    sizes = np.arange(1, jmax + 1)
    p_s = q * (1.0 - q) ** (sizes - 1)
    p_s[-1] += 1.0 - p_s.sum()

    def move(add, lv, rets, lam, orbit, again_share, level_rate):
        acc = 1.0 - drop[lv]
        share = np.divide(again_share, doom, out=np.zeros_like(doom), where=doom > 0)[lv]
        for s, p in zip(sizes, p_s, strict=True):
            doomed = (lv + s > deadline) & (not never)
            fresh, back = lam * acc * p, orbit * acc * p
            add(doomed, s, 1, fresh[doomed])  # a fresh attempt that will time out
            add(~doomed, s, 0, fresh[~doomed])
            add(doomed, s, 0, (back * share)[doomed])  # a retry doomed, retrying again
            add(doomed, s, -1, (back * (1.0 - share))[doomed])
            add(~doomed, s, -1, back[~doomed])
        add(rets > 0, 0, -1, (orbit * drop[lv])[rets > 0])  # a retry dropped
        add(lv > 0, -1, 0, np.full(lv.size, level_rate)[lv > 0])  # one level of work done
    return move


def retry_ctmc(arrival_rate: float, service_rate: float, servers: int, queue_limit: int,
               timeout_s: float, max_attempts: int, phases: int | None = None,
               on_timeout: str = "abandon", backoff_s: float = 0.0,
               backoff_max_s: float = 1.0, jitter: bool = True,
               retry_limit: int | None = None, model: str = "count",
               retry_acceptance: float | None = None) -> RetryCTMC:
    """Build and solve the chain (module docstring). ``backoff_s``/``backoff_max_s``/
    ``jitter`` are ``mitigations.retries.backoff_ms``/``backoff_max_ms``/``jitter`` in
    seconds (the mean backoff over retry levels enters the return delay);
    ``timeout_s = inf`` means no deadline (then it is M/M/c/K). ``retry_limit`` truncates
    pending retries (default: the capacity, servers + queue_limit). ``model``: ``"count"``
    (the default: states (jobs, retries), ``phases`` Erlang stages of the timeout clock,
    default 16) or ``"workload"`` (one server: states (workload level, retries),
    ``phases`` levels per mean service time, default 1; module docstring).
    ``retry_acceptance``: the probability that a request's earlier retries were accepted,
    which sets how many doomed retries have attempts left (module docstring, "Attempts
    left"); ``None`` (the default) solves it as the stationary chain's own (a fixed point,
    ``params["retry_acceptance"]``), 1 is exact for a transient in which the queue has
    not filled (a build-up from empty)."""
    args = dict(phases=phases, on_timeout=on_timeout, backoff_s=backoff_s,
                backoff_max_s=backoff_max_s, jitter=jitter, retry_limit=retry_limit,
                model=model)
    node = (arrival_rate, service_rate, servers, queue_limit, timeout_s, max_attempts)
    fixed = retry_acceptance is not None
    q, jobs, rets, doom, params = retry_generator(
        *node, **args, retry_acceptance=retry_acceptance if fixed else 1.0)
    rl = params["retry_limit"]
    if params["model"] == "jobs_work":
        lay = _jobs_work_layout(params["capacity"], 1.0 / params["phases"], rl)
        levels, tangible = lay["work"], lay["kind"] < 0
        # retries slowest, then jobs, then work (the ILU's order, _sparse_solve)
        order = np.lexsort((lay["kind"], levels, jobs, rets))

        def stationary(g):
            return _jobs_work_stationary(g, tangible, jobs, order), None
    else:
        tangible = None
        # retries-major order: every transition moves at most one level of retries and one
        # job (workload: one level down, at most the largest job up), so the band is about
        # the levels wide (jobs-major would be retry_limit + 2 times the largest jump)
        levels = np.arange(jobs.size) // (rl + 1)
        order = np.lexsort((levels, rets))

        def stationary(g):
            band, bw = _as_band(g, order)
            return _gth_stationary(band, bw)[rank], (band, bw)
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    def finish(pi):  # the truncations' stationary mass, reported and warned about
        boundary = float(pi[rets == rl].sum()) if rl > 0 else 0.0
        if boundary > BOUNDARY_WARN:
            warnings.warn(f"retry_limit: {boundary:.2g} of the stationary mass sits at the "
                          f"truncation ({rl} pending retries); raise retry_limit",
                          RetryCTMCWarning, stacklevel=3)
        if tangible is not None:  # the window's last levels (one level per job: all, exact)
            edge = tangible & (jobs > 0) & (levels >= lay["wmax"][jobs])
            params["window_mass"] = float(pi[edge].sum()) if params["phases"] > 1 else 0.0
            if params["window_mass"] > BOUNDARY_WARN:
                warnings.warn(f"phases: {params['window_mass']:.2g} of the stationary mass "
                              "sits on the work window's last level", RetryCTMCWarning,
                              stacklevel=3)
        return pi, boundary

    if tangible is not None and fixed:  # jobs_work: the stationary solve when first asked
        params["acceptance_solves"], params["acceptance_residual"] = 0, float("nan")
        ctmc = RetryCTMC(params, q, jobs, rets, None, None, doom, levels, order, rank,
                         tangible=tangible, _lazy=lambda: finish(stationary(q)[0]))
        return ctmc
    pi, band = stationary(q)  # the last state kept: the fullest, most likely
    # the retries' acceptance (module docstring, "Attempts left"): a fixed point, solved
    # by secant steps on g(a) - a, g(a) the acceptance the chain built with a gives
    accept_of = _acceptance_reader(params, levels, rets, jobs)
    solve = not fixed and params["max_attempts"] > 2 and rl > 0  # else it changes nothing
    tried = [(1.0, accept_of(pi))] if solve else []
    while tried and abs(tried[-1][1] - tried[-1][0]) > ACCEPT_TOL:
        if len(tried) > ACCEPT_ITER:
            raise RuntimeError(f"retry_acceptance: no fixed point within {ACCEPT_ITER} "
                               f"solves (last {tried[-1]})")
        (a0, g0), (a1, g1) = tried[-2] if len(tried) > 1 else (None, None), tried[-1]
        if a0 is None or (g1 - a1) == (g0 - a0):
            a = g1
        else:  # the secant through the last two residuals (g(a) - a is near linear)
            a = a1 - (g1 - a1) * (a1 - a0) / ((g1 - a1) - (g0 - a0))
        a = min(max(a, 0.0), 1.0)
        q, jobs, rets, doom, params = retry_generator(*node, **args, retry_acceptance=a)
        pi, band = stationary(q)
        tried.append((a, accept_of(pi)))
    params["acceptance_solves"] = len(tried) or 1  # stationary solves (1: none needed)
    params["acceptance_residual"] = abs(tried[-1][1] - tried[-1][0]) if tried else 0.0
    pi, boundary = finish(pi)
    ctmc = RetryCTMC(params, q, jobs, rets, pi, boundary, doom, levels, order, rank,
                     tangible=tangible)
    ctmc._band_cache = band
    return ctmc


def _acceptance_reader(params: dict, levels: np.ndarray, rets: np.ndarray,
                       jobs: np.ndarray):
    """``pi -> `` the probability that a returning retry is accepted, under ``pi``: the
    drop probability of each state (count model: a full node; workload model:
    P(jobs >= capacity | level)) averaged with the retries' return rate, ``retries``
    times the return rate (1 when no retry is ever pending)."""
    if params["model"] == "jobs_work":  # the count is in the state: dropped iff full
        levels = jobs.astype(np.int64)
        drop = (np.arange(params["capacity"] + 1) >= params["capacity"]).astype(float)
    elif params["model"] == "workload":
        q = 1.0 if math.isinf(params["timeout_s"]) else 1.0 / params["phases"]
        drop = _workload_parts(params["capacity"], q, params.get("deadline_levels", 0),
                               True)[1]
        if drop.size != params["levels"]:
            raise AssertionError("the workload levels were not rebuilt the same")
    else:
        drop = (np.arange(params["capacity"] + 1) >= params["capacity"]).astype(float)
    weight_drop = rets * drop[levels]

    def accept(pi: np.ndarray) -> float:
        returning = float(pi @ rets)
        return 1.0 if returning <= 0.0 else 1.0 - float(pi @ weight_drop) / returning
    return accept


def _as_band(q, order: np.ndarray) -> tuple[np.ndarray, int]:
    """The off-diagonal rates of ``q``, states permuted to ``order``, as a band array
    ``B[i, bw + j - i] = q[i, j]`` (the diagonal slot left zero: GTH never reads it)."""
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    coo = q.tocoo()
    off = coo.row != coo.col
    i, j, v = rank[coo.row[off]], rank[coo.col[off]], coo.data[off]
    bw = int(np.abs(i - j).max(initial=1))
    band = np.zeros((order.size, 2 * bw + 1))
    band[i, bw + j - i] = v
    return band, bw


def _gth_forward(band: np.ndarray, bw: int, exit_: np.ndarray, rhs: np.ndarray | None,
                 keep_cols: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """Grassmann-Taksar-Heyman elimination of states 0, 1, ... in order, in place.

    ``band[i, bw + j - i]`` holds the rate i -> j among the states still in play;
    ``exit_`` the rate from each state to outside them (the target, for hitting times).
    Eliminating state k folds ``N_ik N_kj / d_k`` into ``N_ij`` and ``N_ik e_k / d_k``
    into ``e_i`` (and into ``rhs``), where ``d_k`` is recomputed as the sum of what is
    left of row k plus ``e_k``: only positive terms are ever added, so there is no
    cancellation however stiff the chain. Per pivot the touched block is a band x band
    square, a strided view of the band (rows shifted by one place each), so each step
    is one numpy outer product, not a Python loop over entries. Returns each pivot's
    ``d_k`` and, with ``keep_cols``, the column ``N_{k+a,k}`` it had when eliminated."""
    from numpy.lib.stride_tricks import as_strided

    n = band.shape[0] - bw  # the last bw rows are zero padding
    width = band.shape[1]
    item = band.itemsize
    flat = band.reshape(-1)
    d = np.zeros(n)
    cols = np.zeros((n, bw)) if keep_cols else None
    for k in range(n):
        # v[a, b] = band[k + a, bw + b - a] = rate (k + a) -> (k + b)
        v = as_strided(flat[k * width + bw:], shape=(bw + 1, bw + 1),
                       strides=((width - 1) * item, item), writeable=True)
        row = v[0, 1:]
        dk = row.sum() + exit_[k]
        d[k] = dk
        col = v[1:, 0].copy()
        if keep_cols:
            cols[k] = col
        if dk <= 0.0 or not col.any():
            continue
        f = col / dk
        v[1:, 1:] += np.outer(f, row)  # the diagonal slot picks up self-loops: never read
        v[1:, 0] = 0.0
        exit_[k + 1:k + 1 + bw] += f * exit_[k]  # both padded by bw: always bw long
        if rhs is not None:
            rhs[k + 1:k + 1 + bw] += f * rhs[k]
    return d, cols


def _padded(band: np.ndarray, bw: int) -> np.ndarray:
    return np.vstack([band, np.zeros((bw, band.shape[1]))])


def _gth_hitting(band: np.ndarray, bw: int, target: np.ndarray) -> np.ndarray:
    """Mean hitting times of ``target`` (0 on it): d_i h_i - sum_j N_ij h_j = 1 outside the
    target, by :func:`_gth_forward` and back-substitution (every term positive)."""
    n = band.shape[0]
    i, s = np.nonzero(band)
    j = i + s - bw
    into = target[j]
    exit_ = np.bincount(i[into], weights=band[i[into], s[into]], minlength=n)
    band = band.copy()
    band[i[into], s[into]] = 0.0
    band[target] = 0.0
    exit_[target] = 1.0
    rhs = np.where(target, 0.0, 1.0)
    full = _padded(band, bw)
    d, _ = _gth_forward(full, bw, np.concatenate([exit_, np.zeros(bw)]),
                        rhs_full := np.concatenate([rhs, np.zeros(bw)]), False)
    h = np.zeros(n + bw)
    for k in range(n - 1, -1, -1):
        if d[k] <= 0.0:
            h[k] = np.inf
            continue
        h[k] = (rhs_full[k] + full[k, bw + 1:] @ h[k + 1:k + 1 + bw]) / d[k]
    return h[:n]


def _gth_stationary(band: np.ndarray, bw: int) -> np.ndarray:
    """The stationary distribution by GTH: eliminate every state but the last (forward,
    :func:`_gth_forward` with no exit), then pi_last = 1 and, backwards,
    pi_k = sum_{i > k} pi_i N_ik / d_k with the columns kept at elimination. States that
    reach no later state (d_k = 0) get probability 0."""
    n = band.shape[0]
    full = _padded(band, bw)
    d, cols = _gth_forward(full, bw, np.zeros(n + bw), None, True)
    pi = np.zeros(n + bw)
    pi[n - 1] = 1.0
    for k in range(n - 2, -1, -1):
        if d[k] > 0.0:
            pi[k] = cols[k] @ pi[k + 1:k + 1 + bw] / d[k]
            if pi[k] > 1e200:  # relative to an unlikely last state: rescale, never overflow
                pi[k:] *= 1e-200
    pi = pi[:n]
    return pi / pi.sum()


# --- the jobs-and-work model (model="jobs_work"; module docstring) ---

def _jobs_work_layout(cap: int, q: float, rl: int) -> dict:
    """The states of the jobs-and-work chain: tangible ``(jobs n, work w, retries r)``
    with ``w`` in the window ``[n, wmax(n)]`` (``wmax(n)`` = n + the NegBin(n, ``q``)
    quantile 1 - ``WINDOW_TAIL``, so one level per job when ``q`` = 1; 0 for the empty
    node), then the instantaneous states of an arriving attempt adding its levels,
    ``(n, w, r, kind)`` for n >= 1 (kind 1: a retry token is put back if it ends doomed).
    Returns the window and, per state, ``jobs``, ``work``, ``retries``, ``kind`` (-1 for
    a tangible state) and the pair index of ``(n, w)``."""
    from scipy.stats import nbinom

    n = np.arange(cap + 1)
    if q < 1.0:
        wmax = n + nbinom.isf(WINDOW_TAIL, np.maximum(n, 1), q).astype(np.int64)
    else:
        wmax = n.copy()
    wmax[0] = 0
    for i in range(1, cap + 1):  # one more job always has room for one more level
        wmax[i] = max(wmax[i], wmax[i - 1] + 1)
    width = np.where(n > 0, wmax - n + 1, 1)
    pn = np.repeat(n, width)
    pw = np.arange(pn.size) - np.repeat(np.cumsum(width) - width, width) + np.where(pn > 0, pn, 0)
    pair = -np.ones((cap + 1, int(wmax.max()) + 1), dtype=np.int64)
    pair[pn, pw] = np.arange(pn.size)
    busy = np.flatnonzero(pn > 0)
    n_t, n_v = pn.size * (rl + 1), busy.size * (rl + 1) * 2
    tang = {"jobs": np.repeat(pn, rl + 1), "work": np.repeat(pw, rl + 1),
            "retries": np.tile(np.arange(rl + 1), pn.size), "kind": np.full(n_t, -1)}
    vpair = np.repeat(busy, (rl + 1) * 2)
    van = {"jobs": pn[vpair], "work": pw[vpair],
           "retries": np.tile(np.repeat(np.arange(rl + 1), 2), busy.size),
           "kind": np.tile([0, 1], busy.size * (rl + 1))}
    vslot = -np.ones(pn.size, dtype=np.int64)
    vslot[busy] = np.arange(busy.size)
    out = {k: np.concatenate([tang[k], van[k]]) for k in tang}
    out |= {"wmax": wmax, "pair": pair, "vslot": vslot, "tangible_states": n_t,
            "states": n_t + n_v}
    return out


def _jobs_work_generator(params: dict, never: bool):
    """The jobs-and-work chain's generator over its tangible and instantaneous states
    (module docstring, "The jobs-and-work model"): a tangible row holds rates, an
    instantaneous row the probabilities of where the attempt's levels end, minus 1 on its
    diagonal, so every row sums to zero and ``y G = 0`` gives the stationary distribution
    on the tangible states (``y`` on the others is a flow, dropped), ``G h = -1`` (on the
    tangible rows, 0 on the others) the mean hitting times. Returns ``(G, jobs, retries,
    doom per work level, params)``."""
    from scipy.sparse import coo_matrix, diags

    lam, mu, cap = params["arrival_rate"], params["service_rate"], params["capacity"]
    tau, m_att, k_ph = params["timeout_s"], params["max_attempts"], params["phases"]
    rl, theta, accept = params["retry_limit"], params["retry_return_rate"], \
        params["retry_acceptance"]
    q = 1.0 / k_ph
    deadline = 0 if math.isinf(tau) else max(int(round(tau * mu * k_ph)), 1)
    lay = _jobs_work_layout(cap, q, rl)
    if lay["states"] > 20_000_000:
        raise ValueError(f"phases: {lay['states']:,} states (jobs x work x retries) is past "
                         "20,000,000; lower phases, retry_limit or queue_limit")
    wmax, pair, vslot, n_t = lay["wmax"], lay["pair"], lay["vslot"], lay["tangible_states"]
    w_all = np.arange(int(wmax.max()) + 2)
    doom = (np.zeros(w_all.size) if never
            else np.where(w_all < deadline, (1.0 - q) ** np.maximum(deadline - w_all, 0), 1.0))
    allowed = _retry_allowed(doom * accept, m_att - 1)  # a returning retry may retry again

    def tangible(n, w, r):
        return pair[n, np.minimum(w, wmax[n])] * (rl + 1) + np.minimum(r, rl)

    def adding(n, w, r, kind):
        return n_t + (vslot[pair[n, np.minimum(w, wmax[n])]] * (rl + 1) + r) * 2 + kind

    rows, cols, vals = [], [], []

    def add(src, dst, rate):
        rate = np.broadcast_to(rate, src.shape)
        keep = (rate > 0) & (src != dst)
        rows.append(src[keep])
        cols.append(dst[keep])
        vals.append(rate[keep])

    jobs, work, rets, kind = lay["jobs"], lay["work"], lay["retries"], lay["kind"]
    t = np.arange(n_t)
    n, w, r = jobs[:n_t], work[:n_t], rets[:n_t]
    room = n < cap
    fresh_kind = 0 if never else 1  # a fresh attempt may retry iff max_attempts > 1
    add(t[room], adding(n[room] + 1, w[room] + 1, r[room], fresh_kind), lam)
    back = room & (r > 0)  # a retry returns: its token leaves the pool at once
    nb, wb, rb = n[back], w[back], r[back]
    add(t[back], adding(nb + 1, wb + 1, rb - 1, 1), rb * theta * allowed[wb])
    add(t[back], adding(nb + 1, wb + 1, rb - 1, 0), rb * theta * (1.0 - allowed[wb]))
    full = ~room & (r > 0)  # a retry dropped by the full node ends its request
    add(t[full], tangible(n[full], w[full], r[full] - 1), r[full] * theta)
    busy = w >= 1  # a level of work done; it ends a job with probability (n-1)/(w-1)
    ends = np.where(w > 1, (n - 1) / np.maximum(w - 1, 1), 1.0)
    nb, wb, rb = n[busy], w[busy], r[busy]
    add(t[busy], tangible(nb - 1, wb - 1, rb), k_ph * mu * ends[busy])
    add(t[busy], tangible(nb, wb - 1, rb), k_ph * mu * (1.0 - ends[busy]))
    v = np.arange(n_t, lay["states"])
    n, w, r, k = jobs[n_t:], work[n_t:], rets[n_t:], kind[n_t:]
    edge = w >= wmax[n]  # the window's last level takes the geometric tail past it
    more = ~edge
    add(v[more], adding(n[more], w[more] + 1, r[more], k[more]), 1.0 - q)
    late = (w > deadline) & (not never)  # the attempt's work ends past the deadline
    add(v, tangible(n, w, r + k * late), np.where(edge, 1.0, q))
    r_, c_, v_ = (np.concatenate(x) for x in (rows, cols, vals))
    size = lay["states"]
    off = coo_matrix((v_, (r_, c_)), shape=(size, size)).tocsr()
    out_rate = np.asarray(off.sum(axis=1)).ravel()
    g = (off - diags(out_rate)).tocsr()
    params |= {"deadline_levels": deadline, "level_rate": k_ph * mu, "levels": w_all.size - 1,
               "tangible_states": n_t}
    return g, jobs, rets, doom, params


def _sparse_solve(a, b: np.ndarray, order: np.ndarray, what: str,
                  tol: float = 1e3 * SOLVE_RTOL) -> np.ndarray:
    """``a x = b`` for the jobs-and-work chain: a sparse LU up to ``DIRECT_MAX`` unknowns,
    else GMRES (to a relative residual ``tol``, aiming at ``SOLVE_RTOL``) preconditioned by
    an incomplete LU (drop tolerance 1e-2, then 1e-3 from there if it stalls) of ``a`` in
    ``order``: retries slowest, then jobs, then work (SuperLU's own column order cost 3.4x
    the CPU on 359k states; a full sparse LU did not finish in 300 s). Raises if it stalls."""
    from scipy.sparse.linalg import LinearOperator, gmres, spilu, spsolve

    if a.shape[0] <= DIRECT_MAX:
        return np.asarray(spsolve(a.tocsc(), b))
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    ap = a[order][:, order].tocsc()
    bp = b[order]
    x, res, info = None, math.inf, -1
    for drop in (1e-2, 1e-3):  # the cheap preconditioner first, a finer one if it stalls
        ilu = spilu(ap, drop_tol=drop, fill_factor=10 if drop > 1e-3 else 20,
                    permc_spec="NATURAL", diag_pivot_thresh=0.0)
        pre = LinearOperator(ap.shape, ilu.solve)
        x, info = gmres(ap, bp, x0=x, M=pre, rtol=SOLVE_RTOL, restart=60, maxiter=40)
        res = float(np.linalg.norm(ap @ x - bp) / np.linalg.norm(bp))
        if res <= tol:
            return x[rank]
    raise RuntimeError(f"{what}: GMRES left a relative residual of {res:.2g} "
                       f"(info {info}); lower phases")


def _jobs_work_stationary(g, tangible: np.ndarray, jobs: np.ndarray, order: np.ndarray):
    """``y G = 0`` with ``y`` fixed to 1 on one full-node state (the stationary mass
    sits at the full node in a collapse; any state would do), the rest by
    :func:`_sparse_solve`; the tangible part normalised is the stationary distribution."""
    cand = np.flatnonzero(tangible & (jobs == jobs.max()))
    pin = int(cand[cand.size // 2])
    keep = np.ones(g.shape[0], dtype=bool)
    keep[pin] = False
    idx = np.flatnonzero(keep)
    a = g[idx][:, idx].T.tocsr()
    b = -np.asarray(g[pin, idx].todense()).ravel()
    sub_order = np.argsort(np.argsort(order)[idx], kind="stable")
    y = np.zeros(g.shape[0])
    y[pin] = 1.0
    y[idx] = _sparse_solve(a, b, sub_order, "stationary", STATIONARY_TOL)
    pi = np.where(tangible, np.clip(y, 0.0, None), 0.0)
    return pi / pi.sum()
