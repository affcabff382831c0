"""The finite-source queue M/M/c//N: a closed population of N clients in front of c servers.

Each client thinks for an exponential time of mean Z (``think_s``), sends one request,
waits for its answer (exponential service of rate mu, FCFS, c servers) and thinks again.
The number of requests at the servers is a birth-death chain on 0..N with birth rate
(N - n) / Z and death rate min(n, c) mu; its stationary law gives everything here
(Kleinrock, Queueing Systems I, 3.8 and 3.10; the machine-repairman model):

* throughput X = sum_n p_n min(n, c) mu, mean requests at the servers L = sum_n n p_n,
  mean response time R = L / X (Little), and the interactive response-time law
  R = N / X - Z (a client's cycle is R + Z, so X (R + Z) = N), which holds for any
  service and think distribution, not only this model's;
* the response-time distribution by the arrival theorem: a request arriving finds the
  servers as the stationary law of the same system with N - 1 clients; given n found,
  its wait is 0 for n < c and Erlang(n - c + 1, c mu) otherwise, and its service Exp(mu).

Rates are per second, times in seconds. The chain is computed in logarithms, so
thousands of clients neither overflow nor underflow.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ._validate import as_int, as_positive

__all__ = ["FiniteSource", "finite_source"]


def _stationary(clients: int, think_s: float, service_rate: float, servers: int) -> np.ndarray:
    """p_n, n = 0..clients, of the birth-death chain (normalised in logs)."""
    n = np.arange(clients)
    log_ratio = np.log((clients - n) / think_s) - np.log(np.minimum(n + 1, servers)
                                                         * service_rate)
    log_p = np.concatenate([[0.0], np.cumsum(log_ratio)])
    log_p -= log_p.max()
    p = np.exp(log_p)
    return p / p.sum()


@dataclass(frozen=True)
class FiniteSource:
    """Steady state of M/M/c//N (see the module docstring)."""

    clients: int
    think_s: float
    service_rate: float
    servers: int
    p: np.ndarray = field(init=False, repr=False)  # P(n requests at the servers), n = 0..N

    def __post_init__(self) -> None:
        n = as_int("clients", self.clients, 1)
        z = as_positive("think_s", self.think_s)
        mu = as_positive("service_rate", self.service_rate)
        c = as_int("servers", self.servers, 1)
        object.__setattr__(self, "p", _stationary(n, z, mu, c))

    @property
    def throughput(self) -> float:
        """X, requests per second completed (= sent)."""
        n = np.arange(self.clients + 1)
        return float(np.sum(self.p * np.minimum(n, self.servers)) * self.service_rate)

    @property
    def mean_in_system(self) -> float:
        """L, requests queued or in service on average."""
        return float(np.sum(self.p * np.arange(self.clients + 1)))

    @property
    def mean_response(self) -> float:
        """R = L / X (seconds), equal to N / X - Z (the interactive response-time law)."""
        return self.mean_in_system / self.throughput

    @property
    def mean_wait(self) -> float:
        """Mean time queued before service (seconds): R - 1 / mu."""
        return self.mean_response - 1.0 / self.service_rate

    @property
    def utilisation(self) -> float:
        """Busy share of each server: X / (c mu)."""
        return self.throughput / (self.servers * self.service_rate)

    def _arrival_view(self) -> np.ndarray:
        """P(an arriving request finds n at the servers), n = 0..N-1 (the arrival theorem:
        the stationary law with N - 1 clients, equal to (N - n) p_n normalised)."""
        n = np.arange(self.clients)
        w = (self.clients - n) * self.p[:-1]
        return w / w.sum()

    def response_sf(self, t) -> np.ndarray:
        """P(R > t) for the response time of a request (t in seconds, scalar or array):
        every queue length an arrival may find at once, as arrays (t x lengths)."""
        from scipy import stats
        from scipy.special import gammaln

        t = np.atleast_1d(np.asarray(t, dtype=float))
        mu, c = self.service_rate, self.servers
        a = self._arrival_view()
        out = a[: min(c, self.clients)].sum() * np.exp(-mu * t)
        n = np.arange(c, self.clients)
        n = n[a[c:] >= 1e-300]  # (lengths an arrival finds with no measurable chance: none)
        if n.size == 0:
            return np.clip(out, 0.0, 1.0)
        theta, k, tt = c * mu, (n - c + 1)[None, :], t[:, None]
        # P(W + S > t) = P(W > t) + E[exp(-mu (t - W)); W <= t], W ~ Erlang(k, theta)
        tail = stats.gamma.sf(tt, k, scale=1.0 / theta)
        if theta > mu:
            log_e = (k * math.log(theta / (theta - mu))
                     + stats.gamma.logcdf(tt, k, scale=1.0 / (theta - mu)) - mu * tt)
        else:  # c = 1: the integral is (mu t)^k / k!
            with np.errstate(divide="ignore"):
                log_e = k * np.log(mu * tt) - gammaln(k + 1) - mu * tt
        out = out + ((tail + np.exp(log_e)) * a[n][None, :]).sum(axis=1)
        return np.clip(out, 0.0, 1.0)

    def response_quantile(self, q: float) -> float:
        """The q-quantile of the response time (seconds): :meth:`response_sf` = 1 - q,
        by Brent's method on a bracket doubled until it holds the quantile."""
        from scipy.optimize import brentq

        if not 0.0 < q < 1.0:
            raise ValueError(f"q must be in (0, 1), got {q!r}")
        hi = 1.0 / self.service_rate
        while self.response_sf(hi)[0] > 1.0 - q:
            hi *= 2.0
        return float(brentq(lambda t: self.response_sf(t)[0] - (1.0 - q), 0.0, hi,
                            xtol=1e-12, rtol=1e-12))


def finite_source(clients: int, think_s: float, service_rate: float,
                  servers: int = 1) -> FiniteSource:
    """M/M/c//N: ``clients`` clients thinking ``think_s`` seconds on average, ``servers``
    servers of rate ``service_rate`` (per second). Any load is stable: a closed population
    cannot outgrow its servers' queue past N."""
    return FiniteSource(clients, think_s, service_rate, servers)
