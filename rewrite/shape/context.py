"""What is known about a graph's size symbols, and the simplifications that knowledge allows.

Dynamo records a range for every size symbol (usually ``[2, oo)``: it specializes 0 and 1) and
sometimes equalities between symbols. Shape rules ask two kinds of questions: "is this expression
provably equal to that one / to 1?" (broadcasting, squeeze) and "what is the simplest form of this
expression?" (a ``Max(1, s0)`` is just ``s0`` when ``s0 >= 1``). Both are answered here, with value
ranges (torch's ``bound_sympy``) rather than full theorem proving: fast, and exact for the
products and sums sizes are made of.
"""
from __future__ import annotations

import collections
import itertools
import logging

import sympy
from torch.utils._sympy.functions import FloorDiv
from torch.utils._sympy.value_ranges import ValueRanges, bound_sympy

from ..ir import SymbolInfo

log = logging.getLogger("rewrite")

__all__ = ["ShapeContext", "ShapeInferenceError", "to_expr"]


def _exact_floordiv(e):
    """``FloorDiv(a, b)`` is ``a / b`` when that quotient is a polynomial (``(s0**2)//s0`` -> ``s0``)."""
    a, b = e.args
    q = sympy.cancel(a / b)
    if sympy.fraction(q)[1] == 1:
        return sympy.expand(q)
    return e


class ShapeInferenceError(RuntimeError):
    """A shape could not be inferred; the message names the op and the reason."""


def to_expr(value) -> sympy.Expr:
    """A Python int/bool/float or sympy expression as a sympy expression."""
    if isinstance(value, bool):
        return sympy.true if value else sympy.false
    return sympy.sympify(value)


class ShapeContext:
    """Symbol ranges and equalities of one graph, plus a home for fresh symbols.

    ``symbols`` is a graph's ``Graph.symbols`` (it is updated in place when fresh symbols are
    made, so the graph learns about them); ``equalities`` maps a symbol to the expression it is
    known to equal (a guard such as ``s1 == 2*s0``). Symbols not in ``symbols`` get the range
    their sympy assumptions allow (``positive`` -> ``[1, oo)``, otherwise ``[0, oo)``).
    """

    def __init__(self, symbols: dict | None = None, equalities: dict | None = None, use_rules: bool = True):
        self.symbols: dict[sympy.Symbol, SymbolInfo] = symbols if symbols is not None else {}
        self.equalities: dict[sympy.Symbol, sympy.Expr] = dict(equalities or {})
        # False: every op asks its meta kernel (to compare the hand rules with torch on whole graphs).
        self.use_rules = use_rules
        self._kernel_runner = None  # created on first use: building a ShapeEnv costs time
        # How each op's meta was found ("rule", "kernel", ...) and which ops needed the kernel.
        self.stats: collections.Counter = collections.Counter()
        self.kernel_ops: collections.Counter = collections.Counter()
        # Symbols minted for sizes only the data knows (nonzero, item): see KernelRunner.
        self.data_dependent: list[sympy.Symbol] = []
        # Where inference is (graph and node name, set by infer_graph): sizes minted there get
        # names derived from it, so inferring the same graph again finds the same symbols.
        self.site: str | None = None

    # -- facts -------------------------------------------------------------------------------
    def range_of(self, s: sympy.Symbol) -> tuple[int, int | None]:
        info = self.symbols.get(s)
        if info is not None:
            return int(info.lower), info.upper
        return (1 if s.is_positive else 0), None

    def ranges(self, expr) -> dict:
        out = {}
        for s in expr.free_symbols:
            lo, hi = self.range_of(s)
            out[s] = ValueRanges(lo, sympy.oo if hi is None else hi)
        return out

    def bounds(self, expr) -> ValueRanges:
        expr = to_expr(expr)
        try:
            return bound_sympy(expr, self.ranges(expr))
        except Exception:  # bound_sympy does not know every sympy function
            return ValueRanges.unknown()

    # -- simplification ----------------------------------------------------------------------
    def simplify(self, expr):
        """The simplest known form of a size expression (equalities applied, Max/Min decided)."""
        expr = to_expr(expr)
        if expr.is_Number or isinstance(expr, sympy.logic.boolalg.BooleanAtom) or not expr.free_symbols:
            return expr
        if self.equalities:
            expr = expr.xreplace(self.equalities)
        if expr.has(FloorDiv):
            expr = expr.replace(lambda e: isinstance(e, FloorDiv), _exact_floordiv)
        if expr.has(sympy.Max, sympy.Min, sympy.core.relational.Relational):
            expr = expr.replace(lambda e: isinstance(e, (sympy.Max, sympy.Min, sympy.core.relational.Relational)),
                                self._decide)
        return expr

    def _decide(self, e):
        """Max/Min arguments dominated by another argument drop out; decided relations become bools."""
        if isinstance(e, (sympy.Max, sympy.Min)):
            # For Max, ``b`` makes ``a`` redundant when b >= a always (for Min: when b <= a).
            covers = (lambda b, a: self.at_least(b, a)) if isinstance(e, sympy.Max) else (lambda b, a: self.at_least(a, b))
            keep: list = []
            for a in e.args:
                if any(covers(b, a) for b in keep):
                    continue
                keep = [b for b in keep if not covers(a, b)]
                keep.append(a)
            return e.func(*keep)
        truth = self.truth(e)
        return e if truth is None else (sympy.true if truth else sympy.false)

    def at_least(self, a, b) -> bool:
        """Is ``a >= b`` for every value the symbols may take?"""
        return bool(self.bounds(sympy.expand(to_expr(a) - to_expr(b))).lower >= 0)

    def truth(self, cond) -> bool | None:
        """True/False when ``cond`` (a sympy relation) is decided by what we know, else None."""
        cond = to_expr(cond)
        if isinstance(cond, sympy.logic.boolalg.BooleanAtom):
            return bool(cond)
        if self.equalities:
            cond = cond.xreplace(self.equalities)
            if isinstance(cond, sympy.logic.boolalg.BooleanAtom):
                return bool(cond)
        if not isinstance(cond, sympy.core.relational.Relational):
            return None
        diff = sympy.expand(cond.lhs - cond.rhs)
        if diff.is_Number:
            return bool(cond.func(diff, 0))
        b = self.bounds(diff)
        lo, hi = b.lower, b.upper
        if isinstance(cond, sympy.Eq):
            if lo > 0 or hi < 0:
                return False
            return None
        if isinstance(cond, sympy.Ne):
            return True if (lo > 0 or hi < 0) else None
        if isinstance(cond, sympy.StrictGreaterThan):
            return True if lo > 0 else (False if hi <= 0 else None)
        if isinstance(cond, sympy.GreaterThan):
            return True if lo >= 0 else (False if hi < 0 else None)
        if isinstance(cond, sympy.StrictLessThan):
            return True if hi < 0 else (False if lo >= 0 else None)
        if isinstance(cond, sympy.LessThan):
            return True if hi <= 0 else (False if lo > 0 else None)
        return None

    def equal(self, a, b) -> bool | None:
        """Are two size expressions provably equal (True), provably different (False), or unknown (None)?"""
        a, b = self.simplify(a), self.simplify(b)
        if a == b:
            return True
        diff = sympy.expand(a - b)
        if diff == 0:
            return True
        if diff.is_Number:
            return False
        return self.truth(sympy.Eq(diff, 0))

    # -- fresh symbols -----------------------------------------------------------------------
    def fresh_symbol(self, lower: int = 0, upper: int | None = None) -> sympy.Symbol:
        """A new size symbol (``sw0``, ``sw1``...): a size whose value only the run knows."""
        taken = {s.name for s in self.symbols} | {s.name for s in self.equalities}
        name = next(f"sw{k}" for k in itertools.count() if f"sw{k}" not in taken)
        return self.named_symbol(name, lower, upper)

    def symbol_at_site(self, k: int, lower: int = 0) -> sympy.Symbol:
        """The ``k``-th size minted at the current site (a fresh ``sw<n>`` when there is none)."""
        if self.site is None:
            return self.fresh_symbol(lower=lower)
        return self.named_symbol(f"s_{self.site}_{k}", lower=lower)

    def named_symbol(self, name: str, lower: int = 0, upper: int | None = None) -> sympy.Symbol:
        """The size symbol called ``name`` (made and registered on first use). A negative
        ``lower`` makes a plain integer symbol (an ``item()`` value), otherwise a non-negative one.

        Names start with ``s`` so torch's ShapeEnv treats them as ordinary size symbols. A name
        derived from where the size comes from (a loop body and carried position) makes
        re-inference find the same symbol again instead of minting a new one every time.
        """
        s = sympy.Symbol(name, integer=True, nonnegative=True) if lower >= 0 else sympy.Symbol(name, integer=True)
        if s not in self.symbols:
            self.symbols[s] = SymbolInfo(None, None, lower=lower, upper=upper)
            log.debug("shape: new symbol %s in [%s, %s]", s, lower, upper)
        return s

    # -- torch meta kernels ------------------------------------------------------------------
    @property
    def kernels(self):
        """The FakeTensor runner for ops without a hand rule, sharing this context's symbols."""
        if self._kernel_runner is None:
            from .meta_kernels import KernelRunner

            self._kernel_runner = KernelRunner(self)
        return self._kernel_runner

    @classmethod
    def of(cls, symbols) -> "ShapeContext":
        """Accept a ShapeContext, a ``Graph.symbols`` dict or None."""
        if isinstance(symbols, ShapeContext):
            return symbols
        if symbols is None or isinstance(symbols, dict):
            return cls(symbols)
        raise TypeError(f"symbols must be a ShapeContext, a dict of SymbolInfo or None, got {type(symbols).__name__}")
