"""The plain and lean mitigated specialisations compiled ahead of time: no numba needed.

Why: a warm start (every test, sweep worker, notebook kernel and CLI call) spent most of
its time on importing and setting up numba, not on relakit (docs/performance.md, "Warm
start and imports"). numba's ``pycc`` compiles the two plain and two lean mitigated
specialisations of ``kernel.advance`` (:mod:`relakit.sim.loops`) into a CPython extension
that needs numpy only: ``make setup`` builds it (``tools/build_aot.py``) after warming
numba's cache, and ``loops.plain_loops`` and ``loops.mitigated_loops`` call it when it is
there; everything else stays numba's, compiled or loaded on first use (:mod:`relakit.jit`).

Same code, same results: compiled from the very functions numba compiles (the loops'
``py_func`` with their constants), for the argument types numba gives them, with numba's
flags for them (``noalias``, numpy's error model: :func:`_loop_flags`);
``tests/test_aot.py`` compares every output array of both, bit for bit.

Never stale: the module's name carries a digest of every file its code comes from
(:data:`SOURCES`), and a build is written to a temporary directory and moved into place.
``RELAKIT_AOT=0`` switches it off. pycc is "pending deprecation" since numba 0.57 (still
in 0.68, no replacement yet): without it, or without a C compiler, :func:`build` says so in
one line and runs keep numba's loops.
"""

from __future__ import annotations

import functools
import importlib.machinery
import importlib.util
import os
import shutil
import sys
import tempfile
import threading
import warnings
from pathlib import Path

from relakit.sim import cachename

HERE = Path(__file__).parent
#: where builds live (one per digest; not in git)
BUILD_DIR = HERE / "_aot"
#: the files the compiled loops' code comes from (relative to relakit/sim): what every
#: kernel inlines, the loops' own files, and how they are decorated and built
SOURCES = (*cachename.INLINED, "loops.py", "aot.py", "../jit.py")
#: the prefixes of a build's file name, this one's first (older builds were "plain_")
PREFIXES = ("loops_", "plain_")

_loaded: dict = {}  # digest -> module (or None: not built)
_LOCK = threading.Lock()


@functools.cache
def digest() -> str:
    """12 hex digits of a SHA-1 over :data:`SOURCES` (once a process: the code it
    stands for is loaded once)."""
    return cachename.digest(SOURCES)


def module_name(dig: str | None = None) -> str:
    return f"{PREFIXES[0]}{dig or digest()}"


_SWITCH = {"1": True, "on": True, "true": True, "yes": True,
           "0": False, "off": False, "false": False, "no": False}


def enabled() -> bool:
    """``RELAKIT_AOT``: unset or 1 (on, true, yes) uses a build; 0 (off, false, no) does
    not; anything else is an error (a typo must not silently measure the wrong loops)."""
    value = os.environ.get("RELAKIT_AOT", "1")
    switch = _SWITCH.get(value.strip().lower())
    if switch is None:
        raise ValueError(f"environment variable RELAKIT_AOT={value!r}: must be 1 or 0 "
                         "(on/off, true/false, yes/no)")
    return switch


def built_path(dig: str | None = None) -> Path | None:
    """The extension module built for these sources, if on disk."""
    name = module_name(dig)
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        p = BUILD_DIR / f"{name}{suffix}"
        if p.is_file():
            return p
    return None


def load():
    """The module built for the current sources, imported once a process; None when it
    is switched off or not built (then the numba loops run)."""
    if not enabled():
        return None
    dig = digest()
    with _LOCK:  # (threads of one worker: an extension module is initialised once)
        if dig not in _loaded:
            path = built_path(dig)
            module = None
            if path is not None:
                spec = importlib.util.spec_from_file_location(module_name(dig), path)
                module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
            _loaded[dig] = module
        return _loaded[dig]


def build(exports: dict, force: bool = False) -> Path | None:
    """Compile ``exports`` (name: (numba dispatcher, signature)) into
    ``_aot/loops_<digest>``; a no-op when that file is there (unless ``force``).
    Returns its path, or None without pycc or a C compiler (the numba loops then
    run). ``tools/build_aot.py`` gives it the loops and their signatures."""
    dig = digest()
    done = built_path(dig)
    if done is not None and not force:
        return done
    if shutil.which(os.environ.get("CC", "cc")) is None and shutil.which("gcc") is None:
        print("relakit: no C compiler (cc, gcc): the loops stay numba's (no AOT build)",
              file=sys.stderr)
        return None
    from relakit import jit

    jit.materialize()
    with warnings.catch_warnings():  # pycc is "pending deprecation" since numba 0.57 (above)
        warnings.simplefilter("ignore")
        try:
            from numba.pycc import CC
            from numba.pycc import compiler as pycc_compiler
        except ImportError:
            print("relakit: this numba has no pycc: the loops stay numba's (no AOT build)",
                  file=sys.stderr)
            return None

    BUILD_DIR.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=BUILD_DIR, prefix=".build-") as tmp:
        cc = CC(module_name(dig))
        cc.output_dir = tmp
        cc.verbose = False
        for name, (dispatcher, signature) in exports.items():
            cc.export(name, signature)(dispatcher.py_func)
        with _loop_flags(pycc_compiler):
            cc.compile()
        (out,) = Path(tmp).glob(f"{module_name(dig)}*")
        target = BUILD_DIR / out.name
        os.replace(out, target)
    for prefix in PREFIXES:
        for old in BUILD_DIR.glob(f"{prefix}*"):
            if old != target:
                old.unlink()
    return target


class _loop_flags:
    """pycc compiling with the loops' numba flags: ``noalias`` (every array argument's
    data marked noalias for LLVM; relakit.sim.fleet's pools say why that holds) and numpy's
    error model. pycc makes its own ``Flags()`` inside ``compile()`` and takes no
    options, so its module's ``Flags`` is swapped for the call's duration; a numba
    whose pycc differs keeps its defaults (slower, the same numbers)."""

    def __init__(self, module):
        self.module = module
        self.original = getattr(module, "Flags", None)

    def __enter__(self):
        original = self.original
        if original is None:
            return self

        class LoopFlags(original):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, **kwargs)
                self.noalias = True
                self.error_model = "numpy"

        self.module.Flags = LoopFlags
        return self

    def __exit__(self, *exc):
        if self.original is not None:
            self.module.Flags = self.original
        return False
