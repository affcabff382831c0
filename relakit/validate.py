"""Reading YAML mappings with errors that say where: file, dotted key, what is allowed.

Every YAML the workbench reads (scenarios, policies, clocks, chains, sweeps)
goes through :class:`Reader`, so a bad value is always reported the same way:
``<file>: key 'fleet.service.kind': 'expo' is not one of exponential, ...``.
"""

from __future__ import annotations

import functools
import math
from typing import Any

#: Seeds are 64-bit words (``relakit.sim.rng`` takes them modulo 2**64): the YAML and the
#: command line both accept exactly 0 .. SEED_MAX.
SEED_MAX = 2**64 - 1


class ScenarioError(ValueError):
    """An input file is not valid; the message says which file, which key and why."""


class Reader:
    """Walks a mapping, remembering where it is, so errors can say so."""

    def __init__(self, data: Any, source: str, path: str = ""):
        self.source = source
        self.path = path
        if data is None and not path:
            self.fail("the file is empty; expected a mapping of keys to values")
        if not isinstance(data, dict):
            self.fail(f"expected a mapping, got {_kind(data)}")
        self.data = data

    def fail(self, problem: str, key: str | None = None):
        where = ".".join(p for p in (self.path, key) if p) or "(top level)"
        raise ScenarioError(f"{self.source}: key '{where}': {problem}")

    def only(self, allowed):
        extra = sorted(set(self.data) - set(allowed))
        if extra:
            self.fail(f"unknown key(s) {extra}; allowed keys here: {sorted(allowed)}")

    def sub(self, key: str, default=None) -> Reader:
        value = self.data.get(key, default if default is not None else {})
        return Reader(value, self.source, f"{self.path}.{key}" if self.path else key)

    def number(self, key, default=None, *, lo=None, hi=None, lo_open=False, integer=False,
               nullable=False):
        value = self.data.get(key, default)
        if value is None:
            if nullable:
                return None
            self.fail("is required" if key not in self.data else "must not be null", key)
        if isinstance(value, bool) or not isinstance(value, int | float):
            hint = ""
            if isinstance(value, str) and _parses_as_float(value):
                hint = (f" (YAML reads {value} as text; write it with a dot and a signed "
                        f"exponent, e.g. {float(value):.1e})")
            self.fail(f"expected a number, got {_kind(value)} {_short(value)}{hint}", key)
        if isinstance(value, float) and not math.isfinite(value):
            self.fail(f"expected a finite number, got {value!r}", key)
        if integer and isinstance(value, float) and not value.is_integer():
            self.fail(f"expected a whole number, got {value!r}", key)
        if not integer and isinstance(value, int) and abs(value) > 1e300:
            self.fail(f"{_short(value)} is too large", key)
        if lo is not None and (value < lo or (lo_open and value == lo)):
            self.fail(f"{value!r} is out of range: must be {'>' if lo_open else '>='} {lo}", key)
        if hi is not None and value > hi:
            self.fail(f"{value!r} is out of range: must be <= {hi}", key)
        return int(value) if integer else float(value)

    def choice(self, key, allowed, default=None):
        value = self.data.get(key, default)
        if not isinstance(value, str | type(None)) or value not in allowed:
            self.fail(f"{_short(value)} is not one of {', '.join(map(str, allowed))}", key)
        return value


def _parses_as_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _kind(value) -> str:
    """A YAML reader's word for a value's type."""
    return {type(None): "nothing (null)", bool: "true/false", int: "a number",
            float: "a number", str: "a string", list: "a list",
            dict: "a mapping"}.get(type(value), type(value).__name__)


def _short(value, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."




class _DuplicateKey(Exception):
    def __init__(self, key, first: int, second: int):
        self.key, self.first, self.second = key, first, second


@functools.cache
def _unique_key_loader():
    import yaml

    # libyaml's parser where PyYAML was built with it (the pure-Python one is ~5x slower:
    # 0.1 s of a 300-rule replay); marks (line, column) and errors keep their form
    base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

    class Loader(base):
        """PyYAML's safe loader, refusing a key given twice in one mapping."""

        def construct_mapping(self, node, deep=False):
            seen = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                try:
                    if key in seen:
                        raise _DuplicateKey(key, seen[key] + 1, key_node.start_mark.line + 1)
                    seen[key] = key_node.start_mark.line
                except TypeError:  # an unhashable key: let PyYAML report it
                    pass
            return super().construct_mapping(node, deep=deep)

    return Loader


def display_path(path) -> str:
    """A path for messages: relative to the working folder when it is below it or below
    the folder above it (``../params/policies/rela.yaml`` from a notebook in
    ``notebooks/``, so no output shows where the checkout lives), else absolute; without
    ``..`` detours (``scenarios/../chains/x.yaml``)."""
    import os
    from pathlib import Path

    p = Path(os.path.normpath(Path(path).absolute()))
    cwd = Path.cwd()
    bases = [(cwd, Path())]
    if cwd.parent != Path(cwd.anchor):  # not a folder straight under / ("../etc/x")
        bases.append((cwd.parent, Path("..")))
    for base, shown in bases:
        try:
            return str(shown / p.relative_to(base))
        except ValueError:
            continue
    return str(p)


def load_yaml(source, kind: str):
    """A YAML mapping from a path or a dict: (data, name for messages, folder for paths)."""
    from pathlib import Path

    if isinstance(source, dict):
        return source, f"<{kind}>", Path.cwd()
    import yaml  # here: a scenario given as a dict never needs it (~20 ms of a start)

    path = Path(source)
    if not path.is_file():
        raise ScenarioError(f"{path}: no such {kind} file")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ScenarioError(f"{path}: not a text file (byte {exc.start} is not UTF-8); "
                            f"expected a {kind} YAML") from None
    except OSError as exc:
        raise ScenarioError(f"{path}: cannot read the {kind} file: "
                            f"{exc.strerror or exc}") from None
    try:
        data = yaml.load(text, Loader=_unique_key_loader())
    except _DuplicateKey as exc:
        raise ScenarioError(f"{path}: key '{exc.key}': given twice (lines {exc.first} and "
                            f"{exc.second}); YAML would silently keep only the last") from None
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        at = f" at line {where.line + 1}, column {where.column + 1}" if where else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ScenarioError(f"{path}: not valid YAML{at}: {problem}") from None
    return data, str(path), path.resolve().parent
