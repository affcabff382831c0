"""Counterfactual search: which thresholds, hysteresis, dwell and clocks would have done best.

``relakit.search(spec, out_dir)`` (and ``relakit search SEARCH.yaml``) runs an
Optuna study over dotted scenario keys, every trial on the same replication
seeds as the incumbent, and writes trials, the Pareto front, each front
member's policy and clocks, and the front's paired differences against the
incumbent. :mod:`relakit.counterfactual.spec` reads the file, :mod:`.objectives` says
how each number is computed from a run, :mod:`.run` runs and resumes the study,
:mod:`.report` turns a front member into a sentence.

The package is named for what it asks, not ``search``: ``relakit.search`` is the
function (:func:`.run.search`), and a package of that name would take its place as
an attribute of ``relakit`` as soon as any of its modules was imported.
"""

from relakit.counterfactual.objectives import RUN_NUMBERS, SUMMARY_NUMBERS, objective_values
from relakit.counterfactual.report import sentence
from relakit.counterfactual.run import SearchResult, load_trials, run_replication, search
from relakit.counterfactual.spec import Objective, Param, SearchSpec, load_search

__all__ = ["RUN_NUMBERS", "SUMMARY_NUMBERS", "Objective", "Param", "SearchResult",
           "SearchSpec", "load_search", "load_trials", "objective_values", "run_replication",
           "search", "sentence"]
