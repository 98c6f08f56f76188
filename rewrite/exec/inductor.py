"""Kernel backend that hands a graph to Inductor (``config.exec.kernels = "inductor"``).

Each static gear graph is compiled by Inductor on its own, with its exact sizes, so gear graphs
can be compared fairly with Inductor compiling the symbolic graph (``dynamic=True``). The graph
is lowered to FX, its inputs become fake tensors of the graph's metas, Inductor's decompositions
are applied (``make_fx``; the IR is already functional core ATen, so no second AOTAutograd pass
and no second runtime wrapper are needed), and ``compile_fx_inner`` compiles it under a fresh
tracing context, so the Dynamo/AOT context of the model being compiled is not disturbed.

A graph with size symbols is compiled dynamically: every symbol becomes a symbol of a fresh
ShapeEnv (inputs sharing a symbol share it there too), and Inductor generates size-generic code.

Numerics: results must be what eager computes. Inductor's fused ``var_mean`` (a Welford
reduction) returns a mean of ``inf`` for a row holding ``inf`` where ATen's kernel returns
``nan``; such ops run as ATen kernels inside the Inductor graph (`EAGER_NUMERICS`: a custom op
Inductor cannot lower becomes a call of the ATen kernel). On CUDA, Inductor turns a division by a
constant into a product and lets Triton contract products into FMAs; a masked row of an attention
(``(qk + finfo.min) / sqrt(d)``, then softmax) then subtracts its maximum from an unrounded product,
and the rounding error of a product near -1.2e38 (about 3e30) makes ``exp`` of it 0 or inf: every
fully masked row became NaN (the codegen model of the zoo, left-padded, on an H200). Eager rounds
each op, so the graphs are compiled with ``emulate_precision_casts`` (no contraction; low-precision
intermediates rounded as eager rounds them).
"""
from __future__ import annotations

import functools
import logging

import sympy
import torch
from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily

from ..fx_bridge import CompileError, to_fx
from ..ir import Graph, Node, SymMeta, TensorMeta, map_nodes
from ..ops import FUSED_LINEARS, bind_arguments, unfused_linear

log = logging.getLogger("rewrite")

__all__ = ["compile_with_inductor", "EAGER_NUMERICS"]


_EAGER_LIB = torch.library.Library("rewrite_eager", "DEF")  # kept for the process: the ops live as long
_MOMENTS = ("self", "dim", "correction", "keepdim")


def _eager_moment(name: str, aten_op, results: str):
    """An opaque op ``rewrite_eager::{name}`` that runs ``aten_op`` (a statistic taking `_MOMENTS`)."""
    _EAGER_LIB.define(f"{name}(Tensor self, int[]? dim, float? correction, bool keepdim) -> {results}")

    def run(x, dim, correction, keepdim):
        return aten_op(x, dim, correction=correction, keepdim=keepdim)

    _EAGER_LIB.impl(name, run, "CompositeExplicitAutograd")
    torch.library.register_fake(f"rewrite_eager::{name}", run, lib=_EAGER_LIB)
    return getattr(torch.ops.rewrite_eager, name).default


# ATen op -> (the opaque op that runs its ATen kernel, its argument names in order). std and std_mean
# stay single ops in rewrite's graphs (backend.decomposition_table); Inductor would lower all three to
# its Welford reduction, and std to sqrt(var), which overflows at 3e38.
_aten = torch.ops.aten
EAGER_NUMERICS = {
    _aten.var_mean.correction: (_eager_moment("var_mean", _aten.var_mean.correction, "(Tensor, Tensor)"), _MOMENTS),
    _aten.std_mean.correction: (_eager_moment("std_mean", _aten.std_mean.correction, "(Tensor, Tensor)"), _MOMENTS),
    _aten.std.correction: (_eager_moment("std", _aten.std.correction, "Tensor"), _MOMENTS),
}


def _keep_eager_numerics(gm: torch.fx.GraphModule) -> None:
    for node in gm.graph.nodes:
        swap = EAGER_NUMERICS.get(node.target) if node.op == "call_function" else None
        if swap is not None:
            target, names = swap
            bound = bind_arguments(node.target, node.args, node.kwargs)
            node.target, node.args, node.kwargs = target, tuple(bound[n] for n in names), {}
    gm.recompile()

# Size used as the example value of a size symbol when compiling a symbolic graph.
_HINT = 8


def _fake_inputs(graph: Graph, fake_mode: FakeTensorMode) -> list:
    """Fake tensors / ints / SymInts for the graph's inputs, with the graph's (symbolic) sizes."""
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import DimDynamic, StatelessSymbolicContext

    ours: dict = {}  # our sympy symbol -> the ShapeEnv's SymInt for it
    hints = {s: _HINT for s in graph.free_symbols()}
    out: list = [None] * len(graph.placeholders)
    # Tensors first: scalar inputs carrying a size reuse the SymInt of the tensor size they equal.
    order = sorted(enumerate(graph.placeholders), key=lambda ip: not isinstance(ip[1].meta, TensorMeta))
    for i, p in order:
        meta = p.meta
        if isinstance(meta, TensorMeta):
            shape = [sympy.sympify(s) for s in meta.shape]
            with unset_fake_temporarily():
                real = torch.empty([int(s.subs(hints)) for s in shape], dtype=meta.dtype, device=meta.device)
            if all(s.is_Integer for s in shape):
                out[i] = fake_mode.from_tensor(real, static_shapes=True)
                continue
            dyn = [DimDynamic.STATIC if s.is_Integer else DimDynamic.DYNAMIC for s in shape]
            ctx = StatelessSymbolicContext(dynamic_sizes=dyn, constraint_sizes=[None] * len(shape))
            fake = fake_mode.from_tensor(real, source=ConstantSource(f"rewrite_input_{i}"), symbolic_context=ctx)
            for s, size in zip(shape, fake.shape):
                if isinstance(s, sympy.Symbol):
                    if s in ours:  # the same size in two inputs: tell the ShapeEnv they are equal
                        torch._check(size == ours[s])
                    else:
                        ours[s] = size
                elif not s.is_Integer:
                    raise CompileError(f"inductor kernels: input %{p.name} has size {s}; symbolic inputs need "
                                       f"plain symbols or constants")
            out[i] = fake
        elif isinstance(meta, SymMeta):
            expr = sympy.sympify(meta.expr)
            if expr.free_symbols:
                if expr not in ours:
                    raise CompileError(f"inductor kernels: scalar input %{p.name} = {expr} is not a size of a "
                                       f"tensor input")
                out[i] = ours[expr]
            else:
                out[i] = meta.pytype(expr)
        else:
            raise CompileError(f"inductor kernels: input %{p.name} has no tensor or scalar meta ({meta})")
    return out


# Tensor constants above this many elements reach Inductor as graph inputs, not baked-in constants:
# Inductor's FX graph cache key hashes a baked constant by value (``tolist`` and pickle: about 12 s
# per gear for MiniLM's frozen weights, on every compile, cold or warm), an input by its metadata.
# The kernels are the same: without Inductor's freezing passes a constant is only read, like an input.
LIFT_NUMEL = 1024


def _lift_constants(graph: Graph) -> tuple[Graph, list[torch.Tensor]]:
    """A copy of ``graph`` whose large tensor constants are extra inputs after its own, and their values
    (contiguous: the fake inputs Inductor compiles for have contiguous strides)."""
    large = [n for n in graph.nodes if n.kind == "constant" and isinstance(n.value, torch.Tensor)
             and n.value.numel() > LIFT_NUMEL]
    if not large:
        return graph, []
    g, mapping = graph.copy_with_map()
    last = max((i for i, n in enumerate(g.nodes) if n.kind == "placeholder"), default=-1)
    swap, values = {}, []
    for k, old in enumerate(large):
        node = mapping[old.id]
        name = f"lifted_{k}_{node.name}"
        swap[node.id] = Node("placeholder", meta=node.meta, attrs={"name": name}, name=name)
        values.append(old.value.contiguous())
    g.nodes = [n for n in g.nodes if n.id not in swap]
    for p in swap.values():
        p.graph = g
    g.nodes[last + 1:last + 1] = list(swap.values())
    remap = lambda n: swap.get(n.id, n)  # noqa: E731
    for n in g.nodes:
        n.args, n.kwargs = map_nodes(n.args, remap), map_nodes(n.kwargs, remap)
        n.waits = tuple(remap(w) for w in n.waits)
    return g, values


def compile_with_inductor(graph: Graph):
    """Compile ``graph`` with Inductor; returns ``f(*inputs) -> outputs``."""
    from torch._guards import TracingContext, tracing
    from torch._inductor.compile_fx import compile_fx_inner
    from torch._inductor.decomposition import select_decomp_table
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    graph, lifted = _lift_constants(graph)
    gm = to_fx(graph)
    _keep_eager_numerics(gm)
    static = graph.is_static()
    fake_mode = FakeTensorMode(shape_env=None if static else ShapeEnv(), allow_non_fake_inputs=True)
    try:
        with unset_fake_temporarily(), tracing(TracingContext(fake_mode)):
            fake = _fake_inputs(graph, fake_mode)
            # The IR is already functional core ATen; Inductor lowers its own decompositions of it.
            # oneDNN's fused linear (a rule's output) goes back to GEMM + activation: Inductor's own
            # lowering of it asserts on a weight its freezing passes did not pack, and fuses the
            # activation into the GEMM's epilogue itself.
            table = {**select_decomp_table(), **{op: functools.partial(unfused_linear, op) for op in FUSED_LINEARS}}
            with fake_mode:
                lowered = make_fx(gm, decomposition_table=table)(*fake)
            with torch._inductor.config.patch(emulate_precision_casts=True):
                compiled = compile_fx_inner(lowered, fake)
    except CompileError:
        raise
    except Exception as e:
        raise CompileError(f"inductor kernels: graph {graph.name} failed to compile: {type(e).__name__}: {e}") from e

    def run(*args):
        return compiled([*args, *lifted])

    run.__rewrite_inductor__ = True
    return run
