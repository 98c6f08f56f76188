"""What optimization must not change at a graph's edges: fresh outputs, distinct outputs, layouts.

Rules reason about values (dtype, shape, contents); callers and later kernels also see *which
memory* a tensor is and *how it is laid out*. Rewrites that are exact on values can change those:

* ``x * 1 -> x`` or ``cat([x]) -> x`` turn a fresh output into the caller's own input (or a
  constant): mutating the result would mutate the input. `keep_outputs_fresh` re-adds a clone.
* CSE merges ``x + 1`` computed twice, so ``return a, b`` would hand back one tensor twice and
  ``a.add_(1)`` would change ``b``. `keep_outputs_fresh` gives each such position its own clone.
* A value and a differently-strided value with equal contents share an e-class, so a ``view``
  may end up reading a non-contiguous tensor. `views_as_reshapes` turns views into ``reshape``,
  which is a view when the layout allows and a copy when it does not.
"""
from __future__ import annotations

import torch

from ..ir import Graph, Node, TensorMeta, iter_nodes, map_nodes
from ..ops import returns_view
from .pass_type import Pass, Step

__all__ = ["FRESH_OUTPUTS", "VIEWS_AS_RESHAPES", "alias_base", "keep_outputs_fresh", "views_as_reshapes"]


def alias_base(node):
    """The placeholder or constant whose memory ``node`` shares (through view ops), or None if fresh."""
    while isinstance(node, Node):
        if node.kind in ("placeholder", "constant"):
            return node
        if node.kind != "call" or not returns_view(node.target):
            return None
        tensors = [a for a in node.args if isinstance(a, Node)]
        if not tensors:
            return None
        node = tensors[0]
    return None


def keep_outputs_fresh(before: Graph, after: Graph) -> int:
    """Give fresh tensors to outputs of ``after`` that alias memory where ``before``'s outputs did not.

    ``before`` and ``after`` are the graph before and after optimization (same output structure),
    compared position by position over the nodes they return (every pass gives a graph output a
    node, a constant one where it folded the value; a literal output cannot alias). A position gets a clone when its value became an input or
    constant (or a view of one), or when an earlier position now holds the same node although the
    two positions held different nodes before. Positions that shared a node before share a clone.
    A repeated view of an input that was a view of one before gets ``alias`` (its own tensor over the
    same memory, as eager returns) instead of a clone.
    Edits ``after`` in place; returns how many clones and aliases were added.
    """
    old, new = list(iter_nodes(before.outputs)), list(iter_nodes(after.outputs))
    if len(old) != len(new):
        raise ValueError(f"graph {after.name}: optimization changed the number of outputs ({len(old)} -> {len(new)})")
    first_origin: dict[int, Node] = {}  # new node id -> the original node of the first position returning it
    clones: dict[tuple, Node] = {}  # (new node id, original node id) -> its clone
    chosen: dict[int, Node] = {}  # output position -> clone
    for i, (o, n) in enumerate(zip(old, new)):
        if not isinstance(n.meta, TensorMeta):
            continue  # a size (a training forward saves them for its backward) is a number: no memory to share
        is_view, was_view = alias_base(n) is not None, alias_base(o) is not None
        became_alias = is_view and not was_view
        # Shared: an earlier position returns this very node (not a clone of it) for another original.
        if not became_alias and first_origin.setdefault(n.id, o) is o:
            continue
        key = (n.id, o.id)
        if key not in clones:
            anchor = next(m for m in after.nodes[after.nodes.index(n) + 1:] if m.kind != "placeholder")
            # A view of an input that was a view before too: AOTAutograd rebuilds such an output
            # from the input with the returned tensor's sizes, strides and offset, so the second
            # position gets its own view of the same memory (a clone's offset would be 0).
            fresh = torch.ops.aten.alias.default if is_view and was_view else torch.ops.aten.clone.default
            clones[key] = after.call(fresh, (n,), meta=n.meta, before=anchor, stream=n.stream)
        chosen[i] = clones[key]
    if chosen:
        position = iter(range(len(new)))

        def swap(node):
            return chosen.get(next(position), node)

        after.output.args = (map_nodes(after.outputs, swap),)
    return len(clones)


_VIEWS = (torch.ops.aten.view.default, torch.ops.aten._unsafe_view.default)


def views_as_reshapes(graph: Graph) -> int:
    """Turn ``view``/``_unsafe_view`` into ``reshape`` (same values; copies only when it must)."""
    changed = 0
    for n in graph.nodes:
        if n.kind == "call" and n.target in _VIEWS:
            n.target = torch.ops.aten.reshape.default
            changed += 1
    return changed


def _run_views_as_reshapes(step: Step) -> dict:
    # The e-graph equates values, not layouts: after it rewrote the graph a view may read a differently-strided tensor.
    if step.rewritten:
        views_as_reshapes(step.graph)
    return {}  # not counted in the report


def _run_fresh_outputs(step: Step) -> dict:
    return {"fresh_outputs": keep_outputs_fresh(step.original, step.graph)}


VIEWS_AS_RESHAPES = Pass("views_as_reshapes", "finish", _run_views_as_reshapes,
                         "after an e-graph rewrite, views become reshapes (a value may now have another layout)")
FRESH_OUTPUTS = Pass("fresh_outputs", "finish", _run_fresh_outputs,
                     "x*1 -> x must not hand the caller its own input; CSE must not hand back one tensor twice")
