"""JMS 1.1 message selectors (the SQL-92 conditional subset, ActiveMQ dialect).

A selector runs once per message per consumer, so its text is parsed once into
a tree of closures and constant sub-expressions are folded away; evaluating
never re-parses and never raises, whatever values the message carries.

Inside the tree, truth values are ``True``, ``False`` and ``None``: ``None``
is SQL's UNKNOWN and also its NULL (an absent property, a string that is not a
number where one is needed, a division by zero), which is what makes the
three-valued logic fall out of plain ``is None`` tests.

Headers arrive from STOMP as strings, so a string meeting a number is read as a
number when it looks like one; this is looser than JMS, which leaves such a
comparison UNKNOWN, and is what users of a text protocol expect.
"""
from __future__ import annotations

import math
import operator
import re
from typing import Any, Callable, NoReturn

__all__ = ["Selector", "SelectorError", "compile_selector"]

Lookup = Callable[[str], object]
_Fn = Callable[[Lookup], object]

# Each '(' , NOT or sign costs a few Python frames while parsing; bounding the
# nesting keeps hostile selectors from reaching the interpreter's stack limit.
_MAX_DEPTH = 64


class SelectorError(ValueError):
    """Raised for a selector that does not parse; str(e) says what and where (1-based column)."""

    def __init__(self, message: str, column: int, hint: str | None = None) -> None:
        text = f"{message} at column {column}"
        if hint:
            text += f"; expected {hint}"
        super().__init__(text)
        self.column = column


# ---------------------------------------------------------------- values

_PLAIN = frozenset({str, int, float, bool, type(None)})
_INT_RE = re.compile(r"[+-]?[0-9]+")
_FLOAT_RE = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def _coerce(value: object) -> object:
    """Reduce a looked-up value to one of the types the operators know.

    Subclasses (IntEnum, str subclasses) become their base type so that the
    operators can dispatch on ``type(v) is ...``; anything else (bytes, lists,
    objects with hostile ``__eq__``) is treated as absent rather than being
    allowed anywhere near a comparison.
    """
    try:
        if isinstance(value, str):
            return str.__str__(value)
        if isinstance(value, int):
            return int.__int__(value)
        if isinstance(value, float):
            return float.__float__(value)
    except Exception:
        pass
    return None


def _str_num(s: str) -> int | float | None:
    """The number a header string spells, or None; ASCII only, so "1_000",
    "NaN" and Unicode digits that int()/float() would accept stay strings."""
    if _INT_RE.fullmatch(s):
        try:
            return int(s)
        except ValueError:  # beyond int's digit limit: still a number
            return float(s)
    if _FLOAT_RE.fullmatch(s):
        return float(s)
    return None


def _num(v: object) -> int | float | None:
    if type(v) is int or type(v) is float:
        return v
    if type(v) is str:
        return _str_num(v)
    return None


def _truth(v: object) -> bool | None:
    """A bare identifier used as a condition: booleans and their spellings."""
    if v is True or v is False:
        return v
    if type(v) is str:
        low = v.lower()
        if low == "true":
            return True
        if low == "false":
            return False
    return None


def _negate(v: object) -> bool | None:
    return None if v is None else not v


def _eq_str(s: str, other: object) -> bool | None:
    if type(other) is bool:
        t = _truth(s)
        return None if t is None else t is other
    n = _str_num(s)
    return None if n is None else n == other


def _eq(a: object, b: object) -> bool | None:
    if a is None or b is None:
        return None
    ta, tb = type(a), type(b)
    if ta is tb:
        return a == b
    if type(a) is str:
        return _eq_str(a, b)
    if type(b) is str:
        return _eq_str(b, a)
    if ta is bool or tb is bool:
        return None
    return a == b


def _ne(a: object, b: object) -> bool | None:
    r = _eq(a, b)
    return None if r is None else not r


def _order_pair(a: object, b: object) -> tuple[object, object] | None:
    """Bring two values to a common orderable type, or None if there is none.

    Booleans have no order in JMS; two strings order lexicographically as
    ActiveMQ allows; a string against a number is read as a number.
    """
    if a is None or b is None:
        return None
    ta, tb = type(a), type(b)
    if ta is bool or tb is bool:
        return None
    if type(a) is str and tb is not str:
        x = _str_num(a)
        return None if x is None else (x, b)
    if type(b) is str and ta is not str:
        y = _str_num(b)
        return None if y is None else (a, y)
    return a, b


_ORDERABLE = frozenset({int, float, str})


# An ordering operator (operator.lt, ...), applied to two values of one
# orderable type: numbers, or two strings.
_Order = Callable[[Any, Any], bool]


def _ordering(op: _Order) -> Callable[[object, object], bool | None]:
    def compare(a: object, b: object) -> bool | None:
        t = type(a)
        if t is type(b) and t in _ORDERABLE:
            return op(a, b)
        pair = _order_pair(a, b)
        return None if pair is None else op(*pair)
    return compare


_lt, _gt = _ordering(operator.lt), _ordering(operator.gt)
_le, _ge = _ordering(operator.le), _ordering(operator.ge)
_COMPARE = {"=": _eq, "<>": _ne, "!=": _ne, "<": _lt, ">": _gt, "<=": _le, ">=": _ge}


def _between(v: object, low: object, high: object) -> bool | None:
    a, b = _ge(v, low), _le(v, high)
    if a is False or b is False:
        return False
    if a is None or b is None:
        return None
    return True


def _java_div(a: int, b: int) -> int:
    """Java's int division truncates toward zero; Python's // floors."""
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


def _div(a: int | float, b: int | float) -> int | float | None:
    if b == 0:
        return None
    if type(a) is int and type(b) is int:
        return _java_div(a, b)
    return a / b


def _mod(a: int | float, b: int | float) -> int | float | None:
    """Java's remainder takes the dividend's sign (math.fmod), unlike Python's %."""
    if b == 0:
        return None
    if type(a) is int and type(b) is int:
        return a - b * _java_div(a, b)
    return math.fmod(a, b)


def _arith(op: Callable[[float, float], object]) -> Callable[[object, object], object]:
    def apply(a: object, b: object) -> object:
        x, y = _num(a), _num(b)
        if x is None or y is None:
            return None
        try:
            return op(x, y)
        except (ArithmeticError, ValueError):  # int too large for float, fmod(inf)
            return None
    return apply


_ARITH = {"+": _arith(operator.add), "-": _arith(operator.sub),
          "*": _arith(operator.mul), "/": _arith(_div), "%": _arith(_mod)}


def _neg(v: object) -> object:
    n = _num(v)
    return None if n is None else -n


# ---------------------------------------------------------------- tokens

_STR, _NUMBER, _ID, _KW, _OP, _EOF = "string", "number", "identifier", "keyword", "operator", "end"
_KEYWORDS = frozenset({"NOT", "AND", "OR", "BETWEEN", "LIKE", "IN", "IS", "ESCAPE",
                       "NULL", "TRUE", "FALSE"})
_OPS2 = ("<>", "<=", ">=", "!=")
_OPS1 = frozenset("=<>+-*/%(),")
_NUMBER_RE = re.compile(r"""
    0[xX](?P<hex>[0-9a-fA-F]+)[lL]?
  | (?P<float>(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|[0-9]+[eE][+-]?[0-9]+)[fFdD]?
  | (?P<int>[0-9]+)(?P<suffix>[lLfFdD]?)
""", re.VERBOSE)


class _Tok:
    """A token: ``text`` is a string literal's value, an identifier, a keyword
    (upper case) or an operator; ``number`` a numeric literal's value."""

    __slots__ = ("kind", "text", "number", "col", "raw")

    def __init__(self, kind: str, text: str, col: int, raw: str, number: float = 0) -> None:  # float: int or float
        self.kind, self.text, self.number, self.col, self.raw = kind, text, number, col, raw


def _is_part(ch: str) -> bool:
    return ch.isalnum() or ch in "_$."


def _number(text: str, i: int) -> tuple[int | float, int]:
    col = i + 1
    m = _NUMBER_RE.match(text, i)
    assert m is not None  # the caller saw a digit, or '.' and a digit
    end = m.end()
    if end < len(text) and _is_part(text[end]):
        raise SelectorError("invalid numeric literal", col)
    if m["hex"] is not None:
        return int(m["hex"], 16), end
    if m["float"] is not None:
        return float(m["float"]), end
    digits = m["int"]
    if m["suffix"] in ("f", "F", "d", "D"):
        return float(digits), end
    if len(digits) > 1 and digits[0] == "0":
        if "8" in digits or "9" in digits:
            raise SelectorError("invalid octal literal", col)
        return int(digits, 8), end
    try:
        return int(digits), end
    except ValueError:
        raise SelectorError("numeric literal too long", col) from None


def _tokenize(text: str) -> list[_Tok]:
    toks: list[_Tok] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch.isspace():
            i += 1
            continue
        col = i + 1
        if ch == "'":
            parts, j = [], i + 1
            while True:
                k = text.find("'", j)
                if k < 0:
                    raise SelectorError("unterminated string literal", col)
                parts.append(text[j:k])
                if text.startswith("'", k + 1):  # '' is one quote
                    parts.append("'")
                    j = k + 2
                    continue
                break
            i = k + 1
            toks.append(_Tok(_STR, "".join(parts), col, text[col - 1:i]))
        elif "0" <= ch <= "9" or (ch == "." and i + 1 < n and "0" <= text[i + 1] <= "9"):
            value, end = _number(text, i)
            toks.append(_Tok(_NUMBER, text[i:end], col, text[i:end], value))
            i = end
        elif ch.isalpha() or ch in "_$":
            j = i + 1
            while j < n and _is_part(text[j]):
                j += 1
            word = text[i:j]
            # isascii: 'ın'.upper() == 'IN', and a dotless i is no keyword.
            if word.isascii() and word.upper() in _KEYWORDS:
                toks.append(_Tok(_KW, word.upper(), col, word))
            else:
                toks.append(_Tok(_ID, word, col, word))
            i = j
        elif text.startswith(_OPS2, i):
            toks.append(_Tok(_OP, text[i:i + 2], col, text[i:i + 2]))
            i += 2
        elif ch in _OPS1:
            toks.append(_Tok(_OP, ch, col, ch))
            i += 1
        else:
            raise SelectorError(f"unexpected character {ch!r}", col)
    toks.append(_Tok(_EOF, "", n + 1, ""))
    return toks


# ---------------------------------------------------------------- tree

_NC = object()  # marks a node whose value is not known at compile time


class _Node:
    """A compiled sub-expression with the static kind the parser checks:
    "bool" (a condition), "num", "str", or "any" (an identifier)."""
    __slots__ = ("fn", "kind", "col", "const")

    def __init__(self, fn: _Fn, kind: str, col: int, const: object = _NC) -> None:
        self.fn, self.kind, self.col, self.const = fn, kind, col, const


def _const(value: object, kind: str, col: int) -> _Node:
    return _Node(lambda _lookup: value, kind, col, value)


def _map1(op: Callable[[object], object], a: _Node, kind: str, col: int) -> _Node:
    if a.const is not _NC:
        return _const(op(a.const), kind, col)
    f = a.fn
    return _Node(lambda lk: op(f(lk)), kind, col)


def _map2(op: Callable[[object, object], object], a: _Node, b: _Node, kind: str, col: int) -> _Node:
    ac, bc, f, g = a.const, b.const, a.fn, b.fn
    if ac is not _NC and bc is not _NC:
        return _const(op(ac, bc), kind, col)
    if bc is not _NC:  # the common `prop > 5` shape
        return _Node(lambda lk: op(f(lk), bc), kind, col)
    if ac is not _NC:
        return _Node(lambda lk: op(ac, g(lk)), kind, col)
    return _Node(lambda lk: op(f(lk), g(lk)), kind, col)


def _chain(operands: list[_Node], ops: list[Callable[[object, object], object]], col: int) -> _Node:
    """`a + b - c ...` as one loop rather than nested closures, so a long
    chain cannot exhaust the stack at match time."""
    if len(ops) == 1:
        return _map2(ops[0], operands[0], operands[1], "num", col)
    if all(o.const is not _NC for o in operands):
        acc = operands[0].const
        for op, o in zip(ops, operands[1:]):
            acc = op(acc, o.const)
        return _const(acc, "num", col)
    first, rest = operands[0].fn, tuple(zip(ops, (o.fn for o in operands[1:])))

    def fn(lk: Lookup) -> object:
        acc = first(lk)
        for op, f in rest:
            acc = op(acc, f(lk))
        return acc
    return _Node(fn, "num", col)


def _logical(parts: list[_Node], absorbing: bool, col: int) -> _Node:
    """AND (absorbing False) or OR (absorbing True) in three-valued logic:
    the absorbing value wins even over UNKNOWN, otherwise UNKNOWN wins."""
    identity = not absorbing
    live = []
    for p in parts:
        if p.const is absorbing:
            return _const(absorbing, "bool", col)
        if p.const is not identity:
            live.append(p.fn)
    if not live:
        return _const(identity, "bool", col)
    if len(live) == 1:
        return _Node(live[0], "bool", col)
    fns = tuple(live)

    def fn(lk: Lookup) -> bool | None:
        unknown = False
        for f in fns:
            r = f(lk)
            if r is absorbing:
                return absorbing
            if r is None:
                unknown = True
        return None if unknown else identity
    return _Node(fn, "bool", col)


def _like_regex(pattern: str, escape: str | None, col: int) -> re.Pattern[str]:
    """Compile a LIKE pattern so that matching takes linear-ish time.

    A naive `.*a.*a.*a...b` backtracks exponentially on hostile input, and
    selectors come from clients.  Segments between '%' have fixed length, so
    taking the leftmost occurrence of each is always right; an atomic group
    ``(?>.*?seg)`` does exactly that and forbids the regex engine to retry.
    """
    segments: list[list[str]] = [[]]
    i, n = 0, len(pattern)
    while i < n:
        ch = pattern[i]
        if ch == escape:
            i += 1
            if i == n:
                raise SelectorError("LIKE pattern ends with its escape character", col)
            segments[-1].append(re.escape(pattern[i]))
        elif ch == "%":
            if segments[-1] or len(segments) == 1:  # '%%' is one '%'
                segments.append([])
        elif ch == "_":
            segments[-1].append(".")
        else:
            segments[-1].append(re.escape(ch))
        i += 1
    body = "".join(segments[0])
    if len(segments) > 1:
        body += "".join(f"(?>.*?{''.join(s)})" for s in segments[1:-1])
        body += ".*" + "".join(segments[-1])
    return re.compile(rf"\A{body}\Z", re.DOTALL)


def _like(regex: re.Pattern[str]) -> Callable[[object], bool | None]:
    match = regex.match

    def like(v: object) -> bool | None:
        return match(v) is not None if type(v) is str else None
    return like


def _in(strings: frozenset[str], numbers: frozenset[int | float]) -> Callable[[object], bool | None]:
    """JMS allows IN only on strings; a list that also has numbers admits a
    numeric value, and a numeric-looking string against those numbers."""
    def member(v: object) -> bool | None:
        t = type(v)
        if type(v) is str:
            if v in strings:
                return True
            if numbers:
                n = _str_num(v)
                return None if n is None else n in numbers
            return False
        if (t is int or t is float) and numbers:
            return v in numbers
        return None
    return member


def _ident(name: str, col: int) -> _Node:
    def fn(lk: Lookup) -> object:
        v = lk(name)
        return v if type(v) in _PLAIN else _coerce(v)
    return _Node(fn, "any", col)


# ---------------------------------------------------------------- parser

class _Parser:
    """Recursive descent; precedence from loosest: OR, AND, NOT, predicate
    (comparison, BETWEEN, IN, LIKE, IS NULL), + -, * / %, unary sign."""

    def __init__(self, text: str) -> None:
        self.toks = _tokenize(text)
        self.pos = 0
        self.depth = 0

    def parse(self) -> _Fn | None:
        if self.toks[0].kind is _EOF:
            return None
        node = self._or()
        tok = self.toks[self.pos]
        if tok.kind is not _EOF:
            self._fail(tok)
        return self._as_bool(node).fn

    # -- helpers

    def _fail(self, tok: _Tok, hint: str | None = None) -> NoReturn:
        if tok.kind is _EOF:
            raise SelectorError("unexpected end of selector", tok.col, hint)
        raw = tok.raw if len(tok.raw) <= 30 else tok.raw[:27] + "..."
        raise SelectorError(f"unexpected token {raw!r}", tok.col, hint)

    def _at(self, kind: str, *values: str) -> bool:
        tok = self.toks[self.pos]
        return tok.kind is kind and tok.text in values

    def _expect(self, kind: str, value: str) -> None:
        if not self._at(kind, value):
            self._fail(self.toks[self.pos], repr(value) if kind is _OP else value)
        self.pos += 1

    def _enter(self, tok: _Tok) -> None:
        self.depth += 1
        if self.depth > _MAX_DEPTH:
            raise SelectorError("selector nested too deeply", tok.col)

    @staticmethod
    def _as_bool(node: _Node) -> _Node:
        if node.kind == "bool":
            return node
        if node.kind == "any":
            return _map1(_truth, node, "bool", node.col)
        found = "numeric expression" if node.kind == "num" else "string"
        raise SelectorError(f"expected a condition, found a {found}", node.col)

    @staticmethod
    def _as_num(node: _Node) -> _Node:
        if node.kind in ("num", "any"):
            return node
        found = "condition" if node.kind == "bool" else "string"
        raise SelectorError(f"expected a numeric operand, found a {found}", node.col)

    # -- grammar

    def _or(self) -> _Node:
        first = self._and()
        if not self._at(_KW, "OR"):
            return first
        parts = [self._as_bool(first)]
        while self._at(_KW, "OR"):
            self.pos += 1
            parts.append(self._as_bool(self._and()))
        return _logical(parts, True, first.col)

    def _and(self) -> _Node:
        first = self._not()
        if not self._at(_KW, "AND"):
            return first
        parts = [self._as_bool(first)]
        while self._at(_KW, "AND"):
            self.pos += 1
            parts.append(self._as_bool(self._not()))
        return _logical(parts, False, first.col)

    def _not(self) -> _Node:
        tok = self.toks[self.pos]
        if not self._at(_KW, "NOT"):
            return self._predicate()
        self.pos += 1
        self._enter(tok)
        operand = self._as_bool(self._not())
        self.depth -= 1
        return _map1(_negate, operand, "bool", tok.col)

    def _predicate(self) -> _Node:
        left = self._additive()
        tok = self.toks[self.pos]
        if tok.kind is _OP and tok.text in _COMPARE:
            self.pos += 1
            right = self._additive()
            return _map2(_COMPARE[tok.text], left, right, "bool", left.col)
        if tok.kind is not _KW:
            return left
        negated = tok.text == "NOT"
        if negated:
            tok = self.toks[self.pos + 1]
            if not (tok.kind is _KW and tok.text in ("LIKE", "BETWEEN", "IN")):
                self._fail(tok, "LIKE, BETWEEN or IN after NOT")
            self.pos += 1
        if tok.text == "BETWEEN":
            self.pos += 1
            low = self._additive()
            self._expect(_KW, "AND")
            high = self._additive()
            if left.const is not _NC and low.const is not _NC and high.const is not _NC:
                node = _const(_between(left.const, low.const, high.const), "bool", left.col)
            else:
                f, g, h = left.fn, low.fn, high.fn
                node = _Node(lambda lk: _between(f(lk), g(lk), h(lk)), "bool", left.col)
        elif tok.text == "IN":
            self.pos += 1
            node = _map1(self._in_list(), left, "bool", left.col)
        elif tok.text == "LIKE":
            self.pos += 1
            node = _map1(self._like_pattern(), left, "bool", left.col)
        elif tok.text == "IS":
            self.pos += 1
            is_not = self._at(_KW, "NOT")
            self.pos += is_not
            self._expect(_KW, "NULL")
            test = (lambda v: v is not None) if is_not else (lambda v: v is None)
            return _map1(test, left, "bool", left.col)
        else:
            return left
        return _map1(_negate, node, "bool", left.col) if negated else node

    def _in_list(self) -> Callable[[object], bool | None]:
        self._expect(_OP, "(")
        strings: set[str] = set()
        numbers: set[int | float] = set()
        if self._at(_OP, ")"):
            raise SelectorError("empty IN list", self.toks[self.pos].col)
        while True:
            tok = self.toks[self.pos]
            sign = 1
            if tok.kind is _OP and tok.text in ("+", "-"):
                sign = -1 if tok.text == "-" else 1
                self.pos += 1
                tok = self.toks[self.pos]
                if tok.kind is not _NUMBER:
                    self._fail(tok, "a numeric literal")
            if tok.kind is _STR:
                strings.add(tok.text)
            elif tok.kind is _NUMBER:
                numbers.add(sign * tok.number)
            else:
                self._fail(tok, "a string or numeric literal")
            self.pos += 1
            if self._at(_OP, ")"):
                self.pos += 1
                return _in(frozenset(strings), frozenset(numbers))
            if not self._at(_OP, ","):
                self._fail(self.toks[self.pos], "',' or ')'")
            self.pos += 1

    def _like_pattern(self) -> Callable[[object], bool | None]:
        pat = self.toks[self.pos]
        if pat.kind is not _STR:
            self._fail(pat, "a string literal LIKE pattern")
        self.pos += 1
        escape = None
        if self._at(_KW, "ESCAPE"):
            self.pos += 1
            esc = self.toks[self.pos]
            if esc.kind is not _STR:
                self._fail(esc, "a string literal escape character")
            if len(esc.text) != 1:
                raise SelectorError("ESCAPE must be exactly one character", esc.col)
            self.pos += 1
            escape = esc.text
        return _like(_like_regex(pat.text, escape, pat.col))

    def _additive(self) -> _Node:
        return self._binary_chain(self._multiplicative, ("+", "-"))

    def _multiplicative(self) -> _Node:
        return self._binary_chain(self._unary, ("*", "/", "%"))

    def _binary_chain(self, operand: Callable[[], _Node], symbols: tuple[str, ...]) -> _Node:
        first = operand()
        if not self._at(_OP, *symbols):
            return first
        operands, ops = [self._as_num(first)], []
        while self._at(_OP, *symbols):
            ops.append(_ARITH[self.toks[self.pos].text])
            self.pos += 1
            operands.append(self._as_num(operand()))
        return _chain(operands, ops, first.col)

    def _unary(self) -> _Node:
        tok = self.toks[self.pos]
        if not self._at(_OP, "+", "-"):
            return self._primary()
        self.pos += 1
        self._enter(tok)
        operand = self._as_num(self._unary())
        self.depth -= 1
        return _map1(_neg if tok.text == "-" else _num, operand, "num", tok.col)

    def _primary(self) -> _Node:
        tok = self.toks[self.pos]
        kind = tok.kind
        if kind is _NUMBER:
            self.pos += 1
            return _const(tok.number, "num", tok.col)
        if kind is _STR:
            self.pos += 1
            return _const(tok.text, "str", tok.col)
        if kind is _ID:
            self.pos += 1
            return _ident(tok.text, tok.col)
        if kind is _KW and tok.text in ("TRUE", "FALSE"):
            self.pos += 1
            return _const(tok.text == "TRUE", "bool", tok.col)
        if kind is _OP and tok.text == "(":
            self.pos += 1
            self._enter(tok)
            inner = self._or()
            self.depth -= 1
            self._expect(_OP, ")")
            return _Node(inner.fn, inner.kind, tok.col, inner.const)
        self._fail(tok, "an operand")


# ---------------------------------------------------------------- API

def _match_all(_lookup: Lookup) -> bool:
    return True


class Selector:
    """A compiled selector.  Immutable, so every consumer with the same
    selector text may share one instance."""

    __slots__ = ("text", "_fn")
    text: str

    def __init__(self, text: str, fn: _Fn) -> None:
        self.text = text
        self._fn = fn

    def matches(self, lookup: Lookup) -> bool:
        """UNKNOWN is no match, as in SQL's WHERE.  Exceptions raised by
        ``lookup`` itself propagate: they are the caller's bug, not the data's."""
        return self._fn(lookup) is True

    def __repr__(self) -> str:
        return f"Selector({self.text!r})"


def compile_selector(text: str) -> Selector:
    """Parse once so that matching does no parsing; empty text matches all."""
    if not isinstance(text, str):
        raise TypeError(f"selector must be a str, not {type(text).__name__}")
    try:
        fn = _Parser(text).parse()
    except RecursionError:  # a deep stack at the call site; _MAX_DEPTH covers the rest
        raise SelectorError("selector nested too deeply", 1) from None
    return Selector(text, fn if fn is not None else _match_all)
