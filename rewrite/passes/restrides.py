"""Restrides that change no value: ``as_strided(x, x's shape, strides)`` where ``x`` has at most one dim longer
than 1, read with stride 1, and is a computation's fresh result.

AOTAutograd writes such a node where an op's strides in eager differ from its decomposition's: timm's global
average pooling (``mean(x, [-1, -2], keepdim=True)`` of a channels-last image) ends in ``as_strided(mean,
[1, 768, 1, 1], [768, 1, 768, 768])``. The strides of size-1 dims are never used to address an element, and a
fresh result of one long dim holds it densely at offset 0 in every layout, so the restride reads each element
where ``x`` holds it: its value is ``x``. The e-graph refuses every graph that holds a stride reader
(`rewrite.optimizer.egraph_unsupported`): one such node at ConvNeXt's head kept all of its rules from running.

Left as they are: a restride the graph returns (the caller sees eager's strides), one of a graph input or a
view (its layout or offset is the caller's), one with a storage offset, and symbolic sizes.
"""
from __future__ import annotations

import operator

import torch

from .. import ops
from ..ir import Graph, Node, TensorMeta
from .pass_type import Pass, Step

__all__ = ["TRIVIAL_RESTRIDES", "drop_trivial_restrides"]

_AS_STRIDED = torch.ops.aten.as_strided.default


def drop_trivial_restrides(graph: Graph) -> int:
    """Replace each restride that changes no value by its input; returns how many."""
    returned = {n.id for n in graph.output.inputs}
    changed = 0
    for n in list(graph.nodes):
        if n.kind == "call" and n.target is _AS_STRIDED and n.id not in returned and _changes_no_value(n):
            graph.replace_all_uses(n, n.args[0])
            changed += 1
    if changed:
        graph.prune()
    return changed


def _changes_no_value(n: Node) -> bool:
    a = ops.bind_arguments(_AS_STRIDED, n.args, n.kwargs)
    x, size, stride = a["self"], a["size"], a["stride"]
    if a.get("storage_offset") not in (None, 0) or not isinstance(x, Node) or not _fresh(x):
        return False
    if not (isinstance(x.meta, TensorMeta) and x.meta.is_static() and _ints(size) and _ints(stride)):
        return False
    if [int(s) for s in x.meta.shape] != list(size) or len(stride) != len(size) or 0 in size:
        return False
    long_dims = [d for d, s in enumerate(size) if s > 1]
    return len(long_dims) <= 1 and all(stride[d] == 1 for d in long_dims)


def _fresh(x: Node) -> bool:
    """A computation's own result: dense, at offset 0 of its storage. Not an input, a constant, an item of a
    tuple, a view (`ops.returns_view`: ``_unsafe_view`` too, whose schema does not say so) or an in-place op's
    ``self``."""
    if x.kind != "call" or x.target is operator.getitem or not isinstance(x.target, torch._ops.OpOverload):
        return False
    returns = x.target._schema.returns
    return len(returns) == 1 and returns[0].alias_info is None and not ops.returns_view(x.target)


def _ints(values) -> bool:
    return isinstance(values, (list, tuple)) and all(isinstance(v, int) and not isinstance(v, bool) for v in values)


def _run(step: Step) -> dict:
    return {"trivial_restrides": drop_trivial_restrides(step.graph)}


TRIVIAL_RESTRIDES = Pass("trivial_restrides", "fold", _run,
                         "restrides of a fresh result that change no value (only size-1 dims restrided) are dropped")
