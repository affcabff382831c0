"""One output convention across every ``relakit`` command (relakit.cli.OUT_HELP).

``--out DIR`` is the folder a command writes into: its metavar is DIR, its help starts
with "folder to write into:" and names the files, and ends with its default (or
"required"). No command names its output otherwise (``--output``, ``--out-dir``, a
positional, a second folder option): the walk below goes through every parser and
sub-parser, so a command added later is held to it too. The spellings that came before
(``--out FILE``, calibrate's ``--report DIR``, simulate's ``--figure FILE``) still work
with a warning until relakit 0.2, and their files are written whole.
"""

from __future__ import annotations

import argparse
import re
import warnings
from pathlib import Path

import pytest
from conftest import ROOT

from relakit import cli
from relakit.cli import OUT_HELP, build_parser, main

#: commands that write files, and those that write nothing (check) or write into the
#: lab's own folder (--dir: the lab they act on, given to every lab action)
WRITERS = {"simulate", "compare", "replay", "import-rules", "sweep", "search", "figures",
           "calibrate", "lab record"}
OUTPUT_WORDS = re.compile(r"out|output|dest|report|write|save|folder|dir", re.I)
#: options whose name says output but which are not a place to write: what they are
NOT_A_PLACE = {("lab up", "--dir"), ("lab load", "--dir"), ("lab record", "--dir"),
               ("lab down", "--dir"),  # the lab acted on (its state.json), not an output
               ("lab up", "--routing"),  # how the front picks an instance ("rOUTing")
               ("calibrate", "--report"),  # a switch; a DIR after it is deprecated
               ("simulate", "--figure")}  # a format; the figure goes into --out


def _commands(parser: argparse.ArgumentParser, prefix: str = ""):
    """(name, parser) for every leaf command, lab's actions included."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield prefix.strip(), parser
    for action in subs:
        for name, sub in action.choices.items():
            yield from _commands(sub, f"{prefix} {name}")


COMMANDS = dict(_commands(build_parser()))


def test_the_walk_sees_every_command():
    assert WRITERS | {"check"} | {"lab up", "lab load", "lab down"} == set(COMMANDS)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_output_option_follows_the_convention(name):
    parser = COMMANDS[name]
    outs = [a for a in parser._actions if "--out" in a.option_strings]
    assert len(outs) == (name in WRITERS), f"{name}: --out {'missing' if not outs else 'extra'}"
    for a in outs:
        assert a.option_strings == ["--out"] and a.dest == "out", a.option_strings
        assert a.metavar == "DIR" and a.nargs is None, (name, a.metavar)
        assert a.help.startswith(OUT_HELP) and len(a.help) > len(OUT_HELP) + 5, a.help
        shown = parser.formatter_class("x")._get_help_string(a)
        assert shown.endswith(")") and ("(default" in shown or "(required)" in shown), shown
    for a in parser._actions:
        if a.dest in ("help", "out") or not a.option_strings and a.dest in ("command",
                                                                              "action"):
            continue
        names = a.option_strings or [a.dest]
        if any(OUTPUT_WORDS.search(n) for n in names) or (
                a.help and re.search(r"\b(write|output) (to|folder|file)\b", a.help)):
            assert (name, names[0]) in NOT_A_PLACE, f"{name} {names}: an output named " \
                "other than --out DIR"


def test_every_default_output_folder_is_a_folder():
    """A default that names a file (out/lab/recorded.json, as record had) is not a folder."""
    for name, parser in COMMANDS.items():
        for a in parser._actions:
            if a.dest == "out" and isinstance(a.default, str):
                assert not Path(a.default).suffix, (name, a.default)


def _fake_calibrate(monkeypatch):
    """calibrate's fit replaced by a fixed twin: this test is about where files go."""
    import relakit.calibration as cal_mod

    class Cal:
        yaml = "name: twin\n"
        cautions: list = []

    monkeypatch.setattr(cal_mod, "calibrate", lambda *a, **k: Cal())


def test_calibrate_writes_twin_yaml_into_out(tmp_path, monkeypatch, capsys):
    _fake_calibrate(monkeypatch)
    out = tmp_path / "new" / "twin-folder"
    assert main(["calibrate", str(ROOT / "data" / "lab" / "recorded.json"), "--out",
                 str(out)]) == 0
    captured = capsys.readouterr()
    assert sorted(p.name for p in out.iterdir()) == ["twin.yaml"]  # no temporary left
    assert f"wrote {out / 'twin.yaml'}" in captured.out and not captured.err


@pytest.mark.parametrize("command,name,suffix", [
    (["calibrate", str(ROOT / "data" / "lab" / "recorded.json")], "twin.yaml", ".yaml"),
    (["import-rules", str(ROOT / "params" / "rules" / "slo.yml"), "--mapping",
      str(ROOT / "params" / "rules" / "slo-mapping.yml")], "policy.yaml", ".yaml")])
def test_the_old_out_file_spelling_warns_and_still_writes_the_file(
        command, name, suffix, tmp_path, monkeypatch, capsys):
    _fake_calibrate(monkeypatch)
    old = tmp_path / f"mine{suffix}"
    assert main([*command, "--out", str(old)]) == 0
    err = capsys.readouterr().err
    assert old.is_file() and not (tmp_path / name).exists()
    lines = err.strip().splitlines()
    assert any(line.startswith("relakit: warning: --out ") and "deprecated" in line
               and f"relakit {cli.OUT_FILE_UNTIL}" in line and f"--out {tmp_path}" in line
               for line in lines), err
    new = tmp_path / "folder"
    assert main([*command, "--out", str(new)]) == 0
    assert "deprecated" not in capsys.readouterr().err
    assert (new / name).is_file()


def test_import_rules_writes_policy_and_clocks_into_out(tmp_path, capsys):
    out = tmp_path / "slo"
    assert main(["import-rules", str(ROOT / "params" / "rules" / "slo.yml"), "--mapping",
                 str(ROOT / "params" / "rules" / "slo-mapping.yml"), "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["clocks.yaml", "policy.yaml"]
    stdout = capsys.readouterr().out
    assert f"wrote {out / 'policy.yaml'}" in stdout
    assert f"wrote {out / 'clocks.yaml'}" in stdout
    from relakit.control import load_clocks, load_policy

    load_policy(out / "policy.yaml")  # what was written loads
    load_clocks(out / "clocks.yaml")


def test_an_out_that_is_a_file_is_refused_before_any_work(tmp_path, capsys):
    taken = tmp_path / "taken"
    taken.write_text("x")
    assert main(["import-rules", str(ROOT / "params" / "rules" / "slo.yml"), "--mapping",
                 str(ROOT / "params" / "rules" / "slo-mapping.yml"), "--out",
                 str(taken / "sub")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("relakit: error: --out ") and "is a file, not a folder" in err
    assert taken.read_text() == "x"


def test_lab_record_defaults_to_the_labs_folder():
    rec = COMMANDS["lab record"]
    out = next(a for a in rec._actions if a.dest == "out")
    assert out.default is None and "the lab's --dir" in out.help
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a folder is the convention: no warning
        assert cli._out_file(ROOT, "recorded.json", (".json",)) == ROOT / "recorded.json"
