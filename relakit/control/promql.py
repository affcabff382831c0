"""A PromQL subset, parsed by hand and evaluated on relakit's TSDB at many instants at once.

Why hand-written: the maintained parser on PyPI (``promql-parser``, Rust-backed)
covers the language but keeps no positions in its AST and reports syntax errors
without one ("invalid promql query"); a rule file's author needs to be told *where*
the unsupported construct is. The grammar below is small enough to read:

.. code-block:: text

    expr       := cmp
    cmp        := add  (('==' | '!=' | '>' | '<' | '>=' | '<=') ['bool'] [matching] add)*
    add        := mul  (('+' | '-') [matching] mul)*
    mul        := unary (('*' | '/' | '%') [matching] unary)*
    unary      := ('+' | '-') unary | pow
    pow        := postfix ['^' [matching] unary]            (right associative)
    postfix    := primary ['[' DURATION ']'] ['offset' DURATION]
    primary    := NUMBER | '(' expr ')' | agg | call | selector
    agg        := AGG [grouping] '(' expr ')' [grouping]    AGG: sum avg min max count
    grouping   := ('by' | 'without') '(' [LABEL (',' LABEL)*] ')'
    matching   := ('on' | 'ignoring') '(' [LABEL (',' LABEL)*] ')'
    call       := FUNCTION '(' [expr (',' expr)*] ')'
    selector   := METRIC ['{' [matcher (',' matcher)*] '}'] | '{' matcher (',' matcher)* '}'
    matcher    := LABEL ('=' | '!=' | '=~' | '!~') STRING

Evaluation follows Prometheus 2.x (the version the lab and ``promtool`` run): an
instant selector takes the newest sample in ``[t - 5m, t]`` (lookback delta 5 min);
a range selector ``x[W]`` the samples in ``[t - W, t]``; ``rate``/``increase``/
``delta`` extrapolate as ``extrapolatedRate``; ``histogram_quantile`` as
``bucketQuantile``; arithmetic drops the metric name, filtering comparisons keep it.
The functions themselves are :mod:`relakit.control.tsdb`'s (checked against a real
Prometheus). Staleness markers are not modelled for scraped series (relakit's TSDB
stores none: a vanished series stays visible for the 5 min lookback); the series a
recording rule writes do get them, as Prometheus writes them (see
:mod:`relakit.control.rules`).

A value is evaluated at a whole vector of instants ``T`` at once: an instant vector
is a list of series, each with its labels, a value per instant and a mask saying at
which instants it exists (a NaN *value* is a sample; a missing sample is not).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from relakit.control.tsdb import TSDB, Target, bucket_quantile, increase, over_time, window

LOOKBACK_S = 300.0  # Prometheus' default lookback delta

RANGE_FUNCTIONS = ("rate", "irate", "increase", "delta", "avg_over_time", "min_over_time",
                   "max_over_time", "sum_over_time", "count_over_time", "last_over_time")
INSTANT_FUNCTIONS = ("histogram_quantile", "clamp_min", "clamp_max", "abs")
FUNCTIONS = RANGE_FUNCTIONS + INSTANT_FUNCTIONS
AGGREGATIONS = ("sum", "avg", "min", "max", "count")
UNSUPPORTED_AGGREGATIONS = ("topk", "bottomk", "quantile", "count_values", "stddev", "stdvar",
                            "group", "limitk", "limit_ratio")
ARITHMETIC = ("+", "-", "*", "/", "%", "^")
COMPARISON = ("==", "!=", ">", "<", ">=", "<=")
SET_OPERATORS = ("and", "or", "unless")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0,
          "y": 31536000.0}


class PromQLError(ValueError):
    """An expression relakit cannot parse or does not support; says what and where."""

    def __init__(self, problem: str, expr: str, pos: int):
        self.problem, self.expr, self.pos = problem, expr, pos
        super().__init__(f"{problem} at {where(expr, pos)}")


def where(expr: str, pos: int) -> str:
    """``column C`` (1-based), or ``line L column C`` in a multi-line expression."""
    if "\n" not in expr:
        return f"column {pos + 1}"
    line = expr.count("\n", 0, pos) + 1
    return f"line {line} column {pos - (expr.rfind(chr(10), 0, pos) + 1) + 1}"


# ---- the tree ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Number:
    value: float
    pos: int = 0


@dataclass(frozen=True)
class Selector:
    """``name{matchers}``, optionally ``[range]`` and ``offset``; matchers are
    (label, op, value) with op one of = != =~ !~ (the name is a ``__name__`` matcher)."""

    matchers: tuple
    range_s: float | None = None
    offset_s: float = 0.0
    pos: int = 0

    @property
    def name(self) -> str | None:
        return next((v for k, op, v in self.matchers if k == "__name__" and op == "="), None)


@dataclass(frozen=True)
class Call:
    func: str
    args: tuple
    pos: int = 0


@dataclass(frozen=True)
class Aggregate:
    op: str
    expr: object
    labels: tuple = ()
    without: bool = False
    pos: int = 0


@dataclass(frozen=True)
class Unary:
    op: str
    expr: object
    pos: int = 0


@dataclass(frozen=True)
class Binary:
    op: str
    lhs: object
    rhs: object
    bool_: bool = False
    on: tuple | None = None  # on(labels); None with ignoring below
    ignoring: tuple = ()
    pos: int = 0


# ---- lexer ------------------------------------------------------------------------------
_TOKEN = re.compile(r"""
    (?P<ws>\s+|\#[^\n]*)
  | (?P<duration>(?:\d+(?:ms|[smhdwy]))+(?![\w.]))
  | (?P<number>0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)
  | (?P<ident>[a-zA-Z_:][a-zA-Z0-9_:]*)
  | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
  | (?P<op>=~|!~|==|!=|>=|<=|[-+*/%^<>=(){}\[\],:@])
""", re.VERBOSE)

_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'", "a": "\a",
            "b": "\b", "f": "\f", "v": "\v"}


@dataclass
class Token:
    kind: str
    text: str
    pos: int


def _lex(expr: str) -> list[Token]:
    out, i = [], 0
    while i < len(expr):
        m = _TOKEN.match(expr, i)
        if not m:
            raise PromQLError(f"unexpected character {expr[i]!r}", expr, i)
        if m.lastgroup != "ws":
            out.append(Token(m.lastgroup, m.group(), i))
        i = m.end()
    out.append(Token("eof", "", len(expr)))
    return out


def _duration(tok: Token, expr: str) -> float:
    total = 0.0
    for n, unit in re.findall(r"(\d+)(ms|[smhdwy])", tok.text):
        total += int(n) * _UNITS[unit]
    if total <= 0:
        raise PromQLError(f"duration {tok.text!r} must be positive", expr, tok.pos)
    return total


def _string(tok: Token) -> str:
    body = tok.text[1:-1]
    if tok.text[0] == "`":
        return body
    return re.sub(r"\\(.)", lambda m: _ESCAPES.get(m.group(1), m.group(1)), body)


# ---- parser -----------------------------------------------------------------------------
class _Parser:
    def __init__(self, expr: str):
        self.expr = expr
        self.toks = _lex(expr)
        self.i = 0

    @property
    def tok(self) -> Token:
        return self.toks[self.i]

    def fail(self, problem: str, tok: Token | None = None):
        tok = tok or self.tok
        raise PromQLError(problem, self.expr, tok.pos)

    def take(self, text: str | None = None, kind: str | None = None) -> Token:
        t = self.tok
        if (text is not None and t.text != text) or (kind is not None and t.kind != kind):
            want = repr(text) if text else kind
            got = "the end of the expression" if t.kind == "eof" else repr(t.text)
            self.fail(f"expected {want}, found {got}")
        self.i += 1
        return t

    def at(self, *texts) -> bool:
        return self.tok.kind in ("op", "ident") and self.tok.text in texts

    def parse(self):
        node = self.cmp()
        if self.tok.kind != "eof":
            if self.tok.kind == "ident" and self.tok.text.lower() in SET_OPERATORS:
                self.fail(f"unsupported operator '{self.tok.text.lower()}'")
            if self.tok.text == "@":
                self.fail("unsupported '@' modifier")
            self.fail(f"unexpected {self.tok.text!r}")
        return node

    def _matching(self):
        """``on(...)``/``ignoring(...)`` and a refused ``group_left``/``group_right``."""
        on, ignoring = None, ()
        if self.at("on", "ignoring"):
            kw = self.take().text
            labels = self._label_list()
            on, ignoring = (labels, ()) if kw == "on" else (None, labels)
            if self.at("group_left", "group_right"):
                self.fail(f"unsupported '{self.tok.text}' (many-to-one matching)")
        return on, ignoring

    def cmp(self):
        node = self.add()
        while self.tok.kind == "op" and self.tok.text in COMPARISON:
            op = self.take()
            is_bool = bool(self.at("bool")) and self.take() is not None
            on, ign = self._matching()
            rhs = self.add()
            node = self._binary(op, node, rhs, is_bool, on, ign)
        return node

    def add(self):
        node = self.mul()
        while self.tok.kind == "op" and self.tok.text in ("+", "-"):
            op = self.take()
            on, ign = self._matching()
            node = self._binary(op, node, self.mul(), False, on, ign)
        return node

    def mul(self):
        node = self.unary()
        while (self.tok.kind == "op" and self.tok.text in ("*", "/", "%")) or self.at("atan2"):
            if self.at("atan2"):
                self.fail("unsupported operator 'atan2'")
            op = self.take()
            on, ign = self._matching()
            node = self._binary(op, node, self.unary(), False, on, ign)
        return node

    def unary(self):
        if self.tok.kind == "op" and self.tok.text in ("+", "-"):
            op = self.take()
            inner = self.unary()
            if op.text == "+":
                return inner
            if isinstance(inner, Number):
                return Number(-inner.value, op.pos)
            return Unary("-", inner, op.pos)
        return self.pow()

    def pow(self):
        node = self.postfix()
        if self.tok.text == "^" and self.tok.kind == "op":
            op = self.take()
            on, ign = self._matching()
            node = self._binary(op, node, self.unary(), False, on, ign)
        return node

    def _binary(self, op: Token, lhs, rhs, is_bool, on, ignoring):
        scalar = _is_scalar(lhs) and _is_scalar(rhs)
        if op.text in COMPARISON and scalar and not is_bool:
            self.fail("comparisons between scalars must use the 'bool' modifier", op)
        if is_bool and op.text not in COMPARISON:
            self.fail("'bool' applies to comparison operators only", op)
        if (on is not None or ignoring) and (_is_scalar(lhs) or _is_scalar(rhs)):
            self.fail("vector matching (on/ignoring) only applies between two vectors", op)
        for side in (lhs, rhs):
            if isinstance(side, Selector) and side.range_s is not None:
                self.fail("a range vector cannot be an operand; apply a function such as "
                          "rate() to it", op)
        return Binary(op.text, lhs, rhs, is_bool, on, ignoring, op.pos)

    def postfix(self):
        node = self.primary()
        if self.tok.text == "[":
            open_ = self.take()
            if not isinstance(node, Selector) or node.range_s is not None:
                self.fail("unsupported subquery (a range of an expression other than a "
                          "selector)", open_)
            if self.tok.kind != "duration":
                self.fail("expected a duration such as 5m inside [ ]")
            rng = _duration(self.take(), self.expr)
            if self.tok.text.startswith(":"):
                self.fail("unsupported subquery '[range:resolution]'", open_)
            self.take("]")
            node = Selector(node.matchers, rng, node.offset_s, node.pos)
        if self.tok.text == "@":
            self.fail("unsupported '@' modifier")
        if self.at("offset"):
            kw = self.take()
            if not isinstance(node, Selector):
                self.fail("'offset' must follow a selector such as x or x[5m]", kw)
            if self.tok.text == "-":
                self.fail("unsupported negative offset")
            if self.tok.kind != "duration":
                self.fail("expected a duration such as 5m after 'offset'")
            node = Selector(node.matchers, node.range_s, _duration(self.take(), self.expr),
                            node.pos)
            if self.tok.text == "@":
                self.fail("unsupported '@' modifier")
            if self.tok.text == "[":
                self.fail("unsupported subquery (a range after 'offset')")
        return node

    def primary(self):
        t = self.tok
        if t.kind == "number":
            self.i += 1
            return Number(float(int(t.text, 16)) if t.text[:2].lower() == "0x"
                          else float(t.text), t.pos)
        if t.kind == "duration":
            self.fail(f"unexpected duration {t.text!r}")
        if t.kind == "string":
            self.fail("unsupported string literal")
        if t.text == "(":
            self.take()
            node = self.cmp()
            self.take(")")
            return node
        if t.text == "{":
            return self.selector(None, t)
        if t.kind != "ident":
            got = "the end of the expression" if t.kind == "eof" else repr(t.text)
            self.fail(f"expected an expression, found {got}")
        low = t.text.lower()
        if low in ("inf", "nan"):
            self.i += 1
            return Number(float(low), t.pos)
        nxt = self.toks[self.i + 1]
        if t.text in AGGREGATIONS and (nxt.text in ("(",) or nxt.text in ("by", "without")):
            return self.aggregate()
        if t.text in UNSUPPORTED_AGGREGATIONS and nxt.text in ("(", "by", "without"):
            self.fail(f"unsupported aggregation '{t.text}'")
        if low in SET_OPERATORS:
            self.fail(f"unsupported operator '{low}'")
        if nxt.text == "(":
            return self.call()
        self.i += 1
        return self.selector(t.text, t)

    def _label_list(self) -> tuple:
        self.take("(")
        labels = []
        while self.tok.text != ")":
            labels.append(self.take(kind="ident").text)
            if self.tok.text != ")":
                self.take(",")
        self.take(")")
        return tuple(labels)

    def aggregate(self):
        op = self.take()
        labels, without = (), False
        if self.at("by", "without"):
            without = self.take().text == "without"
            labels = self._label_list()
        self.take("(")
        inner = self.cmp()
        if self.tok.text == ",":
            self.fail(f"'{op.text}' takes one argument")
        self.take(")")
        if self.at("by", "without"):
            if labels or without:
                self.fail("grouping given twice")
            without = self.take().text == "without"
            labels = self._label_list()
        if _is_scalar(inner) or _is_range(inner):
            self.fail(f"'{op.text}' expects an instant vector", op)
        return Aggregate(op.text, inner, labels, without, op.pos)

    def call(self):
        name = self.take()
        if name.text not in FUNCTIONS:
            self.fail(f"unsupported function '{name.text}'", name)
        self.take("(")
        args = []
        while self.tok.text != ")":
            args.append(self.cmp())
            if self.tok.text not in (")", ","):
                self.fail("expected ',' or ')' in the arguments of "
                          f"{name.text}(), found " + (repr(self.tok.text) or "the end"))
            if self.tok.text == ",":
                self.take(",")
        self.take(")")
        self._check_args(name, args)
        return Call(name.text, tuple(args), name.pos)

    def _check_args(self, name: Token, args: list):
        f = name.text
        if f in RANGE_FUNCTIONS:
            if len(args) != 1 or not _is_range(args[0]):
                self.fail(f"{f}() expects one range vector such as x[5m]", name)
            return
        want = {"histogram_quantile": ("scalar", "vector"), "clamp_min": ("vector", "scalar"),
                "clamp_max": ("vector", "scalar"), "abs": ("vector",)}[f]
        if len(args) != len(want):
            self.fail(f"{f}() expects {len(want)} argument(s), got {len(args)}", name)
        for a, kind in zip(args, want, strict=True):
            if _is_range(a):
                self.fail(f"{f}() expects an instant vector, not a range such as x[5m]", name)
            if kind == "scalar" and not _is_scalar(a):
                self.fail(f"{f}() expects a number here", name)
            if kind == "vector" and _is_scalar(a):
                self.fail(f"{f}() expects an instant vector here", name)

    def selector(self, name: str | None, start: Token) -> Selector:
        matchers = [("__name__", "=", name)] if name else []
        if self.tok.text == "{":
            self.take("{")
            while self.tok.text != "}":
                label = self.take(kind="ident")
                op = self.tok
                if op.text not in ("=", "!=", "=~", "!~"):
                    self.fail(f"expected a matcher operator (=, !=, =~, !~) after "
                              f"'{label.text}'")
                self.i += 1
                value = self.take(kind="string")
                text = _string(value)
                if op.text in ("=~", "!~"):
                    try:
                        re.compile(text)
                    except re.error as exc:
                        self.fail(f"invalid regular expression {text!r}: {exc}", value)
                matchers.append((label.text, op.text, text))
                if self.tok.text != "}":
                    self.take(",")
            self.take("}")
        if not any(_matches(m, "") is False for m in matchers):
            self.fail("a selector must have at least one matcher that does not match the "
                      "empty string", start)
        return Selector(tuple(matchers), None, 0.0, start.pos)


def _is_scalar(node) -> bool:
    if isinstance(node, Number):
        return True
    if isinstance(node, Unary):
        return _is_scalar(node.expr)
    if isinstance(node, Binary):
        return _is_scalar(node.lhs) and _is_scalar(node.rhs)
    return False


def _is_range(node) -> bool:
    return isinstance(node, Selector) and node.range_s is not None


def parse(expr: str):
    """The syntax tree of ``expr``; :class:`PromQLError` (what and where) otherwise."""
    if not isinstance(expr, str) or not expr.strip():
        raise PromQLError("empty expression", str(expr), 0)
    return _Parser(expr).parse()


def selectors(node) -> list[Selector]:
    """Every selector in the tree (rules use it to see which series an expression reads)."""
    if isinstance(node, Selector):
        return [node]
    out = []
    for child in (getattr(node, a, None) for a in ("expr", "lhs", "rhs")):
        if child is not None:
            out += selectors(child)
    for a in getattr(node, "args", ()):
        out += selectors(a)
    return out


# ---- values -----------------------------------------------------------------------------
def _matches(matcher, value: str) -> bool:
    _, op, want = matcher
    if op == "=":
        return value == want
    if op == "!=":
        return value != want
    hit = re.fullmatch(want, value) is not None  # Prometheus anchors regexes
    return hit if op == "=~" else not hit


@dataclass
class Series:
    """One stored series: its samples (NaN-free) and, for recorded series, stale markers."""

    labels: tuple  # sorted (name, value) pairs, __name__ included
    times: np.ndarray
    values: np.ndarray
    stale: np.ndarray | None = None  # times of staleness markers
    _target: Target | None = field(default=None, repr=False)

    def label(self, key: str) -> str:
        return dict(self.labels).get(key, "")

    def target(self) -> Target:
        """The series as a one-column :class:`Target`, for the tsdb functions."""
        if self._target is None:
            self._target = Target(-1, self.times, self.values[:, None], [self.labels])
        return self._target


@dataclass
class Vector:
    """An instant vector at T instants: per series, labels, values (T,) and presence (T,)."""

    series: list  # [(labels tuple, values, present)]


def instance_label(node: int) -> str:
    """The ``instance`` label of a TSDB target: the node number, or ``client``."""
    return str(node) if node >= 0 else "client"


def store_from_tsdb(tsdb: TSDB) -> list[Series]:
    """Every series of the TSDB with Prometheus labels.

    ``__name__`` is the series name; ``tier``, ``outcome`` and ``le`` keep their names
    (an empty or missing value is an absent label, as in Prometheus); the scrape target
    becomes ``instance="<node>"`` (``instance="client"`` for the fleet-wide series).
    """
    store = []
    for tgt in tsdb.targets:
        for k, col in enumerate(tgt.columns):
            labels = {"__name__": col[0], "instance": instance_label(tgt.node)}
            for key, value in zip(("tier", "outcome", "le"), col[1:], strict=False):
                if value is not None and value != "":
                    labels[key] = str(value)
            ok = ~np.isnan(tgt.values[:, k])
            store.append(Series(tuple(sorted(labels.items())), tgt.times[ok],
                                tgt.values[ok, k]))
    return store


class Evaluator:
    """Evaluates parsed expressions over a series store at a vector of instants."""

    def __init__(self, store: list[Series]):
        self.store = store
        self._by_name: dict = {}
        for s in store:
            self._by_name.setdefault(s.label("__name__"), []).append(s)

    def add(self, series: list[Series]):
        for s in series:
            self.store.append(s)
            self._by_name.setdefault(s.label("__name__"), []).append(s)

    def evaluate(self, node, t_eval):
        """A :class:`Vector`, or a (T,) array for a scalar expression."""
        t = np.atleast_1d(np.asarray(t_eval, dtype=float))
        return self._eval(node, t)

    # -- dispatch
    def _eval(self, node, t):
        if isinstance(node, Number):
            return np.full(t.size, node.value)
        if isinstance(node, Selector):
            return self._instant(node, t)
        if isinstance(node, Unary):
            v = self._eval(node.expr, t)
            if isinstance(v, np.ndarray):
                return -v
            return Vector([(_drop_name(lab), -val, ok) for lab, val, ok in v.series])
        if isinstance(node, Binary):
            return self._binary(node, t)
        if isinstance(node, Aggregate):
            return _aggregate(node, self._eval(node.expr, t), t.size)
        if isinstance(node, Call):
            return self._call(node, t)
        raise TypeError(node)

    def select(self, sel: Selector) -> list[Series]:
        pool = self._by_name.get(sel.name, []) if sel.name else self.store
        return [s for s in pool if all(_matches(m, s.label(m[0])) for m in sel.matchers)]

    def _instant(self, sel: Selector, t):
        """Newest sample in [t - 5m, t] (offset shifts t); a stale marker hides it."""
        te = t - sel.offset_s
        out = []
        for s in self.select(sel):
            i = np.searchsorted(s.times, te, side="right") - 1
            ok = i >= 0
            ok[ok] = s.times[i[ok]] >= te[ok] - LOOKBACK_S
            if s.stale is not None and s.stale.size:
                j = np.searchsorted(s.stale, te, side="right") - 1
                marked = j >= 0
                marked[marked] = s.stale[j[marked]] > np.where(ok, s.times[np.maximum(i, 0)],
                                                               -np.inf)[marked]
                ok &= ~marked
            val = np.where(ok, s.values[np.maximum(i, 0)] if s.times.size else np.nan, np.nan)
            out.append((s.labels, val, ok))
        return Vector(out)

    def _binary(self, node: Binary, t):
        lhs, rhs = self._eval(node.lhs, t), self._eval(node.rhs, t)
        op = node.op
        if isinstance(lhs, np.ndarray) and isinstance(rhs, np.ndarray):
            value, keep = _op(op, lhs, rhs)
            return np.where(keep, 1.0, 0.0) if op in COMPARISON else value
        if isinstance(rhs, np.ndarray) or isinstance(lhs, np.ndarray):
            return _vector_scalar(node, lhs, rhs)
        return _vector_vector(node, lhs, rhs)

    def _call(self, node: Call, t):
        f = node.func
        if f in RANGE_FUNCTIONS:
            return self._range_function(f, node.args[0], t)
        if f == "histogram_quantile":
            return _histogram_quantile(self._eval(node.args[0], t), self._eval(node.args[1], t))
        v = self._eval(node.args[0], t)
        if f == "abs":
            return Vector([(_drop_name(lab), np.abs(val), ok) for lab, val, ok in v.series])
        bound = self._eval(node.args[1], t)
        fn = np.maximum if f == "clamp_min" else np.minimum
        return Vector([(_drop_name(lab), fn(val, bound), ok) for lab, val, ok in v.series])

    def _range_function(self, f: str, sel: Selector, t):
        te, rng = t - sel.offset_s, sel.range_s
        out = []
        for s in self.select(sel):
            tgt, col = s.target(), np.array([0])
            if f in ("rate", "increase", "delta"):
                v = increase(tgt, col, te, rng, as_rate=f == "rate", counter=f != "delta")[:, 0]
            elif f == "irate":
                v = _irate(s.times, s.values, te, rng)
            elif f in ("sum_over_time", "count_over_time", "avg_over_time"):
                v = _sum_count(s.times, s.values, te, rng, f)
            else:
                with np.errstate(invalid="ignore", divide="ignore"):
                    v = over_time(tgt, col, te, rng, f.removesuffix("_over_time"))[:, 0]
            ok = ~np.isnan(v)  # the tsdb functions return NaN where Prometheus returns nothing
            if f in ("min_over_time", "max_over_time", "last_over_time", "avg_over_time",
                     "sum_over_time"):
                lo, hi = window(s.times, te, rng)
                ok = hi >= lo  # a NaN sample value is still a result
            labels = s.labels if f == "last_over_time" else _drop_name(s.labels)
            out.append((labels, v, ok))
        return Vector(out)


# ---- functions not in the tsdb module --------------------------------------------------
def _irate(times, values, te, rng):
    lo, hi = window(times, te, rng)
    out = np.full(te.size, np.nan)
    ok = hi - lo >= 1
    last, prev = values[hi[ok]], values[hi[ok] - 1]
    dt = times[hi[ok]] - times[hi[ok] - 1]
    inc = np.where(last < prev, last, last - prev)  # a counter reset: the new value counts
    out[ok] = inc / dt
    return out


def _sum_count(times, values, te, rng, f: str):
    """``sum``/``count``/``avg_over_time``, adding in sample order as Prometheus does
    (vectorised over instants, one step per sample position in the window)."""
    lo, hi = window(times, te, rng)
    n = np.maximum(hi - lo + 1, 0)
    out = np.full(te.size, np.nan)
    ok = n > 0
    if f == "count_over_time":
        out[ok] = n[ok]
        return out
    acc, c = np.zeros(te.size), np.zeros(te.size)  # Kahan-Neumaier, as Prometheus 2.42
    with np.errstate(all="ignore"):
        for j in range(int(n.max(initial=0))):
            on = j < n
            v = values[np.minimum(lo + j, values.size - 1)]
            inc = v / (j + 1) - acc / (j + 1) if f == "avg_over_time" else v
            t = acc + inc
            c = np.where(on, c + np.where(np.abs(acc) >= np.abs(inc), (acc - t) + inc,
                                          (inc - t) + acc), c)
            acc = np.where(on, t, acc)
        result = np.where(np.isinf(acc), acc, acc + c)
    out[ok] = result[ok]
    return out


def _histogram_quantile(q: np.ndarray, v: Vector) -> Vector:
    """Per group of series equal but for ``le``: Prometheus' bucketQuantile at each instant."""
    groups: dict = {}
    for lab, val, ok in v.series:
        d = dict(lab)
        try:
            le = float(d.pop("le")) if "le" in d else None
        except ValueError:
            le = None
        if le is None:
            continue  # Prometheus ignores series without a usable le
        d.pop("__name__", None)
        groups.setdefault(tuple(sorted(d.items())), []).append((le, val, ok))
    out = []
    for key, buckets in groups.items():
        les = np.array([b[0] for b in buckets])
        vals = np.column_stack([b[1] for b in buckets])
        oks = np.column_stack([b[2] for b in buckets])
        present = oks.any(axis=1)
        res = np.full(q.size, np.nan)
        patterns = {tuple(r) for r in oks[present]}
        for pat in patterns:  # usually one: every bucket present together
            cols = np.flatnonzero(pat)
            rows = present & (oks == np.array(pat)).all(axis=1)
            bounds = np.unique(les[cols])
            # buckets with the same bound add up (coalesceBuckets)
            onehot = (les[cols][:, None] == bounds[None, :]).astype(float)
            counts = vals[np.ix_(rows, cols)] @ onehot
            for qv in np.unique(q[rows]):
                sub = rows & (q == qv)
                if np.isnan(qv):
                    res[sub] = np.nan
                elif qv < 0 or qv > 1:
                    res[sub] = -np.inf if qv < 0 else np.inf
                else:
                    res[sub] = bucket_quantile(qv, bounds, counts[(q[rows] == qv)])
        out.append((key, res, present))
    return Vector(out)


# ---- operators ----------------------------------------------------------------------------
def _op(op: str, a, b):
    """(value, keep): the arithmetic result, or the comparison's truth with a's value."""
    with np.errstate(all="ignore"):
        if op == "+":
            return a + b, None
        if op == "-":
            return a - b, None
        if op == "*":
            return a * b, None
        if op == "/":
            return a / b, None
        if op == "%":
            return np.fmod(a, b), None
        if op == "^":
            return np.power(a, b), None
        keep = {"==": np.equal, "!=": np.not_equal, ">": np.greater, "<": np.less,
                ">=": np.greater_equal, "<=": np.less_equal}[op](a, b)
        return a, keep


def _drop_name(labels: tuple) -> tuple:
    return tuple(kv for kv in labels if kv[0] != "__name__")


def _vector_scalar(node: Binary, lhs, rhs) -> Vector:
    swap = isinstance(lhs, np.ndarray)
    vec, scalar = (rhs, lhs) if swap else (lhs, rhs)
    out = []
    for lab, val, ok in vec.series:
        a, b = (scalar, val) if swap else (val, scalar)
        value, keep = _op(node.op, a, b)
        if node.op in COMPARISON:
            value = val  # a filter keeps the vector's own value, whichever side it is on
            if node.bool_:
                value, keep = np.where(keep, 1.0, 0.0), np.ones_like(keep)
            present = ok & keep
            lab = _drop_name(lab) if node.bool_ else lab
        else:
            present, lab = ok, _drop_name(lab)
        out.append((lab, np.where(present, value, np.nan), present))
    return Vector(out)


def _signature(labels: tuple, node: Binary) -> tuple:
    if node.on is not None:
        return tuple(kv for kv in labels if kv[0] in node.on)
    return tuple(kv for kv in labels if kv[0] != "__name__" and kv[0] not in node.ignoring)


def _vector_vector(node: Binary, lhs: Vector, rhs: Vector) -> Vector:
    """One-to-one matching on the signature (``on``/``ignoring``), as Prometheus' VectorBinop."""
    right: dict = {}
    for lab, val, ok in rhs.series:
        right.setdefault(_signature(lab, node), []).append((lab, val, ok))
    for sig, items in right.items():
        if len(items) > 1 and (np.sum([o for _, _, o in items], axis=0) > 1).any():
            raise PromQLError(f"found duplicate series for the match group {dict(sig)} on "
                              "the right hand-side of the operation: many-to-many matching "
                              "not allowed", "", node.pos)
    results: dict = {}
    matched: dict = {}
    for lab, val, ok in lhs.series:
        sig = _signature(lab, node)
        for _rlab, rval, rok in right.get(sig, []):
            both = ok & rok
            if not both.any():
                continue
            seen = matched.setdefault(sig, np.zeros_like(both))
            if (seen & both).any():
                raise PromQLError(f"multiple matches for labels {dict(sig)}: many-to-one "
                                  "matching must be explicit (group_left/group_right, "
                                  "unsupported)", "", node.pos)
            matched[sig] = seen | both
            value, keep = _op(node.op, val, rval)
            if node.op in COMPARISON:
                if node.bool_:
                    value, keep = np.where(keep, 1.0, 0.0), np.ones_like(both)
                present = both & keep
            else:
                present = both
            res = lab
            if node.op in ARITHMETIC or node.bool_:
                res = _drop_name(res)
            if node.on is not None:
                res = tuple(kv for kv in res if kv[0] in node.on)
            else:
                res = tuple(kv for kv in res if kv[0] not in node.ignoring)
            if res in results:
                pv, pok = results[res]
                if (pok & present).any():
                    raise PromQLError(f"multiple matches for labels {dict(res)}: grouping "
                                      "labels must ensure unique matches", "", node.pos)
                results[res] = (np.where(present, value, pv), pok | present)
            else:
                results[res] = (np.where(present, value, np.nan), present)
    return Vector([(lab, v, ok) for lab, (v, ok) in results.items()])


def _aggregate(node: Aggregate, v: Vector, n_t: int) -> Vector:
    groups: dict = {}
    for lab, val, ok in v.series:
        if node.without:
            key = tuple(kv for kv in lab if kv[0] != "__name__" and kv[0] not in node.labels)
        else:
            key = tuple(kv for kv in lab if kv[0] in node.labels)
        groups.setdefault(key, []).append((lab, val, ok))
    out = []
    for key, items in groups.items():
        items.sort(key=lambda i: i[0])  # Prometheus adds in its series order: sorted labels
        vals = np.vstack([i[1] for i in items])
        oks = np.vstack([i[2] for i in items])
        n = oks.sum(axis=0)
        present = n > 0
        if node.op == "count":
            value = n.astype(float)
        elif node.op in ("sum", "avg"):
            value = _sequential(vals, oks, node.op == "avg")
        else:
            masked = np.where(oks, vals, np.nan)
            with np.errstate(all="ignore"):
                reduce = np.fmin if node.op == "min" else np.fmax  # NaN only if all are NaN
                value = reduce.reduce(masked, axis=0)
        out.append((key, np.where(present, value, np.nan), present))
    return Vector(out)


def _sequential(vals: np.ndarray, oks: np.ndarray, mean: bool) -> np.ndarray:
    """Sum, or Prometheus' incremental mean (``mean += v/n - mean/n``), series by series
    in order, vectorised over the instants: the same float operations, the same bits."""
    acc = np.zeros(vals.shape[1])
    n = np.zeros(vals.shape[1])
    with np.errstate(all="ignore"):
        for v, ok in zip(vals, oks, strict=True):
            n = n + ok
            if mean:
                step = np.where(n == 1, v, acc + (v / n - acc / n))
            else:
                step = acc + v
            acc = np.where(ok, step, acc)
    return acc


def evaluate(expr, tsdb: TSDB, t_eval) -> Vector | np.ndarray:
    """Parse (if text) and evaluate over a TSDB at the instants ``t_eval``."""
    node = parse(expr) if isinstance(expr, str) else expr
    return Evaluator(store_from_tsdb(tsdb)).evaluate(node, t_eval)


def to_frame(result, t_eval):
    """A long polars table (time_s, labels, value) of an evaluation, for reading."""
    import polars as pl

    t = np.atleast_1d(np.asarray(t_eval, dtype=float))
    if isinstance(result, np.ndarray):
        return pl.DataFrame({"time_s": t, "labels": ["{}"] * t.size, "value": result})
    rows = {"time_s": [], "labels": [], "value": []}
    for lab, val, ok in result.series:
        idx = np.flatnonzero(ok)
        rows["time_s"] += t[idx].tolist()
        rows["labels"] += [format_labels(lab)] * idx.size
        rows["value"] += val[idx].tolist()
    return pl.DataFrame(rows, schema={"time_s": pl.Float64, "labels": pl.String,
                                      "value": pl.Float64}).sort("time_s", "labels")


def format_labels(labels) -> str:
    """``{a="x", b="y"}`` with ``__name__`` first written as the metric name, as Prometheus."""
    d = dict(labels)
    name = d.pop("__name__", "")
    body = ", ".join(f'{k}="{_escape(v)}"' for k, v in sorted(d.items()))
    return f"{name}{{{body}}}"


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
