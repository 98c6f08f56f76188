"""Constant de-duplication by content (GE's Const dedup): equal constants become one node.

CSE of computations needs no pass of its own: in the e-graph two equal terms are one e-class.
Constants are compared by content (`rewrite.ops.ContentIndex`: dtype, shape, device and their
bytes, so -0.0 and 0.0, or two NaN payloads, stay apart: merging them would change results).
"""
from __future__ import annotations

import torch

from ..ir import Graph
from ..ops import ContentIndex
from .pass_type import Pass, Step

__all__ = ["DEDUP", "dedup_constants"]


def dedup_constants(graph: Graph) -> int:
    """Make readers of duplicate constant tensors read the first copy. Returns how many merged."""
    first = ContentIndex()
    replace = {}
    for n in graph.nodes:
        if n.kind == "constant" and isinstance(n.value, torch.Tensor):
            keep = first.setdefault(n.value, n)
            if keep is not n:
                replace[n.id] = keep
    if not replace:
        return 0
    graph.replace_uses(replace)
    graph.nodes = [n for n in graph.nodes if n.id not in replace]
    return len(replace)


def _run(step: Step) -> dict:
    return {"dedup": dedup_constants(step.graph)}


DEDUP = Pass("dedup", "dedup", _run, "constants with identical contents become one constant")
