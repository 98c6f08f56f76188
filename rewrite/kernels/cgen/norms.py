"""Normalizations: layer norm over contiguous last dims, and inference batch norm at any strides (its
per-channel terms, `_batch_norm_terms` and `_batch_norm_prologue`, serve a fused kernel's steps too)."""
from __future__ import annotations

from .core import (C_TYPE, FLOAT_DTYPES, PARALLEL_MIN, Unsupported, arg_values, is_dense, math_fn, kernel_function, c_literal, emit_loops,
                   element_count, row_loop, row_pairs, row_shape)


def gen_layer_norm(sig, symbol):
    args = arg_values(sig)
    x = sig["inputs"][args["input"]["tensor"]]
    if x["dtype"] not in FLOAT_DTYPES or any(o["dtype"] != x["dtype"] for o in sig["outputs"]):
        raise Unsupported
    T = C_TYPE[x["dtype"]]
    inner = len(args["normalized_shape"])
    rows, n, rs, ors = row_pairs(x, sig["outputs"][0], inner)
    for stats in sig["outputs"][1:]:  # mean and rstd: one value per row, contiguous
        if element_count(stats["size"]) != rows or not is_dense(stats["size"], stats["stride"]):
            raise Unsupported
    w, b = args["weight"], args["bias"]
    for t in (w, b):
        if t is not None and row_shape(sig["inputs"][t["tensor"]], len(sig["inputs"][t["tensor"]]["size"]))[1] != n:
            raise Unsupported
    eps = c_literal(args["eps"], "double")
    scale = f" * x{w['tensor']}[j]" if w is not None else ""
    shift = f" + x{b['tensor']}[j]" if b is not None else ""
    body = [
        *row_loop(T, rows, n, args["input"]["tensor"], rs, ors, "out"),
        "    double sum = 0, sq = 0;",
        "    #pragma omp simd reduction(+:sum)",
        f"    for (int64_t j = 0; j < {n}LL; j++) sum += row[j];",
        f"    double mean = sum / {n}.0;",
        "    #pragma omp simd reduction(+:sq)",
        f"    for (int64_t j = 0; j < {n}LL; j++) {{ double d = row[j] - mean; sq += d * d; }}",
        f"    double var = sq / {n}.0;",
        # ATen clamps with std::max(var, 0), which keeps a NaN variance (a row holding inf or NaN): the row
        # is NaN. `var > 0 ? var : 0` made it 0, so such a row came out as +-inf and finite values.
        f"    double rstd = 1.0 / sqrt((var < 0 ? 0 : var) + {eps});",
        f"    {T} m = ({T})mean, s = ({T})rstd;",
        "    #pragma omp simd",
        f"    for (int64_t j = 0; j < {n}LL; j++) out[j] = (row[j] - m) * s{scale}{shift};",
        "    y1[r] = m;",
        "    y2[r] = s;",
        "  }",
    ]
    return kernel_function(symbol, body, sig)


MAX_CHANNELS = 16384  # batch norm's per-channel terms live on the kernel's stack
BATCH_NORM = "aten._native_batch_norm_legit_no_training.default"  # inference batch norm (a fused kernel's step too)


def batch_norm_terms(sig) -> tuple[str, int, dict, int]:
    """(C type, input index of x, per-channel inputs, channels) of an inference batch norm's signature;
    per-channel inputs: name -> (input index, stride) for weight, bias, running_mean, running_var."""
    args = arg_values(sig)
    x, out = sig["inputs"][args["input"]["tensor"]], sig["outputs"][0]
    if x["dtype"] not in FLOAT_DTYPES or out["dtype"] != x["dtype"] or len(x["size"]) < 2 or out["size"] != x["size"] \
            or any(element_count(o["size"]) != 0 for o in sig["outputs"][1:]):
        raise Unsupported
    T, channels = C_TYPE[x["dtype"]], x["size"][1]
    if not 0 < channels <= MAX_CHANNELS or element_count(x["size"]) == 0:
        raise Unsupported
    per_channel = {}
    for name in ("weight", "bias", "running_mean", "running_var"):
        ref = args.get(name)
        if ref is None and name in ("weight", "bias"):
            continue
        if not (isinstance(ref, dict) and "tensor" in ref):
            raise Unsupported
        d = sig["inputs"][ref["tensor"]]
        if d["dtype"] != x["dtype"] or d["size"] != [channels]:
            raise Unsupported
        per_channel[name] = (ref["tensor"], d["stride"][0])
    return T, args["input"]["tensor"], per_channel, channels


def batch_norm_prologue(T: str, per_channel: dict, channels: int, eps, suffix: str, source) -> list[str]:
    """Lines filling ``alpha{suffix}``/``beta{suffix}``; ``source(k)`` names the array of input ``k``."""
    def at(name, default):
        if name not in per_channel:
            return default
        k, stride = per_channel[name]
        return f"{source(k)}[c * {stride}LL]"

    return [f"  {T} alpha{suffix}[{channels}], beta{suffix}[{channels}];",
            f"  for (int64_t c = 0; c < {channels}LL; c++) {{",
            f"    {T} invstd = (({T})1) / {math_fn('sqrt', T)}({at('running_var', None)} + {c_literal(eps, T)});",
            f"    alpha{suffix}[c] = invstd * {at('weight', f'(({T})1)')};",
            f"    beta{suffix}[c] = {at('bias', f'(({T})0)')} - {at('running_mean', None)} * alpha{suffix}[c];",
            "  }"]


def channel_strides(rank: int) -> list:
    """Strides that read a per-channel array as a [1, C, 1, ...] tensor broadcast over an image."""
    return [0, 1] + [0] * (rank - 2)


def gen_batch_norm(sig, symbol):
    """Batch norm with running statistics (``_native_batch_norm_legit_no_training``), ATen's CPU formula:
    per channel alpha = invstd * weight and beta = bias - mean * alpha with invstd = 1 / sqrt(var + eps),
    all in the input's type (its opmath for float32 and float64), then out = x * alpha + beta (a multiply
    and an add, no FMA, as ATen's vectorized loop) at any strides; the saved statistics it returns are empty."""
    T, x_at, per_channel, channels = batch_norm_terms(sig)
    x, out = sig["inputs"][x_at], sig["outputs"][0]
    body = batch_norm_prologue(T, per_channel, channels, arg_values(sig)["eps"], "", lambda k: f"x{k}")
    strides = [out["stride"], x["stride"], channel_strides(len(x["size"]))]
    body += emit_loops(list(x["size"]), strides, lambda ix: [f"y0[{ix[0]}] = x{x_at}[{ix[1]}] * alpha[{ix[2]}] + beta[{ix[2]}];"],
                   element_count(x["size"]) >= PARALLEL_MIN)
    return kernel_function(symbol, body, sig)
