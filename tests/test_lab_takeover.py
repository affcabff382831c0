"""Two agents as two processes: SIGKILL of the leader's process hands the lease over.

A real config server, Prometheus and one data-plane instance on loopback; each agent
is a process of its own (``Lab.start_agent``, what ``relakit lab up --agents 2`` runs).
The leader's process is killed with SIGKILL (no clean-up, no lease released); the
follower must make its first accepted write within lease_s + one evaluation interval.
Then a "zombie" sends the write the dead leader would have sent, had it been frozen
between its decision and its write: its epoch is stale, the config server refuses it
(409) and the flags do not change. Nothing written under the dead leader's epoch is
accepted after the takeover. Stopping the lab leaves no agent process behind.
"""

from __future__ import annotations

import os
import signal
import time

import httpx
import polars as pl
import pytest
from conftest import ROOT, wait_until

from relakit.lab import Lab, LabSpec, procs

RELA = ROOT / "params" / "policies" / "rela.yaml"
LEASE_S, RENEW_S = 3.0, 1.0
# a loopback HTTP round trip, a Prometheus query and the decision itself, in a process
# sharing 2 cores with the lab and other work; the bound (lease_s + one evaluation)
# is exact in simulation (tests/test_control_plane.py)
SLACK_S = 1.0


@pytest.fixture(scope="module")
def killed(tmp_path_factory):
    work = tmp_path_factory.mktemp("labkill")
    spec = LabSpec(instances=1, lease_s=LEASE_S, renew_s=RENEW_S)
    with Lab(spec, workdir=str(work)) as lab:
        auth = {"Authorization": f"Bearer {lab.token}"}

        def get(path):
            return httpx.get(f"{lab.config_url}{path}", timeout=2).json()

        def accepted(holder, epoch):
            return next((w for w in get("/writes") if w["holder"] == holder
                         and w["epoch"] == epoch), None)

        p0 = lab.start_agent("agent0", RELA, ha=True)
        wait_until(lambda: accepted("agent0", 1), 90, "agent0 to lead and write")
        p1 = lab.start_agent("agent1", RELA, ha=True)
        wait_until(lambda: "agent1 follows" in (work / "agent1.log").read_text(), 90,
               "agent1 to follow")
        wait_until(lambda: accepted("agent0", 1)["count"] >= 3, 10, "agent0's writes")
        assert p0.poll() is None and p1.poll() is None
        pids = {n: lab.named[n].pid for n in ("agent0", "agent1")}
        recorded = {r["name"]: r for r in lab.records}
        os.kill(p0.pid, signal.SIGKILL)  # the leader's process: no clean-up at all
        killed_at = time.time()
        first = wait_until(lambda: accepted("agent1", 2), LEASE_S + 20, "agent1's first write")
        assert p0.wait(timeout=5) == -signal.SIGKILL
        # the zombie: the dead leader's write, as it arrives had it been frozen mid-write
        before = get("/state")
        zombie = httpx.put(f"{lab.config_url}/state", headers=auth, timeout=2,
                           json={"flags": {"shed_bronze": not before["flags"]["shed_bronze"]},
                                 "holder": "agent0", "epoch": 1, "reason": "zombie"})
        wait_until(lambda: accepted("agent1", 2)["count"] >= first["count"] + 2, 10,
               "agent1 to keep writing")
        out = {"lease": get("/lease"), "writes": get("/writes"), "refused": get("/refused"),
               "history": get("/history"), "before": before, "after": get("/state"),
               "zombie": (zombie.status_code, zombie.json())}
        stopped = lab.stop_agents()
        audit1 = pl.read_parquet(work / "decisions-agent1.parquet")
        alive_agent1 = procs.is_same(recorded["agent1"])
    yield {**out, "killed_at": killed_at, "first": first, "eval_s": lab.clocks.eval_s,
           "pids": pids, "recorded": recorded, "stopped": stopped, "audit1": audit1,
           "alive_agent1_after_stop": alive_agent1, "log1": (work / "agent1.log").read_text()}


def test_each_agent_is_a_process_of_its_own_recorded_for_down(killed):
    assert killed["pids"]["agent0"] != killed["pids"]["agent1"] != os.getpid()
    for name in ("agent0", "agent1"):
        cmd = killed["recorded"][name]["cmdline"]
        assert cmd[1:3] == ["-m", "relakit.lab.agent"] and name in cmd


def test_sigkill_of_the_leader_hands_over_within_lease_plus_one_evaluation(killed):
    took = killed["first"]["first_s"] - killed["killed_at"]
    print(f"SIGKILL to the follower's first accepted write: {took:.2f} s")  # pytest -s
    assert 0 < took <= LEASE_S + killed["eval_s"] + SLACK_S, took
    terms = [(t["epoch"], t["holder"]) for t in killed["lease"]["terms"]]
    assert terms == [(1, "agent0"), (2, "agent1")]


def test_no_write_of_the_dead_leaders_epoch_is_accepted_after_the_takeover(killed):
    took_over = next(t for t in killed["lease"]["terms"] if t["epoch"] == 2)["time_s"]
    old = [w for w in killed["writes"] if w["epoch"] == 1]
    assert [w["holder"] for w in old] == ["agent0"] and old[0]["last_s"] < took_over
    status, body = killed["zombie"]
    assert status == 409 and "stale epoch 1" in body["detail"], body
    assert [(r["holder"], r["epoch"], r["current_epoch"]) for r in killed["refused"]] == [
        ("agent0", 1, 2)]
    assert killed["after"]["flags"] == killed["before"]["flags"]  # the zombie changed nothing
    assert all(h["epoch"] == 2 for h in killed["history"] if h["time_s"] >= took_over)


def test_the_survivor_audits_its_takeover_and_stops_cleanly(killed):
    assert killed["stopped"] == ["agent1"]  # agent0 was dead already
    assert not killed["alive_agent1_after_stop"]
    rows = killed["audit1"].filter(pl.col("action") == "acquire")
    assert rows["reason"].to_list() == ["agent1 acquired the lease: epoch 2"]
    assert "agent1 follows: the lease is held by agent0 (epoch 1)" in killed["log1"]
    assert "error" not in killed["log1"]
