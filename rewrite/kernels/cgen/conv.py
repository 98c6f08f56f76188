"""Small 1-D and 2-D convolutions (``aten.convolution``, not transposed) at static sizes.

ATen hands a convolution to oneDNN or to its im2col path; either costs tens of microseconds a call before any
arithmetic (measured on this machine: 57 us for a depthwise 3x3 over 96 channels of 4x4 pixels, about 14
thousand multiply-adds; 20 us for a 3x3 over 16 channels of 8x8). The convolutions of a small vision or
audio model at batch 1-8 are all such calls. Two forms, every size, stride, padding and dilation a constant:

* ``im2col``: the taps of each image (and group) gathered into a matrix, the padding's zeros included, then
  one GEMM through the BLAS ATen uses (a 1x1 convolution without stride or padding reads its input as the
  matrix itself); the output is written in its own layout (NCHW or channels-last) by the GEMM;
* ``direct`` (depthwise and other convolutions with few channels per group): per output row, the taps
  unrolled at build time with their valid ranges cut to constants, accumulated over the row in registers.

Large convolutions (`MAX_MACS`) keep ATen's: oneDNN's blocked kernels win there. Numerics: sums of the same
products as ATen's, in another order, starting from the bias; equal to rounding.
"""
from __future__ import annotations

from ..signature import value_of
from .core import C_TYPE, FLOAT_DTYPES, Unsupported, arg_values, kernel_function, is_int
from .gemm import gemm_call, gemm_matrix

MAX_MACS = 1 << 20  # multiply-adds of one call up to which these beat ATen's (measured on this machine: depthwise
# 3x3 over 144 channels of 28x28, 1M multiply-adds, 1.8x faster; a dense 3x3 over 32 channels of 16x16, 2.4M, 0.87x)
GEMM_MIN = 8  # output channels per group, and products per output, from which the im2col form is used
MAX_TAPS = 64  # the direct form unrolls its taps
UNROLL_WIDTH = 16  # output rows up to this long are unrolled too


def _ints(v, rank: int) -> list[int]:
    v = value_of(v)
    if is_int(v):
        return [v] * rank
    if not isinstance(v, list) or not all(is_int(x) for x in v):
        raise Unsupported
    if len(v) == 1:
        return v * rank
    if len(v) != rank:
        raise Unsupported
    return v


def _spatial(d: dict, rank: int) -> tuple[list, list]:
    """(sizes, strides) of the spatial dims of a 3-d or 4-d layout, as 2-d (a 1-d convolution is one row)."""
    if rank == 1:
        return [1, d["size"][2]], [0, d["stride"][2]]
    return list(d["size"][2:]), list(d["stride"][2:])


def _valid(out: int, size: int, stride: int, pad: int, dil: int, tap: int) -> tuple[int, int]:
    """The output positions [lo, hi) whose input position ``o * stride - pad + tap * dil`` lies inside the input."""
    shift = tap * dil - pad
    lo = 0
    while lo < out and lo * stride + shift < 0:
        lo += 1
    hi = out
    while hi > lo and (hi - 1) * stride + shift >= size:
        hi -= 1
    return lo, hi


class _Conv:
    """A checked convolution signature, its sizes as 2-d (N, C, H, W -> N, OC, OH, OW)."""

    def __init__(self, sig):
        args = arg_values(sig)
        x, w, out = sig["inputs"][args["input"]["tensor"]], sig["inputs"][args["weight"]["tensor"]], sig["outputs"][0]
        if value_of(args["transposed"]) or len({x["dtype"], w["dtype"], out["dtype"]}) != 1 \
                or x["dtype"] not in FLOAT_DTYPES:
            raise Unsupported
        rank = len(x["size"]) - 2
        if rank not in (1, 2) or len(w["size"]) != rank + 2 or len(out["size"]) != rank + 2:
            raise Unsupported
        groups = value_of(args["groups"])
        self.N, self.C = x["size"][:2]
        self.OC, self.Cg = w["size"][:2]
        if not is_int(groups) or groups < 1 or self.C != self.Cg * groups or self.OC % groups \
                or out["size"][:2] != [self.N, self.OC]:
            raise Unsupported
        self.groups, self.OCg = groups, self.OC // groups
        stride, pad, dil = (_ints(args[name], rank) for name in ("stride", "padding", "dilation"))
        if rank == 1:
            stride, pad, dil = [1] + stride, [0] + pad, [1] + dil
        self.stride, self.pad, self.dil = stride, pad, dil
        (self.H, self.W), (self.xs2, self.xs3) = _spatial(x, rank)
        (self.KH, self.KW), (self.ws2, self.ws3) = _spatial(w, rank)
        (self.OH, self.OW), (self.os2, self.os3) = _spatial(out, rank)
        if min(self.N, self.OC, self.OH, self.OW, self.Cg, self.KH, self.KW) == 0 or min(stride) < 1 \
                or min(dil) < 1 or min(pad) < 0:
            raise Unsupported
        for k, (o, size, kk) in enumerate(((self.OH, self.H, self.KH), (self.OW, self.W, self.KW))):
            if o != (size + 2 * pad[k] - dil[k] * (kk - 1) - 1) // stride[k] + 1:
                raise Unsupported  # not the size this convolution makes
        self.K = self.Cg * self.KH * self.KW  # products per output
        self.P = self.OH * self.OW  # pixels per output channel
        self.macs = self.N * self.OC * self.P * self.K
        if self.macs > MAX_MACS:
            raise Unsupported
        self.T = C_TYPE[x["dtype"]]
        self.xs, self.ws, self.os = x["stride"], w["stride"], out["stride"]
        self.xi, self.wi = args["input"]["tensor"], args["weight"]["tensor"]
        self.bias = None
        if args.get("bias") is not None:
            b = sig["inputs"][args["bias"]["tensor"]]
            if b["dtype"] != x["dtype"] or b["size"] != [self.OC]:
                raise Unsupported
            self.bias = (args["bias"]["tensor"], b["stride"][0])
        self.cols = [_valid(self.OW, self.W, stride[1], pad[1], dil[1], kw) for kw in range(self.KW)]

    def bias_of(self, oc: str) -> str:
        return f"x{self.bias[0]}[({oc}) * {self.bias[1]}LL]" if self.bias is not None else f"(({self.T})0)"


def gen_convolution(sig, symbol):
    c = _Conv(sig)
    if c.OCg >= GEMM_MIN and c.K >= GEMM_MIN:
        if c.N > 1:  # one GEMM per image lost to oneDNN's batched kernels (8 images of a 3x3 over 16 channels: 0.7x)
            raise Unsupported
        return kernel_function(symbol, _im2col(c), sig)
    if c.KH * c.KW > MAX_TAPS:
        raise Unsupported
    return kernel_function(symbol, _direct(c), sig)


# -- im2col + GEMM -------------------------------------------------------------------------------------------

def _flip(m: tuple) -> tuple:
    """The BLAS view of a matrix's transpose (`gemm.gemm_matrix`'s (transposed?, ld, rows, cols))."""
    return (not m[0], m[1], m[3], m[2])


def _flattens(sizes: list, strides: list) -> bool:
    """Whether dims of ``sizes`` at ``strides`` read as one run of unit stride in this order (size-1 dims aside)."""
    expect = 1
    for size, stride in zip(reversed(sizes), reversed(strides)):
        if size != 1 and stride != expect:
            return False
        expect *= size
    return True


def _im2col(c: _Conv) -> list[str]:
    T, K, P = c.T, c.K, c.P
    # the weight of one group as a [OCg, K] matrix: K runs over (ic, kh, kw) in a contiguous weight, over
    # (kh, kw, ic) in a channels-last one (channels_last's copies); the gathered taps follow that order
    w_sizes, w_strides = [c.Cg, c.KH, c.KW], [c.ws[1], c.ws2, c.ws3]
    if _flattens(w_sizes, w_strides):
        order = "ckk"
    elif _flattens([c.KH, c.KW, c.Cg], [c.ws2, c.ws3, c.ws[1]]):
        order = "kkc"
    else:
        raise Unsupported
    weight = gemm_matrix({"size": [c.OCg, K], "stride": [c.ws[0], 1]}, 0)
    # the output of one image and group as a [OCg, P] matrix: its pixels one stride apart (NCHW or channels-last)
    if c.OH > 1 and c.os2 != c.OW * c.os3:
        raise Unsupported
    out = gemm_matrix({"size": [c.OCg, P], "stride": [c.os[1], c.os3]}, 0)
    rows_out = not out[0]  # out[OCg, P] row-major: taps as [K, P]; else out^T[P, OCg] row-major, taps [P, K]
    direct_input = (c.KH, c.KW, c.stride, c.pad) == (1, 1, [1, 1], [0, 0]) and (c.H == 1 or c.xs2 == c.W * c.xs3)
    if direct_input:  # a 1x1 convolution reads its input as the matrix of taps: [Cg, P]
        try:
            taps = gemm_matrix({"size": [c.Cg, P], "stride": [c.xs[1], c.xs3]}, 0)
        except Unsupported:
            direct_input = False
    if not direct_input:
        taps = (False, P, K, P) if rows_out else (True, K, K, P)  # the buffer `col`, in the output's orientation
    lines = []
    if not direct_input:
        lines += [f"  {T} *col = ({T} *)malloc({K * P}LL * sizeof({T}));", "  if (!col) return 2;"]
    lines += [f"  for (int64_t n = 0; n < {c.N}LL; n++)",
              f"  for (int64_t g = 0; g < {c.groups}LL; g++) {{",
              f"    const {T} *xg = x{c.xi} + n * {c.xs[0]}LL + g * {c.Cg * c.xs[1]}LL;",
              f"    {T} *og = y0 + n * {c.os[0]}LL + g * {c.OCg * c.os[1]}LL;"]
    if not direct_input:
        lines += _gather(c, order, rows_out)
    if c.bias is not None:
        lines += [f"    for (int64_t oc = 0; oc < {c.OCg}LL; oc++)",
                  f"      for (int64_t p = 0; p < {P}LL; p++) og[oc * {c.os[1]}LL + p * {c.os3}LL] = "
                  f"{c.bias_of(f'g * {c.OCg}LL + oc')};"]
    beta = "1" if c.bias is not None else "0"
    w_g, source = f"x{c.wi} + g * {c.OCg * c.ws[0]}LL", "xg" if direct_input else "col"
    if rows_out:  # out[OCg, P] = W[OCg, K] taps[K, P]
        call = gemm_call(T, w_g, source, "og", weight, taps, out, c.OCg, P, K, "1", beta)
    else:  # out^T[P, OCg] = taps^T[P, K] W^T[K, OCg]
        call = gemm_call(T, source, w_g, "og", _flip(taps), _flip(weight), _flip(out), P, c.OCg, K, "1", beta)
    lines += ["  " + ln for ln in call] + ["  }"]
    if not direct_input:
        lines += ["  free(col);"]
    return lines


def _gather(c: _Conv, order: str, rows_out: bool) -> list[str]:
    """Lines filling ``col`` with the taps of image ``n``, group ``g``: [K, P] (``rows_out``) or [P, K]."""
    K, P = c.K, c.P
    k_of = "(ic * {KK}LL + kh * {KW}LL + kw)" if order == "ckk" else "((kh * {KW}LL + kw) * {Cg}LL + ic)"
    k_of = k_of.format(KK=c.KH * c.KW, KW=c.KW, Cg=c.Cg)
    at = (lambda p: f"col[k * {P}LL + {p}]") if rows_out else (lambda p: f"col[({p}) * {K}LL + k]")
    sh, sw = c.stride
    ph, pw = c.pad
    dh, dw = c.dil
    pixel = f"oh * {c.OW}LL + ow"
    lines = [f"    for (int64_t ic = 0; ic < {c.Cg}LL; ic++)",
             f"    for (int64_t kh = 0; kh < {c.KH}LL; kh++)",
             f"    for (int64_t kw = 0; kw < {c.KW}LL; kw++) {{",
             f"      const int64_t k = {k_of};",
             f"      const int64_t lo = col_lo[kw], hi = col_hi[kw], dx = kw * {dw}LL - {pw}LL;",
             f"      for (int64_t oh = 0; oh < {c.OH}LL; oh++) {{",
             f"        const int64_t ih = oh * {sh}LL - {ph}LL + kh * {dh}LL;",
             f"        if (ih < 0 || ih >= {c.H}LL) {{",
             f"          for (int64_t ow = 0; ow < {c.OW}LL; ow++) {at(pixel)} = 0;",
             "          continue;",
             "        }",
             f"        const {c.T} *xr = xg + ic * {c.xs[1]}LL + ih * {c.xs2}LL;",
             f"        for (int64_t ow = 0; ow < lo; ow++) {at(pixel)} = 0;",
             "        #pragma omp simd",
             f"        for (int64_t ow = lo; ow < hi; ow++) {at(pixel)} = xr[(ow * {sw}LL + dx) * {c.xs3}LL];",
             f"        for (int64_t ow = hi; ow < {c.OW}LL; ow++) {at(pixel)} = 0;",
             "      }",
             "    }"]
    return _tap_tables(c) + lines


def _tap_tables(c: _Conv) -> list[str]:
    return [f"    static const int64_t col_lo[{c.KW}] = {{{', '.join(str(lo) for lo, _ in c.cols)}}};",
            f"    static const int64_t col_hi[{c.KW}] = {{{', '.join(str(hi) for _, hi in c.cols)}}};"]


# -- direct --------------------------------------------------------------------------------------------------

def _direct(c: _Conv) -> list[str]:
    """Per image, output channel and output row: the row in registers, each tap one loop of constant bounds."""
    T = c.T
    sh, sw = c.stride
    ph, pw = c.pad
    dh, dw = c.dil
    taps = []
    for kh in range(c.KH):
        row = [f"        {{ const int64_t ih = oh * {sh}LL + {kh * dh - ph}LL;",
               f"          if (ih >= 0 && ih < {c.H}LL) {{",
               f"            const {T} *xr = xc + ih * {c.xs2}LL;"]
        for kw in range(c.KW):
            lo, hi = c.cols[kw]
            if lo >= hi:
                continue
            tap = f"wk[{kh * c.KW + kw}]"
            if c.OW <= UNROLL_WIDTH:  # a short row: one statement per output, no loop to set up
                row += [f"            acc[{ow}] += {tap} * xr[{(ow * sw + kw * dw - pw) * c.xs3}LL];"
                        for ow in range(lo, hi)]
            else:
                row += ["            #pragma omp simd",
                        f"            for (int64_t ow = {lo}LL; ow < {hi}LL; ow++) acc[ow] += {tap} * "
                        f"xr[(ow * {sw}LL + {kw * dw - pw}LL) * {c.xs3}LL];"]
        taps += row + ["          }", "        }"]
    parallel = c.macs >= (1 << 18) and c.N * c.OC > 1
    return [
        "  #pragma omp parallel for collapse(2)" if parallel else "  /* one thread */",
        f"  for (int64_t n = 0; n < {c.N}LL; n++)",
        f"  for (int64_t oc = 0; oc < {c.OC}LL; oc++) {{",
        f"    {T} *o = y0 + n * {c.os[0]}LL + oc * {c.os[1]}LL;",
        f"    const {T} start = {c.bias_of('oc')};",
        f"    {T} acc[{c.OW}], wk[{c.KH * c.KW}];",
        f"    for (int64_t oh = 0; oh < {c.OH}LL; oh++) {{",
        f"      for (int64_t ow = 0; ow < {c.OW}LL; ow++) acc[ow] = start;",
        f"      for (int64_t ic = 0; ic < {c.Cg}LL; ic++) {{",
        f"        const {T} *xc = x{c.xi} + n * {c.xs[0]}LL + ((oc / {c.OCg}LL) * {c.Cg}LL + ic) * {c.xs[1]}LL;",
        f"        const {T} *wc = x{c.wi} + oc * {c.ws[0]}LL + ic * {c.ws[1]}LL;",
        f"        for (int64_t kh = 0; kh < {c.KH}LL; kh++)",
        f"          for (int64_t kw = 0; kw < {c.KW}LL; kw++) wk[kh * {c.KW}LL + kw] = wc[kh * {c.ws2}LL + kw * {c.ws3}LL];",
        *taps,
        "      }",
        f"      for (int64_t ow = 0; ow < {c.OW}LL; ow++) o[oh * {c.os2}LL + ow * {c.os3}LL] = acc[ow];",
        "    }",
        "  }",
    ]
