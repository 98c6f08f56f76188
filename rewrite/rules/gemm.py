"""GEMMs with frozen weights: merge the ones that share an input, fold scalars and batch norms into weights.

With ``config.experimental_config.frozen_parameter`` weights are constants, and a replacement may
compute new weights out of them: a term whose inputs are all constants costs nothing at run time
(`rewrite.cost.folds_at_compile_time`) and the folding pass evaluates it once after extraction. So
these rules say what the new weight is (``cat([w0, w1], 1)``, ``w * c``) and never compute it.

* ``gemm.merge_parallel``: attention's Q, K and V projections (an MLP's gate and up) read the same
  activation; one GEMM over the concatenated weights and a split is fewer, larger calls. A
  multi-pattern rule (`rewrite.dsl.siblings`), guarded by the engine: members are original nodes
  taken in graph order, so merged GEMMs never merge again and each set of siblings matches once.
  Siblings of one shape only (``same_shape``): that covers Q/K/V and gate/up, and splits evenly.
* ``gemm.fold_scales``: ``(x @ w + b) * c`` is ``x @ (w * c) + b * c``; a scalar scale moves
  through views, expands, permutes and the left operand of a batched GEMM to reach it (attention's
  ``softmax(q @ k.T * scale)`` puts the scale into the Q weight).
* ``gemm.fold_batch_norms``: an inference batch norm (PyTorch's default eps) after a bias-free,
  ResNet-style 2-d convolution is a per-channel scale and shift, folded into the convolution's
  weight and a new bias.

All replace a value by the same real-number function rounded differently (``exact=False``):
`check_rule` compares them within the dtype's tolerance. Extraction keeps them only where the
calibrated cost model predicts a gain.
"""
from __future__ import annotations

import operator

import torch

from ..dsl import (RuleSet, aten, dim_is, dims_agree, dtype_is, is_const, is_float, is_scalar, op, rule, same_dtype,
                   same_shape, siblings, variables)
from ..ops import FLOATS

__all__ = ["MERGE_PARALLEL", "FOLD_SCALES", "FOLD_BATCH_NORMS", "RULESETS", "fold_conv"]

# GEMM operands, typed once: float matrices x @ w and bias vectors b (also what check_rule draws)
x, w0, w1, w2 = variables("x w0 w1 w2", dtype=FLOATS, rank=2)
b0, b1, b2 = variables("b0 b1 b2", dtype=FLOATS, rank=1)
y, c, s, p, m = variables("y c s p m")
addmm, mm, bmm, cat = aten.addmm.default, aten.mm.default, aten.bmm.default, aten.cat.default
mul, add, sub = aten.mul.Tensor, aten.add.Tensor, aten.sub.Tensor
getitem = op(operator.getitem)


def _gemm(bias: bool, x=x, w0=w0, b0=b0) -> list:
    """What ``addmm(b0, x, w0)`` / ``mm(x, w0)`` needs beyond its operands' types: one dtype, a
    weight whose rows match x's columns, a bias of one value per output column."""
    return [same_dtype(w0, x), dims_agree(x, 1, w0, 0)] + ([same_dtype(x, b0), dims_agree(b0, 0, w0, 1)] if bias else [])


# -- parallel GEMMs reading one activation -----------------------------------------------------------
def _merge(k: int, bias: bool):
    """Rule merging ``k`` GEMMs ``x @ w_i (+ b_i)``: one GEMM over ``cat(w_i, 1)``, split in k equal parts."""
    ws, bs = [w0, w1, w2][:k], [b0, b1, b2][:k]
    wide_w = cat(ws, 1)
    wide = addmm(cat(bs), x, wide_w) if bias else mm(x, wide_w)
    parts = aten.split.Tensor(wide, aten.sym_size.int(w0, 1), 1)
    lhs = siblings(*(addmm(b, x, w) if bias else mm(x, w) for b, w in zip(bs, ws)))
    # (each member like the first; the first's own conditions last, so check_rule draws it to fit x)
    when = [*map(is_const, ws), *(c for w in ws[1:] for c in (same_shape(w, w0), same_dtype(w, w0)))]
    if bias:
        when += [*map(is_const, bs), *(c for b in bs[1:] for c in (same_shape(b, b0), same_dtype(b, b0)))]
    when += _gemm(bias)
    return rule(lhs, siblings(*(getitem(parts, i) for i in range(k))), when=when, exact=False,
                name=f"merge_parallel_{'addmm' if bias else 'mm'}_{k}")


MERGE_PARALLEL = RuleSet("gemm.merge_parallel", [_merge(k, bias) for k in (3, 2) for bias in (True, False)],
                         description="2 or 3 GEMMs of one input and same-shaped frozen weights -> one GEMM + split")

# -- scalars into weights --------------------------------------------------------------------------
# Folding a scale or a batch norm into weights rounds differently, and in half precision the
# difference can exceed any tolerance where the result cancels to near zero (check_rule found
# fp16 conv + batch norm outputs 0.0016 against -0.016): single and double precision only. And a
# scale applied before a GEMM instead of after it changes where a huge finite sum overflows: the
# rules hold for results that do not overflow (tests check them on that domain).


SINGLE = (torch.float32, torch.float64)


def single(v):
    return dtype_is(v, *SINGLE)


sx, sw = variables("x w0", dtype=SINGLE, rank=2)  # a GEMM in single or double precision
sb = variables("b0", dtype=SINGLE, rank=1)[0]
bx, by = variables("x y", dtype=SINGLE, rank=3)  # bmm operands: batches of matrices


# A scalar scale c (a Python number or a 0-dim constant) moves towards the GEMM that produced its
# operand: through views and copies (exactly: a scalar multiplies every element alike, whatever the shape) and
# into the left operand of bmm; at an addmm with frozen weights it becomes part of the weights.
# Written operand order only (``commute=False``): c may have another dtype than the tensor, and
# then ``c * t`` rounds differently from ``t * c`` (check_rule: float32 c times float16 t).
_VIEWS = {"view": lambda v: aten.view.default(v, s), "expand": lambda v: aten.expand.default(v, s),
          "permute": lambda v: aten.permute.default(v, p), "clone": lambda v: aten.clone.default(v, memory_format=m)}
FOLD_SCALES = RuleSet("gemm.fold_scales", [
    rule(mul(addmm(sb, sx, sw), c), addmm(mul(sb, c), sx, mul(sw, c)),
         when=[*_gemm(True, sx, sw, sb), is_const(sb), is_const(sw), is_scalar(c)], exact=False, commute=False,
         name="scale_into_addmm"),
    rule(mul(bmm(bx, by), c), bmm(mul(bx, c), by),
         when=[same_dtype(by, bx), dims_agree(bx, 0, by, 0), dims_agree(bx, 2, by, 1), is_scalar(c)],
         exact=False, commute=False, name="scale_into_bmm"),
] + [
    rule(mul(view(y), c), view(mul(y, c)), when=[is_float(y), is_scalar(c)], commute=False, name=f"scale_before_{name}")
    for name, view in _VIEWS.items()
], description="a scalar scale moves through views and bmm into the frozen weights of addmm")

# -- batch norms into the layer before ----------------------------------------------------------------
# Inference batch norm is y * k + (beta - mean * k) per channel, k = gamma / sqrt(var + eps). The
# rules are for PyTorch's default eps, 1e-5 (check_rule: with eps = 0 a zero variance makes k
# infinite, and the two sides disagree on where that gives nan).
EPS = 1e-05
image, kernel = variables("x w0", dtype=SINGLE, rank=4)  # a batch of images and a convolution's weight
g = variables("g", dtype=SINGLE, rank=1)[0]  # batch norm's per-channel parameters, like g
beta, mean, var, mom = variables("beta mean var mom")
_scale = mul(g, aten.rsqrt.default(add(var, EPS)))
_batch_norm = aten._native_batch_norm_legit_no_training.default


def fold_conv(stride: list, padding: list, pointwise: bool = False):
    """2-d convolution without bias (stride and padding given; no dilation, one group), then batch
    norm -> one convolution with folded weight and a bias. Literal parameters, one rule each for
    the settings ResNets use, so that check_rule can draw instances that fit; ``pointwise``: the
    kernel is 1x1 (a condition: a 1x1 kernel fits any image unpadded)."""
    conv = lambda w, b: aten.convolution.default(image, w, b, stride, padding, [1, 1], False, [0, 0], 1)  # noqa: E731
    per_out = aten.reshape.default(_scale, [-1, 1, 1, 1])
    one_by_one = [dim_is(kernel, 2, 1), dim_is(kernel, 3, 1)] if pointwise else []
    return rule(getitem(_batch_norm(conv(kernel, None), g, beta, mean, var, mom, EPS), 0),
                conv(mul(kernel, per_out), sub(beta, mul(mean, _scale))),
                when=[*map(is_const, (kernel, g, beta, mean, var)), *(same_shape(v, g) for v in (beta, mean, var)),
                      *(same_dtype(v, g) for v in (beta, mean, var)), same_dtype(g, image),
                      same_dtype(kernel, image), dims_agree(image, 1, kernel, 1), dims_agree(g, 0, kernel, 0),
                      *one_by_one],
                exact=False, name=f"batch_norm_into_conv{'_1x1' if pointwise else ''}_s{stride[0]}_p{padding[0]}")


# (stride, padding) of ResNet's 7x7 stem and 3x3 blocks, and of its 1x1 convolutions (a bottleneck's two,
# a projection's stride 2): ResNet-50 has 36 of those 1x1 batch norms against 17 of the others.
_RESNET_CONVS = (([1, 1], [1, 1]), ([2, 2], [1, 1]), ([2, 2], [3, 3]))
_RESNET_POINTWISE = (([1, 1], [0, 0]), ([2, 2], [0, 0]))
FOLD_BATCH_NORMS = RuleSet("gemm.fold_batch_norms", [fold_conv(s_, p_) for s_, p_ in _RESNET_CONVS]
                           + [fold_conv(s_, p_, pointwise=True) for s_, p_ in _RESNET_POINTWISE],
                           description="inference batch norm after a bias-free 2-d convolution (ResNet strides and "
                                       "paddings) with frozen weights -> one convolution with folded weight and bias")

RULESETS = [MERGE_PARALLEL, FOLD_SCALES, FOLD_BATCH_NORMS]
