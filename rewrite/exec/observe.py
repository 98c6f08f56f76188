"""Warm-up: run a static graph once and record what each node really produced.

An execution plan fixed ahead of time (`rewrite.exec.plan`) needs facts the metas do not carry:
the strides each kernel picks, which results share storage with an input, a constant or another
result (views, ops that return an argument, ``contiguous`` of a contiguous tensor), and how many
bytes each storage spans. They are observed on one real run instead of predicted from meta
kernels, which can disagree with the real kernels on strides.

The run keeps every value alive until it ends, so no address is reused during it and two values
share a storage exactly when they alias. The inputs are the caller's first inputs, or tensors
made from the graph's metas (zeros, contiguous) when a plan is made at compile time. Collectives
do not communicate in this run (`_local_stand_in`).
"""
from __future__ import annotations

import dataclasses

import torch
from torch.fx.node import map_aggregate

from ..fx_bridge import CompileError
from ..ir import Graph, Node, SymMeta, TensorMeta
from ..ops import is_collective, issues_collective

__all__ = ["Layout", "TensorFact", "Observation", "observe", "synthesize_inputs", "layout_of"]


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where a tensor's elements are: dtype, device, sizes, strides and storage offset (elements)."""

    dtype: torch.dtype
    size: tuple
    stride: tuple
    offset: int = 0
    device: torch.device = torch.device("cpu")

    def span(self) -> int:
        """Bytes of storage the tensor reaches, from its storage's start."""
        if any(s == 0 for s in self.size):
            return 0
        last = self.offset + sum((n - 1) * st for n, st in zip(self.size, self.stride))
        return (last + 1) * self.itemsize

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    def numel(self) -> int:
        out = 1
        for s in self.size:
            out *= s
        return out


def layout_of(t: torch.Tensor) -> Layout:
    return Layout(t.dtype, tuple(t.shape), tuple(t.stride()), t.storage_offset(), t.device)


@dataclasses.dataclass(frozen=True)
class TensorFact:
    layout: Layout
    storage: int  # index into Observation.storages


@dataclasses.dataclass
class StorageFact:
    """One storage seen during the run and who made it."""

    nbytes: int
    origin: str  # "input", "constant" or "call"
    owner: int  # node id of the input, constant or call that produced it first
    owner_output: int = 0  # which tensor of the owner's result


@dataclasses.dataclass
class Observation:
    """Per node id: its tensors in output order (None where an output is no tensor)."""

    tensors: dict  # node id -> list[TensorFact | None]
    storages: list  # of StorageFact
    scalars: dict  # node id -> a Python value that is not a tensor (sizes, None...)

    def facts(self, node: Node) -> list:
        return self.tensors.get(node.id, [])


def _leaves(value) -> list:
    """The outputs of a node's value: a tensor is one output, a tuple/list its elements."""
    if isinstance(value, (tuple, list)):
        return list(value)
    return [value]


def synthesize_inputs(graph: Graph) -> list:
    """Inputs made from the graph's metas: contiguous zeros, sizes as ints."""
    out = []
    for p in graph.placeholders:
        m = p.meta
        if isinstance(m, TensorMeta) and m.is_static():
            out.append(torch.zeros([int(s) for s in m.shape], dtype=m.dtype, device=m.device))
        elif isinstance(m, SymMeta) and not getattr(m.expr, "free_symbols", ()):
            out.append(m.pytype(m.expr))
        else:
            raise CompileError(f"graph {graph.name}: input %{p.name} ({m}) is not static; cannot make an example")
    return out


def _evaluate(graph: Graph, inputs: list, order: list, subgraph_compiler) -> dict:
    env: dict = {}
    it = iter(inputs)

    def value(a):  # a node's value, a subgraph's callable, anything else itself
        return env[a.id] if isinstance(a, Node) else subgraph_compiler(a) if isinstance(a, Graph) else a

    for n in order:
        if n.kind == "placeholder":
            env[n.id] = next(it)
        elif n.kind == "constant":
            env[n.id] = n.value
        elif n.kind == "call":
            args, kwargs = map_aggregate((n.args, dict(n.kwargs)), value)
            env[n.id] = _local_stand_in(n, args) if is_collective(n.target) else n.target(*args, **kwargs)
    return env


def _local_stand_in(n: Node, args) -> object:
    """What a collective returns, made on this rank alone: the observed run talks to no other rank.

    A plan is made at compile time (reduce-overhead), when the ranks need not compile in step (a
    rank may compile more gears, or load its graphs from a cache), or on one call's inputs as an
    extra run the other ranks do not make; a real collective there would pair with a peer's
    unrelated call. The plan needs the layouts and aliasing of the results, not their values:
    ``wait_tensor`` returns its argument, every other functional collective a new contiguous tensor
    (zeros of the node's static meta stand in for it)."""
    if not issues_collective(n.target):  # wait_tensor
        return args[0]
    metas = n.meta if isinstance(n.meta, (tuple, list)) else [n.meta]
    made = []
    for m in metas:
        if not (isinstance(m, TensorMeta) and m.is_static()):
            raise CompileError(f"graph: collective %{n.name} ({n.op}) has no static result ({m}); cannot observe it")
        made.append(torch.zeros([int(s) for s in m.shape], dtype=m.dtype, device=m.device))
    return made if isinstance(n.meta, (tuple, list)) else made[0]


def observe(graph: Graph, inputs: list, order: list | None = None) -> Observation:
    """Run ``graph`` on ``inputs`` (in ``order``, the graph's by default) and record every node's result."""
    from .codegen import compile_graph_to_python

    order = graph.nodes if order is None else order
    with torch.no_grad():
        env = _evaluate(graph, inputs, order, compile_graph_to_python)
    storages: list[StorageFact] = []
    index: dict[int, int] = {}  # storage data pointer -> index in storages
    tensors: dict[int, list] = {}
    scalars: dict[int, object] = {}
    origin = {"placeholder": "input", "constant": "constant", "call": "call"}
    for n in order:
        if n.kind == "output" or n.id not in env:
            continue
        facts = []
        for k, v in enumerate(_leaves(env[n.id])):
            if not isinstance(v, torch.Tensor):
                facts.append(None)
                continue
            if v.layout != torch.strided or v.is_sparse or v.is_quantized:
                facts.append(None)
                continue
            storage = v.untyped_storage()
            ptr = storage.data_ptr()
            key = index.get(ptr) if storage.nbytes() > 0 else None
            if key is None:  # a new storage (every empty one counts as its own)
                key = len(storages)
                storages.append(StorageFact(storage.nbytes(), origin[n.kind], n.id, k))
                if storage.nbytes() > 0:
                    index[ptr] = key
            facts.append(TensorFact(layout_of(v), key))
        tensors[n.id] = facts
        if not isinstance(env[n.id], (torch.Tensor, tuple, list)):
            scalars[n.id] = env[n.id]
    return Observation(tensors, storages, scalars)
