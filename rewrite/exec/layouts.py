"""Layouts that kernels require of their inputs, restored on the final graph before it runs.

The optimizer reasons about values, not strides: folding stores a computed constant densely and a
rule may drop a copy whose only job was its layout. Some kernels refuse a value in the wrong layout.
CUDA's memory-efficient attention wants the rows of its bias to start on aligned addresses (a row
stride that is a multiple of 16 bytes); eager pads a bias that is not (``pad_bias`` in ATen's
attention: pad the last dim up, then slice the view back), which AOTAutograd records as
``constant_pad_nd`` then ``slice``. A folded mask loses that, and the kernel raises "attn_bias is
not correctly aligned" (bart, marian and the other encoder-decoders of the zoo on an H200).

So every executor's graph passes through `align_attention_biases`: a constant bias becomes an
aligned view of a padded copy, made once; a computed bias of a static width that is not a multiple
of the alignment gets eager's pad and slice. It is idempotent and changes no value.
"""
from __future__ import annotations

import torch

from ..ir import Graph, Node, TensorMeta

__all__ = ["align_attention_biases", "BIAS_ALIGNMENT"]

aten = torch.ops.aten

# Elements; eager pads to 8, and the kernel checks 16 bytes (4 floats, 8 halves): 16 elements satisfy every dtype.
BIAS_ALIGNMENT = 16
# Attention kernels with an alignment requirement on their bias, and the bias's argument position.
_BIAS_ARGUMENT = {aten._scaled_dot_product_efficient_attention.default: 3}


def _aligned(t: torch.Tensor) -> bool:
    return all(s % BIAS_ALIGNMENT == 0 for s, n in zip(t.stride()[:-1], t.shape[:-1]) if n > 1)


def _padded_width(width: int) -> int:
    return -(-width // BIAS_ALIGNMENT) * BIAS_ALIGNMENT


def aligned_copy(t: torch.Tensor) -> torch.Tensor:
    """``t``'s values in a view whose rows start every `BIAS_ALIGNMENT` elements (``t`` itself if they do)."""
    if _aligned(t):
        return t
    width = t.shape[-1]
    padded = torch.constant_pad_nd(t, [0, _padded_width(width) - width])
    return padded[..., :width]


def _is_eager_pad(n: Node) -> bool:
    """``n`` is ``slice(constant_pad_nd(x, [0, p]), -1, 0, width)`` onto an aligned width, as eager writes it,
    perhaps expanded."""
    if n.kind == "call" and n.target is aten.expand.default and isinstance(n.args[0], Node):
        n = n.args[0]
    if n.kind != "call" or n.target is not aten.slice.Tensor or len(n.args) < 2:
        return False
    pad = n.args[0]
    return (isinstance(pad, Node) and pad.kind == "call" and pad.target is aten.constant_pad_nd.default
            and isinstance(pad.meta, TensorMeta) and pad.meta.is_static()
            and int(pad.meta.shape[-1]) % BIAS_ALIGNMENT == 0)


def align_attention_biases(graph: Graph) -> int:
    """Give the bias of every attention kernel that needs it an aligned layout; returns how many changed."""
    changed = 0
    for n in list(graph.nodes):
        pos = _BIAS_ARGUMENT.get(n.target) if n.kind == "call" else None
        if pos is None or len(n.args) <= pos or not isinstance(n.args[pos], Node):
            continue
        bias = n.args[pos]
        meta = bias.meta
        if bias.kind == "constant" and isinstance(bias.value, torch.Tensor):
            if _aligned(bias.value):
                continue
            new = graph.constant(aligned_copy(bias.value), meta=meta, before=n)
            new.attrs.update({k: v for k, v in bias.attrs.items() if k != "value"})
        elif isinstance(meta, TensorMeta) and meta.is_static() and meta.rank and not _is_eager_pad(bias) \
                and int(meta.shape[-1]) % BIAS_ALIGNMENT and any(int(s) > 1 for s in meta.shape[:-1]):
            width = int(meta.shape[-1])
            padded_meta = TensorMeta(meta.dtype, (*meta.shape[:-1], _padded_width(width)), meta.device)
            padded = graph.call(aten.constant_pad_nd.default, (bias, [0, _padded_width(width) - width], 0.0),
                                meta=padded_meta, before=n, stream=n.stream)
            new = graph.call(aten.slice.Tensor, (padded, -1, 0, width), meta=meta, before=n, stream=n.stream)
        else:
            continue
        n.args = n.args[:pos] + (new,) + n.args[pos + 1:]
        changed += 1
    return changed
