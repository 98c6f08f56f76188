"""`generate`: the C source of one checked op signature, from the table that maps each op to its family's
generator (one module per op family; the package's docstring says what gets a kernel)."""
from __future__ import annotations

from ..signature import FUSED
from .attention import gen_attention
from .conv import gen_convolution
from .copies import gen_cat, gen_constant_pad
from .core import Unsupported
from .fused import gen_fused
from .gathers import gen_embedding, gen_index
from .gemm import gen_bmm, gen_mm
from .norms import BATCH_NORM, gen_batch_norm, gen_layer_norm
from .pointwise import POINTWISE_FORMULAS, gen_pointwise
from .pooling import gen_max_pool2d
from .reductions import gen_reduction
from .softmax import gen_softmax

__all__ = ["generate"]


def generate(sig: dict, symbol: str) -> str | None:
    """C source of ``symbol`` implementing checked signature ``sig``, or None when unsupported."""
    family = _FAMILIES.get(sig["op"])
    if family is None:
        return None
    if any(o["size"] and 0 in o["size"] for o in sig["outputs"]) and family is not gen_batch_norm:
        return None  # an empty result: nothing to compute (batch norm's empty statistics are never written)
    try:
        return family(sig, symbol)
    except Unsupported:
        return None


_FAMILIES = {name: gen_pointwise for name in POINTWISE_FORMULAS}
_FAMILIES.update({
    "aten.native_layer_norm.default": gen_layer_norm,
    "aten._softmax.default": lambda sig, symbol: gen_softmax(sig, symbol, False),
    "aten._log_softmax.default": lambda sig, symbol: gen_softmax(sig, symbol, True),
    "aten.mm.default": lambda sig, symbol: gen_mm(sig, symbol, False),
    "aten.addmm.default": lambda sig, symbol: gen_mm(sig, symbol, True),
    "aten.bmm.default": gen_bmm,
    "aten.embedding.default": gen_embedding,
    "aten.index.Tensor": gen_index,
    "aten.cat.default": gen_cat,
    BATCH_NORM: gen_batch_norm,
    "aten.constant_pad_nd.default": gen_constant_pad,
    "aten.max_pool2d_with_indices.default": gen_max_pool2d,
    FUSED: gen_fused,
    "aten.sum.dim_IntList": lambda sig, symbol: gen_reduction(sig, symbol, False),
    "aten.mean.dim": lambda sig, symbol: gen_reduction(sig, symbol, True),
    "aten._scaled_dot_product_flash_attention_for_cpu.default": gen_attention,
    "aten.convolution.default": gen_convolution,
})
