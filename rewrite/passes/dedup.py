"""Constant de-duplication by content (GE's Const dedup): equal constants become one node.

CSE of computations needs no pass of its own: in the e-graph two equal terms are one e-class.
Constants are compared by `rewrite.ops.constant_key` (dtype, shape, device and their bytes, so
-0.0 and 0.0, or two NaN payloads, stay apart: merging them would change results).
"""
from __future__ import annotations

import torch

from ..ir import Graph, map_nodes
from ..ops import constant_key

__all__ = ["dedup_constants"]


def dedup_constants(graph: Graph) -> int:
    """Make readers of duplicate constant tensors read the first copy. Returns how many merged."""
    first: dict[tuple, object] = {}
    replace = {}
    for n in graph.nodes:
        if n.kind == "constant" and isinstance(n.value, torch.Tensor):
            keep = first.setdefault(constant_key(n.value), n)
            if keep is not n:
                replace[n.id] = keep
    if not replace:
        return 0
    swap = lambda n: replace.get(n.id, n)  # noqa: E731
    for n in graph.nodes:
        if not any(d.id in replace for d in n.deps):
            continue  # only readers are rebuilt: most nodes read no duplicate
        n.args = map_nodes(n.args, swap)
        n.kwargs = map_nodes(n.kwargs, swap)
        if n.waits:
            n.waits = tuple(swap(w) for w in n.waits)
    graph.nodes = [n for n in graph.nodes if n.id not in replace]
    return len(replace)
