"""The lab's processes as recorded on disk, so a lab whose owner died can be stopped.

A pid alone names a process only while it lives: once it exits, the kernel may
give the number to anyone. So each child is recorded with its pid, its process
group, its start time (field 22 of ``/proc/PID/stat``, clock ticks since boot)
and its command line; a process is *ours* only while all of those still match,
and nothing else is ever signalled. Linux only (``/proc``); elsewhere nothing
can be verified and nothing is signalled.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path


def identity(pid: int) -> dict | None:
    """{pid, pgid, start, cmdline} of a live process, or None (gone, or a zombie)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # the command name (field 2) is in parentheses and may hold spaces: split after it
    fields = stat[stat.rindex(")") + 2:].split()
    if fields[0] in ("Z", "X"):  # exited, not yet reaped: holds no port, runs nothing
        return None
    return {"pid": pid, "pgid": int(fields[2]), "start": int(fields[19]),
            "cmdline": [a.decode(errors="replace") for a in cmdline.split(b"\0")[:-1]]}


def identity_after_exec(pid: int, args: list[str], timeout_s: float = 5.0) -> dict | None:
    """The identity of a process just started by :class:`subprocess.Popen` with ``args``.

    Popen returns once the exec is past the point of no return, which can be
    before the new program's arguments are mapped: ``/proc/PID/cmdline`` then
    reads empty for a few milliseconds (seen here with Prometheus and Python; a
    record taken then would never match, and `down` would leave the process
    running). Wait until it reads ``args``; after ``timeout_s``, take what is there."""
    deadline = time.monotonic() + timeout_s
    while True:
        ident = identity(pid)
        if ident is None or ident["cmdline"] == list(args) or time.monotonic() > deadline:
            return ident
        time.sleep(0.005)


def is_same(record: dict) -> bool:
    """Whether the recorded process is still alive and still the same process."""
    now = identity(int(record["pid"]))
    return (now is not None and now["start"] == record["start"]
            and now["cmdline"] == record["cmdline"])


def _signal(record: dict, sig: int) -> None:
    """Signal a verified process; its whole group when it still leads the group it was
    started in (each child is started in a session of its own)."""
    if not is_same(record):
        return
    now = identity(int(record["pid"]))
    try:
        if now and now["pgid"] == record.get("pgid") == record["pid"]:
            os.killpg(record["pid"], sig)
        else:
            os.kill(record["pid"], sig)
    except ProcessLookupError:
        pass


def stop(records: list[dict], timeout_s: float = 10.0) -> tuple[list[dict], list[dict]]:
    """SIGTERM every recorded process that is still ours, wait up to ``timeout_s``,
    then SIGKILL what is left. Returns (stopped, left alone): a record whose pid is
    now someone else's (another start time or command line) is never signalled."""
    ours = [r for r in records if is_same(r)]
    alien = [r for r in records if identity(int(r["pid"])) is not None and r not in ours]
    for r in ours:
        _signal(r, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(is_same(r) for r in ours):
        time.sleep(0.05)
    for r in ours:
        _signal(r, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline and any(is_same(r) for r in ours):
        time.sleep(0.05)
    return ours, alien


__all__ = ["identity", "identity_after_exec", "is_same", "stop"]
