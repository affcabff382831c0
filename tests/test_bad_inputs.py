"""The bad-inputs corpus: every mistake in tests/bad_inputs/cases.yaml, through the CLI.

Each case runs ``relakit.cli.main`` in-process, from the corpus folder, and must
end as the manifest says: an error (exit 2), a warning (exit 1 from ``check``, 0
from a run that goes on) or correct behaviour (exit 0, no warning); the message
is one ``relakit: error|warning: ...`` line naming the file and the key; and no
traceback, whatever went wrong.
"""

from __future__ import annotations

import pytest
import yaml
from conftest import ROOT

from relakit.cli import main

CORPUS = ROOT / "tests" / "bad_inputs"
CASES = yaml.safe_load((CORPUS / "cases.yaml").read_text())


def test_the_corpus_is_larger_than_the_issue_and_covers_every_kind():
    assert len(CASES) >= 110
    assert len({c["id"] for c in CASES}) == len(CASES)
    commands = {c["args"][0] for c in CASES}
    assert {"check", "simulate", "replay", "sweep", "lab", "figures"} <= commands
    folders = {a.split("/")[0] for c in CASES for a in c["args"] if "/" in a}
    assert {"scenarios", "policies", "chains", "clocks", "traces", "sweeps"} <= folders
    assert {c["expect"] for c in CASES} == {"error", "warning", "ok"}


def _exit_code(case) -> int:
    if "exit" in case:
        return case["exit"]
    if case["expect"] == "error":
        return 2
    if case["expect"] == "warning":
        return 1 if case["args"][0] == "check" else 0
    return 0


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_bad_input(case, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(CORPUS)
    args = [a.replace("{tmp}", str(tmp_path)) for a in case["args"]]
    code = main(args)
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    assert "internal error" not in err, err
    assert code == _exit_code(case), err
    lines = [line for line in err.splitlines() if line.strip()]
    assert all(line.startswith("relakit: ") for line in lines), err  # nothing else on stderr
    errors = [line for line in lines if line.startswith("relakit: error:")]
    warns = [line for line in lines if line.startswith("relakit: warning:")]
    if case["expect"] == "ok":
        assert not errors and not warns, err
    else:
        found = errors if case["expect"] == "error" else warns
        if case["expect"] == "warning":
            assert not errors, err
        assert found, err
        file, key = case.get("file"), case.get("key")
        # a YAML key is named as key 'K'; a command-line key (--seed, "argument --seed",
        # "required: scenario") as it is written
        literal = key is not None and (key.startswith("-") or " " in key)
        named = [line for line in found
                 if (file is None or file in line)
                 and (key is None or (key in line if literal else f"key '{key}'" in line))]
        assert named, f"no line names file {file!r} and key {key!r}:\n{err}"
    if case.get("stdout"):
        assert case["stdout"] in out, out
