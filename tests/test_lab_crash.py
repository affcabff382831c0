"""A lab that survives its own crash: `relakit lab up` killed with SIGKILL leaves its
services and Prometheus running (its agents, processes of their own, die with it);
`relakit lab down` must find and stop every one of them from what state.json
recorded, leave nothing listening, and never signal a pid that now belongs to another
process. The token never appears on a command line. A lab stopped the ordinary way
leaves no process behind either, and writes its agents' audit; a `state.json` that
is not a lab's is a one-line error.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, stop_lab
from conftest import relakit_cli as _cli

from relakit.cli import main
from relakit.lab import procs


def _ports(state: dict) -> list[int]:
    urls = [state["config_url"], state["prom_url"], state["front_url"], *state["instance_urls"]]
    return [int(u.rsplit(":", 1)[1]) for u in urls]


def _accepts(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1.0)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _all_cmdlines() -> list[bytes]:
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                out.append((p / "cmdline").read_bytes())
            except OSError:
                pass
    return out


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
def _up(work: Path, *args: str) -> tuple[subprocess.Popen, dict]:
    """`relakit lab up` in the background, once every process it starts is recorded."""
    up = subprocess.Popen([sys.executable, "-m", "relakit.cli", "lab", "up", "--dir",
                           str(work), "--front-port", "0", *args], cwd=ROOT,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    state_file = work / "state.json"
    deadline = time.time() + 120
    state = {}
    while time.time() < deadline and up.poll() is None:
        if state_file.is_file():
            try:
                state = json.loads(state_file.read_text())
            except ValueError:  # never: it is renamed into place whole; said if it were
                raise AssertionError(f"{state_file} half-written") from None
            if state.get("ready") and "agent1" in [r["name"] for r in state["processes"]]:
                break
        time.sleep(0.2)
    assert state.get("ready"), up.stdout.read() if up.poll() is not None else "timeout"
    return up, state


def _gone(record: dict, timeout_s: float = 10.0) -> bool:
    deadline = time.time() + timeout_s
    while time.time() < deadline and procs.is_same(record):
        time.sleep(0.05)
    return not procs.is_same(record)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
def test_down_stops_every_process_of_a_lab_whose_up_was_killed(tmp_path):
    work = tmp_path / "lab"
    up, state = _up(work, "--instances", "2", "--agents", "2")
    try:
        state_file = work / "state.json"
        # the secret: in a 0600 file and the config server's environment, on no command line
        assert stat.S_IMODE(state_file.stat().st_mode) == 0o600
        token = state["token"].encode()
        assert len(token) >= 16 and not any(token in c for c in _all_cmdlines())
        records = state["processes"]
        assert [r["name"] for r in records] == ["config", "instance0", "instance1", "front",
                                                "prometheus", "agent0", "agent1"]
        agents, records = records[5:], records[:5]
        ports = _ports(state)
        assert all(_accepts(p) for p in ports)
        second = _cli("lab", "up", "--dir", str(work))  # one lab per folder
        assert second.returncode == 2 and "a lab is already running here" in second.stderr
        assert json.loads(state_file.read_text())["processes"] == records + agents
        os.kill(up.pid, signal.SIGKILL)  # the owner dies without cleaning up
        up.wait(timeout=10)
        # the agents die with their owner (PR_SET_PDEATHSIG): nothing left to write for
        assert all(_gone(r) for r in agents), [procs.identity(r["pid"]) for r in agents]
        time.sleep(0.5)
        # what the issue saw: the services outlive their owner
        gone = [(r["name"], procs.identity(r["pid"])) for r in records if not procs.is_same(r)]
        assert not gone, (gone, [(w.name, w.read_text()[-400:]) for w in work.glob("*.log")])
        assert all(_accepts(p) for p in ports)
        t0 = time.monotonic()
        down = _cli("lab", "down", "--dir", str(work))
        took = time.monotonic() - t0
        assert down.returncode == 0, down.stderr
        for r in records:
            assert f"stopped {r['name']} (pid {r['pid']})" in down.stdout
        for r in agents:
            assert f"(pid {r['pid']})" not in down.stdout  # gone already, never signalled
            assert procs.identity(r["pid"]) is None or not procs.is_same(r)
        assert not any(_accepts(p) for p in ports)
        assert not state_file.exists()
        assert took < 30, took
        again = _cli("lab", "down", "--dir", str(work))  # nothing left to stop: a clear error
        assert again.returncode == 2 and "no running lab here" in again.stderr
    finally:
        stop_lab(up, work)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
def test_down_stops_a_running_lab_and_its_agents_and_leaves_no_process(tmp_path):
    work = tmp_path / "lab"
    up, state = _up(work, "--instances", "1", "--agents", "2", "--lease-s", "3",
                    "--renew-s", "1")
    try:
        records = state["processes"]
        config = state["config_url"]
        # the two agents start together: whichever asks first leads, the other follows
        logs = {a: work / f"{a}.log" for a in ("agent0", "agent1")}

        def follower():
            return next((a for a, p in logs.items()
                         if p.is_file() and f"{a} follows" in p.read_text()), None)

        deadline = time.time() + 60
        while time.time() < deadline and follower() is None:
            time.sleep(0.2)
        assert follower() is not None, {a: p.read_text() for a, p in logs.items() if p.is_file()}
        leader = next(a for a in logs if a != follower())
        # record's --out is a folder, by default the lab's own: recorded.json goes there
        rec = _cli("lab", "record", "--dir", str(work), "--since", "5")
        assert rec.returncode == 0 and f"wrote {work / 'recorded.json'}" in rec.stdout, rec
        assert json.loads((work / "recorded.json").read_text())["status"] == "success"
        down = _cli("lab", "down", "--dir", str(work))
        assert down.returncode == 0, down.stderr
        assert f"stopped lab up (pid {up.pid})" in down.stdout
        assert up.wait(timeout=30) == 0
        tail = up.stdout.read()
        assert "lab down; audit in" in tail, tail
        left = [r["name"] for r in records if procs.is_same(r)]
        assert not left, left  # no orphan: agents, services and Prometheus all gone
        assert not _accepts(int(config.rsplit(":", 1)[1]))
        import polars as pl

        audit = pl.read_parquet(work / "decisions.parquet")
        acquired = audit.filter(pl.col("action") == "acquire")["reason"].to_list()
        assert acquired == [f"{leader} acquired the lease: epoch 1"], acquired
        assert not list(work.glob("decisions-agent*.parquet"))  # merged, then removed
    finally:
        stop_lab(up, work)


@pytest.mark.parametrize("content", ["", "{not json", "[]", '{"processes": 3}',
                                     '{"processes": [{"pid": "x"}]}'],
                         ids=["empty", "corrupt", "list", "processes-int", "bad-record"])
@pytest.mark.parametrize("action", ["down", "load", "record"])
def test_a_state_file_that_is_not_a_labs_is_a_one_line_error(tmp_path, content, action,
                                                            capsys):
    (tmp_path / "state.json").write_text(content)
    code = main(["lab", action, "--dir", str(tmp_path), *_out(action, tmp_path)])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("relakit: error: ") and \
        str(tmp_path / "state.json") in lines[0], err
    assert (tmp_path / "state.json").read_text() == content  # left as it was
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]  # nothing written


@pytest.mark.parametrize("action", ["down", "load", "record"])
def test_a_missing_lab_folder_is_a_one_line_error(tmp_path, action, capsys):
    code = main(["lab", action, "--dir", str(tmp_path / "nowhere"), *_out(action, tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert "no running lab here" in err and "Traceback" not in err
    assert not (tmp_path / "nowhere").exists()


def _out(action: str, tmp_path: Path) -> list[str]:
    return ["--out", str(tmp_path / "rec")] if action == "record" else []


def test_down_leaves_a_reused_pid_alone(tmp_path):
    """Three `sleep`s stand in for recorded children: one whose start time differs from
    its record, one whose command line differs, one that matches exactly. Only the
    last is the lab's; only the last is stopped."""
    sleeps = [subprocess.Popen(["sleep", "60"], start_new_session=True) for _ in range(3)]
    try:
        # as the lab records its children: once the exec has mapped the new arguments
        ids = [procs.identity_after_exec(p.pid, ["sleep", "60"]) for p in sleeps]
        assert all(i is not None and i["cmdline"] == ["sleep", "60"] for i in ids), ids
        records = [
            {"name": "config", **ids[0], "start": ids[0]["start"] - 1},
            {"name": "instance0", **ids[1],
             "cmdline": [sys.executable, "-m", "relakit.lab.dataplane", "--port", "1"]},
            {"name": "prometheus", **ids[2]},
        ]
        state = {"config_url": "http://127.0.0.1:1", "prom_url": "", "instance_urls": [],
                 "token": "x", "clocks": {}, "owner": None, "processes": records}
        (tmp_path / "state.json").write_text(json.dumps(state))
        down = _cli("lab", "down", "--dir", str(tmp_path))
        assert down.returncode == 0, down.stderr
        assert sleeps[0].poll() is None and sleeps[1].poll() is None  # someone else's
        assert sleeps[2].wait(timeout=10) == -signal.SIGTERM  # the lab's: stopped
        assert f"left pid {sleeps[0].pid} alone" in down.stdout
        assert f"left pid {sleeps[1].pid} alone" in down.stdout
        assert f"stopped prometheus (pid {sleeps[2].pid})" in down.stdout
        assert not (tmp_path / "state.json").exists()
    finally:
        for p in sleeps:
            if p.poll() is None:
                p.kill()
            p.wait()
