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

from .ir import Graph, Node

__all__ = ["alias_base", "keep_outputs_fresh", "views_as_reshapes"]


def _is_view_op(node: Node) -> bool:
    """Whether the op's result may share its first input's memory (schema alias annotation).

    ``_unsafe_view`` has none (autograd treats it as fresh), yet its result shares memory.
    """
    t = node.target
    if t is torch.ops.aten._unsafe_view.default:
        return True
    if not isinstance(t, torch._ops.OpOverload) or not t._schema.returns:
        return False
    info = t._schema.returns[0].alias_info
    return info is not None and not info.is_write


def alias_base(node):
    """The placeholder or constant whose memory ``node`` shares (through view ops), or None if fresh."""
    while isinstance(node, Node):
        if node.kind in ("placeholder", "constant"):
            return node
        if node.kind != "call" or not _is_view_op(node):
            return None
        tensors = [a for a in node.args if isinstance(a, Node)]
        if not tensors:
            return None
        node = tensors[0]
    return None


def _output_leaves(graph: Graph) -> list:
    out: list = []
    _map_leaves(graph.outputs, lambda leaf: out.append(leaf) or leaf)
    return out


def _map_leaves(obj, fn):
    """Rebuild a nested output structure with ``fn`` applied to each leaf, in order."""
    if isinstance(obj, tuple):
        return tuple(_map_leaves(x, fn) for x in obj)
    if isinstance(obj, list):
        return [_map_leaves(x, fn) for x in obj]
    if isinstance(obj, dict):
        return {k: _map_leaves(v, fn) for k, v in obj.items()}
    return fn(obj)


def keep_outputs_fresh(before: Graph, after: Graph) -> int:
    """Clone outputs of ``after`` that alias memory where ``before``'s outputs did not.

    ``before`` and ``after`` are the graph before and after optimization (same output structure),
    compared position by position. A position gets a clone when its value became an input or
    constant (or a view of one), or when an earlier position now holds the same node although the
    two positions held different nodes before. Positions that shared a node before share a clone.
    Edits ``after`` in place; returns how many clones were added.
    """
    old, new = _output_leaves(before), _output_leaves(after)
    if len(old) != len(new):
        raise ValueError(f"graph {after.name}: optimization changed the number of outputs ({len(old)} -> {len(new)})")
    first_origin: dict[int, object] = {}  # new node id -> the original leaf of the first position returning it
    clones: dict[tuple, Node] = {}  # (new node id, original leaf id) -> its clone
    chosen: dict[int, Node] = {}  # output position -> clone
    for i, (o, n) in enumerate(zip(old, new)):
        if not isinstance(n, Node):
            continue
        became_alias = alias_base(n) is not None and not (isinstance(o, Node) and alias_base(o) is not None)
        # Shared: an earlier position returns this very node (not a clone of it) for another original.
        if not became_alias and first_origin.setdefault(n.id, o) is o:
            continue
        key = (n.id, id(o))
        if key not in clones:
            anchor = next(m for m in after.nodes[after.nodes.index(n) + 1:] if m.kind != "placeholder")
            attrs = {"stream": n.attrs["stream"]} if "stream" in n.attrs else {}
            clones[key] = after.call(torch.ops.aten.clone.default, (n,), meta=n.meta, attrs=attrs, before=anchor)
        chosen[i] = clones[key]
    if chosen:
        position = iter(range(len(new)))

        def swap(leaf):
            return chosen.get(next(position), leaf)

        after.output.args = (_map_leaves(after.outputs, swap),)
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
