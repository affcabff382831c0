"""PromQL, parsed by hand and evaluated on relakit's TSDB at many instants at once.

Why hand-written: the maintained parser on PyPI (``promql-parser``, Rust-backed)
covers the language but keeps no positions in its AST and reports syntax errors
without one ("invalid promql query"); a rule file's author needs to be told *where*
the unsupported construct is. The grammar, by precedence (lowest first, as
Prometheus'; keywords and aggregation names are case-insensitive, as its lexer's):

.. code-block:: text

    expr       := or
    or         := andu ('or' [matching] andu)*
    andu       := cmp  (('and' | 'unless') [matching] cmp)*
    cmp        := add  (('==' | '!=' | '>' | '<' | '>=' | '<=') ['bool'] [matching] add)*
    add        := mul  (('+' | '-') [matching] mul)*
    mul        := unary (('*' | '/' | '%' | 'atan2') [matching] unary)*
    unary      := ('+' | '-') unary | pow
    pow        := postfix ['^' [matching] unary]            (right associative)
    postfix    := primary ['[' DURATION [':' [DURATION]] ']'] [at] ['offset' ['-'] DURATION] [at]
    at         := '@' (NUMBER | 'start()' | 'end()')
    primary    := NUMBER | STRING | '(' expr ')' | agg | call | selector
    agg        := AGG [grouping] '(' [param ','] expr ')' [grouping]
    grouping   := ('by' | 'without') '(' [LABEL (',' LABEL)*] ')'
    matching   := ('on' | 'ignoring') '(' [LABEL (',' LABEL)*] ')'
                  [('group_left' | 'group_right') ['(' [LABEL (',' LABEL)*] ')']]
    call       := FUNCTION '(' [expr (',' expr)*] ')'
    selector   := METRIC ['{' [matcher (',' matcher)*] '}'] | '{' matcher (',' matcher)* '}'
    matcher    := LABEL ('=' | '!=' | '=~' | '!~') STRING

Evaluation follows Prometheus 2.42 (the version ``promtool`` runs): an instant
selector takes the newest sample in ``[t - 5m, t]`` (lookback delta 5 min); a range
selector ``x[W]`` the samples in ``[t - W, t]``; a subquery ``e[W:S]`` evaluates
``e`` at the multiples of ``S`` in that window; ``rate``/``increase``/``delta``
extrapolate as ``extrapolatedRate``; ``histogram_quantile`` as ``bucketQuantile``;
arithmetic drops the metric name, filtering comparisons keep it. A NaN *value* is a
sample (``count`` counts it, ``x > 1`` drops it, it hides older samples); a missing
sample is not. Staleness markers are not modelled for scraped series (relakit's TSDB
stores none); the series a recording rule writes get them, as Prometheus writes
them (see :mod:`relakit.control.rules`).

The window functions' arithmetic is :mod:`relakit.control.promql_functions` (arrays
only); ``rate``/``increase``/``delta`` are :mod:`relakit.control.tsdb`'s kernel.

A value is evaluated at a whole vector of instants ``T`` at once: an instant vector
is a list of series, each with its labels, a value per instant and a mask saying at
which instants it exists. An evaluation error that Prometheus raises at one instant
(many-to-many matching, duplicate output label sets, an invalid ``holt_winters``
factor) fails that instant only: :meth:`Evaluator.evaluate` raises it, or, asked
for, returns it as a mask with the message (rule backtests report it per instant).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from relakit.control import promql_functions as fn
from relakit.control.tsdb import TSDB, Target, bucket_quantile, increase, window

LOOKBACK_S = 300.0  # Prometheus' default lookback delta
DEFAULT_SUBQUERY_STEP_S = 60.0  # a step-less subquery's step: the global evaluation_interval

# function -> (argument types, how many may be left out at the end, result type);
# types: s scalar, v instant vector, m range vector, str string; "str*" repeats
_MATH = ("abs", "ceil", "floor", "sqrt", "exp", "ln", "log2", "log10", "sgn", "acos", "acosh",
         "asin", "asinh", "atan", "atanh", "cos", "cosh", "sin", "sinh", "tan", "tanh", "deg",
         "rad")
_DATE = ("minute", "hour", "day_of_week", "day_of_month", "day_of_year", "days_in_month",
         "month", "year")
_OVER_TIME = ("avg_over_time", "min_over_time", "max_over_time", "sum_over_time",
              "count_over_time", "last_over_time", "stddev_over_time", "stdvar_over_time",
              "present_over_time")
RANGE_FUNCTIONS = ("rate", "irate", "increase", "delta", "idelta", "changes", "resets",
                   "deriv", "absent_over_time", *_OVER_TIME)
SIGNATURES = {
    **{f: (("m",), 0, "v") for f in RANGE_FUNCTIONS},
    **{f: (("v",), 0, "v") for f in _MATH + ("sort", "sort_desc", "timestamp", "absent")},
    **{f: (("v",), 1, "v") for f in _DATE},
    "quantile_over_time": (("s", "m"), 0, "v"),
    "predict_linear": (("m", "s"), 0, "v"),
    "holt_winters": (("m", "s", "s"), 0, "v"),
    "histogram_quantile": (("s", "v"), 0, "v"),
    "clamp": (("v", "s", "s"), 0, "v"),
    "clamp_min": (("v", "s"), 0, "v"),
    "clamp_max": (("v", "s"), 0, "v"),
    "round": (("v", "s"), 1, "v"),
    "label_replace": (("v", "str", "str", "str", "str"), 0, "v"),
    "label_join": (("v", "str", "str", "str*"), 0, "v"),
    "vector": (("s",), 0, "v"),
    "scalar": (("v",), 0, "s"),
    "time": ((), 0, "s"),
    "pi": ((), 0, "s"),
}
FUNCTIONS = tuple(SIGNATURES)
UNSUPPORTED_FUNCTIONS = ("histogram_count", "histogram_sum", "histogram_fraction",
                         "histogram_stddev", "histogram_stdvar")  # native histograms
AGGREGATIONS = ("sum", "avg", "min", "max", "count", "group", "stddev", "stdvar", "topk",
                "bottomk", "quantile", "count_values")
_AGG_PARAM = {"topk": "s", "bottomk": "s", "quantile": "s", "count_values": "str"}
UNSUPPORTED_AGGREGATIONS = ("limitk", "limit_ratio")  # Prometheus 3 only
ARITHMETIC = ("+", "-", "*", "/", "%", "^", "atan2")
COMPARISON = ("==", "!=", ">", "<", ">=", "<=")
SET_OPERATORS = ("and", "or", "unless")
# words Prometheus' lexer reads as keywords whatever their case
KEYWORDS = SET_OPERATORS + ("atan2", "offset", "by", "without", "on", "ignoring",
                            "group_left", "group_right", "bool") + AGGREGATIONS
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
class String:
    value: str
    pos: int = 0


@dataclass(frozen=True)
class Selector:
    """``name{matchers}``, optionally ``[range]``, ``offset`` and ``@``; matchers are
    (label, op, value) with op one of = != =~ !~ (the name is a ``__name__`` matcher).
    ``at`` is a time in seconds, ``"start"``/``"end"`` (a rule's instant) or None."""

    matchers: tuple
    range_s: float | None = None
    offset_s: float = 0.0
    pos: int = 0
    at: float | str | None = None

    @property
    def name(self) -> str | None:
        return next((v for k, op, v in self.matchers if k == "__name__" and op == "="), None)


@dataclass(frozen=True)
class Subquery:
    """``expr[range:step]`` (step None: the default step), with ``offset``/``@``."""

    expr: object
    range_s: float
    step_s: float | None = None
    offset_s: float = 0.0
    pos: int = 0
    at: float | str | None = None


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
    param: object = None  # topk/bottomk/quantile's number, count_values' label


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
    card: str = "one-to-one"  # many-to-one (group_left), one-to-many (group_right)
    include: tuple = ()  # the labels group_left/group_right copy from the "one" side


# ---- lexer ------------------------------------------------------------------------------
_TOKEN = re.compile(r"""
    (?P<ws>\s+|\#[^\n]*)
  | (?P<duration>(?:\d+(?:ms|[smhdwy]))+(?![\w.]))
  | (?P<number>0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)
  | (?P<ident>[a-zA-Z_][a-zA-Z0-9_:]*|:[a-zA-Z_:][a-zA-Z0-9_:]*)
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

    @property
    def word(self) -> str:
        """A keyword in lower case (Prometheus' lexer ignores their case); else the text."""
        low = self.text.lower()
        return low if self.kind == "ident" and low in KEYWORDS else self.text


def _lex(expr: str) -> list[Token]:
    out, i = [], 0
    while i < len(expr):
        m = _TOKEN.match(expr, i)
        if not m:
            if expr[i] in "\"'`":
                raise PromQLError("unterminated string", expr, i)
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


def kind_of(node) -> str:
    """The type of a node's value: ``scalar``, ``vector``, ``matrix`` or ``string``."""
    if isinstance(node, Number):
        return "scalar"
    if isinstance(node, String):
        return "string"
    if isinstance(node, Selector):
        return "vector" if node.range_s is None else "matrix"
    if isinstance(node, Subquery):
        return "matrix"
    if isinstance(node, Unary):
        return kind_of(node.expr)
    if isinstance(node, Binary):
        return "scalar" if kind_of(node.lhs) == kind_of(node.rhs) == "scalar" else "vector"
    if isinstance(node, Call):
        return {"s": "scalar", "v": "vector"}[SIGNATURES[node.func][2]]
    return "vector"  # Aggregate


def is_scalar(node) -> bool:
    """Whether an expression gives a scalar (the rule importer and checks ask)."""
    return kind_of(node) == "scalar"


def is_range(node) -> bool:
    """Whether an expression gives a range vector (``x[5m]``)."""
    return kind_of(node) == "matrix"


_KIND_NAMES = {"s": "scalar", "v": "vector", "m": "matrix", "str": "string"}
_KIND_EXAMPLES = {"scalar": "a number", "vector": "an instant vector",
                  "matrix": "a range vector such as x[5m]", "string": "a string"}


# ---- parser -----------------------------------------------------------------------------
#: nesting (parentheses, arguments, subqueries) and tree depth relakit parses and evaluates;
#: each level costs ~10 Python frames to parse and 3 to evaluate, and real rules nest a
#: handful deep (a 200-deep expression once ended a backtest in RecursionError, exit 3)
MAX_NESTING = 48
MAX_DEPTH = 200


class _Parser:
    def __init__(self, expr: str):
        self.expr = expr
        self.toks = _lex(expr)
        self.i = 0
        self.nesting = 0
        self.operations = 0

    @property
    def tok(self) -> Token:
        return self.toks[self.i]

    def fail(self, problem: str, tok: Token | None = None):
        tok = tok or self.tok
        raise PromQLError(problem, self.expr, tok.pos)

    def _found(self, t: Token | None = None) -> str:
        t = t or self.tok
        return "the end of the expression" if t.kind == "eof" else repr(t.text)

    def take(self, text: str | None = None, kind: str | None = None, what: str = "") -> Token:
        t = self.tok
        if (text is not None and t.word != text) or (kind is not None and t.kind != kind):
            want = repr(text) if text else kind
            self.fail(f"expected {want}{what}, found {self._found()}")
        self.i += 1
        return t

    def at(self, *words) -> bool:
        return self.tok.kind in ("op", "ident") and self.tok.word in words

    def parse(self):
        node = self.expr_()
        if self.tok.kind != "eof":
            self.fail(f"unexpected {self.tok.text!r} after a complete expression")
        if kind_of(node) == "string":
            self.fail("unsupported string literal (a string is a function's argument only)",
                      self.toks[0])
        return node

    def expr_(self):
        if self.nesting >= MAX_NESTING:
            self.fail(f"an expression nested more than {MAX_NESTING} levels deep "
                      "(parentheses, arguments, subqueries); relakit parses at most that")
        self.nesting += 1
        node = self.or_()
        self.nesting -= 1
        return node

    def _matching(self, op: Token):
        """``on(...)``/``ignoring(...)``, then ``group_left``/``group_right``."""
        on, ignoring, card, include = None, (), "one-to-one", ()
        if self.at("on", "ignoring"):
            kw = self.take().word
            labels = self._label_list()
            on, ignoring = (labels, ()) if kw == "on" else (None, labels)
            if self.at("group_left", "group_right"):
                g = self.take()
                if op.word in SET_OPERATORS:
                    self.fail(f"no grouping ({g.word}) allowed for '{op.word}' operation", g)
                card = "many-to-one" if g.word == "group_left" else "one-to-many"
                if self.tok.text == "(":
                    include = self._label_list()
        elif self.at("group_left", "group_right"):
            self.fail(f"'{self.tok.word}' must follow on(...) or ignoring(...)")
        return on, ignoring, card, include

    def or_(self):
        node = self.andu()
        while self.at("or"):
            op = self.take()
            m = self._matching(op)
            node = self._binary(op, node, self.andu(), False, *m)
        return node

    def andu(self):
        node = self.cmp()
        while self.at("and", "unless"):
            op = self.take()
            m = self._matching(op)
            node = self._binary(op, node, self.cmp(), False, *m)
        return node

    def cmp(self):
        node = self.add()
        while self.tok.kind == "op" and self.tok.text in COMPARISON:
            op = self.take()
            is_bool = bool(self.at("bool")) and self.take() is not None
            m = self._matching(op)
            node = self._binary(op, node, self.add(), is_bool, *m)
        return node

    def add(self):
        node = self.mul()
        while self.tok.kind == "op" and self.tok.text in ("+", "-"):
            op = self.take()
            m = self._matching(op)
            node = self._binary(op, node, self.mul(), False, *m)
        return node

    def mul(self):
        node = self.unary()
        while (self.tok.kind == "op" and self.tok.text in ("*", "/", "%")) or self.at("atan2"):
            op = self.take()
            m = self._matching(op)
            node = self._binary(op, node, self.unary(), False, *m)
        return node

    def unary(self):
        if self.tok.kind == "op" and self.tok.text in ("+", "-"):
            op = self.take()
            inner = self.unary()
            if kind_of(inner) not in ("scalar", "vector"):
                self.fail(f"unary '{op.text}' expects a scalar or an instant vector", op)
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
            m = self._matching(op)
            node = self._binary(op, node, self.unary(), False, *m)
        return node

    def _binary(self, op: Token, lhs, rhs, is_bool, on, ignoring, card="one-to-one",
                include=()):
        name = op.word
        self.operations += 1  # kind_of below walks the tree: bound it before it does
        if self.operations > 2 * MAX_DEPTH:
            self.fail(f"more than {2 * MAX_DEPTH} operations in one expression; relakit "
                      f"evaluates at most {MAX_DEPTH} deep (split it with recording rules)",
                      op)
        kl, kr = kind_of(lhs), kind_of(rhs)
        for k in (kl, kr):
            if k == "matrix":
                self.fail("a range vector cannot be an operand; apply a function such as "
                          "rate() to it", op)
            if k == "string":
                self.fail(f"a string cannot be an operand of '{name}'", op)
        scalar = kl == kr == "scalar"
        if name in SET_OPERATORS and "scalar" in (kl, kr):
            self.fail(f"set operator '{name}' not allowed with a scalar operand: both sides "
                      "must be instant vectors", op)
        if name in COMPARISON and scalar and not is_bool:
            self.fail("comparisons between scalars must use the 'bool' modifier", op)
        if is_bool and name not in COMPARISON:
            self.fail("'bool' applies to comparison operators only", op)
        if (on is not None or ignoring) and "scalar" in (kl, kr):
            self.fail("vector matching (on/ignoring) only applies between two vectors", op)
        return Binary(name, lhs, rhs, is_bool, on, ignoring, op.pos, card, include)

    def _at(self, node):
        at_tok = self.take("@")
        if not isinstance(node, Selector | Subquery):
            self.fail("'@' must follow a selector or a subquery", at_tok)
        if node.at is not None:
            self.fail("'@' given twice", at_tok)
        sign = 1.0
        if self.tok.text in ("+", "-"):
            sign = -1.0 if self.take().text == "-" else 1.0
        if self.tok.kind == "number":
            value = sign * float(self.take().text)
        elif self.at("start", "end") and self.toks[self.i + 1].text == "(":
            value = self.take().text
            self.take("(")
            self.take(")")
        else:
            self.fail(f"expected a time (seconds), start() or end() after '@', found "
                      f"{self._found()}")
        return _replace(node, at=value)

    def postfix(self):
        node = self.primary()
        if self.tok.text == "[":
            open_ = self.take()
            if self.tok.kind != "duration":
                self.fail("expected a duration such as 5m inside [ ]")
            rng = _duration(self.take(), self.expr)
            if self.tok.text == ":":
                self.take(":")
                step = _duration(self.take(), self.expr) if self.tok.kind == "duration" else None
                self.take("]")
                if kind_of(node) != "vector":
                    self.fail("a subquery needs an instant vector expression before "
                              "[range:step]", open_)
                node = Subquery(node, rng, step, 0.0, open_.pos)
            else:
                self.take("]", what=" or ':' (a subquery)")
                if not isinstance(node, Selector) or node.range_s is not None:
                    self.fail("a range [..] needs a selector before it; use a subquery "
                              "[range:step] for an expression", open_)
                node = _replace(node, range_s=rng)
        if self.tok.text == "@":
            node = self._at(node)
        if self.at("offset"):
            kw = self.take()
            if not isinstance(node, Selector | Subquery):
                self.fail("'offset' must follow a selector such as x or x[5m], or a "
                          "subquery", kw)
            sign = 1.0
            if self.tok.text in ("-", "+"):
                sign = -1.0 if self.take().text == "-" else 1.0
            if self.tok.kind != "duration":
                self.fail("expected a duration such as 5m after 'offset'")
            node = _replace(node, offset_s=sign * _duration(self.take(), self.expr))
            if self.tok.text == "@":
                node = self._at(node)
        if self.tok.text == "[":
            self.fail("a range or subquery [..] must come before 'offset' and '@'")
        if self.at("offset"):
            self.fail("'offset' given twice")
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
            self.i += 1
            return String(_string(t), t.pos)
        if t.text == "(":
            self.take()
            node = self.expr_()
            self.take(")", what=" closing the '(' at " + where(self.expr, t.pos))
            return node
        if t.text == "{":
            return self.selector(None, t)
        if t.kind != "ident":
            self.fail(f"expected an expression, found {self._found()}")
        low = t.text.lower()
        if low in ("inf", "nan"):
            self.i += 1
            return Number(float(low), t.pos)
        nxt = self.toks[self.i + 1]
        if t.word in AGGREGATIONS and (nxt.text == "(" or nxt.word in ("by", "without")):
            return self.aggregate()
        if t.text in UNSUPPORTED_AGGREGATIONS and nxt.text in ("(", "by", "without"):
            self.fail(f"unsupported aggregation '{t.text}'")
        if t.word in KEYWORDS:
            self.fail(f"expected an expression, found the keyword '{t.word}'")
        if nxt.text == "(":
            return self.call()
        self.i += 1
        return self.selector(t.text, t)

    def _label_list(self) -> tuple:
        self.take("(")
        labels = []
        while self.tok.text != ")":
            t = self.tok
            if t.kind == "string":  # Prometheus 3 quoted label names
                self.fail("unsupported quoted label name")
            labels.append(self.take(kind="ident", what=" (a label name)").text)
            if self.tok.text != ")":
                self.take(",", what=" or ')' in a label list")
        self.take(")")
        return tuple(labels)

    def aggregate(self):
        op = self.take()
        name = op.word
        labels, without = (), False
        if self.at("by", "without"):
            without = self.take().word == "without"
            labels = self._label_list()
        self.take("(", what=f" after {name}")
        param = None
        if name in _AGG_PARAM:
            param = self.expr_()
            self.take(",", what=f": {name} takes a parameter and an expression")
            want = _AGG_PARAM[name]
            if kind_of(param) != _KIND_NAMES[want]:
                self.fail(f"'{name}' expects {_KIND_EXAMPLES[_KIND_NAMES[want]]} as its "
                          "first argument", op)
        inner = self.expr_()
        if self.tok.text == ",":
            self.fail(f"'{name}' takes {'two arguments' if param is not None else 'one argument'}")
        self.take(")", what=f" closing {name}(")
        if self.at("by", "without"):
            if labels or without:
                self.fail("grouping given twice")
            without = self.take().word == "without"
            labels = self._label_list()
        if kind_of(inner) != "vector":
            self.fail(f"'{name}' expects an instant vector", op)
        if name == "count_values" and not _LABEL.match(param.value):
            self.fail(f"invalid label name {param.value!r} for count_values", op)
        return Aggregate(name, inner, labels, without, op.pos, param)

    def call(self):
        name = self.take()
        f = name.text
        if f not in SIGNATURES:
            self.fail(f"unsupported function '{f}'", name)
        self.take("(")
        args = []
        while self.tok.text != ")":
            args.append(self.expr_())
            if self.tok.text not in (")", ","):
                self.fail(f"expected ',' or ')' in the arguments of {f}(), found "
                          f"{self._found()}")
            if self.tok.text == ",":
                self.take(",")
        self.take(")")
        self._check_args(name, args)
        return Call(f, tuple(args), name.pos)

    def _check_args(self, name: Token, args: list):
        f = name.text
        kinds, optional, _ = SIGNATURES[f]
        variadic = bool(kinds) and kinds[-1].endswith("*")
        lo = len(kinds) - optional - (1 if variadic else 0)
        if len(args) < lo or (not variadic and len(args) > len(kinds)):
            want = f"{lo}" if optional == 0 else f"{lo} to {len(kinds)}"
            more = " or more" if variadic else ""
            self.fail(f"{f}() expects {want}{more} argument(s), got {len(args)}", name)
        for k, a in enumerate(args):
            want = _KIND_NAMES[kinds[min(k, len(kinds) - 1)].rstrip("*")]
            got = kind_of(a)
            if got != want:
                self.fail(f"{f}() expects {_KIND_EXAMPLES[want]} as argument {k + 1}, got "
                          f"{_KIND_EXAMPLES[got]}", name)
        if f == "label_replace":
            if not _LABEL.match(args[1].value):
                self.fail(f"invalid destination label name {args[1].value!r} in "
                          "label_replace()", name)
            try:
                _regex(args[4].value)
            except re.error as exc:
                self.fail(f"invalid regular expression {args[4].value!r} in label_replace(): "
                          f"{exc}", name)
        if f == "label_join":
            for a in args[1:2] + args[3:]:
                if not _LABEL.match(a.value):
                    self.fail(f"invalid label name {a.value!r} in label_join()", name)

    def selector(self, name: str | None, start: Token) -> Selector:
        matchers = [("__name__", "=", name)] if name else []
        if self.tok.text == "{":
            self.take("{")
            while self.tok.text != "}":
                if self.tok.kind == "string":
                    self.fail("unsupported quoted metric or label name inside { }")
                label = self.take(kind="ident", what=" (a label name)")
                op = self.tok
                if op.text not in ("=", "!=", "=~", "!~"):
                    self.fail(f"expected a matcher operator (=, !=, =~, !~) after "
                              f"'{label.text}'")
                self.i += 1
                value = self.take(kind="string")
                text = _string(value)
                if op.text in ("=~", "!~"):
                    try:
                        _regex(text)
                    except re.error as exc:
                        self.fail(f"invalid regular expression {text!r}: {exc}", value)
                if label.text == "__name__" and name:
                    self.fail("metric name given twice (before { } and as __name__)", label)
                matchers.append((label.text, op.text, text))
                if self.tok.text != "}":
                    self.take(",", what=" or '}' between matchers")
            self.take("}")
        if not any(matcher_matches(m, "") is False for m in matchers):
            self.fail("a selector must have at least one matcher that does not match the "
                      "empty string", start)
        return Selector(tuple(matchers), None, 0.0, start.pos)


_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


def _replace(node, **changes):
    from dataclasses import replace

    return replace(node, **changes)


def parse(expr: str):
    """The syntax tree of ``expr``; :class:`PromQLError` (what and where) otherwise."""
    if not isinstance(expr, str) or not expr.strip():
        raise PromQLError("empty expression", str(expr), 0)
    parser = _Parser(expr)
    node = parser.parse()
    depth = tree_depth(node)
    if depth > MAX_DEPTH:  # a long chain of operators is a deep tree, however flat its text
        raise PromQLError(f"an expression {depth} operations deep; relakit evaluates at "
                          f"most {MAX_DEPTH} (split it with recording rules)", expr, 0)
    return node


def tree_depth(node) -> int:
    """The tree's depth, without recursion (the check must not fail the way it guards)."""
    deepest, stack = 0, [(node, 1)]
    while stack:
        n, d = stack.pop()
        deepest = max(deepest, d)
        kids = [getattr(n, a, None) for a in ("expr", "lhs", "rhs", "param")]
        stack += [(k, d + 1) for k in [*kids, *getattr(n, "args", ())] if k is not None]
    return deepest


def selectors(node) -> list[Selector]:
    """Every selector in the tree (rules use it to see which series an expression reads)."""
    if isinstance(node, Selector):
        return [node]
    out = []
    for child in (getattr(node, a, None) for a in ("expr", "lhs", "rhs", "param")):
        if child is not None:
            out += selectors(child)
    for a in getattr(node, "args", ()):
        out += selectors(a)
    return out


def format_duration(seconds: float) -> str:
    """Seconds as a PromQL duration (``90`` -> ``1m30s``, ``0.5`` -> ``500ms``)."""
    ms = round(abs(seconds) * 1000)
    out = ""
    for unit, size in (("d", 86400000), ("h", 3600000), ("m", 60000), ("s", 1000),
                       ("ms", 1)):
        if ms >= size:
            out += f"{ms // size}{unit}"
            ms %= size
    return ("-" if seconds < 0 else "") + (out or "0s")


def _quote(v: str) -> str:
    return '"' + v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def to_text(node) -> str:
    """PromQL text for a tree, parsed back to the same tree (comments are gone; every
    operand of a binary operator is parenthesised, so precedence never changes)."""
    if isinstance(node, Number):
        v = node.value
        if np.isnan(v):
            return "NaN"
        if np.isinf(v):
            return "Inf" if v > 0 else "-Inf"
        return repr(v)
    if isinstance(node, String):
        return _quote(node.value)
    if isinstance(node, Selector | Subquery):
        if isinstance(node, Selector):
            name = node.name
            rest = [m for m in node.matchers if not (m[0] == "__name__" and m[1] == "="
                                                      and m[2] == name)]
            text = (name or "") + ("{" + ", ".join(f"{k}{op}{_quote(v)}" for k, op, v in rest)
                                   + "}" if rest or not name else "")
            if node.range_s is not None:
                text += f"[{format_duration(node.range_s)}]"
        else:
            step = format_duration(node.step_s) if node.step_s else ""
            text = f"({to_text(node.expr)})[{format_duration(node.range_s)}:{step}]"
        if node.at is not None:
            text += f" @ {node.at}()" if isinstance(node.at, str) else f" @ {node.at!r}"
        if node.offset_s:
            text += f" offset {format_duration(node.offset_s)}"
        return text
    if isinstance(node, Call):
        return f"{node.func}({', '.join(to_text(a) for a in node.args)})"
    if isinstance(node, Aggregate):
        grouping = ""
        if node.labels or node.without:
            grouping = f" {'without' if node.without else 'by'} ({', '.join(node.labels)})"
        param = f"{to_text(node.param)}, " if node.param is not None else ""
        return f"{node.op}{grouping} ({param}{to_text(node.expr)})"
    if isinstance(node, Unary):
        return f"-({to_text(node.expr)})"
    if isinstance(node, Binary):
        text = node.op + (" bool" if node.bool_ else "")
        if node.on is not None:
            text += f" on({', '.join(node.on)})"
        elif node.ignoring:
            text += f" ignoring({', '.join(node.ignoring)})"
        if node.card != "one-to-one":
            side = "group_left" if node.card == "many-to-one" else "group_right"
            text += f" {side}({', '.join(node.include)})"
        return f"({to_text(node.lhs)}) {text} ({to_text(node.rhs)})"
    raise TypeError(node)


def reach_s(node) -> float:
    """How far back (seconds) an expression reads, subqueries and offsets included."""
    if isinstance(node, Selector):
        return (node.range_s if node.range_s is not None else LOOKBACK_S) + max(node.offset_s, 0)
    if isinstance(node, Subquery):
        return node.range_s + max(node.offset_s, 0) + reach_s(node.expr)
    kids = [getattr(node, a, None) for a in ("expr", "lhs", "rhs", "param")]
    kids = [k for k in kids if k is not None] + list(getattr(node, "args", ()))
    return max((reach_s(k) for k in kids), default=0.0)


# ---- values -----------------------------------------------------------------------------
_REGEX: dict = {}


def _regex(pattern: str):
    """A Prometheus (RE2) regex compiled for Python's ``re``, for ``fullmatch``: Go
    accepts flags such as ``(?i)`` anywhere, Python only at the start, so a leading
    ``(?flags)`` becomes a scoped ``(?flags:...)``. Raises ``re.error`` if invalid."""
    r = _REGEX.get(pattern)
    if r is None:
        m = re.match(r"\(\?([imsU]+)\)", pattern)
        body = f"(?{m.group(1).replace('U', '')}:{pattern[m.end():]})" if m else \
            f"(?:{pattern})"
        r = _REGEX[pattern] = re.compile(body)
    return r


def matcher_matches(matcher, value: str) -> bool:
    """Whether a label value satisfies one ``(label, op, value)`` matcher (=, !=, =~, !~)."""
    _, op, want = matcher
    if op == "=":
        return value == want
    if op == "!=":
        return value != want
    hit = _regex(want).fullmatch(value) is not None  # Prometheus anchors regexes
    return hit if op == "=~" else not hit


@dataclass
class Series:
    """One stored series: its samples (a NaN value is a sample) and, for recorded
    series, the times of their staleness markers."""

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
    becomes ``instance="<node>"`` (``instance="client"`` for the fleet-wide series);
    every other label a recording kept (the trace's ``labels`` column) is a label.
    A sample whose value is NaN stays a sample (Prometheus stores NaN).
    """
    from relakit.traces import parse_label_text

    store = []
    for tgt in tsdb.targets:
        for k, col in enumerate(tgt.columns):
            labels = dict(parse_label_text(tgt.labels[k])) if tgt.labels is not None else {}
            labels.update({"__name__": col[0], "instance": instance_label(tgt.node)})
            for key, value in zip(("tier", "outcome", "le"), col[1:], strict=False):
                if value is not None and value != "":
                    labels[key] = str(value)
            ok = tgt.has(k)
            store.append(Series(tuple(sorted(labels.items())), tgt.times[ok],
                                tgt.values[ok, k]))
    return store


@dataclass
class _Matrix:
    """A range vector at T instants: series (labels, times, values), each window
    ``[end - range, end]``, and the instant past which samples are not yet written."""

    series: list
    end: np.ndarray
    range_s: float
    cut: list  # per series: None, or (T,) exclusive upper bound on sample times


class Evaluator:
    """Evaluates parsed expressions over a series store at a vector of instants.

    ``late`` names recorded series whose samples at the evaluation instant itself are
    not written yet (a rule reading a series a later rule records, as Prometheus'
    rule manager evaluates rules in order at each instant)."""

    def __init__(self, store: list[Series], default_step_s: float = DEFAULT_SUBQUERY_STEP_S):
        self.store = store
        self.default_step_s = float(default_step_s)
        self.late: frozenset = frozenset()
        self._by_name: dict = {}
        self._fails: list = []
        for s in store:
            self._by_name.setdefault(s.label("__name__"), []).append(s)

    def add(self, series: list[Series]):
        for s in series:
            self.store.append(s)
            self._by_name.setdefault(s.label("__name__"), []).append(s)

    def evaluate(self, node, t_eval, errors: str = "raise"):
        """A :class:`Vector`, or a (T,) array for a scalar expression.

        An instant at which Prometheus would fail the query (many-to-many matching, ...)
        raises :class:`PromQLError` naming it; with ``errors="return"`` the answer is
        ``(result, failed (T,) mask, message)`` and the result is empty where it failed."""
        t = np.atleast_1d(np.asarray(t_eval, dtype=float))
        self._fails = [[np.zeros(t.size, dtype=bool), None]]
        try:
            res = self._eval(node, t)
        finally:
            failed, msg = self._fails.pop()
        if isinstance(res, _Matrix):
            raise PromQLError("a range vector is not a value at an instant; apply a "
                              "function such as rate() to it", "", getattr(node, "pos", 0))
        if errors == "raise":
            if failed.any():
                text, pos = msg
                raise PromQLError(f"{text} (at {t[np.argmax(failed)]:g} s)", "", pos)
            return res
        if isinstance(res, Vector):
            res = Vector([(lab, val, ok & ~failed) for lab, val, ok in res.series])
        return res, failed, (msg[0] if msg else None)

    def _error(self, mask, text: str, pos: int):
        """Fail the instants in ``mask`` (the first message is kept)."""
        mask = np.asarray(mask, dtype=bool)
        if mask.any():
            cur = self._fails[-1]
            cur[0] |= mask
            if cur[1] is None:
                cur[1] = (text, pos)

    # -- dispatch
    def _eval(self, node, t):
        if isinstance(node, Number):
            return np.full(t.size, node.value)
        if isinstance(node, String):
            return node.value
        if isinstance(node, Selector):
            if node.range_s is not None:
                return self._matrix(node, t)
            return self._instant(node, t)[0]
        if isinstance(node, Subquery):
            return self._matrix(node, t)
        if isinstance(node, Unary):
            v = self._eval(node.expr, t)
            if isinstance(v, np.ndarray):
                return -v
            return Vector([(drop_name(lab), -val, ok) for lab, val, ok in v.series])
        if isinstance(node, Binary):
            return self._binary(node, t)
        if isinstance(node, Aggregate):
            param = self._eval(node.param, t) if node.param is not None else None
            return _aggregate(self, node, self._eval(node.expr, t), param, t.size)
        if isinstance(node, Call):
            return self._unique(self._call(node, t), node.pos)
        raise TypeError(node)

    def select(self, sel: Selector) -> list[Series]:
        pool = self._by_name.get(sel.name, []) if sel.name else self.store
        return [s for s in pool if all(matcher_matches(m, s.label(m[0])) for m in sel.matchers)]

    def _when(self, node, t):
        """The instants a selector or subquery reads at: ``@`` then ``offset``."""
        base = t if node.at in (None, "start", "end") else np.full(t.size, float(node.at))
        return base - node.offset_s

    def _cut(self, s: Series, t):
        """Samples at or after ``t`` of a late series are not written yet."""
        return t if s.label("__name__") in self.late else None

    def _instant(self, sel: Selector, t):
        """Newest sample in [t - 5m, t] (offset/@ move t); a stale marker hides it.
        Returns (Vector, per series the sample times)."""
        te = self._when(sel, t)
        out, stamps = [], []
        for s in self.select(sel):
            i = np.searchsorted(s.times, te, side="right") - 1
            cut = self._cut(s, t)
            if cut is not None:
                i = np.minimum(i, np.searchsorted(s.times, cut, side="left") - 1)
            ok = i >= 0
            ok[ok] = s.times[i[ok]] >= te[ok] - LOOKBACK_S
            if s.stale is not None and s.stale.size:
                j = np.searchsorted(s.stale, te, side="right") - 1
                marked = j >= 0
                marked[marked] = s.stale[j[marked]] > np.where(ok, s.times[np.maximum(i, 0)],
                                                               -np.inf)[marked]
                ok &= ~marked
            has = s.times.size > 0
            val = np.where(ok, s.values[np.maximum(i, 0)] if has else np.nan, np.nan)
            stamps.append(np.where(ok, s.times[np.maximum(i, 0)] if has else np.nan, np.nan))
            out.append((s.labels, val, ok))
        return Vector(out), stamps

    def _matrix(self, node, t) -> _Matrix:
        te = self._when(node, t)
        if isinstance(node, Selector):
            chosen = self.select(node)
            return _Matrix([(s.labels, s.times, s.values) for s in chosen], te, node.range_s,
                           [self._cut(s, t) for s in chosen])
        # a subquery: the inner expression at the multiples of the step in the window
        step_ms = round((node.step_s or self.default_step_s) * 1000)
        rng_ms = round(node.range_s * 1000)
        te_ms = np.round(te * 1000).astype(np.int64)
        first = (te_ms.min() - rng_ms) // step_ms * step_ms
        if first < te_ms.min() - rng_ms:
            first += step_ms
        grid_ms = np.arange(first, te_ms.max() + 1, step_ms, dtype=np.int64)
        grid = grid_ms / 1000.0
        self._fails.append([np.zeros(grid.size, dtype=bool), None])
        try:
            inner = self._eval(node.expr, grid)
        finally:
            failed, msg = self._fails.pop()
        if failed.any():  # an instant whose window holds a failed step fails
            lo, hi = window(grid[failed], te, node.range_s)
            self._error(hi >= lo, *msg)
        series = [(lab, grid[ok], val[ok]) for lab, val, ok in inner.series if ok.any()]
        return _Matrix(series, te, node.range_s, [None] * len(series))

    def _binary(self, node: Binary, t):
        lhs, rhs = self._eval(node.lhs, t), self._eval(node.rhs, t)
        op = node.op
        if isinstance(lhs, np.ndarray) and isinstance(rhs, np.ndarray):
            value, keep = _op(op, lhs, rhs)
            return np.where(keep, 1.0, 0.0) if op in COMPARISON else value
        if isinstance(rhs, np.ndarray) or isinstance(lhs, np.ndarray):
            return self._unique(_vector_scalar(node, lhs, rhs), node.pos)
        if op in SET_OPERATORS:
            return self._unique(_set_operation(node, lhs, rhs), node.pos)
        return self._unique(self._vector_vector(node, lhs, rhs), node.pos)

    def _unique(self, v, pos: int):
        """Series with the same labels merged; present together, they fail the instant
        ("vector cannot contain metrics with the same labelset", as Prometheus)."""
        if not isinstance(v, Vector):
            return v
        merged: dict = {}
        for lab, val, ok in v.series:
            if lab in merged:
                pv, pok = merged[lab]
                self._error(pok & ok, "vector cannot contain metrics with the same labelset "
                            f"{format_labels(lab)}", pos)
                merged[lab] = (np.where(ok, val, pv), pok | ok)
            else:
                merged[lab] = (val, ok)
        if len(merged) == len(v.series):
            return v
        return Vector([(lab, val, ok) for lab, (val, ok) in merged.items()])

    def _vector_vector(self, node: Binary, lhs: Vector, rhs: Vector) -> Vector:
        """One-to-one, many-to-one (group_left) or one-to-many (group_right) matching on
        the signature (``on``/``ignoring``), as Prometheus' VectorBinop; a match it would
        refuse fails those instants."""
        swap = node.card == "one-to-many"
        many, one = (rhs, lhs) if swap else (lhs, rhs)
        side = "left" if swap else "right"
        ones: dict = {}
        for lab, val, ok in one.series:
            ones.setdefault(_signature(lab, node), []).append((lab, val, ok))
        for sig, items in ones.items():
            if len(items) > 1:
                dup = np.sum([o for _, _, o in items], axis=0) > 1
                self._error(dup, f"found duplicate series for the match group {_fmt(sig)} on "
                            f"the {side} hand-side of the operation: many-to-many matching "
                            "not allowed: matching labels must be unique on one side", node.pos)
        out, count = [], {}
        for lab, val, ok in many.series:
            sig = _signature(lab, node)
            for olab, oval, ook in ones.get(sig, ()):
                both = ok & ook
                if not both.any():
                    continue
                vl, vr = (oval, val) if swap else (val, oval)
                value, keep = _op(node.op, vl, vr)
                if node.op in COMPARISON:
                    if node.bool_:
                        value, present = np.where(keep, 1.0, 0.0), both
                    else:
                        present = both & keep
                else:
                    present = both
                res = _result_labels(lab, olab, node)
                key = sig if node.card == "one-to-one" else (sig, res)
                count[key] = count.get(key, 0) + present.astype(np.int64)
                out.append((res, np.where(present, value, np.nan), present))
        for key, n in count.items():
            if node.card == "one-to-one":
                self._error(n > 1, f"multiple matches for labels {_fmt(key)}: many-to-one "
                            "matching must be explicit (group_left/group_right)", node.pos)
            else:
                self._error(n > 1, f"multiple matches for labels {_fmt(key[0])}: grouping "
                            "labels must ensure unique matches", node.pos)
        return Vector(out)

    # -- functions
    def _call(self, node: Call, t):
        f, args = node.func, node.args
        if f in RANGE_FUNCTIONS or f in ("quantile_over_time", "predict_linear",
                                         "holt_winters"):
            m_arg = next(a for a in args if kind_of(a) == "matrix")
            scalars = [self._eval(a, t) for a in args if kind_of(a) == "scalar"]
            return self._range_function(node, self._eval(m_arg, t), scalars, t)
        if f == "time":
            return t.copy()
        if f == "pi":
            return np.full(t.size, np.pi)
        if f == "vector":
            return Vector([((), self._eval(args[0], t), np.ones(t.size, dtype=bool))])
        if f in _DATE and not args:
            return _date(f, Vector([((), t.copy(), np.ones(t.size, dtype=bool))]))
        if f == "timestamp":
            if isinstance(args[0], Selector):
                v, stamps = self._instant(args[0], t)
                return Vector([(drop_name(lab), ts, ok)
                               for (lab, _, ok), ts in zip(v.series, stamps, strict=True)])
            v = self._eval(args[0], t)
            return Vector([(drop_name(lab), t.copy(), ok) for lab, _, ok in v.series])
        if f == "histogram_quantile":
            return _histogram_quantile(self._eval(args[0], t), self._eval(args[1], t))
        v = self._eval(args[0], t)
        rest = [self._eval(a, t) for a in args[1:]]
        if f == "scalar":
            n = np.sum([ok for _, _, ok in v.series], axis=0) if v.series else np.zeros(t.size)
            out = np.full(t.size, np.nan)
            for _, val, ok in v.series:
                out = np.where(ok & (n == 1), val, out)
            return out
        if f == "absent":
            seen = np.zeros(t.size, dtype=bool)
            for _, _, ok in v.series:
                seen |= ok
            lab = _absent_labels(args[0]) if isinstance(args[0], Selector) else ()
            return Vector([(lab, np.ones(t.size), ~seen)])
        if f in ("sort", "sort_desc"):
            return v  # an instant vector's order does not matter to rules
        if f == "label_replace":
            return _label_replace(v, *rest)
        if f == "label_join":
            return _label_join(v, rest[0], rest[1], rest[2:])
        if f in _DATE:
            return _date(f, v)
        return Vector([(drop_name(lab), *fn.instant_function(f, val, ok, rest))
                       for lab, val, ok in v.series])

    def _range_function(self, node: Call, m: _Matrix, scalars: list, t):
        f = node.func
        te, rng = m.end, m.range_s
        out = []
        if f == "absent_over_time":
            seen = np.zeros(te.size, dtype=bool)
            for (_, times, _), cut in zip(m.series, m.cut, strict=True):
                lo, hi = fn.window_bounds(times, te, rng, cut)
                seen |= hi >= lo
            arg = node.args[0]
            lab = _absent_labels(arg) if isinstance(arg, Selector) else ()
            return Vector([(lab, np.ones(te.size), ~seen)])
        for (labels, times, values), cut in zip(m.series, m.cut, strict=True):
            lo, hi = fn.window_bounds(times, te, rng, cut)
            n = hi - lo + 1
            ok = n > 0
            if f in ("rate", "increase", "delta"):
                tgt = Target(-1, times, values[:, None], [labels])
                v = increase(tgt, np.array([0]), te, rng, as_rate=f == "rate",
                             counter=f != "delta", nan_samples=True, cut=cut)[:, 0]
                ok = n >= 2
            elif f in ("irate", "idelta"):
                v, ok = fn.instant_rate(times, values, lo, hi, f == "irate")
            elif f in ("sum_over_time", "avg_over_time"):
                v = fn.sum_count(values, lo, n, f == "avg_over_time")
            elif f == "count_over_time":
                v = n.astype(float)
            elif f == "present_over_time":
                v = np.ones(te.size)
            elif f == "last_over_time":
                v = values[np.clip(hi, 0, max(values.size - 1, 0))] if values.size else \
                    np.full(te.size, np.nan)
            elif f in ("min_over_time", "max_over_time"):
                v = fn.reduce_window(values, lo, n, np.fmin if f == "min_over_time" else np.fmax)
            elif f in ("stddev_over_time", "stdvar_over_time"):
                v = fn.stdvar_over_time(values, lo, n)
                if f == "stddev_over_time":
                    v = np.sqrt(v)
            elif f == "quantile_over_time":
                v = fn.quantile_window(values, lo, n, scalars[0])
            elif f in ("changes", "resets"):
                v = fn.changes(values, lo, hi, f == "resets")
            elif f == "deriv":
                slope, _ = fn.regression(times, values, lo, n, times[np.clip(lo, 0, max(
                    times.size - 1, 0))] if times.size else te)
                v, ok = slope, n >= 2
            elif f == "predict_linear":
                slope, icept = fn.regression(times, values, lo, n, t)
                v, ok = slope * scalars[0] + icept, n >= 2
            elif f == "holt_winters":
                sf, tf = scalars
                bad = ~((sf > 0) & (sf < 1)) | ~((tf > 0) & (tf < 1))
                self._error(bad, "invalid smoothing or trend factor in holt_winters(): "
                            "expected 0 < factor < 1", node.pos)
                v, ok = fn.holt_winters(values, lo, n, sf, tf), n >= 2
            else:
                raise AssertionError(f)
            labels = labels if f == "last_over_time" else drop_name(labels)
            out.append((labels, np.where(ok, v, np.nan), ok))
        return Vector(out)


def _date(f: str, v: Vector) -> Vector:
    return Vector([(drop_name(lab), fn.date_field(f, val), ok) for lab, val, ok in v.series])


def _go_expand(template: str, m: re.Match) -> str:
    """Go's Regexp.ExpandString: ``$1``, ``${1}``, ``$name``, ``${name}``, ``$$``; an
    unknown group is empty."""
    def group(name: str) -> str:
        try:
            g = m.group(int(name)) if name.isdigit() else m.group(name)
        except IndexError:  # no such group
            return ""
        return g or ""

    def sub(x: re.Match) -> str:
        if x.group(0) == "$$":
            return "$"
        return group(x.group(1) or x.group(2))

    return re.sub(r"\$\$|\$\{(\w+)\}|\$(\w+)", sub, template)


def _set_label(labels: tuple, key: str, value: str) -> tuple:
    d = dict(labels)
    if value:
        d[key] = value
    else:
        d.pop(key, None)
    return tuple(sorted(d.items()))


def _label_replace(v: Vector, dst: str, repl: str, src: str, regex: str) -> Vector:
    pattern = _regex(regex)
    out = []
    for lab, val, ok in v.series:
        m = pattern.fullmatch(dict(lab).get(src, ""))
        out.append((lab if m is None else _set_label(lab, dst, _go_expand(repl, m)), val, ok))
    return Vector(out)


def _label_join(v: Vector, dst: str, sep: str, srcs) -> Vector:
    out = []
    for lab, val, ok in v.series:
        d = dict(lab)
        out.append((_set_label(lab, dst, sep.join(d.get(s, "") for s in srcs)), val, ok))
    return Vector(out)


def _absent_labels(sel: Selector) -> tuple:
    """The labels ``absent`` gives: the selector's equality matchers, except a label
    matched twice or otherwise (Prometheus' createLabelsForAbsentFunction)."""
    d, drop = {}, set()
    for k, op, v in sel.matchers:
        if k == "__name__":
            continue
        if op == "=" and k not in d:
            d[k] = v
        else:
            drop.add(k)
    return tuple(sorted((k, v) for k, v in d.items() if k not in drop))


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
        if op == "atan2":
            return np.arctan2(a, b), None
        keep = {"==": np.equal, "!=": np.not_equal, ">": np.greater, "<": np.less,
                ">=": np.greater_equal, "<=": np.less_equal}[op](a, b)
        return a, keep


def drop_name(labels: tuple) -> tuple:
    """A series' labels without ``__name__`` (what a function's result keeps)."""
    return tuple(kv for kv in labels if kv[0] != "__name__")


def _fmt(labels: tuple) -> str:
    return format_labels(labels) if labels else "{}"


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
            lab = drop_name(lab) if node.bool_ else lab
        else:
            present, lab = ok, drop_name(lab)
        out.append((lab, np.where(present, value, np.nan), present))
    return Vector(out)


def _signature(labels: tuple, node: Binary) -> tuple:
    if node.on is not None:
        return tuple(kv for kv in labels if kv[0] in node.on)
    return tuple(kv for kv in labels if kv[0] != "__name__" and kv[0] not in node.ignoring)


def _result_labels(many: tuple, one: tuple, node: Binary) -> tuple:
    """Prometheus' resultMetric: the "many" side's labels, name dropped by arithmetic
    and ``bool``, reduced to the matching labels one-to-one, ``group_x`` labels copied."""
    res = many
    if node.op in ARITHMETIC or node.bool_:
        res = drop_name(res)
    if node.card == "one-to-one":
        if node.on is not None:
            res = tuple(kv for kv in res if kv[0] in node.on)
        else:
            res = tuple(kv for kv in res if kv[0] not in node.ignoring)
    for key in node.include:
        res = _set_label(res, key, dict(one).get(key, ""))
    return res


def _set_operation(node: Binary, lhs: Vector, rhs: Vector) -> Vector:
    """``and``/``or``/``unless`` per instant, on the matching signature (``or`` without
    on/ignoring: every label but the name), as VectorAnd/VectorOr/VectorUnless."""
    def presence(v: Vector) -> dict:
        seen: dict = {}
        for lab, _, ok in v.series:
            sig = _signature(lab, node)
            seen[sig] = seen[sig] | ok if sig in seen else ok
        return seen

    if node.op in ("and", "unless"):
        right = presence(rhs)
        out = []
        for lab, val, ok in lhs.series:
            there = right.get(_signature(lab, node), np.zeros_like(ok))
            keep = ok & there if node.op == "and" else ok & ~there
            out.append((lab, np.where(keep, val, np.nan), keep))
        return Vector(out)
    left = presence(lhs)
    out = list(lhs.series)
    for lab, val, ok in rhs.series:
        keep = ok & ~left.get(_signature(lab, node), np.zeros_like(ok))
        out.append((lab, np.where(keep, val, np.nan), keep))
    return Vector(out)


def _format_value(v: float) -> str:
    """A float as Go's strconv.FormatFloat(v, 'f', -1, 64) writes it (count_values)."""
    if np.isnan(v):
        return "NaN"
    if np.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return np.format_float_positional(v, trim="-")


def _aggregate(ev: Evaluator, node: Aggregate, v: Vector, param, n_t: int) -> Vector:
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
        op = node.op
        if op in ("topk", "bottomk"):
            out += _topk(items, vals, oks, param, op == "topk")
            continue
        if op == "count_values":
            out += _count_values(key, vals, oks, param)
            continue
        with np.errstate(all="ignore"):
            if op == "count":
                value = n.astype(float)
            elif op == "group":
                value = np.ones(n_t)
            elif op in ("sum", "avg"):
                value = fn.sequential(vals, oks, op == "avg")
            elif op in ("stddev", "stdvar"):
                value = fn.welford(vals, oks)
                value = np.sqrt(value) if op == "stddev" else value
            elif op == "quantile":
                order = np.argsort(~oks, axis=0, kind="stable")  # present values first
                rows = np.take_along_axis(vals, order, axis=0).T
                value = fn.go_quantile(rows, n, param)
            else:
                masked = np.where(oks, vals, np.nan)
                reduce = np.fmin if op == "min" else np.fmax  # NaN only if all are NaN
                value = reduce.reduce(masked, axis=0)
        out.append((key, np.where(present, value, np.nan), present))
    return Vector(out)


def _topk(items, vals, oks, param, top: bool) -> list:
    """The k largest (smallest) present values of the group per instant; NaN ranks last
    for both, as Prometheus' heaps do."""
    k = np.nan_to_num(np.asarray(param, dtype=float), nan=0.0)
    k = np.trunc(np.clip(k, -1e18, 1e18))
    key = np.where(np.isnan(vals), np.inf, -vals if top else vals)
    key = np.where(oks, key, np.nan)  # absent: after everything
    rank = np.argsort(np.argsort(key, axis=0, kind="stable"), axis=0, kind="stable")
    keep = oks & (rank < k[None, :]) & (k[None, :] >= 1)
    return [(lab, np.where(kp, val, np.nan), kp)
            for (lab, val, _), kp in zip(items, keep, strict=True) if kp.any()]


def _count_values(key: tuple, vals, oks, label: str) -> list:
    """One series per distinct value: the group's labels plus ``label`` = the value."""
    out = []
    present_vals = vals[oks]
    if present_vals.size == 0:
        return out
    texts = {}
    for x in np.unique(present_vals):  # NaN once (np.unique keeps NaNs apart: merge)
        texts.setdefault(_format_value(float(x)), []).append(x)
    for text, xs in texts.items():
        hit = np.zeros_like(oks)
        for x in xs:
            hit |= oks & ((vals == x) | (np.isnan(vals) & np.isnan(x)))
        n = hit.sum(axis=0)
        out.append((_set_label(key, label, text), n.astype(float), n > 0))
    return out


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
