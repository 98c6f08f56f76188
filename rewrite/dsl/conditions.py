"""Conditions: the ``when=[...]`` of a rule, one class each (see `rewrite.dsl`, "Conditions").

A condition is checked in three places: ``holds`` on concrete values (the Python matcher,
`rewrite.testing`), inside the e-graph (``data()``: plain data the engine encodes, `rewrite.egraph.encode`),
and ``hint`` (what `rewrite.testing.check_rule` draws so that its random instances satisfy it).
"""
from __future__ import annotations

import dataclasses
import operator
from typing import Any

import torch

from ..ops import ALL_DTYPES, FLOATS, INTS, dtype_str, register_target, shape_key, splat_key, target_name
from .patterns import Lit, RuleError, Var, format_pattern, OpBuilder


class Condition:
    """A side condition of a rule, over the variables in ``vars``.

    Each condition says itself in the three places a rule is used: ``holds(binding)`` on concrete
    values or metas (the Python matcher, `rewrite.testing`), ``data()`` as plain data that the
    e-graph engine encodes as atoms over its dtype/shape/sizes/splat analyses
    (`rewrite.egraph.encode`: the DSL writes no egglog), and ``hint(hints)`` for what
    `rewrite.testing.check_rule` should draw so that random instances satisfy it.
    """

    vars: tuple = ()

    def holds(self, binding: dict) -> bool:
        raise NotImplementedError

    def data(self) -> tuple:
        """``(kind, *operands)``: variables by name, the rest plain values (see each class)."""
        raise NotImplementedError

    def hint(self, hints: dict) -> None:
        """Record in ``hints`` (variable name -> {key: value}) what the condition asks for."""

    def _names(self) -> str:
        return ", ".join(v.name if isinstance(v, Var) else format_pattern(v) for v in self.vars)

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

    def data(self):
        return ("dtype_in", self.x.name, tuple(dtype_str(d) for d in self.dtypes))

    def hint(self, hints):
        h = hints.setdefault(self.x.name, {})
        h["dtypes"] = tuple(d for d in self.dtypes if d in h.get("dtypes", self.dtypes))


@dataclasses.dataclass(frozen=True, repr=False)
class SameMeta(Condition):
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

    def data(self):
        return ("same", self.analysis, self.x.name, self.y.name)

    def hint(self, hints):
        hints.setdefault(self.x.name, {})[self.hint_key] = self.y.name
        hints.setdefault(self.y.name, {})[self.hint_key] = self.x.name


class SameDtype(SameMeta):
    label, analysis, hint_key = "same_dtype", "dtype", "dtype_like"

    def holds(self, binding):
        a, b = (_dtype_of(v) for v in self._values(binding))
        return a is not None and a == b


class SameShape(SameMeta):
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

    def data(self):
        """The sizes as a variable's name, or as the literal tuple of ints."""
        sizes = self.sizes.name if isinstance(self.sizes, Var) else tuple(self.sizes.value)
        return ("shape_is", self.x.name, sizes)

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

    def data(self):
        return ("dims_agree", self.x.name, self.i, self.y.name, self.j)

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

    def data(self):
        return ("dim_is", self.x.name, self.i, self.size)

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

    def data(self):
        return ("rank_is", self.x.name, self.rank)

    def hint(self, hints):
        hints.setdefault(self.x.name, {})["rank"] = self.rank


@dataclasses.dataclass(frozen=True, repr=False)
class ValueIs(_OnOne):
    value: Any  # int or float

    def __repr__(self):
        return f"value_is({self._names()}, {self.value!r})"

    def holds(self, binding):
        return splat_key(self._values(binding)[0]) == splat_key(self.value) is not None

    def data(self):
        return ("value_is", self.x.name, self.value)

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
        from ..ir import TensorMeta

        return isinstance(v, (torch.Tensor, TensorMeta)) and torch.device(v.device).type == self.device

    def data(self):
        return ("on_device", self.x.name, self.device)


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

    def data(self):
        return ("is_scalar", self.x.name)

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
        from ..ir import TensorMeta

        return isinstance(self._values(binding)[0], (torch.Tensor, TensorMeta))

    def data(self):
        """The targets as (name, canonical arity) pairs."""
        ops = tuple((target_name(t), len(t._schema.arguments) if isinstance(t, torch._ops.OpOverload) else 2)
                    for t in self.targets)
        return ("made_by", self.x.name, ops)


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

    def data(self):
        return ("uniform", self.x.name, self.excluded)

    def hint(self, hints):
        hints.setdefault(self.x.name, {}).setdefault("value", 0.5)


@dataclasses.dataclass(frozen=True, repr=False)
class IsConst(_OnOne):
    """``x`` is a constant tensor: a frozen weight or a folded value (so terms over it fold)."""

    def __repr__(self):
        return f"is_const({self._names()})"

    def holds(self, binding):
        return isinstance(self._values(binding)[0], torch.Tensor)

    def data(self):
        return ("is_const", self.x.name)


def type_conditions(v: Var) -> list:
    """The conditions a typed variable's declared type stands for (none for a plain variable): `rule`
    puts them first among the conditions of every rule that uses it."""
    return (([DtypeIn(v, v.dtypes)] if v.dtypes is not None else [])
            + ([RankIs(v, v.rank)] if v.rank is not None else []))


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
    targets = tuple(t.target if isinstance(t, OpBuilder) else t for t in targets)
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
    from ..ir import TensorMeta

    if isinstance(v, (torch.Tensor, TensorMeta)):
        return v.dtype
    return None


def _shape_of(v):
    from ..ir import TensorMeta

    if isinstance(v, torch.Tensor):
        return tuple(v.shape)
    if isinstance(v, TensorMeta):
        return tuple(v.shape)
    return None


def _size_list(v):
    from ..ir import SymMeta

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
