"""What nbval checks beyond "no cell raises" (``make test``: ``pytest --nbval-lax notebooks``).

A reader of an executed notebook must not see a warning pointing into a source
file (``.../relakit/sim/fleet.py:212: UserWarning``: relakit's warnings name the
reader's input instead) nor an absolute path of the machine that ran it (a
checkout, a temporary folder). Each cell's outputs as nbval received them are
searched, charts' and tables' HTML included; a hit fails that cell, quoting the
line.
"""

from __future__ import annotations

import re

import pytest

#: a warning's location in a source file, and an absolute path of this machine
LEAKS = (
    ("a warning pointing into a source file", re.compile(r"[\w./-]+\.py:\d+: \w*Warning")),
    ("an absolute path", re.compile(r"(?<![\w.:/])/(?:work|tmp|root|home|usr|opt|var)/[\w.+-]+")),
)


def leaks(outputs) -> list[str]:
    """Each leak in a cell's outputs (nbformat output dicts), as 'what: the line'."""
    texts = []
    for out in outputs or []:
        if "text" in out:
            texts.append("".join(out["text"]))
        for mime in ("text/plain", "text/html", "text/markdown"):
            data = out.get("data", {}).get(mime)
            if data:
                texts.append("".join(data))
        if out.get("output_type") == "error":
            texts.append("\n".join(out.get("traceback", [])))
    found = []
    for text in texts:
        for line in text.splitlines():
            for what, pattern in LEAKS:
                if pattern.search(line):
                    found.append(f"{what}: {line.strip()[:200]}")
    return found


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if call.when != "call" or not report.passed or getattr(item, "test_outputs", None) is None:
        return
    found = leaks(item.test_outputs)
    if found:
        report.outcome = "failed"
        report.longrepr = ("the cell's output shows what a reader must not see:\n  "
                           + "\n  ".join(found))
