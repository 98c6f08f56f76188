"""The rule DSL: a rewrite rule is one declaration, pattern on the left, replacement on the right.

Example (a rule file reads like a table)::

    from rewrite.dsl import aten, rule, RuleSet, variables, is_integer, shape_is, value_is

    x, c, s = variables("x c s")
    RULES = RuleSet("algebra.identity", [
        rule(aten.neg.default(aten.neg.default(x)), x, name="neg_neg"),
        rule(aten.mul.Tensor(x, c), x, when=[value_is(c, 1)], name="mul_one"),
        rule(aten.add.Tensor(x, 0), x, when=[is_integer(x)], name="add_zero_int"),
        rule(aten.reshape.default(x, s), x, when=[shape_is(x, s)], name="reshape_noop"),
        rule(aten.t.default(aten.t.default(x)), x, name="t_t"),
    ])

(``x + 0 -> x`` is declared for integers only: for a float ``x = -0.0``, ``-0.0 + 0`` is ``0.0``.
Every replacement must also keep the matched expression's dtype and shape, see Rules below.)

Public API (stable; the rule library and ``rewrite.testing`` are written against it)
----------------------------------------------------------------------------------
Patterns
    ``Var(name)`` / ``variables("x y z")``
        A pattern variable. It matches any argument: a tensor-valued node, a size (SymInt), a
        scalar, a list. The same name used twice must bind the same value (the same e-class).
    ``var(name, dtype=..., rank=...)`` / ``variables("x w", dtype=FLOATS, rank=2)``
        A typed variable: every rule using it gets ``dtype_is`` / ``rank_is`` conditions for it
        (first among its conditions), so a family of rules states its operand types once.
    Commutative ops (``rewrite.ops.COMMUTATIVE``: add, mul, maximum, ...) match both operand
        orders: ``rule(aten.mul.Tensor(x, c), x, ...)`` also rewrites ``c * x`` (``Rule.orders``;
        ``rule(..., commute=False)`` keeps the written order).
    ``aten.<op>.<overload>(*args, **kwargs)``, ``op(target)(*args, **kwargs)``
        An ``OpPattern`` for a call of that target. ATen calls are stored in canonical form: every
        schema argument is present, missing ones filled with their schema default. So a pattern
        means exactly the call as written (``aten.sum.dim_IntList(x, [1])`` means keepdim=False),
        and ``pattern.args``/``pattern.kwargs`` are what you would pass to the op.
        ``op(operator.mul)(a, b)`` matches size arithmetic; ``op(operator.getitem)(t, 0)`` the first
        output of a multi-output op.
    Python values (``1``, ``0.0``, ``True``, ``None``, ``torch.float32``, ``[0, 1]``) are literals
        (``Lit``). Literals are typed: ``1`` does not match ``1.0`` and ``0.0`` does not match
        ``-0.0``, because type promotion and signed zeros make them different values.

Conditions (the ``when=[...]`` list; all must hold)
    ``is_float(x)``, ``is_integer(x)`` (integer dtypes, not bool), ``is_bool(x)``,
    ``dtype_is(x, *dtypes)`` (listed as ``tensor(x)`` when it names every dtype: ``x`` is a
    tensor, not a Python scalar in a Tensor position), ``same_dtype(x, y)``, ``same_shape(x, y)``,
    ``shape_is(x, s)`` (the shape of tensor ``x`` equals the size list ``s``: a variable bound to
    a list argument, or a literal list), ``dims_agree(x, i, y, j)`` (dim i of x has the size of
    dim j of y; what GEMM rules state, and what lets `check_rule` draw operands that fit),
    ``rank_is(x, n)``, ``value_is(c, v)`` (``c`` is a
    compile-time constant tensor or scalar whose elements all equal ``v``; typed like literals
    only in that NaN never equals anything and -0.0 is distinct from 0.0).
    Every condition can be checked in two places: inside the e-graph (each e-class has a meta;
    its dtype, rank and canonical sympy shape string are analyses the rule's query reads) and in
    Python on concrete values with
    ``cond.holds(binding)``; ``binding`` maps variable names to tensors, Python values, or
    ``TensorMeta``/``SymMeta`` (for metas, ``value_is`` cannot hold).

Rules
    ``rule(lhs, rhs, when=(), name=None)`` returns a ``Rule``. ``rhs`` is a pattern built from
    ``lhs``'s variables and literals, or a Python callable ``rhs(**binding) -> value`` (a
    *computed* replacement, e.g. folding). Pattern rules run inside the e-graph; computed rules
    are applied by the Python matcher on the IR between saturation rounds: ``rhs`` receives each
    variable's value (a constant's tensor, a literal, or the ``TensorMeta``/``SymMeta`` of any
    other node) and returns None (no rewrite), a tensor or number (becomes a constant), or a
    pattern built from the rule's ``Var`` objects (not from the values it received).
    Soundness guard applied by the engine to every rule: a replacement is only accepted where its
    dtype and shape equal those of the matched expression, so broadcasting or type promotion can
    never silently change a result (``Rule``'s repr and ``python -m rewrite rules`` print it as
    ``keeps dtype+shape``, after the rule's own conditions: ``squeeze.dim(x, d) -> x`` is sound
    only through it). Replacements inherit the stream of the matched node, and all op nodes of a
    pattern must be on the same stream.
    ``rule(..., exact=False)`` declares a replacement that computes the same real-number function
    but may round differently (a fused kernel, a scale folded into a weight, a wider GEMM):
    `rewrite.testing.check_rule` then compares both sides within the dtype's tolerance instead of
    bit for bit, on instances in the rule's domain (`in_domain`: finite values, none so large that
    a sum may overflow on one side only). Every rule is exact unless it says so.
    ``Rule`` exposes: ``name``, ``lhs``, ``rhs``, ``when``, ``exact``, ``variables`` (names in ``lhs``),
    ``var_types()`` (name -> torch's schema type string of the first position the variable
    takes in ``lhs``: ``"Tensor"``, ``"List[int]"``, ``"List[SymInt]"``, ``"Scalar"``,
    ``"Optional[List[int]]"``...), ``is_computed``,
    ``conditions_hold(binding)``, ``match(tree)`` (``tree`` built from ``Call(target, args)``
    records and values; returns the binding or None), and ``apply(binding)`` which evaluates the
    replacement on concrete values (``evaluate(pattern, binding)`` does that for any pattern).

Multi-pattern rules
    ``siblings(p1, p2, ...)`` on the left side matches values that all exist in the graph at once
    (sharing the variables they share): ``siblings(aten.mm.default(x, w0), aten.mm.default(x, w1))``
    is two GEMMs reading the same ``x``. The right side is a ``siblings(r1, r2, ...)`` of the same
    arity: member i is replaced by ri. The engine guards such rules so they cannot explode: every
    member must be an original node of the graph (terms rules created are never members, so a
    merged GEMM is not merged again) and members are taken in graph order (each set matches once).
    As a value (`evaluate`, `check_rule`), ``siblings(...)`` is its members flattened and
    concatenated into one tensor, so a multi-pattern rule is checked like any other.

Rulesets
    ``RuleSet(name, rules, iterations=8, description="")``: a named group run together, at most
    ``iterations`` times per saturation round. Rulesets are scheduled in list order
    (``rewrite.rules.default_rulesets()``), and users add their own through
    ``CompilerConfig().rules.extra = [RuleSet(...)]``.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
import operator
import zlib
from typing import Any, Iterable

import torch

from .ops import (ALL_DTYPES, COMMUTATIVE, FLOATS, INTS, NO_DEFAULT, OpError, canonical_call, dtype_str, is_pointwise,
                  register_target, schema_default, schema_types, shape_key, splat_key, target_from_name, target_name)

__all__ = [
    "Pattern", "Var", "Lit", "OpPattern", "var", "variables", "op", "aten", "prims",
    "Condition", "is_float", "is_integer", "is_bool", "dtype_is", "same_dtype", "same_shape",
    "shape_is", "rank_is", "value_is", "is_uniform", "is_const", "is_scalar", "made_by", "on_device", "dims_agree", "dim_is", "siblings", "SIBLINGS",
    "Rule", "RuleSet", "rule", "in_domain", "evaluate", "canonical_call", "target_name", "target_from_name",
    "RuleError", "match", "Call", "shape_key", "splat_key", "dtype_str", "same_value",
]


class RuleError(ValueError):
    """A rule or pattern is malformed; the message names the rule and what is allowed."""


# ---------------------------------------------------------------------------------------------
# patterns

class Pattern:
    """Base class of pattern trees: `Var`, `Lit`, `OpPattern`."""

    def variables(self) -> list[str]:
        return list(dict.fromkeys(v.name for v in _walk_vars(self)))  # first occurrence first


@dataclasses.dataclass(frozen=True)
class Var(Pattern):
    """A pattern variable: matches anything; repeated names must bind the same value.

    Declared with ``dtypes`` and/or ``rank`` (`var`, `variables`), it is a typed variable: every
    rule using it gets ``dtype_is(v, *dtypes)`` and ``rank_is(v, rank)`` among its conditions
    (`Var.conditions`), so a family of rules states its operands' types once. Equality and
    hashing are by name only.
    """

    name: str
    dtypes: tuple | None = dataclasses.field(default=None, compare=False)
    rank: int | None = dataclasses.field(default=None, compare=False)

    def __post_init__(self):
        if not self.name.isidentifier():
            raise RuleError(f"pattern variable name {self.name!r} must be a Python identifier")
        if isinstance(self.dtypes, torch.dtype):
            object.__setattr__(self, "dtypes", (self.dtypes,))
        if self.dtypes is not None:
            object.__setattr__(self, "dtypes", tuple(self.dtypes))
            if not self.dtypes or not all(isinstance(d, torch.dtype) for d in self.dtypes):
                raise RuleError(f"variable {self.name}: dtype must be a torch.dtype or a non-empty sequence of them, "
                                f"got {self.dtypes!r}")
        if self.rank is not None and (isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 0):
            raise RuleError(f"variable {self.name}: rank must be a non-negative int, got {self.rank!r}")

    def conditions(self) -> list:
        """The conditions the variable's declared type stands for (none for a plain variable)."""
        return (([DtypeIn(self, self.dtypes)] if self.dtypes is not None else [])
                + ([RankIs(self, self.rank)] if self.rank is not None else []))

    def __repr__(self):
        return self.name


@dataclasses.dataclass(frozen=True)
class Lit(Pattern):
    """A literal argument: int, float, bool, None, str, torch.dtype, torch.device, or a list of those/patterns."""

    value: Any

    def __repr__(self):
        return repr(self.value)


@dataclasses.dataclass(frozen=True, eq=False)
class OpPattern(Pattern):
    """A call of ``target`` with canonical ``args``/``kwargs`` (which may hold sub-patterns)."""

    target: Any
    args: tuple
    kwargs: dict

    @property
    def name(self) -> str:
        return target_name(self.target)

    def __repr__(self):
        if self.target is SIBLINGS:
            return "siblings(" + ", ".join(map(repr, self.args[0])) + ")"
        inner = [_fmt(a) for a in self.args]
        for k, v in self.kwargs.items():
            default = schema_default(self.target, k)
            if not (default is not NO_DEFAULT and same_value(default, v)):
                inner.append(f"{k}={_fmt(v)}")
        return f"{self.name}({', '.join(inner)})"

    def to_egglog(self, scope, rhs: bool = False) -> str:
        items = [_egglog_term(a, scope, rhs) for a in list(self.args) + list(self.kwargs.values())]
        return scope.call(self.name, items, rhs)


def _egglog_term(p, scope, rhs: bool) -> str:
    """egglog term of a pattern or literal argument (``scope`` names variables and streams)."""
    if isinstance(p, Var):
        return scope.var(p.name)
    if isinstance(p, OpPattern):
        return p.to_egglog(scope, rhs)
    if isinstance(p, Lit):
        return _egglog_term(p.value, scope, rhs)
    if isinstance(p, (list, tuple)):
        return scope.sequence([_egglog_term(a, scope, rhs) for a in p], isinstance(p, list))
    return scope.literal(p)


def _fmt(a) -> str:
    if isinstance(a, list):
        return "[" + ", ".join(_fmt(x) for x in a) + "]"
    if isinstance(a, tuple):
        return "(" + ", ".join(_fmt(x) for x in a) + ")"
    if isinstance(a, torch.dtype):
        return str(a)
    return repr(a)


def _as_pattern_arg(a):
    """Arguments inside OpPattern: patterns stay, lists become lists of args, the rest are literals."""
    if isinstance(a, Pattern):
        return a.value if isinstance(a, Lit) and not isinstance(a.value, (list, tuple)) else a
    if isinstance(a, (list, tuple)):
        return [_as_pattern_arg(x) for x in a]
    if a is None or isinstance(a, (bool, int, float, str, torch.dtype, torch.device, torch.layout,
                                   torch.memory_format)):
        return a
    raise RuleError(f"pattern argument {a!r} of type {type(a).__name__} is not allowed; use a Var, an op "
                    "pattern, or a literal (int, float, bool, None, str, dtype, device, list)")


def _walk_vars(p):
    """Every `Var` in pattern ``p``, in order (repeats included)."""
    if isinstance(p, Var):
        yield p
    elif isinstance(p, OpPattern):
        for a in list(p.args) + list(p.kwargs.values()):
            yield from _walk_vars(a)
    elif isinstance(p, (list, tuple)):
        for a in p:
            yield from _walk_vars(a)
    elif isinstance(p, Lit):
        yield from _walk_vars(p.value)


def var(name: str, dtype=None, rank: int | None = None) -> Var:
    """One pattern variable, typed if ``dtype`` (a dtype or a sequence of them) or ``rank`` is given."""
    return Var(name, dtype, rank)


def variables(names: str, dtype=None, rank: int | None = None) -> tuple[Var, ...]:
    """``x, y = variables("x y")``; ``variables("x w", dtype=FLOATS, rank=2)`` declares their type
    once for every rule that uses them (see `Var`)."""
    return tuple(Var(n, dtype, rank) for n in names.replace(",", " ").split())


def _vars_of(p, out: dict) -> dict:
    """The `Var` objects in ``p`` by name, first occurrence first (typed ones win over plain ones)."""
    for v in _walk_vars(p):
        seen = out.get(v.name)
        if seen is None or (seen.dtypes is None and seen.rank is None):
            out[v.name] = v
        elif (v.dtypes is not None or v.rank is not None) and (v.dtypes, v.rank) != (seen.dtypes, seen.rank):
            raise RuleError(f"variable {v.name} is declared twice with different types: dtypes {seen.dtypes} rank "
                            f"{seen.rank}, and dtypes {v.dtypes} rank {v.rank}")
    return out


class _OpBuilder:
    """``op(target)(*args, **kwargs)`` -> OpPattern in canonical form."""

    def __init__(self, target):
        if isinstance(target, torch._ops.OpOverloadPacket):
            target = _traced_overload(target)
        if not callable(target):
            raise RuleError(f"op target {target!r} is not callable")
        self.target = target
        register_target(target)

    def __call__(self, *args, **kwargs) -> OpPattern:
        try:
            cargs, ckwargs = canonical_call(self.target, args, kwargs)
        except OpError as e:
            raise RuleError(str(e)) from None
        return OpPattern(self.target, tuple(_as_pattern_arg(a) for a in cargs),
                         {k: _as_pattern_arg(v) for k, v in ckwargs.items()})

    def __repr__(self):
        return f"op({target_name(self.target)})"


def _traced_overload(packet) -> torch._ops.OpOverload:
    """The overload a traced (core ATen) graph uses for ``aten.<op>(...)`` written without one.

    Taking ``.default`` was a trap: ``aten.mul.default`` is the Python-scalar ``mul(Scalar, Scalar)``,
    never in a traced graph, so ``aten.mul(x, 2)`` passed `check_rule` and never fired (issue 30).
    Traced graphs call the functional overloads that take a tensor first, and the core ATen ones
    among them; ``x * 2`` is ``aten.mul.Tensor(x, 2)`` there. One such overload, or a ``Tensor`` one
    among several, is taken; otherwise the rule must name it.
    """
    def functional_tensor_first(name):
        schema = getattr(packet, name)._schema
        return (not schema.is_mutable and bool(schema.arguments)
                and isinstance(schema.arguments[0].type, torch.TensorType))

    candidates = [n for n in packet.overloads() if functional_tensor_first(n)]
    core = [n for n in candidates if torch.Tag.core in getattr(packet, n).tags] or candidates
    if len(core) == 1:
        return getattr(packet, core[0])
    if "Tensor" in core:
        return packet.Tensor
    spelled = core or packet.overloads()
    raise RuleError(f"aten.{packet.__name__} has several overloads {spelled}; name the one traced graphs use, "
                    f"e.g. aten.{packet.__name__}.{spelled[0]}(...) (`python -m rewrite rules` and graph dumps "
                    "show the spellings)")


def op(target) -> _OpBuilder:
    """Pattern constructor for any call target (ATen overload, ``operator.mul``, ...)."""
    return _OpBuilder(target)


class _Namespace:
    """``aten.mul.Tensor(x, y)``: attribute access mirrors ``torch.ops.aten``."""

    def __init__(self, ns: str):
        self._ns = ns

    def __getattr__(self, opname: str):
        packet = getattr(getattr(torch.ops, self._ns), opname)
        return _PacketBuilder(packet)


class _PacketBuilder:
    def __init__(self, packet):
        self._packet = packet

    def __getattr__(self, overload: str) -> _OpBuilder:
        return _OpBuilder(getattr(self._packet, overload))

    def __call__(self, *args, **kwargs) -> OpPattern:
        return _OpBuilder(self._packet)(*args, **kwargs)


aten = _Namespace("aten")
prims = _Namespace("prims")


@torch.library.custom_op("rewrite_dsl::siblings", mutates_args=())
def _siblings_value(members: list[torch.Tensor]) -> torch.Tensor:
    """The value of ``siblings(...)`` for checking: its members flattened into one tensor."""
    return torch.cat([m.reshape(-1) for m in members])


SIBLINGS = torch.ops.rewrite_dsl.siblings.default
register_target(SIBLINGS)


def siblings(*patterns) -> OpPattern:
    """A multi-pattern: values that all exist in the graph at once (see "Multi-pattern rules")."""
    if len(patterns) < 2:
        raise RuleError(f"siblings(...) takes two or more op patterns, got {len(patterns)}")
    for p in patterns:
        if not isinstance(p, OpPattern) or p.target is SIBLINGS:
            raise RuleError(f"siblings(...) members must be op patterns (not nested siblings), got {p!r}")
    return OpPattern(SIBLINGS, (list(patterns),), {})


def members(p) -> list | None:
    """The member patterns of a ``siblings(...)`` pattern, or None for any other pattern."""
    return list(p.args[0]) if isinstance(p, OpPattern) and p.target is SIBLINGS else None


# ---------------------------------------------------------------------------------------------
# conditions: one class each, checked in three places

class Condition:
    """A side condition of a rule, over the variables in ``vars``.

    Each condition says itself in the three places a rule is used: ``holds(binding)`` on concrete
    values or metas (the Python matcher, `rewrite.testing`), ``to_egglog(scope, compiler)`` as
    atoms over the e-graph's dtype/shape/sizes/splat analyses, and ``hint(hints)`` for what
    `rewrite.testing.check_rule` should draw so that random instances satisfy it.
    """

    vars: tuple = ()

    def holds(self, binding: dict) -> bool:
        raise NotImplementedError

    def to_egglog(self, scope, compiler) -> list[str]:
        raise NotImplementedError

    def hint(self, hints: dict) -> None:
        """Record in ``hints`` (variable name -> {key: value}) what the condition asks for."""

    def _names(self) -> str:
        return ", ".join(v.name if isinstance(v, Var) else _fmt(v) for v in self.vars)

    def _values(self, binding: dict) -> list:
        return [_bound(v, binding) for v in self.vars]


@dataclasses.dataclass(frozen=True, repr=False)
class _OnOne(Condition):
    """A condition on one variable ``x`` (and literal parameters)."""

    x: Var

    @property
    def vars(self):
        return (self.x,)


@dataclasses.dataclass(frozen=True, repr=False)
class DtypeIn(_OnOne):
    dtypes: tuple

    def __repr__(self):
        if set(self.dtypes) >= set(ALL_DTYPES):
            return f"tensor({self._names()})"  # any dtype: "is a tensor, not a Python scalar"
        return f"dtype({self._names()}) in {{{', '.join(dtype_str(d) for d in self.dtypes)}}}"

    def holds(self, binding):
        d = _dtype_of(self._values(binding)[0])
        return d is not None and d in self.dtypes

    def to_egglog(self, scope, compiler):
        return [f"({compiler.dtype_set(self.dtypes)} (dtype (meta {scope.var(self.x.name)})))"]

    def hint(self, hints):
        h = hints.setdefault(self.x.name, {})
        h["dtypes"] = tuple(d for d in self.dtypes if d in h.get("dtypes", self.dtypes))


@dataclasses.dataclass(frozen=True, repr=False)
class _SameMeta(Condition):
    """``x`` and ``y`` agree on one part of their metas (`SameDtype`, `SameShape`)."""

    x: Var
    y: Var
    label = ""        # the condition's name in listings
    analysis = ""     # the e-graph analysis both must agree on
    hint_key = ""     # what rewrite.testing draws one like the other

    @property
    def vars(self):
        return (self.x, self.y)

    def __repr__(self):
        return f"{self.label}({self._names()})"

    def to_egglog(self, scope, compiler):
        a, b = scope.var(self.x.name), scope.var(self.y.name)
        return [f"(= ({self.analysis} (meta {a})) ({self.analysis} (meta {b})))"]

    def hint(self, hints):
        hints.setdefault(self.x.name, {})[self.hint_key] = self.y.name
        hints.setdefault(self.y.name, {})[self.hint_key] = self.x.name


class SameDtype(_SameMeta):
    label, analysis, hint_key = "same_dtype", "dtype", "dtype_like"

    def holds(self, binding):
        a, b = (_dtype_of(v) for v in self._values(binding))
        return a is not None and a == b


class SameShape(_SameMeta):
    label, analysis, hint_key = "same_shape", "shape", "shape_like"

    def holds(self, binding):
        a, b = (_shape_of(v) for v in self._values(binding))
        return a is not None and b is not None and shape_key(a) == shape_key(b)


@dataclasses.dataclass(frozen=True, repr=False)
class ShapeIs(_OnOne):
    sizes: Any  # a Var bound to a size list, or a Lit holding a list of ints

    @property
    def vars(self):
        return (self.x, self.sizes)

    def __repr__(self):
        return f"shape_is({self._names()})"

    def holds(self, binding):
        a, s = _shape_of(self._values(binding)[0]), _size_list(self._values(binding)[1])
        return a is not None and s is not None and shape_key(a) == shape_key(s)

    def to_egglog(self, scope, compiler):
        x = scope.var(self.x.name)
        if isinstance(self.sizes, Var):
            return [f"(= (shape (meta {x})) (sizes {scope.var(self.sizes.name)}))"]
        return [f'(= (shape (meta {x})) "{shape_key(self.sizes.value)}")']

    def hint(self, hints):
        hints.setdefault(self.x.name, {})
        if isinstance(self.sizes, Var):
            hints.setdefault(self.sizes.name, {})["sizes_of"] = self.x.name


@dataclasses.dataclass(frozen=True, repr=False)
class DimsAgree(Condition):
    """Dim ``i`` of tensor ``x`` has the size of dim ``j`` of tensor ``y`` (negative: from the end)."""

    x: Var
    i: int
    y: Var
    j: int

    @property
    def vars(self):
        return (self.x, self.y)

    def __repr__(self):
        return f"dims_agree({self.x!r}, {self.i}, {self.y!r}, {self.j})"

    def holds(self, binding):
        a, b = (_shape_of(v) for v in self._values(binding))
        return (a is not None and b is not None and -len(a) <= self.i < len(a) and -len(b) <= self.j < len(b)
                and shape_key([a[self.i]]) == shape_key([b[self.j]]))

    def to_egglog(self, scope, compiler):
        x, y = scope.var(self.x.name), scope.var(self.y.name)
        if self.i < 0 or self.j < 0:  # index from the end: through the rank
            ri, rj = scope.var(f"_rank_{self.x.name}"), scope.var(f"_rank_{self.y.name}")
            return [f"(= {ri} (rank (meta {x})))", f"(= {rj} (rank (meta {y})))",
                    f"(= (dim (meta {x}) {self._index(ri, self.i)}) (dim (meta {y}) {self._index(rj, self.j)}))"]
        return [f"(= (dim (meta {x}) {self.i}) (dim (meta {y}) {self.j}))"]

    @staticmethod
    def _index(rank: str, i: int) -> str:
        return str(i) if i >= 0 else f"(+ {rank} {i})"

    def hint(self, hints):
        # whichever is drawn second takes the size from the first
        hints.setdefault(self.x.name, {}).setdefault("dims_from", []).append((self.i, self.y.name, self.j))
        hints.setdefault(self.y.name, {}).setdefault("dims_from", []).append((self.j, self.x.name, self.i))


@dataclasses.dataclass(frozen=True, repr=False)
class DimIs(_OnOne):
    """Dim ``i`` of tensor ``x`` is known to be the number ``size`` (a symbolic size never is)."""

    i: int
    size: int

    def __repr__(self):
        return f"dim_is({self._names()}, {self.i}, {self.size})"

    def holds(self, binding):
        a = _shape_of(self._values(binding)[0])
        if a is None or not -len(a) <= self.i < len(a):
            return False
        return shape_key([a[self.i]]) == shape_key([self.size])

    def to_egglog(self, scope, compiler):
        return [f'(= (dim (meta {scope.var(self.x.name)}) {self.i}) "{self.size}")'] if self.i >= 0 else \
            [f"(= {scope.var('_rank_' + self.x.name)} (rank (meta {scope.var(self.x.name)})))",
             f'(= (dim (meta {scope.var(self.x.name)}) (+ {scope.var("_rank_" + self.x.name)} {self.i})) "{self.size}")']

    def hint(self, hints):
        hints.setdefault(self.x.name, {}).setdefault("dim_sizes", {})[self.i] = self.size


@dataclasses.dataclass(frozen=True, repr=False)
class RankIs(_OnOne):
    rank: int

    def __repr__(self):
        return f"rank_is({self._names()}, {self.rank!r})"

    def holds(self, binding):
        a = _shape_of(self._values(binding)[0])
        return a is not None and len(a) == self.rank

    def to_egglog(self, scope, compiler):
        return [f"(= (rank (meta {scope.var(self.x.name)})) {self.rank})"]

    def hint(self, hints):
        hints.setdefault(self.x.name, {})["rank"] = self.rank


@dataclasses.dataclass(frozen=True, repr=False)
class ValueIs(_OnOne):
    value: Any  # int or float

    def __repr__(self):
        return f"value_is({self._names()}, {self.value!r})"

    def holds(self, binding):
        return splat_key(self._values(binding)[0]) == splat_key(self.value) is not None

    def to_egglog(self, scope, compiler):
        return [f'(= (splat {scope.var(self.x.name)}) "{splat_key(self.value)}")']

    def hint(self, hints):
        hints.setdefault(self.x.name, {})["value"] = self.value


@dataclasses.dataclass(frozen=True, repr=False)
class OnDevice(_OnOne):
    """``x`` is a tensor on a device of type ``device`` ("cpu", "cuda"): for kernels of one backend."""

    device: str

    def __repr__(self):
        return f"on_device({self._names()}, {self.device!r})"

    def holds(self, binding):
        v = self._values(binding)[0]
        from .ir import TensorMeta

        return isinstance(v, (torch.Tensor, TensorMeta)) and torch.device(v.device).type == self.device

    def to_egglog(self, scope, compiler):
        return [f'(= (device (meta {scope.var(self.x.name)})) "{self.device}")']


@dataclasses.dataclass(frozen=True, repr=False)
class IsScalar(_OnOne):
    """``x`` is a Python number or a 0-dim tensor: it scales every element alike and broadcasts
    into any shape without changing it."""

    def __repr__(self):
        return f"is_scalar({self._names()})"

    def holds(self, binding):
        v = self._values(binding)[0]
        if isinstance(v, torch.Tensor):
            return v.dim() == 0
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    def to_egglog(self, scope, compiler):
        return [f"(Scalar {scope.var(self.x.name)})"]

    def hint(self, hints):
        hints.setdefault(self.x.name, {}).update(rank=0, value=0.5)


@dataclasses.dataclass(frozen=True, repr=False)
class MadeBy(_OnOne):
    """``x`` is computed by a call of one of ``targets`` (in the graph, not only equal to one).

    A structural condition for rules whose reason is layout, not value: values cannot tell how
    they were made, so on concrete values (`check_rule`) it holds for every tensor.
    """

    targets: tuple

    def __repr__(self):
        return f"made_by({self._names()}, {', '.join(target_name(t) for t in self.targets)})"

    def holds(self, binding):
        from .ir import TensorMeta

        return isinstance(self._values(binding)[0], (torch.Tensor, TensorMeta))

    def to_egglog(self, scope, compiler):
        ops = [(target_name(t), len(t._schema.arguments) if isinstance(t, torch._ops.OpOverload) else 2)
               for t in self.targets]
        return [f"({compiler.made_by(ops)} {scope.var(self.x.name)})"]


@dataclasses.dataclass(frozen=True, repr=False)
class Uniform(_OnOne):
    """``x`` is known at compile time and all its elements equal one number (not one of ``excluded``)."""

    excluded: tuple = ()

    def __repr__(self):
        but = f", not_in={list(self.excluded)!r}" if self.excluded else ""
        return f"is_uniform({self._names()}{but})"

    def holds(self, binding):
        key = splat_key(self._values(binding)[0])
        return key is not None and key not in {splat_key(v) for v in self.excluded}

    def to_egglog(self, scope, compiler):
        value = scope.var(f"_splat_{self.x.name}")
        return ([f"(= {value} (splat {scope.var(self.x.name)}))"]
                + [f'(!= {value} "{splat_key(v)}")' for v in self.excluded])

    def hint(self, hints):
        hints.setdefault(self.x.name, {}).setdefault("value", 0.5)


@dataclasses.dataclass(frozen=True, repr=False)
class IsConst(_OnOne):
    """``x`` is a constant tensor: a frozen weight or a folded value (so terms over it fold)."""

    def __repr__(self):
        return f"is_const({self._names()})"

    def holds(self, binding):
        return isinstance(self._values(binding)[0], torch.Tensor)

    def to_egglog(self, scope, compiler):
        return [f"(= {scope.var(self.x.name)} (Const {scope.var(f'_const_{self.x.name}')}))"]


def _var(v) -> Var:
    if not isinstance(v, Var):
        raise RuleError(f"conditions take pattern variables, got {v!r}")
    return v


def is_float(x: Var) -> Condition:
    return DtypeIn(_var(x), FLOATS)


def is_integer(x: Var) -> Condition:
    return DtypeIn(_var(x), INTS)


def is_bool(x: Var) -> Condition:
    return DtypeIn(_var(x), (torch.bool,))


def dtype_is(x: Var, *dtypes: torch.dtype) -> Condition:
    if not dtypes or not all(isinstance(d, torch.dtype) for d in dtypes):
        raise RuleError(f"dtype_is({x!r}, ...) needs one or more torch.dtype values, got {dtypes!r}")
    return DtypeIn(_var(x), tuple(dtypes))


def same_dtype(x: Var, y: Var) -> Condition:
    return SameDtype(_var(x), _var(y))


def same_shape(x: Var, y: Var) -> Condition:
    return SameShape(_var(x), _var(y))


def shape_is(x: Var, sizes) -> Condition:
    """Shape of ``x`` equals ``sizes``: a Var bound to a size-list argument, or a literal list."""
    if not isinstance(sizes, Var):
        if not isinstance(sizes, (list, tuple)) or not all(isinstance(s, int) for s in sizes):
            raise RuleError(f"shape_is({x!r}, sizes): sizes must be a Var or a list of ints, got {sizes!r}")
        sizes = Lit(list(sizes))
    return ShapeIs(_var(x), sizes)


def dims_agree(x: Var, i: int, y: Var, j: int) -> Condition:
    """Dim ``i`` of ``x`` has the size of dim ``j`` of ``y`` (GEMM operands: ``dims_agree(x, 1, w, 0)``)."""
    if not all(isinstance(d, int) and not isinstance(d, bool) for d in (i, j)):
        raise RuleError(f"dims_agree({x!r}, i, {y!r}, j): i and j must be ints, got {i!r}, {j!r}")
    return DimsAgree(_var(x), i, _var(y), j)


def dim_is(x: Var, i: int, size: int) -> Condition:
    """Dim ``i`` of ``x`` (negative: from the end) has the static size ``size`` (``dim_is(x, 2, 1)``)."""
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (i, size)) or size < 0:
        raise RuleError(f"dim_is({x!r}, i, size): i must be an int and size a non-negative int, got {i!r}, {size!r}")
    return DimIs(_var(x), i, size)


def rank_is(x: Var, n: int) -> Condition:
    if not isinstance(n, int) or n < 0:
        raise RuleError(f"rank_is({x!r}, n): n must be a non-negative int, got {n!r}")
    return RankIs(_var(x), n)


def value_is(c: Var, v) -> Condition:
    """``c`` is a compile-time constant (tensor or scalar) all of whose elements equal ``v``."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise RuleError(f"value_is({c!r}, v): v must be an int or float, got {v!r}")
    return ValueIs(_var(c), v)


def on_device(x: Var, device: str) -> Condition:
    """``x`` is a tensor on a ``device`` ("cpu", "cuda"...): a rule for kernels of one backend."""
    if not isinstance(device, str) or not device.isidentifier():
        raise RuleError(f"on_device({x!r}, device): device must be a device type such as 'cpu', got {device!r}")
    return OnDevice(_var(x), device)


def is_scalar(c: Var) -> Condition:
    """``c`` is a Python number or a 0-dim tensor (it broadcasts into any shape unchanged)."""
    return IsScalar(_var(c))


def made_by(x: Var, *targets) -> Condition:
    """``x`` is computed by a call of one of ``targets`` (``aten.addmm.default``, ``operator.getitem``)."""
    targets = tuple(t.target if isinstance(t, _OpBuilder) else t for t in targets)
    for t in targets:
        if not (isinstance(t, torch._ops.OpOverload) or t is operator.getitem):
            raise RuleError(f"made_by({x!r}, ...): targets are ATen overloads or operator.getitem, got {t!r}")
        register_target(t)
    if not targets:
        raise RuleError(f"made_by({x!r}, ...) needs at least one target")
    return MadeBy(_var(x), tuple(targets))


def is_uniform(c: Var, not_in=()) -> Condition:
    """``c`` is a compile-time scalar or constant whose elements all equal one number, none of ``not_in``."""
    for v in not_in:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise RuleError(f"is_uniform({c!r}, not_in): values must be ints or floats, got {v!r}")
    return Uniform(_var(c), tuple(not_in))


def is_const(w: Var) -> Condition:
    """``w`` is a constant tensor (a frozen weight or a folded value): terms over it fold."""
    return IsConst(_var(w))


def _bound(v, binding):
    if isinstance(v, Var):
        if v.name not in binding:
            raise RuleError(f"condition reads variable {v.name!r}, which is not bound (bound: {sorted(binding)})")
        return binding[v.name]
    if isinstance(v, Lit):
        return v.value
    return v


def _dtype_of(v):
    from .ir import TensorMeta

    if isinstance(v, (torch.Tensor, TensorMeta)):
        return v.dtype
    return None


def _shape_of(v):
    from .ir import TensorMeta

    if isinstance(v, torch.Tensor):
        return tuple(v.shape)
    if isinstance(v, TensorMeta):
        return tuple(v.shape)
    return None


def _size_list(v):
    from .ir import SymMeta

    if isinstance(v, (list, tuple, torch.Size)):
        out = []
        for s in v:
            if isinstance(s, SymMeta):
                out.append(s.expr)
            elif isinstance(s, (int, torch.SymInt)) and not isinstance(s, bool):
                out.append(s)
            else:
                return None
        return tuple(out)
    return None


# ---------------------------------------------------------------------------------------------
# rules and rulesets

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

    def to_egglog(self, compiler, ruleset: str) -> list[str]:
        """The egglog rules of a pattern rule (see `rewrite.egraph.compile.RuleCompiler.rule`)."""
        if self.is_computed:
            raise RuleError(f"rule {self.name} has a computed replacement; it runs on the IR, not in egglog")
        scope = compiler.scope()
        left = members(self.lhs)
        # every operand order is a structural match of its own (same variables, its own streams)
        lhs = [p.to_egglog(scope) for p in left] if left else [self.lhs.to_egglog(scope)] + [
            order.to_egglog(compiler.scope()) for order in self.orders[1:]]
        variables = [scope.var(v) for v in self.variables]
        conditions = [atom for c in self.when for atom in c.to_egglog(scope, compiler)]
        if left:
            rhs = [_egglog_term(p, scope, rhs=True) for p in members(self.rhs)]
            return compiler.multi_rule(ruleset, self.name, scope, lhs, variables, conditions, rhs)
        rhs_is_var = isinstance(self.rhs, Var)
        rhs = scope.var(self.rhs.name) if rhs_is_var else _egglog_term(self.rhs, scope, rhs=True)
        lhs = lhs[0] if len(lhs) == 1 else lhs
        return compiler.rule(ruleset, self.name, scope, lhs, variables, conditions, rhs, rhs_is_var,
                             same_meta=self._swaps_operands())

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
        rhs = getattr(self.rhs, "__name__", "<computed>") if self.is_computed else _fmt(self.rhs)
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
    if isinstance(out, _SameMeta) and out.y.name < out.x.name:
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

    The declared types of typed variables (`Var.conditions`) come first among the conditions, in
    the order the variables appear. ``commute=False``: match the written operand order only.
    """
    if name is None:
        name = f"{getattr(lhs, 'name', 'rule')}#{zlib.crc32(repr(lhs).encode()) % 10_000:04d}"
    found: dict = {}
    for side in (lhs, rhs):
        if isinstance(side, Pattern):
            _vars_of(side, found)
    declared = [c for v in found.values() for c in v.conditions()]
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


# ---------------------------------------------------------------------------------------------
# evaluating and matching patterns on concrete values (used by rewrite.testing and Python rules)

def evaluate(p, binding: dict):
    """Evaluate a pattern (or literal) with variables taken from ``binding``."""
    if isinstance(p, Var):
        if p.name not in binding:
            raise RuleError(f"variable {p.name!r} is not bound (bound: {sorted(binding)})")
        return binding[p.name]
    if isinstance(p, Lit):
        return evaluate(p.value, binding)
    if isinstance(p, OpPattern):
        args = [evaluate(a, binding) for a in p.args]
        kwargs = {k: evaluate(v, binding) for k, v in p.kwargs.items()}
        return p.target(*args, **kwargs)
    if isinstance(p, list):
        return [evaluate(a, binding) for a in p]
    if isinstance(p, tuple):
        return tuple(evaluate(a, binding) for a in p)
    return p


@dataclasses.dataclass
class Call:
    """A concrete call record ``target(*args, **kwargs)`` for `match` (args may nest Calls)."""

    target: Any
    args: tuple
    kwargs: dict = dataclasses.field(default_factory=dict)


def match(p, tree, binding: dict | None = None) -> dict | None:
    """Match pattern ``p`` against ``tree`` (Calls / values); returns the binding or None."""
    binding = {} if binding is None else binding
    if isinstance(p, Var):
        if p.name in binding:
            return binding if same_value(binding[p.name], tree) else None
        binding[p.name] = tree
        return binding
    if isinstance(p, OpPattern):
        if not isinstance(tree, Call) or tree.target is not p.target:
            return None
        args, kwargs = canonical_call(tree.target, tree.args, tree.kwargs)
        if len(args) != len(p.args) or set(kwargs) != set(p.kwargs):
            return None
        for a, t in zip(p.args, args):
            if match(a, t, binding) is None:
                return None
        for k, a in p.kwargs.items():
            if match(a, kwargs[k], binding) is None:
                return None
        return binding
    if isinstance(p, Lit):
        return match(p.value, tree, binding)
    if isinstance(p, (list, tuple)):
        if not isinstance(tree, (list, tuple)) or len(tree) != len(p):
            return None
        for a, t in zip(p, tree):
            if match(a, t, binding) is None:
                return None
        return binding
    return binding if same_value(p, tree) else None


def same_value(a, b) -> bool:
    """The one notion of literal equality (patterns, bindings, the Python rule matcher): typed
    (``1`` is not ``1.0``, ``True`` is not ``1``), signed zeros distinct, NaN equal to nothing,
    lists elementwise; tensors (and other objects without value equality) by identity."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return a is b
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return a == b and math.copysign(1, a) == math.copysign(1, b)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b))
    return a == b
