"""An open-loop load generator for the lab: tiers, a rate profile, hedging when the
flag says so, only the instances the config server says are routable, and the client
throttle when the lab's scenario has one (``mitigations.client_throttle``)."""

from __future__ import annotations

import asyncio
import random
import secrets
import time

import httpx

from relakit.lab.calls import (
    HEDGE_DELAY_S,
    keep_polling,
    outcome_of,
    read_state,
    refresh,
    through_throttle,
)
from relakit.lab.in_path import ClientThrottle, first_answer
from relakit.lab.lab import Lab
from relakit.vocab import OUTCOMES, TIERS

# what one load phase may ask (``relakit lab load --phases`` refuses more): the
# generator keeps at most MAX_CONNECTIONS open, so a higher rate only queues here
MAX_CONNECTIONS = 400
MAX_RATE_RPS = 10_000.0
MAX_PHASE_S = 86_400.0


def run_load(lab: Lab, phases: list[tuple[float, float]], tiers=(0.1, 0.3, 0.6),
             hedge_delay_s: float = HEDGE_DELAY_S, timeout_s: float = 2.0,
             seed: int | None = None, fanout: int = 1) -> list[dict]:
    """The front: open-loop Poisson arrivals, ``phases`` = [(duration_s, rate_rps), ...].

    Each user request goes to ``fanout`` distinct routable instances (per the config
    server's per-instance controls) and succeeds only if all do; a call still
    unanswered after ``hedge_delay_s`` is hedged to another instance while the
    ``hedge_enabled`` flag is on. Returns one record per user request: start (Unix
    s), tier, outcome, latency_ms, hedged, instance (the first called; -1: none routable).
    Bounded by the phases' time and count. With the lab's ``client_throttle``, each call
    is first judged by one throttle (the simulator's: one client population), after its
    ``cost_us``; a call it refuses is never sent (outcome ``throttled``), and the
    ``throttle_k`` the config server serves (a policy's) replaces the scenario's k.
    ``seed`` (arrivals, tiers, targets, the throttle's draws): None draws a fresh one, so
    two loads are independent samples as the instances' service times are (``LabSpec.seed``).
    """
    seed = secrets.randbits(31) if seed is None else seed
    return asyncio.run(_load(lab, phases, tiers, hedge_delay_s, timeout_s, seed, fanout))


async def _load(lab, phases, tiers, hedge_delay_s, timeout_s, seed, fanout=1):
    rng = random.Random(seed)
    names = TIERS
    records: list[dict] = []
    flags = {"hedge_enabled": False, "throttle_k": None}
    ct = lab.spec.mitigations.get("client_throttle")
    throttle = None if ct is None else ClientThrottle(**ct, seed=seed)
    routable = {"list": list(range(len(lab.instance_urls)))}
    limits = httpx.Limits(max_connections=MAX_CONNECTIONS, max_keepalive_connections=100)
    async with httpx.AsyncClient(timeout=timeout_s, limits=limits) as client:
        def apply(state):  # (relakit.lab.calls.read_state: flags and routable instances)
            routable["list"] = read_state(state, len(lab.instance_urls), flags)

        async def call(url, tier):
            async def send():
                r = await client.get(f"{url}/work", params={"tier": tier})
                return r.status_code, r.content

            # the client's adaptive throttle (issue 33), when the scenario has one
            return await through_throttle(throttle, flags.get("throttle_k"), send)

        async def one_call(urls, tier):
            first = asyncio.create_task(call(urls[0], tier))
            hedged = False
            try:
                done, _ = await asyncio.wait({first}, timeout=hedge_delay_s)
                tasks = {first}
                if not done and flags.get("hedge_enabled") and len(urls) > 1:
                    hedged = True
                    second = asyncio.create_task(call(urls[1], tier))
                    second.add_done_callback(lambda f: f.cancelled() or f.exception())
                    tasks.add(second)
                decided = await first_answer(tasks, lambda answer: answer[0] == 200)
                for p in tasks - {decided}:
                    p.cancel()
                outcome = outcome_of(*decided.result())
            except (TimeoutError, httpx.TimeoutException):
                outcome = "timeout"
            except httpx.HTTPError:
                outcome = "error"
            first.add_done_callback(lambda f: f.cancelled() or f.exception())
            return outcome, hedged

        async def one(tier):
            t0 = time.time()
            pool = [lab.instance_urls[i] for i in routable["list"]]
            if not pool:
                records.append({"start_s": t0, "tier": tier, "outcome": "error",
                                "latency_ms": 0.0, "hedged": False, "instance": -1})
                return
            k = min(fanout, len(pool))
            targets = rng.sample(pool, k=k)
            spares = [u for u in pool if u not in targets]
            calls = [one_call([u] + ([rng.choice(spares)] if spares else []), tier)
                     for u in targets]
            results = await asyncio.gather(*calls)
            order = OUTCOMES
            outcome = max((o for o, _ in results), key=order.index)
            records.append({"start_s": t0, "tier": tier, "outcome": outcome,
                            "latency_ms": (time.time() - t0) * 1000,
                            "hedged": any(h for _, h in results),
                            "instance": lab.instance_urls.index(targets[0])})

        # the flags in force before the first request (a policy's throttle_k), then polled
        await refresh(client, lab.config_url, apply)
        poller = asyncio.create_task(keep_polling(client, lab.config_url, apply,
                                                  lab.clocks.poll_s, now=False))
        inflight = []
        t = time.time()
        for duration, rate in phases:
            end = t + duration
            while True:
                t += rng.expovariate(rate)
                if t >= end:
                    t = end
                    break
                await asyncio.sleep(max(0.0, t - time.time()))
                x = rng.random()
                tier = names[0] if x < tiers[0] else names[1] if x < tiers[0] + tiers[1] \
                    else names[2]
                inflight.append(asyncio.create_task(one(tier)))
        await asyncio.gather(*inflight)
        poller.cancel()
    return records
