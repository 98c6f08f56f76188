"""Fused kernels ATen ships, offered to extraction as alternatives; the cost model decides.

* ``fused.gelu``: GPT-2's ``gelu_new`` (``0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))``,
  eight pointwise ops after AOTAutograd) is ``gelu(x, approximate="tanh")``, one kernel on any device.
* ``fused.linear``: oneDNN's linear, ``mkldnn._linear_pointwise``: a float32 GEMM on a frozen weight
  with its bias (if any) and activation (none, GPT-2's tanh GELU, BERT's pooler tanh) in one call.
  The weight is ``t_copy(w)``, folded at compile time; the generated code binds it in oneDNN's own
  blocked layout (`rewrite.ops.packed_linear_weight`), made once. That is what makes even the plain
  form (no activation) worth offering: on a CPU where oneDNN's AVX-512 GEMM outruns MKL's (AMD EPYC:
  MKL takes its AVX2 path there), a prepacked linear took 0.70-0.97x of MKL's GEMM at MiniLM's shapes
  (32 to 512 rows, 384 x 384 to 384 x 1536 weights), its fixed cost about 17 us more.

Left out, each with the counterexample `check_rule` printed: the erf GELU post-op (ATen's
``gelu(+inf)`` is nan, oneDNN's is inf), bfloat16 (a row ``[0.5, 0.5, -inf]`` times a weight sums
to inf in addmm and to nan in oneDNN's blocked bf16 kernel), and linear + residual add
(``.binary``: probed, and left out while this torch ships it without a shape function).

The linear rules exist only where this ATen build has the kernel for the dtype, with a shape
function (`available`): the module runs each kernel once on a tiny input when it is loaded and
leaves out what fails, recording why in `LEFT_OUT` (``python -m rewrite rules`` prints it). They
match CPU tensors only. Whether a fused form is used is the cost model's call, from the kernels timed
at the graph's shapes on this machine (`rewrite.cost.kernel_times`, the linear on its packed weight):
on a CPU where MKL's GEMM is the faster, and for small GEMMs (oneDNN's call costs more), extraction keeps
the GEMM; in a graph headed for static kernels the fused linear, which has none, also pays for the run of
kernels it splits (`rewrite.cost.model`).

All rewrite rounding (``exact=False``): a fused kernel computes the same function in its own order.
"""
from __future__ import annotations

import torch

from ..ops import LINEAR_POST_OPS
from ..dsl import RuleSet, aten, dims_agree, is_const, is_float, on_device, op, rule, same_dtype, variables

__all__ = ["GELU", "LINEAR", "RULESETS", "LEFT_OUT", "available"]

x = variables("x")[0]
mul, add = aten.mul.Tensor, aten.add.Tensor

# -- GPT-2's tanh GELU, spelt out --------------------------------------------------------------------
_GELU_NEW = mul(mul(x, 0.5), add(aten.tanh.default(mul(add(x, mul(aten.pow.Tensor_Scalar(x, 3.0), 0.044715)),
                                                            0.7978845608028654)), 1.0))
GELU = RuleSet("fused.gelu", [
    rule(_GELU_NEW, aten.gelu.default(x, approximate="tanh"), when=[is_float(x)], exact=False, name="gelu_tanh"),
], description="0.5*x*(1+tanh(0.79788*(x+0.044715*x^3))) -> gelu(x, approximate='tanh')")


# -- oneDNN linear with post-ops ---------------------------------------------------------------------
LEFT_OUT: list[str] = []  # "rule: why it is not in this build"


def available(name: str, call, dtype: torch.dtype) -> bool:
    """Whether ``call(dtype)`` (a tiny run of kernel ``name``) works here, eagerly and on metas."""
    from ..shape import infer_meta
    from ..ir import meta_of_value

    try:
        target, args = call(dtype)
        with torch.no_grad():
            target(*args)
        infer_meta(target, [meta_of_value(a) if isinstance(a, torch.Tensor) else a for a in args], {})
    except Exception as e:  # noqa: BLE001 - any failure means: not in this build
        LEFT_OUT.append(f"{name} ({dtype}): {type(e).__name__}: {str(e).splitlines()[0][:120]}")
        return False
    return True


def _binary_call(dtype):
    k = torch.ops.mkldnn._linear_pointwise.binary
    return k, (torch.ones(2, 3, dtype=dtype), torch.ones(2, 4, dtype=dtype), torch.ones(4, 3, dtype=dtype),
               torch.ones(4, dtype=dtype), "add")


def _pointwise_call(dtype):
    k = torch.ops.mkldnn._linear_pointwise.default
    return k, (torch.ones(2, 3, dtype=dtype), torch.ones(4, 3, dtype=dtype), torch.ones(4, dtype=dtype), "relu", [], "")


# activation pattern on a value -> (oneDNN post-op, its algorithm): none, GPT-2's GELU, BERT's pooler tanh.
# The erf GELU (BERT, ViT) stays out: ATen's gelu(+inf) is nan, oneDNN's is inf (check_rule).
_ACTIVATIONS = {
    "": (lambda v: v, "none", ""),
    "gelu_tanh": (lambda v: aten.gelu.default(v, approximate="tanh"), "gelu", "tanh"),
    "tanh": (aten.tanh.default, "tanh", ""),
}
# Every kernel backend must run what a rule produces: a post-op without an ATen form in
# `ops.LINEAR_POST_OPS` (what backends that cannot lower oneDNN's kernel run) is never emitted.
_NO_ATEN_FORM = [name for name, (_, attr, alg) in _ACTIVATIONS.items() if (attr, alg) not in LINEAR_POST_OPS]
if _NO_ATEN_FORM:
    raise RuntimeError(f"fused.linear: post-ops {_NO_ATEN_FORM} have no ATen form in ops.LINEAR_POST_OPS")


def _linear_rules() -> list:
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")):
        LEFT_OUT.append("fused.linear: this build has no oneDNN (torch.backends.mkldnn) linear kernels")
        return []
    # float32 only: bfloat16 stays out (see the module docstring: an infinite sum becomes nan)
    dtypes = [d for d in (torch.float32,) if available("_linear_pointwise", _pointwise_call, d)]
    # Linear + add (_linear_pointwise.binary) ships without a shape function in this torch: left out.
    available("_linear_pointwise.binary", _binary_call, torch.float32)
    if not dtypes:
        return []
    linear, addmm = torch.ops.mkldnn._linear_pointwise.default, aten.addmm.default
    x, w = variables("x w", dtype=dtypes, rank=2)  # the GEMM's operands in a dtype the kernel has
    b = variables("b", dtype=dtypes, rank=1)[0]
    # oneDNN reads dense operands: the weight transposed the way it reads it, the bias copied dense
    # (a constant may be an expanded view); both computed once, at compile time
    weight, bias = aten.t_copy.default(w), aten.clone.default(b, memory_format=torch.contiguous_format)
    when = [on_device(x, "cpu"), same_dtype(w, x), same_dtype(b, x), dims_agree(x, 1, w, 0), dims_agree(b, 0, w, 1),
            is_const(w), is_const(b)]
    with_bias = [rule(act(addmm(b, x, w)), op(linear)(x, weight, bias, attr, [], algorithm), when=when, exact=False,
                      name="_".join(filter(None, ("linear", name))))
                 for name, (act, attr, algorithm) in _ACTIVATIONS.items()]
    # bias-free projections (T5, Llama): the GEMM alone
    no_bias = rule(aten.mm.default(x, w), op(linear)(x, weight, None, "none", [], ""), exact=False,
                   when=[on_device(x, "cpu"), same_dtype(w, x), dims_agree(x, 1, w, 0), is_const(w)], name="linear_mm")
    return with_bias + [no_bias]


LINEAR = RuleSet("fused.linear", _linear_rules(),
                 description="GEMM [+ bias] [+ activation] on a frozen weight -> oneDNN linear, the activation as "
                             "post-op (CPU)")

RULESETS = [GELU, LINEAR]
