"""Every fenced shell command and Python snippet of the documentation runs as written.

The commands are read from the Markdown files themselves (README.md,
notebooks/README.md and docs/*.md), not copied here, so an edit to a page is
what the test runs. Each fenced block runs in its own temporary copy of the
files a command reads (params/, data/, notebooks/; .venv linked), so the
commands of one block see each other's output, as a reader typing them would,
and nothing lands in the tree. A shell line runs with bash (so its ``# ...``
comment is a comment); it must exit 0, or the code its comment announces
("exits 1"). A Python block runs in a fresh interpreter and must not raise.

What does not run is listed in EXCLUDED (commands) and COVERED (sections another
test runs) with the reason, never dropped silently: a test fails when an entry
matches nothing (a stale entry). Covered: README.md, notebooks/README.md and every
docs/*.md page; YAML and text blocks are not commands.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT

PAGES = [ROOT / "README.md", ROOT / "notebooks" / "README.md",
         *sorted((ROOT / "docs").glob("*.md"))]
COPIED = ("params", "data", "notebooks")

#: (a piece of the command, why it does not run here)
EXCLUDED = (
    ("make run", "builds the environment (make setup) before running notebook 04; notebook 04 "
                 "runs in make test's nbval pass, and its papermill form is notebooks/README's "
                 "example, which runs here"),
    ("make test", "make test runs this test: it would run itself"),
    ("relakit lab ", "starts servers; tests/test_lab*.py start, check and stop the lab"),
    ("wrk ", "needs a running lab's front; tests/test_lab_front.py runs this very line (its "
             "port, connections, duration and tier changed) against one"),
    ("--scheduler tcp://", "needs a Dask scheduler listening; tests/test_sweep.py runs a "
                           "sweep on a local Dask cluster"),
    ("--seed SEED", "a pattern with a seed the reader supplies"),
)


#: (page, section) whose blocks another test runs, and which
COVERED = {("README.md", "Quick use"): "tests/test_readme.py runs README's Quick use and checks "
                                       "what each command prints and writes"}


def _blocks(page: Path) -> list[tuple[str, int, str, str]]:
    """(language, line, text, section heading) of each fenced sh/python block of a page."""
    text = page.read_text()
    out = []
    for m in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.S | re.M):
        if m.group(1) in ("sh", "python"):
            heads = re.findall(r"^#+ (.+)$", text[:m.start()], re.M)
            out.append((m.group(1), text.count("\n", 0, m.start()) + 1, m.group(2),
                        heads[-1].strip() if heads else ""))
    return out


def _commands(block: str) -> list[str]:
    """The shell lines of a block, continuation lines joined; comment-only lines dropped."""
    lines = block.replace("\\\n", " ").splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.strip().startswith("#")]


def _excluded(text: str) -> str | None:
    return next((why for piece, why in EXCLUDED if piece in text), None)


def _cases():
    for page in PAGES:
        for lang, line, block, section in _blocks(page):
            why = COVERED.get((str(page.relative_to(ROOT)), section))
            marks = [pytest.mark.skip(reason=why)] if why else []
            yield pytest.param(page, lang, block, id=f"{page.relative_to(ROOT)}:{line}",
                               marks=marks)


CASES = list(_cases())


def _sandbox(tmp_path: Path) -> Path:
    for name in COPIED:
        shutil.copytree(ROOT / name, tmp_path / name,
                        ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
    (tmp_path / ".venv").symlink_to(ROOT / ".venv")
    return tmp_path


def _env() -> dict:
    env = dict(os.environ)
    env.setdefault("NUMBA_CACHE_DIR", str(ROOT / ".numba_cache"))
    env["PYTHONPATH"] = str(ROOT)
    return env


def test_the_pages_hold_commands_and_every_exclusion_matches_one():
    assert len(CASES) >= 10, [c.id for c in CASES]
    texts = [block for page in PAGES for _, _, block, _ in _blocks(page)]
    sections = {(str(page.relative_to(ROOT)), head) for page in PAGES
                for _, _, _, head in _blocks(page)}
    assert set(COVERED) <= sections, set(COVERED) - sections
    for piece, _ in EXCLUDED:
        assert any(piece in t for t in texts), f"stale exclusion: {piece!r} is in no page"


@pytest.mark.parametrize(("page", "lang", "block"), CASES)
def test_a_documented_block_runs(page, lang, block, tmp_path):
    box = _sandbox(tmp_path)
    timings = []
    if lang == "python":
        if _excluded(block):
            pytest.skip(_excluded(block))
        t0 = time.perf_counter()
        done = subprocess.run([sys.executable, "-c", block], cwd=box, env=_env(),
                              capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, f"{page.name}:\n{block}\n{done.stderr[-3000:]}"
        timings.append((block.splitlines()[0], time.perf_counter() - t0))
    else:
        ran = 0
        for cmd in _commands(block):
            if _excluded(cmd):
                continue  # said why in EXCLUDED; the block's other lines still run
            want = re.search(r"#.*\bexits (\d)\b", cmd)
            t0 = time.perf_counter()
            done = subprocess.run(["bash", "-c", cmd], cwd=box, env=_env(),
                                  capture_output=True, text=True, timeout=900)
            code = int(want.group(1)) if want else 0
            assert done.returncode == code, (
                f"{page.name}: `{cmd}` exited {done.returncode}, not {code}:\n"
                f"{done.stderr[-3000:]}")
            ran += 1
            timings.append((cmd[:70], time.perf_counter() - t0))
        if not ran:
            pytest.skip(f"every line excluded: {[_excluded(c) for c in _commands(block)]}")
    for what, s in timings:
        print(f"{s:7.1f} s  {what}")
