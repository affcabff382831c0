"""Steady states of the in-path mechanisms (issue 33): what a client-side adaptive
throttle sends in overload, and what deciding in the request path costs in capacity.

* **Client-side adaptive throttling** (Google SRE book, "Handling Overload"): a client
  keeps, over a sliding window, the requests it attempted and the ones the backend
  accepted, and rejects a new request locally with probability
  max(0, (requests - k x accepts) / (requests + 1)). In steady overload the window's
  ratio settles where what reaches the backend is k x what it accepts: a throttled
  share of 1 - k x accepted / offered (``throttle_steady_state``).
* **The cost of deciding in the path**: a server-side mechanism that spends ``cost_s``
  of service time judging each request lowers the capacity of c servers of mean service
  s from c / s to c / (s + cost) (``decision_capacity``): the priority inversion a busy
  system pays to save itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._validate import as_int, as_nonnegative, as_positive

__all__ = ["ThrottleSteadyState", "decision_capacity", "throttle_steady_state"]


@dataclass(frozen=True)
class ThrottleSteadyState:
    """Rates (per second) of a client population under adaptive throttling."""

    offered_rps: float  # what the application asks the client to send
    accepted_rps: float  # what the backend accepts
    sent_rps: float  # what reaches the backend: k x accepted in overload, else offered
    throttled_rps: float  # rejected locally by the client, never sent
    k: float

    @property
    def throttled_share(self) -> float:
        return self.throttled_rps / self.offered_rps if self.offered_rps > 0 else 0.0

    @property
    def sent_per_accepted(self) -> float:
        """Requests sent per request accepted: k in overload, offered/accepted below it."""
        return self.sent_rps / self.accepted_rps if self.accepted_rps > 0 else float("inf")


def throttle_steady_state(offered_rps: float, accepted_rps: float, k: float
                          ) -> ThrottleSteadyState:
    """SRE adaptive throttling in steady state, for a backend that accepts
    ``accepted_rps`` of what reaches it (its capacity when saturated, with fast
    rejections of the rest).

    The local rejection probability p = max(0, (R - k A) / (R + 1)) over a window of R
    requests and A accepts makes the expected sent rate R (1 - p) = k A when R > k A
    (the +1 vanishes as the window fills): the client sends k times what is accepted
    and throttles the rest. With R <= k A nothing is throttled. ``k`` >= 1 (k = 1
    throttles everything the backend would refuse; the book's default is 2).
    """
    offered = as_nonnegative("offered_rps", offered_rps)
    accepted = as_nonnegative("accepted_rps", accepted_rps)
    k = as_positive("k", k)
    if k < 1:
        raise ValueError(f"k must be >= 1 (the client sends k x what is accepted), got {k}")
    if accepted > offered:
        raise ValueError(f"accepted_rps ({accepted}) cannot exceed offered_rps ({offered})")
    sent = min(offered, k * accepted)
    return ThrottleSteadyState(offered, accepted, sent, offered - sent, k)


def decision_capacity(servers: int, mean_service_s: float, cost_s: float) -> float:
    """Requests per second ``servers`` servers complete when each request's service of
    mean ``mean_service_s`` carries ``cost_s`` more for an in-path decision:
    servers / (mean_service_s + cost_s)."""
    c = as_int("servers", servers, 1)
    s = as_positive("mean_service_s", mean_service_s)
    cost = as_nonnegative("cost_s", cost_s)
    return c / (s + cost)
