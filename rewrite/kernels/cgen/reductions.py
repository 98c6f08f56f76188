"""Reductions over some dims: ``sum.dim_IntList`` and ``mean.dim``."""
from __future__ import annotations

from ..signature import value_of
from .core import (C_TYPE, FLOAT_DTYPES, PARALLEL_MIN, Unsupported, arg_values, collapse_dims, kernel_function, is_int, emit_loops,
                   memory_order, element_count)


def gen_reduction(sig, symbol, mean: bool):
    """``sum.dim_IntList`` / ``mean.dim`` of a float tensor over the dims listed (any strides, keepdim or
    not), its own dtype: each result summed in double, in the input's memory order (global pooling of a
    channels-last image reads its rows of channels), then divided by the count for a mean."""
    args = arg_values(sig)
    x, out = sig["inputs"][args["self"]["tensor"]], sig["outputs"][0]
    dims = value_of(args["dim"])
    rank = len(x["size"])
    if x["dtype"] not in FLOAT_DTYPES or out["dtype"] != x["dtype"] or args.get("dtype") is not None or rank == 0 \
            or not isinstance(dims, list) or not dims or any(not is_int(d) for d in dims):
        raise Unsupported
    reduced = sorted({d % rank for d in dims})
    kept = [d for d in range(rank) if d not in reduced]
    keepdim = bool(value_of(args.get("keepdim", False)))
    out_size = [1 if d in reduced else s for d, s in enumerate(x["size"])] if keepdim else [x["size"][d] for d in kept]
    if out_size != out["size"] or element_count(x["size"]) == 0:
        raise Unsupported
    out_strides = [out["stride"][d] for d in kept] if keepdim else list(out["stride"])
    T, count = C_TYPE[x["dtype"]], element_count([x["size"][d] for d in reduced])
    xi = args["self"]["tensor"]
    inner_size, (inner_stride,) = collapse_dims(*memory_order([x["size"][d] for d in reduced],
                                                          [[x["stride"][d] for d in reduced]]))

    def body(ix):
        lines = ["double acc = 0;"]
        for k, n in enumerate(inner_size):
            if k == len(inner_size) - 1:
                lines.append("#pragma omp simd reduction(+:acc)")
            lines.append(f"for (int64_t r{k} = 0; r{k} < {n}LL; r{k}++)")
        at = " + ".join([ix[1]] + [f"r{k}*{st}LL" for k, st in enumerate(inner_stride)])
        lines.append(f"  acc += x{xi}[{at}];")
        return lines + [f"y0[{ix[0]}] = ({T})({'acc / ' + str(count) + '.0' if mean else 'acc'});"]

    parallel = element_count(x["size"]) >= PARALLEL_MIN and len(kept) > 0
    return kernel_function(symbol, emit_loops([x["size"][d] for d in kept], [out_strides, [x["stride"][d] for d in kept]], body,
                                    parallel, simd=False), sig)
