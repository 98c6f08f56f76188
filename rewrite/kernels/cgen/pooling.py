"""2-D max pooling with indices (``max_pool2d_with_indices``), channels-last too."""
from __future__ import annotations

from ..signature import value_of
from .core import C_TYPE, FLOAT_DTYPES, PARALLEL_MIN, Unsupported, arg_values, kernel_function, is_int, element_count


def gen_max_pool2d(sig, symbol):
    """``max_pool2d_with_indices`` (values and flat indices into each input plane), ATen's CPU scan: the
    window's in-bounds positions in row-major order, a position taken when its value is greater than the
    maximum so far or is NaN (so the first of equal maxima, the last NaN), starting from -inf at the
    window's first in-bounds position. Any strides (channels-last too); output sizes are the recorded ones."""
    args = arg_values(sig)
    x = sig["inputs"][args["self"]["tensor"]]
    values, indices = sig["outputs"]
    kernel, stride, padding, dilation = (value_of(args.get(k)) for k in ("kernel_size", "stride", "padding",
                                                                        "dilation"))
    if x["dtype"] not in FLOAT_DTYPES or values["dtype"] != x["dtype"] or indices["dtype"] != "int64" \
            or len(x["size"]) != 4 or values["size"] != indices["size"] or values["size"][:2] != x["size"][:2]:
        raise Unsupported
    pairs = []
    for v, default in ((kernel, None), (stride, kernel), (padding, 0), (dilation, 1)):
        v = default if v in (None, []) else v
        v = [v, v] if is_int(v) else v
        if isinstance(v, list) and len(v) == 1:
            v = v * 2
        if not isinstance(v, list) or len(v) != 2 or any(not is_int(e) for e in v):
            raise Unsupported
        pairs.append(v)
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = pairs
    if min(kh, kw, sh, sw, dh, dw) < 1 or min(ph, pw) < 0:
        raise Unsupported
    T, xi = C_TYPE[x["dtype"]], args["self"]["tensor"]
    height, width = x["size"][2], x["size"][3]
    xs, vs, js = x["stride"], values["stride"], indices["stride"]
    n, channels, out_h, out_w = values["size"]
    parallel = element_count(values["size"]) * kh * kw >= PARALLEL_MIN
    window = [f"int64_t h0 = oh * {sh}LL - {ph}LL, w0 = ow * {sw}LL - {pw}LL;",
              f"int64_t h1 = h0 + {(kh - 1) * dh + 1}LL, w1 = w0 + {(kw - 1) * dw + 1}LL;",
              f"if (h1 > {height}LL) h1 = {height}LL;",
              f"if (w1 > {width}LL) w1 = {width}LL;",
              f"while (h0 < 0) h0 += {dh}LL;",
              f"while (w0 < 0) w0 += {dw}LL;"]
    value_at = f"y0[b * {vs[0]}LL + c * {vs[1]}LL + oh * {vs[2]}LL + ow * {vs[3]}LL]"
    index_at = f"y1[b * {js[0]}LL + c * {js[1]}LL + oh * {js[2]}LL + ow * {js[3]}LL]"
    read = f"x{xi}[b * {xs[0]}LL + c * {xs[1]}LL + h * {xs[2]}LL + w * {xs[3]}LL]"
    take = f"if (v > {value_at} || isnan(v)) {{ {value_at} = v; {index_at} = h * {width}LL + w; }}"
    lines = ["  #pragma omp parallel for collapse(2)"] if parallel else []
    if xs[1] <= min(xs[2], xs[3]):
        # Channels-last: per output position, the window's positions outside and the channels inside, so the
        # innermost loop walks the channels (dense) and vectorizes; the outputs hold the running maxima.
        lines += [f"  for (int64_t b = 0; b < {n}LL; b++) {{",
                  f"    for (int64_t oh = 0; oh < {out_h}LL; oh++) {{",
                  f"      for (int64_t ow = 0; ow < {out_w}LL; ow++) {{"]
        lines += ["        " + ln for ln in window + [
            "#pragma omp simd",
            f"for (int64_t c = 0; c < {channels}LL; c++) {{ {value_at} = -INFINITY; "
            f"{index_at} = h0 * {width}LL + w0; }}",
            f"for (int64_t h = h0; h < h1; h += {dh}LL) {{",
            f"  for (int64_t w = w0; w < w1; w += {dw}LL) {{",
            "    #pragma omp simd",
            f"    for (int64_t c = 0; c < {channels}LL; c++) {{ {T} v = {read}; {take} }}",
            "  }",
            "}"]]
        lines += ["      }", "    }", "  }"]
    else:
        # One output at a time, its window scanned in a local maximum (a plane's rows are dense).
        lines += [f"  for (int64_t b = 0; b < {n}LL; b++) {{",
                  f"    for (int64_t c = 0; c < {channels}LL; c++) {{",
                  f"      for (int64_t oh = 0; oh < {out_h}LL; oh++) {{",
                  f"        for (int64_t ow = 0; ow < {out_w}LL; ow++) {{"]
        lines += ["          " + ln for ln in window + [
            f"{T} best = -INFINITY;",
            f"int64_t at = h0 * {width}LL + w0;",
            f"for (int64_t h = h0; h < h1; h += {dh}LL) {{",
            f"  for (int64_t w = w0; w < w1; w += {dw}LL) {{",
            f"    {T} v = {read};",
            f"    if (v > best || isnan(v)) {{ best = v; at = h * {width}LL + w; }}",
            "  }",
            "}",
            f"{value_at} = best;",
            f"{index_at} = at;"]]
        lines += ["        }", "      }", "    }", "  }"]
    return kernel_function(symbol, lines, sig)
