"""Size expressions in export files: a small grammar of our own, parsed without ``eval``.

A symbolic size is written as sympy prints it (``s33*s50``, ``(s0//2)``, ``Min(512, s50)``) and read
back by `parse_expr`, which accepts only::

    expr   := term (('+' | '-') term)*
    term   := factor (('*' | '//') factor)*
    factor := '-' factor | power
    power  := atom ('**' INT)?                  INT <= MAX_EXPONENT, base not a number
    atom   := INT | SYMBOL | FUNC '(' expr (',' expr)* ')' | '(' expr ')'
    FUNC   := Mod | Min | Max

with integer literals that fit 64 bits, at most MAX_EXPR_CHARS characters and MAX_EXPR_DEPTH
levels of nesting, and only the graph's own symbols. The sympy value is built from the parsed
pieces (``sympy.Add``, ``FloorDiv``...), never from the text. The exporter writes an expression only
after `check_round_trip` read it back equal, so every file it writes parses.
"""
from __future__ import annotations

import re

import sympy
from torch.utils._sympy.functions import FloorDiv

from .checks import MAX_INT64, fail
from .errors import ExportError

__all__ = ["parse_expr", "check_round_trip", "MAX_EXPR_CHARS", "MAX_EXPR_DEPTH", "MAX_EXPONENT", "FUNCTIONS"]

MAX_EXPR_CHARS = 2000
MAX_EXPR_DEPTH = 32
MAX_EXPONENT = 64

# sympy's functions (torch's same-named ones print alike; the shape engine compares either), and torch's
# FloorDiv for ``//``, which is how it prints.
FUNCTIONS = {"Mod": (sympy.Mod, 2), "Min": (sympy.Min, None), "Max": (sympy.Max, None)}
_BINARY = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b, "//": FloorDiv}
_TOKEN = re.compile(r"\s*(?:([0-9]+)|([A-Za-z_][A-Za-z0-9_]*)|(\*\*|//|[-+*(),]))")


def _tokenize(text: str, where: str) -> list:
    tokens, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            if text[pos:].strip():
                raise fail(where, f"malformed shape expression {text[:80]!r}: unexpected "
                                  f"{text[pos:].strip()[:1]!r} (allowed: integers, the graph's symbols, "
                                  "+ - * // **, Mod, Min, Max, parentheses)")
            break
        number, name, op = m.groups()
        tokens.append(("int", number) if number else ("name", name) if name else ("op", op))
        pos = m.end()
    tokens.append(("end", ""))
    return tokens


class _Parser:
    def __init__(self, text: str, symbols: dict, where: str):
        self.text, self.symbols, self.where = text, symbols, where
        self.tokens = _tokenize(text, where)
        self.pos = 0
        self.depth = 0

    def error(self, problem: str):
        text = self.text if len(self.text) <= 80 else self.text[:77] + "..."
        return fail(self.where, f"malformed shape expression {text!r}: {problem}")

    def peek(self) -> tuple:
        return self.tokens[self.pos]

    def take(self, kind: str | None = None, value: str | None = None) -> str:
        k, v = self.tokens[self.pos]
        if (kind is not None and k != kind) or (value is not None and v != value):
            raise self.error(f"expected {value or kind}, found {v or 'the end'!r}")
        self.pos += 1
        return v

    def nested(self, parse):
        self.depth += 1
        if self.depth > MAX_EXPR_DEPTH:
            raise self.error(f"nested more than {MAX_EXPR_DEPTH} levels deep")
        try:
            return parse()
        finally:
            self.depth -= 1

    def apply(self, fn, *args):
        try:
            value = fn(*args)
        except (ArithmeticError, TypeError, ValueError) as e:
            raise self.error(f"{type(e).__name__}: {e}") from None
        if isinstance(value, sympy.Integer) and abs(int(value)) > MAX_INT64:
            raise self.error("a constant does not fit in 64 bits")
        return value

    def chain(self, operators: tuple, operand):
        """``operand (op operand)*`` for ``op`` in ``operators``, left-associative."""
        value = operand()
        while self.peek()[0] == "op" and self.peek()[1] in operators:
            op = self.take()
            value = self.apply(_BINARY[op], value, operand())
        return value

    def expr(self):
        return self.chain(("+", "-"), self.term)

    def term(self):
        return self.chain(("*", "//"), self.factor)

    def factor(self):
        if self.peek() == ("op", "-"):
            self.take()
            return self.nested(lambda: self.apply(lambda a: -a, self.factor()))
        return self.power()

    def power(self):
        base = self.atom()
        if self.peek() != ("op", "**"):
            return base
        self.take()
        exponent = int(self.take("int"))
        if base.is_number or not 0 <= exponent <= MAX_EXPONENT:
            raise self.error(f"'**' takes a symbolic base and an exponent up to {MAX_EXPONENT}")
        value = self.apply(sympy.Pow, base, sympy.Integer(exponent))
        if any(abs(p.exp) > MAX_EXPONENT for p in value.atoms(sympy.Pow)):  # (s0**8)**16 is s0**128
            raise self.error(f"an exponent above {MAX_EXPONENT}")
        return value

    def atom(self):
        kind, value = self.peek()
        if kind == "int":
            self.take()
            if len(value) > 19 or int(value) > MAX_INT64:
                raise self.error(f"integer {value[:24]} does not fit in 64 bits")
            return sympy.Integer(int(value))
        if (kind, value) == ("op", "("):
            self.take()
            inner = self.nested(self.expr)
            self.take("op", ")")
            return inner
        if kind == "name" and value in FUNCTIONS:
            self.take()
            return self.nested(lambda: self.call(value))
        if kind == "name":
            if value not in self.symbols:
                raise self.error(f"uses {value!r}, which is neither a symbol of the graph "
                                 f"({sorted(self.symbols)[:20]}) nor one of {sorted(FUNCTIONS)}")
            self.take()
            return self.symbols[value]
        raise self.error(f"unexpected {value or 'end'!r}")

    def call(self, name: str):
        fn, arity = FUNCTIONS[name]
        self.take("op", "(")
        args = [self.expr()]
        while self.peek() == ("op", ","):
            self.take()
            args.append(self.expr())
        self.take("op", ")")
        if arity is not None and len(args) != arity:
            raise self.error(f"{name} takes {arity} arguments, got {len(args)}")
        return self.apply(fn, *args)


def parse_expr(text, symbols: dict, where: str) -> sympy.Expr:
    """The sympy expression a shape string stands for; anything outside the grammar is an ExportError."""
    if not isinstance(text, str):
        raise fail(where, f"malformed shape expression {text!r}")
    if len(text) > MAX_EXPR_CHARS:
        raise fail(where, f"malformed shape expression: {len(text)} characters; at most {MAX_EXPR_CHARS} "
                          "are allowed")
    key = (text, tuple(symbols.items()))
    value = _parsed.get(key)
    if value is None:
        parser = _Parser(text, symbols, where)
        value = parser.expr()
        parser.take("end")
        if len(_parsed) >= _PARSED_MAX:
            _parsed.clear()
        _parsed[key] = value
    return value


# Expressions already parsed, by text and symbol table (sympy expressions are immutable, so sharing is
# safe; only successful parses are kept). A graph repeats its few size expressions on every node, and
# building one ``Max`` costs sympy milliseconds: a geared MiniLM load parsed the same 18 ``Max`` 0.3 s.
_PARSED_MAX = 4096
_parsed: dict = {}


def check_round_trip(expr, where: str) -> str:
    """``str(expr)``, once it is known to parse back to an expression printed the same (so written files load)."""
    text = str(expr)
    symbols = {str(s): s for s in sympy.sympify(expr).free_symbols}
    try:
        back = parse_expr(text, symbols, where)
    except ExportError as e:
        raise fail(where, f"shape expression {text!r} cannot be exported ({e})") from None
    if str(back) != text:
        raise fail(where, f"shape expression {text!r} cannot be exported: it reads back as {back}")
    return text
