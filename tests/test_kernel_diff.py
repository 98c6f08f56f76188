"""Differential checker for static kernels: random signatures of every op family the C generator
knows, built and run through the project's own path, compared with the ATen op.

Each case is one ATen call on random tensors: sizes including 1 and 0, non-contiguous layouts
(permuted, sliced with steps and offsets, expanded with stride 0), broadcasting, mixed float32 /
float64 operands (0-dim tensors too), and special values (NaN, +-inf, -0.0, denormals, values
near the dtype's limits, magnitudes that overflow naive formulas). A batch of cases becomes one
graph whose outputs are every case's result; it goes the way a tier-up goes: observed run
(`observe`), plan with `StaticKernels.decide` (signature recording, the generator's probe),
`StaticKernels.build` (one C compile, the signed artifact, loading), `PlannedExecutable` (pointer
tables, native runs). Its results are compared with the graph's plain ATen code, per case, with a
tolerance that fits the op and dtype; NaN positions must agree, and ops that only move values
must agree bit for bit.

``REWRITE_KERNEL_DIFF_CASES`` cases (default 500, about 20 s here; `make fuzz` runs 3000), seeded by
``REWRITE_KERNEL_DIFF_SEED`` (default 0); case k is drawn from (seed, k) alone, so a failure names
the case that reproduces it. Bugs this checker found stay below as fixed regression examples.
"""
from __future__ import annotations

import json
import math
import os
import random
from collections import Counter

import pytest
import torch

import rewrite
from rewrite.exec.codegen import compile_graph_to_python
from rewrite.exec.memory import ArenaPool
from rewrite.exec.observe import observe
from rewrite.exec.plan import make_plan
from rewrite.exec.planned import PlannedExecutable
from rewrite.ir import Graph, meta_of_value
from rewrite.kernels import PACK_MIN, StaticKernels, compiler
from rewrite.unit import CompileUnit

aten = torch.ops.aten
CASES = int(os.environ.get("REWRITE_KERNEL_DIFF_CASES", "500"))
SEED = int(os.environ.get("REWRITE_KERNEL_DIFF_SEED", "0"))
BATCH = 200  # cases per graph: one C compile each

pytestmark = pytest.mark.skipif(not compiler.compiler_available(), reason="static kernels need a C compiler")


# -- cases ---------------------------------------------------------------------------------------------------

class Weight:
    """A constant [N, K] weight the case reads as ``aten.t`` of it (the layout MKL's packed GEMM takes)."""

    def __init__(self, value: torch.Tensor):
        self.value = value


class Case:
    """One ATen call: ``op(*args, **kwargs)``; tensors (and lists of them, and `Weight`s) become graph inputs."""

    def __init__(self, family: str, op, args: tuple, kwargs: dict | None = None, exact: bool = False):
        self.family, self.op, self.args, self.kwargs = family, op, args, kwargs or {}
        self.exact = exact  # the kernel only moves or selects values: bitwise equal to ATen (-0.0 included)
        # ATen's maximum/minimum pick either zero on a tie of -0.0 and 0.0, by the element's position in
        # its vector loop (measured: 16 of 17 elements take the second operand, the tail the first)
        self.signed_zero = exact and family not in ("maximum", "minimum")
        self.label = ""

    def describe(self) -> str:
        def show(v):
            if isinstance(v, torch.Tensor):
                return f"{str(v.dtype)[6:]}{list(v.shape)}@{list(v.stride())}"
            if isinstance(v, Weight):
                return f"t(const {str(v.value.dtype)[6:]}{list(v.value.shape)})"
            if isinstance(v, list):
                return "[" + ", ".join(show(x) for x in v) + "]"
            return repr(v)
        parts = [show(a) for a in self.args] + [f"{k}={show(v)}" for k, v in self.kwargs.items()]
        return f"{self.op}({', '.join(parts)})"


_SPECIAL32 = [math.nan, math.inf, -math.inf, -0.0, 0.0, 3.0e38, -3.0e38, 1e-45, 1e-40, 1.2e-38, 88.7, -88.7, 104.0,
              -104.0, 1e10, -1e10, 1.0, -1.0, 0.5, 1e-7]
_SPECIAL64 = _SPECIAL32 + [1.7e308, -1.7e308, 5e-324, 1e-310, 710.0, -745.0]
_DIMS = [1, 1, 2, 3, 4, 5, 7, 8, 16, 17, 33]


def _dtype(rng, mixed: float = 0.25) -> torch.dtype:
    return torch.float64 if rng.random() < mixed else torch.float32


def _shape(rng, rank: int | None = None, zero: float = 0.03, big: float = 0.03) -> list:
    """Sizes with many 1s, now and then a 0, now and then enough elements for the threaded loops."""
    if rng.random() < big:
        return rng.choice([[70, 500], [3, 130, 90], [33000], [2, 4, 64, 72]])
    rank = rng.choice([0, 1, 2, 2, 3, 3, 4]) if rank is None else rank
    shape = [rng.choice(_DIMS) for _ in range(rank)]
    if shape and rng.random() < zero:
        shape[rng.randrange(rank)] = 0
    return shape


def _values(rng, shape, dtype, *, scale=None, positive=False, special=0.15) -> torch.Tensor:
    g = torch.Generator().manual_seed(rng.getrandbits(62))
    scale = rng.choice([1.0, 1.0, 1.0, 1e-3, 30.0, 1e4]) if scale is None else scale
    t = torch.randn(shape, generator=g, dtype=torch.float64) * scale
    if positive:
        t = t.abs() + 1e-3
    t = t.to(dtype)
    if t.numel() and rng.random() < special:
        flat = t.view(-1)
        pool = _SPECIAL64 if dtype == torch.float64 else _SPECIAL32
        for _ in range(rng.randint(1, max(1, min(8, t.numel())))):
            flat[rng.randrange(t.numel())] = rng.choice(pool)
    return t


def _layout(rng, t: torch.Tensor, p_strided: float = 0.4) -> torch.Tensor:
    """``t``'s values in a random layout: contiguous, permuted, sliced with steps and an offset."""
    if t.dim() == 0 or rng.random() > p_strided:
        return t
    how = rng.choice(["permute", "slice", "both"])
    out = t
    if how in ("permute", "both") and t.dim() >= 2:
        perm = list(range(t.dim()))
        rng.shuffle(perm)
        inverse = [perm.index(d) for d in range(t.dim())]
        out = out.permute(perm).contiguous().permute(inverse)  # same values, strides in another order
    if how in ("slice", "both"):
        steps = [rng.choice([1, 1, 2, 3]) for _ in range(t.dim())]
        big = torch.zeros([max(s * st + rng.randint(0, 2), 1) for s, st in zip(t.shape, steps)], dtype=t.dtype)
        view = big[tuple(slice(rng.randint(0, max(0, b - s * st)), None, st) for b, s, st
                         in zip(big.shape, t.shape, steps))]
        view = view[tuple(slice(0, s) for s in t.shape)]
        view.copy_(out)
        out = view
    return out


def _operand(rng, out_shape: list, dtype, **kw) -> torch.Tensor:
    """An operand broadcast to ``out_shape``: fewer leading dims, size-1 dims, or expanded (stride 0)."""
    shape = list(out_shape)
    r = rng.random()
    if r < 0.15 and shape:
        shape = shape[rng.randint(1, len(shape)):]  # fewer dims
    elif r < 0.35:
        shape = [1 if rng.random() < 0.4 else s for s in shape]
    t = _layout(rng, _values(rng, shape, dtype, **kw))
    if rng.random() < 0.1 and shape != list(out_shape):
        t = t.expand(out_shape)  # stride 0 in the operand itself
    return t


def _scalar(rng, kind: str = "value"):
    if kind == "alpha":
        return rng.choice([1, 1, 2, -0.5, 0.0, 3, 1e-3])
    values = [0.5, 2.0, -1.5, 0.0, -0.0, 1, 3, 1e-3, 1e30, -1e30, math.inf, -math.inf, math.nan, 0.1, 1e-40]
    return rng.choice(values + ([] if kind == "no bool" else [True]))  # ATen refuses to subtract a bool


_UNARY = {  # op -> keyword arguments for _values
    "exp": {}, "log": {"positive": 0.8}, "tanh": {}, "sin": {}, "cos": {}, "erf": {}, "expm1": {},
    "log1p": {"positive": 0.8}, "sqrt": {"positive": 0.8}, "abs": {}, "neg": {}, "reciprocal": {},
    "rsqrt": {"positive": 0.8}, "sigmoid": {}, "silu": {}, "relu": {},
}
_EXACT_UNARY = {"abs", "neg", "relu"}
_BINARY = ["add", "sub", "rsub", "mul", "div"]
_COMPARE = ["eq", "ne", "lt", "le", "gt", "ge"]


def _unary(rng) -> Case:
    name = rng.choice(list(_UNARY))
    kw = dict(_UNARY[name])
    positive = kw.pop("positive", 0) > rng.random()
    x = _layout(rng, _values(rng, _shape(rng), _dtype(rng), positive=positive))
    return Case(f"unary.{name}", getattr(aten, name).default, (x,), exact=name in _EXACT_UNARY)


def _binary(rng) -> Case:
    name = rng.choice(_BINARY + ["maximum", "minimum", "pow"])
    shape = _shape(rng)
    x = _operand(rng, shape, _dtype(rng), positive=name == "pow")
    scalar = name not in ("maximum", "minimum") and rng.random() < 0.35
    if name == "pow":
        if scalar:
            e = rng.choice([2, 3, 1, 0.5, -1, -2, -0.5, 0, 1.7, -3, 2.5, math.nan, math.inf])
            return Case("pow.Tensor_Scalar", aten.pow.Tensor_Scalar, (x, e))
        y = _operand(rng, shape, _dtype(rng), scale=2.0)
        return Case("pow.Tensor_Tensor", aten.pow.Tensor_Tensor, (x, y))
    if scalar:
        other = _scalar(rng, "no bool" if name in ("sub", "rsub") else "value")
    else:
        other = _operand(rng, shape, _dtype(rng), positive=name == "div" and rng.random() < .5)
    if rng.random() < 0.15 and not scalar:
        x, other = other, x  # the broadcast operand first
    if name in ("maximum", "minimum"):
        return Case(name, getattr(aten, name).default, (x, other), exact=True)
    op = getattr(getattr(aten, name), "Scalar" if scalar else "Tensor")
    kwargs = {"alpha": _scalar(rng, "alpha")} if name in ("add", "sub", "rsub") and rng.random() < 0.5 else {}
    return Case(f"{name}.{'Scalar' if scalar else 'Tensor'}", op, (x, other), kwargs)


def _compare(rng) -> Case:
    name = rng.choice(_COMPARE)
    shape = _shape(rng)
    x = _values(rng, shape, _dtype(rng), scale=rng.choice([1.0, 1e-3]))
    if rng.random() < 0.35:
        other = rng.choice([_scalar(rng), 0.1, 1 / 3, 16777217])  # values float32 cannot hold exactly
        if x.numel():
            x.view(-1)[:rng.randint(1, x.numel())] = other
        return Case(f"compare.{name}.Scalar", getattr(aten, name).Scalar, (_layout(rng, x), other), exact=True)
    if rng.random() < 0.3:  # an operand equal to x, in the other dtype (promotion decides equality)
        other = _layout(rng, x.to(torch.float64 if x.dtype == torch.float32 else torch.float32))
    elif rng.random() < 0.3:
        # a 0-dim operand does not widen x's dtype: float32 x's 0.1f equals tensor(0.1, float64)
        v = rng.choice([0.1, 1 / 3, 0.0, math.nan, 16777217.0])
        other = torch.tensor(v, dtype=_dtype(rng, 0.5))
        if x.numel():
            x.view(-1)[:rng.randint(1, x.numel())] = v
    else:
        other = _operand(rng, shape, _dtype(rng))
    x = _layout(rng, x)
    if rng.random() < 0.15:
        x, other = other, x
    return Case(f"compare.{name}.Tensor", getattr(aten, name).Tensor, (x, other), exact=True)


def _select(rng) -> Case:
    shape = _shape(rng)
    g = torch.Generator().manual_seed(rng.getrandbits(62))
    if rng.random() < 0.5:
        cond = _layout(rng, torch.rand([1 if rng.random() < .3 else s for s in shape], generator=g) > 0.5)
        x, y = _operand(rng, shape, _dtype(rng)), _operand(rng, shape, _dtype(rng))
        return Case("where", aten.where.self, (cond, x, y), exact=True)
    x = _layout(rng, _values(rng, shape, _dtype(rng)))
    mask = _layout(rng, torch.rand([1 if rng.random() < .3 else s for s in shape], generator=g) > 0.5)
    return Case("masked_fill", aten.masked_fill.Scalar, (x, mask, _scalar(rng)), exact=True)


def _clamps(rng) -> Case:
    x = _layout(rng, _values(rng, _shape(rng), _dtype(rng)))
    lo, hi = sorted([rng.uniform(-2, 2), rng.uniform(-2, 2)])
    if rng.random() < 0.1:
        lo, hi = hi, lo  # min above max: ATen gives max
    if rng.random() < 0.05:
        lo, hi = rng.choice([(math.nan, hi), (lo, math.nan)])  # ATen: all NaN
    name = rng.choice(["clamp", "clamp_min", "clamp_max", "hardtanh", "leaky_relu"])
    if name == "clamp":
        lo, hi = rng.choice([(lo, hi), (None, hi), (lo, None)])
        return Case(name, aten.clamp.default, (x, lo, hi), exact=True)
    if name == "clamp_min":
        return Case(name, aten.clamp_min.default, (x, lo), exact=True)
    if name == "clamp_max":
        return Case(name, aten.clamp_max.default, (x, hi), exact=True)
    if name == "hardtanh":
        return Case(name, aten.hardtanh.default, (x, lo, hi), exact=True)
    return Case(name, aten.leaky_relu.default, (x, rng.choice([0.01, 0.2, -1.0, 0.0])))


def _gelu(rng) -> Case:
    # finite values only: at +-inf and near the float limit ATen's vectorized gelu gives nan/inf where
    # the formula gives a number (see test_static_kernels); everything else of the range is drawn
    x = _layout(rng, _values(rng, _shape(rng), _dtype(rng), special=0.0, scale=rng.choice([1.0, 5.0, 1e3])))
    return Case("gelu", aten.gelu.default, (x,), {"approximate": rng.choice(["none", "tanh"])})


def _copy(rng) -> Case:
    x = _layout(rng, _values(rng, _shape(rng), _dtype(rng)))
    if rng.random() < 0.4:
        fmt = rng.choice([None, torch.contiguous_format, torch.preserve_format])
        return Case("clone", aten.clone.default, (x,), {"memory_format": fmt} if fmt is not None else {}, exact=True)
    if rng.random() < 0.15:  # a copy only where x is not in that layout already (else x itself: no kernel)
        fmt = torch.channels_last if x.dim() == 4 and rng.random() < 0.5 else torch.contiguous_format
        return Case("contiguous", aten.contiguous.default, (x,), {"memory_format": fmt}, exact=True)
    dtype = rng.choice([torch.float32, torch.float64, torch.bool])
    if rng.random() < 0.3:  # a float attention mask: 0 where attended, the dtype's minimum where not
        x = torch.where(x > 0, torch.zeros_like(x), torch.full_like(x, torch.finfo(x.dtype).min))
    exact = dtype == torch.bool or dtype.itemsize >= x.dtype.itemsize
    return Case(f"_to_copy.{str(dtype)[6:]}", aten._to_copy.default, (x,), {"dtype": dtype}, exact=exact)


def _rows_input(rng, dtype, inner: list) -> torch.Tensor:
    outer = _shape(rng, rng.choice([0, 1, 1, 2]), big=0.0)
    if rng.random() < 0.05:
        outer = [200]
    scale = rng.choice([1.0, 1.0, 1e-3, 1e3, 1e15])
    t = _values(rng, outer + inner, dtype, scale=scale, special=0.1)
    if rng.random() < 0.2:
        t = t + rng.choice([1e4, -1e4, 1e6])  # a large mean over a small spread: the naive variance cancels
    return _layout(rng, t, 0.3)


def _layer_norm(rng) -> Case:
    dtype = _dtype(rng)
    inner = [rng.choice(_DIMS)] if rng.random() < 0.7 else [rng.choice([2, 3, 4]), rng.choice(_DIMS)]
    x = _rows_input(rng, dtype, inner)
    # Left open: where x * x overflows the dtype (|x| above ~1e19 in float32) ATen's float statistics give
    # a NaN row, the kernel's double ones a finite one; such rows are not drawn (inf and NaN still are).
    limit = 1e18 if dtype == torch.float32 else 1e150
    x.copy_(torch.where(x.isfinite() & (x.abs() > limit), x.sign() * limit, x))  # in place: keeps its layout
    w = _values(rng, inner, dtype, special=0.0) if rng.random() < 0.7 else None
    b = _values(rng, inner, dtype, special=0.0) if rng.random() < 0.7 else None
    return Case("native_layer_norm", aten.native_layer_norm.default, (x, inner, w, b, rng.choice([1e-5, 1e-12, 0.1])))


def _softmax(rng) -> Case:
    dtype = _dtype(rng)
    x = _rows_input(rng, dtype, [rng.choice(_DIMS + [0, 100])])
    if rng.random() < 0.1:
        x = x.fill_(-math.inf) if x.is_contiguous() else x  # a fully masked row
    rank = x.dim()
    dim = rank - 1 if rng.random() < 0.8 else rng.randrange(-rank, rank)
    name = rng.choice(["_softmax", "_log_softmax"])
    return Case(name, getattr(aten, name).default, (x, dim, False))


def _matrix(rng, rows: int, cols: int, dtype, special: float = 0.03) -> torch.Tensor:
    t = _values(rng, [rows, cols], dtype, scale=rng.choice([1.0, 1e-2, 1e3]), special=special)
    how = rng.random()
    if how < 0.3:
        return t.t().contiguous().t()  # column-major
    if how < 0.45:
        big = torch.zeros(rows, cols + rng.randint(1, 5), dtype=dtype)  # leading dimension above cols
        big[:, :cols] = t
        return big[:, :cols]
    return t


def _gemm(rng) -> Case:
    dtype = _dtype(rng, 0.3)
    m, n, k = (rng.choice([1, 2, 3, 5, 8, 17, 33, 64]) for _ in range(3))
    name = rng.choice(["mm", "addmm", "bmm"])
    if name == "bmm":
        batch = rng.choice([1, 2, 3, 5])
        a = torch.stack([_matrix(rng, m, k, dtype) for _ in range(batch)])
        b = torch.stack([_matrix(rng, k, n, dtype) for _ in range(batch)])
        a, b = _layout(rng, a, 0.4), _layout(rng, b, 0.4)
        if rng.random() < 0.1:
            b = b[:1].expand(batch, k, n)  # one matrix for every batch: stride 0
        return Case("bmm", aten.bmm.default, (a, b))
    a, b = _matrix(rng, m, k, dtype), _matrix(rng, k, n, dtype)
    if name == "mm":
        return Case("mm", aten.mm.default, (a, b))
    bias = _values(rng, rng.choice([[n], [1, n], [m, n], [m, 1], [1]]), dtype, special=0.03)
    return Case("addmm", aten.addmm.default, (bias, a, b),
                {"beta": rng.choice([1, 1, 0.5, 0]), "alpha": rng.choice([1, 1, 2.0, -0.5])})


def _packed_gemm(rng) -> Case:
    """A float32 GEMM on a constant [N, K] weight large enough for MKL's packed GEMM (`PACK_MIN`)."""
    k, n = rng.choice([(256, 256), (128, 512), (512, 160)])
    assert k * n >= PACK_MIN
    m = rng.choice([1, 3, 8, 20])
    a = _matrix(rng, m, k, torch.float32, special=0.0)
    w = Weight(_values(rng, [n, k], torch.float32, scale=0.05, special=0.0))
    if rng.random() < 0.5:
        return Case("mm.packed", aten.mm.default, (a, w))
    bias = _values(rng, [n], torch.float32, special=0.0)
    return Case("addmm.packed", aten.addmm.default, (bias, a, w), {"beta": rng.choice([1, 0])})


def _embedding(rng) -> Case:
    dtype = _dtype(rng)
    vocab, dim = rng.choice([1, 2, 7, 50]), rng.choice([1, 3, 16, 64])
    w = _values(rng, [vocab, dim], dtype)
    if rng.random() < 0.3:
        big = torch.zeros(vocab, dim + 3, dtype=dtype)  # rows further apart than their length
        big[:, 1:dim + 1] = w
        w = big[:, 1:dim + 1]
    g = torch.Generator().manual_seed(rng.getrandbits(62))
    ids = _layout(rng, torch.randint(0, vocab, _shape(rng, rng.choice([0, 1, 2, 3]), big=0.0), generator=g), 0.4)
    padding = rng.choice([-1, -1, 0, vocab - 1])
    return Case("embedding", aten.embedding.default, (w, ids, padding), exact=True)


def _index(rng) -> Case:
    """``x[i]`` with one int64 index tensor: rows of any layout, negative indices (an index out of range:
    tests/test_static_kernels.py)."""
    dtype = _dtype(rng)
    shape = _shape(rng, rng.choice([1, 2, 3]), zero=0.0)
    x = _layout(rng, _values(rng, shape, dtype), 0.4)
    n = shape[0]
    g = torch.Generator().manual_seed(rng.getrandbits(62))
    ids = torch.randint(-n, n, _shape(rng, rng.choice([0, 1, 2]), big=0.0), generator=g)
    return Case("index", aten.index.Tensor, (x, [_layout(rng, ids, 0.4)]), exact=True)


def _cat(rng) -> Case:
    shape = _shape(rng, rng.choice([1, 2, 3, 4]), zero=0.0)
    rank = len(shape)  # a big shape has its own rank
    dim = rng.randrange(-rank, rank)
    dtype = _dtype(rng, 0.3)
    parts = []
    for _ in range(rng.randint(1, 4)):
        s = list(shape)
        s[dim] = rng.choice([0, 1, 2, 5, s[dim]])
        parts.append(_layout(rng, _values(rng, s, dtype if rng.random() < 0.9 else _dtype(rng, 0.5))))
    if rng.random() < 0.15:
        parts.insert(rng.randrange(len(parts) + 1), torch.empty(0, dtype=dtype))  # the legacy empty tensor
    return Case("cat", aten.cat.default, (parts, dim), exact=True)


def _batch_norm(rng) -> Case:
    """Inference batch norm on a [N, C, ...] input in any layout (channels-last among the permutations)."""
    dtype = _dtype(rng)
    shape = [rng.choice(_DIMS), rng.choice(_DIMS)] + _shape(rng, rng.choice([0, 1, 2]), zero=0.0, big=0.0)
    # Not drawn: values near the dtype's largest, where x * alpha + beta (ATen's fast paths and the kernel)
    # and ATen's other layouts' (x - mean) * invstd * w + b overflow at different points.
    x = _values(rng, shape, dtype, special=0.0)
    if rng.random() < 0.1:
        x.view(-1)[rng.randrange(x.numel())] = rng.choice([math.nan, math.inf, -math.inf])
    x = _layout(rng, x, 0.5)
    c = shape[1]
    w = _values(rng, [c], dtype, special=0.0) if rng.random() < 0.7 else None
    b = _values(rng, [c], dtype, special=0.0) if rng.random() < 0.7 else None
    mean, var = _values(rng, [c], dtype, special=0.0), _values(rng, [c], dtype, positive=True, special=0.0)
    return Case("batch_norm", aten._native_batch_norm_legit_no_training.default,
                (x, w, b, mean, var, 0.1, rng.choice([1e-5, 1e-3, 0.1])))


def _constant_pad(rng) -> Case:
    """Zero or constant padding of the last dims (a negative pad crops: left to ATen)."""
    dtype = _dtype(rng, 0.3)
    shape = _shape(rng, rng.choice([1, 2, 3, 4]), zero=0.05, big=0.0)
    x = _layout(rng, _values(rng, shape, dtype), 0.5)
    pad = [rng.choice([0, 0, 1, 2, 3]) for _ in range(2 * rng.randint(1, len(shape)))]
    croppable = [i for i in range(len(pad)) if shape[-(i // 2 + 1)] >= 1]  # no dim cropped below size 0
    if croppable and rng.random() < 0.1:
        pad[rng.choice(croppable)] = -1
    return Case("constant_pad_nd", aten.constant_pad_nd.default, (x, pad, rng.choice([0.0, 0.0, -1.5, math.inf])),
                exact=True)


def _max_pool(rng) -> Case:
    """2-D max pooling with indices on [N, C, H, W] in any layout: windows with padding, strides, dilation and
    ceil mode; values from a few integers so windows hold ties (the first maximum's index wins), NaN and inf."""
    dtype = _dtype(rng, 0.3)
    while True:
        h, w = rng.randint(1, 12), rng.randint(1, 12)
        kernel = [rng.randint(1, 4), rng.randint(1, 4)]
        stride = rng.choice([[], [rng.randint(1, 3), rng.randint(1, 3)]])
        padding = [rng.randint(0, kernel[0] // 2), rng.randint(0, kernel[1] // 2)]
        dilation = [rng.choice([1, 1, 2]), rng.choice([1, 1, 2])]
        ceil = rng.random() < 0.3
        x = torch.randint(-3, 4, [rng.choice([1, 2, 3]), rng.choice([1, 3, 8, 17]), h, w]).to(dtype)
        try:
            aten.max_pool2d_with_indices.default(x, kernel, stride, padding, dilation, ceil)
            break
        except RuntimeError:  # an output size of 0 or less: draw again
            continue
    if rng.random() < 0.5:
        x = x * rng.choice([1.0, -0.0, 1e-3])  # -0.0 scaling: signed zeros tie with zeros
    if rng.random() < 0.2:
        for _ in range(rng.randint(1, 3)):
            x.view(-1)[rng.randrange(x.numel())] = rng.choice([math.nan, math.inf, -math.inf])
    x = _layout(rng, x, 0.6)
    return Case("max_pool2d_with_indices", aten.max_pool2d_with_indices.default,
                (x, kernel, stride, padding, dilation, ceil), exact=True)


def _reduction(rng) -> Case:
    """sum / mean over a random set of dims, keepdim or not, of a tensor in any layout."""
    dtype = _dtype(rng)
    shape = _shape(rng, rng.choice([1, 2, 3, 4]), zero=0.0, big=0.05)
    x = _values(rng, shape, dtype, special=0.0)
    if rng.random() < 0.1:
        x.view(-1)[rng.randrange(x.numel())] = rng.choice([math.nan, math.inf, -math.inf])
    x = _layout(rng, x, 0.5)
    dims = rng.sample(range(len(shape)), rng.randint(1, len(shape)))
    dims = [d - len(shape) if rng.random() < 0.3 else d for d in dims]  # negative dims too
    op = rng.choice([aten.sum.dim_IntList, aten.mean.dim])
    return Case(op.__name__.split(".")[0], op, (x, dims, rng.random() < 0.5))


def _attention(rng) -> Case:
    """ATen's CPU flash attention on [B, H, L, E] heads in the layouts models give it (heads transposed out of
    [B, L, H, E], or any other), causal or with an additive float mask (rows fully masked too), GQA, a scale;
    key lengths beyond one of ATen's blocks (512) are drawn too (the generator leaves those to ATen)."""
    dtype = _dtype(rng, 0.2)
    b, h = rng.choice([1, 1, 2, 3]), rng.choice([1, 2, 4])
    hk = rng.choice([d for d in (1, 2, 4) if h % d == 0])
    q_len, k_len = rng.choice([1, 1, 2, 3, 8, 17]), rng.choice([1, 3, 8, 17, 64, 300, 513])
    e = rng.choice([1, 4, 8, 16, 64])  # ATen's flash attention takes one head size for q, k and v

    def heads(heads_n, length, dim, **kw):
        t = _values(rng, [b, length, heads_n, dim], dtype, scale=rng.choice([1.0, 1.0, 0.1, 10.0]),
                    special=0.03, **kw)
        if rng.random() < 0.6:
            return t.transpose(1, 2)
        # any layout; one whose head dim is not contiguous SDPA never passes (ATen's kernel misreads it), and
        # the generator leaves it to ATen
        return _layout(rng, t.transpose(1, 2).contiguous(), 0.5)

    q, k, v = heads(h, q_len, e), heads(hk, k_len, e), heads(hk, k_len, e)
    kwargs = {}
    causal = rng.random() < 0.4
    if rng.random() < 0.5:
        shape = rng.choice([[q_len, k_len], [b, 1, q_len, k_len], [1, h, q_len, k_len], [b, h, q_len, k_len]])
        g = torch.Generator().manual_seed(rng.getrandbits(62))
        keep = torch.rand(shape, generator=g) > rng.choice([0.0, 0.3, 0.9])
        masked = rng.choice([-math.inf, torch.finfo(dtype).min, -1e4])
        mask = torch.where(keep, _values(rng, shape, dtype, scale=rng.choice([0.0, 1.0]), special=0.0),
                           torch.full(shape, masked, dtype=dtype))
        if rng.random() < 0.2:
            mask[..., 0, :] = -math.inf  # a fully masked row
        kwargs["attn_mask"] = mask
    if rng.random() < 0.3:
        kwargs["scale"] = rng.choice([0.125, 1.0, 0.01])
    return Case("attention", aten._scaled_dot_product_flash_attention_for_cpu.default, (q, k, v, 0.0, causal), kwargs)


def _conv(rng) -> Case:
    """A small 1-d or 2-d convolution (the sizes the generator takes): grouped, depthwise and dense, strides,
    padding, dilation, with or without bias, the input in any layout (channels-last among the permutations)."""
    dtype = _dtype(rng, 0.2)
    rank = rng.choice([1, 2, 2])
    groups = rng.choice([1, 1, 2, 4])
    cg, ocg = rng.choice([1, 2, 3, 8]), rng.choice([1, 2, 4, 8])
    if rng.random() < 0.2:
        groups, cg, ocg = rng.choice([8, 16]), 1, rng.choice([1, 2])  # depthwise
    n = rng.choice([1, 1, 2, 3])
    kernel = [rng.choice([1, 2, 3, 3, 5, 7]) for _ in range(rank)]
    stride = [rng.choice([1, 1, 2, 3]) for _ in range(rank)]
    dilation = [rng.choice([1, 1, 1, 2]) for _ in range(rank)]
    padding = [rng.randint(0, (k - 1) * d) for k, d in zip(kernel, dilation)]
    spatial = [max(rng.choice([1, 3, 4, 8, 16, 19, 33]), (k - 1) * d + 1 - 2 * p)
               for k, d, p in zip(kernel, dilation, padding)]
    x = _layout(rng, _values(rng, [n, cg * groups] + spatial, dtype, special=0.02), 0.5)
    w = _layout(rng, _values(rng, [ocg * groups, cg] + kernel, dtype, scale=0.3, special=0.0), 0.3)
    b = _values(rng, [ocg * groups], dtype, special=0.0) if rng.random() < 0.6 else None
    return Case("convolution", aten.convolution.default,
                (x, w, b, stride, padding, dilation, False, [0] * rank, groups))


# how often each family is drawn
_FAMILIES = [(_unary, 6), (_binary, 6), (_compare, 3), (_select, 2), (_clamps, 2), (_gelu, 1), (_copy, 3),
             (_layer_norm, 3), (_softmax, 3), (_gemm, 4), (_embedding, 1), (_cat, 2), (_batch_norm, 2),
             (_constant_pad, 2), (_reduction, 2), (_max_pool, 2), (_index, 1), (_attention, 3), (_conv, 3)]


def draw(index: int, seed: int = SEED) -> Case:
    """Case ``index`` of the seeded sequence (depends on nothing else, so any one case reproduces alone)."""
    rng = random.Random(f"kernel-diff/{seed}/{index}")
    if index % 100 == 99:
        case = _packed_gemm(rng)
    else:
        case = rng.choices([f for f, _ in _FAMILIES], weights=[w for _, w in _FAMILIES])[0](rng)
    case.label = f"case {index} (seed {seed})"
    return case


# -- running a batch through the real build path --------------------------------------------------------------

def run_batch(cases: list, build_dir) -> list:
    """Run ``cases`` as one graph, planned with static kernels and as plain ATen code.

    Returns per case ``(kernel signature or None, got, want)``: None where the case runs its ATen
    kernel (the generator or the planner declined it)."""
    g = Graph("kernel_diff")
    inputs: list = []
    case_nodes = []

    def operand(v):
        if isinstance(v, torch.Tensor):
            inputs.append(v)
            return g.placeholder(f"in{len(inputs)}", meta_of_value(v))
        if isinstance(v, Weight):
            w = g.constant(v.value, meta_of_value(v.value))
            return g.call(aten.t.default, (w,), meta=meta_of_value(v.value.t()))
        if isinstance(v, list):
            return [operand(x) for x in v]
        return v

    for case in cases:
        args = tuple(operand(a) for a in case.args)
        kwargs = {k: operand(v) for k, v in case.kwargs.items()}
        with torch.no_grad():
            value = case.op(*[a.value.t() if isinstance(a, Weight) else a for a in case.args], **case.kwargs)
        case_nodes.append(g.call(case.op, args, kwargs, meta=meta_of_value(value)))
    g.set_output(tuple(case_nodes))

    config = rewrite.CompilerConfig()
    kernels = StaticKernels(config, CompileUnit.detached("kernel_diff", config), str(build_dir))
    obs = observe(g, inputs)
    plan = make_plan(g, obs, "cpu", native=kernels.decide)
    kernels.build()
    plain = compile_graph_to_python(g)
    planned = PlannedExecutable(g, plan, ArenaPool("cpu"), kernels, plain)
    with torch.no_grad():
        want = plain(*inputs)
        got = planned(*inputs)
    index = {n.id: i for i, n in enumerate(g.nodes)}
    out = []
    for node, w, r in zip(case_nodes, want, got):
        p = plan.nodes[index[node.id]]
        out.append((kernels.signatures[p.kernel] if p.kind == "native" else None, r, w))
    return out


# -- comparing ------------------------------------------------------------------------------------------------

def _eps(dtype) -> float:
    return torch.finfo(dtype).eps if dtype.is_floating_point else 0.0


def _finite_max(*tensors) -> float:
    m = 0.0
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel():
            f = t[torch.isfinite(t)]
            if f.numel():
                m = max(m, f.abs().max().item())
    return m


def tolerance(case: Case, want: torch.Tensor, wants: list, output: int) -> tuple[float, float]:
    """(rtol, atol) for ``case``'s result: a few ulps for pointwise ops, the error bound of a sum for
    reductions (GEMMs and layer norm sum k terms; their rounding order differs from ATen's)."""
    eps = _eps(want.dtype)
    fam = case.family
    tensors = [a.value if isinstance(a, Weight) else a for a in case.args]
    if fam.startswith(("mm", "addmm", "bmm")):
        a, b = (tensors[1], tensors[2]) if fam.startswith("addmm") else (tensors[0], tensors[1])
        k = a.shape[-1]
        scale = _finite_max(a) * _finite_max(b) * k * abs(case.kwargs.get("alpha", 1)) + _finite_max(tensors[0]) * (
            fam.startswith("addmm"))
        return 16 * eps, 8 * eps * max(scale, 1e-30)
    if fam == "native_layer_norm":
        # (x - mean) * rstd is only defined to an ulp of x times rstd: a large mean over a small spread
        # cancels, in ATen's float statistics (Welford in float) more than in the kernel's double ones
        cond = max(1.0, _finite_max(tensors[0]) * _finite_max(wants[2]))
        if output == 1:  # the mean: an ulp of the largest element per element summed
            return 64 * eps, 64 * eps * max(1.0, _finite_max(tensors[0]))
        return 64 * eps * cond, 64 * eps * cond * max(1.0, _finite_max(tensors[2])) + 16 * eps * max(
            1.0, _finite_max(tensors[3]))
    if fam in ("sum", "mean"):  # ATen sums in the dtype, pairwise; the kernel in double: the sum's error bound
        x = tensors[0]
        count = max(1, x.numel() // max(1, want.numel()))
        scale = _finite_max(x) * (1 if fam == "mean" else count)
        return 16 * eps, 4 * eps * max(1.0, math.log2(count)) * max(scale, 1e-30)
    if fam == "batch_norm":
        # x * alpha + beta with beta = bias - mean * alpha: where they cancel, an ulp of the terms (ATen's
        # paths differ in how they round: its TensorIterator path for non-4-d inputs is not the kernel's)
        x, w, b, mean, var, _, bn_eps = tensors
        alpha = (1.0 if w is None else _finite_max(w)) / math.sqrt(max(var.min().item(), 0.0) + bn_eps)
        terms = (_finite_max(x) + _finite_max(mean)) * alpha + (0.0 if b is None else _finite_max(b))
        return 16 * eps, 8 * eps * max(terms, 1e-30)
    if fam == "convolution":  # a sum of C/g * taps products (and the bias) in another order than ATen's
        x, w, b = tensors[:3]
        terms = w.shape[1] * math.prod(w.shape[2:])
        scale = _finite_max(x) * _finite_max(w) * terms + (0.0 if b is None else _finite_max(b))
        return 16 * eps, 8 * eps * max(scale, 1e-30)
    if fam == "attention":
        # scores q.k * scale summed in another order than ATen's blocked GEMM: their error, through the
        # softmax weights, times the values; the logsumexp carries the scores' error
        q, k, v = tensors[:3]
        scale = case.kwargs.get("scale") or 1 / math.sqrt(q.shape[-1])
        scores = q.shape[-1] * _finite_max(q) * _finite_max(k) * scale
        if output == 1:
            return 16 * eps, 8 * eps * max(1.0, scores) + 4 * eps * math.log2(max(2, k.shape[-2]))
        return 64 * eps, 8 * eps * max(1.0, _finite_max(v)) * max(1.0, scores)
    if fam == "_log_softmax":
        return 64 * eps, 64 * eps * max(1.0, _finite_max(tensors[0]))
    if fam == "_softmax":
        return 64 * eps, 16 * eps
    if fam == "gelu":  # x * (1 + erf(x / sqrt 2)) / 2 cancels for negative x: an ulp of the sum, times x
        return 16 * eps, 8 * eps * max(1.0, _finite_max(tensors[0]))
    if fam in ("pow.Tensor_Tensor", "pow.Tensor_Scalar"):
        return 64 * eps, eps  # pow's vector variants: a few ulps, more near overflow
    return 16 * eps, 4 * _tiny(want.dtype)


def _tiny(dtype) -> float:
    return torch.finfo(dtype).tiny if dtype.is_floating_point else 0.0


def _attention_odd_rows(case: Case) -> torch.Tensor:
    """[B, H, L] mask of the query rows of an attention case with a NaN or +inf among their scores (any key,
    computed in the case's dtype, where a product can overflow)."""
    q, k = case.args[0], case.args[1]
    k = k.repeat_interleave(q.shape[1] // k.shape[1], 1)
    s = q @ k.transpose(-1, -2)
    if case.kwargs.get("attn_mask") is not None:
        s = s + case.kwargs["attn_mask"]
    return (s.isnan() | (s == math.inf)).any(-1)


def mismatch(case: Case, got, want) -> str | None:
    """Why ``got`` is not an acceptable result of ``case`` (None when it is)."""
    gots = list(got) if isinstance(got, (tuple, list)) else [got]
    wants = list(want) if isinstance(want, (tuple, list)) else [want]
    for k, (r, w) in enumerate(zip(gots, wants)):
        where = f"output {k}: " if len(wants) > 1 else ""
        if r.dtype != w.dtype or r.shape != w.shape:
            return f"{where}{r.dtype}{list(r.shape)} where ATen gives {w.dtype}{list(w.shape)}"
        if not w.is_floating_point():
            if not torch.equal(r, w):
                bad = (r != w).nonzero()[0].tolist()
                return f"{where}at {bad}: {r[tuple(bad)].item()} where ATen gives {w[tuple(bad)].item()}"
            continue
        if case.family == "native_layer_norm" and k == 1:
            # ATen's mean of a row holding inf is inf or NaN by where the inf stands (Welford's updates);
            # the kernel's is the sum's. Only rows of finite values are compared (the row itself and rstd
            # are NaN in both, checked on outputs 0 and 2).
            x = case.args[0]
            finite = torch.isfinite(x.reshape(-1, math.prod(case.args[1]))).all(1).reshape(w.shape)
            r, w = r[finite], w[finite]
        if case.family == "attention":
            # rows with a NaN or +inf score: ATen's answer is NaN, inf or numbers by where the value falls in its
            # vector loop and whether the key is visible (see rewrite.kernels.cgen.attention); the kernel's is
            # NaN (tests/test_static_kernels.py). Compared here are the other rows.
            odd = _attention_odd_rows(case)
            r, w = r[~odd], w[~odd]
        nan_r, nan_w = r.isnan(), w.isnan()
        if not torch.equal(nan_r, nan_w):
            bad = (nan_r != nan_w).nonzero()[0].tolist()
            return (f"{where}NaN positions differ, at {bad}: {r[tuple(bad)].item()} where ATen gives "
                    f"{w[tuple(bad)].item()}")
        if case.exact:
            same = (r == w) | (nan_r & nan_w)
            if case.signed_zero:
                same &= (r.signbit() == w.signbit()) | (nan_r & nan_w)
            if not bool(same.all()):
                bad = (~same).nonzero()[0].tolist()
                return f"{where}at {bad}: {r[tuple(bad)].item()!r} where ATen gives {w[tuple(bad)].item()!r} (exact op)"
            continue
        rtol, atol = tolerance(case, w, wants, k)
        try:
            torch.testing.assert_close(r, w, rtol=rtol, atol=atol, equal_nan=True)
        except AssertionError as e:
            return f"{where}{str(e).strip().splitlines()[0]} (rtol {rtol:.1e}, atol {atol:.1e}); " + \
                " ".join(str(e).split("\n")[1:4])
    return None


def check(cases: list, build_dir) -> Counter:
    """Run and compare ``cases`` in batches; fails listing every mismatch; returns kernels run per family."""
    ran: Counter = Counter()
    failures = []
    for start in range(0, len(cases), BATCH):
        batch = cases[start:start + BATCH]
        for case, (sig, got, want) in zip(batch, run_batch(batch, build_dir)):
            if sig is None:
                continue
            ran[case.family] += 1
            why = mismatch(case, got, want)
            if why is not None:
                failures.append(f"{case.label}: {case.describe()}: {why}\n    signature: {json.dumps(sig)}")
    assert not failures, f"{len(failures)} static kernels differ from ATen:\n" + "\n".join(failures[:20])
    return ran


# -- tests ----------------------------------------------------------------------------------------------------

def test_random_static_kernels_match_aten(tmp_path):
    cases = [draw(k) for k in range(CASES)]
    ran = check(cases, tmp_path)
    drawn = Counter(c.family.split(".")[0] for c in cases)
    covered = Counter()
    for fam, n in ran.items():
        covered[fam.split(".")[0]] += n
    # the checker must exercise kernels, not only ATen fallbacks: every family drawn often gets kernels
    missing = [f for f, n in drawn.items() if n >= 10 and covered[f] == 0]
    assert not missing, f"no case of {missing} got a static kernel (drawn: {dict(drawn)}, kernels: {dict(covered)})"
    print(f"kernel diff: {len(cases)} cases, {sum(ran.values())} on static kernels: {dict(sorted(covered.items()))}")
    assert sum(ran.values()) >= len(cases) // 2, f"only {sum(ran.values())} of {len(cases)} cases got kernels"


def _float_mask(dtype=torch.float32) -> torch.Tensor:
    m = torch.zeros(2, 1, 4, 4, dtype=dtype)
    m[0, 0, :, :2] = torch.finfo(dtype).min
    m[1, 0, 1, 1] = -0.0
    m[1, 0, 2, 2] = 0.5
    m[1, 0, 3, 3] = math.nan
    return m


# Failing cases this checker (and issue 24) found, kept as fixed examples. Each entry: why, then the case.
REGRESSIONS = [
    # issue 24: a float mask cast to bool was C's (uint8_t)x: the dtype's minimum (undefined in C) and 0.5
    # (truncated) became False; torch's bool is x != 0, NaN included
    ("float mask to bool", lambda: Case("_to_copy.bool", aten._to_copy.default, (_float_mask(),),
                                        {"dtype": torch.bool}, exact=True)),
    ("float64 mask to bool", lambda: Case("_to_copy.bool", aten._to_copy.default, (_float_mask(torch.float64),),
                                          {"dtype": torch.bool}, exact=True)),
]


_ZEROS = torch.tensor([-0.0, 0.0, -0.0, 0.0, 1.0, -2.0, math.inf, math.nan])
_OTHER = torch.tensor([0.0, -0.0, -0.0, 0.0, 3.0, 0.5, 1.0, 1.0])
_TENTHS = torch.tensor([0.1, 1 / 3, 0.5, 16777217.0, -0.1, 0.2, 0.1, 0.3])  # float32 roundings


def _inf_row() -> torch.Tensor:
    x = torch.randn(3, 7, generator=torch.Generator().manual_seed(0)) - 1e4
    x[0, 0] = math.inf
    x[1, 3] = math.nan
    return x


REGRESSIONS += [
    # comparisons computed in double when any operand was float64, but a 0-dim float64 tensor does not
    # widen a float32 tensor: ATen compares 0.1f with 0.1 rounded to float (True), the kernel with 0.1 (False)
    ("compare with a 0-dim float64", lambda: Case("compare.eq.Tensor", aten.eq.Tensor,
                                                  (_TENTHS, torch.tensor(0.1, dtype=torch.float64)), exact=True)),
    ("gt with a 0-dim float64", lambda: Case("compare.gt.Tensor", aten.gt.Tensor,
                                             (_TENTHS, torch.tensor(1 / 3, dtype=torch.float64)), exact=True)),
    # layer norm clamped a NaN variance (a row holding inf or NaN) to 0: the row came out +-inf and finite
    ("layer norm of rows holding inf and NaN", lambda: Case(
        "native_layer_norm", aten.native_layer_norm.default, (_inf_row(), [7], torch.ones(7), torch.zeros(7), 1e-5))),
    # a NaN bound makes ATen's result all NaN; the kernel compared with it and left x as it was
    ("clamp with a NaN bound", lambda: Case("clamp", aten.clamp.default, (_ZEROS, math.nan, 1.0), exact=True)),
    ("clamp_max with a NaN bound", lambda: Case("clamp_max", aten.clamp_max.default, (_ZEROS, math.nan), exact=True)),
    ("hardtanh with a NaN bound", lambda: Case("hardtanh", aten.hardtanh.default, (_ZEROS, -1.0, math.nan),
                                               exact=True)),
    # relu is clamp_min(x, 0): relu(-0.0) is -0.0 in ATen, was 0.0
    ("relu of -0.0", lambda: Case("unary.relu", aten.relu.default, (_ZEROS,), exact=True)),
    # sub is add(a, b, -alpha): with an int alpha 0, a - 0.0 * b turns -0.0 - -0.0 into +0.0;
    # ATen's -0.0 + 0 * -0.0 is -0.0
    ("sub with alpha 0", lambda: Case("sub.Tensor", aten.sub.Tensor, (_ZEROS, _OTHER), {"alpha": 0}, exact=True)),
    ("rsub with alpha 0", lambda: Case("rsub.Tensor", aten.rsub.Tensor, (_OTHER, _ZEROS), {"alpha": 0}, exact=True)),
    # add/sub with alpha are one fused multiply-add in ATen; a + alpha * b rounded twice, so where a cancels
    # alpha * b the kernel gave 0 and ATen the product's rounding error (found at 3000 cases, seed 0)
    ("add with alpha, cancelling", lambda: Case("add.Tensor", aten.add.Tensor, _cancelling(3.0), {"alpha": 3})),
    ("sub with alpha, cancelling", lambda: Case("sub.Tensor", aten.sub.Tensor, _cancelling(-0.001),
                                                {"alpha": 0.001})),
    ("rsub with alpha, cancelling", lambda: Case("rsub.Tensor", aten.rsub.Tensor, _cancelling(-3.0)[::-1],
                                                 {"alpha": 3})),
    # MKL's packed weight is an MKLDNN tensor without data_ptr (binding raised), and a dense copy of its
    # bytes crashed sgemm_compute (SIGFPE/SIGSEGV): the kernel gets the buffer's own address
    ("packed GEMM, one row", lambda: _packed_regression(1, 512, 160)),
    ("packed GEMM with bias", lambda: _packed_regression(20, 512, 160, bias=True)),
]


def _cancelling(alpha: float) -> tuple:
    """(a, b) with a = -(alpha * b) rounded to float32: a + alpha * b is the product's rounding error."""
    b = torch.randn(64, generator=torch.Generator().manual_seed(1))
    return (-(alpha * b)).float(), b


def _packed_regression(m: int, k: int, n: int, bias: bool = False) -> Case:
    g = torch.Generator().manual_seed(m)
    a, w = torch.randn(m, k, generator=g), Weight(torch.randn(n, k, generator=g) * 0.05)
    if bias:
        return Case("addmm.packed", aten.addmm.default, (torch.randn(n, generator=g), a, w), {"beta": 1})
    return Case("mm.packed", aten.mm.default, (a, w))


@pytest.mark.parametrize("name", [name for name, _ in REGRESSIONS])
def test_regression_examples(tmp_path, name):
    case = dict(REGRESSIONS)[name]()
    case.label = name
    ran = check([case], tmp_path)
    assert ran[case.family] == 1, f"{name}: the case no longer gets a static kernel; it tests nothing"


def test_an_attention_row_with_a_nan_score_is_nan(tmp_path):
    """ATen's answer for such a row depends on where the NaN falls in its vector loop (a row of NaN scores it
    drops entirely gives zeros: here the first query row); the kernel's row is NaN wherever the NaN is."""
    q, k, v = (torch.randn(1, 2, 3, 4, generator=torch.Generator().manual_seed(s)) for s in range(3))
    q[0, :, 0, 0] = math.nan
    case = Case("attention", aten._scaled_dot_product_flash_attention_for_cpu.default, (q, k, v, 0.0, False))
    (sig, got, want), = run_batch([case], tmp_path)
    assert sig is not None, "the case got no static kernel"
    assert bool(got[0][0, :, 0].isnan().all()) and bool(got[1][0, :, 0].isnan().all())
    torch.testing.assert_close(got[0][0, :, 1:], want[0][0, :, 1:])  # the other rows: attention
