"""Running a search: Optuna asks for a batch of trials, the runner runs their replications,
Optuna is told; everything is kept in a journal file so a killed search resumes.

Why it is built this way:

* **Common random numbers.** Every trial, and the incumbent, runs the same
  replication seeds (``replication_seeds(seed, replications)``), so two
  policies meet the same arrivals and service demands, and the difference of
  a trial and the incumbent is paired replication by replication
  (:func:`relakit.stats.paired_difference`): a much narrower interval than two
  independent samples would give.
* **Ask, run, tell, in batches.** ``batch`` trials are asked at once (TPE with a
  constant liar, so the batch spreads out), their ``trials x replications``
  runs go to the shared executor (:mod:`relakit.runner`: one local pool kept
  for the whole search, or a Dask scheduler), and each trial is told its
  objectives' means. Per-replication values are kept on the trial (user
  attributes), so the intervals and paired differences can be computed again
  from the storage alone.
* **Resume.** The study lives in ``<out>/study.journal`` (Optuna's journal
  file: appends only, safe to kill). A finished trial is never run again; a
  trial that was running when the search was killed is marked failed and its
  parameters are queued again. A resumed search whose file changed (space,
  objectives, replications, seed, sampler, the scenario's content) is refused:
  its stored trials answered another question.
"""

from __future__ import annotations

import math
import os
import sys
import time
import warnings
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import polars as pl

from relakit.counterfactual.objectives import objective_values
from relakit.counterfactual.report import fmt, label
from relakit.counterfactual.spec import SearchSpec, load_search, raw_scenario
from relakit.progress import Progress
from relakit.replications import replication_seeds
from relakit.stats import paired_difference, t_interval
from relakit.validate import ScenarioError

JOURNAL = "study.journal"


def run_replication(scenario: str, overrides: dict, seed: int, numbers: tuple,
                    slo_ms: float | None) -> dict:
    """One replication of one trial (a worker's task): its objectives' values."""
    os.environ.setdefault("NUMBA_NUM_THREADS", "1")
    from relakit.checks import RelakitWarning
    from relakit.experiment import require_one_fleet, run_once
    from relakit.scenario import load_scenario

    sc = load_scenario(scenario, overrides=overrides)
    require_one_fleet(sc, "a search trial")
    with warnings.catch_warnings():  # the spec was checked before the search started
        warnings.simplefilter("ignore", RelakitWarning)
        result = run_once(sc, seed, record_requests=False)
    return objective_values(result, numbers, slo_ms, sc.warmup_s)


class SearchResult:
    """What a search leaves: ``trials`` (every finished trial: parameters, each objective's
    mean, ``_ci`` and, with an incumbent, ``_diff``/``_diff_ci``), ``front`` (the
    Pareto-optimal trials), ``incumbent`` (per front member and objective: incumbent
    and member, paired difference and interval, or None), ``info`` and ``spec``."""

    def __init__(self, spec, trials, front, incumbent, info):
        self.spec, self.trials, self.front, self.incumbent, self.info = (
            spec, trials, front, incumbent, info)

    def __repr__(self) -> str:
        return (f"SearchResult({self.spec.name!r}, trials={self.trials.height}, "
                f"front={self.front.height})")

    def _repr_html_(self) -> str:
        from relakit.counterfactual.report import front_rows
        from relakit.display import html_view

        return html_view(
            f"SearchResult: {self.spec.name}",
            [f"{self.trials.height} trials complete, {self.front.height} on the Pareto front; "
             f"{self.spec.replications} replications a trial, the same seeds for every trial"],
            [("the Pareto front", front_rows(self))],
            ["cells: mean ± 95 % half-width over replications; in brackets the paired "
             "difference from the incumbent (better/worse where significant)"
             if self.incumbent is not None else ""])

    def difference(self, trial: int, number: str) -> dict:
        """The paired difference row of one front member and objective, by key."""
        sel = self.incumbent.filter((pl.col("trial") == trial) & (pl.col("number") == number))
        if sel.height != 1:
            raise KeyError(f"no incumbent comparison for trial {trial} and {number!r}")
        return sel.row(0, named=True)

    def best(self, number: str) -> dict:
        """The front member best on one objective (ties: the lower trial number)."""
        o = next(o for o in self.spec.objectives if o.number == number)
        ordered = self.front.sort([number, "trial"], descending=[o.direction == "max", False])
        return ordered.row(0, named=True)


def search(spec, out_dir, *, trials: int | None = None, workers: int | None = None,
           scheduler: str | None = None, batch: int | None = None, notice=None,
           stop_after: int | None = None) -> SearchResult:
    """Run (or resume) a search until ``trials`` trials (default: the file's) are complete;
    write its outputs in ``out_dir`` and return them.

    ``spec`` is a path, a dict or a :class:`SearchSpec`. ``workers`` local processes
    (default: one per core, at most the batch's runs; one runs in this process) or the
    Dask ``scheduler``. ``batch`` trials are asked at a time (default: the file's, else
    enough to keep the workers busy: ``max(2, workers)``). ``stop_after`` stops after
    that many batches of this call (tests of resuming use it)."""
    spec = spec if isinstance(spec, SearchSpec) else load_search(spec)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with _journal_lock(out):
        return _search(spec, out, trials, workers, scheduler, batch, notice, stop_after)


@contextmanager
def _journal_lock(out: Path):
    """Hold ``<out>/study.lock`` for the whole search: two searches appending to one journal
    would each ask for the other's trials and mix their batches. The lock is the
    kernel's (``flock``), so it goes with its holder, even one killed with SIGKILL."""
    import fcntl

    path = out / "study.lock"
    with open(path, "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "another process"
            raise ScenarioError(f"{out / JOURNAL}: another search (pid {holder}) is running "
                                "on this journal; wait for it to end or give another "
                                "--out") from None
        fh.seek(0)
        fh.truncate()
        fh.write(str(os.getpid()))
        fh.flush()
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _search(spec, out, trials, workers, scheduler, batch, notice, stop_after):
    import optuna

    say = notice or (lambda line: print(f"relakit: search: {line}", file=sys.stderr,
                                        flush=True))
    target = int(trials if trials is not None else spec.trials)
    if target < 1:
        raise ValueError(f"trials: expected a whole number >= 1, got {target}")
    n_workers = 1 if scheduler else (workers or os.cpu_count() or 1)
    batch = int(batch or spec.batch or max(2, n_workers))
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    study = _study(spec, out)
    _requeue_interrupted(study, say)
    numbers = tuple(o.number for o in spec.objectives)
    seeds = replication_seeds(spec.seed, spec.replications)
    pool = None
    if not scheduler and n_workers > 1:
        from relakit.runner import local_pool

        pool = local_pool(min(n_workers, batch * spec.replications))
    batches = 0
    line = Progress("search", target, "trials", start=min(_complete(study), target))
    try:
        while _complete(study) < target and (stop_after is None or batches < stop_after):
            n = min(batch, target - _complete(study))
            before = _complete(study)
            told = _run_batch(study, spec, n, seeds, numbers, pool, scheduler, workers)
            if not line.enabled:  # a log or a pipe: a line a trial, not a rewritten line
                for j, (number, means) in enumerate(told):
                    say(f"trial {number} ({before + j + 1}/{target}): " + "; ".join(
                        f"{label(o.number)} {fmt(o.number, m)}"
                        for o, m in zip(spec.objectives, means, strict=True)))
            batches += 1
            _write_trials(spec, study, out)
            line.update(_complete(study))
    finally:
        line.close()
        if pool is not None:
            pool.shutdown()
    return write_outputs(spec, study, out)


# ---- the study -------------------------------------------------------------------------------
def _study(spec: SearchSpec, out: Path):
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    storage = JournalStorage(JournalFileBackend(str(out / JOURNAL)))
    directions = ["maximize" if o.direction == "max" else "minimize" for o in spec.objectives]
    existing = [s for s in storage.get_all_studies() if s.study_name == spec.name]
    study = optuna.create_study(study_name=spec.name, storage=storage, directions=directions,
                                load_if_exists=True)
    digest = spec.digest()
    if existing:
        had = study.user_attrs.get("digest")
        if had != digest:
            raise ScenarioError(
                f"{spec.source}: key '(top level)': {out / JOURNAL} holds a search named "
                f"{spec.name!r} with another space, objectives, replications, seed, sampler, "
                "or another content of a file its trials read (the scenario, its policy, "
                "clocks, chain or trace); give another --out (or another name) to start "
                "afresh")
    else:
        study.set_user_attr("digest", digest)
        study.set_user_attr("seeds", replication_seeds(spec.seed, spec.replications))
    study.sampler = _sampler(spec, len(study.get_trials(deepcopy=False)))
    return study


def _sampler(spec: SearchSpec, done: int):
    """The sampler, seeded from the file's seed and the trials already stored (so a
    resumed search is reproducible from where it stopped)."""
    import optuna

    seed = (spec.seed + 7919 * done) % (2**32)
    if spec.sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if spec.sampler == "nsga2":
        return optuna.samplers.NSGAIISampler(
            seed=seed, population_size=max(4, min(50, spec.trials // 4)))
    return optuna.samplers.TPESampler(
        seed=seed, multivariate=True, constant_liar=True,
        n_startup_trials=max(4, min(10, spec.trials // 3)))


def _complete(study) -> int:
    from optuna.trial import TrialState

    return len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))


def _requeue_interrupted(study, say) -> None:
    """Trials left running by a killed search: failed, and their parameters queued again."""
    from optuna.trial import TrialState

    running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    for t in running:
        study.tell(t.number, state=TrialState.FAIL)
        if t.params:
            study.enqueue_trial(t.params, user_attrs={"rerun_of": t.number})
    if running:
        say(f"{len(running)} trial(s) were running when the search stopped; running them "
            "again")


def _run_batch(study, spec: SearchSpec, n: int, seeds, numbers, pool, scheduler,
               workers) -> None:
    from optuna.trial import TrialState

    from relakit.runner import run_tasks

    asked = []
    for _ in range(n):
        trial = study.ask()
        params = {p.key: p.suggest(trial) for p in spec.space}
        asked.append((trial, _plain(params)))
    tasks, owner = [], []
    if spec.incumbent is not None and "incumbent" not in study.user_attrs:
        for s in seeds:  # the incumbent rides with the first batch
            tasks.append((run_replication, (spec.scenario, {**spec.base, **spec.incumbent},
                                            s, numbers, spec.slo_ms)))
            owner.append(-1)
    for k, (_trial, params) in enumerate(asked):
        for s in seeds:
            tasks.append((run_replication, (spec.scenario, {**spec.base, **params}, s,
                                            numbers, spec.slo_ms)))
            owner.append(k)
    t0 = time.perf_counter()
    results = run_tasks(tasks, workers=1 if pool is None and not scheduler else workers,
                        scheduler=scheduler, executor=pool,
                        keys=[f"search-{os.getpid()}-{time.time_ns()}-{i}"
                              for i in range(len(tasks))] if scheduler else None)
    wall = (time.perf_counter() - t0) / max(1, len(asked))
    per = {k: {nm: [r[nm] for r, o in zip(results, owner, strict=True) if o == k]
               for nm in numbers} for k in set(owner)}
    if -1 in per:
        study.set_user_attr("incumbent", per[-1])
    told = []
    for k, (trial, _params) in enumerate(asked):
        values = per[k]
        trial.set_user_attr("values", values)
        trial.set_user_attr("wall_s", round(wall, 3))
        means = [float(np.mean(values[nm])) for nm in numbers]
        if all(math.isfinite(m) for m in means):
            study.tell(trial, means)
            told.append((trial.number, means))
        else:  # a number with no value (e.g. a quantile of a tier that served nothing)
            study.tell(trial, state=TrialState.FAIL)
    return told


def _plain(params: dict) -> dict:
    return {k: (v.item() if isinstance(v, np.generic) else v) for k, v in params.items()}


# ---- outputs ---------------------------------------------------------------------------------
def _trial_rows(spec: SearchSpec, study, members=None) -> list[dict]:
    from optuna.trial import TrialState

    inc = study.user_attrs.get("incumbent")
    rows = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        if members is not None and t.number not in members:
            continue
        row = {"trial": t.number}
        row.update({f"param.{p.key}": t.params.get(p.key) for p in spec.space})
        vals = t.user_attrs.get("values", {})
        for o in spec.objectives:
            x = np.asarray(vals.get(o.number, []), dtype=float)
            iv = t_interval(x)
            row[o.number], row[f"{o.number}_ci"] = iv.mean, iv.half_width
            if inc is not None:
                d = paired_difference(x, np.asarray(inc[o.number], dtype=float)).interval
                row[f"{o.number}_diff"], row[f"{o.number}_diff_ci"] = d.mean, d.half_width
        row["replications"] = len(next(iter(vals.values()), []))
        row["wall_s"] = t.user_attrs.get("wall_s")
        row["rerun_of"] = t.user_attrs.get("rerun_of")
        rows.append(row)
    return rows


def _frame(spec, rows) -> pl.DataFrame:
    if rows:
        return pl.DataFrame(rows, infer_schema_length=None).sort("trial")
    return pl.DataFrame(schema={"trial": pl.Int64})


def _write_trials(spec, study, out: Path) -> pl.DataFrame:
    from relakit.io import write_parquet

    table = _frame(spec, _trial_rows(spec, study))
    write_parquet(table, out / "trials.parquet")
    return table


def write_outputs(spec: SearchSpec, study, out: Path) -> SearchResult:
    """trials.parquet, front.parquet, front/trial-N/ (policy, clocks, chain and overrides
    YAML), incumbent.parquet and search.json, each written atomically."""
    from relakit.io import write_json, write_parquet

    trials = _write_trials(spec, study, out)
    members = sorted(t.number for t in study.best_trials)
    front = trials.filter(pl.col("trial").is_in(members)) if trials.height else trials
    write_parquet(front, out / "front.parquet")
    written = _write_members(spec, study, members, out / "front")
    inc = _incumbent_table(spec, study, members)
    if inc is not None:
        write_parquet(inc, out / "incumbent.parquet")
    inc_values = study.user_attrs.get("incumbent")
    incumbent = None if inc_values is None else {
        o.number: {"mean": t_interval(np.asarray(inc_values[o.number], float)).mean,
                   "ci": t_interval(np.asarray(inc_values[o.number], float)).half_width}
        for o in spec.objectives}
    info = {"name": spec.name, "source": spec.source, "scenario": spec.scenario,
            "digest": spec.digest(), "replications": spec.replications,
            "seeds": study.user_attrs.get("seeds"), "sampler": spec.sampler,
            "objectives": [o.__dict__ for o in spec.objectives],
            "space": [p.key for p in spec.space], "base": spec.base,
            "incumbent_overrides": spec.incumbent, "incumbent": incumbent,
            "trials_complete": trials.height,
            "trials_stored": len(study.get_trials(deepcopy=False)),
            "front": members, "front_files": written, "confidence": 0.95,
            "difference": "trial - incumbent, paired by replication (common random numbers)"}
    write_json(info, out / "search.json")
    return SearchResult(spec, trials, front, inc, info)


def _incumbent_table(spec, study, members) -> pl.DataFrame | None:
    inc = study.user_attrs.get("incumbent")
    if inc is None:
        return None
    rows = []
    trials = {t.number: t for t in study.get_trials(deepcopy=False)}
    for n in members:
        vals = trials[n].user_attrs["values"]
        for o in spec.objectives:
            a = np.asarray(inc[o.number], dtype=float)
            b = np.asarray(vals[o.number], dtype=float)
            diff = paired_difference(b, a)
            ia, ib = t_interval(a), t_interval(b)
            better = bool(diff.significant) and \
                ((diff.interval.mean > 0) == (o.direction == "max"))
            rows.append({"trial": n, "number": o.number, "direction": o.direction,
                         "incumbent": ia.mean, "incumbent_ci": ia.half_width,
                         "value": ib.mean, "value_ci": ib.half_width,
                         **diff.columns(), "better": better})
    schema = {"trial": pl.Int64, "number": pl.String, "direction": pl.String,
              **dict.fromkeys(("incumbent", "incumbent_ci", "value", "value_ci", "difference",
                               "difference_ci", "difference_low", "difference_high"),
                              pl.Float64),
              "significant": pl.Boolean, "better": pl.Boolean, "variance_ratio": pl.Float64}
    return pl.DataFrame(rows, schema=schema)


def _write_members(spec, study, members, folder: Path) -> dict:
    """Each front member's policy, clocks and chain (when the scenario has them) and its
    overrides, as YAML; folders of trials no longer on the front are removed."""
    import shutil

    import yaml

    from relakit.io import atomic_write

    trials = {t.number: t for t in study.get_trials(deepcopy=False)}
    written = {}
    for n in members:
        params = _plain(trials[n].params)
        data = raw_scenario(spec.scenario, {**spec.base, **params})
        d = folder / f"trial-{n}"
        d.mkdir(parents=True, exist_ok=True)
        head = (f"# search {spec.name!r}, trial {n} (on the Pareto front): "
                f"{spec.source} over {Path(spec.scenario).name}\n")
        files = {"overrides.yaml": {**spec.base, **params}}
        for key in ("policy", "clocks", "chain"):
            if isinstance(data.get(key), dict):
                files[f"{key}.yaml"] = data[key]
        for fname, content in files.items():
            text = head + yaml.safe_dump(content, sort_keys=False)
            atomic_write(d / fname, lambda tmp, text=text: Path(tmp).write_text(text))
        written[n] = sorted(files)
    if folder.is_dir():
        for old in folder.glob("trial-*"):
            if old.is_dir() and int(old.name.removeprefix("trial-")) not in members:
                shutil.rmtree(old)
    return written


def load_trials(out_dir) -> pl.DataFrame:
    """A search folder's trials.parquet."""
    return pl.read_parquet(Path(out_dir) / "trials.parquet")
