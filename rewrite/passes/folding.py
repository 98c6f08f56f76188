"""Constant folding: an op whose inputs are all known at compile time becomes a constant.

GE's "constant folding + InferShape" (seed 003): folding runs with shape folding, alternating until
nothing changes, so ``sym_size -> mul -> view`` chains on static shapes collapse to constants.
Folding evaluates the op with torch itself, so the constant is bit-identical to what eager computes.
Never folded: nondeterministic ops (rand, dropout, empty: their values are not reproducible),
ops with mutable schemas, side effects, nodes that wait on others, and results over
``size_limit`` elements (a folded 1 GB constant would cost more than it saves) unless they are no
larger than the frozen weights they read together: a transposed, scaled or concatenated weight
takes the place of the weights it was computed from (and is marked as coming from weights). The cost model (`rewrite.cost.folds_at_compile_time`)
counts exactly these as free, so extraction may build them. A folded view becomes a dense copy:
a GEMM reads a transposed weight faster once it is stored transposed.
"""
from __future__ import annotations

import logging

import sympy
import torch

from ..cost import call_inputs, foldable_target, folds_at_compile_time, is_weight, numel
from ..ir import (Graph, Node, SymMeta, TensorMeta, is_side_effect, iter_instances, map_nodes, meta_of_value, reads_any,
                  same_meta)
from ..ops import is_overload
from .pass_type import Pass, Step

log = logging.getLogger("rewrite")

__all__ = ["FOLD", "FOLD_SIZES", "fold_constants", "can_fold", "fold_sizes"]


def can_fold(node: Node) -> bool:
    """Whether ``node`` may be evaluated at compile time (ignoring whether its inputs are known)."""
    if node.kind != "call" or is_side_effect(node) or node.waits:
        return False
    t = node.target
    if isinstance(t, torch._ops.HigherOrderOperator) or (is_overload(t) and not foldable_target(t)):
        return False
    return next(iter_instances(node.args, Graph), None) is None


def fold_constants(graph: Graph, size_limit: int) -> int:
    """Evaluate foldable nodes with all-constant inputs; returns how many were folded.

    One pass in graph order (readers come after what they read, so folds cascade within the
    pass), rebuilding the node list once: replacing uses node by node would be quadratic.
    Calls of one op on the same constant nodes and literals are evaluated once (repeated layers
    fold the same mask or scale many times); each still becomes a constant node of its own.
    """
    replaced: dict[int, Node] = {}
    swap = lambda n: replaced.get(n.id, n)  # noqa: E731
    waited = graph.waited_on()
    kept: list[Node] = []
    results: dict = {}  # _call_key -> the evaluated value (None: not foldable)
    for node in graph.nodes:
        if replaced and reads_any(node, lambda n: n.id in replaced):
            node.args = map_nodes(node.args, swap)
            node.kwargs = map_nodes(node.kwargs, swap)
        const = None
        # most nodes read a non-constant: that is found without listing their inputs
        if node.kind == "call" and node.id not in waited and not reads_any(node, _not_constant):
            inputs = call_inputs(node)
            if can_fold(node) and _fits(node, sum(numel(i.meta) for i in inputs if is_weight(i)), size_limit):
                key = _call_key(node)
                if key is None:
                    const = _constant_node(node, _evaluate(node))
                else:
                    if key not in results:
                        results[key] = _evaluate(node)
                    const = _constant_node(node, results[key])
        if const is None:
            kept.append(node)
            continue
        const.graph = graph
        replaced[node.id] = const
        kept.append(const)
    graph.nodes = kept
    return len(replaced)


def _not_constant(n: Node) -> bool:
    return n.kind != "constant"


def _fits(node: Node, weight_numel: int, size_limit: int) -> bool:
    """Whether the folded result may be kept (size functions such as ``operator.mul`` always)."""
    if not is_overload(node.target):
        return isinstance(node.meta, SymMeta)
    return folds_at_compile_time(node.target, node.meta, weight_numel, size_limit)


def _call_key(node: Node):
    """What a fold of ``node`` depends on: its op, its input nodes (constants) and its literals,
    each literal with its type (``1``, ``1.0`` and ``True`` are equal in Python, their results
    are not; ``repr`` keeps -0.0 apart from 0.0). None when an argument has no such key."""
    def key(a):
        if isinstance(a, Node):
            return ("node", a.id)
        if a is None or isinstance(a, (bool, int, float, str)):
            return (type(a), repr(a))
        if isinstance(a, (torch.dtype, torch.device, torch.layout, torch.memory_format)):
            return (type(a), str(a))
        if isinstance(a, (list, tuple)):
            return (type(a), tuple(key(x) for x in a))
        raise TypeError(type(a).__name__)

    try:
        return (node.target, key(node.args), tuple((k, key(v)) for k, v in node.kwargs.items()))
    except TypeError:
        return None


def _evaluate(node: Node):
    """``node``'s value (every input is a constant) as a fresh dense tensor or a Python scalar;
    None if it cannot be evaluated."""
    value_of = {i.id: i.value for i in node.inputs}
    value = lambda n: value_of[n.id]  # noqa: E731
    try:
        with torch.no_grad():
            result = node.target(*map_nodes(node.args, value), **map_nodes(node.kwargs, value))
    except Exception as e:  # a kernel that refuses these inputs is simply not folded
        log.debug("folding %s (%s) failed: %s", node.name, node.op, e)
        return None
    if isinstance(result, torch.Tensor):
        if any(result.untyped_storage().data_ptr() == v.untyped_storage().data_ptr()
               for v in value_of.values() if isinstance(v, torch.Tensor) and v.numel()):
            result = result.clone(memory_format=torch.contiguous_format)  # a dense copy, aliasing nothing
        elif not result.is_contiguous():
            result = result.contiguous()
    return result


def _constant_node(node: Node, result) -> Node | None:
    """A constant node holding ``result`` in place of ``node``, or None if it does not fit its meta."""
    if result is None:
        return None
    if isinstance(result, torch.Tensor):
        if not isinstance(node.meta, TensorMeta) or not same_meta(meta_of_value(result), node.meta):
            return None
        meta = node.meta
    elif isinstance(result, (int, float, bool)) and not isinstance(result, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        meta = meta_of_value(result)
    else:
        return None
    attrs = {"value": result}
    # A value computed from one weight (e.g. its transpose) keeps that weight's name, so an export
    # can still name the file after the parameter it came from.
    sources = {i.attrs.get("weight_name") or i.attrs.get("derived_from") for i in node.inputs} - {None}
    if len(sources) == 1:
        attrs["derived_from"] = sources.pop()
    if any(is_weight(i) for i in node.inputs):
        attrs["from_weights"] = True
    return Node("constant", meta=meta, attrs=attrs, name=node.name)


def fold_sizes(graph: Graph) -> int:
    """Size computations whose value is a constant expression become constants.

    Uses the shape engine's ``fold_shape_computations`` (it re-infers shapes so folds cascade),
    only when there is something to fold: it re-runs shape inference over the whole graph, too
    slow to call on every sweep of a graph with nothing to fold.
    """
    if not any(_known_size(n) for n in graph.nodes):
        return 0
    from ..shape import fold_shape_computations

    return fold_shape_computations(graph)


def _known_size(node: Node) -> bool:
    """A size/scalar node (call or SymInt input) whose value is a number at compile time."""
    m = node.meta
    if node.kind not in ("call", "placeholder") or not isinstance(m, SymMeta):
        return False
    expr = sympy.sympify(m.expr)
    return bool(expr.is_number) or expr in (sympy.true, sympy.false)


def _run_fold_sizes(step: Step) -> dict:
    return {"fold_sizes": fold_sizes(step.graph)}


def _run_fold(step: Step) -> dict:
    return {"fold": fold_constants(step.graph, step.unit.config.rules.fold_size_limit)}


# Both are timed in the one "fold" bucket: they alternate, as GE's folding and InferShape do.
FOLD_SIZES = Pass("fold_sizes", "fold", _run_fold_sizes,
                  "size computations whose value is a constant expression become constants")
FOLD = Pass("fold", "fold", _run_fold,
            "ops whose inputs are all constants are evaluated with torch (size cap: rules.fold_size_limit)")
