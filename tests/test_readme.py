"""Examples are tests: every command and snippet in README.md's "Quick use" runs here.

Each runs in a fresh temporary folder that holds only links to the project's
``params/`` and ``data/``, so what it writes (``out/...``) lands there and
nothing in the checkout is touched; ``.venv/bin/`` means the environment
running the tests. Besides exiting 0, each must print and write what the
README says it does: a number at the end of a ``print(...)`` line's comment
(``# Erlang C p99 (s): 0.0709``) must appear in the output, a simulation its
summary, a replay its time in each mode, and every ``--out`` folder its files.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import ROOT

README = ROOT / "README.md"
BIN = Path(sys.executable).parent


def quick_use_blocks() -> list[tuple[str, str]]:
    """(language, text) of the fenced sh and python blocks under '## Quick use'."""
    text = README.read_text()
    section = re.search(r"^## Quick use\n(.*?)(?=^## )", text, re.S | re.M)
    assert section, "README.md has no '## Quick use' section"
    return re.findall(r"^```(sh|python)\n(.*?)^```", section.group(1), re.S | re.M)


def commands(block: str) -> list[str]:
    """The block's shell commands, one a line, comments dropped."""
    out = []
    for line in block.splitlines():
        words = shlex.split(line, comments=True)
        if words:
            out.append(words)
    return out


@pytest.fixture
def fresh(tmp_path) -> Path:
    for name in ("params", "data"):
        (tmp_path / name).symlink_to(ROOT / name, target_is_directory=True)
    return tmp_path


def _run(argv, cwd) -> subprocess.CompletedProcess:
    if argv[0].startswith(".venv/bin/"):
        argv = [str(BIN / argv[0].removeprefix(".venv/bin/")), *argv[1:]]
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=600)


def _check_command(words: list[str], run: subprocess.CompletedProcess, cwd: Path) -> None:
    shown = " ".join(words)
    assert run.returncode == 0, f"{shown}\n{run.stdout}\n{run.stderr}"
    assert run.stderr == "", f"{shown}: stderr is not a terminal, yet got {run.stderr!r}"
    out_dir = Path(words[words.index("--out") + 1]) if "--out" in words else None
    if words[1] == "simulate":
        scenario = yaml.safe_load((cwd / words[2]).read_text())
        name = scenario["name"]
        assert f"scenario {name}" in run.stdout, shown
        assert re.search(r"^all +\d+ +\d\.\d{4} ", run.stdout, re.M), shown  # the summary
        folder = cwd / (out_dir or Path("out") / name)
        assert (folder / "summary.json").is_file(), shown
        assert ("--no-requests" in words) != (folder / "requests.parquet").is_file(), shown
        if scenario.get("policy"):
            assert "time in each mode: normal" in run.stdout, shown
    elif words[1] == "replay":
        assert "time in each mode: normal" in run.stdout, shown
        assert (cwd / out_dir / "decisions.parquet").is_file(), shown
    for line in run.stdout.splitlines():
        if line.startswith("wrote "):
            assert (cwd / line.removeprefix("wrote ")).exists(), line


def test_quick_use_runs_as_written(fresh):
    blocks = quick_use_blocks()
    assert any(lang == "sh" for lang, _ in blocks) and any(lang == "python" for lang, _ in blocks)
    t0 = time.perf_counter()
    ran = 0
    for lang, block in blocks:
        if lang == "sh":
            for words in commands(block):
                assert words[0] == ".venv/bin/relakit", f"not a relakit command: {words}"
                _check_command(words, _run(words, fresh), fresh)
                ran += 1
        else:
            run = _run([sys.executable, "-c", block], fresh)
            assert run.returncode == 0, f"{block}\n{run.stdout}\n{run.stderr}"
            claims = re.findall(r"^print\(.*#.*:\s*([-+]?\d[\d.]*)\s*\S*$", block, re.M)
            for number in claims:
                assert number in run.stdout, f"README claims {number}; printed:\n{run.stdout}"
            ran += 1
    assert ran >= 4
    # the section is meant to be tried by hand: keep it quick (generous for a busy machine)
    assert time.perf_counter() - t0 < 120


def test_the_readme_claims_are_found():
    """The parser really sees the Erlang C claim (a test that finds nothing proves nothing)."""
    python = [b for lang, b in quick_use_blocks() if lang == "python"]
    claims = [n for b in python
              for n in re.findall(r"^print\(.*#.*:\s*([-+]?\d[\d.]*)\s*\S*$", b, re.M)]
    assert "0.0709" in claims


def test_the_picture_and_quick_use_claims_match_their_scenarios():
    """The numbers README.md states about its picture and its first command are the
    scenarios' own: the ramp's load against the fleet's capacity, when it ramps, how
    long a run the flagship notebook draws, and the faults fleet's shape."""
    import json

    import relakit

    text = README.read_text()
    caption = re.search(r"^\*What `make run` draws.*?\*$", text, re.S | re.M)
    assert caption, "README.md's picture has no caption starting 'What `make run` draws'"
    caption = " ".join(caption.group(0).split())
    ramp = relakit.load_scenario(ROOT / "params/scenarios/rela-ramp.yaml")
    rates, times = ramp.workload.arrival.rates_rps, ramp.workload.arrival.times_s
    low, high = (round(100 * r / ramp.fleet.capacity_rps, -1) for r in (min(rates), max(rates)))
    assert f"ramps from {low:.0f} % to {high:.0f} % of the fleet's capacity" in caption, caption
    first_top = rates.index(max(rates))
    # the ramp starts where the rate last sits at its floor before the top
    start = times[max(i for i in range(first_top) if rates[i] == min(rates))]
    top = times[first_top]
    assert f"({start:.0f}–{top:.0f} s)" in caption, caption
    notebook = json.loads((ROOT / "notebooks/04_policy.ipynb").read_text())
    params = next("".join(c["source"]) for c in notebook["cells"]
                  if "parameters" in c.get("metadata", {}).get("tags", []))
    shown = float(re.search(r"^ramp_duration_s: float = ([\d.]+)", params, re.M).group(1))
    assert f"over the first {shown:.0f} s of" in caption, caption
    assert "figures/04_rela_ramp.png" in caption and "04_rela_ramp" in "".join(
        "".join(c["source"]) for c in notebook["cells"])

    faults = relakit.load_scenario(ROOT / "params/scenarios/fleet-faults.yaml")
    words = {1: "one", 2: "two", 3: "three", 4: "four", 5: "five"}
    claim = (f"# {faults.fleet.nodes} nodes, fan-out {faults.workload.fanout}, "
             f"{words[len(faults.faults)]} faults")
    assert claim in text, claim
