"""The one cost model: estimated single-thread seconds of an op, from its metas.

Used by e-graph extraction (which form of a value is cheapest), by the optimizer's "keep the
cheaper graph" check, and by ``exec.auto_streams`` (which branches are worth a stream). A compute
op costs a fixed dispatch overhead plus the larger of its compute time and its memory time (a
roofline); ops that only make views or compute sizes cost a fraction of a dispatch, so extraction
still prefers ``x`` over ``view(view(x))``. Symbolic sizes are costed at `SYMBOL_SIZE`.

The figures are rough for one CPU core; only ratios matter to the decisions built on them.
"""
from __future__ import annotations

import functools
import operator

import sympy

from . import ops
from .ir import Graph, Node, SymMeta, TensorMeta, iter_metas

__all__ = ["op_cost", "node_cost", "graph_cost", "numel", "nbytes", "flops", "moves_no_data",
           "OP_OVERHEAD_S", "VIEW_S", "SIZE_S", "FLOPS_PER_S", "BYTES_PER_S", "SYMBOL_SIZE"]

OP_OVERHEAD_S = 4e-6     # dispatching one ATen kernel from Python
VIEW_S = 1e-6            # an op that only makes a view (no data moved)
SIZE_S = 0.5e-6          # size arithmetic on Python ints
FLOPS_PER_S = 100e9
BYTES_PER_S = 8e9
SYMBOL_SIZE = 64         # what a symbolic size counts as

_FREE = ops.VIEWS | ops.SIZE_QUERIES | {operator.getitem}
_ADD_MATMULS = ops._overloads("addmm.default", "baddbmm.default")


@functools.lru_cache(maxsize=65_536)
def _concrete(expr) -> int:
    e = sympy.sympify(expr)
    if e.is_Integer:
        return int(e)
    try:
        return max(0, int(e.subs({s: SYMBOL_SIZE for s in e.free_symbols})))
    except (TypeError, ValueError):
        return SYMBOL_SIZE


def numel(meta) -> int:
    """Elements of a tensor meta (symbols at `SYMBOL_SIZE`; unknown rank: 0)."""
    if not isinstance(meta, TensorMeta) or meta.shape is None:
        return 0
    n = 1
    for s in meta.shape:
        n *= _concrete(s)
    return n


def nbytes(meta) -> int:
    """Bytes of a meta or a nested structure of metas."""
    return sum(numel(m) * m.dtype.itemsize for m in iter_metas(meta) if isinstance(m, TensorMeta))


def flops(target, out_meta, in_metas: list) -> float:
    """Floating-point operations of one call (elementwise ops: one per element)."""
    tensors = [m for m in in_metas if isinstance(m, TensorMeta) and m.shape is not None]
    out = next((m for m in iter_metas(out_meta) if isinstance(m, TensorMeta)), None)
    out_n = numel(out)
    if target in ops.MATMULS and tensors:
        # 2*M*N*K: the output's elements times the reduced dimension (last dim of the first matrix)
        a = tensors[1] if target in _ADD_MATMULS and len(tensors) > 1 else tensors[0]
        k = _concrete(a.shape[-1]) if a.shape else 1
        return 2.0 * out_n * k
    if target in ops.CONVOLUTIONS and len(tensors) > 1:
        w = tensors[1]
        per_out = 1
        for s in w.shape[1:]:
            per_out *= _concrete(s)
        return 2.0 * out_n * per_out
    if target in ops.ATTENTION and tensors and len(tensors[0].shape) >= 2:
        q = tensors[0]
        kv_len = _concrete(tensors[1].shape[-2]) if len(tensors) > 1 and len(tensors[1].shape) >= 2 else 1
        return 4.0 * numel(q) * kv_len
    return float(max(out_n, max((numel(t) for t in tensors), default=0)))


def moves_no_data(target) -> bool:
    """Views, size queries and getitem: they cost a dispatch at most, and no time on a stream."""
    return target in _FREE


def op_cost(target, out_meta, in_metas: list) -> float:
    """Estimated seconds of one call of ``target`` producing ``out_meta`` from inputs with ``in_metas``."""
    if target in ops.SIZE_ARITHMETIC or isinstance(out_meta, SymMeta) or target in ops.SIZE_QUERIES:
        return SIZE_S
    if target in _FREE:
        return VIEW_S
    moved = nbytes(out_meta) + sum(nbytes(m) for m in in_metas)
    return OP_OVERHEAD_S + max(flops(target, out_meta, in_metas) / FLOPS_PER_S, moved / BYTES_PER_S)


def node_cost(node: Node) -> float:
    """`op_cost` of an IR node (0 for anything that is not a call)."""
    if node.kind != "call":
        return 0.0
    return op_cost(node.target, node.meta, [i.meta for i in node.inputs])


def graph_cost(graph: Graph) -> float:
    """Sum of `node_cost` over a graph: its DAG cost."""
    return sum(node_cost(n) for n in graph.nodes)
