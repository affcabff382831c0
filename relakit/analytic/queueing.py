"""Queueing closed forms: M/M/c (Erlang C), M/G/1 (Pollaczek-Khinchine), G/G/c approximations.

Rates are per second and times are in seconds, except :func:`service_moments`, which takes
the simulator's millisecond parameters and converts. Everything assumes a stationary,
work-conserving FCFS queue with infinite buffer; utilisation >= 1 has no steady state and
raises :class:`UnstableSystemError` rather than returning a negative or infinite "mean".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ._validate import (
    as_int,
    as_nonnegative,
    as_positive,
    as_probability,
    as_probability_array,
    scalar_or_array,
)

__all__ = [
    "MMc",
    "UnstableSystemError",
    "erlang_c",
    "kingman_wait",
    "mg1_mean_response",
    "mg1_mean_wait",
    "mm1",
    "mmc",
    "service_moments",
    "service_quantile",
]


class UnstableSystemError(ValueError):
    """Utilisation >= 1: arrivals outpace service, the queue grows without bound."""


def _check_stable(arrival_rate: float, service_rate: float, servers: int) -> float:
    """Return utilisation rho = lambda / (c mu), raising UnstableSystemError if rho >= 1."""
    rho = arrival_rate / (servers * service_rate)
    if rho >= 1.0:
        raise UnstableSystemError(
            f"unstable queue: utilisation {rho:.4g} >= 1 (arrival_rate={arrival_rate:.6g}, "
            f"service_rate={service_rate:.6g}, servers={servers}); "
            "add servers or lower the load"
        )
    return rho


def _erlang_b(servers: int, offered_load: float) -> float:
    """Erlang B blocking probability via B(0)=1, B(k) = a B(k-1) / (k + a B(k-1)).

    The recursion only adds positive terms and divides, so it neither overflows (unlike
    a**c / c!) nor cancels; it is accurate for thousands of servers.
    """
    b = 1.0
    for k in range(1, servers + 1):
        b = offered_load * b / (k + offered_load * b)
    return b


def erlang_c(servers: int, offered_load: float) -> float:
    """Erlang C: probability an arrival must wait in an M/M/c queue.

    ``offered_load`` is a = lambda/mu (in Erlangs). Computed from Erlang B as
    ``C = c B / (c - a (1 - B))``, which is stable for large c. Requires a < c (utilisation
    a/c < 1), else :class:`UnstableSystemError`.
    """
    c = as_int("servers", servers, 1)
    a = as_nonnegative("offered_load", offered_load)
    if a >= c:
        raise UnstableSystemError(
            f"unstable queue: utilisation {a / c:.4g} >= 1 (offered_load={a:.6g}, "
            f"servers={c}); add servers or lower the load"
        )
    if a == 0.0:
        return 0.0
    b = _erlang_b(c, a)
    return min(1.0, c * b / (c - a * (1.0 - b)))


def _sum_of_two_exp_sf(t: np.ndarray, rate1: float, rate2: float) -> np.ndarray:
    """P(X1 + X2 > t) for independent X1 ~ Exp(rate1), X2 ~ Exp(rate2), t >= 0.

    The textbook form (r1 e^{-r2 t} - r2 e^{-r1 t}) / (r1 - r2) cancels catastrophically as
    r1 -> r2. Factoring out the slower decay gives the equivalent
    e^{-lo t} (1 + lo (1 - e^{-(hi-lo) t}) / (hi - lo)), evaluated with expm1: no
    cancellation, no overflow, and it tends continuously to the Erlang-2 limit
    (1 + r t) e^{-r t} used when the rates are exactly equal.
    """
    lo, hi = min(rate1, rate2), max(rate1, rate2)
    delta = hi - lo
    if delta == 0.0:
        h = t
    else:
        h = -np.expm1(-delta * t) / delta
    return np.exp(-lo * t) * (1.0 + lo * h)


@dataclass(frozen=True)
class MMc:
    """Steady state of an M/M/c FCFS queue (Poisson arrivals, Exp service, c servers).

    Waiting time W: P(W = 0) = 1 - P_w, and W | W > 0 ~ Exp(theta) with theta = c mu - lambda.
    Response R = W + S with S ~ Exp(mu) independent of W.
    """

    arrival_rate: float
    service_rate: float
    servers: int
    p_wait: float = field(init=False)

    def __post_init__(self) -> None:
        lam = as_positive("arrival_rate", self.arrival_rate)
        mu = as_positive("service_rate", self.service_rate)
        c = as_int("servers", self.servers, 1)
        _check_stable(lam, mu, c)
        object.__setattr__(self, "arrival_rate", lam)
        object.__setattr__(self, "service_rate", mu)
        object.__setattr__(self, "servers", c)
        object.__setattr__(self, "p_wait", erlang_c(c, lam / mu))

    @property
    def utilisation(self) -> float:
        """rho = lambda / (c mu), the long-run fraction of time each server is busy."""
        return self.arrival_rate / (self.servers * self.service_rate)

    @property
    def _theta(self) -> float:
        """Rate of the conditional wait: c mu - lambda (spare service capacity)."""
        return self.servers * self.service_rate - self.arrival_rate

    @property
    def mean_wait(self) -> float:
        """E[W] = P_w / (c mu - lambda)."""
        return self.p_wait / self._theta

    @property
    def mean_response(self) -> float:
        """E[R] = E[W] + 1/mu."""
        return self.mean_wait + 1.0 / self.service_rate

    @property
    def mean_queue_length(self) -> float:
        """E[number waiting] = lambda E[W] (Little's law)."""
        return self.arrival_rate * self.mean_wait

    @property
    def mean_in_system(self) -> float:
        """E[number in system] = lambda E[R] (Little's law)."""
        return self.arrival_rate * self.mean_response

    def wait_cdf(self, t: float | np.ndarray) -> float | np.ndarray:
        """P(W <= t) = 1 - P_w e^{-theta t} for t >= 0 (atom 1 - P_w at zero), 0 for t < 0."""
        t_arr = np.asarray(t, dtype=float)
        tc = np.maximum(t_arr, 0.0)
        out = np.where(t_arr < 0, 0.0, 1.0 - self.p_wait * np.exp(-self._theta * tc))
        return scalar_or_array(out)

    def wait_quantile(self, q: float | np.ndarray) -> float | np.ndarray:
        """q-quantile of W: 0 if q <= 1 - P_w (the arrival finds a free server), else
        ln(P_w / (1 - q)) / theta."""
        q_arr = as_probability_array("q", q, open_interval=True)
        pw = self.p_wait
        waits = q_arr > 1.0 - pw
        safe = np.where(waits, q_arr, 0.0)  # keep log's argument positive where unused
        with np.errstate(divide="ignore"):
            t = np.log(pw / (1.0 - safe)) / self._theta
        return scalar_or_array(np.where(waits, np.maximum(t, 0.0), 0.0))

    def response_sf(self, t: float | np.ndarray) -> float | np.ndarray:
        """P(R > t) = (1 - P_w) e^{-mu t} + P_w P(W' + S > t), W' ~ Exp(theta), S ~ Exp(mu).

        For c = 1 this collapses to e^{-(mu - lambda) t}, the M/M/1 Exp(mu - lambda) response.
        """
        t_arr = np.asarray(t, dtype=float)
        tc = np.maximum(t_arr, 0.0)
        mu, pw = self.service_rate, self.p_wait
        sf = (1.0 - pw) * np.exp(-mu * tc) + pw * _sum_of_two_exp_sf(tc, self._theta, mu)
        return scalar_or_array(np.where(t_arr < 0, 1.0, np.minimum(sf, 1.0)))

    def response_cdf(self, t: float | np.ndarray) -> float | np.ndarray:
        """P(R <= t) = 1 - response_sf(t)."""
        return scalar_or_array(1.0 - np.asarray(self.response_sf(t)))

    def response_quantile(self, q: float | np.ndarray) -> float | np.ndarray:
        """q-quantile of R, solving response_sf(t) = 1 - q with Brent's method.

        Working on the survival function keeps tail quantiles (q = 0.9999) accurate. The
        bracket starts at the mean and doubles until sf < 1 - q, which always terminates
        because sf decays at least like (1 + mu t) e^{-min(theta, mu) t}.
        """
        q_arr = as_probability_array("q", q, open_interval=True)
        out = np.array([self._response_quantile_scalar(float(x)) for x in q_arr.ravel()])
        return scalar_or_array(out.reshape(q_arr.shape))

    def _response_quantile_scalar(self, q: float) -> float:
        target = 1.0 - q

        def f(t: float) -> float:
            return float(self.response_sf(t)) - target

        hi = self.mean_response
        for _ in range(2000):
            if f(hi) < 0.0:
                break
            hi *= 2.0
        else:  # pragma: no cover - unreachable for q < 1
            raise RuntimeError(f"could not bracket the response quantile q={q}")
        from scipy import optimize  # here, not at import: scipy.optimize costs ~0.5 s to load
        return float(optimize.brentq(f, 0.0, hi, xtol=1e-15 * hi, rtol=8.9e-16, maxiter=500))


def mmc(arrival_rate: float, service_rate: float, servers: int) -> MMc:
    """M/M/c queue with Poisson arrivals (rate lambda/s), Exp service (rate mu/s), c servers."""
    return MMc(arrival_rate, service_rate, servers)


def mm1(arrival_rate: float, service_rate: float) -> MMc:
    """M/M/1 queue: ``mmc(arrival_rate, service_rate, 1)``; response ~ Exp(mu - lambda)."""
    return mmc(arrival_rate, service_rate, 1)


def _second_moment(mean_service: float, second_moment: float | None, scv: float | None) -> float:
    if (second_moment is None) == (scv is None):
        raise ValueError("give exactly one of second_moment (E[S^2]) or scv (Var[S]/E[S]^2)")
    if scv is not None:
        return (1.0 + as_nonnegative("scv", scv)) * mean_service**2
    s2 = as_positive("second_moment", second_moment, allow_inf=True)
    if s2 < mean_service**2 * (1.0 - 1e-12):
        raise ValueError(
            f"second_moment={s2:.6g} is below mean_service**2={mean_service**2:.6g}, "
            "impossible since Var[S] >= 0"
        )
    return s2


def mg1_mean_wait(
    arrival_rate: float,
    mean_service: float,
    second_moment: float | None = None,
    scv: float | None = None,
) -> float:
    """Mean queueing delay of an M/G/1 FCFS queue (Pollaczek-Khinchine).

    Wq = lambda E[S^2] / (2 (1 - rho)), rho = lambda E[S]. Give E[S^2] directly or the
    squared coefficient of variation (E[S^2] = (1 + scv) E[S]^2). Exact for Poisson
    arrivals and any service distribution; infinite when E[S^2] is (e.g. Pareto alpha <= 2).
    """
    lam = as_positive("arrival_rate", arrival_rate)
    es = as_positive("mean_service", mean_service)
    s2 = _second_moment(es, second_moment, scv)
    rho = _check_stable(lam, 1.0 / es, 1)
    return lam * s2 / (2.0 * (1.0 - rho))


def mg1_mean_response(
    arrival_rate: float,
    mean_service: float,
    second_moment: float | None = None,
    scv: float | None = None,
) -> float:
    """Mean response time of an M/G/1 FCFS queue: P-K mean wait + E[S]."""
    return mg1_mean_wait(arrival_rate, mean_service, second_moment, scv) + float(mean_service)


def kingman_wait(
    arrival_rate: float, mean_service: float, ca2: float, cs2: float, servers: int = 1
) -> float:
    """Approximate mean queueing delay of a G/G/c queue from first two moments.

    servers = 1: Kingman's heavy-traffic formula Wq ~ (rho / (1 - rho)) ((ca2 + cs2) / 2) E[S].
    servers > 1: Allen-Cunneen, Wq ~ (P_w(M/M/c) / (c mu - lambda)) (ca2 + cs2) / 2, i.e.
    the M/M/c wait scaled by the variability factor. ca2, cs2 are the squared coefficients
    of variation of inter-arrival and service times. Exact for M/M/c (ca2 = cs2 = 1) and
    M/G/1 (ca2 = 1); an approximation otherwise, best at high utilisation.
    """
    lam = as_positive("arrival_rate", arrival_rate)
    es = as_positive("mean_service", mean_service)
    a2 = as_nonnegative("ca2", ca2)
    s2 = as_nonnegative("cs2", cs2)
    c = as_int("servers", servers, 1)
    mu = 1.0 / es
    rho = _check_stable(lam, mu, c)
    variability = (a2 + s2) / 2.0
    if c == 1:
        return rho / (1.0 - rho) * variability * es
    return erlang_c(c, lam * es) / (c * mu - lam) * variability


# the simulator's service kinds and their parameters: relakit.vocab.SERVICE_PARAMS, kept
# here too so the closed forms stand alone (tests/test_vocab.py pins the two equal)
SERVICE_PARAMS: dict[str, tuple[str, ...]] = {
    "exponential": ("mean_ms",),
    "deterministic": ("mean_ms",),
    "lognormal": ("mean_ms", "cv"),
    "pareto": ("mean_ms", "alpha"),
    "bimodal": ("fast_ms", "slow_ms", "slow_fraction"),
    "hyperexponential": ("fast_ms", "slow_ms", "slow_fraction"),
}


def service_moments(kind: str, **params: float) -> tuple[float, float]:
    """(E[S] in s, E[S^2] in s^2) for the simulator's service distributions (params in ms).

    exponential(mean_ms): E[S^2] = 2 m^2. deterministic(mean_ms): m^2.
    lognormal(mean_ms, cv): m^2 (1 + cv^2).
    pareto(mean_ms, alpha): classic Pareto with x_m = m (alpha - 1) / alpha (alpha > 1 so the
    mean is finite); E[S^2] = alpha x_m^2 / (alpha - 2), infinite for alpha <= 2.
    bimodal(fast_ms, slow_ms, slow_fraction): two point masses; moments are the mixture's.
    hyperexponential(fast_ms, slow_ms, slow_fraction): exponential with mean slow_ms with
    probability slow_fraction, else fast_ms; E[S^2] = 2 ((1 - f) fast^2 + f slow^2).
    Feed the result to :func:`mg1_mean_wait` to check the simulator against P-K.
    """
    if kind not in SERVICE_PARAMS:
        raise ValueError(f"unknown service kind {kind!r}; expected one of {list(SERVICE_PARAMS)}")
    expected = SERVICE_PARAMS[kind]
    if set(params) != set(expected):
        raise ValueError(f"{kind} service takes parameters {list(expected)}, got {sorted(params)}")
    if kind in ("bimodal", "hyperexponential"):
        fast = as_positive("fast_ms", params["fast_ms"])
        slow = as_positive("slow_ms", params["slow_ms"])
        f = as_probability("slow_fraction", params["slow_fraction"])
        mean_ms = (1.0 - f) * fast + f * slow
        # a point mass's square, or an exponential's second moment (2 m^2), mixed
        s2_ms = (1.0 if kind == "bimodal" else 2.0) * ((1.0 - f) * fast**2 + f * slow**2)
    else:
        mean_ms = as_positive("mean_ms", params["mean_ms"])
        if kind == "exponential":
            s2_ms = 2.0 * mean_ms**2
        elif kind == "deterministic":
            s2_ms = mean_ms**2
        elif kind == "lognormal":
            s2_ms = (1.0 + as_nonnegative("cv", params["cv"]) ** 2) * mean_ms**2
        else:  # pareto
            alpha = as_positive("alpha", params["alpha"])
            if alpha <= 1.0:
                raise ValueError(f"pareto alpha must be > 1 for a finite mean, got {alpha}")
            x_m = mean_ms * (alpha - 1.0) / alpha
            s2_ms = alpha * x_m**2 / (alpha - 2.0) if alpha > 2.0 else math.inf
    return mean_ms / 1e3, s2_ms / 1e6


def service_quantile(kind: str, q: float, **params: float) -> float:
    """The ``q`` quantile (s) of the simulator's service distribution (params in ms, as
    :func:`service_moments` takes them): inf{t : P(S <= t) >= q}, 0 < q < 1.

    exponential: -m ln(1 - q). deterministic: m. lognormal(mean_ms, cv): e^(mu + sigma z_q)
    with sigma^2 = ln(1 + cv^2), mu = ln m - sigma^2 / 2 (the simulator's draw). pareto:
    x_m (1 - q)^(-1/alpha). bimodal: the lighter mass's point while q <= its probability, else
    the other's. hyperexponential: survival (1 - f) e^(-t/fast) + f e^(-t/slow) = 1 - q has no
    closed form; it falls strictly from 1 to 0, so Brent's method on [0, -ln(1-q) max(fast,
    slow)] (where it is <= 1 - q) solves it. The lab's instances draw this kind
    (:meth:`relakit.lab.lab.LabSpec.service_quantile_ms`).
    """
    q = as_probability("q", q)
    if not 0.0 < q < 1.0:
        raise ValueError(f"q: must lie strictly between 0 and 1, got {q!r}")
    service_moments(kind, **params)  # validates kind, parameter names and values
    if kind in ("bimodal", "hyperexponential"):
        fast, slow, f = params["fast_ms"], params["slow_ms"], params["slow_fraction"]
        if kind == "bimodal":
            (lo, p_lo), hi = ((fast, 1.0 - f), slow) if fast <= slow else ((slow, f), fast)
            return (lo if q <= p_lo else hi) / 1e3
        target = 1.0 - q

        def excess(t: float) -> float:
            return (1.0 - f) * math.exp(-t / fast) + f * math.exp(-t / slow) - target

        hi_ms = -math.log(target) * max(fast, slow)
        from scipy import optimize  # here, not at import: scipy.optimize costs ~0.5 s to load
        return float(optimize.brentq(excess, 0.0, hi_ms, xtol=1e-12 * hi_ms, rtol=8.9e-16,
                                     maxiter=500)) / 1e3
    mean_ms = params["mean_ms"]
    if kind == "exponential":
        return -mean_ms * math.log1p(-q) / 1e3
    if kind == "deterministic":
        return mean_ms / 1e3
    if kind == "lognormal":
        from scipy.special import ndtri

        sigma2 = math.log1p(params["cv"] ** 2)
        return math.exp(math.log(mean_ms) - sigma2 / 2 + math.sqrt(sigma2) * float(ndtri(q))) / 1e3
    alpha = params["alpha"]  # pareto
    return mean_ms * (alpha - 1.0) / alpha * (1.0 - q) ** (-1.0 / alpha) / 1e3
