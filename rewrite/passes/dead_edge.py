"""Dead-edge elimination: ``torch.cond`` with a predicate known at compile time -> the chosen branch.

Seed 003 (GE's 死边消除): when the condition of an If/Case is a constant, the branch that can never
run is dropped and the other is inlined. Here the predicate may be a constant tensor, a Python
bool, or a size comparison whose sympy value is decided (``s0 >= 1`` with ``s0`` in ``[2, oo)``
after the shape engine simplified it).
"""
from __future__ import annotations

import logging
import operator

import sympy
import torch

from ..ir import Graph, Node, SymMeta, map_nodes
from .pass_type import Pass, Step

log = logging.getLogger("rewrite")

__all__ = ["DEAD_EDGE", "eliminate_dead_edges", "known_predicate"]


def known_predicate(pred) -> bool | None:
    """The compile-time truth value of a cond predicate, or None if it is only known at run time."""
    if isinstance(pred, bool):
        return pred
    if isinstance(pred, Node):
        if pred.kind == "constant":
            return known_predicate(pred.value)
        if isinstance(pred.meta, SymMeta):
            expr = sympy.sympify(pred.meta.expr)
            if expr in (sympy.true, sympy.false):
                return bool(expr)
            if expr.is_number:
                return bool(expr)
        return None
    if isinstance(pred, torch.Tensor) and pred.numel() == 1 and pred.device.type != "meta":
        return bool(pred.item())
    return None


def eliminate_dead_edges(graph: Graph) -> int:
    """Inline the selected branch of every cond with a known predicate; returns how many."""
    count = 0
    waited = graph.waited_on()
    for node in list(graph.nodes):
        if node.kind != "call" or node.target is not torch.ops.higher_order.cond or node.id in waited:
            continue
        pred, true_g, false_g, operands = node.args[:4]
        taken = known_predicate(pred)
        if taken is None or not isinstance(true_g, Graph) or not isinstance(false_g, Graph):
            continue
        users = [u for u in graph.nodes if node in u.inputs]
        if not all(u.target is operator.getitem and isinstance(u.args[1], int) for u in users):
            continue  # the branch's output structure is used whole; leave the cond
        results = _inline(graph, true_g if taken else false_g, list(operands), before=node)
        if results is None:
            continue
        for u in users:
            graph.replace_all_uses(u, results[u.args[1]])
            graph.remove(u)
        graph.remove(node)
        count += 1
        log.debug("dead edge: %s takes its %s branch", node.name, "true" if taken else "false")
    return count


def _run(step: Step) -> dict:
    return {"dead_edge": eliminate_dead_edges(step.graph)}


DEAD_EDGE = Pass("dead_edge", "dead_edge", _run,
                 "torch.cond with a compile-time predicate -> the selected branch inlined")


def _inline(graph: Graph, branch: Graph, operands: list, before: Node):
    """Copy ``branch`` into ``graph`` before ``before`` with its inputs bound to ``operands``."""
    body, _ = branch.copy_with_map()
    placeholders = body.placeholders
    if len(placeholders) != len(operands):
        log.debug("dead edge: branch %s takes %d inputs, cond passes %d", branch.name, len(placeholders), len(operands))
        return None
    bound = {p.id: v for p, v in zip(placeholders, operands)}
    swap = lambda n: bound.get(n.id, n)  # noqa: E731
    for n in body.nodes:
        if n.kind in ("placeholder", "output"):
            continue
        n.args = map_nodes(n.args, swap)
        n.kwargs = map_nodes(n.kwargs, swap)
        n.name = f"{before.name}_{n.name}"
        graph.add(n, before=before)
    outs = map_nodes(body.outputs, swap)
    return list(outs) if isinstance(outs, (list, tuple)) else [outs]
