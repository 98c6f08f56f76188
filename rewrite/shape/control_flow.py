"""Shapes through control flow: the ``while_loop`` fixpoint and ``cond``'s branch merge.

``torch.ops.higher_order.while_loop(cond_fn, body_fn, carried_inputs, additional_inputs)``: in
the IR the two functions are `Graph` objects whose placeholders are the carried inputs followed
by the additional inputs; the body returns new carried values, the op returns the last ones.

Torch itself only accepts loops whose carried shapes do not change. GE's While (seed 003) is more
general, and so is this: the body is inferred with the carried metas, its outputs are merged
("widened") into the carried metas, and this repeats until two rounds agree. Widening per carried
value: equal sizes stay; a size that changes becomes a symbol named after the loop body and the
position (``s_<body>_c<i>_d<dim>``, stable across re-inference); a rank that changes becomes
unknown rank (``TensorMeta.shape is None``); a dtype that changes is an error (torch forbids it
too). Each widening step only moves up this short ladder, so the fixpoint is reached in at most
three rounds per carried value.
"""
from __future__ import annotations

import logging
import re

import sympy
import torch

from ..ir import Graph, Node, SymMeta, TensorMeta, meta_of_value
from .context import ShapeContext, ShapeInferenceError, to_expr

log = logging.getLogger("rewrite")

__all__ = ["infer_higher_order", "infer_while_loop", "infer_cond", "WHILE_FIXPOINT_ROUNDS"]

WHILE_FIXPOINT_ROUNDS = 10


def infer_higher_order(target, args, kwargs, ctx: ShapeContext):
    if target is torch.ops.higher_order.while_loop:
        cond, body, carried, additional = _while_args(args, kwargs)
        return infer_while_loop(cond, body, carried, additional, ctx)
    if target is torch.ops.higher_order.cond:
        pred, true_graph, false_graph, operands = (list(args) + [kwargs.get("operands", ())])[:4]
        return infer_cond(pred, true_graph, false_graph, operands, ctx)
    raise ShapeInferenceError(f"higher-order op {target.name()}: no shape rule (known: while_loop, cond)")


def _while_args(args, kwargs):
    names = ("cond_fn", "body_fn", "carried_inputs", "additional_inputs")
    values = list(args) + [kwargs[n] for n in names[len(args):] if n in kwargs]
    if len(values) == 3:
        values.append(())
    if len(values) != 4 or not isinstance(values[0], Graph) or not isinstance(values[1], Graph):
        raise ShapeInferenceError("while_loop: expects (cond Graph, body Graph, carried_inputs, additional_inputs), "
                                  f"got {[type(v).__name__ for v in values]}")
    return values


def run_subgraph(graph: Graph, input_metas, ctx: ShapeContext):
    """Infer ``graph`` with its placeholders set to ``input_metas``; returns its output metas."""
    from .infer import infer_graph

    placeholders = graph.placeholders
    if len(placeholders) != len(input_metas):
        raise ShapeInferenceError(f"subgraph {graph.name} takes {len(placeholders)} inputs, "
                                  f"was given {len(input_metas)}")
    for p, meta in zip(placeholders, input_metas):
        p.meta = meta
    infer_graph(graph, ctx)
    outs = graph.outputs
    outs = outs if isinstance(outs, (tuple, list)) else (outs,)
    return tuple(o.meta if isinstance(o, Node) else meta_of_value(o) for o in outs)


def _symbol_name(graph_name: str, position: int, dim: int | None) -> str:
    base = re.sub(r"\W+", "_", graph_name).strip("_")
    return f"s_{base}_c{position}" + ("" if dim is None else f"_d{dim}")


def widen(ctx: ShapeContext, old, new, graph_name: str, position: int, what: str):
    """The least general meta covering both ``old`` and ``new`` (see the module docstring)."""
    if isinstance(old, TensorMeta) and isinstance(new, TensorMeta):
        if old.dtype != new.dtype:
            raise ShapeInferenceError(f"{what}: carried value {position} changes dtype from {old.dtype} to {new.dtype}")
        if old.shape is None or new.shape is None or len(old.shape) != len(new.shape):
            return TensorMeta(old.dtype, None, old.device)
        shape = []
        for d, (a, b) in enumerate(zip(old.shape, new.shape)):
            if ctx.equal(a, b) is True:
                shape.append(a)
            else:
                shape.append(ctx.named_symbol(_symbol_name(graph_name, position, d)))
        return TensorMeta(old.dtype, tuple(shape), old.device)
    if isinstance(old, SymMeta) and isinstance(new, SymMeta):
        if to_expr(old.expr) == to_expr(new.expr) or ctx.equal(old.expr, new.expr) is True:
            return old
        sym = ctx.named_symbol(_symbol_name(graph_name, position, None))
        return SymMeta(sympy.Ne(sym, 0) if old.pytype is bool else sym, old.pytype)
    raise ShapeInferenceError(f"{what}: carried value {position} changes kind from {old} to {new}")


def infer_while_loop(cond: Graph, body: Graph, carried, additional, ctx: ShapeContext):
    """Output metas of a while loop: the fixpoint of the body's shape function over the carries."""
    state = tuple(carried)
    additional = tuple(additional)
    for rounds in range(1, WHILE_FIXPOINT_ROUNDS + 1):
        out = run_subgraph(body, state + additional, ctx)
        if len(out) != len(state):
            raise ShapeInferenceError(f"while_loop: body {body.name} returns {len(out)} values for "
                                      f"{len(state)} carried inputs")
        widened = tuple(widen(ctx, s, o, body.name, i, f"while_loop body {body.name}")
                        for i, (s, o) in enumerate(zip(state, out)))
        if widened == state:
            break
        state = widened
    else:
        raise ShapeInferenceError(f"while_loop: shapes of body {body.name} did not settle in {WHILE_FIXPOINT_ROUNDS} rounds")
    log.debug("shape: while_loop body %s settled after %d round(s): %s", body.name, rounds,
              ", ".join(str(m) for m in state))
    run_subgraph(cond, state + additional, ctx)  # its metas, for the executor
    return state


def infer_cond(pred, true_graph: Graph, false_graph: Graph, operands, ctx: ShapeContext):
    """Output metas of ``cond``: both branches' metas merged (a known predicate picks one)."""
    operands = tuple(operands)
    t = run_subgraph(true_graph, operands, ctx)
    f = run_subgraph(false_graph, operands, ctx)
    if isinstance(pred, SymMeta) and to_expr(pred.expr) in (sympy.true, sympy.false):
        return t if to_expr(pred.expr) == sympy.true else f
    if isinstance(pred, bool):
        return t if pred else f
    if len(t) != len(f):
        raise ShapeInferenceError(f"cond: branches return {len(t)} and {len(f)} values")
    return tuple(widen(ctx, a, b, true_graph.name, i, "cond") for i, (a, b) in enumerate(zip(t, f)))
