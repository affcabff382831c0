"""The lab's front door: one port a user's own load tool drives (``wrk``, ``hey``, …).

``GET /work`` with the tier in the ``X-Tier`` header (the name is configurable) or in
``?tier=`` goes to one data-plane instance, picked as the simulator's ``fleet.routing``
picks a node (``random``, ``round_robin``, ``jsq``: fewest requests the front has in
flight there, ``p2c``: the fewer of two drawn at random), among the instances the config
server says are routable; the instance's answer is passed back as it is (200 ok, 500
error, 503 shed or queue full, 504 past the deadline). A missing, doubled or unknown
tier is refused here with 400 and never reaches an instance, so it makes no metric
series. While the ``hedge_enabled`` flag is on, a call unanswered after the hedge delay
is copied to a second instance and the first answer wins (the simulator's hedge, with
``cancel: never``).

With a client throttle (``--client-throttle JSON``: a scenario's
``mitigations.client_throttle``, see :mod:`relakit.lab.in_path`) the front is the
clients' library: every call it would send is first judged by one SRE throttle, and one
it refuses is answered 429 ``throttled`` at once, never sent; an instance's 200 or 500
is an accept. ``GET /metrics`` then serves ``client_throttled_total`` and
``client_requests_total{tier,outcome}`` (what the front answered), scraped by the
lab's Prometheus. The ``throttle_k`` the config server serves (a policy's) replaces k.

Idle keep-alive connections stay open ``keepalive_s`` (75 s by default, longer than the
think time of any client it was tried with; uvicorn's own default, 5 s, cut clients
that think longer). It is a raw ASGI app on uvicorn, no framework: at 200 requests/s
every microsecond of the proxy is spent twice a request on a 2-core machine. Run with
``python -m relakit.lab.front --port P --config-url U --instances URL,URL,...``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from urllib.parse import parse_qs

import httpx

from relakit.lab.dataplane import TIER_HEADER, tier_of
from relakit.lab.in_path import ClientThrottle
from relakit.vocab import OUTCOMES, ROUTINGS, TIERS

KEEPALIVE_S = 75.0  # idle keep-alive, seconds (the clients thought up to 60 s)
HEDGE_DELAY_S = 0.1  # as relakit.lab.load's generator


class Front:
    """The routing state of the front: instances, what is routable, what is in flight."""

    def __init__(self, instance_urls: list[str], routing: str = "random", seed: int = 0):
        if routing not in ROUTINGS:
            raise ValueError(f"routing {routing!r}: expected one of {', '.join(ROUTINGS)}")
        self.urls = list(instance_urls)
        self.routing = routing
        self.rng = random.Random(seed)
        self.routable = list(range(len(self.urls)))
        self.outstanding = [0] * len(self.urls)
        self.turn = 0
        self.flags = {"hedge_enabled": False, "throttle_k": None}
        self.throttle: ClientThrottle | None = None  # set by make_app (--client-throttle)

    def pick(self, exclude: int = -1) -> int:
        """An instance for one call, as ``fleet.routing`` says (-1: none routable)."""
        pool = [i for i in self.routable if i != exclude]
        if not pool:
            return -1
        if self.routing == "random":
            return self.rng.choice(pool)
        if self.routing == "round_robin":
            self.turn += 1
            return pool[self.turn % len(pool)]
        if self.routing == "jsq":
            low = min(self.outstanding[i] for i in pool)
            return self.rng.choice([i for i in pool if self.outstanding[i] == low])
        a, b = (self.rng.sample(pool, 2) if len(pool) > 1 else (pool[0], pool[0]))  # p2c
        return a if self.outstanding[a] <= self.outstanding[b] else b

    def apply_state(self, state: dict) -> None:
        """The config server's state: flags, and the instances made unroutable."""
        self.flags.update(state.get("flags", {}))
        out = {int(k) for k, v in state.get("instances", {}).items()
               if not v.get("routable", True)}
        self.routable = [i for i in range(len(self.urls)) if i not in out]


def make_app(front: Front, config_url: str, poll_s: float, tier_header: str = TIER_HEADER,
             hedge_delay_s: float = HEDGE_DELAY_S, timeout_s: float = 60.0,
             client_throttle: dict | None = None):
    """The ASGI app of the front (see the module's docstring)."""
    header_key = tier_header.lower().encode()
    box: dict = {}
    throttle = front.throttle = (None if client_throttle is None
                                 else ClientThrottle(**client_throttle))
    answered = {(t, o): 0 for t in TIERS for o in OUTCOMES}  # client_requests_total
    outcome_of = {200: "ok", 500: "error", 504: "timeout", 503: "dropped", 429: "rejected"}

    async def poll():
        client = box["client"]
        while True:
            try:
                front.apply_state((await client.get(f"{config_url}/state")).json())
            except (httpx.HTTPError, KeyError, ValueError, AttributeError):
                pass  # keep the last state it knew
            await asyncio.sleep(poll_s)

    async def call(i: int, tier: str) -> tuple[int, bytes]:
        if throttle is not None:  # ---- the clients' adaptive throttle (issue 33)
            if throttle.cost_s > 0.0:
                await asyncio.sleep(throttle.cost_s)
            if throttle.judge(time.monotonic(), front.flags.get("throttle_k")):
                return 429, b"throttled"
        front.outstanding[i] += 1
        try:
            r = await box["client"].get(f"{front.urls[i]}/work", params={"tier": tier})
            if throttle is not None and r.status_code in (200, 500):
                throttle.accepted(time.monotonic())
            return r.status_code, r.content
        except httpx.HTTPError as exc:
            return 502, f"instance {i}: {type(exc).__name__}".encode()
        finally:
            front.outstanding[i] -= 1

    async def route(tier: str) -> tuple[int, bytes]:
        i = front.pick()
        if i < 0:
            return 503, b"no routable instance"
        first = asyncio.ensure_future(call(i, tier))
        done, _ = await asyncio.wait({first}, timeout=hedge_delay_s)
        if done or not front.flags.get("hedge_enabled"):
            return await first
        j = front.pick(exclude=i)
        if j < 0:
            return await first
        second = asyncio.ensure_future(call(j, tier))
        done, _ = await asyncio.wait({first, second}, return_when=asyncio.FIRST_COMPLETED)
        # the loser is let finish and its answer dropped (the simulator's cancel: never):
        # its instance works on either way, and cancelling it would close a pooled
        # connection per hedge, which under load cost the front more than the hedge
        return next(iter(done)).result()

    async def send(send_, status: int, body: bytes) -> None:
        await send_({"type": "http.response.start", "status": status,
                     "headers": [(b"content-type", b"text/plain"),
                                 (b"content-length", str(len(body)).encode())]})
        await send_({"type": "http.response.body", "body": body})

    async def app(scope, receive, send_):
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                if msg["type"] == "lifespan.startup":
                    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=200)
                    box["client"] = httpx.AsyncClient(timeout=timeout_s, limits=limits)
                    box["poller"] = asyncio.ensure_future(poll())
                    await send_({"type": "lifespan.startup.complete"})
                elif msg["type"] == "lifespan.shutdown":
                    box["poller"].cancel()
                    await box["client"].aclose()
                    await send_({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        path = scope["path"]
        if path == "/":
            return await send(send_, 200, (
                f"relakit lab front: GET /work with the {tier_header} header or ?tier=; "
                f"routing {front.routing} over {len(front.urls)} instances\n").encode())
        if path == "/metrics" and throttle is not None:
            lines = ["# TYPE client_throttled_total counter",
                     f"client_throttled_total {throttle.throttled}",
                     "# TYPE client_requests_total counter"]
            lines += [f'client_requests_total{{tier="{t}",outcome="{o}"}} {n}'
                      for (t, o), n in answered.items()]
            return await send(send_, 200, ("\n".join(lines) + "\n").encode())
        if path != "/work":
            return await send(send_, 404, b"not found: the front serves GET /work\n")
        query = parse_qs(scope.get("query_string", b"").decode())
        q = query.get("tier", [None])[-1]
        h = next((v.decode() for k, v in scope["headers"] if k == header_key), None)
        tier, why = tier_of(q, h)
        if tier is None:
            return await send(send_, 400, (why.replace(TIER_HEADER, tier_header)
                                           + "\n").encode())
        status, body = await route(tier)
        if throttle is not None:
            o = ("throttled" if body == b"throttled" else "error" if body == b"queue full"
                 else outcome_of.get(status, "error"))  # a full queue errs, as simulated
            answered[tier, o] += 1
        await send(send_, status, body)

    return app


def main() -> None:
    import uvicorn

    ap = argparse.ArgumentParser(prog="python -m relakit.lab.front")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--config-url", required=True)
    ap.add_argument("--instances", required=True, help="instance URLs, comma-separated")
    ap.add_argument("--poll-s", type=float, default=1.0)
    ap.add_argument("--routing", choices=ROUTINGS, default="random")
    ap.add_argument("--tier-header", default=TIER_HEADER)
    ap.add_argument("--keepalive-s", type=float, default=KEEPALIVE_S)
    ap.add_argument("--hedge-delay-ms", type=float, default=HEDGE_DELAY_S * 1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--client-throttle", type=json.loads, default=None,
                    help="mitigations.client_throttle as JSON, every key given "
                         "(relakit.lab.in_path.lab_mitigations)")
    a = ap.parse_args()
    front = Front(a.instances.split(","), a.routing, a.seed)
    app = make_app(front, a.config_url, a.poll_s, a.tier_header, a.hedge_delay_ms / 1000,
                   client_throttle=a.client_throttle)
    uvicorn.run(app, host="127.0.0.1", port=a.port, log_level="warning",
                timeout_keep_alive=a.keepalive_s, lifespan="on", access_log=False)


if __name__ == "__main__":
    main()
