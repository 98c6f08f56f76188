"""C source of static CPU kernels: one function per op signature, sizes and strides baked in.

A kernel is ``int k_<key>(void **p)``: ``p`` holds the addresses of its tensor inputs (in the
signature's order), then its outputs, then any extra buffer the kernel reads; it returns 0, or an
error code (`ERRORS`). Everything else (sizes, strides, scalar arguments) is a constant in the
code, so the compiler unrolls, vectorizes and folds index arithmetic. The code is built only from
a checked signature (`signature.check`): op names select a generator from the tables below, and
every number that reaches the source is an int or a float printed by Python.

What gets a kernel (everything else runs its ATen kernel):

* pointwise ops on float32/float64 (bool for masks and comparisons), with broadcasting and any
  strides; transcendental functions through glibc's vector math library (libmvec), so loops
  vectorize like ATen's; large ones split over OpenMP threads;
* ``native_layer_norm`` and ``_softmax``/``_log_softmax`` over contiguous last dimensions;
* ``mm``/``addmm``/``bmm`` through MKL's ``sgemm_``/``dgemm_`` (the BLAS ATen itself calls), and
  for weights that are constants, MKL's packed GEMM (``cblas_sgemm_compute`` on a weight packed once
  by ``mkl::_mkl_reorder_linear_weight``, what Inductor's freezing uses); the addresses reach the
  library at load time (`compiler.Library`);
* ``embedding`` and ``index.Tensor`` with one index tensor (an index out of range is error 1, raised as
  IndexError) and copies (``clone``,
  ``_to_copy`` between float dtypes, ``cat``, ``constant_pad_nd``);
* inference batch norm (``_native_batch_norm_legit_no_training``) and 2-D max pooling with indices
  (``max_pool2d_with_indices``) at any strides, channels-last too;
* ``sum``/``mean`` over listed dims (summed in double, in memory order);
* scaled dot-product attention (ATen's CPU flash op) with up to 512 keys, causal or masked, GQA
  (`attention`); small 1-d and 2-d convolutions, grouped and depthwise too (`conv`);
* a group of neighbouring pointwise steps and inference batch norms of one shape as one loop
  (`fused.gen_fused`; the planner picks the groups, `rewrite.kernels.fusion`).

Numerics: the same formulas as ATen's CPU kernels (layer norm statistics in double), so results
agree to float rounding; tests compare with eager at every gear.

The generator is split by op family, one module each (as fx2trt's converters are): `core` (version,
C types, the emitting helpers), `runtime`, `pointwise`, `norms`, `softmax`, `reductions`, `gemm`,
`gathers`, `copies`, `pooling`, `attention`, `conv` and `fused`; `generator` holds `generate`, with the table that
maps each op to its family's generator.
"""
from __future__ import annotations

from .core import ERRORS, PARALLEL_MIN, VERSION, Unsupported
from .fused import gen_fused
from .gemm import PACKED
from .generator import generate
from .norms import BATCH_NORM, MAX_CHANNELS
from .pointwise import POINTWISE_OPS
from .runtime import MATH_DECLARATIONS, RUNTIME

__all__ = ["generate", "RUNTIME", "ERRORS", "VERSION"]
# Also used from outside as `cgen.X`: MATH_DECLARATIONS and PACKED (rewrite.kernels), BATCH_NORM and
# POINTWISE_OPS (rewrite.kernels.fusion); PARALLEL_MIN, MAX_CHANNELS, Unsupported and gen_fused stay
# reachable here as they were in the single module.
