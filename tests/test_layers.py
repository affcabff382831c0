"""The rules of the house about who may import whom, checked on the source."""

from __future__ import annotations

import ast

from conftest import ROOT

PKG = ROOT / "relakit"


def _imports(folder: str) -> set[str]:
    found = set()
    paths = [PKG / folder] if (PKG / folder).is_file() else (PKG / folder).rglob("*.py")
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                found.add(node.module)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
    return {m for m in found if m.startswith("relakit")}


def test_the_data_plane_never_imports_the_control_plane_or_the_chain():
    assert not {m for m in _imports("sim") if m.startswith(("relakit.control", "relakit.chain"))}


def test_the_control_plane_and_the_chain_never_import_the_kernel():
    for folder in ("control", "chain"):
        assert not {m for m in _imports(folder) if m.startswith("relakit.sim")}, folder


def test_closed_forms_stand_alone_and_nothing_imports_the_command_line():
    assert all(m.startswith("relakit.analytic") for m in _imports("analytic"))
    for path in PKG.rglob("*.py"):
        if path.name not in ("cli.py", "__main__.py"):  # the command line's own entry points
            assert "relakit.cli" not in path.read_text(), path
