"""The config server: the source of truth for RelA's flags.

Versioned state; reads for the data plane; writes for the controller, guarded
by a token and validated (an unknown flag or a non-boolean value is rejected
with a clear error); a history of every change. Run with
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

from relakit.vocab import POLICY_FLAGS

FLAGS = POLICY_FLAGS  # relakit.vocab's: what a policy asserts


class FlagUpdate(BaseModel):
    flags: dict = {}
    instances: dict = {}  # "0": {"routable": false}, per-instance controls
    reason: str = ""


def make_app(token: str) -> FastAPI:
    app = FastAPI(title="relakit config server")
    state = {"version": 0, "flags": {f: False for f in FLAGS}, "instances": {}}
    history: list[dict] = []

    @app.get("/state")
    def read_state():
        return state

    @app.get("/history")
    def read_history():
        return history

    @app.put("/state")
    def write_state(update: FlagUpdate, authorization: str = Header(default="")):
        if authorization != f"Bearer {token}":
            raise HTTPException(401, "a valid 'Authorization: Bearer <token>' is required")
        unknown = sorted(set(update.flags) - set(FLAGS))
        if unknown:
            raise HTTPException(422, f"unknown flag(s) {unknown}; flags are {list(FLAGS)}")
        bad = sorted(k for k, v in update.flags.items() if not isinstance(v, bool))
        if bad:
            raise HTTPException(422, f"flag(s) {bad} must be true or false")
        for inst, ctl in update.instances.items():
            if not str(inst).isdigit() or not isinstance(ctl, dict) or set(ctl) - {
                    "routable"} or not all(isinstance(v, bool) for v in ctl.values()):
                raise HTTPException(422, f"instance {inst!r}: controls are "
                                         "{'routable': true|false} per instance index")
        changed = {k: v for k, v in update.flags.items() if state["flags"][k] != v}
        inst_changed = {str(k): v for k, v in update.instances.items()
                        if state["instances"].get(str(k)) != v}
        if inst_changed:
            state["instances"] = {**state["instances"], **inst_changed}
            changed["instances"] = inst_changed
        if changed:
            state["flags"] = {**state["flags"], **{k: v for k, v in changed.items()
                                                   if k in FLAGS}}
            state["version"] += 1
            history.append({"version": state["version"], "time_s": time.time(),
                            "changed": changed, "reason": update.reason})
        return state

    return app


def main() -> None:
    import uvicorn

    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    args = ap.parse_args()
    token = os.environ.pop("RELAKIT_LAB_TOKEN", "")
    if not token:
        sys.exit("config server: set RELAKIT_LAB_TOKEN (the write token) in the environment")
    uvicorn.run(make_app(token), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
