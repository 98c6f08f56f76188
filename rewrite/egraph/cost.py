"""The cost of one op from its metas: dispatch overhead + bytes moved + flops.

Units are rough microseconds on a CPU: a kernel launch/dispatch costs ~5, memory ~1 GB/ms, compute
~10 GFLOP/s. Only the ordering matters: fewer ops beat more ops, views beat copies, a matmul on
big operands dominates elementwise work. Symbolic sizes are costed at `SYMBOL_SIZE`.
"""
from __future__ import annotations

import functools
import operator

import sympy
import torch

from ..ir import Graph, SymMeta, TensorMeta

DISPATCH = 5.0
BYTES_PER_UNIT = 1000.0
FLOPS_PER_UNIT = 10_000.0
SYMBOL_SIZE = 64

# Ops that only change how a tensor is viewed (no data moved).
VIEW_OPS = frozenset({
    "aten.view.default", "aten._unsafe_view.default", "aten.permute.default", "aten.t.default",
    "aten.transpose.int", "aten.expand.default", "aten.unsqueeze.default", "aten.squeeze.dim",
    "aten.squeeze.dims", "aten.squeeze.default", "aten.slice.Tensor", "aten.select.int",
    "aten.alias.default", "aten.as_strided.default", "aten.detach.default", "aten.split.Tensor",
    "aten.split_with_sizes.default", "aten.unbind.int", "aten.sym_size.int", "aten.sym_numel.default",
    "aten.sym_stride.int", "getitem",
})
MATMUL_OPS = frozenset({"aten.mm.default", "aten.bmm.default", "aten.addmm.default", "aten.baddbmm.default",
                        "aten.matmul.default", "aten.linear.default"})
SIZE_OPS = frozenset(getattr(op, "__name__") for op in (
    operator.add, operator.sub, operator.mul, operator.floordiv, operator.truediv, operator.mod,
    operator.neg, operator.pow, operator.eq, operator.ne, operator.lt, operator.le, operator.gt, operator.ge))


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
    n = 1
    for s in meta.shape:
        n *= _concrete(s)
    return n


def nbytes(meta) -> int:
    if isinstance(meta, TensorMeta):
        try:
            item = torch.empty((), dtype=meta.dtype).element_size()
        except (TypeError, RuntimeError):
            item = 4
        return numel(meta) * item
    if isinstance(meta, (tuple, list)):
        return sum(nbytes(m) for m in meta)
    return 0


def op_cost(op_name: str, out_meta, in_metas: list) -> float:
    """Cost of one call of ``op_name`` producing ``out_meta`` from inputs with ``in_metas``."""
    if op_name in SIZE_OPS or isinstance(out_meta, SymMeta):
        return 0.5
    if op_name in VIEW_OPS:
        return 1.0
    moved = nbytes(out_meta) + sum(nbytes(m) for m in in_metas if isinstance(m, (TensorMeta, tuple, list)))
    flops = _flops(op_name, out_meta, in_metas)
    return DISPATCH + moved / BYTES_PER_UNIT + flops / FLOPS_PER_UNIT


def _flops(op_name: str, out_meta, in_metas: list) -> float:
    tensors = [m for m in in_metas if isinstance(m, TensorMeta)]
    out = out_meta[0] if isinstance(out_meta, (tuple, list)) and out_meta else out_meta
    out_n = numel(out) if isinstance(out, TensorMeta) else 0
    if op_name in MATMUL_OPS and tensors:
        # 2*M*N*K: the output's elements times the reduced dimension (last dim of the first matrix)
        a = tensors[1] if op_name in ("aten.addmm.default", "aten.baddbmm.default") and len(tensors) > 1 else tensors[0]
        k = _concrete(a.shape[-1]) if a.shape else 1
        return 2.0 * out_n * k
    if op_name == "aten.convolution.default" and len(tensors) > 1:
        w = tensors[1]
        per_out = 1
        for s in w.shape[1:]:
            per_out *= _concrete(s)
        return 2.0 * out_n * per_out
    if op_name.startswith("aten._scaled_dot_product") or op_name == "aten.scaled_dot_product_attention.default":
        if tensors and len(tensors[0].shape) >= 2:
            q = tensors[0]
            s_len = _concrete(tensors[1].shape[-2]) if len(tensors) > 1 and len(tensors[1].shape) >= 2 else 1
            return 4.0 * numel(q) * s_len
    return float(max(out_n, max((numel(t) for t in tensors), default=0)))


def graph_cost(graph: Graph) -> float:
    """Sum of `op_cost` over the call nodes of an IR graph (the DAG cost of the graph)."""
    from ..dsl import target_name

    total = 0.0
    for n in graph.nodes:
        if n.kind == "call":
            total += op_cost(target_name(n.target), n.meta, [i.meta for i in n.inputs])
    return total
