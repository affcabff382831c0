"""The docs a successor reads stay short, complete and linked.

* README.md's "Map of the package" lists every module of relakit (every ``.py``; a
  package by its folder, which stands for its ``__init__.py``) and nothing that is not
  there, in an order that follows the import layers: a module added and not listed,
  or listed above what imports it, fails here.
* docs/design.md stays a page read in one sitting (≤ 700 lines), README.md ≤ 350.
* Measurements are dated by commit, never by a numbered session or round of work.
* Every relative link in README.md and docs/*.md reaches an existing file, and an
  ``#anchor`` a heading of that file.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import ROOT

README = ROOT / "README.md"
DOCS = ROOT / "docs"
PKG = ROOT / "relakit"

NAME = re.compile(r"^[\w.]+(/|\.py)$")


def map_block(text: str | None = None) -> str:
    text = README.read_text() if text is None else text
    section = re.search(r"^## Map of the package\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert section, "README.md has no '## Map of the package' section"
    block = re.search(r"^```text\n(.*?)^```", section.group(1), re.S | re.M)
    assert block, "the map is a ```text block under '## Map of the package'"
    return block.group(1)


def listed_modules(block: str) -> list[str]:
    """Paths relative to the repository, in map order, from an indented tree whose lines
    start with a name (``sim/``, ``kernel.py``; several may share a line, separated by
    commas) followed by two or more spaces and a description."""
    out: list[str] = []
    folders: list[str] = []  # the folder open at each depth
    for line in block.splitlines():
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip(" "))
        assert indent % 2 == 0, f"map: indent by two spaces: {line!r}"
        depth = indent // 2
        names = re.split(r"\s{2,}", line.strip(), maxsplit=1)[0]
        for name in (n.strip() for n in names.split(",")):
            assert NAME.match(name), f"map: not a module or package name: {name!r} in {line!r}"
            assert depth <= len(folders), f"map: {name!r} is indented under no folder"
            parent = "/".join(folders[:depth])
            path = f"{parent}/{name}" if parent else name
            if name.endswith("/"):
                del folders[depth:]
                folders.append(name.rstrip("/"))
                out.append(path + "__init__.py")
            else:
                out.append(path)
    return out


def actual_modules() -> set[str]:
    return {p.relative_to(ROOT).as_posix() for p in PKG.rglob("*.py")
            if "__pycache__" not in p.parts and "_aot" not in p.parts}


def test_the_map_lists_every_module_and_only_those():
    listed = listed_modules(map_block())
    assert len(listed) == len(set(listed)), "a module is listed twice"
    listed_set = set(listed)
    actual = actual_modules()
    missing, extra = sorted(actual - listed_set), sorted(listed_set - actual)
    assert not missing, f"modules missing from README.md's map: {missing}"
    assert not extra, f"README.md's map lists what is not there: {extra}"


def test_the_map_check_fails_on_a_module_it_does_not_list(tmp_path):
    """The test itself: a tree with one module left out is found wanting (checked by
    mutation too: a dummy relakit/sim/dummy.py fails the test above)."""
    block = map_block()
    listed = set(listed_modules(block))
    cut = "\n".join(line for line in block.splitlines()
                    if not line.strip().startswith("longtable.py"))
    assert listed - set(listed_modules(cut)) == {"relakit/sim/longtable.py"}
    # a package folder stands for its __init__.py
    assert "relakit/sim/__init__.py" in listed and "relakit/__init__.py" in listed


def _unit(module: str) -> str:
    """The top-level unit of a dotted module name: relakit.sim.kernel -> relakit.sim."""
    parts = module.split(".")
    return ".".join(parts[:2])


def test_the_map_order_follows_the_import_layers():
    """README says a module imports only from its own group and those below it."""
    from test_layers import GRAPH

    order: list[str] = []
    for path in listed_modules(map_block()):
        parts = Path(path).with_suffix("").parts
        parts = parts[:-1] if parts[-1] == "__init__" else parts
        unit = ".".join(parts[:2])
        if unit not in order:
            order.append(unit)
    rank = {u: i for i, u in enumerate(order)}
    upward = sorted({(_unit(m), _unit(e)) for m, edges in GRAPH.items() for e in edges
                     if _unit(m) != _unit(e) and rank[_unit(e)] < rank[_unit(m)]})
    assert not upward, f"README.md's map lists these importers below what they import: {upward}"


def test_line_budgets():
    design = (DOCS / "design.md").read_text().splitlines()
    readme = README.read_text().splitlines()
    assert len(design) <= 700, f"docs/design.md is {len(design)} lines (at most 700)"
    assert len(readme) <= 350, f"README.md is {len(readme)} lines (at most 350)"


ORDINALS = ("first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|"
            "twelfth|thirteenth|fourteenth|fifteenth|\\d+(?:st|nd|rd|th)")
DATING = [
    re.compile(r"\bsessions?\b", re.I),  # never a dating word here; a process group is a group
    re.compile(rf"\b(?:{ORDINALS}|this|that|last|next|previous|earlier|later|same)\s+rounds?\b",
               re.I),
    re.compile(r"\bround\s+(?:\d+|of work)\b", re.I),
]


@pytest.mark.parametrize("name", ["README.md", "docs/design.md", "docs/performance.md"])
def test_figures_are_dated_by_commit_not_by_session_or_round(name):
    text = (ROOT / name).read_text()
    found = [m.group(0) for pattern in DATING for m in pattern.finditer(text)]
    assert not found, f"{name} dates by session or round: {found}"


def test_the_dating_rule_catches_what_it_must():
    bad = ("the eleventh session's figures", "this round measured", "round 2", "in a later round")
    ok = ("3 rounds of 5 M requests", "a round trip", "round robin", "round(F x nodes)")
    assert all(any(p.search(t) for p in DATING) for t in bad)
    assert not any(p.search(t) for p in DATING for t in ok)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    out: set[str] = set()
    seen: dict[str, int] = {}
    in_code = False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        m = None if in_code else re.match(r"^#{1,6}\s+(.*)$", line)
        if m:
            slug = _slug(m.group(1))
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            out.add(slug if n == 0 else f"{slug}-{n}")
    return out


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
PAGES = [README, *sorted(DOCS.glob("*.md"))]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_resolve(page):
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    broken = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading with that anchor")
    assert not broken, f"{page.name}: {broken}"


def test_every_docs_page_is_reachable_from_the_readme():
    """A page nobody links to is a page nobody reads."""
    readme_links = {(README.parent / t.partition("#")[0]).resolve()
                    for t in LINK.findall(README.read_text()) if not re.match(r"^[a-z]+:", t)}
    orphans = [p.name for p in DOCS.glob("*.md") if p.resolve() not in readme_links]
    assert not orphans, f"docs pages the README does not link to: {orphans}"
