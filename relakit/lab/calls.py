"""What the lab's two clients of the instances share: the front (:mod:`.front`, for a
user's own load tool) and the load generator (:mod:`.load`); the instances
(:mod:`.dataplane`) read the config server's state with the same reader and poller.

- :func:`outcome_of`: an answer's outcome (relakit.vocab.OUTCOMES), as the simulator
  counts it: a full queue and no routable instance are errors, a shed request is
  ``dropped``, a concurrency limit's 429 ``rejected``, the client throttle's
  ``throttled``;
- :func:`read_state` / :func:`keep_polling`: the config server's ``/state`` (its flags,
  and which instances are routable), polled; a failed poll or a malformed state keeps
  the last state;
- :func:`through_throttle`: one call through the client's adaptive throttle
  (:class:`relakit.lab.in_path.ClientThrottle`): its decision cost, its judgement (a
  refused call is never sent), an answer from a server counted an accept.
"""

from __future__ import annotations

import asyncio
import time

import httpx

from relakit.vocab import LOCAL_FLAGS, POLICY_FLAGS, Flags

HEDGE_DELAY_S = 0.1  # a call unanswered this long is hedged (while hedge_enabled is on)
ACCEPTED = (200, 500)  # a server answered: the throttle's accept (the kernel's)
THROTTLED = (429, b"throttled")  # the answer to a call the client's throttle refused
QUEUE_FULL = (503, b"queue full")  # an instance's full queue (relakit.lab.dataplane)
NO_INSTANCE = (503, b"no routable instance")  # the front's, with every instance isolated


def outcome_of(status: int, body: bytes = b"") -> str:
    """The outcome of one call from its answer (status and body, as an instance or the
    front gives them); a status nobody sends here (a 502: the instance unreachable) is
    an error."""
    if status == 429:
        return "throttled" if body == THROTTLED[1] else "rejected"
    if status == 503:
        return "error" if body in (QUEUE_FULL[1], NO_INSTANCE[1]) else "dropped"
    return {200: "ok", 504: "timeout"}.get(status, "error")


def read_state(state, instances: int, flags: dict) -> list[int]:
    """The config server's ``/state``: ``flags`` updated in place with its flags (the
    policy's :data:`~relakit.vocab.POLICY_FLAGS`, true or false), and the
    instances (0 .. ``instances`` - 1) routable by its per-instance controls returned
    (``instances`` 0: a data-plane instance, which reads the flags only). A state of
    another shape, a policy flag that is not a bool, or a
    :data:`~relakit.vocab.LOCAL_FLAGS` value that is not a number >= 1 or null, raises
    ValueError and changes nothing (the poller keeps the last)."""
    if not isinstance(state, dict) or not isinstance(state.get("flags", {}), dict) \
            or not isinstance(state.get("instances", {}), dict):
        raise ValueError(f"config server state: expected flags and instances as mappings, "
                         f"got {str(state)[:80]}")
    got = state.get("flags", {})
    Flags(**{k: got[k] for k in LOCAL_FLAGS if k in got})  # vocab's check: ValueError
    odd = [k for k in POLICY_FLAGS if k in got and not isinstance(got[k], bool)]
    if odd:  # "false" would read as True
        raise ValueError(f"config server state: flag '{odd[0]}' is {got[odd[0]]!r}, "
                         "expected true or false")
    out = {int(k) for k, v in state.get("instances", {}).items()
           if isinstance(v, dict) and not v.get("routable", True)}
    flags.update(got)
    return [i for i in range(instances) if i not in out]


async def refresh(client: httpx.AsyncClient, config_url: str, apply) -> bool:
    """One poll: ``apply(state)`` with what the config server serves; False (and nothing
    applied) when it could not be read."""
    try:
        apply((await client.get(f"{config_url}/state")).json())
        return True
    except (httpx.HTTPError, ValueError):
        return False


async def keep_polling(client: httpx.AsyncClient, config_url: str, apply, poll_s: float,
                       now: bool = True) -> None:
    """:func:`refresh` every ``poll_s`` seconds (first at once unless ``now`` is False),
    until cancelled."""
    if not now:
        await asyncio.sleep(poll_s)
    while True:
        await refresh(client, config_url, apply)
        await asyncio.sleep(poll_s)


async def through_throttle(throttle, k, send) -> tuple[int, bytes]:
    """One call, ``send()`` giving its (status, body), through the client's ``throttle``
    (None: none): after the throttle's ``cost_s`` it judges the call with ``k`` (a
    policy's ``throttle_k``; None: its own); a refused call is answered
    :data:`THROTTLED` and never sent; an answer in :data:`ACCEPTED` counts an accept."""
    if throttle is None:
        return await send()
    if throttle.cost_s > 0.0:
        await asyncio.sleep(throttle.cost_s)
    if throttle.judge(time.monotonic(), k):
        return THROTTLED
    answer = await send()
    if answer[0] in ACCEPTED:
        throttle.accepted(time.monotonic())
    return answer


__all__ = ["ACCEPTED", "HEDGE_DELAY_S", "NO_INSTANCE", "QUEUE_FULL", "THROTTLED",
           "keep_polling", "outcome_of", "read_state", "refresh", "through_throttle"]
