"""The lab's front door: one port a user's own load tool drives (``wrk``, ``hey``, …).

``GET /work`` with the tier in the ``X-Tier`` header (the name is configurable) or in
``?tier=`` goes to one data-plane instance, picked as the simulator's ``fleet.routing``
picks a node (``random``, ``round_robin``, ``jsq``: fewest requests the front has in
flight there, ``p2c``: the fewer of two drawn at random), among the instances the config
server says are routable; the instance's answer is passed back as it is (200 ok, 500
error, 503 shed or queue full, 504 past the deadline; 502 if the instance could not be
reached or did not answer within ``timeout_s``). A missing, doubled or unknown tier is
refused here with 400 and never reaches an instance, so it makes no metric series.
While the ``hedge_enabled`` flag is on, a call unanswered after the hedge delay is
copied to a second instance and the first answer wins (the simulator's hedge, with
``cancel: never``).

With a client throttle (``--client-throttle JSON``: a scenario's
``mitigations.client_throttle``, see :mod:`relakit.lab.in_path`) the front is the
clients' library: every call it would send is first judged by one SRE throttle, and one
it refuses is answered 429 ``throttled`` at once, never sent; an instance's 200 or 500
is an accept. ``GET /metrics`` then serves ``client_throttled_total`` and
``client_requests_total{tier,outcome}`` (what the front answered), scraped by the
lab's Prometheus. The ``throttle_k`` the config server serves (a policy's) replaces k.

Idle keep-alive connections stay open ``keepalive_s`` (75 s by default, longer than the
think time of any client it was tried with; uvicorn's default, 5 s, cut clients that
think longer). The front must add no queue of its own in front of the instances, so it
is HTTP/1.1 written on asyncio's protocols, both ways: clients' connections parsed
here, and a pool of keep-alive connections per instance, one request in flight on
each. On uvicorn (pure-Python h11) with httpx (whose connection pool scans every
connection for each request) the front cost 1.3-2.7 ms of CPU a request and carried at
most 180 requests/s on the loaded 2-core machine, the lab's capacity being 139; this
one costs 0.06-0.5 ms and carried 2,979 (``benchmarks/bench_front.py``, performance.md).
Run with ``python -m relakit.lab.front --port P --config-url U --instances URL,...``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
from urllib.parse import parse_qs, urlsplit

import httpx

from relakit.lab.calls import (
    HEDGE_DELAY_S,
    NO_INSTANCE,
    keep_polling,
    outcome_of,
    read_state,
    through_throttle,
)
from relakit.lab.dataplane import TIER_HEADER, tier_of
from relakit.lab.in_path import ClientThrottle, first_answer
from relakit.vocab import OUTCOMES, ROUTINGS, TIERS

KEEPALIVE_S = 75.0  # idle keep-alive, seconds (the clients thought up to 60 s)
MAX_HEAD = 65536  # bytes of a request's line and headers before it is refused (431)
MAX_IDLE = 256  # idle keep-alive connections kept per instance
REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 429: "Too Many Requests",
           431: "Request Header Fields Too Large", 500: "Internal Server Error",
           501: "Not Implemented", 502: "Bad Gateway", 503: "Service Unavailable",
           504: "Gateway Timeout"}


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
        """The config server's state: flags, and the instances made unroutable
        (:func:`relakit.lab.calls.read_state`)."""
        self.routable = read_state(state, len(self.urls), self.flags)


def _head(data: bytearray, end: int) -> tuple[bytes, dict[bytes, list[bytes]]]:
    """The first line and the headers (names lower-cased) of an HTTP message's head."""
    lines = bytes(data[:end]).split(b"\r\n")
    headers: dict[bytes, list[bytes]] = {}
    for ln in lines[1:]:
        k, sep, v = ln.partition(b":")
        if sep:
            headers.setdefault(k.strip().lower(), []).append(v.strip())
    return lines[0], headers


# ---- upstream: keep-alive connections to the instances ------------------------------------
class _Upstream(asyncio.Protocol):
    """One keep-alive connection to an instance, one request at a time; the answer is
    read by its Content-Length (the instances' uvicorn always sends one)."""

    def __init__(self):
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.waiter: asyncio.Future | None = None
        self.closed = False

    def connection_made(self, transport):
        self.transport = transport

    def connection_lost(self, exc):
        self.closed = True
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(ConnectionError("the instance closed the connection"))

    def data_received(self, data):
        self.buf += data
        end = self.buf.find(b"\r\n\r\n")
        if end < 0 or self.waiter is None or self.waiter.done():
            return
        first, headers = _head(self.buf, end)
        try:
            n = int(headers.get(b"content-length", [b"0"])[-1])
            status = int(first.split(b" ", 2)[1])
        except (ValueError, IndexError):
            self.waiter.set_exception(ConnectionError(f"bad answer {first[:80]!r}"))
            return
        if len(self.buf) < end + 4 + n:
            return
        body = bytes(self.buf[end + 4:end + 4 + n])
        del self.buf[:end + 4 + n]
        keep = b"close" not in headers.get(b"connection", [b""])[-1].lower()
        self.waiter.set_result((status, body, keep))

    async def get(self, request: bytes, timeout_s: float) -> tuple[int, bytes, bool]:
        loop = asyncio.get_running_loop()
        self.waiter = waiter = loop.create_future()
        self.transport.write(request)
        timer = loop.call_later(timeout_s, self._late, waiter)  # cheaper than wait_for
        try:
            return await waiter
        finally:
            timer.cancel()

    def _late(self, waiter: asyncio.Future):
        if not waiter.done():
            waiter.set_exception(TimeoutError("the instance did not answer in time"))


class _Pool:
    """Idle keep-alive connections to one instance; a call takes one or opens one."""

    def __init__(self, url: str, timeout_s: float):
        u = urlsplit(url)
        self.host, self.port = u.hostname or "127.0.0.1", u.port or 80
        self.timeout_s = timeout_s
        self.idle: list[_Upstream] = []
        self.requests = {t: (f"GET /work?tier={t} HTTP/1.1\r\nHost: {u.netloc}\r\n"
                             "\r\n").encode() for t in TIERS}

    async def get(self, tier: str) -> tuple[int, bytes]:
        for retry in (False, True):
            conn = None
            while self.idle and conn is None:
                conn = self.idle.pop()
                conn = None if conn.closed else conn
            reused = conn is not None
            if conn is None:
                _, conn = await asyncio.get_running_loop().create_connection(
                    _Upstream, self.host, self.port)
            try:
                status, body, keep = await conn.get(self.requests[tier], self.timeout_s)
                break
            except ConnectionError:
                conn.transport.close()
                # an idle connection the instance closed as it was reused: nothing was
                # answered, so a GET is sent again once, on a new connection
                if retry or not reused or conn.buf:
                    raise
            except BaseException:
                conn.transport.close()
                raise
        if keep and not conn.closed and len(self.idle) < MAX_IDLE:
            self.idle.append(conn)
        else:
            conn.transport.close()
        return status, body

    def close(self) -> None:
        for conn in self.idle:
            conn.transport.close()
        self.idle.clear()


def _response(status: int, body: bytes, close: bool) -> bytes:
    shut = "connection: close\r\n" if close else ""
    return (f"HTTP/1.1 {status} {REASONS.get(status, 'Unknown')}\r\ncontent-type: "
            f"text/plain\r\ncontent-length: {len(body)}\r\n{shut}\r\n").encode() + body


# ---- the clients' side ---------------------------------------------------------------------
class _Client(asyncio.Protocol):
    """One client connection: requests parsed and answered in order, kept alive while
    idle for ``keepalive_s``."""

    def __init__(self, handle, keepalive_s: float):
        self.handle = handle  # (method, target, headers) -> (status, body) or a coroutine
        self.keepalive_s = keepalive_s
        self.buf = bytearray()
        self.busy = False
        self.transport: asyncio.Transport | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.loop = asyncio.get_running_loop()

    def connection_made(self, transport):
        self.transport = transport
        self._idle()

    def connection_lost(self, exc):
        if self.timer is not None:
            self.timer.cancel()
        self.transport = None

    def _idle(self):
        if self.timer is not None:
            self.timer.cancel()
        self.timer = self.loop.call_later(self.keepalive_s, self._expire)

    def _expire(self):
        if self.transport is not None and not self.busy:
            self.transport.close()

    def data_received(self, data):
        self.buf += data
        if not self.busy:
            self._next()

    def _next(self):
        while not self.busy and self.transport is not None:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                if len(self.buf) > MAX_HEAD:
                    self._answer(431, b"request head too large\n", close=True)
                return
            first, headers = _head(self.buf, end)
            parts = first.split(b" ")
            if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
                self._answer(400, b"bad request line\n", close=True)
                return
            if b"transfer-encoding" in headers:
                self._answer(501, b"the front takes no request body\n", close=True)
                return
            try:
                n = int(headers.get(b"content-length", [b"0"])[-1])
            except ValueError:
                self._answer(400, b"bad content-length\n", close=True)
                return
            if len(self.buf) < end + 4 + n:
                return  # the body (which the front ignores) is still coming
            del self.buf[:end + 4 + n]
            conn = headers.get(b"connection", [b""])[-1].lower()
            close = b"close" in conn or (parts[2] == b"HTTP/1.0" and b"keep-alive" not in conn)
            got = self.handle(parts[0], parts[1], headers)
            if isinstance(got, tuple):
                self._answer(*got, close=close)
            else:
                self.busy = True
                if self.timer is not None:
                    self.timer.cancel()
                self.loop.create_task(got).add_done_callback(
                    lambda t, close=close: self._done(t, close))

    def _done(self, task: asyncio.Task, close: bool):
        self.busy = False
        if task.cancelled():
            return
        exc = task.exception()
        status, body = (502, f"front: {type(exc).__name__}\n".encode()) if exc \
            else task.result()
        self._answer(status, body, close)
        if self.transport is not None:
            self._idle()
            self._next()

    def _answer(self, status: int, body: bytes, close: bool):
        if self.transport is None:
            return
        self.transport.write(_response(status, body, close))
        if close:
            self.transport.close()
            self.transport = None


def make_app(front: Front, config_url: str, poll_s: float, tier_header: str = TIER_HEADER,
             hedge_delay_s: float = HEDGE_DELAY_S, timeout_s: float = 60.0,
             client_throttle: dict | None = None):
    """``handle(method, target, headers)``: the front's answer to one request, a
    ``(status, body)`` at once or a coroutine giving it; and ``start()`` / ``stop()``
    (coroutines: the instances' pools and the config poller) — see the module's
    docstring."""
    header_key = tier_header.lower().encode()
    pools = [_Pool(u, timeout_s) for u in front.urls]
    box: dict = {}
    throttle = front.throttle = (None if client_throttle is None
                                 else ClientThrottle(**client_throttle))
    answered = {(t, o): 0 for t in TIERS for o in OUTCOMES}  # client_requests_total

    async def poll():
        async with httpx.AsyncClient(timeout=max(2.0, poll_s)) as client:
            await keep_polling(client, config_url, front.apply_state, poll_s)

    async def call(i: int, tier: str) -> tuple[int, bytes]:
        async def send() -> tuple[int, bytes]:
            front.outstanding[i] += 1
            try:
                return await pools[i].get(tier)
            except OSError as exc:  # refused, reset, closed, or TimeoutError (timeout_s)
                return 502, f"instance {i}: {type(exc).__name__}".encode()
            finally:
                front.outstanding[i] -= 1

        # the clients' adaptive throttle (issue 33), when the front has one
        return await through_throttle(throttle, front.flags.get("throttle_k"), send)

    async def route(tier: str) -> tuple[int, bytes]:
        i = front.pick()
        if i < 0:
            status, body = NO_INSTANCE
        elif not front.flags.get("hedge_enabled"):
            status, body = await call(i, tier)
        else:
            status, body = await hedged(i, tier)
        if throttle is not None:  # the outcome as the load generator counts it
            answered[tier, outcome_of(status, body)] += 1
        return status, body

    async def hedged(i: int, tier: str) -> tuple[int, bytes]:
        first = asyncio.ensure_future(call(i, tier))
        done, _ = await asyncio.wait({first}, timeout=hedge_delay_s)
        if done:
            return first.result()
        j = front.pick(exclude=i)
        if j < 0:
            return await first
        second = asyncio.ensure_future(call(j, tier))
        # the loser is let finish and its answer dropped (the simulator's cancel: never):
        # its instance works on either way, and cancelling it would close a pooled
        # connection per hedge, which under load cost the front more than the hedge
        return (await first_answer({first, second}, lambda answer: answer[0] == 200)).result()

    def handle(method: bytes, target: bytes, headers: dict):
        path, _, qs = target.partition(b"?")
        if path == b"/":
            return 200, (f"relakit lab front: GET /work with the {tier_header} header or "
                         f"?tier=; routing {front.routing} over {len(front.urls)} "
                         "instances\n").encode()
        if path == b"/metrics" and throttle is not None:
            lines = ["# TYPE client_throttled_total counter",
                     f"client_throttled_total {throttle.throttled}",
                     "# TYPE client_requests_total counter"]
            lines += [f'client_requests_total{{tier="{t}",outcome="{o}"}} {n}'
                      for (t, o), n in answered.items()]
            return 200, ("\n".join(lines) + "\n").encode()
        if path != b"/work":
            return 404, b"not found: the front serves GET /work\n"
        q = parse_qs(qs.decode("utf-8", "replace")).get("tier", [None])[-1] if qs else None
        hs = headers.get(header_key)
        h = hs[0].decode("utf-8", "replace") if hs else None
        tier, why = tier_of(q, h)
        if tier is None:
            return 400, (why.replace(TIER_HEADER, tier_header) + "\n").encode()
        return route(tier)

    async def start():
        box["poller"] = asyncio.ensure_future(poll())

    async def stop():
        box["poller"].cancel()
        for p in pools:
            p.close()

    handle.start, handle.stop = start, stop
    return handle


async def serve(handle, port: int, keepalive_s: float = KEEPALIVE_S,
                host: str = "127.0.0.1") -> None:
    """Serve the front on ``host:port`` until SIGTERM or SIGINT."""
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    await handle.start()
    server = await loop.create_server(lambda: _Client(handle, keepalive_s), host, port,
                                      reuse_address=True, backlog=1024)
    try:
        await stopping.wait()
    finally:
        server.close()
        await handle.stop()


def main() -> None:
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
    handle = make_app(front, a.config_url, a.poll_s, a.tier_header, a.hedge_delay_ms / 1000,
                      client_throttle=a.client_throttle)
    asyncio.run(serve(handle, a.port, a.keepalive_s))


if __name__ == "__main__":
    main()
