"""Layouts kernels require, restored before a graph runs (rewrite.exec.layouts).

CUDA's memory-efficient attention refuses a bias whose rows are not aligned; folding stores a mask
densely, which broke bart, marian and five other encoder-decoders of the zoo on a GPU. These tests
check the pass on the CPU (the graph it produces, and the values); tests/test_cuda.py runs a folded
mask through the kernel itself where there is a GPU.
"""
from __future__ import annotations

import torch

from rewrite.exec.layouts import BIAS_ALIGNMENT, align_attention_biases, aligned_copy
from rewrite.ir import Graph, TensorMeta

aten = torch.ops.aten
ATTENTION = aten._scaled_dot_product_efficient_attention.default


def _attention_graph(bias_width: int, constant_bias: bool):
    g = Graph("attention")
    meta = TensorMeta(torch.float32, (2, 2, 6, 8))
    q, k, v = (g.placeholder(name, meta) for name in "qkv")
    bias_meta = TensorMeta(torch.float32, (2, 2, 6, bias_width))
    if constant_bias:
        bias = g.constant(torch.randn(2, 2, 6, bias_width))
    else:
        x = g.placeholder("mask", bias_meta)
        bias = g.call(aten.mul.Tensor, (x, 2.0), meta=bias_meta)
    attn = g.call(ATTENTION, (q, k, v, bias, False), meta=meta)
    g.set_output([attn])
    return g, attn, bias


def _rows_aligned(t: torch.Tensor) -> bool:
    return all(s % BIAS_ALIGNMENT == 0 for s in t.stride()[:-1])


def test_a_folded_mask_becomes_an_aligned_view_with_the_same_values():
    g, attn, bias = _attention_graph(6, constant_bias=True)
    assert not _rows_aligned(bias.value)
    assert align_attention_biases(g) == 1
    new = attn.args[3]
    assert new.kind == "constant" and new is not bias
    assert _rows_aligned(new.value) and new.value.stride()[-1] == 1
    assert torch.equal(new.value, bias.value)
    assert new.meta == bias.meta
    assert align_attention_biases(g) == 0  # idempotent: an executor may build the same graph twice


def test_a_computed_bias_gets_eagers_pad_and_slice_once():
    g, attn, bias = _attention_graph(6, constant_bias=False)
    assert align_attention_biases(g) == 1
    sliced = attn.args[3]
    assert sliced.target is aten.slice.Tensor and sliced.args[1:] == (-1, 0, 6)
    padded = sliced.args[0]
    assert padded.target is aten.constant_pad_nd.default and padded.args[0] is bias
    assert padded.meta.shape[-1] % BIAS_ALIGNMENT == 0
    g.validate()
    assert align_attention_biases(g) == 0
    # the pad and slice change no value
    mask = torch.randn(2, 2, 6, 6)
    view = torch.ops.aten.slice.Tensor(torch.ops.aten.constant_pad_nd.default(mask * 2.0, padded.args[1], 0.0), -1, 0, 6)
    assert torch.equal(view, mask * 2.0) and _rows_aligned(view)


def test_aligned_biases_are_left_alone():
    g, attn, bias = _attention_graph(BIAS_ALIGNMENT, constant_bias=False)
    assert align_attention_biases(g) == 0 and attn.args[3] is bias
    g, attn, bias = _attention_graph(2 * BIAS_ALIGNMENT, constant_bias=True)
    assert align_attention_biases(g) == 0 and attn.args[3] is bias


def test_aligned_copy_keeps_values_dtype_and_broadcast_dims():
    for dtype in (torch.float32, torch.float16, torch.bool):
        t = (torch.randn(1, 3, 5, 7) > 0).to(dtype)
        out = aligned_copy(t)
        assert out.dtype == dtype and out.shape == t.shape and torch.equal(out, t)
        assert all(s % BIAS_ALIGNMENT == 0 for s, n in zip(out.stride()[:-1], out.shape[:-1]) if n > 1)
