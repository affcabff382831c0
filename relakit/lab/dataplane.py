"""One data-plane instance: a web service that acts only on the flags it is given.

``GET /work?tier=gold`` (or the tier in the ``X-Tier`` header) costs a service time
(exponential with a slow path, ``servers`` at a time, the rest queue), fails at its own
error rate and runs ``slowdown`` times slower (faults set per instance), and honours
the flags polled from the config server: ``shed_bronze`` answers bronze with a fast
503 (a drop, not an error), ``degraded_mode`` serves at ``degraded_factor`` of the
cost. It exposes what relakit's simulator exposes, under the same names:
``requests_total{tier,outcome}``, ``latency_seconds{tier}`` (histogram, buckets as
given), ``in_flight``, ``busy_seconds_total`` and the flags as gauges. A tier that is
not one of relakit.vocab's (or none) is refused with 400 before any metric is touched,
so it makes no series. The fleet's ``queue_limit`` (waiting places: a request finding
them full is an error, 503) and ``deadline_ms`` (answered 504 and counted a timeout when
it passes; the instance finishes the work, as the simulator's server does) hold here.
With a concurrency limit (``--concurrency-limit JSON``: a scenario's
``mitigations.concurrency_limit``, see :mod:`relakit.lab.in_path`), a request that would
take the instance's admitted requests over the limit is refused at once with 429 and
counted ``rejected`` (``requests_total``, ``rejected_total``); the limit is the gauge
``concurrency_limit`` and learns from each finished request, and a policy's
``concurrency_max`` polled from the config server caps it. The config server's state is
read and polled as the front and the load generator do (:mod:`relakit.lab.calls`).
``POST /repair`` mends its fault (error rate 0, no slowdown): the chain's repair, done
live; like a write to the config server it needs the lab's token (``Authorization:
Bearer``), since any local process could otherwise heal a fault an experiment injected.
Run with ``RELAKIT_LAB_TOKEN=T python -m relakit.lab.dataplane --port P ...``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import sys
import time

import httpx
from fastapi import FastAPI, Header, HTTPException, Request, Response
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from relakit.lab.calls import keep_polling, read_state
from relakit.lab.in_path import ConcurrencyLimit
from relakit.vocab import LOCAL_FLAGS, POLICY_FLAGS

# the latency histogram's bucket bounds (s) unless told otherwise: fine enough between
# 50 ms and 2 s that a p99 read from them is within a bucket's width of the clients'
DEFAULT_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.6, 0.8,
                     1.0, 1.5, 2.0, 3.0, 5.0, 10.0)
TIER_HEADER = "X-Tier"


def tier_of(query: str | None, header: str | None) -> tuple[str | None, str]:
    """The request's tier from the query or the header, or (None, why it is refused)."""
    from relakit.vocab import TIERS

    if query is not None and header is not None and query != header:
        return None, f"tier given twice and differently: query {query!r}, header {header!r}"
    tier = query if query is not None else header
    if tier is None:
        return None, (f"no tier: give the {TIER_HEADER} header or ?tier=, one of "
                      f"{', '.join(TIERS)}")
    if tier not in TIERS:
        return None, f"unknown tier {tier!r}: expected one of {', '.join(TIERS)}"
    return tier, ""


def make_app(config_url: str, poll_s: float, servers: int, mean_ms: float,
             slow_ms: float, slow_fraction: float, error_rate: float,
             degraded_factor: float = 0.5, seed: int = 0, slowdown: float = 1.0,
             token: str = "", buckets_s=DEFAULT_BUCKETS_S, queue_limit: int | None = None,
             deadline_ms: float | None = None, tier_header: str = TIER_HEADER,
             concurrency_limit: dict | None = None) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app):
        """The config poller runs while the server does: started on start-up, cancelled
        (and waited for) on shutdown, so no poll outlives the app."""
        app.state.poller = asyncio.create_task(poll())
        try:
            yield
        finally:
            app.state.poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await app.state.poller

    app = FastAPI(title="relakit data plane", lifespan=lifespan)
    reg = CollectorRegistry()
    requests = Counter("requests", "requests by tier and outcome", ["tier", "outcome"],
                       registry=reg)
    latency = Histogram("latency_seconds", "server-side latency", ["tier"], registry=reg,
                        buckets=tuple(buckets_s))
    in_flight = Gauge("in_flight", "requests in the instance", registry=reg)
    busy = Counter("busy_seconds", "server-seconds spent serving", registry=reg)
    flag_gauge = Gauge("flag", "flags as the instance applies them", ["flag"], registry=reg)
    flags = {**{f: False for f in POLICY_FLAGS}, **{f: None for f in LOCAL_FLAGS}}
    limiter = None if concurrency_limit is None else ConcurrencyLimit(**concurrency_limit)
    if limiter is not None:  # its series only where it runs, as in the simulator
        rejected = Counter("rejected", "requests refused by the concurrency limit",
                           registry=reg)
        limit_gauge = Gauge("concurrency_limit", "the adaptive concurrency limit",
                            registry=reg)
        limit_gauge.set_function(lambda: limiter.limit)
    sem = asyncio.Semaphore(servers)
    fault = {"error_rate": error_rate, "slowdown": slowdown}  # mended by POST /repair
    rng = random.Random(seed)

    def apply_state(state) -> None:
        """The config server's state, read as the front and the load generator read it
        (:func:`relakit.lab.calls.read_state`: flags coerced there; a malformed state is
        refused whole and the last one stays)."""
        read_state(state, 0, flags)  # 0: an instance routes nothing, it reads the flags
        for k in POLICY_FLAGS:
            flag_gauge.labels(k).set(int(flags[k]))
        if limiter is not None:  # a policy's ceiling (None: the scenario's)
            limiter.set_ceiling(flags["concurrency_max"])

    app.state.apply_state = apply_state  # what each poll does (tests call it directly)

    async def poll():
        async with httpx.AsyncClient(timeout=2.0) as client:
            await keep_polling(client, config_url, apply_state, poll_s)

    held = [0]  # requests admitted and not finished: in service or waiting for a server

    async def serve(t0: float, late: list) -> bool:
        """Queue for a server, work, and say whether it failed (the fault's error rate).
        ``late``: set when its deadline passed first (the limit learns it as a failure)."""
        try:
            async with sem:
                cost = (slow_ms if rng.random() < slow_fraction else mean_ms) / 1000.0
                cost = rng.expovariate(1.0 / cost) * fault["slowdown"]
                if flags["degraded_mode"]:
                    cost *= degraded_factor
                if limiter is not None:  # deciding costs the server time (cost_us)
                    cost += limiter.cost_s
                await asyncio.sleep(cost)
                busy.inc(cost)
            return rng.random() < fault["error_rate"]
        finally:
            held[0] -= 1
            in_flight.dec()
            if limiter is not None:
                limiter.learn(time.perf_counter() - t0, bool(late))

    @app.get("/work")
    async def work(request: Request, tier: str | None = None):
        t0 = time.perf_counter()
        tier, why = tier_of(tier, request.headers.get(tier_header))
        if tier is None:  # refused before any metric: an unknown tier makes no series
            return Response(why, status_code=400)
        if tier == "bronze" and flags["shed_bronze"]:
            requests.labels(tier, "dropped").inc()
            return Response("shed", status_code=503)
        if queue_limit is not None and held[0] >= servers + queue_limit:
            requests.labels(tier, "error").inc()  # a full queue errors, as in the simulator
            return Response("queue full", status_code=503)
        if limiter is not None and not limiter.admits(held[0]):
            rejected.inc()  # over the instance's own limit: refused at once
            requests.labels(tier, "rejected").inc()
            return Response("rejected", status_code=429)
        held[0] += 1  # counted here, before any await: admission is exact under a burst
        in_flight.inc()
        late: list = []
        job = asyncio.ensure_future(serve(t0, late))
        try:
            failed = await asyncio.wait_for(asyncio.shield(job), deadline_ms / 1000.0) \
                if deadline_ms else await job
        except TimeoutError:  # the instance goes on with the work: wasted, as simulated
            job.add_done_callback(lambda f: f.cancelled() or f.exception())
            late.append(True)
            latency.labels(tier).observe(time.perf_counter() - t0)
            requests.labels(tier, "timeout").inc()
            return Response("deadline", status_code=504)
        latency.labels(tier).observe(time.perf_counter() - t0)
        requests.labels(tier, "error" if failed else "ok").inc()
        return Response("error" if failed else "ok", status_code=500 if failed else 200)

    @app.post("/repair")
    def repair(authorization: str | None = Header(None)):
        """The live counterpart of ``Fleet.repair``: the instance's fault is mended (what
        the chain's Punisher asks for once it has isolated the instance)."""
        if not token or authorization != f"Bearer {token}":
            raise HTTPException(401, "a valid 'Authorization: Bearer <token>' is required")
        fault.update(error_rate=0.0, slowdown=1.0)
        return fault

    @app.get("/metrics")
    def metrics():
        return Response(generate_latest(reg), media_type="text/plain; version=0.0.4")

    return app


def main() -> None:
    import uvicorn

    ap = argparse.ArgumentParser()
    for name, kind in (("port", int), ("config-url", str), ("poll-s", float),
                       ("servers", int), ("mean-ms", float), ("slow-ms", float),
                       ("slow-fraction", float), ("error-rate", float), ("seed", int),
                       ("slowdown", float)):
        ap.add_argument(f"--{name}", type=kind, required=True)
    ap.add_argument("--buckets", default=",".join(f"{b:g}" for b in DEFAULT_BUCKETS_S),
                    help="latency histogram bucket bounds, seconds, comma-separated")
    ap.add_argument("--queue-limit", type=int, default=None)
    ap.add_argument("--deadline-ms", type=float, default=None)
    ap.add_argument("--tier-header", default=TIER_HEADER)
    ap.add_argument("--keepalive-s", type=float, default=75.0)
    ap.add_argument("--concurrency-limit", type=json.loads, default=None,
                    help="mitigations.concurrency_limit as JSON, every key given "
                         "(relakit.lab.in_path.lab_mitigations)")
    a = ap.parse_args()
    token = os.environ.pop("RELAKIT_LAB_TOKEN", "")
    if not token:
        sys.exit("data plane: set RELAKIT_LAB_TOKEN (the lab's write token) in the environment")
    app = make_app(a.config_url, a.poll_s, a.servers, a.mean_ms, a.slow_ms, a.slow_fraction,
                   a.error_rate, seed=a.seed, slowdown=a.slowdown, token=token,
                   buckets_s=[float(b) for b in a.buckets.split(",")],
                   queue_limit=a.queue_limit, deadline_ms=a.deadline_ms,
                   tier_header=a.tier_header, concurrency_limit=a.concurrency_limit)
    uvicorn.run(app, host="127.0.0.1", port=a.port, log_level="warning",
                timeout_keep_alive=a.keepalive_s)


if __name__ == "__main__":
    main()
