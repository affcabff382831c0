"""One data-plane instance: a web service that acts only on the flags it is given.

``GET /work?tier=gold`` costs a service time (exponential with a slow path,
``servers`` at a time, the rest queue), fails at the instance's error rate,
fails at its own error rate and runs ``slowdown`` times slower (faults set per
instance), and honours the flags polled from the config server: ``shed_bronze`` answers
bronze with a fast 503 (a drop, not an error), ``degraded_mode`` serves at
``degraded_factor`` of the cost. It exposes what relakit's simulator exposes,
under the same names: ``requests_total{tier,outcome}``,
``latency_seconds`` (histogram), ``in_flight``, ``busy_seconds_total`` and the
flags as gauges. ``POST /repair`` mends its fault (error rate 0, no slowdown): the
chain's repair, done live; like a write to the config server it needs the lab's token
(``Authorization: Bearer``), since any local process could otherwise heal a fault an
experiment injected. Run with ``RELAKIT_LAB_TOKEN=T python -m relakit.lab.dataplane
--port P ...``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import time

import httpx
from fastapi import FastAPI, Header, HTTPException, Response
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from relakit.vocab import POLICY_FLAGS


def make_app(config_url: str, poll_s: float, servers: int, mean_ms: float,
             slow_ms: float, slow_fraction: float, error_rate: float,
             degraded_factor: float = 0.5, seed: int = 0, slowdown: float = 1.0,
             token: str = "") -> FastAPI:
    app = FastAPI(title="relakit data plane")
    reg = CollectorRegistry()
    requests = Counter("requests", "requests by tier and outcome", ["tier", "outcome"],
                       registry=reg)
    latency = Histogram("latency_seconds", "server-side latency", registry=reg)
    in_flight = Gauge("in_flight", "requests in the instance", registry=reg)
    busy = Counter("busy_seconds", "server-seconds spent serving", registry=reg)
    flag_gauge = Gauge("flag", "flags as the instance applies them", ["flag"], registry=reg)
    flags = {f: False for f in POLICY_FLAGS}  # relakit.vocab's
    sem = asyncio.Semaphore(servers)
    fault = {"error_rate": error_rate, "slowdown": slowdown}  # mended by POST /repair
    rng = random.Random(seed)

    async def poll():
        async with httpx.AsyncClient(timeout=2.0) as client:
            while True:
                try:
                    state = (await client.get(f"{config_url}/state")).json()
                    flags.update(state["flags"])
                    for k, v in flags.items():
                        flag_gauge.labels(k).set(int(v))
                except (httpx.HTTPError, KeyError, ValueError):
                    pass  # keep the last state it knew
                await asyncio.sleep(poll_s)

    @app.on_event("startup")
    async def start_polling():
        app.state.poller = asyncio.create_task(poll())

    @app.get("/work")
    async def work(tier: str = "bronze"):
        t0 = time.perf_counter()
        if tier == "bronze" and flags["shed_bronze"]:
            requests.labels(tier, "dropped").inc()
            return Response("shed", status_code=503)
        in_flight.inc()
        try:
            async with sem:
                cost = (slow_ms if rng.random() < slow_fraction else mean_ms) / 1000.0
                cost = rng.expovariate(1.0 / cost) * fault["slowdown"]
                if flags["degraded_mode"]:
                    cost *= degraded_factor
                await asyncio.sleep(cost)
                busy.inc(cost)
            failed = rng.random() < fault["error_rate"]
        finally:
            in_flight.dec()
        latency.observe(time.perf_counter() - t0)
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
    a = ap.parse_args()
    token = os.environ.pop("RELAKIT_LAB_TOKEN", "")
    if not token:
        sys.exit("data plane: set RELAKIT_LAB_TOKEN (the lab's write token) in the environment")
    app = make_app(a.config_url, a.poll_s, a.servers, a.mean_ms, a.slow_ms, a.slow_fraction,
                   a.error_rate, seed=a.seed, slowdown=a.slowdown, token=token)
    uvicorn.run(app, host="127.0.0.1", port=a.port, log_level="warning")


if __name__ == "__main__":
    main()
