"""Scaled dot-product attention (``_scaled_dot_product_flash_attention_for_cpu``) at static sizes: one query
row at a time, its scores, softmax and weighted sum of the values computed without leaving the row.

ATen's CPU flash attention tiles the work for large sequences (GEMMs per block, thread-local buffers,
a parallel loop); at the sizes of a served model's heads its fixed cost is most of its time (about 20 us a
call for 4 heads of 8 tokens on this machine, most of a tiny decoder layer's budget). Here everything is
a constant: sizes, strides, the scale, the GQA group; the dot products and the value sums vectorize over
the head dim.

Numerics follow ATen's kernel for key lengths it handles in one block (up to `MAX_KEYS`): scores are
``q.k * scale + mask`` (keys after the query's position are skipped when causal), a row whose maximum is
-inf (fully masked) gives zeros and a logsumexp of 0, otherwise ``exp(s - max)`` weights and logsumexp
``max + log(sum)``, all in the input's type. A NaN score makes its row NaN. (ATen's own answer for such a
row depends on where the NaN falls: its vectorized maximum keeps a NaN, the scalar loop over a row's last
elements drops it, and a row of NaN scores it drops entirely gives zeros; measured on torch 2.13.) Longer key lengths,
where ATen's blocks change the treatment of special values, keep ATen's kernel.
"""
from __future__ import annotations

import math

from ..signature import value_of
from .core import C_TYPE, FLOAT_DTYPES, Unsupported, arg_values, broadcast_strides, math_fn, kernel_function, c_literal

MAX_KEYS = 512  # ATen's CPU flash attention takes up to 512 keys in one block
MAX_HEAD = 1024  # the value head dim: the row's accumulator lives on the stack
PARALLEL_WORK = 1 << 17  # multiply-adds from which the heads are split over threads
MAX_TRANSPOSED = 16384  # a head's keys up to this many elements are transposed on the stack (64 KiB of float)
ROWS = 4  # query rows computed together


def gen_attention(sig, symbol):
    args = arg_values(sig)
    q, k, v = (sig["inputs"][args[name]["tensor"]] for name in ("query", "key", "value"))
    out, lse = sig["outputs"]
    dtypes = {q["dtype"], k["dtype"], v["dtype"], out["dtype"], lse["dtype"]}
    if len(dtypes) != 1 or q["dtype"] not in FLOAT_DTYPES or value_of(args["dropout_p"]) != 0:
        raise Unsupported
    if any(len(d["size"]) != 4 for d in (q, k, v, out)) or len(lse["size"]) != 3:
        raise Unsupported
    B, H, L, E = q["size"]
    _, Hk, S, Ek = k["size"]
    Ev = v["size"][3]
    if k["size"][0] != B or v["size"][:3] != [B, Hk, S] or Ek != E or out["size"] != [B, H, L, Ev] \
            or lse["size"] != [B, H, L] or Hk == 0 or H % Hk:
        raise Unsupported
    if not 0 < S <= MAX_KEYS or not 0 < Ev <= MAX_HEAD or min(B, H, L, E) == 0:
        raise Unsupported
    if any(d["stride"][3] != 1 and d["size"][3] > 1 for d in (q, k, v)):
        # ATen's kernel reads the head dim as contiguous whatever its stride (SDPA only calls it so): its result
        # for other strides is not attention, and a kernel computing attention would differ from eager
        raise Unsupported
    T = C_TYPE[q["dtype"]]
    scale_v = value_of(args.get("scale"))
    scale = c_literal(1.0 / math.sqrt(E) if scale_v is None else scale_v, T)
    mask = args.get("attn_mask")
    ms = None
    if mask is not None:
        m = sig["inputs"][mask["tensor"]]
        if m["dtype"] != q["dtype"]:
            raise Unsupported
        ms = broadcast_strides(m, [B, H, L, S])
    causal = bool(value_of(args["is_causal"]))
    if causal and ms is not None:  # SDPA never passes both (it refuses them); ATen's kernel then reads further
        raise Unsupported
    group = H // Hk
    qs, ks, vs, os_, ls = q["stride"], k["stride"], v["stride"], out["stride"], lse["stride"]
    xq, xk, xv = (f"x{args[name]['tensor']}" for name in ("query", "key", "value"))
    exp, log = math_fn("exp", T), math_fn("log", T)
    R = ROWS if L >= ROWS else 1  # query rows computed together: each key and value row loaded once for all
    # row r of a block: query row i0 + r; past the last row a block recomputes the last row (never stored)
    def keys(row: str) -> str:  # the keys query row ``row`` sees; causal: 0..row (SDPA's top-left aligned mask)
        return f"({row} + 1 < S ? {row} + 1 : S)" if causal else "S"

    masked = f" + mb[i * {ms[2]}LL + j * {ms[3]}LL]" if ms is not None else ""
    parallel = B * H > 1 and B * H * L * S * (E + Ev) >= PARALLEL_WORK
    transposed = E * S <= MAX_TRANSPOSED
    if transposed:  # the head's keys as [E, S] on the stack: a block's scores are one loop over the keys per dim
        keys_prologue = [
            f"    {T} kt[{E * S}];",
            f"    for (int64_t j = 0; j < {S}LL; j++)",
            f"      for (int64_t e = 0; e < {E}LL; e++) kt[e * {S}LL + j] = kb[j * {ks[2]}LL + e * {ks[3]}LL];"]
        scores = [
            f"      for (int64_t r = 0; r < {R}; r++) for (int64_t j = 0; j < S; j++) s[r][j] = 0;",
            f"      for (int64_t e = 0; e < {E}LL; e++) {{",
            f"        const {T} *kte = kt + e * {S}LL;",
            f"        {T} qe[{R}];",
            f"        for (int64_t r = 0; r < {R}; r++) qe[r] = qi[r][e * {qs[3]}LL];",
            "        #pragma omp simd",
            "        for (int64_t j = 0; j < last; j++) {",
            f"          const {T} kv = kte[j];",
            f"          for (int64_t r = 0; r < {R}; r++) s[r][j] += qe[r] * kv;",
            "        }",
            "      }"]
    else:
        keys_prologue = []
        scores = [
            f"      for (int64_t r = 0; r < {R}; r++)",
            "      for (int64_t j = 0; j < last; j++) {",
            f"        const {T} *kj = kb + j * {ks[2]}LL;",
            f"        {T} d = 0;",
            "        #pragma omp simd reduction(+:d)",
            f"        for (int64_t e = 0; e < {E}LL; e++) d += qi[r][e * {qs[3]}LL] * kj[e * {ks[3]}LL];",
            "        s[r][j] = d;",
            "      }"]
    body = [
        f"  const int64_t S = {S}LL;",
        "  #pragma omp parallel for collapse(2)" if parallel else "",
        f"  for (int64_t b = 0; b < {B}LL; b++)",
        f"  for (int64_t h = 0; h < {H}LL; h++) {{",
        f"    const {T} *qb = {xq} + b * {qs[0]}LL + h * {qs[1]}LL;",
        f"    const {T} *kb = {xk} + b * {ks[0]}LL + (h / {group}LL) * {ks[1]}LL;",
        f"    const {T} *vb = {xv} + b * {vs[0]}LL + (h / {group}LL) * {vs[1]}LL;",
        (f"    const {T} *mb = x{mask['tensor']} + b * {ms[0]}LL + h * {ms[1]}LL;" if ms is not None else ""),
        f"    {T} s[{R}][{S}], acc[{R}][{Ev}], sums[{R}], maxes[{R}];",
        *keys_prologue,
        f"    for (int64_t i0 = 0; i0 < {L}LL; i0 += {R}) {{",
        f"      const {T} *qi[{R}];",
        f"      for (int64_t r = 0; r < {R}; r++) qi[r] = qb + (i0 + r < {L}LL ? i0 + r : {L - 1}LL) * {qs[2]}LL;",
        f"      const int64_t i_last = i0 + {R - 1} < {L}LL ? i0 + {R - 1} : {L - 1}LL;",
        f"      const int64_t last = {keys('i_last')};  /* the block's most keys */",
        *scores,
        f"      for (int64_t r = 0; r < {R}; r++) {{",
        f"        const int64_t i = i0 + r < {L}LL ? i0 + r : {L - 1}LL;",
        f"        const int64_t n = {keys('i')};",
        f"        {T} *sr = s[r];",
        "        #pragma omp simd",
        f"        for (int64_t j = 0; j < n; j++) sr[j] = sr[j] * {scale}{masked};",
        f"        {T} mx = -INFINITY;",
        "        int nan = 0;",
        "        #pragma omp simd reduction(max:mx) reduction(|:nan)",
        "        for (int64_t j = 0; j < n; j++) { mx = sr[j] > mx ? sr[j] : mx; nan |= sr[j] != sr[j]; }",
        "        if (nan) mx = NAN;  /* a NaN score makes the row NaN */",
        f"        {T} sum = 0;",
        "        if (mx != -INFINITY) {",
        "          #pragma omp simd reduction(+:sum)",
        f"          for (int64_t j = 0; j < n; j++) {{ {T} p = {exp}(sr[j] - mx); sr[j] = p; sum += p; }}",
        "        } else {  /* fully masked: every weight 0 (ATen's answer) */",
        "          for (int64_t j = 0; j < n; j++) sr[j] = 0;",
        "          mx = 0;",
        "        }",
        # ATen multiplies the weights of every key of its block (all of them, up to 512) with the values, the
        # zero weights of masked and causally hidden keys too: a NaN or inf value there makes the row NaN in
        # eager, and here as well
        "        for (int64_t j = n; j < S; j++) sr[j] = 0;",
        "        if (sum == 0) sum = 1;",
        f"        sums[r] = sum; maxes[r] = mx;",
        "      }",
        f"      for (int64_t r = 0; r < {R}; r++) for (int64_t e = 0; e < {Ev}LL; e++) acc[r][e] = 0;",
        "      for (int64_t j = 0; j < S; j++) {",
        f"        const {T} *vj = vb + j * {vs[2]}LL;",
        f"        {T} p[{R}];",
        f"        for (int64_t r = 0; r < {R}; r++) p[r] = s[r][j];",
        "        #pragma omp simd",
        f"        for (int64_t e = 0; e < {Ev}LL; e++) {{",
        f"          const {T} ve = vj[e * {vs[3]}LL];",
        f"          for (int64_t r = 0; r < {R}; r++) acc[r][e] += p[r] * ve;",
        "        }",
        "      }",
        f"      for (int64_t r = 0; r < {R} && i0 + r < {L}LL; r++) {{",
        "        const int64_t i = i0 + r;",
        f"        const {T} inv = (({T})1) / sums[r];",
        f"        {T} *o = y0 + b * {os_[0]}LL + h * {os_[1]}LL + i * {os_[2]}LL;",
        "        #pragma omp simd",
        f"        for (int64_t e = 0; e < {Ev}LL; e++) o[e * {os_[3]}LL] = acc[r][e] * inv;",
        f"        y1[b * {ls[0]}LL + h * {ls[1]}LL + i * {ls[2]}LL] = maxes[r] + {log}(sums[r]);",
        "      }",
        "    }",
        "  }",
    ]
    return kernel_function(symbol, [ln for ln in body if ln], sig)
