"""The one cost model: predicted seconds of an op on this machine, from its metas.

Used by e-graph extraction (which form of a value is cheapest), by the optimizer's "keep the
cheaper graph" check, by ``exec.auto_streams`` (which branches are worth a stream) and by
``rewrite.explain`` (predicted cost before/after). One formula for every op:

    seconds = overhead(family) + max(work / rate(family, dtype), bytes moved / memory rate) / speed-up

where the family (`FAMILIES`, declared in `rewrite.ops`: gemm, fused linear, packed linear, attention, convolution,
normalization, copy, pointwise) says what ``work`` is (flops, or bytes) and the rates are
*measured* on this machine by `rewrite.cost.calibration` (a micro-benchmark of a second or two, cached
per machine, torch version and thread count; ``python -m rewrite calibrate`` re-runs it); rates are
for one thread, and the speed-up on the process's threads (measured on a large GEMM) applies as
a kernel's work grows past `PARALLEL_GRAIN_S`. Views and
size queries cost a fraction of a dispatch, so extraction still prefers ``x`` over
``view(view(x))``; symbolic sizes are costed at `SYMBOL_SIZE` (`rewrite.cost.sizes`). Where a GEMM or attention kernel
has static shapes, its time measured at those shapes replaces the formula (`rewrite.cost.kernel_times`).

A graph headed for static kernels (reduce-overhead with static kernels, the default mode's tier-up) is
priced under `for_static_kernels`: an op the C generator has no kernel for (`OUTSIDE_STATIC_KERNELS`: the
oneDNN and MKL linears rules produce) is an ATen call between two runs of C kernels there, so it also pays
`RUN_SPLIT_DISPATCHES` dispatches: its own call from the generated Python, which the GEMM kernel it
replaces does not make, the extra runner call of the run it splits, and the wake-up of its thread pool,
which the C kernels before it left idle. Measured on GPT-2 (64 wide) at batch 1: oneDNN's linear took
62 us a call inside the run against 34 us timed alone, and the gear with two of them 1.35x the time of
the gear without (about 6 dispatches more than the two counted first; the dispatch is measured per
machine, so the charge scales with it). A large GEMM on oneDNN's packed weight is worth that (MiniLM's
QKV at 512 rows: 2.4 ms against MKL's 3.0 ms); a small one is not (the zoo's phi at batch 8: 0.795 ms
with its fused linears, 0.551 ms without, when they were priced as ATen calls).

Whether oneDNN's linear beats ATen's GEMM depends on the sizes (its call costs about 17 us more, its GEMM
is faster on some CPUs and not on others), so it is chosen at static shapes only, where the kernels are
timed: with a symbolic size its cost is `AT_STATIC_SHAPES_ONLY_S`, more than any GEMM. A symbolic graph
keeps ATen's GEMM; each gear made from it is optimized again at its own sizes and chooses there (the
choice cannot be undone by a later optimization: no rule leads from the fused linear back to the GEMM).
Before, a symbolic graph priced it at the stand-in size, and its gears inherited oneDNN's linear even
where their GEMMs were 64 wide (benchmarks/reduce_overhead.py's GPT-2 at batch 1: 1.9 ms a call of its gear,
0.73 ms of its static graph).

Compile-time work is free: an op whose inputs are all constants is evaluated once by the folding
pass (`folds_at_compile_time`), so a rule may build new weights out of frozen ones (a concatenated
QKV weight, a scale folded into a weight) and extraction counts them at no run-time cost.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import operator

import torch

from .. import ops
from ..ir import Graph, Node, SymMeta, TensorMeta, iter_instances, iter_metas
from .calibration import current as _calibration
from .kernel_times import WITHOUT_POST_OP
from .sizes import concrete, nbytes, numel

__all__ = ["op_cost", "node_cost", "graph_cost", "flops", "moves_no_data", "family_of", "call_inputs",
           "folds_at_compile_time", "foldable_target", "is_weight", "dispatch_overhead", "single_thread_cost",
           "pointwise_pass", "for_static_kernels", "FAMILIES", "SIZE_S", "FOLD_SIZE_LIMIT", "OUTSIDE_STATIC_KERNELS",
           "RUN_SPLIT_DISPATCHES", "AT_STATIC_SHAPES_ONLY_S"]

SIZE_S = 0.3e-6          # size arithmetic on Python ints (not worth measuring: it is never the choice)
PARALLEL_GRAIN_S = 100e-6  # one thread's work from which a kernel gets the measured multi-thread speed-up
FOLD_SIZE_LIMIT = 65_536  # config.rules.fold_size_limit's default: what the cost model assumes folds

# Op families by what bounds them (`ops.COST_FAMILIES`); the rest is "pointwise".
_COMPUTE = ops.COMPUTE_FAMILIES  # family -> targets whose work is counted in flops
_MEMORY = ops.MEMORY_FAMILIES    # family -> targets whose work is the bytes they move
FAMILIES = ops.COST_FAMILIES
_FAMILY = {t: f for f, targets in {**_COMPUTE, **_MEMORY}.items() for t in targets}
# reshape too: it is a view whenever the layout allows, and the graphs it runs in are dense
_FREE = ops.VIEWS | ops.SIZE_QUERIES | {operator.getitem} | ops.overloads("reshape.default")


# Kernels rules produce that no static kernel runs (rewrite.kernels.cgen generates none of them).
OUTSIDE_STATIC_KERNELS = ops.FUSED_LINEARS | ops.PACKED_LINEARS
RUN_SPLIT_DISPATCHES = 8  # what such an op adds in a graph of static kernels: its call, one more run, a wake-up
AT_STATIC_SHAPES_ONLY_S = 1.0  # such an op with a symbolic size: never chosen over the GEMM it replaces
_STATIC_KERNELS = contextvars.ContextVar("rewrite_cost_for_static_kernels", default=False)


@contextlib.contextmanager
def for_static_kernels(on: bool = True):
    """Price ops, within this block and this thread, for a graph headed for static kernels (module docstring)."""
    token = _STATIC_KERNELS.set(bool(on))
    try:
        yield
    finally:
        _STATIC_KERNELS.reset(token)


def family_of(target) -> str:
    """The cost family of a call target (`FAMILIES`)."""
    return _FAMILY.get(target, "pointwise")


def flops(target, out_meta, in_metas: list) -> float:
    """Floating-point operations of one call (elementwise ops: one per element)."""
    tensors = [m for m in in_metas if isinstance(m, TensorMeta) and m.shape is not None]
    out = next((m for m in iter_metas(out_meta) if isinstance(m, TensorMeta)), None)
    out_n = numel(out)
    family = family_of(target)
    if family in ("gemm", "fused_linear", "packed_linear") and tensors:
        # 2*M*N*K: the output's elements times the reduced dimension (last dim of the activation)
        a = tensors[1] if target in ops.ADD_MATMULS and len(tensors) > 1 else tensors[0]
        k = concrete(a.shape[-1]) if a.shape else 1
        return 2.0 * out_n * k
    if family == "convolution" and len(tensors) > 1:
        per_out = 1
        for s in tensors[1].shape[1:]:
            per_out *= concrete(s)
        return 2.0 * out_n * per_out
    if family == "attention" and tensors and len(tensors[0].shape) >= 2:
        kv_len = concrete(tensors[1].shape[-2]) if len(tensors) > 1 and len(tensors[1].shape) >= 2 else 1
        return 4.0 * numel(tensors[0]) * kv_len
    return float(max(out_n, max((numel(t) for t in tensors), default=0)))


def moves_no_data(target) -> bool:
    """Views, size queries and getitem: they cost a dispatch at most, and no time on a stream."""
    return target in _FREE


def _dtype(out_meta, in_metas) -> torch.dtype:
    for m in (*iter_metas(out_meta), *in_metas):
        if isinstance(m, TensorMeta) and m.dtype.is_floating_point:
            return m.dtype
    return torch.float32


def _metas_key(metas) -> tuple:
    return tuple(m if isinstance(m, (TensorMeta, SymMeta)) else type(m).__name__ for m in metas)


def op_cost(target, out_meta, in_metas: list) -> float:
    """Predicted seconds of one call of ``target`` producing ``out_meta`` from inputs with ``in_metas``."""
    static = _STATIC_KERNELS.get()
    try:
        return _op_cost_cached(target, out_meta, _metas_key(in_metas), _calibration(), static)
    except TypeError:  # an unhashable meta (a list): compute without the cache
        return _op_cost(target, out_meta, in_metas, _calibration(), static)


@functools.lru_cache(maxsize=65_536)
def _op_cost_cached(target, out_meta, in_metas: tuple, cal, static: bool) -> float:
    return _op_cost(target, out_meta, list(in_metas), cal, static)


def _op_cost(target, out_meta, in_metas: list, cal, static: bool = False) -> float:
    if target in OUTSIDE_STATIC_KERNELS:
        if not all(m.is_static() for m in in_metas if isinstance(m, TensorMeta)):
            return AT_STATIC_SHAPES_ONLY_S
        if static:
            return RUN_SPLIT_DISPATCHES * cal.dispatch_s + _op_cost(target, out_meta, in_metas, cal)
    if cal.kernel_times is not None:  # GEMMs and attention at static shapes: measured (rewrite.cost.kernel_times)
        measured = cal.kernel_times.seconds(target, out_meta, in_metas)
        if measured is not None:
            if target in WITHOUT_POST_OP:  # the fused post-op's pass over the output: no dispatch of its own
                measured += nbytes(out_meta) / cal.families["pointwise"].rate
            return measured
    overhead, work = _one_thread(target, out_meta, in_metas, cal)
    return overhead + work / _speedup(work, cal)


def _speedup(work: float, cal) -> float:
    """How much faster ``work`` seconds of one thread's kernel run on the process's threads: the
    measured speed-up of a large kernel, reached as the work grows past `PARALLEL_GRAIN_S`."""
    return 1.0 + (cal.parallel - 1.0) * min(1.0, work / PARALLEL_GRAIN_S)


def _one_thread(target, out_meta, in_metas: list, cal) -> tuple[float, float]:
    """(fixed overhead, work) seconds of one call on one thread."""
    if target in ops.SIZE_ARITHMETIC or isinstance(out_meta, SymMeta) or target in ops.SIZE_QUERIES \
            or target is operator.getitem:  # Python arithmetic, or indexing a tuple the kernel returned
        return SIZE_S, 0.0
    if target in _FREE:
        return cal.view_s, 0.0
    family = family_of(target)
    rates = cal.families[family]
    moved = nbytes(out_meta) + sum(nbytes(m) for m in in_metas)
    memory_time = moved / cal.families["pointwise"].rate
    if family in _COMPUTE:
        speed = cal.dtype_speed.get(ops.dtype_str(_dtype(out_meta, in_metas)), 1.0)
        work_time = flops(target, out_meta, in_metas) / (rates.rate * speed)
    else:
        work_time = moved / rates.rate
    return rates.overhead_s, max(work_time, memory_time)


def pointwise_pass(meta) -> float:
    """Seconds of one pointwise pass writing ``meta``'s bytes, with no dispatch of its own: a post-op fused
    into the kernel that produced it (measured: gelu fused into a 32x256x768 linear adds 7 us, the pass 16 us)."""
    return nbytes(meta) / _calibration().families["pointwise"].rate


def dispatch_overhead() -> float:
    """Seconds of calling one ATen kernel from generated code (measured)."""
    return _calibration().dispatch_s


def single_thread_cost(node: Node) -> float:
    """`node_cost` on one thread (``auto_streams`` shares threads between streams itself)."""
    if node.kind != "call":
        return 0.0
    overhead, work = _one_thread(node.target, node.meta, [i.meta for i in node.inputs], _calibration())
    return overhead + work


# -- compile-time work ----------------------------------------------------------------------------

def foldable_target(target) -> bool:
    """Whether calls of ``target`` may be evaluated at compile time when their inputs are constants:
    deterministic ATen/prims ops without mutation and with reproducible results (not ``empty``)."""
    if not ops.is_overload(target) or target.namespace not in ("aten", "prims"):
        return False
    if ops.is_mutable(target) or ops.is_nondeterministic(target):
        return False
    name = target._schema.name
    return "empty" not in name and not name.startswith("aten::_local_scalar")


def folds_at_compile_time(target, out_meta, weight_numel: int = 0, size_limit: int = FOLD_SIZE_LIMIT) -> bool:
    """Whether a call on constants only is folded into a constant (so it costs nothing at run time).

    Folding keeps results of at most ``size_limit`` elements, or no larger than the frozen weights
    among its inputs together (``weight_numel`` elements): a transposed, scaled or concatenated
    weight takes the place of the weights it is computed from.
    """
    if not foldable_target(target):
        return False
    if isinstance(out_meta, SymMeta):
        return True
    if not isinstance(out_meta, TensorMeta) or not out_meta.is_static():
        return False
    n = numel(out_meta)
    return n <= size_limit or n <= weight_numel


def is_weight(node: Node) -> bool:
    """A constant holding a frozen weight or a value folded from frozen weights."""
    a = node.attrs
    return node.kind == "constant" and bool(a.get("weight_name") or a.get("derived_from") or a.get("from_weights"))


def node_cost(node: Node) -> float:
    """`op_cost` of an IR node (0 for anything that is not a call)."""
    if node.kind != "call":
        return 0.0
    return op_cost(node.target, node.meta, [i.meta for i in call_inputs(node)])


def graph_cost(graph: Graph) -> float:
    """Predicted run time of a graph: the sum of its ops' costs; what folding will compute at
    compile time (constants and calls on them, see `folds_at_compile_time`) costs nothing."""
    known: dict[int, int] = {}  # compile-time node id -> its elements if it comes from frozen weights, else 0
    total = 0.0
    cal, memo, static = _calibration(), {}, _STATIC_KERNELS.get()  # memo by meta identity: nodes share few metas
    for n in graph.nodes:
        if n.kind == "constant":
            known[n.id] = numel(n.meta) if is_weight(n) else 0
            continue
        if n.kind != "call":
            continue
        inputs = call_inputs(n)
        if not n.waits and all(i.id in known for i in inputs):
            weights = sum(known[i.id] for i in inputs)
            if folds_at_compile_time(n.target, n.meta, weights):
                known[n.id] = numel(n.meta) if weights else 0
                continue
        metas = [i.meta for i in inputs]
        key = (n.target, id(n.meta), *map(id, metas))
        entry = memo.get(key)
        if entry is None:  # the metas ride along, so their ids stay theirs while the memo lives
            entry = memo[key] = (_op_cost(n.target, n.meta, metas, cal, static), n.meta, metas)
        total += entry[0]
    return total


def call_inputs(node: Node) -> list:
    """``node.inputs`` (distinct nodes read, in order), fast for the usual flat arguments: graphs
    of 50,000 nodes are costed several times per optimization."""
    out, seen = [], set()
    for a in (*node.args, *node.kwargs.values()):
        if isinstance(a, Node):
            if a.id not in seen:
                seen.add(a.id)
                out.append(a)
        elif isinstance(a, (list, tuple, dict)):
            for n in iter_instances(a, Node):
                if n.id not in seen:
                    seen.add(n.id)
                    out.append(n)
    return out

