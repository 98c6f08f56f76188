"""Rules and rulesets (see `rewrite.dsl`, "Rules" and "Rulesets").

A `Rule` is ``lhs -> rhs`` under conditions, matching every operand order of commutative ops
(`operand_orders`); `Rule.data` is a pattern rule as the plain data the e-graph engine compiles
(`RuleData`). A `RuleSet` is a named, scheduled group of rules.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
import zlib
from typing import Any, Iterable, NamedTuple

import torch

from ..ops import COMMUTATIVE, is_pointwise, schema_default, schema_types
from .conditions import Condition, DtypeIn, SameMeta, type_conditions
from .evaluation import evaluate, match
from .patterns import (SIBLINGS, Lit, OpPattern, Pattern, RuleError, Var, format_pattern, vars_of, members, pattern_data,
                       same_value)


class RuleData(NamedTuple):
    """A pattern rule as plain data (`Rule.data`): names, numbers and tuples (`pattern_data`,
    `Condition.data`), what `rewrite.egraph` takes instead of the DSL's objects."""

    name: str
    siblings: bool      # a multi-pattern rule: ``lhs`` and ``rhs`` hold one pattern per member
    lhs: tuple          # the left sides: one per operand order (``Rule.orders``), or the members
    variables: tuple    # the names ``lhs`` binds, first occurrence first
    conditions: tuple   # each condition's ``(kind, *operands)``
    rhs: Any            # the replacement's pattern data (one per member for siblings)
    same_meta: bool     # the replacement swaps a pointwise call's operands: its meta is the matched one's


@dataclasses.dataclass(eq=False)
class Rule:
    """``lhs`` -> ``rhs`` when every condition in ``when`` holds.

    ``orders``: the left sides the rule matches, ``lhs`` first, then ``lhs`` with the operands of
    its commutative ops (`rewrite.ops.COMMUTATIVE`) swapped (``commute=True``, see `operand_orders`):
    one rule, one name, for ``x * 1`` and ``1 * x``.
    """

    name: str
    lhs: OpPattern
    rhs: Any  # Pattern, literal, or callable(**binding) -> value
    when: tuple = ()
    exact: bool = True  # False: the replacement may round differently (checked within tolerance)
    commute: bool = True  # also match the other operand order of commutative ops
    orders: tuple = dataclasses.field(init=False, repr=False)

    def __post_init__(self):
        if not isinstance(self.lhs, OpPattern):
            raise RuleError(f"rule {self.name}: the left side must be an op pattern such as "
                            f"aten.neg.default(x), got {self.lhs!r}")
        lhs_vars = set(self.variables)
        if not self.is_computed:
            rhs = self.rhs if isinstance(self.rhs, Pattern) else Lit(self.rhs)
            missing = set(rhs.variables()) - lhs_vars
            if missing:
                raise RuleError(f"rule {self.name}: the right side uses variables {sorted(missing)} "
                                f"that the left side does not bind (left binds {sorted(lhs_vars)})")
            left, right = members(self.lhs), members(self.rhs)
            if left is not None and (right is None or len(right) != len(left)):
                raise RuleError(f"rule {self.name}: a siblings(...) left side of {len(left)} members needs a "
                                f"siblings(...) right side of {len(left)} members, got {self.rhs!r}")
            if left is None and right is not None:
                raise RuleError(f"rule {self.name}: siblings(...) on the right needs siblings(...) on the left")
        for c in self.when:
            if not isinstance(c, Condition):
                raise RuleError(f"rule {self.name}: 'when' holds conditions such as is_float(x), got {c!r}")
            unbound = {v.name for v in c.vars if isinstance(v, Var)} - lhs_vars
            if unbound:
                raise RuleError(f"rule {self.name}: condition {c!r} reads {sorted(unbound)}, "
                                f"not bound by the left side {self.lhs!r}")
        self.orders = tuple(operand_orders(self) if self.commute else [self.lhs])

    def each_order(self) -> list["Rule"]:
        """One rule per left side in `orders` (what `rewrite.testing.check_rule` checks one by one)."""
        if len(self.orders) == 1:
            return [self]
        return [Rule(self.name, lhs, self.rhs, self.when, self.exact, commute=False) for lhs in self.orders]

    @property
    def variables(self) -> list[str]:
        return self.lhs.variables()

    @property
    def is_computed(self) -> bool:
        return callable(self.rhs) and not isinstance(self.rhs, Pattern)

    def var_types(self) -> dict[str, str]:
        """Variable name -> schema type of the first position it takes in ``lhs``."""
        out: dict[str, str] = {}

        def walk(p, typ):
            if isinstance(p, Var):
                out.setdefault(p.name, typ or "Any")
            elif isinstance(p, OpPattern):
                pos, kw = schema_types(p.target)
                for i, a in enumerate(p.args):
                    walk(a, pos[i] if i < len(pos) else None)
                for k, a in p.kwargs.items():
                    walk(a, kw.get(k))
            elif isinstance(p, (list, tuple)):
                elem = typ[:-2] if typ and typ.endswith("[]") else None
                for a in p:
                    walk(a, elem)

        walk(self.lhs, "Tensor")
        return out

    def conditions_hold(self, binding: dict) -> bool:
        """The conditions on concrete values; for an inexact rule also its domain (`in_domain`)."""
        return all(c.holds(binding) for c in self.when) and (self.exact or in_domain(binding))

    def match(self, tree) -> dict | None:
        """Match the left side, in any of its `orders`, against a value tree of `Call` records (see `match`)."""
        for lhs in self.orders:
            binding = match(lhs, tree)
            if binding is not None:
                return binding
        return None

    def apply(self, binding: dict):
        """The replacement's value for concrete ``binding`` (tensors / Python values)."""
        if self.is_computed:
            result = self.rhs(**binding)  # a value, or a pattern over the rule's variables (as on the IR)
            return evaluate(result, binding) if isinstance(result, Pattern) else result
        return evaluate(self.rhs, binding)

    def data(self) -> RuleData:
        """The pattern rule as plain data: what the e-graph engine compiles into egglog rules
        (`rewrite.egraph.encode.RuleCompiler.compile_rule`), knowing none of the DSL's classes."""
        if self.is_computed:
            raise RuleError(f"rule {self.name} has a computed replacement; it runs on the IR, not in egglog")
        left = members(self.lhs)
        return RuleData(
            name=self.name, siblings=left is not None,
            # every operand order is a structural match of its own (same variables, its own streams)
            lhs=tuple(pattern_data(p) for p in (left if left is not None else self.orders)),
            variables=tuple(self.variables), conditions=tuple(c.data() for c in self.when),
            rhs=(tuple(pattern_data(p) for p in members(self.rhs)) if left is not None else pattern_data(self.rhs)),
            same_meta=left is None and self._swaps_operands())

    def _swaps_operands(self) -> bool:
        """Whether the replacement is the matched pointwise call with its two tensor operands
        swapped (``x + y -> y + x``): broadcasting and type promotion are symmetric, so its meta is
        the matched one's, and the engine may union it without inferring a meta first."""
        lhs, rhs = self.lhs, self.rhs
        if not (isinstance(rhs, OpPattern) and rhs.target is lhs.target and is_pointwise(lhs.target)):
            return False
        return (len(lhs.args) >= 2 and all(isinstance(a, Var) for a in lhs.args[:2]) and lhs.args[0] != lhs.args[1]
                and tuple(rhs.args[:2]) == (lhs.args[1], lhs.args[0]) and tuple(rhs.args[2:]) == tuple(lhs.args[2:])
                and all(same_value(rhs.kwargs[k], v) if not isinstance(v, Pattern) else rhs.kwargs[k] == v
                        for k, v in lhs.kwargs.items()))

    def __repr__(self):
        rhs = getattr(self.rhs, "__name__", "<computed>") if self.is_computed else format_pattern(self.rhs)
        # the engine's guard on every rule (see the module docstring), listed with the conditions
        when = ", ".join([*map(repr, self.when), "keeps dtype+shape"])
        rounding = "" if self.exact else " (may round differently)"
        orders = f" ({len(self.orders)} operand orders)" if len(self.orders) > 1 else ""
        return f"{self.name}: {self.lhs!r} -> {rhs} when {when}{rounding}{orders}"


def _commutes(p: OpPattern, tensors: set) -> bool:
    """Whether swapping ``p``'s two operands gives another pattern of the same value: a commutative
    op on two non-literal operands (a literal scalar is never ``self`` of an ATen call) with its
    other arguments at their defaults (``add(x, y, alpha=2)`` does not commute). The first operand
    must be known to be a tensor (an op's result, or a variable in ``tensors``: one with a dtype
    condition): ``self`` only holds tensors, the second operand may bind a Python scalar too."""
    if p.target not in COMMUTATIVE or len(p.args) != 2 or not all(isinstance(a, Pattern) for a in p.args):
        return False
    if not (isinstance(p.args[0], OpPattern) or (isinstance(p.args[0], Var) and p.args[0].name in tensors)):
        return False
    if p.args[0] is p.args[1] or (isinstance(p.args[0], Var) and p.args[0] == p.args[1]):
        return False
    return all(not isinstance(v, Pattern) and same_value(schema_default(p.target, k), v) for k, v in p.kwargs.items())


def _swaps(p, tensors: set) -> list:
    """``p`` with every combination of commutative operands swapped (``p`` itself first)."""
    if isinstance(p, (list, tuple)):
        return [type(p)(combo) for combo in itertools.product(*(_swaps(a, tensors) for a in p))]
    if not isinstance(p, OpPattern) or p.target is SIBLINGS:
        return [p]
    out = []
    for args in itertools.product(*(_swaps(a, tensors) for a in p.args)):
        out.append(OpPattern(p.target, tuple(args), p.kwargs))
        if _commutes(p, tensors):
            out.append(OpPattern(p.target, (args[1], args[0]), p.kwargs))
    return out


def _renamed(p, names: dict):
    """``p`` with variables renamed by ``names`` (names it lacks are kept)."""
    if isinstance(p, Var):
        return Var(names.get(p.name, p.name))
    if isinstance(p, OpPattern):
        return OpPattern(p.target, tuple(_renamed(a, names) for a in p.args),
                         {k: _renamed(v, names) for k, v in p.kwargs.items()})
    if isinstance(p, (list, tuple)):
        return type(p)(_renamed(a, names) for a in p)
    if isinstance(p, Lit):
        return Lit(_renamed(p.value, names))
    return p


def operand_orders(r: Rule) -> list:
    """The left sides ``r`` matches: ``r.lhs`` and its commutative operands swapped, less the
    swaps that add nothing. A swap that is ``r.lhs`` with variables renamed (``x + y`` and
    ``y + x``) gives the rule back over renamed variables; it is dropped when that renamed rule
    is ``r`` itself, or builds ``r``'s replacement with operands swapped (``clone(x * y) -> y * x``:
    what commutativity gives anyway, and only where it holds). ``x + y -> y + x``, commutativity
    itself, thus stays one order; ``x * c -> x when c == 1`` gets ``c * x``."""
    out, seen = [r.lhs], {repr(r.lhs)}
    tensors = {c.x.name for c in r.when if isinstance(c, DtypeIn)}
    for lhs in _swaps(r.lhs, tensors)[1:]:
        if repr(lhs) in seen or (not r.is_computed and repr(lhs) == repr(r.rhs)):
            continue
        seen.add(repr(lhs))
        rename = dict(zip(lhs.variables(), r.lhs.variables()))
        if repr(_renamed(lhs, rename)) == repr(r.lhs):  # the same left side over renamed variables
            if r.is_computed:
                continue
            rhs = repr(_renamed(r.rhs, rename))
            same_when = (sorted(repr(_renamed_condition(c, rename)) for c in r.when)
                         == sorted(repr(_renamed_condition(c, {})) for c in r.when))
            if (rhs == repr(r.rhs) and same_when) or (rhs != repr(r.rhs) and rhs in {repr(p) for p in _swaps(r.rhs, tensors)}):
                continue
        out.append(lhs)
    return out


def _renamed_condition(c: Condition, names: dict) -> Condition:
    """``c`` over renamed variables (symmetric conditions with their two variables in order)."""
    if not dataclasses.is_dataclass(c):
        return c
    fields = {f.name: _renamed(getattr(c, f.name), names) if isinstance(getattr(c, f.name), (Var, Lit)) else getattr(c, f.name)
              for f in dataclasses.fields(c)}
    out = type(c)(**fields)
    if isinstance(out, SameMeta) and out.y.name < out.x.name:
        out = type(c)(out.y, out.x)
    return out


def in_domain(binding: dict) -> bool:
    """Where an inexact rule (``exact=False``) promises agreement within rounding: no tensor holds
    an infinity or an element beyond the square root of its dtype's largest value (NaN is fine:
    it propagates alike). Beyond that a sum or product may overflow on one side and not the other
    (a scale applied before or after a GEMM, a GEMM summed in another order), and floating point
    promises nothing."""
    for v in binding.values():
        if isinstance(v, torch.Tensor) and v.dtype.is_floating_point and v.numel():
            a = v.detach().double().abs().nan_to_num(nan=0.0, posinf=math.inf)
            if float(a.max()) > math.sqrt(torch.finfo(v.dtype).max):
                return False
    return True


def rule(lhs: OpPattern, rhs, when: Iterable[Condition] = (), name: str | None = None, exact: bool = True,
         commute: bool = True) -> Rule:
    """Declare ``lhs -> rhs`` (under conditions ``when``; ``exact=False``: may round differently).

    The declared types of typed variables (`type_conditions`) come first among the conditions, in
    the order the variables appear. ``commute=False``: match the written operand order only.
    """
    if name is None:
        name = f"{getattr(lhs, 'name', 'rule')}#{zlib.crc32(repr(lhs).encode()) % 10_000:04d}"
    found: dict = {}
    for side in (lhs, rhs):
        if isinstance(side, Pattern):
            vars_of(side, found)
    declared = [c for v in found.values() for c in type_conditions(v)]
    return Rule(name, lhs, rhs, tuple(declared + [c for c in when if c not in declared]), exact, commute)


@dataclasses.dataclass
class RuleSet:
    """A named, scheduled group of rules (run together up to ``iterations`` times per round)."""

    name: str
    rules: list
    iterations: int = 8
    description: str = ""

    def __post_init__(self):
        self.rules = list(self.rules)
        if not self.name or not all(ch.isalnum() or ch in "._-" for ch in self.name):
            raise RuleError(f"ruleset name {self.name!r} must be non-empty and use letters, digits, '.', '_', '-'")
        if not isinstance(self.iterations, int) or self.iterations < 1:
            raise RuleError(f"ruleset {self.name}: iterations must be an int >= 1, got {self.iterations!r}")
        seen = set()
        for r in self.rules:
            if not isinstance(r, Rule):
                raise RuleError(f"ruleset {self.name}: expected Rule objects (from rewrite.dsl.rule), got {r!r}")
            if r.name in seen:
                raise RuleError(f"ruleset {self.name}: two rules are named {r.name!r}; names must be unique")
            seen.add(r.name)

    @property
    def pattern_rules(self) -> list[Rule]:
        return [r for r in self.rules if not r.is_computed]

    @property
    def computed_rules(self) -> list[Rule]:
        return [r for r in self.rules if r.is_computed]

    def __iter__(self):
        return iter(self.rules)

    def __len__(self):
        return len(self.rules)
