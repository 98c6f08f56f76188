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
from ..ir import Graph, Node, SymMeta, TensorMeta, is_side_effect, iter_instances, map_nodes, meta_of_value
from ..ops import is_overload

log = logging.getLogger("rewrite")

__all__ = ["fold_constants", "can_fold", "fold_sizes"]


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
    """
    replaced: dict[int, Node] = {}
    swap = lambda n: replaced.get(n.id, n)  # noqa: E731
    waited = graph.waited_on()
    kept: list[Node] = []
    for node in graph.nodes:
        if replaced and any(i.id in replaced for i in call_inputs(node)):
            node.args = map_nodes(node.args, swap)
            node.kwargs = map_nodes(node.kwargs, swap)
        const = None
        if node.kind == "call" and node.id not in waited:
            inputs = call_inputs(node)
            if (all(i.kind == "constant" for i in inputs) and can_fold(node)
                    and _fits(node, sum(numel(i.meta) for i in inputs if is_weight(i)), size_limit)):
                const = _evaluate(node)
        if const is None:
            kept.append(node)
            continue
        const.graph = graph
        replaced[node.id] = const
        kept.append(const)
    graph.nodes = kept
    return len(replaced)


def _fits(node: Node, weight_numel: int, size_limit: int) -> bool:
    """Whether the folded result may be kept (size functions such as ``operator.mul`` always)."""
    if not is_overload(node.target):
        return isinstance(node.meta, SymMeta)
    return folds_at_compile_time(node.target, node.meta, weight_numel, size_limit)


def _evaluate(node: Node) -> Node | None:
    """A constant node holding ``node``'s value (every input is a constant), or None."""
    value_of = {i.id: i.value for i in node.inputs}
    value = lambda n: value_of[n.id]  # noqa: E731
    try:
        with torch.no_grad():
            result = node.target(*map_nodes(node.args, value), **map_nodes(node.kwargs, value))
    except Exception as e:  # a kernel that refuses these inputs is simply not folded
        log.debug("folding %s (%s) failed: %s", node.name, node.op, e)
        return None
    if isinstance(result, torch.Tensor):
        if not isinstance(node.meta, TensorMeta) or str(meta_of_value(result)) != str(node.meta):
            return None
        if any(result.untyped_storage().data_ptr() == v.untyped_storage().data_ptr()
               for v in value_of.values() if isinstance(v, torch.Tensor) and v.numel()):
            result = result.clone(memory_format=torch.contiguous_format)  # a dense copy, aliasing nothing
        elif not result.is_contiguous():
            result = result.contiguous()
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

