"""numba's decorators, applied only once numba is needed.

Why: in a fresh process numba costs more than a warm plain run itself. Measured
here (2-core VM, fresh processes): ``import numba`` 0.33-0.35 s, and its CPU
target's set-up on the first call of any compiled function 0.54 s (numba's
lowering registries, and scipy.linalg, which ``numba.np.arraymath`` imports to
look for a BLAS), against 0.04 s to load the cached plain loop and 0.01 s to
run a 1 s scenario. A plain run whose loops were compiled ahead of time
(:mod:`relakit.sim.aot`) needs no numba at all. So the modules that define
kernels decorate through this one: :func:`njit` and :func:`intrinsic` return a
stand-in (:class:`Deferred`), :func:`register_jitable` returns the function as
numba's does, and each records what it was asked. The first time numba is
needed (a stand-in called, one of its attributes read, or :func:`materialize`),
numba is imported, every recorded decoration is applied in the order made, and
every global still naming a stand-in, in relakit's modules and in the copied
namespaces of :func:`relakit.sim.cachename.digest_named`, is rebound to the real
dispatcher, so that numba, compiling a caller, sees real ones. After that the
decorators are numba's own.

Loading numba also points it at the cache ``make setup`` filled (:func:`use_shared_cache`),
unless ``NUMBA_CACHE_DIR`` says otherwise: the README's commands run outside make.
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

_RECORDS: list = []  # ("jitable", fn, options, None) or ("deferred", fn, make, stand-in)
_LOCK = threading.RLock()
_loaded = False
# the cache `make setup` fills with every kernel a run uses (the Makefile's NUMBA_CACHE_DIR)
SHARED_CACHE = Path(__file__).resolve().parents[1] / ".numba_cache"


class Deferred:
    """A numba dispatcher (or intrinsic) not made yet: calling it, or reading any
    attribute numba's object has (``py_func``, ``signatures``...), makes it."""

    def __init__(self, fn):
        self.__wrapped__ = fn
        self._real = None  # set by materialize()
        for name in ("__name__", "__qualname__", "__doc__", "__module__"):
            setattr(self, name, getattr(fn, name, None))

    def real(self):
        if self._real is None:
            materialize()
        return self._real

    def __call__(self, *args, **kwargs):
        return self.real()(*args, **kwargs)

    @property
    def _numba_type_(self):
        """numba's type of the real object: a stand-in a module kept from before
        :func:`materialize` (``from relakit.sim.kernel import x`` outside relakit)
        still compiles into a caller."""
        from numba import typeof

        return typeof(self.real())

    def __getattr__(self, name):  # only for names this object lacks
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.real(), name)

    def __repr__(self) -> str:
        return f"<deferred numba function {self.__qualname__}>"


def _noalias_compiler():
    """numba's compiler with its ``noalias`` flag set (the settled and lean loops':
    kernel.specialised says what it gains, relakit.sim.fleet why it holds)."""
    from numba.core.compiler import Compiler

    class NoAliasCompiler(Compiler):
        def define_pipelines(self):
            self.state.flags.noalias = True
            return super().define_pipelines()

    return NoAliasCompiler


_NOALIAS = None


def _numba_options(options: dict) -> dict:
    """``noalias=True`` (ours) as numba's ``pipeline_class``; the rest as given."""
    global _NOALIAS
    options = dict(options)
    if options.pop("noalias", False):
        if _NOALIAS is None:
            _NOALIAS = _noalias_compiler()
        options["pipeline_class"] = _NOALIAS
    return options


def njit(fn=None, **options):
    """numba.njit, as ``@njit``, ``@njit(**options)`` or ``njit(**options)(fn)``; one
    more option, ``noalias=True`` (see :func:`_noalias_compiler`)."""
    if fn is None:
        return lambda f: njit(f, **options)

    def make():
        import numba

        return numba.njit(**_numba_options(options))(fn)

    return _defer(fn, make)


def intrinsic(fn):
    """numba.extending.intrinsic, deferred like :func:`njit`."""

    def make():
        from numba.extending import intrinsic as real

        return real(fn)

    return _defer(fn, make)


def register_jitable(**options):
    """numba.extending.register_jitable: the function itself comes back (numba finds it
    by identity when compiling a caller), registered now or when numba is loaded."""

    def deco(fn):
        with _LOCK:
            if _loaded:
                from numba.extending import register_jitable as real

                return real(**options)(fn)
            _RECORDS.append(("jitable", fn, options, None))
        return fn

    return deco


def _defer(fn, make):
    """A stand-in for ``make()`` until numba is loaded; once it is, ``make()`` itself."""
    with _LOCK:
        if _loaded:
            return make()
        stand_in = Deferred(fn)
        _RECORDS.append(("deferred", fn, make, stand_in))
        return stand_in


def use_shared_cache(environ=os.environ, shared: Path = SHARED_CACHE) -> None:
    """Point numba at the cache ``make setup`` filled (``shared``) when ``NUMBA_CACHE_DIR``
    is unset or empty and that cache exists.

    Why: make exports NUMBA_CACHE_DIR for its own commands only. The README's other
    commands (``.venv/bin/relakit simulate``, a Dask worker started by hand, a notebook
    outside ``make lab``) left numba on its default, a second cache in each module's
    ``__pycache__``, empty on a fresh checkout, so their first run compiled every kernel
    again (a RelA policy run: 49 s, against 9.5 s from the shared cache). Set in the
    environment, so that the processes this one starts (sweep workers, notebook kernels)
    share it too. A value the user set wins; without the cache, numba keeps its default."""
    if not environ.get("NUMBA_CACHE_DIR") and shared.is_dir():
        environ["NUMBA_CACHE_DIR"] = str(shared)


def materialize() -> None:
    """Import numba, apply every recorded decoration, rebind every global naming a
    stand-in. Idempotent; the first call costs numba's import (0.3-0.4 s here)."""
    global _loaded
    with _LOCK:
        if _loaded:
            return
        use_shared_cache()
        from numba.core import config
        from numba.extending import register_jitable as real_jitable

        config.reload_config()  # (numba read its environment when imported: maybe earlier)

        for kind, fn, how, stand_in in _RECORDS:
            if kind == "jitable":
                real_jitable(**how)(fn)
            else:
                stand_in._real = how()
        _loaded = True
        scopes = [vars(m) for name, m in list(sys.modules.items())
                  if m is not None and (name == "relakit" or name.startswith("relakit."))]
        scopes += [fn.__globals__ for _, fn, _, _ in _RECORDS]
        seen = set()
        for scope in scopes:
            if id(scope) in seen:
                continue
            seen.add(id(scope))
            for key, value in list(scope.items()):
                if isinstance(value, Deferred):
                    scope[key] = value._real
        _RECORDS.clear()
