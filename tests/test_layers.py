"""The rules of the house about who may import whom, checked on the source, transitively.

The graph has one node per module of relakit and an edge for every import written
anywhere in it (module level or inside a function: a deferred import is still a
dependency), plus the packages an import initialises on the way (``relakit.control.audit``
runs ``relakit/control/__init__.py`` first). No exception: an import inside a package's
PEP 562 ``__getattr__`` is an edge like any other.
"""

from __future__ import annotations

import ast
import subprocess
import sys

from conftest import ROOT

PKG = ROOT / "relakit"


def _module_name(path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in PKG.rglob("*.py")}


def _targets(name: str, imported: str) -> set[str]:
    """The modules an import of ``imported`` runs: it and its packages, minus the importer's
    own packages (already being initialised) and anything outside relakit."""
    parts = imported.split(".")
    out = {".".join(parts[:i]) for i in range(1, len(parts) + 1)}
    own = {".".join(name.split(".")[:i]) for i in range(1, len(name.split(".")) + 1)}
    return {m for m in out if m in MODULES and m not in own}


def _edges(name: str) -> set[str]:
    path = MODULES[name]
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from .x import y
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(up + ([node.module] if node.module else []))
            for alias in node.names:  # `from relakit.sim import kernel`: a submodule
                found |= _targets(name, f"{base}.{alias.name}")
            found |= _targets(name, base)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                found |= _targets(name, alias.name)
    return found


GRAPH = {m: _edges(m) for m in MODULES}


def _reach(start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for m in GRAPH[todo.pop()]:
            if m not in seen:
                seen.add(m)
                todo.append(m)
    return seen


def _layer(prefix: str) -> set[str]:
    return {m for m in MODULES if m == prefix or m.startswith(prefix + ".")}


def _reach_layer(prefix: str) -> set[str]:
    return set().union(*(_reach(m) for m in _layer(prefix)))


def test_the_graph_sees_deferred_imports():
    """The test itself: the old cycle went through imports inside functions."""
    assert "relakit.control.audit" in GRAPH["relakit.chain"]
    assert "relakit.chain" in GRAPH["relakit.openloop"]
    assert "relakit.sim.kernel" in GRAPH["relakit.sim.fleet"]


def test_no_import_cycles():
    for m in MODULES:
        assert m not in _reach(m), f"{m} imports itself through {sorted(_reach(m))}"


def test_the_data_plane_never_reaches_the_control_plane_or_the_chain():
    bad = {m for m in _reach_layer("relakit.sim") if m.startswith(
        ("relakit.control", "relakit.chain", "relakit.scenario", "relakit.experiment",
         "relakit.openloop", "relakit.lab"))}
    assert not bad


def test_the_control_plane_and_the_chain_never_reach_the_kernel():
    for layer in ("relakit.control", "relakit.chain"):
        bad = {m for m in _reach_layer(layer) if m.startswith((
            "relakit.sim", "relakit.scenario", "relakit.experiment", "relakit.checks",
            "relakit.openloop"))}
        assert not bad, layer
    # the control plane is below the chain: only the chain may use the control plane
    assert not {m for m in _reach_layer("relakit.control") if m.startswith("relakit.chain")}


def test_closed_forms_and_the_vocabulary_stand_alone_and_nothing_imports_the_command_line():
    assert _reach_layer("relakit.analytic") <= _layer("relakit.analytic")
    assert not _reach("relakit.vocab")
    for m in MODULES:
        if m not in ("relakit.cli", "relakit.__main__"):  # the command line's own entry points
            assert "relakit.cli" not in _reach(m), m


def test_importing_the_closed_forms_does_not_load_numba_or_the_kernel():
    code = ("import sys, relakit.analytic, relakit; relakit.__version__; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'numba' "
            "or m.startswith(('relakit.sim', 'relakit.control', 'polars'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]", out.stdout


def test_the_package_names_still_resolve_lazily():
    import relakit

    assert callable(relakit.simulate) and callable(relakit.replay)
    assert relakit.Fleet.__module__ == "relakit.sim.fleet"
    assert set(relakit.__all__) <= set(dir(relakit))


def test_importing_the_closed_forms_defers_scipy_and_package_metadata():
    # scipy.stats/optimize (~0.5 s) and importlib.metadata (~70 ms) load when first used,
    # so `import relakit.analytic` stays near numpy's own import time
    code = ("import sys, relakit.analytic; "
            "print(sorted(m for m in ('scipy.stats', 'scipy.optimize', 'importlib.metadata') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]", out.stdout
    from relakit.analytic import MMc, quorum_success

    assert 0.0 < quorum_success(0.9, 5, 3) < 1.0
    assert MMc(0.9 * 8, 1.0, 8).response_quantile(0.99) > 0


def _imports(name: str):
    """(line, module imported from, name) for every ``from ... import`` of relakit in a
    module, relative imports made absolute."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(up + ([node.module] if node.module else []))
            if base.split(".")[0] == "relakit":
                for alias in node.names:
                    yield node.lineno, base, alias.name


def _private(part: str) -> bool:
    return part.startswith("_") and not part.startswith("__")


def test_no_private_name_crosses_a_module():
    """A ``_name`` is its module's own: imported (or read as ``module._name``) from another
    module it is a public name in hiding. A private module (``traces/_schema.py``) is its
    package's own: only modules of that package import it."""
    found = []
    for name, path in MODULES.items():
        for line, base, imported in _imports(name):
            owner = base.rsplit(".", 1)[0] if _private(base.rsplit(".", 1)[-1]) else None
            if _private(imported) and base != name:
                found.append(f"{name}:{line} imports {imported} from {base}")
            elif owner is not None and not (name + ".").startswith(owner + "."):
                found.append(f"{name}:{line} imports the private module {base}")
        modules = {}  # names bound to a relakit module: `from relakit.control import promql`
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("relakit"):
                for a in node.names:
                    if f"{node.module}.{a.name}" in MODULES:
                        modules[a.asname or a.name] = f"{node.module}.{a.name}"
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name in MODULES and a.asname:
                        modules[a.asname] = a.name
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and _private(node.attr)
                    and isinstance(node.value, ast.Name) and node.value.id in modules
                    and modules[node.value.id] != name):
                found.append(f"{name}:{node.lineno} reads {modules[node.value.id]}."
                             f"{node.attr}")
    assert not found, "\n".join(found)


def test_only_plots_draws():
    """Every chart is built in relakit/plots.py (one theme, one palette); no other module
    of the package imports altair (notebooks may, to compose what plots gives)."""
    found = []
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(n.split(".")[0] == "altair" for n in names) and name != "relakit.plots":
                found.append(f"{name}:{node.lineno}")
    assert not found, found


def test_the_flat_api_verbs_are_functions_whichever_was_imported_first():
    """``relakit.calibrate``, ``relakit.search`` and ``relakit.replay`` are functions whose
    packages have other names (calibration, counterfactual, openloop): importing a package
    first cannot put a module in the function's place, and no module swaps its class."""
    for verb, package in (("calibrate", "calibration"), ("search", "counterfactual"),
                          ("replay", "openloop")):
        for first in ("import relakit", f"import relakit.{package}; import relakit"):
            code = (f"{first}; import types; f = relakit.{verb}; "
                    f"m = __import__('relakit.{package}', fromlist=['x']); "
                    f"assert isinstance(f, types.FunctionType), type(f); "
                    f"assert f is getattr(m, '{verb}') and type(m) is types.ModuleType; "
                    "print('ok')")
            out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                 cwd=ROOT)
            assert out.stdout.strip() == "ok", (first, out.stderr[-500:])
