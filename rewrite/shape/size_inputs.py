"""Size inputs read from the tensors that carry them (TorchAir's ``_optimize_sym_input``).

Dynamo passes a size the model uses as a separate SymInt graph input even when a tensor input
already carries it as one of its dims (same symbol: Dynamo's guards make them equal). Two inputs
then hold one value, and the exported signature needs a value the caller never chose. Two steps
give the graph one source of truth for each size:

- `merge_lifted_sizes`, on Dynamo's graph before AOTAutograd: a size Dynamo lifted from a tensor
  (source ``L['x'].size()[0]``, never an argument of the caller) leaves the graph's inputs; its
  readers read ``aten.sym_size.int(tensor, dim)``, and the compiled function picks the remaining
  inputs out of Dynamo's call (`MergedSizes.calling`). TorchAir's graph with 8 inputs has 6 after it.
- `read_sizes_from_tensors`, on the imported graph: a SymInt the caller passed (``f(6, t)`` with
  ``t.shape[0] == 6`` guarded) stays an input, as TorchAir keeps it and an export checks it against the
  tensors (rewrite.export.assembly), but its readers read the tensor's dim; per-gear graphs fold
  that sym_size to its number.

Matched like TorchAir: the SymInt's expression equals a tensor input's dim expression exactly
(``s7`` to a dim ``s7``, ``s0*s1`` to a dim ``s0*s1``); the first tensor input and dim win.
"""
from __future__ import annotations

import dataclasses
import operator
import re

import sympy
import torch
import torch.fx

from ..ir import Graph, SymMeta, TensorMeta

__all__ = ["read_sizes_from_tensors", "merge_lifted_sizes", "MergedSizes"]

# Dynamo's source name of a value it lifted from a tensor: L['x'].size()[0], L['x'].stride()[1], ...
_LIFTED_FROM_TENSOR = re.compile(r".+\.(size\(\)\[\d+\]|stride\(\)\[\d+\]|storage_offset\(\))")


@dataclasses.dataclass(frozen=True)
class MergedSizes:
    """Dynamo's graph without the size inputs a tensor input carries: ``kept`` are the positions, in Dynamo's
    call, of the inputs ``gm`` still takes (``example_inputs``, in that order)."""

    gm: torch.fx.GraphModule
    example_inputs: list
    kept: tuple

    def calling(self, fn):
        """``fn`` (compiled for ``gm``) as Dynamo calls it: with every input of its original graph."""
        if len(self.kept) == 1:
            only = self.kept[0]
            return lambda *args: fn(args[only])
        pick = operator.itemgetter(*self.kept)  # in C: a transformers graph passes its ~200 weights on every call

        def call(*args):
            return fn(*pick(args))

        return call


def merge_lifted_sizes(gm: torch.fx.GraphModule, example_inputs: list, names: list) -> MergedSizes | None:
    """A copy of Dynamo's graph ``gm`` without each input Dynamo lifted from a tensor (``names``: Dynamo's source
    names) whose value a plain tensor input carries as a dim; None when there is none."""
    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    if len(placeholders) != len(example_inputs) or len(names) < len(placeholders):
        return None
    lifted = _lifted_sizes(placeholders, example_inputs, names)
    if not lifted:
        return None
    # Dynamo reads its own graph's placeholders again to build the call, so the inputs leave a copy
    gm = _copy(gm)
    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    first = next(n for n in gm.graph.nodes if n.op != "placeholder")
    for i, (tensor, dim) in lifted.items():
        p = placeholders[i]
        if p.users:
            with gm.graph.inserting_before(first):
                size = gm.graph.call_function(torch.ops.aten.sym_size.int, (placeholders[tensor], dim))
            size.meta["example_value"] = p.meta["example_value"]
            p.replace_all_uses_with(size)
        gm.graph.erase_node(p)
    gm.recompile()
    kept = tuple(i for i in range(len(placeholders)) if i not in lifted)
    return MergedSizes(gm, [example_inputs[i] for i in kept], kept)


def _lifted_sizes(placeholders: list, example_inputs: list, names: list) -> dict:
    """Input position -> (position of the plain tensor input, dim) that carries it, for each size Dynamo lifted."""
    carriers: dict = {}
    for k, (p, value) in enumerate(zip(placeholders, example_inputs)):
        fake = p.meta.get("example_value")
        if type(value) in (torch.Tensor, torch.nn.Parameter) and isinstance(fake, torch.Tensor):
            for d, size in enumerate(fake.shape):
                if isinstance(size, torch.SymInt):
                    carriers.setdefault(size.node.expr, (k, d))
    lifted = {}
    for i, (p, name) in enumerate(zip(placeholders, names)):
        value = p.meta.get("example_value")
        if _LIFTED_FROM_TENSOR.fullmatch(name) and isinstance(value, torch.SymInt) and value.node.expr in carriers:
            lifted[i] = carriers[value.node.expr]
    return lifted


def _copy(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A GraphModule with a copy of ``gm``'s graph (its modules and constants shared) and what Dynamo attached to
    ``gm`` and its placeholders for AOTAutograd (``meta``, ``_param_name_to_source``, ``_dynamo_source``, ...)."""
    graph = torch.fx.Graph()
    nodes: dict = {}
    graph.output(graph.graph_copy(gm.graph, nodes))
    copied = torch.fx.GraphModule(gm, graph)
    for key, value in vars(gm).items():
        if key not in vars(copied):
            setattr(copied, key, value)
    copied.meta.update(gm.meta)
    for old, new in nodes.items():
        if hasattr(old, "_dynamo_source"):
            new._dynamo_source = old._dynamo_source
    return copied


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
