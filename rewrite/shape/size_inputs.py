"""Size inputs read from the tensors that carry them (TorchAir's ``_optimize_sym_input``).

Dynamo passes a size the model uses as a separate SymInt graph input even when a tensor input
already carries it as one of its dims (same symbol: Dynamo's guards make them equal). Two inputs
then hold one value, and the exported signature needs a value the caller never chose. Here each
such SymInt placeholder's readers read ``aten.sym_size.int(tensor, dim)`` instead, so the graph has
one source of truth for the size; the placeholder stays in the calling convention, unread (an
export drops it, see rewrite.export.assembly; per-gear graphs fold the sym_size to its number).

Matched like TorchAir: the SymInt's expression equals a tensor input's dim expression exactly
(``s7`` to a dim ``s7``, ``s0*s1`` to a dim ``s0*s1``); the first tensor input and dim win.
"""
from __future__ import annotations

import sympy
import torch

from ..ir import Graph, SymMeta, TensorMeta

__all__ = ["read_sizes_from_tensors"]


def read_sizes_from_tensors(graph: Graph) -> int:
    """Point the readers of SymInt inputs that equal a tensor input's dim at that dim; returns how many."""
    carriers: dict = {}
    for p in graph.placeholders:
        if isinstance(p.meta, TensorMeta) and p.meta.shape is not None:
            for d, size in enumerate(p.meta.shape):
                size = sympy.sympify(size)
                if not size.is_Integer:
                    carriers.setdefault(size, (p, d))
    if not carriers:
        return 0
    users = graph.users()
    first = next(n for n in graph.nodes if n.kind != "placeholder")
    merged = 0
    for p in graph.placeholders:
        meta = p.meta
        if not (isinstance(meta, SymMeta) and meta.pytype is int) or not users.get(p.id):
            continue
        source = carriers.get(sympy.sympify(meta.expr))
        if source is None:
            continue
        tensor, dim = source
        size = graph.call(torch.ops.aten.sym_size.int, (tensor, dim), meta=SymMeta(meta.expr, int), before=first)
        size.name = f"{p.name}_from_{tensor.name}"
        graph.replace_all_uses(p, size)
        merged += 1
    return merged
