"""The plain loops compiled ahead of time: a plain run that never imports numba.

Why: a warm start (a fresh process loading the cached kernels: every test, sweep
worker, notebook kernel and CLI call) spent most of its time on numba itself, not
on relakit. Measured here (2-core VM, fresh processes, 3 runs): numpy 0.13 s,
polars 0.25 s, ``import numba`` 0.34 s, numba's CPU target set-up 0.54 s (its
lowering registries, and scipy.linalg, imported by ``numba.np.arraymath`` to look
for a BLAS), loading the cached loop 0.04 s, the run itself 0.01 s. numba's
``pycc`` compiles the two plain loops (:mod:`relakit.sim.plain`) into a CPython
extension module that needs no numba to load (numpy only): ``make setup`` builds
it (``tools/build_aot.py``) after warming numba's cache, and
:func:`relakit.sim.plain.loops` calls it when it is there. Everything else (the
general kernel, the helpers Python calls for varying rates and probes, the
controller's step) stays numba's and is compiled or loaded on first use, numba
imported then (:mod:`relakit.jit`).

Same code, same results: the module is compiled from the very functions numba
compiles (the plain loops' ``py_func``, their SIMPLE constant and digest-named
copies included), for the argument types numba gives them; only the loops'
compile flags are not applied (pycc has its own pipeline): not ``noalias``, and
division by zero is Python's error model rather than numpy's (the loops divide
only by validated positive quantities and constants). Built with both flags, and
for the host CPU, the loops ran no faster (A/B, 7 rounds: M/M/8 0.98-1.01x, 50
nodes 1.00-1.01x). ``tests/test_aot.py`` compares every output array of both on
several scenarios, bit for bit.

Never stale: the module's name carries a digest of every file its code comes from
(:data:`SOURCES`); an edit is a new name, so an old build is never loaded (and the
next build deletes it). A build writes into a temporary directory and moves the
finished file into place, so a half-written module is never on the path.
``RELAKIT_AOT=0`` switches it off (the numba loops run; ``bench_kernel.py``
measures a cold start so).

pycc has been "pending deprecation" since numba 0.57 (still here in 0.68, with no
replacement yet): without it, or without a C compiler, :func:`build` says so in
one line and runs keep numba's loops, as before; nothing else depends on it.
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
#: kernel inlines, the loops' own file, and how they are decorated and built
SOURCES = (*cachename.INLINED, "plain.py", "aot.py", "../jit.py")

_loaded: dict = {}  # digest -> module (or None: not built)
_LOCK = threading.Lock()


@functools.cache
def digest() -> str:
    """12 hex digits of a SHA-1 over :data:`SOURCES` (once a process: the code it
    stands for is loaded once)."""
    return cachename.digest(SOURCES)


def module_name(dig: str | None = None) -> str:
    return f"plain_{dig or digest()}"


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


def build(exports: dict, signature, force: bool = False) -> Path | None:
    """Compile ``exports`` (name: numba dispatcher, all of one ``signature``) into
    ``_aot/plain_<digest>``; a no-op when that file is there (unless ``force``).
    Returns its path, or None without pycc or a C compiler (the numba loops then
    run). ``tools/build_aot.py`` gives it the plain loops and their signature."""
    dig = digest()
    done = built_path(dig)
    if done is not None and not force:
        return done
    if shutil.which(os.environ.get("CC", "cc")) is None and shutil.which("gcc") is None:
        print("relakit: no C compiler (cc, gcc): the plain loops stay numba's (no AOT build)",
              file=sys.stderr)
        return None
    from relakit import jit

    jit.materialize()
    with warnings.catch_warnings():  # pycc is "pending deprecation" since numba 0.57 (above)
        warnings.simplefilter("ignore")
        try:
            from numba.pycc import CC
        except ImportError:
            print("relakit: this numba has no pycc: the plain loops stay numba's (no AOT build)",
                  file=sys.stderr)
            return None

    BUILD_DIR.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=BUILD_DIR, prefix=".build-") as tmp:
        cc = CC(module_name(dig))
        cc.output_dir = tmp
        cc.verbose = False
        for name, dispatcher in exports.items():
            cc.export(name, signature)(dispatcher.py_func)
        cc.compile()
        (out,) = Path(tmp).glob(f"{module_name(dig)}*")
        target = BUILD_DIR / out.name
        os.replace(out, target)
    for old in BUILD_DIR.glob("plain_*"):
        if old != target:
            old.unlink()
    return target
