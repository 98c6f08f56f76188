"""The ops an export file may call: an allow-list, never an attribute walk chosen by the file.

`resolve_op` turns an op name from a graph file into a callable only if it is one of:

* an ATen, prims, rewrite (``rewrite_stream``) or functional-collective (``_c10d_functional*``)
  overload registered in this process, whose schema takes and returns only tensors, numbers,
  strings, dtypes, devices and lists/optionals of those, and which is not in `DENIED` (ops that
  read or write files, print, or change process state);
* a higher-order op in `HIGHER_ORDER` (those the IR and shape engine know);
* one of `FUSED_OPS`, the fused kernels rewrite's own rules emit (oneDNN's linear with a post-op);
* one of `rewrite.ops.SIZE_FUNCTIONS` (Python's size arithmetic).

The name is matched against the registry's own list of names before any lookup, so a file cannot
steer ``getattr`` anywhere (``torch.ops.load_library``, ``import_module``...). `check_call` then
checks the call against the op's schema: a keyword must be a parameter of the op, the number of
arguments must fit, and each argument must have a type the parameter accepts. `check_size_growth`
bounds the integers size arithmetic can build, since loading a geared export folds it.
"""
from __future__ import annotations

import functools
import inspect
import math
import operator
import re

import torch

from .. import ops
from ..ir import Graph, Node
from .checks import describe, fail

__all__ = ["NAMESPACES", "HIGHER_ORDER", "FUSED_OPS", "DENIED", "resolve_op", "check_call", "check_size_growth"]

NAMESPACES = ("aten", "prims", "rewrite_stream", "_c10d_functional", "_c10d_functional_autograd")
HIGHER_ORDER = ("cond", "while_loop")
# Overloads outside those namespaces that rewrite's own rules put into graphs (rules/fused.py).
FUSED_OPS = frozenset({"mkldnn._linear_pointwise.default", "mkldnn._linear_pointwise.binary"})
# Registered ops of those namespaces that are not tensor computations: they read or write files,
# print, or change state outside the tensors they are given.
DENIED = frozenset({
    "aten.from_file", "aten._print", "aten.record_stream", "aten.get_gradients", "aten.set_data",
    "aten.retain_grad", "aten.requires_grad_", "aten._cufft_set_plan_cache_max_size",
    "aten._cufft_clear_plan_cache", "aten._test_warn_in_autograd",
})
# Schema types an allowed op may take or return (JIT kinds; dtype, layout and memory format are ints).
_VALUE_KINDS = frozenset({"TensorType", "IntType", "SymIntType", "FloatType", "BoolType", "SymBoolType",
                          "NumberType", "StringType", "DeviceObjType", "GeneratorType", "AnyType", "NoneType"})

_V1_OPERATOR_PREFIX = "operator."  # version 1 wrote Python's operators as ``operator.<name>``
_OP_NAME = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\.([A-Za-z_][A-Za-z0-9_]*)\.([A-Za-z_][A-Za-z0-9_]*)")
MAX_SIZE_BITS = 4096


def _kinds(t) -> list[str]:
    if t.kind() in ("ListType", "OptionalType"):
        return _kinds(t.getElementType())
    return [t.kind()]


@functools.lru_cache(maxsize=None)
def _overload(name: str):
    """The overload of a registered, allowed name (looked up only after every check passed)."""
    ns, op, overload = name.split(".")
    target = getattr(getattr(getattr(torch.ops, ns), op), overload)
    schema = target._schema
    bad = [f"{a.name}: {a.type}" for a in list(schema.arguments) + list(schema.returns)
           if any(k not in _VALUE_KINDS for k in _kinds(a.type))]
    return target, bad


def resolve_op(name, where: str):
    """The callable an op name of a graph file stands for; anything not allowed is an ExportError."""
    if not isinstance(name, str) or len(name) > 200:
        raise fail(where, f"expected a string naming an op, got {describe(name)}")
    if name.startswith(_V1_OPERATOR_PREFIX) and name[len(_V1_OPERATOR_PREFIX):] in ops.SIZE_FUNCTIONS:
        name = name[len(_V1_OPERATOR_PREFIX):]
    if name in ops.SIZE_FUNCTIONS:
        return ops.SIZE_FUNCTIONS[name]
    if name.startswith("higher_order."):
        hop = name[len("higher_order."):]
        if hop not in HIGHER_ORDER:
            raise fail(where, f"op {name!r} is not allowed; allowed higher-order ops are "
                              f"{['higher_order.' + h for h in HIGHER_ORDER]}")
        return getattr(torch.ops.higher_order, HIGHER_ORDER[HIGHER_ORDER.index(hop)])
    m = _OP_NAME.fullmatch(name)
    if m is None:
        raise fail(where, f"op {name!r} is not of the form namespace.op.overload, higher_order.op or one of the "
                          f"allowed Python functions {sorted(ops.SIZE_FUNCTIONS)}")
    ns, op, _ = m.groups()
    if ns not in NAMESPACES and name not in FUSED_OPS:
        raise fail(where, f"op {name!r} is not allowed: namespace {ns!r} is not one of {list(NAMESPACES)}")
    if f"{ns}.{op}" in DENIED:
        raise fail(where, f"op {name!r} is not allowed: it touches files or process state, not only tensors")
    import rewrite.scope  # noqa: F401 - registers the rewrite_stream ops

    if not ops.is_registered(name):
        raise fail(where, f"op {name!r} is not registered in this torch {torch.__version__} (was the file "
                          "written by a newer torch?)")
    target, bad = _overload(name)
    if bad:
        raise fail(where, f"op {name!r} is not allowed: it takes or returns {bad}, not only tensors and numbers")
    return target


# -- calls -----------------------------------------------------------------------------------------

def _accepts(t, value) -> bool:
    """Whether ``value`` (decoded from a file) fits schema type ``t``; nodes fit any value slot."""
    kind = t.kind()
    if kind == "OptionalType":
        return value is None or _accepts(t.getElementType(), value)
    if kind == "ListType":
        return isinstance(value, Node) or (isinstance(value, (list, tuple))
                                           and all(_accepts(t.getElementType(), v) for v in value))
    if isinstance(value, Node) and isinstance(value.meta, tuple):
        return kind == "AnyType"  # several results: read one with getitem first
    if kind == "AnyType":
        return True
    if kind == "StringType":
        return isinstance(value, str)
    if kind == "DeviceObjType":
        return isinstance(value, torch.device)
    if kind == "GeneratorType" or value is None:
        return False
    if isinstance(value, Node):
        return True
    if kind == "TensorType":
        return isinstance(value, (torch.Tensor, bool, int, float))
    if kind in ("IntType", "SymIntType"):
        return isinstance(value, (int, torch.dtype, torch.layout, torch.memory_format))
    return isinstance(value, (bool, int, float))  # float, bool, number


def _type_name(value) -> str:
    if isinstance(value, Node):
        return f"node {value.name}"
    return f"{type(value).__name__} {value!r}"[:80]


def _check_overload_call(target, args: tuple, kwargs: dict, where: str) -> None:
    schema = target._schema
    params = {a.name: a for a in schema.arguments}
    for key in kwargs:
        if key not in params:
            raise fail(_at_kwarg(where, key), f"{key[:40]!r} is not a parameter of {ops.target_name(target)}; "
                                              f"its parameters are {list(params)}")
    try:
        bound = ops.bind_arguments(target, args, kwargs)
    except ops.OpError as e:
        raise fail(where, str(e)) from None
    for name, value in bound.items():
        if not _accepts(params[name].type, value):
            raise fail(where, f"argument {name!r} of {ops.target_name(target)} expects {params[name].type}, got "
                              f"{_type_name(value)}")


def _at_kwarg(where: str, key: str) -> str:
    return f"{where}.kwargs[{key[:40]!r}]"


def _is_size_value(value) -> bool:
    if isinstance(value, (list, tuple)):
        return all(_is_size_value(v) for v in value)
    return isinstance(value, (Node, bool, int, float))


@functools.lru_cache(maxsize=None)
def _signature(fn):
    return inspect.signature(fn)


def _check_higher_order(target, args: tuple, where: str) -> None:
    """cond(pred, true graph, false graph, operands); while_loop(cond graph, body graph, carried[, additional])."""
    graphs, arities = ((1, 2), (4,)) if target.name() == "cond" else ((0, 1), (3, 4))
    if len(args) not in arities or not all(isinstance(args[i], Graph) for i in graphs):
        raise fail(where, f"higher_order.{target.name()} takes {' or '.join(map(str, arities))} arguments with "
                          f"subgraphs at positions {list(graphs)}, got {[type(a).__name__ for a in args]}")
    for i, a in enumerate(args):
        if i not in graphs and not isinstance(a, (Node, bool, list, tuple)):
            raise fail(where, f"argument {i} of higher_order.{target.name()} is {_type_name(a)}")


def check_call(target, args: tuple, kwargs: dict, where: str) -> None:
    """The call fits the op: keywords are its parameters, the arguments fit its schema."""
    if isinstance(target, torch._ops.OpOverload):
        return _check_overload_call(target, args, kwargs, where)
    if kwargs:
        raise fail(_at_kwarg(where, next(iter(kwargs))), f"{ops.target_name(target)} takes no keyword arguments")
    if isinstance(target, torch._ops.HigherOrderOperator):
        return _check_higher_order(target, args, where)
    try:
        _signature(target).bind(*args)
    except TypeError as e:
        raise fail(where, f"{ops.target_name(target)}: {e}") from None
    if not all(_is_size_value(a) for a in args):
        raise fail(where, f"{ops.target_name(target)} takes numbers and nodes, got "
                          f"{[_type_name(a) for a in args]}")
    if target is operator.getitem and not (isinstance(args[0], Node) and type(args[1]) is int):
        raise fail(where, f"getitem reads result k of a node: it takes a node and an int, got "
                          f"{[_type_name(a) for a in args]}")


# -- size arithmetic ---------------------------------------------------------------------------------

def _bits(value, known: dict) -> int:
    """An upper bound of the bit length of an integer argument (64 for sizes read off tensors)."""
    if isinstance(value, Node):
        return known.get(value.id, 64)
    if isinstance(value, (list, tuple)):
        return max((_bits(v, known) for v in value), default=1) + len(value).bit_length()
    if isinstance(value, int):
        return max(int(value).bit_length(), 1)
    return 64  # floats: their arithmetic saturates at inf instead of growing


def _result_bits(n: Node, known: dict, constants: dict) -> int | None:
    """Bound of a size function's result, or None when no bound exists (a non-constant exponent)."""
    t, args = n.target, n.args
    b = [_bits(a, known) for a in args]
    if t in (operator.add, operator.sub, operator.invert, torch.sym_sum):
        return max(b) + 1
    if t is operator.mul:
        return sum(b)
    if t in (operator.pow, operator.lshift):
        k = constants.get(args[1].id) if isinstance(args[1], Node) else args[1]
        if isinstance(k, float) and t is operator.pow:
            return 64
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            return None
        return b[0] * k if t is operator.pow else b[0] + k
    if t in (math.floor, math.ceil, math.trunc, torch.sym_int):
        return 1024  # the integer part of a float
    return max(b, default=1)


def check_size_growth(graph: Graph, where: str) -> None:
    """Refuse size arithmetic whose integers could exceed MAX_SIZE_BITS bits (``x*x`` forty times over).

    Loading a geared export substitutes each gear's sizes and folds the arithmetic, so an unbounded
    chain would hang the load. Inputs and sizes read off tensors count as 64 bits.
    """
    size_functions = set(ops.SIZE_FUNCTIONS.values())
    constants = {n.id: n.value for n in graph.nodes if n.kind == "constant" and isinstance(n.value, (int, float))}
    known = {i: _bits(v, {}) for i, v in constants.items()}
    for n in graph.nodes:
        if n.kind != "call" or n.target not in size_functions:
            continue
        bits = _result_bits(n, known, constants)
        if bits is None or bits > MAX_SIZE_BITS:
            raise fail(where, f"node {n.name} ({n.op}) builds integers that could exceed {MAX_SIZE_BITS} bits "
                              "(exponents and shift amounts must be non-negative constants)")
        known[n.id] = bits
