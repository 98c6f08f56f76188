"""Copies into a new layout: ``cat`` and ``constant_pad_nd`` (``clone``, ``contiguous`` and ``_to_copy``
are pointwise ops, `pointwise`)."""
from __future__ import annotations

from ..signature import value_of
from .core import C_TYPE, FLOAT_DTYPES, PARALLEL_MIN, Unsupported, arg_values, kernel_function, is_int, c_literal, emit_loops, element_count


def gen_cat(sig, symbol):
    args = arg_values(sig)
    out = sig["outputs"][0]
    refs = args["tensors"]["tensors"]
    rank = len(out["size"])
    dim = value_of(args["dim"]) % max(rank, 1)
    if out["dtype"] not in C_TYPE or any(sig["inputs"][r]["dtype"] != out["dtype"] for r in refs):
        raise Unsupported
    body, at = [], 0
    for r in refs:
        d = sig["inputs"][r]
        if element_count(d["size"]) == 0:
            continue  # ATen skips empty inputs too
        if len(d["size"]) != rank:
            raise Unsupported
        size = list(d["size"])
        strides = [out["stride"], d["stride"]]
        base = at * out["stride"][dim]
        body += emit_loops(size, strides, lambda ix, r=r, base=base: [f"y0[{base}LL + {ix[0]}] = x{r}[{ix[1]}];"],
                       element_count(size) >= PARALLEL_MIN)
        at += d["size"][dim]
    if at != out["size"][dim]:
        raise Unsupported
    return kernel_function(symbol, body, sig)


def gen_constant_pad(sig, symbol):
    """``constant_pad_nd`` with pads of at least 0: the value everywhere, then the input copied inside."""
    args = arg_values(sig)
    x, out = sig["inputs"][args["self"]["tensor"]], sig["outputs"][0]
    pad = value_of(args["pad"])
    rank = len(x["size"])
    if x["dtype"] not in FLOAT_DTYPES or out["dtype"] != x["dtype"] or not isinstance(pad, list) or len(pad) % 2 \
            or len(pad) > 2 * rank or any(not is_int(p) or p < 0 for p in pad):
        raise Unsupported
    T = C_TYPE[x["dtype"]]
    value = args.get("value")
    fill = c_literal(value if value is not None else 0, T)
    before = [0] * rank
    for k in range(len(pad) // 2):  # pad holds (before, after) pairs from the last dim backwards
        before[rank - 1 - k] = pad[2 * k]
        if x["size"][rank - 1 - k] + pad[2 * k] + pad[2 * k + 1] != out["size"][rank - 1 - k]:
            raise Unsupported
    base = sum(b * st for b, st in zip(before, out["stride"]))
    parallel = element_count(out["size"]) >= PARALLEL_MIN
    body = emit_loops(list(out["size"]), [out["stride"]], lambda ix: [f"y0[{ix[0]}] = {fill};"], parallel)
    if element_count(x["size"]):
        body += emit_loops(list(x["size"]), [out["stride"], x["stride"]],
                       lambda ix: [f"y0[{base}LL + {ix[0]}] = x{args['self']['tensor']}[{ix[1]}];"], parallel)
    return kernel_function(symbol, body, sig)
