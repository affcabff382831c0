"""The config server: the source of truth for RelA's flags.

Versioned state; reads for the data plane; writes for the controller, guarded
by a token and validated (an unknown flag or a non-boolean value is rejected
with a clear error); a history of every change. Beside the policy's booleans it serves
the in-path mechanisms' parameters (``throttle_k``, ``concurrency_max``: a number >= 1,
or null for the scenario's own).

High availability: one lease (``/lease``, ``/lease/acquire``, ``/lease/renew``),
held by one agent for ``--lease-s`` seconds and renewed by it; every acquisition
starts a new term (the epoch goes up by one). Once a lease has been taken, a write
must carry the current epoch: a deposed leader's write (an older epoch) is refused
with 409 and kept in ``/refused``, so fencing does not depend on the old leader
noticing that it was deposed. The same rules as the simulation's
:class:`relakit.control.plane.ConfigServer`. Run with
``RELAKIT_LAB_TOKEN=T python -m relakit.lab.config_server --port P``: the token
is read from the environment (private to the user) so that it never appears on
a command line, which every user can read in ``ps``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from fastapi import FastAPI, Header, HTTPException
from pydantic import BaseModel

from relakit.vocab import LOCAL_FLAGS, POLICY_FLAGS, Flags

FLAGS = POLICY_FLAGS  # relakit.vocab's: what a policy asserts
# and the in-path mechanisms' parameters a policy may set (issue 33): a number >= 1, or
# null for the lab's own (its scenario's); served to the instances and the load generator
LOCAL = LOCAL_FLAGS


class FlagUpdate(BaseModel):
    flags: dict = {}
    instances: dict = {}  # "0": {"routable": false}, per-instance controls
    reason: str = ""
    epoch: int | None = None  # the writer's lease term (required once a lease exists)
    holder: str = ""  # who writes, for the history


class LeaseRequest(BaseModel):
    holder: str
    epoch: int | None = None  # renew: the term being renewed


def make_app(token: str, lease_s: float = 10.0) -> FastAPI:
    app = FastAPI(title="relakit config server")
    state = {"version": 0, "flags": {**{f: False for f in FLAGS}, **{f: None for f in LOCAL}},
             "instances": {}}
    history: list[dict] = []
    lease = {"holder": None, "epoch": 0, "expires_at": 0.0, "lease_s": lease_s}
    terms: list[dict] = []  # every acquisition: epoch, holder, time
    refused: list[dict] = []  # writes refused for a stale epoch
    accepted: dict = {}  # (holder, epoch) -> first and last accepted write, and count

    def _auth(authorization: str) -> None:
        if authorization != f"Bearer {token}":
            raise HTTPException(401, "a valid 'Authorization: Bearer <token>' is required")

    @app.get("/lease")
    def read_lease():
        return {**lease, "now": time.time(), "terms": terms}

    @app.post("/lease/acquire")
    def acquire(req: LeaseRequest, authorization: str = Header(default="")):
        _auth(authorization)
        now = time.time()
        if lease["holder"] not in (None, req.holder) and now < lease["expires_at"]:
            raise HTTPException(409, f"the lease is held by {lease['holder']} (epoch "
                                     f"{lease['epoch']}) until {lease['expires_at']:.3f}")
        if lease["holder"] != req.holder or now >= lease["expires_at"]:
            lease["epoch"] += 1  # a new term, even for the same holder after expiry
            terms.append({"epoch": lease["epoch"], "holder": req.holder, "time_s": now})
        lease["holder"], lease["expires_at"] = req.holder, now + lease_s
        return lease

    @app.post("/lease/renew")
    def renew(req: LeaseRequest, authorization: str = Header(default="")):
        _auth(authorization)
        if lease["holder"] != req.holder or lease["epoch"] != req.epoch:
            raise HTTPException(409, f"cannot renew epoch {req.epoch}: the lease is "
                                     f"{lease['holder']}'s at epoch {lease['epoch']}")
        lease["expires_at"] = time.time() + lease_s
        return lease

    @app.get("/refused")
    def read_refused():
        return refused

    @app.get("/writes")
    def read_writes():
        """Accepted writes per writer and epoch (level-triggered writes that change
        nothing are not in ``/history`` but are here)."""
        return list(accepted.values())

    @app.get("/state")
    def read_state():
        return state

    @app.get("/history")
    def read_history():
        return history

    @app.put("/state")
    def write_state(update: FlagUpdate, authorization: str = Header(default="")):
        _auth(authorization)
        if lease["epoch"] > 0 and update.epoch != lease["epoch"]:  # fencing
            refused.append({"time_s": time.time(), "holder": update.holder,
                            "epoch": update.epoch, "current_epoch": lease["epoch"]})
            raise HTTPException(409, f"stale epoch {update.epoch}: the lease is "
                                     f"{lease['holder']}'s at epoch {lease['epoch']}")
        unknown = sorted(set(update.flags) - set(FLAGS) - set(LOCAL))
        if unknown:
            raise HTTPException(422, f"unknown flag(s) {unknown}; flags are "
                                     f"{list(FLAGS + LOCAL)}")
        bad = sorted(k for k, v in update.flags.items() if k in FLAGS and not isinstance(v, bool))
        if bad:
            raise HTTPException(422, f"flag(s) {bad} must be true or false")
        try:  # vocab.Flags' own check: a number >= 1 or null
            Flags(**{k: v for k, v in update.flags.items() if k in LOCAL})
        except ValueError as exc:
            raise HTTPException(422, str(exc)) from None
        for inst, ctl in update.instances.items():
            if not str(inst).isdigit() or not isinstance(ctl, dict) or set(ctl) - {
                    "routable"} or not all(isinstance(v, bool) for v in ctl.values()):
                raise HTTPException(422, f"instance {inst!r}: controls are "
                                         "{'routable': true|false} per instance index")
        now = time.time()
        w = accepted.setdefault((update.holder, update.epoch), {
            "holder": update.holder, "epoch": update.epoch, "first_s": now, "count": 0})
        w["last_s"], w["count"] = now, w["count"] + 1
        changed = {k: v for k, v in update.flags.items() if state["flags"][k] != v}
        inst_changed = {str(k): v for k, v in update.instances.items()
                        if state["instances"].get(str(k)) != v}
        if inst_changed:
            state["instances"] = {**state["instances"], **inst_changed}
            changed["instances"] = inst_changed
        if changed:
            state["flags"] = {**state["flags"], **{k: v for k, v in changed.items()
                                                   if k in FLAGS or k in LOCAL}}
            state["version"] += 1
            history.append({"version": state["version"], "time_s": time.time(),
                            "changed": changed, "reason": update.reason,
                            "holder": update.holder, "epoch": update.epoch})
        return state

    return app


def main() -> None:
    import uvicorn

    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--lease-s", type=float, default=10.0)
    args = ap.parse_args()
    token = os.environ.pop("RELAKIT_LAB_TOKEN", "")
    if not token:
        sys.exit("config server: set RELAKIT_LAB_TOKEN (the write token) in the environment")
    uvicorn.run(make_app(token, args.lease_s), host="127.0.0.1", port=args.port,
                log_level="warning")


if __name__ == "__main__":
    main()
