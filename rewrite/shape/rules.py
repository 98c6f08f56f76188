"""Hand-written shape rules: one small function per op family, registered in one table.

A rule gets the op's arguments bound by name (``a.self``, ``a.dim``...; tensors are `TensorMeta`,
sizes are sympy expressions) and returns the output meta. Rules exist where they give simpler
expressions than torch's meta kernels (``s0*s1`` rather than ``FloorDiv(64*s0*s1, 64)``) or where
they avoid building FakeTensors; every other op goes to its meta kernel (`meta_kernels.py`). A rule
that cannot decide something (a size that might or might not be 1) raises `NoRule`, and the meta
kernel answers instead.
"""
from __future__ import annotations

import math
import operator

import sympy
import torch
from torch._prims_common import get_computation_dtype
from torch.utils._sympy.functions import FloorDiv, Mod

from .. import ops
from ..ir import SymMeta, TensorMeta, iter_instances
from .context import ShapeContext, ShapeInferenceError, to_expr
from .meta_kernels import probe_dtype

__all__ = ["NoRule", "RULES", "SCALAR_RULES", "elementwise", "bind", "broadcast"]

aten = torch.ops.aten


class NoRule(Exception):
    """This rule cannot decide; ask the meta kernel."""


class Args:
    """An op's arguments by schema name (defaults filled in)."""

    def __init__(self, values: dict):
        self.__dict__.update(values)


def bind(target: torch._ops.OpOverload, args, kwargs) -> Args:
    """Bind positional and keyword arguments to the schema's names, filling in defaults."""
    try:
        return Args(ops.bind_arguments(target, args, kwargs))
    except ops.OpError as e:
        raise ShapeInferenceError(str(e)) from None


# -- small helpers ---------------------------------------------------------------------------

def size(v):
    """A size argument (int, SymMeta or sympy expression) as a sympy expression."""
    if isinstance(v, SymMeta):
        return to_expr(v.expr)
    if isinstance(v, TensorMeta):
        raise NoRule  # a size given as a tensor: only the kernel knows
    return to_expr(v)


def sizes(values) -> tuple:
    if isinstance(values, (SymMeta, int)) or hasattr(values, "is_Integer"):
        values = [values]
    return tuple(size(v) for v in values)


def norm_dim(d, rank: int, op: str = "") -> int:
    d = int(size(d))
    r = max(rank, 1)
    if not -r <= d < r:
        raise ShapeInferenceError(f"{op}: dimension {d} is out of range for a tensor of rank {rank} "
                                  f"(allowed {-r}..{r - 1})")
    return d % r


def norm_dims(dims, rank: int, op: str = "") -> list[int]:
    if dims is None:
        return list(range(rank))
    if isinstance(dims, (int, SymMeta)):
        dims = [dims]
    return sorted({norm_dim(d, rank, op) for d in dims})


def prod(exprs) -> sympy.Expr:
    return sympy.Mul(*exprs) if exprs else sympy.Integer(1)


def same(x: TensorMeta, shape=None, dtype=None, device=None) -> TensorMeta:
    return TensorMeta(dtype or x.dtype, tuple(x.shape if shape is None else shape), device or x.device)


def exact_div(ctx: ShapeContext, num, den, op: str = "") -> sympy.Expr:
    """``num / den`` for sizes known to divide (view's -1): a clean quotient when sympy finds one."""
    if num.is_Integer and den.is_Integer:
        if num % den:
            raise ShapeInferenceError(f"{op}: {num} elements do not divide into parts of {den} (the -1 size)")
        return sympy.Integer(num // den)
    q = sympy.cancel(num / den)
    if sympy.fraction(q)[1] == 1:
        return ctx.simplify(sympy.expand(q))
    return FloorDiv(num, den)


def broadcast(ctx: ShapeContext, shapes, op: str = "") -> tuple:
    """NumPy broadcasting of symbolic shapes. A pair of sizes where either might be 1 becomes
    ``Max(a, b)``: that is what broadcasting computes whenever the op is valid."""
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for i in range(rank):
        dims = [s[len(s) - rank + i] for s in shapes if len(s) - rank + i >= 0]
        result = dims[0]
        for d in dims[1:]:
            result = _broadcast_pair(ctx, result, d, op)
        out.append(result)
    return tuple(out)


def _broadcast_pair(ctx: ShapeContext, a, b, op: str):
    a, b = to_expr(a), to_expr(b)
    if a == b or ctx.equal(b, 1) is True:
        return a
    if ctx.equal(a, 1) is True:
        return b
    if ctx.equal(a, b) is True:
        return a
    a_not_1, b_not_1 = ctx.truth(sympy.Ne(a, 1)), ctx.truth(sympy.Ne(b, 1))
    if a_not_1 and b_not_1 and ctx.equal(a, b) is False:
        raise ShapeInferenceError(f"{op}: sizes {a} and {b} cannot be broadcast together (neither is 1)")
    # A size that is not 1 is the result: the other one must be 1 or equal to it (torch guards the same).
    if a_not_1:
        return a
    if b_not_1:
        return b
    return ctx.simplify(sympy.Max(a, b))


def _device(args, kwargs):
    dev = kwargs.get("device")
    if dev is not None:
        return torch.device(dev)
    tensors = list(iter_instances((args, kwargs), TensorMeta))
    for t in tensors:
        if t.shape is None or len(t.shape) > 0:
            return t.device
    return tensors[0].device if tensors else torch.device("cpu")


def _reduction_dtype(x: TensorMeta, dtype, integer_to_long: bool):
    if dtype is not None:
        return dtype
    if integer_to_long and (not x.dtype.is_floating_point and not x.dtype.is_complex):
        return torch.int64
    return x.dtype


# -- elementwise -----------------------------------------------------------------------------

def elementwise(ctx: ShapeContext, target, args, kwargs):
    """Pointwise ops (`ops.is_pointwise`): the output shape is the broadcast of the tensor inputs."""
    tensors = list(iter_instances((args, kwargs), TensorMeta))
    if not tensors:
        raise NoRule
    shape = broadcast(ctx, [t.shape for t in tensors], str(target))
    probe = probe_dtype(target, args, kwargs)
    device = _device(args, kwargs)
    if isinstance(probe, (tuple, list)):
        return tuple(TensorMeta(p.dtype, shape, device) for p in probe)
    return TensorMeta(probe.dtype, shape, device)


# -- views and layout ------------------------------------------------------------------------

def reshape(ctx, a: Args, op):
    x = a.self
    new = list(sizes(a.size if hasattr(a, "size") else a.shape))  # view says size, reshape says shape
    numel = prod(x.shape)
    holes = [i for i, s in enumerate(new) if s == -1]
    if len(holes) > 1:
        raise ShapeInferenceError(f"{op}: only one dimension can be -1, got shape {new}")
    if holes:
        known = prod(s for i, s in enumerate(new) if i != holes[0])
        if ctx.equal(known, 0) is True:
            raise ShapeInferenceError(f"{op}: cannot infer -1 in shape {new} for a tensor of {numel} elements")
        new[holes[0]] = exact_div(ctx, numel, known, op)
    elif ctx.equal(prod(new), numel) is False:
        raise ShapeInferenceError(f"{op}: shape {new} is invalid for a tensor of shape {list(x.shape)} ({numel} elements)")
    return same(x, new)


def permute(ctx, a, op):
    x = a.self
    dims = [norm_dim(d, x.rank, op) for d in a.dims]
    if sorted(dims) != list(range(x.rank)):
        raise ShapeInferenceError(f"{op}: dims {list(a.dims)} are not a permutation of 0..{x.rank - 1}")
    return same(x, [x.shape[d] for d in dims])


def transpose(ctx, a, op):
    x = a.self
    shape = list(x.shape)
    if x.rank == 0:
        return same(x)
    d0, d1 = norm_dim(a.dim0, x.rank, op), norm_dim(a.dim1, x.rank, op)
    shape[d0], shape[d1] = shape[d1], shape[d0]
    return same(x, shape)


def t(ctx, a, op):
    x = a.self
    if x.rank > 2:
        raise ShapeInferenceError(f"{op}: expects a tensor of rank <= 2, got rank {x.rank}")
    return same(x, x.shape[::-1])


def expand(ctx, a, op):
    x = a.self
    new = list(sizes(a.size))
    if len(new) < x.rank:
        raise ShapeInferenceError(f"{op}: cannot expand rank {x.rank} to {len(new)} sizes {new}")
    lead = len(new) - x.rank
    out = []
    for i, s in enumerate(new):
        if i < lead:
            out.append(s)
            continue
        old = x.shape[i - lead]
        if s == -1 or ctx.equal(s, old) is True:
            out.append(old)
        elif ctx.equal(old, 1) is True:
            out.append(s)
        elif ctx.equal(old, s) is False and ctx.truth(sympy.Ne(old, 1)):
            raise ShapeInferenceError(f"{op}: size {old} at dimension {i - lead} cannot expand to {s}")
        else:
            out.append(s)  # valid only when old is 1 or equal to s: either way the result is s
    return same(x, out)


def unsqueeze(ctx, a, op):
    x = a.self
    d = norm_dim(a.dim, x.rank + 1, op)
    shape = list(x.shape)
    shape.insert(d, sympy.Integer(1))
    return same(x, shape)


def squeeze(ctx, a, op):
    x = a.self
    if hasattr(a, "dims"):  # squeeze.dims
        dims = norm_dims(a.dims, x.rank, op)
    elif hasattr(a, "dim"):  # squeeze.dim
        dims = norm_dims(a.dim, x.rank, op)
    else:  # squeeze.default: every size-1 dimension
        dims = list(range(x.rank))
    out = []
    for i, s in enumerate(x.shape):
        if i in dims:
            is_one = ctx.equal(s, 1)
            if is_one is None:
                raise NoRule
            if is_one:
                continue
        out.append(s)
    return same(x, out)


def cat(ctx, a, op):
    tensors = [t for t in a.tensors if not (t.rank == 1 and ctx.equal(t.shape[0], 0) is True)]
    if not tensors:
        return same(a.tensors[0])
    first = tensors[0]
    d = norm_dim(a.dim, first.rank, op)
    for t_ in tensors[1:]:
        if t_.rank != first.rank:
            raise ShapeInferenceError(f"{op}: tensors have ranks {first.rank} and {t_.rank}; cat needs equal ranks")
    shape = list(first.shape)
    shape[d] = ctx.simplify(sum((t_.shape[d] for t_ in tensors), sympy.Integer(0)))
    dtype = first.dtype
    for t_ in tensors[1:]:
        dtype = torch.promote_types(dtype, t_.dtype)
    return same(first, shape, dtype=dtype)


def constant_pad_nd(ctx, a, op):
    """``pad`` holds (before, after) pairs starting from the last dimension; pads may be negative."""
    x = a.self
    pad = sizes(a.pad)
    if len(pad) % 2 or len(pad) // 2 > x.rank:
        raise ShapeInferenceError(f"{op}: pad {list(pad)} must hold (before, after) pairs for at most {x.rank} dimensions")
    shape = list(x.shape)
    for i in range(len(pad) // 2):
        d = x.rank - 1 - i
        shape[d] = ctx.simplify(shape[d] + pad[2 * i] + pad[2 * i + 1])
    return same(x, shape)


_END_SENTINEL = 2 ** 62  # slice ends at or above this mean "to the end" (Python's x[a:])


def _clamp_index(ctx, i, n, default):
    """Python-style slice bound: None -> default, negative literals wrap, clamp into [0, n]."""
    if i is None:
        return default
    i = size(i)
    if i.is_Integer and i >= _END_SENTINEL:  # x[a:] is traced as slice(x, d, a, INT64_MAX)
        return n
    if i.is_Integer and i < 0:
        i = n + i
        return ctx.simplify(sympy.Max(i, 0))
    return ctx.simplify(sympy.Min(i, n))


def slice_(ctx, a, op):
    x = a.self
    d = norm_dim(a.dim, x.rank, op)
    n = x.shape[d]
    step = size(a.step)
    if not step.is_Integer or step <= 0:
        raise NoRule
    start = _clamp_index(ctx, a.start, n, sympy.Integer(0))
    end = _clamp_index(ctx, a.end, n, n)
    length = ctx.simplify(sympy.Max(end - start, 0))
    if step != 1:
        length = ctx.simplify(FloorDiv(length + step - 1, step))
    shape = list(x.shape)
    shape[d] = length
    return same(x, shape)


def select(ctx, a, op):
    x = a.self
    d = norm_dim(a.dim, x.rank, op)
    return same(x, x.shape[:d] + x.shape[d + 1:])


def index_select(ctx, a, op):
    x = a.self
    d = norm_dim(a.dim, x.rank, op)
    shape = list(x.shape)
    if x.rank:
        shape[d] = prod(a.index.shape)
    return same(x, shape)


def gather(ctx, a, op):
    return same(a.self, a.index.shape)


def embedding(ctx, a, op):
    w, idx = a.weight, a.indices
    if w.rank != 2:
        raise ShapeInferenceError(f"{op}: weight must have rank 2, got {list(w.shape)}")
    return TensorMeta(w.dtype, tuple(idx.shape) + (w.shape[1],), w.device)


# -- normalization ---------------------------------------------------------------------------

def softmax(ctx, a, op):
    x = a.self
    norm_dim(a.dim, x.rank, op)
    dtype = getattr(a, "dtype", None)
    if getattr(a, "half_to_float", False):
        dtype = torch.float32
    return same(x, dtype=dtype)


def native_layer_norm(ctx, a, op):
    x = a.input
    k = len(a.normalized_shape)
    if k > x.rank:
        raise ShapeInferenceError(f"{op}: normalized_shape {list(a.normalized_shape)} is longer than the input rank {x.rank}")
    stat_shape = tuple(x.shape[: x.rank - k]) + (sympy.Integer(1),) * k
    stat_dtype = x.dtype if x.device.type == "cpu" else get_computation_dtype(x.dtype)
    return same(x), same(x, stat_shape, dtype=stat_dtype), same(x, stat_shape, dtype=stat_dtype)


# -- reductions ------------------------------------------------------------------------------

def _reduced_shape(x: TensorMeta, dims, keepdim: bool) -> list:
    out = []
    for i, s in enumerate(x.shape):
        if i in dims:
            if keepdim:
                out.append(sympy.Integer(1))
        else:
            out.append(s)
    return out


def _reduce_dims(x, dim, op):
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return list(range(x.rank))
    return norm_dims(dim, x.rank, op)


def sum_like(ctx, a, op):
    x = a.self
    dims = _reduce_dims(x, getattr(a, "dim", None), op)
    return same(x, _reduced_shape(x, dims, getattr(a, "keepdim", False)),
                dtype=_reduction_dtype(x, getattr(a, "dtype", None), integer_to_long=True))


def mean_like(ctx, a, op):
    x = a.self
    dims = _reduce_dims(x, getattr(a, "dim", None), op)
    return same(x, _reduced_shape(x, dims, getattr(a, "keepdim", False)), dtype=getattr(a, "dtype", None))


def var_like(ctx, a, op):
    x = a.self
    dims = _reduce_dims(x, getattr(a, "dim", None), op)
    dtype = x.dtype.to_real() if x.dtype.is_complex else x.dtype
    return same(x, _reduced_shape(x, dims, getattr(a, "keepdim", False)), dtype=dtype)


def minmax_like(ctx, a, op):
    x = a.self
    dims = _reduce_dims(x, getattr(a, "dim", None), op)
    return same(x, _reduced_shape(x, dims, getattr(a, "keepdim", False)))


def any_like(ctx, a, op):
    x = a.self
    dims = _reduce_dims(x, getattr(a, "dim", None), op)
    dtype = torch.uint8 if x.dtype == torch.uint8 else torch.bool
    return same(x, _reduced_shape(x, dims, getattr(a, "keepdim", False)), dtype=dtype)


def arg_like(ctx, a, op):
    x = a.self
    if a.dim is None:  # index into the flattened tensor
        shape = [sympy.Integer(1)] * x.rank if a.keepdim else []
    else:
        shape = _reduced_shape(x, [norm_dim(a.dim, x.rank, op)], a.keepdim)
    return same(x, shape, dtype=torch.int64)


def max_dim(ctx, a, op):
    x = a.self
    dims = _reduce_dims(x, a.dim, op)
    shape = _reduced_shape(x, dims, a.keepdim)
    return same(x, shape), same(x, shape, dtype=torch.int64)


# -- matrix products -------------------------------------------------------------------------

def _check_inner(ctx, k1, k2, op, a_shape, b_shape):
    if ctx.equal(k1, k2) is False:
        raise ShapeInferenceError(f"{op}: inner sizes differ: {list(a_shape)} @ {list(b_shape)}")


def mm(ctx, a, op):
    x, y = a.self, a.mat2
    if x.rank != 2 or y.rank != 2:
        raise ShapeInferenceError(f"{op}: needs two matrices, got shapes {list(x.shape)} and {list(y.shape)}")
    _check_inner(ctx, x.shape[1], y.shape[0], op, x.shape, y.shape)
    return same(x, (x.shape[0], y.shape[1]))


def bmm(ctx, a, op):
    x, y = a.self, a.mat2
    if x.rank != 3 or y.rank != 3:
        raise ShapeInferenceError(f"{op}: needs two rank-3 tensors, got shapes {list(x.shape)} and {list(y.shape)}")
    _check_inner(ctx, x.shape[2], y.shape[1], op, x.shape, y.shape)
    return same(x, (x.shape[0], x.shape[1], y.shape[2]))


def _check_bias(ctx, bias: TensorMeta, out: tuple, op):
    """The added term must broadcast to the product's shape (it does not change it)."""
    if len(bias.shape) > len(out):
        raise ShapeInferenceError(f"{op}: the added tensor {list(bias.shape)} has more dimensions than the product {list(out)}")
    broadcast(ctx, [bias.shape, out], op)


def addmm(ctx, a, op):
    x, y = a.mat1, a.mat2
    _check_inner(ctx, x.shape[1], y.shape[0], op, x.shape, y.shape)
    out = (x.shape[0], y.shape[1])
    _check_bias(ctx, a.self, out, op)
    return same(x, out)


def baddbmm(ctx, a, op):
    x, y = a.batch1, a.batch2
    _check_inner(ctx, x.shape[2], y.shape[1], op, x.shape, y.shape)
    out = (x.shape[0], x.shape[1], y.shape[2])
    _check_bias(ctx, a.self, out, op)
    return same(x, out)


def matmul(ctx, a, op):
    x, y = a.self, a.other
    if x.rank == 0 or y.rank == 0:
        raise ShapeInferenceError(f"{op}: both arguments need rank >= 1, got {list(x.shape)} and {list(y.shape)}")
    xs, ys = list(x.shape), list(y.shape)
    if x.rank == 1 and y.rank == 1:
        _check_inner(ctx, xs[0], ys[0], op, xs, ys)
        return same(x, ())
    if x.rank == 1:
        _check_inner(ctx, xs[0], ys[-2], op, xs, ys)
        return same(x, ys[:-2] + ys[-1:])
    if y.rank == 1:
        _check_inner(ctx, xs[-1], ys[0], op, xs, ys)
        return same(x, xs[:-1])
    _check_inner(ctx, xs[-1], ys[-2], op, xs, ys)
    batch = broadcast(ctx, [xs[:-2], ys[:-2]], op)
    return same(x, list(batch) + [xs[-2], ys[-1]])


# -- copies and factories --------------------------------------------------------------------

def like(ctx, a, op):
    x = a.self
    dev = getattr(a, "device", None)
    return same(x, dtype=getattr(a, "dtype", None), device=torch.device(dev) if dev is not None else None)


def _factory_dtype(a, fill=None):
    dtype = getattr(a, "dtype", None)
    if dtype is not None:
        return dtype
    if fill is not None:
        if isinstance(fill, SymMeta):
            fill = fill.pytype(1)
        if isinstance(fill, bool):
            return torch.bool
        if isinstance(fill, int):
            return torch.int64
    return torch.get_default_dtype()


def _factory_device(a):
    dev = getattr(a, "device", None)
    return torch.device(dev) if dev is not None else torch.device("cpu")


def full(ctx, a, op):
    return TensorMeta(_factory_dtype(a, a.fill_value), sizes(a.size), _factory_device(a))


def factory(ctx, a, op):
    return TensorMeta(_factory_dtype(a), sizes(a.size), _factory_device(a))


def new_factory(ctx, a, op):
    x = a.self
    dev = getattr(a, "device", None)
    return TensorMeta(getattr(a, "dtype", None) or x.dtype, sizes(a.size), torch.device(dev) if dev else x.device)


def scalar_tensor(ctx, a, op):
    return TensorMeta(_factory_dtype(a), (), _factory_device(a))


def arange(ctx, a, op):
    start = getattr(a, "start", 0)
    step = getattr(a, "step", 1)
    values = [v.expr if isinstance(v, SymMeta) else v for v in (start, a.end, step)]
    is_float = any(isinstance(v, float) or (isinstance(v, SymMeta) and v.pytype is float)
                   for v in (start, a.end, step))
    start_e, end_e, step_e = (to_expr(v) for v in values)
    if not step_e.is_Number or step_e == 0:
        raise NoRule
    if is_float:
        length = sympy.ceiling((end_e - start_e) / step_e)
    elif step_e > 0:
        length = FloorDiv(end_e - start_e + step_e - 1, step_e) if step_e != 1 else end_e - start_e
    else:
        length = FloorDiv(start_e - end_e - step_e - 1, -step_e)
    length = ctx.simplify(sympy.Max(length, 0))
    dtype = getattr(a, "dtype", None) or (torch.get_default_dtype() if is_float else torch.int64)
    return TensorMeta(dtype, (length,), _factory_device(a))


def split_with_sizes(ctx, a, op):
    x = a.self
    d = norm_dim(a.dim, x.rank, op)
    parts = sizes(a.split_sizes)
    if ctx.equal(sum(parts, sympy.Integer(0)), x.shape[d]) is False:
        raise ShapeInferenceError(f"{op}: split sizes {list(parts)} do not add up to size {x.shape[d]} of dimension {d}")
    return tuple(same(x, x.shape[:d] + (p,) + x.shape[d + 1:]) for p in parts)


def split(ctx, a, op):
    x = a.self
    d = norm_dim(a.dim, x.rank, op)
    n, chunk = x.shape[d], size(a.split_size)
    if not (to_expr(n).is_Integer and chunk.is_Integer) or chunk <= 0:
        raise NoRule  # the number of outputs depends on a symbolic size
    n, chunk = int(n), int(chunk)
    count = max(1, -(-n // chunk))
    return tuple(same(x, x.shape[:d] + (sympy.Integer(min(chunk, n - i * chunk)),) + x.shape[d + 1:])
                 for i in range(count))


def sdpa(ctx, a, op):
    """Attention output: the query's shape with the value's last size."""
    q, v = a.query, a.value
    return same(q, q.shape[:-1] + v.shape[-1:])


def sdpa_flash_cpu(ctx, a, op):
    """(output, logsumexp): logsumexp is float32 per (batch, head, query position)."""
    q, v = a.query, a.value
    out = same(q, q.shape[:-1] + v.shape[-1:])
    return out, TensorMeta(torch.float32, q.shape[:-1], q.device)


# -- sizes read off tensors ------------------------------------------------------------------

def sym_size(ctx, a, op):
    x = a.self
    return SymMeta(x.shape[norm_dim(a.dim, x.rank, op)], int)


def sym_numel(ctx, a, op):
    return SymMeta(ctx.simplify(prod(a.self.shape)), int)


def shape_as_tensor(ctx, a, op):
    """GE's Shape op: the sizes as an int64 vector (on the CPU, like torch's)."""
    return TensorMeta(torch.int64, (sympy.Integer(a.self.rank),), torch.device("cpu"))


def assert_scalar(ctx, a, op):
    """Dynamo's runtime shape assertions: no output; one that is decided false is an error now."""
    cond = a.self
    value = to_expr(cond.expr if isinstance(cond, SymMeta) else cond)
    if value == sympy.false or (value.is_Number and value == 0):
        raise ShapeInferenceError(f"a shape assertion is false for these sizes: {a.assert_msg}")
    return None


# Op family -> its rule; single ops after the families.
RULES = ops.family_table(
    (ops.RESHAPES, reshape),
    (ops.PERMUTES, permute),
    (ops.TRANSPOSES, transpose),
    (ops.MATRIX_TRANSPOSES, t),
    (ops.EXPANDS, expand),
    (ops.UNSQUEEZES, unsqueeze),
    (ops.SQUEEZES, squeeze),
    (ops.SLICES, slice_),
    (ops.SELECTS, select),
    (ops.SPLITS, split),
    (ops.SPLITS_WITH_SIZES, split_with_sizes),
    (ops.SOFTMAXES, softmax),
    (ops.LAYER_NORMS, native_layer_norm),
    (ops.SUMS, sum_like),
    (ops.MEANS, mean_like),
    (ops.VARIANCES, var_like),
    (ops.MIN_MAX, minmax_like),
    (ops.ANY_ALL, any_like),
    (ops.ARG_REDUCTIONS, arg_like),
    (ops.MAX_MIN_DIM, max_dim),
    (ops.ALIASES | ops.COPIES | ops.LIKE_FACTORIES, like),
    (ops.FULLS, full),
    (ops.FACTORIES, factory),
    (ops.NEW_FACTORIES, new_factory),
    (ops.SCALAR_TENSORS, scalar_tensor),
    (ops.RANGES, arange),
    ({aten.cat.default}, cat),
    ({aten.constant_pad_nd.default}, constant_pad_nd),
    ({aten.index_select.default}, index_select),
    ({aten.gather.default}, gather),
    ({aten.embedding.default}, embedding),
    ({aten.mm.default}, mm),
    ({aten.bmm.default}, bmm),
    ({aten.addmm.default}, addmm),
    ({aten.baddbmm.default}, baddbmm),
    ({aten.matmul.default}, matmul),
    ({aten.scaled_dot_product_attention.default}, sdpa),
    ({aten._scaled_dot_product_flash_attention_for_cpu.default}, sdpa_flash_cpu),
    ({aten._assert_scalar.default}, assert_scalar),
    ({aten._shape_as_tensor.default}, shape_as_tensor),
    ({aten.sym_size.int}, sym_size),
    ({aten.sym_numel.default}, sym_numel),
)


# -- Python arithmetic on sizes (operator.mul(%s0, 4) ...) -------------------------------------

def _num(v):
    if isinstance(v, SymMeta):
        return to_expr(v.expr), v.pytype
    if isinstance(v, bool):
        return to_expr(v), bool
    if isinstance(v, (int, float)):
        return to_expr(v), type(v)
    raise NoRule


def _arith(fn, result_type=None):
    def rule(ctx, args):
        values = [_num(v) for v in args]
        exprs = [e for e, _ in values]
        types = [t_ for _, t_ in values]
        pytype = result_type or (float if float in types else int)
        return SymMeta(ctx.simplify(fn(*exprs)), pytype)
    return rule


def _floordiv(a, b):
    return FloorDiv(a, b) if a.is_integer and b.is_integer else sympy.floor(a / b)


_sum = _arith(sympy.Add)

SCALAR_RULES = {
    # Python's operators compute on sympy expressions as they do on numbers.
    **{fn: _arith(fn) for fn in (operator.add, operator.sub, operator.mul, operator.neg, operator.pow)},
    **{fn: _arith(relation, bool) for fn, relation in ((operator.eq, sympy.Eq), (operator.ne, sympy.Ne),
                                                      (operator.lt, sympy.Lt), (operator.le, sympy.Le),
                                                      (operator.gt, sympy.Gt), (operator.ge, sympy.Ge))},
    operator.floordiv: _arith(_floordiv),
    operator.mod: _arith(Mod),
    operator.truediv: _arith(operator.truediv, float),
    torch.sym_max: _arith(sympy.Max),
    torch.sym_min: _arith(sympy.Min),
    torch.sym_sum: lambda ctx, args: _sum(ctx, tuple(args[0])),  # one argument: the list of terms
    torch.sym_float: _arith(lambda a: a, float),
    torch.sym_int: _arith(lambda a: sympy.floor(a) if not a.is_integer else a, int),
    torch.sym_not: _arith(sympy.Not, bool),
    math.floor: _arith(sympy.floor, int),
    math.ceil: _arith(sympy.ceiling, int),
}
