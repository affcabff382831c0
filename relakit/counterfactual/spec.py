"""Search files: which scenario, which dotted keys over which ranges, which objectives.

A search file is read once, here, and every mistake is one line naming the
file, the key and what is allowed, before any trial runs::

    name: metastable-policy
    scenario: ../scenarios/metastable.yaml
    base: {duration_s: 120}                     # fixed overrides (as sweeps have)
    space:                                      # dotted keys, as sweeps and overrides use
      policy.conditions.overloaded.threshold: {low: 50, high: 400, log: true}
      policy.modes.0.enter_after: {low: 1, high: 5, step: 1}
      clocks.eval_s: {choices: [1, 2, 5]}
    objectives:
      - {number: gold.success_ratio, direction: max}
      - {number: dropped_share, direction: min}
    replications: 3                             # per trial, the same seeds for every trial
    incumbent: true                             # the scenario as it is (or a mapping of overrides)

A key of ``space`` must lead somewhere in the scenario: every part but the last
must exist (referenced policy, clocks and chain files read in place), and the
scenario must load with the range's ends (or every choice) applied, exactly
as a trial will apply them.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from relakit.counterfactual.objectives import check_objective
from relakit.validate import Reader, ScenarioError, display_path, load_yaml

SAMPLERS = ("tpe", "nsga2", "random")
DIRECTIONS = ("max", "min")
KEYS = {"name", "scenario", "base", "space", "objectives", "replications", "seed", "trials",
        "sampler", "batch", "slo_ms", "incumbent"}
MAX_REPLICATIONS = 1000


@dataclass(frozen=True)
class Param:
    """One dimension of the space: a float or integer range (``log``, ``step``) or choices."""

    key: str
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    choices: tuple | None = None
    integer: bool = False

    def ends(self) -> list:
        """The values a check applies: both ends, or every choice."""
        if self.choices is not None:
            return list(self.choices)
        cast = int if self.integer else float
        return [cast(self.low), cast(self.high)]

    def inner(self):
        """A value a trial may draw strictly inside a float range, not a whole number:
        the check that a key taking whole numbers was not given a float range (its ends
        load, 2.37 does not). None for choices and integer ranges."""
        if self.choices is not None or self.integer or self.step is not None:
            return None
        value = self.low + 0.37 * (self.high - self.low)
        return value if value != int(value) else value + 0.013 * (self.high - self.low)

    def suggest(self, trial):
        """The trial's value (Optuna's distributions; the name is the dotted key)."""
        if self.choices is not None:
            return trial.suggest_categorical(self.key, list(self.choices))
        if self.integer:
            return trial.suggest_int(self.key, int(self.low), int(self.high),
                                     step=int(self.step or 1), log=self.log)
        return trial.suggest_float(self.key, self.low, self.high, step=self.step, log=self.log)


@dataclass(frozen=True)
class Objective:
    number: str     # see relakit.counterfactual.objectives.NUMBERS
    direction: str  # max | min

    @property
    def column(self) -> str:
        return self.number


@dataclass(frozen=True)
class SearchSpec:
    name: str
    scenario: str
    space: tuple[Param, ...]
    objectives: tuple[Objective, ...]
    base: dict = field(default_factory=dict)
    replications: int = 3
    seed: int = 0
    trials: int = 20
    sampler: str = "tpe"
    batch: int | None = None
    slo_ms: float | None = None
    incumbent: dict | None = field(default_factory=dict)  # overrides; None: no incumbent
    source: str = "<search>"

    def digest(self) -> str:
        """What makes two searches the same search: everything but the trial budget, the
        batch and the name, plus the content of every file a trial reads (the scenario,
        and the policy, chain, clocks and trace files it names with the base and the
        incumbent applied, as a sweep keys its points). A resumed search with another
        digest is refused (its stored trials answered another question)."""
        from relakit.sweep import hash_file, referenced_files

        files = {}
        for overrides in (self.base, {**self.base, **(self.incumbent or {})}):
            for key, path in referenced_files(self.scenario, overrides).items():
                files[key] = hash_file(path) if path else None
        text = json.dumps({"scenario": hash_file(self.scenario), "files": files,
                           "base": self.base,
                           "space": [p.__dict__ for p in self.space],
                           "objectives": [o.__dict__ for o in self.objectives],
                           "replications": self.replications, "seed": self.seed,
                           "sampler": self.sampler, "slo_ms": self.slo_ms,
                           "incumbent": self.incumbent}, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def load_search(source) -> SearchSpec:
    """Read and check a search file (a path or a dict); :class:`ScenarioError` on a mistake."""
    data, name, base_dir = load_yaml(source, "search")
    r = Reader(data, name)
    r.only(KEYS)
    if "scenario" not in r.data:
        r.fail("is required: the scenario (or twin) to search over", "scenario")
    if not isinstance(r.data["scenario"], str):
        r.fail("expected a path to a scenario YAML", "scenario")
    target = Path(r.data["scenario"])
    if not target.is_absolute():
        target = base_dir / target if (base_dir / target).exists() else Path.cwd() / target
    if not target.is_file():
        r.fail(f"file not found: {display_path(target)}", "scenario")
    base = r.data.get("base") or {}
    if not isinstance(base, dict):
        r.fail("expected a mapping of fixed overrides (dotted keys to values)", "base")
    space = _space(r)
    slo = r.number("slo_ms", None, lo=0, lo_open=True, nullable=True)
    objectives = _objectives(r, slo)
    inc = r.data.get("incumbent", True)
    if inc is True:
        incumbent = {}
    elif inc is False or inc is None:
        incumbent = None
    elif isinstance(inc, dict):
        incumbent = inc
    else:
        r.fail("expected true (the scenario as it is), false (none) or a mapping of "
               f"overrides, got {inc!r}", "incumbent")
    spec = SearchSpec(
        name=str(r.data.get("name") or Path(name).stem), scenario=str(target), space=space,
        objectives=objectives, base=base,
        replications=r.number("replications", 3, lo=2, hi=MAX_REPLICATIONS, integer=True),
        seed=r.number("seed", 0, lo=0, hi=2**63 - 1, integer=True),
        trials=r.number("trials", 20, lo=1, hi=100_000, integer=True),
        sampler=r.choice("sampler", SAMPLERS, "tpe"),
        batch=r.number("batch", None, lo=1, hi=10_000, integer=True, nullable=True),
        slo_ms=slo, incumbent=incumbent, source=name)
    check_against_scenario(spec)
    return spec


def _space(r: Reader) -> tuple[Param, ...]:
    raw = r.data.get("space")
    if not isinstance(raw, dict) or not raw:
        r.fail("expected a mapping of dotted keys to ranges ({low, high, log, step} or "
               "{choices: [...]})", "space")
    out = []
    for key, rng in raw.items():
        where = f"space.{key}"
        if not isinstance(key, str) or not key or "" in key.split("."):
            r.fail("expected a dotted key such as policy.modes.0.enter_after", where)
        if not isinstance(rng, dict):
            r.fail("expected {low, high} (with log or step) or {choices: [...]}", where)
        p = Reader(rng, r.source, where)
        p.only({"low", "high", "log", "step", "choices"})
        if "choices" in rng:
            if set(rng) != {"choices"}:
                p.fail("choices stand alone: drop low, high, log and step")
            ch = rng["choices"]
            if not isinstance(ch, list) or not ch or any(
                    isinstance(c, dict | list) for c in ch):
                p.fail("expected a non-empty list of plain values", "choices")
            out.append(Param(key, choices=tuple(ch)))
            continue
        if "low" not in rng or "high" not in rng:
            p.fail("give low and high (or choices)")
        lo, hi = p.number("low"), p.number("high")
        if lo >= hi:
            p.fail(f"low {rng['low']!r} must be below high {rng['high']!r}", "low")
        log = rng.get("log", False)
        if not isinstance(log, bool):
            p.fail(f"expected true or false, got {log!r}", "log")
        if log and lo <= 0:
            p.fail(f"a log range needs low > 0, got {rng['low']!r}", "low")
        step = p.number("step", None, lo=0, lo_open=True, nullable=True)
        if step is not None and log:
            p.fail("step and log do not go together (Optuna samples one or the other)",
                   "step")
        integer = step is not None and all(isinstance(rng[k], int) and not isinstance(
            rng[k], bool) for k in ("low", "high", "step"))
        if step is not None and not math.isclose(((hi - lo) / step) % 1, 0, abs_tol=1e-9) \
                and not math.isclose(((hi - lo) / step) % 1, 1, abs_tol=1e-9):
            p.fail(f"high - low ({hi - lo:g}) is not a whole number of steps of {step:g}",
                   "step")
        if log and all(isinstance(rng[k], int) and not isinstance(rng[k], bool)
                       for k in ("low", "high")):
            integer = False  # a log range of whole numbers is still sampled as floats
        out.append(Param(key, lo, hi, log, step, None, integer))
    return tuple(out)


def _objectives(r: Reader, slo_ms) -> tuple[Objective, ...]:
    raw = r.data.get("objectives")
    if not isinstance(raw, list) or not raw:
        r.fail("expected a list of {number: ..., direction: max|min}", "objectives")
    out, seen = [], set()
    for i, o in enumerate(raw):
        where = f"objectives.{i}"
        if not isinstance(o, dict):
            r.fail("expected {number: ..., direction: max|min}", where)
        q = Reader(o, r.source, where)
        q.only({"number", "direction"})
        number = o.get("number")
        if not isinstance(number, str):
            q.fail("expected the name of a summary number, e.g. gold.success_ratio", "number")
        problem = check_objective(number, slo_ms)
        if problem:
            q.fail(problem, "number")
        direction = q.choice("direction", DIRECTIONS)
        if number in seen:
            q.fail(f"{number} is already an objective", "number")
        seen.add(number)
        out.append(Objective(number, direction))
    return tuple(out)


# ---- against the scenario -------------------------------------------------------------------
def raw_scenario(path, overrides: dict | None = None) -> dict:
    """The scenario's YAML as a mapping, with its policy, clocks and chain files read in
    place (as :func:`relakit.scenario.load_scenario` does for an override reaching into
    them) and ``overrides`` applied: what a trial's scenario is, written out."""
    from relakit.scenario import REFERENCED, apply_overrides, inline_reference

    data, name, base_dir = load_yaml(path, "scenario")
    apply_overrides(data, overrides, name, base_dir)
    for head in REFERENCED:
        inline_reference(data, head, name, base_dir)
    return data


def _missing_part(data: dict, key: str) -> str | None:
    """Where a dotted key leaves the scenario (all parts but the last must exist)."""
    cur, walked = data, []
    for k in key.split(".")[:-1]:
        where = ".".join(walked) or "the top level"
        if isinstance(cur, dict):
            if k not in cur:
                have = ", ".join(map(str, cur)) or "nothing"
                return f"the scenario has no '{k}' under {where} (it has: {have})"
            cur = cur[k]
        elif isinstance(cur, list):
            if not k.isdigit() or int(k) >= len(cur):
                return f"{where} is a list of {len(cur)}: '{k}' must be 0 to {len(cur) - 1}"
            cur = cur[int(k)]
        else:
            return f"{where} is {cur!r}, which has no '{k}'"
        walked.append(k)
    return None


def check_against_scenario(spec: SearchSpec) -> None:
    """Every space key and the incumbent applied to the scenario, as trials will apply them."""
    from relakit.checks import Finding, check_scenario, enforce
    from relakit.scenario import load_scenario

    r = Reader({}, spec.source)
    scen = display_path(spec.scenario)

    def _one(exc):  # the scenario's own name once, not twice
        return " ".join(str(exc).split()).removeprefix(f"{scen}: ")

    try:
        data = raw_scenario(spec.scenario, spec.base)
    except ScenarioError as exc:
        r.fail(f"the scenario with base applied is refused: {_one(exc)}", "base")
    try:
        as_set = load_scenario(scen, overrides=spec.base)
    except ScenarioError as exc:
        r.fail(f"{scen} with base applied is refused: {_one(exc)}", "base")
    as_given = check_scenario(as_set)
    findings = [Finding(f.severity, spec.source, "base", f.text) for f in as_given
                if f.severity == "error"]
    for p in spec.space:
        where = f"space.{p.key}"
        if p.key in spec.base:
            r.fail("is also fixed in base; drop it from one of them", where)
        missing = _missing_part(data, p.key)
        if missing:
            r.fail(missing, where)
        for value in p.ends():
            try:
                sc = load_scenario(scen, overrides={**spec.base, p.key: value})
            except ScenarioError as exc:
                r.fail(f"{value!r} is refused by {scen}: {_one(exc)}", where)
            findings += [Finding(f.severity, spec.source, where, f"at {value!r}: {f.text}")
                         for f in check_scenario(sc) if f not in as_given]
        inner = p.inner()
        if inner is not None:
            try:
                load_scenario(scen, overrides={**spec.base, p.key: inner})
            except ScenarioError as exc:
                r.fail(f"a value inside the range such as {inner!r} is refused by {scen} "
                       f"({_one(exc)}); for a whole-number key give whole low and high and "
                       "step: 1", where)
    if spec.incumbent:
        for k in spec.incumbent:
            if not isinstance(k, str):
                r.fail(f"expected dotted keys, got {k!r}", "incumbent")
        try:
            load_scenario(scen, overrides={**spec.base, **spec.incumbent})
        except ScenarioError as exc:
            r.fail(f"the incumbent's overrides are refused by {scen}: {_one(exc)}",
                   "incumbent")
    # what `relakit check` says of a trial's scenario, at the range's ends, said of the
    # search's own key: an error refuses the search, a warning is shown once
    enforce(dict.fromkeys(findings))
    from relakit.counterfactual.objectives import needs_policy

    for i, o in enumerate(spec.objectives):
        if needs_policy(o.number) and as_set.policy is None:
            r.fail(f"{o.number} counts a policy's decisions, and {scen} has no policy",
                   f"objectives.{i}.number")

