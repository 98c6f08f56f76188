"""Patterns: variables, literals and op calls, the two sides of a rule (see `rewrite.dsl`).

``aten``/``prims``/``op(target)`` build `OpPattern` calls in canonical form, ``siblings(...)`` the
multi-patterns; `same_value` is the one notion of literal equality every part of the DSL compares by;
`pattern_data` is a pattern as the plain data the e-graph engine encodes.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

from ..ops import NO_DEFAULT, OpError, canonical_call, register_target, schema_default, target_name


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
    (`rewrite.dsl.conditions.type_conditions`), so a family of rules states its operands' types once. Equality and
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
        inner = [format_pattern(a) for a in self.args]
        for k, v in self.kwargs.items():
            default = schema_default(self.target, k)
            if not (default is not NO_DEFAULT and same_value(default, v)):
                inner.append(f"{k}={format_pattern(v)}")
        return f"{self.name}({', '.join(inner)})"


def format_pattern(a) -> str:
    if isinstance(a, list):
        return "[" + ", ".join(format_pattern(x) for x in a) + "]"
    if isinstance(a, tuple):
        return "(" + ", ".join(format_pattern(x) for x in a) + ")"
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


def vars_of(p, out: dict) -> dict:
    """The `Var` objects in ``p`` by name, first occurrence first (typed ones win over plain ones)."""
    for v in _walk_vars(p):
        seen = out.get(v.name)
        if seen is None or (seen.dtypes is None and seen.rank is None):
            out[v.name] = v
        elif (v.dtypes is not None or v.rank is not None) and (v.dtypes, v.rank) != (seen.dtypes, seen.rank):
            raise RuleError(f"variable {v.name} is declared twice with different types: dtypes {seen.dtypes} rank "
                            f"{seen.rank}, and dtypes {v.dtypes} rank {v.rank}")
    return out


class OpBuilder:
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


def op(target) -> OpBuilder:
    """Pattern constructor for any call target (ATen overload, ``operator.mul``, ...)."""
    return OpBuilder(target)


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

    def __getattr__(self, overload: str) -> OpBuilder:
        return OpBuilder(getattr(self._packet, overload))

    def __call__(self, *args, **kwargs) -> OpPattern:
        return OpBuilder(self._packet)(*args, **kwargs)


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


def pattern_data(p):
    """``p`` (a pattern, or a literal argument of one) as plain data: what the e-graph engine encodes
    (`rewrite.egraph.encode`), which knows none of these classes.

    ``("var", name)``; ``("call", op name, items)`` with the arguments, then the keyword arguments'
    values, in canonical order; ``("list", items)`` or ``("tuple", items)``; ``("lit", value)`` for a
    literal scalar (int, float, bool, None, str, dtype, device, layout, memory format).
    """
    if isinstance(p, Var):
        return ("var", p.name)
    if isinstance(p, OpPattern):
        return ("call", p.name, tuple(pattern_data(a) for a in list(p.args) + list(p.kwargs.values())))
    if isinstance(p, Lit):
        return pattern_data(p.value)
    if isinstance(p, (list, tuple)):
        return ("list" if isinstance(p, list) else "tuple", tuple(pattern_data(a) for a in p))
    return ("lit", p)


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
