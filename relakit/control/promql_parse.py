"""PromQL's grammar: the lexer, the tree, the parser, and the tree back to text.

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

:mod:`relakit.control.promql` evaluates the tree; this module knows nothing of values.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

LOOKBACK_S = 300.0  # Prometheus' default lookback delta: how far an instant selector reads
# function -> (argument types, how many may be left out at the end, result type);
# types: s scalar, v instant vector, m range vector, str string; "str*" repeats
_MATH = ("abs", "ceil", "floor", "sqrt", "exp", "ln", "log2", "log10", "sgn", "acos", "acosh",
         "asin", "asinh", "atan", "atanh", "cos", "cosh", "sin", "sinh", "tan", "tanh", "deg",
         "rad")
DATE_FUNCTIONS = ("minute", "hour", "day_of_week", "day_of_month", "day_of_year", "days_in_month",
         "month", "year")
_OVER_TIME = ("avg_over_time", "min_over_time", "max_over_time", "sum_over_time",
              "count_over_time", "last_over_time", "stddev_over_time", "stdvar_over_time",
              "present_over_time")
RANGE_FUNCTIONS = ("rate", "irate", "increase", "delta", "idelta", "changes", "resets",
                   "deriv", "absent_over_time", *_OVER_TIME)
SIGNATURES = {
    **{f: (("m",), 0, "v") for f in RANGE_FUNCTIONS},
    **{f: (("v",), 0, "v") for f in _MATH + ("sort", "sort_desc", "timestamp", "absent")},
    **{f: (("v",), 1, "v") for f in DATE_FUNCTIONS},
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


# ---- label matchers --------------------------------------------------------------------
_REGEX: dict = {}


def compiled_regex(pattern: str):
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
    _, op, want = matcher
    if op == "=":
        return value == want
    if op == "!=":
        return value != want
    hit = compiled_regex(want).fullmatch(value) is not None  # Prometheus anchors regexes
    return hit if op == "=~" else not hit


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
    return kind_of(node) == "scalar"


def is_range(node) -> bool:
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
                compiled_regex(args[4].value)
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
                        compiled_regex(text)
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
