"""Counterfactual search: which thresholds, hysteresis, dwell and clocks would have done best.

``relakit.search(spec, out_dir)`` (and ``relakit search SEARCH.yaml``) runs an
Optuna study over dotted scenario keys, every trial on the same replication
seeds as the incumbent, and writes trials, the Pareto front, each front
member's policy and clocks, and the front's paired differences against the
incumbent. :mod:`relakit.search.spec` reads the file, :mod:`.objectives` says
how each number is computed from a run, :mod:`.run` runs and resumes the study,
:mod:`.report` turns a front member into a sentence.
"""

import sys as _sys
import types as _types

from relakit.search.objectives import RUN_NUMBERS, SUMMARY_NUMBERS, objective_values
from relakit.search.report import sentence
from relakit.search.run import SearchResult, load_trials, run_replication, search
from relakit.search.spec import Objective, Param, SearchSpec, load_search

__all__ = ["RUN_NUMBERS", "SUMMARY_NUMBERS", "Objective", "Param", "SearchResult",
           "SearchSpec", "load_search", "load_trials", "objective_values", "run_replication",
           "search", "sentence"]


class _CallableModule(_types.ModuleType):
    """``relakit.search`` is both this package and, called, :func:`search` (as
    ``relakit.calibrate`` is), so the spelling works whichever was imported first."""

    def __call__(self, *args, **kwargs) -> SearchResult:
        return search(*args, **kwargs)


_sys.modules[__name__].__class__ = _CallableModule
